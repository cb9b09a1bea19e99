//! Locality metrics of a trace (docs/METRICS.md): summary, trace windows,
//! code windows per function, per-load table, reuse distance, execution
//! interval tree and hot regions — all in one streaming pass.
//!
//! [`Analyzer`] takes records one at a time (`Analyzer::push`) and keeps
//! state proportional to the distinct addresses and blocks of the trace,
//! never to its length; [`analyze_trace`] drives it from a
//! [`TraceReader`]. The result is a plain [`Analysis`] (JSON schema
//! `memgaze.analysis.v1`, see [`result`]) with a terminal rendering in
//! [`table`].
//!
//! How each metric is computed in O(1) or O(log n) per access:
//! - footprints of every window size at once: `windows.rs`;
//! - reuse distance (Olken/Fenwick, compacted time axis): `reuse.rs`;
//! - inter-sample windows (execution interval tree): `intervals.rs`;
//! - hot regions (location zoom tree), from per-line totals at the end:
//!   `regions.rs`;
//! - the hot path's address tables: `addr_table.rs`;
//! - whole-run stack distances and miss-ratio curves over spatially
//!   tracked blocks (per thread, Olken/Fenwick over the tracked blocks):
//!   [`locality`].
//!
//! Per-sample state is stamped with a *piece* id (a sample of one thread)
//! instead of being cleared, so the thousands of small samples of a sampled
//! trace cost O(sample size) each, not O(table size).

#![warn(missing_docs)]

use memgaze_trace::{
    Backend, FunctionEntry, LoadClass, LoadEntry, RawRecord, SpatialSampling, TraceError,
    TraceHeader, TraceReader, TraceTotals,
};
use std::collections::BTreeMap;
use std::io::Read;

mod addr_table;
pub mod checks;
mod error;
mod intervals;
pub mod locality;
mod regions;
mod reuse;
pub mod table;
mod windows;

pub use error::AnalysisError;
/// The result types, defined in `memgaze-metadata` (the analysis document).
pub use memgaze_metadata::analysis as result;
pub use result::*;

use addr_table::{
    AddrTable, ByteAddresses, HugePageVec, LineNumbers, LineSlot, PackedSlot, Zeroable,
};
use intervals::IntervalBuilder;
use locality::{Tally, Tracking, WholeRun, WindowDistances};
use regions::LineStat;
use reuse::{BlockLocal, ReuseTracker};
use windows::{AddrLocal, Lasts, LevelSums, NO_LASTS, WindowEngine, last_of};

/// Records processed late so that their table slots can be prefetched.
const PREFETCH_DISTANCE: usize = 16;

/// A record waiting in the prefetch queue.
#[derive(Clone, Copy, Debug, Default)]
struct Pending {
    load: u32,
    addr: u64,
    sample: u64,
    thread: u32,
    /// The address's slot in [`Analyzer::addrs`] when the second prefetch
    /// stage found it ([`NO_HINT`] if not), so processing skips the probe.
    hint: u32,
}

const NO_HINT: u32 = u32::MAX;

/// Accesses per (page, load site), behind a direct-mapped cache: a region
/// of a few thousand pages never reaches the map.
struct PageLoads {
    cache: Vec<(u64, u32, u64)>,
    map: Map<(u64, u32), u64>,
}

impl PageLoads {
    const CACHE: usize = 4096;

    fn new() -> Self {
        PageLoads {
            cache: vec![(NONE, 0, 0); Self::CACHE],
            map: Map::default(),
        }
    }

    #[inline]
    fn add(&mut self, page: u64, load: u32) {
        let i =
            (page.wrapping_add(u64::from(load).wrapping_mul(0x9e37_79b9)) as usize) % Self::CACHE;
        let e = &mut self.cache[i];
        if e.0 == page && e.1 == load {
            e.2 += 1;
        } else {
            if e.2 > 0 {
                *self.map.entry((e.0, e.1)).or_insert(0) += e.2;
            }
            *e = (page, load, 1);
        }
    }

    /// Every (page, load, accesses), sorted.
    fn drain(&mut self) -> Vec<(u64, u32, u64)> {
        for &(page, load, count) in &self.cache {
            if count > 0 {
                *self.map.entry((page, load)).or_insert(0) += count;
            }
        }
        self.cache.fill((NONE, 0, 0));
        let mut all: Vec<(u64, u32, u64)> = self.map.drain().map(|((p, l), c)| (p, l, c)).collect();
        all.sort_unstable();
        all
    }
}

/// Hash map with a fast, deterministic hasher.
pub(crate) type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;
/// "No position" / "no block".
pub(crate) const NONE: u64 = u64::MAX;
/// Window levels `k` tracked: `0..LEVELS`.
pub(crate) const LEVELS: usize = 32;
/// Largest `k` of the trace-window histogram of a full trace (docs/METRICS.md).
pub const FULL_TRACE_MAX_K: u32 = 20;
/// Largest code-window exponent `--code-window` accepts.
pub const MAX_CODE_WINDOW_K: u32 = 24;

/// Parameters of an analysis. `Default` gives the values of docs/METRICS.md.
#[derive(Clone, Debug, PartialEq)]
pub struct AnalysisOptions {
    /// Access block for reuse distance, bytes (power of two; default 64).
    pub block: u64,
    /// Code-window exponent `k_c`; default `⌊log2 min(w, 1024)⌋` (10 for a
    /// full trace).
    pub code_window_k: Option<u32>,
    /// Largest trace-window `k` (default 20, the full-trace limit; a
    /// sampled trace stops at `⌊log2 w⌋` below it).
    pub max_k: u32,
    /// Hot-region threshold `t`, percent of the parent region's accesses.
    pub region_threshold_percent: f64,
    /// Smallest zoom page, bytes (power of two, ≥ 64; default 4096).
    pub region_min_page: u64,
    /// Analyse only records of functions whose name matches this glob
    /// (records outside any function are left out too).
    pub functions: Option<String>,
    /// Cache sizes of `MR_L1`, `MR_L2`, `MR_LLC` (`--cache-sizes`); `None`:
    /// this machine's ([`locality::machine_cache_sizes`]).
    pub cache_sizes: Option<CacheSizes>,
    /// Build the whole-run curve of a **full** trace as a run spatially
    /// sampled with these parameters would (its tracked records, `N`
    /// exact): the estimate whose error against the exact curve validation
    /// measures. Refused on a sampled trace.
    pub emulate_spatial: Option<SpatialSampling>,
}

impl Default for AnalysisOptions {
    fn default() -> Self {
        AnalysisOptions {
            block: 64,
            code_window_k: None,
            max_k: FULL_TRACE_MAX_K,
            region_threshold_percent: 10.0,
            region_min_page: 4096,
            functions: None,
            cache_sizes: None,
            emulate_spatial: None,
        }
    }
}

/// Reads a whole trace and analyses it.
pub fn analyze_trace<R: Read + Send>(
    mut reader: TraceReader<R>,
    options: &AnalysisOptions,
) -> Result<Analysis, AnalysisError> {
    let mut analyzer = Analyzer::new(reader.header(), options)?;
    feed(&mut reader, &mut analyzer, || ())?;
    let totals = reader.totals().ok_or(AnalysisError::MissingTotals)?.clone();
    Ok(analyzer.finish(&totals))
}

/// Records the decoding thread hands over at once (512 KiB).
const DECODED_BATCH: usize = 1 << 14;

/// Where [`feed`]'s loop takes its records from.
enum Source<'a, R: Read> {
    /// Decoded here, record by record.
    Reader(&'a mut TraceReader<R>),
    /// Decoded by another thread, in batches (returned through `spent`
    /// for reuse).
    Batches {
        decoded: std::sync::mpsc::Receiver<Vec<RawRecord>>,
        spent: std::sync::mpsc::Sender<Vec<RawRecord>>,
    },
}

/// Streams every record of `reader` into `analyzer`, calling `tick` after
/// each (for progress).
///
/// Where the machine has a second core, a scoped thread decodes the
/// records and hands them over in batches, in order, so that decoding
/// overlaps the analysis (the records, and so the analysis, are the same
/// either way; a decoding error comes after every record before it).
///
/// The loop is compiled twice: for the baseline x86-64 the release build
/// targets, and for `x86-64-v3` (AVX2, BMI1/2, LZCNT, POPCNT), chosen at
/// run time when the CPU has those features. The hot path counts bits and
/// leading zeros on every record, which the baseline turns into ~12- and
/// 3-instruction sequences, and the reuse tracker's masked sums vectorise
/// twice as wide with AVX2. Both copies are the same source, and
/// `both_instruction_sets_give_the_same_analysis` checks them against
/// each other.
pub fn feed<R: Read + Send>(
    reader: &mut TraceReader<R>,
    analyzer: &mut Analyzer,
    mut tick: impl FnMut(),
) -> Result<(), AnalysisError> {
    if std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2) {
        let fed = std::thread::scope(|scope| {
            let (hand_over, decoded) = std::sync::mpsc::sync_channel(4);
            let (spent, returned) = std::sync::mpsc::channel();
            let decoder = std::thread::Builder::new()
                .name("decode".into())
                .spawn_scoped(scope, || decode_in_batches(reader, hand_over, returned))
                .ok()?;
            let batches: Source<'_, R> = Source::Batches { decoded, spent };
            let analysed = feed_from(batches, analyzer, &mut tick);
            let decoded = match decoder.join() {
                Ok(decoded) => decoded,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            Some(decoded.map_err(AnalysisError::from).and(analysed))
        });
        // No thread could be started: decode here.
        if let Some(fed) = fed {
            return fed;
        }
    }
    feed_from(Source::Reader(reader), analyzer, tick)
}

/// Decodes every record of `reader` into batches sent to `hand_over`,
/// reusing the ones that come back; a partial batch is sent before an
/// error is returned.
fn decode_in_batches<R: Read>(
    reader: &mut TraceReader<R>,
    hand_over: std::sync::mpsc::SyncSender<Vec<RawRecord>>,
    returned: std::sync::mpsc::Receiver<Vec<RawRecord>>,
) -> Result<(), TraceError> {
    let mut batch = Vec::with_capacity(DECODED_BATCH);
    let decoded = reader.for_each_raw(|raw| {
        batch.push(raw);
        if batch.len() == DECODED_BATCH {
            let mut next = returned
                .try_recv()
                .unwrap_or_else(|_| Vec::with_capacity(DECODED_BATCH));
            next.clear();
            // A closed channel means the analysis panicked: the scope
            // reports that once decoding ends.
            let _ = hand_over.send(std::mem::replace(&mut batch, next));
        }
    });
    if !batch.is_empty() {
        let _ = hand_over.send(batch);
    }
    decoded
}

/// [`feed`]'s loop over `source`, in the copy for this CPU.
fn feed_from<R: Read>(
    source: Source<'_, R>,
    analyzer: &mut Analyzer,
    tick: impl FnMut(),
) -> Result<(), AnalysisError> {
    #[cfg(target_arch = "x86_64")]
    if has_x86_64_v3() {
        // SAFETY: the CPU has every feature the function enables.
        return unsafe { feed_x86_64_v3(source, analyzer, tick) };
    }
    feed_baseline(source, analyzer, tick)
}

/// Whether the CPU runs `x86-64-v3` code (checked once).
#[cfg(target_arch = "x86_64")]
fn has_x86_64_v3() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("bmi1")
            && std::is_x86_feature_detected!("bmi2")
            && std::is_x86_feature_detected!("lzcnt")
            && std::is_x86_feature_detected!("popcnt")
    })
}

/// [`feed`]'s loop. Each compilation writes out its own closure: a
/// closure is compiled with the target features of the function that
/// defines it, and the record path (`push_load` down to the reuse tracker
/// and the window engines) is inlined into it.
macro_rules! feed_loop {
    ($source:expr, $analyzer:expr, $tick:expr) => {{
        let mut push = |raw: RawRecord| {
            if raw.spatial {
                $analyzer.push_spatial(raw.load, raw.addr, raw.thread);
            } else {
                $analyzer.push_load(raw.load, raw.addr, raw.sample, raw.thread);
            }
            $tick();
        };
        match $source {
            Source::Reader(reader) => Ok(reader.for_each_raw(push)?),
            Source::Batches { decoded, spent } => {
                for batch in decoded {
                    for &raw in &batch {
                        push(raw);
                    }
                    // The decoder may have finished: then the batch is dropped.
                    let _ = spent.send(batch);
                }
                Ok(())
            }
        }
    }};
}

/// [`feed`] for any x86-64 CPU (and other architectures).
fn feed_baseline<R: Read>(
    source: Source<'_, R>,
    analyzer: &mut Analyzer,
    mut tick: impl FnMut(),
) -> Result<(), AnalysisError> {
    feed_loop!(source, analyzer, tick)
}

/// [`feed`] compiled for `x86-64-v3`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
fn feed_x86_64_v3<R: Read>(
    source: Source<'_, R>,
    analyzer: &mut Analyzer,
    mut tick: impl FnMut(),
) -> Result<(), AnalysisError> {
    feed_loop!(source, analyzer, tick)
}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/// A load site as the analysis sees it.
#[derive(Clone, Debug)]
struct LoadSlot {
    ip: u64,
    class: LoadClass,
    implied: u32,
    function: Option<u32>,
    line: Option<String>,
    proxy: Option<u32>,
    included: bool,
    /// Its records: all of them while records come, then (`finish`) none
    /// when it is filtered out.
    count: u64,
    d_sum: u64,
    d_count: u64,
}

/// Everything about an address: whole-trace facts and, for the first
/// thread of the current sample, its per-piece positions — with its key,
/// one 64-byte slot of [`AddrTable`] (56 bytes at most), found with one
/// lookup per access.
#[derive(Clone, Copy, Debug)]
struct AddrEntry {
    /// Positions in the piece's trace-window sequence.
    lasts: Lasts,
    /// Positions in the owner function's sequence (same piece).
    function_lasts: Lasts,
    /// Strided and Irregular accesses, below [`COUNT_LIMIT`]; then the
    /// counts move to [`Analyzer::mixed_counts`] and this holds
    /// [`COUNTS_ELSEWHERE`].
    counts: [u32; 2],
    /// Piece of `lasts` and `function_lasts`.
    piece: u32,
    /// Function (index + 1) whose sequence state lives here; other
    /// functions keep theirs in [`FunctionEngine::addrs`].
    owner: u32,
    /// Last piece (index + 1) touching it, for the interval tree.
    interval_last: u32,
    /// Index of its line in [`Analyzer::line_arena`] ([`NO_LINE`] until
    /// linked): later accesses reach the line without a hash lookup.
    line: u32,
}

const NO_LINE: u32 = u32::MAX;
/// A class count in [`AddrEntry::counts`] stays below this.
const COUNT_LIMIT: u32 = u32::MAX - 1;
/// [`AddrEntry::counts`] of an address whose counts are in
/// [`Analyzer::mixed_counts`] (no count below [`COUNT_LIMIT`] equals it).
const COUNTS_ELSEWHERE: [u32; 2] = [u32::MAX; 2];

const _: () = assert!(std::mem::size_of::<LineSlot<AddrEntry>>() == 64);

impl Default for AddrEntry {
    fn default() -> Self {
        AddrEntry {
            lasts: NO_LASTS,
            function_lasts: NO_LASTS,
            counts: [0; 2],
            piece: 0,
            owner: 0,
            interval_last: 0,
            line: NO_LINE,
        }
    }
}

impl AddrEntry {
    /// Counts one access of `class` (0 Strided, 1 Irregular) to `addr`,
    /// moving the counts to `elsewhere` when one would reach
    /// [`COUNT_LIMIT`].
    #[inline]
    fn count(&mut self, addr: u64, class: usize, elsewhere: &mut Map<u64, [u64; 2]>) {
        if self.counts[class] < COUNT_LIMIT - 1 {
            self.counts[class] += 1;
        } else {
            self.count_elsewhere(addr, class, elsewhere);
        }
    }

