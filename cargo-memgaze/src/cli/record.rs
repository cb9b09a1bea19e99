//! `cargo memgaze record`: run an instrumented program and write its trace.
//!
//! The program's standard streams and exit status pass through untouched:
//! `record` exits with the program's code (128 + N when it died of signal
//! N, like a shell). Progress and notes go to stderr.

use super::Global;
use super::style::styled_eprintln;
use crate::pipeline::instrumented::Decode;
use crate::pipeline::libs::{LibSelection, Libraries, LoadedAtRun};
use crate::pipeline::sites::{RecordInputs, SitesFor};
use anyhow::{Context, Result, bail};
use memgaze_error::{Exit, usage};
use memgaze_metadata::annotation::{Annotation, InstrumentationMode, LoadFlags};
use memgaze_record::pt::probe::{BackendChoice, BackendRequest};
use memgaze_record::{self as record, Recording};
use memgaze_trace::{Backend, ProgramExit, Sampling, TraceWriter};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// `--libs` of `record`, `run` and `bench`: libc, libm and libgcc_s by
/// default.
#[derive(clap::Args, Debug, Clone)]
pub struct LibsArgs {
    /// Shared libraries to instrument too: a comma-separated list of globs
    /// on the names the program needs them by (`libc.so.6`), where
    /// `default` (the default) stands for libc, libm and libgcc_s and
    /// `all` (or `'*'`) for every library, or `none` for the executable alone.
    /// Instrumented copies are cached like executables (or under
    /// `MEMGAZE_LIBS_CACHE`) and found first on `LD_LIBRARY_PATH`; a
    /// library that cannot be instrumented is named and runs original.
    #[arg(long, value_name = "LIBS", value_parser = parse_libs, default_value = "default", env = "MEMGAZE_LIBS")]
    pub libs: LibSelection,
}

/// `--libs` of `golden` and `validate`: none by default, so that the
/// checked-in snapshots do not depend on the host's libc (its version and
/// the variants it picks by CPU).
#[derive(clap::Args, Debug, Clone)]
pub struct SnapshotLibsArgs {
    /// Shared libraries to instrument too, as for `record` (`default`,
    /// globs), but `none` (the default) for the executable alone: the
    /// snapshots must not depend on the host's libraries.
    #[arg(long, value_name = "LIBS", value_parser = parse_libs, default_value = "none", env = "MEMGAZE_LIBS")]
    pub libs: LibSelection,
}

impl SnapshotLibsArgs {
    /// The selection, to prepare like `record`'s.
    pub fn to_libs_args(&self) -> LibsArgs {
        LibsArgs {
            libs: self.libs.clone(),
        }
    }
}

