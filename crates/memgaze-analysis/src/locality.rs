//! Whole-run locality (docs/METRICS.md, "Whole-run locality"): stack
//! distances over the whole run of the accesses to *tracked* 64-byte
//! blocks, and the miss-ratio curve (MRC) of a fully associative LRU cache
//! they give, per trace, function and source line.
//!
//! - A full trace tracks every block: Mattson's exact curve.
//! - A sampled trace with spatial sampling tracks the blocks its
//!   [`SpatialSampling`] hashes under the threshold: the spatial records and
//!   the time-sample records on those blocks. `D̂ = d'/R`, every access
//!   weighs `1/R`, and the SHARDS correction divides by the expected
//!   `N·R` tracked accesses instead of the actual count (`N`: Strided and
//!   Irregular executions, `ρ` times their time-sample records).
//! - A full trace can *emulate* spatial sampling
//!   ([`crate::AnalysisOptions::emulate_spatial`]): its records filtered by
//!   [`SpatialSampling::tracks`] are exactly what a sampled run's tracked
//!   stream holds, and `N` is known exactly; this measures the estimate's
//!   error against the exact curve of the same trace.
//!
//! Distances are per thread: a trace gives program order within a thread
//! only (records of different threads are interleaved in the order their
//! buffers were flushed, not in time), and L1/L2 are private to a core.
//! Each thread keeps an Olken stack (`ReuseTracker`, O(log n) per access)
//! over its tracked blocks, so memory is proportional to the tracked blocks
//! (for a full trace, to the touched 1 KiB pages: see `BlockMap`).
//!
//! Per load site, the accesses are counted in buckets between the reported
//! cache sizes (bucket `j`: `D̂` at least the `j` smallest sizes and below
//! the next; cold accesses in the last bucket), which gives the curve of
//! any set of load sites (a function, a line) exactly at those sizes.
//!
//! Small sampled distances: `d'/R` is a multiple of `1/R` blocks (128 at
//! the default rate), so it cannot tell a reuse at 10 blocks from one at
//! 120, and curves at sizes below a few hundred blocks would be off by
//! whole steps. An access with `d' <` [`SMOOTH_DISTANCES`] is therefore
//! spread over the buckets by the distribution of the true distance given
//! `d'`: every one of the `D` other blocks is tracked with probability
//! `R`. The prior of `D` is measured where it can be: the time samples
//! hold every load of their windows, so their in-window reuse distances
//! are exact, and a reuse whose previous access lies before its window is
//! known to be at least the distinct blocks seen in the window so far (a
//! right-censored observation). Their Kaplan–Meier estimate gives `P(D)`
//! up to the distance where too few observations remain at risk
//! (`WindowDistances`); beyond it the prior continues scale-free
//! (`∝ 1/(D + 1)`, the measured mass per octave), as it is everywhere when
//! the windows give nothing. The small `d'` are therefore counted apart
//! while the run streams and spread by `WholeRun::smooth` at its end; see
//! `smoothing_table`. A block most accesses reuse at a short distance (the
//! top of a tree), when tracked, gives many `d' = 0`: the measured prior
//! keeps them at the short distances the windows see, where a scale-free
//! one would spread them up to `~1/R` blocks. Larger `d'` use `D̂ = d'/R`
//! (relative step below 1/64).

use super::reuse::{BlockLocal, ReuseTracker};
use super::{Map, NONE};
use memgaze_metadata::analysis::{CacheSizes, MrcPoint};
use memgaze_trace::SpatialSampling;

/// Smallest reported cache size: `2^6` blocks (4 KiB).
pub const MRC_MIN_LOG2: u32 = 6;
/// Largest reported cache size: `2^24` blocks (1 GiB).
pub const MRC_MAX_LOG2: u32 = 24;
/// Fewer tracked accesses than this make a curve undersampled
/// (docs/METRICS.md).
pub const MIN_TRACKED: u64 = 1000;
/// Sampled distances `d'` below this are spread by their posterior (see
/// the module documentation).
pub const SMOOTH_DISTANCES: usize = 64;
/// In-window distances at and past this count as censored here: the prior
/// is measured below it at most.
pub const PRIOR_DISTANCES: usize = 1 << 12;
/// The measured prior ends where fewer in-window observations than this
/// remain at risk (the hazard's relative error there is about
/// `1/sqrt(events)`, and events are a fraction of these).
pub const PRIOR_MIN_AT_RISK: u64 = 1000;
/// Groups of tracked blocks (by a second hash of the block) whose shares
/// of the curve `summary.mrc_groups` holds, for bootstrap intervals.
pub const BOOTSTRAP_GROUPS: usize = 32;
/// Source lines listed in `lines[]`.
pub const TOP_LINES: usize = 32;

/// Cache sizes assumed when sysfs cannot be read (the spec's example).
pub const FALLBACK_CACHE_SIZES: [u64; 3] = [48 << 10, 2 << 20, 32 << 20];

/// Parses `48K,2M,32M` (sizes in bytes with an optional `K`, `M` or `G`
/// suffix, powers of 1024) into L1, L2 and LLC sizes; the error says what
/// is wrong.
pub fn parse_cache_sizes(text: &str) -> Result<CacheSizes, String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if parts.len() != 3 {
        return Err(format!(
            "expected three sizes L1,L2,LLC such as 48K,2M,32M, got {text:?}"
        ));
    }
    let mut sizes = [0u64; 3];
    for (size, part) in sizes.iter_mut().zip(&parts) {
        *size = parse_size(part).ok_or_else(|| {
            format!("{part:?} is not a cache size (bytes with an optional K, M or G suffix, at least 64)")
        })?;
    }
    Ok(CacheSizes {
        l1: sizes[0],
        l2: sizes[1],
        llc: sizes[2],
        source: "--cache-sizes".into(),
    })
}

/// `32768`, `32K`, `32KiB`, `2M`, `1G` in bytes; `None` when unparsable,
/// below one 64-byte block or absurdly large.
fn parse_size(text: &str) -> Option<u64> {
    let upper = text.to_ascii_uppercase();
    let body = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (digits, shift) = match body.chars().last()? {
        'K' => (&body[..body.len() - 1], 10),
        'M' => (&body[..body.len() - 1], 20),
        'G' => (&body[..body.len() - 1], 30),
        _ => (body, 0),
    };
    let n: u64 = digits.parse().ok()?;
    let bytes = n.checked_mul(1 << shift)?;
    (64..=1 << 40).contains(&bytes).then_some(bytes)
}

