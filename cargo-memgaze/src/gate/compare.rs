//! Comparing runs with a baseline: which metrics changed, which changes
//! are regressions, and how to say so to people (`old → new (Δ%)`) and to
//! scripts (`"reason": "regression"` JSON objects).

use super::baseline::{Baseline, BaselineBench, BenchKey, BenchRun, Recording};
use super::limits::{Limit, Limits};
use super::metric::{Metric, common_window_k, windows_at};
use anyhow::Result;
use memgaze_error::{Exit, usage};
use memgaze_metadata::messages::{self, Reason};
use std::fmt::Write as _;

/// Fewer samples than this make a sampled run's metrics too noisy to gate
/// (docs/METRICS.md, "Undersampling").
pub const MIN_SAMPLES: u64 = 30;

/// How much an undersampled comparison widens the limits of sampled
/// metrics: `√(MIN_SAMPLES / n)` for `0 < n < MIN_SAMPLES` samples (the
/// smaller of the two runs), rounded to two decimals; `None` from
/// `MIN_SAMPLES` on. The default limits are ≥ 3σ of the sampling noise of
/// a difference of two runs at `MIN_SAMPLES` samples (ARCHITECTURE.md,
/// "Default regression limits"); that σ grows as `1/√n`, so this keeps the
/// same margin for short benches instead of failing them on noise, while a
/// change of access pattern (a fraction moving by 0.5 and more, `ΔF` or
/// `D` doubling) still exceeds the widened limits down to a few samples.
pub fn noise_factor(samples: u64) -> Option<f64> {
    (samples > 0 && samples < MIN_SAMPLES)
        .then(|| ((MIN_SAMPLES as f64 / samples as f64).sqrt() * 100.0).round() / 100.0)
}

/// A metric that got worse than its limit allows.
#[derive(Clone, Debug, PartialEq)]
pub struct Regression {
    /// The bench.
    pub bench: BenchKey,
    /// The metric.
    pub metric: Metric,
    /// Baseline value.
    pub old: f64,
    /// This run's value.
    pub new: f64,
    /// How it changed.
    pub change: Change,
    /// The limit it broke.
    pub limit: Limit,
}

/// A metric's change between two runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Change {
    /// `new − old`.
    pub absolute: f64,
    /// `(new − old) / |old|`; `None` when `old` is 0.
    pub relative: Option<f64>,
}

impl Change {
    /// The change from `old` to `new`.
    pub fn between(old: f64, new: f64) -> Change {
        Change {
            absolute: new - old,
            relative: (old != 0.0).then(|| (new - old) / old.abs()),
        }
    }

    /// The change as `limit` measures it: the absolute change (`+0.9`)
    /// where the limit is absolute only — a fraction moving from 6e-7 to
    /// 1 reads as `+1`, not `+174284700.0%` — else as `Display` shows it.
    pub fn against(&self, limit: Option<&Limit>) -> String {
        match limit {
            Some(Limit {
                relative: None,
                absolute: Some(_),
                ..
            }) if self.relative.is_some() => {
                let sign = if self.absolute >= 0.0 { "+" } else { "" };
                format!("{sign}{}", number(self.absolute))
            }
            _ => self.to_string(),
        }
    }
}

impl std::fmt::Display for Change {
    /// `+12.5%`, or the absolute change when there is no relative one.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.relative {
            Some(r) => write!(f, "{:+.1}%", r * 100.0),
            None => {
                let sign = if self.absolute >= 0.0 { "+" } else { "" };
                write!(f, "{sign}{} from 0", number(self.absolute))
            }
        }
    }
}

/// A metric value for messages: up to four significant digits, no
/// exponent for everyday magnitudes.
fn number(value: f64) -> String {
    let a = value.abs();
    let trimmed = |text: String| text.trim_end_matches('0').trim_end_matches('.').to_string();
    if value.fract() == 0.0 && a < 1e15 || a >= 1000.0 {
        format!("{value:.0}")
    } else if a >= 1.0 {
        trimmed(format!("{value:.3}"))
    } else if a >= 1e-4 {
        trimmed(format!("{value:.4}"))
    } else {
        format!("{value:.2e}")
    }
}

