//! `cargo memgaze compare OLD NEW`: two saved baselines compared as
//! `bench --baseline OLD` would compare a run that measured NEW, without
//! running anything: the terminal verdict, an HTML report of NEW against
//! OLD, an optional Markdown summary, and exit status 3 on a regression.

use super::Global;
use super::report::{default_results_root, write_summary};
use crate::gate::{BenchRun, Gate, Limits, load_baseline};
use crate::report::{COMPARE_DIR, ReportBench, ReportOptions, summary, write_report};
use anyhow::Result;
use memgaze_error::{Exit, usage};
use std::path::PathBuf;

/// Arguments of `cargo memgaze compare`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Both baselines are read from RESULTS/baselines (saved by `bench --save-baseline`). \
Every bench of NEW is compared with the same bench of OLD under the default limits \
(or --limits); benches of NEW that OLD lacks are listed as not compared. Benches \
recorded differently (backend, --full, --period/--window) or built with another \
cargo profile are refused with exit 2, as under `bench`.

The report has every chart a baseline gives (trace windows and reuse distance with \
OLD overlaid, old-vs-new bars, tables of old, new and change); baselines keep the \
analysis but not the trace, so it has no heatmap or per-address chart.

Exit status: 0 within the limits, 3 on a regression, 1 or 2 on errors.")]
pub struct Args {
    /// The baseline compared with (the "before").
    #[arg(value_name = "OLD")]
    pub old: String,
    /// The baseline compared (the "after").
    #[arg(value_name = "NEW")]
    pub new: String,
    /// Results root holding `baselines/` [default: $CARGO_TARGET_DIR/memgaze,
    /// else target/memgaze].
    #[arg(long, value_name = "DIR")]
    pub results: Option<PathBuf>,
    /// Output directory of the report [default: RESULTS/compare/OLD..NEW].
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Do not write the HTML report.
    #[arg(long)]
    pub no_report: bool,
    /// Regression limits, e.g. `dF=+5%,F_irr_frac=+0.02` (replacing the
    /// defaults metric by metric).
    #[arg(long, value_name = "LIMITS")]
    pub limits: Option<String>,
    /// Write a short Markdown summary (regressions first) to FILE.
    #[arg(long, value_name = "FILE")]
    pub summary_md: Option<PathBuf>,
}

/// Runs the command.
pub fn run(args: Args, global: &Global) -> Result<Exit> {
    let limits = match &args.limits {
        Some(spec) => Limits::defaults().overridden_by(&Limits::parse(spec)?),
        None => Limits::defaults(),
    };
    if args.old == args.new {
        return Err(usage(format!(
            "compare: OLD and NEW are both `{}`; name two different baselines",
            args.old
        )));
    }
    let root = args.results.clone().unwrap_or_else(default_results_root);
    let old = load_baseline(&root, &args.old)?;
    let new = load_baseline(&root, &args.new)?;

    // The terminal verdict: the gate `bench --baseline OLD` runs, fed with
    // NEW's saved results instead of fresh ones.
    let mut gate = Gate::new(old.clone(), limits.clone(), false);
    let mut verdicts = Vec::new();
    for bench in &new.benches {
        let run = BenchRun {
            key: bench.bench.clone(),
            analysis: bench.analysis.clone(),
            binary: bench.binary.clone(),
            profile: bench.profile.clone(),
        };
        let verdict = gate.check(&run)?;
        if !global.quiet {
            print!("{}", verdict.human(&old.name));
        }
        verdicts.push(verdict);
    }
    let missing = old
        .benches
        .iter()
        .filter(|b| new.bench(&b.bench).is_none())
        .count();
    if !global.quiet && missing > 0 {
        eprintln!(
            "note: {missing} bench(es) of baseline `{}` are not in `{}`",
            old.name, new.name
        );
    }

    let mut index = None;
    if !args.no_report {
        let out = args.output.clone().unwrap_or_else(|| {
            root.join(COMPARE_DIR)
                .join(format!("{}..{}", old.name, new.name))
        });
        let benches: Vec<ReportBench> = new
            .benches
            .iter()
            .map(|b| {
                let key = &b.bench;
                let mut bench = ReportBench::new(
                    format!("{} ({}/{})", key.bench, key.package, key.target),
                    b.analysis.clone(),
                );
                bench.key = Some(key.clone());
                bench
            })
            .collect();
        let mut options = ReportOptions::new(out);
        options.title = format!("cargo memgaze: baseline {} against {}", new.name, old.name);
        options.baseline = Some(old.clone());
        options.run_label = format!("baseline {}", new.name);
        options.limits = limits;
        let written = write_report(
            &benches,
            &format!("baseline {} ({})", new.name, new.dir.display()),
            &options,
        )?;
        if !global.quiet {
            eprintln!(
                "note: baselines keep no trace: the report has no heatmap or per-address chart"
            );
            eprintln!("{:>12} {}", "Report", written.index.display());
        }
        index = Some(written.index);
    }
    if let Some(file) = &args.summary_md {
        let current = format!("baseline {}", new.name);
        let text = summary::markdown(
            &old.name,
            &current,
            &verdicts,
            index.as_deref().map(super::bench::shown_here).as_deref(),
        );
        write_summary(file, &text)?;
    }
    if !global.quiet {
        eprintln!("{:>12} {}", "Gate", gate.summary());
    }
    Ok(gate.exit())
}
