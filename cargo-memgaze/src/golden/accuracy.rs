//! Accuracy of a sampled run against its golden full trace
//! (docs/METRICS.md, "Accuracy against a full trace").
//!
//! - Trace windows: per metric (`F`, `ΔF`, `F_str`, `F_irr`), the MAPE over
//!   the rows `k = 3..=⌊log2 w⌋` both runs have (rows whose full value is 0
//!   are skipped, and for `F_str`/`F_irr` also rows where they are below
//!   [`Limits::min_component_share`] of `F`: see there).
//! - Code windows: per function holding at least
//!   [`Limits::min_function_share`] of the full run's accesses, the relative
//!   error of the code-window `ΔF` at the sampled run's `W_c`, and the
//!   absolute differences of `F_str%`, `F_irr%` and `A_const%`.
//! - Undersampling: fewer than [`Limits::min_samples`] samples (per bench,
//!   and per function: samples holding its records), or a 95% bootstrap
//!   confidence interval (over samples) of a compared metric wider than the
//!   metric's limit. The interval is that of the sampled value, expressed
//!   like its error (relative to the full value, or in fraction points), so
//!   its width is the precision the samples buy, whatever the bias.
//! - Whole-run curve: the MAE of the sampled miss-ratio curve against the
//!   snapshot's exact one at the sizes `2^6 … 2^24` blocks, with a 95%
//!   bootstrap interval over the 32 groups of tracked blocks
//!   (`summary.mrc_groups`); undersampled below
//!   [`memgaze_analysis::locality::MIN_TRACKED`] tracked accesses or with an
//!   interval wider than the limit.

use super::samples::{FunctionSums, LevelSums, SampleSet, TraceMetric};
use super::snapshot::GoldenMetrics;
use memgaze_analysis::Analysis;
use memgaze_trace::rng::SplitMix64;
use serde::Serialize;

/// Accuracy limits (defaults: spec'd by issue 7).
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Largest trace-window MAPE, as a fraction (0.15).
    pub trace_mape: f64,
    /// Largest code-window error, as a fraction (0.03): relative for `ΔF`,
    /// absolute for the `%` metrics.
    pub code_error: f64,
    /// Fewest samples a bench, or a compared function, may have (30).
    pub min_samples: u64,
    /// Functions holding at least this share of the full run's accesses
    /// are compared (0.01).
    pub min_function_share: f64,
    /// Rows where `F_str` (`F_irr`) holds less than this share of the full
    /// run's `F` are not compared for that metric (0.01): a relative error
    /// of a negligible component is noise (a strided kernel's three
    /// irregular loads make `F_irr` 10⁻⁷ of `F`; a sample catches one or
    /// none, a 100%–3000% "error" that says nothing about the footprint).
    pub min_component_share: f64,
    /// Largest MAE of the whole-run miss-ratio curve (0.02).
    pub mrc_error: f64,
    /// Bootstrap replicates for the confidence intervals (1000).
    pub replicates: u32,
    /// Seed of the bootstrap's resampling.
    pub seed: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            trace_mape: 0.15,
            code_error: 0.03,
            min_samples: 30,
            min_function_share: 0.01,
            min_component_share: 0.01,
            mrc_error: 0.02,
            replicates: 1000,
            seed: 0x006d_656d_6761_7a65,
        }
    }
}

/// How a compared quantity fared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Within its limit, with a tight enough confidence interval.
    Ok,
    /// Error past the limit.
    Exceeded,
    /// Too few samples, or a confidence interval wider than the limit.
    Undersampled,
    /// Nothing to compare (e.g. the full value is 0 at every row).
    NotCompared,
}

impl Status {
    fn worst(self, other: Status) -> Status {
        let rank = |s: Status| match s {
            Status::Ok | Status::NotCompared => 0,
            Status::Undersampled => 1,
            Status::Exceeded => 2,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// One compared quantity: its error, the 95% interval of the sampled value
/// (in the error's units: relative deviation or fraction points) and the
/// verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Error {
    /// The error (MAPE, relative error or absolute difference); `None` when
    /// not compared.
    pub error: Option<f64>,
    /// 95% bootstrap interval of the signed deviation of the sampled value.
    pub ci: Option<[f64; 2]>,
    /// The limit applied.
    pub limit: f64,
    /// The verdict.
    pub status: Status,
}

impl Error {
    fn judge(error: Option<f64>, ci: Option<[f64; 2]>, limit: f64, enough: bool) -> Error {
        let status = match error {
            None => Status::NotCompared,
            Some(e) if e > limit => Status::Exceeded,
            Some(_) if !enough => Status::Undersampled,
            Some(_) => match ci {
                Some([lo, hi]) if hi - lo > limit => Status::Undersampled,
                _ => Status::Ok,
            },
        };
        Error {
            error,
            ci,
            limit,
            status,
        }
    }
}

/// A trace-window metric's MAPE.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceWindowError {
    /// `F`, `dF`, `F_str` or `F_irr`.
    pub metric: &'static str,
    /// Rows (values of `k`) compared: where the full value is not 0 and,
    /// for `F_str`/`F_irr`, at least [`Limits::min_component_share`] of `F`.
    pub rows: usize,
    /// The MAPE and its verdict.
    #[serde(flatten)]
    pub error: Error,
}

/// A function's code-window errors.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionError {
    /// Function name.
    pub name: String,
    /// Its share of the full run's accesses.
    pub share: f64,
    /// Samples holding its records.
    pub samples: u64,
    /// Its code windows in the sampled run.
    pub windows: u64,
    /// Relative error of the code-window ΔF.
    #[serde(rename = "dF")]
    pub d_f: Error,
    /// Absolute difference of the code-window F_str%.
    #[serde(rename = "F_str_frac")]
    pub f_str_frac: Error,
    /// Absolute difference of the code-window F_irr%.
    #[serde(rename = "F_irr_frac")]
    pub f_irr_frac: Error,
    /// Absolute difference of A_const%.
    #[serde(rename = "A_const_frac")]
    pub a_const_frac: Error,
    /// Worst of the above (and `undersampled` with too few samples).
    pub status: Status,
}

/// The whole-run miss-ratio curve's error.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MrcError {
    /// Tracked accesses of the sampled run.
    pub tracked: u64,
    /// Its spatial sampling rate.
    pub spatial_rate: f64,
    /// Sizes compared.
    pub points: usize,
    /// MAE, the 95% bootstrap interval of the MAE, the limit, the verdict.
    #[serde(flatten)]
    pub error: Error,
}

