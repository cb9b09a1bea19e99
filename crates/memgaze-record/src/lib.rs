//! Running an instrumented program and collecting its software-recorder
//! output into a trace.
//!
//! [`record`] spawns the program with its arguments, its standard streams
//! and its environment untouched (plus [`protocol::RECORDER_ENV`],
//! [`protocol::RECORDING_ENV`] and a `GLIBC_TUNABLES` stack cache size) and
//! address-space randomisation disabled,
//! reads the recorder's messages from a socket while the program runs, and
//! streams the records into a [`RecordSink`]: a [`TraceWriter`] for `cargo
//! memgaze record`, or anything else (an analyser) that wants them without a
//! file. Nothing is buffered beyond one sample window per thread.

#![warn(missing_docs)]

pub(crate) mod assemble;
mod error;
mod exec_watch;
pub mod lackey;
mod listen;
pub mod pt;
pub mod signals;
pub(crate) mod supervise;

pub use assemble::RegionEvent;
pub use error::{AccessError, LackeyError, RecordError, SinkError, SinkFileError, SinkResult};
pub use supervise::{DEFAULT_KILL_AFTER, Limits, parse_duration};

use assemble::Assembler;
use memgaze_metadata::annotation::Annotation;
use memgaze_trace::Interruption;
use memgaze_trace::protocol::{self, RecorderConfig};
use memgaze_trace::{
    Backend, Dropped, EscapeCount, FunctionEntry, LoadClass, LoadEntry, ProgramExit, Sampling,
    SpatialSampling, TraceHeader, TraceTotals, TraceWriter,
};
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use supervise::{Supervisor, Verdict};

/// Default records per sample window (`w`).
pub const DEFAULT_WINDOW: u64 = 1_000;
/// Default instrumented-load executions per period (`w + z`).
pub const DEFAULT_PERIOD: u64 = 100_000;

/// How long descendants of the program may keep the socket open, sending
/// nothing, after the program itself exited before their output is cut off.
/// Counted only while the reader waits on an empty socket: time spent
/// handling a message (a slow sink, a loaded machine) never counts.
const LINGER: Duration = Duration::from_secs(2);

/// How long after the recording could end it still waits for a process
/// that sent `Exec` and runs on to connect (an instrumented program's entry
/// hook connects within milliseconds of the `exec`; an uninstrumented one
/// never does, and holds the recording no longer than this).
const JOIN_GRACE: Duration = Duration::from_millis(300);

/// Where the collector puts the records it decodes.
///
/// The collector guarantees: [`RecordSink::begin_sample`] before the first
/// record; in a sampled trace every sample is one whole window of one
/// thread; in a full trace there is one sample and
/// [`RecordSink::switch_thread`] announces records of another thread.
pub trait RecordSink {
    /// Starts the next sample, recorded by `thread`.
    fn begin_sample(&mut self, thread: u32) -> SinkResult;
    /// The current sample continues with records of `thread`.
    fn switch_thread(&mut self, thread: u32) -> SinkResult;
    /// The records pushed next are spatial records of `thread` (taken
    /// outside every sample; docs/METRICS.md, "Whole-run locality"), until
    /// the next [`RecordSink::begin_sample`] or
    /// [`RecordSink::switch_thread`].
    fn begin_spatial(&mut self, thread: u32) -> SinkResult;
    /// One record: load site `load` (index into the annotation's and the
    /// trace header's loads) read `addr`.
    fn push(&mut self, load: u32, addr: u64) -> SinkResult;
    /// Several records in a row, as [`RecordSink::push`] of each: the
    /// collector hands over a message's records at once, so the call through
    /// `dyn RecordSink` is paid per message, not per record (the default
    /// loop is compiled per sink, its `push` calls inlined).
    fn push_records(&mut self, records: &[(u32, u64)]) -> SinkResult {
        for &(load, addr) in records {
            self.push(load, addr)?;
        }
        Ok(())
    }
    /// A region marker was called (the default ignores it).
    fn region(&mut self, _event: &RegionEvent) -> SinkResult {
        Ok(())
    }
    /// Whether the sink takes records of `program`'s loads (from
    /// [`JoinedProgram::load_base`] on), beyond the header it was made
    /// with: another instrumented program joined the recording
    /// ([`Recording::joined_programs`]). A trace file takes them (the
    /// caller extends its header afterwards), the analysis adds the
    /// program as an object of its own; the default cannot, and that
    /// program's records are then counted as dropped.
    fn join_program(&mut self, _program: &JoinedProgram) -> bool {
        false
    }
}

impl<W: Write> RecordSink for TraceWriter<W> {
    fn begin_sample(&mut self, thread: u32) -> SinkResult {
        Ok(TraceWriter::begin_sample(self, thread)?)
    }
    fn switch_thread(&mut self, thread: u32) -> SinkResult {
        Ok(TraceWriter::switch_thread(self, thread)?)
    }
    fn begin_spatial(&mut self, thread: u32) -> SinkResult {
        Ok(TraceWriter::begin_spatial(self, thread)?)
    }
    fn push(&mut self, load: u32, addr: u64) -> SinkResult {
        Ok(TraceWriter::push(self, load, addr)?)
    }
    fn push_records(&mut self, records: &[(u32, u64)]) -> SinkResult {
        Ok(TraceWriter::push_records(self, records)?)
    }
    fn join_program(&mut self, program: &JoinedProgram) -> bool {
        TraceWriter::extend_loads(self, program.load_end());
        true
    }
}

/// Streams records straight into the analysis (no trace file): what
/// `cargo memgaze run` uses, and what `golden` can use for full traces.
/// Spatial records go to the whole-run curve only
/// ([`memgaze_analysis::Analyzer::push_spatial`]).
pub struct AnalyzerSink {
    analyzer: memgaze_analysis::Analyzer,
    sample: u64,
    thread: u32,
    started: bool,
    spatial: bool,
    /// Spatial records received.
    pub spatial_records: u64,
}

impl AnalyzerSink {
    /// An analyser for a trace with this header.
    pub fn new(
        header: &TraceHeader,
        options: &memgaze_analysis::AnalysisOptions,
    ) -> Result<Self, memgaze_analysis::AnalysisError> {
        Ok(AnalyzerSink {
            analyzer: memgaze_analysis::Analyzer::new(header, options)?,
            sample: 0,
            thread: 0,
            started: false,
            spatial: false,
            spatial_records: 0,
        })
    }

    /// The analysis, given the recording's totals.
    pub fn finish(self, totals: &TraceTotals) -> memgaze_analysis::Analysis {
        self.analyzer.finish(totals)
    }

    /// See [`memgaze_analysis::Analyzer::add_untraced_libraries`].
    pub fn add_untraced_libraries(&mut self, libraries: &[String]) {
        self.analyzer.add_untraced_libraries(libraries);
    }
}

impl RecordSink for AnalyzerSink {
    fn begin_sample(&mut self, thread: u32) -> SinkResult {
        if self.started {
            self.sample += 1;
        }
        self.started = true;
        self.thread = thread;
        self.spatial = false;
        Ok(())
    }
    fn switch_thread(&mut self, thread: u32) -> SinkResult {
        self.thread = thread;
        self.spatial = false;
        Ok(())
    }
    fn begin_spatial(&mut self, thread: u32) -> SinkResult {
        self.spatial = true;
        self.thread = thread;
        Ok(())
    }
    fn join_program(&mut self, program: &JoinedProgram) -> bool {
        if self.analyzer.loads() != program.load_base as usize {
            return false;
        }
        let (object, functions, loads) = program.entries(self.analyzer.functions() as u32);
        self.analyzer.add_object(object, functions, loads);
        true
    }
    fn push(&mut self, load: u32, addr: u64) -> SinkResult {
        if self.spatial {
            self.spatial_records += 1;
            self.analyzer.push_spatial(load, addr, self.thread);
        } else {
            self.analyzer
                .push_load(load, addr, self.sample, self.thread);
        }
        Ok(())
    }
}

/// Counts the records delivered and keeps nothing else: for checks that a
/// recording loses nothing (`doctor`'s backend check, the recorder's tests).
#[derive(Clone, Copy, Debug, Default)]
pub struct CountingSink {
    /// Records pushed so far (spatial records not included).
    pub records: u64,
    /// Spatial records pushed so far.
    pub spatial_records: u64,
    spatial: bool,
}

impl RecordSink for CountingSink {
    fn begin_sample(&mut self, _thread: u32) -> SinkResult {
        self.spatial = false;
        Ok(())
    }
    fn switch_thread(&mut self, _thread: u32) -> SinkResult {
        self.spatial = false;
        Ok(())
    }
    fn begin_spatial(&mut self, _thread: u32) -> SinkResult {
        self.spatial = true;
        Ok(())
    }
    fn push(&mut self, _load: u32, _addr: u64) -> SinkResult {
        self.push_records(&[(0, 0)])
    }
    fn push_records(&mut self, records: &[(u32, u64)]) -> SinkResult {
        if self.spatial {
            self.spatial_records += records.len() as u64;
        } else {
            self.records += records.len() as u64;
        }
        Ok(())
    }
}

/// Sends every record to two sinks (e.g. a trace file and an analyser).
pub struct Tee<'a>(pub &'a mut dyn RecordSink, pub &'a mut dyn RecordSink);

impl RecordSink for Tee<'_> {
    fn begin_sample(&mut self, thread: u32) -> SinkResult {
        self.0.begin_sample(thread)?;
        self.1.begin_sample(thread)
    }
    fn switch_thread(&mut self, thread: u32) -> SinkResult {
        self.0.switch_thread(thread)?;
        self.1.switch_thread(thread)
    }
    fn begin_spatial(&mut self, thread: u32) -> SinkResult {
        self.0.begin_spatial(thread)?;
        self.1.begin_spatial(thread)
    }
    fn push(&mut self, load: u32, addr: u64) -> SinkResult {
        self.0.push(load, addr)?;
        self.1.push(load, addr)
    }
    fn push_records(&mut self, records: &[(u32, u64)]) -> SinkResult {
        self.0.push_records(records)?;
        self.1.push_records(records)
    }
    fn region(&mut self, event: &RegionEvent) -> SinkResult {
        self.0.region(event)?;
        self.1.region(event)
    }
    fn join_program(&mut self, program: &JoinedProgram) -> bool {
        // Both or neither: the analysis, which checks its size, first.
        self.1.join_program(program) && self.0.join_program(program)
    }
}