/// The directory `MEMGAZE_LIBS_CACHE` names for the instrumented libraries
/// instead of the project's cache (one cache for many projects, or for a
/// test run), if set and not empty.
fn libs_cache_override() -> Option<PathBuf> {
    std::env::var_os("MEMGAZE_LIBS_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn parse_libs(value: &str) -> Result<LibSelection, String> {
    LibSelection::parse(value)
}

impl LibsArgs {
    /// Instruments the selected libraries of `program` (cached under
    /// `MEMGAZE_LIBS_CACHE`, else `cache` when given), naming each one made now and each refused.
    pub fn prepare(
        &self,
        program: &Path,
        cache: Option<&Path>,
        global: &Global,
    ) -> Result<Libraries> {
        self.prepare_as(program, cache, Decode::Whole, global)
    }

    /// [`LibsArgs::prepare`], with the annotations of cached copies decoded
    /// as `decode` says.
    pub fn prepare_as(
        &self,
        program: &Path,
        cache: Option<&Path>,
        decode: Decode,
        global: &Global,
    ) -> Result<Libraries> {
        let cache = libs_cache_override().or_else(|| cache.map(Path::to_path_buf));
        let libraries =
            Libraries::prepare_as(program, &self.libs, cache.as_deref(), decode, |library| {
                if !global.quiet {
                    styled_eprintln!("memgaze: instrumenting {}…", library.display());
                }
            })?;
        for (library, reason) in &libraries.refused {
            styled_eprintln!(
                "memgaze: warning: {} ({}) is not instrumented and runs original: {reason}",
                library.name,
                library.path.display()
            );
        }
        if !libraries.unmatched.is_empty() && !global.quiet {
            styled_eprintln!(
                "memgaze: note: --libs {} matches none of the libraries {} loads at start ({}): a pattern matches the whole name (`{}`), or a library loaded later (dlopen) from the next run on",
                libraries.unmatched.join(", "),
                program.display(),
                libraries.at_start().join(", "),
                whole_name_hint(&libraries.unmatched[0])
            );
        }
        Ok(libraries)
    }
}

/// `pattern` as it would match a whole library name: `libz*` for `libz`.
fn whole_name_hint(pattern: &str) -> String {
    if pattern.ends_with('*') {
        pattern.to_string()
    } else {
        format!("{pattern}*")
    }
}

/// Sampling flags shared by `record` and `run`.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Record every instrumented-load execution (a full trace, `z = 0`):
    /// exact, but about 10–60× slower than the program alone and a trace
    /// as large as the loads executed. Without it, sampled recording.
    #[arg(long, conflicts_with_all = ["period", "window"])]
    pub full: bool,
    /// Instrumented-load executions per sampling period (`w + z`), per
    /// thread. Each period records one window of `--window` consecutive
    /// executions and skips the rest; the skip is jittered by ±1/8 so loops
    /// cannot alias with it. The default with `--window 1000` records ≈1%.
    #[arg(long, value_name = "N", default_value_t = record::DEFAULT_PERIOD)]
    pub period: u64,
    /// Consecutive instrumented-load executions recorded per period (`w`,
    /// one sample window). All executions are counted either way, so the
    /// analysis knows the sampling ratio ρ exactly.
    #[arg(long, value_name = "W", default_value_t = record::DEFAULT_WINDOW)]
    pub window: u64,
    /// Seed of the sampling jitter and of each thread's first window's
    /// phase (default: random, written in the trace header). The same seed
    /// and input give the same samples.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Recording backend: `auto` takes Intel PT where every check of
    /// `cargo memgaze doctor` passes (and the program was instrumented with
    /// `--mode ptwrite`), else the software recorder, and says which; `soft`
    /// the software recorder; `pt` Intel PT (one error line where it cannot
    /// run). With Intel PT, `--period` is the number of retired loads between
    /// AUX samples (default 1000003 when `--period` is left at its default)
    /// and `--window` does not apply.
    #[arg(long, value_enum, default_value_t = BackendRequest::Auto)]
    pub backend: BackendRequest,
    #[command(flatten)]
    pub spatial: super::spatial::SpatialArgs,
}

impl SamplingArgs {
    /// The sampling parameters these flags ask for.
    pub fn sampling(&self) -> Result<Sampling> {
        if self.full {
            return Ok(Sampling::full());
        }
        if self.window == 0 {
            return Err(usage("--window must be at least 1"));
        }
        if self.period < self.window {
            return Err(usage(format!(
                "--period {} must be at least --window {}",
                self.period, self.window
            )));
        }
        let seed = self.seed.unwrap_or_else(random_seed);
        Ok(Sampling {
            window: self.window,
            period: self.period,
            seed: Some(seed),
        })
    }

    /// The spatial sampling these flags ask for: none for a full trace or
    /// `--spatial-rate 0`.
    pub fn spatial(&self) -> Option<memgaze_trace::SpatialSampling> {
        if self.full {
            None
        } else {
            self.spatial.spatial()
        }
    }

    /// Resolves `--backend` against this machine (one error line when the
    /// requested backend cannot run here).
    pub fn resolve_backend(&self) -> Result<BackendChoice> {
        super::backend::resolve(self.backend)
    }

    /// What the machine's `choice` means for a program instrumented with
    /// `mode`: the backend to record with. When `auto` decided, says which
    /// and why on stderr (unless `--quiet`).
    pub fn backend_for(
        &self,
        choice: BackendChoice,
        program: &Path,
        mode: Option<InstrumentationMode>,
        global: &Global,
    ) -> Result<Backend> {
        let (backend, note) = self.backend_and_note(choice, program, mode)?;
        if let Some(note) = note
            && !global.quiet
        {
            styled_eprintln!("memgaze: {note}");
        }
        Ok(backend)
    }

