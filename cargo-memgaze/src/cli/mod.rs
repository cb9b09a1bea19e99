//! The command layer: argument parsing and one module per subcommand.
//!
//! Each subcommand module exposes an `Args` struct (clap) and
//! `run(args, &Global) -> anyhow::Result<Exit>`. Commands do their work
//! through the library modules; they only parse, print and choose exit codes.

use clap::{Args, Parser, Subcommand, ValueEnum};
use memgaze_error::Exit;

pub mod analyze;
pub mod backend;
pub mod bench;
pub mod caches;
pub mod classify;
pub mod compare;
pub mod completions;
pub mod doctor;
pub mod dump;
pub mod golden;
pub mod instrument;
pub mod limits;
pub mod progress;
pub mod pt_decode;
pub mod record;
pub mod report;
pub mod run;
pub mod spatial;
pub mod style;
pub mod suite;
pub mod validate;

/// `cargo` invokes subcommands as `cargo-memgaze memgaze <args>`.
#[derive(Parser, Debug)]
#[command(name = "cargo", bin_name = "cargo", styles = clap::builder::Styles::styled())]
pub enum CargoCli {
    /// See how a program touches memory: sampled load-address traces,
    /// locality metrics, reports and regression gates.
    Memgaze(MemgazeCli),
}

/// Top-level options and the subcommand.
#[derive(Args, Debug)]
#[command(version = env!("MEMGAZE_LONG_VERSION"), about, long_about = None, propagate_version = true)]
pub struct MemgazeCli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every subcommand accepts.
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// When to use colours in human output.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, global = true)]
    pub color: ColorChoice,
    /// Print only results and errors (no progress, no notes).
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Explain more of what is being done (repeat for more).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
}

/// `--color` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColorChoice {
    /// Colour when writing to a terminal.
    Auto,
    /// Always colour.
    Always,
    /// Never colour.
    Never,
}

/// `--message-format` values shared by the commands that stream results.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MessageFormat {
    /// Tables for people.
    #[default]
    Human,
    /// One JSON object per line with a `"reason"` field.
    Json,
}

/// `--format` values of the commands that print one document.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// A table for people.
    #[default]
    Table,
    /// One JSON document.
    Json,
}

/// The end of `record`'s and `run`'s help. They exit with the program's
/// status (like `perf record` and valgrind) — a deliberate pass-through that
/// docs/CLI.md's exit codes do not cover — so users must be told that those
/// codes do not apply there.
const PROGRAM_EXIT_STATUS: &str = "\
Exit status: the program's own (128 + N when it died of signal N), as with \
`perf record` or valgrind, and not memgaze's exit codes: a program that \
exits 3 is not a regression. memgaze's own failures, before or after the \
program runs, exit 2 (bad usage) or 1 (any other error) and print an \
`error:` line on stderr.";

/// The subcommands (docs/CLI.md).
// Parsed once per process; boxing the larger `Args` would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Build bench targets, instrument, record sampled traces, analyse,
    /// report and gate.
    Bench(bench::Args),
    /// Instrument, record and analyse one program.
    ///
    /// Instruments the program (cached under target/memgaze/instrumented/
    /// inside a cargo project), runs it with its arguments, stdin, stdout
    /// and exit status untouched, records a sampled trace (by default
    /// windows of 1000 load executions per period of 100000, ≈1%; --full
    /// for everything) and prints the analysis.
    ///
    /// Example: cargo memgaze run --seed 1 -- target/release/mybin input.txt
    #[command(after_help = PROGRAM_EXIT_STATUS)]
    Run(run::Args),
    /// Show the functions and classified loads of an executable.
    Classify(classify::Args),
    /// Write an instrumented executable and its annotation.
    ///
    /// Copies the selected functions (all by default) with a probe before
    /// each explicit load into a new segment, patches their entries, and
    /// prints what was and was not instrumented: load coverage, skipped
    /// functions and every place execution can escape into uninstrumented
    /// code. One instrumented binary serves any sampling parameters of
    /// `record`; run alone, it behaves like the original.
    ///
    /// Example: cargo memgaze instrument target/release/mybin -o mybin.mg
    Instrument(instrument::Args),
    /// Run an instrumented program and write its trace.
    ///
    /// The program's arguments, stdin, stdout, stderr and exit status pass
    /// through untouched; ASLR is off.
    /// Sampled by default: windows of 1000 consecutive instrumented-load
    /// executions per period of 100000 (≈1% of the loads), every execution
    /// counted; --full records all of them.
    ///
    /// Example: cargo memgaze record --seed 1 -o run.trace -- ./mybin.mg input.txt
    #[command(after_help = PROGRAM_EXIT_STATUS)]
    Record(record::Args),
    /// Compute the locality metrics of a trace or a Lackey log.
    Analyze(analyze::Args),
    /// Print a trace file as text.
    Dump(dump::Args),
    /// Record full-trace golden snapshots of the workspace's benches.
    Golden(golden::Args),
    /// Check sampled runs against the golden snapshots.
    Validate(validate::Args),
    /// Render SVG charts and an HTML report.
    Report(report::Args),
    /// Compare two saved baselines without running anything.
    ///
    /// Example: cargo memgaze compare main my-branch --summary-md summary.md
    Compare(compare::Args),
    /// Tell which recording backends this machine supports, and why not.
    Doctor(doctor::Args),
    /// Print the PTW events of a raw Intel PT stream.
    PtDecode(pt_decode::Args),
    /// Write a shell completion script for `cargo-memgaze` to stdout.
    ///
    /// Example: cargo memgaze completions bash > ~/.local/share/bash-completion/completions/cargo-memgaze
    Completions(completions::Args),
}