/// This machine's L1 data, L2 and last-level cache sizes, from
/// `/sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}`; the
/// [`FALLBACK_CACHE_SIZES`] (source `"fallback"`) when they cannot be read.
/// Read once per process.
pub fn machine_cache_sizes() -> CacheSizes {
    static SIZES: std::sync::OnceLock<CacheSizes> = std::sync::OnceLock::new();
    SIZES
        .get_or_init(|| {
            read_sysfs_cache_sizes(std::path::Path::new("/sys/devices/system/cpu/cpu0/cache"))
                .unwrap_or(CacheSizes {
                    l1: FALLBACK_CACHE_SIZES[0],
                    l2: FALLBACK_CACHE_SIZES[1],
                    llc: FALLBACK_CACHE_SIZES[2],
                    source: "fallback".into(),
                })
        })
        .clone()
}

/// The cache sizes under a sysfs `cache` directory: the level-1 Data (or
/// Unified) cache, the level-2 cache and the highest level's; `None` when
/// any is missing.
pub fn read_sysfs_cache_sizes(dir: &std::path::Path) -> Option<CacheSizes> {
    let mut l1 = None;
    let mut l2 = None;
    let mut last: Option<(u32, u64)> = None;
    for entry in std::fs::read_dir(dir).ok()? {
        let path = entry.ok()?.path();
        if !path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("index"))
        {
            continue;
        }
        let read = |name: &str| std::fs::read_to_string(path.join(name)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        let Ok(level) = level.trim().parse::<u32>() else {
            continue;
        };
        let kind = kind.trim();
        if kind == "Instruction" {
            continue;
        }
        let Some(bytes) = parse_size(size.trim()) else {
            continue;
        };
        match level {
            1 => l1 = Some(bytes),
            2 => l2 = Some(bytes),
            _ => {}
        }
        if last.is_none_or(|(l, _)| level > l) {
            last = Some((level, bytes));
        }
    }
    let (level, llc) = last?;
    (level >= 2).then_some(())?;
    Some(CacheSizes {
        l1: l1?,
        l2: l2?,
        llc,
        source: "sysfs".into(),
    })
}

/// Which accesses build the whole-run curve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Tracking {
    /// None (a sampled trace without spatial sampling).
    Off,
    /// Every Strided and Irregular record (a full trace): the exact curve.
    Every,
    /// The records on blocks `sampling` tracks, with `N` from the sampled
    /// counts (a spatially sampled trace) or exact (`emulated`, a full
    /// trace filtered).
    Sampled {
        sampling: SpatialSampling,
        emulated: bool,
    },
}

/// Blocks per page of [`BlockMap::Paged`] (1 KiB of addresses).
const PAGE_BLOCKS: usize = 16;

/// One thread's per-block state.
enum BlockMap {
    /// One hash-map entry per block: tracked blocks of a sampled trace are
    /// scattered (a fraction `R` of them).
    Hashed(Map<u64, BlockLocal>),
    /// Every block tracked (a full trace): pages of [`PAGE_BLOCKS`]
    /// neighbouring blocks, found through a hash map of page numbers that
    /// is `PAGE_BLOCKS` times smaller (cache-resident where the block map
    /// is not), the last page remembered. Streams find their next block's
    /// state beside the last one's; a page costs `PAGE_BLOCKS` states
    /// however few of its blocks are touched.
    Paged {
        index: Map<u64, u32>,
        pages: Vec<[BlockLocal; PAGE_BLOCKS]>,
        /// The last page looked up and its index (`NONE`: none yet).
        last: (u64, u32),
    },
}

impl BlockMap {
    /// The state of `block`, inserted unseen (piece 0) when new.
    #[inline(always)]
    fn entry(&mut self, block: u64) -> &mut BlockLocal {
        match self {
            BlockMap::Hashed(map) => map.entry(block).or_default(),
            BlockMap::Paged { index, pages, last } => {
                let page = block / PAGE_BLOCKS as u64;
                if last.0 != page {
                    let next = pages.len() as u32;
                    let at = *index.entry(page).or_insert_with(|| {
                        pages.push(Default::default());
                        next
                    });
                    *last = (page, at);
                }
                &mut pages[last.1 as usize][(block % PAGE_BLOCKS as u64) as usize]
            }
        }
    }
}

/// One thread's stack of tracked blocks.
struct ThreadStack {
    thread: u32,
    tracker: ReuseTracker,
    blocks: BlockMap,
    /// The block accessed last, once it has been reused (`NONE` otherwise):
    /// its next access is at distance 0 and changes no state, so it skips
    /// the block map and the tracker.
    recent: u64,
}

impl ThreadStack {
    fn new(thread: u32, every_block: bool) -> Self {
        let mut tracker = ReuseTracker::new();
        // One piece for the whole run; blocks start in piece 0 (unseen).
        tracker.reset(1);
        ThreadStack {
            thread,
            tracker,
            blocks: if every_block {
                BlockMap::Paged {
                    index: Map::default(),
                    pages: Vec::new(),
                    last: (NONE, 0),
                }
            } else {
                BlockMap::Hashed(Map::default())
            },
            recent: NONE,
        }
    }

    /// The stack distance `d'` of an access to `block`, `None` when cold.
    #[inline]
    fn access(&mut self, block: u64) -> Option<u64> {
        if block == self.recent {
            return Some(0);
        }
        if self.tracker.needs_room() {
            let blocks = &mut self.blocks;
            self.tracker.compact(|b, t| blocks.entry(b).time = t);
        }
        let local = self.blocks.entry(block);
        let distance = self.tracker.access(block, local);
        self.recent = if distance.is_some() { block } else { NONE };
        distance
    }
}

/// The reported cache sizes, in blocks, and the distance thresholds that
/// separate the buckets.
#[derive(Clone, Debug)]
pub(crate) struct CurveSizes {
    /// Sorted, distinct: `2^6 … 2^24` and the three cache sizes.
    pub sizes: Vec<u64>,
    /// `⌈sizes[i] · R⌉`: an access misses at `sizes[i]` iff `d' ≥` this
    /// (`d'` is an integer, so `d' ≥ sizes[i] · R` iff `d' ≥ ⌈sizes[i] · R⌉`).
    thresholds: Vec<u64>,
    /// By bit length `b` of `d'` (0 for `d' = 0`): the thresholds at or
    /// below the smallest `d'` of that length, where the bucket search
    /// starts (a few thresholds lie within one bit length).
    first_bucket: [u8; 65],
    /// Index of the L1, L2 and LLC sizes in `sizes`.
    pub caches: [usize; 3],
    /// log2 of the block size.
    pub block_shift: u32,
    /// Whether accesses of `d' <` [`SMOOTH_DISTANCES`] are counted apart
    /// (sampled curves, until [`WholeRun::smooth`] spreads them).
    raw: bool,
}

