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
//! The harness's markers win when present; the frameworks' hooks are used
//! only together (criterion's `start` without its `end` hooks nothing).

use crate::binary::Binary;

/// Symbol of the harness's region-begin marker.
pub(crate) const REGION_BEGIN: &str = "memgaze_region_begin";
/// Symbol of the harness's region-end marker.
pub(crate) const REGION_END: &str = "memgaze_region_end";

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
}

/// The benchmark framework whose hooks were found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framework {
    /// memgaze-harness markers.
    Harness,
    /// criterion's `WallTime` measurement.
    Criterion,
    /// divan's sample-loop synchronisation.
    Divan,
}

/// Sets of hooks, by framework, in order of preference: every function of
/// a set must be present for the set to be used.
const SETS: [(Framework, &[(&str, Hook)]); 3] = [
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
    let position = |name: &str| {
        binary
            .functions()
            .iter()
            .position(|f| f.name == name || f.raw_name.as_deref() == Some(name))
    };
    for (framework, set) in SETS {
        let found: Vec<Option<usize>> = set.iter().map(|(name, _)| position(name)).collect();
        if found.iter().all(Option::is_some) {
            let hooks = found
                .into_iter()
                .zip(set.iter())
                .map(|(f, (_, hook))| (f.expect("all found"), *hook))
                .collect();
            return Some((framework, hooks));
        }
        if framework == Framework::Harness && found.iter().any(Option::is_some) {
            warnings.push(
                "only one of the region markers was found: recording from start to exit".into(),
            );
            return None;
        }
    }
    None
}
