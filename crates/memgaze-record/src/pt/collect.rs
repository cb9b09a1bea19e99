//! Running a program under Intel PT `ptwrite` collection.
//!
//! [`collect`] starts the program stopped (fork, then the child waits on a
//! pipe before `execve`), opens one event group per online CPU bound to the
//! child (`intel_pt` leader enabled on exec, inherited by threads and
//! children; in sampling mode a load-sampling member whose samples carry the
//! last PT bytes), maps each group's data ring and AUX area, lets the child
//! exec, and drains the rings until it exits. The result, a [`Collection`],
//! holds the AUX samples (or, in full mode, each CPU's whole PT stream), the
//! mappings of the executable (to map PTWRITE IPs back to file addresses),
//! the loads the sampling event counted (the numerator of ρ), and every
//! loss the kernel reported.
//!
//! Sampling mode maps the AUX area read-only, which the kernel treats as
//! overwrite ("snapshot") mode: PT runs continuously into the AUX ring and
//! each load-event overflow copies its last `aux_sample_size` bytes into the
//! sample. Full mode maps it writable and drains it (`aux_head`/`aux_tail`).
//!
//! Nothing here can run on a machine without Intel PT; the record handling
//! (`Accumulator`), the ring logic ([`super::ring`]) and the process
//! handshake (`spawn_stopped`) are tested without it.

use super::config::{self, INTEL_PT_PMU, PtOptions};
use super::error::{Context, PtError, Result};
use super::probe::{BufferPlan, explain_errno, page_size};
use super::ring::{
    Losses, PerfRecord, RecordHeader, RecordReader, RingArea, RingPointers, drain_aux, parse_record,
};
use super::sysfs::{Pmu, SystemRoot, online_cpus};
use memgaze_trace::ProgramExit;
use perf_event_open_sys::bindings as sys;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What to collect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollectMode {
    /// An AUX sample every `period` executed loads.
    Sampled {
        /// Loads between samples.
        period: u64,
    },
    /// The whole PT stream of every CPU.
    Full,
}

/// Options of a collection.
#[derive(Clone, Debug)]
pub struct CollectOptions {
    /// Sampled or full.
    pub(crate) mode: CollectMode,
    /// The `intel_pt` event's options.
    pub(crate) pt: PtOptions,
    /// Ring, AUX and sample sizes.
    pub(crate) buffers: BufferPlan,
    /// Where sysfs is read (the live system outside tests).
    pub(crate) root: SystemRoot,
}

/// One AUX sample: the last bytes of one CPU's PT stream when the load
/// counter overflowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AuxSample {
    /// CPU whose PT data it is.
    pub(crate) cpu: u32,
    /// Process of the overflowing thread.
    pub(crate) pid: u32,
    /// The overflowing thread.
    pub(crate) tid: u32,
    /// Perf timestamp.
    pub(crate) time: u64,
    /// Raw PT bytes.
    pub(crate) data: Vec<u8>,
}

/// A file mapping reported by `PERF_RECORD_MMAP2`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mapping {
    /// Process.
    pub(crate) pid: u32,
    /// Start address.
    pub(crate) addr: u64,
    /// Length in bytes.
    pub(crate) len: u64,
    /// File offset mapped at `addr`.
    pub(crate) pgoff: u64,
    /// `PROT_*`.
    pub(crate) prot: u32,
    /// The file.
    pub(crate) filename: String,
}

/// The loads the sampling event counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LoadCount {
    /// Raw count.
    pub(crate) value: u64,
    /// Time the event was enabled (ns).
    pub(crate) time_enabled: u64,
    /// Time it actually counted (less when the PMU was multiplexed).
    pub(crate) time_running: u64,
}

impl LoadCount {
    /// The count scaled for multiplexing (`value × enabled / running`).
    pub(crate) fn estimate(&self) -> u64 {
        if self.time_running == 0 || self.time_running >= self.time_enabled {
            self.value
        } else {
            (self.value as u128 * self.time_enabled as u128 / self.time_running as u128) as u64
        }
    }

