//! `cargo memgaze bench`: build a workspace's harness benches, then
//! instrument, record, analyse and summarise each.

use super::progress::Progress;
use super::style::styled_eprintln;
use super::suite::{self, plural};
use super::{Global, MessageFormat};
use crate::cargo::{
    BenchCase, BenchKey, BenchOutcome, BenchSuite, BenchTarget, CargoArgs, HarnessArgs,
};
use crate::gate::{self, Baseline, BenchRun, Gate, Limits, load_baseline, save_baseline};
use crate::pipeline::{self, RunPlan};
use crate::report::{self, ReportOptions};
use memgaze_error::{Exit, usage};
use memgaze_metadata::messages::{self, Reason};
use memgaze_trace::Sampling;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Arguments of `cargo memgaze bench`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
Examples:
  cargo memgaze bench -p microbenches            every microbenchmark
  cargo memgaze bench -p microbenches -- chase   benches whose name contains `chase`
  cargo memgaze bench -- --exact str/irr         exactly one bench
  cargo memgaze bench -- --skip irr --list       list what would run

Benches are `[[bench]]` targets with `harness = false` whose `main` comes
from `memgaze_harness::main!` (or criterion/divan). The workspace's members
are built with the bench profile plus line-table debug info and symbols
(profile overrides passed with `--config`; Cargo.toml is not edited);
dependencies keep the profile `cargo bench` uses, so its build is reused.
Results go to <target-dir>/memgaze/.")]
// The field docs are the `--help` text clap prints (`<target-dir>`,
// `[default: …]`), not rustdoc markup.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
pub struct Args {
    #[command(flatten)]
    pub cargo: CargoArgs,

    #[command(flatten)]
    pub libs: super::record::LibsArgs,

    /// Output: tables for people, or one JSON object per line with a
    /// `reason` field.
    #[arg(long, value_enum, value_name = "FMT", default_value_t = MessageFormat::Human)]
    pub message_format: MessageFormat,

    /// Record every load (a full trace) instead of samples.
    #[arg(long, conflicts_with_all = ["period", "window"], help_heading = "Recording")]
    pub full: bool,

    /// Sampling period: one sample every N instrumented-load executions
    /// (default 100000, or 100 × --window for a larger window: ≈1% recorded).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..),
        help_heading = "Recording"
    )]
    pub period: Option<u64>,

    /// Records per sample, w (default 1000).
    #[arg(
        long,
        value_name = "W",
        value_parser = clap::value_parser!(u64).range(1..),
        help_heading = "Recording"
    )]
    pub window: Option<u64>,

    /// Seed of the sampling jitter, for reproducible runs (default: a
    /// random one, shown in the JSON messages and the trace header).
    #[arg(long, value_name = "N", help_heading = "Recording")]
    pub seed: Option<u64>,

    #[command(flatten)]
    pub spatial: super::spatial::SpatialArgs,

    #[command(flatten)]
    pub caches: super::caches::CacheSizesArgs,

    #[command(flatten)]
    pub time: super::limits::LimitArgs,

    /// Stop at the first bench that fails or regresses.
    #[arg(long, help_heading = "Baselines and regressions")]
    pub fail_fast: bool,

    /// Save this run's results as baseline NAME under
    /// <target-dir>/memgaze/baselines/ (when the run ends, as a whole: an
    /// interrupted run leaves the previous NAME unchanged; benches this run
    /// did not measure keep their saved results).
    #[arg(long, value_name = "NAME", help_heading = "Baselines and regressions")]
    pub save_baseline: Option<String>,

    /// Compare each bench with baseline NAME; exit 3 on a regression past
    /// the limits.
    #[arg(long, value_name = "NAME", help_heading = "Baselines and regressions")]
    pub baseline: Option<String>,

    /// Regression limits, `METRIC=[+|-|±]N[%]` or `METRIC=off`,
    /// comma-separated (over the defaults and `[package.metadata.memgaze]
    /// limits`), e.g. `dF=+5%,F_irr_frac=+0.05`.
    #[arg(long, value_name = "SPEC", help_heading = "Baselines and regressions")]
    pub limits: Option<String>,

    /// Write a short Markdown summary of the comparison with --baseline
    /// to FILE (regressions first, a table of changed metrics, the
    /// report's path): for a pull-request comment or a CI job summary.
    #[arg(
        long,
        value_name = "FILE",
        requires = "baseline",
        help_heading = "Baselines and regressions"
    )]
    pub summary_md: Option<PathBuf>,

    /// Do not write the HTML report (default: <target-dir>/memgaze/report/).
    #[arg(long)]
    pub no_report: bool,

    /// Recording backend: Intel PT where `doctor` finds it usable (auto),
    /// or the software recorder.
    #[arg(long, value_enum, default_value_t = Backend::Auto, help_heading = "Recording")]
    pub backend: Backend,

    /// Arguments for the bench harness, as libtest takes them: a name
    /// filter, `--exact`, `--skip FILTER`, `--list`, `--ignored`,
    /// `--include-ignored`.
    #[arg(last = true, value_name = "HARNESS-ARGS")]
    pub harness_args: Vec<String>,
}

pub use super::suite::Backend;

/// Fewer samples than this make a bench's metrics unreliable (the
/// validation threshold of docs/METRICS.md).
const UNDERSAMPLED: u64 = 30;

