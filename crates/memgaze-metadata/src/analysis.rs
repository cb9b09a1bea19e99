//! The result of an analysis: plain, documented, (de)serialisable types
//! whose JSON is the `memgaze.analysis.v1` document of docs/CLI.md.
//!
//! Field names follow docs/METRICS.md (`A`, `F_str`, `dF`, `kappa`…).
//! Quantities that are undefined (a ratio whose denominator is 0, a mean
//! over nothing) are `None` here, `null` in JSON and `–` in tables — never
//! NaN or infinity. Fractions (`*_frac`) are in `[0, 1]`.

use crate::model::{Backend, Dropped, LoadClass};
use serde::{Deserialize, Serialize};

/// Schema tag of [`Analysis`] documents.
pub const ANALYSIS_SCHEMA: &str = "memgaze.analysis.v1";

/// Every metric of docs/METRICS.md for one trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    /// Always [`ANALYSIS_SCHEMA`].
    pub schema: String,
    /// What was analysed and with which parameters.
    pub run: RunInfo,
    /// Whole-trace metrics.
    pub summary: Summary,
    /// Trace-window histogram: one row per `k` (windows of `2^k` accesses
    /// within samples) where at least one window fits.
    pub trace_windows: Vec<WindowRow>,
    /// Per-function metrics, hottest (`A`) first.
    pub functions: Vec<FunctionMetrics>,
    /// Per-load table, by `ip`.
    pub loads: Vec<LoadRow>,
    /// Hot regions: the leaves of the location zoom tree, by start address.
    pub regions: Vec<Region>,
    /// Reuse-distance histogram and capture/survival counts.
    pub reuse: ReuseHistogram,
    /// Execution interval tree over samples (inter-sample windows).
    pub intervals: IntervalTree,
    /// Whole-run locality of the hottest source lines (most estimated
    /// accesses first); empty, and absent from the JSON, without a
    /// whole-run curve.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lines: Vec<LineLocality>,
    /// What was counted but not analysed, and why.
    pub coverage: Coverage,
}

/// Parameters of the run and of the analysis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Collector that wrote the trace.
    pub backend: Backend,
    /// Whether the trace is a full trace (`z = 0`).
    pub full: bool,
    /// `w`: records per sample (`None` for a full trace).
    pub window: Option<u64>,
    /// `w + z` (`None` for a full trace).
    pub period: Option<u64>,
    /// Path of the original binary, when known.
    pub binary: Option<String>,
    /// Command line of the traced program.
    pub command: Vec<String>,
    /// Access block for reuse distance, bytes.
    pub block: u64,
    /// Code-window exponent `k_c` (`W_c = 2^k_c`).
    pub code_window_k: u32,
    /// Largest `k` of the trace-window histogram considered.
    pub max_k: u32,
    /// Hot-region threshold `t`, percent.
    pub region_threshold_percent: f64,
    /// Smallest zoom page, bytes.
    pub region_min_page: u64,
    /// `--functions` filter, when one was given.
    pub functions_filter: Option<String>,
    /// The cache sizes `MR_L1`, `MR_L2` and `MR_LLC` are read at (absent
    /// without a whole-run curve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_sizes: Option<CacheSizes>,
}

/// The cache sizes of the whole-run miss ratios `MR_L1`, `MR_L2`, `MR_LLC`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheSizes {
    /// L1 data cache, bytes.
    #[serde(rename = "L1")]
    pub l1: u64,
    /// L2 cache, bytes.
    #[serde(rename = "L2")]
    pub l2: u64,
    /// Last-level cache, bytes.
    #[serde(rename = "LLC")]
    pub llc: u64,
    /// Where they come from: `"sysfs"` (this machine's), `"--cache-sizes"`,
    /// or `"fallback"` (sysfs unreadable: `48K,2M,32M`).
    pub source: String,
}

/// One point of a miss-ratio curve: a fully associative LRU cache of
/// `blocks` 64-byte blocks misses on this share of the accesses.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MrcPoint {
    /// Cache size in blocks.
    pub blocks: u64,
    /// Cache size in bytes.
    pub bytes: u64,
    /// `MR(C)` (exact) or `MR̂(C)` (spatially sampled), in `[0, 1]`.
    pub miss_ratio: f64,
}

