//! `cargo memgaze report`: SVG charts and an `index.html` from a trace,
//! an analysis JSON or a results directory.

use super::Global;
use super::style::styled_eprintln;
use crate::gate::{Limits, load_baseline};
use crate::report::{ReportOptions, default_report_dir, report_results};
use anyhow::Result;
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
no external resource): open it in a browser or upload the directory as a CI artifact.")]
pub struct Args {
    /// A trace file, an analysis JSON or a results directory.
    #[arg(value_name = "RESULTS")]
    pub results: PathBuf,
    /// Output directory [default: RESULTS/report for a directory, else
    /// `<name>-report` beside the file].
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Compare with this saved baseline: old-vs-new charts and tables.
    /// Looked up in `RESULTS/baselines` (RESULTS a directory) or
    /// `target/memgaze/baselines`.
    #[arg(long, value_name = "NAME")]
    pub baseline: Option<String>,
    /// Regression limits the comparison tables mark, e.g.
    /// `dF=+5%,F_irr_frac=+0.02` (replacing the defaults metric by metric).
    #[arg(long, value_name = "LIMITS", requires = "baseline")]
    pub limits: Option<String>,
    /// Heading of the page.
    #[arg(long, default_value = "cargo memgaze report")]
    pub title: String,
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
    if let Some(name) = &args.baseline {
        let root = if is_dir {
            results.clone()
        } else {
            PathBuf::from("target/memgaze")
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
    Ok(Exit::Ok)
}
