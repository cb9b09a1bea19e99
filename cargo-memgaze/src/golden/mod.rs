//! Golden full-trace snapshots and accuracy validation of sampled runs.
//!
//! - [`facts`]: the build facts a snapshot depends on (compiler, target,
//!   profile, features, bench-size variables);
//! - [`snapshot`]: the snapshot contents ([`GoldenMetrics`]) and their
//!   insta-compatible `.snap` file;
//! - [`store`]: the `golden/` directory — comparing, writing `.snap.new`
//!   files for `cargo insta review`, updating, orphans;
//! - [`samples`]: per-sample sums of a sampled trace, from the analysis
//!   engine run on each sample alone;
//! - [`accuracy`]: MAPE over trace windows, code-window errors, bootstrap
//!   confidence intervals and the limits of docs/METRICS.md.

pub mod accuracy;
pub mod facts;
pub mod samples;
pub mod snapshot;
pub mod store;

pub use accuracy::{Comparison, Limits, Perturbation, Status, compare};
pub use facts::BuildFacts;
pub use samples::{SampleBreakdown, SampleSet, TraceMetric};
pub use snapshot::{GoldenMetrics, SnapshotFile, SnapshotMeta};
pub use store::{GoldenStore, Outcome};