/// The comparison of one bench.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// Samples of the sampled run.
    pub samples: u64,
    /// `w`.
    pub window: u64,
    /// `w + z`.
    pub period: u64,
    /// Trace-window rows compared: `3..=k_max`.
    pub k_max: u32,
    /// Code-window exponent `k_c`.
    pub code_window_k: u32,
    /// Time-sample records of the sampled run over the full run's records.
    pub trace_size_frac: Option<f64>,
    /// All records of the sampled run (time-sample and spatial) over the
    /// full run's records.
    pub trace_size_frac_total: Option<f64>,
    /// Per metric.
    pub trace_windows: Vec<TraceWindowError>,
    /// Per compared function, most accesses first.
    pub functions: Vec<FunctionError>,
    /// The whole-run curve's error (absent when the run or the snapshot
    /// has no curve).
    pub mrc: Option<MrcError>,
    /// Why the bench fails, one line each (empty when it passes).
    pub problems: Vec<String>,
    /// Worst status.
    pub status: Status,
}

/// A deliberate distortion of the sampled metrics (a test hook: it proves
/// validation catches an error past a limit).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Perturbation {
    /// Multiply a trace-window metric at every `k`.
    TraceWindow(TraceMetric, f64),
    /// Multiply every function's code-window ΔF.
    CodeWindowDf(f64),
}

impl Perturbation {
    /// Parses `trace:F=1.3`, `trace:dF=0.5`, `code:dF=1.1`.
    pub fn parse(text: &str) -> Result<Perturbation, String> {
        let (what, factor) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: expected WHAT=FACTOR"))?;
        let factor: f64 = factor
            .parse()
            .map_err(|_| format!("{text:?}: {factor:?} is not a number"))?;
        match what {
            "code:dF" => Ok(Perturbation::CodeWindowDf(factor)),
            _ => {
                let metric = what
                    .strip_prefix("trace:")
                    .and_then(|m| TraceMetric::ALL.into_iter().find(|t| t.name() == m))
                    .ok_or_else(|| {
                        format!("{text:?}: expected trace:F|dF|F_str|F_irr or code:dF")
                    })?;
                Ok(Perturbation::TraceWindow(metric, factor))
            }
        }
    }

    /// Applies the distortion to a sampled run's analysis and samples.
    pub fn apply(&self, analysis: &mut Analysis, samples: &mut SampleSet) {
        match *self {
            Perturbation::TraceWindow(metric, factor) => {
                for row in &mut analysis.trace_windows {
                    match metric {
                        TraceMetric::F => row.f *= factor,
                        TraceMetric::DF => row.d_f *= factor,
                        TraceMetric::FStr => row.f_str *= factor,
                        TraceMetric::FIrr => row.f_irr *= factor,
                    }
                }
                for sample in &mut samples.samples {
                    for level in &mut sample.levels {
                        match metric {
                            TraceMetric::F => level.f *= factor,
                            TraceMetric::DF => level.d_f *= factor,
                            TraceMetric::FStr => level.f_str *= factor,
                            TraceMetric::FIrr => level.f_irr *= factor,
                        }
                    }
                }
            }
            Perturbation::CodeWindowDf(factor) => {
                for f in &mut analysis.functions {
                    f.d_f = f.d_f.map(|x| x * factor);
                }
                for sample in &mut samples.samples {
                    for (_, sums) in &mut sample.functions {
                        sums.d_f *= factor;
                    }
                }
            }
        }
    }
}

/// Compares a sampled run (its analysis and per-sample sums) with the golden
/// full-trace metrics of the same bench.
///
/// Phases: the trace windows (`compare_trace_windows`), then each function
/// that holds enough of the full run (`named_functions`,
/// `compare_function`), then the overall status. `problems` collects, in
/// that order, the lines a person reads.
pub fn compare(
    golden: &GoldenMetrics,
    sampled: &Analysis,
    samples: &SampleSet,
    limits: &Limits,
) -> Comparison {
    let n = samples.samples.len() as u64;
    let enough = n >= limits.min_samples;
    let mut problems = Vec::new();
    if !enough {
        problems.push(format!(
            "undersampled: {n} samples, fewer than {} (lower --period or raise the bench's size)",
            limits.min_samples
        ));
    }
    let replicates = Bootstrap::new(samples, limits);
    let trace_windows =
        compare_trace_windows(golden, sampled, limits, &replicates, enough, &mut problems);

    let code_k = sampled.run.code_window_k;
    let (golden_functions, sampled_functions) = named_functions(golden, sampled, code_k);
    let full_a = golden.summary.a.max(1) as f64;
    let functions: Vec<FunctionError> = golden_functions
        .iter()
        .filter(|f| f.a as f64 / full_a >= limits.min_function_share)
        .map(|full| {
            let context = FunctionContext {
                samples,
                replicates: &replicates,
                limits,
                code_k,
                share: full.a as f64 / full_a,
            };
            let sampled_f = sampled_functions.iter().find(|f| f.name == full.name);
            compare_function(full, sampled_f, &context, &mut problems)
        })
        .collect();
    if functions.is_empty() {
        problems.push("no function holds enough of the full run's accesses to compare".into());
    }

    let mut status = if enough {
        Status::Ok
    } else {
        Status::Undersampled
    };
    for e in &trace_windows {
        status = status.worst(e.error.status);
    }
    for f in &functions {
        status = status.worst(f.status);
    }
    let mrc = compare_mrc(golden, sampled, limits, &mut problems);
    if let Some(m) = &mrc {
        status = status.worst(m.error.status);
    }
    let full_records = golden.summary.records;
    let share = |records: u64| (full_records > 0).then(|| records as f64 / full_records as f64);
    let coverage = &sampled.coverage;
    Comparison {
        samples: n,
        window: sampled.run.window.unwrap_or(u64::MAX),
        period: sampled.run.period.unwrap_or(u64::MAX),
        k_max: sampled.run.max_k,
        code_window_k: code_k,
        trace_size_frac: share(coverage.records),
        trace_size_frac_total: share(coverage.records + coverage.spatial_records.unwrap_or(0)),
        trace_windows,
        functions,
        mrc,
        problems,
        status,
    }
}

