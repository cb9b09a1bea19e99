//! `cargo memgaze run`: instrument a program (cached), run it under the
//! software recorder and print the analysis of its loads.
//!
//! The program's stdin, stdout, stderr and exit status pass through; the
//! analysis is printed after it exits (to stdout, or to `--output`), and
//! progress and notes go to stderr. The instrumented copy is kept under
//! `target/memgaze/instrumented/` when run inside a cargo project (keyed by
//! the binary's hash and file name, the function selection and this cargo
//! memgaze), else
//! in a temporary directory, and runs from a mirror of the original's
//! directories beside it ([`crate::pipeline::layout`]), so that programs
//! that find their files relative to their executable find them.

use super::record::{SamplingArgs, exit_like_program, print_summary, resolve_program};
use super::style::styled_eprintln;
use super::{Format, Global};
use anyhow::{Context, Result};
use memgaze_analysis::table;
use memgaze_error::Exit;
use memgaze_metadata::annotation::{Annotation, InstrumentationMode, LoadFlags};
use memgaze_record::{self as record, AnalyzerSink, Tee};
use memgaze_trace::TraceWriter;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Arguments of `cargo memgaze run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub time: super::limits::LimitArgs,
    /// Instrument only functions whose name matches this glob.
    #[arg(long, value_name = "GLOB")]
    pub functions: Option<String>,
    /// How to print the analysis.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the analysis here instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Also keep the trace in this file.
    #[arg(long, value_name = "TRACE")]
    pub save_trace: Option<PathBuf>,
    #[command(flatten)]
    pub libs: super::record::LibsArgs,
    #[command(flatten)]
    pub caches: super::caches::CacheSizesArgs,
    /// The program (an ordinary, uninstrumented executable) and its
    /// arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    pub command: Vec<OsString>,
}

/// Runs the command.
pub fn run(args: Args, global: &Global) -> Result<Exit> {
    let sampling = args.sampling.sampling()?;
    // Outputs written after the program ran are checked before it starts.
    for path in [&args.output, &args.save_trace].into_iter().flatten() {
        memgaze_output::check_output(path)?;
    }
    let program = resolve_program(Path::new(&args.command[0]))?;
    // `run` instruments for whichever backend the machine offers.
    let choice = args.sampling.resolve_backend()?;
    let mode = match choice.backend {
        memgaze_trace::Backend::Pt => InstrumentationMode::Ptwrite,
        _ => InstrumentationMode::Soft,
    };
    // Caught for the whole command, not only while recording: a signal
    // that killed us while instrumenting or printing would leave the
    // temporary directory behind. One that comes before the recording
    // starts stops the command before the program runs.
    let watch = record::signals::Watch::start();
    let (instrumented, annotation, _temporary) =
        instrumented_copy(&program, args.functions.as_deref(), mode, global)?;
    // Beside the copy, a mirror of the original's directories: programs
    // that find their files relative to their executable find them.
    let mirror_root = instrumented
        .parent()
        .context("the instrumented copy has no directory")?
        .join(MIRROR_DIR);
    // A read-only cache still runs the copy, where it is.
    let instrumented = match crate::pipeline::layout::mirror(&program, &instrumented, &mirror_root)
    {
        Ok(mirrored) => mirrored,
        Err(e) => {
            eprintln!(
                "memgaze: note: running {} where it is ({}): a program that finds its files relative to its executable may not find them",
                instrumented.display(),
                memgaze_error::one_line(&e)
            );
            instrumented
        }
    };
    if let Some(code) = watch.stopped("before the program started") {
        return Ok(Exit::Interrupted(code));
    }
    let backend = args
        .sampling
        .backend_for(choice, &program, annotation.mode, global)?;
    if backend == memgaze_trace::Backend::Pt {
        super::record::refuse_limits_with_pt(&args.time)?;
        return run_pt(&args, &instrumented, &annotation, global);
    }
    let limits = args.time.limits();

    let mut command = vec![program.display().to_string()];
    command.extend(
        args.command[1..]
            .iter()
            .map(|a| a.to_string_lossy().into_owned()),
    );
    let spatial = args.sampling.spatial();
    let mut header = record::trace_header(&annotation, sampling, command);
    header.spatial = spatial;
    let libraries = args
        .libs
        .prepare(&program, cache_dir().as_deref(), global)?;
    // Instrumenting the libraries takes seconds: a signal meanwhile must
    // stop the command too (the recording counts only later ones).
    if let Some(code) = watch.stopped("before the program started") {
        return Ok(Exit::Interrupted(code));
    }
    let objects = record::Objects {
        bases: libraries.extend_header(&mut header),
        valid: libraries.valid_loads(&annotation),
        escapes: record::escape_sites(&annotation),
        library_escapes: libraries.escape_sites(),
        measured_regions: record::records_only_in_regions(&annotation),
    };
    let program_command = |instrumented: &Path, command: &[OsString]| {
        let mut cmd = program_command(instrumented, command);
        libraries.apply(&mut cmd);
        cmd
    };
    let mut analyzer = AnalyzerSink::new(&header, &args.caches.analysis_options())?;
    let recording = match &args.save_trace {
        Some(path) => {
            let mut writer =
                TraceWriter::create(path, &header).with_context(|| path.display().to_string())?;
            let recording = record::record_objects_within(
                program_command(&instrumented, &args.command),
                &objects,
                &sampling,
                spatial,
                &mut Tee(&mut record::NamedSink(&mut writer, path), &mut analyzer),
                &limits,
            )?;
            writer
                .finish(&recording.totals)
                .with_context(|| path.display().to_string())?
                .commit()?;
            recording
        }
        None => record::record_objects_within(
            program_command(&instrumented, &args.command),
            &objects,
            &sampling,
            spatial,
            &mut analyzer,
            &limits,
        )?,
    };
    if !global.quiet {
        let target = args
            .save_trace
            .as_deref()
            .unwrap_or_else(|| Path::new("the analysis"));
        print_summary(&recording, target);
        super::record::print_static_coverage(annotation.loads.iter().map(LoadFlags::of));
        eprintln!(
            "memgaze: {}",
            super::record::untraced_note_with(&annotation, &libraries)
        );
    }
    let late = libraries.loaded_at_run(&recording.loaded_objects, &instrumented, &header);
    if let Some(path) = args.save_trace.as_deref() {
        super::record::complete_header(path, &mut header, &recording, &late)?;
    }
    analyzer.add_untraced_libraries(&late.untraced);
    let mut analysis = analyzer.finish(&recording.totals);
    analysis.coverage.notes.extend(late.note());
    print_dynamic_coverage(&analysis, global.quiet);
    print_analysis(&args, &analysis)?;
    // Returned, not `process::exit`: the temporary directory of the
    // instrumented copy (outside a cargo project) is removed on the way out.
    match watch.signal() {
        // A signal after the program ended (while analysing) still ends
        // the command as interrupted.
        Some(signal) if recording.interrupted.is_none() => Ok(Exit::Interrupted(128 + signal)),
        _ => Ok(exit_like_program(&recording)),
    }
}

/// `; {what} are not counted (a, b)` for the dynamic coverage line, or
/// nothing when `objects` is empty.
pub(crate) fn not_counted(what: &str, objects: &[impl AsRef<str>]) -> String {
    if objects.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = objects.iter().map(AsRef::as_ref).collect();
    format!("; {what} are not counted ({})", names.join(", "))
}

/// The dynamic coverage line of a software recording, and the warning
/// below [`memgaze_analysis::DYNAMIC_COVERAGE_WARNING`] (even with
/// `--quiet`).
pub fn print_dynamic_coverage(analysis: &memgaze_analysis::Analysis, quiet: bool) {
    let Some(coverage) = analysis.summary.coverage_dynamic else {
        if let Some(missing) = analysis.summary.escape_counts_missing
            && !quiet
        {
            styled_eprintln!(
                "memgaze: {}",
                memgaze_analysis::escape_counts_missing_note(missing)
            );
        }
        return;
    };
    if !quiet {
        // The figure covers the instrumented objects only: say so beside
        // it when libraries ran uninstrumented, whose loads nobody counted.
        let uninstrumented: Vec<&str> = analysis
            .summary
            .coverage_by_object
            .iter()
            .filter(|o| !o.instrumented)
            .map(|o| o.object.as_str())
            .collect();
        let uncounted = &analysis.coverage.uncounted_libraries;
        styled_eprintln!(
            "memgaze: dynamic coverage: {:.1}% of the instrumented code's load executions traced{}{}{}",
            100.0 * coverage,
            counted_untraced(analysis),
            not_counted(
                "escapes and untraced loads in instrumented libraries",
                uncounted
            ),
            not_counted("loads in uninstrumented libraries", &uninstrumented)
        );
    }
    if let Some(warning) =
        memgaze_analysis::dynamic_coverage_warning(coverage, &analysis.coverage.untraced_functions)
    {
        styled_eprintln!("warning: {warning}");
    }
}

/// What the dynamic coverage line counted: escapes, and executions of
/// loads no probe can trace.
fn counted_untraced(analysis: &memgaze_analysis::Analysis) -> String {
    let escapes: u64 = (analysis.coverage.untraced_functions.iter())
        .map(|f| f.escapes)
        .sum();
    let loads = analysis.summary.untraced_load_executions.unwrap_or(0);
    match (escapes, loads) {
        (0, 0) => " (no escape into original code counted)".to_string(),
        (_, 0) => format!(" (an estimate: {escapes} escapes into original code counted)"),
        _ => format!(
            " (an estimate: {escapes} escapes into original code and {loads} executions of loads no probe can trace counted)"
        ),
    }
}

/// The directory of a cache entry (or the temporary directory) that holds
/// the mirror of the original's path ([`crate::pipeline::layout`]).
const MIRROR_DIR: &str = "mirror";

/// The command that runs the instrumented copy with the program's
/// arguments, and with `argv[0]` as the user gave it: programs that look at
/// their name (multi-call binaries, usage lines, gzip's `gunzip` check) see
/// what they would natively.
fn program_command(instrumented: &Path, command: &[OsString]) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(instrumented);
    cmd.arg0(&command[0]).args(&command[1..]);
    cmd
}

/// `run` with Intel PT: the trace goes to a file (`--save-trace`, else a
/// temporary one) and is analysed from there.
fn run_pt(
    args: &Args,
    instrumented: &Path,
    annotation: &Annotation,
    global: &Global,
) -> Result<Exit> {
    let temporary =
        memgaze_output::private_tempdir().context("cannot create a temporary directory")?;
    let trace = args
        .save_trace
        .clone()
        .unwrap_or_else(|| temporary.path().join("trace.mgz"));
    let totals = super::record::record_pt_to_file(
        instrumented,
        &args.command[1..],
        annotation,
        &args.sampling.pt_options(),
        &trace,
        global,
    )?;
    let reader =
        memgaze_trace::TraceReader::open(&trace).with_context(|| trace.display().to_string())?;
    let analysis = memgaze_analysis::analyze_trace(reader, &args.caches.analysis_options())?;
    print_analysis(args, &analysis)?;
    Ok(super::record::exit_like(totals.exit))
}

fn print_analysis(args: &Args, analysis: &memgaze_analysis::Analysis) -> Result<()> {
    let text = match args.format {
        Format::Table => table::render(analysis, &table::TableOptions::default()),
        Format::Json => serde_json::to_string_pretty(analysis)? + "\n",
    };
    match &args.output {
        Some(path) => memgaze_output::write_atomic(path, text)?,
        None => {
            let mut out = std::io::stdout().lock();
            match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                Ok(()) => {}
                // `run prog | head` is normal use: the reader is gone, and
                // the exit status stays the program's.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                Err(e) => return Err(e).context("cannot write to standard output"),
            }
        }
    }
    Ok(())
}

/// The instrumented copy of `program` for this selection, made if missing
/// (and the temporary directory holding it outside a cargo project).
fn instrumented_copy(
    program: &Path,
    functions: Option<&str>,
    mode: InstrumentationMode,
    global: &Global,
) -> Result<(PathBuf, Annotation, Option<tempfile::TempDir>)> {
    let instrument = |input: &Path, output: &Path| {
        if !global.quiet {
            styled_eprintln!("memgaze: instrumenting {}…", input.display());
        }
        let result = super::instrument::instrument_file(input, output, functions, mode)?;
        if global.verbose > 0 {
            eprint!("{}", result.report);
        }
        Ok((result.annotation, result.report))
    };
    match cache_dir() {
        Some(cache) => {
            let selection = format!(
                "run --functions {} --mode {mode:?}",
                functions.unwrap_or("*")
            );
            let copy = crate::pipeline::instrumented::cached(
                program,
                &cache,
                selection.as_bytes(),
                instrument,
            )?;
            Ok((copy.path, copy.annotation, None))
        }
        None => {
            let temporary =
                memgaze_output::private_tempdir().context("cannot create a temporary directory")?;
            let name = program.file_name().unwrap_or("program".as_ref());
            let output = temporary.path().join(name);
            let (annotation, _) = instrument(program, &output)?;
            Ok((output, annotation, Some(temporary)))
        }
    }
}

/// `target/memgaze/instrumented` of the cargo project around, if any.
pub(super) fn cache_dir() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    target
        .is_dir()
        .then(|| target.join("memgaze").join("instrumented"))
}
