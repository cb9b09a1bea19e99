//! What `bench`, `golden` and `validate` do alike before recording: build
//! and list the benches, choose the backend, instrument each executable.

use super::progress::Progress;
use super::style::styled_eprintln;
use super::{ColorChoice, Global};
use crate::cargo::{
    self, BenchExecutable, BenchOutcome, BenchSuite, BuildOptions, CargoArgs, HarnessArgs,
};
use crate::pipeline::libs::Libraries;
use crate::pipeline::{self, InstrumentedBench};
use anyhow::Context;
use memgaze_error::Exit;
use memgaze_metadata::messages::{self, Reason};
use memgaze_record::signals::Watch;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// `--backend` values (the same as every recording command's).
pub use memgaze_record::pt::probe::BackendRequest as Backend;

/// Resolves `--backend` for a suite run: suites record with the software
/// recorder; `Some(note)` says what `auto` chose and why.
pub fn choose_backend(backend: Backend) -> anyhow::Result<Option<String>> {
    let choice = super::backend::software_only(backend, "a bench suite")?;
    Ok((backend == Backend::Auto).then(|| format!("note: backend {}", choice.reason)))
}

/// Builds the benches and lists the selected ones (cargo's output on
/// stderr); warnings for skipped non-harness targets.
pub fn discover(
    cargo_args: &CargoArgs,
    harness: &HarnessArgs,
    global: &Global,
) -> anyhow::Result<BenchSuite> {
    discover_checked(cargo_args, harness, global, |_| Ok(()))
}

/// [`discover`], with `before_build` checking the workspace before it is
/// built ([`cargo::discover_checked`]).
pub fn discover_checked(
    cargo_args: &CargoArgs,
    harness: &HarnessArgs,
    global: &Global,
    before_build: impl FnOnce(&cargo::Workspace) -> anyhow::Result<()>,
) -> anyhow::Result<BenchSuite> {
    let options = BuildOptions {
        quiet: global.quiet,
        verbose: global.verbose > 0,
        color: match global.color {
            ColorChoice::Auto => None,
            ColorChoice::Always => Some("always"),
            ColorChoice::Never => Some("never"),
        },
    };
    let suite = cargo::discover_checked(cargo_args, harness, &options, before_build)?;
    for (_, reason) in &suite.skipped {
        styled_eprintln!("warning: {reason}; skipped");
    }
    Ok(suite)
}

/// Leaves the criterion targets out of a suite that `command` (`golden`,
/// `validate`) traces in full: criterion picks how many times a routine
/// runs by time, and no option of its fixes the count, so their full traces
/// differ on every run and their snapshots would never match. A target the
/// user named (`--bench`) is a usage error; when no other target is left,
/// the reason is the error; otherwise each is skipped with a warning.
pub fn without_criterion_targets(
    mut suite: BenchSuite,
    cargo_args: &CargoArgs,
    command: &str,
) -> anyhow::Result<BenchSuite> {
    let (criterion, others): (Vec<_>, Vec<_>) = std::mem::take(&mut suite.targets)
        .into_iter()
        .partition(|t| t.executable.harness == cargo::BenchHarness::Criterion);
    let reason = |exe: &BenchExecutable| {
        format!(
            "bench target `{}` uses criterion, which picks how many times a routine runs by time: \
             its full traces differ on every run, so `{command}` cannot compare them (record it with `cargo memgaze bench`)",
            exe.display_name()
        )
    };
    if let Some(named) = criterion
        .iter()
        .find(|t| cargo_args.bench_targets.contains(&t.executable.target))
    {
        return Err(memgaze_error::usage(reason(&named.executable)));
    }
    if others.is_empty()
        && let Some(first) = criterion.first()
    {
        anyhow::bail!(reason(&first.executable));
    }
    for target in &criterion {
        styled_eprintln!("warning: {}; skipped", reason(&target.executable));
    }
    suite.targets = others;
    Ok(suite)
}

/// The instrumented executables of a suite's targets that have selected
/// benches, each with its instrumented libraries (`--libs`).
pub struct InstrumentedTargets {
    /// In `suite.targets` order; `None` for targets with nothing to run.
    by_target: Vec<(PathBuf, Option<(InstrumentedBench, Libraries)>)>,
}

impl InstrumentedTargets {
    /// The instrumented executable of a selected bench's target.
    pub fn of(&self, exe: &BenchExecutable) -> &InstrumentedBench {
        self.with_libraries(exe).0
    }