/// The sampled whole-run curve against the snapshot's exact one.
fn compare_mrc(
    golden: &GoldenMetrics,
    sampled: &Analysis,
    limits: &Limits,
    problems: &mut Vec<String>,
) -> Option<MrcError> {
    use memgaze_analysis::locality::{MIN_TRACKED, curve_mae, standard_points};
    let s = &sampled.summary;
    let exact = &golden.summary.whole_run.mrc;
    let (rate, tracked) = (s.spatial_rate?, s.tracked_accesses?);
    if exact.is_empty() {
        return None;
    }
    let estimate = standard_points(&s.whole_run.mrc);
    let mae = curve_mae(&estimate, exact);
    let points = estimate
        .iter()
        .filter(|p| exact.iter().any(|q| q.blocks == p.blocks))
        .count();
    let ci = mrc_interval(sampled, exact, limits);
    let enough = tracked >= MIN_TRACKED;
    let mut error = Error::judge(mae, ci, limits.mrc_error, enough);
    if !enough && error.status == Status::Exceeded {
        // A curve from so few blocks is noise either way: an error past the
        // limit says no more about the estimator than one within it.
        error.status = Status::Undersampled;
    }
    match error.status {
        Status::Exceeded => problems.push(format!(
            "whole-run miss-ratio curve: MAE {:.4} > {}",
            mae.unwrap_or(0.0),
            limits.mrc_error
        )),
        Status::Undersampled if !enough => problems.push(format!(
            "whole-run miss-ratio curve undersampled: {tracked} tracked accesses, fewer than {MIN_TRACKED} (MAE {:.4}, not judged)",
            mae.unwrap_or(0.0)
        )),
        Status::Undersampled => problems.push(format!(
            "whole-run miss-ratio curve: 95% interval of the MAE wider than {}",
            limits.mrc_error
        )),
        _ => {}
    }
    Some(MrcError {
        tracked,
        spatial_rate: rate,
        points,
        error,
    })
}

/// 95% bootstrap interval of the curve's MAE: the 32 block groups
/// resampled with replacement, each replicate's curve their sum.
fn mrc_interval(
    sampled: &Analysis,
    exact: &[memgaze_analysis::MrcPoint],
    limits: &Limits,
) -> Option<[f64; 2]> {
    let s = &sampled.summary;
    let groups = &s.mrc_groups;
    if groups.is_empty() || limits.replicates == 0 {
        return None;
    }
    // The points of the curve compared, with their exact values.
    let compared: Vec<(usize, f64)> = s
        .whole_run
        .mrc
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let q = exact.iter().find(|q| q.blocks == p.blocks)?;
            Some((i, q.miss_ratio))
        })
        .collect();
    if compared.is_empty() {
        return None;
    }
    let mut rng = SplitMix64::new(limits.seed ^ 0x006d_7263);
    let mut maes: Vec<f64> = (0..limits.replicates)
        .map(|_| {
            let mut curve = vec![0.0; s.whole_run.mrc.len()];
            for _ in 0..groups.len() {
                let g = &groups[rng.below(groups.len() as u64) as usize];
                for (c, x) in curve.iter_mut().zip(g) {
                    *c += x;
                }
            }
            compared
                .iter()
                .map(|&(i, want)| (curve[i].clamp(0.0, 1.0) - want).abs())
                .sum::<f64>()
                / compared.len() as f64
        })
        .collect();
    maes.sort_by(f64::total_cmp);
    let at = |q: f64| maes[((maes.len() - 1) as f64 * q).round() as usize];
    Some([at(0.025), at(0.975)])
}

/// The trace-window metrics: for each, the mean relative error over the
/// window sizes both runs have (components only where they are a real
/// share of F), judged with its bootstrap interval.
fn compare_trace_windows(
    golden: &GoldenMetrics,
    sampled: &Analysis,
    limits: &Limits,
    replicates: &Bootstrap,
    enough: bool,
    problems: &mut Vec<String>,
) -> Vec<TraceWindowError> {
    let rows: Vec<(
        u32,
        &memgaze_analysis::WindowRow,
        &memgaze_analysis::WindowRow,
    )> = (3..=sampled.run.max_k)
        .filter_map(|k| {
            let full = golden.trace_windows.iter().find(|r| r.k == k)?;
            let sampled = sampled.trace_windows.iter().find(|r| r.k == k)?;
            Some((k, full, sampled))
        })
        .collect();
    let mut trace_windows = Vec::new();
    for metric in TraceMetric::ALL {
        let component = matches!(metric, TraceMetric::FStr | TraceMetric::FIrr);
        let compared: Vec<(u32, f64, f64)> = rows
            .iter()
            .filter(|(_, full, _)| {
                let value = metric.of_row(full);
                value != 0.0 && (!component || value >= limits.min_component_share * full.f)
            })
            .map(|&(k, full, sampled)| (k, metric.of_row(full), metric.of_row(sampled)))
            .collect();
        let mape = (!compared.is_empty()).then(|| {
            compared
                .iter()
                .map(|&(_, full, sampled)| ((sampled - full) / full).abs())
                .sum::<f64>()
                / compared.len() as f64
        });
        let ci = replicates.trace_interval(metric, &compared);
        let error = Error::judge(mape, ci, limits.trace_mape, enough);
        match error.status {
            Status::Exceeded => problems.push(format!(
                "trace-window MAPE of {} is {:.1}%, over the {:.1}% limit",
                metric.name(),
                100.0 * mape.unwrap_or(0.0),
                100.0 * limits.trace_mape
            )),
            Status::Undersampled if enough => problems.push(format!(
                "undersampled: the 95% interval of trace-window {} is {:.1}% wide, over the {:.1}% limit",
                metric.name(),
                100.0 * ci.map_or(0.0, |[lo, hi]| hi - lo),
                100.0 * limits.trace_mape
            )),
            _ => {}
        }
        trace_windows.push(TraceWindowError {
            metric: metric.name(),
            rows: compared.len(),
            error,
        });
    }
    trace_windows
}