    #[cold]
    fn count_elsewhere(&mut self, addr: u64, class: usize, elsewhere: &mut Map<u64, [u64; 2]>) {
        if self.counts == COUNTS_ELSEWHERE {
            elsewhere.get_mut(&addr).expect("counted elsewhere")[class] += 1;
        } else {
            let mut counts = self.counts.map(u64::from);
            counts[class] += 1;
            elsewhere.insert(addr, counts);
            self.counts = COUNTS_ELSEWHERE;
        }
    }

    /// Strided and Irregular accesses over the whole trace.
    fn class_counts(&self, addr: u64, elsewhere: &Map<u64, [u64; 2]>) -> [u64; 2] {
        if self.counts == COUNTS_ELSEWHERE {
            elsewhere[&addr]
        } else {
            self.counts.map(u64::from)
        }
    }
}

/// Everything about a 64-byte line: one cache line of
/// [`Analyzer::line_arena`], in order of first access (so a stream's lines
/// are neighbours).
#[derive(Clone, Copy, Debug, Default)]
#[repr(align(64))]
struct LineEntry {
    /// `addr >> 6`.
    line: u64,
    a: u64,
    d_sum: u64,
    d_count: u64,
    /// Position of its last access in the piece's sequence (`F_lines`).
    last: u64,
    /// Reuse-distance state when the access block is 64 bytes; its `piece`
    /// also stamps `last`.
    block: BlockLocal,
    interval_last: u32,
}

// SAFETY: integers and a `BlockLocal` (integers and a `bool`), for which
// zero bytes are valid values (and what `LineEntry::default()` holds).
unsafe impl Zeroable for LineEntry {}

/// Per-piece state of a line in a side map.
#[derive(Clone, Copy, Debug, Default)]
struct LineLocal {
    last: u64,
    block: BlockLocal,
}

/// Per-piece maps of a thread that is not the first of its sample (the
/// first one keeps its per-piece state inside the whole-trace entries).
#[derive(Default)]
struct SideMaps {
    addrs: Map<u64, AddrLocal>,
    lines: Map<u64, LineLocal>,
    blocks: Map<u64, BlockLocal>,
    /// Addresses and lines first touched in this piece; they enter the
    /// interval tree when the piece closes, in piece order.
    first_addrs: Vec<u64>,
    first_lines: Vec<u64>,
}

/// A function's own access sequence in the current piece.
struct FunctionEngine {
    engine: WindowEngine,
    /// Sequence state of addresses this function does not own (an address
    /// table, not a `HashMap`: a strided scan of another function's data
    /// then walks neighbouring slots instead of missing on every access).
    addrs: AddrTable<PackedSlot<AddrLocal>, ByteAddresses>,
}

/// Everything about one thread of the current sample.
struct ThreadState {
    piece: u32,
    thread: u32,
    engine: WindowEngine,
    reuse: ReuseTracker,
    functions: Vec<Option<Box<FunctionEngine>>>,
    side: Option<Box<SideMaps>>,
    a: u64,
    a_const: u64,
    d_sum: u64,
    d_count: u64,
}

/// Whole-trace accumulators of a function.
#[derive(Clone)]
struct FunctionAcc {
    name: String,
    /// The object whose code it is ([`TraceHeader::object_of_function`]).
    object: Option<String>,
    included: bool,
    a: u64,
    a_const: u64,
    sums: Vec<LevelSums>,
}

/// Streaming analysis: `Analyzer::push` every record in trace order,
/// then [`Analyzer::finish`].
pub struct Analyzer {
    options: AnalysisOptions,
    backend: Backend,
    sampling: memgaze_trace::Sampling,
    binary: Option<String>,
    command: Vec<String>,
    max_k: u32,
    code_k: u32,
    function_lo: u32,
    function_top: u32,
    block_shift: u32,
    min_page_shift: u32,

    slots: Vec<LoadSlot>,
    slot_index: Map<(u64, u8, u32), u32>,
    function_ranges: Vec<(u64, u64, u32)>,
    functions: Vec<FunctionAcc>,

    addrs: AddrTable<LineSlot<AddrEntry>, ByteAddresses>,
    /// Line number → index + 1 into `line_arena` (consulted only when an
    /// address is first seen).
    lines: AddrTable<PackedSlot<u32>, LineNumbers>,
    line_arena: HugePageVec<LineEntry>,
    blocks: Map<u64, BlockLocal>,
    /// Strided and Irregular accesses of addresses touched by both classes
    /// (or accessed 2^32 times).
    mixed_counts: Map<u64, [u64; 2]>,
    /// Accesses per (minimum zoom page, load site), for the functions and
    /// lines of hot regions; `page_run` batches runs of the same key.
    page_loads: PageLoads,
    /// Records waiting to be processed; their table slots are prefetched.
    pending: [Pending; PREFETCH_DISTANCE],
    /// Records pushed so far: record `n` waits in `pending[n % 16]`, the
    /// slot record `n + 16` takes when it comes.
    pushed: usize,

    contexts: Vec<ThreadState>,
    /// Threads of the current sample, in order of appearance (index into
    /// `contexts`).
    active: Vec<u32>,
    sample: Option<u64>,
    thread: u32,
    /// Every thread seen, sorted (`summary.threads`).
    threads: Vec<u32>,
    context: usize,
    next_piece: u32,
    intervals: IntervalBuilder,

    trace_sums: Vec<LevelSums>,
    a: u64,
    a_const: u64,
    a_all: u64,
    a_const_all: u64,
    records: u64,
    records_all: u64,
    filtered_out: u64,
    outside_functions: u64,
    empty_samples: u64,
    d_bins: [u64; 65],
    /// The largest reuse distance (0 while there is none).
    d_max: u64,
    captures: u64,
    survivals: u64,
    classified: bool,
    outside_binary: Option<u64>,
    notes: Vec<String>,
    /// The executable's `DT_NEEDED` libraries, from the header's labels.
    untraced_libraries: Vec<String>,
    /// The executable's file name, then each instrumented library's.
    instrumented_objects: Vec<String>,
    /// Each instrumented shared library's file name, from the header's
    /// labels (not the programs that joined the recording), when the
    /// header does not say their escapes were counted (a trace recorded
    /// before libraries counted them); else empty.
    uncounted_libraries: Vec<String>,
    /// Load-slot ranges `first..end` of the instrumented libraries and
    /// their names, in a spatially sampled recording (empty otherwise):
    /// libraries take no spatial samples, so their loads are left out of
    /// the whole-run tallies.
    unsampled_libraries: Vec<(u32, u32, String)>,
    /// Whole-run stack distances over the tracked blocks.
    whole: WholeRun,
    /// The time samples' in-window distances, for the whole-run prior
    /// (`None` unless a recorded spatially sampled trace's reuse blocks are
    /// the tracked blocks).
    window_distances: Option<Box<WindowDistances>>,
    cache_sizes: CacheSizes,
}

/// Dynamic coverage (docs/METRICS.md): the trace's and each function's
/// traced load executions (`Â`) against the estimated executions that ran
/// untraced after the counted escapes (`totals.escapes`). Fills in each
/// escaped-into function's `coverage_dynamic`; returns the trace's figure
/// and the escaped-into functions, most untraced first.
pub fn dynamic_coverage(
    summary: &Summary,
    functions: &mut [FunctionMetrics],
    totals: &TraceTotals,
) -> (f64, Vec<UntracedFunction>) {
    let mut by_function: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
    for e in &totals.escapes {
        let entry = by_function.entry(e.function.as_str()).or_default();
        // An untraced load's count is its executions, not escapes.
        if !e.untraced_load {
            entry.0 += e.count;
        }
        entry.1 += e.untraced_loads();
    }
    let ratio = |traced: f64, untraced: f64| {
        if traced + untraced > 0.0 {
            traced / (traced + untraced)
        } else {
            1.0
        }
    };
    let mut untraced: Vec<UntracedFunction> = by_function
        .into_iter()
        .map(|(name, (escapes, lost))| {
            let row = functions.iter_mut().find(|f| f.name == name);
            let traced = row.as_ref().and_then(|f| f.a_hat).unwrap_or(0.0);
            let coverage = ratio(traced, lost);
            if let Some(row) = row {
                row.coverage_dynamic = Some(coverage);
            }
            UntracedFunction {
                name: name.to_string(),
                escapes,
                traced,
                untraced: lost,
                coverage_dynamic: coverage,
            }
        })
        .collect();
    untraced.sort_by(|x, y| {
        y.untraced
            .total_cmp(&x.untraced)
            .then_with(|| x.name.cmp(&y.name))
    });
    let lost: f64 = untraced.iter().map(|f| f.untraced).sum();
    // Without records there is no Â (a run shorter than one period): the
    // recorder's exact count of instrumented load executions stands in, as
    // in `record`'s figure before any analysis, rather than "0% traced".
    let traced = summary
        .a_hat
        .filter(|a| *a > 0.0)
        .unwrap_or(totals.executions as f64);
    (ratio(traced, lost), untraced)
}

/// Why the dynamic coverage of a run is unknown: `missing` processes never
/// sent their escape counts.
pub fn escape_counts_missing_note(missing: u64) -> String {
    format!(
        "dynamic coverage unknown: {missing} process(es) ended without sending their escape counts (killed by a signal, or ended without the exit hook), so the escapes into original code they ran are not known"
    )
}

/// Executions of explicit loads no probe can trace, counted at run time
/// (`totals.escapes` entries marked `untraced_load`).
pub fn untraced_load_executions(totals: &TraceTotals) -> u64 {
    totals
        .escapes
        .iter()
        .filter(|e| e.untraced_load)
        .map(|e| e.count)
        .sum()
}

/// Dynamic coverage under which every command that records warns.
pub const DYNAMIC_COVERAGE_WARNING: f64 = 0.95;

/// The one-line warning of a run whose dynamic coverage is below
/// [`DYNAMIC_COVERAGE_WARNING`], naming the largest untraced functions
/// (without the `warning: ` prefix); `None` at or above it.
pub fn dynamic_coverage_warning(coverage: f64, untraced: &[UntracedFunction]) -> Option<String> {
    if coverage >= DYNAMIC_COVERAGE_WARNING {
        return None;
    }
    let names: Vec<String> = untraced
        .iter()
        .take(3)
        .map(|f| format!("{} (~{:.0} load executions untraced)", f.name, f.untraced))
        .collect();
    Some(format!(
        "dynamic coverage is {:.1}%: an estimated {:.1}% of the load executions ran untraced, in original code reached through indirect jumps the rewriter could not redirect or as loads no probe can trace (gathers, gs: sources); largest: {}",
        100.0 * coverage,
        100.0 * (1.0 - coverage),
        names.join(", ")
    ))
}

/// Dynamic coverage from a recording's totals alone, before any analysis
/// (`record`): in units of the recorder's executions of instrumented loads
/// (`executions` against escapes times the instrumented loads one reaches),
/// as the implied Constant loads are known only to the analysis. Returns
/// the figure and the escaped-into functions (their `traced` unknown: 0),
/// most untraced first; `None` without counted escapes.
pub fn recorded_dynamic_coverage(totals: &TraceTotals) -> Option<(f64, Vec<UntracedFunction>)> {
    if totals.escapes.is_empty() {
        return None;
    }
    let mut by_function: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
    for e in &totals.escapes {
        let entry = by_function.entry(e.function.as_str()).or_default();
        if e.untraced_load {
            // Each execution is one load no probe traced.
            entry.1 += e.untraced_loads();
        } else {
            entry.0 += e.count;
            entry.1 += e.count as f64 * f64::from(e.probed);
        }
    }
    let mut untraced: Vec<UntracedFunction> = by_function
        .into_iter()
        .map(|(name, (escapes, lost))| UntracedFunction {
            name: name.to_string(),
            escapes,
            traced: 0.0,
            untraced: lost,
            coverage_dynamic: 0.0,
        })
        .collect();
    untraced.sort_by(|x, y| {
        y.untraced
            .total_cmp(&x.untraced)
            .then_with(|| x.name.cmp(&y.name))
    });
    let lost: f64 = untraced.iter().map(|f| f.untraced).sum();
    let traced = totals.executions as f64;
    let coverage = if traced + lost > 0.0 {
        traced / (traced + lost)
    } else {
        1.0
    };
    Some((coverage, untraced))
}

/// The coverage note on counted escapes, if any ran, or on escape counts
/// that never arrived.
fn dynamic_coverage_note(summary: &Summary, untraced: &[UntracedFunction]) -> Option<String> {
    if let Some(missing) = summary.escape_counts_missing {
        return Some(escape_counts_missing_note(missing));
    }
    let coverage = summary.coverage_dynamic?;
    let escapes: u64 = untraced.iter().map(|f| f.escapes).sum();
    let loads = summary.untraced_load_executions.unwrap_or(0);
    if escapes == 0 && loads == 0 {
        return None;
    }
    let lost: f64 = untraced.iter().map(|f| f.untraced).sum();
    let loads = if loads > 0 {
        format!(" and {loads} executions of loads no probe can trace")
    } else {
        String::new()
    };
    Some(format!(
        "{escapes} escapes into original code{loads}: an estimated {lost:.0} load executions ran untraced (dynamic coverage {:.1}%, an estimate; docs/METRICS.md)",
        100.0 * coverage
    ))
}

/// The instrumented objects of a trace: the executable's file name (when
/// the header names a binary), then each instrumented library's in header
/// order.
fn instrumented_objects(header: &TraceHeader) -> Vec<String> {
    let executable = header
        .binary
        .as_ref()
        .and_then(|b| std::path::Path::new(&b.path).file_name())
        .map(|n| n.to_string_lossy().into_owned());
    executable
        .into_iter()
        .chain(instrumented_libraries(header))
        .collect()
}

/// The instrumented objects after the executable (libraries, and programs
/// that joined the recording), in header order.
fn instrumented_libraries(header: &TraceHeader) -> impl Iterator<Item = String> + '_ {
    header
        .labels
        .iter()
        .filter(|(key, _)| key == memgaze_trace::OBJECT_LABEL)
        .filter_map(|(_, value)| value.splitn(3, ' ').nth(2).map(str::to_string))
}

/// The load-slot ranges `first..end` of the instrumented shared libraries
/// the header's object labels (`<first function> <first load> <name>`)
/// name, with their names; a range ends where the next object begins.
fn library_load_ranges(header: &TraceHeader) -> Vec<(u32, u32, String)> {
    let objects: Vec<(u32, &str)> = header
        .labels
        .iter()
        .filter(|(key, _)| key == memgaze_trace::OBJECT_LABEL)
        .filter_map(|(_, value)| {
            let mut parts = value.splitn(3, ' ');
            let first_load = parts.nth(1)?.parse::<u32>().ok()?;
            Some((first_load, parts.next()?))
        })
        .collect();
    let loads = header.loads.len() as u32;
    objects
        .iter()
        .enumerate()
        .filter(|(_, (_, name))| is_shared_object_name(name))
        .map(|(i, &(first, name))| {
            let end = objects.get(i + 1).map_or(loads, |&(next, _)| next);
            (first, end.max(first), name.to_string())
        })
        .collect()
}

/// Whether the header's instrumented libraries counted their escapes and
/// untraced loads ([`memgaze_trace::LIBRARY_ESCAPES_LABEL`]).
fn library_escapes_counted(header: &TraceHeader) -> bool {
    header.labels.iter().any(|(key, value)| {
        key == memgaze_trace::LIBRARY_ESCAPES_LABEL
            && value == memgaze_trace::LIBRARY_ESCAPES_COUNTED
    })
}

/// Whether an object's file name is a shared object's (`libc.so.6`,
/// `libz.so`). The header labels libraries and programs that joined the
/// recording alike; a joined program has its own runtime and counts its
/// escapes, a library only where the header says so
/// ([`library_escapes_counted`]).
fn is_shared_object_name(name: &str) -> bool {
    name.ends_with(".so") || name.contains(".so.")
}

