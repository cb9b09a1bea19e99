//! Running an instrumented program and collecting its software-recorder
//! output into a trace.
//!
//! [`record`] spawns the program with its arguments, its standard streams
//! and its environment untouched (plus [`protocol::RECORDER_ENV`] and
//! [`protocol::RECORDING_ENV`]) and address-space randomisation disabled,
//! reads the recorder's messages from a socket while the program runs, and
//! streams the records into a [`RecordSink`]: a [`TraceWriter`] for `cargo
//! memgaze record`, or anything else (an analyser) that wants them without a
//! file. Nothing is buffered beyond one sample window per thread.

pub mod assemble;
pub mod protocol;

pub use assemble::RegionEvent;

use crate::annotation::Annotation;
use crate::trace::{
    Backend, Dropped, ProgramExit, Sampling, TraceHeader, TraceTotals, TraceWriter,
};
use anyhow::{Context, Result, bail};
use assemble::Assembler;
use protocol::RecorderConfig;
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Default records per sample window (`w`).
pub const DEFAULT_WINDOW: u64 = 1_000;
/// Default instrumented-load executions per period (`w + z`).
pub const DEFAULT_PERIOD: u64 = 100_000;

/// How long descendants of the program may keep the socket open, sending
/// nothing, after the program itself exited before their output is cut off.
const LINGER: Duration = Duration::from_secs(2);

/// Where the collector puts the records it decodes.
///
/// The collector guarantees: [`RecordSink::begin_sample`] before the first
/// record; in a sampled trace every sample is one whole window of one
/// thread; in a full trace there is one sample and
/// [`RecordSink::switch_thread`] announces records of another thread.
pub trait RecordSink {
    /// Starts the next sample, recorded by `thread`.
    fn begin_sample(&mut self, thread: u32) -> Result<()>;
    /// The current sample continues with records of `thread`.
    fn switch_thread(&mut self, thread: u32) -> Result<()>;
    /// One record: load site `load` (index into the annotation's and the
    /// trace header's loads) read `addr`.
    fn push(&mut self, load: u32, addr: u64) -> Result<()>;
    /// A region marker was called (the default ignores it).
    fn region(&mut self, _event: &RegionEvent) -> Result<()> {
        Ok(())
    }
}

impl<W: Write> RecordSink for TraceWriter<W> {
    fn begin_sample(&mut self, thread: u32) -> Result<()> {
        TraceWriter::begin_sample(self, thread)
    }
    fn switch_thread(&mut self, thread: u32) -> Result<()> {
        TraceWriter::switch_thread(self, thread)
    }
    fn push(&mut self, load: u32, addr: u64) -> Result<()> {
        TraceWriter::push(self, load, addr)
    }
}

/// Streams records straight into the analysis (no trace file): what
/// `cargo memgaze run` uses, and what `golden` can use for full traces.
pub struct AnalyzerSink {
    analyzer: crate::analysis::Analyzer,
    sample: u64,
    thread: u32,
    started: bool,
}

impl AnalyzerSink {
    /// An analyser for a trace with this header.
    pub fn new(header: &TraceHeader, options: &crate::analysis::AnalysisOptions) -> Result<Self> {
        Ok(AnalyzerSink {
            analyzer: crate::analysis::Analyzer::new(header, options)?,
            sample: 0,
            thread: 0,
            started: false,
        })
    }

    /// The analysis, given the recording's totals.
    pub fn finish(self, totals: &TraceTotals) -> crate::analysis::Analysis {
        self.analyzer.finish(totals)
    }
}

impl RecordSink for AnalyzerSink {
    fn begin_sample(&mut self, thread: u32) -> Result<()> {
        if self.started {
            self.sample += 1;
        }
        self.started = true;
        self.thread = thread;
        Ok(())
    }
    fn switch_thread(&mut self, thread: u32) -> Result<()> {
        self.thread = thread;
        Ok(())
    }
    fn push(&mut self, load: u32, addr: u64) -> Result<()> {
        self.analyzer
            .push_load(load, addr, self.sample, self.thread);
        Ok(())
    }
}

/// Sends every record to two sinks (e.g. a trace file and an analyser).
pub struct Tee<'a>(pub &'a mut dyn RecordSink, pub &'a mut dyn RecordSink);

