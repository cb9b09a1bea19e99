//! `cargo memgaze validate`: sampled runs against the golden full-trace
//! snapshots (docs/METRICS.md, "Accuracy against a full trace").

use super::bench::{emit, sampling, sampling_info};
use super::golden::{facts_mismatch, golden_dir};
use super::progress::Progress;
use super::suite::{self, Backend};
use super::{Global, MessageFormat};
use crate::cargo::{BenchCase, BenchTarget, CargoArgs, HarnessArgs};
use crate::golden::accuracy::{Error, FunctionError};
use crate::golden::{BuildFacts, Comparison, GoldenStore, Limits, Perturbation, Status, compare};
use crate::pipeline::{self, RunPlan};
use memgaze_analysis::AnalysisOptions;
use memgaze_error::{Exit, usage};
use memgaze_metadata::messages::{self, Reason};
use std::path::PathBuf;
use std::time::Instant;

/// Seed of the sampling jitter unless `--seed` says otherwise: validation
/// is reproducible by default.
pub const DEFAULT_SEED: u64 = 1;

/// Arguments of `cargo memgaze validate`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
Runs every selected bench sampled (default w = 1000 records every 100000
load executions, about 1% of the full trace) and compares its metrics with
the golden full-trace snapshot (`cargo memgaze golden`):
  trace windows   MAPE of F, dF, F_str, F_irr over k = 3..floor(log2 w)
  code windows    per function holding >= 1% of the accesses: relative
                  error of dF, absolute difference of F_str%, F_irr%,
                  A_const% at the code-window size W_c
Exits with 3 when an error exceeds its limit or a bench or function is
undersampled: fewer than --min-samples samples, or a 95% bootstrap
confidence interval (over samples) wider than the limit.

Examples:
  cargo memgaze validate -p microbenches
  cargo memgaze validate -p microbenches --period 10000 -- irr")]
pub struct Args {
    #[command(flatten)]
    pub cargo: CargoArgs,

    #[command(flatten)]
    pub libs: super::record::SnapshotLibsArgs,

    /// Sampling period: one sample every N instrumented-load executions
    /// (default 100000, or 100 × --window for a larger window: ≈1% recorded).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Recording")]
    pub period: Option<u64>,

    /// Records per sample, w (default 1000).
    #[arg(long, value_name = "W", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Recording")]
    pub window: Option<u64>,

    /// Seed of the sampling jitter.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SEED, help_heading = "Recording")]
    pub seed: u64,

    #[command(flatten)]
    pub spatial: super::spatial::SpatialArgs,

    /// Recording backend.
    #[arg(long, value_enum, default_value_t = Backend::Auto, help_heading = "Recording")]
    pub backend: Backend,

    /// Largest trace-window MAPE, percent.
    #[arg(
        long,
        value_name = "PCT",
        default_value_t = 15.0,
        help_heading = "Limits"
    )]
    pub max_trace_mape: f64,

    /// Largest code-window error, percent (relative for dF, percentage
    /// points for F_str%, F_irr%, A_const%).
    #[arg(
        long,
        value_name = "PCT",
        default_value_t = 3.0,
        help_heading = "Limits"
    )]
    pub max_code_error: f64,

    /// Largest mean absolute error of the whole-run miss-ratio curve
    /// (a fraction, e.g. 0.02).
    #[arg(
        long,
        value_name = "E",
        default_value_t = 0.02,
        help_heading = "Limits"
    )]
    pub max_mrc_error: f64,

    /// Fewest samples a bench or a compared function may have.
    #[arg(long, value_name = "N", default_value_t = 30, help_heading = "Limits")]
    pub min_samples: u64,

    /// Compare functions holding at least this share of the full run's
    /// accesses, percent.
    #[arg(
        long,
        value_name = "PCT",
        default_value_t = 1.0,
        help_heading = "Limits"
    )]
    pub min_function_share: f64,

    #[command(flatten)]
    pub time: super::limits::LimitArgs,

    /// Snapshot directory (default: `golden/` in the workspace root).
    #[arg(long, value_name = "DIR")]
    pub golden_dir: Option<PathBuf>,

    /// Output: tables for people, or one JSON object per line with a
    /// `reason` field.
    #[arg(long, value_enum, value_name = "FMT", default_value_t = MessageFormat::Human)]
    pub message_format: MessageFormat,

    /// Test hook: distort a sampled metric before comparing
    /// (`trace:F=1.3`, `trace:dF=0.8`, `trace:F_str=…`, `trace:F_irr=…`,
    /// `code:dF=1.1`), to prove validation catches it.
    #[arg(long, value_name = "WHAT=FACTOR", hide = true, value_parser = Perturbation::parse)]
    pub perturb: Option<Perturbation>,

    /// Arguments for the bench harness (a name filter, `--exact`, `--skip`).
    #[arg(last = true, value_name = "HARNESS-ARGS")]
    pub harness_args: Vec<String>,
}