/// The instrumented libraries among `objects` that ran traced loads: no
/// counter sees their escapes or their loads no probe can trace.
fn uncounted_libraries(objects: &[ObjectLoadCoverage], libraries: &[String]) -> Vec<String> {
    objects
        .iter()
        .filter(|o| o.instrumented && o.loads_traced > 0.0 && libraries.contains(&o.object))
        .map(|o| o.object.clone())
        .collect()
}

/// What the dynamic coverage leaves out of the instrumented `libraries`
/// that ran ([`Coverage::uncounted_libraries`]).
pub fn uncounted_libraries_note(libraries: &[String]) -> String {
    format!(
        "escapes into original code and loads no probe can trace (gathers, gs: sources) in instrumented libraries are not counted, so the dynamic coverage and their shares by object leave them out: {}",
        libraries.join(", ")
    )
}

/// Executed-load coverage by object (docs/METRICS.md, "Coverage by
/// object"): each instrumented object's traced load executions (the `Â` of
/// its functions) against those plus the estimated untraced ones after the
/// escapes into its functions, then each uninstrumented library, whose
/// loads are unknown. Instrumented objects come most executed loads first.
/// Without `ρ` (`estimable` false: no sample held a record) the
/// instrumented objects' figures are unknown too.
pub fn coverage_by_object(
    estimable: bool,
    instrumented: &[String],
    uninstrumented: &[String],
    functions: &[FunctionMetrics],
    untraced: &[UntracedFunction],
) -> Vec<ObjectLoadCoverage> {
    if instrumented.is_empty() {
        return uninstrumented_rows(uninstrumented).collect();
    }
    let mut traced = vec![0.0; instrumented.len()];
    let mut lost = vec![0.0; instrumented.len()];
    let index_of = |object: Option<&str>| {
        object
            .and_then(|o| instrumented.iter().position(|name| name == o))
            .unwrap_or(0)
    };
    for f in functions {
        traced[index_of(f.object.as_deref())] += f.a_hat.unwrap_or(0.0);
    }
    for u in untraced {
        // A library function's name carries its object (`libc.so.6!memcpy`).
        let object = functions
            .iter()
            .find(|f| f.name == u.name)
            .and_then(|f| f.object.as_deref())
            .or_else(|| u.name.split_once('!').map(|(o, _)| o));
        lost[index_of(object)] += u.untraced;
    }
    let mut rows: Vec<ObjectLoadCoverage> = instrumented
        .iter()
        .zip(traced.iter().zip(&lost))
        .enumerate()
        // A library whose original ran instead of its copy (`dlopen` by
        // path) is one uninstrumented row, not also an empty instrumented one.
        .filter(|&(index, (object, (&traced, &lost)))| {
            index == 0 || traced + lost > 0.0 || !uninstrumented.contains(object)
        })
        .map(|(_, (object, (&traced, &lost)))| {
            let executed = traced + lost;
            ObjectLoadCoverage {
                object: object.clone(),
                instrumented: true,
                loads_executed: estimable.then_some(executed),
                loads_traced: traced,
                share: estimable.then_some(if executed > 0.0 {
                    traced / executed
                } else {
                    1.0
                }),
            }
        })
        .collect();
    rows.sort_by(|x, y| {
        y.loads_executed
            .unwrap_or(0.0)
            .total_cmp(&x.loads_executed.unwrap_or(0.0))
            .then_with(|| x.object.cmp(&y.object))
    });
    rows.extend(uninstrumented_rows(uninstrumented));
    rows
}

/// The rows of libraries that ran uninstrumented: loads unknown.
fn uninstrumented_rows(libraries: &[String]) -> impl Iterator<Item = ObjectLoadCoverage> + '_ {
    libraries.iter().map(|object| ObjectLoadCoverage {
        object: object.clone(),
        instrumented: false,
        loads_executed: None,
        loads_traced: 0.0,
        share: None,
    })
}