/// The functions of both runs by name, the only identity a snapshot keeps:
/// distinct functions of one name (a generic function's instances, which
/// demangle alike) are compared as one, merged alike on both sides (and in
/// the per-sample sums), so no instance is compared with another's metrics.
/// The golden side's code-window values are its row at `code_k`.
fn named_functions<'a>(
    golden: &'a GoldenMetrics,
    sampled: &'a Analysis,
    code_k: u32,
) -> (Vec<NamedFunction<'a>>, Vec<NamedFunction<'a>>) {
    let golden_functions = NamedFunction::merge(golden.functions.iter().map(|f| {
        let row = f.trace_windows.iter().find(|r| r.k == code_k);
        NamedFunction {
            name: &f.name,
            instances: 1,
            a: f.a,
            a_const: f.a_const,
            a_const_frac: f.a_const_frac,
            code: row.map(|r| CodeWindows {
                windows: r.windows,
                d_f: r.d_f,
                f_str_frac: r.f_str_frac,
                f_irr_frac: r.f_irr_frac,
            }),
        }
    }));
    let sampled_functions = NamedFunction::merge(sampled.functions.iter().map(|f| NamedFunction {
        name: &f.name,
        instances: 1,
        a: f.a,
        a_const: f.a_const,
        a_const_frac: f.a_const_frac,
        code: (f.code_windows > 0).then(|| CodeWindows {
            windows: f.code_windows,
            d_f: f.d_f.unwrap_or(0.0),
            f_str_frac: f.f_str_frac.unwrap_or(0.0),
            f_irr_frac: f.f_irr_frac.unwrap_or(0.0),
        }),
    }));
    (golden_functions, sampled_functions)
}

/// What judging one function needs besides the function itself.
struct FunctionContext<'a> {
    samples: &'a SampleSet,
    replicates: &'a Bootstrap<'a>,
    limits: &'a Limits,
    /// The code-window size exponent `k_c`.
    code_k: u32,
    /// The function's share of the full run's accesses.
    share: f64,
}

/// Judges one function of the golden run against its namesake in the
/// sampled run (`None`: not seen there), and says why where it fails or
/// cannot be judged.
fn compare_function(
    full: &NamedFunction,
    sampled_f: Option<&NamedFunction>,
    context: &FunctionContext,
    problems: &mut Vec<String>,
) -> FunctionError {
    let FunctionContext {
        samples,
        replicates,
        limits,
        code_k,
        share,
    } = *context;
    let index = samples.function_index(full.name);
    let function_samples = index.map_or(0, |i| replicates.function_samples(i));
    let windows = sampled_f.and_then(|f| f.code).map_or(0, |c| c.windows);
    let f_enough = function_samples >= limits.min_samples && windows > 0;
    let full_row = full.code;
    let missing = || Error {
        error: None,
        ci: None,
        limit: limits.code_error,
        status: Status::Undersampled,
    };
    let (d_f, f_str, f_irr) = match (full_row, sampled_f.and_then(|f| f.code)) {
        (Some(row), Some(f)) => {
            let ci = |get: fn(&FunctionSums) -> f64, full: f64, relative: bool| {
                index.and_then(|i| replicates.function_interval(i, get, full, relative))
            };
            let d_f = f.d_f;
            let rel = (row.d_f != 0.0).then(|| ((d_f - row.d_f) / row.d_f).abs());
            (
                Error::judge(
                    rel,
                    ci(|s| s.d_f, row.d_f, true),
                    limits.code_error,
                    f_enough,
                ),
                Error::judge(
                    Some((f.f_str_frac - row.f_str_frac).abs()),
                    ci(|s| s.f_str_frac, row.f_str_frac, false),
                    limits.code_error,
                    f_enough,
                ),
                Error::judge(
                    Some((f.f_irr_frac - row.f_irr_frac).abs()),
                    ci(|s| s.f_irr_frac, row.f_irr_frac, false),
                    limits.code_error,
                    f_enough,
                ),
            )
        }
        _ => (missing(), missing(), missing()),
    };
    let a_const_frac = match (full.a_const_frac, sampled_f.and_then(|f| f.a_const_frac)) {
        (Some(full_frac), Some(frac)) => Error::judge(
            Some((frac - full_frac).abs()),
            index.and_then(|i| replicates.a_const_interval(i, full_frac)),
            limits.code_error,
            f_enough,
        ),
        _ => missing(),
    };
    let mut status = [&d_f, &f_str, &f_irr, &a_const_frac]
        .iter()
        .fold(Status::Ok, |s, e| s.worst(e.status));
    if !f_enough && status != Status::Exceeded {
        status = Status::Undersampled;
    }
    let merged = if full.instances > 1 {
        format!(
            "{} functions of this name, compared as one; ",
            full.instances
        )
    } else {
        String::new()
    };
    let label = format!(
        "function `{}` ({merged}{:.1}% of accesses)",
        full.name,
        100.0 * share
    );
    if function_samples < limits.min_samples {
        problems.push(format!(
            "undersampled: {label} is in {function_samples} samples, fewer than {}",
            limits.min_samples
        ));
    } else if windows == 0 {
        problems.push(format!(
            "undersampled: {label} has no code window of 2^{code_k} records in any sample"
        ));
    } else if full_row.is_none() {
        // Its code-window metrics are not compared (undersampled); say
        // why, or the bench fails without a reason (w < 8 gives k_c < 3,
        // below the snapshot's first row; else the snapshot was edited).
        let why = if code_k < 3 {
            " (its rows start at 2^3)"
        } else {
            ""
        };
        problems.push(format!(
            "undersampled: {label}: the golden snapshot has no code window of 2^{code_k} records to compare with{why}"
        ));
    }
    for (name, e) in [
        ("dF", &d_f),
        ("F_str%", &f_str),
        ("F_irr%", &f_irr),
        ("A_const%", &a_const_frac),
    ] {
        match e.status {
            Status::Exceeded => problems.push(format!(
                "{label}: code-window {name} error {:.2}%, over the {:.1}% limit",
                100.0 * e.error.unwrap_or(0.0),
                100.0 * limits.code_error
            )),
            Status::Undersampled if f_enough => {
                if let Some([lo, hi]) = e.ci {
                    problems.push(format!(
                        "undersampled: {label}: the 95% interval of code-window {name} is {:.2}% wide, over the {:.1}% limit",
                        100.0 * (hi - lo),
                        100.0 * limits.code_error
                    ));
                }
            }
            _ => {}
        }
    }
    FunctionError {
        name: full.name.to_string(),
        share,
        samples: function_samples,
        windows,
        d_f,
        f_str_frac: f_str,
        f_irr_frac: f_irr,
        a_const_frac,
        status,
    }
}

/// A function's code-window metrics at `k_c`: window count and averages.
#[derive(Clone, Copy, Debug, PartialEq)]
struct CodeWindows {
    windows: u64,
    d_f: f64,
    f_str_frac: f64,
    f_irr_frac: f64,
}