impl Args {
    fn limits(&self) -> anyhow::Result<Limits> {
        for (name, value) in [
            ("--max-trace-mape", self.max_trace_mape),
            ("--max-code-error", self.max_code_error),
            ("--min-function-share", self.min_function_share),
        ] {
            if !(value > 0.0 && value <= 100.0) {
                return Err(usage(format!(
                    "{name} must be a percentage in (0, 100], got {value}"
                )));
            }
        }
        if !(self.max_mrc_error > 0.0 && self.max_mrc_error <= 1.0) {
            return Err(usage(format!(
                "--max-mrc-error must be a miss-ratio error in (0, 1], got {}",
                self.max_mrc_error
            )));
        }
        Ok(Limits {
            mrc_error: self.max_mrc_error,
            trace_mape: self.max_trace_mape / 100.0,
            code_error: self.max_code_error / 100.0,
            min_samples: self.min_samples,
            min_function_share: self.min_function_share / 100.0,
            ..Limits::default()
        })
    }
}

/// Runs the command.
pub fn run(args: Args, global: &Global) -> anyhow::Result<Exit> {
    let harness = HarnessArgs::parse(&args.harness_args)?;
    let limits = args.limits()?;
    let sampling = sampling(false, args.window, args.period, Some(args.seed))?;
    suite::choose_backend(args.backend)?;
    let json = args.message_format == MessageFormat::Json;
    // A `--golden-dir` that cannot hold snapshots fails before the build.
    if let Some(dir) = &args.golden_dir
        && !dir.is_dir()
    {
        anyhow::bail!(
            "golden snapshot directory {} {}",
            dir.display(),
            match dir.exists() {
                true => "is not a directory",
                false => "does not exist (`cargo memgaze golden` writes the snapshots)",
            }
        );
    }
    let facts = BuildFacts::current(&args.cargo)?;
    let suite = suite::discover(&args.cargo, &harness, global)?;
    let suite = suite::without_criterion_targets(suite, &args.cargo, "validate")?;
    let store = GoldenStore::new(golden_dir(&args.golden_dir, &suite));
    if let Some(message) = facts_mismatch(&store, &suite, &facts)? {
        anyhow::bail!(message);
    }
    let selected: Vec<(&BenchTarget, &BenchCase)> = suite.selected().collect();
    let has_snapshot = |(t, c): &(&BenchTarget, &BenchCase)| {
        store
            .path(&t.executable.package, &t.executable.target, &c.name)
            .is_file()
    };
    // With no snapshot at all there is nothing to validate: one line naming
    // them, before anything is instrumented or run.
    if !selected.is_empty() && !selected.iter().any(has_snapshot) {
        let names: Vec<String> = selected
            .iter()
            .map(|(_, c)| format!("`{}`", c.name))
            .collect();
        anyhow::bail!(
            "no golden snapshot in {} for {} {}: record them with `cargo memgaze golden --update`",
            store.dir().display(),
            if names.len() == 1 { "bench" } else { "benches" },
            names.join(", ")
        );
    }

    // Caught from here on: a signal while waiting for the lock, while the
    // targets are instrumented, between two benches or while one is
    // analysed stops the run instead of killing it halfway through writing
    // results.
    let watch = memgaze_record::signals::Watch::start();
    // One command at a time writes this results tree (cargo/lock.rs).
    let _lock = suite
        .workspace
        .results_layout()
        .lock(global.quiet, &watch)?;
    let started = Instant::now();
    let progress = Progress::new(selected.len() as u64, global.quiet);
    let instrumented =
        suite::instrument_targets(&suite, &progress, &args.libs.to_libs_args(), global)?;
    let mut exit = Exit::Ok;
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for (target, case) in &selected {
        if let Some(code) = watch.stopped("before the next bench") {
            exit = exit.worst(Exit::Interrupted(code));
            break;
        }
        let exe = &target.executable;
        let instrumented = instrumented.with_libraries(exe);
        // A bench without a snapshot is named and skipped; the others are
        // still validated, and the run ends with 1 (docs/CLI.md).
        let Some(golden) = store.read(&exe.package, &exe.target, &case.name)? else {
            let problem = format!(
                "bench `{}` of `{}`: no golden snapshot in {}: run `cargo memgaze golden --update` to record it",
                case.name,
                exe.display_name(),
                store.dir().display()
            );
            if json {
                emit(&missing_snapshot(
                    (&exe.package, &exe.target, &case.name),
                    &sampling,
                    problem.clone(),
                ));
            }
            progress.error(&format!("error: {problem}"));
            *counts.entry("missing").or_default() += 1;
            exit = exit.worst(Exit::Error);
            progress.advance();
            continue;
        };
        progress.start(
            "Validating",
            &format!("{} {}", exe.display_name(), case.name),
        );
        let plan = RunPlan {
            sampling,
            spatial: args.spatial.spatial(),
            analysis: AnalysisOptions::default(),
            trace_file: None,
            per_sample: true,
            env: vec![pipeline::one_iteration()],
            limits: args.time.limits(),
        };
        let recording = pipeline::record_bench(target, case, instrumented, &plan)?;
        let tally = (&mut exit, &mut counts);
        match suite::after_recording(&recording, (exe, &case.name), json, &progress, tally) {
            suite::AfterRecording::Use => {}
            suite::AfterRecording::Next => continue,
            // A signal ends the whole run.
            suite::AfterRecording::Stop => break,
        }
        let mut analysis = recording.analysis;
        let mut samples = recording.samples.expect("the plan asks for samples");
        if let Some(perturbation) = &args.perturb {
            perturbation.apply(&mut analysis, &mut samples);
        }
        let comparison = compare(&golden.metrics, &analysis, &samples, &limits);
        let verdict = match comparison.status {
            Status::Ok | Status::NotCompared => "ok",
            Status::Exceeded => "exceeded",
            Status::Undersampled => "undersampled",
        };
        *counts.entry(verdict).or_default() += 1;
        if verdict != "ok" {
            exit = exit.worst(Exit::Regression);
        }
        if json {
            emit(&messages::Validation {
                code_window_k: comparison.code_window_k,
                elapsed_s: recording.elapsed.as_secs_f64(),
                functions: comparison.functions.clone(),
                k_max: comparison.k_max,
                mrc: comparison
                    .mrc
                    .as_ref()
                    .map(|m| serde_json::to_value(m).expect("serialisable")),
                name: case.name.clone(),
                package: exe.package.clone(),
                period: comparison.period,
                problems: comparison.problems.clone(),
                reason: Reason::Validation,
                samples: comparison.samples,
                sampling: sampling_info(&sampling),
                status: verdict.to_string(),
                target: exe.target.clone(),
                trace_size_frac: comparison.trace_size_frac,
                trace_size_frac_total: comparison.trace_size_frac_total,
                trace_windows: comparison.trace_windows.clone(),
                window: comparison.window,
            });
        } else {
            let text = render(
                &format!("{} {}", exe.display_name(), case.name),
                verdict,
                &comparison,
            );
            progress.print(|| print!("{text}"));
        }
        progress.advance();
    }
    progress.finish();
    exit = suite::exit_after_benches(&watch, exit, "after the last bench");
    suite::print_summary(
        json,
        global,
        ("bench", "benches"),
        selected.len(),
        &counts,
        started,
    );
    Ok(exit)
}