/// One line on [`Summary::coverage_by_object`]: each object's traced share
/// of its executed loads, "no loads executed", or "not instrumented" (`app
/// 100.0%, libc.so.6 not instrumented`). An object that executed no load
/// has `share` 1 in the JSON; "100.0%" would read as all of its loads
/// traced.
pub fn coverage_by_object_line(objects: &[ObjectLoadCoverage]) -> String {
    objects
        .iter()
        .map(|o| match o.share {
            Some(_) if o.loads_executed.is_some_and(|n| n <= 0.0) => {
                format!("{} no loads executed", o.object)
            }
            Some(share) => format!("{} {:.1}%", o.object, 100.0 * share),
            None if o.instrumented => format!("{} unknown (no ρ)", o.object),
            None => format!("{} not instrumented", o.object),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The note naming the instrumented objects whose loads partly ran
/// untraced (after escapes), most estimated untraced load executions
/// first; `None` when there are none. Uninstrumented libraries have their
/// own note ([`untraced_libraries_note`]).
fn largest_untraced_objects_note(objects: &[ObjectLoadCoverage]) -> Option<String> {
    let mut partly: Vec<&ObjectLoadCoverage> = objects
        .iter()
        .filter(|o| o.instrumented && o.loads_untraced() > 0.0)
        .collect();
    partly.sort_by(|x, y| y.loads_untraced().total_cmp(&x.loads_untraced()));
    let names: Vec<String> = partly
        .iter()
        .map(|o| {
            format!(
                "{} ~{:.0} of ~{:.0} ({:.1}% traced)",
                o.object,
                o.loads_untraced(),
                o.loads_executed.unwrap_or(0.0),
                100.0 * o.share.unwrap_or(1.0)
            )
        })
        .collect();
    (!names.is_empty()).then(|| {
        format!(
            "load executions untraced after escapes, by object: {}",
            names.join(", ")
        )
    })
}

/// What the coverage says about the shared libraries that ran
/// uninstrumented (not selected by `--libs`, or `dlopen`ed): their loads
/// are missing from every metric.
pub fn untraced_libraries_note(libraries: &[String]) -> String {
    format!(
        "loads in shared libraries that ran uninstrumented are not traced: {}",
        libraries.join(", ")
    )
}

impl Analyzer {
    /// Adds libraries that ran uninstrumented beyond those the header
    /// named (found loaded at the run's end: `dlopen`ed ones and what they
    /// need), each once.
    pub fn add_untraced_libraries(&mut self, libraries: &[String]) {
        for library in libraries {
            if !self.untraced_libraries.contains(library) {
                self.untraced_libraries.push(library.clone());
            }
        }
    }

    /// An analyzer for a trace with this header.
    pub fn new(header: &TraceHeader, options: &AnalysisOptions) -> Result<Self, AnalysisError> {
        if !options.block.is_power_of_two() {
            return Err(AnalysisError::Block {
                block: options.block,
            });
        }
        if !options.region_min_page.is_power_of_two() || options.region_min_page < 64 {
            return Err(AnalysisError::RegionMinPage {
                page: options.region_min_page,
            });
        }
        if !(0.0..=100.0).contains(&options.region_threshold_percent) {
            return Err(AnalysisError::HotThreshold {
                percent: options.region_threshold_percent,
            });
        }
        if let Some(k) = options.code_window_k
            && k > MAX_CODE_WINDOW_K
        {
            return Err(AnalysisError::CodeWindow { k });
        }
        let matcher = options
            .functions
            .as_deref()
            .map(memgaze_trace::function_matcher)
            .transpose()?;
        let sampling = header.sampling;
        let tracking = match (options.emulate_spatial, sampling.is_full(), header.spatial) {
            (Some(_), false, _) => return Err(AnalysisError::EmulateOnSampled),
            (Some(spatial), true, _) => Tracking::Sampled {
                sampling: spatial,
                emulated: true,
            },
            (None, true, _) => Tracking::Every,
            (None, false, Some(spatial)) => Tracking::Sampled {
                sampling: spatial,
                emulated: false,
            },
            (None, false, None) => Tracking::Off,
        };
        let cache_sizes = options
            .cache_sizes
            .clone()
            .unwrap_or_else(locality::machine_cache_sizes);
        let window = if sampling.is_full() {
            u64::MAX
        } else {
            sampling.window
        };
        let log2_w = 63 - window.leading_zeros();
        let max_k = options.max_k.min(log2_w).min(LEVELS as u32 - 1);
        let code_k = options
            .code_window_k
            .unwrap_or_else(|| 63 - window.min(1024).leading_zeros());
        let function_lo = code_k.min(3);
        let function_top = max_k.max(code_k).max(function_lo);

        let functions: Vec<FunctionAcc> = header
            .functions
            .iter()
            .enumerate()
            .map(|(i, f)| FunctionAcc {
                name: f.name.clone(),
                object: header.object_of_function(i as u32),
                included: matcher.as_ref().is_none_or(|m| m.is_match(&f.name)),
                a: 0,
                a_const: 0,
                sums: vec![LevelSums::default(); LEVELS],
            })
            .collect();
        let mut function_ranges: Vec<(u64, u64, u32)> = header
            .functions
            .iter()
            .enumerate()
            .map(|(i, f)| (f.start, f.end, i as u32))
            .collect();
        function_ranges.sort_unstable();

        let mut analyzer = Analyzer {
            options: options.clone(),
            backend: header.backend,
            sampling,
            binary: header.binary.as_ref().map(|b| b.path.clone()),
            command: header.command.clone(),
            untraced_libraries: header.shared_libraries().map(str::to_string).collect(),
            instrumented_objects: instrumented_objects(header),
            uncounted_libraries: instrumented_libraries(header)
                .filter(|name| is_shared_object_name(name))
                .filter(|_| !library_escapes_counted(header))
                .collect(),
            unsampled_libraries: match tracking {
                Tracking::Sampled {
                    emulated: false, ..
                } => library_load_ranges(header),
                _ => Vec::new(),
            },
            max_k,
            code_k,
            function_lo,
            function_top,
            block_shift: options.block.trailing_zeros(),
            min_page_shift: options.region_min_page.trailing_zeros(),
            slots: Vec::with_capacity(header.loads.len()),
            slot_index: Map::default(),
            function_ranges,
            functions,
            addrs: AddrTable::new(),
            lines: AddrTable::new(),
            line_arena: HugePageVec::new(),
            blocks: Map::default(),
            mixed_counts: Map::default(),
            page_loads: PageLoads::new(),
            pending: [Pending::default(); PREFETCH_DISTANCE],
            pushed: 0,
            contexts: Vec::new(),
            active: Vec::new(),
            sample: None,
            thread: 0,
            threads: Vec::new(),
            context: 0,
            next_piece: 1,
            intervals: IntervalBuilder::new(),
            trace_sums: vec![LevelSums::default(); LEVELS],
            a: 0,
            a_const: 0,
            a_all: 0,
            a_const_all: 0,
            records: 0,
            records_all: 0,
            filtered_out: 0,
            outside_functions: 0,
            empty_samples: 0,
            d_bins: [0; 65],
            d_max: 0,
            captures: 0,
            survivals: 0,
            classified: true,
            outside_binary: None,
            notes: Vec::new(),
            whole: WholeRun::new(tracking, &cache_sizes),
            window_distances: match tracking {
                Tracking::Sampled {
                    sampling,
                    emulated: false,
                } if sampling.block_shift == options.block.trailing_zeros() => Some(Box::default()),
                _ => None,
            },
            cache_sizes,
        };
        for load in &header.loads {
            let function = load.function.or_else(|| analyzer.function_of(load.ip));
            analyzer.add_slot(
                load.ip,
                load.class,
                load.implied,
                function,
                load.line.clone(),
                load.proxy,
            );
        }
        Ok(analyzer)
    }

    /// Records loads that were counted but lie outside the analysed binary
    /// (Lackey import).
    pub fn set_outside_binary(&mut self, loads: u64) {
        self.outside_binary = Some(loads);
    }

    /// Adds a note to the result's coverage section.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    fn function_of(&self, ip: u64) -> Option<u32> {
        let i = self
            .function_ranges
            .partition_point(|&(start, _, _)| start <= ip);
        self.function_ranges[..i]
            .iter()
            .rev()
            .take(4)
            .find(|&&(start, end, _)| start <= ip && ip < end)
            .map(|&(_, _, f)| f)
    }

    fn add_slot(
        &mut self,
        ip: u64,
        class: LoadClass,
        implied: u32,
        function: Option<u32>,
        line: Option<String>,
        proxy: Option<u32>,
    ) -> u32 {
        let included = match function {
            Some(f) => self.functions[f as usize].included,
            None => self.options.functions.is_none(),
        };
        let slot = self.slots.len() as u32;
        self.slots.push(LoadSlot {
            ip,
            class,
            implied,
            function,
            line,
            proxy,
            included,
            count: 0,
            d_sum: 0,
            d_count: 0,
        });
        self.slot_index
            .entry((ip, class.code(), implied))
            .or_insert(slot);
        slot
    }

    /// Registers a load site the header did not list (importers that learn
    /// their loads as they go); returns its index for [`Self::push_load`].
    /// Its function, when `None`, is looked up from the header's functions.
    pub fn add_load(&mut self, load: LoadEntry) -> u32 {
        let function = load.function.or_else(|| self.function_of(load.ip));
        self.add_slot(
            load.ip,
            load.class,
            load.implied,
            function,
            load.line,
            load.proxy,
        )
    }

    /// Load sites known so far (the header's, then those added).
    pub fn loads(&self) -> usize {
        self.slots.len()
    }

    /// Functions known so far (the header's, then those added).
    pub fn functions(&self) -> usize {
        self.functions.len()
    }

    /// Adds an instrumented object the header did not list (another
    /// program that joined a recording): its `functions` follow the known
    /// ones ([`Self::functions`]) and its `loads` the known load sites
    /// ([`Self::loads`]), as a header with an `object` label for it would
    /// list them; a load's function is its own, never looked up by address
    /// (the object's addresses are another address space's).
    pub fn add_object(
        &mut self,
        name: String,
        functions: Vec<FunctionEntry>,
        loads: Vec<LoadEntry>,
    ) {
        let matcher = self
            .options
            .functions
            .as_deref()
            .and_then(|glob| memgaze_trace::function_matcher(glob).ok());
        self.functions
            .extend(functions.into_iter().map(|f| FunctionAcc {
                included: matcher.as_ref().is_none_or(|m| m.is_match(&f.name)),
                name: f.name,
                object: Some(name.clone()),
                a: 0,
                a_const: 0,
                sums: vec![LevelSums::default(); LEVELS],
            }));
        for load in loads {
            self.add_slot(
                load.ip,
                load.class,
                load.implied,
                load.function,
                load.line,
                load.proxy,
            );
        }
        self.instrumented_objects.push(name);
    }

    /// One record, in trace order. Records of a sample must be contiguous;
    /// a sample whose records come from several threads is split per thread.
    /// Spatial records enter only the whole-run curve ([`Analyzer::push_spatial`]).
    pub fn push(&mut self, record: &memgaze_trace::Record) {
        let key = (record.ip, record.class.code(), record.implied);
        let slot = match self.slot_index.get(&key) {
            Some(&slot) => slot,
            None => {
                let function = self.function_of(record.ip);
                self.add_slot(
                    record.ip,
                    record.class,
                    record.implied,
                    function,
                    None,
                    None,
                )
            }
        };
        if record.spatial {
            self.push_spatial(slot, record.addr, record.thread);
        } else {
            self.push_load(slot, record.addr, record.sample, record.thread);
        }
    }

    /// A record taken by spatial sampling outside any time sample
    /// ([`memgaze_trace::Record::spatial`]): it enters the whole-run curve only, never
    /// the time-window metrics, ρ or the record counts.
    pub fn push_spatial(&mut self, load: u32, addr: u64, thread: u32) {
        self.whole.spatial_records += 1;
        let slot = &self.slots[load as usize];
        let usable = matches!(
            self.whole.tracking,
            Tracking::Sampled {
                emulated: false,
                ..
            }
        ) && slot.class.is_access();
        if !usable {
            self.whole.spatial_ignored += 1;
        } else if slot.included {
            self.whole.access(load, addr, thread);
        }
    }

    /// One record given by its load-site index into the header's `loads`
    /// (the fast path of [`analyze_trace`]).
    ///
    /// Records are processed 16 records late, in order:
    /// meanwhile the table slots of their address and line are prefetched,
    /// so the cache misses of irregular traces overlap.
    #[inline(always)]
    pub fn push_load(&mut self, load: u32, addr: u64, sample: u64, thread: u32) {
        // In program order, before the prefetch queue: spatial records
        // (`push_spatial`) take effect at once too.
        if self.whole.is_on() {
            let slot = &self.slots[load as usize];
            if slot.class.is_access() && slot.included && self.whole.tracks(addr) {
                self.whole.access(load, addr, thread);
            }
        }
        let n = self.pushed;
        if n >= PREFETCH_DISTANCE {
            self.process(self.pending[n % PREFETCH_DISTANCE]);
        }
        if self.slots[load as usize].class.is_access() {
            self.addrs.prefetch_two(addr);
        }
        // Second stage, for the record half a queue older: its address
        // slot has arrived by now, so its line entry can be fetched.
        if n > PREFETCH_DISTANCE / 2 {
            let at = (n - PREFETCH_DISTANCE / 2) % PREFETCH_DISTANCE;
            let older = self.pending[at];
            let slot = &self.slots[older.load as usize];
            if slot.class.is_access() {
                match self.addrs.index_of(older.addr) {
                    Some(i) => {
                        self.pending[at].hint = i as u32;
                        let e = self.addrs.value_at(i);
                        if e.line != NO_LINE {
                            addr_table::prefetch(
                                &self.line_arena[e.line as usize] as *const LineEntry as *const u8,
                            )
                        } else {
                            self.lines.prefetch(older.addr >> 6)
                        }
                        let strided = slot.class == LoadClass::Strided;
                        if let Some(c) = self.contexts.get(self.context) {
                            // An access of the other class than the
                            // address's last one registers it as mixed.
                            if e.piece == c.piece && c.side.is_none() {
                                c.engine.prefetch_mark(older.addr, &e.lasts, strided);
                            }
                            // A function that does not own the address
                            // keeps its positions in its engine's own table.
                            if let Some(f) = slot.function
                                && e.owner != 0
                                && let Some(fe) =
                                    c.functions.get(f as usize).and_then(|fe| fe.as_deref())
                            {
                                if e.owner != f + 1 {
                                    fe.addrs.prefetch(older.addr);
                                } else if e.piece == c.piece && fe.engine.piece() == c.piece {
                                    fe.engine
                                        .prefetch_mark(older.addr, &e.function_lasts, strided);
                                }
                            }
                        }
                    }
                    None => self.lines.prefetch(older.addr >> 6),
                }
            }
        }
        self.pending[n % PREFETCH_DISTANCE] = Pending {
            load,
            addr,
            sample,
            thread,
            hint: NO_HINT,
        };
        self.pushed = n + 1;
    }

    /// Processes every pending record (the queue is then empty).
    fn drain(&mut self) {
        let n = self.pushed;
        for i in n.saturating_sub(PREFETCH_DISTANCE)..n {
            self.process(self.pending[i % PREFETCH_DISTANCE]);
        }
        self.pushed = 0;
    }

    #[inline(always)]
    fn process(&mut self, record: Pending) {
        let Pending {
            load,
            addr,
            sample,
            thread,
            hint,
        } = record;
        if self.sample != Some(sample) || self.thread != thread {
            self.switch(sample, thread);
        }
        let slot = &mut self.slots[load as usize];
        // Every record counts on its load site only: the trace's and the
        // functions' record, A and A_const counts are the sites' counts
        // added up in `finish` (`count_records`).
        slot.count += 1;
        if !slot.included {
            return;
        }
        let implied = u64::from(slot.implied);
        let function = slot.function;
        if slot.class.is_access() {
            let strided = slot.class == LoadClass::Strided;
            self.access(load, function, addr, hint, strided, implied);
        } else {
            self.constant(function, 1 + implied);
        }
    }

    fn constant(&mut self, function: Option<u32>, loads: u64) {
        let ctx = &mut self.contexts[self.context];
        ctx.a_const += loads;
        ctx.engine.constant(loads);
        if let Some(f) = function {
            let fe = function_engine(
                &mut ctx.functions,
                f,
                ctx.piece,
                self.function_lo,
                self.function_top,
            );
            fe.engine.constant(loads);
        }
    }

    #[inline(always)]
    fn access(
        &mut self,
        load: u32,
        function: Option<u32>,
        addr: u64,
        hint: u32,
        strided: bool,
        implied: u64,
    ) {
        let block_shift = self.block_shift;
        let lines_are_blocks = block_shift == 6;
        let ThreadState {
            piece,
            thread: _,
            engine,
            reuse,
            functions,
            side,
            a,
            a_const,
            d_sum,
            d_count,
        } = &mut self.contexts[self.context];
        let piece = *piece;
        *a += 1;
        *a_const += implied;

        // Make room on the reuse-distance time axis before borrowing entries.
        if reuse.needs_room() {
            // The tracker's block ids: line-arena indices for the first
            // thread with 64-byte blocks, else line or block numbers.
            match (side.as_deref_mut(), lines_are_blocks) {
                (None, true) => reuse.compact(|b, t| self.line_arena[b as usize].block.time = t),
                (None, false) => {
                    reuse.compact(|b, t| self.blocks.get_mut(&b).expect("live block").time = t)
                }
                (Some(side), true) => {
                    reuse.compact(|b, t| side.lines.get_mut(&b).expect("live line").block.time = t)
                }
                (Some(side), false) => {
                    reuse.compact(|b, t| side.blocks.get_mut(&b).expect("live block").time = t)
                }
            }
        }

        // Which loads touch which memory, for the hot regions.
        self.page_loads.add(addr >> self.min_page_shift, load);

        // The address entry, and through it the line entry.
        let line = addr >> 6;
        let addr_entry = self.addrs.entry_hinted(addr, hint);
        if addr_entry.line == NO_LINE {
            let index = self.lines.entry(line);
            if *index == 0 {
                self.line_arena.push(LineEntry {
                    line,
                    ..LineEntry::default()
                });
                *index = self.line_arena.len() as u32;
            }
            addr_entry.line = *index - 1;
        }
        let line_index = addr_entry.line;

        // The line: F_lines windows, location statistics, reuse distance.
        let entry = &mut self.line_arena[line_index as usize];
        entry.a += 1;
        let position = engine.position();
        let (previous_line, first_in_piece) = match side.as_deref_mut() {
            None => {
                let first = entry.block.piece != piece;
                let previous = if first { NONE } else { entry.last };
                entry.last = position;
                if !lines_are_blocks {
                    entry.block.piece = piece;
                }
                (previous, first)
            }
            Some(side) => {
                let local = side.lines.entry(line).or_default();
                let first = local.block.piece != piece;
                let previous = if first { NONE } else { local.last };
                local.last = position;
                if !lines_are_blocks {
                    local.block.piece = piece;
                }
                if first {
                    side.first_lines.push(line);
                }
                (previous, first)
            }
        };
        if first_in_piece && side.is_none() {
            self.intervals.first_line(&mut entry.interval_last);
        }
        engine.line(previous_line);
        let distance = if lines_are_blocks {
            match side.as_deref_mut() {
                None => reuse.access(u64::from(line_index), &mut entry.block),
                Some(side) => {
                    let local = &mut side.lines.get_mut(&line).expect("just inserted").block;
                    reuse.access(line, local)
                }
            }
        } else {
            let block = addr >> block_shift;
            let block_local = match side.as_deref_mut() {
                None => self.blocks.entry(block).or_default(),
                Some(side) => side.blocks.entry(block).or_default(),
            };
            reuse.access(block, block_local)
        };
        if let Some(prior) = self.window_distances.as_deref_mut() {
            // A cold access was just counted among the live blocks.
            prior.add(
                distance,
                u64::from(reuse.live()) - u64::from(distance.is_none()),
            );
        }
        if let Some(d) = distance {
            entry.d_sum += d;
            entry.d_count += 1;
            *d_sum += d;
            *d_count += 1;
            // `leading_zeros(0)` is 64: a distance of 0 lands in bin 0.
            self.d_bins[64 - d.leading_zeros() as usize] += 1;
            self.d_max = self.d_max.max(d);
            // The trace's and the functions' sums are the load sites' sums,
            // added up in `finish`; accesses without one are cold.
            let slot = &mut self.slots[load as usize];
            slot.d_sum += d;
            slot.d_count += 1;
        }

        // The address: whole-trace class counts, footprints of every window
        // size, and the owner function's code windows.
        let entry = addr_entry;
        let class = !strided as usize;
        entry.count(addr, class, &mut self.mixed_counts);
        if let Some(f) = function
            && entry.owner == 0
            && side.is_none()
        {
            entry.owner = f + 1;
        }
        let owned = side.is_none() && function.is_some_and(|f| entry.owner == f + 1);
        let closes = match side.as_deref_mut() {
            None => {
                if entry.piece != piece {
                    entry.piece = piece;
                    entry.lasts = NO_LASTS;
                    entry.function_lasts = NO_LASTS;
                }
                if entry.interval_last != self.intervals.current_mark() {
                    self.intervals.first_address(&mut entry.interval_last);
                }
                engine.access(addr, &mut entry.lasts, strided, implied)
            }
            Some(side) => {
                let local = side.addrs.entry(addr).or_default();
                if local.piece != piece {
                    side.first_addrs.push(addr);
                }
                engine.access(addr, local.for_piece(piece), strided, implied)
            }
        };
        let function_closes = match function {
            Some(f) => {
                let fe = function_engine(functions, f, piece, self.function_lo, self.function_top);
                let lasts = if owned {
                    &mut entry.function_lasts
                } else {
                    fe.addrs.entry(addr).for_piece(piece)
                };
                fe.engine.access(addr, lasts, strided, implied)
            }
            None => false,
        };
        if closes {
            match side.as_deref() {
                None => engine.close(
                    |a| last_of(&self.addrs.get(a).expect("address seen").lasts),
                    &mut self.trace_sums,
                ),
                Some(side) => {
                    engine.close(|a| last_of(&side.addrs[&a].lasts), &mut self.trace_sums)
                }
            }
        }
        if function_closes {
            let f = function.expect("function closes");
            let fe = functions[f as usize].as_deref_mut().expect("engine exists");
            let owner = f + 1;
            let addrs = &self.addrs;
            let own = &fe.addrs;
            let primary = side.is_none();
            fe.engine.close(
                |a| match addrs.get(a) {
                    Some(e) if primary && e.owner == owner => last_of(&e.function_lasts),
                    _ => last_of(&own.get(a).expect("address seen").lasts),
                },
                &mut self.functions[f as usize].sums,
            );
        }
    }

    /// A record of another sample or thread than the previous one.
    #[cold]
    fn switch(&mut self, sample: u64, thread: u32) {
        if self.sample != Some(sample) {
            self.end_sample();
            let gap = match self.sample {
                None => sample,
                Some(previous) if sample > previous => sample - previous - 1,
                Some(_) => 0,
            };
            for _ in 0..gap {
                self.empty_piece();
            }
            self.sample = Some(sample);
            self.active.clear();
        }
        self.thread = thread;
        if let Err(at) = self.threads.binary_search(&thread) {
            self.threads.insert(at, thread);
        }
        let contexts = &self.contexts;
        let found = self
            .active
            .iter()
            .position(|&c| contexts[c as usize].thread == thread);
        self.context = match found {
            Some(i) => self.active[i] as usize,
            None => {
                let index = self.active.len();
                if self.contexts.len() <= index {
                    self.contexts.push(ThreadState::new(index > 0));
                }
                let piece = self.next_piece;
                self.next_piece += 1;
                let top = self.max_k.max(3);
                self.contexts[index].start(piece, thread, top);
                self.active.push(index as u32);
                index
            }
        };
    }

    /// A sample without records.
    fn empty_piece(&mut self) {
        self.next_piece += 1;
        self.empty_samples += 1;
        self.intervals.close_piece(0, 0, 0, 0);
    }

    /// Closes every thread piece of the current sample, in order.
    fn end_sample(&mut self) {
        for i in 0..self.active.len() {
            let index = self.active[i] as usize;
            let ctx = &mut self.contexts[index];
            let (captures, survivals) = ctx.reuse.reset(0);
            self.captures += captures;
            self.survivals += survivals;
            if let Some(side) = ctx.side.as_deref_mut() {
                for addr in side.first_addrs.drain(..) {
                    let entry = self.addrs.get_mut(addr).expect("address seen");
                    self.intervals.first_address(&mut entry.interval_last);
                }
                for line in side.first_lines.drain(..) {
                    let index = *self.lines.get(line).expect("line seen") - 1;
                    let entry = &mut self.line_arena[index as usize];
                    self.intervals.first_line(&mut entry.interval_last);
                }
            }
            self.intervals
                .close_piece(ctx.a, ctx.a_const, ctx.d_sum, ctx.d_count);
        }
        self.active.clear();
    }

    /// Adds up the load sites' record counts into the trace's (records,
    /// `A`, `A_const`, filtered out, outside functions) and the functions'
    /// (`A`, `A_const`); then a site whose records were filtered out counts
    /// none, as the tables show only what was analysed.
    fn count_records(&mut self) {
        for slot in &mut self.slots {
            let n = slot.count;
            let implied = n * u64::from(slot.implied);
            let (a, a_const) = if slot.class.is_access() {
                (n, implied)
            } else {
                (0, n + implied)
            };
            self.records_all += n;
            self.a_all += a;
            self.a_const_all += a_const;
            if !slot.included {
                self.filtered_out += n;
                slot.count = 0;
                continue;
            }
            self.records += n;
            self.a += a;
            self.a_const += a_const;
            match slot.function {
                Some(f) => {
                    let acc = &mut self.functions[f as usize];
                    acc.a += a;
                    acc.a_const += a_const;
                }
                None => self.outside_functions += n,
            }
        }
    }

    /// The metrics. `totals` gives ρ's numerator and the number of samples
    /// (trailing empty samples have no records to announce them).
    pub fn finish(mut self, totals: &TraceTotals) -> Analysis {
        self.drain();
        self.whole.settle();
        self.end_sample();
        self.count_records();

        let seen = self.sample.map_or(0, |s| s + 1);
        for _ in seen..totals.samples {
            self.empty_piece();
        }
        let pieces = u64::from(self.next_piece - 1);
        let rho = self.rho(totals);
        let reuse = self.reuse_sums();
        let mut summary = self.summary(rho, pieces, &reuse, totals);
        let trace_windows = window_rows(&self.trace_sums, 3, self.max_k, true);
        if let Some(prior) = &self.window_distances {
            self.whole.smooth(&prior.survival());
        } else {
            self.whole.smooth(&[1.0]);
        }
        let tallies = self.whole.is_on().then(|| self.tallies(rho));
        if let Some(t) = &tallies {
            self.whole_run_summary(&mut summary, &t.total);
        }
        let mut function_rows = self.function_rows(rho, &reuse, tallies.as_ref());
        let mut uncounted = Vec::new();
        let untraced_functions = if self.backend == Backend::Soft {
            let (overall, untraced) = dynamic_coverage(&summary, &mut function_rows, totals);
            summary.untraced_load_executions =
                Some(untraced_load_executions(totals)).filter(|&n| n > 0);
            // A process that took its escape counts along may have escaped
            // any number of times: the figure is unknown, not 1.
            if totals.escape_counts_missing > 0 {
                summary.escape_counts_missing = Some(totals.escape_counts_missing);
            } else {
                summary.coverage_dynamic = Some(overall);
            }
            summary.coverage_by_object = coverage_by_object(
                summary.a_hat.is_some(),
                &self.instrumented_objects,
                &self.untraced_libraries,
                &function_rows,
                &untraced,
            );
            uncounted = uncounted_libraries(&summary.coverage_by_object, &self.uncounted_libraries);
            untraced
        } else {
            Vec::new()
        };
        let lines = tallies
            .as_ref()
            .map_or_else(Vec::new, |t| self.line_rows(t));
        let loads = self.load_rows();
        let region_rows = self.region_rows();
        let bins = self.reuse_bins();
        let intervals = std::mem::replace(&mut self.intervals, IntervalBuilder::new()).finish(rho);
        let mut notes = self.notes(totals);
        let objects = self.object_coverage();
        if !objects.is_empty() {
            let shares: Vec<String> = objects
                .iter()
                .map(|o| format!("{} {:.1}%", o.object, 100.0 * o.share))
                .collect();
            notes.push(format!("accesses traced by object: {}", shares.join(", ")));
        }
        if let Some(note) = dynamic_coverage_note(&summary, &untraced_functions) {
            notes.push(note);
        }
        if let Some(note) = largest_untraced_objects_note(&summary.coverage_by_object) {
            notes.push(note);
        }
        if !uncounted.is_empty() {
            notes.push(uncounted_libraries_note(&uncounted));
        }
        let options = &self.options;

        Analysis {
            schema: ANALYSIS_SCHEMA.to_string(),
            run: RunInfo {
                backend: self.backend,
                full: self.sampling.is_full(),
                window: (!self.sampling.is_full()).then_some(self.sampling.window),
                period: (!self.sampling.is_full()).then_some(self.sampling.period),
                binary: self.binary.clone(),
                command: self.command.clone(),
                block: options.block,
                code_window_k: self.code_k,
                max_k: self.max_k,
                region_threshold_percent: options.region_threshold_percent,
                region_min_page: options.region_min_page,
                functions_filter: options.functions.clone(),
                cache_sizes: self.whole.is_on().then(|| self.cache_sizes.clone()),
            },
            summary,
            trace_windows,
            functions: function_rows,
            loads,
            regions: region_rows,
            reuse: ReuseHistogram {
                block: options.block,
                bins,
                cold: self.a - reuse.d_count,
                captures: self.captures,
                survivals: self.survivals,
            },
            intervals,
            lines,
            coverage: Coverage {
                records: self.records_all,
                spatial_records: (self.whole.spatial_records > 0)
                    .then_some(self.whole.spatial_records),
                trace_samples: totals.samples.max(seen),
                empty_samples: self.empty_samples,
                outside_functions: self.outside_functions,
                filtered_out: self.filtered_out,
                dropped: totals.dropped,
                complete: totals.complete,
                classified: self.classified,
                outside_binary: self.outside_binary,
                untraced_libraries: self.untraced_libraries.clone(),
                objects,
                untraced_functions,
                uncounted_libraries: uncounted,
                notes,
            },
        }
    }

    /// Reuse distances are summed per load site only: the trace's and each
    /// function's sums add up their sites'.
    fn reuse_sums(&self) -> ReuseSums {
        let (mut d_sum, mut d_count) = (0u64, 0u64);
        let mut function_d = vec![(0u64, 0u64); self.functions.len()];
        for slot in &self.slots {
            d_sum += slot.d_sum;
            d_count += slot.d_count;
            if let Some(f) = slot.function {
                function_d[f as usize].0 += slot.d_sum;
                function_d[f as usize].1 += slot.d_count;
            }
        }
        ReuseSums {
            d_sum,
            d_count,
            function_d,
        }
    }

    /// The trace's summary row.
    fn summary(
        &self,
        rho: Option<f64>,
        pieces: u64,
        reuse: &ReuseSums,
        totals: &TraceTotals,
    ) -> Summary {
        let f = self.addrs.len() as u64;
        // A fold from +0.0, not `sum()`: a float sum of nothing is -0.0,
        // which the JSON of a run without accesses would show as `-0.0`.
        let f_str: f64 = self
            .addrs
            .iter()
            .map(|(addr, e)| {
                let [s, i] = e.class_counts(addr, &self.mixed_counts);
                s as f64 / (s + i) as f64
            })
            .fold(0.0, |total, x| total + x);
        let f_irr = f as f64 - f_str;
        let total = self.a + self.a_const;
        Summary {
            a: self.a,
            a_const: self.a_const,
            a_const_frac: ratio(self.a_const as f64, total),
            kappa: ratio(self.a_const as f64, self.a).map(|r| 1.0 + r),
            rho,
            a_hat: rho.map(|r| r * total as f64),
            samples: pieces,
            records: self.records,
            f,
            f_hat: rho.map(|r| r * f as f64),
            f_lines: self.line_arena.len() as u64,
            f_str,
            f_irr,
            f_str_frac: if f == 0 { 0.0 } else { f_str / f as f64 },
            f_irr_frac: if f == 0 { 0.0 } else { f_irr / f as f64 },
            d_f: if self.a == 0 {
                None
            } else {
                ratio(f as f64, total)
            },
            d_mean: ratio(reuse.d_sum as f64, reuse.d_count),
            d_max: (reuse.d_count > 0).then_some(self.d_max),
            whole_run: WholeRunLocality::default(),
            misses_l1: None,
            misses_l2: None,
            misses_llc: None,
            spatial_rate: None,
            tracked_accesses: None,
            mrc_groups: Vec::new(),
            interrupted: totals.interrupted.map(|i| i.name()),
            threads: self.threads.len() as u64,
            iterations: None,
            runs_per_batch: None,
            coverage_dynamic: None,
            escape_counts_missing: None,
            untraced_load_executions: None,
            execs_untraced: (totals.execs_untraced > 0).then(|| ExecsUntraced {
                programs: totals.execs_untraced,
                seconds: totals.execs_untraced_micros as f64 / 1e6,
            }),
            coverage_by_object: Vec::new(),
        }
    }

    /// The whole-run bucket counts and estimated executions of the trace,
    /// of each function and of each source line (their sites added up).
    fn tallies(&self, rho: Option<f64>) -> Tallies {
        let buckets = self.whole.sizes.buckets();
        let mut total = Tally::new(buckets);
        let mut functions = vec![Tally::new(buckets); self.functions.len()];
        let mut lines: Vec<LineTally> = Vec::new();
        let mut line_index: Map<&str, usize> = Map::default();
        for (i, slot) in self.slots.iter().enumerate() {
            if !slot.class.is_access() || !slot.included {
                continue;
            }
            let site = self.whole.site(i);
            let executions = match self.whole.tracking {
                Tracking::Sampled {
                    emulated: false, ..
                } => rho.map(|r| r * slot.count as f64),
                _ => Some(slot.count as f64),
            };
            if (site.is_empty() && slot.count == 0) || self.unsampled_library(i).is_some() {
                continue;
            }
            let zeros;
            let site = if site.is_empty() {
                zeros = vec![0.0; buckets + 1];
                &zeros[..]
            } else {
                site
            };
            total.add(site, executions);
            if let Some(f) = slot.function {
                functions[f as usize].add(site, executions);
            }
            if let Some(line) = &slot.line {
                let at = *line_index.entry(line.as_str()).or_insert_with(|| {
                    lines.push(LineTally::new(line.clone(), buckets));
                    lines.len() - 1
                });
                lines[at].add(slot.function, site, executions, slot.count);
            }
        }
        Tallies {
            total,
            functions,
            lines,
        }
    }

    /// The instrumented library whose load slot `slot` is, in a spatially
    /// sampled recording: its tracked accesses are only those its time
    /// windows recorded (about `1/ρ` of them), and what it reused between
    /// windows is in no stack, so the whole-run figures leave it out.
    fn unsampled_library(&self, slot: usize) -> Option<&str> {
        let slot = slot as u32;
        self.unsampled_libraries
            .iter()
            .find(|(first, end, _)| (*first..*end).contains(&slot))
            .map(|(_, _, name)| name.as_str())
    }

    /// Per library that the whole-run figures leave out
    /// ([`Analyzer::unsampled_library`]): its name, its load sites with
    /// records and their estimated executions (`ρ ×` records; the records
    /// when ρ is unknown).
    fn unsampled_library_loads(&self, rho: Option<f64>) -> Vec<(&str, u64, f64)> {
        let mut left_out: Vec<(&str, u64, f64)> = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            if !slot.class.is_access() || !slot.included || slot.count == 0 {
                continue;
            }
            let Some(library) = self.unsampled_library(i) else {
                continue;
            };
            let executions = rho.unwrap_or(1.0) * slot.count as f64;
            match left_out.iter_mut().find(|(name, _, _)| *name == library) {
                Some((_, loads, n)) => {
                    *loads += 1;
                    *n += executions;
                }
                None => left_out.push((library, 1, executions)),
            }
        }
        left_out
    }

    /// The whole-run fields of the summary.
    fn whole_run_summary(&self, summary: &mut Summary, total: &Tally) {
        let (sizes, rate) = (&self.whole.sizes, self.whole.rate);
        let whole_run = &mut summary.whole_run;
        whole_run.mrc = total.curve(sizes, rate);
        [whole_run.mr_l1, whole_run.mr_l2, whole_run.mr_llc] = total.cache_ratios(sizes, rate);
        let tracked = total.tracked();
        [summary.misses_l1, summary.misses_l2, summary.misses_llc] = sizes
            .caches
            .map(|i| (tracked > 0).then(|| total.misses(i, rate)));
        summary.spatial_rate = Some(rate);
        summary.tracked_accesses = Some(tracked);
        summary.mrc_groups = if tracked > 0 {
            self.whole.group_shares(total)
        } else {
            Vec::new()
        };
    }

    /// The hottest source lines by estimated Strided and Irregular
    /// executions, with their estimated misses at each cache size.
    fn line_rows(&self, tallies: &Tallies) -> Vec<LineLocality> {
        let (sizes, rate) = (&self.whole.sizes, self.whole.rate);
        let mut rows: Vec<LineLocality> = tallies
            .lines
            .iter()
            .filter(|l| l.tally.tracked() > 0)
            .map(|l| {
                let t = &l.tally;
                let [l1, l2, llc] = sizes.caches.map(|i| t.misses(i, rate));
                LineLocality {
                    line: l.line.clone(),
                    function: l.function(&self.functions).map(str::to_owned),
                    a_hat: t.estimated_accesses(rate),
                    misses_l1: l1,
                    misses_l2: l2,
                    misses_llc: llc,
                }
            })
            .collect();
        rows.sort_by(|x, y| {
            y.a_hat
                .total_cmp(&x.a_hat)
                .then(y.misses_l1.total_cmp(&x.misses_l1))
                .then_with(|| x.line.cmp(&y.line))
        });
        rows.truncate(locality::TOP_LINES);
        rows
    }

    /// One row per function with loads, most accesses first.
    fn function_rows(
        &self,
        rho: Option<f64>,
        reuse: &ReuseSums,
        tallies: Option<&Tallies>,
    ) -> Vec<FunctionMetrics> {
        let (sizes, rate) = (&self.whole.sizes, self.whole.rate);
        let mut hot_by_function = self.hot_slots_by_function();
        let mut function_rows: Vec<FunctionMetrics> = self
            .functions
            .iter()
            .enumerate()
            .filter(|(_, acc)| acc.a + acc.a_const > 0)
            .map(|(i, acc)| {
                let code = &acc.sums[self.code_k as usize];
                let mut hot = std::mem::take(&mut hot_by_function[i]);
                hot.sort_by(|x, y| y.count.cmp(&x.count).then(x.ip.cmp(&y.ip)));
                let windows = code.windows;
                let (d_sum, d_count) = reuse.function_d[i];
                let tally = tallies.map(|t| &t.functions[i]);
                let [mr_l1, mr_l2, mr_llc] =
                    tally.map_or([None; 3], |t| t.cache_ratios(sizes, rate));
                FunctionMetrics {
                    name: acc.name.clone(),
                    object: acc.object.clone(),
                    a: acc.a,
                    a_const: acc.a_const,
                    a_const_frac: ratio(acc.a_const as f64, acc.a + acc.a_const),
                    a_hat: rho.map(|r| r * (acc.a + acc.a_const) as f64),
                    d_f: ratio(code.d_f, windows),
                    f_str_frac: ratio(code.f_str_frac, windows),
                    f_irr_frac: ratio(code.f_irr_frac, windows),
                    code_windows: windows,
                    d_mean: ratio(d_sum as f64, d_count),
                    trace_windows: window_rows(&acc.sums, 3, self.max_k, false),
                    whole_run: WholeRunLocality {
                        mrc: tally.map_or_else(Vec::new, |t| t.curve(sizes, rate)),
                        mr_l1,
                        mr_l2,
                        mr_llc,
                    },
                    hot_loads: hot
                        .iter()
                        .take(3)
                        .map(|s| HotLoad {
                            ip: s.ip,
                            line: s.line.clone(),
                            count: s.count,
                        })
                        .collect(),
                    coverage_dynamic: None,
                }
            })
            .collect();
        function_rows.sort_by(|x, y| {
            (y.a, y.a_const)
                .cmp(&(x.a, x.a_const))
                .then_with(|| x.name.cmp(&y.name))
        });
        function_rows
    }

    /// The load sites with records of each function (indexed as
    /// `functions`), in slot order: one pass over the slots, where a scan
    /// per function was quadratic on programs with many active functions.
    fn hot_slots_by_function(&self) -> Vec<Vec<&LoadSlot>> {
        let mut hot: Vec<Vec<&LoadSlot>> = vec![Vec::new(); self.functions.len()];
        for slot in &self.slots {
            if let Some(f) = slot.function
                && slot.count > 0
            {
                hot[f as usize].push(slot);
            }
        }
        hot
    }

    /// One row per load site with records (an implied load: its proxy's),
    /// by address.
    fn load_rows(&self) -> Vec<LoadRow> {
        let slots = &self.slots;
        let function_name = |f: Option<u32>| f.map(|f| self.functions[f as usize].name.clone());
        let object = |f: Option<u32>| f.and_then(|f| self.functions[f as usize].object.clone());
        let mut loads: Vec<LoadRow> = Vec::new();
        for slot in slots.iter() {
            if let Some(proxy) = slot.proxy {
                let count = slots[proxy as usize].count;
                if count > 0 && slot.included {
                    loads.push(LoadRow {
                        ip: slot.ip,
                        class: slot.class,
                        count,
                        function: function_name(slot.function),
                        object: object(slot.function),
                        line: slot.line.clone(),
                        implied: true,
                        d_mean: None,
                    });
                }
            } else if slot.count > 0 {
                loads.push(LoadRow {
                    ip: slot.ip,
                    class: slot.class,
                    count: slot.count,
                    function: function_name(slot.function),
                    object: object(slot.function),
                    line: slot.line.clone(),
                    implied: false,
                    d_mean: ratio(slot.d_sum as f64, slot.d_count),
                });
            }
        }
        loads.sort_by(|x, y| {
            (&x.object, x.ip, x.class, x.implied).cmp(&(&y.object, y.ip, y.class, y.implied))
        });
        merge_duplicate_loads(&mut loads);
        loads
    }

    /// The hot regions of the address space, by start (takes the page
    /// loads).
    fn region_rows(&mut self) -> Vec<Region> {
        let mut line_stats: Vec<LineStat> = self
            .line_arena
            .iter()
            .map(|e| LineStat {
                line: e.line,
                a: e.a,
                d_sum: e.d_sum,
                d_count: e.d_count,
            })
            .collect();
        line_stats.sort_unstable_by_key(|l| l.line);
        let mut page_table: Vec<(u64, u32, u64)> = self.page_loads.drain();
        page_table.sort_unstable();
        let leaves = regions::hot_regions(
            &line_stats,
            self.options.region_threshold_percent,
            self.min_page_shift,
        );
        let mut region_rows: Vec<Region> = leaves
            .iter()
            .map(|leaf| {
                let ls = &line_stats[leaf.lines.clone()];
                let a: u64 = ls.iter().map(|l| l.a).sum();
                let d_sum: u64 = ls.iter().map(|l| l.d_sum).sum();
                let d_count: u64 = ls.iter().map(|l| l.d_count).sum();
                let first_page = leaf.span.start >> self.min_page_shift;
                let end_page = if leaf.span.end == u64::MAX {
                    u64::MAX
                } else {
                    leaf.span.end >> self.min_page_shift
                };
                let from = page_table.partition_point(|&(p, _, _)| p < first_page);
                let to = page_table.partition_point(|&(p, _, _)| p < end_page);
                Region {
                    start: ls[0].line << 6,
                    end: (ls[ls.len() - 1].line + 1) << 6,
                    a,
                    a_frac: if self.a == 0 {
                        0.0
                    } else {
                        a as f64 / self.a as f64
                    },
                    blocks: ls.len() as u64,
                    a_per_block: a as f64 / ls.len() as f64,
                    d_mean: ratio(d_sum as f64, d_count),
                    depth: leaf.depth,
                    page: if leaf.page_shift >= 64 {
                        0
                    } else {
                        1 << leaf.page_shift
                    },
                    functions: region_functions(
                        &page_table[from..to],
                        &self.slots,
                        &self.functions,
                    ),
                }
            })
            .collect();
        region_rows.sort_by_key(|r| r.start);
        region_rows
    }

    /// The reuse-distance histogram's bins, up to the last non-empty one.
    fn reuse_bins(&self) -> Vec<ReuseBin> {
        let last_bin = self.d_bins.iter().rposition(|&c| c > 0);
        match last_bin {
            None => Vec::new(),
            Some(last) => (0..=last)
                .map(|i| {
                    let (lo, hi) = if i == 0 {
                        (0, 0)
                    } else {
                        (
                            1u64 << (i - 1),
                            (1u64 << (i - 1)).wrapping_mul(2).wrapping_sub(1),
                        )
                    };
                    ReuseBin {
                        lo,
                        hi,
                        count: self.d_bins[i],
                    }
                })
                .collect(),
        }
    }

    /// Recorded accesses per object, most first, when the trace holds more
    /// than one object's code (instrumented shared libraries).
    fn object_coverage(&self) -> Vec<ObjectCoverage> {
        let mut by_object: Vec<(String, u64)> = Vec::new();
        for f in &self.functions {
            let Some(object) = &f.object else { continue };
            match by_object.iter_mut().find(|(o, _)| o == object) {
                Some((_, n)) => *n += f.a + f.a_const,
                None => by_object.push((object.clone(), f.a + f.a_const)),
            }
        }
        if by_object.len() < 2 {
            return Vec::new();
        }
        let total: u64 = by_object.iter().map(|(_, n)| n).sum();
        by_object.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
        by_object
            .into_iter()
            .map(|(object, accesses)| ObjectCoverage {
                object,
                accesses,
                share: if total == 0 {
                    0.0
                } else {
                    accesses as f64 / total as f64
                },
            })
            .collect()
    }

    /// The notes of the coverage: those gathered so far, then what the
    /// analysis could not see (takes the notes).
    fn notes(&mut self, totals: &TraceTotals) -> Vec<String> {
        let mut notes = std::mem::take(&mut self.notes);
        if !self.classified {
            notes.push(
                "load classes unknown: every access counted as Irregular (F_str = 0)".to_string(),
            );
        }
        if self.outside_functions > 0 {
            notes.push(format!(
                "{} records lie in no known function: in the summary, not in any function",
                self.outside_functions
            ));
        }
        if self.filtered_out > 0 {
            notes.push(format!(
                "{} records left out by --functions {}",
                self.filtered_out,
                self.options.functions.as_deref().unwrap_or("")
            ));
        }
        let d = totals.dropped;
        if d.records + d.samples + d.bytes > 0 {
            notes.push(format!(
                "the collector lost {} records, {} samples, {} bytes",
                d.records, d.samples, d.bytes
            ));
        }
        if let Some(interruption) = totals.interrupted {
            notes.push(format!(
                "the recording was interrupted ({}): the metrics are those of the part of the run recorded until then",
                interruption.name()
            ));
        } else if !totals.complete && d.records == 0 {
            notes.push("the trace is a prefix: the program did not finish cleanly".to_string());
        } else if !totals.complete {
            notes.push(
                "the trace is incomplete: records were lost (above), or the program did not finish cleanly"
                    .to_string(),
            );
        }
        if !self.untraced_libraries.is_empty() {
            notes.push(untraced_libraries_note(&self.untraced_libraries));
        }
        self.whole_run_notes(&mut notes, totals);
        if !self.sampling.is_full() && totals.executions < self.rho_denominator() {
            notes.push(format!(
                "inconsistent trace totals: {} load executions for {} recorded accesses; ρ and the estimates scaled by it are left out",
                totals.executions,
                self.rho_denominator()
            ));
        }
        notes
    }

    /// What the whole-run curve could not see or is unsure of.
    fn whole_run_notes(&self, notes: &mut Vec<String>, totals: &TraceTotals) {
        let whole = &self.whole;
        if whole.spatial_ignored > 0 {
            notes.push(format!(
                "{} of {} spatial records left out: not Strided or Irregular loads, or the trace has no spatial sampling",
                whole.spatial_ignored, whole.spatial_records
            ));
        }
        if let Tracking::Sampled { emulated, .. } = whole.tracking {
            if whole.tracked < locality::MIN_TRACKED {
                notes.push(format!(
                    "whole-run curve undersampled: {} tracked accesses (fewer than {})",
                    whole.tracked,
                    locality::MIN_TRACKED
                ));
            }
            let rho = self.rho(totals);
            let left_out = self.unsampled_library_loads(rho);
            if !left_out.is_empty() {
                let counted = if rho.is_some() {
                    "estimated executions"
                } else {
                    "records"
                };
                let what: Vec<String> = left_out
                    .iter()
                    .map(|(name, loads, executions)| {
                        let s = if *loads == 1 { "" } else { "s" };
                        format!("{loads} load{s} of {name} ({executions:.0} {counted})")
                    })
                    .collect();
                notes.push(format!(
                    "whole-run cache figures (MR_*, misses_*) leave out {}: libraries take no spatial samples, so their miss ratios are unknown",
                    what.join(", ")
                ));
            }
            if !emulated && rho.is_none() {
                notes.push(
                    "ρ unknown: the whole-run curve divides by the tracked accesses, without the SHARDS correction"
                        .to_string(),
                );
            }
        }
    }

    /// ρ per docs/METRICS.md: 1 for a full trace; executions over records
    /// (software, Lackey) or over `A + A_const` (Intel PT), over the whole
    /// trace before any `--functions` filter.
    fn rho(&self, totals: &TraceTotals) -> Option<f64> {
        if self.sampling.is_full() {
            return Some(1.0);
        }
        let denominator = self.rho_denominator();
        if totals.executions < denominator {
            // Fewer executions than recorded accesses: the totals are
            // inconsistent, and ρ below 1 would scale every estimate down
            // (`finish` notes why it is missing).
            return None;
        }
        ratio(totals.executions as f64, denominator)
    }

    /// What ρ divides the executions by (see [`Analyzer::rho`]).
    fn rho_denominator(&self) -> u64 {
        match self.backend {
            Backend::Pt => self.a_all + self.a_const_all,
            Backend::Soft | Backend::Lackey => self.records_all,
        }
    }
}

/// Whole-run bucket counts of the trace, its functions (by index) and its
/// source lines (in order of first load site).
struct Tallies {
    total: Tally,
    functions: Vec<Tally>,
    lines: Vec<LineTally>,
}

/// A source line's whole-run tally, and how its Strided and Irregular
/// loads spread over the functions holding them (a line inlined into
/// several functions has loads in each).
struct LineTally {
    line: String,
    tally: Tally,
    /// Per function (index): the records and the tracked accesses of the
    /// line's loads in it.
    functions: Vec<(u32, u64, u64)>,
}

impl LineTally {
    fn new(line: String, buckets: usize) -> Self {
        LineTally {
            line,
            tally: Tally::new(buckets),
            functions: Vec::new(),
        }
    }

    /// Adds one load site of the line: its whole-run bucket counts,
    /// estimated executions and records.
    fn add(&mut self, function: Option<u32>, site: &[f64], executions: Option<f64>, records: u64) {
        self.tally.add(site, executions);
        let Some(f) = function else { return };
        let tracked = site.last().copied().unwrap_or(0.0) as u64;
        match self.functions.iter_mut().find(|(g, _, _)| *g == f) {
            Some((_, r, t)) => {
                *r = r.saturating_add(records);
                *t = t.saturating_add(tracked);
            }
            None => self.functions.push((f, records, tracked)),
        }
    }

    /// The function the line is attributed to: the one with the most
    /// records of the line's loads, then the most tracked accesses (a line
    /// seen by spatial records only), then the first name — the same
    /// whatever the order of the load sites.
    fn function<'a>(&self, functions: &'a [FunctionAcc]) -> Option<&'a str> {
        self.functions
            .iter()
            .map(|&(f, records, tracked)| (records, tracked, functions[f as usize].name.as_str()))
            .max_by(|x, y| x.0.cmp(&y.0).then(x.1.cmp(&y.1)).then(y.2.cmp(x.2)))
            .map(|(_, _, name)| name)
    }
}

