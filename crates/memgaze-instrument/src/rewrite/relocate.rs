//! Encoding the copies of all selected functions, with their probes, as one
//! block of code (see `encode`).
//!
//! Every original instruction keeps its address as its identity, so a
//! branch to any instruction of any relocated function (its own loops, a
//! tail call, gcc's `.cold` parts) is re-targeted to the copy; branches
//! elsewhere keep their absolute target. The first inserted instruction
//! before a load takes the load's address (branches to the load run its
//! probe) and the load itself, like every label the probes need, gets a
//! unique fake address from a range no code uses.
//!
//! RIP-relative *memory operands* are not branches: a `lea` of a function's
//! address or a load of data that sits between functions must keep meaning
//! the original address, so `emit` re-encodes them with their
//! absolute target, never resolved to a copy.

use super::output::Output;
use super::probe::{self, FastPath, ProbeCode, SpatialProbe, TemplateUse};
use super::reg_countdown::{self, LoopMap, RegisterLoop};
use crate::annotation::{PtwriteOperand, PtwriteSite};
use crate::binary::FunctionCode;
use crate::error::RelocateError;
use foldhash::HashMap;
use iced_x86::{
    Code, CodeSize, Encoder, FlowControl, IcedError, Instruction, Mnemonic, OpKind, Register,
};
use std::borrow::Cow;
use std::sync::Mutex;

/// What to insert before one instruction of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Insert {
    /// A software counting probe for load `id`.
    Soft {
        /// Load id (annotation index) passed to the runtime.
        id: u32,
        /// Fast-path variant.
        fast: FastPath,
    },
    /// `ptwrite` of the source registers of load `id`.
    Ptwrite {
        /// Load id (annotation index).
        id: u32,
    },
    /// The string probe of a string instruction ([`probe::string_stub`]):
    /// records every element it reads.
    String {
        /// Load id of its first source (`rsi`; `rdi` for `scas`, `cmps`).
        id: u32,
        /// Load id of its second source (`rsi` of `cmps`).
        second: Option<u32>,
    },
}

/// A superblock whose instrumented loads are counted by one check (see
/// [`probe`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Superblock {
    /// Instruction index of the check (flags dead there).
    pub at: usize,
    /// Index of its last instruction.
    pub last: usize,
    /// The loads it counts: `(instruction index, load id, probe variant)`,
    /// in order; their probes live in the superblock's counting fragment.
    pub loads: Vec<(usize, u32, FastPath)>,
    /// Side exits: `(index of the conditional branch, loads it skips)`.
    pub exits: Vec<(usize, u32)>,
}

/// How a copy reads a jump table translated to copy addresses (see
/// `rewrite::tables`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TableRedirect {
    /// The entry load reads the translated table: its memory displacement
    /// becomes this.
    Displacement(u64),
    /// `lea target, [target + base]` before the jump: the translated entries
    /// are offsets from what `base` holds.
    AddBase {
        /// The jump's register.
        target: Register,
        /// The register holding the table's base.
        base: Register,
    },
}

/// One function to copy.
pub(crate) struct CopyPlan<'a> {
    /// Its code and control flow: lent, or given to `encode`, which frees
    /// the instructions of a given code once its copy is emitted.
    pub code: Cow<'a, FunctionCode>,
    /// `(instruction index, insert)`, sorted by index.
    pub inserts: Vec<(usize, Insert)>,
    /// The loads with a spatial check: instruction index →
    /// `(load id, how the check saves state)`.
    pub spatial: HashMap<usize, (u32, SpatialProbe)>,
    /// Superblocks counted by one check, sorted by index.
    pub(crate) superblocks: Vec<Superblock>,
    /// Innermost loops whose countdown lives in a register, sorted.
    pub(crate) register_loops: Vec<RegisterLoop>,
    /// A call placed before the first instruction (region marker hooks).
    pub(crate) prologue_call: Option<u64>,
    /// Jump-table reads redirected to translated tables: instruction index →
    /// what changes.
    pub(crate) redirects: HashMap<usize, TableRedirect>,
    /// Indirect jumps that may land in original code: `(instruction index,
    /// escape site)`, sorted by index; each goes through an
    /// [`probe::escape_stub`] that counts the escapes.
    pub(crate) escapes: Vec<(usize, u32)>,
}

/// Where one copy landed.
#[derive(Clone, Debug)]
pub struct CopyMap {
    /// Original start.
    pub original_start: u64,
    /// Original end.
    pub(crate) original_end: u64,
    /// Address of the copy.
    pub start: u64,
    /// End of the copied body (its slow stubs follow).
    pub(crate) body_end: u64,
    /// End of the copy including stubs.
    pub end: u64,
    /// Copy address of each original instruction (of its probe, if any),
    /// as an offset from `start`: 32 bits for each of millions of
    /// instructions, held until the original is patched.
    addresses: Vec<u32>,
    /// Original address of each instruction, as an offset from
    /// `original_start`.
    original: Vec<u32>,
}

impl CopyMap {
    /// The copy address for an original instruction boundary or the end.
    pub fn map(&self, addr: u64) -> Option<u64> {
        if addr == self.original_end {
            return Some(self.body_end);
        }
        let offset = u32::try_from(addr.checked_sub(self.original_start)?).ok()?;
        self.original
            .binary_search(&offset)
            .ok()
            .map(|i| self.address(i))
    }

    /// [`CopyMap::map`] of addresses asked mostly in increasing order, a
    /// few instructions apart (an FDE's rows, an LSDA's call sites): the
    /// instructions from the last found (`near`, which it updates) on are
    /// tried first, and the whole map searched only when `addr` lies
    /// before them or past the next few. A search for each was most of an
    /// unwind table's translation.
    pub(crate) fn map_near(&self, addr: u64, near: &std::cell::Cell<usize>) -> Option<u64> {
        /// Instructions tried from the last found before a search.
        const AHEAD: usize = 8;
        if addr == self.original_end {
            return Some(self.body_end);
        }
        let offset = u32::try_from(addr.checked_sub(self.original_start)?).ok()?;
        let from = near.get().min(self.original.len());
        let ahead = &self.original[from..(from + AHEAD).min(self.original.len())];
        let i = match ahead.iter().position(|&o| o >= offset) {
            Some(k) if ahead[k] == offset => from + k,
            // Between two instructions tried: not a boundary.
            Some(k) if k > 0 || from == 0 => return None,
            _ => self.original.binary_search(&offset).ok()?,
        };
        near.set(i);
        Some(self.address(i))
    }

    /// The copy address of original instruction number `i`.
    pub(crate) fn address(&self, i: usize) -> u64 {
        self.start + u64::from(self.addresses[i])
    }
}

/// `value`, a function's or a run's offset, in 32 bits.
fn offset32(value: u64) -> u32 {
    u32::try_from(value).expect("a function or a run of copies below 4 GiB")
}

/// The encoded copies (their code is in the output `encode` was given).
pub struct Copies {
    /// Bytes of machine code, placed at the base passed to `encode`.
    pub len: u64,
    /// One map per plan, in plan order.
    pub maps: Vec<CopyMap>,
    /// Every `ptwrite` emitted (ptwrite mode), with its final address.
    pub ptwrites: Vec<PtwriteSite>,
    /// Every spatial check emitted (soft mode), in the copies and their
    /// counting fragments.
    pub(crate) spatial_checks: Vec<SpatialCheckSite>,
}

/// Where a spatial check landed, for the runtime to skip it in runs that
/// take no spatial samples (see [`probe::spatial_skip`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SpatialCheckSite {
    /// Address of its first byte.
    pub ip: u64,
    /// Its length in bytes (the load follows).
    pub len: u32,
    /// It moves `rsp` (saves below the red zone).
    pub moves_rsp: bool,
    /// Offsets from its first byte of its multiplier's and threshold's
    /// immediates ([`probe::spatial_immediates`]), read from its bytes as
    /// emitted: the code is not held once written.
    pub immediates: Option<[u8; 2]>,
}

/// The runtime addresses the copies' probes reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entries {
    /// The slow path.
    pub record: u64,
    /// The slow path of loads with a spatial check.
    pub(crate) record_tracked: u64,
    /// The runtime's `probe_append` and `probe_append_tracked`, which the
    /// slow stubs of flags-dead probes call (of loads without and with a
    /// spatial check).
    pub(crate) probe_append: [u64; 2],
    /// The spatial record entry.
    pub spatial: u64,
    /// The runtime's `spatial_append`, which the stubs of checks with dead
    /// flags call; 0: none (a library's copies, whose checks never branch).
    pub(crate) spatial_append: u64,
    /// The spatial checks' hash.
    pub(crate) spatial_hash: probe::SpatialHash,
    /// Whether soft-mode spatial checks of a load through one 64-bit
    /// register take its block number with `rorx` (BMI2).
    pub(crate) spatial_rorx: bool,
    /// What escape checks compare with (`None`: no counters, the jumps are
    /// copied as they are).
    pub(crate) escape: Option<probe::EscapeCheck>,
    /// GOT slot → process-end stub ([`super::process_end`]): a
    /// `call`/`jmp qword [rip → slot]` is copied as a direct one to the stub.
    pub(crate) got_hooks: HashMap<u64, u64>,
}

impl Entries {
    /// The slow path and its flags-dead append of a load with a spatial
    /// check (`tracked`) or without.
    fn slow_path(&self, tracked: bool) -> (u64, u64) {
        if tracked {
            (self.record_tracked, self.probe_append[1])
        } else {
            (self.record, self.probe_append[0])
        }
    }

    /// Where the spatial checks' stubs take their records.
    fn spatial_entry(&self) -> probe::SpatialEntry {
        probe::SpatialEntry {
            spatial: self.spatial,
            append: self.spatial_append,
        }
    }
}

/// Batches' worth of runs (one run per thread) emitted between two
/// returns of freed memory to the system.
const TRIM_EVERY: usize = 4;

/// Most bytes of the copies read back at once to write the branches left
/// to [`settle`].
const SETTLE_WINDOW: usize = 1 << 20;

/// Fake addresses for labels: far above any user-space address.
const FAKE_BASE: u64 = 0xffff_f000_0000_0000;

/// Each run of plans takes its fake labels from its own `2^FAKE_RUN_BITS`
/// addresses above [`FAKE_BASE`].
const FAKE_RUN_BITS: u32 = 36;

/// Encodes the copies of `plans` at `base`, writing their code to `out` at
/// `offset` (where `base` lies in the file). `entries` are the runtime's
/// path. Fails with the address of an instruction the encoder refused.
///
/// Every branch is encoded in its rel32 form, so an instruction's size does
/// not depend on where it lands: consecutive runs of plans are built and
/// measured on the pool's workers, a few runs ahead, while this thread
/// lays each out after the runs before it, emits it and writes it out, so
/// only a few runs' layouts are held. A branch to a label not yet laid out
/// (a later run's) is written once every run is ([`Fixup`]). The result is
/// the same bytes a single pass would produce. The instructions of each
/// code given (not lent) are freed once its run is emitted: held to the
/// end, every copy's instructions (40 bytes each) were resident at the
/// rewriter's peak. Each run's code is written out once emitted: held to
/// the end, the copies' code was the largest part of the peak.
pub(crate) fn encode(
    plans: &mut [CopyPlan<'_>],
    base: u64,
    entries: &Entries,
    (out, offset): (&mut dyn Output, u64),
) -> Result<Copies, RelocateError> {
    encode_in_runs(plans, &balanced_runs(plans), base, entries, (out, offset))
}

/// `encode` with the plans cut into the given consecutive `runs`.
///
/// The runs are built on the pool, each by whichever worker is free, up
/// to [`RunQueue`]'s window ahead of the run being emitted; this thread
/// takes them in order, builds one itself when no worker has taken it yet,
/// and does the serial work (placing, labels, emitting, maps, freeing)
/// beside the workers' builds. Built a batch at a time with a barrier after
/// each step, one core sat idle for about a third of the encoding: waiting
/// for the slower run of each batch and for the serial steps between
/// batches.
fn encode_in_runs(
    plans: &mut [CopyPlan<'_>],
    runs: &[std::ops::Range<usize>],
    base: u64,
    entries: &Entries,
    (out, offset): (&mut dyn Output, u64),
) -> Result<Copies, RelocateError> {
    let threads = rayon::current_num_threads().max(1);
    // The original addresses each run's labels lie in.
    let spans = RunSpans::new(runs.iter().map(|run| {
        let plans = &plans[run.clone()];
        let start = plans.iter().map(|p| p.code.start).min();
        let end = plans.iter().map(|p| p.code.end).max();
        start.unwrap_or(0)..end.unwrap_or(0)
    }));
    let copies = plans.len();
    let run_plans = split_into_runs(plans, runs);
    let spares = Spares::default();
    let queue = RunQueue::new(runs.len(), threads + 1);
    let build = |run: usize| {
        let plans = run_plans[run].lock().expect("not poisoned");
        build_part(&plans, run, base, entries, &spares)
    };
    let emitted = rayon::in_place_scope(|scope| -> Result<Emitter<'_>, RelocateError> {
        for _ in 0..threads {
            scope.spawn(|_| {
                let _stop = StopOnPanic(&queue);
                while let Some(run) = queue.claim() {
                    queue.deliver(run, build(run));
                }
            });
        }
        let _stop = StopOnDrop(&queue);
        let mut emitter = Emitter {
            base,
            threads,
            spans: &spans,
            labels: RunLabels::default(),
            code: Vec::new(),
            fixups: Vec::new(),
            copies: Copies {
                len: 0,
                maps: Vec::with_capacity(copies),
                ptwrites: Vec::new(),
                spatial_checks: Vec::new(),
            },
        };
        for (run, plans) in run_plans.iter().enumerate() {
            // The scope passes the worker's panic on.
            let part = queue
                .take(run, build)
                .expect("no worker building a run of copies panicked")?;
            let mut plans = plans.lock().expect("not poisoned");
            emitter.emit_run(run, part, &mut plans, &spares, (&mut *out, offset))?;
            queue.emitted(run + 1);
        }
        Ok(emitter)
    })?;
    let Emitter {
        labels,
        fixups,
        code,
        copies,
        ..
    } = emitted;
    // Not needed past the last run.
    drop((code, spares));
    labels.check_across_runs()?;
    settle_output((out, offset), SETTLE_WINDOW, &fixups, |target| {
        labels.find(target).map_or(target, |offset| base + offset)
    })?;
    Ok(copies)
}

/// `plans` cut into the consecutive `runs`, each behind a lock: a run's
/// plans are read by the thread that builds it, then its given codes freed
/// by the one that emits it, never both at once.
fn split_into_runs<'p, 'a>(
    plans: &'p mut [CopyPlan<'a>],
    runs: &[std::ops::Range<usize>],
) -> Vec<Mutex<&'p mut [CopyPlan<'a>]>> {
    let mut rest = plans;
    let mut taken = 0;
    let mut slices = Vec::with_capacity(runs.len());
    for run in runs {
        assert_eq!(run.start, taken, "runs are consecutive");
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(run.len());
        slices.push(Mutex::new(head));
        rest = tail;
        taken = run.end;
    }
    slices
}

/// The runs still to build, handed out in order to the pool's workers and
/// the emitting thread, and the built ones waiting to be emitted. Workers
/// take a run only within `window` runs of the next one to emit, so that
/// at most that many runs' layouts are held at once.
struct RunQueue {
    state: Mutex<QueueState>,
    changed: std::sync::Condvar,
    window: usize,
}

/// [`RunQueue`]'s state, under its lock.
struct QueueState {
    /// The first run nobody has taken.
    next: usize,
    /// Runs emitted so far.
    emitted: usize,
    /// Runs built by workers and not yet taken by the emitting thread.
    built: Vec<Option<Result<Part, RelocateError>>>,
    /// Nothing more is built: the emitting thread is done (or failed), or
    /// a worker panicked.
    stopped: bool,
}

impl RunQueue {
    fn new(runs: usize, window: usize) -> Self {
        RunQueue {
            state: Mutex::new(QueueState {
                next: 0,
                emitted: 0,
                built: (0..runs).map(|_| None).collect(),
                stopped: false,
            }),
            changed: std::sync::Condvar::new(),
            window,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // Never held while a run is built: a panic elsewhere leaves the
        // state whole.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next run for a worker to build, once it is within the window;
    /// `None` when every run is taken or the encoding stopped.
    fn claim(&self) -> Option<usize> {
        let mut state = self.lock();
        loop {
            if state.stopped || state.next >= state.built.len() {
                return None;
            }
            if state.next < state.emitted + self.window {
                state.next += 1;
                return Some(state.next - 1);
            }
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Hands over `part`, built by a worker.
    fn deliver(&self, run: usize, part: Result<Part, RelocateError>) {
        self.lock().built[run] = Some(part);
        self.changed.notify_all();
    }

    /// Run `run`, the next to emit: built by a worker, or by `build` here
    /// when no worker has taken it; `None` if a worker panicked.
    fn take(
        &self,
        run: usize,
        build: impl FnOnce(usize) -> Result<Part, RelocateError>,
    ) -> Option<Result<Part, RelocateError>> {
        let mut state = self.lock();
        loop {
            if let Some(part) = state.built[run].take() {
                return Some(part);
            }
            if state.next == run {
                state.next += 1;
                drop(state);
                return Some(build(run));
            }
            if state.stopped {
                return None;
            }
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Counts the runs emitted, letting workers take later ones.
    fn emitted(&self, runs: usize) {
        self.lock().emitted = runs;
        self.changed.notify_all();
    }

    /// Stops handing out runs and wakes everyone waiting.
    fn stop(&self) {
        self.lock().stopped = true;
        self.changed.notify_all();
    }
}

/// Stops the queue when dropped: the emitting thread's end, whether it
/// finished, failed or panicked, lets the waiting workers go.
struct StopOnDrop<'q>(&'q RunQueue);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Stops the queue if a worker panics, so that the emitting thread does
/// not wait for the run it was building.
struct StopOnPanic<'q>(&'q RunQueue);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.stop();
        }
    }
}

/// The original addresses each run's labels lie in, with the hull of the
/// spans of the runs after each: most branches a run's labels do not
/// resolve go to the runtime's entries or to code left in place, outside
/// the later runs' hull, and are told apart without a look at each span.
struct RunSpans {
    /// Per run: the original addresses its labels lie in.
    spans: Vec<std::ops::Range<u64>>,
    /// Per run: the smallest range holding every later run's (non-empty)
    /// span.
    later_hulls: Vec<std::ops::Range<u64>>,
    /// The smallest range holding every (non-empty) span: no run labels an
    /// address outside it, nor is one still to lay out there (the
    /// runtime's entries the stubs call, code left in place).
    hull: std::ops::Range<u64>,
    /// The spans are non-empty and each ends at or before the next starts
    /// (runs of functions in address order): the one run that can label
    /// an address is found by one search ([`RunSpans::holder`]).
    ordered: bool,
}

impl RunSpans {
    /// The runs' `spans`, in run order.
    fn new(spans: impl Iterator<Item = std::ops::Range<u64>>) -> RunSpans {
        let spans: Vec<_> = spans.collect();
        let mut later_hulls = vec![0..0; spans.len()];
        let mut hull: std::ops::Range<u64> = 0..0;
        for (run, span) in spans.iter().enumerate().rev() {
            later_hulls[run] = hull.clone();
            if !span.is_empty() {
                hull = if hull.is_empty() {
                    span.clone()
                } else {
                    hull.start.min(span.start)..hull.end.max(span.end)
                };
            }
        }
        let ordered = spans.iter().all(|span| !span.is_empty())
            && spans.windows(2).all(|w| w[0].end <= w[1].start);
        RunSpans {
            spans,
            later_hulls,
            hull,
            ordered,
        }
    }

    /// The run whose span holds `target`, run `first` asked first (a
    /// run's branches go mostly to its own functions); only for
    /// [`RunSpans::ordered`] spans, where at most one does.
    fn holder(&self, target: u64, first: usize) -> Option<usize> {
        debug_assert!(self.ordered, "one run at most spans an address");
        if self.spans[first].contains(&target) {
            return Some(first);
        }
        let after = self.spans.partition_point(|span| span.start <= target);
        let run = after.checked_sub(1)?;
        self.spans[run].contains(&target).then_some(run)
    }

    /// Whether a run after `run` spans `target` (its label is still to be
    /// laid out).
    fn later_holds(&self, run: usize, target: u64) -> bool {
        self.later_hulls[run].contains(&target)
            && self.spans[run + 1..]
                .iter()
                .any(|span| span.contains(&target))
    }
}

/// The serial side of [`encode_in_runs`]: lays out and emits the built
/// runs in order.
struct Emitter<'s> {
    /// Where the copies are placed.
    base: u64,
    /// The pool's threads.
    threads: usize,
    /// The original addresses each run's labels lie in.
    spans: &'s RunSpans,
    /// The labels of the runs emitted.
    labels: RunLabels,
    /// The buffer runs are emitted into (given back by the output).
    code: Vec<u8>,
    /// Branches to labels of runs not yet laid out when emitted.
    fixups: Vec<Fixup>,
    /// What is known of the copies so far (`len`: bytes emitted).
    copies: Copies,
}

