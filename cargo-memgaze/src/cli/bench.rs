//! `cargo memgaze bench`: build a workspace's harness benches, then
//! instrument, record, analyse and summarise each.

use super::{ColorChoice, Global, MessageFormat};
use crate::cargo::{self, BenchSuite, BuildOptions, CargoArgs, HarnessArgs};
use crate::error::Exit;
use clap::ValueEnum;
use std::io::Write;

/// Arguments of `cargo memgaze bench`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
Examples:
  cargo memgaze bench -p microbenches            every microbenchmark
  cargo memgaze bench -p microbenches -- chase   benches whose name contains `chase`
  cargo memgaze bench -- --exact str/irr         exactly one bench
  cargo memgaze bench -- --skip irr --list       list what would run

Benches are `[[bench]]` targets with `harness = false` whose `main` comes
from `memgaze_harness::main!`. They are built with the bench profile plus
line-table debug info and symbols (set through CARGO_PROFILE_<P>_DEBUG and
_STRIP; Cargo.toml is not edited). Results go to <target-dir>/memgaze/.")]
pub struct Args {
    #[command(flatten)]
    pub cargo: CargoArgs,

    /// Output: tables for people, or one JSON object per line with a
    /// `reason` field.
    #[arg(long, value_enum, value_name = "FMT", default_value_t = MessageFormat::Human)]
    pub message_format: MessageFormat,

    /// Record every load (a full trace) instead of samples.
    #[arg(long, conflicts_with_all = ["period", "window"], help_heading = "Recording")]
    pub full: bool,

    /// Sampling period: one sample every N instrumented-load executions
    /// (default: the recorder's).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..),
        help_heading = "Recording"
    )]
    pub period: Option<u64>,

    /// Records per sample, w (default: the recorder's).
    #[arg(
        long,
        value_name = "W",
        value_parser = clap::value_parser!(u64).range(1..),
        help_heading = "Recording"
    )]
    pub window: Option<u64>,

    /// Seed of the sampling jitter, for reproducible runs.
    #[arg(long, value_name = "N", help_heading = "Recording")]
    pub seed: Option<u64>,

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

/// `--backend` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// Intel PT when usable, else the software recorder.
    #[default]
    Auto,
    /// The software recorder (works everywhere).
    Soft,
    /// Intel PT `ptwrite` (needs hardware and kernel support).
    Pt,
}

/// Runs the command.
pub fn run(args: Args, global: &Global) -> anyhow::Result<Exit> {
    let harness = HarnessArgs::parse(&args.harness_args)?;
    let options = BuildOptions {
        quiet: global.quiet,
        verbose: global.verbose > 0,
        color: match global.color {
            ColorChoice::Auto => None,
            ColorChoice::Always => Some("always"),
            ColorChoice::Never => Some("never"),
        },
    };
    let suite = cargo::discover(&args.cargo, &harness, &options)?;
    for (_, reason) in &suite.skipped {
        eprintln!("warning: skipping {reason}");
    }
    if harness.list_requested() {
        print_list(&suite, args.message_format)?;
        return Ok(Exit::Ok);
    }
    let selected = suite.selected().count();
    if !global.quiet {
        for target in &suite.targets {
            let runs = suite
                .selected()
                .filter(|(t, _)| t.executable.path == target.executable.path)
                .count();
            eprintln!(
                "{:>12} {} in {} ({})",
                "Selected",
                plural(runs, "bench", "benches"),
                target.executable.display_name(),
                target.executable.path.display()
            );
        }
        for (target, case) in suite.ignored() {
            eprintln!(
                "{:>12} {} in {} (ignored; `-- --include-ignored` runs it)",
                "Skipping",
                case.name,
                target.executable.display_name()
            );
        }
    }
    if selected == 0 {
        if !global.quiet {
            eprintln!("note: no bench matches the harness arguments; nothing to do");
        }
        return Ok(Exit::Ok);
    }
    anyhow::bail!(
        "instrumentation pipeline not wired yet ({} in {} built and listed)",
        plural(selected, "bench", "benches"),
        plural(suite.targets.len(), "target", "targets"),
    )
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `-- --list`: libtest's `<name>: bench` lines on stdout (a header per
/// target on stderr), or one `bench-listed` JSON object per bench.
fn print_list(suite: &BenchSuite, format: MessageFormat) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for target in &suite.targets {
        let exe = &target.executable;
        match format {
            MessageFormat::Human => {
                eprintln!(
                    "{:>12} {} ({})",
                    "Listing",
                    exe.display_name(),
                    exe.path.display()
                );
                for case in &target.cases {
                    writeln!(out, "{}: bench", case.name)?;
                }
            }
            MessageFormat::Json => {
                for case in &target.cases {
                    let line = serde_json::json!({
                        "reason": "bench-listed",
                        "package": exe.package,
                        "target": exe.target,
                        "name": case.name,
                        "ignored": case.ignored,
                        "executable": exe.path,
                    });
                    writeln!(out, "{line}")?;
                }
            }
        }
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{CargoCli, Command};
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        let CargoCli::Memgaze(cli) =
            CargoCli::try_parse_from(["cargo", "memgaze", "bench"].iter().chain(args.iter()))?;
        match cli.command {
            Command::Bench(args) => Ok(args),
            other => panic!("{other:?}"),
        }
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
}