/// The `validation` line of a bench `(package, target, name)` without a
/// golden snapshot: status `missing`, `problems` saying so, and nothing
/// measured (it is not run: the numbers are 0, the lists empty).
fn missing_snapshot(
    (package, target, name): (&str, &str, &str),
    sampling: &memgaze_trace::Sampling,
    problem: String,
) -> messages::Validation {
    messages::Validation {
        code_window_k: 0,
        elapsed_s: 0.0,
        functions: Vec::new(),
        k_max: 0,
        mrc: None,
        name: name.to_string(),
        package: package.to_string(),
        period: sampling.period,
        problems: vec![problem],
        reason: Reason::Validation,
        samples: 0,
        sampling: sampling_info(sampling),
        status: "missing".to_string(),
        target: target.to_string(),
        trace_size_frac: None,
        trace_size_frac_total: None,
        trace_windows: Vec::new(),
        window: sampling.window,
    }
}

fn percent(x: f64) -> String {
    format!("{:.3}%", 100.0 * x)
}

fn interval(ci: Option<[f64; 2]>) -> String {
    match ci {
        Some([lo, hi]) => format!("[{:+.3}%, {:+.3}%]", 100.0 * lo, 100.0 * hi),
        None => "–".to_string(),
    }
}

fn status_word(status: Status) -> &'static str {
    match status {
        Status::Ok => "ok",
        Status::Exceeded => "EXCEEDED",
        Status::Undersampled => "UNDERSAMPLED",
        Status::NotCompared => "not compared",
    }
}

fn row(out: &mut String, name: &str, e: &Error) {
    use std::fmt::Write;
    let error = e.error.map_or_else(|| "–".to_string(), percent);
    let _ = writeln!(
        out,
        "    {name:<12} {error:>8}  {:>22}  {:>7}  {}",
        interval(e.ci),
        percent(e.limit),
        status_word(e.status)
    );
}