impl Emitter<'_> {
    /// Lays out `part`, run number `run` of `plans`, after the runs before
    /// it, emits and writes its code, makes its maps and frees its layout
    /// and its plans' given codes.
    fn emit_run(
        &mut self,
        run: usize,
        mut part: Part,
        plans: &mut [CopyPlan<'_>],
        spares: &Spares,
        (out, offset): (&mut dyn Output, u64),
    ) -> Result<(), RelocateError> {
        let base = self.base;
        let start = self.copies.len;
        // Padding depends on where the run lands.
        place(&mut part, base + start);
        let mut originals = std::mem::take(&mut part.labels.originals);
        originals.place(&part, start);
        self.labels.push(originals);
        // A fake label is the run's own. A target no run still to lay out
        // can label keeps its address (as `settle` would give it): only
        // branches to later runs wait.
        let (labels, spans) = (&self.labels, self.spans);
        let mut pool = std::mem::take(&mut part.layout.pool);
        // Most targets are the run's fake labels, then addresses no run
        // spans (the runtime's entries): their look-ups are small enough
        // to inline into `emit`, the original addresses' is not.
        let resolve = |target: u64| {
            if target >= FAKE_BASE {
                let offset = part.labels.fake_offset(&part, run, target);
                return offset.map(|offset| base + start + offset);
            }
            if !spans.hull.contains(&target) {
                return Some(target);
            }
            resolve_original(labels, spans, run, base, target)
        };
        let slot = (&mut self.code, part.len as usize);
        let pending = emit(&part, &mut pool, base + start, &resolve, slot);
        part.layout.pool = pool;
        let mut pending = pending?;
        for fixup in &mut pending {
            fixup.shift(start as usize);
        }
        self.fixups.append(&mut pending);
        let checks = checks_in(&part, (base, start), (&self.code, start));
        self.copies.spatial_checks.extend(checks);
        spares.keep_layout(part.layout.take_code());
        spares.keep_fake_labels(std::mem::take(&mut part.labels.fakes));
        // Written while the next runs are emitted; its buffer comes back.
        let code = std::mem::take(&mut self.code);
        self.code = out.write_owned(offset + start, code);
        self.copies.len = start + part.len;
        push_maps(&mut part, plans, base + start, &mut self.copies);
        for plan in plans {
            if let Cow::Owned(code) = &mut plan.code {
                code.instructions = Vec::new();
            }
        }
        // What the runs freed goes back to the system every few batches'
        // worth (the next runs' layouts are allocated elsewhere): after
        // every batch, faulting the pages in again made the encoding about
        // a fifth slower.
        let every = TRIM_EVERY * self.threads;
        if run % every == every - 1 {
            super::release_freed_memory();
        }
        Ok(())
    }
}

/// The new address of the original address `target`, branched to from
/// run number `run`: its label's in the runs emitted (`labels`, from
/// `base`), else the target itself unless a later run spans it (its
/// label is still to be laid out: `None`). Where the runs' spans are
/// ordered, only the run that spans the target is asked (its own first);
/// else the run's own labels are asked first (its copies' branches within
/// their functions), then every run's, then whether a later run spans it:
/// two searches and a walk of the later spans for each branch to another
/// run's function.
#[inline(never)]
fn resolve_original(
    labels: &RunLabels,
    spans: &RunSpans,
    run: usize,
    base: u64,
    target: u64,
) -> Option<u64> {
    if spans.ordered {
        let offset = match spans.holder(target, run) {
            Some(holder) if holder > run => return None,
            Some(holder) => labels.runs[holder].find(target),
            None => None,
        };
        return Some(offset.map_or(target, |offset| base + offset));
    }
    let own = labels.own_run(run).and_then(|own| own.find(target));
    let offset = own.or_else(|| labels.find(target));
    (offset.map(|offset| base + offset))
        .or_else(|| (!spans.later_holds(run, target)).then_some(target))
}

/// Appends the maps of `plans`' copies, laid out in `part` at `start`, and
/// its `ptwrite`s to `copies`; takes the part's per-plan offsets. Each
/// copy's offsets of its original instructions become its map's addresses
/// in place (they come in order, so the paddings are walked with them).
fn push_maps(part: &mut Part, plans: &[CopyPlan<'_>], start: u64, copies: &mut Copies) {
    let firsts = std::mem::take(&mut part.firsts);
    let originals = std::mem::take(&mut part.originals);
    let mut offsets = PaddedOffsets::new(part);
    let plans = plans.iter().enumerate();
    for (((p, plan), mut addresses), original) in plans.zip(firsts).zip(originals) {
        let copy_start = offsets.of(u64::from(addresses[0]));
        for at in &mut addresses {
            *at = offset32(offsets.of(u64::from(*at)) - copy_start);
        }
        copies.maps.push(CopyMap {
            original_start: plan.code.start,
            original_end: plan.code.end,
            start: start + copy_start,
            body_end: start + offsets.of(part.body_ends[p]),
            end: start + offsets.of(part.ends[p]),
            addresses,
            original,
        });
    }
    let mut offsets = PaddedOffsets::new(part);
    let ptwrites = part
        .ptwrite_at
        .iter()
        .map(|&(i, load, operand)| PtwriteSite {
            ip: start + offsets.of(i),
            load,
            operand,
        });
    copies.ptwrites.extend(ptwrites);
}

/// The spatial checks of `part`, placed at `start` (from `base`), read from
/// `code`, the emitted code from offset `from` on.
fn checks_in<'p>(
    part: &'p Part,
    (base, start): (u64, u64),
    (code, from): (&'p [u8], u64),
) -> impl Iterator<Item = SpatialCheckSite> + 'p {
    let mut offsets = PaddedOffsets::new(part);
    part.spatial_at
        .iter()
        .map(move |&(first, past, moves_rsp, immediates)| {
            let (first, past) = (start + offsets.of(first), start + offsets.of(past));
            let bytes = &code[(first - from) as usize..(past - from) as usize];
            debug_assert_eq!(
                probe::spatial_immediates(bytes),
                Some(immediates.map(u32::from).into()),
                "the immediates found by decoding the check"
            );
            SpatialCheckSite {
                ip: base + first,
                len: (past - first) as u32,
                moves_rsp,
                immediates: Some(immediates),
            }
        })
}

/// Splits `plans` into consecutive runs of about equal instruction counts,
/// sixteen per core (one run when there is little to do): the runs within
/// [`RunQueue`]'s window (one more than the pool's threads) have their
/// layouts held at once, so more, smaller runs lower the peak memory of
/// instrumenting a large binary (docs/performance.md).
fn balanced_runs(plans: &[CopyPlan<'_>]) -> Vec<std::ops::Range<usize>> {
    // Small enough that a small input is cut into several runs too: as
    // one run, gzip's copies were built and then emitted on one core
    // while the other sat idle.
    const MIN_RUN_INSTRUCTIONS: usize = 2048;
    let total: usize = plans.iter().map(|p| p.code.instructions.len()).sum();
    let wanted = (rayon::current_num_threads() * 16)
        .min(total / MIN_RUN_INSTRUCTIONS)
        .max(1);
    let per_run = total.div_ceil(wanted).max(1);
    let mut runs = Vec::with_capacity(wanted);
    let mut start = 0;
    let mut size = 0;
    for (i, plan) in plans.iter().enumerate() {
        size += plan.code.instructions.len();
        if size >= per_run {
            runs.push(start..i + 1);
            start = i + 1;
            size = 0;
        }
    }
    if start < plans.len() || runs.is_empty() {
        runs.push(start..plans.len());
    }
    runs
}

/// An emitted `ptwrite`: (index in the run's instructions, load id,
/// operand).
type PtwriteAt = (usize, u32, PtwriteOperand);

/// Appends ptwrite mode's code before `insn` (load `id`; the first
/// instruction takes `label`): the spatial check and its stub when the
/// load has `check`, then the operand `ptwrite`s. Records each `ptwrite`
/// (index in `all`, or in `stubs` for the stub's); returns the label still
/// to place (0 when placed).
fn emit_ptwrites(
    insn: &Instruction,
    (id, mut label): (u32, u64),
    check: Option<SpatialProbe>,
    spatial_hash: probe::SpatialHash,
    next_fake: &mut dyn FnMut() -> u64,
    (all, stubs): (&mut ProbeCode, &mut Vec<Instruction>),
    (ptwrite_at, stub_ptwrites): (&mut Vec<PtwriteAt>, &mut Vec<(usize, u32)>),
) -> u64 {
    if let Some(check) = check {
        let stub = next_fake();
        let resume = next_fake();
        // No entry hook to refuse a CPU without BMI2: the baseline form.
        probe::spatial_check_code(insn, check, (label, stub), (spatial_hash, false), all);
        let at = probe::spatial_ptwrite_stub(insn, check, stub, resume, stubs);
        stub_ptwrites.push((at, id));
        label = resume;
    }
    let at = all.insns.len();
    if probe::ptwrite(insn, label, &mut all.insns) > 0 {
        label = 0;
    }
    for (k, j) in (at..all.insns.len()).enumerate() {
        let operand = if k == 0 && insn.memory_base().is_gpr() {
            PtwriteOperand::Base
        } else {
            PtwriteOperand::Index
        };
        ptwrite_at.push((j, id, operand));
    }
    label
}

/// A run of consecutive plans, built and measured, not yet placed.
/// Positions in it are *unpadded offsets*: byte offsets from its start
/// before [`place`] pads its aligned instructions. Only the measured layout
/// is kept, not the instructions: a run's copies have several times the
/// original's instructions, and kept whole with an offset each they were
/// most of the rewriter's memory.
struct Part {
    /// Per plan: unpadded offset of each original instruction's first
    /// emitted instruction.
    firsts: Vec<Vec<u32>>,
    /// Per plan: each original instruction's offset from the plan's start
    /// (its map's `original`), made on the pool with the run.
    originals: Vec<Vec<u32>>,
    /// Per plan: unpadded offset of its body end.
    body_ends: Vec<u64>,
    /// Per plan: unpadded offset of its end.
    ends: Vec<u64>,
    /// (unpadded offset, load id, operand) of every emitted ptwrite.
    ptwrite_at: Vec<(u64, u32, PtwriteOperand)>,
    /// (unpadded offset, offset past it, moves `rsp`, offsets from its
    /// first byte of its multiplier's and threshold's immediates) of every
    /// spatial check.
    spatial_at: Vec<(u64, u64, bool, [u8; 2])>,
    /// How its code is laid out.
    layout: Layout,
    /// Its labels, split, sorted and checked.
    labels: MeasuredLabels,
    /// The instructions that start aligned, in order.
    aligned: Vec<Aligned>,
    /// `(unpadded offset, padding from there on)` at each aligned
    /// instruction ([`place`]).
    paddings: Vec<(u64, u64)>,
    /// Length of the run's code ([`place`]).
    len: u64,
}

impl Part {
    /// Offset from the run's start of the instruction at unpadded offset
    /// `at`; the end's is the run's length (padded to [`CODE_ALIGN`]).
    fn offset(&self, at: u64) -> u64 {
        if at >= self.layout.end {
            return self.len;
        }
        let k = self.paddings.partition_point(|&(from, _)| from <= at);
        at + k.checked_sub(1).map_or(0, |k| self.paddings[k].1)
    }
}

/// [`Part::offset`] of a placed part's unpadded offsets asked mostly in
/// increasing order (a copy's marks, its maps' instructions): the paddings
/// are walked with them, and searched only when one goes back. A search
/// for each of a run's original instructions was a fifth of the emitting
/// thread's work.
struct PaddedOffsets<'p> {
    part: &'p Part,
    /// The paddings not yet passed.
    next: usize,
    /// The padding of the last offset asked.
    padding: u64,
    /// The unpadded offset of the last padding passed (0 before the
    /// first): an offset below it goes back. Kept beside `next` (as
    /// `next_from` is) so that an offset in order is two comparisons.
    passed_from: u64,
    /// The unpadded offset of the next padding (`u64::MAX` past the last).
    next_from: u64,
}

impl<'p> PaddedOffsets<'p> {
    fn new(part: &'p Part) -> Self {
        let mut offsets = PaddedOffsets {
            part,
            next: 0,
            padding: 0,
            passed_from: 0,
            next_from: 0,
        };
        offsets.bounds();
        offsets
    }

    /// Sets `passed_from` and `next_from` from `next`.
    fn bounds(&mut self) {
        let paddings = &self.part.paddings;
        self.passed_from = self.next.checked_sub(1).map_or(0, |k| paddings[k].0);
        self.next_from = paddings.get(self.next).map_or(u64::MAX, |p| p.0);
    }

    /// [`Part::offset`] of `at`. Inlined where asked: an offset between
    /// the same two paddings as the last is a few comparisons, and a call
    /// for each cost as much again.
    #[inline]
    fn of(&mut self, at: u64) -> u64 {
        let part = self.part;
        if at >= part.layout.end {
            return part.len;
        }
        if at < self.passed_from || at >= self.next_from {
            self.move_to(at);
        }
        debug_assert_eq!(at + self.padding, part.offset(at));
        at + self.padding
    }

    /// Passes the paddings up to `at` (searched for when `at` goes back).
    #[inline(never)]
    fn move_to(&mut self, at: u64) {
        let paddings = &self.part.paddings;
        if at < self.passed_from {
            self.next = paddings.partition_point(|&(from, _)| from <= at);
            self.padding = self.next.checked_sub(1).map_or(0, |k| paddings[k].1);
            self.bounds();
        }
        while at >= self.next_from {
            self.padding = paddings[self.next].1;
            self.next += 1;
            self.bounds();
        }
    }
}

/// Where one copy's instructions are marked, as indices into its
/// instructions.
#[derive(Default)]
struct CopyMarks {
    /// Each original instruction's first emitted instruction.
    first: Vec<usize>,
    /// The body's end (fragments and stubs follow).
    body_end: usize,
    /// (index, load id, operand) of every emitted ptwrite.
    ptwrite_at: Vec<(usize, u32, PtwriteOperand)>,
    /// Every spatial check.
    spatial_at: Vec<CheckAt>,
    /// The instructions that start aligned (the copy's first, then the
    /// compiler's loop heads) and the last branch back to each.
    aligned: Vec<(usize, Option<usize>)>,
}

/// Where a spatial check is among a copy's instructions, as indices.
#[derive(Clone, Copy)]
struct CheckAt {
    /// Its first instruction.
    first: usize,
    /// The instruction past it.
    past: usize,
    /// It moves `rsp` (saves below the red zone).
    moves_rsp: bool,
    /// The template that holds its hash's immediates, which the runtime
    /// may patch ([`SpatialCheckSite::immediates`]), and their offsets in
    /// it ([`probe::spatial_check_code`]).
    hash: usize,
    immediates: [u8; 2],
}

impl CheckAt {
    /// The check appended to `code` from index `first` on by
    /// [`probe::spatial_check_code`], which gave `(hash, immediates)`.
    fn appended(
        code: &ProbeCode,
        first: usize,
        (hash, immediates): (usize, [u8; 2]),
        moves_rsp: bool,
    ) -> Self {
        CheckAt {
            first,
            past: code.insns.len(),
            moves_rsp,
            hash,
            immediates,
        }
    }

    /// The same check `by` instructions further on.
    fn shifted(self, by: usize) -> Self {
        CheckAt {
            first: self.first + by,
            past: self.past + by,
            hash: self.hash + by,
            ..self
        }
    }
}