    /// Adds another CPU's count.
    pub(crate) fn add(&mut self, other: LoadCount) {
        self.value += other.value;
        self.time_enabled += other.time_enabled;
        self.time_running += other.time_running;
    }
}

/// The whole PT stream of one CPU (full mode).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CpuStream {
    /// The CPU.
    pub(crate) cpu: u32,
    /// Its PT bytes, in order; a gap (AUX truncation) shows as a resync.
    pub(crate) data: Vec<u8>,
}

/// What a collection produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collection {
    /// AUX samples, in the order they were drained (per CPU in time order).
    pub(crate) samples: Vec<AuxSample>,
    /// Full mode: every CPU's PT stream.
    pub(crate) streams: Vec<CpuStream>,
    /// Mappings of every file the traced processes mapped.
    pub(crate) mappings: Vec<Mapping>,
    /// Loads counted by the sampling event (sampling mode).
    pub(crate) loads: Option<LoadCount>,
    /// Everything the kernel reported lost.
    pub(crate) losses: Losses,
    /// How the program ended.
    pub(crate) exit: Option<ProgramExit>,
    /// Process id of the traced program.
    pub(crate) pid: u32,
}

/// Turns ring records into a [`Collection`]: the part of the collector that
/// needs no hardware (tested on simulated rings).
#[derive(Debug, Default)]
pub(crate) struct Accumulator {
    /// The collection so far.
    pub(crate) collection: Collection,
    /// Records that did not parse (counted, never silently dropped).
    pub(crate) malformed_records: u64,
}

impl Accumulator {
    /// Handles one record read from `cpu`'s ring.
    pub(crate) fn on_record(&mut self, cpu: u32, header: RecordHeader, body: &[u8]) {
        let record = match parse_record(header, body) {
            Ok(record) => record,
            Err(_) => {
                self.malformed_records += 1;
                return;
            }
        };
        self.collection.losses.count(&record);
        match record {
            PerfRecord::Sample { id, aux } => self.collection.samples.push(AuxSample {
                cpu,
                pid: id.pid,
                tid: id.tid,
                time: id.time,
                data: aux.to_vec(),
            }),
            PerfRecord::Mmap {
                pid,
                addr,
                len,
                pgoff,
                prot,
                filename,
            } => self.collection.mappings.push(Mapping {
                pid,
                addr,
                len,
                pgoff,
                prot,
                filename: filename.to_string(),
            }),
            _ => {}
        }
    }

    /// Appends AUX bytes drained from `cpu` (full mode).
    pub(crate) fn on_aux(&mut self, cpu: u32, bytes: &[u8]) {
        let streams = &mut self.collection.streams;
        match streams.iter_mut().find(|s| s.cpu == cpu) {
            Some(stream) => stream.data.extend_from_slice(bytes),
            None => streams.push(CpuStream {
                cpu,
                data: bytes.to_vec(),
            }),
        }
    }
}

/// A forked child blocked before `execve` until [`StoppedChild::start`].
#[derive(Debug)]
pub(crate) struct StoppedChild {
    pid: libc::pid_t,
    go: Option<OwnedFd>,
    exec_status: OwnedFd,
    program: PathBuf,
}

/// A started child.
#[derive(Debug)]
pub(crate) struct RunningChild {
    pid: libc::pid_t,
    exit: Option<ProgramExit>,
}

fn cstring(s: &OsStr, what: &str) -> Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| PtError::NulByte {
        what: what.to_string(),
        value: s.to_os_string(),
    })
}