fn heading(out: &mut String, title: &str) {
    use std::fmt::Write;
    let _ = writeln!(out, "  {title}");
    let _ = writeln!(
        out,
        "    {:<12} {:>8}  {:>22}  {:>7}  status",
        "", "error", "95% interval", "limit"
    );
}

/// The human report of one bench.
fn render(name: &str, verdict: &str, c: &Comparison) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{name}: {}  ({} samples of w = {}, period {}; trace {} of the full one, {} with spatial records)",
        verdict.to_uppercase(),
        c.samples,
        c.window,
        c.period,
        c.trace_size_frac.map_or_else(|| "–".to_string(), percent),
        c.trace_size_frac_total
            .map_or_else(|| "–".to_string(), percent)
    );
    let trace_windows = if c.k_max >= 3 {
        format!("trace windows, k = 3..{}: MAPE", c.k_max)
    } else {
        // w < 8: no window of 2^3 accesses fits in a sample.
        format!("trace windows: none (w = {} < 8)", c.window)
    };
    heading(&mut out, &trace_windows);
    for e in &c.trace_windows {
        row(&mut out, e.metric, &e.error);
    }
    heading(
        &mut out,
        &format!(
            "code windows of {} records: relative error (dF), difference (%)",
            1u64 << c.code_window_k
        ),
    );
    for f in &c.functions {
        render_function(&mut out, f);
    }
    if let Some(m) = &c.mrc {
        heading(
            &mut out,
            &format!(
                "whole-run miss-ratio curve ({} tracked accesses, R = {}): MAE in miss-ratio points over {} sizes",
                m.tracked, m.spatial_rate, m.points
            ),
        );
        row(&mut out, "MRC", &m.error);
    }
    for problem in &c.problems {
        let _ = writeln!(out, "  - {problem}");
    }
    out
}

fn render_function(out: &mut String, f: &FunctionError) {
    use std::fmt::Write;
    let _ = writeln!(
        out,
        "    {} ({:.1}% of accesses, {} samples, {} code windows)",
        f.name,
        100.0 * f.share,
        f.samples,
        f.windows
    );
    for (name, e) in [
        ("dF", &f.d_f),
        ("F_str%", &f.f_str_frac),
        ("F_irr%", &f.f_irr_frac),
        ("A_const%", &f.a_const_frac),
    ] {
        row(out, &format!("  {name}"), e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::accuracy::{Comparison, Status};

    fn comparison(window: u64, k_max: u32) -> Comparison {
        Comparison {
            samples: 40,
            window,
            period: 100 * window,
            k_max,
            code_window_k: 2,
            trace_size_frac: Some(0.01),
            trace_size_frac_total: Some(0.015),
            trace_windows: Vec::new(),
            functions: Vec::new(),
            mrc: None,
            problems: Vec::new(),
            status: Status::Ok,
        }
    }

    /// With w < 8 no trace-window row is compared; the heading says so
    /// instead of an empty range `k = 3..2` (found by an outside check).
    #[test]
    fn a_bench_without_snapshot_is_a_missing_validation_line() {
        let sampling = memgaze_trace::Sampling {
            window: 1000,
            period: 100_000,
            seed: Some(1),
        };
        let line = missing_snapshot(("p", "t", "b"), &sampling, "no snapshot".into());
        let json = serde_json::to_value(&line).unwrap();
        assert_eq!(json["reason"], "validation");
        assert_eq!(json["status"], "missing");
        assert_eq!(json["problems"], serde_json::json!(["no snapshot"]));
        assert_eq!(
            (&json["package"], &json["target"], &json["name"]),
            (&"p".into(), &"t".into(), &"b".into())
        );
        assert_eq!(
            (&json["window"], &json["period"]),
            (&1000.into(), &100_000.into())
        );
        assert_eq!(json["samples"], 0);
    }

    #[test]
    fn a_window_below_8_has_no_trace_window_range() {
        let text = render("str1", "ok", &comparison(4, 2));
        assert!(text.contains("trace windows: none (w = 4 < 8)"), "{text}");
        assert!(!text.contains("k = 3.."), "{text}");
        let text = render("str1", "ok", &comparison(1024, 10));
        assert!(text.contains("trace windows, k = 3..10: MAPE"), "{text}");
    }

    /// The heading gives the trace's size both ways: time-sample records
    /// only, and with the spatial records.
    #[test]
    fn the_heading_gives_both_trace_sizes() {
        let text = render("str1", "ok", &comparison(1024, 10));
        let first = text.lines().next().unwrap();
        assert!(
            first.ends_with("trace 1.000% of the full one, 1.500% with spatial records)"),
            "{first}"
        );
    }
}