/// Builds the instructions of run number `run` and measures them one copy
/// at a time, in buffers taken from `spares`. Each run draws its fake
/// labels from a range of its own.
fn build_part(
    plans: &[CopyPlan<'_>],
    run: usize,
    base: u64,
    entries: &Entries,
    spares: &Spares,
) -> Result<Part, RelocateError> {
    let mut layout = spares.layout();
    let mut scratch = spares.build_scratch();
    let mut encoder = LAYOUT_ENCODER.take().unwrap_or_else(LayoutEncoder::new);
    let mut fake = fake_run_base(run);
    let mut next_fake = || {
        fake += 1;
        fake
    };
    let mut firsts: Vec<Vec<u32>> = Vec::with_capacity(plans.len());
    let mut originals: Vec<Vec<u32>> = Vec::with_capacity(plans.len());
    let mut body_ends = Vec::with_capacity(plans.len());
    let mut ends = Vec::with_capacity(plans.len());
    let mut ptwrite_at: Vec<(u64, u32, PtwriteOperand)> = Vec::new();
    let mut spatial_at: Vec<(u64, u64, bool, [u8; 2])> = Vec::new();
    let mut aligned: Vec<Aligned> = Vec::new();
    for plan in plans {
        let BuildScratch {
            all,
            unpadded,
            breaks,
            copy,
            ..
        } = &mut scratch;
        all.clear();
        copy_instructions(plan, entries, &mut next_fake, all, copy)?;
        let marks = &copy.marks;
        breaks.clear();
        breaks.extend(marks.aligned.iter().map(|&(i, _)| i));
        // Measured in place: appended to the body, the stubs (most of a
        // copy's instructions) were each copied once more.
        let code = [&*all, &copy.fragments, &copy.stubs];
        layout.measure(&mut encoder, &code, breaks, base, unpadded)?;
        let copy_len = code.iter().map(|c| c.insns.len()).sum();
        let at = |i: usize| unpadded[i];
        firsts.push(marks.first.iter().map(|&i| offset32(at(i))).collect());
        let start = plan.code.start;
        originals.push(
            (plan.code.instructions.iter())
                .map(|i| offset32(i.ip() - start))
                .collect(),
        );
        body_ends.push(at(marks.body_end));
        ends.push(at(copy_len));
        ptwrite_at.extend(
            marks
                .ptwrite_at
                .iter()
                .map(|&(i, id, operand)| (at(i), id, operand)),
        );
        spatial_at.extend(marks.spatial_at.iter().map(|check| {
            // No padding falls inside a check.
            let immediates = check.immediates.map(|offset| {
                let from_first = at(check.hash) + u64::from(offset) - at(check.first);
                u8::try_from(from_first).expect("a short check")
            });
            (at(check.first), at(check.past), check.moves_rsp, immediates)
        }));
        aligned.extend(marks.aligned.iter().map(|&(i, last)| Aligned {
            at: at(i),
            loop_end: last.map(|j| at(j + 1)),
        }));
    }
    LAYOUT_ENCODER.set(Some(encoder));
    spares.keep_build_scratch(scratch);
    let measured = std::mem::take(&mut layout.labels);
    let lists = (spares.label_list(), spares.fake_labels());
    let drawn = (fake - fake_run_base(run)) as usize;
    let (labels, sorted) = MeasuredLabels::of(&measured, &aligned, (run, drawn), lists);
    spares.keep_label_list(measured);
    spares.keep_label_list(sorted);
    let labels = labels?;
    // The labels' lists go back to `spares` once the run is emitted, at
    // their size: shrunk, each run's grew (and was faulted in) again.
    ptwrite_at.shrink_to_fit();
    spatial_at.shrink_to_fit();
    aligned.shrink_to_fit();
    Ok(Part {
        firsts,
        originals,
        body_ends,
        ends,
        ptwrite_at,
        spatial_at,
        layout,
        labels,
        aligned,
        paddings: Vec::new(),
        len: 0,
    })
}

/// The instructions of a copy's stubs and counting fragments, gathered
/// apart from its body (the copy is the body, the fragments, then the
/// stubs), and the copy's marks: kept from copy to copy, so that each
/// copy's lists are not allocated and grown (and moved) again.
#[derive(Default)]
struct CopyScratch {
    stubs: ProbeCode,
    fragments: ProbeCode,
    /// (index in `stubs`, load id) of each spatial check's `ptwrite`.
    stub_ptwrites: Vec<(usize, u32)>,
    /// The spatial checks in `fragments`.
    fragment_checks: Vec<CheckAt>,
    /// The last copy's marks ([`copy_instructions`]).
    marks: CopyMarks,
    /// The plan's side exits, spatial checks and table redirects, each
    /// sorted by instruction index ([`copy_instructions`]).
    exits: Vec<(usize, u32)>,
    spatial: Vec<(usize, (u32, SpatialProbe))>,
    redirects: Vec<(usize, TableRedirect)>,
    /// The loop heads' addresses and places ([`mark_loop_ends`]).
    loop_heads: Vec<(u64, usize)>,
}

impl CopyScratch {
    /// Empties every list for the next copy.
    fn clear(&mut self) {
        self.stubs.clear();
        self.fragments.clear();
        self.stub_ptwrites.clear();
        self.fragment_checks.clear();
        self.exits.clear();
        self.spatial.clear();
        self.redirects.clear();
        self.loop_heads.clear();
        let marks = &mut self.marks;
        marks.first.clear();
        marks.body_end = 0;
        marks.ptwrite_at.clear();
        marks.spatial_at.clear();
        marks.aligned.clear();
    }
}

/// A worker's buffers for building one run ([`build_part`]), emptied by
/// whoever takes them.
#[derive(Default)]
struct BuildScratch {
    /// One copy's body.
    all: ProbeCode,
    /// Their unpadded offsets, and the end's.
    unpadded: Vec<u64>,
    /// The indices of its aligned instructions.
    breaks: Vec<usize>,
    copy: CopyScratch,
}

impl BuildScratch {
    /// Most instructions of one copy whose buffers are kept for the next
    /// run: a huge function's are freed with its run, not held by every
    /// worker to the end of the encoding.
    const KEPT_INSTRUCTIONS: usize = 1 << 16;

    /// Whether its buffers are small enough to keep.
    fn worth_keeping(&self) -> bool {
        let copy = &self.copy;
        self.all
            .insns
            .capacity()
            .max(copy.stubs.insns.capacity())
            .max(copy.fragments.insns.capacity())
            <= Self::KEPT_INSTRUCTIONS
    }
}

/// Buffers kept between the runs and batches of one encoding: a run's
/// build and its layout's code were allocated afresh for every run, and
/// faulting their pages in (the large ones are mapped apart, so freeing
/// them returned their pages at once) was a sizeable part of the
/// encoding's time. Layouts are given back once emitted, so at most a
/// batch's worth are held, as before.
#[derive(Default)]
struct Spares {
    layouts: Mutex<Vec<Layout>>,
    builds: Mutex<Vec<BuildScratch>>,
    /// Emptied lists of labels ([`Layout::labels`], and the original
    /// addresses' sorted by [`MeasuredLabels::of`]): a run's labels (about
    /// 100,000 on the own release binary, 1.6 MB) were allocated afresh
    /// for every run, a tenth of the instrumenter's page faults.
    label_lists: Mutex<Vec<Vec<(u64, u64)>>>,
    /// Emptied tables of fake labels ([`MeasuredLabels::fakes`]), for the
    /// same reason.
    fake_tables: Mutex<Vec<Vec<FakeLabel>>>,
}

impl Spares {
    /// An empty layout, in a given-back one's buffers if there is one.
    fn layout(&self) -> Layout {
        let spare = self.layouts.lock().expect("not poisoned").pop();
        let mut layout = spare.map_or_else(Layout::default, Layout::emptied);
        layout.labels = self.label_list();
        layout
    }

    /// An empty list of labels, a given-back one if there is one.
    fn label_list(&self) -> Vec<(u64, u64)> {
        let spare = self.label_lists.lock().expect("not poisoned").pop();
        spare.unwrap_or_default()
    }

    /// Keeps `list`, emptied, for later runs.
    fn keep_label_list(&self, mut list: Vec<(u64, u64)>) {
        list.clear();
        self.label_lists.lock().expect("not poisoned").push(list);
    }

    /// An empty table of fake labels, a given-back one if there is one.
    fn fake_labels(&self) -> Vec<FakeLabel> {
        let spare = self.fake_tables.lock().expect("not poisoned").pop();
        spare.unwrap_or_default()
    }

    /// Keeps `table`, emptied, for later runs.
    fn keep_fake_labels(&self, mut table: Vec<FakeLabel>) {
        table.clear();
        self.fake_tables.lock().expect("not poisoned").push(table);
    }

    /// Keeps `layout`'s buffers for a later run.
    fn keep_layout(&self, layout: Layout) {
        self.layouts.lock().expect("not poisoned").push(layout);
    }

    /// A build's buffers, emptied by whoever fills them.
    fn build_scratch(&self) -> BuildScratch {
        let spare = self.builds.lock().expect("not poisoned").pop();
        spare.unwrap_or_default()
    }

    /// Keeps `scratch` for a later run, unless a huge copy grew it.
    fn keep_build_scratch(&self, scratch: BuildScratch) {
        if scratch.worth_keeping() {
            self.builds.lock().expect("not poisoned").push(scratch);
        }
    }
}

/// The side exits of `plan`'s superblocks in `exits` (empty), sorted by
/// branch index: (branch, loads to give back), the last superblock's
/// count standing where two name one branch.
fn sorted_exits<'e>(plan: &CopyPlan<'_>, exits: &'e mut Vec<(usize, u32)>) -> &'e [(usize, u32)] {
    exits.extend(
        plan.superblocks
            .iter()
            .flat_map(|b| b.exits.iter().copied()),
    );
    exits.sort_by_key(|&(i, _)| i);
    exits.dedup_by(|later, earlier| {
        let same = later.0 == earlier.0;
        if same {
            *earlier = *later;
        }
        same
    });
    exits
}

/// Appends the instructions of `plan`'s copy to `all` (empty): its body
/// with probes, then the superblocks' counting fragments and the stubs
/// (gathered in `scratch`); the copy's marks are left in `scratch.marks`.
fn copy_instructions(
    plan: &CopyPlan<'_>,
    entries: &Entries,
    mut next_fake: impl FnMut() -> u64,
    all: &mut ProbeCode,
    scratch: &mut CopyScratch,
) -> Result<(), RelocateError> {
    let code = &*plan.code;
    scratch.clear();
    let CopyScratch {
        stubs,
        fragments,
        stub_ptwrites,
        fragment_checks,
        marks:
            CopyMarks {
                first,
                body_end,
                ptwrite_at,
                spatial_at,
                aligned,
            },
        exits,
        spatial,
        redirects,
        loop_heads,
    } = scratch;
    aligned.push((0, None));
    first.reserve(code.instructions.len());
    // Read from the front as the instructions are walked (a `Peekable`
    // cost a few instructions more per original instruction).
    let mut checks = plan.superblocks.as_slice();
    let loops = LoopMap::new(code, &plan.register_loops, &mut next_fake);
    // Side exits of superblocks (branch index, loads to give back), the
    // spatial checks and the table redirects, each sorted by instruction
    // and walked with the instructions: a map lookup per instruction was
    // a sizeable part of building the copies.
    let mut listed = Listed::new(
        sorted_by_index(&plan.spatial, spatial),
        sorted_exits(plan, exits),
        sorted_by_index(&plan.redirects, redirects),
        &plan.inserts,
        &plan.escapes,
    );
    for (i, original) in code.instructions.iter().enumerate() {
        first.push(all.insns.len());
        let ip = original.ip();
        if i > 0 && follows_alignment_padding(ip, &code.instructions[i - 1]) {
            aligned.push((all.insns.len(), None));
        }
        let in_loop = loops.of(i);
        let checked = checks.first().is_some_and(|block| block.at == i);
        if !listed.holds(i) && in_loop.is_none() && !checked && i > 0 {
            // Most instructions: nothing before them and no change but a
            // hooked import's call, pushed as they are (built up through
            // the probes' steps, each was copied twice more).
            all.insns.push(*original);
            let pushed = all.insns.last_mut().expect("just pushed");
            hook_got_call(entries, pushed);
            continue;
        }
        let here = listed.take(i);
        // The address the next emitted instruction must carry: the
        // original one first, then a block check's resume label.
        let mut label = ip;
        if i == 0
            && let Some(target) = plan.prologue_call
        {
            let mut call = Instruction::with_branch(Code::Call_rel32_64, target)?;
            call.set_ip(label);
            all.insns.push(call);
            label = 0;
        }
        label = loops.enter((i, in_loop), label, &mut all.insns, aligned);
        if let [block, rest @ ..] = checks
            && checked
        {
            checks = rest;
            let loads = block.loads.len() as u32;
            let stub = next_fake();
            let fragment = next_fake();
            let labels = (label, stub, fragment);
            loops.block_check(in_loop, loads, labels, (&mut all.insns, &mut stubs.insns));
            label = 0;
            let fragment_start = fragments.insns.len();
            counting_fragment(
                plan,
                block,
                (fragment, in_loop.is_some()),
                entries,
                &mut next_fake,
                (&mut *fragments, &mut *fragment_checks),
                &mut *stubs,
            );
            if let Some(n) = in_loop {
                let fragment = &mut fragments.insns[fragment_start..];
                loops.fragment_exits(n, fragment, &mut next_fake, &mut stubs.insns);
            }
        }
        let mut insn = *original;
        match here.insert {
            Some(Insert::Soft { id, fast }) => {
                let slow = next_fake();
                let resume = next_fake();
                // The slow stub's way back to the load.
                let back = match in_loop {
                    Some(n) => {
                        let reload = next_fake();
                        reg_countdown::probe(loops.reg(n), label, slow, &mut all.insns);
                        reg_countdown::reload(loops.reg(n), reload, resume, &mut stubs.insns);
                        reload
                    }
                    None => {
                        probe::soft_fast_path_code(fast, label, slow, all);
                        resume
                    }
                };
                label = 0;
                insn.set_ip(resume);
                let record = entries.slow_path(here.spatial.is_some());
                let inline = in_loop.map(|_| next_fake());
                let labels = (slow, back);
                probe::soft_slow_stub_code(fast, &insn, id, labels, record, inline, stubs);
            }
            Some(Insert::String { id, second }) => {
                let stub = next_fake();
                let resume = next_fake();
                all.insns.push(jump_with_label(stub, label));
                label = 0;
                insn.set_ip(resume);
                probe::string_stub(
                    &insn,
                    [id, second.unwrap_or(id)],
                    stub,
                    resume,
                    entries.record,
                    &mut next_fake,
                    &mut stubs.insns,
                );
            }
            Some(Insert::Ptwrite { id }) => {
                label = emit_ptwrites(
                    &insn,
                    (id, label),
                    here.spatial.map(|(_, check)| check),
                    entries.spatial_hash,
                    &mut next_fake,
                    (all, &mut stubs.insns),
                    (&mut *ptwrite_at, &mut *stub_ptwrites),
                );
            }
            None => {}
        }
        if let Some(n) = in_loop {
            loops.branch(n, &mut insn, here.exit, &mut next_fake, &mut stubs.insns);
        } else if let Some(skipped) = here.exit {
            let stub = next_fake();
            let target = insn.near_branch_target();
            probe::exit_stub(skipped, stub, target, &mut stubs.insns);
            insn.set_near_branch64(stub);
        }
        if let Some(check) = here.spatial
            && !matches!(here.insert, Some(Insert::Ptwrite { .. }))
        {
            spatial_check_in_copy(
                check,
                (&mut insn, ip),
                label,
                entries,
                &mut next_fake,
                (all, &mut *stubs),
                &mut *spatial_at,
            );
            label = 0;
        }
        if insn.ip() == ip {
            insn.set_ip(label);
        }
        redirect(here.redirect, &mut insn, &mut all.insns);
        // A hooked import's tail call lands in the stub, never in
        // original code: no escape check.
        let hooked = hook_got_call(entries, &mut insn);
        let site = here.escape.filter(|_| !hooked);
        push_checked(
            insn,
            site,
            entries,
            &mut next_fake,
            &mut all.insns,
            &mut stubs.insns,
        )?;
        if let Some(n) = in_loop {
            loops.fall_out(n, i, &mut all.insns);
        }
    }
    if code.instructions.last().is_some_and(runs_off_the_end) {
        // In the original, execution goes on at the next bytes (glibc's
        // `__strncasecmp_avx2` loads the locale and continues into
        // `__strncasecmp_l_avx2`); in the copy, the stubs follow.
        all.insns
            .push(Instruction::with_branch(Code::Jmp_rel32_64, code.end)?);
    }
    *body_end = all.insns.len();
    mark_loop_ends(&all.insns, aligned, loop_heads);
    // The fragments, then the stubs, follow the body: the marks index
    // the three as one list.
    let at = all.insns.len();
    spatial_at.extend(fragment_checks.drain(..).map(|check| check.shifted(at)));
    let at = at + fragments.insns.len();
    ptwrite_at.extend(
        stub_ptwrites
            .drain(..)
            .map(|(i, id)| (at + i, id, PtwriteOperand::Address)),
    );
    Ok(())
}

/// Gives each loop head among `aligned` (after the copy's first
/// instruction) the last branch of the body `all` back to it, if that
/// branch follows it. `heads` (empty) takes the heads' addresses, sorted,
/// with their places in `aligned`: a copy has a few loop heads, and a
/// search among them for each branch's target cost less than a map of
/// every branch target to its last branch.
fn mark_loop_ends(
    all: &[Instruction],
    aligned: &mut [(usize, Option<usize>)],
    heads: &mut Vec<(u64, usize)>,
) {
    if aligned.len() <= 1 {
        return;
    }
    for (h, head) in aligned.iter_mut().enumerate().skip(1) {
        heads.push((all[head.0].ip(), h));
        head.1 = None;
    }
    heads.sort_unstable();
    for (j, insn) in all.iter().enumerate() {
        if is_relative_branch(insn) {
            let target = insn.near_branch_target();
            let from = heads.partition_point(|&(ip, _)| ip < target);
            for &(_, h) in heads[from..].iter().take_while(|&&(ip, _)| ip == target) {
                aligned[h].1 = Some(j);
            }
        }
    }
    for head in &mut aligned[1..] {
        head.1 = head.1.filter(|&j| j > head.0);
    }
}

/// The entries of a map keyed by instruction index, sorted by index, in
/// `entries` (empty).
fn sorted_by_index<'e, T: Copy>(
    map: &HashMap<usize, T>,
    entries: &'e mut Vec<(usize, T)>,
) -> &'e [(usize, T)] {
    entries.extend(map.iter().map(|(&i, &value)| (i, value)));
    entries.sort_unstable_by_key(|&(i, _)| i);
    entries
}

/// The lists a copy walks with its instructions, each sorted by index
/// ([`take_at`]), and the lowest index any of them still holds: the
/// instructions before it, most of a copy's, skip the five lists' checks.
struct Listed<'l> {
    spatial: &'l [(usize, (u32, SpatialProbe))],
    exits: &'l [(usize, u32)],
    redirects: &'l [(usize, TableRedirect)],
    inserts: &'l [(usize, Insert)],
    escapes: &'l [(usize, u32)],
    /// The lowest index at the lists' fronts (`usize::MAX` for none).
    next: usize,
}

/// What [`Listed`] holds for one instruction.
#[derive(Default)]
struct ListedAt {
    spatial: Option<(u32, SpatialProbe)>,
    exit: Option<u32>,
    redirect: Option<TableRedirect>,
    insert: Option<Insert>,
    escape: Option<u32>,
}

impl<'l> Listed<'l> {
    /// The lists: spatial checks, side exits, table redirects, then
    /// inserts and escape sites.
    fn new(
        spatial: &'l [(usize, (u32, SpatialProbe))],
        exits: &'l [(usize, u32)],
        redirects: &'l [(usize, TableRedirect)],
        inserts: &'l [(usize, Insert)],
        escapes: &'l [(usize, u32)],
    ) -> Self {
        let mut listed = Listed {
            spatial,
            exits,
            redirects,
            inserts,
            escapes,
            next: 0,
        };
        listed.next = listed.lowest_front();
        listed
    }

    /// The lowest index at the lists' fronts.
    fn lowest_front(&self) -> usize {
        fn front<T>(list: &[(usize, T)]) -> usize {
            list.first().map_or(usize::MAX, |&(i, _)| i)
        }
        (front(self.spatial).min(front(self.exits)))
            .min(front(self.redirects).min(front(self.inserts)))
            .min(front(self.escapes))
    }

    /// Whether any list may hold instruction `i` (else [`Listed::take`]
    /// gives nothing).
    #[inline]
    fn holds(&self, i: usize) -> bool {
        i >= self.next
    }

    /// What the lists hold for instruction `i`, taken off their fronts
    /// (the instructions are walked in order). An entry below `i`, never
    /// taken, keeps every later instruction checked, as [`take_at`] alone
    /// would.
    #[inline]
    fn take(&mut self, i: usize) -> ListedAt {
        if i < self.next {
            return ListedAt::default();
        }
        let at = ListedAt {
            spatial: take_at(&mut self.spatial, i),
            exit: take_at(&mut self.exits, i),
            redirect: take_at(&mut self.redirects, i),
            insert: take_at(&mut self.inserts, i),
            escape: take_at(&mut self.escapes, i),
        };
        self.next = self.lowest_front();
        at
    }
}

/// The value of the first entry of `sorted` (by index, none below `i`)
/// if it is instruction `i`'s, taken off the front: the lists a copy walks
/// with its instructions (a `Peekable` of each was a sizeable part of
/// building the copies).
fn take_at<T: Copy>(sorted: &mut &[(usize, T)], i: usize) -> Option<T> {
    match **sorted {
        [(at, value), ref rest @ ..] if at == i => {
            *sorted = rest;
            Some(value)
        }
        _ => None,
    }
}

/// Appends the spatial check `(id, probe)` of `insn` (original address
/// `ip`) to `code` at `label`, its stub to `stubs`, and its place to
/// `sites`; a load still at its original address moves to a fake one (the
/// check takes the label).
fn spatial_check_in_copy(
    (id, spatial): (u32, SpatialProbe),
    (insn, ip): (&mut Instruction, u64),
    label: u64,
    entries: &Entries,
    next_fake: &mut dyn FnMut() -> u64,
    (code, stubs): (&mut ProbeCode, &mut ProbeCode),
    sites: &mut Vec<CheckAt>,
) {
    let stub = next_fake();
    let at = code.insns.len();
    let form = (entries.spatial_hash, entries.spatial_rorx);
    let hash = probe::spatial_check_code(insn, spatial, (label, stub), form, code);
    sites.push(CheckAt::appended(code, at, hash, spatial.pushed() > 0));
    if insn.ip() == ip {
        insn.set_ip(next_fake());
    }
    probe::spatial_stub_code(
        insn,
        id,
        spatial,
        (stub, insn.ip()),
        entries.spatial_entry(),
        stubs,
    );
}

/// Appends `insn` to the copy, or, for escape site `site` (with escape
/// counting on), a jump to its check, which ends with `insn` itself (for an
/// untraced load, its count and then `insn`). Inlined: most instructions
/// are no site and are only pushed (out of line, with the instruction
/// passed by value, the call cost more than the push).
#[inline]
fn push_checked(
    insn: Instruction,
    site: Option<u32>,
    entries: &Entries,
    next_fake: &mut dyn FnMut() -> u64,
    all: &mut Vec<Instruction>,
    stubs: &mut Vec<Instruction>,
) -> Result<(), IcedError> {
    match (site, &entries.escape) {
        (Some(site), Some(check)) => push_escape_check(&insn, (site, check), next_fake, all, stubs),
        _ => {
            all.push(insn);
            Ok(())
        }
    }
}

/// [`push_checked`] of `insn`, escape site `site` counted by `check`.
#[inline(never)]
fn push_escape_check(
    insn: &Instruction,
    (site, check): (u32, &probe::EscapeCheck),
    next_fake: &mut dyn FnMut() -> u64,
    all: &mut Vec<Instruction>,
    stubs: &mut Vec<Instruction>,
) -> Result<(), IcedError> {
    if insn.flow_control() != FlowControl::IndirectBranch {
        // Not a jump: an untraced load, counted in place before it runs.
        let mut load = *insn;
        probe::untraced_load_count(site, check, insn.ip(), next_fake, all);
        load.set_ip(0);
        all.push(load);
    } else {
        let stub = next_fake();
        let mut jump = probe::branch(Code::Jmp_rel32_64, stub);
        jump.set_ip(insn.ip());
        probe::escape_stub(insn, site, check, stub, next_fake, stubs);
        all.push(jump);
    }
    Ok(())
}

/// Alignment of function copies and of the instructions the compiler
/// aligned (loop heads), in bytes.
const CODE_ALIGN: u64 = 16;

/// Cache line: a short loop that would straddle two starts on a line of
/// its own (the original's loops fit the op cache's 64-byte windows by the
/// compiler's alignment; a copy lengthened by probes must not lose that by
/// the accident of where it lands).
const LINE: u64 = 64;

/// An instruction of a run that starts aligned.
#[derive(Clone, Copy, Debug)]
struct Aligned {
    /// Its unpadded offset in the run.
    at: u64,
    /// The unpadded offset of the end of the last branch back to it (a
    /// loop head), if any.
    loop_end: Option<u64>,
}

/// Whether execution can continue past `last`, a function's last
/// instruction, into whatever follows the function.
fn runs_off_the_end(last: &Instruction) -> bool {
    !matches!(
        last.flow_control(),
        FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::Return
            | FlowControl::Exception
    )
}

/// Whether the compiler padded the code before the instruction at `ip`
/// (a NOP right before it, and `ip` on a [`CODE_ALIGN`] boundary): the copy
/// aligns it the same way, so a hot loop does not straddle more fetch
/// blocks than in the original by the accident of where it lands.
fn follows_alignment_padding(ip: u64, previous: &Instruction) -> bool {
    ip.is_multiple_of(CODE_ALIGN) && previous.mnemonic() == Mnemonic::Nop
}