/// Reuse-distance sums `(Σd, count)` of the trace and of each function.
struct ReuseSums {
    d_sum: u64,
    d_count: u64,
    /// Per function, by index.
    function_d: Vec<(u64, u64)>,
}

impl ThreadState {
    fn new(secondary: bool) -> Self {
        ThreadState {
            piece: 0,
            thread: 0,
            engine: WindowEngine::new(3, 3),
            reuse: ReuseTracker::new(),
            functions: Vec::new(),
            side: secondary.then(Box::default),
            a: 0,
            a_const: 0,
            d_sum: 0,
            d_count: 0,
        }
    }

    fn start(&mut self, piece: u32, thread: u32, top: u32) {
        self.piece = piece;
        self.thread = thread;
        if self.engine.levels() != (3, top) {
            self.engine = WindowEngine::new(3, top);
        }
        self.engine.reset(piece);
        self.reuse.reset(piece);
        self.a = 0;
        self.a_const = 0;
        self.d_sum = 0;
        self.d_count = 0;
    }
}

/// The engine of function `f` for `piece`: created on the function's
/// first access, reset on its first access in a piece.
#[inline(always)]
fn function_engine(
    engines: &mut Vec<Option<Box<FunctionEngine>>>,
    f: u32,
    piece: u32,
    lo: u32,
    top: u32,
) -> &mut FunctionEngine {
    let f = f as usize;
    let ready = engines
        .get(f)
        .and_then(|fe| fe.as_deref())
        .is_some_and(|fe| fe.engine.piece() == piece);
    if !ready {
        prepare_function_engine(engines, f, piece, lo, top);
    }
    engines[f].as_deref_mut().expect("prepared")
}