/// A sink whose errors name the file it writes (`t.trace: cannot write
/// trace: No space left on device`).
pub struct NamedSink<'a>(pub &'a mut dyn RecordSink, pub &'a Path);

/// `source`, named by the file `path` once: a writer that names its file
/// itself (`AtomicFile`: `cannot write trace: t.trace: No space left on
/// device`) has that inner name dropped, so the line reads `t.trace:
/// cannot write trace: No space left on device`.
fn named(path: &Path, source: SinkError) -> SinkError {
    let text = source.to_string();
    let inner = format!("{}: ", path.display());
    let source = if text.contains(&inner) {
        text.replacen(&inner, "", 1).into()
    } else {
        source
    };
    Box::new(SinkFileError {
        path: path.to_path_buf(),
        source,
    })
}

impl RecordSink for NamedSink<'_> {
    fn begin_sample(&mut self, thread: u32) -> SinkResult {
        let path = self.1;
        self.0
            .begin_sample(thread)
            .map_err(|source| named(path, source))
    }
    fn switch_thread(&mut self, thread: u32) -> SinkResult {
        let path = self.1;
        self.0
            .switch_thread(thread)
            .map_err(|source| named(path, source))
    }
    fn begin_spatial(&mut self, thread: u32) -> SinkResult {
        let path = self.1;
        self.0
            .begin_spatial(thread)
            .map_err(|source| named(path, source))
    }
    fn push(&mut self, load: u32, addr: u64) -> SinkResult {
        let path = self.1;
        self.0
            .push(load, addr)
            .map_err(|source| named(path, source))
    }
    fn push_records(&mut self, records: &[(u32, u64)]) -> SinkResult {
        let path = self.1;
        self.0
            .push_records(records)
            .map_err(|source| named(path, source))
    }
    fn region(&mut self, event: &RegionEvent) -> SinkResult {
        let path = self.1;
        self.0.region(event).map_err(|source| named(path, source))
    }
    fn join_program(&mut self, program: &JoinedProgram) -> bool {
        self.0.join_program(program)
    }
}

/// What a recording produced besides the records.
#[derive(Clone, Debug)]
pub struct Recording {
    /// How the program ended.
    pub exit: ProgramExit,
    /// Totals for the trace footer (`records`/`samples` match what the sink
    /// received).
    pub totals: TraceTotals,
    /// Threads seen (over all processes).
    pub threads: usize,
    /// Processes that sent records (the program and forked children).
    pub processes: usize,
    /// Processes that ended in an `exec` (another program, untraced).
    pub execs: usize,
    /// Instrumented programs a recorded process `exec`ed, whose records
    /// joined the trace.
    pub joined_execs: usize,
    /// Instrumented executables other than the traced one whose records
    /// joined the trace, in the order their loads follow the header's
    /// (each [`JoinedProgram::load_base`]): the caller appends them to the
    /// header ([`JoinedProgram::extend_header`]).
    pub joined_programs: Vec<JoinedProgram>,
    /// The files the traced program's processes had mapped executable when
    /// they ran their exit hook (the executable, the dynamic loader, the
    /// libraries, `dlopen`ed ones included), each once; empty when none
    /// reached it.
    pub loaded_objects: Vec<std::path::PathBuf>,
    /// Processes that sent records but ended without flushing the rest
    /// (killed, or a raw exit system call): the trace is incomplete.
    pub unflushed_processes: usize,
    /// Things the user should know (drops, cut-off output, signals).
    pub notes: Vec<String>,
    /// Messages whose records came through a shared chunk instead of the
    /// socket.
    pub(crate) shared_messages: u64,
    /// Why `cargo memgaze` cut the recording short (a signal it received
    /// and forwarded, `--timeout`); the trace is then a prefix.
    pub interrupted: Option<Interruption>,
}

impl Recording {
    /// The exit code a shell would report for the program (128 + N for a
    /// signal).
    pub fn exit_code(&self) -> i32 {
        match self.exit {
            ProgramExit::Code(code) => code,
            ProgramExit::Signal(signal) => 128 + signal,
        }
    }
}

/// An instrumented executable other than the traced one that a recorded
/// process `exec`ed (or spawned) and whose records joined the trace: its
/// load ids are its own annotation's, so its records name trace loads
/// from `load_base` on.
#[derive(Clone, Debug)]
pub struct JoinedProgram {
    /// The executable (as `/proc/<pid>/exe` named it).
    pub path: std::path::PathBuf,
    /// Its annotation (read beside it).
    pub annotation: Annotation,
    /// Trace index of its first load.
    pub load_base: u32,
}

impl JoinedProgram {
    /// One past the trace index of its last load.
    pub fn load_end(&self) -> usize {
        self.load_base as usize + self.annotation.loads.len()
    }

    /// The program's object name (the original executable's file name, as
    /// the traced one is named), its functions (named `<file>!<function>`)
    /// and its loads, as a header lists them after `function_base`
    /// functions and [`JoinedProgram::load_base`] loads.
    pub fn entries(&self, function_base: u32) -> (String, Vec<FunctionEntry>, Vec<LoadEntry>) {
        let name = Path::new(&self.annotation.binary.path)
            .file_name()
            .or_else(|| self.path.file_name())
            .map_or_else(
                || self.path.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
        let functions = function_entries(&self.annotation)
            .into_iter()
            .map(|mut f| {
                f.name = format!("{name}!{}", f.name);
                f
            })
            .collect();
        let loads = load_entries(&self.annotation)
            .into_iter()
            .map(|l| LoadEntry {
                function: l.function.map(|f| f + function_base),
                proxy: l.proxy.map(|p| p + self.load_base),
                ..l
            })
            .collect();
        (name, functions, loads)
    }

    /// Appends the program's functions and loads ([`JoinedProgram::entries`])
    /// to `header`, with an [`memgaze_trace::OBJECT_LABEL`] label, so its
    /// records name its own loads. `header` must list exactly `load_base`
    /// loads (the programs are appended in order).
    pub fn extend_header(&self, header: &mut TraceHeader) {
        debug_assert_eq!(header.loads.len(), self.load_base as usize);
        let function_base = header.functions.len() as u32;
        let (name, functions, loads) = self.entries(function_base);
        header.labels.push((
            memgaze_trace::OBJECT_LABEL.to_string(),
            format!("{function_base} {} {name}", self.load_base),
        ));
        header.functions.extend(functions);
        header.loads.extend(loads);
    }
}

/// The trace header for a recording of an instrumented program.
///
/// Load indices are annotation load ids, so the collector can hand them
/// through unchanged.
pub fn trace_header(
    annotation: &Annotation,
    sampling: Sampling,
    command: Vec<String>,
) -> TraceHeader {
    TraceHeader {
        functions: function_entries(annotation),
        loads: load_entries(annotation),
        ..trace_header_without_sites(annotation, sampling, command)
    }
}

/// [`trace_header`] without functions and loads, for
/// [`memgaze_trace::TraceWriter::with_sites`] with [`encode_sites`] of the
/// same annotation.
pub fn trace_header_without_sites(
    annotation: &Annotation,
    sampling: Sampling,
    command: Vec<String>,
) -> TraceHeader {
    TraceHeader {
        backend: Backend::Soft,
        sampling,
        binary: Some(annotation.binary.clone()),
        command,
        functions: Vec::new(),
        loads: Vec::new(),
        labels: shared_library_labels(annotation),
        spatial: None,
    }
}

/// The functions and loads [`trace_header`] gives for `annotation`, encoded
/// once ([`memgaze_trace::EncodedSites`], identified by `key`).
pub fn encode_sites(
    annotation: &Annotation,
    key: u64,
) -> Result<memgaze_trace::EncodedSites, memgaze_trace::TraceError> {
    memgaze_trace::EncodedSites::encode(
        key,
        &function_entries(annotation),
        &load_entries(annotation),
    )
}

/// One [`memgaze_trace::SHARED_LIBRARY_LABEL`] label per library the
/// executable links: the trace says what it leaves out.
pub fn shared_library_labels(annotation: &Annotation) -> Vec<(String, String)> {
    annotation
        .shared_libraries
        .iter()
        .map(|l| (memgaze_trace::SHARED_LIBRARY_LABEL.to_string(), l.clone()))
        .collect()
}

/// The annotation's functions as a trace header carries them.
fn function_entries(annotation: &Annotation) -> Vec<FunctionEntry> {
    annotation
        .functions
        .iter()
        .map(|f| FunctionEntry {
            name: f.name.clone(),
            start: f.start,
            end: f.start + f.size,
        })
        .collect()
}

/// The annotation's loads as a trace header carries them (same order and
/// indices as [`Annotation::loads`], so a load's `id` indexes both).
fn load_entries(annotation: &Annotation) -> Vec<LoadEntry> {
    annotation
        .loads
        .iter()
        .map(|l| LoadEntry {
            ip: l.ip,
            class: l.class,
            implied: l.implied,
            function: Some(l.function),
            line: l.line.as_deref().map(str::to_string),
            proxy: match (l.instrumented, l.proxy) {
                (false, Some(ip)) if l.class == LoadClass::Constant => {
                    annotation.load_at(ip.get()).map(|p| p.id)
                }
                _ => None,
            },
        })
        .collect()
}

/// Runs `program` (instrumented, described by `annotation`) with `args` and
/// streams its records into `sink`, within `limits`.
///
/// `sampling.window == sampling.period` records a full trace; otherwise the
/// recorder records `window` consecutive instrumented-load executions per
/// `period` (jittered with `sampling.seed`, 0 when absent), and with
/// `spatial` also every execution of a Strided or Irregular load outside
/// those windows whose block the spatial hash tracks, as spatial records
/// (a full trace ignores `spatial`: it holds every record).
pub fn record(
    program: &Path,
    args: &[OsString],
    annotation: &Annotation,
    sampling: &Sampling,
    spatial: Option<SpatialSampling>,
    sink: &mut dyn RecordSink,
    limits: &Limits,
) -> Result<Recording, RecordError> {
    let mut command = Command::new(program);
    command.args(args);
    record_command_within(command, annotation, sampling, spatial, sink, limits)
}

/// [`record_command_within`] without a time limit and with the default
/// grace period.
pub fn record_command(
    command: Command,
    annotation: &Annotation,
    sampling: &Sampling,
    sink: &mut dyn RecordSink,
) -> Result<Recording, RecordError> {
    record_command_within(
        command,
        annotation,
        sampling,
        None,
        sink,
        &Limits::default(),
    )
}

/// [`record`] for a command the caller prepared: its arguments, working
/// directory, environment and standard streams are kept (e.g. `cargo
/// memgaze bench` runs a bench from its package root and captures its
/// libtest output); the recorder's variables and the spawn settings
/// (no address randomisation, the socket inherited, a process group of its
/// own, death with `cargo memgaze`) are added.
///
/// While it runs, SIGINT, SIGTERM and SIGHUP are caught and forwarded to
/// the program (`supervise`); the recording then ends as a prefix with
/// [`Recording::interrupted`] set, and so does one whose `limits.timeout`
/// expired. A sink that fails (a full disk) kills the program and returns
/// the sink's error.
pub fn record_command_within(
    command: Command,
    annotation: &Annotation,
    sampling: &Sampling,
    spatial: Option<SpatialSampling>,
    sink: &mut dyn RecordSink,
    limits: &Limits,
) -> Result<Recording, RecordError> {
    let objects = Objects {
        valid: annotation.loads.iter().map(|l| l.instrumented).collect(),
        bases: Vec::new(),
        escapes: escape_sites(annotation),
        library_escapes: Vec::new(),
        measured_regions: records_only_in_regions(annotation),
    };
    record_objects_within(command, &objects, sampling, spatial, sink, limits)
}

/// memgaze-harness's region markers, whose entries the runtime hooks.
const HARNESS_MARKERS: [&str; 2] = [protocol::REGION_BEGIN_SYMBOL, protocol::REGION_END_SYMBOL];

/// Whether an instrumented executable records only inside measured regions:
/// both of memgaze-harness's region markers were instrumented, so the
/// runtime hooks them and starts with recording off. criterion's and
/// divan's hooks are not recognised here (`cargo memgaze bench` knows its
/// executables are benches).
pub fn records_only_in_regions(annotation: &Annotation) -> bool {
    HARNESS_MARKERS.iter().all(|marker| {
        annotation
            .functions
            .iter()
            .any(|f| f.instrumented && f.name == *marker)
    })
}

/// The instrumented objects of a recording: which trace loads records may
/// name, and where each object's loads start in the trace header.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    /// Per trace load (header order): whether it is instrumented.
    pub valid: Vec<bool>,
    /// Trace index of the first load of each object (object 0, the
    /// executable, first; `u32::MAX` for a number not in use): records of
    /// object `o` carry `o << 24 | load`. Empty: the executable alone.
    pub bases: Vec<u32>,
    /// The executable's escape sites ([`escape_sites`]), by site number.
    pub escapes: Vec<EscapeCount>,
    /// Each instrumented library's escape sites, by object number (index
    /// 0, the executable, and numbers not in use: empty), their functions
    /// named as in the trace header (`libc.so.6!memcpy`): the runtime
    /// sends a library's counts with ids `object << 24 | site`.
    pub library_escapes: Vec<Vec<EscapeCount>>,
    /// The executable records only inside measured regions (a bench's:
    /// [`records_only_in_regions`], or a framework's hooks): a run that
    /// ended before any region began recorded nothing, and the notes say
    /// so. `false` when not known.
    pub measured_regions: bool,
}

