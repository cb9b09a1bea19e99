//! Instrumenting an executable file: select functions, classify their
//! loads, rewrite the binary and write the executable and its annotation.

use crate::annotation::{Annotation, AnnotationFormat, InstrumentationMode};
use crate::binary::{Binary, FunctionCode};
use crate::classify::{BinaryLoads, Classifier, FunctionLoads, Position};
use crate::error::InstrumentError;
use crate::rewrite::output::FileOutput;
use crate::rewrite::{self as instrument, InstrumentOptions, Instrumented};
use foldhash::{HashMap, HashMapExt};
use memgaze_error::UsageError;
use memgaze_output::{AtomicFile, EXECUTABLE_MODE};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// Selects functions by glob (all when `None`), builds the annotation and
/// instruments `input` into `output` (+ the compact annotation beside it).
/// The result's `executable` is empty: its bytes are in `output`.
pub fn instrument_file(
    input: &Path,
    output: &Path,
    functions: Option<&str>,
    mode: InstrumentationMode,
) -> Result<Instrumented, InstrumentError> {
    instrument_object(
        input,
        output,
        functions,
        mode,
        None,
        AnnotationFormat::Compact,
    )
}

/// [`instrument_file`], with the annotation written as `format`.
pub fn instrument_file_as(
    input: &Path,
    output: &Path,
    functions: Option<&str>,
    mode: InstrumentationMode,
    format: AnnotationFormat,
) -> Result<Instrumented, InstrumentError> {
    instrument_object(input, output, functions, mode, None, format)
}

/// Instruments the shared library `input` into `output` (+ annotation
/// beside it) as object number `object` (1..=`MAX_OBJECT`, the high bits
/// of its record ids; see [`crate::rewrite::library`]): every function, soft
/// probes, no entry or exit hook.
pub fn instrument_library_file(
    input: &Path,
    output: &Path,
    object: u32,
) -> Result<Instrumented, InstrumentError> {
    instrument_library_file_as(input, output, object, AnnotationFormat::Compact)
}

/// [`instrument_library_file`], with the annotation written as `format`.
pub fn instrument_library_file_as(
    input: &Path,
    output: &Path,
    object: u32,
    format: AnnotationFormat,
) -> Result<Instrumented, InstrumentError> {
    instrument_object(
        input,
        output,
        None,
        InstrumentationMode::Soft,
        Some(object),
        format,
    )
}