/// Finds `program` on `PATH` when it has no slash (what `execvp` would run).
pub(crate) fn resolve_program(program: &Path) -> Result<PathBuf> {
    if program.as_os_str().as_bytes().contains(&b'/') {
        return Ok(program.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| PtError::NotOnPath {
            program: program.to_path_buf(),
        })
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe2");
    }
    // SAFETY: two new descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Forks `program args…` with `env` added to this process's environment;
/// the child waits before `execve` until [`StoppedChild::start`].
pub(crate) fn spawn_stopped(
    program: &Path,
    args: &[OsString],
    env: &[(OsString, OsString)],
) -> Result<StoppedChild> {
    let resolved = resolve_program(program)?;
    // Everything the child needs is built before fork: after it, the child
    // may only make async-signal-safe calls.
    let path = cstring(resolved.as_os_str(), "program path")?;
    let mut argv = vec![cstring(program.as_os_str(), "program name")?];
    for arg in args {
        argv.push(cstring(arg, "argument")?);
    }
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| !env.iter().any(|(e, _)| e == k))
        .collect();
    vars.extend(env.iter().cloned());
    let envp: Vec<CString> = vars
        .iter()
        .map(|(k, v)| {
            let mut kv = k.clone();
            kv.push("=");
            kv.push(v);
            cstring(&kv, "environment variable")
        })
        .collect::<Result<_>>()?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());

    let (go_read, go_write) = pipe()?;
    let (status_read, status_write) = pipe()?;
    // SAFETY: fork has no preconditions; the child branch below only calls
    // async-signal-safe functions (close, read, execve, write, _exit).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork");
    }
    if pid == 0 {
        // SAFETY: the child: raw syscalls on descriptors and pointers built
        // before the fork; it never returns into Rust code.
        unsafe {
            libc::close(go_write.as_raw_fd());
            libc::close(status_read.as_raw_fd());
            let mut byte = 0u8;
            loop {
                let n = libc::read(go_read.as_raw_fd(), (&mut byte as *mut u8).cast(), 1);
                if n == 1 {
                    break;
                }
                if n < 0 && *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                // The parent gave up (its end closed): never run the program.
                libc::_exit(127);
            }
            // An executable written just now can be busy (ETXTBSY) while
            // another thread's fork still holds it open: wait that out, as
            // `record` does (nanosleep is async-signal-safe).
            let mut tries = 0;
            loop {
                libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr());
                if *libc::__errno_location() != libc::ETXTBSY
                    || tries == crate::BUSY_EXECUTABLE_TRIES
                {
                    break;
                }
                tries += 1;
                let pause = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: crate::BUSY_EXECUTABLE_PAUSE_MS as libc::c_long * 1_000_000,
                };
                libc::nanosleep(&pause, std::ptr::null_mut());
            }
            let errno = *libc::__errno_location();
            let bytes = errno.to_ne_bytes();
            libc::write(status_write.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
            libc::_exit(127);
        }
    }
    drop(go_read);
    drop(status_write);
    Ok(StoppedChild {
        pid,
        go: Some(go_write),
        exec_status: status_read,
        program: program.to_path_buf(),
    })
}

impl StoppedChild {
    /// The child's process id (to bind perf events to).
    pub(crate) fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Lets the child call `execve`; fails if the exec fails.
    pub(crate) fn start(mut self) -> Result<RunningChild> {
        let go = self.go.take().expect("started twice");
        let byte = [1u8];
        // SAFETY: writing one byte from a live buffer to our pipe end.
        let written = unsafe { libc::write(go.as_raw_fd(), byte.as_ptr().cast(), 1) };
        drop(go);
        if written != 1 {
            return Err(std::io::Error::last_os_error()).context("releasing the child");
        }
        let mut status = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            // SAFETY: reading into the rest of a live buffer.
            let n = unsafe {
                libc::read(
                    self.exec_status.as_raw_fd(),
                    status[got..].as_mut_ptr().cast(),
                    4 - got,
                )
            };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        let pid = self.pid;
        // The child is now either the program or exiting: no kill on drop.
        self.pid = 0;
        let mut running = RunningChild { pid, exit: None };
        if got == 4 {
            // The child exits by itself after a failed exec.
            let errno = i32::from_ne_bytes(status);
            let _ = running.wait();
            return Err(PtError::Exec {
                program: self.program.clone(),
                errno,
            });
        }
        Ok(running)
    }
}