impl Regression {
    /// `str1 (microbenches/micro): dF 0.125 → 0.25 (+100.0%; limit +10% and +0.02)`.
    pub fn human(&self) -> String {
        format!(
            "{}: {} {} → {} ({}; limit {})",
            self.bench,
            self.metric,
            number(self.old),
            number(self.new),
            self.change.against(Some(&self.limit)),
            self.limit
        )
    }

    /// The `"reason": "regression"` message of the bench JSON stream.
    pub fn to_message(&self, baseline: &str) -> messages::Regression {
        messages::Regression {
            baseline: baseline.to_string(),
            bench: self.bench.bench.clone(),
            change: self.change.absolute,
            change_frac: self.change.relative,
            limit: self.limit.to_string(),
            metric: self.metric.name().to_string(),
            new: self.new,
            old: self.old,
            package: self.bench.package.clone(),
            reason: Reason::Regression,
            target: self.bench.target.clone(),
        }
    }
}

/// One metric of one bench, compared.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricComparison {
    /// The metric.
    pub metric: Metric,
    /// Baseline value (`None`: undefined there).
    pub old: Option<f64>,
    /// This run's value.
    pub new: Option<f64>,
    /// Its limit, when gated.
    pub limit: Option<Limit>,
    /// Whether the change broke the limit.
    pub regressed: bool,
}

/// How one bench fared against the baseline.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchVerdict {
    /// The bench.
    pub bench: BenchKey,
    /// Every metric with a value on either side, gated ones first.
    pub metrics: Vec<MetricComparison>,
    /// The limits it broke.
    pub regressions: Vec<Regression>,
    /// The window size (`2^k` accesses) at which `dF`, `F_str_frac` and
    /// `F_irr_frac` were compared.
    pub window_k: Option<u32>,
    /// Whether the baseline had this bench at all (a new bench passes).
    pub has_baseline: bool,
    /// Things the reader should know (undersampling, missing windows).
    pub notes: Vec<String>,
}

impl BenchVerdict {
    /// The lines to print for people: one per regression, or a short
    /// "within limits" line.
    pub fn human(&self, baseline: &str) -> String {
        let mut out = String::new();
        if !self.has_baseline {
            let _ = writeln!(
                out,
                "{}: not in baseline `{baseline}`, nothing to compare",
                self.bench
            );
        } else if self.regressions.is_empty() {
            let gated = self
                .metrics
                .iter()
                .filter(|m| m.limit.is_some() && m.old.is_some() && m.new.is_some())
                .count();
            let _ = if gated == 0 {
                writeln!(
                    out,
                    "{}: nothing compared with baseline `{baseline}`: no gated metric has a value in both runs",
                    self.bench
                )
            } else {
                writeln!(
                    out,
                    "{}: within limits of baseline `{baseline}` ({gated} metrics compared)",
                    self.bench
                )
            };
        } else {
            for r in &self.regressions {
                let _ = writeln!(out, "regression: {}", r.human());
            }
        }
        for note in &self.notes {
            let _ = writeln!(out, "note: {}: {note}", self.bench);
        }
        out
    }

    /// The `"reason": "baseline-comparison"` message of the bench JSON
    /// stream (every compared metric), and the `"regression"` messages
    /// that follow it, one per regression.
    pub fn to_messages(
        &self,
        baseline: &str,
    ) -> (messages::BaselineComparison, Vec<messages::Regression>) {
        let metrics = self
            .metrics
            .iter()
            .map(|m| {
                let change = match (m.old, m.new) {
                    (Some(old), Some(new)) => Some(Change::between(old, new)),
                    _ => None,
                };
                messages::MetricComparison {
                    change: change.map(|c| c.absolute),
                    change_frac: change.and_then(|c| c.relative),
                    limit: m.limit.map(|l| l.to_string()),
                    metric: m.metric.name().to_string(),
                    new: m.new,
                    old: m.old,
                    regressed: m.regressed,
                }
            })
            .collect();
        let comparison = messages::BaselineComparison {
            baseline: baseline.to_string(),
            bench: self.bench.bench.clone(),
            has_baseline: self.has_baseline,
            metrics,
            notes: self.notes.clone(),
            package: self.bench.package.clone(),
            reason: Reason::BaselineComparison,
            regressions: self.regressions.len(),
            target: self.bench.target.clone(),
            window_k: self.window_k,
        };
        let regressions = self
            .regressions
            .iter()
            .map(|r| r.to_message(baseline))
            .collect();
        (comparison, regressions)
    }
}