    fn backend_and_note(
        &self,
        choice: BackendChoice,
        program: &Path,
        mode: Option<InstrumentationMode>,
    ) -> Result<(Backend, Option<String>)> {
        let auto = self.backend == BackendRequest::Auto;
        match (choice.backend, mode) {
            (Backend::Pt, Some(InstrumentationMode::Ptwrite)) => {
                Ok((Backend::Pt, auto.then_some(choice.reason)))
            }
            (Backend::Pt, _) if !auto => bail!(
                "{}: instrumented with --mode soft; --backend pt records programs instrumented with --mode ptwrite",
                program.display()
            ),
            (Backend::Pt, _) => Ok((
                Backend::Soft,
                Some(format!(
                    "auto: software recorder: Intel PT is usable here, but {} is instrumented with --mode soft",
                    program.display()
                )),
            )),
            (Backend::Soft, Some(InstrumentationMode::Ptwrite)) => bail!(
                "{}: instrumented with --mode ptwrite; the software recorder needs --mode soft",
                program.display()
            ),
            (Backend::Soft | Backend::Lackey, _) => {
                Ok((Backend::Soft, auto.then_some(choice.reason)))
            }
        }
    }

    /// The Intel PT collection these flags ask for.
    pub fn pt_options(&self) -> memgaze_record::pt::PtRecordOptions {
        let mode = if self.full {
            memgaze_record::pt::collect::CollectMode::Full
        } else if self.period == record::DEFAULT_PERIOD {
            memgaze_record::pt::collect::CollectMode::Sampled {
                period: memgaze_record::pt::DEFAULT_LOAD_PERIOD,
            }
        } else {
            memgaze_record::pt::collect::CollectMode::Sampled {
                period: self.period,
            }
        };
        memgaze_record::pt::PtRecordOptions {
            mode,
            ..Default::default()
        }
    }
}

fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// One error line before anything runs where the annotation lists a CPU
/// feature this CPU lacks: the copy's entry hook would refuse to run
/// (`cpu_features`; an unknown name counts as lacking).
fn refuse_missing_cpu_features(program: &Path, annotation: &Annotation) -> Result<()> {
    for feature in &annotation.cpu_features {
        let present = feature == "bmi2" && memgaze_instrument::rewrite::cpu_has_bmi2();
        if !present {
            bail!(
                "{}: instrumented for a CPU with {feature}, which this CPU lacks: instrument the program again on this machine",
                program.display()
            );
        }
    }
    Ok(())
}

/// Arguments of `cargo memgaze record`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub time: super::limits::LimitArgs,
    /// Trace file to write (default: `<program>.trace` in the current
    /// directory).
    #[arg(short, long, value_name = "TRACE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub libs: LibsArgs,
    /// The instrumented program and its arguments.
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
    let choice = args.sampling.resolve_backend()?;
    let program = resolve_program(Path::new(&args.command[0]))?;
    // The header's sites come from a cache: the executable's own, or with
    // libraries one of those followed by the libraries' (found once they
    // are known).
    let sites_for = if args.libs.libs.is_empty() {
        SitesFor::Executable
    } else {
        SitesFor::WithLibraries
    };
    let mut inputs = crate::pipeline::sites::read_for_record(&program, sites_for)?;
    refuse_missing_cpu_features(&program, &inputs.annotation)?;
    let backend = args
        .sampling
        .backend_for(choice, &program, inputs.annotation.mode, global)?;
    let output = match &args.output {
        Some(path) => path.clone(),
        None => {
            let name = program
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "program".into());
            let path = PathBuf::from(format!("{name}.trace"));
            if !global.quiet {
                styled_eprintln!("memgaze: writing the trace to {}", path.display());
            }
            path
        }
    };
    // Checked before the libraries are instrumented and the program runs.
    memgaze_output::check_output(&output)?;
    if backend == Backend::Pt {
        let annotation = if inputs.outline {
            // Intel PT decoding needs the loads' registers.
            memgaze_instrument::rewrite::read_annotation(&program)?
        } else {
            inputs.annotation
        };
        refuse_limits_with_pt(&args.time)?;
        let totals = record_pt_to_file(
            &program,
            &args.command[1..],
            &annotation,
            &args.sampling.pt_options(),
            &output,
            global,
        )?;
        return Ok(exit_like(totals.exit));
    }
    // Signals are caught from here on: one that comes before the program
    // starts stops the command before the trace is created, one that comes
    // while the trace is finished cannot cut it in half.
    let watch = record::signals::Watch::start();
    if let Some(code) = watch.stopped("before the program started") {
        return Ok(Exit::Interrupted(code));
    }
    let mut libraries =
        args.libs
            .prepare_as(&program, lib_cache().as_deref(), Decode::Outline, global)?;
    if sites_for == SitesFor::WithLibraries {
        crate::pipeline::sites::with_libraries(&program, &mut inputs, &mut libraries)?;
    }
    // Instrumenting the libraries takes seconds: a signal meanwhile must
    // stop the command too (the recording counts only later ones).
    if let Some(code) = watch.stopped("before the program started") {
        return Ok(Exit::Interrupted(code));
    }
    let recording = record_to_file(
        &program,
        &args.command[1..],
        (&inputs, &libraries),
        &sampling,
        args.sampling.spatial(),
        &output,
        &args.time.limits(),
    )?;
    if !global.quiet {
        print_summary(&recording, &output);
        print_static_coverage(inputs.load_flags.iter().copied());
        eprintln!(
            "memgaze: {}",
            untraced_note_with(&inputs.annotation, &libraries)
        );
    }
    if recording.totals.escape_counts_missing > 0 {
        if !global.quiet {
            styled_eprintln!(
                "memgaze: {}",
                memgaze_analysis::escape_counts_missing_note(
                    recording.totals.escape_counts_missing
                )
            );
        }
    } else if let Some((coverage, untraced)) =
        memgaze_analysis::recorded_dynamic_coverage(&recording.totals)
    {
        if !global.quiet {
            styled_eprintln!(
                "memgaze: dynamic coverage: {:.1}% of the instrumented-load executions traced (an estimate: {} escapes into original code and {} executions of loads no probe can trace counted)",
                100.0 * coverage,
                untraced.iter().map(|f| f.escapes).sum::<u64>(),
                memgaze_analysis::untraced_load_executions(&recording.totals),
            );
        }
        if let Some(warning) = memgaze_analysis::dynamic_coverage_warning(coverage, &untraced) {
            styled_eprintln!("warning: {warning}");
        }
    }
    // The command ends here: freeing every load site's strings one by one
    // was a tenth of a short recording's cost (the process exit frees them).
    std::mem::forget(inputs);
    libraries.forget_annotations();
    match watch.signal() {
        Some(signal) if recording.interrupted.is_none() => Ok(Exit::Interrupted(128 + signal)),
        _ => Ok(exit_like_program(&recording)),
    }
}