impl CurveSizes {
    pub fn new(caches: &CacheSizes, block_shift: u32, rate: f64) -> Self {
        let cache_blocks = [caches.l1, caches.l2, caches.llc].map(|b| (b >> block_shift).max(1));
        let mut sizes: Vec<u64> = (MRC_MIN_LOG2..=MRC_MAX_LOG2).map(|k| 1u64 << k).collect();
        sizes.extend(cache_blocks);
        sizes.sort_unstable();
        sizes.dedup();
        let caches = cache_blocks.map(|c| sizes.binary_search(&c).expect("listed"));
        let thresholds: Vec<u64> = sizes
            .iter()
            .map(|&c| (c as f64 * rate).ceil() as u64)
            .collect();
        let first_bucket = std::array::from_fn(|bits| {
            let smallest = if bits == 0 { 0 } else { 1u64 << (bits - 1) };
            thresholds.partition_point(|&t| t <= smallest) as u8
        });
        CurveSizes {
            sizes,
            thresholds,
            first_bucket,
            caches,
            block_shift,
            raw: rate < 1.0,
        }
    }

    /// Adds one access of distance `d'` to a site's weights
    /// ([`Self::columns`]).
    #[inline]
    fn add(&self, site: &mut [f64], distance: Option<u64>) {
        match distance {
            Some(d) if self.raw && (d as usize) < SMOOTH_DISTANCES => {
                site[self.buckets() + d as usize] += 1.0;
            }
            _ => site[self.bucket(distance)] += 1.0,
        }
    }

    /// Buckets per load site.
    pub fn buckets(&self) -> usize {
        self.sizes.len() + 1
    }

    /// Weights per load site or block group while the run streams: the
    /// buckets, then the counts of each small `d'` while they are apart.
    pub fn columns(&self) -> usize {
        self.buckets() + if self.raw { SMOOTH_DISTANCES } else { 0 }
    }

    /// The bucket of an access of distance `d'` (`None`: cold, the last).
    #[inline]
    fn bucket(&self, distance: Option<u64>) -> usize {
        match distance {
            None => self.sizes.len(),
            Some(d) => {
                let bits = (u64::BITS - d.leading_zeros()) as usize;
                let mut b = usize::from(self.first_bucket[bits]);
                while self.thresholds.get(b).is_some_and(|&t| t <= d) {
                    b += 1;
                }
                b
            }
        }
    }
}

/// The in-window reuse distances of the time samples' tracked-class
/// accesses, for the prior of `D` (module documentation).
#[derive(Clone, Debug)]
pub(crate) struct WindowDistances {
    /// `events[k]`: accesses at in-window distance `k < PRIOR_DISTANCES`.
    events: Vec<u64>,
    /// `censored[c]`: accesses known only to be at a distance `≥ c` (cold
    /// in their window after `c` distinct blocks, or at a distance `≥`
    /// [`PRIOR_DISTANCES`], `c` capped there).
    censored: Vec<u64>,
}

impl Default for WindowDistances {
    fn default() -> Self {
        WindowDistances {
            events: vec![0; PRIOR_DISTANCES],
            censored: vec![0; PRIOR_DISTANCES + 1],
        }
    }
}

impl WindowDistances {
    /// One access: its in-window distance (`None`: its block's previous
    /// access, if any, lies before the window) and the distinct blocks of
    /// the window before it.
    #[inline]
    pub fn add(&mut self, distance: Option<u64>, seen: u64) {
        match distance {
            Some(d) if (d as usize) < PRIOR_DISTANCES => self.events[d as usize] += 1,
            Some(_) => self.censored[PRIOR_DISTANCES] += 1,
            None => self.censored[(seen as usize).min(PRIOR_DISTANCES)] += 1,
        }
    }

    /// Kaplan–Meier survival `S(k) = P(D ≥ k)` for `k = 0 ..= H`, `H` the
    /// first distance with fewer than [`PRIOR_MIN_AT_RISK`] observations at
    /// risk (an observation censored at `c` is at risk at every `k < c`).
    pub fn survival(&self) -> Vec<f64> {
        let mut at_risk: u64 =
            self.events.iter().sum::<u64>() + self.censored[1..].iter().sum::<u64>();
        let mut survival = vec![1.0];
        for k in 0..PRIOR_DISTANCES {
            if at_risk < PRIOR_MIN_AT_RISK {
                break;
            }
            let s = survival[k] * (1.0 - self.events[k] as f64 / at_risk as f64);
            survival.push(s);
            at_risk -= self.events[k] + self.censored[k + 1];
        }
        survival
    }
}

/// Row `d'` (for `d' < SMOOTH_DISTANCES`): the probability that the true
/// distance `D` lies in each bucket. Given `D`, `d'` is binomial (`D`
/// blocks, each tracked with probability `R`), so
/// `P(D | d') ∝ C(D, d') R^d' (1 − R)^(D − d') π(D)`, summed until the
/// tail is negligible. The prior `π` comes from `survival` (`S(k)` for
/// `k ≤ H`, [`WindowDistances::survival`]): `S(D) − S(D + 1)` below `H`,
/// then scale-free, `c/(D + 1)`, holding the measured rest `S(H)` between
/// `H` and the run's estimated footprint `M` (at least `2H`) blocks:
/// `c = S(H)/ln((M + 1)/(H + 1))` (`c = 1`, wholly scale-free, when
/// `H < 2`). A row the prior gives no weight falls back to the scale-free
/// one. Only the rows `needed` marks are computed (the others are zeros):
/// at a tiny rate each row sums up to 2^26 terms, and most `d'` never
/// occur.
fn smoothing_table(
    sizes: &[u64],
    rate: f64,
    survival: &[f64],
    footprint: f64,
    needed: &[bool; SMOOTH_DISTANCES],
) -> Vec<f64> {
    let head = survival.len().saturating_sub(1);
    let n = sizes.len() + 1;
    let mut table = Vec::with_capacity(SMOOTH_DISTANCES * n);
    let (survival, tail) = if head >= 2 {
        let end = footprint.max(2.0 * head as f64);
        let c = survival[head] / ((end + 1.0) / (head as f64 + 1.0)).ln();
        (survival, c)
    } else {
        (&[1.0][..], 1.0)
    };
    for (d, &needed) in needed.iter().enumerate() {
        if !needed {
            table.extend(std::iter::repeat_n(0.0, n));
            continue;
        }
        let row = posterior_row(sizes, rate, d, survival, tail)
            .or_else(|| posterior_row(sizes, rate, d, &[1.0], 1.0))
            .expect("the scale-free prior weighs every D");
        table.extend(row);
    }
    table
}