/// Whole-run locality of one source line (docs/METRICS.md, "Whole-run
/// locality").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LineLocality {
    /// `file:line`.
    pub line: String,
    /// Function of its loads: the one with the most records of them when
    /// several (docs/CLI.md).
    pub function: Option<String>,
    /// Estimated executions of its Strided and Irregular loads.
    #[serde(rename = "A_hat")]
    pub a_hat: f64,
    /// Estimated misses in an L1-sized fully associative LRU cache.
    #[serde(rename = "misses_L1")]
    pub misses_l1: f64,
    /// Estimated misses at the L2 size.
    #[serde(rename = "misses_L2")]
    pub misses_l2: f64,
    /// Estimated misses at the last-level-cache size.
    #[serde(rename = "misses_LLC")]
    pub misses_llc: f64,
}

/// Whole-run locality of a set of accesses (docs/METRICS.md, "Whole-run
/// locality"): the miss-ratio curve and the miss ratios read off it at the
/// machine's cache sizes. Flattened into the documents that hold it, each
/// field empty (and absent from the JSON) when there is no curve: a sampled
/// trace without spatial sampling.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WholeRunLocality {
    /// Miss-ratio curve at `2^6 … 2^24` blocks and at the
    /// [`RunInfo::cache_sizes`], by size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mrc: Vec<MrcPoint>,
    /// `MR` at the L1 data cache's size.
    #[serde(rename = "MR_L1", default, skip_serializing_if = "Option::is_none")]
    pub mr_l1: Option<f64>,
    /// `MR` at the L2 cache's size.
    #[serde(rename = "MR_L2", default, skip_serializing_if = "Option::is_none")]
    pub mr_l2: Option<f64>,
    /// `MR` at the last-level cache's size.
    #[serde(rename = "MR_LLC", default, skip_serializing_if = "Option::is_none")]
    pub mr_llc: Option<f64>,
}