/// What validation compares of the functions of one name (usually one).
#[derive(Clone, Debug, PartialEq)]
struct NamedFunction<'a> {
    name: &'a str,
    /// Distinct functions of this name merged into this one.
    instances: usize,
    a: u64,
    a_const: u64,
    a_const_frac: Option<f64>,
    code: Option<CodeWindows>,
}

impl<'a> NamedFunction<'a> {
    /// Merges functions of the same name (first appearance keeps its
    /// place, then most accesses first): counts add up and the window
    /// averages are weighted by window counts, which is exactly the average
    /// over the union of their windows. A name met once is kept unchanged.
    fn merge(functions: impl Iterator<Item = NamedFunction<'a>>) -> Vec<NamedFunction<'a>> {
        let mut merged: Vec<NamedFunction<'a>> = Vec::new();
        // Where each name is in `merged` (a map: a large program's snapshot
        // lists thousands of functions).
        let mut position: std::collections::HashMap<&'a str, usize> = Default::default();
        for f in functions {
            let Some(&at) = position.get(f.name) else {
                position.insert(f.name, merged.len());
                merged.push(f);
                continue;
            };
            let m = &mut merged[at];
            m.instances += f.instances;
            m.a += f.a;
            m.a_const += f.a_const;
            let total = m.a + m.a_const;
            m.a_const_frac = (total > 0).then(|| m.a_const as f64 / total as f64);
            m.code = match (m.code, f.code) {
                (Some(x), Some(y)) => {
                    let n = (x.windows + y.windows) as f64;
                    let (wx, wy) = (x.windows as f64, y.windows as f64);
                    let mean = |a: f64, b: f64| (a * wx + b * wy) / n;
                    Some(CodeWindows {
                        windows: x.windows + y.windows,
                        d_f: mean(x.d_f, y.d_f),
                        f_str_frac: mean(x.f_str_frac, y.f_str_frac),
                        f_irr_frac: mean(x.f_irr_frac, y.f_irr_frac),
                    })
                }
                (x, y) => x.or(y),
            };
        }
        // Stable: equal counts keep their order of first appearance.
        merged.sort_by_key(|f| std::cmp::Reverse(f.a));
        merged
    }
}

/// Bootstrap replicates of the sample set: `replicates` draws of `n`
/// samples with replacement, each stored as per-sample multiplicities so
/// every statistic is a weighted sum.
struct Bootstrap<'a> {
    samples: &'a SampleSet,
    /// `weights[b][s]`: how often sample `s` is drawn in replicate `b`.
    weights: Vec<Vec<u32>>,
}

/// Uniform in `0..n` (multiply-shift on the high 32 bits; the bias is below
/// 2^-32 for the sample counts of a trace). Not [`SplitMix64::below`]: this
/// narrower form is what drew every replicate so far, and a seed must keep
/// giving the same intervals.
fn below(rng: &mut SplitMix64, n: usize) -> usize {
    (((rng.next_u64() >> 32) * n as u64) >> 32) as usize
}

impl<'a> Bootstrap<'a> {
    fn new(samples: &'a SampleSet, limits: &Limits) -> Self {
        let n = samples.samples.len();
        let mut rng = SplitMix64::new(limits.seed);
        let weights = if n == 0 {
            Vec::new()
        } else {
            (0..limits.replicates)
                .map(|_| {
                    let mut w = vec![0u32; n];
                    for _ in 0..n {
                        w[below(&mut rng, n)] += 1;
                    }
                    w
                })
                .collect()
        };
        Bootstrap { samples, weights }
    }

    /// Samples holding records of function `index`.
    fn function_samples(&self, index: usize) -> u64 {
        self.samples
            .samples
            .iter()
            .filter(|s| s.functions.iter().any(|(i, _)| *i == index))
            .count() as u64
    }

    /// 95% interval of the mean relative deviation over the compared rows
    /// `(k, full, sampled)`: per replicate, `mean_k (value_k − full_k) /
    /// full_k`.
    fn trace_interval(&self, metric: TraceMetric, rows: &[(u32, f64, f64)]) -> Option<[f64; 2]> {
        if rows.is_empty() || self.weights.is_empty() {
            return None;
        }
        let mut values = Vec::with_capacity(self.weights.len());
        for weights in &self.weights {
            let mut total = 0.0;
            let mut counted = 0usize;
            for &(k, full, _) in rows {
                let mut sums = LevelSums::default();
                for (sample, &w) in self.samples.samples.iter().zip(weights) {
                    if w == 0 {
                        continue;
                    }
                    if let Some(level) = sample.levels.get(k as usize - 3) {
                        let scaled = LevelSums {
                            windows: level.windows * u64::from(w),
                            f: level.f * f64::from(w),
                            d_f: level.d_f * f64::from(w),
                            f_str: level.f_str * f64::from(w),
                            f_irr: level.f_irr * f64::from(w),
                        };
                        sums.add(&scaled);
                    }
                }
                if let Some(mean) = sums.mean(metric) {
                    total += (mean - full) / full;
                    counted += 1;
                }
            }
            if counted > 0 {
                values.push(total / counted as f64);
            }
        }
        interval(values)
    }

    /// 95% interval of a function's code-window metric: relative deviation
    /// from `full` when `relative`, else the difference.
    fn function_interval(
        &self,
        index: usize,
        get: fn(&FunctionSums) -> f64,
        full: f64,
        relative: bool,
    ) -> Option<[f64; 2]> {
        if relative && full == 0.0 {
            return None;
        }
        let values = self.function_replicates(index, |sums| {
            (sums.windows > 0).then(|| {
                let mean = get(sums) / sums.windows as f64;
                if relative {
                    (mean - full) / full
                } else {
                    mean - full
                }
            })
        });
        interval(values)
    }

    /// 95% interval of a function's `A_const%` minus the full value.
    fn a_const_interval(&self, index: usize, full: f64) -> Option<[f64; 2]> {
        let values = self.function_replicates(index, |sums| {
            let total = sums.a + sums.a_const;
            (total > 0).then(|| sums.a_const as f64 / total as f64 - full)
        });
        interval(values)
    }