impl RecordSink for Tee<'_> {
    fn begin_sample(&mut self, thread: u32) -> Result<()> {
        self.0.begin_sample(thread)?;
        self.1.begin_sample(thread)
    }
    fn switch_thread(&mut self, thread: u32) -> Result<()> {
        self.0.switch_thread(thread)?;
        self.1.switch_thread(thread)
    }
    fn push(&mut self, load: u32, addr: u64) -> Result<()> {
        self.0.push(load, addr)?;
        self.1.push(load, addr)
    }
    fn region(&mut self, event: &RegionEvent) -> Result<()> {
        self.0.region(event)?;
        self.1.region(event)
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
    /// Region marker events.
    pub regions: Vec<RegionEvent>,
    /// Things the user should know (drops, cut-off output, signals).
    pub notes: Vec<String>,
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
        backend: Backend::Soft,
        sampling,
        binary: Some(annotation.binary.clone()),
        command,
        functions: annotation.function_entries(),
        loads: annotation.load_entries(),
        labels: Vec::new(),
    }
}

/// Runs `program` (instrumented, described by `annotation`) with `args` and
/// streams its records into `sink`.
///
/// `sampling.window == sampling.period` records a full trace; otherwise the
/// recorder records `window` consecutive instrumented-load executions per
/// `period` (jittered with `sampling.seed`, 0 when absent).
pub fn record(
    program: &Path,
    args: &[OsString],
    annotation: &Annotation,
    sampling: &Sampling,
    sink: &mut dyn RecordSink,
) -> Result<Recording> {
    let mut command = Command::new(program);
    command.args(args);
    record_command(command, annotation, sampling, sink)
}