impl Drop for StoppedChild {
    fn drop(&mut self) {
        if self.pid > 0 {
            // Closing the pipe makes the child exit without exec; reap it.
            self.go.take();
            let mut status = 0;
            // SAFETY: reaping our own child.
            unsafe { libc::waitpid(self.pid, &mut status, 0) };
        }
    }
}

fn decode_status(status: libc::c_int) -> ProgramExit {
    if libc::WIFSIGNALED(status) {
        ProgramExit::Signal(libc::WTERMSIG(status))
    } else {
        ProgramExit::Code(libc::WEXITSTATUS(status))
    }
}

impl RunningChild {
    /// The exit status, if the child has exited.
    pub(crate) fn try_wait(&mut self) -> Result<Option<ProgramExit>> {
        if self.exit.is_some() {
            return Ok(self.exit);
        }
        let mut status = 0;
        // SAFETY: polling our own child.
        let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        if r < 0 {
            return Err(std::io::Error::last_os_error()).context("waitpid");
        }
        if r == self.pid {
            self.exit = Some(decode_status(status));
        }
        Ok(self.exit)
    }

    /// Waits for the child to exit.
    pub(crate) fn wait(&mut self) -> Result<ProgramExit> {
        if let Some(exit) = self.exit {
            return Ok(exit);
        }
        let mut status = 0;
        loop {
            // SAFETY: waiting for our own child.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e).context("waitpid");
            }
        }
        let exit = decode_status(status);
        self.exit = Some(exit);
        Ok(exit)
    }
}

impl Drop for RunningChild {
    fn drop(&mut self) {
        // Collection failed while the program ran: do not leave it running
        // untraced behind the error.
        if self.exit.is_none() {
            // SAFETY: signalling and reaping our own child.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = self.wait();
        }
    }
}

/// A mapping created with `mmap`, unmapped on drop.
struct Mapped {
    base: *mut u8,
    len: usize,
}

