//! `cargo memgaze instrument`: write an instrumented executable and its
//! annotation (`<OUT>.memgaze.json`, compact unless JSON is asked for) and
//! print the instrumentation report.

use super::{Format, Global};
use anyhow::Result;
use memgaze_error::Exit;
pub use memgaze_instrument::{annotate, annotate_with_code, instrument_file, instrument_file_as};
use memgaze_metadata::annotation::{AnnotationFormat, InstrumentationMode};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Arguments of `cargo memgaze instrument`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The executable to instrument (x86-64 ELF, dynamically linked).
    pub elf: PathBuf,
    /// Where to write the instrumented executable (its annotation goes to
    /// `<OUT>.memgaze.json`, in the format `--annotation-format` names).
    #[arg(short, long, value_name = "OUT")]
    pub output: PathBuf,
    /// Instrument only functions whose (demangled or raw) name matches this
    /// glob, e.g. `'*lookup*'`.
    #[arg(long, value_name = "GLOB")]
    pub functions: Option<String>,
    /// `soft`: counting probes and the software recorder (runs anywhere;
    /// what `record`/`run` need); `ptwrite`: Intel PT `ptwrite` of each
    /// load's address registers (for the PT backend; needs a CPU with
    /// PTWRITE, else the program dies of SIGILL).
    #[arg(long, value_enum, default_value_t = ModeArg::Soft)]
    pub mode: ModeArg,
    /// How to print the report.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Instrument a shared library (soft mode, every function) as object
    /// number N (1–127, the high bits of its record ids), for a program
    /// whose instrumented executable loads it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=127), conflicts_with_all = ["functions", "mode"])]
    pub library: Option<u32>,
    /// How to write the annotation: `compact` (binary, zstd; what every
    /// command reads fastest) or `json` (schema `memgaze.annotation.v1`,
    /// for people and other tools). Readers accept both.
    #[arg(long, value_enum, default_value_t = AnnotationFormatArg::Compact)]
    pub annotation_format: AnnotationFormatArg,
}

/// `--annotation-format` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnnotationFormatArg {
    /// Binary, zstd-compressed.
    Compact,
    /// JSON text.
    Json,
}

impl From<AnnotationFormatArg> for AnnotationFormat {
    fn from(format: AnnotationFormatArg) -> Self {
        match format {
            AnnotationFormatArg::Compact => AnnotationFormat::Compact,
            AnnotationFormatArg::Json => AnnotationFormat::Json,
        }
    }
}

/// `--mode` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeArg {
    /// Software recorder.
    Soft,
    /// Intel PT `ptwrite`.
    Ptwrite,
}

impl From<ModeArg> for InstrumentationMode {
    fn from(mode: ModeArg) -> Self {
        match mode {
            ModeArg::Soft => InstrumentationMode::Soft,
            ModeArg::Ptwrite => InstrumentationMode::Ptwrite,
        }
    }
}

/// Runs the command.
pub fn run(args: Args, global: &Global) -> Result<Exit> {
    refuse_output_over_input(&args.elf, &args.output)?;
    let started = std::time::Instant::now();
    let result = match args.library {
        Some(object) => memgaze_instrument::instrument_library_file_as(
            &args.elf,
            &args.output,
            object,
            args.annotation_format.into(),
        )?,
        None => instrument_file_as(
            &args.elf,
            &args.output,
            args.functions.as_deref(),
            args.mode.into(),
            args.annotation_format.into(),
        )?,
    };
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Table => {
            if !global.quiet {
                writeln!(
                    out,
                    "instrumented {} → {} ({:.2}s)",
                    args.elf.display(),
                    args.output.display(),
                    started.elapsed().as_secs_f64()
                )?;
                write!(out, "{}", result.report)?;
                if global.verbose > 0 {
                    for (phase, seconds) in &result.report.timings {
                        writeln!(out, "  {seconds:8.3}s  {phase}")?;
                    }
                }
            }
        }
        Format::Json => {
            serde_json::to_writer_pretty(&mut out, &result.report)?;
            writeln!(out)?;
        }
    }
    // The process exits right after this command: freeing the annotation
    // (a few strings per load, millions on a large program) would only
    // delay the exit, by 50-90 ms on the own release binary.
    std::mem::forget(result);
    Ok(Exit::Ok)
}

/// Refuses an `-o` that is the input itself (the same file by device and
/// inode, whatever the spelling): the instrumented copy would replace the
/// original, which every later run needs.
fn refuse_output_over_input(elf: &Path, output: &Path) -> Result<()> {
    let (Ok(input), Ok(existing)) = (std::fs::metadata(elf), std::fs::metadata(output)) else {
        return Ok(());
    };
    if input.dev() == existing.dev() && input.ino() == existing.ino() {
        return Err(memgaze_error::usage(format!(
            "{}: -o names the input itself: instrumenting in place would replace the original; write the copy elsewhere",
            output.display()
        )));
    }
    Ok(())
}