/// Whole-trace metrics (docs/METRICS.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Observed accesses (Strided + Irregular records).
    #[serde(rename = "A")]
    pub a: u64,
    /// Constant loads: Constant records plus `implied`.
    #[serde(rename = "A_const")]
    pub a_const: u64,
    /// `A_const / (A + A_const)`.
    #[serde(rename = "A_const_frac")]
    pub a_const_frac: Option<f64>,
    /// `1 + A_const / A`.
    pub kappa: Option<f64>,
    /// Sample ratio ρ (1 for a full trace).
    pub rho: Option<f64>,
    /// `Â = ρ·(A + A_const)`: estimated executed loads.
    #[serde(rename = "A_hat")]
    pub a_hat: Option<f64>,
    /// Samples after splitting per thread (empty samples included).
    pub samples: u64,
    /// Records analysed (after the `--functions` filter).
    pub records: u64,
    /// Distinct addresses of Strided and Irregular records.
    #[serde(rename = "F")]
    pub f: u64,
    /// `F̂ = ρ·F` (a poor estimate for data with reuse; see docs/METRICS.md).
    #[serde(rename = "F_hat")]
    pub f_hat: Option<f64>,
    /// Distinct 64-byte lines.
    #[serde(rename = "F_lines")]
    pub f_lines: u64,
    /// Strided share of `F` (mixed addresses split by access share).
    #[serde(rename = "F_str")]
    pub f_str: f64,
    /// Irregular share of `F`.
    #[serde(rename = "F_irr")]
    pub f_irr: f64,
    /// `F_str / F` (0 when `F = 0`).
    #[serde(rename = "F_str_frac")]
    pub f_str_frac: f64,
    /// `F_irr / F` (0 when `F = 0`).
    #[serde(rename = "F_irr_frac")]
    pub f_irr_frac: f64,
    /// `ΔF = F / (A + A_const)`.
    #[serde(rename = "dF")]
    pub d_f: Option<f64>,
    /// Mean reuse distance over accesses that have one.
    #[serde(rename = "D_mean")]
    pub d_mean: Option<f64>,
    /// Largest reuse distance.
    #[serde(rename = "D_max")]
    pub d_max: Option<u64>,
    /// Whole-run miss-ratio curve and `MR_*` (absent from the JSON for a
    /// sampled trace without spatial sampling).
    #[serde(flatten)]
    pub whole_run: WholeRunLocality,
    /// Estimated misses at the L1 size: `MR_L1` times the estimated
    /// Strided and Irregular executions.
    #[serde(rename = "misses_L1", default, skip_serializing_if = "Option::is_none")]
    pub misses_l1: Option<f64>,
    /// Estimated misses at the L2 size.
    #[serde(rename = "misses_L2", default, skip_serializing_if = "Option::is_none")]
    pub misses_l2: Option<f64>,
    /// Estimated misses at the last-level-cache size.
    #[serde(
        rename = "misses_LLC",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub misses_llc: Option<f64>,
    /// `R`, the share of 64-byte blocks whose accesses the curve is built
    /// from (1 for a full trace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spatial_rate: Option<f64>,
    /// Accesses the curve is built from (on tracked blocks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracked_accesses: Option<u64>,
    /// Spatially sampled curves only: the tracked blocks split into 32
    /// groups by a hash, and each group's share of `MR̂` at every size of
    /// `mrc` (the groups add up to the curve before clamping). Validation
    /// resamples the groups for bootstrap intervals of the curve's error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mrc_groups: Vec<Vec<f64>>,
    /// How the recording was cut short (`"SIGINT"`, `"SIGTERM"`,
    /// `"SIGHUP"`, `"timeout"`): the metrics are those of a prefix of the
    /// run. Absent for a run recorded to its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
    /// Threads whose records were analysed (0 without records).
    #[serde(default)]
    pub threads: u64,
    /// Runs of the bench routine the trace covers, where the bench harness
    /// reports them (`bench`, `golden`, `validate`); per-run figures are the
    /// totals divided by it. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterations: Option<u64>,
    /// Runs of the bench routine in each timed batch, where the harness
    /// picks and reports it (divan: `iters` over `samples`). A divan bench
    /// makes a whole batch's `with_inputs` inputs before timing it, so the
    /// batch size sets how much data is live at once. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_per_batch: Option<u64>,
    /// Dynamic coverage: traced load executions `Â` over `Â` plus the
    /// estimated load executions that ran untraced in original code after
    /// an escape (docs/METRICS.md, "Dynamic coverage"). An estimate; 1 when
    /// nothing escaped. Absent for traces of collectors that do not count
    /// escapes (Intel PT, Lackey) and in older analyses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage_dynamic: Option<f64>,
    /// Processes of the traced executable whose escape counts never
    /// reached the recorder (killed by a signal, or ended without an exit
    /// hook): `coverage_dynamic` is then absent, unknown rather than 1.
    /// Absent when every process sent its counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escape_counts_missing: Option<u64>,
    /// Executions of explicit loads of instrumented functions that no
    /// probe can trace (gathers, `gs:` sources), counted at run time: part
    /// of the untraced term of `coverage_dynamic`. Absent when none ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untraced_load_executions: Option<u64>,
    /// Programs a recorded process `exec`ed that did not join the trace,
    /// and how long they ran: time the trace does not cover. Absent when
    /// there were none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execs_untraced: Option<ExecsUntraced>,
    /// Executed-load coverage of each object of the process: the
    /// executable, each instrumented shared library, then the libraries the
    /// executable links that ran uninstrumented (docs/METRICS.md, "Coverage
    /// by object"). Absent for traces of collectors that do not count
    /// escapes and in older analyses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub coverage_by_object: Vec<ObjectLoadCoverage>,
}

/// The executed loads of one object and the share of them traced
/// ([`Summary::coverage_by_object`]), in the units of `Â`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObjectLoadCoverage {
    /// The executable's or the library's file name.
    pub object: String,
    /// Whether its code was instrumented. An uninstrumented object's loads
    /// are unknown: `loads_executed` and `share` are null, not zero.
    pub instrumented: bool,
    /// Estimated executed loads: `loads_traced` plus those that ran
    /// untraced in its original code after counted escapes; null when not
    /// instrumented, or when no sample held a record (no `ρ`).
    pub loads_executed: Option<f64>,
    /// Estimated load executions traced in its code: the `Â` of its
    /// functions (0 when not instrumented).
    pub loads_traced: f64,
    /// `loads_traced / loads_executed` (1 when it executed none); null when
    /// `loads_executed` is.
    pub share: Option<f64>,
}

impl ObjectLoadCoverage {
    /// Estimated load executions that ran untraced in its original code
    /// (0 when not instrumented: unknown, not counted).
    pub fn loads_untraced(&self) -> f64 {
        self.loads_executed.map_or(0.0, |e| e - self.loads_traced)
    }
}