fn instrument_object(
    input: &Path,
    output: &Path,
    functions: Option<&str>,
    mode: InstrumentationMode,
    library: Option<u32>,
    format: AnnotationFormat,
) -> Result<Instrumented, InstrumentError> {
    let started = std::time::Instant::now();
    crate::timings::begin();
    let whole = crate::timings::phase("instrument (whole)");
    build_iced_tables_beside();
    let peak_held_down = crate::rewrite::PeakHeldDown::new();
    let mut binary = {
        let _open = crate::timings::phase("open (ELF, symbols, functions)");
        Binary::open_hashing_later(input, library.is_some())?
    };
    peak_held_down.unless_needed_for(&binary);
    let opened = started.elapsed().as_secs_f64();
    // A large file is hashed on a thread of its own from the moment it is
    // opened, beside the function discovery and then the classification.
    let selected = select(&binary, functions)?;
    let parts = classify_functions(&binary, &selected);
    binary.finish_sha256();
    let (annotation, mut codes) = gather_annotation(&binary, selected.len(), parts);
    let staging = crate::timings::phase("stage outputs, load addresses");
    if library.is_some() && annotation.loads.len() > crate::rewrite::library::MAX_LOADS {
        return Err(InstrumentError::InFile {
            path: input.to_path_buf(),
            source: Box::new(InstrumentError::TooManyLoads(annotation.loads.len())),
        });
    }
    let classified = started.elapsed().as_secs_f64() - opened;
    // Both outputs are checked and staged before either is written, so a
    // refused annotation path leaves no executable behind (and vice versa).
    let mut staged_executable = AtomicFile::create_with_mode(output, EXECUTABLE_MODE)?;
    let mut staged_annotation = AtomicFile::create(&instrument::annotation_path(output))?;
    let options = InstrumentOptions {
        mode,
        library,
        escape_checks: instrument::escape_checks_from_env(),
        spatial_bmi2: instrument::spatial_bmi2_from_env(),
    };
    let in_file = |e| InstrumentError::InFile {
        path: input.to_path_buf(),
        source: Box::new(e),
    };
    let write_error = |source| InstrumentError::Write {
        path: output.to_path_buf(),
        source,
    };
    // The loads' line table is read and their source positions looked up
    // beside the rewriter's serial steps after the copies, one unit and one
    // run of addresses at a time on a thread of their own (taking the core
    // those steps leave idle) until they are needed, what is left then on
    // all cores. The positions are given to the loads and the annotation
    // encoded while the rewriter writes the rest of the executable. (Every
    // load the rewriter is given comes from the classification: their
    // addresses are the ones looked up.)
    let load_addresses = crate::classify::sorted_addresses(&annotation.loads);
    drop(staging);
    let read_lines = |needed: &AtomicBool| {
        let lines = crate::timings::phase("line table (beside)");
        let table = binary.line_table_until_hurried(&load_addresses, needed);
        drop(lines);
        let _positions = crate::timings::phase("positions of loads (beside)");
        crate::classify::positions_until_hurried(&load_addresses, &table, needed)
    };
    let finish_annotation = |annotation: &mut Annotation, mut positions: Vec<Position>| {
        // The DWARF sections' pages are not read again (the writer gives
        // up the input's other pages as it copies them).
        binary.release_resident();
        let _lines = crate::timings::phase("add lines to loads (beside)");
        let looked_up = (load_addresses.as_slice(), positions.as_mut_slice());
        // A load the classification did not give (none) has its position
        // read for it.
        if !crate::classify::add_positions(&mut annotation.loads, looked_up) {
            crate::classify::add_lines(&mut annotation.loads, &binary);
        }
        drop(positions);
        drop(_lines);
        let _encode = crate::timings::phase("encode annotation (beside)");
        annotation.to_bytes(format)
    };
    // The executable is written as it is made, straight into the file
    // (held whole in memory, it was the rewriter's largest part at the
    // end); a device or FIFO, which takes no writes at offsets, gets it
    // built in memory and written in order, and so does a small input's
    // (one write instead of hundreds).
    let small = binary.is_small();
    let (mut result, annotation_bytes) = match staged_executable.regular_file()? {
        Some(file) if !small => {
            let mut out = FileOutput::new(file);
            let result = instrument::instrument_with_code(
                &binary,
                annotation,
                &options,
                &mut codes,
                (&mut out, read_lines, finish_annotation),
            );
            if let Some(source) = out.error() {
                return Err(write_error(source));
            }
            result.map_err(in_file)?
        }
        regular => {
            let mut bytes = Vec::new();
            let result = instrument::instrument_with_code(
                &binary,
                annotation,
                &options,
                &mut codes,
                (&mut bytes, read_lines, finish_annotation),
            )
            .map_err(in_file)?;
            // A regular file's error is the system's own, as when written
            // in place (the staged file's own writes name the file).
            match regular {
                Some(file) => file.write_all_at(&bytes, 0).map_err(write_error)?,
                None => staged_executable.write_bytes(&bytes)?,
            }
            result
        }
    };
    let written = std::time::Instant::now();
    let committing = crate::timings::phase("write annotation, commit both");
    // Whatever the writer read again after the line table is given up.
    binary.release_resident();
    write_annotation(&mut staged_annotation, &annotation_bytes)?;
    drop(annotation_bytes);
    staged_executable.commit()?;
    staged_annotation.commit()?;
    drop(committing);
    let timings = &mut result.report.timings;
    timings.insert(0, ("classify (CFG, load classes)".into(), classified));
    timings.insert(
        0,
        ("read binary (functions, symbols, lines)".into(), opened),
    );
    timings.push((
        "write annotation, commit both files".into(),
        written.elapsed().as_secs_f64(),
    ));
    drop(whole);
    Ok(result)
}