/// [`record_command_within`] for a program whose shared libraries are
/// instrumented too: the trace header holds every object's loads.
pub fn record_objects_within(
    mut command: Command,
    objects: &Objects,
    sampling: &Sampling,
    spatial: Option<SpatialSampling>,
    sink: &mut dyn RecordSink,
    limits: &Limits,
) -> Result<Recording, RecordError> {
    let program = std::path::PathBuf::from(command.get_program());
    let program = program.as_path();
    if sampling.window == 0 || sampling.window > sampling.period {
        return Err(RecordError::InvalidSampling {
            window: sampling.window,
            period: sampling.period,
        });
    }
    // The runtime's block test shifts by a constant.
    let spatial = spatial.filter(|_| !sampling.is_full());
    if let Some(s) = spatial
        && s.block_shift != SpatialSampling::DEFAULT_BLOCK_SHIFT
    {
        return Err(RecordError::SpatialBlock {
            block_shift: s.block_shift,
        });
    }
    // Caught from here on: a signal that arrives while the program starts
    // is forwarded as soon as it runs (and SIGXFSZ is ignored before the
    // shared buffers are sized).
    let mut catch = signals::Catch::install();
    let seen = signals::received();
    let (ours, theirs) = socket_pair()?;
    let (inode, device) = inode_of(&theirs)?;
    let config = RecorderConfig {
        fd: theirs.as_raw_fd(),
        inode,
        device,
        window: sampling.window,
        period: sampling.period,
        seed: sampling.seed.unwrap_or(0),
        spatial_threshold: spatial.map_or(0, |s| s.threshold),
        spatial_multiplier: spatial.map_or(0, |s| s.multiplier),
    };
    command
        .env(protocol::RECORDER_ENV, config.to_env())
        .env(protocol::RECORDING_ENV, "1");
    keep_thread_stacks_mapped(&mut command);
    // Exec'd and spawned instrumented programs connect here (the socket
    // pair's end is close-on-exec in the program), unless the user opted
    // out.
    let follow_exec = command
        .get_envs()
        .find(|(k, _)| *k == protocol::FOLLOW_EXEC_ENV)
        .map_or_else(
            || std::env::var_os(protocol::FOLLOW_EXEC_ENV),
            |(_, v)| v.map(OsString::from),
        )
        .is_none_or(|v| v != "0");
    let listener = follow_exec.then(listen::Listener::open).flatten();
    match &listener {
        Some(l) => command.env(protocol::LISTEN_ENV, &l.name),
        None => command.env_remove(protocol::LISTEN_ENV),
    };
    // Optional: without shared chunks every message is copied through the
    // socket, which works the same, only slower.
    let shared = SharedChunks::new(SHARED_CHUNKS).ok();
    let shared_fd = match &shared {
        Some(chunks) => {
            command.env(protocol::SHARED_ENV, chunks.config.to_env());
            chunks.config.fd
        }
        None => {
            command.env_remove(protocol::SHARED_ENV);
            -1
        }
    };
    prepare_spawn(&mut command, theirs.as_raw_fd(), shared_fd);
    let mut child = spawn_fresh_executable(&mut command).map_err(|source| RecordError::Spawn {
        program: program.to_path_buf(),
        source,
    })?;
    drop(theirs);
    let pid = child.id();
    // Which program the trace's load ids belong to: what the child runs
    // now that `spawn` has returned (the exec succeeded).
    let main_exe = exe_identity(pid);
    let mut supervisor = Supervisor::new(pid, *limits, seen);

    let done = Arc::new(AtomicBool::new(false));
    let exited = Arc::new(AtomicBool::new(false));
    let cut_off = Arc::new(AtomicBool::new(false));
    // Messages read so far, odd while one is being handled: the linger
    // below counts from the last one read and not while one is handled, so
    // a reader still draining what the program queued before it exited (a
    // slow sink, a full trace) is never cut off.
    let progress = Arc::new(AtomicU64::new(0));
    let waiter = {
        let done = Arc::clone(&done);
        let exited = Arc::clone(&exited);
        let cut_off = Arc::clone(&cut_off);
        let progress = Arc::clone(&progress);
        let socket = ours.as_raw_fd();
        std::thread::spawn(move || {
            let status = child.wait();
            exited.store(true, Ordering::Release);
            let mut deadline = Instant::now() + LINGER;
            let mut seen = progress.load(Ordering::Acquire);
            while !done.load(Ordering::Acquire) && Instant::now() < deadline {
                // Woken early by the reader when it is done (a plain
                // sleep here made every recording wait up to 10 ms more).
                std::thread::park_timeout(Duration::from_millis(10));
                let now = progress.load(Ordering::Acquire);
                if now != seen || now % 2 == 1 {
                    seen = now;
                    deadline = Instant::now() + LINGER;
                }
            }
            if !done.load(Ordering::Acquire) {
                cut_off.store(true, Ordering::Release);
                // SAFETY: `socket` stays open until this thread is joined.
                unsafe { libc::shutdown(socket, libc::SHUT_RDWR) };
            }
            status
        })
    };

    let full = sampling.is_full();
    // What a process runs: its `/proc/<pid>/exe` while it runs (the file
    // it executes, even if its path was replaced since: a cache entry
    // rewritten by a concurrent `run`), else the path its `Start` named.
    // The traced program is the same file, or the same path.
    let main_path = std::fs::read_link(format!("/proc/{pid}/exe"))
        .or_else(|_| std::fs::canonicalize(program))
        .ok();
    let main_exe = main_exe.or_else(|| file_identity(program));
    let same_program = move |p: u32, exec_image: bool, named: Option<&Path>| {
        let live = || exe_identity(p).zip(std::fs::read_link(format!("/proc/{p}/exe")).ok());
        // The program a `Start` named is what the process ran when it sent
        // it: by the time it is read the process may have exec'd another.
        let found = match named {
            Some(path) => live()
                .filter(|(_, now)| now == path)
                .or_else(|| Some((file_identity(path)?, path.to_path_buf()))),
            None => live(),
        };
        match found {
            // The program's own first image is the traced program.
            _ if p == pid && !exec_image => assemble::Program::Traced,
            Some((exe, path)) if main_exe == Some(exe) || main_path.as_ref() == Some(&path) => {
                assemble::Program::Traced
            }
            Some((exe, path)) => assemble::Program::Other(exe, path),
            None if p == pid => assemble::Program::Traced,
            None => assemble::Program::Unknown,
        }
    };
    let mut assembler = Assembler::new(sink, objects.valid.clone(), full, sampling.window)
        .with_objects(objects.bases.clone())
        .with_measured_regions(objects.measured_regions)
        .with_program_check(Box::new(same_program));
    let exec_watch = exec_watch::ExecWatch::start();
    let (failure, shared_messages) = collect(
        &Doors {
            socket: &ours,
            listener: listener.as_ref(),
            program: pid,
            exited: &exited,
            cut_off: &cut_off,
        },
        shared.as_ref(),
        &mut assembler,
        &mut supervisor,
        &progress,
        &exec_watch,
    );
    done.store(true, Ordering::Release);
    waiter.thread().unpark();
    let status = waiter
        .join()
        .map_err(|_| RecordError::WaiterPanicked)?
        .map_err(|source| RecordError::Wait {
            program: program.to_path_buf(),
            source,
        })?;
    if supervisor.interrupted.is_some() {
        // The command is on its way out: a further signal must not kill it
        // while it writes the trace's end.
        catch.keep();
    }
    drop(catch);
    let execs_timed = exec_watch.finish();
    if let Some(e) = failure {
        return Err(e);
    }
    assembler.finish().map_err(RecordError::Sink)?;
    let exit = match (status.code(), status.signal()) {
        (Some(code), _) => ProgramExit::Code(code),
        (None, Some(signal)) => ProgramExit::Signal(signal),
        (None, None) => ProgramExit::Code(-1),
    };
    let mut recording = summarise(
        &mut assembler,
        pid,
        exit,
        cut_off.load(Ordering::Acquire),
        supervisor.interrupted,
        limits,
        &execs_timed,
    );
    recording.shared_messages = shared_messages;
    recording.totals.escapes = escape_counts(objects, &assembler.escapes);
    if objects.escapes.is_empty() && objects.library_escapes.iter().all(Vec::is_empty) {
        // Without escape checks there was nothing to count.
        recording.totals.escape_counts_missing = 0;
    }
    Ok(recording)
}