#[cold]
#[inline(never)]
fn prepare_function_engine(
    engines: &mut Vec<Option<Box<FunctionEngine>>>,
    f: usize,
    piece: u32,
    lo: u32,
    top: u32,
) {
    if engines.len() <= f {
        engines.resize_with(f + 1, || None);
    }
    let fe = engines[f].get_or_insert_with(|| {
        Box::new(FunctionEngine {
            engine: WindowEngine::new(lo, top),
            addrs: AddrTable::new(),
        })
    });
    if fe.engine.piece() != piece {
        fe.engine.reset(piece);
    }
}

fn ratio(numerator: f64, denominator: u64) -> Option<f64> {
    (denominator > 0).then(|| numerator / denominator as f64)
}

fn window_rows(sums: &[LevelSums], lo: u32, hi: u32, lines: bool) -> Vec<WindowRow> {
    (lo..=hi)
        .filter(|&k| sums[k as usize].windows > 0)
        .map(|k| {
            let s = &sums[k as usize];
            let n = s.windows as f64;
            WindowRow {
                k,
                windows: s.windows,
                f: s.f as f64 / n,
                f_lines: lines.then(|| s.f_lines as f64 / n),
                d_f: s.d_f / n,
                f_str: s.f_str / n,
                f_irr: s.f_irr / n,
                f_str_frac: s.f_str_frac / n,
                f_irr_frac: s.f_irr_frac / n,
                a_const: s.a_const as f64 / n,
            }
        })
        .collect()
}

/// Rows with the same `ip`, class and `implied` flag (load sites listed
/// twice) become one.
fn merge_duplicate_loads(loads: &mut Vec<LoadRow>) {
    loads.dedup_by(|later, earlier| {
        if later.ip == earlier.ip
            && later.object == earlier.object
            && later.class == earlier.class
            && later.implied == earlier.implied
        {
            earlier.count += later.count;
            true
        } else {
            false
        }
    });
}

fn region_functions(
    pages: &[(u64, u32, u64)],
    slots: &[LoadSlot],
    functions: &[FunctionAcc],
) -> Vec<RegionFunction> {
    let mut by_function: Map<Option<u32>, (u64, Map<u32, u64>)> = Map::default();
    for &(_, load, count) in pages {
        let slot = &slots[load as usize];
        let e = by_function.entry(slot.function).or_default();
        e.0 += count;
        *e.1.entry(load).or_insert(0) += count;
    }
    let mut out: Vec<RegionFunction> = by_function
        .into_iter()
        .map(|(f, (a, loads))| {
            let mut loads: Vec<(u32, u64)> = loads.into_iter().collect();
            loads.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
            let mut lines: Vec<String> = Vec::new();
            for (load, _) in loads {
                if let Some(line) = &slots[load as usize].line
                    && !lines.contains(line)
                    && lines.len() < 3
                {
                    lines.push(line.clone());
                }
            }
            RegionFunction {
                name: f.map_or_else(|| "?".to_string(), |f| functions[f as usize].name.clone()),
                a,
                lines,
            }
        })
        .collect();
    out.sort_by(|x, y| y.a.cmp(&x.a).then_with(|| x.name.cmp(&y.name)));
    out.truncate(5);
    out
}

#[cfg(test)]
mod tests {
    //! Hand-worked examples of each formula of docs/METRICS.md. The
    //! property tests (tests/it/analysis_reference.rs) cover random traces.
    use super::*;
    use memgaze_trace::Record;
    use memgaze_trace::{Dropped, FunctionEntry, Sampling};

    const L0: u32 = 0; // Strided, implies 1 Constant, in f0
    const L1: u32 = 1; // Irregular, in f0
    const L2: u32 = 2; // Constant, implies 2, in f1

    fn header(backend: Backend, sampling: Sampling) -> TraceHeader {
        let load = |ip, class, implied, function, proxy| LoadEntry {
            ip,
            class,
            implied,
            function: Some(function),
            line: Some(format!("k.c:{ip}")),
            proxy,
        };
        TraceHeader {
            backend,
            sampling,
            binary: None,
            command: vec![],
            functions: vec![
                FunctionEntry {
                    name: "f0".into(),
                    start: 0x10,
                    end: 0x40,
                },
                FunctionEntry {
                    name: "f1".into(),
                    start: 0x40,
                    end: 0x80,
                },
            ],
            loads: vec![
                load(0x10, LoadClass::Strided, 1, 0, None),
                load(0x20, LoadClass::Irregular, 0, 0, None),
                load(0x40, LoadClass::Constant, 2, 1, None),
                // Uninstrumented Constant load implied by L0.
                load(0x14, LoadClass::Constant, 0, 0, Some(L0)),
            ],
            labels: vec![],
            spatial: None,
        }
    }

    fn sampled() -> Sampling {
        Sampling {
            window: 8,
            period: 80,
            seed: None,
        }
    }

    /// sample 0: L0@0x100 L1@0x100 L2@0x7f00 L0@0x108 L1@0x200
    /// sample 1: L1@0x200 L0@0x100 L1@0x208
    fn run(backend: Backend, sampling: Sampling, options: &AnalysisOptions) -> Analysis {
        let mut a = Analyzer::new(&header(backend, sampling), options).unwrap();
        let records = [
            (L0, 0x100, 0),
            (L1, 0x100, 0),
            (L2, 0x7f00, 0),
            (L0, 0x108, 0),
            (L1, 0x200, 0),
            (L1, 0x200, 1),
            (L0, 0x100, 1),
            (L1, 0x208, 1),
        ];
        for (load, addr, sample) in records {
            a.push_load(load, addr, sample, 0);
        }
        a.finish(&TraceTotals::clean(80, 8, 2))
    }

