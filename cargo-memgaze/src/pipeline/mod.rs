//! The bench pipeline after the build: instrument each bench executable
//! once, then record each bench alone and analyse its trace as it streams.
//!
//! What `bench`, `golden` and `validate` share:
//!
//! 1. [`instrumented()`] gives the instrumented copy of a
//!    [`BenchExecutable`](crate::cargo::BenchExecutable), cached by content;
//! 2. [`record_bench`] runs one bench through it (the harness's exact-name
//!    command from the package root, with [`RECORDING_ENV`] set) under the
//!    software recorder, and streams the records at once into the analysis
//!    engine, into a trace file ([`TRACE_FILE`]) when the plan keeps one,
//!    and into a per-sample breakdown when the plan asks for one — a full
//!    trace of a hundred million records is never stored. The bench's own
//!    output is captured, so its libtest events tell whether the body
//!    failed.
//!
//! Results of `cargo memgaze bench` live in the bench's results directory
//! (`cargo::ResultsLayout`): [`BENCH_FILE`](crate::cargo::BENCH_FILE),
//! [`TRACE_FILE`] and [`ANALYSIS_FILE`]; `cargo memgaze golden` adds
//! [`GOLDEN_FILE`].

pub mod instrumented;
pub mod layout;
pub mod libs;
mod sink;
pub mod sites;

pub use instrumented::{InstrumentedBench, instrumented};

use crate::cargo::{BenchCase, BenchOutcome, BenchTarget, RECORDING_ENV};
use crate::golden::SampleSet;
use anyhow::Context;
use memgaze_analysis::{Analysis, AnalysisOptions};
use memgaze_metadata::annotation::Annotation;
use memgaze_trace::Interruption;
use memgaze_trace::{ProgramExit, Sampling, TraceHeader, TraceTotals, TraceWriter};
use sink::StreamingSink;
use std::io::{Read, Seek};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The files of a bench's results directory (named once, in the report's
/// results module, which reads them): the trace, its analysis
/// (`memgaze.analysis.v1` JSON), and the full-trace analysis `golden` leaves.
pub use crate::report::results::{ANALYSIS_FILE, GOLDEN_FILE, TRACE_FILE};

/// Default records per sample `w` (spec: about 1% of the full trace).
pub const DEFAULT_WINDOW: u64 = memgaze_record::DEFAULT_WINDOW;
/// Default period `w + z`.
pub const DEFAULT_PERIOD: u64 = memgaze_record::DEFAULT_PERIOD;

/// The environment that makes memgaze-harness run each routine exactly
/// once, without warm-up (`MEMGAZE_ITERATIONS=1`): full traces (`golden`,
/// `validate`, `bench --full`) stay deterministic and bounded, whatever
/// time calibration would pick.
pub fn one_iteration() -> (String, String) {
    (ITERATIONS_ENV.to_string(), "1".to_string())
}

/// The harness's variable for a fixed number of routine runs.
pub const ITERATIONS_ENV: &str = "MEMGAZE_ITERATIONS";

/// The fixed number of routine runs a bench process is given
/// ([`ITERATIONS_ENV`] in the plan's environment, else in ours), which
/// divan is told on its command line; `None` when its length is timed.
fn fixed_runs(plan_env: &[(String, String)]) -> Option<u64> {
    let value = match plan_env.iter().find(|(name, _)| name == ITERATIONS_ENV) {
        Some((_, value)) => value.clone(),
        None => std::env::var(ITERATIONS_ENV).ok()?,
    };
    value.trim().parse().ok().filter(|&runs| runs > 0)
}

/// How to record and analyse one bench.
#[derive(Clone, Debug)]
pub struct RunPlan {
    /// Sampled (with its jitter seed) or full.
    pub sampling: Sampling,
    /// Spatial sampling of a sampled recording (none for a full one).
    pub spatial: Option<memgaze_trace::SpatialSampling>,
    /// Analysis parameters.
    pub analysis: AnalysisOptions,
    /// Write the trace to this file while recording.
    pub trace_file: Option<PathBuf>,
    /// Compute the per-sample breakdown (validation's bootstrap).
    pub per_sample: bool,
    /// Extra environment for the bench process.
    pub env: Vec<(String, String)>,
    /// `--timeout` and `--kill-after`, per bench.
    pub limits: memgaze_record::Limits,
}