/// Processes of the traced executable that never sent their escape
/// counters: the runtime sends them from its exit hook and before `exec`,
/// so a process killed by a signal (or ended by a raw exit system call)
/// takes its counts along. The program's last image (`main`) counts even
/// when it sent nothing else; joined programs' escapes are not the trace's.
fn escape_counts_missing(assembler: &Assembler<'_>, main_exited: bool, pid: u32, main: u32) -> u64 {
    let children = assembler
        .processes
        .iter()
        .filter(|&&p| p != pid && p != main)
        .filter(|p| !assembler.image_bases.contains_key(p))
        .filter(|&&p| !assembler.process_ended(p))
        .count();
    let main_missing = !main_exited && !assembler.image_bases.contains_key(&main);
    (children + usize::from(main_missing)) as u64
}

/// The escape sites of an instrumented executable, by site number, each
/// with a count of 0 and what the annotation estimates one escape leaves
/// untraced.
pub fn escape_sites(annotation: &Annotation) -> Vec<EscapeCount> {
    annotation
        .escapes
        .iter()
        .map(|escape| EscapeCount {
            at: escape.at,
            function: annotation
                .functions
                .get(escape.function as usize)
                .map_or_else(String::new, |f| f.name.clone()),
            count: 0,
            loads: escape.loads,
            probed: escape.probed,
            untraced_load: escape.untraced_load,
        })
        .collect()
}

/// The escape counters the processes sent, with what the annotation of
/// their object estimates each escape leaves untraced; by jump address
/// (the executable's first where a library's jump has the same address).
/// A site id is `object << 24 | site` (object 0: the executable). A counter
/// of a site no annotation lists is ignored (it cannot be attributed): the
/// runtime counts only the sites the annotations list.
fn escape_counts(objects: &Objects, counted: &HashMap<u32, u64>) -> Vec<EscapeCount> {
    let mut escapes: Vec<(u32, EscapeCount)> = counted
        .iter()
        .filter(|&(_, &count)| count > 0)
        .filter_map(|(&id, &count)| {
            let (object, site) = (id >> 24, id & 0xff_ffff);
            let sites = match object {
                0 => &objects.escapes,
                _ => objects.library_escapes.get(object as usize)?,
            };
            let escape = sites.get(site as usize)?;
            Some((
                id,
                EscapeCount {
                    count,
                    ..escape.clone()
                },
            ))
        })
        .collect();
    escapes.sort_by_key(|&(id, ref e)| (e.at, id >> 24));
    escapes.into_iter().map(|(_, e)| e).collect()
}

/// The glibc tunable that bounds the bytes of exited threads' stacks kept
/// mapped for reuse (40 MiB by default).
const STACK_CACHE_TUNABLE: &str = "glibc.pthread.stack_cache_size";

/// Stack cache the recorded program gets (1 TiB: never trimmed).
const STACK_CACHE_BYTES: u64 = 1 << 40;

/// Adds `glibc.pthread.stack_cache_size` to the program's `GLIBC_TUNABLES`
/// (unless it names the tunable itself), so that glibc keeps the stacks
/// of exited threads mapped. A thread's TCB lives in its stack, and the
/// exit hook reads each exited thread's countdown there to count the
/// executions of its last, partly consumed skip budget: past the default
/// 40 MiB cache (about 20 exited threads of 2 MiB, or one with a large
/// stack) glibc unmaps the stack and up to a period of executions per
/// thread went uncounted, lowering `ρ` and `Â`. Full traces, which count
/// every record, get it too: the program sees the same environment however
/// it is recorded (its `getenv` loops execute the same loads). The cache
/// holds no more than the stacks the program had mapped at once; other C
/// libraries ignore the variable.
fn keep_thread_stacks_mapped(command: &mut Command) {
    let current = command
        .get_envs()
        .find(|(k, _)| *k == "GLIBC_TUNABLES")
        .map_or_else(
            || std::env::var_os("GLIBC_TUNABLES"),
            |(_, v)| v.map(OsString::from),
        );
    if let Some(tunables) = with_stack_cache(current.as_deref()) {
        command.env("GLIBC_TUNABLES", tunables);
    }
}

/// `GLIBC_TUNABLES` with the stack cache tunable appended, or `None` when
/// the value already sets it (the user's choice stands).
fn with_stack_cache(current: Option<&std::ffi::OsStr>) -> Option<OsString> {
    let setting = format!("{STACK_CACHE_TUNABLE}={STACK_CACHE_BYTES}");
    let Some(current) = current.filter(|c| !c.is_empty()) else {
        return Some(setting.into());
    };
    let names_it = current
        .as_encoded_bytes()
        .split(|&b| b == b':')
        .any(|entry| entry.split(|&b| b == b'=').next() == Some(STACK_CACHE_TUNABLE.as_bytes()));
    if names_it {
        return None;
    }
    let mut merged = current.to_os_string();
    merged.push(":");
    merged.push(setting);
    Some(merged)
}

