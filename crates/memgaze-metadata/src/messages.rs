//! The JSON lines of `bench`, `golden` and `validate`
//! (`--message-format json`, docs/CLI.md): one type per `"reason"`.
//!
//! Each line is one object with a [`Reason`]; a reader can parse the
//! `reason` first and then the whole line as its type. Keys are written in
//! lexicographic (byte) order, which is the order the fields are declared
//! in; nested documents taken from the analysis ([`BenchFinished::summary`],
//! [`BenchFinished::coverage`]) and the per-metric rows of a
//! [`Validation`] are written with their keys in that order too.
//! Paths are written as strings.

use crate::analysis::{Coverage, Summary};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What a line reports: its `"reason"` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// [`BuildFinished`].
    BuildFinished,
    /// [`BenchListed`].
    BenchListed,
    /// [`BenchStarted`].
    BenchStarted,
    /// [`BenchFinished`].
    BenchFinished,
    /// [`BenchFailed`].
    BenchFailed,
    /// [`BaselineComparison`].
    BaselineComparison,
    /// [`Regression`].
    Regression,
    /// [`Report`].
    Report,
    /// [`BenchSummary`] (`bench`) or [`SuiteSummary`] (`golden`,
    /// `validate`): the last line.
    Summary,
    /// [`Golden`].
    Golden,
    /// [`GoldenOrphan`].
    GoldenOrphan,
    /// [`GoldenFactsDiffer`].
    GoldenFactsDiffer,
    /// [`Validation`].
    Validation,
}

/// A bench target built and about to run (`bench`, first line).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BuildFinished {
    /// Always [`Reason::BuildFinished`].
    pub reason: Reason,
    /// Whether the build succeeded (a failed build is an error instead).
    pub success: bool,
    /// The bench targets built, with their benches.
    pub targets: Vec<BuiltTarget>,
}

/// One bench target of [`BuildFinished`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BuiltTarget {
    /// Names of its benches, as the harness lists them.
    pub benches: Vec<String>,
    /// The bench executable cargo built.
    pub executable: PathBuf,
    /// Package name.
    pub package: String,
    /// Bench target name.
    pub target: String,
}

/// One bench, listed by `bench -- --list`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchListed {
    /// The bench executable.
    pub executable: PathBuf,
    /// Whether the bench is ignored (run with `-- --include-ignored`).
    pub ignored: bool,
    /// Bench name.
    pub name: String,
    /// Package name.
    pub package: String,
    /// Always [`Reason::BenchListed`].
    pub reason: Reason,
    /// Bench target name.
    pub target: String,
}

/// A bench starts recording.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchStarted {
    /// Bench name.
    pub name: String,
    /// Package name.
    pub package: String,
    /// Always [`Reason::BenchStarted`].
    pub reason: Reason,
    /// Bench target name.
    pub target: String,
}

/// A bench measured: where its results are and its whole-trace metrics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchFinished {
    /// Its `analysis.json`.
    pub analysis: PathBuf,
    /// What the analysis saw but did not analyse.
    #[serde(serialize_with = "sorted")]
    pub coverage: Coverage,
    /// Wall time of the recording and analysis, seconds.
    pub elapsed_s: f64,
    /// The bench's harness: `memgaze` (memgaze-harness), `criterion` or `divan`.
    pub harness: String,
    /// Runs of the bench routine the trace covers, where the harness
    /// reports them (memgaze-harness, divan); absent for criterion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterations: Option<u64>,
    /// Bench name.
    pub name: String,
    /// Package name.
    pub package: String,
    /// Always [`Reason::BenchFinished`].
    pub reason: Reason,
    /// Wall time of the measured runs, as the harness reported it, ns
    /// (absent where the harness reports none: criterion's profiling mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_ns: Option<u64>,
    /// Its results directory.
    pub results: PathBuf,
    /// How it was sampled.
    pub sampling: SamplingInfo,
    /// The analysis summary.
    #[serde(serialize_with = "sorted")]
    pub summary: Summary,
    /// Bench target name.
    pub target: String,
    /// Its trace file, when one was kept.
    pub trace: Option<PathBuf>,
    /// The `warning:` lines a person sees for this bench (such as
    /// undersampling), without the prefix; absent in messages of versions
    /// that printed them on stderr only.
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// A bench whose body failed (panicked or exited non-zero).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchFailed {
    /// What went wrong.
    pub message: String,
    /// Bench name.
    pub name: String,
    /// Package name.
    pub package: String,
    /// Always [`Reason::BenchFailed`].
    pub reason: Reason,
    /// Bench target name.
    pub target: String,
}