    /// The instrumented executable of a selected bench's target and the
    /// libraries it loads instrumented.
    pub fn with_libraries(&self, exe: &BenchExecutable) -> (&InstrumentedBench, &Libraries) {
        self.by_target
            .iter()
            .find(|(path, _)| *path == exe.path)
            .and_then(|(_, instrumented)| instrumented.as_ref())
            .map(|(bench, libraries)| (bench, libraries))
            .expect("targets with selected benches are instrumented")
    }
}

/// Instruments every target of the suite that has selected benches, and
/// the libraries `libs` selects of each (from the cache when possible).
pub fn instrument_targets(
    suite: &BenchSuite,
    progress: &Progress,
    libs: &super::record::LibsArgs,
    global: &Global,
) -> anyhow::Result<InstrumentedTargets> {
    let root = suite.workspace.results_layout().root().to_path_buf();
    let mut out = Vec::with_capacity(suite.targets.len());
    for target in &suite.targets {
        let runs = suite
            .selected()
            .any(|(t, _)| t.executable.path == target.executable.path);
        if !runs {
            out.push((target.executable.path.clone(), None));
            continue;
        }
        progress.start("Instrumenting", &target.executable.display_name());
        let instrumented = pipeline::instrumented(&target.executable.path, &root)
            .with_context(|| format!("bench target `{}`", target.executable.display_name()))?;
        if let Some(report) = &instrumented.report {
            let skipped = report.loads - report.loads_instrumented - report.loads_implied;
            if global.verbose > 0 || skipped > 0 || report.string_loads > 0 {
                progress.note(&format!(
                    "{:>12} {}: {} of {} functions, {} of {} loads instrumented ({} implied by a proxy){}{}",
                    "Instrumented",
                    target.executable.display_name(),
                    report.functions_instrumented,
                    report.functions_selected,
                    report.loads_instrumented,
                    report.loads,
                    report.loads_implied,
                    if skipped > 0 {
                        format!("; {skipped} loads not covered (`cargo memgaze instrument` lists why)")
                    } else {
                        String::new()
                    },
                    implicit_loads_note(report.string_loads, report.stack_loads, global.verbose > 0)
                ));
            }
            for warning in &report.warnings {
                progress.note(&format!(
                    "warning: {}: {warning}",
                    target.executable.display_name()
                ));
            }
        }
        let libraries = libs
            .prepare(
                &target.executable.path,
                Some(&root.join(pipeline::instrumented::CACHE_DIR)),
                global,
            )
            .with_context(|| {
                format!(
                    "libraries of bench target `{}`",
                    target.executable.display_name()
                )
            })?;
        out.push((
            target.executable.path.clone(),
            Some((instrumented, libraries)),
        ));
    }
    Ok(InstrumentedTargets { by_target: out })
}

/// The dynamic-coverage warning of one recorded bench (without the
/// `warning: ` prefix), if below the limit.
pub fn dynamic_coverage_warning(
    name: &str,
    analysis: &memgaze_analysis::Analysis,
) -> Option<String> {
    let coverage = analysis.summary.coverage_dynamic?;
    memgaze_analysis::dynamic_coverage_warning(coverage, &analysis.coverage.untraced_functions)
        .map(|w| format!("{name}: {w}"))
}

/// The last line of `golden` and `validate`: a `summary` message with
/// `--message-format json`, else `Finished N <noun> in Ts: <counts>` on
/// stderr (nothing with `--quiet`).
pub fn print_summary(
    json: bool,
    global: &Global,
    noun: (&str, &str),
    benches: usize,
    counts: &BTreeMap<&str, usize>,
    started: Instant,
) {
    if json {
        super::bench::emit(&messages::SuiteSummary {
            benches,
            counts: counts.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            elapsed_s: started.elapsed().as_secs_f64(),
            reason: Reason::Summary,
        });
    } else if !global.quiet {
        let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
        let parts = if parts.is_empty() {
            String::new()
        } else {
            format!(": {}", parts.join(", "))
        };
        styled_eprintln!(
            "{:>12} {} in {:.1}s{parts}",
            "Finished",
            plural(benches, noun.0, noun.1),
            started.elapsed().as_secs_f64(),
        );
    }
}