/// The spawn settings of a recorded program: the recorder's descriptors
/// inherited, no address randomisation, a process group of its own, and
/// death when `cargo memgaze` dies.
fn prepare_spawn(command: &mut Command, their_fd: RawFd, shared_fd: RawFd) {
    // Its own group: a signal forwarded to the group reaches the program's
    // children too, and a terminal's ^C reaches only us (we forward it).
    command.process_group(0);
    // SAFETY: getpid before the fork; only async-signal-safe calls between
    // fork and exec.
    let parent = unsafe { libc::getpid() };
    unsafe {
        command.pre_exec(move || {
            // Killed with us: a recorder that dies (SIGKILL, a crash) must
            // not leave the program running as an orphan.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // We may have died between the fork and the prctl.
            if libc::getppid() != parent {
                libc::_exit(128 + libc::SIGKILL);
            }
            if libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::fcntl(their_fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            if shared_fd >= 0 && libc::fcntl(shared_fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // Ignored dispositions survive exec: the program gets the
            // defaults (we ignore SIGXFSZ while recording, see `signals`).
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
            libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
            Ok(())
        });
    }
}

/// Where the collector's messages come from and when they end.
struct Doors<'a> {
    /// The socket pair's end: the traced program and its forked children.
    socket: &'a OwnedFd,
    /// Where exec'd and spawned instrumented programs connect.
    listener: Option<&'a listen::Listener>,
    /// The traced program's pid (and process group).
    program: u32,
    /// Set once the traced program has exited.
    exited: &'a AtomicBool,
    /// Set when the linger cut the recording off.
    cut_off: &'a AtomicBool,
}

/// Reads the recorder's messages into `assembler` until the recording ends
/// (the traced program has exited, and every process that held the socket
/// or connected has closed it; a process that sent `Exec` gets
/// [`JOIN_GRACE`] to connect), the supervisor stops the recording, or
/// something fails (then the program is killed: it would block forever on a
/// socket no one reads). Returns the failure and the count of messages that
/// came through shared chunks.
fn collect(
    doors: &Doors<'_>,
    shared: Option<&SharedChunks>,
    assembler: &mut Assembler<'_>,
    supervisor: &mut Supervisor,
    progress: &AtomicU64,
    exec_watch: &exec_watch::ExecWatch,
) -> (Option<RecordError>, u64) {
    let mut buffer = vec![0u8; 1 << 18];
    let mut shared_messages = 0;
    // The socket pair's end (None once closed), then accepted connections.
    let mut main = Some(doors.socket.as_raw_fd());
    let mut joined: Vec<OwnedFd> = Vec::new();
    // Processes that sent `Exec` and have not connected since.
    let mut execs: HashMap<u32, Instant> = HashMap::new();
    // Accepting costs a system call: done when the sockets are idle and
    // every so many messages.
    let mut accept_due = true;
    let mut handled_messages = 0u64;
    // Readable once the traced program has exited: its sockets close
    // before it exits, and polling for the exit cost every recording up
    // to 10 ms of waiting.
    let program_exit = pidfd(doors.program);
    // Set once it was readable: the waiter thread is then about to mark
    // the exit, and polling it again would spin.
    let mut exit_seen = false;
    let failure = 'collect: loop {
        if supervisor.check() == Verdict::Stop || doors.cut_off.load(Ordering::Acquire) {
            break None;
        }
        if accept_due {
            accept(doors, &mut joined, &mut execs, assembler);
        }
        // One message from the first socket that has one, oldest socket
        // first: an image's `Exec` (sent before the `exec`, on the socket
        // it held) is then handled before the next image's `Start` (sent on
        // a connection made after it).
        let mut index = 0;
        let message = loop {
            let fd = match (index, main) {
                (0, Some(fd)) => fd,
                _ => match joined.get(index - usize::from(main.is_some())) {
                    Some(connection) => connection.as_raw_fd(),
                    None => break None,
                },
            };
            // Non-blocking: with every socket empty, wait in the supervisor
            // (sockets, signals and deadlines at once).
            // SAFETY: buffer is valid for its length.
            let n = unsafe {
                libc::recv(
                    fd,
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                break Some(n as usize);
            }
            if n == 0 {
                // Closed by every process that held it.
                if index == 0 && main.is_some() {
                    main = None;
                } else {
                    joined.remove(index - usize::from(main.is_some()));
                }
                continue;
            }
            let err = std::io::Error::last_os_error();
            match err.kind() {
                std::io::ErrorKind::Interrupted => {}
                std::io::ErrorKind::WouldBlock => index += 1,
                _ => break 'collect Some(RecordError::ReadOutput(err)),
            }
        };
        if let Some(mut n) = message {
            progress.fetch_add(1, Ordering::Release);
            if let Some(length) = shared.and_then(|c| c.take(&mut buffer, n)) {
                n = length;
                shared_messages += 1;
            }
            let handled = assembler.message(&buffer[..n]);
            progress.fetch_add(1, Ordering::Release);
            if let Err(e) = handled {
                break Some(RecordError::Sink(e));
            }
            for pid in assembler.new_execs.drain(..) {
                let now = Instant::now();
                exec_watch.add(pid, now);
                execs.insert(pid, now);
            }
            handled_messages += 1;
            accept_due = handled_messages.is_multiple_of(64);
            continue;
        }
        accept_due = true;
        if main.is_none() && joined.is_empty() {
            // A connection made since the last accept keeps it going.
            if accept(doors, &mut joined, &mut execs, assembler) {
                continue;
            }
            let now = Instant::now();
            execs.retain(|&pid, &mut at| now.duration_since(at) < JOIN_GRACE && alive(pid));
            if doors.listener.is_none()
                || (doors.exited.load(Ordering::Acquire) && execs.is_empty())
            {
                break None;
            }
        }
        let exit_fd = program_exit
            .as_ref()
            .filter(|_| !exit_seen && !doors.exited.load(Ordering::Acquire))
            .map(AsRawFd::as_raw_fd);
        let fds: Vec<RawFd> = main
            .into_iter()
            .chain(joined.iter().map(AsRawFd::as_raw_fd))
            .chain(doors.listener.map(listen::Listener::fd))
            .chain(exit_fd)
            .collect();
        // Without an open socket, the program's exit is noticed by polling.
        let cap = match (main.is_none() && joined.is_empty(), exit_seen) {
            (true, false) => Duration::from_millis(10),
            (true, true) => Duration::from_millis(1),
            (false, _) => signals::POLL_CAP,
        };
        supervisor.wait(&fds, cap);
        if let Some(fd) = exit_fd {
            exit_seen = readable(fd);
        }
    };
    if failure.is_some() {
        supervisor.kill();
    }
    (failure, shared_messages)
}

/// A descriptor that becomes readable when process `pid` exits
/// (`pidfd_open`, Linux 5.3); `None` where the kernel has none (the exit
/// is then noticed by polling).
fn pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a descriptor just returned to us, owned by nothing else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether `fd` is readable now.
fn readable(fd: RawFd) -> bool {
    let mut entry = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd entry, no waiting.
    unsafe { libc::poll(&mut entry, 1, 0) == 1 && entry.revents & libc::POLLIN != 0 }
}

/// Accepts the connections waiting at the listener (if any) into `joined`;
/// their processes need no more waiting for. Whether any was accepted.
fn accept(
    doors: &Doors<'_>,
    joined: &mut Vec<OwnedFd>,
    execs: &mut HashMap<u32, Instant>,
    assembler: &mut Assembler<'_>,
) -> bool {
    let Some(listener) = doors.listener else {
        return false;
    };
    let (accepted, refused) = listener.accept(doors.program);
    assembler.refused_connections += refused;
    let any = !accepted.is_empty();
    for (connection, pid) in accepted {
        execs.remove(&pid);
        joined.push(connection);
    }
    any
}

/// Whether process `pid` still runs (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat[stat.rfind(')')? + 1..]
                .split_whitespace()
                .next()?
                .to_string();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

/// When SIGKILL follows the forwarded SIGTERM, for the notes:
/// `--kill-after 0` sends it at once.
fn sigkill_when(kill_after: std::time::Duration) -> String {
    if kill_after.is_zero() {
        "SIGKILL at once".to_string()
    } else {
        format!("SIGKILL {kill_after:?} later")
    }
}

/// The note on a program killed by `signal`. The runtime sends a thread's
/// records only when its buffer fills, at a region's end and at exit; a
/// fatal signal skips the exit hook, and the buffers live in the program's
/// private memory, gone with it. Before its measured region began
/// (`before_regions`), a bench had recorded nothing to lose.
fn killed_note(assembler: &Assembler<'_>, signal: i32, before_regions: bool) -> String {
    let name = signal_name(signal);
    if before_regions {
        format!(
            "the program was killed by signal {signal} ({name}) before its measured region began (in its set-up or warm-up): nothing was recorded, so no record was lost"
        )
    } else if assembler.processes.is_empty() {
        format!(
            "the program was killed by signal {signal} ({name}) before the recorder's first flush: every record it held is lost"
        )
    } else {
        format!(
            "the program was killed by signal {signal} ({name}): the trace holds the records flushed until then; each thread's last, partly filled buffer (up to {} records) is lost",
            memgaze_trace::layout::slot::CAPACITY
        )
    }
}

/// The recording's totals and notes, once the program has ended.
fn summarise(
    assembler: &mut Assembler<'_>,
    pid: u32,
    exit: ProgramExit,
    cut_off: bool,
    interrupted: Option<Interruption>,
    limits: &Limits,
    execs_timed: &HashMap<u32, exec_watch::Ended>,
) -> Recording {
    let mut notes = Vec::new();
    let (execs_untraced_micros, still_running) = untraced_exec_time(assembler, execs_timed);
    // The program's last image: the one it exec'd into, if that joined.
    let main = assembler.image(pid);
    let main_exited = assembler.process_ended(main);
    let unflushed_children = assembler
        .processes
        .iter()
        .filter(|&&p| p != pid && p != main && !assembler.process_ended(p))
        .count();
    if let Some(why) = interrupted {
        notes.push(match why {
            Interruption::Timeout => format!(
                "--timeout {:?} expired: the program was sent SIGTERM ({} if still running); the trace holds what it recorded until then",
                limits.timeout.unwrap_or_default(),
                sigkill_when(limits.kill_after)
            ),
            Interruption::Signal(_) => format!(
                "interrupted by {}: forwarded to the program ({}, or at a second signal); the trace holds what it recorded until then",
                why.name(),
                sigkill_when(limits.kill_after)
            ),
        });
    }
    let before_regions = assembler.measured_regions && !assembler.region_began();
    if let ProgramExit::Signal(signal) = exit {
        notes.push(killed_note(assembler, signal, before_regions));
    } else if before_regions {
        notes.push(
            "the program's measured region never began (it ended in its set-up or warm-up): nothing was recorded"
                .into(),
        );
    }
    if cut_off {
        notes.push(format!(
            "processes the program left running still held the recorder socket {}s after it exited; their output was cut off",
            LINGER.as_secs()
        ));
    }
    if assembler.processes.is_empty() && matches!(exit, ProgramExit::Code(_)) {
        notes.push(
            "the recorder sent nothing: the program may not be instrumented by this cargo memgaze, may have exited before its entry point, may have closed the recorder's descriptor (programs that close every inherited descriptor, with closefrom, close_range or a loop, cannot be recorded), or runs on a kernel without MADV_WIPEONFORK (Linux ≥ 4.14)"
                .into(),
        );
    } else if matches!(exit, ProgramExit::Code(_)) && !main_exited {
        notes.push(
            "the program ended without its exit hook reaching the recorder (a raw exit system call, or a program that closed the recorder's descriptor after the recorder's first flush, as closefrom, close_range or a loop over descriptors do): executions after its last flush are not counted"
                .into(),
        );
    }
    if unflushed_children > 0 {
        notes.push(format!(
            "{unflushed_children} child process(es) ended without flushing (killed, or ended by a raw exit system call): each one's last, partly filled buffer (up to {} records) is lost and the trace is incomplete",
            memgaze_trace::layout::slot::CAPACITY
        ));
    }
    if !assembler.execed.is_empty() {
        let running = if still_running > 0 {
            format!(", {still_running} of them still running when the recording ended")
        } else {
            String::new()
        };
        notes.push(format!(
            "{} process(es) replaced themselves with another program (exec): what that program ran is not traced ({:.3} s of wall time from exec to exit{running})",
            assembler.execed.len(),
            execs_untraced_micros as f64 / 1e6
        ));
    }
    if assembler.refused_connections > 0 {
        notes.push(format!(
            "{} connection(s) to the recorder refused (not from a process of the traced program, or of another user): what they ran is not traced",
            assembler.refused_connections
        ));
    }
    if assembler.joined_execs > 0 {
        notes.push(format!(
            "{} exec'd instrumented program(s) joined the trace (each a process of its own)",
            assembler.joined_execs
        ));
    }
    if !assembler.joined.is_empty() {
        let names: Vec<String> = assembler
            .joined
            .iter()
            .map(|j| j.path.display().to_string())
            .collect();
        notes.push(format!(
            "{} other instrumented program(s) joined the trace with loads of their own: {}",
            names.len(),
            names.join(", ")
        ));
    }
    if assembler.joined_escapes > 0 {
        notes.push(format!(
            "{} escapes into original code by the other programs that joined are not in the dynamic coverage (it covers the traced executable)",
            assembler.joined_escapes
        ));
    }
    // An image that sent nothing to file (the `exec` of an uninstrumented
    // program by a `vfork` child, seen by its `Exec`) lost nothing.
    if assembler.foreign_images() > 0 && assembler.foreign_records > 0 {
        notes.push(format!(
            "{} process image(s) could not be filed under their program's loads (another instrumented program than the traced one without a readable annotation beside it, or a process gone before the recorder could tell which program it ran, once another had joined): their {} records are dropped",
            assembler.foreign_images(),
            assembler.foreign_records
        ));
    }
    if assembler.invalid_records > 0 || assembler.bad_messages > 0 {
        notes.push(format!(
            "{} records named unknown loads and {} messages were malformed (annotation does not match the binary?)",
            assembler.invalid_records, assembler.bad_messages
        ));
    }
    let dropped_records =
        assembler.dropped() + assembler.invalid_records + assembler.foreign_records;
    if dropped_records > 0 {
        notes.push(format!(
            "{dropped_records} records dropped (signal-handler re-entry, failed writes, or loads of threads that had not yet noticed that a measured region began)"
        ));
    }
    let totals = TraceTotals {
        executions: assembler.executions(),
        records: assembler.records,
        spatial_records: assembler.spatial_records,
        samples: assembler.samples,
        dropped: Dropped {
            records: dropped_records,
            samples: 0,
            bytes: 0,
        },
        exit: Some(exit),
        // Never "complete" with records known to be missing.
        complete: matches!(exit, ProgramExit::Code(_))
            && main_exited
            && unflushed_children == 0
            && !cut_off
            && interrupted.is_none()
            && dropped_records == 0,
        interrupted,
        escapes: Vec::new(),
        escape_counts_missing: escape_counts_missing(assembler, main_exited, pid, main),
        execs_untraced: assembler.execed.len() as u64,
        execs_untraced_micros,
    };
    Recording {
        exit,
        totals,
        threads: assembler.threads(),
        processes: assembler.processes.len(),
        execs: assembler.execed.len(),
        joined_execs: assembler.joined_execs,
        joined_programs: std::mem::take(&mut assembler.joined),
        loaded_objects: assembler.loaded_objects(),
        unflushed_processes: assembler.unflushed_processes(),
        notes,
        shared_messages: 0,
        interrupted,
    }
}

/// `(device, inode)` of the executable process `pid` runs, if it can be
/// read.
fn exe_identity(pid: u32) -> Option<(u64, u64)> {
    file_identity(format!("/proc/{pid}/exe"))
}

/// `(device, inode)` of the file `path` names (links followed), if it can
/// be read.
fn file_identity(path: impl AsRef<Path>) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.dev(), meta.ino()))
}