    fn function_replicates(
        &self,
        index: usize,
        statistic: impl Fn(&FunctionSums) -> Option<f64>,
    ) -> Vec<f64> {
        // The function's sums per sample, once.
        let per_sample: Vec<Option<FunctionSums>> = self
            .samples
            .samples
            .iter()
            .map(|s| {
                s.functions
                    .iter()
                    .find(|(i, _)| *i == index)
                    .map(|(_, f)| *f)
            })
            .collect();
        let mut values = Vec::with_capacity(self.weights.len());
        for weights in &self.weights {
            let mut total = FunctionSums::default();
            for (sums, &w) in per_sample.iter().zip(weights) {
                if let (Some(sums), true) = (sums, w > 0) {
                    let w64 = u64::from(w);
                    let wf = f64::from(w);
                    total.add(&FunctionSums {
                        a: sums.a * w64,
                        a_const: sums.a_const * w64,
                        windows: sums.windows * w64,
                        d_f: sums.d_f * wf,
                        f_str_frac: sums.f_str_frac * wf,
                        f_irr_frac: sums.f_irr_frac * wf,
                    });
                }
            }
            if let Some(value) = statistic(&total) {
                values.push(value);
            }
        }
        values
    }
}

/// The 2.5th and 97.5th percentiles (linear interpolation).
fn interval(mut values: Vec<f64>) -> Option<[f64; 2]> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let at = |p: f64| {
        let x = p * (values.len() - 1) as f64;
        let (i, frac) = (x.floor() as usize, x - x.floor());
        let next = values[(i + 1).min(values.len() - 1)];
        values[i] + frac * (next - values[i])
    };
    Some([at(0.025), at(0.975)])
}

#[cfg(test)]
mod tests {
    use super::super::samples::SampleBreakdown;
    use super::super::snapshot::GoldenMetrics;
    use super::*;
    use memgaze_analysis::{AnalysisOptions, Analyzer};
    use memgaze_trace::{Sampling, TraceHeader, TraceTotals};

    /// A stationary synthetic program: every window looks alike, so a
    /// sampled run of it must validate.
    fn program(total: u64) -> impl Iterator<Item = (u32, u64)> {
        let mut state = 42u64;
        let mut i = 0u64;
        (0..total).map(move |j| {
            if j % 50 == 49 {
                return (2, 0x7ff0_0000);
            }
            if j % 2 == 0 {
                i += 1;
                (0, 0x10_0000 + 4 * (i % 100_000))
            } else {
                irregular_load(&mut state)
            }
        })
    }

    /// Alternates, every 20 000 records, between a phase of strided loads
    /// only and one of irregular loads only: every window of up to 2^9
    /// records is all one class, so a sample's `F_str` is all or nothing.
    fn phased(total: u64) -> impl Iterator<Item = (u32, u64)> {
        let mut state = 7u64;
        (0..total).map(move |j| {
            if (j / 20_000) % 2 == 0 {
                (0, 0x10_0000 + 4 * (j % 100_000))
            } else {
                irregular_load(&mut state)
            }
        })
    }

    /// Load 1: a pseudo-random gather over 200 000 words (one LCG step).
    fn irregular_load(state: &mut u64) -> (u32, u64) {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (1, 0x80_0000 + 8 * ((*state >> 33) % 200_000))
    }

    fn full_metrics(header: &TraceHeader, total: u64) -> GoldenMetrics {
        full_metrics_of(header, total, program(total))
    }

    fn full_metrics_of(
        header: &TraceHeader,
        total: u64,
        records: impl Iterator<Item = (u32, u64)>,
    ) -> GoldenMetrics {
        let header = TraceHeader {
            sampling: Sampling::full(),
            ..header.clone()
        };
        let mut analyzer = Analyzer::new(&header, &AnalysisOptions::default()).unwrap();
        for (load, addr) in records {
            analyzer.push_load(load, addr, 0, 0);
        }
        let analysis = analyzer.finish(&TraceTotals::clean(total, total, 1));
        GoldenMetrics::from_analysis("p", "t", "b", &analysis)
    }

    /// Samples `window` records every `period` of the program.
    fn sampled(
        header: &TraceHeader,
        total: u64,
        window: u64,
        period: u64,
    ) -> (Analysis, SampleSet) {
        sampled_of(header, total, window, period, program(total))
    }

    fn sampled_of(
        header: &TraceHeader,
        total: u64,
        window: u64,
        period: u64,
        program: impl Iterator<Item = (u32, u64)>,
    ) -> (Analysis, SampleSet) {
        let header = TraceHeader {
            sampling: Sampling {
                window,
                period,
                seed: Some(3),
            },
            ..header.clone()
        };
        let options = AnalysisOptions::default();
        let mut analyzer = Analyzer::new(&header, &options).unwrap();
        let mut breakdown = SampleBreakdown::new(&header, &options);
        let mut samples = 0u64;
        let mut records = 0u64;
        for (j, (load, addr)) in program.enumerate() {
            let j = j as u64;
            // Start each sample at a varying offset in its period.
            let offset = (j / period * 7919) % (period - window);
            let phase = j % period;
            if phase == offset {
                breakdown.begin_sample().unwrap();
                samples += 1;
            }
            if phase >= offset && phase < offset + window {
                analyzer.push_load(load, addr, samples - 1, 0);
                breakdown.push(load, addr, 0);
                records += 1;
            }
        }
        let analysis = analyzer.finish(&TraceTotals::clean(total, records, samples));
        (analysis, breakdown.finish().unwrap())
    }

    fn header() -> TraceHeader {
        super::super::samples::tests::header(1000, 100_000)
    }

    #[test]
    fn a_well_sampled_stationary_program_passes() {
        let header = header();
        let total = 600_000;
        let golden = full_metrics(&header, total);
        let (analysis, samples) = sampled(&header, total, 1000, 5_000);
        let c = compare(&golden, &analysis, &samples, &Limits::default());
        assert_eq!(c.status, Status::Ok, "{:#?}", c);
        assert_eq!(c.samples, 120);
        assert_eq!(c.k_max, 9);
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        let f = &c.trace_windows[0];
        assert_eq!((f.metric, f.rows), ("F", 7));
        assert!(f.error.error.unwrap() < 0.01, "{f:?}");
        let [lo, hi] = f.error.ci.unwrap();
        assert!(lo <= hi && hi - lo < 0.15, "{lo} {hi}");
        let size = c.trace_size_frac.unwrap();
        assert!((size - 0.2).abs() < 0.001, "{size}");
        // No spatial records: both shares are the same.
        assert_eq!(c.trace_size_frac_total, c.trace_size_frac);
        // The kernel is compared; the helper holds ~1% of accesses but only
        // Constant loads (A = 0), so it is not.
        assert_eq!(c.functions.len(), 1);
        assert_eq!(c.functions[0].name, "kernel");
        assert_eq!(c.functions[0].status, Status::Ok, "{:#?}", c.functions);
    }