/// One row of [`smoothing_table`] under the prior that `survival` and the
/// tail's `c` give; `None` when it gives the row no weight.
fn posterior_row(sizes: &[u64], rate: f64, d: usize, survival: &[f64], c: f64) -> Option<Vec<f64>> {
    let n = sizes.len() + 1;
    let head = survival.len() - 1;
    let prior = |big: u64| -> f64 {
        match usize::try_from(big) {
            Ok(k) if k < head => (survival[k] - survival[k + 1]).max(0.0),
            _ => c / (big as f64 + 1.0),
        }
    };
    let ln_q = (1.0 - rate).ln();
    // `ln C(D, d') + (D − d') ln q` for D = d', d' + 1, …, by the ratio
    // (D + 1)/(D + 1 − d') · q.
    let mut ln_likelihood = 0.0_f64;
    let mut mass = vec![0.0; n];
    let mut total = 0.0;
    let mut bucket = sizes.partition_point(|&s| s <= d as u64);
    let mut big = d as u64;
    loop {
        let w = ln_likelihood.exp() * prior(big);
        total += w;
        mass[bucket] += w;
        // Past the head the prior is positive everywhere, so a negligible
        // term means a negligible rest; inside the head a measured prior
        // can be zero at one `D` and not at the next.
        let past = big as usize >= head && big as f64 > (d as f64 + 1.0) / rate;
        if (past && w <= total * 1e-15) || big > (1 << 26) {
            break;
        }
        let x = big as f64;
        ln_likelihood += ((x + 1.0) / (x + 1.0 - d as f64)).ln() + ln_q;
        big += 1;
        while bucket < sizes.len() && sizes[bucket] <= big {
            bucket += 1;
        }
    }
    (total > 0.0).then(|| mass.iter().map(|m| m / total).collect())
}

/// Tracked accesses handed to the stacks at once: the analysis queues them
/// and, once a batch fills, a second thread takes over the stacks, so the
/// whole-run distances overlap the per-window metrics (the accesses are
/// taken in the same order either way, so the counts are the same).
const BATCH: usize = 1 << 16;

/// One tracked access: load site, thread, address.
#[derive(Clone, Copy)]
struct Access {
    slot: u32,
    thread: u32,
    addr: u64,
}

/// The whole-run stacks and per-load-site bucket counts of an analysis.
pub(crate) struct WholeRun {
    pub tracking: Tracking,
    pub sizes: CurveSizes,
    /// `R` (1 for [`Tracking::Every`]).
    pub rate: f64,
    /// The stacks and counts: here until the first batch fills, on the
    /// worker from then until [`Self::settle`].
    stacks: Option<Stacks>,
    /// Accesses not yet handed to the stacks.
    queued: Vec<Access>,
    worker: Option<Worker>,
    /// Tracked accesses counted (valid after [`Self::settle`]).
    pub tracked: u64,
    /// Spatial records met (whatever their load).
    pub spatial_records: u64,
    /// Spatial records of loads that are not Strided or Irregular, or of
    /// a trace without spatial sampling: left out.
    pub spatial_ignored: u64,
}

/// The thread that owns the [`Stacks`] while the trace is read: batches in,
/// emptied batches back for reuse.
struct Worker {
    batches: std::sync::mpsc::SyncSender<Vec<Access>>,
    emptied: std::sync::mpsc::Receiver<Vec<Access>>,
    thread: std::thread::JoinHandle<Stacks>,
}

/// Per-thread stacks and per-site bucket weights.
struct Stacks {
    sizes: CurveSizes,
    threads: Vec<ThreadStack>,
    current: usize,
    every_block: bool,
    /// Per load site with a tracked access, in order of its first:
    /// `columns()` weights (`buckets()` once smoothed), then the
    /// tracked-access count. A row for every site up to the highest one
    /// seen was most of a large program's analysis (450 k sites × 86
    /// weights, where a short run touches a few thousand).
    hist: Vec<f64>,
    /// Per site index up to the highest seen: its row of `hist` plus one,
    /// 0 when it has none.
    row_of: Vec<u32>,
    /// `buckets()` zero weights and a zero count: what [`WholeRun::site`]
    /// gives for a site below the highest seen that has no row.
    zero_row: Vec<f64>,
    /// `BOOTSTRAP_GROUPS × columns()` weights (`buckets()` once smoothed):
    /// the accesses of each group of blocks (sampled curves only).
    groups: Vec<f64>,
    tracked: u64,
}

impl WholeRun {
    pub fn new(tracking: Tracking, caches: &CacheSizes) -> Self {
        let (rate, block_shift) = match tracking {
            Tracking::Sampled { sampling, .. } => (sampling.rate(), sampling.block_shift),
            _ => (1.0, SpatialSampling::DEFAULT_BLOCK_SHIFT),
        };
        let sizes = CurveSizes::new(caches, block_shift, rate);
        WholeRun {
            tracking,
            stacks: Some(Stacks {
                sizes: sizes.clone(),
                threads: Vec::new(),
                current: 0,
                every_block: tracking == Tracking::Every,
                hist: Vec::new(),
                row_of: Vec::new(),
                zero_row: vec![0.0; sizes.buckets() + 1],
                groups: match tracking {
                    Tracking::Sampled { .. } => {
                        vec![0.0; BOOTSTRAP_GROUPS * sizes.columns()]
                    }
                    _ => Vec::new(),
                },
                tracked: 0,
            }),
            sizes,
            rate,
            queued: Vec::new(),
            worker: None,
            tracked: 0,
            spatial_records: 0,
            spatial_ignored: 0,
        }
    }

    pub fn is_on(&self) -> bool {
        self.tracking != Tracking::Off
    }

    /// Whether a record of a Strided or Irregular load on `addr`, from a
    /// time sample or a full trace, is tracked.
    #[inline]
    pub fn tracks(&self, addr: u64) -> bool {
        match self.tracking {
            Tracking::Off => false,
            Tracking::Every => true,
            Tracking::Sampled { sampling, .. } => sampling.tracks(addr),
        }
    }

    /// A tracked access of load site `slot` to `addr` by `thread`.
    #[inline]
    pub fn access(&mut self, slot: u32, addr: u64, thread: u32) {
        self.queued.push(Access { slot, thread, addr });
        if self.queued.len() >= BATCH {
            self.hand_over();
        }
    }