impl Mapped {
    fn new(fd: &OwnedFd, len: usize, offset: usize, writable: bool, what: &str) -> Result<Mapped> {
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: mapping a perf fd; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if base == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(libc::EPERM) {
                " (over the locked-memory budget: see the `mlock` check of `cargo memgaze doctor`)"
            } else {
                ""
            };
            return Err(PtError::Mmap {
                what: what.to_string(),
                len,
                error: e,
                hint,
            });
        }
        Ok(Mapped {
            base: base.cast(),
            len,
        })
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// One CPU's event group and its mapped rings.
struct CpuGroup {
    cpu: u32,
    // Field order: the maps go before the descriptors are closed.
    aux: Mapped,
    ring: Mapped,
    member: Option<OwnedFd>,
    leader: OwnedFd,
    reader: RecordReader,
}

fn open_event(
    event: &config::EventConfig,
    pid: u32,
    cpu: u32,
    group: Option<&OwnedFd>,
) -> Result<OwnedFd> {
    let mut attr = event.to_attr();
    // SAFETY: a fully initialised attr of its declared size.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            &mut attr,
            pid as libc::pid_t,
            cpu as libc::c_int,
            group.map_or(-1, |g| g.as_raw_fd()),
            sys::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(PtError::PerfEventOpen {
            pmu: event.pmu.to_string(),
            config: event.words.config,
            cpu: cpu as i32,
            why: explain_errno(&e),
        });
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_groups(pid: u32, options: &CollectOptions) -> Result<Vec<CpuGroup>> {
    let plan = &options.buffers;
    if !(plan.data_pages.is_power_of_two() && plan.aux_pages.is_power_of_two()) {
        return Err(PtError::BufferNotPowerOfTwo);
    }
    let page = page_size();
    let data_len = plan.data_pages * page;
    let aux_len = plan.aux_pages * page;
    if let CollectMode::Sampled { .. } = options.mode
        && !(plan.aux_sample_size as usize <= aux_len && (plan.aux_sample_size as usize) < data_len)
    {
        return Err(PtError::AuxSampleTooLarge {
            sample: plan.aux_sample_size,
            aux_len,
            data_len,
        });
    }
    let pt_pmu = Pmu::load(&options.root, INTEL_PT_PMU)
        .context("the intel_pt PMU (see `cargo memgaze doctor`)")?;
    let mut pt_event = config::intel_pt_event(&pt_pmu, &options.pt)?;
    pt_event.wakeup_watermark = (data_len / 2) as u32;
    let load_pmus = match options.mode {
        CollectMode::Sampled { .. } => config::load_pmus(&options.root)?,
        CollectMode::Full => Vec::new(),
    };
    let cpus = online_cpus(&options.root)?;
    let writable_aux = matches!(options.mode, CollectMode::Full);
    if writable_aux {
        pt_event.aux_watermark = (aux_len / 2) as u32;
    }
    let mut groups = Vec::with_capacity(cpus.len());
    for cpu in cpus {
        let leader = open_event(&pt_event, pid, cpu, None)?;
        // The rings first: PERF_EVENT_IOC_SET_OUTPUT needs the target
        // event's buffer to be mapped (kernel/events/core.c,
        // perf_event_set_output).
        let ring = Mapped::new(&leader, page + data_len, 0, true, "perf data ring")?;
        let header = ring.base.cast::<sys::perf_event_mmap_page>();
        // SAFETY: the header page is mapped read-write; the kernel reads the
        // AUX placement from it when the AUX area is mapped.
        unsafe {
            (*header).aux_offset = (page + data_len) as u64;
            (*header).aux_size = aux_len as u64;
        }
        // Read-only AUX = overwrite mode (sampling); writable = drained.
        let aux = Mapped::new(&leader, aux_len, page + data_len, writable_aux, "AUX area")?;
        let member = match options.mode {
            CollectMode::Sampled { period } => {
                let pmu = load_pmus
                    .iter()
                    .find(|p| p.covers_cpu(cpu))
                    .ok_or(PtError::NoPmuForCpu { cpu })?;
                let event = config::load_sampling_event(pmu, period, plan.aux_sample_size)?;
                let member = open_event(&event, pid, cpu, Some(&leader))?;
                // Samples go to the leader's ring.
                // SAFETY: an ioctl on two perf descriptors we own.
                let r = unsafe {
                    perf_event_open_sys::ioctls::SET_OUTPUT(member.as_raw_fd(), leader.as_raw_fd())
                };
                if r != 0 {
                    return Err(std::io::Error::last_os_error())
                        .with_context(|| format!("PERF_EVENT_IOC_SET_OUTPUT on CPU {cpu}"));
                }
                Some(member)
            }
            CollectMode::Full => None,
        };
        groups.push(CpuGroup {
            cpu,
            aux,
            ring,
            member,
            leader,
            reader: RecordReader::default(),
        });
    }
    Ok(groups)
}

impl CpuGroup {
    fn drain(&mut self, acc: &mut Accumulator, full: bool, scratch: &mut Vec<u8>) -> Result<()> {
        let page = page_size();
        let header = self.ring.base.cast::<sys::perf_event_mmap_page>();
        // SAFETY: the ring and AUX mappings live as long as `self`.
        let (data, data_ptrs, aux, aux_ptrs) = unsafe {
            (
                RingArea::from_raw(self.ring.base.add(page), self.ring.len - page),
                RingPointers::data(header),
                RingArea::from_raw(self.aux.base, self.aux.len),
                RingPointers::aux(header),
            )
        };
        let cpu = self.cpu;
        self.reader
            .drain(&data, &data_ptrs, |h, body| acc.on_record(cpu, h, body))
            .with_context(|| format!("CPU {cpu} data ring"))?;
        if full {
            scratch.clear();
            drain_aux(&aux, &aux_ptrs, scratch).with_context(|| format!("CPU {cpu} AUX area"))?;
            acc.on_aux(cpu, scratch);
        }
        Ok(())
    }

    fn read_loads(&self) -> Result<Option<LoadCount>> {
        let Some(member) = &self.member else {
            return Ok(None);
        };
        let mut values = [0u64; 3];
        // SAFETY: reading 24 bytes into a live buffer.
        let n = unsafe { libc::read(member.as_raw_fd(), values.as_mut_ptr().cast(), 24) };
        if n != 24 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("reading the load count of CPU {}", self.cpu));
        }
        Ok(Some(LoadCount {
            value: values[0],
            time_enabled: values[1],
            time_running: values[2],
        }))
    }
}