    /// The total share counts the spatial records on top of the
    /// time-sample ones.
    #[test]
    fn the_total_trace_share_adds_the_spatial_records() {
        let header = header();
        let total = 600_000;
        let golden = full_metrics(&header, total);
        let (mut analysis, samples) = sampled(&header, total, 1000, 5_000);
        let time_records = analysis.coverage.records;
        analysis.coverage.spatial_records = Some(6_000);
        let c = compare(&golden, &analysis, &samples, &Limits::default());
        let full = golden.summary.records as f64;
        assert_eq!(c.trace_size_frac, Some(time_records as f64 / full));
        assert_eq!(
            c.trace_size_frac_total,
            Some((time_records + 6_000) as f64 / full)
        );
    }

    #[test]
    fn too_few_samples_are_undersampled_not_passed() {
        let header = header();
        let total = 600_000;
        let golden = full_metrics(&header, total);
        let (analysis, samples) = sampled(&header, total, 1000, 30_000);
        assert_eq!(samples.samples.len(), 20);
        let c = compare(&golden, &analysis, &samples, &Limits::default());
        assert_eq!(c.status, Status::Undersampled);
        assert!(
            c.problems[0].contains("20 samples, fewer than 30"),
            "{:?}",
            c.problems
        );
    }

    /// Enough samples and an unbiased mean are not enough: when samples
    /// disagree so much that the 95% interval is wider than the limit, the
    /// run is undersampled (docs/METRICS.md), not passed.
    #[test]
    fn a_wide_interval_is_undersampled_even_when_the_error_is_small() {
        let header = header();
        let total = 600_000;
        let golden = full_metrics_of(&header, total, phased(total));
        // Four samples in every phase: the mean is right, but each sample
        // sees one class only.
        let (analysis, samples) = sampled_of(&header, total, 1000, 5_000, phased(total));
        assert_eq!(samples.samples.len(), 120);
        let c = compare(&golden, &analysis, &samples, &Limits::default());
        assert_eq!(c.status, Status::Undersampled, "{c:#?}");
        let f_str = c
            .trace_windows
            .iter()
            .find(|e| e.metric == "F_str")
            .unwrap();
        assert_eq!(f_str.error.status, Status::Undersampled, "{f_str:?}");
        assert!(f_str.error.error.unwrap() < 0.05, "{f_str:?}");
        let [lo, hi] = f_str.error.ci.unwrap();
        assert!(hi - lo > Limits::default().trace_mape, "{lo} {hi}");
        assert!(
            c.problems
                .iter()
                .any(|p| p.contains("95% interval of trace-window F_str")),
            "{:?}",
            c.problems
        );
        let kernel = &c.functions[0];
        assert_eq!(kernel.f_str_frac.status, Status::Undersampled, "{kernel:?}");
        // The same program sampled in every period of 500 records instead
        // (1200 samples of 250) averages out: the interval narrows.
        let (analysis, samples) = sampled_of(&header, total, 250, 500, phased(total));
        let c = compare(&golden, &analysis, &samples, &Limits::default());
        let f_str = c
            .trace_windows
            .iter()
            .find(|e| e.metric == "F_str")
            .unwrap();
        let [lo, hi] = f_str.error.ci.unwrap();
        assert!(hi - lo < Limits::default().trace_mape, "{lo} {hi}");
    }

    #[test]
    fn a_perturbed_metric_exceeds_its_limit() {
        let header = header();
        let total = 600_000;
        let golden = full_metrics(&header, total);
        let (mut analysis, mut samples) = sampled(&header, total, 1000, 5_000);
        Perturbation::parse("trace:F_irr=1.2")
            .unwrap()
            .apply(&mut analysis, &mut samples);
        let c = compare(&golden, &analysis, &samples, &Limits::default());
        assert_eq!(c.status, Status::Exceeded);
        let f_irr = c
            .trace_windows
            .iter()
            .find(|e| e.metric == "F_irr")
            .unwrap();
        assert!((f_irr.error.error.unwrap() - 0.2).abs() < 0.02, "{f_irr:?}");
        assert!(
            c.problems.iter().any(|p| p.contains("MAPE of F_irr")),
            "{:?}",
            c.problems
        );

        let (mut analysis, mut samples) = sampled(&header, total, 1000, 5_000);
        Perturbation::parse("code:dF=1.05")
            .unwrap()
            .apply(&mut analysis, &mut samples);
        let c = compare(&golden, &analysis, &samples, &Limits::default());
        assert_eq!(
            c.functions[0].d_f.status,
            Status::Exceeded,
            "{:?}",
            c.functions[0]
        );
        assert_eq!(c.status, Status::Exceeded);
    }

    /// A curve from fewer than `MIN_TRACKED` tracked accesses is called
    /// undersampled whatever its error (docs/METRICS.md): one far off the
    /// exact curve is not reported as the estimator exceeding its limit,
    /// while the same error from enough accesses is.
    #[test]
    fn a_curve_from_too_few_tracked_accesses_is_undersampled_not_exceeded() {
        use memgaze_analysis::locality::MIN_TRACKED;
        let header = header();
        let total = 600_000;
        let golden = full_metrics(&header, total);
        assert!(!golden.summary.whole_run.mrc.is_empty());
        let (mut analysis, samples) = sampled(&header, total, 1000, 5_000);
        analysis.summary.spatial_rate = Some(1.0 / 128.0);
        analysis.summary.whole_run.mrc = golden.summary.whole_run.mrc.clone();
        for point in &mut analysis.summary.whole_run.mrc {
            point.miss_ratio = (point.miss_ratio + 0.2).min(1.0);
        }
        for (tracked, expected) in [
            (MIN_TRACKED - 1, Status::Undersampled),
            (MIN_TRACKED, Status::Exceeded),
        ] {
            analysis.summary.tracked_accesses = Some(tracked);
            let c = compare(&golden, &analysis, &samples, &Limits::default());
            let mrc = c.mrc.as_ref().expect("the curve is compared");
            assert_eq!(mrc.error.status, expected, "{tracked}: {mrc:?}");
            assert!(mrc.error.error.unwrap() > 0.02, "{mrc:?}");
            let undersampled = c.problems.iter().any(|p| p.contains("curve undersampled"));
            assert_eq!(
                undersampled,
                expected == Status::Undersampled,
                "{:?}",
                c.problems
            );
        }
    }