/// Multi-byte NOPs of 1 to 9 bytes (the forms the optimisation manuals
/// recommend), index = length − 1.
pub(super) const NOPS: [&[u8]; 9] = [
    &[0x90],
    &[0x66, 0x90],
    &[0x0f, 0x1f, 0x00],
    &[0x0f, 0x1f, 0x40, 0x00],
    &[0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00],
    &[0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
    &[0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
];

/// How a stretch of code is laid out by [`Layout::measure`]. Every piece's
/// bytes are in the pool, encoded once; the pieces with a target take the
/// next of the layout's targets, in order, and get their 4-byte
/// displacement to it written where they land.
enum Piece {
    /// Position-independent instructions: the next this many bytes.
    Fixed(u32),
    /// A relative branch in its rel32 form (size): its last 4 bytes are
    /// the displacement.
    Near(u8),
    /// `jrcxz`/`loop`-style rel8-only branch (its size), expanded to
    /// `jcx L1; jmp short L2; L1: jmp rel32 target; L2:`: the pool holds
    /// all but the last 4 bytes.
    Short(u8),
    /// A RIP-relative memory operand (size, offset of its displacement):
    /// it keeps its absolute target.
    RipRelative(u8, u8),
    /// An instruction whose encoding is re-derived where it lands (placed
    /// instruction, size): a branch with a 16-bit displacement, or an
    /// IP-relative operand that is not `rip`-based.
    Reencode(u32, u8),
}

/// The layout of a run's instructions, before [`place`] pads it.
#[derive(Default)]
struct Layout {
    /// In order; consecutive position-independent instructions are one
    /// piece unless an aligned instruction starts between them.
    pieces: Vec<Piece>,
    /// The pieces' bytes, the displacements still to write left as
    /// encoded at the measuring base (or out, for [`Piece::Short`]).
    pool: Vec<u8>,
    /// The absolute targets of the pieces with one, in order.
    targets: Vec<u64>,
    /// The instructions of the [`Piece::Reencode`] pieces, in order.
    placed: Vec<Instruction>,
    /// `(unpadded offset, address label)` of every instruction that
    /// carries one.
    labels: Vec<(u64, u64)>,
    /// Unpadded length so far.
    end: u64,
}

impl Layout {
    /// Takes its code (pieces, bytes, targets) out, keeping its length.
    fn take_code(&mut self) -> Layout {
        std::mem::replace(
            self,
            Layout {
                end: self.end,
                ..Layout::default()
            },
        )
    }

    /// An empty layout in `spare`'s code buffers (its labels were taken
    /// once measured, [`MeasuredLabels::of`], and come back apart:
    /// [`Spares::label_list`]).
    fn emptied(spare: Layout) -> Layout {
        let Layout {
            mut pieces,
            mut pool,
            mut targets,
            mut placed,
            ..
        } = spare;
        pieces.clear();
        pool.clear();
        targets.clear();
        placed.clear();
        Layout {
            pieces,
            pool,
            targets,
            placed,
            ..Layout::default()
        }
    }

    /// Lays out `code` (its slices one after another) after what is
    /// already measured: every branch in its rel32 form (so sizes are known
    /// in one pass; no relaxation and no dependence on where the code
    /// lands), every instruction encoded once into the pool, every
    /// template's placeholder laid out as the template ([`ProbeCode`]).
    /// The instructions at the indices `breaks` (sorted; indices into the
    /// slices' instructions one after another) start a piece of their own:
    /// [`place`] pads before them.
    /// `unpadded` receives the unpadded offset of each instruction and of
    /// the end. `base` is only used to check RIP-relative operands can be
    /// encoded near it.
    ///
    /// Only bytes and targets are kept, not the instructions: a 40-byte
    /// `Instruction` per branch was most of a run's layout. iced's
    /// `BlockEncoder`, which encodes each instruction several times while
    /// it shrinks branches, was most of the rewriter's time.
    fn measure(
        &mut self,
        encoder: &mut LayoutEncoder,
        code: &[&ProbeCode],
        breaks: &[usize],
        base: u64,
        unpadded: &mut Vec<u64>,
    ) -> Result<(), RelocateError> {
        unpadded.clear();
        let mut breaks = breaks;
        let mut from = 0;
        for slice in code {
            self.measure_one(encoder, (slice, from), &mut breaks, base, unpadded)?;
            from += slice.insns.len();
        }
        unpadded.push(self.end);
        Ok(())
    }

    /// [`Layout::measure`] of one slice of the code, `code`, whose first
    /// instruction has index `from`.
    fn measure_one(
        &mut self,
        encoder: &mut LayoutEncoder,
        (code, from): (&ProbeCode, usize),
        breaks: &mut &[usize],
        base: u64,
        unpadded: &mut Vec<u64>,
    ) -> Result<(), RelocateError> {
        // The breaks and templates left, read from the front as the
        // instructions are walked (a `Peekable` of each cost more than the
        // rest of a template's layout).
        let mut templates = code.templates.as_slice();
        for (k, insn) in code.insns.iter().enumerate() {
            let i = from + k;
            let starts_piece = breaks.first() == Some(&i);
            while let [first, rest @ ..] = *breaks
                && *first == i
            {
                *breaks = rest;
            }
            if insn.ip() != 0 {
                self.labels.push((self.end, insn.ip()));
            }
            unpadded.push(self.end);
            if let [(at, used), rest @ ..] = templates
                && *at as usize == k
            {
                templates = rest;
                self.template(used, starts_piece);
                continue;
            }
            let (piece, size) = self.piece(encoder, insn, base)?;
            match (piece, self.pieces.last_mut()) {
                (Piece::Fixed(size), Some(Piece::Fixed(previous))) if !starts_piece => {
                    *previous += size;
                }
                (piece, _) => self.pieces.push(piece),
            }
            self.end += size;
        }
        Ok(())
    }

    /// Lays out `insn`: appends its bytes to the pool (and its target or
    /// itself where it is written where it lands) and gives its piece and
    /// its size in bytes.
    fn piece(
        &mut self,
        encoder: &mut LayoutEncoder,
        insn: &Instruction,
        base: u64,
    ) -> Result<(Piece, u64), RelocateError> {
        if !is_relative_branch(insn) && !insn.is_ip_rel_memory_operand() {
            let size = encoder.position_independent(insn, &mut self.pool)?;
            return Ok((Piece::Fixed(size), u64::from(size)));
        }
        let layout_encoder = encoder;
        Ok(if is_relative_branch(insn) {
            let short = matches!(
                insn.code(),
                Code::Jrcxz_rel8_64
                    | Code::Jecxz_rel8_64
                    | Code::Loop_rel8_64_RCX
                    | Code::Loop_rel8_64_ECX
                    | Code::Loope_rel8_64_RCX
                    | Code::Loope_rel8_64_ECX
                    | Code::Loopne_rel8_64_RCX
                    | Code::Loopne_rel8_64_ECX
            );
            if short {
                let encoder = &mut layout_encoder.encoder;
                // Sized first, then encoded with its target past the
                // `jmp short`, which is where it lands wherever that is.
                let mut probe = *insn;
                probe.set_near_branch64(base + 2);
                let size = encoder.encode(&probe, base).map_err(|e| fail(insn, e))? as u8;
                discard(encoder);
                probe.set_near_branch64(base + u64::from(size) + 2);
                encoder.encode(&probe, base).map_err(|e| fail(insn, e))?;
                drain_into(encoder, &mut self.pool);
                self.pool.extend_from_slice(&[0xeb, 0x05, 0xe9]); // jmp short past the jmp rel32
                self.targets.push(insn.near_branch_target());
                (Piece::Short(size), u64::from(size) + 2 + 5)
            } else {
                let mut near = *insn;
                near.as_near_branch();
                if near.code() == Code::Xbegin_rel16 {
                    near.set_code(Code::Xbegin_rel32);
                }
                near.set_near_branch64(base);
                match layout_encoder.near_branch(&near, base, &mut self.pool) {
                    Ok(Some(size)) => {
                        self.targets.push(insn.near_branch_target());
                        (Piece::Near(size as u8), u64::from(size))
                    }
                    Ok(None) => {
                        // Measured again: such forms are rare.
                        let encoder = &mut layout_encoder.encoder;
                        let size = encoder.encode(&near, base).map_err(|e| fail(insn, e))?;
                        self.reencode(encoder, insn, size)
                    }
                    Err(e) => return Err(fail(insn, e)),
                }
            }
        } else if let Some((size, at)) = write_direct(insn, base, &mut self.pool) {
            self.targets.push(insn.memory_displacement64());
            (Piece::RipRelative(size as u8, at), u64::from(size))
        } else {
            let encoder = &mut layout_encoder.encoder;
            let size = encoder.encode(insn, base).map_err(|e| fail(insn, e))?;
            let offsets = encoder.get_constant_offsets();
            if insn.memory_base() == Register::RIP && offsets.displacement_size() == 4 {
                drain_into(encoder, &mut self.pool);
                self.targets.push(insn.memory_displacement64());
                let at = offsets.displacement_offset() as u8;
                (Piece::RipRelative(size as u8, at), size as u64)
            } else {
                self.reencode(encoder, insn, size)
            }
        })
    }

    /// Lays out the template of `used`: its bytes, with its value, in the
    /// pool, and a [`Piece::Near`] for each rel32 displacement (its
    /// branch's other bytes are in the fixed pieces around it).
    fn template(&mut self, used: &TemplateUse, starts_piece: bool) {
        let template = used.template;
        template.append_to(used.values, &mut self.pool);
        let mut from = 0;
        for (&end, &target) in template.rel32_ends().iter().zip(&used.targets) {
            let end = u32::from(end);
            self.fixed(end - 4 - from, starts_piece && from == 0);
            self.pieces.push(Piece::Near(4));
            self.targets.push(target);
            from = end;
        }
        let len = template.len() as u32;
        self.fixed(len - from, starts_piece && from == 0);
        self.end += u64::from(len);
    }

    /// Adds `size` position-independent bytes to the pieces: to the last
    /// piece where that is fixed too, unless they `start_piece`.
    fn fixed(&mut self, size: u32, starts_piece: bool) {
        match self.pieces.last_mut() {
            _ if size == 0 => {}
            Some(Piece::Fixed(previous)) if !starts_piece => *previous += size,
            _ => self.pieces.push(Piece::Fixed(size)),
        }
    }

    /// Keeps `insn` (just encoded to `size` bytes) to be re-encoded where
    /// it lands.
    fn reencode(&mut self, encoder: &mut Encoder, insn: &Instruction, size: usize) -> (Piece, u64) {
        discard(encoder);
        self.placed.push(*insn);
        let k = self.placed.len() as u32 - 1;
        (Piece::Reencode(k, size as u8), size as u64)
    }
}

thread_local! {
    /// The worker thread's [`LayoutEncoder`], kept between its runs: its
    /// cache is not allocated and filled again for every run.
    static LAYOUT_ENCODER: std::cell::Cell<Option<LayoutEncoder>> =
        const { std::cell::Cell::new(None) };
}

/// iced's encoder, with the encodings of the position-independent
/// instructions it encoded last kept by instruction: a run's probes repeat
/// a few templates and its original instructions repeat too (about nine
/// lookups in ten hit), and looking one up costs a fraction of encoding it
/// again.
///
/// An instruction's encoding away from relative targets is a function of
/// what `Instruction`'s `==` compares: it leaves out only the address, the
/// length and the decoder's code size, none of which the encoder reads for
/// such an instruction in 64-bit mode (an unknown code size is 64-bit).
/// The cache holds its instructions with those three cleared
/// ([`LayoutEncoder::key_of`]) and compares all bits, which is `==` at a
/// fraction of the cost (`==` compares field by field, out of line, and
/// was most of a hit's time).
struct LayoutEncoder {
    encoder: Encoder,
    /// Direct-mapped by hash: a newer instruction replaces the one in its
    /// slot, so the cache stays small (it lives on every worker thread at
    /// the rewriter's peak) and needs no eviction bookkeeping.
    cache: Box<[CachedEncoding]>,
}

/// One slot of [`LayoutEncoder`]'s cache, a cache line of its own (a
/// lookup misses the CPU's cache once); empty while `len` is 0.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct CachedEncoding {
    /// The instruction, as [`LayoutEncoder::key_of`] gives it.
    key: Instruction,
    len: u8,
    /// The encoding, then zeros: copied whole, 16 bytes at a time.
    bytes: [u8; 16],
}

impl CachedEncoding {
    /// On a hit (the slot holds `key`, an instruction as
    /// [`LayoutEncoder::key_of`] gives it), appends its encoding to `out`
    /// and gives its size.
    fn append_if_holds(&self, key: &Instruction, out: &mut Vec<u8>) -> Option<u32> {
        let len = usize::from(self.len);
        if len == 0 || !self.key.eq_all_bits(key) {
            return None;
        }
        // A copy of fixed length, inlined, instead of one of `len`.
        let from = out.len();
        out.extend_from_slice(&self.bytes);
        out.truncate(from + len);
        Some(len as u32)
    }

    /// Holds the `encoding` of the instruction of `key` from now on, if it
    /// fits.
    fn hold(&mut self, key: &Instruction, encoding: &[u8]) {
        if let Ok(len) = u8::try_from(encoding.len())
            && encoding.len() <= self.bytes.len()
        {
            self.key = *key;
            self.len = len;
            self.bytes = [0; 16];
            self.bytes[..encoding.len()].copy_from_slice(encoding);
        }
    }
}

impl LayoutEncoder {
    /// Slots of the cache (a power of two), 64 KB: on python3.11, 88% of
    /// the lookups hit (256 slots: 82%, 4,096: 91%, 16,384: 92%), and a
    /// larger table's lookups missed the CPU's caches more than the hits
    /// they added saved.
    const SLOTS: usize = 1024;

    fn new() -> Self {
        let empty = CachedEncoding {
            key: Instruction::default(),
            len: 0,
            bytes: [0; 16],
        };
        LayoutEncoder {
            encoder: Encoder::new(64),
            cache: vec![empty; Self::SLOTS].into_boxed_slice(),
        }
    }

    /// `insn` with what `==` leaves out cleared: equal keys, all bits
    /// compared, are equal instructions.
    fn key_of(insn: &Instruction) -> Instruction {
        let mut key = *insn;
        key.set_next_ip(0);
        key.set_len(0);
        key.set_code_size(CodeSize::Unknown);
        key
    }

    /// The cache slot of `insn`, from [`super::distinguishing_fields`] and
    /// its displacement and immediate (a hit compares all fields).
    fn slot_of(insn: &Instruction) -> usize {
        use std::hash::BuildHasher;
        let kinds = super::distinguishing_fields(insn);
        let values = insn.memory_displacement64() ^ u64::from(insn.immediate32()).rotate_left(32);
        let hash = foldhash::fast::FixedState::with_seed(0).hash_one((kinds, values));
        hash as usize & (Self::SLOTS - 1)
    }

    /// Appends the encoding of `insn`, which has no relative target, to
    /// `out` and gives its size.
    fn position_independent(
        &mut self,
        insn: &Instruction,
        out: &mut Vec<u8>,
    ) -> Result<u32, RelocateError> {
        if let Some(size) =
            mov_r32_imm32(insn, out).or_else(|| write_direct(insn, 0, out).map(|(size, _)| size))
        {
            return Ok(size);
        }
        let key = Self::key_of(insn);
        let slot = &mut self.cache[Self::slot_of(&key)];
        if let Some(size) = slot.append_if_holds(&key, out) {
            return Ok(size);
        }
        let size = self.encoder.encode(insn, 0).map_err(|e| fail(insn, e))?;
        let from = out.len();
        drain_into(&mut self.encoder, out);
        slot.hold(&key, &out[from..]);
        Ok(size as u32)
    }
}

impl LayoutEncoder {
    /// Appends the encoding of `near`, a relative branch in its rel32 form
    /// with its target at `base`, encoded at `base`, to `out` and gives its
    /// size, when its last 4 bytes are the displacement; `None` (and
    /// nothing appended) for any other form. A plain `jmp`, `call` or `jcc`
    /// is written directly ([`write_near_rel32`]); other branches are
    /// cached with the position-independent instructions: a branch's bytes
    /// but for its displacement depend only on what `==` compares, its
    /// target (`base`, the same for all) included.
    fn near_branch(
        &mut self,
        near: &Instruction,
        base: u64,
        out: &mut Vec<u8>,
    ) -> Result<Option<u32>, IcedError> {
        if let Some(size) = write_near_rel32(near, base, out) {
            return Ok(Some(size));
        }
        let key = Self::key_of(near);
        let slot = &mut self.cache[Self::slot_of(&key)];
        if let Some(size) = slot.append_if_holds(&key, out) {
            return Ok(Some(size));
        }
        let size = self.encoder.encode(near, base)?;
        let offsets = self.encoder.get_constant_offsets();
        if !(offsets.immediate_size() == 4 && offsets.immediate_offset() + 4 == size) {
            discard(&mut self.encoder);
            return Ok(None);
        }
        let from = out.len();
        drain_into(&mut self.encoder, out);
        slot.hold(&key, &out[from..]);
        Ok(Some(size as u32))
    }
}

/// The opcode of a near `jmp`, `call` or `jcc` in its rel32 form, after
/// `0F` for a `jcc`: the branches most copies are laid out with.
fn rel32_opcode(code: Code) -> Option<u8> {
    Some(match code {
        Code::Jmp_rel32_64 => 0xe9,
        Code::Call_rel32_64 => 0xe8,
        Code::Jo_rel32_64 => 0x80,
        Code::Jno_rel32_64 => 0x81,
        Code::Jb_rel32_64 => 0x82,
        Code::Jae_rel32_64 => 0x83,
        Code::Je_rel32_64 => 0x84,
        Code::Jne_rel32_64 => 0x85,
        Code::Jbe_rel32_64 => 0x86,
        Code::Ja_rel32_64 => 0x87,
        Code::Js_rel32_64 => 0x88,
        Code::Jns_rel32_64 => 0x89,
        Code::Jp_rel32_64 => 0x8a,
        Code::Jnp_rel32_64 => 0x8b,
        Code::Jl_rel32_64 => 0x8c,
        Code::Jge_rel32_64 => 0x8d,
        Code::Jle_rel32_64 => 0x8e,
        Code::Jg_rel32_64 => 0x8f,
        _ => return None,
    })
}

/// Appends the encoding at `ip` of `near`, a near `jmp`, `call` or `jcc`
/// in its rel32 form without prefixes, and gives its size (its last 4
/// bytes are the displacement); `None` (nothing appended) for any other
/// instruction or a target out of reach, left to iced. The bytes are
/// iced's: `E9`/`E8`, or `0F 8x`, then the displacement from the
/// instruction's end. They were about two in five of the
/// [`LayoutEncoder`]'s lookups, each costing several times these bytes.
fn write_near_rel32(near: &Instruction, ip: u64, out: &mut Vec<u8>) -> Option<u32> {
    let opcode = rel32_opcode(near.code())?;
    if !unprefixed(near) {
        return None;
    }
    let escaped = opcode & 0xf0 == 0x80;
    let size = 5 + usize::from(escaped);
    let next_ip = ip.wrapping_add(size as u64);
    let rel = i32::try_from(near.near_branch64().wrapping_sub(next_ip) as i64).ok()?;
    let mut bytes = [0x0f, opcode, 0, 0, 0, 0];
    bytes[2..].copy_from_slice(&rel.to_le_bytes());
    out.extend_from_slice(&bytes[usize::from(!escaped)..]);
    Some(size as u32)
}

/// Whether `insn` is of `code` without a segment, lock or repeat prefix:
/// the forms whose bytes are written here instead of by iced.
fn is_plain(insn: &Instruction, code: Code) -> bool {
    insn.code() == code && unprefixed(insn)
}

/// Whether `insn` has no segment, lock or repeat prefix.
fn unprefixed(insn: &Instruction) -> bool {
    insn.segment_prefix() == Register::None
        && !insn.has_lock_prefix()
        && !insn.has_rep_prefix()
        && !insn.has_repne_prefix()
}

/// Appends the encoding of `insn` if it is a `mov r32, imm32` without
/// prefixes (`B8+r id`, `41` first for `r8d`–`r15d`: iced's) and gives its
/// size. Every slow stub sets its load id so (`mov esi, id`): unique, such
/// an instruction missed the [`LayoutEncoder`]'s cache, was encoded by
/// iced and evicted an encoding that repeats.
fn mov_r32_imm32(insn: &Instruction, out: &mut Vec<u8>) -> Option<u32> {
    if !is_plain(insn, Code::Mov_r32_imm32) {
        return None;
    }
    let number = insn.op0_register().number() as u8;
    let from = out.len();
    if number >= 8 {
        out.push(0x41);
    }
    out.push(0xb8 | (number & 7));
    out.extend_from_slice(&insn.immediate32().to_le_bytes());
    Some((out.len() - from) as u32)
}

/// Where a memory operand written directly ([`write_direct`]) points, as
/// the bytes around the opcode take it.
struct Addressing {
    /// 32-bit address registers: an `67` prefix.
    narrow: bool,
    /// REX.X and REX.B of its index and base.
    rex: u8,
    /// ModRM's mod and r/m bits.
    mod_rm: u8,
    /// SIB byte, where an index, a scale or an `rsp`/`r12` base needs one.
    sib: Option<u8>,
    /// `[rip + disp32]`: the displacement, to `displacement` as an
    /// absolute target, is known once the instruction's size is.
    rip_relative: bool,
    /// The displacement (its low `displacement_len` bytes are written), or
    /// the absolute target of a RIP-relative operand.
    displacement: u64,
    displacement_len: usize,
}

/// The number of `register` if it is a general register of 64 bits
/// (`wide`) or 32: iced numbers each width's sixteen in order.
#[inline]
fn gpr_number(register: Register, wide: bool) -> Option<u8> {
    let first = if wide { Register::RAX } else { Register::EAX };
    let number = (register as u32).wrapping_sub(first as u32);
    (number < 16).then_some(number as u8)
}

/// What [`addressing`] takes each register for, by its number in iced: a
/// general register of 64 bits is its number (0–15), one of 32 bits its
/// number plus [`NARROW_ADDRESS`], no register [`NO_ADDRESS`], any other
/// more. One load classifies a base or an index, where a range check per
/// width and an `Option` per register cost a tenth of a direct write.
static ADDRESS_REGISTERS: [u8; 256] = {
    let mut table = [u8::MAX; 256];
    table[Register::None as usize] = NO_ADDRESS;
    let mut number = 0;
    while number < 16 {
        table[Register::RAX as usize + number] = number as u8;
        table[Register::EAX as usize + number] = NARROW_ADDRESS + number as u8;
        number += 1;
    }
    table
};

/// Added to a 32-bit address register's number in [`ADDRESS_REGISTERS`].
const NARROW_ADDRESS: u8 = 16;

/// [`ADDRESS_REGISTERS`]' value of no register: its low four bits are 0,
/// so that it adds no REX bit and no SIB bits.
const NO_ADDRESS: u8 = 32;

/// The [`Addressing`] of `insn`'s memory operand as iced encodes it, for
/// 64-bit or 32-bit address registers or `rip`; `None` for what iced
/// refuses or writes otherwise (an absolute address, `eip`, a
/// displacement out of range), which is left to iced. iced's choices:
/// the displacement as disp8 where its size asks for one (a zero one
/// where an `rbp`/`r13` base has none) and it fits, else disp32; a SIB
/// where an index, a scale or an `rsp`/`r12` base needs one.
#[inline]
fn addressing(insn: &Instruction) -> Option<Addressing> {
    let (base, index) = (insn.memory_base(), insn.memory_index());
    let displ_size = insn.memory_displ_size();
    if !matches!(displ_size, 0 | 1 | 4 | 8) {
        return None;
    }
    if base == Register::RIP {
        return (index == Register::None && insn.memory_index_scale() == 1).then(|| Addressing {
            narrow: false,
            rex: 0,
            mod_rm: 0x05,
            sib: None,
            rip_relative: true,
            displacement: insn.memory_displacement64(),
            displacement_len: 4,
        });
    }
    let (b, x) = (
        ADDRESS_REGISTERS[base as usize],
        ADDRESS_REGISTERS[index as usize],
    );
    // 32-bit address registers where either is one; then both must be.
    let narrow = (b | x) & NARROW_ADDRESS != 0;
    let (has_base, has_index) = (b != NO_ADDRESS, x != NO_ADDRESS);
    if b > NO_ADDRESS
        || x > NO_ADDRESS
        || (narrow && (b < NARROW_ADDRESS || x < NARROW_ADDRESS))
        // No absolute address (iced's form of it differs), no `rsp` index.
        || !(has_base || has_index)
        || x & !NARROW_ADDRESS == 4
    {
        return None;
    }
    let (base_number, index_number) = (b & 15, x & 15);
    let disp = insn.memory_displacement64() as i64;
    let disp_max = if narrow {
        i64::from(u32::MAX)
    } else {
        i64::from(i32::MAX)
    };
    if !(i64::from(i32::MIN)..=disp_max).contains(&disp) {
        return None;
    }
    let displ = insn.memory_displacement32();
    let address_bytes = if narrow { 4 } else { 8 };
    let mut displ_size = displ_size;
    if displ_size == 0 && has_base && base_number & 7 == 5 {
        // `[rbp]` and `[r13]` take a zero disp8.
        if displ != 0 {
            return None;
        }
        displ_size = 1;
    }
    if displ_size == 1 && i8::try_from(displ as i32).is_err() {
        displ_size = address_bytes;
    }
    let (mod_bits, displacement_len) = match displ_size {
        _ if !has_base => (0x00, 4),
        1 => (0x40, 1),
        _ if displ_size == address_bytes => (0x80, 4),
        0 if displ == 0 => (0x00, 0),
        _ => return None,
    };
    let scale = insn.memory_index_scale().trailing_zeros() as u8;
    // No register ([`NO_ADDRESS`], low bits 0) adds no bit.
    let rex = (index_number >> 3) << 1 | base_number >> 3;
    let needs_sib = has_index || scale != 0 || !has_base || base_number & 7 == 4;
    let (mod_rm, sib) = if needs_sib {
        let index_bits = if has_index { index_number & 7 } else { 4 };
        let base_bits = if has_base { base_number & 7 } else { 5 };
        (mod_bits | 4, Some(scale << 6 | index_bits << 3 | base_bits))
    } else {
        (mod_bits | (base_number & 7), None)
    };
    Some(Addressing {
        narrow,
        rex,
        mod_rm,
        sib,
        rip_relative: false,
        displacement: u64::from(displ),
        displacement_len,
    })
}

/// What fills the ModRM reg field of a [`DirectForm`]; its other operand
/// is the r/m one.
#[derive(Clone, Copy)]
enum RegField {
    /// Operand 0, a general register of the form's width (`op r, r/m`).
    First,
    /// Operand 1, a general register of the form's width (`op r/m, r`).
    Second,
    /// The opcode's extension (`op r/m` or `op r/m, imm`).
    Extension(u8),
}

/// What a [`DirectForm`]'s r/m operand may be besides memory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RmRegister {
    /// Nothing: memory only (`lea`, and the `movzx` and byte forms, whose
    /// registers would need iced's rules for byte registers).
    None,
    /// A 64-bit general register.
    Gpr64,
    /// A 32-bit general register.
    Gpr32,
}