/// Runs a parsed command line.
pub fn dispatch(cli: MemgazeCli) -> anyhow::Result<Exit> {
    let global = cli.global;
    style::init(global.color);
    match cli.command {
        Command::Bench(args) => bench::run(args, &global),
        Command::Run(args) => run::run(args, &global),
        Command::Classify(args) => classify::run(args, &global),
        Command::Instrument(args) => instrument::run(args, &global),
        Command::Record(args) => record::run(args, &global),
        Command::Analyze(args) => analyze::run(args, &global),
        Command::Dump(args) => dump::run(args, &global),
        Command::Golden(args) => golden::run(args, &global),
        Command::Validate(args) => validate::run(args, &global),
        Command::Report(args) => report::run(args, &global),
        Command::Compare(args) => compare::run(args, &global),
        Command::Doctor(args) => doctor::run(args, &global),
        Command::PtDecode(args) => pt_decode::run(args, &global),
        Command::Completions(args) => completions::run(args, &global),
    }
}

/// Accepts both `cargo-memgaze memgaze <sub>` (how cargo calls it) and
/// `cargo-memgaze <sub>` (run directly) by inserting the `memgaze` token.
pub fn normalize_args(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    if args.get(1).is_none_or(|a| a != "memgaze") {
        args.insert(1.min(args.len()), "memgaze".into());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        CargoCli::command().debug_assert();
    }

    /// `record` and `run` exit with the program's status, so their `--help`
    /// must say that their codes are not memgaze's (a program's 3 is not a
    /// regression).
    #[test]
    fn record_and_run_help_explain_the_exit_status_pass_through() {
        let mut cli = CargoCli::command();
        let memgaze = cli.find_subcommand_mut("memgaze").unwrap();
        for name in ["record", "run"] {
            let help = memgaze
                .find_subcommand_mut(name)
                .unwrap()
                .render_long_help()
                .to_string();
            let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
            for expected in [
                "Exit status: the program's own",
                "128 + N",
                "not memgaze's exit codes",
                "a program that exits 3 is not a regression",
                "`error:` line",
            ] {
                assert!(help.contains(expected), "{name}: no {expected:?} in {help}");
            }
        }
    }

    #[test]
    fn memgaze_token_is_inserted_only_when_missing() {
        let a = |v: &[&str]| {
            v.iter()
                .map(Into::into)
                .collect::<Vec<std::ffi::OsString>>()
        };
        assert_eq!(
            normalize_args(a(&["cargo-memgaze", "doctor"])),
            a(&["cargo-memgaze", "memgaze", "doctor"])
        );
        assert_eq!(
            normalize_args(a(&["cargo-memgaze", "memgaze", "doctor"])),
            a(&["cargo-memgaze", "memgaze", "doctor"])
        );
        assert_eq!(
            normalize_args(a(&["cargo-memgaze"])),
            a(&["cargo-memgaze", "memgaze"])
        );
    }
}