/// Has a pool worker build iced's decoder and encoder tables, which iced
/// builds on first use (about half a millisecond of CPU together), while
/// this thread reads and parses the input. Otherwise this thread builds
/// them where it first decodes (function discovery) and first assembles
/// (the runtime), both before or between the parallel stages, with the
/// other core idle: a small input's time is mostly such serial steps.
fn build_iced_tables_beside() {
    use iced_x86::{Code, Decoder, DecoderOptions, Encoder, Instruction, Register};
    rayon::spawn(|| {
        let _ = Decoder::with_ip(64, &[0x90], 0, DecoderOptions::NONE).decode();
        if let Ok(mov) = Instruction::with2(Code::Mov_rm64_imm32, Register::RAX, 1) {
            let _ = Encoder::new(64).encode(&mov, 0);
        }
    });
}

/// The annotation of the selected functions.
pub fn annotate(binary: &Binary, functions: Option<&str>) -> Result<Annotation, InstrumentError> {
    Ok(annotate_with_code(binary, functions)?.0)
}

/// The annotation of the selected functions and their control flow (built
/// once, on all cores, for the classification and then the rewriter).
pub fn annotate_with_code(
    binary: &Binary,
    functions: Option<&str>,
) -> Result<(Annotation, HashMap<u64, Box<FunctionCode>>), InstrumentError> {
    let (mut annotation, codes) = annotate_without_lines(binary, functions)?;
    crate::classify::add_lines(&mut annotation.loads, binary);
    Ok((annotation, codes))
}

/// [`annotate_with_code`] without the loads' source positions.
fn annotate_without_lines(
    binary: &Binary,
    functions: Option<&str>,
) -> Result<(Annotation, HashMap<u64, Box<FunctionCode>>), InstrumentError> {
    let selected = select(binary, functions)?;
    let parts = classify_functions(binary, &selected);
    Ok(gather_annotation(binary, selected.len(), parts))
}

/// The loads and the control flow of the functions `selected` (indices
/// into the binary's functions), on all cores, in order. Each function's
/// control flow is boxed where it is built: it then moves from this list
/// to the map of codes and on to the plans as one pointer, where each
/// list and map of it inline was a fresh copy of every function's (pages
/// faulted in for each).
fn classify_functions(
    binary: &Binary,
    selected: &[usize],
) -> Vec<(usize, FunctionLoads, Box<FunctionCode>)> {
    use rayon::prelude::*;
    let _classifying = crate::timings::phase("classify (CFG, load classes)");
    selected
        .par_iter()
        .map_init(Classifier::new, |classifier, &i| {
            let code = binary.function_code(&binary.functions()[i]);
            let loads = classifier.classify(&code);
            (i, loads, Box::new(code))
        })
        .collect()
}

/// The annotation (without source positions) of the `selected` functions'
/// classified `parts`, and their control flow keyed by function start.
fn gather_annotation(
    binary: &Binary,
    selected: usize,
    parts: Vec<(usize, FunctionLoads, Box<FunctionCode>)>,
) -> (Annotation, HashMap<u64, Box<FunctionCode>>) {
    let _gathering = crate::timings::phase("gather loads, annotation");
    let mut loads = BinaryLoads {
        functions: Vec::with_capacity(selected),
    };
    let mut codes = HashMap::with_capacity(selected);
    for (i, function_loads, code) in parts {
        codes.insert(binary.functions()[i].start, code);
        loads.functions.push((i, function_loads));
    }
    (loads.to_annotation_without_lines(binary), codes)
}

/// Indices of the functions a `--functions` glob selects (all when `None`).
fn select(binary: &Binary, functions: Option<&str>) -> Result<Vec<usize>, InstrumentError> {
    match functions {
        None => Ok((0..binary.functions().len()).collect()),
        Some(glob) => {
            let matcher = globset::Glob::new(glob)
                .map_err(|e| {
                    InstrumentError::Usage(UsageError(format!("--functions {glob}: {e}")))
                })?
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
                return Err(InstrumentError::NoFunctionMatch {
                    glob: glob.to_string(),
                    binary: binary.path().to_path_buf(),
                });
            }
            Ok(selected)
        }
    }
}

fn write_annotation(file: &mut AtomicFile, bytes: &[u8]) -> Result<(), InstrumentError> {
    Ok(file.write_bytes(bytes)?)
}