/// An instruction form whose bytes [`write_direct`] writes instead of
/// iced: a one-byte opcode (after `0F` where `escaped`) with a ModRM
/// operand, general registers, and at most an 8-bit or 32-bit immediate
/// after the displacement.
#[derive(Clone, Copy)]
struct DirectForm {
    code: Code,
    opcode: u8,
    escaped: bool,
    /// REX.W, and a 64-bit register in the reg field (else a 32-bit one;
    /// a near `call`/`jmp` is 64-bit without it).
    wide: bool,
    reg: RegField,
    rm: RmRegister,
    /// Bytes of its immediate: 0, 1 or 4.
    immediate: usize,
}

/// The forms [`write_direct`] writes: those that reached iced most often
/// on large inputs, their encodings repeating too little for the
/// [`LayoutEncoder`]'s cache: the stubs' and checks' `lea` of their load's
/// address (unique by displacement), the originals' stack and structure
/// accesses, and their RIP-relative `lea`s, calls and jumps through the
/// GOT and loads of globals (never cached: each is laid out with its
/// target).
const DIRECT_FORMS: [DirectForm; 27] = {
    use RegField::*;
    use RmRegister::*;
    const fn form(
        code: Code,
        opcode: u8,
        wide: bool,
        reg: RegField,
        rm: RmRegister,
        immediate: usize,
    ) -> DirectForm {
        DirectForm {
            code,
            opcode,
            escaped: false,
            wide,
            reg,
            rm,
            immediate,
        }
    }
    const fn escaped(form: DirectForm) -> DirectForm {
        DirectForm {
            escaped: true,
            ..form
        }
    }
    [
        form(Code::Lea_r64_m, 0x8d, true, First, None, 0),
        form(Code::Lea_r32_m, 0x8d, false, First, None, 0),
        form(Code::Mov_r64_rm64, 0x8b, true, First, Gpr64, 0),
        form(Code::Mov_r32_rm32, 0x8b, false, First, Gpr32, 0),
        form(Code::Cmp_r64_rm64, 0x3b, true, First, Gpr64, 0),
        form(Code::Movsxd_r64_rm32, 0x63, true, First, Gpr32, 0),
        escaped(form(Code::Movzx_r32_rm8, 0xb6, false, First, None, 0)),
        escaped(form(Code::Movzx_r32_rm16, 0xb7, false, First, None, 0)),
        form(Code::Mov_rm64_r64, 0x89, true, Second, Gpr64, 0),
        form(Code::Mov_rm32_r32, 0x89, false, Second, Gpr32, 0),
        form(Code::Add_rm64_r64, 0x01, true, Second, Gpr64, 0),
        form(Code::Sub_rm64_r64, 0x29, true, Second, Gpr64, 0),
        form(Code::Cmp_rm64_r64, 0x39, true, Second, Gpr64, 0),
        form(Code::Cmp_rm32_r32, 0x39, false, Second, Gpr32, 0),
        form(Code::Test_rm64_r64, 0x85, true, Second, Gpr64, 0),
        form(Code::Xor_rm32_r32, 0x31, false, Second, Gpr32, 0),
        form(Code::Call_rm64, 0xff, false, Extension(2), Gpr64, 0),
        form(Code::Jmp_rm64, 0xff, false, Extension(4), Gpr64, 0),
        form(Code::Add_rm64_imm8, 0x83, true, Extension(0), Gpr64, 1),
        form(Code::Sub_rm64_imm8, 0x83, true, Extension(5), Gpr64, 1),
        form(Code::Cmp_rm64_imm8, 0x83, true, Extension(7), Gpr64, 1),
        form(Code::Cmp_rm32_imm8, 0x83, false, Extension(7), Gpr32, 1),
        form(Code::Cmp_rm8_imm8, 0x80, false, Extension(7), None, 1),
        form(Code::Add_rm64_imm32, 0x81, true, Extension(0), Gpr64, 4),
        form(Code::Mov_rm64_imm32, 0xc7, true, Extension(0), Gpr64, 4),
        form(Code::Mov_rm32_imm32, 0xc7, false, Extension(0), Gpr32, 4),
        escaped(form(Code::Nop_rm32, 0x1f, false, Extension(0), Gpr32, 0)),
    ]
};

/// Codes below this have a slot in [`DIRECT_FORM_OF`] (above every
/// code's number).
const CODES: usize = 5000;

/// For each code, 1 + its index in [`DIRECT_FORMS`], or 0: one load tells
/// whether an instruction is written directly (a `match` on the code
/// compared it with every form, for each of millions of instructions).
static DIRECT_FORM_OF: [u8; CODES] = {
    let mut table = [0; CODES];
    let mut k = 0;
    while k < DIRECT_FORMS.len() {
        table[DIRECT_FORMS[k].code as usize] = k as u8 + 1;
        k += 1;
    }
    table
};

/// The [`DirectForm`] of `code`, if it has one.
fn direct_form(code: Code) -> Option<&'static DirectForm> {
    let k = *DIRECT_FORM_OF.get(code as usize)?;
    // 0 wraps past the end: one bounds check where two were.
    DIRECT_FORMS.get(usize::from(k).wrapping_sub(1))
}

/// Appends the encoding of `insn` at `ip` if it is a [`DirectForm`]
/// without prefixes, its r/m operand a register the form takes or a memory
/// operand with an [`addressing`], and gives its size and the offset of
/// its displacement (past the ModRM/SIB where it has none); `None`
/// (nothing appended) for anything else, which iced encodes or refuses.
/// The bytes are iced's: `67` for 32-bit address registers, a REX prefix
/// only where REX.W or a register numbered 8 or above needs one, the
/// opcode, ModRM, SIB, displacement and immediate; a RIP-relative
/// displacement is to its target from the instruction's end, and one out
/// of reach is left to iced (which refuses it).
fn write_direct(insn: &Instruction, ip: u64, out: &mut Vec<u8>) -> Option<(u32, u8)> {
    let form = direct_form(insn.code())?;
    if !unprefixed(insn) {
        return None;
    }
    let ((rm_kind, rm_register), reg_number) = match form.reg {
        RegField::First => (
            (insn.op1_kind(), insn.op1_register()),
            gpr_number(insn.op0_register(), form.wide)?,
        ),
        RegField::Second => (
            (insn.op0_kind(), insn.op0_register()),
            gpr_number(insn.op1_register(), form.wide)?,
        ),
        RegField::Extension(digit) => ((insn.op0_kind(), insn.op0_register()), digit),
    };
    let addressing = match rm_kind {
        OpKind::Memory => addressing(insn)?,
        OpKind::Register => register_addressing(form.rm, rm_register)?,
        _ => return None,
    };
    // Written into a buffer of fixed size, each optional byte written and
    // counted or not, then copied whole: pushed one by one, with copies
    // of their length, the bytes cost more than iced's cached encodings.
    let mut bytes = [0u8; 16];
    let mut len = 0;
    let rex = u8::from(form.wide) << 3 | (reg_number >> 3) << 2 | addressing.rex;
    bytes[len] = 0x67;
    len += usize::from(addressing.narrow);
    bytes[len] = 0x40 | rex;
    len += usize::from(rex != 0);
    bytes[len] = 0x0f;
    len += usize::from(form.escaped);
    bytes[len] = form.opcode;
    bytes[len + 1] = addressing.mod_rm | (reg_number & 7) << 3;
    len += 2;
    bytes[len] = addressing.sib.unwrap_or(0);
    len += usize::from(addressing.sib.is_some());
    let displacement_at = len;
    let size = len + addressing.displacement_len + form.immediate;
    let displacement = if addressing.rip_relative {
        let next_ip = ip.wrapping_add(size as u64);
        i32::try_from(addressing.displacement.wrapping_sub(next_ip) as i64).ok()? as u32
    } else {
        addressing.displacement as u32
    };
    bytes[len..len + 4].copy_from_slice(&displacement.to_le_bytes());
    len += addressing.displacement_len;
    bytes[len..len + 4].copy_from_slice(&insn.immediate32().to_le_bytes());
    let from = out.len();
    out.extend_from_slice(&bytes);
    out.truncate(from + size);
    Some((size as u32, displacement_at as u8))
}

/// The [`Addressing`] of an r/m operand that is `register`, where the
/// form takes one of its width (`mod` 11, REX.B for `r8` and above).
#[inline]
fn register_addressing(takes: RmRegister, register: Register) -> Option<Addressing> {
    let number = match takes {
        RmRegister::None => None,
        RmRegister::Gpr64 => gpr_number(register, true),
        RmRegister::Gpr32 => gpr_number(register, false),
    }?;
    Some(Addressing {
        narrow: false,
        rex: number >> 3,
        mod_rm: 0xc0 | (number & 7),
        sib: None,
        rip_relative: false,
        displacement: 0,
        displacement_len: 0,
    })
}

/// Places a measured run at `start` (an address, or an offset from a
/// [`LINE`]-aligned base): pads before its aligned instructions (a short
/// loop that would straddle two lines moves to the next line) and at its
/// end to [`CODE_ALIGN`]; fills in its paddings and length.
fn place(part: &mut Part, start: u64) {
    let mut paddings = Vec::with_capacity(part.aligned.len());
    let mut padding = 0u64;
    // (An empty plan shares its start with the next one; one at the end
    // shares the run's end, which is aligned anyway.)
    for a in part.aligned.iter().take_while(|a| a.at < part.layout.end) {
        let mut at = (start + a.at + padding).next_multiple_of(CODE_ALIGN);
        if let Some(loop_end) = a.loop_end {
            let len = loop_end - a.at;
            if len <= LINE && at / LINE != (at + len - 1) / LINE {
                at = at.next_multiple_of(LINE);
            }
        }
        padding = at - start - a.at;
        paddings.push((a.at, padding));
    }
    let end = (start + part.layout.end + padding).next_multiple_of(CODE_ALIGN);
    part.len = end - start;
    part.paddings = paddings;
}

/// A run's labels, split, sorted and checked by the worker that built it,
/// so that the emitting thread only adds where the run lands: the original
/// addresses' labels are placed as the run is ([`OriginalLabels::place`]),
/// and the fake labels, which only the run itself branches to, are looked
/// up in its own table ([`MeasuredLabels::fake_offset`]). Split, sorted and
/// indexed as each run was emitted, a run's labels took a fifth of the
/// emitting thread's work.
#[derive(Default)]
struct MeasuredLabels {
    /// The original addresses' labels, their offsets unpadded (from the
    /// run's start) until placed.
    originals: OriginalLabels,
    /// Per fake label of the run, indexed by its draw number less one:
    /// where it lies. A binary search of sorted pairs missed the CPU's
    /// caches at most of its steps.
    fakes: Vec<FakeLabel>,
}

/// Where run number `run`'s fake labels start: its first is one past.
fn fake_run_base(run: usize) -> u64 {
    FAKE_BASE + ((run as u64) << FAKE_RUN_BITS)
}

/// The draw number less one of `label`, a fake label of run number `run`
/// (its index in the run's table); `None` for any other address.
fn fake_draw(run: usize, label: u64) -> Option<usize> {
    let draw = label.checked_sub(fake_run_base(run) + 1)?;
    ((draw >> FAKE_RUN_BITS) == 0).then_some(draw as usize)
}

/// Where a fake label lies in its run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FakeLabel {
    /// Its unpadded offset ([`NOT_PLACED`] for one drawn and never placed).
    at: u32,
    /// How many of the run's aligned instructions lie at or before it: its
    /// padding is the last of theirs ([`place`]).
    aligned: u32,
}

impl FakeLabel {
    /// A label drawn and never placed.
    const NOT_PLACED: FakeLabel = FakeLabel {
        at: NOT_PLACED,
        aligned: 0,
    };
}

impl MeasuredLabels {
    /// Splits `labels`, `(unpadded offset, address label)` of every
    /// labelled instruction of run number `run` in the order of their
    /// offsets, whose aligned instructions are `aligned` (in order), the
    /// run having drawn `drawn` fake labels (the table is made at that
    /// size at once: grown label by label, it was resized for most). The
    /// original addresses are sorted in `sorted`, an empty list given back
    /// with the labels (where they do not come in their own order: a
    /// copy's body follows its original's instructions, and a sort of all a
    /// run's labels was a few percent of the encoding); the fake labels'
    /// table is made in `fakes`' buffer.
    ///
    /// Fails on an address carried by more than one instruction of the run
    /// (the lowest such address, an original one first): the first inserted
    /// instruction takes a load's address, the load itself a fake one.
    fn of(
        labels: &[(u64, u64)],
        aligned: &[Aligned],
        (run, drawn): (usize, usize),
        (mut sorted, mut fakes): (Vec<(u64, u64)>, Vec<FakeLabel>),
    ) -> (Result<Self, RelocateError>, Vec<(u64, u64)>) {
        debug_assert!(sorted.is_empty() && fakes.is_empty(), "spares come emptied");
        fakes.resize(drawn, FakeLabel::NOT_PLACED);
        let mut passed = 0;
        let mut twice: Option<u64> = None;
        for &(at, ip) in labels {
            if ip < FAKE_BASE {
                sorted.push((ip, at));
                continue;
            }
            while aligned.get(passed).is_some_and(|a| a.at <= at) {
                passed += 1;
            }
            let fake = fake_draw(run, ip)
                .and_then(|draw| fakes.get_mut(draw))
                .expect("a run's fake labels are drawn from its own range");
            if fake.at != NOT_PLACED {
                twice = Some(twice.map_or(ip, |t| t.min(ip)));
            }
            *fake = FakeLabel {
                at: offset32(at),
                aligned: passed as u32,
            };
        }
        // Addresses in strictly increasing order, as they mostly come, are
        // sorted and none is carried twice: one pass over them, not two.
        let mut twice_original = None;
        if !sorted.windows(2).all(|w| w[0].0 < w[1].0) {
            sorted.sort_unstable();
            let pair = sorted.windows(2).find(|w| w[0].0 == w[1].0);
            twice_original = pair.map(|w| w[0].0);
        }
        let measured = match twice_original.or(twice) {
            Some(ip) => Err(RelocateError::DuplicateAddress(ip)),
            None => Ok(MeasuredLabels {
                originals: OriginalLabels::new(&sorted),
                fakes,
            }),
        };
        (measured, sorted)
    }

    /// The offset from the start of `part` (run number `run`, placed) of
    /// the fake label `target`; `None` for one of another run or never
    /// placed.
    #[inline]
    fn fake_offset(&self, part: &Part, run: usize, target: u64) -> Option<u64> {
        let label = *self.fakes.get(fake_draw(run, target)?)?;
        if label.at == NOT_PLACED {
            return None;
        }
        let at = u64::from(label.at);
        if at >= part.layout.end {
            return Some(part.len);
        }
        let padding = label.aligned.checked_sub(1);
        let offset = at + padding.map_or(0, |k| part.paddings[k as usize].1);
        debug_assert_eq!(offset, part.offset(at));
        Some(offset)
    }
}

/// The original address labels of every run emitted, looked up where they
/// lie: merged into one table they were a second copy of all labels at the
/// rewriter's peak. An original address is looked up in the run whose
/// original addresses span it (runs are consecutive functions, which do
/// not overlap), among a few candidates there by its bucket
/// ([`OriginalLabels`]). The labels, one per original instruction and held
/// to the end, are 32-bit offsets from their run's lowest. (A fake label
/// is only branched to from its own run: [`MeasuredLabels::fake_offset`].)
#[derive(Default)]
struct RunLabels {
    /// Per run: its original address labels.
    runs: Vec<OriginalLabels>,
    /// `(lowest, highest original address label, run)`, sorted.
    originals: Vec<(u64, u64, usize)>,
    /// The runs' original address ranges are disjoint (else every run is
    /// searched).
    disjoint: bool,
}

/// A fake label drawn and never placed, in [`MeasuredLabels::fakes`].
const NOT_PLACED: u32 = u32::MAX;

/// One run's original address labels, with an index of where each
/// [`OriginalLabels::BUCKET_BITS`]-sized stretch of addresses starts in
/// them: a lookup searches only the few labels of its stretch.
#[derive(Default)]
struct OriginalLabels {
    /// Its lowest original address label.
    lowest: u64,
    /// `(offset from lowest, offset from the base)`, sorted (until placed,
    /// [`OriginalLabels::place`], the second is the unpadded offset in the
    /// run).
    labels: Vec<(u32, u32)>,
    /// Per stretch of addresses from `lowest`, the index of its first
    /// label; then the number of labels.
    buckets: Vec<u32>,
}

impl OriginalLabels {
    /// Stretches of 64 bytes of original code, a dozen instructions or so:
    /// the index takes 4 bytes per 64 bytes of the runs' original span.
    const BUCKET_BITS: u32 = 6;

    /// Indexes `labels`, `(address, offset from the base)` of original
    /// addresses sorted.
    fn new(labels: &[(u64, u64)]) -> Self {
        let lowest = labels.first().map_or(0, |&(ip, _)| ip);
        let labels: Vec<(u32, u32)> = labels
            .iter()
            .map(|&(ip, offset)| (offset32(ip - lowest), offset32(offset)))
            .collect();
        let stretches = labels
            .last()
            .map_or(0, |&(ip, _)| (ip >> Self::BUCKET_BITS) as usize + 1);
        let mut buckets = Vec::with_capacity(stretches + 1);
        for (i, &(ip, _)) in labels.iter().enumerate() {
            while buckets.len() <= (ip >> Self::BUCKET_BITS) as usize {
                buckets.push(i as u32);
            }
        }
        buckets.push(labels.len() as u32);
        OriginalLabels {
            lowest,
            labels,
            buckets,
        }
    }

    /// Places the labels of `part`, laid out at `start` (from the base):
    /// their unpadded offsets become offsets from the base. (The labels are
    /// in the order of their addresses, mostly that of their offsets too:
    /// the paddings are walked with them.)
    fn place(&mut self, part: &Part, start: u64) {
        let mut offsets = PaddedOffsets::new(part);
        for (_, offset) in &mut self.labels {
            *offset = offset32(start + offsets.of(u64::from(*offset)));
        }
    }

    /// The original addresses it labels.
    fn addresses(&self) -> impl Iterator<Item = u64> + '_ {
        (self.labels.iter()).map(|&(ip, _)| self.lowest + u64::from(ip))
    }

    /// The offset (from the base) of the instruction labelled `target`.
    fn find(&self, target: u64) -> Option<u64> {
        let key = u32::try_from(target.checked_sub(self.lowest)?).ok()?;
        let bucket = (key >> Self::BUCKET_BITS) as usize;
        let (&from, &to) = (self.buckets.get(bucket)?, self.buckets.get(bucket + 1)?);
        let labels = &self.labels[from as usize..to as usize];
        labels
            .binary_search_by_key(&key, |&(ip, _)| ip)
            .ok()
            .map(|i| u64::from(labels[i].1))
    }
}

impl RunLabels {
    /// Adds the original address labels of the next run, placed.
    fn push(&mut self, originals: OriginalLabels) {
        let run = self.runs.len();
        if let Some(&(highest, _)) = originals.labels.last() {
            let lowest = originals.lowest;
            let span = (lowest, lowest + u64::from(highest), run);
            let at = self.originals.partition_point(|o| *o < span);
            self.originals.insert(at, span);
        }
        self.runs.push(originals);
        self.disjoint = self.originals.windows(2).all(|w| w[0].1 < w[1].0);
    }

    /// The original address labels of run number `run` (the last pushed)
    /// where a label it holds is the one [`RunLabels::find`] gives: the
    /// runs' ranges are disjoint, so no other run spans its addresses.
    fn own_run(&self, run: usize) -> Option<&OriginalLabels> {
        self.disjoint.then(|| &self.runs[run])
    }

    /// Fails on an original address carried by instructions of two runs
    /// (only possible when the runs' ranges overlap).
    fn check_across_runs(&self) -> Result<(), RelocateError> {
        if self.disjoint {
            return Ok(());
        }
        let mut all: Vec<u64> = self
            .runs
            .iter()
            .flat_map(OriginalLabels::addresses)
            .collect();
        all.sort_unstable();
        match all.windows(2).find(|w| w[0] == w[1]) {
            Some(w) => Err(RelocateError::DuplicateAddress(w[0])),
            None => Ok(()),
        }
    }

    /// The offset (from the base) of the instruction labelled with the
    /// original address `target` (none for a fake label).
    fn find(&self, target: u64) -> Option<u64> {
        if target >= FAKE_BASE {
            return None;
        }
        if !self.disjoint {
            return self.runs.iter().find_map(|run| run.find(target));
        }
        let k = self.originals.partition_point(|&(lo, _, _)| lo <= target);
        let &(_, hi, run) = self.originals.get(k.checked_sub(1)?)?;
        (target <= hi)
            .then(|| self.runs[run].find(target))
            .flatten()
    }
}