/// Exec'd programs that ran untraced ([`Summary::execs_untraced`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecsUntraced {
    /// How many.
    pub programs: u64,
    /// Their wall time in seconds, from each `exec` to the program's exit
    /// (or the end of the recording).
    pub seconds: f64,
}

/// One row of a trace-window histogram: metrics averaged over all windows
/// of `2^k` accesses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowRow {
    /// Window size exponent.
    pub k: u32,
    /// Windows averaged.
    pub windows: u64,
    /// Mean footprint.
    #[serde(rename = "F")]
    pub f: f64,
    /// Mean distinct 64-byte lines (whole-trace histogram only).
    #[serde(rename = "F_lines", default, skip_serializing_if = "Option::is_none")]
    pub f_lines: Option<f64>,
    /// Mean of the per-window `ΔF = F / (2^k + A_const)`.
    #[serde(rename = "dF")]
    pub d_f: f64,
    /// Mean strided footprint.
    #[serde(rename = "F_str")]
    pub f_str: f64,
    /// Mean irregular footprint.
    #[serde(rename = "F_irr")]
    pub f_irr: f64,
    /// Mean of the per-window `F_str / F`.
    #[serde(rename = "F_str_frac")]
    pub f_str_frac: f64,
    /// Mean of the per-window `F_irr / F`.
    #[serde(rename = "F_irr_frac")]
    pub f_irr_frac: f64,
    /// Mean Constant loads per window.
    #[serde(rename = "A_const")]
    pub a_const: f64,
}

/// Metrics of one function (records whose `ip` lies in it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionMetrics {
    /// Demangled name.
    pub name: String,
    /// The object whose code it is: the executable's file name, or an
    /// instrumented shared library's (`libc.so.6`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// Observed accesses.
    #[serde(rename = "A")]
    pub a: u64,
    /// Constant loads.
    #[serde(rename = "A_const")]
    pub a_const: u64,
    /// `A_const / (A + A_const)`.
    #[serde(rename = "A_const_frac")]
    pub a_const_frac: Option<f64>,
    /// `ρ·(A + A_const)`.
    #[serde(rename = "A_hat")]
    pub a_hat: Option<f64>,
    /// Code-window `ΔF` (mean over windows of `2^k_c` of its accesses).
    #[serde(rename = "dF")]
    pub d_f: Option<f64>,
    /// Code-window `F_str%` as a fraction.
    #[serde(rename = "F_str_frac")]
    pub f_str_frac: Option<f64>,
    /// Code-window `F_irr%` as a fraction.
    #[serde(rename = "F_irr_frac")]
    pub f_irr_frac: Option<f64>,
    /// Code windows averaged.
    pub code_windows: u64,
    /// Mean reuse distance of its accesses.
    #[serde(rename = "D_mean")]
    pub d_mean: Option<f64>,
    /// Its own trace-window histogram.
    pub trace_windows: Vec<WindowRow>,
    /// Its whole-run miss-ratio curve and `MR_*`, of its accesses.
    #[serde(flatten)]
    pub whole_run: WholeRunLocality,
    /// Its hottest loads (by count) with their source lines.
    pub hot_loads: Vec<HotLoad>,
    /// Its dynamic coverage ([`Summary::coverage_dynamic`]), where escapes
    /// into its original code were counted; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage_dynamic: Option<f64>,
}

/// A load named in a function's or region's summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HotLoad {
    /// Original address of the load.
    #[serde(with = "hex")]
    pub ip: u64,
    /// `file:line`, when debug info exists.
    pub line: Option<String>,
    /// Accesses (records) of this load.
    pub count: u64,
}

/// One row of the per-load table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadRow {
    /// Address of the load in the original binary.
    #[serde(with = "hex")]
    pub ip: u64,
    /// Its class.
    pub class: LoadClass,
    /// Accesses at this address: recorded, or implied by a proxy.
    pub count: u64,
    /// Containing function.
    pub function: Option<String>,
    /// The object `ip` is an offset of: the executable's file name, or an
    /// instrumented shared library's (`libc.so.6`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// `file:line`.
    pub line: Option<String>,
    /// True for an uninstrumented Constant load whose count is implied by
    /// its basic block's proxy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub implied: bool,
    /// Mean reuse distance of its accesses.
    #[serde(rename = "D_mean", default, skip_serializing_if = "Option::is_none")]
    pub d_mean: Option<f64>,
}