/// What recording one bench produced.
#[derive(Clone, Debug)]
pub struct BenchRecording {
    /// How the bench ended (measured, or its body failed).
    pub outcome: BenchOutcome,
    /// The metrics of its trace (of what was recorded before a failure).
    pub analysis: Analysis,
    /// Per-sample sums, when the plan asked for them.
    pub samples: Option<SampleSet>,
    /// The recorder's totals.
    pub totals: TraceTotals,
    /// The trace file written, if any.
    pub trace_file: Option<PathBuf>,
    /// What the recorder wants the user to know (drops, signals).
    pub notes: Vec<String>,
    /// Wall time of recording and analysis.
    pub elapsed: Duration,
    /// Why the recording was cut short: `--timeout` (the outcome is then
    /// [`BenchOutcome::Failed`]) or a signal (the run should stop).
    pub interrupted: Option<Interruption>,
}

impl BenchRecording {
    /// The exit code that ends the whole run when a signal interrupted this
    /// bench (`None` otherwise: a timed-out bench is only a failed one).
    pub fn stop_exit(&self) -> Option<memgaze_error::Exit> {
        match self.interrupted {
            Some(why @ Interruption::Signal(_)) => {
                Some(memgaze_error::Exit::Interrupted(why.exit_code()))
            }
            _ => None,
        }
    }
}

/// Names each load by the first line of its inline chain in the user's
/// workspace: a load in an inlined `BTreeMap::get` reads as the user's line
/// that called it (the annotation keeps the whole chain).
fn attribute_to_user_code(header: &mut TraceHeader, annotation: &Annotation, root: &Path) {
    if root.as_os_str().is_empty() {
        return;
    }
    for (entry, site) in header.loads.iter_mut().zip(&annotation.loads) {
        if let Some(line) = site.user_line(|file| Path::new(file).starts_with(root)) {
            entry.line = Some(line.to_string());
        }
    }
}