/// [`record`] for a command the caller prepared: its arguments, working
/// directory, environment and standard streams are kept (e.g. `cargo
/// memgaze bench` runs a bench from its package root and captures its
/// libtest output); the recorder's variables and the spawn settings
/// (no address randomisation, the socket inherited) are added.
pub fn record_command(
    mut command: Command,
    annotation: &Annotation,
    sampling: &Sampling,
    sink: &mut dyn RecordSink,
) -> Result<Recording> {
    let program = std::path::PathBuf::from(command.get_program());
    let program = program.as_path();
    if sampling.window == 0 || sampling.window > sampling.period {
        bail!(
            "window {} must be between 1 and the period {}",
            sampling.window,
            sampling.period
        );
    }
    let (ours, theirs) = socket_pair()?;
    let (inode, device) = inode_of(&theirs)?;
    let config = RecorderConfig {
        fd: theirs.as_raw_fd(),
        inode,
        device,
        window: sampling.window,
        period: sampling.period,
        seed: sampling.seed.unwrap_or(0),
    };
    let their_fd = theirs.as_raw_fd();
    command
        .env(protocol::RECORDER_ENV, config.to_env())
        .env(protocol::RECORDING_ENV, "1");
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::fcntl(their_fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("{}: cannot run", program.display()))?;
    drop(theirs);
    let pid = child.id();
    // Like a shell: ^C reaches the program (same process group); we stay to
    // write what it recorded.
    let previous = ignore_interrupts();

    let done = Arc::new(AtomicBool::new(false));
    let cut_off = Arc::new(AtomicBool::new(false));
    // Messages read so far: the linger below counts from the last one, so a
    // reader still draining what the program queued before it exited (a
    // slow sink, a full trace) is never cut off.
    let progress = Arc::new(AtomicU64::new(0));
    let waiter = {
        let done = Arc::clone(&done);
        let cut_off = Arc::clone(&cut_off);
        let progress = Arc::clone(&progress);
        let socket = ours.as_raw_fd();
        std::thread::spawn(move || {
            let status = child.wait();
            let mut deadline = Instant::now() + LINGER;
            let mut seen = progress.load(Ordering::Acquire);
            while !done.load(Ordering::Acquire) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
                let now = progress.load(Ordering::Acquire);
                if now != seen {
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

    let valid: Vec<bool> = annotation.loads.iter().map(|l| l.instrumented).collect();
    let full = sampling.is_full();
    let mut assembler = Assembler::new(sink, valid, full, sampling.window);
    let mut buffer = vec![0u8; 1 << 18];
    let mut failure = None;
    loop {
        // SAFETY: buffer is valid for its length.
        let n = unsafe {
            libc::recv(
                ours.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                0,
            )
        };
        if n == 0 {
            break;
        }
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            failure = Some(anyhow::Error::new(err).context("reading the recorder's output"));
            break;
        }
        if let Err(e) = assembler.message(&buffer[..n as usize]) {
            failure = Some(e);
            break;
        }
        progress.fetch_add(1, Ordering::Release);
    }
    done.store(true, Ordering::Release);
    let status = waiter
        .join()
        .map_err(|_| anyhow::anyhow!("the process waiter panicked"))?
        .with_context(|| format!("{}: cannot wait for the program", program.display()))?;
    restore_interrupts(previous);
    if let Some(e) = failure {
        return Err(e);
    }
    assembler.finish()?;

    let exit = match (status.code(), status.signal()) {
        (Some(code), _) => ProgramExit::Code(code),
        (None, Some(signal)) => ProgramExit::Signal(signal),
        (None, None) => ProgramExit::Code(-1),
    };
    let mut notes = Vec::new();
    if let ProgramExit::Signal(signal) = exit {
        notes.push(format!(
            "the program was killed by signal {signal} ({}): the trace holds what was recorded until then",
            signal_name(signal)
        ));
    }
    if cut_off.load(Ordering::Acquire) {
        notes.push(format!(
            "processes the program left running still held the recorder socket {}s after it exited; their output was cut off",
            LINGER.as_secs()
        ));
    }
    let main_exited = assembler.process_exited(pid);
    if assembler.processes.is_empty() {
        notes.push(
            "the recorder sent nothing: the program may not be instrumented by this cargo memgaze, may have exited before its entry point, or runs on a kernel without MADV_WIPEONFORK (Linux ≥ 4.14)"
                .into(),
        );
    } else if matches!(exit, ProgramExit::Code(_)) && !main_exited {
        notes.push(
            "the program ended without running its exit hook (_exit or exec): executions after its last flush are not counted"
                .into(),
        );
    }
    if assembler.invalid_records > 0 || assembler.bad_messages > 0 {
        notes.push(format!(
            "{} records named unknown loads and {} messages were malformed (annotation does not match the binary?)",
            assembler.invalid_records, assembler.bad_messages
        ));
    }
    let dropped_records = assembler.dropped() + assembler.invalid_records;
    if dropped_records > 0 {
        notes.push(format!(
            "{dropped_records} records dropped (signal-handler re-entry or failed writes)"
        ));
    }
    let totals = TraceTotals {
        executions: assembler.executions(),
        records: assembler.records,
        samples: assembler.samples,
        dropped: Dropped {
            records: dropped_records,
            samples: 0,
            bytes: 0,
        },
        exit: Some(exit),
        complete: matches!(exit, ProgramExit::Code(_))
            && main_exited
            && !cut_off.load(Ordering::Acquire),
    };
    Ok(Recording {
        exit,
        totals,
        threads: assembler.threads(),
        processes: assembler.processes.len(),
        regions: std::mem::take(&mut assembler.regions),
        notes,
    })
}

fn socket_pair() -> Result<(OwnedFd, OwnedFd)> {
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
        return Err(std::io::Error::last_os_error()).context("cannot create the recorder socket");
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

fn inode_of(fd: &OwnedFd) -> Result<(u64, u64)> {
    // SAFETY: stat is plain data; fstat fills it.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error()).context("cannot stat the recorder socket");
    }
    Ok((stat.st_ino, stat.st_dev))
}

type Handlers = [libc::sighandler_t; 2];

fn ignore_interrupts() -> Handlers {
    // SAFETY: setting dispositions of SIGINT/SIGQUIT.
    unsafe {
        [
            libc::signal(libc::SIGINT, libc::SIG_IGN),
            libc::signal(libc::SIGQUIT, libc::SIG_IGN),
        ]
    }
}

fn restore_interrupts(previous: Handlers) {
    // SAFETY: restoring what ignore_interrupts replaced.
    unsafe {
        libc::signal(libc::SIGINT, previous[0]);
        libc::signal(libc::SIGQUIT, previous[1]);
    }
}

/// `SIGSEGV`-style name of a signal number.
pub fn signal_name(signal: i32) -> String {
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