    /// Hands the full batch to the worker, starting it on the first batch
    /// (where the machine has one core, or no thread can be started, the
    /// batch is taken here).
    #[cold]
    fn hand_over(&mut self) {
        if self.worker.is_none() {
            self.worker = self.start_worker();
        }
        match &self.worker {
            Some(worker) => {
                let spare = worker
                    .emptied
                    .try_recv()
                    .unwrap_or_else(|_| Vec::with_capacity(BATCH));
                let batch = std::mem::replace(&mut self.queued, spare);
                // A closed channel means the worker panicked: `settle`
                // reports it.
                let _ = worker.batches.send(batch);
            }
            None => {
                let stacks = self.stacks.as_mut().expect("stacks kept here");
                stacks.take(&self.queued);
                self.queued.clear();
            }
        }
    }

    fn start_worker(&mut self) -> Option<Worker> {
        if !std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2) {
            return None;
        }
        // The stacks move only once the thread runs: a failed start keeps
        // them here.
        let (give, receive) = std::sync::mpsc::channel::<Stacks>();
        let (batches, inbox) = std::sync::mpsc::sync_channel::<Vec<Access>>(2);
        let (done, emptied) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("whole-run".into())
            .spawn(move || {
                let mut stacks = receive.recv().expect("stacks sent once started");
                for mut batch in inbox {
                    stacks.take(&batch);
                    batch.clear();
                    let _ = done.send(batch);
                }
                stacks
            })
            .ok()?;
        give.send(self.stacks.take()?).ok()?;
        Some(Worker {
            batches,
            emptied,
            thread,
        })
    }

    /// Takes every queued access and brings the stacks back from the
    /// worker: call before [`Self::site`] and [`Self::group_shares`].
    pub fn settle(&mut self) {
        if let Some(worker) = self.worker.take() {
            let batch = std::mem::take(&mut self.queued);
            let _ = worker.batches.send(batch);
            drop(worker.batches);
            match worker.thread.join() {
                Ok(stacks) => self.stacks = Some(stacks),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        } else if let Some(stacks) = &mut self.stacks {
            stacks.take(&self.queued);
            self.queued.clear();
        }
        self.tracked = self.stacks.as_ref().map_or(0, |s| s.tracked);
    }

    /// Spreads the accesses of small `d'` counted apart over the buckets
    /// by their posterior under the prior `survival` gives
    /// ([`WindowDistances::survival`]); afterwards every site and group
    /// holds `buckets()` weights. Call after [`Self::settle`]; nothing to
    /// do for exact curves.
    pub fn smooth(&mut self, survival: &[f64]) {
        if !self.sizes.raw {
            return;
        }
        let rate = self.rate;
        if let Some(stacks) = self.stacks.as_mut() {
            debug_assert!(
                self.queued.is_empty() && self.worker.is_none(),
                "settle() first"
            );
            stacks.smooth(rate, survival);
        }
        self.sizes.raw = false;
    }

    /// Each block group's share of `MR̂` at every reported size, given the
    /// trace's denominator (`N·R` or the tracked count): they add up to the
    /// trace's curve before clamping. Empty for exact curves.
    pub fn group_shares(&self, total: &Tally) -> Vec<Vec<f64>> {
        debug_assert!(!self.sizes.raw, "smooth() first");
        let Some(den) = total.denominator(self.rate) else {
            return Vec::new();
        };
        let n = self.sizes.buckets();
        self.settled()
            .groups
            .chunks(n)
            .map(|g| {
                (0..self.sizes.sizes.len())
                    .map(|i| g[i + 1..].iter().sum::<f64>() / den)
                    .collect()
            })
            .collect()
    }

    /// Bucket weights and tracked count of load site `slot` (empty past
    /// the highest site with a tracked access, zeros below it for a site
    /// without), once [`Self::smooth`] has run.
    pub fn site(&self, slot: usize) -> &[f64] {
        debug_assert!(!self.sizes.raw, "smooth() first");
        let width = self.sizes.buckets() + 1;
        let stacks = self.settled();
        match stacks.row_of.get(slot) {
            None => &[],
            Some(0) => &stacks.zero_row,
            Some(&row) => &stacks.hist[(row as usize - 1) * width..][..width],
        }
    }

    fn settled(&self) -> &Stacks {
        debug_assert!(self.queued.is_empty() && self.worker.is_none());
        self.stacks.as_ref().expect("settled")
    }
}

impl Stacks {
    fn take(&mut self, accesses: &[Access]) {
        for a in accesses {
            self.access(a.slot, a.addr, a.thread);
        }
    }

    #[inline]
    fn access(&mut self, slot: u32, addr: u64, thread: u32) {
        if self
            .threads
            .get(self.current)
            .is_none_or(|t| t.thread != thread)
        {
            self.switch(thread);
        }
        let block = addr >> self.sizes.block_shift;
        let distance = self.threads[self.current].access(block);
        if !self.groups.is_empty() {
            let n = self.sizes.columns();
            let g = (block.wrapping_mul(0xd6e8_feb8_6659_fd93) >> 59) as usize;
            self.sizes.add(&mut self.groups[g * n..][..n], distance);
        }
        let width = self.sizes.columns() + 1;
        let slot = slot as usize;
        if self.row_of.len() <= slot {
            self.row_of.resize(slot + 1, 0);
        }
        let row = match self.row_of[slot] {
            0 => {
                self.hist.resize(self.hist.len() + width, 0.0);
                let rows = self.hist.len() / width;
                self.row_of[slot] = rows as u32;
                rows - 1
            }
            row => row as usize - 1,
        };
        let site = &mut self.hist[row * width..][..width];
        self.sizes.add(&mut site[..width - 1], distance);
        site[width - 1] += 1.0;
        self.tracked += 1;
    }

    #[cold]
    fn switch(&mut self, thread: u32) {
        self.current = match self.threads.iter().position(|t| t.thread == thread) {
            Some(i) => i,
            None => {
                self.threads
                    .push(ThreadStack::new(thread, self.every_block));
                self.threads.len() - 1
            }
        };
    }