/// A leaf of the location zoom tree (paper §IV-C2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Region {
    /// First accessed byte's 64-byte block.
    #[serde(with = "hex")]
    pub start: u64,
    /// One past the last accessed 64-byte block.
    #[serde(with = "hex")]
    pub end: u64,
    /// Accesses to the region.
    #[serde(rename = "A")]
    pub a: u64,
    /// Share of all accesses.
    #[serde(rename = "A_frac")]
    pub a_frac: f64,
    /// Distinct 64-byte blocks touched.
    pub blocks: u64,
    /// `A / blocks`: accesses per touched 64-byte block.
    #[serde(rename = "A_per_block")]
    pub a_per_block: f64,
    /// Mean reuse distance of accesses to it.
    #[serde(rename = "D_mean")]
    pub d_mean: Option<f64>,
    /// Zoom depth of the leaf (1 = child of the root).
    pub depth: u32,
    /// Page size at which the region was found, bytes.
    pub page: u64,
    /// Functions accessing it, most accesses first.
    pub functions: Vec<RegionFunction>,
}

/// A function's share of a region.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionFunction {
    /// Function name (`?` for code outside known functions).
    pub name: String,
    /// Its accesses to the region.
    #[serde(rename = "A")]
    pub a: u64,
    /// Source lines of its loads into the region, most accesses first.
    pub lines: Vec<String>,
}

/// Reuse distance `D` in power-of-two bins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReuseHistogram {
    /// Access block, bytes.
    pub block: u64,
    /// Bins `0`, `1`, `2–3`, `4–7`, … up to the last non-empty one.
    pub bins: Vec<ReuseBin>,
    /// Accesses without a D (first access to their block in the sample).
    pub cold: u64,
    /// Blocks reused within their sample (summed over samples).
    pub captures: u64,
    /// Blocks not reused within their sample (summed over samples).
    pub survivals: u64,
}

/// One reuse-distance bin: accesses with `lo ≤ D ≤ hi`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReuseBin {
    /// Smallest D of the bin.
    pub lo: u64,
    /// Largest D of the bin.
    pub hi: u64,
    /// Accesses.
    pub count: u64,
}

/// The execution interval tree (paper §IV-C1): samples merged pairwise.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IntervalTree {
    /// Per level `h` (nodes of `2^h` consecutive samples), metrics averaged
    /// over complete nodes: the inter-sample rows of the trace-window
    /// histogram.
    pub levels: Vec<IntervalLevel>,
    /// The upper part of the tree (levels with at most 256 nodes; lower
    /// levels only in `levels`), root first; a trailing node of fewer samples is included
    /// and marked incomplete.
    pub nodes: Vec<IntervalNode>,
}

/// Averages over the complete nodes of one level.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IntervalLevel {
    /// Samples per node are `2^h`.
    pub h: u32,
    /// Complete nodes averaged.
    pub nodes: u64,
    /// Mean accesses per node.
    #[serde(rename = "A")]
    pub a: f64,
    /// Mean observed footprint per node.
    #[serde(rename = "F")]
    pub f: f64,
    /// `ρ·F`, the estimated footprint of the executed interval.
    #[serde(rename = "F_hat")]
    pub f_hat: Option<f64>,
    /// Mean per-node `ΔF` (nodes with accesses).
    #[serde(rename = "dF")]
    pub d_f: Option<f64>,
}

/// One node of the execution interval tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IntervalNode {
    /// Level (`2^h` samples when complete).
    pub h: u32,
    /// Index of its first sample.
    pub first_sample: u64,
    /// Samples it covers.
    pub samples: u64,
    /// Whether it covers a full `2^h` samples.
    pub complete: bool,
    /// Observed accesses.
    #[serde(rename = "A")]
    pub a: u64,
    /// Constant loads.
    #[serde(rename = "A_const")]
    pub a_const: u64,
    /// Observed footprint (distinct addresses over its samples).
    #[serde(rename = "F")]
    pub f: u64,
    /// Distinct 64-byte lines over its samples.
    #[serde(rename = "F_lines")]
    pub f_lines: u64,
    /// `ρ·F`.
    #[serde(rename = "F_hat")]
    pub f_hat: Option<f64>,
    /// `F / (A + A_const)`, i.e. `F / (κ·A)`; null when `A = 0` (only
    /// Constant loads, or none), as `κ` is.
    #[serde(rename = "dF")]
    pub d_f: Option<f64>,
    /// Mean intra-sample reuse distance of its accesses.
    #[serde(rename = "D_mean")]
    pub d_mean: Option<f64>,
}