/// Wall time, in microseconds, of the exec'd programs that did not join
/// the trace (from each `Exec` message to the program's exit, or to now
/// for one still running), and how many of them are still running.
fn untraced_exec_time(
    assembler: &Assembler<'_>,
    execs_timed: &HashMap<u32, exec_watch::Ended>,
) -> (u64, usize) {
    let now = Instant::now();
    let mut micros = 0u64;
    let mut running = 0;
    for &image in assembler.execed.keys() {
        if let Some(e) = execs_timed.get(&assembler.real_pid(image)) {
            running += usize::from(e.exit.is_none());
            let ran = e.exit.unwrap_or(now).saturating_duration_since(e.exec);
            micros += u64::try_from(ran.as_micros()).unwrap_or(u64::MAX);
        }
    }
    (micros, running)
}

/// Shared chunks offered to the program: 4 MiB in flight, as much as the
/// socket's send buffer holds.
const SHARED_CHUNKS: u64 = 64;

/// Retries of an exec that fails because the executable is busy
/// (`ETXTBSY`): with [`BUSY_EXECUTABLE_PAUSE_MS`], up to 1 s in all.
/// Shared with the Intel PT backend's fork/exec
/// (`pt::collect::spawn_stopped`).
pub(crate) const BUSY_EXECUTABLE_TRIES: u32 = 100;
/// The pause before each retry of [`BUSY_EXECUTABLE_TRIES`].
pub(crate) const BUSY_EXECUTABLE_PAUSE_MS: u64 = 10;

/// Spawns `command`, retrying for up to a second while its executable is
/// busy (`ETXTBSY`). An instrumented copy has only just been written: if
/// another thread of this process forked while the copy's descriptor was
/// open, that child holds the descriptor until it execs, and an exec of the
/// file meanwhile fails. Waiting it out is the only remedy (the descriptor
/// is close-on-exec, but the window before the other child's exec remains).
fn spawn_fresh_executable(command: &mut Command) -> std::io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match command.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < BUSY_EXECUTABLE_TRIES => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(BUSY_EXECUTABLE_PAUSE_MS));
            }
            result => return result,
        }
    }
}

/// Record buffers shared with the program (a memfd both map; layout in
/// [`protocol::SHARED_STATE_BYTES`] and its neighbours). The runtime claims a
/// free chunk with a locked compare-and-swap on its state word, copies a
/// flush's payload into it and sends only a reference; the collector copies
/// the payload out and frees the chunk. This replaces the kernel's copy of
/// every record into a socket buffer (about 40% of a full trace's CPU time
/// went there). Forked children share the mapping and claim chunks the same
/// way; an exec'd program does not inherit it (the entry hook closes the
/// descriptor after mapping it).
struct SharedChunks {
    config: protocol::SharedConfig,
    _fd: OwnedFd,
    map: *mut u8,
    bytes: usize,
}

impl SharedChunks {
    fn new(chunks: u64) -> Result<SharedChunks, RecordError> {
        let bytes = protocol::SharedConfig::bytes(chunks);
        // SAFETY: plain system calls on a descriptor we own.
        let fd = unsafe { libc::memfd_create(c"memgaze-records".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(setup_error("memfd_create"));
        }
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        if unsafe { libc::ftruncate(fd.as_raw_fd(), bytes as libc::off_t) } != 0 {
            return Err(setup_error("ftruncate"));
        }
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(setup_error("mmap"));
        }
        let (inode, device) = inode_of(&fd)?;
        Ok(SharedChunks {
            config: protocol::SharedConfig {
                fd: fd.as_raw_fd(),
                inode,
                device,
                chunks,
            },
            _fd: fd,
            map: map.cast(),
            bytes,
        })
    }

    /// If `buffer[..n]` is a message whose payload is in a chunk, copies the
    /// payload after the header, clears the flag, frees the chunk and
    /// returns the whole message's length; otherwise `None` (a malformed
    /// reference is left for the assembler to count as a bad message).
    fn take(&self, buffer: &mut [u8], n: usize) -> Option<usize> {
        use protocol::{HEADER_BYTES, SHARED_CHUNK_BYTES, SHARED_FLAG, SHARED_PAYLOAD_BYTES};
        let kind_at = protocol::offsets::KIND as usize;
        if n != HEADER_BYTES + SHARED_PAYLOAD_BYTES {
            return None;
        }
        let kind = u32::from_le_bytes(buffer[kind_at..kind_at + 4].try_into().expect("4"));
        if kind & SHARED_FLAG == 0 {
            return None;
        }
        let word = |at: usize| u32::from_le_bytes(buffer[at..at + 4].try_into().expect("4"));
        let chunk = word(HEADER_BYTES) as usize;
        let length = word(HEADER_BYTES + 4) as usize;
        if chunk as u64 >= self.config.chunks
            || length > SHARED_CHUNK_BYTES
            || HEADER_BYTES + length > buffer.len()
        {
            return None;
        }
        let offset = protocol::SHARED_STATE_BYTES + chunk * SHARED_CHUNK_BYTES;
        debug_assert!(offset + length <= self.bytes);
        // SAFETY: the chunk lies inside the mapping (checked above). The
        // program does not write a chunk between sending its reference and
        // the release below; a misbehaving one could only garble its own
        // records, which the assembler validates.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.add(offset),
                buffer.as_mut_ptr().add(HEADER_BYTES),
                length,
            );
            let state = &*(self.map.add(chunk * 8) as *const AtomicU64);
            state.store(0, Ordering::Release);
            // Wake senders waiting for a free chunk (see the runtime's
            // `send`): the generation changes after the release, and the
            // flag is only swapped, so a sender that set it after this
            // check sees the new generation and does not sleep.
            let generation = &*(self.map.add(protocol::SHARED_GENERATION) as *const AtomicU32);
            generation.fetch_add(1, Ordering::SeqCst);
            let waiting = &*(self.map.add(protocol::SHARED_WAITING) as *const AtomicU64);
            if waiting.load(Ordering::SeqCst) != 0 && waiting.swap(0, Ordering::SeqCst) != 0 {
                libc::syscall(
                    libc::SYS_futex,
                    generation.as_ptr(),
                    libc::FUTEX_WAKE,
                    i32::MAX,
                );
            }
        }
        buffer[kind_at..kind_at + 4].copy_from_slice(&(kind & !SHARED_FLAG).to_le_bytes());
        Some(HEADER_BYTES + length)
    }
}