/// A bench compared with a baseline (`bench --baseline`): every compared
/// metric; one [`Regression`] line follows per regression.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaselineComparison {
    /// Name of the baseline.
    pub baseline: String,
    /// Bench name.
    pub bench: String,
    /// Whether the baseline has this bench (a new bench passes).
    pub has_baseline: bool,
    /// Every metric with a value on either side, gated ones first.
    pub metrics: Vec<MetricComparison>,
    /// Things the reader should know (undersampling, missing windows).
    pub notes: Vec<String>,
    /// Package name.
    pub package: String,
    /// Always [`Reason::BaselineComparison`].
    pub reason: Reason,
    /// Regressions found (the [`Regression`] lines that follow).
    pub regressions: usize,
    /// Bench target name.
    pub target: String,
    /// The window exponent `k` at which the window metrics were compared.
    pub window_k: Option<u32>,
}

/// One metric of a [`BaselineComparison`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricComparison {
    /// `new − old`, when both exist.
    pub change: Option<f64>,
    /// `(new − old) / |old|`, when both exist and `old` is not 0.
    pub change_frac: Option<f64>,
    /// Its limit (`+10%`, `+0.02`, …), when gated.
    pub limit: Option<String>,
    /// Metric name (`dF`, `F_irr_frac`, …).
    pub metric: String,
    /// This run's value.
    pub new: Option<f64>,
    /// The baseline's value.
    pub old: Option<f64>,
    /// Whether the change broke the limit.
    pub regressed: bool,
}

/// A metric that broke its limit against the baseline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Regression {
    /// Name of the baseline.
    pub baseline: String,
    /// Bench name.
    pub bench: String,
    /// `new − old`.
    pub change: f64,
    /// `(new − old) / |old|`; null when `old` is 0.
    pub change_frac: Option<f64>,
    /// The limit it broke.
    pub limit: String,
    /// Metric name.
    pub metric: String,
    /// This run's value.
    pub new: f64,
    /// The baseline's value.
    pub old: f64,
    /// Package name.
    pub package: String,
    /// Always [`Reason::Regression`].
    pub reason: Reason,
    /// Bench target name.
    pub target: String,
}

/// The HTML report written after the benches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Benches reported.
    pub benches: usize,
    /// The report's `index.html`.
    pub index: PathBuf,
    /// Always [`Reason::Report`].
    pub reason: Reason,
    /// Problems that did not stop the report, one line each.
    pub warnings: Vec<String>,
}

/// The last line of `bench`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchSummary {
    /// Benches selected.
    pub benches: usize,
    /// Wall time of the whole command after the build, seconds.
    pub elapsed_s: f64,
    /// Benches whose body failed.
    pub failed: usize,
    /// Benches measured.
    pub measured: usize,
    /// Always [`Reason::Summary`].
    pub reason: Reason,
    /// The results directory.
    pub results: PathBuf,
}

/// The last line of `golden` and `validate`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SuiteSummary {
    /// Benches selected.
    pub benches: usize,
    /// Benches per status (`unchanged`, `differs`, … or `ok`,
    /// `exceeded`, `undersampled`).
    pub counts: BTreeMap<String, usize>,
    /// Wall time of the whole command after the build, seconds.
    pub elapsed_s: f64,
    /// Always [`Reason::Summary`].
    pub reason: Reason,
}

/// One bench's golden snapshot checked or written (`golden`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Golden {
    /// The metrics that differ, one line each (`differs`), or why the
    /// full trace cannot be snapshotted (`incomplete`).
    pub changes: Vec<String>,
    /// Wall time of the full-trace recording and analysis, seconds.
    pub elapsed_s: f64,
    /// Bench name.
    pub name: String,
    /// Package name.
    pub package: String,
    /// The `.snap.new` file written for review, if any.
    pub pending: Option<PathBuf>,
    /// Always [`Reason::Golden`].
    pub reason: Reason,
    /// Records of the full trace.
    pub records: u64,
    /// The snapshot file.
    pub snapshot: PathBuf,
    /// `unchanged`, `created`, `updated`, `missing`, `differs` or
    /// `incomplete` (no snapshot written or checked).
    pub status: String,
    /// Bench target name.
    pub target: String,
}