    /// An instrumented library whose original ran instead of its copy
    /// (`dlopen` by path), so it is also named uninstrumented and traced
    /// nothing, is one uninstrumented row; the executable's row stays even
    /// when it traced nothing.
    #[test]
    fn a_library_whose_original_ran_instead_of_its_copy_is_one_uninstrumented_row() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let rows = coverage_by_object(
            true,
            &names(&["app", "libx.so", "liby.so"]),
            &names(&["libx.so"]),
            &[],
            &[],
        );
        let summary: Vec<(&str, bool)> = rows
            .iter()
            .map(|r| (r.object.as_str(), r.instrumented))
            .collect();
        assert_eq!(
            summary,
            [("app", true), ("liby.so", true), ("libx.so", false)]
        );
    }

    /// An instrumented object that executed no load: `share` 1 in the
    /// JSON, "no loads executed" in the text line (not "100.0%").
    #[test]
    fn an_object_without_executed_loads_says_so_in_the_coverage_line() {
        let row = |object: &str, executed: Option<f64>, traced: f64, share: Option<f64>| {
            ObjectLoadCoverage {
                object: object.into(),
                instrumented: true,
                loads_executed: executed,
                loads_traced: traced,
                share,
            }
        };
        let objects = [
            row("app", Some(10.0), 10.0, Some(1.0)),
            row("libz.so.1", Some(0.0), 0.0, Some(1.0)),
            row("libc.so.6", Some(8.0), 6.0, Some(0.75)),
            row("libm.so.6", None, 0.0, None),
        ];
        assert_eq!(
            coverage_by_object_line(&objects),
            "app 100.0%, libz.so.1 no loads executed, libc.so.6 75.0%, libm.so.6 unknown (no ρ)"
        );
    }

    /// A library's loads in a spatially sampled recording (libraries take no
    /// spatial samples) are left out of the whole-run figures, with a note;
    /// the executable's keep theirs. In a full trace they are in.
    #[test]
    fn libraries_are_left_out_of_a_sampled_whole_run() {
        let analyse = |sampling: Sampling| {
            let mut h = header(Backend::Soft, sampling);
            h.spatial = (!sampling.is_full()).then(|| memgaze_trace::SpatialSampling {
                threshold: u64::MAX,
                ..memgaze_trace::SpatialSampling::with_rate(0.5).unwrap()
            });
            h.loads[L1 as usize].function = Some(1);
            h.functions[1].name = "libc.so.6!f1".into();
            h.labels = vec![(memgaze_trace::OBJECT_LABEL.into(), "1 1 libc.so.6".into())];
            let mut a = Analyzer::new(&h, &AnalysisOptions::default()).unwrap();
            for (load, addr, sample) in [
                (L0, 0x100, 0),
                (L1, 0x200, 0),
                (L0, 0x100, 0),
                (L1, 0x200, 1),
                (L0, 0x140, 1),
            ] {
                a.push_load(load, addr, sample, 0);
            }
            a.finish(&TraceTotals::clean(50, 5, 2))
        };
        let mr_l1 = |a: &Analysis, name: &str| {
            let f = a.functions.iter().find(|f| f.name == name).unwrap();
            f.whole_run.mr_l1
        };
        let left_out = |a: &Analysis| {
            a.coverage
                .notes
                .iter()
                .find(|n| n.contains("no spatial samples"))
                .cloned()
        };

        let sampled = analyse(sampled());
        assert!(mr_l1(&sampled, "f0").is_some());
        assert_eq!(mr_l1(&sampled, "libc.so.6!f1"), None);
        assert!(sampled.functions.iter().any(|f| f.name == "libc.so.6!f1"));
        assert_eq!(sampled.summary.tracked_accesses, Some(3), "L0's alone");
        let note = left_out(&sampled).unwrap_or_else(|| panic!("{:?}", sampled.coverage.notes));
        assert!(
            note.contains("leave out 1 load of libc.so.6 (20 estimated executions)"),
            "ρ = 50/5: {note}"
        );

        let full = analyse(Sampling::full());
        assert!(mr_l1(&full, "libc.so.6!f1").is_some());
        assert_eq!(full.summary.tracked_accesses, Some(5));
        assert_eq!(left_out(&full), None);
    }

    /// A header that says its instrumented libraries counted their escapes
    /// ([`memgaze_trace::LIBRARY_ESCAPES_LABEL`]) names none uncounted: the
    /// library's escapes are in its row and in the dynamic coverage.
    #[test]
    fn libraries_that_counted_their_escapes_are_not_called_uncounted() {
        let mut h = header(Backend::Soft, Sampling::full());
        h.functions[1].name = "libc.so.6!f1".into();
        h.labels = vec![
            (memgaze_trace::OBJECT_LABEL.into(), "1 2 libc.so.6".into()),
            (
                memgaze_trace::LIBRARY_ESCAPES_LABEL.into(),
                memgaze_trace::LIBRARY_ESCAPES_COUNTED.into(),
            ),
        ];
        let mut a = Analyzer::new(&h, &AnalysisOptions::default()).unwrap();
        for (load, addr) in [(L0, 0x100), (L1, 0x200), (L0, 0x108)] {
            a.push_load(load, addr, 0, 0);
        }
        let mut totals = TraceTotals::clean(3, 3, 1);
        totals.escapes.push(memgaze_trace::EscapeCount {
            at: 0x48,
            function: "libc.so.6!f1".into(),
            count: 5,
            loads: 1,
            probed: 0,
            untraced_load: true,
        });
        let a = a.finish(&totals);
        assert!(
            a.coverage.uncounted_libraries.is_empty(),
            "{:?}",
            a.coverage
        );
        assert!(
            !a.coverage.notes.iter().any(|n| n.contains("not counted")),
            "{:?}",
            a.coverage.notes
        );
        assert_eq!(a.summary.untraced_load_executions, Some(5));
        let libc = a
            .summary
            .coverage_by_object
            .iter()
            .find(|o| o.object == "libc.so.6")
            .unwrap();
        assert_eq!(
            libc.loads_executed.unwrap() - libc.loads_traced,
            5.0,
            "{libc:?}"
        );
    }

    /// Coverage by object: the executable and an instrumented library each
    /// traced over traced plus the escapes into it, and a library left
    /// uninstrumented listed with unknown loads (null, not zero); the note
    /// names the library with untraced executions, and the table says it.
    #[test]
    fn executed_loads_are_split_by_object_with_uninstrumented_libraries_unknown() {
        let mut h = header(Backend::Soft, Sampling::full());
        h.binary = Some(memgaze_metadata::model::BinaryIdentity {
            path: "/build/app".into(),
            size: 1,
            sha256: String::new(),
            build_id: None,
        });
        h.functions[1].name = "libc.so.6!f1".into();
        h.labels = vec![
            (memgaze_trace::OBJECT_LABEL.into(), "1 2 libc.so.6".into()),
            (
                memgaze_trace::SHARED_LIBRARY_LABEL.into(),
                "libm.so.6".into(),
            ),
        ];
        let mut a = Analyzer::new(&h, &AnalysisOptions::default()).unwrap();
        for (load, addr) in [(L0, 0x100), (L1, 0x200), (L2, 0x7f00), (L0, 0x108)] {
            a.push_load(load, addr, 0, 0);
        }
        let mut totals = TraceTotals::clean(4, 4, 1);
        totals.escapes.push(memgaze_trace::EscapeCount {
            at: 0x48,
            function: "libc.so.6!f1".into(),
            count: 3,
            loads: 4,
            probed: 1,
            untraced_load: false,
        });
        let a = a.finish(&totals);
        let a_hat = |name: &str| {
            a.functions
                .iter()
                .find(|f| f.name == name)
                .and_then(|f| f.a_hat)
                .unwrap()
        };
        let (app, libc) = (a_hat("f0"), a_hat("libc.so.6!f1"));
        assert!(app > 0.0 && libc > 0.0);
        let objects = &a.summary.coverage_by_object;
        let row = |name: &str| objects.iter().find(|o| o.object == name).unwrap();
        assert_eq!(objects.len(), 3, "{objects:?}");
        assert_eq!(row("app").loads_traced, app);
        assert_eq!(row("app").share, Some(1.0));
        assert_eq!(row("libc.so.6").loads_executed, Some(libc + 12.0));
        assert_eq!(row("libc.so.6").share, Some(libc / (libc + 12.0)));
        assert_eq!(objects[2].object, "libm.so.6", "uninstrumented last");
        assert!(!objects[2].instrumented);
        assert_eq!((objects[2].loads_executed, objects[2].share), (None, None));
        let json = serde_json::to_value(&a.summary).unwrap();
        assert!(json["coverage_by_object"][2]["share"].is_null(), "{json}");
        let note = a
            .coverage
            .notes
            .iter()
            .find(|n| n.starts_with("load executions untraced after escapes, by object: "))
            .unwrap_or_else(|| panic!("{:?}", a.coverage.notes));
        assert!(note.contains("libc.so.6 ~12 of ~"), "{note}");
        assert!(!note.contains("app"), "{note}");
        let table = table::render(&a, &table::TableOptions::default());
        let line = table.lines().find(|l| l.contains("  traced   ")).unwrap();
        assert!(line.contains("app 100.0%"), "{line}");
        assert!(line.contains("libm.so.6 not instrumented"), "{line}");
        // The instrumented library ran: what its copies cannot count is said
        // (not the executable's, nor the uninstrumented library's).
        assert_eq!(a.coverage.uncounted_libraries, ["libc.so.6"]);
        assert!(
            a.coverage
                .notes
                .contains(&uncounted_libraries_note(&["libc.so.6".into()])),
            "{:?}",
            a.coverage.notes
        );
        // Without records there is no ρ: the instrumented rows are unknown.
        let mut sampled_header = h.clone();
        sampled_header.sampling = sampled();
        let empty = Analyzer::new(&sampled_header, &AnalysisOptions::default())
            .unwrap()
            .finish(&TraceTotals::clean(12, 0, 1));
        let first = &empty.summary.coverage_by_object[0];
        assert!(first.instrumented && first.share.is_none() && first.loads_executed.is_none());
        assert!(
            empty.coverage.uncounted_libraries.is_empty(),
            "libc ran no traced load"
        );
        // ... but the dynamic coverage of a run without records counts its
        // load executions as traced, not 0%: 12 executions, 3 × 4 untraced.
        let mut escaped = TraceTotals::clean(12, 0, 1);
        escaped.escapes = totals.escapes.clone();
        let short = Analyzer::new(&sampled_header, &AnalysisOptions::default())
            .unwrap()
            .finish(&escaped);
        assert_eq!(short.summary.coverage_dynamic, Some(0.5));
        // A collector that does not count escapes gets no rows.
        let mut pt = h.clone();
        pt.backend = Backend::Pt;
        let none = Analyzer::new(&pt, &AnalysisOptions::default())
            .unwrap()
            .finish(&TraceTotals::clean(0, 0, 0));
        assert!(none.summary.coverage_by_object.is_empty());
    }

    /// An object added mid-run (a program that joined the recording) is
    /// analysed as the same object listed by the header from the start:
    /// its function named and attributed to it, its loads its own even
    /// where their addresses are the executable's.
    #[test]
    fn an_object_added_mid_run_is_analysed_as_one_the_header_lists() {
        let base = header(Backend::Soft, Sampling::full());
        let functions = vec![FunctionEntry {
            name: "other!g".into(),
            start: 0x10,
            end: 0x40,
        }];
        let loads = vec![LoadEntry {
            ip: 0x10,
            class: LoadClass::Irregular,
            implied: 0,
            function: Some(2),
            line: None,
            proxy: None,
        }];
        let mut whole = base.clone();
        whole
            .labels
            .push((memgaze_trace::OBJECT_LABEL.into(), "2 4 other".into()));
        whole.functions.extend(functions.clone());
        whole.loads.extend(loads.clone());
        let options = AnalysisOptions::default();
        let mut listed = Analyzer::new(&whole, &options).unwrap();
        let mut joined = Analyzer::new(&base, &options).unwrap();
        let records = [
            (L0, 0x100),
            (L1, 0x200),
            (4, 0x100),
            (4, 0x300),
            (L2, 0x7f00),
            (4, 0x100),
        ];
        for (i, &(load, addr)) in records.iter().enumerate() {
            if i == 2 {
                assert_eq!((joined.loads(), joined.functions()), (4, 2));
                joined.add_object("other".into(), functions.clone(), loads.clone());
            }
            listed.push_load(load, addr, 0, u32::from(load == 4));
            joined.push_load(load, addr, 0, u32::from(load == 4));
        }
        let totals = TraceTotals::clean(6, 6, 1);
        let (listed, joined) = (listed.finish(&totals), joined.finish(&totals));
        assert_eq!(listed, joined);
        let g = joined
            .functions
            .iter()
            .find(|f| f.name == "other!g")
            .unwrap();
        assert_eq!(g.object.as_deref(), Some("other"));
        assert_eq!(g.a, 3);
        let other_loads: u64 = joined
            .loads
            .iter()
            .filter(|l| l.object.as_deref() == Some("other"))
            .map(|l| l.count)
            .sum();
        assert_eq!(other_loads, 3);
    }

    /// The header's shared-library labels become the coverage's untraced
    /// libraries and a note naming them; without labels, neither.
    #[test]
    fn shared_libraries_in_the_header_are_named_as_untraced() {
        let mut h = header(Backend::Soft, Sampling::full());
        h.labels = vec![
            ("bench".into(), "b".into()),
            (
                memgaze_trace::SHARED_LIBRARY_LABEL.into(),
                "libm.so.6".into(),
            ),
            (
                memgaze_trace::SHARED_LIBRARY_LABEL.into(),
                "libc.so.6".into(),
            ),
        ];
        let a = Analyzer::new(&h, &AnalysisOptions::default())
            .unwrap()
            .finish(&TraceTotals::clean(0, 0, 0));
        assert_eq!(a.coverage.untraced_libraries, ["libm.so.6", "libc.so.6"]);
        assert!(a.coverage.notes.contains(&"loads in shared libraries that ran uninstrumented are not traced: libm.so.6, libc.so.6".to_string()), "{:?}", a.coverage.notes);
        let plain = run(Backend::Soft, Sampling::full(), &AnalysisOptions::default());
        assert!(plain.coverage.untraced_libraries.is_empty());
        assert!(
            !plain
                .coverage
                .notes
                .iter()
                .any(|n| n.contains("shared libraries"))
        );
    }

    /// A trace whose totals count fewer load executions than it holds
    /// records (was: ρ = 0.5 from 4 / 8, or 0 from 0 executions, and every
    /// estimate scaled by it, without a word): no ρ, and a note saying why.
    #[test]
    fn fewer_executions_than_records_leave_rho_out_with_a_note() {
        for executions in [0, 4] {
            let mut a = Analyzer::new(
                &header(Backend::Soft, sampled()),
                &AnalysisOptions::default(),
            )
            .unwrap();
            for (i, load) in [L0, L1, L0, L1, L0, L1, L0, L1].into_iter().enumerate() {
                a.push_load(load, 0x100 + 64 * i as u64, (i / 4) as u64, 0);
            }
            let r = a.finish(&TraceTotals::clean(executions, 8, 2));
            assert_eq!(r.summary.rho, None, "{executions} executions");
            assert_eq!(r.summary.a_hat, None);
            assert!(
                r.coverage
                    .notes
                    .iter()
                    .any(|n| n.contains("inconsistent trace totals")),
                "{:?}",
                r.coverage.notes
            );
        }
    }

    /// Both compilations of [`feed`]'s loop (the dispatched one with its
    /// decoding thread, the baseline one decoding inline) give the same
    /// analysis of a trace with several samples and threads, many decoded
    /// batches, reuses within and across
    /// the reuse tracker's words and groups, and mixed addresses. (Each
    /// piece stays within one span of the tracker; the tree over spans is
    /// scalar code, checked by `reuse`'s own tests.)
    #[test]
    fn both_instruction_sets_give_the_same_analysis() {
        let header = header(Backend::Soft, sampled());
        let mut writer = memgaze_trace::TraceWriter::new(Vec::new(), &header).unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut records = 0;
        for sample in 0..6u64 {
            writer.begin_sample(sample as u32 % 2).unwrap();
            for i in 0..30_000u64 {
                if i == 20_000 {
                    writer.switch_thread(7).unwrap();
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let (load, addr) = match x % 4 {
                    0 => (L0, 0x10_0000 + 8 * (i % 50_000)),
                    1 => (L1, 0x10_0000 + 8 * ((x >> 20) % 60_000)),
                    2 => (L2, 0x7f00),
                    _ => (L1, 0x90_0000 + 64 * ((x >> 24) % 300)),
                };
                writer.push(load, addr).unwrap();
                records += 1;
            }
        }
        let bytes = writer
            .finish(&TraceTotals::clean(100 * records, records, 6))
            .unwrap();
        let analyse = |v3: bool| {
            let mut reader = TraceReader::new(&bytes[..]).unwrap();
            let mut analyzer = Analyzer::new(reader.header(), &AnalysisOptions::default()).unwrap();
            let mut ticks = 0u64;
            let tick = || ticks += 1;
            if v3 {
                feed(&mut reader, &mut analyzer, tick).unwrap();
            } else {
                feed_baseline(Source::Reader(&mut reader), &mut analyzer, tick).unwrap();
            }
            assert_eq!(ticks, records);
            analyzer.finish(reader.totals().unwrap())
        };
        let (baseline, dispatched) = (analyse(false), analyse(true));
        assert!(baseline.coverage.records == records && baseline.summary.d_max.is_some());
        assert!(baseline == dispatched, "the two compilations disagree");
    }

    /// A trace cut short fails the same way whether it is decoded on a
    /// thread of its own or inline, after the same records.
    #[test]
    fn a_decoding_error_comes_after_the_records_before_it() {
        let header = header(Backend::Soft, sampled());
        let mut writer = memgaze_trace::TraceWriter::new(Vec::new(), &header).unwrap();
        writer.begin_sample(0).unwrap();
        // Several chunks (a chunk holds 1 MiB of encoded records).
        let records = 1_500_000u64;
        for i in 0..records {
            writer
                .push(L1, 0x10_0000 + 8 * (i * 7919 % 100_000))
                .unwrap();
        }
        let bytes = writer
            .finish(&TraceTotals::clean(records, records, 1))
            .unwrap();
        let cut = &bytes[..bytes.len() * 3 / 5];
        let feed_cut = |apart: bool| {
            let mut reader = TraceReader::new(cut).unwrap();
            let mut analyzer = Analyzer::new(reader.header(), &AnalysisOptions::default()).unwrap();
            let mut ticks = 0u64;
            let tick = || ticks += 1;
            let fed = if apart {
                feed(&mut reader, &mut analyzer, tick)
            } else {
                feed_baseline(Source::Reader(&mut reader), &mut analyzer, tick)
            };
            (fed.expect_err("a cut trace").to_string(), ticks)
        };
        let (inline, apart) = (feed_cut(false), feed_cut(true));
        assert!(
            inline.1 > DECODED_BATCH as u64,
            "records before the cut: {}",
            inline.1
        );
        assert_eq!(inline, apart);
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn class_counts_move_elsewhere_before_they_overflow() {
        let mut elsewhere: Map<u64, [u64; 2]> = Map::default();
        let mut entry = AddrEntry {
            counts: [COUNT_LIMIT - 2, 5],
            ..AddrEntry::default()
        };
        entry.count(7, 0, &mut elsewhere);
        entry.count(7, 1, &mut elsewhere);
        assert_eq!(entry.counts, [COUNT_LIMIT - 1, 6]);
        assert!(elsewhere.is_empty());
        entry.count(7, 0, &mut elsewhere);
        assert_eq!(entry.counts, COUNTS_ELSEWHERE);
        for class in [0, 0, 1] {
            entry.count(7, class, &mut elsewhere);
        }
        let limit = u64::from(COUNT_LIMIT);
        assert_eq!(entry.class_counts(7, &elsewhere), [limit + 2, 7]);
        // Both counts one below the limit: the marker's value is never a
        // real count.
        let mut both = AddrEntry {
            counts: [COUNT_LIMIT - 1; 2],
            ..AddrEntry::default()
        };
        both.count(8, 1, &mut elsewhere);
        assert_eq!(both.counts, COUNTS_ELSEWHERE);
        assert_eq!(both.class_counts(8, &elsewhere), [limit - 1, limit]);
    }

    #[test]
    fn summary_formulas_by_hand() {
        let r = run(Backend::Soft, sampled(), &AnalysisOptions::default());
        let s = &r.summary;
        // A: Strided + Irregular records; A_const: Constant records + implied.
        assert_eq!((s.a, s.a_const, s.records, s.samples), (7, 3 + 3, 8, 2));
        assert!(close(s.kappa.unwrap(), 1.0 + 6.0 / 7.0));
        assert!(close(s.a_const_frac.unwrap(), 6.0 / 13.0));
        // Software ρ = executions / records; Â = ρ (A + A_const).
        assert!(close(s.rho.unwrap(), 10.0));
        assert!(close(s.a_hat.unwrap(), 130.0));
        // F over 0x100 0x108 0x200 0x208; lines 4 and 8.
        assert_eq!((s.f, s.f_lines), (4, 2));
        // 0x100: 2 Strided, 1 Irregular → 2/3 strided; 0x108 strided.
        assert!(close(s.f_str, 2.0 / 3.0 + 1.0));
        assert!(close(s.f_irr, 1.0 / 3.0 + 2.0));
        assert!(close(s.f_str_frac, (5.0 / 3.0) / 4.0));
        assert!(close(s.d_f.unwrap(), 4.0 / 13.0));
        assert!(close(s.f_hat.unwrap(), 40.0));
        // D over 64-byte blocks: sample 0: 4 4 4 8 → 0, 0; sample 1: 8 4 8 → 1.
        assert!(close(s.d_mean.unwrap(), 1.0 / 3.0));
        assert_eq!(s.d_max, Some(1));
        let bins: Vec<_> = r.reuse.bins.iter().map(|b| (b.lo, b.hi, b.count)).collect();
        assert_eq!(bins, vec![(0, 0, 2), (1, 1, 1)]);
        assert_eq!(
            (r.reuse.cold, r.reuse.captures, r.reuse.survivals),
            (4, 2, 2)
        );
        // No sample holds 8 accesses: no trace-window row.
        assert!(r.trace_windows.is_empty());
        // Per-load counts, with the implied row of the proxy's count.
        let loads: Vec<_> = r.loads.iter().map(|l| (l.ip, l.count, l.implied)).collect();
        assert_eq!(
            loads,
            vec![
                (0x10, 3, false),
                (0x14, 3, true),
                (0x20, 4, false),
                (0x40, 1, false)
            ]
        );
        // Interval tree: two samples, one node of both.
        let root = &r.intervals.nodes[0];
        assert_eq!(
            (root.h, root.samples, root.f, root.a, root.a_const),
            (1, 2, 4, 7, 6)
        );
        assert!(close(root.f_hat.unwrap(), 40.0));
    }

    #[test]
    fn rho_by_backend() {
        let pt = run(Backend::Pt, sampled(), &AnalysisOptions::default());
        assert!(close(pt.summary.rho.unwrap(), 80.0 / 13.0));
        let full = run(Backend::Soft, Sampling::full(), &AnalysisOptions::default());
        assert_eq!(full.summary.rho, Some(1.0));
    }

    #[test]
    fn code_windows_by_hand() {
        let options = AnalysisOptions {
            code_window_k: Some(1),
            ..AnalysisOptions::default()
        };
        let r = run(Backend::Soft, sampled(), &options);
        let f0 = r.functions.iter().find(|f| f.name == "f0").unwrap();
        // f0's windows of 2: [0x100 S, 0x100 I] F=1 (½ strided), A_const 1;
        // [0x108 S, 0x200 I] F=2, A_const 1; sample 1: [0x200 I, 0x100 S]
        // F=2, A_const 1; the tail [0x208] is dropped.
        assert_eq!((f0.a, f0.a_const, f0.code_windows), (7, 3, 3));
        assert!(close(
            f0.d_f.unwrap(),
            (1.0 / 3.0 + 2.0 / 3.0 + 2.0 / 3.0) / 3.0
        ));
        assert!(close(f0.f_str_frac.unwrap(), 0.5));
        assert!(close(f0.f_irr_frac.unwrap(), 0.5));
        assert!(close(f0.a_const_frac.unwrap(), 3.0 / 10.0));
        assert!(close(f0.a_hat.unwrap(), 100.0));
        assert!(close(f0.d_mean.unwrap(), 1.0 / 3.0));
        // f1 has only Constant loads: no accesses, undefined ratios.
        let f1 = r.functions.iter().find(|f| f.name == "f1").unwrap();
        assert_eq!((f1.a, f1.a_const, f1.code_windows), (0, 3, 0));
        assert_eq!((f1.d_f, f1.f_str_frac, f1.d_mean), (None, None, None));
        assert_eq!(f1.a_const_frac, Some(1.0));
        // Default k_c for w = 8 is 3.
        let r = run(Backend::Soft, sampled(), &AnalysisOptions::default());
        assert_eq!(r.run.code_window_k, 3);
        assert_eq!(
            run(Backend::Soft, Sampling::full(), &AnalysisOptions::default())
                .run
                .code_window_k,
            10
        );
    }

    #[test]
    fn no_accesses_gives_nulls_not_nan() {
        let mut a = Analyzer::new(
            &header(Backend::Soft, sampled()),
            &AnalysisOptions::default(),
        )
        .unwrap();
        a.push_load(L2, 0x7f00, 0, 0);
        let r = a.finish(&TraceTotals {
            spatial_records: 0,
            executions: 5,
            records: 1,
            samples: 3,
            dropped: Dropped::default(),
            exit: None,
            complete: false,
            interrupted: None,
            escapes: Vec::new(),
            escape_counts_missing: 0,
            execs_untraced: 0,
            execs_untraced_micros: 0,
        });
        let s = &r.summary;
        assert_eq!((s.a, s.a_const, s.f, s.samples), (0, 3, 0, 3));
        assert_eq!(
            (s.kappa, s.d_f, s.d_mean, s.d_max),
            (None, None, None, None)
        );
        assert_eq!((s.f_str_frac, s.a_const_frac), (0.0, Some(1.0)));
        assert_eq!(r.coverage.empty_samples, 2);
        assert!(r.coverage.notes.iter().any(|n| n.contains("prefix")));
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"kappa\":null") && !json.contains("NaN"));
        assert!(
            json.contains("\"F_str\":0.0") && !json.contains("-0.0"),
            "{json}"
        );
        let table = table::render(&r, &table::TableOptions::default());
        assert!(table.contains("κ = –"), "{table}");
    }

    #[test]
    fn samples_mixing_threads_are_split() {
        let mut a = Analyzer::new(
            &header(Backend::Soft, sampled()),
            &AnalysisOptions::default(),
        )
        .unwrap();
        // One sample: t0 0x200, t1 0x200, t0 0x200 → pieces [0x200 0x200], [0x200].
        a.push_load(L1, 0x200, 0, 0);
        a.push_load(L1, 0x200, 0, 1);
        a.push_load(L1, 0x200, 0, 0);
        let r = a.finish(&TraceTotals::clean(30, 3, 1));
        assert_eq!(r.summary.samples, 2);
        assert_eq!(r.coverage.trace_samples, 1);
        assert_eq!((r.summary.d_max, r.reuse.cold), (Some(0), 2));
        assert_eq!((r.reuse.captures, r.reuse.survivals), (1, 1));
        assert_eq!(r.intervals.levels[0].nodes, 2);
    }

    /// Reuse distances through time-axis compactions, for the first and a
    /// second thread of a sample, and with another block size.
    #[test]
    fn reuse_distance_survives_compaction_in_every_thread() {
        for block in [64u64, 256] {
            let options = AnalysisOptions {
                block,
                ..AnalysisOptions::default()
            };
            let mut a = Analyzer::new(&header(Backend::Soft, Sampling::full()), &options).unwrap();
            // Threads 0 and 1 interleaved; each sweeps 3000 lines three times.
            let mut sequences: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
            for round in 0..3u64 {
                for i in 0..3000u64 {
                    for thread in 0..2u32 {
                        let addr =
                            0x10_0000 * (u64::from(thread) + 1) + 64 * ((i * 7 + round) % 3000);
                        a.push_load(L1, addr, 0, thread);
                        sequences[thread as usize].push(addr / block);
                    }
                }
            }
            let r = a.finish(&TraceTotals::clean(18000, 18000, 1));
            // Naive LRU stack distances per thread.
            let mut ds = Vec::new();
            for seq in &sequences {
                let mut stack: Vec<u64> = Vec::new();
                for &b in seq {
                    if let Some(i) = stack.iter().rev().position(|&x| x == b) {
                        ds.push(i as u64);
                    }
                    stack.retain(|&x| x != b);
                    stack.push(b);
                }
            }
            let mean = ds.iter().sum::<u64>() as f64 / ds.len() as f64;
            assert!(close(r.summary.d_mean.unwrap(), mean), "block {block}");
            assert_eq!(r.summary.d_max, ds.iter().copied().max(), "block {block}");
            assert_eq!(r.summary.samples, 2);
        }
    }

    #[test]
    fn records_and_load_indices_agree() {
        let h = header(Backend::Soft, sampled());
        let by_index = run(Backend::Soft, sampled(), &AnalysisOptions::default());
        let mut a = Analyzer::new(&h, &AnalysisOptions::default()).unwrap();
        for (load, addr, sample) in [
            (L0, 0x100, 0),
            (L1, 0x100, 0),
            (L2, 0x7f00, 0),
            (L0, 0x108, 0),
            (L1, 0x200, 0),
            (L1, 0x200, 1),
            (L0, 0x100, 1),
            (L1, 0x208, 1),
        ] {
            let l = &h.loads[load as usize];
            a.push(&Record {
                ip: l.ip,
                addr,
                class: l.class,
                implied: l.implied,
                sample,
                thread: 0,
                spatial: false,
            });
        }
        let by_record = a.finish(&TraceTotals::clean(80, 8, 2));
        assert_eq!(by_record, by_index);
    }

    #[test]
    fn options_are_validated() {
        let h = header(Backend::Soft, sampled());
        let error = |bad: AnalysisOptions| Analyzer::new(&h, &bad).err();
        assert!(matches!(
            error(AnalysisOptions {
                block: 48,
                ..AnalysisOptions::default()
            }),
            Some(AnalysisError::Block { block: 48 })
        ));
        assert!(matches!(
            error(AnalysisOptions {
                region_min_page: 32,
                ..AnalysisOptions::default()
            }),
            Some(AnalysisError::RegionMinPage { page: 32 })
        ));
        assert!(matches!(
            error(AnalysisOptions {
                functions: Some("[".into()),
                ..AnalysisOptions::default()
            }),
            Some(AnalysisError::Filter(
                memgaze_trace::FilterError::InvalidPattern { .. }
            ))
        ));
        assert!(matches!(
            error(AnalysisOptions {
                region_threshold_percent: 150.0,
                ..AnalysisOptions::default()
            }),
            Some(AnalysisError::HotThreshold { .. })
        ));
        assert!(matches!(
            error(AnalysisOptions {
                code_window_k: Some(MAX_CODE_WINDOW_K + 1),
                ..AnalysisOptions::default()
            }),
            Some(AnalysisError::CodeWindow { .. })
        ));
    }
}