/// The static coverage line: how many explicit loads of the selected
/// functions were instrumented or implied by a proxy. The dynamic coverage
/// line cannot show loads the rewriter left out (gathers, `gs:`), since
/// nothing counts their executions.
pub fn print_static_coverage(load_flags: impl IntoIterator<Item = LoadFlags>) {
    let (total, covered) = load_flags
        .into_iter()
        .fold((0usize, 0usize), |(total, covered), l| {
            (total + 1, covered + usize::from(l.covered))
        });
    styled_eprintln!(
        "memgaze: coverage: {covered} of {total} explicit loads of the selected functions instrumented or implied ({:.1}%; `cargo memgaze instrument` lists the rest)",
        if total == 0 {
            100.0
        } else {
            100.0 * covered as f64 / total as f64
        }
    );
}

/// What the trace leaves out, said plainly: the shared libraries' loads
/// (only the executable is instrumented) and the executable's implicit
/// reads (string instructions, stack reads), which have no operand to
/// probe.
pub fn untraced_note(annotation: &Annotation) -> String {
    untraced_note_with(annotation, &Libraries::default())
}

/// [`untraced_note`] when `libraries` are instrumented too.
pub fn untraced_note_with(annotation: &Annotation, libraries: &Libraries) -> String {
    let strings: u64 = annotation
        .functions
        .iter()
        .map(|f| u64::from(f.string_loads))
        .sum();
    let stack: u64 = annotation
        .functions
        .iter()
        .map(|f| u64::from(f.stack_loads))
        .sum();
    let traced: Vec<&str> = libraries
        .instrumented
        .iter()
        .map(|l| l.library.name.as_str())
        .collect();
    // The loader's whole list when it is known: libraries that other
    // libraries need run untraced as well as the executable's own.
    let linked: &[String] = if libraries.at_start().is_empty() {
        &annotation.shared_libraries
    } else {
        libraries.at_start()
    };
    let untraced: Vec<&str> = linked
        .iter()
        .map(String::as_str)
        .filter(|l| !traced.contains(l))
        .collect();
    let untraced = if linked.is_empty() {
        "none linked".to_string()
    } else if untraced.is_empty() {
        "none of those linked".to_string()
    } else {
        untraced.join(", ")
    };
    let scope = if traced.is_empty() {
        "only the executable is instrumented".to_string()
    } else {
        format!("instrumented: the executable, {}", traced.join(", "))
    };
    format!(
        "not traced: loads in shared libraries ({untraced}; {scope}), and the executable's implicit reads at {strings} string-instruction and {stack} stack-read sites"
    )
}

