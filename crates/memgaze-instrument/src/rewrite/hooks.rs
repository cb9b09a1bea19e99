//! Region hooks: the functions at whose entry the runtime switches
//! recording on or off.
//!
//! A memgaze-harness bench has its own markers (`REGION_BEGIN`,
//! `REGION_END`, `rdi`/`rsi` = the bench's name). Criterion and divan
//! benches are recorded unmodified: their measurement functions, found by
//! symbol, delimit the timed loop.
//!
//! - criterion (0.3 to 0.8): every `Bencher::iter*` form calls
//!   `<WallTime as Measurement>::start` just before the timed loop (or
//!   routine call) and `::end` just after it; setup, batching and
//!   statistics lie outside. `start` is entered before its `Instant::now`,
//!   so the clock read is inside the region (a few loads per timed loop).
//! - divan (0.1): the sample loop is bracketed by `sync_impl(barrier,
//!   is_start)` (`#[inline(never)]`): called with `is_start = true` right
//!   before the start timestamp and `false` right after the end one; inputs
//!   (`with_inputs`) are generated before it, outputs dropped after.
//!
//! - criterion with LTO (`lto = true`, common in `[profile.bench]` or
//!   inherited from `[profile.release]`): `WallTime::start`/`end` are
//!   inlined away. What survives is each bench function's
//!   `<Function<M,F,T> as Routine<M,T>>::warm_up` (one instance per bench,
//!   all of one name, called through `dyn Routine`) and the profiler's
//!   `stop_profiling`. In profiling mode `Routine::profile` calls
//!   `start_profiling`, `warm_up` (1 s), `bench` (the remaining time, if
//!   any), `stop_profiling`; the fallback region opens at every `warm_up`'s
//!   entry and closes at `stop_profiling`'s (and `start_profiling`'s, which
//!   LTO may have merged with it: an end with no open region is ignored).
//!   Unlike the `WallTime` region it also holds the loop around the timed
//!   calls, the clock reads, `iter_batched`'s setup and drops, and `bench`'s
//!   entry; its loads are still the routine's run, not criterion's analysis.
//!
//! The harness's markers win when present; the frameworks' hooks are used
//! only together (criterion's `start` without its `end` hooks nothing), and
//! every function of a hooked name is hooked.

use crate::binary::Binary;

pub(crate) use memgaze_trace::protocol::{
    REGION_BEGIN_SYMBOL as REGION_BEGIN, REGION_END_SYMBOL as REGION_END,
};
/// Symbol of the harness's progress query (optional: older harnesses lack
/// it, and their `iter` runs its calibrated count).
pub(crate) const REGION_SAMPLES: &str = "memgaze_region_samples";

/// Every bench function's warm-up routine (criterion 0.3 to 0.8).
const CRITERION_WARM_UP: &str =
    "<criterion::routine::Function<M,F,T> as criterion::routine::Routine<M,T>>::warm_up";
/// The profiler's start, which LTO may merge with `stop_profiling` (equal
/// empty bodies): hooked as a region end too, ignored with none open.
const CRITERION_START_PROFILING: &str =
    "<criterion::profiler::ExternalProfiler as criterion::profiler::Profiler>::start_profiling";

/// Hooks a framework's set gains where the function exists (a function
/// the set already hooks keeps its hook).
const OPTIONAL: [(Framework, &str, Hook); 2] = [
    (Framework::Harness, REGION_SAMPLES, Hook::Samples),
    (
        Framework::CriterionRoutine,
        CRITERION_START_PROFILING,
        Hook::EndUnnamed,
    ),
];

/// What the runtime does at a hooked function's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hook {
    /// Open the region named by `rdi`/`rsi` (the harness's marker).
    Begin,
    /// Close the region named by `rdi`/`rsi`.
    End,
    /// Open an unnamed region (the function's arguments are not a name).
    BeginUnnamed,
    /// Close an unnamed region.
    EndUnnamed,
    /// Open an unnamed region when the second argument's low byte
    /// (`sil`) is non-zero, else close it (divan's `sync_impl`).
    Toggle,
    /// Set `rdi` to the time samples taken so far (the harness's
    /// `memgaze_region_samples`).
    Samples,
}

impl Hook {
    /// Whether the hook opens or closes a region (without them, the
    /// program is recorded whole); the others are extras.
    pub(crate) fn delimits(self) -> bool {
        self != Hook::Samples
    }
}

/// The benchmark framework whose hooks were found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framework {
    /// memgaze-harness markers.
    Harness,
    /// criterion's `WallTime` measurement.
    Criterion,
    /// criterion's `Routine::warm_up` and profiler (LTO-inlined `WallTime`).
    CriterionRoutine,
    /// divan's sample-loop synchronisation.
    Divan,
}

/// Sets of hooks, by framework, in order of preference: every function of
/// a set must be present for the set to be used.
const SETS: [(Framework, &[(&str, Hook)]); 4] = [
    (
        Framework::Harness,
        &[(REGION_BEGIN, Hook::Begin), (REGION_END, Hook::End)],
    ),
    (
        Framework::Criterion,
        &[
            (
                "<criterion::measurement::WallTime as criterion::measurement::Measurement>::start",
                Hook::BeginUnnamed,
            ),
            (
                "<criterion::measurement::WallTime as criterion::measurement::Measurement>::end",
                Hook::EndUnnamed,
            ),
        ],
    ),
    (
        Framework::CriterionRoutine,
        &[
            (CRITERION_WARM_UP, Hook::BeginUnnamed),
            (
                "<criterion::profiler::ExternalProfiler as criterion::profiler::Profiler>::stop_profiling",
                Hook::EndUnnamed,
            ),
        ],
    ),
    (
        Framework::Divan,
        &[(
            "divan::benchmark::BenchContext::sample_recorder::{{closure}}::{{closure}}::sync_impl",
            Hook::Toggle,
        )],
    ),
];

/// The region hooks of `binary` (function index, hook) and the framework
/// they belong to; `None` when it has none (recorded whole). A partial
/// harness set is reported in `warnings`.
pub(crate) fn find(
    binary: &Binary,
    warnings: &mut Vec<String>,
) -> Option<(Framework, Vec<(usize, Hook)>)> {
    let positions = |name: &str| -> Vec<usize> {
        binary
            .functions()
            .iter()
            .enumerate()
            .filter(|(_, f)| f.name == name || f.raw_name.as_deref() == Some(name))
            .map(|(i, _)| i)
            .collect()
    };
    for (framework, set) in SETS {
        let found: Vec<Vec<usize>> = set.iter().map(|(name, _)| positions(name)).collect();
        if found.iter().all(|f| !f.is_empty()) {
            let mut hooks: Vec<(usize, Hook)> = found
                .into_iter()
                .zip(set.iter())
                .flat_map(|(fs, (_, hook))| fs.into_iter().map(|f| (f, *hook)))
                .collect();
            for (_, name, hook) in OPTIONAL.iter().filter(|(f, ..)| *f == framework) {
                let hooked: Vec<usize> = hooks.iter().map(|&(f, _)| f).collect();
                hooks.extend(
                    positions(name)
                        .into_iter()
                        .filter(|f| !hooked.contains(f))
                        .map(|f| (f, *hook)),
                );
            }
            return Some((framework, hooks));
        }
        if framework == Framework::Harness && found.iter().any(|f| !f.is_empty()) {
            warnings.push(
                "only one of the region markers was found: recording from start to exit".into(),
            );
            return None;
        }
    }
    None
}