/// What the analysis saw but did not analyse.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Coverage {
    /// Records in the trace (or loads in the Lackey log inside the binary).
    pub records: u64,
    /// Spatial-sampling records in the trace besides `records` (outside
    /// the time samples: they enter the whole-run curve only); absent when
    /// there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spatial_records: Option<u64>,
    /// Samples in the trace, before splitting per thread.
    pub trace_samples: u64,
    /// Samples without records.
    pub empty_samples: u64,
    /// Records whose `ip` lies in no known function (analysed, but in no
    /// function's metrics).
    pub outside_functions: u64,
    /// Records left out by the `--functions` filter.
    pub filtered_out: u64,
    /// What the collector reported lost.
    pub dropped: Dropped,
    /// False when the trace is a prefix (the program did not finish cleanly).
    pub complete: bool,
    /// Whether load classes come from the classifier (`false`: every access
    /// is Irregular, e.g. a Lackey import before classification).
    pub classified: bool,
    /// Lackey import: loads whose instruction lies outside the binary
    /// (ld.so, libc, vdso), counted but not analysed.
    pub outside_binary: Option<u64>,
    /// The shared libraries the executable links (`DT_NEEDED`): not
    /// instrumented, so their loads are in no metric (absent when there
    /// are none, for Lackey imports and in older analyses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub untraced_libraries: Vec<String>,
    /// Traced accesses by object (the executable and each instrumented
    /// shared library), most first; absent when only the executable is
    /// instrumented.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<ObjectCoverage>,
    /// The functions whose original code ran untraced after counted
    /// escapes, most estimated untraced load executions first (absent when
    /// none did).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub untraced_functions: Vec<UntracedFunction>,
    /// The instrumented shared libraries that ran traced loads: their
    /// copies count no escape into original code and no execution of a
    /// load no probe can trace, so `coverage_dynamic` and their
    /// `coverage_by_object` shares leave those out (docs/METRICS.md,
    /// "Dynamic coverage"; absent when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uncounted_libraries: Vec<String>,
    /// Human-readable notes on the above.
    pub notes: Vec<String>,
}

/// The traced accesses of one object ([`Coverage::objects`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObjectCoverage {
    /// The executable's or the library's file name.
    pub object: String,
    /// Accesses recorded in its code (`A + A_const` of its functions).
    pub accesses: u64,
    /// Its share of all accesses recorded in known functions.
    pub share: f64,
}

/// A function that ran partly untraced, in original code reached by an
/// escape (docs/METRICS.md, "Dynamic coverage").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UntracedFunction {
    /// Demangled name.
    pub name: String,
    /// Counted escapes into it.
    pub escapes: u64,
    /// Its traced load executions (`Â`; 0 without records).
    pub traced: f64,
    /// Estimated untraced load executions: escapes times the loads of the
    /// original code one escape reaches.
    pub untraced: f64,
    /// `traced / (traced + untraced)`.
    pub coverage_dynamic: f64,
}

/// `u64` as a `"0x…"` string in JSON (addresses read better in hex).
pub(crate) mod hex {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:#x}"))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let text = String::deserialize(d)?;
        let digits = text
            .strip_prefix("0x")
            .ok_or_else(|| serde::de::Error::custom(format!("expected 0x…, got {text:?}")))?;
        u64::from_str_radix(digits, 16).map_err(serde::de::Error::custom)
    }
}

