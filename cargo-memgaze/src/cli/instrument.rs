//! `cargo memgaze instrument`: write an instrumented executable and its
//! annotation (`<OUT>.memgaze.json`) and print the instrumentation report.

use super::{Format, Global};
use crate::annotation::{Annotation, InstrumentationMode};
use crate::binary::{Binary, FunctionCode};
use crate::classify::{BinaryLoads, Classifier, FunctionLoads};
use crate::error::{Exit, usage};
use crate::instrument::{self, InstrumentOptions, Instrumented};
use crate::trace::AtomicFile;
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Arguments of `cargo memgaze instrument`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The executable to instrument (x86-64 ELF, dynamically linked).
    pub elf: PathBuf,
    /// Where to write the instrumented executable (its annotation goes to
    /// `<OUT>.memgaze.json`).
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
    let started = std::time::Instant::now();
    let result = instrument_file(
        &args.elf,
        &args.output,
        args.functions.as_deref(),
        args.mode.into(),
    )?;
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
    Ok(Exit::Ok)
}

/// Selects functions by glob (all when `None`), builds the annotation and
/// instruments `input` into `output` (+ annotation beside it).
pub fn instrument_file(
    input: &Path,
    output: &Path,
    functions: Option<&str>,
    mode: InstrumentationMode,
) -> Result<Instrumented> {
    let started = std::time::Instant::now();
    let binary = Binary::open(input)?;
    let opened = started.elapsed().as_secs_f64();
    let (annotation, mut codes) = annotate_with_code(&binary, functions)?;
    let classified = started.elapsed().as_secs_f64() - opened;
    let mut result = instrument::instrument_with_code(
        &binary,
        annotation,
        &InstrumentOptions { mode },
        &mut codes,
    )
    .with_context(|| input.display().to_string())?;
    let written = std::time::Instant::now();
    // Both outputs are checked and staged before either is written, so a
    // refused annotation path leaves no executable behind (and vice versa).
    let mut staged_executable =
        AtomicFile::create_with_mode(output, crate::trace::output::EXECUTABLE_MODE)?;
    let mut staged_annotation = AtomicFile::create(&instrument::annotation_path(output))?;
    let (executable, annotation) = rayon::join(
        || write_executable(&mut staged_executable, &result.executable),
        || write_annotation(&mut staged_annotation, &result.annotation),
    );
    executable?;
    annotation?;
    staged_executable.commit()?;
    staged_annotation.commit()?;
    let timings = &mut result.report.timings;
    timings.insert(0, ("classify (CFG, load classes)".into(), classified));
    timings.insert(
        0,
        ("read binary (functions, symbols, lines)".into(), opened),
    );
    timings.push((
        "write executable and annotation".into(),
        written.elapsed().as_secs_f64(),
    ));
    Ok(result)
}

/// The annotation of the selected functions.
pub fn annotate(binary: &Binary, functions: Option<&str>) -> Result<Annotation> {
    Ok(annotate_with_code(binary, functions)?.0)
}

/// The annotation of the selected functions and their control flow (built
/// once, on all cores, for the classification and then the rewriter).
pub fn annotate_with_code(
    binary: &Binary,
    functions: Option<&str>,
) -> Result<(Annotation, HashMap<u64, FunctionCode>)> {
    let selected = select(binary, functions)?;
    let parts: Vec<(usize, FunctionLoads, FunctionCode)> = {
        use rayon::prelude::*;
        selected
            .par_iter()
            .map_init(Classifier::new, |classifier, &i| {
                let code = binary.function_code(&binary.functions()[i]);
                let loads = classifier.classify(&code);
                (i, loads, code)
            })
            .collect()
    };
    let mut loads = BinaryLoads {
        functions: Vec::with_capacity(selected.len()),
    };
    let mut codes = HashMap::with_capacity(selected.len());
    for (i, function_loads, code) in parts {
        codes.insert(binary.functions()[i].start, code);
        loads.functions.push((i, function_loads));
    }
    Ok((loads.to_annotation(binary), codes))
}

/// Indices of the functions a `--functions` glob selects (all when `None`).
fn select(binary: &Binary, functions: Option<&str>) -> Result<Vec<usize>> {
    match functions {
        None => Ok((0..binary.functions().len()).collect()),
        Some(glob) => {
            let matcher = globset::Glob::new(glob)
                .map_err(|e| usage(format!("--functions {glob}: {e}")))?
                .compile_matcher();
            let selected: Vec<usize> = binary
                .functions()
                .iter()
                .enumerate()
                .filter(|(_, f)| {
                    matcher.is_match(&f.name)
                        || f.raw_name.as_deref().is_some_and(|r| matcher.is_match(r))
                })
                .map(|(i, _)| i)
                .collect();
            if selected.is_empty() {
                anyhow::bail!(
                    "--functions {glob}: no function of {} matches",
                    binary.path().display()
                );
            }
            Ok(selected)
        }
    }
}

/// Writes the executable into its staged file (renamed into place by the
/// caller; a replaced file keeps its mode, made executable).
fn write_executable(file: &mut AtomicFile, bytes: &[u8]) -> Result<()> {
    file.write_all(bytes)
        .with_context(|| format!("{}: cannot write", file.path().display()))
}

fn write_annotation(file: &mut AtomicFile, annotation: &Annotation) -> Result<()> {
    serde_json::to_writer(&mut *file, annotation)
        .map_err(std::io::Error::from)
        .and_then(|()| file.flush())
        .with_context(|| format!("{}: cannot write", file.path().display()))
}