    #[test]
    fn a_negligible_component_is_not_compared() {
        let header = header();
        let total = 600_000;
        let mut golden = full_metrics(&header, total);
        let (analysis, samples) = sampled(&header, total, 1000, 5_000);
        // Pretend the full run's F_str were a trace of its F.
        for row in &mut golden.trace_windows {
            row.f_str = row.f * 0.001;
        }
        let c = compare(&golden, &analysis, &samples, &Limits::default());
        let f_str = c
            .trace_windows
            .iter()
            .find(|e| e.metric == "F_str")
            .unwrap();
        assert_eq!((f_str.rows, f_str.error.status), (0, Status::NotCompared));
        let f_irr = c
            .trace_windows
            .iter()
            .find(|e| e.metric == "F_irr")
            .unwrap();
        assert_eq!(f_irr.rows, 7);
    }

    /// Two distinct functions with one name (a generic function's
    /// instances demangle alike): one all strided, one all irregular. The
    /// snapshot keeps names only, so validation must compare them as one on
    /// both sides. Found by an outside check (two `sort_unstable`
    /// instances): every snapshot entry of the name was compared with the
    /// first sampled function of that name (here: a 100-point `F_str%`
    /// "error"), and the per-sample sums kept one instance per sample.
    #[test]
    fn functions_of_one_name_are_compared_as_one() {
        use memgaze_trace::{FunctionEntry, LoadClass, LoadEntry};
        let function = |name: &str, start| FunctionEntry {
            name: name.into(),
            start,
            end: start + 0x100,
        };
        let load = |ip, class, function| LoadEntry {
            ip,
            class,
            implied: 0,
            function: Some(function),
            line: None,
            proxy: None,
        };
        let header = TraceHeader {
            functions: vec![
                function("kernel", 0x1000),
                function("helper", 0x2000),
                function("kernel", 0x3000),
            ],
            loads: vec![
                load(0x1010, LoadClass::Strided, 0),
                load(0x3020, LoadClass::Irregular, 2),
                load(0x2010, LoadClass::Constant, 1),
            ],
            ..super::super::samples::tests::header(4096, 20_000)
        };
        // Alternates load 0 (strided, first `kernel`) and load 1 (irregular,
        // second `kernel`): with w = 4096 each instance has two code windows
        // of 2^10 records in every sample, as many as the other (the merged
        // averages weigh instances by their windows; see ARCHITECTURE.md, "Golden snapshots and accuracy").
        let alternating = |total: u64| {
            let mut state = 42u64;
            (0..total).map(move |j| {
                if j % 2 == 0 {
                    (0, 0x10_0000 + 4 * ((j / 2) % 100_000))
                } else {
                    irregular_load(&mut state)
                }
            })
        };
        let total = 2_400_000;
        let golden = full_metrics_of(&header, total, alternating(total));
        let kernels: Vec<_> = golden
            .functions
            .iter()
            .filter(|f| f.name == "kernel")
            .collect();
        assert_eq!(kernels.len(), 2, "{:?}", golden.functions);
        let (analysis, samples) = sampled_of(&header, total, 4096, 20_000, alternating(total));
        assert_eq!(samples.samples.len(), 120);
        for sample in &samples.samples {
            let mut indices: Vec<usize> = sample.functions.iter().map(|(i, _)| *i).collect();
            let n = indices.len();
            indices.dedup();
            assert_eq!(indices.len(), n, "one entry per name and sample");
        }
        let c = compare(&golden, &analysis, &samples, &Limits::default());
        assert_eq!(c.functions.len(), 1, "{:#?}", c.functions);
        let kernel = &c.functions[0];
        assert_eq!(kernel.name, "kernel");
        let share: f64 = kernels.iter().map(|f| f.a as f64).sum::<f64>() / golden.summary.a as f64;
        assert!((kernel.share - share).abs() < 1e-12, "{kernel:?}");
        assert_eq!(kernel.samples, 120);
        assert_eq!((c.code_window_k, kernel.windows), (10, 480), "{kernel:?}");
        assert_eq!(kernel.status, Status::Ok, "{kernel:#?}");
        for e in [&kernel.f_str_frac, &kernel.f_irr_frac, &kernel.d_f] {
            assert!(e.error.unwrap() < 0.01, "{kernel:#?}");
            // The interval is of the merged sums too: it holds the deviation.
            let [lo, hi] = e.ci.unwrap();
            assert!(lo <= 0.01 && hi >= -0.01, "{kernel:#?}");
        }
        assert_eq!(c.status, Status::Ok, "{:?}", c.problems);
    }

    /// A compared function without a snapshot row at `k_c` (here removed;
    /// in practice `--window` below 8) is undersampled, and a problem line
    /// says why: found by an outside check, the bench failed with none.
    #[test]
    fn a_missing_snapshot_row_is_a_stated_problem() {
        let header = header();
        let total = 600_000;
        let mut golden = full_metrics(&header, total);
        let (analysis, samples) = sampled(&header, total, 1000, 5_000);
        let kernel = golden
            .functions
            .iter_mut()
            .find(|f| f.name == "kernel")
            .unwrap();
        kernel.trace_windows.retain(|r| r.k != 9);
        let c = compare(&golden, &analysis, &samples, &Limits::default());
        assert_eq!(c.status, Status::Undersampled, "{c:#?}");
        assert_eq!(c.functions[0].d_f.status, Status::Undersampled);
        assert!(
            c.problems.iter().any(|p| p.contains("`kernel`")
                && p.contains("no code window of 2^9 records to compare with")),
            "{:?}",
            c.problems
        );
    }

    #[test]
    fn perturbation_syntax() {
        assert_eq!(
            Perturbation::parse("trace:dF=0.5"),
            Ok(Perturbation::TraceWindow(TraceMetric::DF, 0.5))
        );
        assert_eq!(
            Perturbation::parse("code:dF=2"),
            Ok(Perturbation::CodeWindowDf(2.0))
        );
        assert!(Perturbation::parse("trace:G=1").is_err());
        assert!(Perturbation::parse("trace:F").is_err());
        assert!(Perturbation::parse("trace:F=x").is_err());
    }

    #[test]
    fn intervals_are_percentiles() {
        let values: Vec<f64> = (0..=1000).map(f64::from).collect();
        assert_eq!(interval(values), Some([25.0, 975.0]));
        assert_eq!(interval(vec![]), None);
        assert_eq!(interval(vec![2.0]), Some([2.0, 2.0]));
    }
}