/// `Option<u64>` as a `"0x…"` string or `null` in JSON.
pub(crate) mod hex_option {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => super::hex::serialize(v, s),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        #[derive(Deserialize)]
        struct Hex(#[serde(with = "super::hex")] u64);
        Ok(Option::<Hex>::deserialize(d)?.map(|h| h.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The whole-run fields are absent when there is no curve, so the
    /// document of a trace without spatial sampling is what it was.
    #[test]
    fn whole_run_fields_are_absent_without_a_curve() {
        let text = serde_json::to_value(Summary::default()).unwrap();
        for key in [
            "mrc",
            "MR_L1",
            "MR_L2",
            "MR_LLC",
            "misses_L1",
            "spatial_rate",
            "tracked_accesses",
        ] {
            assert!(text.get(key).is_none(), "{key} present: {text}");
        }
        // And an older document (without them) reads back.
        let back: Summary = serde_json::from_value(text).unwrap();
        assert_eq!(back, Summary::default());
    }

    /// The flattened [`WholeRunLocality`] writes its fields where the
    /// documents always had them: after `D_max` (a function: after
    /// `trace_windows`), before `misses_*` (a function: `hot_loads`).
    #[test]
    fn whole_run_fields_keep_their_place_in_the_document() {
        let whole_run = WholeRunLocality {
            mrc: vec![MrcPoint {
                blocks: 64,
                bytes: 4096,
                miss_ratio: 0.5,
            }],
            mr_l1: Some(0.5),
            mr_l2: Some(0.25),
            mr_llc: Some(0.125),
        };
        let summary = Summary {
            d_max: Some(7),
            whole_run: whole_run.clone(),
            misses_l1: Some(1.0),
            ..Summary::default()
        };
        let text = serde_json::to_string(&summary).unwrap();
        let at = |key: &str| text.find(&format!("\"{key}\":")).unwrap();
        let order = [
            "D_max",
            "mrc",
            "MR_L1",
            "MR_L2",
            "MR_LLC",
            "misses_L1",
            "threads",
        ];
        assert!(order.windows(2).all(|w| at(w[0]) < at(w[1])), "{text}");
        assert_eq!(serde_json::from_str::<Summary>(&text).unwrap(), summary);

        let function = FunctionMetrics {
            name: "f".into(),
            object: None,
            a: 1,
            a_const: 0,
            a_const_frac: None,
            a_hat: None,
            d_f: None,
            f_str_frac: None,
            f_irr_frac: None,
            code_windows: 0,
            d_mean: None,
            trace_windows: Vec::new(),
            whole_run,
            hot_loads: Vec::new(),
            coverage_dynamic: None,
        };
        let text = serde_json::to_string(&function).unwrap();
        assert!(
            text.ends_with(
                r#""trace_windows":[],"mrc":[{"blocks":64,"bytes":4096,"miss_ratio":0.5}],"MR_L1":0.5,"MR_L2":0.25,"MR_LLC":0.125,"hot_loads":[]}"#
            ),
            "{text}"
        );
        assert_eq!(
            serde_json::from_str::<FunctionMetrics>(&text).unwrap(),
            function
        );
    }

    #[test]
    fn whole_run_fields_serialise_under_their_metric_names() {
        let summary = Summary {
            whole_run: WholeRunLocality {
                mrc: vec![MrcPoint {
                    blocks: 64,
                    bytes: 4096,
                    miss_ratio: 0.25,
                }],
                mr_l1: Some(0.25),
                mr_l2: Some(0.125),
                mr_llc: Some(0.0625),
            },
            misses_l1: Some(25.0),
            spatial_rate: Some(0.0078125),
            tracked_accesses: Some(1200),
            ..Summary::default()
        };
        let value = serde_json::to_value(&summary).unwrap();
        assert_eq!(
            value["mrc"],
            json!([{ "blocks": 64, "bytes": 4096, "miss_ratio": 0.25 }])
        );
        assert_eq!(value["MR_L1"], json!(0.25));
        assert_eq!(value["MR_L2"], json!(0.125));
        assert_eq!(value["MR_LLC"], json!(0.0625));
        assert_eq!(value["misses_L1"], json!(25.0));
        assert_eq!(value["spatial_rate"], json!(0.0078125));
        assert_eq!(value["tracked_accesses"], json!(1200));
        let back: Summary = serde_json::from_value(value).unwrap();
        assert_eq!(back, summary);

        let line = LineLocality {
            line: "src/lib.rs:12".into(),
            function: Some("walk".into()),
            a_hat: 1000.0,
            misses_l1: 500.0,
            misses_l2: 125.0,
            misses_llc: 1.0,
        };
        let value = serde_json::to_value(&line).unwrap();
        assert_eq!(
            value,
            json!({ "line": "src/lib.rs:12", "function": "walk", "A_hat": 1000.0,
                    "misses_L1": 500.0, "misses_L2": 125.0, "misses_LLC": 1.0 })
        );
        let sizes = CacheSizes {
            l1: 32768,
            l2: 1 << 20,
            llc: 32 << 20,
            source: "sysfs".into(),
        };
        assert_eq!(
            serde_json::to_value(&sizes).unwrap(),
            json!({ "L1": 32768, "L2": 1048576, "LLC": 33554432, "source": "sysfs" })
        );
    }
}