/// Records a `--mode ptwrite` program with Intel PT into a trace file and
/// prints what was lost; returns the trace's totals.
pub fn record_pt_to_file(
    program: &Path,
    args: &[OsString],
    annotation: &Annotation,
    options: &memgaze_record::pt::PtRecordOptions,
    output: &Path,
    global: &Global,
) -> Result<memgaze_trace::TraceTotals> {
    let file = memgaze_output::AtomicFile::create(output)?;
    let (out, recording) = memgaze_record::pt::record(file, program, args, annotation, options)?;
    out.commit()?;
    if !global.quiet {
        let totals = &recording.totals;
        styled_eprintln!(
            "memgaze: Intel PT: {} records in {} samples ({} PTW packets; {} records dropped, {} samples lost, {} truncated AUX records) → {}",
            totals.records,
            totals.samples,
            recording.stats.ptw,
            totals.dropped.records,
            recording.losses.lost_samples,
            recording.losses.aux_truncated,
            output.display()
        );
    }
    Ok(recording.totals)
}

/// `--timeout` and `--kill-after` are the software recorder's: with Intel
/// PT they are refused rather than silently ignored.
pub fn refuse_limits_with_pt(limits: &super::limits::LimitArgs) -> Result<()> {
    if limits.limits() != record::Limits::default() {
        return Err(usage(
            "--timeout and --kill-after apply to the software recorder; use --backend soft",
        ));
    }
    Ok(())
}

/// The exit code for a program that ended with `exit` (128 + N for signal N).
pub fn exit_like(exit: Option<ProgramExit>) -> Exit {
    match exit {
        None | Some(ProgramExit::Code(0)) => Exit::Ok,
        Some(ProgramExit::Code(code)) => Exit::Program(code),
        Some(ProgramExit::Signal(signal)) => Exit::Program(128 + signal),
    }
}

/// Records `program` into a trace file within `limits`; returns what the
/// recording said. A trace that cannot be written (a full disk) ends the
/// recording at once, with the program killed and the path named. `sites`,
/// when given, are the functions and loads of the annotation and then of
/// the libraries, encoded once (`pipeline::sites`).
pub fn record_to_file(
    program: &Path,
    args: &[OsString],
    (inputs, libraries): (&RecordInputs, &Libraries),
    sampling: &Sampling,
    spatial: Option<memgaze_trace::SpatialSampling>,
    output: &Path,
    limits: &record::Limits,
) -> Result<Recording> {
    let mut command = vec![program.display().to_string()];
    command.extend(args.iter().map(|a| a.to_string_lossy().into_owned()));
    let (annotation, sites) = (&inputs.annotation, inputs.sites.as_ref());
    let mut header = match sites {
        Some(_) => record::trace_header_without_sites(annotation, *sampling, command.clone()),
        None => record::trace_header(annotation, *sampling, command.clone()),
    };
    header.spatial = spatial;
    let bases = match sites {
        Some(_) => libraries.extend_labels(
            &mut header,
            (
                annotation.functions.len() as u32,
                inputs.load_flags.len() as u32,
            ),
        ),
        None => libraries.extend_header(&mut header),
    };
    let objects = record::Objects {
        bases,
        valid: libraries.valid_loads_after(&inputs.load_flags),
        escapes: record::escape_sites(annotation),
        library_escapes: libraries.escape_sites(),
        measured_regions: record::records_only_in_regions(annotation),
    };
    let mut writer = match sites {
        Some(sites) => TraceWriter::create_with_sites(output, &header, sites),
        None => TraceWriter::create(output, &header),
    }
    .with_context(|| output.display().to_string())?;
    let mut program_command = std::process::Command::new(program);
    program_command.args(args);
    libraries.apply(&mut program_command);
    let recording = record::record_objects_within(
        program_command,
        &objects,
        sampling,
        spatial,
        &mut record::NamedSink(&mut writer, output),
        limits,
    )?;
    writer
        .finish(&recording.totals)
        .with_context(|| output.display().to_string())?
        .commit()?;
    let late = libraries.loaded_at_run(&recording.loaded_objects, program, &header);
    if !recording.joined_programs.is_empty() || !late.untraced.is_empty() {
        // Other instrumented programs joined: their loads follow the
        // header's (the records already name them); libraries loaded late
        // are named. A header written with cached sites left the
        // executable's and libraries' own out, and the annotations read
        // for it may have no load texts: the replacement is built from the
        // whole annotations.
        if sites.is_some() {
            let whole = memgaze_instrument::rewrite::read_annotation(program)?;
            header = record::trace_header(&whole, *sampling, command);
            header.spatial = spatial;
            libraries.extend_header_whole(&mut header)?;
        }
        complete_header(output, &mut header, &recording, &late)?;
    }
    let mut recording = recording;
    recording.notes.extend(late.note());
    Ok(recording)
}