/// Records one bench through its instrumented executable (loading the
/// instrumented `libraries`) and analyses the trace as it streams in (see
/// the module documentation).
///
/// An error means the bench could not be recorded (the program did not
/// start, the recorder failed, no bench of that exact name ran); a failing
/// body is `Ok` with [`BenchOutcome::Failed`].
pub fn record_bench(
    target: &BenchTarget,
    case: &BenchCase,
    (instrumented, libraries): (&InstrumentedBench, &libs::Libraries),
    plan: &RunPlan,
) -> anyhow::Result<BenchRecording> {
    let started = Instant::now();
    let exe = &target.executable;
    let mut command = exe.run_command(&instrumented.path, case, fixed_runs(&plan.env));
    command.env(RECORDING_ENV, "1");
    for (name, value) in &plan.env {
        command.env(name, value);
    }
    // The bench's output goes to unnamed temporary files (a pipe could fill
    // while we are busy reading the recorder's socket).
    let mut stdout = tempfile::tempfile().context("cannot create a temporary file")?;
    let mut stderr = tempfile::tempfile().context("cannot create a temporary file")?;
    command.stdout(stdout.try_clone()?);
    command.stderr(stderr.try_clone()?);

    let mut words = vec![instrumented.path.display().to_string()];
    words.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    let mut header = memgaze_record::trace_header(&instrumented.annotation, plan.sampling, words);
    attribute_to_user_code(&mut header, &instrumented.annotation, &exe.workspace_root);
    header.spatial = plan.spatial.filter(|_| !plan.sampling.is_full());
    header.labels.extend([
        ("package".into(), exe.package.clone()),
        ("target".into(), exe.target.clone()),
        ("bench".into(), case.name.clone()),
    ]);
    let objects = memgaze_record::Objects {
        bases: libraries.extend_header(&mut header),
        valid: libraries.valid_loads(&instrumented.annotation),
        escapes: memgaze_record::escape_sites(&instrumented.annotation),
        library_escapes: libraries.escape_sites(),
        // `discover` took it as a criterion or divan bench by the hooks the
        // rewriter delimits its regions with.
        measured_regions: memgaze_record::records_only_in_regions(&instrumented.annotation)
            || exe.harness != crate::cargo::BenchHarness::Memgaze,
    };
    libraries.apply(&mut command);
    let writer = match &plan.trace_file {
        Some(path) => {
            Some(TraceWriter::create(path, &header).with_context(|| path.display().to_string())?)
        }
        None => None,
    };
    let mut sink = StreamingSink::new(&header, &plan.analysis, writer, plan.per_sample)?;
    // Errors of the sink are the trace file's (the analysis cannot fail).
    let unnamed = Path::new("the analysis");
    let named = plan.trace_file.as_deref().unwrap_or(unnamed);
    let recording = memgaze_record::record_objects_within(
        command,
        &objects,
        &plan.sampling,
        header.spatial,
        &mut memgaze_record::NamedSink(&mut sink, named),
        &plan.limits,
    )
    .with_context(|| {
        format!(
            "recording bench `{}` of `{}`",
            case.name,
            exe.display_name()
        )
    })?;
    let late = libraries.loaded_at_run(&recording.loaded_objects, &instrumented.path, &header);
    sink.add_untraced_libraries(&late.untraced);
    let (mut analysis, writer, breakdown) = sink.finish(&recording.totals)?;
    analysis.coverage.notes.extend(late.note());
    if let (Some(writer), Some(path)) = (writer, &plan.trace_file) {
        writer
            .finish(&recording.totals)
            .with_context(|| path.display().to_string())?
            .commit()?;
        crate::cli::record::complete_header(path, &mut header, &recording, &late)?;
    }
    let samples = breakdown.map(|b| b.finish()).transpose()?;

    let status = match recording.exit {
        ProgramExit::Code(code) => std::process::ExitStatus::from_raw((code & 0xff) << 8),
        ProgramExit::Signal(signal) => std::process::ExitStatus::from_raw(signal & 0x7f),
    };
    let read = |file: &mut std::fs::File| -> anyhow::Result<String> {
        let mut bytes = Vec::new();
        file.rewind()?;
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    // A bench cut short has no verdict of its own to read: its harness
    // output stops wherever the signal found it.
    let outcome = match recording.interrupted {
        Some(Interruption::Timeout) => BenchOutcome::Failed {
            message: format!(
                "timed out after {:?} (--timeout): the program was stopped",
                plan.limits.timeout.unwrap_or_default()
            ),
        },
        Some(why) => BenchOutcome::Failed {
            message: format!("interrupted by {}", why.name()),
        },
        None => {
            exe.interpret(&case.name, status, read(&mut stdout)?, read(&mut stderr)?)
                .with_context(|| format!("bench `{}` of `{}`", case.name, exe.display_name()))?
                .outcome
        }
    };
    if let BenchOutcome::Measured {
        iterations,
        runs_per_batch,
        ..
    } = &outcome
    {
        analysis.summary.iterations = *iterations;
        analysis.summary.runs_per_batch = *runs_per_batch;
    }
    Ok(BenchRecording {
        outcome,
        analysis,
        samples,
        totals: recording.totals,
        trace_file: plan.trace_file.clone(),
        notes: recording.notes,
        elapsed: started.elapsed(),
        interrupted: recording.interrupted,
    })
}

/// Writes an analysis as pretty JSON (the `memgaze.analysis.v1` document).
pub fn write_analysis(path: &Path, analysis: &Analysis) -> anyhow::Result<()> {
    let mut json = serde_json::to_vec_pretty(analysis).context("serialising the analysis")?;
    json.push(b'\n');
    Ok(memgaze_output::write_atomic(path, json)?)
}