/// A branch emitted before its target's run was laid out: written by
/// [`settle`] once every run is.
enum Fixup {
    /// The rel32 at `at` (offset in the code), of the instruction that ends
    /// at address `next`, goes to `target`'s new address.
    Rel32 { at: usize, next: u64, target: u64 },
    /// The branch at `at`, placed at its `ip` in `len` bytes, is encoded
    /// again with its target's new address.
    Reencode {
        at: usize,
        len: u8,
        insn: Box<Instruction>,
    },
}

impl Fixup {
    fn shift(&mut self, by: usize) {
        match self {
            Fixup::Rel32 { at, .. } | Fixup::Reencode { at, .. } => *at += by,
        }
    }

    /// Offsets of its first byte and past its last.
    fn span(&self) -> (usize, usize) {
        match *self {
            Fixup::Rel32 { at, .. } => (at, at + 4),
            Fixup::Reencode { at, len, .. } => (at, at + usize::from(len)),
        }
    }
}

/// [`settle`] on the code written to `out` at `offset`: read back a window
/// of at most `window_len` bytes at a time (the fixups are in code order,
/// so each window is read and written once).
fn settle_output(
    (out, offset): (&mut dyn Output, u64),
    window_len: usize,
    fixups: &[Fixup],
    resolve: impl Fn(u64) -> u64,
) -> Result<(), RelocateError> {
    let mut window = Vec::new();
    let mut rest = fixups;
    while let Some(first) = rest.first() {
        let from = first.span().0;
        let n = rest
            .iter()
            .take_while(|f| {
                let (at, end) = f.span();
                at >= from && end <= from + window_len
            })
            .count();
        let (group, tail) = rest.split_at(n);
        rest = tail;
        let end = group.iter().map(|f| f.span().1).max().unwrap_or(from);
        window.clear();
        window.resize(end - from, 0);
        out.read_at(offset + from as u64, &mut window);
        settle(&mut window, from, group, &resolve)?;
        out.write_at(offset + from as u64, &window);
    }
    Ok(())
}

/// Writes the branches left to `fixups`, each to its target's address
/// (`resolve`: the new one of a label, else the target itself), into
/// `code`, the code from offset `from` on.
fn settle(
    code: &mut [u8],
    from: usize,
    fixups: &[Fixup],
    resolve: impl Fn(u64) -> u64,
) -> Result<(), RelocateError> {
    let mut encoder = Encoder::new(64);
    for fixup in fixups {
        match fixup {
            &Fixup::Rel32 { at, next, target } => {
                let at = at - from;
                write_rel32(&mut code[..at + 4], 4, next, resolve(target))?;
            }
            Fixup::Reencode { at, len, insn } => {
                let mut insn = **insn;
                insn.set_near_branch64(resolve(insn.near_branch_target()));
                let size = encoder
                    .encode(&insn, insn.ip())
                    .map_err(|e| fail(&insn, e))?;
                if size != usize::from(*len) {
                    return Err(RelocateError::RipRelativeSize(insn.code()));
                }
                let mut bytes = Vec::with_capacity(size);
                drain_into(&mut encoder, &mut bytes);
                let at = *at - from;
                code[at..at + size].copy_from_slice(&bytes);
            }
        }
    }
    Ok(())
}

/// Encodes a measured run at `start`: branch targets that are labels
/// (`resolve`) go to their new address, every RIP-relative operand keeps
/// its absolute address; the bytes are appended to `code` (emptied), at
/// most `measured` of them, the run's measured length. Branches to targets
/// `resolve` does not know yet (a later run's labels, or no label: the
/// absolute address) are returned as fixups, `at` an offset in `code`.
///
/// `pool` is the layout's pool, whose displacements are written in place:
/// the pieces between two paddings whose bytes are all in the pool are
/// then copied as one stretch (a copy per piece, most of them a few
/// bytes, was a sixth of the emitting thread's work).
fn emit(
    part: &Part,
    pool: &mut [u8],
    start: u64,
    resolve: &impl Fn(u64) -> Option<u64>,
    (code, measured): (&mut Vec<u8>, usize),
) -> Result<Vec<Fixup>, RelocateError> {
    let mut fixups = Vec::new();
    let mut encoder = Encoder::new(64);
    code.clear();
    code.reserve(measured);
    let slot_len = measured;
    let code = &mut SlotCode {
        code,
        measured,
        len: 0,
    };
    let layout = &part.layout;
    let mut targets = layout.targets.iter();
    let mut target = || *targets.next().expect("one target per piece with one");
    let mut paddings = part.paddings.as_slice();
    let mut padding = 0;
    // The next padding's unpadded offset, compared alone at each piece.
    let next_padded = |paddings: &[(u64, u64)]| paddings.first().map_or(u64::MAX, |p| p.0);
    let mut padded_from = next_padded(paddings);
    // Unpadded offset of the piece, and of its bytes in the pool; the
    // pool's bytes from `copied` to `in_pool` follow the code as they are.
    let mut at = 0u64;
    let mut in_pool = 0usize;
    let mut copied = 0usize;
    for piece in &layout.pieces {
        if at >= padded_from {
            while let [(from, to), rest @ ..] = paddings
                && *from <= at
            {
                padding = *to;
                paddings = rest;
            }
            padded_from = next_padded(paddings);
            code.extend_from_slice(&pool[copied..in_pool]);
            copied = in_pool;
            code.pad_to(at + padding);
        }
        // Where the piece lands, as an address and in the code, and
        // whether it fits the slot (past it, nothing is written: the length
        // is what is reported); worked out only by the pieces that need
        // them, not by the fixed ones, most of a run's.
        let here = || start + at + padding;
        let offset = || code.len + (in_pool - copied);
        let fits = |size: usize| offset() + size <= slot_len;
        let (size, from_pool) = match *piece {
            Piece::Fixed(size) => (size as usize, size as usize),
            Piece::Near(size) => {
                let size = usize::from(size);
                let (next, target) = (here() + size as u64, target());
                match resolve(target) {
                    Some(resolved) if fits(size) => {
                        write_rel32(&mut pool[..in_pool + size], 4, next, resolved)?;
                    }
                    Some(_) => {}
                    None => fixups.push(Fixup::Rel32 {
                        at: offset() + size - 4,
                        next,
                        target,
                    }),
                }
                (size, size)
            }
            Piece::RipRelative(size, displacement) => {
                let size = usize::from(size);
                let (next, target) = (here() + size as u64, target());
                if fits(size) {
                    let from_end = size - usize::from(displacement);
                    write_rel32(&mut pool[..in_pool + size], from_end, next, target)?;
                }
                (size, size)
            }
            Piece::Short(size) => {
                // The pool holds all but its rel32.
                let size = usize::from(size) + 2 + 5;
                code.extend_from_slice(&pool[copied..in_pool + size - 4]);
                copied = in_pool + size - 4;
                code.extend_from_slice(&[0; 4]);
                let next = here() + size as u64;
                branch_rel32(code, next, target(), resolve, &mut fixups)?;
                (size, size - 4)
            }
            Piece::Reencode(k, size) => {
                let here = here();
                code.extend_from_slice(&pool[copied..in_pool]);
                copied = in_pool;
                let mut insn = layout.placed[k as usize];
                let mut later = None;
                if is_relative_branch(&insn) {
                    insn.as_near_branch();
                    if insn.code() == Code::Xbegin_rel16 {
                        insn.set_code(Code::Xbegin_rel32);
                    }
                    match resolve(insn.near_branch_target()) {
                        Some(resolved) => insn.set_near_branch64(resolved),
                        None => {
                            // Its form fixes its size: encoded here as a
                            // branch to itself, again once the target is known.
                            let mut kept = insn;
                            kept.set_ip(here);
                            later = Some(Box::new(kept));
                            insn.set_near_branch64(here);
                        }
                    }
                }
                let written = encoder.encode(&insn, here).map_err(|e| fail(&insn, e))?;
                if written != usize::from(size) {
                    return Err(RelocateError::RipRelativeSize(insn.code()));
                }
                if let Some(insn) = later {
                    fixups.push(Fixup::Reencode {
                        at: code.len,
                        len: size,
                        insn,
                    });
                }
                code.drain_from(&mut encoder);
                (usize::from(size), 0)
            }
        };
        in_pool += from_pool;
        at += size as u64;
    }
    code.extend_from_slice(&pool[copied..in_pool]);
    code.pad_to(part.len);
    if code.len != measured {
        return Err(RelocateError::LengthChanged {
            encoded: code.len as u64,
            measured: measured as u64,
        });
    }
    Ok(fixups)
}

/// A run's code appended to a buffer with room for its measured length
/// (not zero-filled first: every byte is written once). Bytes that would
/// run past the measured length are counted, not written: [`emit`]
/// reports the length it encoded.
struct SlotCode<'c> {
    code: &'c mut Vec<u8>,
    /// The run's measured length.
    measured: usize,
    /// Bytes encoded so far (`code`'s length while within `measured`).
    len: usize,
}

impl SlotCode<'_> {
    /// Appends `bytes`.
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if end <= self.measured {
            self.code.extend_from_slice(bytes);
        }
        self.len = end;
    }

    /// Appends `nop`s up to `len` bytes.
    fn pad_to(&mut self, len: u64) {
        while (self.len as u64) < len {
            let gap = (len - self.len as u64).min(NOPS.len() as u64) as usize;
            self.extend_from_slice(NOPS[gap - 1]);
        }
    }

    /// Moves the encoder's output here, keeping its buffer's allocation.
    fn drain_from(&mut self, encoder: &mut Encoder) {
        let mut buffer = encoder.take_buffer();
        self.extend_from_slice(&buffer);
        buffer.clear();
        encoder.set_buffer(buffer);
    }

    /// [`write_rel32`] on the code so far (nothing once past the measured
    /// length).
    fn write_rel32(
        &mut self,
        from_end: usize,
        next: u64,
        target: u64,
    ) -> Result<(), RelocateError> {
        if self.len > self.measured {
            return Ok(());
        }
        write_rel32(self.code, from_end, next, target)
    }
}

/// Writes the rel32 that ends `code` (its instruction ends at `next`) to
/// `target`'s new address, or leaves it to a fixup while that is unknown.
fn branch_rel32(
    code: &mut SlotCode<'_>,
    next: u64,
    target: u64,
    resolve: &impl Fn(u64) -> Option<u64>,
    fixups: &mut Vec<Fixup>,
) -> Result<(), RelocateError> {
    match resolve(target) {
        Some(resolved) => code.write_rel32(4, next, resolved),
        None => {
            fixups.push(Fixup::Rel32 {
                at: code.len - 4,
                next,
                target,
            });
            Ok(())
        }
    }
}

/// Writes the displacement from `next` (the address after the instruction)
/// to `target` over the 4 bytes that start `from_end` bytes before the end
/// of `code`.
fn write_rel32(
    code: &mut [u8],
    from_end: usize,
    next: u64,
    target: u64,
) -> Result<(), RelocateError> {
    let rel = i32::try_from(target.wrapping_sub(next) as i64)
        .map_err(|_| RelocateError::OutOfReach { target })?;
    let at = code.len() - from_end;
    code[at..at + 4].copy_from_slice(&rel.to_le_bytes());
    Ok(())
}

/// The error for an instruction the encoder refuses.
fn fail(insn: &Instruction, error: IcedError) -> RelocateError {
    RelocateError::Encode {
        code: insn.code(),
        ip: insn.ip(),
        error,
    }
}

/// Moves the encoder's output to `out`, keeping its buffer's allocation.
fn drain_into(encoder: &mut Encoder, out: &mut Vec<u8>) {
    let mut buffer = encoder.take_buffer();
    out.extend_from_slice(&buffer);
    buffer.clear();
    encoder.set_buffer(buffer);
}

/// Drops the encoder's output (a size probe).
fn discard(encoder: &mut Encoder) {
    let mut buffer = encoder.take_buffer();
    buffer.clear();
    encoder.set_buffer(buffer);
}

/// Whether `insn` has a relative branch target (near `jmp`/`jcc`/`call`,
/// `jrcxz`/`loop`, `xbegin`).
fn is_relative_branch(insn: &Instruction) -> bool {
    matches!(
        insn.op0_kind(),
        OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16
    )
}

/// Appends the counting fragment of a superblock at `label`: its
/// instructions from the check on, with a counting probe before each of its
/// loads, ending with a jump back into the copy (before a final call, which
/// stays in the copy so that return addresses keep their unwind
/// information). Its branches go straight into the copy: a side exit taken
/// here skips loads that were never counted. A final indirect jump that is
/// an escape site gets an escape check of its own, counting into the same
/// site as the copy's. `in_register_loop`: the superblock lies in an
/// innermost loop that keeps its countdown in a register, whose loads'
/// slow stubs append inline.
fn counting_fragment(
    plan: &CopyPlan<'_>,
    block: &Superblock,
    (label, in_register_loop): (u64, bool),
    entries: &Entries,
    next_fake: &mut dyn FnMut() -> u64,
    (out, checks): (&mut ProbeCode, &mut Vec<CheckAt>),
    stubs: &mut ProbeCode,
) {
    let (code, spatial) = (&*plan.code, &plan.spatial);
    let mut first = label;
    let mut loads = block.loads.iter().peekable();
    for i in block.at..=block.last {
        let original = code.instructions[i];
        if i == block.last
            && matches!(
                original.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            )
        {
            let mut back = probe::branch(Code::Jmp_rel32_64, original.ip());
            back.set_ip(first);
            out.insns.push(back);
            return;
        }
        let mut insn = original;
        insn.set_ip(0);
        let at = plan.inserts.partition_point(|&(index, _)| index < i);
        let string = match plan.inserts.get(at) {
            Some(&(index, Insert::String { id, second })) if index == i => {
                Some([id, second.unwrap_or(id)])
            }
            _ => None,
        };
        if let Some(ids) = string {
            // Its probe runs wherever the instruction does.
            let stub = next_fake();
            let resume = next_fake();
            out.insns.push(jump_with_label(stub, first));
            insn.set_ip(resume);
            let record = entries.record;
            probe::string_stub(
                &insn,
                ids,
                stub,
                resume,
                record,
                next_fake,
                &mut stubs.insns,
            );
        } else if let Some(&(_, id, fast)) = loads.next_if(|&&(index, _, _)| index == i) {
            let slow = next_fake();
            let resume = next_fake();
            probe::soft_fast_path_code(fast, first, slow, out);
            insn.set_ip(resume);
            let record = match spatial.get(&i) {
                Some(&(_, check)) => {
                    let stub = next_fake();
                    let at = out.insns.len();
                    let form = (entries.spatial_hash, entries.spatial_rorx);
                    let hash = probe::spatial_check_code(&insn, check, (0, stub), form, out);
                    checks.push(CheckAt::appended(out, at, hash, check.pushed() > 0));
                    probe::spatial_stub_code(
                        &insn,
                        id,
                        check,
                        (stub, resume),
                        entries.spatial_entry(),
                        stubs,
                    );
                    entries.slow_path(true)
                }
                None => entries.slow_path(false),
            };
            let inline = in_register_loop.then(&mut *next_fake);
            let labels = (slow, resume);
            probe::soft_slow_stub_code(fast, &insn, id, labels, record, inline, stubs);
        } else if first != 0 {
            insn.set_ip(first);
        }
        first = 0;
        redirect(plan.redirects.get(&i).copied(), &mut insn, &mut out.insns);
        let hooked = hook_got_call(entries, &mut insn);
        // The block's final indirect jump runs here whenever the check
        // sends the block to this fragment (every time in a full trace):
        // it needs the copy's escape check as much as the copy's own jump.
        let site = plan
            .escapes
            .binary_search_by_key(&i, |&(index, _)| index)
            .ok()
            .map(|at| plan.escapes[at].1)
            .filter(|_| !hooked);
        push_checked(
            insn,
            site,
            entries,
            next_fake,
            &mut out.insns,
            &mut stubs.insns,
        )
        .expect("a jump to an escape check encodes");
    }
    let last = &code.instructions[block.last];
    if !matches!(
        last.flow_control(),
        FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
    ) {
        let next = last.next_ip();
        out.insns.push(probe::branch(Code::Jmp_rel32_64, next));
    }
}

/// `jmp rel32 target` carrying the label `ip` (0: none).
fn jump_with_label(target: u64, ip: u64) -> Instruction {
    let mut jump = probe::branch(Code::Jmp_rel32_64, target);
    jump.set_ip(ip);
    jump
}

/// Applies `redirect`, the table redirect of `insn`, the copy about to be
/// appended to `out`: a new displacement for the entry load (its probe and
/// spatial check, emitted before, keep the original address), or a `lea`
/// adding the table base before the jump, taking over the jump's label.
fn redirect(redirect: Option<TableRedirect>, insn: &mut Instruction, out: &mut Vec<Instruction>) {
    match redirect {
        Some(TableRedirect::Displacement(displacement)) => {
            if insn.memory_base() != Register::None {
                // disp8 if it fits, else the address size.
                insn.set_memory_displ_size(1);
            }
            insn.set_memory_displacement64(displacement);
        }
        Some(TableRedirect::AddBase { target, base }) => {
            let operand = iced_x86::MemoryOperand::with_base_index(target, base);
            let mut add = Instruction::with2(Code::Lea_r64_m, target, operand).expect("valid lea");
            add.set_ip(insn.ip());
            insn.set_ip(0);
            out.push(add);
        }
        None => {}
    }
}

/// Turns `insn`, a `call`/`jmp qword [rip → slot]` of a hooked import's
/// GOT slot, into a direct `call`/`jmp` of the slot's stub (same label);
/// whether it did.
fn hook_got_call(entries: &Entries, insn: &mut Instruction) -> bool {
    let code = match insn.code() {
        Code::Call_rm64 => Code::Call_rel32_64,
        Code::Jmp_rm64 => Code::Jmp_rel32_64,
        _ => return false,
    };
    if insn.memory_base() != Register::RIP {
        return false;
    }
    let Some(&stub) = entries.got_hooks.get(&insn.memory_displacement64()) else {
        return false;
    };
    let mut direct = Instruction::with_branch(code, stub).expect("valid branch");
    direct.set_ip(insn.ip());
    *insn = direct;
    true
}