    /// Spreads the accesses of small `d'` counted apart over the buckets
    /// by their posterior under the prior `survival` gives
    /// ([`WindowDistances::survival`]) at rate `rate`; afterwards every
    /// site and group holds `buckets()` weights.
    fn smooth(&mut self, rate: f64, survival: &[f64]) {
        // Distinct tracked blocks weighted 1/R: the run's footprint.
        let footprint = self
            .threads
            .iter()
            .map(|t| f64::from(t.tracker.live()))
            .sum::<f64>()
            / rate;
        let n = self.sizes.buckets();
        let columns = self.sizes.columns();
        let mut needed = [false; SMOOTH_DISTANCES];
        for weights in self
            .hist
            .chunks(columns + 1)
            .chain(self.groups.chunks(columns))
        {
            for (d, &count) in weights[n..n + SMOOTH_DISTANCES].iter().enumerate() {
                needed[d] |= count > 0.0;
            }
        }
        let table = smoothing_table(&self.sizes.sizes, rate, survival, footprint, &needed);
        let fold = |weights: &[f64], out: &mut Vec<f64>| {
            let at = out.len();
            out.extend_from_slice(&weights[..n]);
            for (d, &count) in weights[n..n + SMOOTH_DISTANCES].iter().enumerate() {
                if count > 0.0 {
                    for (w, p) in out[at..].iter_mut().zip(&table[d * n..][..n]) {
                        *w += count * p;
                    }
                }
            }
        };
        let mut hist = Vec::with_capacity(self.hist.len() / (columns + 1) * (n + 1));
        for site in self.hist.chunks(columns + 1) {
            fold(site, &mut hist);
            hist.push(site[columns]);
        }
        let mut groups = Vec::with_capacity(BOOTSTRAP_GROUPS * n);
        for group in self.groups.chunks(columns) {
            fold(group, &mut groups);
        }
        (self.hist, self.groups) = (hist, groups);
        self.sizes.raw = false;
    }
}

/// Bucket counts and estimated executions of a set of load sites.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tally {
    /// Bucket weights, then the tracked-access count.
    pub buckets: Vec<f64>,
    /// `N`, the estimated Strided and Irregular executions (`None` when
    /// ρ is unknown).
    pub executions: Option<f64>,
}

impl Tally {
    pub fn new(buckets: usize) -> Self {
        Tally {
            buckets: vec![0.0; buckets + 1],
            executions: Some(0.0),
        }
    }

    pub fn add(&mut self, site: &[f64], executions: Option<f64>) {
        for (total, &n) in self.buckets.iter_mut().zip(site) {
            *total += n;
        }
        self.executions = match (self.executions, executions) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
    }

    pub fn tracked(&self) -> u64 {
        self.buckets.last().copied().unwrap_or(0.0) as u64
    }

    /// Tracked accesses (weights) that miss at size index `i`.
    fn misses_at(&self, i: usize) -> f64 {
        let n = self.buckets.len() - 1;
        self.buckets[i + 1..n].iter().sum()
    }

    /// What a miss count is divided by: the expected tracked accesses
    /// `N·R` (the SHARDS correction), or the actual ones without `N` (ρ
    /// unknown, or no time-sample record to estimate it from).
    pub(crate) fn denominator(&self, rate: f64) -> Option<f64> {
        let d = match self.executions {
            Some(n) if n > 0.0 => n * rate,
            _ => self.tracked() as f64,
        };
        (d > 0.0).then_some(d)
    }

    /// `MR̂` at size index `i`, in `[0, 1]`.
    pub fn miss_ratio(&self, i: usize, rate: f64) -> Option<f64> {
        let d = self.denominator(rate)?;
        Some((self.misses_at(i) / d).clamp(0.0, 1.0))
    }

    /// Estimated misses at size index `i`: tracked misses weighted `1/R`
    /// (`MR̂ · N`, before clamping).
    pub fn misses(&self, i: usize, rate: f64) -> f64 {
        self.misses_at(i) / rate
    }

    /// Estimated executions: `N`, or the tracked accesses weighted `1/R`.
    pub fn estimated_accesses(&self, rate: f64) -> f64 {
        match self.executions {
            Some(n) if n > 0.0 => n,
            _ => self.tracked() as f64 / rate,
        }
    }

    /// The curve at every reported size (empty when nothing was tracked).
    pub fn curve(&self, sizes: &CurveSizes, rate: f64) -> Vec<MrcPoint> {
        if self.tracked() == 0 {
            return Vec::new();
        }
        sizes
            .sizes
            .iter()
            .enumerate()
            .filter_map(|(i, &blocks)| {
                Some(MrcPoint {
                    blocks,
                    bytes: blocks << sizes.block_shift,
                    miss_ratio: self.miss_ratio(i, rate)?,
                })
            })
            .collect()
    }

    /// `MR_L1`, `MR_L2`, `MR_LLC`.
    pub fn cache_ratios(&self, sizes: &CurveSizes, rate: f64) -> [Option<f64>; 3] {
        if self.tracked() == 0 {
            return [None; 3];
        }
        sizes.caches.map(|i| self.miss_ratio(i, rate))
    }
}

/// Mean absolute error between two curves over the sizes both report
/// (`None` when they share none).
pub fn curve_mae(estimate: &[MrcPoint], exact: &[MrcPoint]) -> Option<f64> {
    let mut sum = 0.0;
    let mut n = 0u32;
    for p in estimate {
        if let Some(q) = exact.iter().find(|q| q.blocks == p.blocks) {
            sum += (p.miss_ratio - q.miss_ratio).abs();
            n += 1;
        }
    }
    (n > 0).then(|| sum / f64::from(n))
}

/// The points of a curve at the machine-independent sizes `2^6 … 2^24`
/// blocks (what golden snapshots keep).
pub fn standard_points(curve: &[MrcPoint]) -> Vec<MrcPoint> {
    curve
        .iter()
        .filter(|p| {
            p.blocks.is_power_of_two()
                && (MRC_MIN_LOG2..=MRC_MAX_LOG2).contains(&p.blocks.trailing_zeros())
        })
        .copied()
        .collect()
}