/// `n bench(es)`.
pub fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Reports a bench whose body failed: a `bench-failed` message with
/// `--message-format json`, and an `error:` line either way (also with
/// `-q`).
pub fn report_failed_bench(
    exe: &BenchExecutable,
    name: &str,
    message: &str,
    json: bool,
    progress: &Progress,
) {
    if json {
        super::bench::emit(&messages::BenchFailed {
            message: message.to_string(),
            name: name.to_string(),
            package: exe.package.clone(),
            reason: Reason::BenchFailed,
            target: exe.target.clone(),
        });
    }
    progress.error(&format!(
        "error: bench `{name}` of `{}` failed: {message}",
        exe.display_name()
    ));
}

/// What `golden` and `validate` do with a bench once it is recorded.
pub enum AfterRecording {
    /// Use its results (a dynamic-coverage warning was given if due).
    Use,
    /// It failed (reported and counted): go on with the next bench.
    Next,
    /// It failed because a signal stopped it (reported and counted): stop
    /// the whole run.
    Stop,
}

/// Reports a failed bench's recording (advances `progress` past it, counts
/// it under `failed` and raises `exit` to its code), or warns of a
/// finished one's low dynamic coverage; says what to do next.
pub fn after_recording(
    recording: &crate::pipeline::BenchRecording,
    (exe, name): (&BenchExecutable, &str),
    json: bool,
    progress: &Progress,
    (exit, counts): (&mut Exit, &mut BTreeMap<&str, usize>),
) -> AfterRecording {
    if let BenchOutcome::Failed { message } = &recording.outcome {
        report_failed_bench(exe, name, message, json, progress);
        progress.advance();
        *counts.entry("failed").or_default() += 1;
        *exit = exit.worst(Exit::BenchFailed);
        return match recording.stop_exit() {
            Some(stop) => {
                *exit = exit.worst(stop);
                AfterRecording::Stop
            }
            None => AfterRecording::Next,
        };
    }
    if let Some(warning) = dynamic_coverage_warning(name, &recording.analysis) {
        progress.warning(&format!("warning: {warning}"));
    }
    AfterRecording::Use
}

/// The run's exit once its benches are done: a signal that came after the
/// last check (while the last bench was analysed, compared or reported;
/// no next bench is left to stop before) still ends the command with its
/// code. `what` says where it was noticed; an exit that already says an
/// interruption is kept as it is (its line was printed).
pub fn exit_after_benches(watch: &Watch, exit: Exit, what: &str) -> Exit {
    if matches!(exit, Exit::Interrupted(_)) {
        return exit;
    }
    match watch.stopped(what) {
        Some(code) => exit.worst(Exit::Interrupted(code)),
        None => exit,
    }
}

/// The implicit loads a bench's instrumentation does not trace by design,
/// for its "Instrumented" note: string instructions whenever there are
/// some (their reads are data the trace misses), stack reads (in every
/// function: `ret`) only when `verbose`.
fn implicit_loads_note(string_loads: usize, stack_loads: usize, verbose: bool) -> String {
    let mut note = String::new();
    if string_loads > 0 {
        note += &format!("; {string_loads} string-instruction loads not traced (by design)");
    }
    if verbose {
        note += &format!("; {stack_loads} stack reads (pop, ret, leave) not traced (by design)");
    }
    note
}

#[cfg(test)]
mod tests {
    use super::{Exit, Watch, exit_after_benches, implicit_loads_note};

    #[test]
    fn a_signal_after_the_last_check_still_ends_the_run_with_its_code() {
        let watch = Watch::start();
        assert_eq!(
            exit_after_benches(&watch, Exit::Regression, "x"),
            Exit::Regression
        );
        // SAFETY: the watch's handler catches SIGTERM (it only counts it).
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        assert_eq!(
            exit_after_benches(&watch, Exit::Regression, "after the last bench"),
            Exit::Interrupted(143)
        );
        // An interruption already said (its line printed) is kept.
        assert_eq!(
            exit_after_benches(&watch, Exit::Interrupted(130), "x"),
            Exit::Interrupted(130)
        );
    }

    #[test]
    fn the_instrumented_note_names_untraced_string_loads() {
        assert_eq!(implicit_loads_note(0, 12, false), "");
        assert_eq!(
            implicit_loads_note(3, 12, false),
            "; 3 string-instruction loads not traced (by design)"
        );
        assert_eq!(
            implicit_loads_note(0, 12, true),
            "; 12 stack reads (pop, ret, leave) not traced (by design)"
        );
    }
}