/// Why a function's code cannot be copied faithfully, if it cannot.
pub(crate) fn unrelocatable(code: &FunctionCode) -> Option<String> {
    if code.instructions.is_empty() {
        return Some("no instructions".into());
    }
    if code.invalid_instructions > 0 {
        return Some("bytes that do not decode as instructions".into());
    }
    for insn in &code.instructions {
        let next = insn.next_ip();
        if matches!(insn.code(), Code::Call_rel32_64) && insn.near_branch_target() == next {
            return Some(format!(
                "call to the next instruction at {:#x} (reads its own address)",
                insn.ip()
            ));
        }
        if insn.is_ip_rel_memory_operand() && insn.memory_base() == Register::EIP {
            return Some(format!("32-bit EIP-relative operand at {:#x}", insn.ip()));
        }
        if matches!(
            insn.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::FarBranch16 | OpKind::FarBranch32
        ) {
            return Some(format!("unusual branch at {:#x}", insn.ip()));
        }
        if insn.is_jcc_short_or_near() || insn.is_jmp_short_or_near() || insn.is_call_near() {
            let target = insn.near_branch_target();
            if target >= code.start && target < code.end && code.instruction_at(target).is_none() {
                return Some(format!(
                    "branch at {:#x} into the middle of an instruction ({target:#x})",
                    insn.ip()
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::Binary;
    use foldhash::HashMapExt;

    /// `map_near` answers as `map` for every address around a copy's
    /// instructions, asked in increasing, decreasing and scattered order
    /// with one hint, and from a hint past the end.
    #[test]
    fn map_near_is_map_in_any_order() {
        // Instructions of 1 to 7 bytes, 40 of them.
        let mut original = Vec::new();
        let mut at = 0u32;
        for k in 0..40u32 {
            original.push(at);
            at += 1 + (k * 5) % 7;
        }
        let map = CopyMap {
            original_start: 0x1000,
            original_end: 0x1000 + u64::from(at),
            start: 0x9000,
            body_end: 0x9000 + 4 * u64::from(at),
            end: 0x9000 + 5 * u64::from(at),
            addresses: original.iter().map(|&o| 3 * o + 2).collect(),
            original,
        };
        let addresses: Vec<u64> = (0x1000 - 3..map.original_end + 3).collect();
        let scattered: Vec<u64> = (0..addresses.len())
            .map(|k| addresses[(k * 37) % addresses.len()])
            .collect();
        let orders = [
            addresses.clone(),
            addresses.iter().rev().copied().collect(),
            scattered,
        ];
        for order in &orders {
            let near = std::cell::Cell::new(0);
            for &addr in order {
                assert_eq!(map.map_near(addr, &near), map.map(addr), "{addr:#x}");
            }
        }
        let near = std::cell::Cell::new(usize::MAX);
        for &addr in &addresses {
            assert_eq!(map.map_near(addr, &near), map.map(addr), "{addr:#x}");
        }
    }

    /// A run's own labels, where `own_run` gives them, find what
    /// `RunLabels::find` does for every address around the run; runs whose
    /// ranges overlap give none.
    #[test]
    fn own_run_labels_are_find_for_their_addresses() {
        let run_of = |from: u64, step: u64| {
            let labels: Vec<(u64, u64)> = (0..50).map(|k| (from + k * step, 7 * k)).collect();
            OriginalLabels::new(&labels)
        };
        let mut labels = RunLabels::default();
        labels.push(run_of(0x3000, 3));
        labels.push(run_of(0x1000, 5));
        for (run, from) in [(0, 0x3000), (1, 0x1000)] {
            let own = labels.own_run(run).expect("disjoint runs");
            for target in from - 4..from + 300 {
                if let Some(offset) = own.find(target) {
                    assert_eq!(Some(offset), labels.find(target), "{target:#x}");
                }
            }
        }
        labels.push(run_of(0x1010, 4));
        assert!(labels.own_run(2).is_none(), "overlapping runs");
    }

    /// `mark_loop_ends` gives each loop head after the first the last
    /// relative branch to its address when that branch follows it, over
    /// pseudo-random bodies of branches and other instructions whose
    /// addresses repeat (two heads may share one), with heads that came
    /// marked.
    #[test]
    fn mark_loop_ends_finds_the_last_branch_back() {
        let mut state = 0x5eed_1005;
        let mut heads = Vec::new();
        for _ in 0..500 {
            let len = 1 + crate::binary::xorshift64(&mut state) as usize % 60;
            let ip = |state: &mut u64| 0x1000 + crate::binary::xorshift64(state) % 8;
            let all: Vec<Instruction> = (0..len)
                .map(|_| {
                    let mut insn = if crate::binary::xorshift64(&mut state).is_multiple_of(3) {
                        Instruction::with_branch(Code::Jne_rel32_64, ip(&mut state)).unwrap()
                    } else {
                        Instruction::with(Code::Nopd)
                    };
                    insn.set_ip(ip(&mut state));
                    insn
                })
                .collect();
            let mut aligned = vec![(0, None)];
            for i in 1..len {
                if crate::binary::xorshift64(&mut state).is_multiple_of(4) {
                    aligned.push((i, Some(usize::MAX)));
                }
            }
            let expected: Vec<(usize, Option<usize>)> = (aligned.iter().enumerate())
                .map(|(h, &(i, marked))| {
                    let last = (all.iter().enumerate())
                        .rev()
                        .find(|(_, b)| {
                            is_relative_branch(b) && b.near_branch_target() == all[i].ip()
                        })
                        .map(|(j, _)| j);
                    let back = last.filter(|&j| j > i);
                    (i, if h == 0 { marked } else { back })
                })
                .collect();
            heads.clear();
            mark_loop_ends(&all, &mut aligned, &mut heads);
            assert_eq!(aligned, expected, "{all:?}");
        }
    }

    /// Copies of this test executable's functions, with a probe before
    /// every supported memory operand and branches between functions.
    fn plans_of(codes: &[FunctionCode]) -> Vec<CopyPlan<'_>> {
        codes
            .iter()
            .map(|code| CopyPlan {
                code: Cow::Borrowed(code),
                inserts: code
                    .instructions
                    .iter()
                    .enumerate()
                    .filter(|(_, i)| {
                        i.op_count() > 0
                            && (0..i.op_count()).any(|k| i.op_kind(k) == OpKind::Memory)
                            && !i.is_ip_rel_memory_operand()
                            && probe::unsupported_operand(i).is_none()
                    })
                    .enumerate()
                    .map(|(n, (index, _))| {
                        let fast = if n % 2 == 0 {
                            FastPath::FlagsDead
                        } else {
                            FastPath::Stack
                        };
                        (index, Insert::Soft { id: n as u32, fast })
                    })
                    .collect(),
                spatial: HashMap::new(),
                superblocks: Vec::new(),
                register_loops: Vec::new(),
                prologue_call: None,
                redirects: HashMap::new(),
                escapes: Vec::new(),
            })
            .collect()
    }

    /// The copies of `plans` cut into `runs`, and their code.
    fn encoded(
        plans: &mut [CopyPlan<'_>],
        runs: &[std::ops::Range<usize>],
        base: u64,
        entries: &Entries,
    ) -> (Copies, Vec<u8>) {
        let mut code = Vec::new();
        let copies = encode_in_runs(plans, runs, base, entries, (&mut code, 0)).unwrap();
        (copies, code)
    }

    fn entries() -> Entries {
        Entries {
            record: 0x6fff_0000,
            record_tracked: 0x6fff_0100,
            probe_append: [0x6fff_0400, 0x6fff_0500],
            spatial: 0x6fff_0200,
            spatial_append: 0x6fff_0300,
            spatial_hash: probe::SpatialHash::default_rate(),
            spatial_rorx: false,
            escape: None,
            got_hooks: HashMap::new(),
        }
    }

    /// The relocatable functions among the first `limit` of this test
    /// executable.
    fn codes_of_this_executable(limit: usize) -> Vec<FunctionCode> {
        let binary = Binary::open(std::env::current_exe().unwrap()).unwrap();
        binary
            .functions()
            .iter()
            .take(limit)
            .map(|f| binary.function_code(f))
            .filter(|code| unrelocatable(code).is_none())
            .collect()
    }

    #[test]
    fn compiler_aligned_code_stays_aligned_and_short_loops_keep_one_line() {
        let codes = codes_of_this_executable(400);
        let mut plans = plans_of(&codes);
        let copies = encode(&mut plans, 0x7000_0000, &entries(), (&mut Vec::new(), 0)).unwrap();
        let (mut heads, mut short_loops) = (0, 0);
        for (map, code) in copies.maps.iter().zip(&codes) {
            assert_eq!(map.start % CODE_ALIGN, 0, "function {:#x}", code.start);
            let insns = &code.instructions;
            for i in 1..insns.len() {
                let ip = insns[i].ip();
                if !follows_alignment_padding(ip, &insns[i - 1]) {
                    continue;
                }
                heads += 1;
                let at = map.address(i);
                assert_eq!(at % CODE_ALIGN, 0, "{ip:#x} copied to {at:#x}");
                let last_branch_back = (i..insns.len()).rev().find(|&j| {
                    is_relative_branch(&insns[j]) && insns[j].near_branch_target() == ip
                });
                if let Some(j) = last_branch_back {
                    let end = if j + 1 < map.addresses.len() {
                        map.address(j + 1)
                    } else {
                        map.body_end
                    };
                    if end - at <= LINE {
                        short_loops += 1;
                        assert_eq!(
                            at / LINE,
                            (end - 1) / LINE,
                            "loop {ip:#x} at {at:#x}..{end:#x}"
                        );
                    }
                }
            }
        }
        assert!(
            heads > 10 && short_loops > 0,
            "{heads} aligned, {short_loops} short loops"
        );
    }

    #[test]
    fn runs_encoded_apart_give_the_bytes_of_one_pass() {
        let codes = codes_of_this_executable(400);
        assert!(codes.len() > 100, "only {} functions", codes.len());
        let mut plans = plans_of(&codes);
        let base = 0x7000_0000;
        let record = entries();
        let one_run = std::iter::once(0..plans.len()).collect::<Vec<_>>();
        let (whole, whole_code) = encoded(&mut plans, &one_run, base, &record);
        let n = plans.len();
        let cut = [0..1, 1..n / 3, n / 3..n / 3, n / 3..n - 1, n - 1..n];
        let (apart, apart_code) = encoded(&mut plans, &cut, base, &record);
        assert!(whole_code == apart_code, "the bytes differ");
        // The runs are built ahead by the pool's workers, as many as it
        // has: on a pool of one, called from its thread, the caller builds
        // every run itself; the same bytes whoever builds which run, with
        // runs many times the window.
        let small_runs: Vec<_> = (0..n).step_by(7).map(|i| i..(i + 7).min(n)).collect();
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for runs in [&cut[..], &small_runs] {
                let (ahead, ahead_code) = pool.install(|| encoded(&mut plans, runs, base, &record));
                assert!(
                    whole_code == ahead_code,
                    "{threads} threads, {} runs: the bytes differ",
                    runs.len()
                );
                assert_eq!(whole.maps.len(), ahead.maps.len());
            }
        }
        assert_eq!(whole.len, whole_code.len() as u64);
        assert_eq!(whole.maps.len(), apart.maps.len());
        for (a, b) in whole.maps.iter().zip(&apart.maps) {
            assert_eq!(
                (a.start, a.body_end, a.end, &a.addresses),
                (b.start, b.body_end, b.end, &b.addresses)
            );
        }
        assert_eq!(whole.ptwrites, apart.ptwrites);
        // A branch into another run's function lands in its copy.
        let calls_into_copies = apart
            .maps
            .iter()
            .zip(&plans)
            .flat_map(|(map, plan)| {
                plan.code
                    .instructions
                    .iter()
                    .filter(|i| i.is_call_near())
                    .filter_map(|i| map.map(i.ip()))
            })
            .count();
        assert!(calls_into_copies > 0);
    }

    /// Branches and RIP-relative operands are kept as bytes and a target;
    /// decoding what is emitted gives the targets they must have where the
    /// run lands (labels moved, other addresses kept), whatever follows the
    /// displacement.
    #[test]
    fn given_codes_are_freed_once_emitted_and_encode_as_lent_ones() {
        let codes = codes_of_this_executable(400);
        let base = 0x7000_0000;
        let mut lent = plans_of(&codes);
        let mut given = plans_of(&codes);
        for plan in &mut given {
            plan.code = Cow::Owned(plan.code.clone().into_owned());
        }
        let runs = [0..codes.len() / 2, codes.len() / 2..codes.len()];
        let (from_lent, lent_code) = encoded(&mut lent, &runs, base, &entries());
        let (from_given, given_code) = encoded(&mut given, &runs, base, &entries());
        assert!(lent_code == given_code, "the bytes differ");
        for (a, b) in from_lent.maps.iter().zip(&from_given.maps) {
            assert_eq!(
                (a.start, a.end, &a.addresses),
                (b.start, b.end, &b.addresses)
            );
            assert_eq!(a.original, b.original);
        }
        assert!(lent.iter().all(|p| !p.code.instructions.is_empty()));
        assert!(given.iter().all(|p| p.code.instructions.is_empty()));
    }

    #[test]
    fn displacements_written_where_a_run_lands_reach_their_targets() {
        use iced_x86::{Decoder, DecoderOptions, MemoryOperand};
        let (far, data) = (0x40_1000u64, 0x60_2000u64);
        let labelled = |mut insn: Instruction, ip: u64| {
            insn.set_ip(ip);
            insn
        };
        let all = [
            labelled(
                Instruction::with_branch(Code::Jrcxz_rel8_64, 0x10_0003).unwrap(),
                0x10_0000,
            ),
            Instruction::with2(
                Code::Mov_rm32_imm32,
                MemoryOperand::with_base_displ(Register::RIP, data as i64),
                0x1234_5678u32,
            )
            .unwrap(),
            labelled(
                Instruction::with2(Code::Add_r64_rm64, Register::RAX, Register::RBX).unwrap(),
                0x10_0003,
            ),
            Instruction::with_branch(Code::Jne_rel8_64, 0x10_0000).unwrap(),
            Instruction::with_branch(Code::Call_rel32_64, far).unwrap(),
            Instruction::with2(
                Code::Lea_r64_m,
                Register::RCX,
                MemoryOperand::with_base_displ(Register::RIP, data as i64 + 8),
            )
            .unwrap(),
            Instruction::with_branch(Code::Jmp_rel8_64, 0x10_0003).unwrap(),
        ];
        let start = 0x50_0000u64;
        let mut layout = Layout::default();
        let mut unpadded = Vec::new();
        layout
            .measure(
                &mut LayoutEncoder::new(),
                &[&ProbeCode::of(all.to_vec())],
                &[],
                start,
                &mut unpadded,
            )
            .unwrap();
        let mut part = part_of(layout, Vec::new());
        let measured = std::mem::take(&mut part.layout.labels);
        let lists = (Vec::new(), Vec::new());
        let mut labels = MeasuredLabels::of(&measured, &part.aligned, (0, 0), lists)
            .0
            .unwrap();
        place(&mut part, start);
        labels.originals.place(&part, start);
        let resolve = |target: u64| {
            (labels.originals.find(target))
                .or_else(|| labels.fake_offset(&part, 0, target).map(|o| start + o))
        };
        // A slot of another length than measured is an error naming both,
        // whether the code would run past it or fall short of it.
        for measured in [part.len - 1, part.len + 1] {
            let mut slot = Vec::new();
            let mut pool = part.layout.pool.clone();
            match emit(
                &part,
                &mut pool,
                start,
                &resolve,
                (&mut slot, measured as usize),
            ) {
                Err(RelocateError::LengthChanged {
                    encoded,
                    measured: m,
                }) => assert_eq!((encoded, m), (part.len, measured)),
                other => panic!("{measured}-byte slot: {:?}", other.map(|f| f.len())),
            }
        }
        let mut code = Vec::new();
        let mut pool = part.layout.pool.clone();
        let fixups = emit(
            &part,
            &mut pool,
            start,
            &resolve,
            (&mut code, part.len as usize),
        )
        .unwrap();
        assert_eq!(fixups.len(), 1, "the call to an address without a label");
        settle(&mut code, 0, &fixups, |target| {
            resolve(target).unwrap_or(target)
        })
        .unwrap();
        let at = |i: usize| start + unpadded[i];
        let mut decoder = Decoder::with_ip(
            64,
            &code[..unpadded[all.len()] as usize],
            start,
            DecoderOptions::NONE,
        );
        let decoded: Vec<Instruction> = decoder.iter().collect();
        let described: Vec<(Mnemonic, u64)> = decoded
            .iter()
            .map(|i| {
                let target = if is_relative_branch(i) {
                    i.near_branch_target()
                } else if i.is_ip_rel_memory_operand() {
                    i.ip_rel_memory_address()
                } else {
                    0
                };
                (i.mnemonic(), target)
            })
            .collect();
        let jrcxz = at(0);
        assert_eq!(
            described,
            [
                (Mnemonic::Jrcxz, jrcxz + 4),
                (Mnemonic::Jmp, jrcxz + 9),
                (Mnemonic::Jmp, at(2)),
                (Mnemonic::Mov, data),
                (Mnemonic::Add, 0),
                (Mnemonic::Jne, at(0)),
                (Mnemonic::Call, far),
                (Mnemonic::Lea, data + 8),
                (Mnemonic::Jmp, at(2)),
            ]
        );
        assert_eq!(decoded[3].immediate32(), 0x1234_5678);
    }

    /// Branches written a window at a time into code already written out
    /// get the bytes written into the whole code at once.
    #[test]
    fn branches_settled_in_windows_match_those_settled_at_once() {
        let code: Vec<u8> = (0..64u8).collect();
        let fixups: Vec<Fixup> = [3usize, 9, 14, 30, 34, 60]
            .iter()
            .map(|&at| Fixup::Rel32 {
                at,
                next: 0x1000 + at as u64 + 4,
                target: 0x2000 + at as u64 * 3,
            })
            .collect();
        let resolve = |target: u64| target + 0x10;
        let mut whole = code.clone();
        settle(&mut whole, 0, &fixups, resolve).unwrap();
        assert_ne!(whole, code);
        for window_len in [4, 8, 13, 64] {
            let mut out = vec![0xccu8; 5];
            out.extend_from_slice(&code);
            settle_output((&mut out, 5), window_len, &fixups, resolve).unwrap();
            assert_eq!(&out[5..], &whole[..], "windows of {window_len} bytes");
            assert_eq!(&out[..5], &[0xcc; 5]);
        }
    }

    #[test]
    fn cached_encodings_are_the_encoders() {
        let codes = codes_of_this_executable(400);
        let mut cached = LayoutEncoder::new();
        let mut encoder = Encoder::new(64);
        let (mut from_cache, mut fresh) = (Vec::new(), Vec::new());
        // Twice, so that the second pass is mostly hits, each instruction
        // also at another address.
        for shift in [0, 0x1234_5678] {
            for insn in codes.iter().flat_map(|c| &c.instructions) {
                if is_relative_branch(insn) || insn.is_ip_rel_memory_operand() {
                    continue;
                }
                let mut insn = *insn;
                insn.set_ip(insn.ip() + shift);
                let size = cached.position_independent(&insn, &mut from_cache).unwrap();
                let expected = encoder.encode(&insn, 0).unwrap();
                assert_eq!(size as usize, expected, "{insn}");
                drain_into(&mut encoder, &mut fresh);
                assert_eq!(from_cache, fresh, "{insn}");
            }
        }
        assert!(!fresh.is_empty());
    }

    /// Targets around an instruction at `ip` (the end of every size lies
    /// among them) and around rel32's furthest reach each way.
    fn rel32_edge_targets(ip: u64) -> Vec<u64> {
        let near = (-20i64..=20).map(|d| ip.wrapping_add_signed(d));
        let forward = (0..40).map(|d| ip.wrapping_add(0x7fff_ffe8 + d));
        let back = (0..40).map(|d| ip.wrapping_sub(0x8000_0000 - 20 + d));
        near.chain(forward).chain(back).collect()
    }

    #[test]
    fn near_rel32_branches_are_written_as_iced_encodes_them() {
        let mut encoder = Encoder::new(64);
        let ip = 0x7000_0000_0000u64;
        let targets = rel32_edge_targets(ip);
        let (mut written, mut refused, mut other_codes) = (0, 0, 0);
        // Every code, so that no other one is written. iced builds an
        // `xbegin` only through `with_xbegin` (asserted in debug builds):
        // those are checked after the loop.
        for code in Code::values().filter(|c| c.mnemonic() != Mnemonic::Xbegin) {
            for &target in &targets {
                let Ok(insn) = Instruction::with_branch(code, target) else {
                    continue;
                };
                let mut direct = Vec::new();
                let ours = write_near_rel32(&insn, ip, &mut direct);
                if rel32_opcode(code).is_none() {
                    assert!(ours.is_none() && direct.is_empty(), "{insn}");
                    other_codes += 1;
                    continue;
                }
                // iced leaves the bytes of a branch out of reach in its
                // buffer too.
                let iced = encoder.encode(&insn, ip);
                let mut fresh = Vec::new();
                drain_into(&mut encoder, &mut fresh);
                match (ours, iced) {
                    (Some(size), Ok(expected)) => {
                        assert_eq!((size as usize, &direct), (expected, &fresh), "{insn}");
                        written += 1;
                    }
                    (None, Err(_)) => {
                        assert!(direct.is_empty(), "{insn}");
                        refused += 1;
                    }
                    (ours, iced) => panic!("{insn}: written {ours:?}, iced {iced:?}"),
                }
            }
        }
        assert!(written > 1000 && refused > 0 && other_codes > 0);
        for bitness in [16, 32, 64] {
            let xbegin = Instruction::with_xbegin(bitness, ip + 0x100).unwrap();
            assert!(write_near_rel32(&xbegin, ip, &mut Vec::new()).is_none());
        }
        // A prefix (`bnd`, a branch hint) is left to iced.
        let bnd: fn(&mut Instruction) = |insn| insn.set_has_repne_prefix(true);
        let hint: fn(&mut Instruction) = |insn| insn.set_segment_prefix(Register::DS);
        for add_prefix in [bnd, hint] {
            let mut insn = Instruction::with_branch(Code::Jne_rel32_64, ip).unwrap();
            add_prefix(&mut insn);
            assert!(write_near_rel32(&insn, ip, &mut Vec::new()).is_none());
        }
    }

    #[test]
    fn spatial_checks_name_the_immediates_their_bytes_hold() {
        let codes = codes_of_this_executable(300);
        let mut plans = plans_of(&codes);
        let scratch = [Register::RAX, Register::R11, Register::RDX, Register::R9];
        let mut n = 0;
        for plan in &mut plans {
            for &(index, _) in plan.inserts.iter().step_by(3) {
                let probe = SpatialProbe {
                    scratch: scratch[n % scratch.len()],
                    save_scratch: n % 2 == 0,
                    save_flags: n % 3 == 0,
                };
                plan.spatial.insert(index, (n as u32, probe));
                n += 1;
            }
        }
        let base = 0x7000_0000;
        let entries = entries();
        let runs = [0..plans.len() / 2, plans.len() / 2..plans.len()];
        let (copies, code) = encoded(&mut plans, &runs, base, &entries);
        assert!(copies.spatial_checks.len() > 100, "{n} checks planned");
        let hash = entries.spatial_hash;
        for check in &copies.spatial_checks {
            let at = (check.ip - base) as usize;
            let bytes = &code[at..at + check.len as usize];
            let [multiplier, threshold] = check.immediates.unwrap().map(usize::from);
            let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            assert_eq!(
                (word(multiplier), word(threshold)),
                (hash.multiplier, hash.threshold)
            );
            let decoded = probe::spatial_immediates(bytes).unwrap();
            assert_eq!(decoded, (multiplier as u32, threshold as u32));
        }
    }

    #[test]
    fn movs_of_an_immediate_are_written_as_iced_encodes_them() {
        let mut cached = LayoutEncoder::new();
        let mut encoder = Encoder::new(64);
        let (mut direct, mut fresh) = (Vec::new(), Vec::new());
        use Register::*;
        let registers = [
            EAX, ECX, EDX, EBX, ESP, EBP, ESI, EDI, R8D, R9D, R10D, R11D, R12D, R13D, R14D, R15D,
        ];
        let ids = [0, 7, 0x7fff_ffff, u32::MAX];
        for (r, id) in registers.into_iter().flat_map(|r| ids.map(|id| (r, id))) {
            let plain = Instruction::with2(Code::Mov_r32_imm32, r, id).unwrap();
            let mut prefixed = plain;
            prefixed.set_segment_prefix(Register::FS);
            let mut repeated = plain;
            repeated.set_has_rep_prefix(true);
            for insn in [plain, prefixed, repeated] {
                direct.clear();
                let size = cached.position_independent(&insn, &mut direct).unwrap();
                let expected = encoder.encode(&insn, 0).unwrap();
                fresh.clear();
                drain_into(&mut encoder, &mut fresh);
                assert_eq!((size as usize, &direct), (expected, &fresh), "{insn}");
            }
            assert!(mov_r32_imm32(&plain, &mut direct).is_some());
            assert!(mov_r32_imm32(&repeated, &mut direct).is_none());
        }
    }

    /// The registers of 64 and 32 bits, in number order.
    const WIDE: [Register; 16] = {
        use Register::*;
        [
            RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8, R9, R10, R11, R12, R13, R14, R15,
        ]
    };
    const NARROW: [Register; 16] = {
        use Register::*;
        [
            EAX, ECX, EDX, EBX, ESP, EBP, ESI, EDI, R8D, R9D, R10D, R11D, R12D, R13D, R14D, R15D,
        ]
    };

    /// Every memory operand a direct form may meet: each base (none, 64-
    /// and 32-bit registers, `rip`) with each index (none, 64- and 32-bit
    /// registers; iced asserts in debug builds on a 32-bit register beside
    /// a 64-bit one), scale and displacement of every size iced takes,
    /// valued at the edges of disp8 and disp32, and some it refuses.
    fn memory_operands() -> Vec<iced_x86::MemoryOperand> {
        use Register::*;
        let bases = [None].into_iter().chain(WIDE).chain(NARROW).chain([RIP]);
        let indices: Vec<Register> = [None].into_iter().chain(WIDE).chain(NARROW).collect();
        let displacements: [(u32, i64); 17] = [
            (0, 0),
            (0, 5),
            (1, 0),
            (1, 1),
            (1, 127),
            (1, -128),
            (1, 128),
            (1, -129),
            (2, 8),
            (4, 0x1234),
            (4, -0x8000_0000),
            (4, 0xffff_fff0),
            (8, 0),
            (8, -1),
            (8, 0x7fff_ffff),
            (8, 0x8000_0000),
            (8, -0x8000_0001),
        ];
        let narrow_with_wide =
            |b: Register, i: Register| b != None && i != None && b.is_gpr32() != i.is_gpr32();
        let mut operands = Vec::new();
        for base in bases {
            for &index in indices.iter().filter(|&&i| !narrow_with_wide(base, i)) {
                for scale in [1, 2, 4, 8] {
                    for (size, disp) in displacements {
                        operands.push(iced_x86::MemoryOperand::new(
                            base, index, scale, disp, size, false, None,
                        ));
                    }
                }
            }
        }
        operands
    }

    /// Immediates at the edges of 8 and 32 bits (those a form cannot take
    /// are skipped).
    const IMMEDIATES: [i32; 7] = [0, 1, 0x7f, -0x80, -1, 0x1234_5678, i32::MIN];

    /// The instruction of `form` with its register `reg` (ignored by a
    /// form with an opcode extension), r/m operand `rm` and immediate
    /// `immediate` (ignored by a form without one); `None` where iced
    /// cannot make it.
    fn direct_instruction(
        form: &DirectForm,
        reg: Register,
        rm: impl Into<Rm>,
        immediate: i32,
    ) -> Option<Instruction> {
        let code = form.code;
        let made = match (rm.into(), form.reg) {
            (Rm::Memory(m), RegField::First) => Instruction::with2(code, reg, m),
            (Rm::Register(r), RegField::First) => Instruction::with2(code, reg, r),
            (Rm::Memory(m), RegField::Second) => Instruction::with2(code, m, reg),
            (Rm::Register(r), RegField::Second) => Instruction::with2(code, r, reg),
            (Rm::Memory(m), RegField::Extension(_)) if form.immediate == 0 => {
                Instruction::with1(code, m)
            }
            (Rm::Register(r), RegField::Extension(_)) if form.immediate == 0 => {
                Instruction::with1(code, r)
            }
            (Rm::Memory(m), RegField::Extension(_)) => Instruction::with2(code, m, immediate),
            (Rm::Register(r), RegField::Extension(_)) => Instruction::with2(code, r, immediate),
        };
        made.ok()
    }

    /// A [`DirectForm`]'s r/m operand, in tests.
    enum Rm {
        Memory(iced_x86::MemoryOperand),
        Register(Register),
    }

    impl From<iced_x86::MemoryOperand> for Rm {
        fn from(memory: iced_x86::MemoryOperand) -> Self {
            Rm::Memory(memory)
        }
    }

    impl From<Register> for Rm {
        fn from(register: Register) -> Self {
            Rm::Register(register)
        }
    }

    /// The registers of `form`'s reg field.
    fn reg_registers(form: &DirectForm) -> [Register; 16] {
        if form.wide { WIDE } else { NARROW }
    }

    /// Whether `insn` encoded at `ip` is written by [`write_direct`] as by
    /// iced, its displacement where iced's constant offsets put it; gives
    /// whether it was written (else iced refused it or it is an absolute
    /// address, left to iced).
    fn written_as_iced(encoder: &mut Encoder, insn: &Instruction, ip: u64) -> bool {
        let mut direct = Vec::new();
        let ours = write_direct(insn, ip, &mut direct);
        let iced = encoder.encode(insn, ip);
        let mut fresh = Vec::new();
        drain_into(encoder, &mut fresh);
        match (ours, iced) {
            (Some((size, at)), Ok(expected)) => {
                assert_eq!((size as usize, &direct), (expected, &fresh), "{insn}");
                let offsets = encoder.get_constant_offsets();
                if offsets.has_displacement() {
                    assert_eq!(usize::from(at), offsets.displacement_offset(), "{insn}");
                }
                true
            }
            (Some(_), Err(e)) => panic!("{insn}: written, iced refuses: {e}"),
            (None, Ok(_)) => {
                let absolute =
                    insn.memory_base() == Register::None && insn.memory_index() == Register::None;
                assert!(absolute && direct.is_empty(), "{insn}: left to iced");
                false
            }
            (None, Err(_)) => {
                assert!(direct.is_empty(), "{insn}");
                false
            }
        }
    }

    #[test]
    fn direct_forms_with_memory_are_written_as_iced_encodes_them() {
        let mut encoder = Encoder::new(64);
        let (mut written, mut left_to_iced) = (0usize, 0usize);
        let operands = memory_operands();
        for form in &DIRECT_FORMS {
            let registers = reg_registers(form);
            // Every register with every operand for `lea`, whose
            // addressing every form shares; the others' registers and
            // immediates taken in turn.
            let every_register = form.code == Code::Lea_r64_m;
            for (k, &memory) in operands.iter().enumerate() {
                let turn = [registers[k % 16]];
                let regs = if every_register {
                    &registers[..]
                } else {
                    &turn
                };
                let immediate = IMMEDIATES[k % IMMEDIATES.len()];
                for &reg in regs {
                    let made = direct_instruction(form, reg, memory, immediate)
                        .or_else(|| direct_instruction(form, reg, memory, -0x80));
                    let Some(insn) = made else {
                        continue;
                    };
                    if written_as_iced(&mut encoder, &insn, 0) {
                        written += 1;
                    } else {
                        left_to_iced += 1;
                    }
                }
            }
        }
        assert!(
            written > 900_000 && left_to_iced > 0,
            "{written} {left_to_iced}"
        );
        let mut prefixed = Instruction::with2(
            Code::Lea_r64_m,
            Register::RDI,
            iced_x86::MemoryOperand::with_base_displ(Register::RBX, 8),
        )
        .unwrap();
        assert!(write_direct(&prefixed, 0, &mut Vec::new()).is_some());
        prefixed.set_segment_prefix(Register::FS);
        assert!(write_direct(&prefixed, 0, &mut Vec::new()).is_none());
    }

    #[test]
    fn direct_forms_between_registers_are_written_as_iced_encodes_them() {
        let mut encoder = Encoder::new(64);
        let mut written = 0;
        for form in &DIRECT_FORMS {
            let rms = match form.rm {
                RmRegister::None => continue,
                RmRegister::Gpr64 => WIDE,
                RmRegister::Gpr32 => NARROW,
            };
            for (reg, rm) in reg_registers(form)
                .into_iter()
                .flat_map(|reg| rms.map(|rm| (reg, rm)))
            {
                for immediate in IMMEDIATES {
                    if let Some(insn) = direct_instruction(form, reg, rm, immediate) {
                        assert!(written_as_iced(&mut encoder, &insn, 0), "{insn}");
                        written += 1;
                    }
                }
            }
        }
        assert!(written > 10_000, "{written}");
        // A register where the form takes only memory, or one of
        // another width, is left to iced.
        let byte = Instruction::with2(Code::Movzx_r32_rm8, Register::EAX, Register::SIL).unwrap();
        let narrow =
            Instruction::with2(Code::Movsxd_r64_rm32, Register::RAX, Register::ESI).unwrap();
        assert!(write_direct(&byte, 0, &mut Vec::new()).is_none());
        assert!(write_direct(&narrow, 0, &mut Vec::new()).is_some());
    }

    #[test]
    fn rip_relative_direct_forms_reach_as_far_as_iced_does() {
        let mut encoder = Encoder::new(64);
        let ip = 0x7000_0000_0000u64;
        let targets = rel32_edge_targets(ip);
        let (mut written, mut refused) = (0, 0);
        for form in &DIRECT_FORMS {
            let registers = reg_registers(form);
            for (k, &target) in targets.iter().enumerate() {
                for size in [0, 1, 4, 8] {
                    let memory = iced_x86::MemoryOperand::new(
                        Register::RIP,
                        Register::None,
                        1,
                        target as i64,
                        size,
                        false,
                        Register::None,
                    );
                    let immediate = IMMEDIATES[k % IMMEDIATES.len()];
                    let Some(insn) = direct_instruction(form, registers[k % 16], memory, immediate)
                    else {
                        continue;
                    };
                    if written_as_iced(&mut encoder, &insn, ip) {
                        written += 1;
                    } else {
                        refused += 1;
                    }
                }
            }
        }
        assert!(written > 5_000 && refused > 500, "{written} {refused}");
    }

    #[test]
    fn listed_entries_are_taken_at_their_instructions_as_each_list_alone_would() {
        let exits = [(2, 7), (5, 8)];
        let redirects = [(5, TableRedirect::Displacement(0x40))];
        let inserts = [
            (0, Insert::Ptwrite { id: 1 }),
            (9, Insert::Ptwrite { id: 2 }),
        ];
        // The second entry at 3 is never taken (as by `take_at` alone): the
        // later instructions are all checked, and still take theirs.
        let escapes = [(3, 4), (3, 6)];
        let mut listed = Listed::new(&[], &exits, &redirects, &inserts, &escapes);
        let (mut e, mut r, mut n, mut s) = (&exits[..], &redirects[..], &inserts[..], &escapes[..]);
        let mut taken = 0;
        for i in 0..12 {
            let here = listed.take(i);
            let alone = (
                take_at(&mut e, i),
                take_at(&mut r, i),
                take_at(&mut n, i),
                take_at(&mut s, i),
            );
            assert!(here.spatial.is_none());
            assert_eq!((here.exit, here.redirect, here.insert, here.escape), alone);
            taken += usize::from(alone.0.is_some()) + usize::from(alone.3.is_some());
        }
        assert_eq!((taken, listed.next), (3, 3));
        let mut clean = Listed::new(&[], &exits, &[], &[], &[]);
        assert_eq!(clean.next, 2);
        assert_eq!(clean.take(2).exit, Some(7));
        assert_eq!(clean.next, 5);
        assert_eq!(clean.take(5).exit, Some(8));
        assert_eq!(clean.next, usize::MAX);
    }

    #[test]
    fn each_code_has_at_most_one_direct_form() {
        for (k, form) in DIRECT_FORMS.iter().enumerate() {
            assert!((form.code as usize) < CODES);
            let first = DIRECT_FORMS.iter().position(|f| f.code == form.code);
            assert_eq!(first, Some(k), "{:?}", form.code);
            assert_eq!(direct_form(form.code).map(|f| f.code), Some(form.code));
        }
        assert!(direct_form(Code::Add_r64_rm64).is_none());
        assert!(Code::values().all(|code| (code as usize) < CODES));
    }

    /// A piece's kind and sizes, to compare.
    fn shape(piece: &Piece) -> (u8, u32, u8) {
        match *piece {
            Piece::Fixed(size) => (0, size, 0),
            Piece::Near(size) => (1, size.into(), 0),
            Piece::Short(size) => (2, size.into(), 0),
            Piece::RipRelative(size, at) => (3, size.into(), at),
            Piece::Reencode(k, size) => (4, k, size),
        }
    }

    #[test]
    fn branches_and_rip_relative_operands_lay_out_alike_from_a_warm_cache() {
        let codes = codes_of_this_executable(300);
        let base = 0x7000_0000;
        let mut warm = LayoutEncoder::new();
        let mut cold = LayoutEncoder::new();
        let empty = cold.cache[0];
        let (mut near, mut rip) = (0, 0);
        // Twice, so that the second pass is mostly hits.
        for _ in 0..2 {
            for insn in codes.iter().flat_map(|c| &c.instructions) {
                if !is_relative_branch(insn) && !insn.is_ip_rel_memory_operand() {
                    continue;
                }
                cold.cache.fill(empty);
                let (mut cached, mut fresh) = (Layout::default(), Layout::default());
                let from_cache = cached.piece(&mut warm, insn, base);
                let encoded = fresh.piece(&mut cold, insn, base);
                let (Ok((piece, size)), Ok((expected, expected_size))) = (from_cache, encoded)
                else {
                    panic!("{insn}: one of the two layouts failed");
                };
                assert_eq!(
                    (shape(&piece), size),
                    (shape(&expected), expected_size),
                    "{insn}"
                );
                assert_eq!(cached.targets, fresh.targets, "{insn}");
                assert_eq!(cached.placed, fresh.placed, "{insn}");
                match piece {
                    Piece::RipRelative(..) => rip += 1,
                    Piece::Near(_) => near += 1,
                    _ => {}
                }
                assert_eq!(cached.pool, fresh.pool, "{insn}");
            }
        }
        assert!(
            near > 100 && rip > 100,
            "{near} branches, {rip} rip-relative"
        );
    }

    /// A run refused while the workers build the runs after it is an
    /// error, not a wait for runs never emitted.
    #[test]
    fn a_refused_run_among_runs_built_ahead_is_an_error() {
        let mut codes = codes_of_this_executable(400);
        let n = codes.len();
        // Two copies of one function in one of the last runs: its
        // addresses are labelled twice there.
        let twice = codes[n - 10].clone();
        codes.insert(n - 9, twice);
        let runs: Vec<_> = (0..n + 1)
            .step_by(5)
            .map(|i| i..(i + 5).min(n + 1))
            .collect();
        let (start, end) = (codes[n - 10].start, codes[n - 10].end);
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut plans = plans_of(&codes);
            let mut code = Vec::new();
            let encoded = pool.install(|| {
                encode_in_runs(&mut plans, &runs, 0x7000_0000, &entries(), (&mut code, 0))
            });
            match encoded {
                Err(RelocateError::DuplicateAddress(ip)) => {
                    assert!((start..end).contains(&ip), "{ip:#x}");
                }
                other => panic!("{threads} threads: {:?}", other.map(|c| c.len)),
            }
        }
    }

    /// A measured part of `layout` whose aligned instructions are
    /// `aligned`, not yet placed.
    fn part_of(layout: Layout, aligned: Vec<Aligned>) -> Part {
        Part {
            firsts: Vec::new(),
            originals: Vec::new(),
            body_ends: Vec::new(),
            ends: Vec::new(),
            ptwrite_at: Vec::new(),
            spatial_at: Vec::new(),
            layout,
            labels: MeasuredLabels::default(),
            aligned,
            paddings: Vec::new(),
            len: 0,
        }
    }

    /// A run's labels, split and indexed before the run is placed, are
    /// found where the placed run's padding puts them: fake labels in the
    /// run's own table (none of another run's, none drawn and never
    /// placed), original ones sorted by address.
    #[test]
    fn labels_measured_apart_are_found_where_the_run_lands() {
        let fake = |run: u64, n: u64| FAKE_BASE + (run << FAKE_RUN_BITS) + n;
        let aligned = [
            (0, None),
            (40, Some(90)),
            (40, None),
            (130, None),
            (250, None),
        ]
        .map(|(at, loop_end)| Aligned { at, loop_end });
        // Fakes come in the order of their offsets, not of their draws;
        // some original addresses out of their order.
        let measured = [
            (0, 0x2000),
            (5, fake(1, 4)),
            (39, 0x2010),
            (40, fake(1, 1)),
            (41, 0x2008),
            (129, fake(1, 2)),
            (130, 0x2020),
            (200, fake(1, 6)),
            (260, 0x2030),
        ];
        let lists = (Vec::new(), Vec::new());
        let (labels, sorted) = MeasuredLabels::of(&measured, &aligned, (1, 7), lists);
        let labels = labels.unwrap();
        assert!(sorted.is_sorted(), "{sorted:?}");
        for start in [0x7000_0000u64, 0x7000_0010, 0x7000_0031] {
            let mut part = part_of(
                Layout {
                    end: 280,
                    ..Layout::default()
                },
                aligned.to_vec(),
            );
            place(&mut part, start);
            assert!(part.paddings.iter().any(|&(_, p)| p > 0));
            for &(at, ip) in &measured {
                if ip >= FAKE_BASE {
                    let offset = labels.fake_offset(&part, 1, ip);
                    assert_eq!(offset, Some(part.offset(at)), "{ip:#x} at {start:#x}");
                    assert_eq!(labels.fake_offset(&part, 0, ip), None);
                    assert_eq!(labels.fake_offset(&part, 2, ip), None);
                }
            }
            for never in [fake(1, 3), fake(1, 5), fake(1, 7), fake(0, 1), fake(2, 1)] {
                assert_eq!(labels.fake_offset(&part, 1, never), None, "{never:#x}");
            }
            // Placed as the run is, offsets from a base below it.
            let mut originals = OriginalLabels::new(&sorted);
            let from_base = start - 0x6fff_0000;
            originals.place(&part, from_base);
            for &(at, ip) in measured.iter().filter(|&&(_, ip)| ip < FAKE_BASE) {
                let offset = from_base + part.offset(at);
                assert_eq!(originals.find(ip), Some(offset), "{ip:#x}");
            }
        }
    }

    #[test]
    fn an_address_labelled_twice_in_a_run_is_refused_the_lowest_named() {
        let fake = |n: u64| FAKE_BASE + n;
        let twice = |labels: &[(u64, u64)]| match MeasuredLabels::of(
            labels,
            &[],
            (0, 3),
            (Vec::new(), Vec::new()),
        )
        .0
        {
            Err(RelocateError::DuplicateAddress(ip)) => Some(ip),
            Ok(_) => None,
            Err(e) => panic!("{e}"),
        };
        let fakes = [(30, fake(3)), (20, fake(2)), (40, fake(3)), (50, fake(2))];
        let run = |originals: &[(u64, u64)], fakes: &[(u64, u64)]| {
            let mut labels = [originals, fakes].concat();
            labels.sort_unstable();
            labels
        };
        assert_eq!(twice(&run(&[(0, 0x10)], &fakes)), Some(fake(2)));
        let originals = [(0, 0x10), (4, 0x20), (8, 0x20)];
        assert_eq!(twice(&run(&originals, &fakes)), Some(0x20));
        let once = [(20, fake(2)), (10, fake(1))];
        assert_eq!(twice(&run(&[(0, 0x10)], &once)), None);
    }

    #[test]
    fn original_labels_are_found_across_their_buckets_as_by_a_search() {
        // Instructions of 1 to 15 bytes, some addresses labelled twice
        // apart (gaps), crossing many 64-byte stretches.
        let mut labels = Vec::new();
        let mut ip = 0x40_1000u64;
        for k in 0..2_000u64 {
            labels.push((ip, 7 * k));
            ip += 1 + (k * 7919) % 15 + if k % 97 == 0 { 300 } else { 0 };
        }
        let index = OriginalLabels::new(&labels);
        let by_search = |target: u64| {
            labels
                .binary_search_by_key(&target, |&(ip, _)| ip)
                .ok()
                .map(|i| labels[i].1)
        };
        for target in 0x40_0f00..ip + 200 {
            assert_eq!(index.find(target), by_search(target), "{target:#x}");
        }
        assert_eq!(OriginalLabels::new(&[]).find(0x1000), None);
        assert!(index.addresses().eq(labels.iter().map(|&(ip, _)| ip)));
    }

    #[test]
    fn runs_are_consecutive_and_cover_every_plan() {
        let binary = Binary::open(std::env::current_exe().unwrap()).unwrap();
        let codes: Vec<FunctionCode> = binary
            .functions()
            .iter()
            .map(|f| binary.function_code(f))
            .collect();
        let plans = plans_of(&codes);
        let runs = balanced_runs(&plans);
        assert_eq!(runs[0].start, 0);
        assert_eq!(runs.last().unwrap().end, plans.len());
        assert!(runs.windows(2).all(|w| w[0].end == w[1].start));
        assert!(balanced_runs(&plans[..1]).len() == 1);
        assert_eq!(balanced_runs(&[]), vec![0..0]);
    }

    proptest::proptest! {
        /// Over runs whose spans are in order and apart, the search of the
        /// one run spanning a target resolves every address around them as
        /// the look at the run's own labels, every run's and the later
        /// spans does, from every run as it is emitted; an address outside
        /// every span keeps its value.
        #[test]
        fn ordered_spans_resolve_as_every_run_is_asked(
            runs in proptest::collection::vec((0u64..8, 1u64..24, 1u64..5), 1..8),
        ) {
            let mut spans = Vec::new();
            let mut from = 0x1000;
            for &(gap, len, _) in &runs {
                spans.push(from + gap..from + gap + len);
                from += gap + len;
            }
            let ordered = RunSpans::new(spans.iter().cloned());
            proptest::prop_assert!(ordered.ordered);
            let mut searched = RunSpans::new(spans.iter().cloned());
            searched.ordered = false;
            let base = 0x70_0000;
            let mut labels = RunLabels::default();
            for (run, (span, &(_, _, step))) in spans.iter().zip(&runs).enumerate() {
                let run_labels: Vec<(u64, u64)> = (span.clone())
                    .step_by(step as usize)
                    .enumerate()
                    .map(|(k, ip)| (ip, 1000 * run as u64 + 7 * k as u64))
                    .collect();
                labels.push(OriginalLabels::new(&run_labels));
                for target in 0x1000 - 2..from + 2 {
                    let resolved = resolve_original(&labels, &searched, run, base, target);
                    proptest::prop_assert_eq!(
                        resolve_original(&labels, &ordered, run, base, target),
                        resolved,
                        "run {} target {:#x}", run, target
                    );
                    // What `emit_run` answers without asking.
                    if !ordered.hull.contains(&target) {
                        proptest::prop_assert_eq!(resolved, Some(target));
                    }
                }
            }
        }

        /// The later runs' hull only rejects what no later span holds:
        /// `later_holds` is the look at every later span, for overlapping,
        /// empty and out-of-order spans alike.
        #[test]
        fn later_holds_is_any_later_span(
            spans in proptest::collection::vec((0u64..64, 0u64..24), 1..12),
            targets in proptest::collection::vec(0u64..96, 1..24),
        ) {
            let spans: Vec<_> = spans.iter().map(|&(start, len)| start..start + len).collect();
            let run_spans = RunSpans::new(spans.iter().cloned());
            for run in 0..spans.len() {
                for &target in &targets {
                    let any = spans[run + 1..].iter().any(|span| span.contains(&target));
                    proptest::prop_assert_eq!(run_spans.later_holds(run, target), any);
                }
            }
        }
    }
}
