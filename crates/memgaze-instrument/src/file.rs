//! Instrumenting an executable file: select functions, classify their
//! loads, rewrite the binary and write the executable and its annotation.

use crate::annotation::{Annotation, InstrumentationMode};
use crate::binary::{Binary, FunctionCode};
use crate::classify::{BinaryLoads, Classifier, FunctionLoads};
use crate::rewrite::{self as instrument, InstrumentOptions, Instrumented};
use anyhow::{Context, Result};
use memgaze_error::usage;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

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
    let (executable, annotation) = rayon::join(
        || write_executable(output, &result.executable),
        || write_annotation(output, &result.annotation),
    );
    executable?;
    annotation?;
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

fn write_executable(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(path)
        .with_context(|| format!("{}: cannot write", path.display()))?;
    file.write_all(bytes)
        .with_context(|| format!("{}: cannot write", path.display()))?;
    // An existing file keeps its mode: make sure it can run.
    use std::os::unix::fs::PermissionsExt;
    let mut permissions = file.metadata()?.permissions();
    permissions.set_mode(permissions.mode() | 0o111);
    file.set_permissions(permissions)
        .with_context(|| format!("{}: cannot make executable", path.display()))?;
    Ok(())
}

fn write_annotation(executable: &Path, annotation: &Annotation) -> Result<()> {
    let path = instrument::annotation_path(executable);
    let file = std::fs::File::create(&path)
        .with_context(|| format!("{}: cannot write", path.display()))?;
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, file);
    serde_json::to_writer(&mut writer, annotation)
        .map_err(std::io::Error::from)
        .and_then(|()| writer.flush())
        .with_context(|| format!("{}: cannot write", path.display()))?;
    Ok(())
}
