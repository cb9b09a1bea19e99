//! `cargo memgaze report`: SVG charts and an `index.html` from a trace,
//! an analysis JSON or a results directory.

use super::Global;
use super::style::styled_eprintln;
use crate::gate::{BenchVerdict, Limits, load_baseline};
use crate::report::{ReportOptions, default_report_dir, report_results, summary};
use anyhow::{Context, Result};
use memgaze_error::Exit;
use std::path::{Path, PathBuf};

/// Arguments of `cargo memgaze report`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
RESULTS is a trace file (`.mgz`), an analysis JSON (`analyze --format json`) or a \
results directory such as `target/memgaze`, scanned recursively for bench directories \
holding `trace.mgz` and/or `analysis.json` (plus `bench.json` naming the bench and an \
optional `golden.json`, a full-trace analysis overlaid on the trace-window chart).

The report is one SVG file per chart and an `index.html` that works offline (no script, \
no external resource): open it in a browser or upload the directory as a CI artifact. \
Files an earlier report wrote into the directory and this one does not are removed.

With --baseline, nothing is run: the results are compared with the saved baseline \
(default limits and --limits; a package's `[package.metadata.memgaze] limits` apply \
only under `bench`), each regression is printed as a `regression:` line on stderr and \
the exit status is 3 when there is one, as with `bench --baseline`.")]
// The field docs are the `--help` text clap prints (`<target-dir>`,
// `[default: …]`), not rustdoc markup.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
pub struct Args {
    /// A trace file, an analysis JSON or a results directory.
    #[arg(value_name = "RESULTS")]
    pub results: PathBuf,
    /// Output directory [default: RESULTS/report for a directory, else
    /// `<name>-report` beside the file].
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Compare with this saved baseline: old-vs-new charts and tables;
    /// exit 3 on a regression. Looked up in `RESULTS/baselines` (RESULTS a
    /// directory) or `$CARGO_TARGET_DIR/memgaze/baselines` (default
    /// `target/memgaze/baselines`).
    #[arg(long, value_name = "NAME")]
    pub baseline: Option<String>,
    /// Regression limits the comparison tables mark, e.g.
    /// `dF=+5%,F_irr_frac=+0.02` (replacing the defaults metric by metric).
    #[arg(long, value_name = "LIMITS", requires = "baseline")]
    pub limits: Option<String>,
    /// Write a short Markdown summary of the comparison with --baseline
    /// to FILE (for a pull-request comment or a CI job summary).
    #[arg(long, value_name = "FILE", requires = "baseline")]
    pub summary_md: Option<PathBuf>,
    /// Heading of the page.
    #[arg(long, default_value = "cargo memgaze report")]
    pub title: String,
    /// Traces (a bench directory's included) are analysed at these sizes;
    /// an analysis JSON must have been analysed at them.
    #[command(flatten)]
    pub caches: super::caches::CacheSizesArgs,
}

/// `$CARGO_TARGET_DIR/memgaze`, else `target/memgaze`: where `bench`
/// keeps results and baselines in the current project.
pub fn default_results_root() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| PathBuf::from("target"), PathBuf::from)
        .join("memgaze")
}

/// Writes a Markdown summary to `file` (whole, or not at all).
pub fn write_summary(file: &Path, text: &str) -> Result<()> {
    memgaze_output::write_atomic(file, text)
        .with_context(|| format!("{}: cannot write the summary", file.display()))
}

/// Prints the regressions of a comparison (stderr, `regression:` lines
/// and a closing count, as `bench` does) and chooses the exit status.
pub fn gate_verdicts(baseline: &str, verdicts: &[BenchVerdict], quiet: bool) -> Exit {
    let count: usize = verdicts.iter().map(|v| v.regressions.len()).sum();
    if !quiet {
        for verdict in verdicts {
            for r in &verdict.regressions {
                eprintln!("regression: {}", r.human());
            }
        }
        let compared = verdicts.iter().filter(|v| v.has_baseline).count();
        let new = verdicts.len() - compared;
        let not_in = if new > 0 {
            format!("; {new} not in the baseline (nothing compared)")
        } else {
            String::new()
        };
        if count > 0 {
            eprintln!(
                "{:>12} {count} regression(s) against baseline `{baseline}` in {compared} bench(es) compared{not_in}",
                "Gate"
            );
        } else {
            eprintln!(
                "{:>12} {compared} bench(es) within the limits of baseline `{baseline}`{not_in}",
                "Gate"
            );
        }
    }
    if count > 0 {
        Exit::Regression
    } else {
        Exit::Ok
    }
}

/// Runs the command.
pub fn run(args: Args, global: &Global) -> Result<Exit> {
    let results = &args.results;
    let is_dir = results.is_dir();
    let output = args.output.clone().unwrap_or_else(|| {
        if is_dir {
            default_report_dir(results)
        } else {
            let stem = results
                .file_stem()
                .map_or_else(|| "memgaze".into(), |s| s.to_string_lossy().into_owned());
            results
                .parent()
                .unwrap_or(Path::new("."))
                .join(format!("{stem}-report"))
        }
    });
    let mut options = ReportOptions::new(output);
    options.title = args.title.clone();
    options.cache_sizes = args.caches.cache_sizes.clone();
    if let Some(name) = &args.baseline {
        let root = if is_dir {
            results.clone()
        } else {
            default_results_root()
        };
        options.baseline = Some(load_baseline(&root, name)?);
        if let Some(spec) = &args.limits {
            options.limits = Limits::defaults().overridden_by(&Limits::parse(spec)?);
        }
    }
    let written = report_results(results, &options)?;
    if !global.quiet {
        for warning in &written.warnings {
            styled_eprintln!("warning: {warning}");
        }
        styled_eprintln!(
            "wrote {} chart{} for {} bench{}",
            written.charts.len(),
            if written.charts.len() == 1 { "" } else { "s" },
            written.benches,
            if written.benches == 1 { "" } else { "es" }
        );
    }
    println!("{}", written.index.display());
    let Some(baseline) = &options.baseline else {
        return Ok(Exit::Ok);
    };
    if let Some(file) = &args.summary_md {
        let index = super::bench::shown_here(&written.index);
        let text = summary::markdown(&baseline.name, "this run", &written.verdicts, Some(&index));
        write_summary(file, &text)?;
    }
    Ok(gate_verdicts(
        &baseline.name,
        &written.verdicts,
        global.quiet,
    ))
}