/// A snapshot that belongs to no bench (`golden`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GoldenOrphan {
    /// Whether it was deleted (`--update`).
    pub deleted: bool,
    /// Always [`Reason::GoldenOrphan`].
    pub reason: Reason,
    /// The snapshot file.
    pub snapshot: PathBuf,
}

/// The snapshots were recorded under other build facts (`golden`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GoldenFactsDiffer {
    /// What differs, for people.
    pub message: String,
    /// Always [`Reason::GoldenFactsDiffer`].
    pub reason: Reason,
}

/// One bench's sampled run against its golden full trace (`validate`).
///
/// The per-metric rows are the accuracy types of `cargo-memgaze`'s golden
/// module (`W` for the trace-window metrics, `F` for the functions); read
/// back, they are JSON values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(serialize = "W: Serialize, F: Serialize"))]
pub struct Validation<W = serde_json::Value, F = serde_json::Value> {
    /// Code-window exponent `k_c`.
    pub code_window_k: u32,
    /// Wall time of the sampled recording and analysis, seconds.
    pub elapsed_s: f64,
    /// Per compared function, most accesses first.
    #[serde(serialize_with = "sorted")]
    pub functions: Vec<F>,
    /// Trace-window rows compared: `3..=k_max`.
    pub k_max: u32,
    /// The whole-run miss-ratio curve's error against the golden exact
    /// curve: `{ "error" (MAE), "ci" (95% bootstrap interval of the MAE),
    /// "limit", "status", "tracked", "spatial_rate", "points" }`; absent
    /// when the run or the snapshot has no curve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mrc: Option<serde_json::Value>,
    /// Bench name.
    pub name: String,
    /// Package name.
    pub package: String,
    /// `w + z`.
    pub period: u64,
    /// Why the bench fails, one line each (empty when it passes).
    pub problems: Vec<String>,
    /// Always [`Reason::Validation`].
    pub reason: Reason,
    /// Samples of the sampled run.
    pub samples: u64,
    /// How it was sampled.
    pub sampling: SamplingInfo,
    /// `ok`, `exceeded` or `undersampled`; `missing` for a bench without a
    /// golden snapshot (not run: `problems` says so, the numbers are 0).
    pub status: String,
    /// Bench target name.
    pub target: String,
    /// Time-sample records of the sampled run over the full run's records.
    pub trace_size_frac: Option<f64>,
    /// All records of the sampled run (time-sample and spatial) over the
    /// full run's records.
    pub trace_size_frac_total: Option<f64>,
    /// Per trace-window metric.
    #[serde(serialize_with = "sorted")]
    pub trace_windows: Vec<W>,
    /// `w`.
    pub window: u64,
}

/// The `sampling` object of [`BenchFinished`] and [`Validation`]:
/// `{"full": true}` for a full trace, else
/// `{"full": false, "period", "seed", "window"}` (`seed` null when the
/// recorder used none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SamplingInfo {
    /// A full trace: every execution recorded.
    Full,
    /// `window` records out of every `period`.
    Sampled {
        /// `w + z`.
        period: u64,
        /// Seed of the period jitter.
        seed: Option<u64>,
        /// `w`.
        window: u64,
    },
}

impl Serialize for SamplingInfo {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match *self {
            SamplingInfo::Full => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("full", &true)?;
                m.end()
            }
            SamplingInfo::Sampled {
                period,
                seed,
                window,
            } => {
                let mut m = s.serialize_map(Some(4))?;
                m.serialize_entry("full", &false)?;
                m.serialize_entry("period", &period)?;
                m.serialize_entry("seed", &seed)?;
                m.serialize_entry("window", &window)?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for SamplingInfo {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Fields {
            full: bool,
            period: Option<u64>,
            seed: Option<u64>,
            window: Option<u64>,
        }
        let f = Fields::deserialize(d)?;
        match (f.full, f.period, f.window) {
            (true, _, _) => Ok(SamplingInfo::Full),
            (false, Some(period), Some(window)) => Ok(SamplingInfo::Sampled {
                period,
                seed: f.seed,
                window,
            }),
            _ => Err(serde::de::Error::custom(
                "a sampled run needs \"period\" and \"window\"",
            )),
        }
    }
}

/// Writes `value` with the keys of every object in lexicographic order
/// (through a `serde_json::Value`, whose maps are sorted), as the lines
/// have always had them.
fn sorted<T: Serialize, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    serde_json::to_value(value)
        .map_err(serde::ser::Error::custom)?
        .serialize(s)
}

#[cfg(test)]
mod tests;