/// Completes `header` with the libraries `late` found loaded after the
/// start and the programs that joined `recording` (their records already
/// name their loads), and rewrites the header of the trace file at `path`
/// with it; nothing to do when there are neither.
pub fn complete_header(
    path: &Path,
    header: &mut memgaze_trace::TraceHeader,
    recording: &Recording,
    late: &LoadedAtRun,
) -> Result<()> {
    if recording.joined_programs.is_empty() && late.untraced.is_empty() {
        return Ok(());
    }
    late.name_in(header);
    for program in &recording.joined_programs {
        program.extend_header(header);
    }
    memgaze_trace::format::replace_header(path, header).with_context(|| path.display().to_string())
}

/// Where `record` caches instrumented libraries: the cargo project's
/// `target/memgaze/instrumented` when there is one (as `run`).
fn lib_cache() -> Option<PathBuf> {
    super::run::cache_dir()
}

/// Prints notes and one summary line on stderr.
pub fn print_summary(recording: &Recording, output: &Path) {
    for note in &recording.notes {
        styled_eprintln!("memgaze: note: {note}");
    }
    let totals = &recording.totals;
    let rho = if totals.records > 0 {
        format!("{:.1}", totals.executions as f64 / totals.records as f64)
    } else {
        "–".into()
    };
    styled_eprintln!(
        "memgaze: {} records in {} sample{} from {} thread{} ({} load executions, ρ = {rho}) → {}",
        totals.records,
        totals.samples,
        if totals.samples == 1 { "" } else { "s" },
        recording.threads,
        if recording.threads == 1 { "" } else { "s" },
        totals.executions,
        output.display()
    );
}

/// The exit code `record` ends with: the program's, or 128 + N for signal
/// N; 124, 130, 143 or 129 when `--timeout` or a signal cut it short (and
/// a line that says so).
pub fn exit_like_program(recording: &Recording) -> Exit {
    if let Some(why) = recording.interrupted {
        styled_eprintln!(
            "memgaze: {}: the trace is a prefix of the run, marked interrupted",
            match why {
                memgaze_trace::Interruption::Timeout => "timed out".to_string(),
                _ => format!("interrupted by {}", why.name()),
            }
        );
        return Exit::Interrupted(why.exit_code());
    }
    match recording.exit_code() {
        0 => Exit::Ok,
        // The program's own status passes through untouched.
        code => Exit::Program(code),
    }
}

/// Finds the program like a shell would: a path with a `/` as is, a bare
/// name through `PATH`, skipping files this user may not execute (then the
/// current directory's file of that name). A file the user may not execute
/// is refused: the instrumented copy would run where the original cannot.
pub fn resolve_program(program: &Path) -> Result<PathBuf> {
    if program.as_os_str().to_string_lossy().contains('/') {
        if !program.exists() {
            bail!("{}: no such file", program.display());
        }
        refuse_unexecutable(program)?;
        return Ok(program.to_path_buf());
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join(program);
            if candidate.is_file() && may_execute(&candidate) {
                return Ok(candidate);
            }
        }
    }
    if program.is_file() {
        let local = Path::new(".").join(program);
        refuse_unexecutable(&local)?;
        return Ok(local);
    }
    bail!("{}: no such program", program.display())
}

/// Whether this user may execute `path` (`access(X_OK)`: what `execve`
/// checks, so root needs one execute bit too).
fn may_execute(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(name) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `name` is a NUL-terminated string that outlives the call.
    unsafe { libc::access(name.as_ptr(), libc::X_OK) == 0 }
}

/// Refuses a regular file this user may not execute (directories and other
/// inputs are left to the checks that name what they are).
fn refuse_unexecutable(path: &Path) -> Result<()> {
    if path.is_file() && !may_execute(path) {
        bail!(
            "{}: permission denied: not executable by this user (it would not run without cargo memgaze either)",
            path.display()
        );
    }
    Ok(())
}
