//! Regression gates: saved baselines, limits per metric, and the
//! comparison of a run with a baseline.
//!
//! - [`baseline`]: `target/memgaze/baselines/<NAME>/…`, one file per bench
//!   holding its analysis, sampling parameters, backend and binary identity
//!   ([`save_baseline`], [`save_baseline_bench`], [`load_baseline`],
//!   [`list_baselines`]);
//! - [`limits`]: `dF=+5%,F_irr_frac=+0.02`, from the command line, from
//!   `[package.metadata.memgaze]` and the [`Limits::defaults`];
//! - [`compare`](mod@compare): [`Gate`] checks each bench as it finishes, refuses runs
//!   recorded differently from their baseline, and yields [`Regression`]s
//!   rendered as `old → new (Δ%)` or as `"reason": "regression"` JSON;
//! - [`noise`]: the spatial-sampling noise the limits of `MR_*` and
//!   `misses_*` widen to.

pub mod baseline;
pub mod compare;
pub mod limits;
pub mod metric;
pub mod noise;
mod staging;

pub use baseline::{
    BASELINE_FILE, BASELINES_DIR, Baseline, BaselineBench, BaselineInfo, BenchKey, BenchRun,
    Recording, baselines_dir, list_baselines, load_baseline, save_baseline, save_baseline_bench,
};
pub use compare::{
    BenchVerdict, Change, Gate, MIN_SAMPLES, MetricComparison, Regression, check_same_profile,
    compare, compare_analysis, compare_bench,
};
pub use limits::{Limit, Limits};
pub use metric::{Direction, Metric};