/// `MR` at `blocks` from a curve, interpolated linearly in `log2(size)`
/// between its points (clamped at its ends); `None` for an empty curve.
pub fn interpolate(curve: &[MrcPoint], blocks: u64) -> Option<f64> {
    let first = curve.first()?;
    let last = curve.last()?;
    if blocks <= first.blocks {
        return Some(first.miss_ratio);
    }
    if blocks >= last.blocks {
        return Some(last.miss_ratio);
    }
    let i = curve.partition_point(|p| p.blocks <= blocks);
    let (lo, hi) = (curve[i - 1], curve[i]);
    if lo.blocks == blocks {
        return Some(lo.miss_ratio);
    }
    let x = (blocks as f64).log2();
    let (x0, x1) = ((lo.blocks as f64).log2(), (hi.blocks as f64).log2());
    Some(lo.miss_ratio + (hi.miss_ratio - lo.miss_ratio) * (x - x0) / (x1 - x0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cache sizes in bytes, as `--cache-sizes` would give them.
    fn test_caches(l1: u64, l2: u64, llc: u64) -> CacheSizes {
        CacheSizes {
            l1,
            l2,
            llc,
            source: "test".into(),
        }
    }

    #[test]
    fn cache_sizes_parse_and_refuse() {
        let c = parse_cache_sizes("48K,2M,32M").unwrap();
        assert_eq!((c.l1, c.l2, c.llc), (48 << 10, 2 << 20, 32 << 20));
        let c = parse_cache_sizes("32768, 1MiB, 1G").unwrap();
        assert_eq!((c.l1, c.l2, c.llc), (32768, 1 << 20, 1 << 30));
        for bad in [
            "banana",
            "48K,2M",
            "48K,2M,32M,1G",
            "0,2M,32M",
            "48Q,2M,32M",
            "-1,2,3",
        ] {
            assert!(parse_cache_sizes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sysfs_layout_is_read() {
        let dir = std::env::temp_dir().join(format!("memgaze-sysfs-{}", std::process::id()));
        for (i, level, kind, size) in [
            (0, "1", "Data", "32K"),
            (1, "1", "Instruction", "32K"),
            (2, "2", "Unified", "1024K"),
            (3, "3", "Unified", "32768K"),
        ] {
            let d = dir.join(format!("index{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        let c = read_sysfs_cache_sizes(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((c.l1, c.l2, c.llc), (32 << 10, 1 << 20, 32 << 20));
        assert!(read_sysfs_cache_sizes(&dir).is_none());
    }

    #[test]
    fn buckets_split_at_the_sizes() {
        let caches = test_caches(48 << 10, 1 << 20, 32 << 20);
        let s = CurveSizes::new(&caches, 6, 1.0);
        // 2^6..2^24 (19 sizes) plus 768 blocks (48K); 1M and 32M are powers of two.
        assert_eq!(s.sizes.len(), 20);
        assert_eq!(s.sizes[s.caches[0]], 768);
        assert_eq!(s.bucket(Some(0)), 0);
        assert_eq!(s.bucket(Some(63)), 0);
        assert_eq!(s.bucket(Some(64)), 1);
        assert_eq!(s.bucket(None), 20);
        assert_eq!(s.bucket(Some(1 << 30)), 20);
    }

    /// The integer bucket search gives the bucket of the comparison with
    /// `sizes[i] · R` in floating point, at every rate and around every
    /// threshold.
    #[test]
    fn integer_buckets_match_the_float_thresholds() {
        let caches = test_caches(48 << 10, 1_310_720, 33 << 20);
        for rate in [1.0, 0.5, 1.0 / 128.0, 0.001, 0.3] {
            let s = CurveSizes::new(&caches, 6, rate);
            let float: Vec<f64> = s.sizes.iter().map(|&c| c as f64 * rate).collect();
            let mut distances: Vec<u64> = (0..300).collect();
            for &t in &float {
                let t = t as u64;
                distances.extend(t.saturating_sub(2)..t + 3);
            }
            distances.extend([u64::from(u32::MAX), 1 << 40, u64::MAX >> 12]);
            for d in distances {
                let want = float.partition_point(|&t| t <= d as f64);
                assert_eq!(s.bucket(Some(d)), want, "rate {rate}, d' {d}");
            }
        }
    }

    #[test]
    fn interpolation_is_log_linear() {
        let curve = [
            MrcPoint {
                blocks: 64,
                bytes: 4096,
                miss_ratio: 1.0,
            },
            MrcPoint {
                blocks: 256,
                bytes: 16384,
                miss_ratio: 0.0,
            },
        ];
        assert_eq!(interpolate(&curve, 128), Some(0.5));
        assert_eq!(interpolate(&curve, 1), Some(1.0));
        assert_eq!(interpolate(&curve, 1 << 20), Some(0.0));
        assert_eq!(interpolate(&[], 1), None);
    }

    /// Accesses handed to the worker thread in batches give the counts of
    /// the same accesses taken in place, bit for bit, with threads
    /// switching and a partial last batch.
    #[test]
    fn batched_accesses_give_the_counts_taken_in_place() {
        let caches = test_caches(48 << 10, 2 << 20, 32 << 20);
        let sampled = Tracking::Sampled {
            sampling: SpatialSampling::with_rate(0.5).expect("a rate"),
            emulated: true,
        };
        for tracking in [Tracking::Every, sampled] {
            let mut batched = WholeRun::new(tracking, &caches);
            let mut in_place = WholeRun::new(tracking, &caches);
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            let accesses = 3 * BATCH + 1234;
            for i in 0..accesses as u64 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let addr = if state.is_multiple_of(3) {
                    (state >> 20) % (1 << 24)
                } else {
                    i * 8 % (1 << 22)
                };
                let (slot, thread) = ((state % 7) as u32, u32::from(i % 50_000 < 1000));
                if !batched.tracks(addr) {
                    continue;
                }
                batched.access(slot, addr, thread);
                in_place
                    .stacks
                    .as_mut()
                    .expect("in place")
                    .access(slot, addr, thread);
            }
            // The worker took the batches (where there is a second core).
            if std::thread::available_parallelism().is_ok_and(|n| n.get() > 1) {
                assert!(batched.worker.is_some() && batched.stacks.is_none());
            }
            batched.settle();
            in_place.settle();
            // The scale-free prior: the small distances spread alike.
            batched.smooth(&[1.0]);
            in_place.smooth(&[1.0]);
            assert_eq!(batched.tracked, in_place.tracked);
            for slot in 0..8 {
                let (a, b) = (batched.site(slot), in_place.site(slot));
                assert_eq!(a.len(), b.len());
                assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
            }
            assert_eq!(batched.settled().groups, in_place.settled().groups);
        }
    }

    /// A site's weights take memory only once it has a tracked access:
    /// two sites far apart make two rows, not one per site up to the
    /// highest. Sites below the highest without one read as zeros, sites
    /// past it as empty, after smoothing as before.
    #[test]
    fn only_sites_with_tracked_accesses_have_rows() {
        let caches = test_caches(48 << 10, 2 << 20, 32 << 20);
        let sampled = Tracking::Sampled {
            sampling: SpatialSampling::with_rate(1.0).expect("a rate"),
            emulated: true,
        };
        for tracking in [Tracking::Every, sampled] {
            let mut run = WholeRun::new(tracking, &caches);
            let stacks = run.stacks.as_mut().expect("in place");
            for (slot, addr) in [(400_000, 0x1000), (7, 0x2000), (400_000, 0x1000)] {
                stacks.access(slot, addr, 0);
            }
            let width = stacks.sizes.columns() + 1;
            assert_eq!(stacks.hist.len(), 2 * width);
            run.settle();
            run.smooth(&[1.0]);
            let tracked = |site: &[f64]| site.last().copied();
            assert_eq!(tracked(run.site(400_000)), Some(2.0));
            assert_eq!(tracked(run.site(7)), Some(1.0));
            let below = run.site(8);
            assert_eq!(below.len(), run.sizes.buckets() + 1);
            assert!(below.iter().all(|&w| w == 0.0));
            assert!(run.site(400_001).is_empty());
        }
    }

    /// At the smallest rate (one step, `2^-32`) a posterior row sums up to
    /// 2^26 terms, so all 64 rows take minutes: the table computes only
    /// the rows of `d'` that are needed and leaves the others zero.
    #[test]
    fn the_smoothing_table_computes_only_the_rows_needed() {
        let caches = test_caches(48 << 10, 2 << 20, 32 << 20);
        let rate = f64::powi(2.0, -32);
        let sizes = CurveSizes::new(&caches, 6, rate).sizes;
        let n = sizes.len() + 1;
        let mut needed = [false; SMOOTH_DISTANCES];
        needed[0] = true;
        needed[3] = true;
        let table = smoothing_table(&sizes, rate, &[1.0], 1e6, &needed);
        assert_eq!(table.len(), SMOOTH_DISTANCES * n);
        for (d, &needed) in needed.iter().enumerate() {
            let sum: f64 = table[d * n..][..n].iter().sum();
            if needed {
                assert!((sum - 1.0).abs() < 1e-9, "row {d} sums to {sum}");
            } else {
                assert_eq!(sum, 0.0, "row {d} was computed");
            }
        }
    }

    /// A run that tracked nothing at the smallest rate needs no row: it is
    /// smoothed to all-zero groups (and at once, by the test above).
    #[test]
    fn smoothing_a_run_that_tracked_nothing_gives_zero_groups() {
        let caches = test_caches(48 << 10, 2 << 20, 32 << 20);
        let tracking = Tracking::Sampled {
            sampling: SpatialSampling::with_rate(f64::powi(2.0, -32)).expect("a rate"),
            emulated: false,
        };
        let mut run = WholeRun::new(tracking, &caches);
        run.settle();
        run.smooth(&[1.0]);
        assert!(run.settled().groups.iter().all(|&w| w == 0.0));
    }

    /// The paged block map and the repeated-block shortcut give the
    /// distances of a plain tracker over a hash map, through compactions
    /// and axis growth, on a stream mixing runs on one block, hot blocks,
    /// neighbours and blocks alone in their page.
    #[test]
    fn paged_stacks_give_the_distances_of_a_plain_tracker() {
        let mut paged = ThreadStack::new(0, true);
        let mut hashed = ThreadStack::new(0, false);
        let mut plain = ReuseTracker::new();
        plain.reset(1);
        let mut locals: Map<u64, BlockLocal> = Map::default();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut block = 0;
        for i in 0..200_000u64 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            block = match state % 8 {
                0 | 1 => block,
                2 | 3 => state >> 40 & 31,
                4 => block + 1,
                5 => (state >> 20) % (1 << 40) * 97,
                _ => 1000 + (state >> 24) % (i / 8 + 64),
            };
            if plain.needs_room() {
                plain.compact(|b, t| locals.get_mut(&b).expect("live").time = t);
            }
            let want = plain.access(block, locals.entry(block).or_default());
            assert_eq!(paged.access(block), want, "access {i}");
            assert_eq!(hashed.access(block), want, "access {i}");
        }
    }

    /// Kaplan–Meier by hand: 2000 observations, 1000 at distance 0, 500
    /// censored at 2 (known `≥ 2`), 500 at distance 3. `S(1) = 1/2`; at 1
    /// nothing happens; at 2 the censored leave; at 3, 500 of 500 at risk
    /// are events, but 500 < `PRIOR_MIN_AT_RISK` ends the head at `H = 2`.
    #[test]
    fn window_survival_by_hand() {
        let mut w = WindowDistances::default();
        for _ in 0..1000 {
            w.add(Some(0), 10);
        }
        for _ in 0..500 {
            w.add(None, 2);
            w.add(Some(3), 10);
        }
        assert_eq!(w.survival(), vec![1.0, 0.5, 0.5]);
        // Cold after 5000 distinct blocks and far reuses are censored at
        // the cap: at risk over the whole head.
        let mut far = WindowDistances::default();
        for _ in 0..PRIOR_MIN_AT_RISK {
            far.add(None, 5000);
            far.add(Some(1 << 20), 0);
        }
        let s = far.survival();
        assert_eq!(s.len(), PRIOR_DISTANCES + 1);
        assert!(s.iter().all(|&x| x == 1.0));
    }

    /// A block reused at short distances only (the windows see `D < 16`):
    /// its `d' = 0` accesses stay below 64 blocks, where the scale-free
    /// prior puts over a tenth at 64 blocks and more. Without a measured
    /// head the rows are the scale-free ones.
    #[test]
    fn a_measured_prior_keeps_short_reuses_short() {
        let caches = test_caches(32 << 10, 1 << 20, 32 << 20);
        let sizes = CurveSizes::new(&caches, 6, 1.0 / 128.0).sizes;
        let n = sizes.len() + 1;
        let mut w = WindowDistances::default();
        for i in 0..100_000u64 {
            w.add(Some(i % 16), 1000);
        }
        let survival = w.survival();
        // Nobody is at risk past 15: the head ends at 16, all its mass below.
        assert_eq!((survival.len(), survival[16]), (17, 0.0));
        let all = [true; SMOOTH_DISTANCES];
        let measured = smoothing_table(&sizes, 1.0 / 128.0, &survival, 1e6, &all);
        let scale_free = smoothing_table(&sizes, 1.0 / 128.0, &[1.0], 1e6, &all);
        assert!(measured[0] > 1.0 - 1e-12, "{}", measured[0]);
        assert!(scale_free[0] < 0.9, "{}", scale_free[0]);
        // A d' the head cannot explain goes to the scale-free tail, and
        // rows sum to 1.
        for d in 0..SMOOTH_DISTANCES {
            let row = &measured[d * n..][..n];
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-9, "row {d}");
        }
        let too_few = WindowDistances::default().survival();
        assert_eq!(too_few, vec![1.0]);
        assert_eq!(
            smoothing_table(&sizes, 1.0 / 128.0, &too_few, 1e6, &all),
            scale_free
        );
    }
}