/// Refuses to compare runs recorded differently: their metrics measure
/// different things (D depends on `w`; the window means on the sampling).
pub fn check_comparable(
    bench: &BenchKey,
    baseline_name: &str,
    old: &Recording,
    new: &Recording,
) -> Result<()> {
    if old == new {
        return Ok(());
    }
    Err(usage(format!(
        "cannot compare {bench} with baseline `{baseline_name}`: the baseline was recorded with {old}, this run with {new}; \
         record both the same way (or save a new baseline)"
    )))
}

/// The shared libraries whose loads an analysis traced (`--libs`), by
/// file name, sorted: the instrumented rows of its coverage by object that
/// are shared objects (`lib….so…`; the executable and joined programs are
/// not).
pub fn instrumented_libraries(analysis: &memgaze_analysis::Analysis) -> Vec<&str> {
    let mut names: Vec<&str> = analysis
        .summary
        .coverage_by_object
        .iter()
        .filter(|o| o.instrumented && o.object.contains(".so"))
        .map(|o| o.object.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Refuses to compare a run that traced shared libraries' loads with one
/// that traced none (`--libs none` against `--libs default`: every total
/// would move by the libraries' loads); runs whose sets of instrumented
/// libraries differ otherwise (a library the program newly links) are
/// compared, and the difference is returned as a note.
pub fn check_same_libraries(
    bench: &BenchKey,
    baseline_name: &str,
    old: &memgaze_analysis::Analysis,
    new: &memgaze_analysis::Analysis,
) -> Result<Option<String>> {
    let (old, new) = (instrumented_libraries(old), instrumented_libraries(new));
    if old == new {
        return Ok(None);
    }
    let show = |names: &[&str]| {
        if names.is_empty() {
            "none (--libs none)".to_string()
        } else {
            names.join(", ")
        }
    };
    if old.is_empty() || new.is_empty() {
        return Err(usage(format!(
            "cannot compare {bench} with baseline `{baseline_name}`: the baseline traced the loads of shared libraries {}, this run of {}; \
             record both with the same --libs (or save a new baseline)",
            show(&old),
            show(&new)
        )));
    }
    Ok(Some(format!(
        "the instrumented libraries differ (baseline {}, this run {}): their loads are in one run's totals only",
        show(&old),
        show(&new)
    )))
}

/// Refuses to compare builds of different cargo profiles (another
/// optimisation level is another program: every metric would move). A
/// side whose profile is unknown (a baseline saved before profiles were
/// recorded) is compared.
pub fn check_same_profile(
    bench: &BenchKey,
    baseline_name: &str,
    old: Option<&str>,
    new: Option<&str>,
) -> Result<()> {
    match (old, new) {
        (Some(old), Some(new)) if old != new => Err(usage(format!(
            "cannot compare {bench} with baseline `{baseline_name}`: the baseline was built with the `{old}` profile, this run with `{new}`; \
             build both with the same --profile (or save a new baseline)"
        ))),
        _ => Ok(()),
    }
}

/// Compares one bench's run with its saved baseline under `limits`.
pub fn compare_bench(
    baseline_name: &str,
    old: &BaselineBench,
    new: &BenchRun,
    limits: &Limits,
) -> Result<BenchVerdict> {
    check_same_profile(
        &new.key,
        baseline_name,
        old.profile.as_deref(),
        new.profile.as_deref(),
    )?;
    compare_analysis(baseline_name, old, &new.key, &new.analysis, limits)
}

/// The note for a whole-run curve from fewer than
/// [`memgaze_analysis::locality::MIN_TRACKED`] tracked accesses: with none,
/// `MR_*` were not estimated at all (so not compared), rather than noisy.
fn undersampled_curve_note(which: &str, tracked: u64) -> String {
    if tracked == 0 {
        format!(
            "whole-run curve of {which} empty (no spatially sampled block was touched): MR_* not estimated, not compared"
        )
    } else {
        format!(
            "whole-run curve of {which} undersampled ({tracked} tracked accesses, < {}): MR_* are noisy",
            memgaze_analysis::locality::MIN_TRACKED
        )
    }
}

/// [`compare_bench`] for an analysis that is not wrapped in a [`BenchRun`].
pub fn compare_analysis(
    baseline_name: &str,
    old: &BaselineBench,
    key: &BenchKey,
    analysis: &memgaze_analysis::Analysis,
    limits: &Limits,
) -> Result<BenchVerdict> {
    let new_recording = Recording::of(analysis);
    check_comparable(key, baseline_name, &old.recording, &new_recording)?;
    let mut notes = Vec::new();
    notes.extend(check_same_libraries(
        key,
        baseline_name,
        &old.analysis,
        analysis,
    )?);
    let adjusted = super::metric::at_cache_sizes_of(&old.analysis, analysis);
    if let (Some(_), Some(o), Some(n)) = (
        &adjusted,
        &old.analysis.run.cache_sizes,
        &analysis.run.cache_sizes,
    ) {
        notes.push(format!(
            "cache sizes differ (baseline {}/{}/{} B, this run {}/{}/{} B): the baseline's MR_* and misses_* are read off its curve at this run's sizes",
            o.l1, o.l2, o.llc, n.l1, n.l2, n.llc
        ));
    }
    let (a, b) = (adjusted.as_ref().unwrap_or(&old.analysis), analysis);
    for (which, x) in [("baseline", a), ("this run", b)] {
        if let (Some(rate), Some(tracked)) = (x.summary.spatial_rate, x.summary.tracked_accesses)
            && rate < 1.0
            && tracked < memgaze_analysis::locality::MIN_TRACKED
        {
            notes.push(undersampled_curve_note(which, tracked));
        }
    }
    if let Some(timed) = [a, b]
        .into_iter()
        .find(|x| super::metric::run_count_chosen_by_time(x))
    {
        notes.push(match super::metric::timed_framework(timed) {
            Some("divan") => "A_hat and misses_* not compared: divan picks how many times the routine runs by time, and its table gave no count for this bench (a `threads` bench has a row per thread count), so totals differ by that alone",
            _ => "A_hat and misses_* not compared: criterion's profiling mode picks how many times the routine runs by time and reports no count, so totals differ by that alone",
        }.to_string());
    }
    let unlike_workloads = timed_workloads_differ(a, b);
    if let Some((old_loads, new_loads)) = unlike_workloads {
        notes.push(format!(
            "MR_* not compared: the framework picked how often the routine runs by time, and the two runs executed {} and {} loads (more than ×{WORKLOAD_TOLERANCE} apart); their miss ratios count cold misses and batched inputs over different amounts of work",
            number(old_loads),
            number(new_loads)
        ));
    }
    let unlike_batches = timed_batches_differ(a, b);
    if let Some((old_runs, new_runs)) = unlike_batches {
        notes.push(format!(
            "MR_* and misses_* not compared: the framework picked batches of {old_runs} and {new_runs} runs by time, and a batch's inputs (divan's `with_inputs`) are all live while it runs, so the two runs' working sets differ"
        ));
    }
    let window_k = common_window_k(a, b);
    let mut widen = None;
    if !new_recording.full {
        let (old_samples, new_samples) = (a.summary.samples, b.summary.samples);
        let short: Vec<String> = [("baseline", old_samples), ("this run", new_samples)]
            .into_iter()
            .filter(|(_, n)| *n < MIN_SAMPLES)
            .map(|(which, n)| format!("{which} {n}"))
            .collect();
        if !short.is_empty() {
            notes.push(format!(
                "undersampled ({} samples, < {MIN_SAMPLES}): too noisy to gate reliably — lower --period or run the bench longer",
                short.join(", ")
            ));
        }
        let samples = old_samples.min(new_samples);
        widen = noise_factor(samples);
        if let Some(factor) = widen {
            notes.push(format!(
                "limits of sampled metrics widened ×{factor} (√({MIN_SAMPLES}/{samples})) to keep sampling noise inside them"
            ));
        }
    }
    match window_k {
        Some(k) if k < a.run.code_window_k.min(b.run.code_window_k) => notes.push(format!(
            "no window of the code-window size in both runs; dF, F_str_frac and F_irr_frac compared over windows of {} accesses",
            1u64 << k
        )),
        None => notes.push("no trace window in both runs: dF, F_str_frac and F_irr_frac not compared".to_string()),
        _ => {}
    }
    let mut metrics = Vec::new();
    let mut regressions = Vec::new();
    let mut noisy = Vec::new();
    let gated = Metric::ALL.into_iter().filter(|m| limits.get(*m).is_some());
    let ungated = Metric::ALL.into_iter().filter(|m| limits.get(*m).is_none());
    for metric in gated.chain(ungated) {
        if metric.is_miss_ratio() && unlike_workloads.is_some() {
            continue;
        }
        if metric.counts_misses() && unlike_batches.is_some() {
            continue;
        }
        let old_value = metric.value(a, window_k);
        let new_value = metric.value(b, window_k);
        if old_value.is_none() && new_value.is_none() {
            continue;
        }
        let limit = limits.get(metric).map(|limit| match widen {
            Some(factor) if metric.is_sampled() => limit.widened(factor),
            _ => match super::noise::widened(metric, limit, a, b) {
                Some(wider) => {
                    noisy.push(metric.name());
                    wider
                }
                None => *limit,
            },
        });
        let regressed = match (limit, old_value, new_value) {
            (Some(limit), Some(old_v), Some(new_v)) => limit.exceeded(old_v, new_v),
            _ => false,
        };
        if regressed {
            let (old_v, new_v) = (old_value.unwrap_or_default(), new_value.unwrap_or_default());
            regressions.push(Regression {
                bench: key.clone(),
                metric,
                old: old_v,
                new: new_v,
                change: Change::between(old_v, new_v),
                limit: limit.expect("regressed implies a limit"),
            });
        }
        metrics.push(MetricComparison {
            metric,
            old: old_value,
            new: new_value,
            limit,
            regressed,
        });
    }
    if !noisy.is_empty() {
        notes.push(format!(
            "limits of {} widened to {}σ of the spatial-sampling noise of the two runs (misses_*: at least 2% of the loads per run)",
            noisy.join(", "),
            super::noise::NOISE_SIGMAS
        ));
    }
    if let Some(k) = window_k {
        let (wa, wb) = (windows_at(a, k), windows_at(b, k));
        if !new_recording.full && wa.min(wb) < MIN_SAMPLES {
            notes.push(format!(
                "only {} windows of {} accesses in {}: dF, F_str_frac and F_irr_frac are noisy",
                wa.min(wb),
                1u64 << k,
                if wa < wb { "the baseline" } else { "this run" }
            ));
        }
    }
    Ok(BenchVerdict {
        bench: key.clone(),
        metrics,
        regressions,
        window_k,
        has_baseline: true,
        notes,
    })
}

/// How far apart two runs' executed loads may be for their miss ratios to
/// be compared when a framework chose the run count by time.
pub const WORKLOAD_TOLERANCE: f64 = 1.25;

/// The estimated executed loads (`Â`) of `old` and `new` when either ran
/// its routine a number of times chosen by time (criterion, divan without
/// a count) and they are more than [`WORKLOAD_TOLERANCE`] apart. Whole-run
/// miss ratios depend on the amount of work: cold misses are spread over
/// the runs, and criterion's `iter_batched` sizes its batch of live inputs
/// from the same timing, so a loaded machine's run (half the iterations,
/// half the batch) is a different workload, not a regression.
fn timed_workloads_differ(
    old: &memgaze_analysis::Analysis,
    new: &memgaze_analysis::Analysis,
) -> Option<(f64, f64)> {
    use super::metric::run_count_chosen_by_time;
    if !run_count_chosen_by_time(old) && !run_count_chosen_by_time(new) {
        return None;
    }
    let (old_loads, new_loads) = (old.summary.a_hat?, new.summary.a_hat?);
    let (low, high) = (old_loads.min(new_loads), old_loads.max(new_loads));
    (low > 0.0 && high > low * WORKLOAD_TOLERANCE).then_some((old_loads, new_loads))
}

/// The runs per timed batch of `old` and `new` when a framework chose them
/// by time (divan) and they differ. Divan makes a batch's `with_inputs`
/// inputs before timing it and keeps them all until it ends, so the batch
/// size sets the bench's working set: a batch of 16 inputs of 8 KiB misses
/// in a 48 KiB L1 where a batch of 1 fits, with no change in the code.
/// Divan doubles its batch until a batch outlasts the timer's precision,
/// so a few percent of timing jitter can double it.
fn timed_batches_differ(
    old: &memgaze_analysis::Analysis,
    new: &memgaze_analysis::Analysis,
) -> Option<(u64, u64)> {
    use super::metric::timed_framework;
    if timed_framework(old).is_none() && timed_framework(new).is_none() {
        return None;
    }
    let (old_runs, new_runs) = (old.summary.runs_per_batch?, new.summary.runs_per_batch?);
    (old_runs != new_runs).then_some((old_runs, new_runs))
}

/// A regression gate over a run of several benches: check each bench as
/// it finishes, stop early under `--fail-fast`, and end with the exit code.
///
/// ```no_run
/// # use memgaze::gate::{Gate, Limits, load_baseline, BenchRun};
/// # fn runs() -> Vec<BenchRun> { vec![] }
/// # fn main() -> anyhow::Result<()> {
/// let root = std::path::Path::new("target/memgaze");
/// let mut gate = Gate::new(load_baseline(root, "main")?, Limits::defaults(), false);
/// for run in runs() {
///     let verdict = gate.check(&run)?;
///     print!("{}", verdict.human(gate.baseline_name()));
///     if gate.should_stop() {
///         break;
///     }
/// }
/// std::process::exit(gate.exit().code());
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Gate {
    baseline: Baseline,
    limits: Limits,
    fail_fast: bool,
    regressions: Vec<Regression>,
    checked: usize,
    /// Benches checked that the baseline does not hold (nothing compared).
    not_in_baseline: usize,
}

impl Gate {
    /// A gate comparing with `baseline` under `limits`; with `fail_fast`,
    /// [`Gate::should_stop`] turns true at the first regression.
    pub fn new(baseline: Baseline, limits: Limits, fail_fast: bool) -> Gate {
        Gate {
            baseline,
            limits,
            fail_fast,
            regressions: Vec::new(),
            checked: 0,
            not_in_baseline: 0,
        }
    }

    /// The baseline's name.
    pub fn baseline_name(&self) -> &str {
        &self.baseline.name
    }

    /// The baseline compared with.
    pub fn baseline(&self) -> &Baseline {
        &self.baseline
    }

    /// The limits applied.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Compares one bench's run. Errors (with exit code 2) when the bench
    /// was recorded differently from its baseline or built with another
    /// cargo profile.
    pub fn check(&mut self, run: &BenchRun) -> Result<BenchVerdict> {
        self.checked += 1;
        let Some(old) = self.baseline.bench(&run.key) else {
            self.not_in_baseline += 1;
            return Ok(BenchVerdict {
                bench: run.key.clone(),
                metrics: Vec::new(),
                regressions: Vec::new(),
                window_k: None,
                has_baseline: false,
                notes: Vec::new(),
            });
        };
        let mut verdict = compare_bench(&self.baseline.name, old, run, &self.limits)?;
        if self.fail_fast {
            verdict.regressions.truncate(1);
            if !self.regressions.is_empty() {
                verdict.regressions.clear();
            }
        }
        self.regressions.extend(verdict.regressions.iter().cloned());
        Ok(verdict)
    }

    /// Whether a fail-fast gate has seen its first regression.
    pub fn should_stop(&self) -> bool {
        self.fail_fast && !self.regressions.is_empty()
    }

    /// Every regression so far.
    pub fn regressions(&self) -> &[Regression] {
        &self.regressions
    }

    /// `Exit::Regression` (3) if any bench regressed, else `Exit::Ok`.
    pub fn exit(&self) -> Exit {
        if self.regressions.is_empty() {
            Exit::Ok
        } else {
            Exit::Regression
        }
    }

    /// A closing summary line for people. Benches the baseline does not
    /// hold are counted apart: they passed without being compared, and a
    /// run none of whose benches is in the baseline must not read as one
    /// within its limits.
    pub fn summary(&self) -> String {
        let compared = self.checked - self.not_in_baseline;
        let not_in_baseline = match self.not_in_baseline {
            0 => String::new(),
            n => format!("; {n} not in the baseline (nothing compared)"),
        };
        match self.regressions.len() {
            0 if compared == 0 => format!(
                "nothing compared with baseline `{}`: none of the {} bench(es) checked is in it",
                self.baseline.name, self.checked
            ),
            0 => format!(
                "{compared} bench(es) within the limits of baseline `{}` ({}){not_in_baseline}",
                self.baseline.name, self.limits
            ),
            n => format!(
                "{n} regression(s) against baseline `{}` in {} bench(es) checked{not_in_baseline}{}",
                self.baseline.name,
                self.checked,
                if self.should_stop() {
                    " (stopped at the first: --fail-fast)"
                } else {
                    ""
                }
            ),
        }
    }
}

/// Compares a whole set of runs at once (for tools that have every result
/// already); stops at the first regression with `fail_fast`.
pub fn compare(
    baseline: Baseline,
    runs: &[BenchRun],
    limits: &Limits,
    fail_fast: bool,
) -> Result<(Vec<BenchVerdict>, Gate)> {
    let mut gate = Gate::new(baseline, limits.clone(), fail_fast);
    let mut verdicts = Vec::new();
    for run in runs {
        verdicts.push(gate.check(run)?);
        if gate.should_stop() {
            break;
        }
    }
    Ok((verdicts, gate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::metric::Direction;

    #[test]
    fn a_change_is_shown_as_its_limit_measures_it() {
        let absolute = Limit {
            direction: Direction::Increase,
            relative: None,
            absolute: Some(0.1),
        };
        let relative = Limit {
            relative: Some(0.05),
            absolute: None,
            ..absolute
        };
        let tiny_to_one = Change::between(5.74e-7, 1.0);
        assert_eq!(tiny_to_one.against(Some(&absolute)), "+1");
        assert_eq!(tiny_to_one.against(Some(&relative)), "+174215927.9%");
        assert_eq!(Change::between(0.5, 0.25).against(Some(&absolute)), "-0.25");
        assert_eq!(
            Change::between(0.0, 1.0).against(Some(&absolute)),
            "+1 from 0"
        );
        assert_eq!(Change::between(2.0, 3.0).against(None), "+50.0%");
        let regression = Regression {
            bench: BenchKey {
                package: "p".into(),
                target: "t".into(),
                bench: "b".into(),
            },
            metric: Metric::FIrrFrac,
            old: 5.74e-7,
            new: 1.0,
            change: tiny_to_one,
            limit: absolute,
        };
        assert!(
            regression.human().ends_with("(+1; limit +0.1)"),
            "{}",
            regression.human()
        );
    }

    #[test]
    fn an_empty_whole_run_curve_is_not_called_noisy() {
        let empty = undersampled_curve_note("this run", 0);
        assert!(empty.contains("MR_* not estimated"), "{empty}");
        assert!(!empty.contains("noisy"), "{empty}");
        let few = undersampled_curve_note("the baseline", 12);
        assert!(
            few.contains("(12 tracked accesses, < 1000): MR_* are noisy"),
            "{few}"
        );
    }
}