impl Drop for SharedChunks {
    fn drop(&mut self) {
        // SAFETY: unmaps what `new` mapped.
        unsafe { libc::munmap(self.map.cast(), self.bytes) };
    }
}

/// The [`RecordError::Setup`] error of the system call that just failed.
fn setup_error(what: &'static str) -> RecordError {
    RecordError::Setup {
        what,
        source: std::io::Error::last_os_error(),
    }
}

fn socket_pair() -> Result<(OwnedFd, OwnedFd), RecordError> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(setup_error("cannot create the recorder socket"));
    }
    // SAFETY: socketpair returned two fresh descriptors we now own.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A deeper queue lets the program run ahead of the decoder (capped by
    // net.core.wmem_max; failure only costs speed).
    let size: libc::c_int = 4 << 20;
    // SAFETY: valid descriptor and option buffer.
    unsafe {
        libc::setsockopt(
            theirs.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    Ok((ours, theirs))
}

fn inode_of(fd: &OwnedFd) -> Result<(u64, u64), RecordError> {
    // SAFETY: stat is plain data; fstat fills it.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(setup_error("cannot stat the recorder socket"));
    }
    Ok((stat.st_ino, stat.st_dev))
}

/// `SIGSEGV`-style name of a signal number.
pub(crate) fn signal_name(signal: i32) -> String {
    // SAFETY: strsignal returns a static or thread-local string.
    let described = unsafe {
        let text = libc::strsignal(signal);
        if text.is_null() {
            None
        } else {
            Some(
                std::ffi::CStr::from_ptr(text)
                    .to_string_lossy()
                    .into_owned(),
            )
        }
    };
    let short = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return described.unwrap_or_else(|| format!("signal {signal}")),
    };
    match described {
        Some(text) => format!("{short}, {text}"),
        None => short.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::{HEADER_BYTES, MessageHeader, MessageKind, SHARED_FLAG, SHARED_STATE_BYTES};

    /// A program records only inside regions when both harness markers
    /// were instrumented: one missing or left uninstrumented (the runtime
    /// then hooks neither and records the whole run) is not enough.
    #[test]
    fn only_both_instrumented_markers_gate_recording() {
        use memgaze_metadata::annotation::{ANNOTATION_SCHEMA, FunctionSite};
        let site = |name: &str, instrumented| FunctionSite {
            name: name.into(),
            raw_name: None,
            start: 0x1000,
            size: 16,
            instrumented,
            skipped: None,
            stack_loads: 0,
            string_loads: 0,
        };
        let gated = |functions: Vec<FunctionSite>| {
            records_only_in_regions(&Annotation {
                schema: ANNOTATION_SCHEMA.into(),
                binary: memgaze_metadata::BinaryIdentity {
                    path: "a.out".into(),
                    size: 10,
                    sha256: "00".into(),
                    build_id: None,
                },
                mode: None,
                functions,
                loads: Vec::new(),
                ptwrites: Vec::new(),
                shared_libraries: Vec::new(),
                escapes: Vec::new(),
                cpu_features: Vec::new(),
            })
        };
        let (begin, end) = ("memgaze_region_begin", "memgaze_region_end");
        assert!(gated(vec![
            site("main", true),
            site(begin, true),
            site(end, true)
        ]));
        assert!(!gated(vec![site(begin, true)]));
        assert!(!gated(vec![site(begin, true), site(end, false)]));
        assert!(!gated(vec![site("main", true)]));
    }

    /// Escape ids `object << 24 | site` are looked up in their object's
    /// sites (0: the executable's); zero counts, and ids of sites no
    /// annotation lists, give no entry; equal addresses keep object order.
    #[test]
    fn escape_ids_are_attributed_to_their_object() {
        let site = |at, function: &str| EscapeCount {
            at,
            function: function.into(),
            count: 0,
            loads: 2,
            probed: 1,
            untraced_load: false,
        };
        let objects = Objects {
            escapes: vec![site(0x40, "main")],
            library_escapes: vec![
                Vec::new(),
                Vec::new(),
                vec![
                    site(0x10, "libc.so.6!memcpy"),
                    site(0x40, "libc.so.6!strlen"),
                ],
            ],
            ..Objects::default()
        };
        let counted = HashMap::from([
            (2 << 24 | 1, 5),
            (0, 3),
            (2 << 24, 0),
            (1 << 24, 7),
            (3 << 24, 1),
            (2 << 24 | 2, 1),
        ]);
        let escapes: Vec<(String, u64)> = escape_counts(&objects, &counted)
            .into_iter()
            .map(|e| (e.function, e.count))
            .collect();
        assert_eq!(
            escapes,
            [("main".to_string(), 3), ("libc.so.6!strlen".to_string(), 5)]
        );
    }

    #[test]
    fn stack_cache_tunable_joins_the_users_tunables() {
        let ours = format!("{STACK_CACHE_TUNABLE}={STACK_CACHE_BYTES}");
        assert_eq!(with_stack_cache(None), Some(OsString::from(&ours)));
        assert_eq!(
            with_stack_cache(Some("".as_ref())),
            Some(OsString::from(&ours))
        );
        assert_eq!(
            with_stack_cache(Some("glibc.malloc.check=3".as_ref())),
            Some(OsString::from(format!("glibc.malloc.check=3:{ours}")))
        );
        // The user's own stack cache size stands.
        assert_eq!(
            with_stack_cache(Some(
                "glibc.malloc.check=3:glibc.pthread.stack_cache_size=0".as_ref()
            )),
            None
        );
        // A tunable whose name only starts like it is another one.
        assert!(with_stack_cache(Some("glibc.pthread.stack_cache_size_x=1".as_ref())).is_some());
    }

    /// The chain of `error` as `anyhow`'s `{:#}` prints it.
    fn chain(error: &(dyn std::error::Error + 'static)) -> String {
        let mut parts = vec![error.to_string()];
        let mut next = error.source();
        while let Some(e) = next {
            parts.push(e.to_string());
            next = e.source();
        }
        parts.join(": ")
    }

    #[test]
    fn a_sink_error_names_its_file_once() {
        let path = Path::new("tiny/p.trace");
        let already = "cannot write trace: tiny/p.trace: No space left on device";
        assert_eq!(
            chain(&*named(path, already.into())),
            "tiny/p.trace: cannot write trace: No space left on device"
        );
        let plain = "cannot write trace: No space left on device";
        assert_eq!(
            chain(&*named(path, plain.into())),
            "tiny/p.trace: cannot write trace: No space left on device"
        );
    }

    #[test]
    fn the_notes_say_when_sigkill_follows() {
        use std::time::Duration;
        assert_eq!(sigkill_when(Duration::from_secs(5)), "SIGKILL 5s later");
        assert_eq!(
            sigkill_when(Duration::from_millis(250)),
            "SIGKILL 250ms later"
        );
        assert_eq!(sigkill_when(Duration::ZERO), "SIGKILL at once");
    }

    fn shared_message(chunk: u32, length: u32, count: u32) -> Vec<u8> {
        let header = MessageHeader {
            kind: MessageKind::Records,
            pid: 7,
            tid: 7,
            executions: count as u64,
            dropped: 0,
            slot: 0,
            count,
        };
        let mut message = header.encode().to_vec();
        let kind = (MessageKind::Records as u32 | SHARED_FLAG).to_le_bytes();
        message[protocol::offsets::KIND as usize..][..4].copy_from_slice(&kind);
        message.extend_from_slice(&chunk.to_le_bytes());
        message.extend_from_slice(&length.to_le_bytes());
        message
    }

    #[test]
    fn shared_references_are_copied_out_and_their_chunk_freed() {
        let chunks = SharedChunks::new(4).unwrap();
        let records: Vec<u8> = (0..24u8).collect(); // two records
        let chunk = 2;
        unsafe {
            let at = chunks
                .map
                .add(SHARED_STATE_BYTES + chunk * protocol::SHARED_CHUNK_BYTES);
            std::ptr::copy_nonoverlapping(records.as_ptr(), at, records.len());
            *(chunks.map.add(chunk * 8) as *mut u64) = 1; // claimed
        }
        let mut buffer = vec![0u8; 1 << 18];
        let message = shared_message(chunk as u32, 24, 2);
        buffer[..message.len()].copy_from_slice(&message);
        let n = chunks.take(&mut buffer, message.len()).unwrap();
        assert_eq!(n, HEADER_BYTES + 24);
        let (header, payload) = MessageHeader::decode(&buffer[..n]).unwrap();
        assert_eq!(header.kind, MessageKind::Records);
        assert_eq!(payload, &records[..]);
        assert_eq!(unsafe { *(chunks.map.add(chunk * 8) as *const u64) }, 0);
    }

    #[test]
    fn malformed_shared_references_are_left_to_the_assembler() {
        let chunks = SharedChunks::new(4).unwrap();
        let mut buffer = vec![0u8; 1 << 18];
        for message in [
            shared_message(4, 24, 2), // no such chunk
            shared_message(0, protocol::SHARED_CHUNK_BYTES as u32 + 12, 2), // too long
        ] {
            buffer[..message.len()].copy_from_slice(&message);
            assert_eq!(chunks.take(&mut buffer, message.len()), None);
            // The flag stays: the assembler counts it as a bad message.
            assert!(MessageHeader::decode(&buffer[..message.len()]).is_err());
        }
        // A plain message is not touched.
        let plain = MessageHeader {
            kind: MessageKind::Records,
            pid: 1,
            tid: 1,
            executions: 0,
            dropped: 0,
            slot: 0,
            count: 0,
        }
        .encode();
        buffer[..HEADER_BYTES].copy_from_slice(&plain);
        assert_eq!(chunks.take(&mut buffer, HEADER_BYTES), None);
    }

    /// A collector slower than the program: every chunk is in flight, the
    /// senders wait for releases (or fall back to the socket), and every
    /// record still arrives once.
    #[test]
    fn a_slow_collector_makes_senders_wait_without_losing_records() {
        struct Slow(CountingSink);
        impl RecordSink for Slow {
            fn begin_sample(&mut self, _thread: u32) -> SinkResult {
                Ok(())
            }
            fn switch_thread(&mut self, _thread: u32) -> SinkResult {
                Ok(())
            }
            fn begin_spatial(&mut self, thread: u32) -> SinkResult {
                self.0.begin_spatial(thread)
            }
            fn push(&mut self, load: u32, addr: u64) -> SinkResult {
                self.0.push(load, addr)
            }
            fn push_records(&mut self, records: &[(u32, u64)]) -> SinkResult {
                std::thread::sleep(Duration::from_millis(2));
                self.0.push_records(records)
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let (instrumented, annotation) = instrumented_fixture(dir.path(), "bench_kernels.c");
        let mut sink = Slow(CountingSink::default());
        let mut command = Command::new(&instrumented);
        command
            .args(["str", "200000", "4"])
            .stdout(std::process::Stdio::null());
        let recording = record_command(command, &annotation, &Sampling::full(), &mut sink).unwrap();
        assert_eq!(recording.exit_code(), 0);
        assert!(recording.totals.complete);
        assert!(recording.shared_messages > SHARED_CHUNKS, "{recording:?}");
        assert_eq!(sink.0.records, recording.totals.records);
        assert_eq!(recording.totals.records, recording.totals.executions);
        assert!(recording.totals.records >= 800_000);
        assert_eq!(recording.totals.dropped.records, 0);
    }

    fn instrumented_fixture(dir: &Path, source: &str) -> (std::path::PathBuf, Annotation) {
        let fixture = memgaze_fixtures::fixtures().join("rewriter").join(source);
        let binary = dir.join("program");
        let status = Command::new("gcc")
            .args(["-O2", "-o"])
            .arg(&binary)
            .arg(&fixture)
            .status()
            .unwrap();
        assert!(status.success());
        let instrumented = dir.join("program.mg");
        let result = memgaze_instrument::instrument_file(
            &binary,
            &instrumented,
            None,
            memgaze_metadata::annotation::InstrumentationMode::Soft,
        )
        .unwrap();
        (instrumented, result.annotation)
    }

    /// A forked parent and child both hand full buffers over through shared
    /// chunks (claimed from the one mapping they share), and nothing is lost
    /// or duplicated.
    #[test]
    fn forked_processes_share_the_chunks_without_losing_records() {
        let dir = tempfile::tempdir().unwrap();
        let (instrumented, annotation) = instrumented_fixture(dir.path(), "fork.c");
        let mut sink = CountingSink::default();
        let mut command = Command::new(&instrumented);
        command.stdout(std::process::Stdio::null());
        let recording = record_command(command, &annotation, &Sampling::full(), &mut sink).unwrap();
        assert_eq!(recording.exit_code(), 0);
        // The parent, the child that computes, and the child that execs
        // (its `Exec` message).
        assert_eq!(recording.processes, 3);
        assert_eq!(recording.execs, 1);
        assert!(recording.totals.complete);
        assert!(recording.shared_messages >= 2, "{recording:?}");
        assert_eq!(sink.records, recording.totals.records);
        assert_eq!(recording.totals.records, recording.totals.executions);
        assert_eq!(recording.totals.dropped.records, 0);
        assert!(recording.totals.records > 4096 + 2048, "{recording:?}");
    }
}

/// Children that end through `_exit`, a successful `exec` or a failed one.
#[cfg(test)]
mod process_end_tests {
    use super::*;

    /// Records per load id.
    #[derive(Default)]
    struct PerLoad(HashMap<u32, u64>);

    impl RecordSink for PerLoad {
        fn begin_sample(&mut self, _thread: u32) -> SinkResult {
            Ok(())
        }
        fn switch_thread(&mut self, _thread: u32) -> SinkResult {
            Ok(())
        }
        fn begin_spatial(&mut self, _thread: u32) -> SinkResult {
            panic!("these runs record no spatial samples")
        }
        fn push(&mut self, load: u32, _addr: u64) -> SinkResult {
            *self.0.entry(load).or_default() += 1;
            Ok(())
        }
    }

    fn instrumented(dir: &Path) -> (std::path::PathBuf, Annotation, Vec<String>) {
        let (program, annotation, report) = instrumented_with(dir, &[]);
        (program, annotation, report.process_end_hooks)
    }

    fn instrumented_with(
        dir: &Path,
        flags: &[&str],
    ) -> (
        std::path::PathBuf,
        Annotation,
        memgaze_instrument::rewrite::Report,
    ) {
        let fixture = memgaze_fixtures::fixtures()
            .join("rewriter")
            .join("fork_exit.c");
        let binary = dir.join("program");
        let status = Command::new("gcc")
            .arg("-O2")
            .args(flags)
            .arg("-o")
            .arg(&binary)
            .arg(&fixture)
            .status()
            .unwrap();
        assert!(status.success());
        let output = dir.join("program.mg");
        let result = memgaze_instrument::instrument_file(
            &binary,
            &output,
            None,
            memgaze_metadata::annotation::InstrumentationMode::Soft,
        )
        .unwrap();
        (output, result.annotation, result.report)
    }

    /// Calls that bypass the PLT (`-fno-plt`: `call [rip → GOT slot]`) go
    /// through the same hooks: every child's records arrive, exactly.
    #[test]
    fn imports_called_without_a_plt_entry_are_hooked() {
        let dir = tempfile::tempdir().unwrap();
        let (program, annotation, report) = instrumented_with(dir.path(), &["-fno-plt"]);
        for name in ["_exit", "execl", "fork"] {
            assert!(
                report.process_end_hooks.iter().any(|n| n == name),
                "{report:?}"
            );
        }
        assert!(report.process_end_unhooked.is_empty(), "{report:?}");
        assert!(report.process_end_got_calls >= 7, "{report:?}");
        let loads = child_sum_loads(&annotation);
        let mut sink = PerLoad::default();
        let mut command = Command::new(&program);
        command.stdout(std::process::Stdio::piped());
        let recording = record_command(command, &annotation, &Sampling::full(), &mut sink).unwrap();
        assert_eq!(recording.exit_code(), 0, "{recording:?}");
        assert_eq!(sink.0.get(&loads[0]).copied().unwrap_or(0), 2000);
        assert!(recording.totals.complete, "{recording:?}");
        assert_eq!(recording.totals.records, recording.totals.executions);
        assert_eq!(recording.processes, 4, "{recording:?}");
        assert_eq!(recording.execs, 1, "{recording:?}");
    }

    fn child_sum_loads(annotation: &Annotation) -> Vec<u32> {
        let f = annotation
            .functions
            .iter()
            .position(|f| f.name == "child_sum")
            .unwrap() as u32;
        let loads: Vec<u32> = annotation
            .loads
            .iter()
            .filter(|l| l.function == f && l.instrumented)
            .map(|l| l.id)
            .collect();
        assert_eq!(loads.len(), 1, "{:?}", annotation.loads);
        loads
    }

    /// Every child ends without `exit`, each after fewer records than a
    /// buffer holds: all of their records arrive, and the one that execs is
    /// counted as an untraced program.
    #[test]
    fn children_flush_before_exit_and_exec() {
        let dir = tempfile::tempdir().unwrap();
        let (program, annotation, hooks) = instrumented(dir.path());
        assert!(hooks.contains(&"_exit".to_string()), "{hooks:?}");
        assert!(hooks.contains(&"execl".to_string()), "{hooks:?}");
        let loads = child_sum_loads(&annotation);
        let mut sink = PerLoad::default();
        let mut command = Command::new(&program);
        command.stdout(std::process::Stdio::piped());
        let recording = record_command(command, &annotation, &Sampling::full(), &mut sink).unwrap();
        assert_eq!(recording.exit_code(), 0, "{recording:?}");
        assert_eq!(sink.0.get(&loads[0]).copied().unwrap_or(0), 2000);
        assert!(recording.totals.complete, "{recording:?}");
        assert_eq!(recording.totals.dropped.records, 0);
        assert_eq!(recording.totals.records, recording.totals.executions);
        assert_eq!(recording.processes, 4, "{recording:?}");
        assert_eq!(recording.execs, 1, "{recording:?}");
        assert_eq!(recording.unflushed_processes, 0);
    }

    /// A sampled run counts the children's executions exactly.
    #[test]
    fn children_count_their_executions_when_sampled() {
        let dir = tempfile::tempdir().unwrap();
        let (program, annotation, _) = instrumented(dir.path());
        let run = |sampling: &Sampling| {
            let mut sink = PerLoad::default();
            let mut command = Command::new(&program);
            command.arg("3").stdout(std::process::Stdio::null());
            record_command(command, &annotation, sampling, &mut sink).unwrap()
        };
        let full = run(&Sampling::full());
        let sampled = run(&Sampling {
            window: 64,
            period: 1000,
            ..Sampling::full()
        });
        assert!(full.totals.complete && sampled.totals.complete);
        assert_eq!(sampled.totals.executions, full.totals.executions);
        assert!(sampled.totals.records < full.totals.records);
    }

    /// A child that flushed, then was killed: its last buffer is lost, and
    /// the trace says so.
    #[test]
    fn a_killed_child_leaves_the_trace_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        let (program, annotation, _) = instrumented(dir.path());
        let mut sink = PerLoad::default();
        let mut command = Command::new(&program);
        command
            .args(["1", "kill"])
            .stdout(std::process::Stdio::null());
        let recording = record_command(command, &annotation, &Sampling::full(), &mut sink).unwrap();
        assert_eq!(recording.exit_code(), 0);
        assert_eq!(recording.unflushed_processes, 1, "{recording:?}");
        assert!(!recording.totals.complete);
        assert!(
            recording
                .notes
                .iter()
                .any(|n| n.contains("ended without flushing")),
            "{:?}",
            recording.notes
        );
    }
}