/// Runs the command.
pub fn run(args: Args, global: &Global) -> anyhow::Result<Exit> {
    let harness = HarnessArgs::parse(&args.harness_args)?;
    let sampling = sampling(args.full, args.window, args.period, args.seed)?;
    let backend_note = suite::choose_backend(args.backend)?;
    // Bad usage is told before the build, not after minutes of it.
    let cli_limits = cli_limits(&args)?;
    let json = args.message_format == MessageFormat::Json;
    let suite = suite::discover_checked(&args.cargo, &harness, global, |workspace| {
        check_baseline_saved(&args, workspace)
    })?;
    if json {
        emit(&build_finished(&suite));
    }
    if harness.list_requested() {
        return list(&suite, args.message_format, global.quiet);
    }
    let selected: Vec<(&BenchTarget, &BenchCase)> = suite.selected().collect();
    if !global.quiet {
        print_selection(&suite, &selected, backend_note.as_deref());
    }
    if selected.is_empty() {
        return Ok(nothing_selected(&suite, json, global.quiet));
    }

    let started = Instant::now();
    let layout = suite.workspace.results_layout();
    // Caught from here on: a signal while waiting for the lock, while the
    // targets are instrumented, between two benches or while one is
    // analysed stops the run instead of killing it halfway through writing
    // results.
    let watch = memgaze_record::signals::Watch::start();
    // One command at a time writes this results tree (cargo/lock.rs).
    let _lock = layout.lock(global.quiet, &watch)?;
    let mut gating = Gating::new(&args, cli_limits, &suite, layout.root())?;
    let progress = Progress::new(selected.len() as u64, global.quiet);
    let instrumented = suite::instrument_targets(&suite, &progress, &args.libs, global)?;
    let several_targets = suite.targets.len() > 1;
    let width = selected
        .iter()
        .map(|(t, c)| label(t, c, several_targets).chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    if !json {
        progress.print(|| println!("{}", table_header(width)));
    }
    let mut exit = Exit::Ok;
    let (mut measured, mut failed) = (0usize, 0usize);
    for (target, case) in &selected {
        if let Some(code) = watch.stopped("before the next bench") {
            exit = exit.worst(Exit::Interrupted(code));
            break;
        }
        let exe = &target.executable;
        let instrumented = instrumented.with_libraries(exe);
        progress.start(
            "Recording",
            &format!("{} {}", exe.display_name(), case.name),
        );
        if json {
            emit(&messages::BenchStarted {
                name: case.name.clone(),
                package: exe.package.clone(),
                reason: Reason::BenchStarted,
                target: exe.target.clone(),
            });
        }
        let dir = layout.create_bench_dir(&BenchKey::new(&exe.package, &exe.target, &case.name))?;
        let plan = RunPlan {
            sampling,
            spatial: args.spatial.spatial(),
            analysis: args.caches.analysis_options(),
            trace_file: Some(dir.join(pipeline::TRACE_FILE)),
            per_sample: false,
            env: full_trace_env(&sampling),
            limits: args.time.limits(),
        };
        let recording = record_to_target(target, case, instrumented, &plan)?;
        let stop = recording.stop_exit();
        for note in &recording.notes {
            progress.note(&format!("note: {}: {note}", case.name));
        }
        let warnings = bench_warnings(exe, &case.name, &recording, &sampling);
        for warning in &warnings {
            progress.warning(&format!("warning: {warning}"));
        }
        let analysis_file = dir.join(pipeline::ANALYSIS_FILE);
        match &recording.outcome {
            BenchOutcome::Measured { nanos, .. } => {
                measured += 1;
                pipeline::write_analysis(&analysis_file, &recording.analysis)?;
                if json {
                    emit(&messages::BenchFinished {
                        analysis: analysis_file.clone(),
                        coverage: recording.analysis.coverage.clone(),
                        elapsed_s: recording.elapsed.as_secs_f64(),
                        harness: exe.harness.name().to_string(),
                        iterations: recording.analysis.summary.iterations,
                        name: case.name.clone(),
                        package: exe.package.clone(),
                        reason: Reason::BenchFinished,
                        region_ns: *nanos,
                        results: dir.clone(),
                        sampling: sampling_info(&sampling),
                        summary: recording.analysis.summary.clone(),
                        target: exe.target.clone(),
                        trace: recording.trace_file.clone(),
                        warnings,
                    });
                } else {
                    let row = table_row(
                        &label(target, case, several_targets),
                        width,
                        &recording.analysis,
                        recording.elapsed,
                    );
                    progress.print(|| println!("{row}"));
                }
                let run = BenchRun {
                    key: BenchKey::new(&exe.package, &exe.target, &case.name),
                    analysis: recording.analysis,
                    binary: Some(instrumented.0.annotation.binary.clone()),
                    profile: Some(args.cargo.profile.clone()),
                };
                gating.after(&run, json, &progress)?;
            }
            BenchOutcome::Failed { message } => {
                failed += 1;
                exit = exit.worst(Exit::BenchFailed);
                // A failed run's partial metrics must not pass for results,
                // nor a trace it left (or an earlier run's) be reported.
                let _ = std::fs::remove_file(&analysis_file);
                if stop.is_none() {
                    let _ = std::fs::remove_file(dir.join(pipeline::TRACE_FILE));
                } else if let Some(trace) = &recording.trace_file {
                    // What a signal cut short is kept, marked interrupted.
                    progress.note(&format!(
                        "note: {}: the trace recorded until the interruption is in {}",
                        case.name,
                        trace.display()
                    ));
                }
                suite::report_failed_bench(exe, &case.name, message, json, &progress);
            }
        }
        progress.advance();
        if let Some(stop) = stop {
            // A signal ends the whole run: the benches after this one are
            // not started.
            exit = exit.worst(stop);
            break;
        }
        if args.fail_fast && (exit != Exit::Ok || gating.should_stop()) {
            break;
        }
    }
    progress.finish();
    exit = suite::exit_after_benches(&watch, exit, "after the last bench (no report written)");
    gating.save()?;
    exit = exit.worst(gating.finish(json, global.quiet));
    let report = !args.no_report && measured > 0 && !matches!(exit, Exit::Interrupted(_));
    exit = exit.worst(write_outputs(&args, &gating, report, global.quiet));
    exit = suite::exit_after_benches(
        &watch,
        exit,
        "while the report was written (it is complete)",
    );
    let elapsed = started.elapsed();
    if json {
        emit(&messages::BenchSummary {
            benches: selected.len(),
            elapsed_s: elapsed.as_secs_f64(),
            failed,
            measured,
            reason: Reason::Summary,
            results: layout.root().to_path_buf(),
        });
    } else if !global.quiet {
        // The default code window: W_c = 2^⌊log2 min(w, 1024)⌋ (docs/METRICS.md).
        let k = match sampling.is_full() {
            true => 10,
            false => 63 - sampling.window.min(1024).leading_zeros(),
        };
        // The legend of the table's columns, when it has rows.
        if measured > 0 {
            styled_eprintln!(
                "note: A and F are what the samples observed; ΔF@W_c is the mean ΔF over code windows of W_c = 2^{k} accesses (the gate's `dF`; JSON `summary.dF` is the whole run's F/(A+A_const)); D is the intra-sample reuse distance in 64-byte lines"
            );
        }
        styled_eprintln!(
            "{:>12} {} in {:.1}s{}; results in {}",
            "Finished",
            plural(measured, "bench", "benches"),
            elapsed.as_secs_f64(),
            if failed > 0 {
                format!(", {failed} failed")
            } else {
                String::new()
            },
            layout.root().display()
        );
    }
    Ok(exit)
}

/// A full trace records one run of each routine (unless the user's
/// environment sets the harness's count): calibrated repetitions would make
/// it as large as a second of loads.
/// Time samples a sampled bench should reach (`Bencher::iter` repeats
/// longer to get them, within [`SAMPLE_BUDGET_S`]).
const TARGET_SAMPLES: u64 = 100;
/// Spatially tracked accesses a sampled bench should reach.
const TARGET_TRACKED: u64 = 1_000;
/// The most seconds a re-recorded bench's region is asked to repeat.
const SAMPLE_BUDGET_S: f64 = 2.0;
/// The harness's measuring-time variable (memgaze-harness `MEASURE_ENV`).
const MEASURE_ENV: &str = "MEMGAZE_MEASURE_S";
/// The harness's sample-target variable (memgaze-harness
/// `SAMPLE_TARGET_ENV`).
const SAMPLE_TARGET_ENV: &str = "MEMGAZE_SAMPLE_TARGET";
/// The harness's default measuring time, in seconds.
const DEFAULT_MEASURE_S: f64 = 1.0;

/// Records one bench and, while a memgaze-harness bench falls short of its
/// sample target, records it again with a longer measuring time
/// (criterion-style calibration: each run tells how long the region must
/// repeat). The rate of a loaded machine changes between runs, so a run
/// that still falls short is scaled again rather than accepted.
fn record_to_target(
    target: &BenchTarget,
    case: &BenchCase,
    instrumented: (&pipeline::InstrumentedBench, &pipeline::libs::Libraries),
    plan: &RunPlan,
) -> anyhow::Result<pipeline::BenchRecording> {
    let mut stop_at = first_stop(target.executable.harness, &plan.sampling);
    let mut first = plan.clone();
    first.env.extend(stop_at.map(stop_env));
    let mut recording = pipeline::record_bench(target, case, instrumented, &first)?;
    let mut measure_s = harness_measure_s();
    for _ in 0..MAX_RECALIBRATIONS {
        let Some((longer_s, factor)) = longer_measure(
            target.executable.harness,
            &plan.sampling,
            &recording,
            measure_s,
        ) else {
            break;
        };
        measure_s = longer_s;
        // Short of tracked accesses with enough samples: the harness must
        // now run past its sample count, in proportion.
        let reached = recording.analysis.summary.samples as f64;
        stop_at = stop_at.map(|stop| stop.max((reached * factor * 1.2).ceil() as u64));
        let mut longer = plan.clone();
        longer
            .env
            .push((MEASURE_ENV.to_string(), format!("{measure_s:.3}")));
        longer.env.extend(stop_at.map(stop_env));
        recording = pipeline::record_bench(target, case, instrumented, &longer)?;
    }
    if let Some(note) = untracked_note(plan, &recording) {
        recording.notes.push(note);
    }
    Ok(recording)
}

/// The note on a sampled recording with spatial sampling on that tracked
/// no access: no 64-byte block it touched hashes under the rate, so its
/// whole-run miss ratios are unknown (not zero).
fn untracked_note(plan: &RunPlan, recording: &pipeline::BenchRecording) -> Option<String> {
    let s = &recording.analysis.summary;
    let rate = s.spatial_rate.filter(|rate| *rate < 1.0)?;
    (!plan.sampling.is_full() && s.samples > 0 && s.tracked_accesses == Some(0)).then(|| {
        format!(
            "no 64-byte block it touched was spatially sampled (rate {rate}; a footprint of \
             about {} distinct addresses is too small to hold one): its whole-run miss ratios \
             (MR_L1, MR_L2, MR_LLC) are not estimated; a higher --spatial-rate samples more blocks",
            s.f
        )
    })
}

/// The samples at which a sampled memgaze-harness bench's `iter` stops
/// repeating ([`SAMPLE_TARGET_ENV`]): the target and a tenth more, as the
/// analysis may count a window cut by the region's end or left empty as
/// none. `None` for other benches, full traces, and where the user's
/// environment sets the count or the target.
fn first_stop(harness: crate::cargo::BenchHarness, sampling: &Sampling) -> Option<u64> {
    let user_set = [SAMPLE_TARGET_ENV, pipeline::ITERATIONS_ENV]
        .iter()
        .any(|name| std::env::var_os(name).is_some());
    (harness == crate::cargo::BenchHarness::Memgaze && !sampling.is_full() && !user_set)
        .then_some(TARGET_SAMPLES + TARGET_SAMPLES / 10)
}

fn stop_env(samples: u64) -> (String, String) {
    (SAMPLE_TARGET_ENV.to_string(), samples.to_string())
}

/// How many times a bench short of its sample target is recorded again
/// with a longer measuring time (each within [`SAMPLE_BUDGET_S`]).
const MAX_RECALIBRATIONS: usize = 3;

/// The measuring time the harness uses when memgaze sets none: the user's
/// `MEMGAZE_MEASURE_S` or the harness default.
fn harness_measure_s() -> f64 {
    std::env::var(MEASURE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|m| m.is_finite() && *m > 0.0)
        .unwrap_or(DEFAULT_MEASURE_S)
}

/// Whether a recording is short of [`TARGET_SAMPLES`] or (spatial
/// sampling on) [`TARGET_TRACKED`]; `None` when it has no target.
fn short_of_target(sampling: &Sampling, recording: &pipeline::BenchRecording) -> Option<bool> {
    if sampling.is_full() || !matches!(recording.outcome, BenchOutcome::Measured { .. }) {
        return None;
    }
    let s = &recording.analysis.summary;
    // A run that tracked no block at all gains nothing by running longer:
    // its footprint holds no block the spatial hash samples (said in a
    // note, see `untracked_note`).
    let tracked_short = s.spatial_rate.is_some_and(|rate| rate < 1.0)
        && s.tracked_accesses
            .is_some_and(|t| t > 0 && t < TARGET_TRACKED);
    Some(s.samples < TARGET_SAMPLES || tracked_short)
}

/// The longer `MEMGAZE_MEASURE_S` a memgaze-harness bench short of its
/// sample target is recorded again with: `measure` (the time the recording
/// ran with) scaled by the shortfall (×1.2), capped at [`SAMPLE_BUDGET_S`];
/// with the shortfall factor.
/// `None` when the bench reached the target, is not a memgaze-harness
/// bench, runs an exact iteration count, never entered its region, or
/// already measures for the whole budget.
fn longer_measure(
    harness: crate::cargo::BenchHarness,
    sampling: &Sampling,
    recording: &pipeline::BenchRecording,
    measure: f64,
) -> Option<(f64, f64)> {
    if harness != crate::cargo::BenchHarness::Memgaze
        || std::env::var_os(pipeline::ITERATIONS_ENV).is_some()
        || recording.totals.executions == 0
        || short_of_target(sampling, recording) != Some(true)
    {
        return None;
    }
    let s = &recording.analysis.summary;
    let shortfall = |target: u64, reached: u64| target as f64 / reached.max(1) as f64;
    let mut factor = shortfall(TARGET_SAMPLES, s.samples);
    if s.spatial_rate.is_some_and(|rate| rate < 1.0)
        && let Some(tracked) = s.tracked_accesses
    {
        factor = factor.max(shortfall(TARGET_TRACKED, tracked));
    }
    let factor = factor.max(1.0);
    let longer = (measure * factor * 1.2).min(SAMPLE_BUDGET_S);
    (longer > measure).then_some((longer, factor))
}

fn full_trace_env(sampling: &Sampling) -> Vec<(String, String)> {
    if sampling.is_full() && std::env::var_os(pipeline::ITERATIONS_ENV).is_none() {
        vec![pipeline::one_iteration()]
    } else {
        Vec::new()
    }
}

/// Tells which benches of which executables run, and which are skipped.
fn print_selection(
    suite: &BenchSuite,
    selected: &[(&BenchTarget, &BenchCase)],
    backend_note: Option<&str>,
) {
    for target in &suite.targets {
        let runs = selected
            .iter()
            .filter(|(t, _)| t.executable.path == target.executable.path)
            .count();
        styled_eprintln!(
            "{:>12} {} in {} ({})",
            "Selected",
            plural(runs, "bench", "benches"),
            target.executable.display_name(),
            target.executable.path.display()
        );
    }
    for (target, case) in suite.ignored() {
        styled_eprintln!(
            "{:>12} {} in {} (ignored; `-- --include-ignored` runs it)",
            "Skipping",
            case.name,
            target.executable.display_name()
        );
    }
    if let Some(note) = backend_note {
        styled_eprintln!("{note}");
    }
}

/// The end of a run whose harness arguments select no bench: a note, and
/// under JSON the summary line a run that measured would end with.
fn nothing_selected(suite: &BenchSuite, json: bool, quiet: bool) -> Exit {
    if !quiet {
        styled_eprintln!("note: no bench matches the harness arguments; nothing to do");
    }
    if json {
        emit(&messages::BenchSummary {
            benches: 0,
            elapsed_s: 0.0,
            failed: 0,
            measured: 0,
            reason: Reason::Summary,
            results: suite.workspace.results_layout().root().to_path_buf(),
        });
    }
    Exit::Ok
}

/// Checks that the `--baseline` to compare with is saved. Called once the
/// workspace, and so the results directory, is known: a missing baseline
/// is told before the build, not after it.
fn check_baseline_saved(args: &Args, workspace: &crate::cargo::Workspace) -> anyhow::Result<()> {
    match &args.baseline {
        Some(name) => {
            gate::baseline::check_baseline_exists(workspace.results_layout().root(), name)
        }
        None => Ok(()),
    }
}

/// Checks the baseline names and parses `--limits` (usage errors, exit 2).
fn cli_limits(args: &Args) -> anyhow::Result<Limits> {
    for name in [&args.save_baseline, &args.baseline].into_iter().flatten() {
        gate::baseline::check_name(name)?;
    }
    match &args.limits {
        Some(spec) => Limits::parse(spec),
        None => Ok(Limits::none()),
    }
}

/// Baselines and the regression gate of one `bench` run: `--save-baseline`
/// saves the measured benches together at the end; `--baseline` compares
/// each as it finishes, with the
/// limits of its package (defaults ← `[package.metadata.memgaze] limits` ←
/// `--limits`).
struct Gating {
    root: PathBuf,
    save: Option<String>,
    /// Runs measured so far, saved by [`Gating::save`].
    measured: Vec<BenchRun>,
    /// The loaded baseline and one gate per package (limits differ).
    baseline: Option<Baseline>,
    gates: BTreeMap<String, Gate>,
    limits: BTreeMap<String, Limits>,
    /// `--limits` over the defaults, for the report's tables.
    report_limits: Limits,
    fail_fast: bool,
    /// Every bench's comparison with the baseline, in run order.
    verdicts: Vec<gate::BenchVerdict>,
}

impl Gating {
    fn new(args: &Args, cli: Limits, suite: &BenchSuite, root: &Path) -> anyhow::Result<Gating> {
        let mut limits = BTreeMap::new();
        for target in &suite.targets {
            let package = &target.executable.package;
            if limits.contains_key(package) {
                continue;
            }
            let metadata = suite
                .workspace
                .members
                .iter()
                .find(|m| &m.name == package)
                .map(|m| Limits::from_metadata(&m.metadata))
                .transpose()?
                .unwrap_or_else(Limits::none);
            limits.insert(
                package.clone(),
                Limits::defaults()
                    .overridden_by(&metadata)
                    .overridden_by(&cli),
            );
        }
        // Loaded before anything is saved: `--save-baseline X --baseline X`
        // compares with the previous X (which must exist, as checked before
        // the build).
        let baseline = args
            .baseline
            .as_ref()
            .map(|name| load_baseline(root, name))
            .transpose()?;
        // A baseline of another profile is refused before minutes of
        // instrumenting and recording, not at the first comparison.
        if let Some(baseline) = &baseline {
            for (target, case) in suite.selected() {
                let exe = &target.executable;
                let key = BenchKey::new(&exe.package, &exe.target, &case.name);
                if let Some(old) = baseline.bench(&key) {
                    gate::check_same_profile(
                        &key,
                        &baseline.name,
                        old.profile.as_deref(),
                        Some(&args.cargo.profile),
                    )?;
                }
            }
        }
        Ok(Gating {
            root: root.to_path_buf(),
            save: args.save_baseline.clone(),
            measured: Vec::new(),
            baseline,
            gates: BTreeMap::new(),
            limits,
            report_limits: Limits::defaults().overridden_by(&cli),
            fail_fast: args.fail_fast,
            verdicts: Vec::new(),
        })
    }

    /// Gates one bench's run and keeps it for [`Gating::save`].
    fn after(&mut self, run: &BenchRun, json: bool, progress: &Progress) -> anyhow::Result<()> {
        if self.save.is_some() {
            self.measured.push(run.clone());
        }
        let Some(baseline) = &self.baseline else {
            return Ok(());
        };
        let package = run.key.package.clone();
        let gate = self.gates.entry(package.clone()).or_insert_with(|| {
            let limits = self
                .limits
                .get(&package)
                .cloned()
                .unwrap_or_else(Limits::defaults);
            Gate::new(baseline.clone(), limits, self.fail_fast)
        });
        let verdict = gate.check(run)?;
        let name = gate.baseline_name().to_string();
        if json {
            let (comparison, regressions) = verdict.to_messages(&name);
            emit(&comparison);
            for regression in &regressions {
                emit(regression);
            }
        } else {
            let text = verdict.human(&name);
            let text = super::style::paint_text(&text, super::style::Stream::Stdout);
            progress.print(|| print!("{text}"));
        }
        self.verdicts.push(verdict);
        Ok(())
    }

    /// `--save-baseline`: replaces the baseline with the measured benches
    /// in one step (a run that stops before this leaves it unchanged).
    fn save(&self) -> anyhow::Result<()> {
        match &self.save {
            Some(name) if !self.measured.is_empty() => {
                save_baseline(&self.root, name, &self.measured).map(drop)
            }
            _ => Ok(()),
        }
    }

    /// `--summary-md`: the Markdown summary of the comparison; a failure
    /// to write it is reported and gives exit code 1.
    fn write_summary(&self, args: &Args, index: Option<&Path>) -> Exit {
        let (Some(file), Some(baseline)) = (&args.summary_md, &self.baseline) else {
            return Exit::Ok;
        };
        let index = index.map(shown_here);
        let text =
            report::summary::markdown(&baseline.name, "this run", &self.verdicts, index.as_deref());
        match super::report::write_summary(file, &text) {
            Ok(()) => Exit::Ok,
            Err(e) => {
                eprintln!("error: {}", memgaze_error::one_line(&e));
                Exit::Error
            }
        }
    }

    /// Whether `--fail-fast` should stop after a regression.
    fn should_stop(&self) -> bool {
        self.gates.values().any(Gate::should_stop)
    }

    /// The gates' closing lines; 3 when a bench regressed.
    fn finish(&self, json: bool, quiet: bool) -> Exit {
        let mut exit = Exit::Ok;
        for gate in self.gates.values() {
            exit = exit.worst(gate.exit());
            if !json && !quiet {
                styled_eprintln!("{:>12} {}", "Gate", gate.summary());
            }
        }
        if let (Some(name), false, false) = (&self.save, json, quiet) {
            styled_eprintln!(
                "{:>12} baseline `{name}` in {}",
                "Saved",
                gate::baseline::baselines_dir(&self.root)
                    .join(name)
                    .display()
            );
        }
        exit
    }
}

/// Writes the HTML report (when `report`) and the `--summary-md` summary;
/// a failure is reported and gives exit code 1 (the bench results stand).
fn write_outputs(args: &Args, gating: &Gating, report: bool, quiet: bool) -> Exit {
    let json = args.message_format == MessageFormat::Json;
    let (exit, index) = match report {
        true => write_report(&gating.root, gating, json, quiet),
        false => (Exit::Ok, None),
    };
    exit.worst(gating.write_summary(args, index.as_deref()))
}

/// Writes the HTML report of the results tree and returns its index; a
/// failure is reported and gives exit code 1 (the bench results stand).
fn write_report(root: &Path, gating: &Gating, json: bool, quiet: bool) -> (Exit, Option<PathBuf>) {
    let mut options = ReportOptions::new(report::default_report_dir(root));
    options.baseline = gating.baseline.clone();
    options.limits = gating.report_limits.clone();
    options.package_limits = gating.limits.clone();
    match report::report_results(root, &options) {
        Ok(output) => {
            for warning in &output.warnings {
                styled_eprintln!("warning: report: {warning}");
            }
            if json {
                emit(&messages::Report {
                    benches: output.benches,
                    index: output.index.clone(),
                    reason: Reason::Report,
                    warnings: output.warnings.clone(),
                });
            } else if !quiet {
                styled_eprintln!("{:>12} {}", "Report", output.index.display());
            }
            (Exit::Ok, Some(output.index))
        }
        Err(e) => {
            styled_eprintln!("error: writing the report: {}", memgaze_error::one_line(&e));
            (Exit::Error, None)
        }
    }
}

/// The sampling a command's `--full`/`--window`/`--period`/`--seed` ask
/// for (defaults: `w` = 1000, period 100 000 — or 100 × `w` for a larger
/// `--window`, see `default_period` — and a random seed).
pub fn sampling(
    full: bool,
    window: Option<u64>,
    period: Option<u64>,
    seed: Option<u64>,
) -> anyhow::Result<Sampling> {
    if full {
        return Ok(Sampling::full());
    }
    let window = window.unwrap_or(pipeline::DEFAULT_WINDOW);
    let period = period.unwrap_or_else(|| default_period(window));
    if period < window {
        return Err(usage(format!(
            "--period {period} must be at least --window {window}"
        )));
    }
    Ok(Sampling {
        window,
        period,
        seed: Some(seed.unwrap_or_else(random_seed)),
    })
}

/// The period when only `--window` is given: the default, or for windows
/// above the default one the same share recorded (≈1%), so that a larger
/// window never silently turns into a full trace (a period equal to the
/// window skips nothing).
fn default_period(window: u64) -> u64 {
    let ratio = pipeline::DEFAULT_PERIOD / pipeline::DEFAULT_WINDOW;
    pipeline::DEFAULT_PERIOD.max(window.saturating_mul(ratio))
}

fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// The `sampling` object of JSON messages.
pub fn sampling_info(sampling: &Sampling) -> messages::SamplingInfo {
    if sampling.is_full() {
        messages::SamplingInfo::Full
    } else {
        messages::SamplingInfo::Sampled {
            period: sampling.period,
            seed: sampling.seed,
            window: sampling.window,
        }
    }
}

/// Prints one JSON message line (a type of [`memgaze_metadata::messages`])
/// on stdout.
pub fn emit(message: &impl serde::Serialize) {
    let line = serde_json::to_string(message).expect("messages serialise");
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // A closed pipe (`| head`) is not worth a panic.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn build_finished(suite: &BenchSuite) -> messages::BuildFinished {
    let targets = suite
        .targets
        .iter()
        .map(|t| messages::BuiltTarget {
            benches: t.cases.iter().map(|c| c.name.clone()).collect(),
            executable: t.executable.path.clone(),
            package: t.executable.package.clone(),
            target: t.executable.target.clone(),
        })
        .collect();
    messages::BuildFinished {
        reason: Reason::BuildFinished,
        success: true,
        targets,
    }
}

/// The bench's name in tables: `target/bench` when several targets run.
fn label(target: &BenchTarget, case: &BenchCase, several_targets: bool) -> String {
    if several_targets {
        format!("{}/{}", target.executable.target, case.name)
    } else {
        case.name.clone()
    }
}

/// The `warning:` lines of one recorded bench (without the prefix), for
/// stderr and its `bench-finished` JSON line alike.
fn bench_warnings(
    exe: &crate::cargo::BenchExecutable,
    name: &str,
    recording: &pipeline::BenchRecording,
    sampling: &Sampling,
) -> Vec<String> {
    let samples = recording.analysis.summary.samples;
    let measured_ok = matches!(recording.outcome, BenchOutcome::Measured { .. });
    let mut warnings = Vec::new();
    if measured_ok && recording.totals.executions == 0 {
        warnings.push(format!(
            "{name}: no load was recorded: the measured region was never entered{}",
            match exe.harness {
                crate::cargo::BenchHarness::Criterion => {
                    " (criterion's `iter_custom` times the routine itself, without criterion's measurement, so it is not recorded)"
                }
                _ => "",
            }
        ));
    } else if !sampling.is_full()
        && measured_ok
        && (samples < UNDERSAMPLED
            || (exe.harness == crate::cargo::BenchHarness::Memgaze
                && short_of_target(sampling, recording) == Some(true)))
    {
        warnings.push(undersampled_warning(name, recording, sampling));
    }
    if let Some(coverage) = recording.analysis.summary.coverage_dynamic
        && let Some(warning) = memgaze_analysis::dynamic_coverage_warning(
            coverage,
            &recording.analysis.coverage.untraced_functions,
        )
    {
        warnings.push(format!("{name}: {warning}"));
    }
    warnings
}

/// What an undersampled bench reached: samples, tracked accesses (spatial
/// sampling), iterations, against the target a memgaze-harness bench is
/// re-recorded for.
fn undersampled_warning(
    name: &str,
    recording: &pipeline::BenchRecording,
    sampling: &Sampling,
) -> String {
    let s = &recording.analysis.summary;
    let spatial = s.spatial_rate.is_some_and(|rate| rate < 1.0);
    let mut reached = plural(s.samples as usize, "sample", "samples");
    if spatial && let Some(tracked) = s.tracked_accesses {
        reached.push_str(&format!(", {tracked} tracked accesses"));
    }
    if let BenchOutcome::Measured {
        iterations: Some(iterations),
        ..
    } = &recording.outcome
    {
        reached.push_str(&format!(
            " in {}",
            plural(*iterations as usize, "iteration", "iterations")
        ));
    }
    let target = match spatial {
        true => format!("{TARGET_SAMPLES} samples and {TARGET_TRACKED} tracked accesses"),
        false => format!("{TARGET_SAMPLES} samples"),
    };
    format!(
        "{name}: {reached} ({} load executions for a period of {}), short of the target of {target}: its metrics are not reliable; lower --period",
        recording.totals.executions, sampling.period
    )
}

fn table_header(width: usize) -> String {
    format!(
        "{:<width$} {:>11} {:>11} {:>7} {:>7} {:>7} {:>9} {:>8} {:>7} {:>8} {:>3} {:>7}",
        "bench",
        "A",
        "F",
        "ΔF@W_c",
        "F_str%",
        "F_irr%",
        "D mean",
        "samples",
        "ρ",
        "iters",
        "thr",
        "time"
    )
}

fn table_row(
    name: &str,
    width: usize,
    analysis: &memgaze_analysis::Analysis,
    elapsed: std::time::Duration,
) -> String {
    let s = &analysis.summary;
    let or_dash = |x: Option<String>| x.unwrap_or_else(|| "–".to_string());
    // ΔF@W_c, the gate's `dF`: new data per load over code windows (the
    // whole-run ΔF of a sampled trace says more about the sampling than
    // about the program, and is not shown under the same name).
    let k = crate::gate::metric::common_window_k(analysis, analysis);
    let d_f = crate::gate::Metric::DF
        .value(analysis, k)
        .map(|x| format!("{x:.4}"));
    format!(
        "{:<width$} {:>11} {:>11} {:>7} {:>7.1} {:>7.1} {:>9} {:>8} {:>7} {:>8} {:>3} {:>6.1}s",
        name,
        s.a,
        s.f,
        or_dash(d_f),
        100.0 * s.f_str_frac,
        100.0 * s.f_irr_frac,
        or_dash(s.d_mean.map(|x| format!("{x:.1}"))),
        s.samples,
        or_dash(s.rho.map(|x| format!("{x:.1}"))),
        or_dash(s.iterations.map(|n| n.to_string())),
        s.threads,
        elapsed.as_secs_f64(),
    )
}

/// `-- --list`, ending quietly with the status of a program killed by
/// SIGPIPE when the reader left (`-- --list | head`), as `bench | head`
/// does.
fn list(suite: &BenchSuite, format: MessageFormat, quiet: bool) -> anyhow::Result<Exit> {
    match print_list(suite, format, quiet) {
        Ok(()) => Ok(Exit::Ok),
        Err(e) if reader_left(&e) => Ok(Exit::Interrupted(128 + libc::SIGPIPE)),
        Err(e) => Err(e),
    }
}

/// `-- --list`: libtest's `<name>: bench` lines on stdout (a header per
/// target on stderr, progress that `-q` hides), or one `bench-listed` JSON
/// object per bench.
fn print_list(suite: &BenchSuite, format: MessageFormat, quiet: bool) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for target in &suite.targets {
        let exe = &target.executable;
        match format {
            MessageFormat::Human => {
                if !quiet {
                    styled_eprintln!(
                        "{:>12} {} ({})",
                        "Listing",
                        exe.display_name(),
                        exe.path.display()
                    );
                }
                for case in &target.cases {
                    writeln!(out, "{}: bench", case.name)?;
                }
            }
            MessageFormat::Json => {
                for case in &target.cases {
                    let line = serde_json::to_string(&messages::BenchListed {
                        executable: exe.path.clone(),
                        ignored: case.ignored,
                        name: case.name.clone(),
                        package: exe.package.clone(),
                        reason: Reason::BenchListed,
                        target: exe.target.clone(),
                    })?;
                    writeln!(out, "{line}")?;
                }
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// Whether writing our standard output failed because its reader left
/// (`EPIPE`).
fn reader_left(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

/// [`shown_from`] the directory the command runs in.
pub(crate) fn shown_here(path: &Path) -> String {
    shown_from(path, std::env::current_dir().ok().as_deref())
}

/// `path` as a pull request's reader should see it: relative to `here`
/// (where the command ran, the checkout in CI) when it lies below it; a
/// runner's absolute path means nothing to them.
pub(crate) fn shown_from(path: &Path, here: Option<&Path>) -> String {
    here.and_then(|here| path.strip_prefix(here).ok())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{CargoCli, Command};
    use clap::Parser;

    #[test]
    fn the_summary_names_the_report_relative_to_the_checkout() {
        let report = Path::new("/runner/work/app/target/memgaze/report/index.html");
        let shown = |here: Option<&str>| shown_from(report, here.map(Path::new));
        assert_eq!(
            shown(Some("/runner/work/app")),
            "target/memgaze/report/index.html"
        );
        assert_eq!(shown(Some("/elsewhere")), report.display().to_string());
        assert_eq!(shown(None), report.display().to_string());
    }

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        let CargoCli::Memgaze(cli) =
            CargoCli::try_parse_from(["cargo", "memgaze", "bench"].iter().chain(args.iter()))?;
        match cli.command {
            Command::Bench(args) => Ok(args),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_larger_window_alone_keeps_the_default_share_recorded() {
        let period = |window: Option<u64>, period: Option<u64>| {
            sampling(false, window, period, Some(1)).map(|s| (s.window, s.period))
        };
        assert_eq!(period(None, None).unwrap(), (1_000, 100_000));
        assert_eq!(period(Some(500), None).unwrap(), (500, 100_000));
        // Was (200 000, 200 000): z = 0, a full trace under another name.
        assert_eq!(period(Some(200_000), None).unwrap(), (200_000, 20_000_000));
        assert_eq!(
            period(Some(200_000), Some(300_000)).unwrap(),
            (200_000, 300_000)
        );
        assert!(period(Some(200_000), Some(100_000)).is_err());
        assert_eq!(
            period(Some(u64::MAX), None).unwrap(),
            (u64::MAX, u64::MAX),
            "saturates"
        );
    }

    #[test]
    fn cargo_memgaze_and_harness_flags_separate_at_the_double_dash() {
        let args = parse(&[
            "-p",
            "microbenches",
            "--bench",
            "micro",
            "--period",
            "10000",
            "--window",
            "1024",
            "--seed",
            "7",
            "--backend",
            "soft",
            "--message-format",
            "json",
            "--",
            "--exact",
            "--bench",
            "chase",
        ])
        .unwrap();
        assert_eq!(args.cargo.packages, ["microbenches"]);
        assert_eq!(args.cargo.bench_targets, ["micro"]);
        assert_eq!(
            (args.period, args.window, args.seed),
            (Some(10000), Some(1024), Some(7))
        );
        assert_eq!(args.backend, Backend::Soft);
        assert_eq!(args.message_format, MessageFormat::Json);
        assert_eq!(args.harness_args, ["--exact", "--bench", "chase"]);
        assert!(!args.full);
    }

    #[test]
    fn full_excludes_sampling_parameters_and_zero_is_rejected() {
        assert!(parse(&["--full"]).unwrap().full);
        assert!(parse(&["--full", "--period", "10"]).is_err());
        assert!(parse(&["--window", "0"]).is_err());
        assert!(parse(&["--backend", "gpu"]).is_err());
    }

    #[test]
    fn cache_sizes_reach_the_analysis_of_every_bench() {
        let args = parse(&["--cache-sizes", "48K,2M,32M", "--", "chase"]).unwrap();
        let sizes = args.caches.analysis_options().cache_sizes.unwrap();
        assert_eq!(
            (sizes.l1, sizes.l2, sizes.llc),
            (48 << 10, 2 << 20, 32 << 20)
        );
        assert_eq!(
            parse(&[]).unwrap().caches.analysis_options().cache_sizes,
            None
        );
    }
}