/// Runs `program args…` under collection. `env` is added to the program's
/// environment (the recorder passes `MEMGAZE_RECORDING=1`).
pub fn collect(
    program: &Path,
    args: &[OsString],
    env: &[(OsString, OsString)],
    options: &CollectOptions,
) -> Result<Collection> {
    let child = spawn_stopped(program, args, env)?;
    let pid = child.pid();
    // On error the stopped child is dropped: it exits without running.
    let mut groups = open_groups(pid, options)?;
    let mut running = child.start()?;
    let full = matches!(options.mode, CollectMode::Full);
    let mut acc = Accumulator::default();
    let mut scratch = Vec::new();
    let mut pollfds: Vec<libc::pollfd> = groups
        .iter()
        .map(|g| libc::pollfd {
            fd: g.leader.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let exit = loop {
        // SAFETY: polling descriptors we own; errors (EINTR) just retry.
        unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, 50) };
        for group in &mut groups {
            group.drain(&mut acc, full, &mut scratch)?;
        }
        if let Some(exit) = running.try_wait()? {
            break exit;
        }
    };
    let mut loads = None::<LoadCount>;
    for group in &mut groups {
        group.drain(&mut acc, full, &mut scratch)?;
        if let Some(count) = group.read_loads()? {
            loads.get_or_insert_with(LoadCount::default).add(count);
        }
    }
    if acc.malformed_records != 0 {
        return Err(PtError::MalformedRecords {
            count: acc.malformed_records,
        });
    }
    let mut collection = acc.collection;
    collection.loads = loads;
    collection.exit = Some(exit);
    collection.pid = pid;
    Ok(collection)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pt::ring::tests::{SimRing, sample_body};

    #[test]
    fn child_does_not_run_before_start_and_reports_its_exit() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let script = format!("echo $MEMGAZE_RECORDING > {}; exit 7", marker.display());
        let child = spawn_stopped(
            Path::new("sh"),
            &["-c".into(), script.into()],
            &[("MEMGAZE_RECORDING".into(), "1".into())],
        )
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!marker.exists(), "the child ran before it was released");
        let mut running = child.start().unwrap();
        assert_eq!(running.wait().unwrap(), ProgramExit::Code(7));
        assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "1");
    }

    #[test]
    fn exec_failures_and_signals_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let not_exec = dir.path().join("data.txt");
        std::fs::write(&not_exec, "just text").unwrap();
        let e = spawn_stopped(&not_exec, &[], &[])
            .unwrap()
            .start()
            .unwrap_err();
        assert!(e.to_string().starts_with("cannot execute"), "{e}");
        assert!(spawn_stopped(Path::new("no-such-program-memgaze"), &[], &[]).is_err());
        let mut running = spawn_stopped(Path::new("sh"), &["-c".into(), "kill -9 $$".into()], &[])
            .unwrap()
            .start()
            .unwrap();
        assert_eq!(running.wait().unwrap(), ProgramExit::Signal(9));
    }

    #[test]
    fn an_executable_still_open_for_writing_runs_once_it_is_closed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("fresh.sh");
        std::fs::write(&program, "#!/bin/sh\nexit 5\n").unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Another process holds the file open for writing for a while (as
        // another thread's fork holds a just-written copy until it execs):
        // exec fails with ETXTBSY meanwhile.
        let ready = dir.path().join("ready");
        let mut holder = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "exec 3>>'{}'; touch '{}'; sleep 0.3",
                program.display(),
                ready.display()
            ))
            .spawn()
            .unwrap();
        while !ready.exists() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut running = spawn_stopped(&program, &[], &[]).unwrap().start().unwrap();
        assert_eq!(running.wait().unwrap(), ProgramExit::Code(5));
        holder.wait().unwrap();
    }

    #[test]
    fn dropping_a_stopped_child_never_runs_it() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let child = spawn_stopped(
            Path::new("sh"),
            &["-c".into(), format!("touch {}", marker.display()).into()],
            &[],
        )
        .unwrap();
        drop(child);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!marker.exists());
    }

    #[test]
    fn accumulator_collects_samples_mappings_and_losses_from_a_ring() {
        let mut ring = SimRing::new(1 << 14);
        let mut acc = Accumulator::default();
        assert!(ring.write(
            sys::PERF_RECORD_SAMPLE,
            &sample_body(11, 2, 1000, &[0x02, 0x82])
        ));
        let mut aux = Vec::new();
        aux.extend_from_slice(&0u64.to_ne_bytes());
        aux.extend_from_slice(&4096u64.to_ne_bytes());
        aux.extend_from_slice(
            &u64::from(sys::PERF_AUX_FLAG_OVERWRITE | sys::PERF_AUX_FLAG_PARTIAL).to_ne_bytes(),
        );
        aux.extend_from_slice(&[0; 32]);
        assert!(ring.write(sys::PERF_RECORD_AUX, &aux));
        let mut lost_samples = 5u64.to_ne_bytes().to_vec();
        lost_samples.extend_from_slice(&[0; 32]);
        assert!(ring.write(sys::PERF_RECORD_LOST_SAMPLES, &lost_samples));
        let area = RingArea::from_slice(&ring.area).unwrap();
        RecordReader::default()
            .drain(&area, &ring.pointers(), |h, b| acc.on_record(2, h, b))
            .unwrap();
        let c = &acc.collection;
        assert_eq!(c.samples.len(), 1);
        assert_eq!(
            (c.samples[0].cpu, c.samples[0].tid, c.samples[0].time),
            (2, 11, 1000)
        );
        assert_eq!(&c.samples[0].data[..2], &[0x02, 0x82]);
        assert_eq!(
            (
                c.losses.aux_overwrite,
                c.losses.aux_partial,
                c.losses.lost_samples
            ),
            (1, 1, 5)
        );
        acc.on_aux(3, &[1, 2]);
        acc.on_aux(3, &[3]);
        assert_eq!(acc.collection.streams[0].data, vec![1, 2, 3]);
    }

    #[test]
    fn collect_without_intel_pt_fails_clearly_and_never_runs_the_program() {
        let root = SystemRoot::live();
        if Pmu::exists(&root, INTEL_PT_PMU) {
            return; // A PT machine: this is the other machines' test.
        }
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let options = CollectOptions {
            mode: CollectMode::Sampled { period: 100_000 },
            pt: PtOptions::default(),
            buffers: BufferPlan::default(),
            root,
        };
        let e = collect(
            Path::new("sh"),
            &["-c".into(), format!("touch {}", marker.display()).into()],
            &[],
            &options,
        )
        .unwrap_err();
        let line = memgaze_error::one_line_of(&e);
        assert!(line.contains("intel_pt"), "{line}");
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !marker.exists(),
            "the program ran although collection failed"
        );
    }

    #[test]
    fn load_counts_scale_for_multiplexing() {
        let c = LoadCount {
            value: 1000,
            time_enabled: 200,
            time_running: 100,
        };
        assert_eq!(c.estimate(), 2000);
        assert_eq!(
            LoadCount {
                value: 7,
                time_enabled: 5,
                time_running: 5
            }
            .estimate(),
            7
        );
    }
}
