//! The command layer: argument parsing and one module per subcommand.
//!
//! Each subcommand module exposes an `Args` struct (clap) and
//! `run(args, &Global) -> anyhow::Result<Exit>`. Commands do their work
//! through the library modules; they only parse, print and choose exit codes.

use crate::error::Exit;
use clap::{Args, Parser, Subcommand, ValueEnum};

pub mod analyze;
pub mod backend;
pub mod bench;
pub mod classify;
pub mod doctor;
pub mod dump;
pub mod golden;
pub mod instrument;
pub mod progress;
pub mod pt_decode;
pub mod record;
pub mod report;
pub mod run;
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
#[command(version, about, long_about = None, propagate_version = true)]
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

/// The subcommands (spec/CLI.md).
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
    /// through untouched (death by signal N exits 128 + N); ASLR is off.
    /// Sampled by default: windows of 1000 consecutive instrumented-load
    /// executions per period of 100000 (≈1% of the loads), every execution
    /// counted; --full records all of them.
    ///
    /// Example: cargo memgaze record --seed 1 -o run.trace -- ./mybin.mg input.txt
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
    /// Tell which recording backends this machine supports, and why not.
    Doctor(doctor::Args),
    /// Print the PTW events of a raw Intel PT stream.
    PtDecode(pt_decode::Args),
}

/// Runs a parsed command line.
pub fn dispatch(cli: MemgazeCli) -> anyhow::Result<Exit> {
    let global = cli.global;
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
        Command::Doctor(args) => doctor::run(args, &global),
        Command::PtDecode(args) => pt_decode::run(args, &global),
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
