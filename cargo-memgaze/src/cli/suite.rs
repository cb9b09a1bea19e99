//! What `bench`, `golden` and `validate` do alike before recording: build
//! and list the benches, choose the backend, instrument each executable.

use super::progress::Progress;
use super::{ColorChoice, Global};
use crate::cargo::{self, BenchSuite, BuildOptions, CargoArgs, HarnessArgs};
use crate::pipeline::{self, InstrumentedBench};
use anyhow::Context;

/// `--backend` values (the same as every recording command's).
pub use crate::pt::probe::BackendRequest as Backend;

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
    let options = BuildOptions {
        quiet: global.quiet,
        verbose: global.verbose > 0,
        color: match global.color {
            ColorChoice::Auto => None,
            ColorChoice::Always => Some("always"),
            ColorChoice::Never => Some("never"),
        },
    };
    let suite = cargo::discover(cargo_args, harness, &options)?;
    for (_, reason) in &suite.skipped {
        eprintln!("warning: skipping {reason}");
    }
    Ok(suite)
}

/// Instruments every target of the suite that has selected benches (from
/// the cache when possible), in `suite.targets` order; `None` for targets
/// with nothing to run.
pub fn instrument_targets(
    suite: &BenchSuite,
    progress: &Progress,
    global: &Global,
) -> anyhow::Result<Vec<Option<InstrumentedBench>>> {
    let root = suite.workspace.results_layout().root().to_path_buf();
    let mut out = Vec::with_capacity(suite.targets.len());
    for target in &suite.targets {
        let runs = suite
            .selected()
            .any(|(t, _)| t.executable.path == target.executable.path);
        if !runs {
            out.push(None);
            continue;
        }
        progress.start("Instrumenting", &target.executable.display_name());
        let instrumented = pipeline::instrumented(&target.executable.path, &root)
            .with_context(|| format!("bench target `{}`", target.executable.display_name()))?;
        if let Some(report) = &instrumented.report {
            let skipped = report.loads - report.loads_instrumented - report.loads_implied;
            if global.verbose > 0 || skipped > 0 {
                progress.note(&format!(
                    "{:>12} {}: {} of {} functions, {} of {} loads instrumented ({} implied by a proxy){}",
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
                    }
                ));
            }
            for warning in &report.warnings {
                progress.note(&format!(
                    "warning: {}: {warning}",
                    target.executable.display_name()
                ));
            }
        }
        out.push(Some(instrumented));
    }
    Ok(out)
}

/// `n bench(es)`.
pub fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Reports a bench whose body failed: a `bench-failed` message with
/// `--message-format json`, and an error note either way.
pub fn report_failed_bench(
    exe: &crate::cargo::BenchExecutable,
    name: &str,
    message: &str,
    json: bool,
    progress: &Progress,
) {
    if json {
        super::bench::emit(&serde_json::json!({
            "reason": "bench-failed",
            "package": exe.package,
            "target": exe.target,
            "name": name,
            "message": message,
        }));
    }
    progress.note(&format!(
        "error: bench `{name}` of `{}` failed: {message}",
        exe.display_name()
    ));
}
