//! Turning the recorder's messages into samples for a [`RecordSink`].
//!
//! Messages of different threads (and forked processes) arrive interleaved.
//! A *sampled* trace buffers each thread's open window (at most `w`
//! records) and hands it to the sink whole, so every sample is one window of
//! one thread. A *full* trace is one sample; records stream straight through
//! and [`RecordSink::switch_thread`] marks where another thread's records
//! continue it (the analysis splits it per thread, docs/METRICS.md).
//!
//! Spatial records ([`protocol::SPATIAL_FLAG`]) of a sampled trace go to
//! the sink as they arrive, after [`RecordSink::begin_spatial`] of their
//! thread, once the thread's open window (whose records come before them
//! in the thread's order) was handed over: each thread's records keep
//! their program order.

use super::{RecordSink, SinkResult};
use memgaze_trace::protocol::{
    self, MessageHeader, MessageKind, UNWRITTEN_MARKER, WINDOW_MARKER, split_spatial,
};
use std::collections::HashMap;

/// A region marker event seen in the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionEvent {
    /// `true` for `memgaze_region_begin`, `false` for `memgaze_region_end`.
    pub(crate) begin: bool,
    /// The region (bench) name.
    pub(crate) name: String,
    /// Thread that called the marker.
    pub(crate) thread: u32,
}

/// Counts kept per thread slot (cumulative values from its last message).
#[derive(Clone, Copy, Debug, Default)]
struct SlotCounts {
    executions: u64,
    dropped: u64,
    final_seen: bool,
}

/// A thread's open window in a sampled trace.
#[derive(Debug, Default)]
struct OpenWindow {
    open: bool,
    records: Vec<(u32, u64)>,
}

/// Decodes messages and feeds a sink.
pub(crate) struct Assembler<'a> {
    sink: &'a mut dyn RecordSink,
    /// Which load ids may appear in records (instrumented loads).
    valid_loads: Vec<bool>,
    /// First trace load index of each object (see [`dense_id`]); empty when
    /// only the executable is instrumented.
    objects: Vec<u32>,
    full: bool,
    window: u64,
    threads: HashMap<(u32, u32), u32>,
    slots: HashMap<(u32, u32), SlotCounts>,
    /// Open window per thread id.
    windows: Vec<OpenWindow>,
    current_thread: Option<u32>,
    /// A full trace's records of the current message (reused).
    batch: Vec<(u32, u64)>,
    /// A sampled trace's run of spatial records of one thread.
    spatial_batch: Vec<(u32, u64)>,
    /// The thread whose spatial records the sink takes now, if it does.
    spatial_thread: Option<u32>,
    /// Records handed to the sink (spatial records not included).
    pub(crate) records: u64,
    /// Spatial records handed to the sink.
    pub(crate) spatial_records: u64,
    /// Samples begun in the sink.
    pub(crate) samples: u64,
    /// Records that named an unknown or uninstrumented load.
    pub(crate) invalid_records: u64,
    /// Records claimed but never written (see
    /// [`protocol::UNWRITTEN_MARKER`]): dropped, their executions counted.
    pub(crate) unwritten_records: u64,
    /// Messages that could not be decoded.
    pub(crate) bad_messages: u64,
    /// Processes whose exit hook reported in, with their process-level drops.
    pub(crate) exited: HashMap<u32, u64>,
    /// Processes whose last message so far is `Exec`, with what a
    /// successful `exec` discarded; a later message of the process (the
    /// `exec` failed) takes it out.
    pub(crate) execed: HashMap<u32, u64>,
    /// Region events, in arrival order.
    pub(crate) regions: Vec<RegionEvent>,
    /// Process ids in order of first message.
    pub(crate) processes: Vec<u32>,
    /// Escapes into original code counted per escape site, summed over
    /// processes.
    pub(crate) escapes: HashMap<u32, u64>,
    /// A process that `exec`ed an instrumented program: its pid → the id
    /// the new image's messages are kept under (an image of its own).
    images: HashMap<u32, u32>,
    /// Images given an id of their own so far.
    images_started: u32,
    /// `exec`ed instrumented programs whose messages joined the trace.
    pub(crate) joined_execs: usize,
    /// Connections to the recorder's listening socket refused: not from a
    /// process of the traced program (`listen`).
    pub(crate) refused_connections: u64,
    /// Real process ids of the `Exec` messages not yet handed on (to the
    /// watch that times the exec'd programs, `exec_watch`).
    pub(crate) new_execs: Vec<u32>,
    /// Spawned processes (`Spawn`) not heard from yet.
    spawned: std::collections::HashSet<u32>,
    /// Which program process `pid` runs (given the path its `Start`
    /// named, if any); without it every process is taken to run the traced
    /// one.
    same_program: Option<ProgramCheck<'a>>,
    /// Images whose program is known (from their `Start`), not checked
    /// again at their first records.
    identified: std::collections::HashSet<u32>,
    /// Images running another instrumented program than the traced one:
    /// their load ids are not this trace's, so their records are counted
    /// in `foreign_records`, never filed.
    foreign: std::collections::HashSet<u32>,
    /// Records (and their executions) of `foreign` images.
    pub(crate) foreign_records: u64,
    /// Other programs that joined, by `(device, inode)`: the trace index
    /// of their first load (`None`: their annotation could not be read).
    joined_bases: HashMap<(u64, u64), Option<u32>>,
    /// Trace index of the first load of the program each image of another
    /// program runs (images absent run the traced one: 0).
    pub(crate) image_bases: HashMap<u32, u32>,
    /// Other programs that joined, in order of their loads.
    pub(crate) joined: Vec<super::JoinedProgram>,
    /// Escapes counted by images of joined programs: their site numbers
    /// are their own annotation's, so they are not the trace's escapes.
    pub(crate) joined_escapes: u64,
    /// Each image's `/proc/self/maps` as its `Objects` messages brought it
    /// (parts in order), in order of first part.
    maps: Vec<(u32, Vec<u8>)>,
    /// Whether the traced executable records only inside measured regions
    /// ([`super::Objects::measured_regions`]).
    pub(crate) measured_regions: bool,
}

/// The program a process runs, as [`ProgramCheck`] tells it.
pub(crate) enum Program {
    /// The traced executable.
    Traced,
    /// Another executable: `(device, inode)` and path.
    Other((u64, u64), std::path::PathBuf),
    /// Cannot tell (the process is gone and named no path).
    Unknown,
}

/// See [`Assembler::with_program_check`].
pub(crate) type ProgramCheck<'a> =
    Box<dyn FnMut(u32, bool, Option<&std::path::Path>) -> Program + 'a>;

impl<'a> Assembler<'a> {
    /// An assembler for a trace with `w = window` (`full`: one sample).
    pub(crate) fn new(
        sink: &'a mut dyn RecordSink,
        valid_loads: Vec<bool>,
        full: bool,
        window: u64,
    ) -> Self {
        Assembler {
            sink,
            valid_loads,
            objects: Vec::new(),
            full,
            window,
            threads: HashMap::new(),
            slots: HashMap::new(),
            windows: Vec::new(),
            current_thread: None,
            batch: Vec::new(),
            spatial_batch: Vec::new(),
            spatial_thread: None,
            records: 0,
            spatial_records: 0,
            samples: 0,
            invalid_records: 0,
            unwritten_records: 0,
            bad_messages: 0,
            exited: HashMap::new(),
            execed: HashMap::new(),
            regions: Vec::new(),
            processes: Vec::new(),
            escapes: HashMap::new(),
            images: HashMap::new(),
            images_started: 0,
            joined_execs: 0,
            refused_connections: 0,
            new_execs: Vec::new(),
            spawned: std::collections::HashSet::new(),
            same_program: None,
            identified: std::collections::HashSet::new(),
            foreign: std::collections::HashSet::new(),
            foreign_records: 0,
            joined_bases: HashMap::new(),
            image_bases: HashMap::new(),
            joined: Vec::new(),
            joined_escapes: 0,
            maps: Vec::new(),
            measured_regions: false,
        }
    }

    /// Image `image` runs program `program`: nothing to do for the traced
    /// one; another joins under its program's loads, or is `foreign` (its
    /// records counted as dropped) when the annotation cannot be read or
    /// the sink extended. An unknown program is taken for the traced one
    /// while no other program joined, and is `foreign` after (it could be
    /// either).
    fn file_image(&mut self, image: u32, program: Program) {
        let base = match program {
            Program::Traced => return,
            Program::Unknown if self.joined_bases.is_empty() => return,
            Program::Unknown => None,
            Program::Other(exe, path) => match self.joined_bases.get(&exe) {
                Some(&base) => base,
                None => {
                    let base = self.join_program(path);
                    self.joined_bases.insert(exe, base);
                    base
                }
            },
        };
        match base {
            Some(base) => {
                self.image_bases.insert(image, base);
            }
            None => {
                self.foreign.insert(image);
            }
        }
    }

    /// Appends the loads of the instrumented executable at `path`; the
    /// trace index of its first load.
    fn join_program(&mut self, path: std::path::PathBuf) -> Option<u32> {
        let annotation = memgaze_instrument::rewrite::read_annotation(&path).ok()?;
        let base = self.valid_loads.len();
        let total = base.checked_add(annotation.loads.len())?;
        // Below the markers and the spatial flag.
        if total >= protocol::SPATIAL_FLAG as usize {
            return None;
        }
        let program = super::JoinedProgram {
            path,
            annotation,
            load_base: base as u32,
        };
        if !self.sink.join_program(&program) {
            return None;
        }
        self.valid_loads
            .extend(program.annotation.loads.iter().map(|l| l.instrumented));
        self.joined.push(program);
        Some(base as u32)
    }

    /// Checks each new process image and each new process with `check`
    /// (given whether the process `exec`ed into it and the path its
    /// `Start` named). An image of another
    /// instrumented program joins the trace under loads of its own, read
    /// from the annotation beside the executable, if the sink can take
    /// them ([`RecordSink::join_program`]); else its records are counted
    /// as dropped (its load ids are not this trace's).
    pub(crate) fn with_program_check(mut self, check: ProgramCheck<'a>) -> Self {
        self.same_program = Some(check);
        self
    }

    /// Records of instrumented libraries carry `object << 24 | load`: the
    /// trace's index of the object's first load is `objects[object]`
    /// (object 0, the executable, at 0).
    pub(crate) fn with_objects(mut self, objects: Vec<u32>) -> Self {
        self.objects = objects;
        self
    }

    /// The traced executable records only inside measured regions, so a
    /// run that no region began in recorded nothing.
    pub(crate) fn with_measured_regions(mut self, measured_regions: bool) -> Self {
        self.measured_regions = measured_regions;
        self
    }

    /// Whether a process called a region-begin marker.
    pub(crate) fn region_began(&self) -> bool {
        self.regions.iter().any(|event| event.begin)
    }

    /// The process id behind `image` (an id [`Assembler::image`] gave).
    pub(crate) fn real_pid(&self, image: u32) -> u32 {
        self.images
            .iter()
            .find(|&(_, &i)| i == image)
            .map_or(image, |(&real, _)| real)
    }

    /// The id process `pid`'s messages are kept under: its own, or that of
    /// the last image it `exec`ed into.
    pub(crate) fn image(&self, pid: u32) -> u32 {
        self.images.get(&pid).copied().unwrap_or(pid)
    }

    /// A process image started recording. The first image of a process
    /// needs nothing; one from a process that sent messages before was
    /// `exec`ed by it: the old image ended there (with what the `exec`
    /// discarded), and the new one's slots and threads are its own, under a
    /// fresh id above every pid.
    fn start(&mut self, pid: u32) {
        if !self.processes.contains(&pid) {
            // A spawned program joining (its `Spawn` came first).
            if self.spawned.remove(&pid) {
                self.execed.remove(&pid);
                self.joined_execs += 1;
            }
            return;
        }
        let dropped = self.execed.remove(&pid);
        if let Some(dropped) = dropped {
            self.exited.insert(pid, dropped);
            self.joined_execs += 1;
        }
        let real = self
            .images
            .iter()
            .find(|&(_, &image)| image == pid)
            .map_or(pid, |(&real, _)| real);
        let image = (1 << 31) + self.images_started;
        self.images_started += 1;
        self.images.insert(real, image);
    }

    /// Images found running another program than the traced one.
    pub(crate) fn foreign_images(&self) -> usize {
        self.foreign.len()
    }

    /// A process `pid` was spawned: its program joined already (its
    /// messages came first), or it is counted as an exec'd program (with
    /// nothing discarded) until its `Start` arrives, if ever.
    fn spawn(&mut self, pid: u32) {
        if self.processes.contains(&pid) {
            self.joined_execs += 1;
        } else {
            self.spawned.insert(pid);
            self.execed.insert(pid, 0);
            self.new_execs.push(pid);
        }
    }

    /// Small thread ids in order of first appearance.
    fn thread_id(&mut self, pid: u32, tid: u32) -> u32 {
        let next = self.threads.len() as u32;
        let id = *self.threads.entry((pid, tid)).or_insert(next);
        if self.windows.len() <= id as usize {
            self.windows
                .resize_with(id as usize + 1, OpenWindow::default);
        }
        id
    }

    /// Number of distinct threads (across processes) seen.
    pub(crate) fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Processes one message.
    pub(crate) fn message(&mut self, bytes: &[u8]) -> SinkResult {
        let (mut header, payload) = match MessageHeader::decode(bytes) {
            Ok(decoded) => decoded,
            Err(_) => {
                self.bad_messages += 1;
                return Ok(());
            }
        };
        let real_pid = header.pid;
        header.pid = self.image(header.pid);
        if header.kind == MessageKind::Start {
            self.start(header.pid);
            let image = self.image(real_pid);
            let named = (!payload.is_empty()).then(|| {
                use std::os::unix::ffi::OsStrExt;
                std::path::Path::new(std::ffi::OsStr::from_bytes(payload))
            });
            if let Some(check) = self.same_program.as_mut() {
                // An exec'd image that cannot be checked counts as another
                // program.
                let exec_image = self.images.contains_key(&real_pid);
                let program = match check(real_pid, exec_image, named) {
                    Program::Unknown if exec_image => {
                        self.foreign.insert(image);
                        return Ok(());
                    }
                    program => program,
                };
                self.identified.insert(image);
                self.file_image(image, program);
            }
            return Ok(());
        }
        if header.kind == MessageKind::Spawn {
            self.spawn(header.pid);
            return Ok(());
        }
        if header.kind == MessageKind::Objects {
            if !self.foreign.contains(&header.pid) {
                match self.maps.iter_mut().find(|(pid, _)| *pid == header.pid) {
                    Some((_, maps)) => maps.extend_from_slice(payload),
                    None => self.maps.push((header.pid, payload.to_vec())),
                }
            }
            return Ok(());
        }
        // A spawned program that joined (its `Start` came before the
        // `Spawn`, its other messages after).
        if self.spawned.remove(&header.pid) {
            self.execed.remove(&header.pid);
            self.joined_execs += 1;
        }
        if !self.processes.contains(&header.pid) {
            self.processes.push(header.pid);
            // A forked child that named no program (a `fork` the runtime
            // does not hook) runs its parent's, which may be another.
            if !self.identified.contains(&header.pid)
                && let Some(check) = self.same_program.as_mut()
            {
                let program = check(real_pid, self.images.contains_key(&real_pid), None);
                self.file_image(header.pid, program);
            }
        }
        if header.kind == MessageKind::ProcessExit {
            self.exited.insert(header.pid, header.dropped);
            // Exec attempts before it failed.
            self.execed.remove(&header.pid);
            return Ok(());
        }
        if header.kind == MessageKind::Exec {
            self.execed.insert(header.pid, header.dropped);
            self.new_execs.push(real_pid);
            return Ok(());
        }
        if self.foreign.contains(&header.pid) {
            if matches!(header.kind, MessageKind::Records | MessageKind::Final) {
                self.foreign_records += u64::from(header.count);
            }
            return Ok(());
        }
        let joined_base = self.image_bases.get(&header.pid).copied();
        let base = joined_base.unwrap_or(0);
        if header.kind == MessageKind::Escapes {
            if joined_base.is_some() {
                self.joined_escapes += protocol::records(payload).map(|(_, n)| n).sum::<u64>();
                return Ok(());
            }
            // Counts since the process's previous message of this kind.
            for (site, count) in protocol::records(payload) {
                *self.escapes.entry(site).or_default() += count;
            }
            return Ok(());
        }
        if !self.execed.is_empty() {
            self.execed.remove(&header.pid);
        }
        let counts = self.slots.entry((header.pid, header.slot)).or_default();
        counts.executions = counts.executions.max(header.executions);
        counts.dropped = counts.dropped.max(header.dropped);
        counts.final_seen |= header.kind == MessageKind::Final;
        let thread = self.thread_id(header.pid, header.tid);
        match header.kind {
            MessageKind::Records | MessageKind::Final if self.full => {
                let (kept, invalid, unwritten) = valid_records(
                    payload,
                    &self.valid_loads,
                    (&self.objects, base),
                    &mut self.batch,
                );
                self.invalid_records += invalid;
                self.unwritten_records += unwritten;
                if kept > 0 {
                    self.enter_full_sample(thread)?;
                    self.records += kept as u64;
                    self.sink.push_records(&self.batch[..kept])?;
                }
            }
            MessageKind::Records | MessageKind::Final => {
                for (load, addr) in protocol::records(payload) {
                    let (load, spatial) = split_spatial(load);
                    let load = dense_id(&self.objects, base, load);
                    if spatial {
                        if self.valid_loads.get(load as usize) == Some(&true) {
                            self.spatial(thread, load, addr)?;
                        } else {
                            self.invalid_records += 1;
                        }
                        continue;
                    }
                    self.flush_spatial()?;
                    if load == WINDOW_MARKER {
                        self.close_window(thread)?;
                        self.windows[thread as usize].open = true;
                    } else if self.valid_loads.get(load as usize) == Some(&true) {
                        let window = &mut self.windows[thread as usize];
                        window.open = true;
                        window.records.push((load, addr));
                        if window.records.len() as u64 >= self.window {
                            self.close_window(thread)?;
                        }
                    } else if load == UNWRITTEN_MARKER {
                        self.unwritten_records += 1;
                    } else {
                        self.invalid_records += 1;
                    }
                }
                self.flush_spatial()?;
            }
            MessageKind::RegionBegin | MessageKind::RegionEnd => {
                let begin = header.kind == MessageKind::RegionBegin;
                if !begin && !self.full {
                    self.close_window(thread)?;
                }
                let event = RegionEvent {
                    begin,
                    name: String::from_utf8_lossy(payload).into_owned(),
                    thread,
                };
                self.sink.region(&event)?;
                self.regions.push(event);
            }
            MessageKind::ProcessExit
            | MessageKind::Exec
            | MessageKind::Escapes
            | MessageKind::Start
            | MessageKind::Spawn
            | MessageKind::Objects => unreachable!(),
        }
        Ok(())
    }

    /// Makes `thread` the one whose records continue the single sample of a
    /// full trace.
    fn enter_full_sample(&mut self, thread: u32) -> SinkResult {
        match self.current_thread {
            None => {
                self.sink.begin_sample(thread)?;
                self.samples += 1;
            }
            Some(current) if current != thread => self.sink.switch_thread(thread)?,
            Some(_) => {}
        }
        self.current_thread = Some(thread);
        Ok(())
    }

    /// A spatial record of `thread`: after the thread's open window (which
    /// it follows), batched with the spatial records after it.
    fn spatial(&mut self, thread: u32, load: u32, addr: u64) -> SinkResult {
        if self.spatial_thread != Some(thread) {
            self.flush_spatial()?;
            self.close_window(thread)?;
            self.sink.begin_spatial(thread)?;
            self.spatial_thread = Some(thread);
        }
        self.spatial_batch.push((load, addr));
        Ok(())
    }

    /// Hands the batched spatial records to the sink.
    fn flush_spatial(&mut self) -> SinkResult {
        if !self.spatial_batch.is_empty() {
            self.sink.push_records(&self.spatial_batch)?;
            self.spatial_records += self.spatial_batch.len() as u64;
            self.spatial_batch.clear();
        }
        Ok(())
    }

    /// Hands a thread's open window (if it holds records) to the sink.
    fn close_window(&mut self, thread: u32) -> SinkResult {
        let Some(window) = self.windows.get_mut(thread as usize) else {
            return Ok(());
        };
        window.open = false;
        if window.records.is_empty() {
            return Ok(());
        }
        self.spatial_thread = None;
        self.sink.begin_sample(thread)?;
        self.samples += 1;
        self.sink.push_records(&window.records)?;
        self.records += window.records.len() as u64;
        window.records.clear();
        Ok(())
    }

    /// Emits every window still open (program ended or was killed).
    pub fn finish(&mut self) -> SinkResult {
        self.flush_spatial()?;
        for thread in 0..self.windows.len() as u32 {
            self.close_window(thread)?;
        }
        Ok(())
    }

    /// The files the traced program's processes had mapped executable at
    /// their exit (their `Objects` messages), each once, in order of first
    /// sight: the executable, the dynamic loader and every library,
    /// `dlopen`ed ones included.
    pub(crate) fn loaded_objects(&self) -> Vec<std::path::PathBuf> {
        let mut objects: Vec<std::path::PathBuf> = Vec::new();
        for (_, maps) in &self.maps {
            for path in executable_mappings(maps) {
                if !objects.contains(&path) {
                    objects.push(path);
                }
            }
        }
        objects
    }

    /// Executions counted over all slots of all processes.
    pub(crate) fn executions(&self) -> u64 {
        self.slots.values().map(|c| c.executions).sum()
    }

    /// Records the recorders reported lost (slots and processes), and
    /// records claimed but never written.
    pub(crate) fn dropped(&self) -> u64 {
        self.slots.values().map(|c| c.dropped).sum::<u64>()
            + self.exited.values().sum::<u64>()
            + self.execed.values().sum::<u64>()
            + self.unwritten_records
    }

    /// Whether process `pid` sent everything it recorded: it ran its exit
    /// hook (`exit`, `_exit`), or its last message was `Exec`.
    pub(crate) fn process_ended(&self, pid: u32) -> bool {
        self.exited.contains_key(&pid) || self.execed.contains_key(&pid)
    }

    /// Processes that sent records but neither an exit nor an `Exec`
    /// message: killed, or ended by a path no hook sees (a raw
    /// `exit_group`). Their last buffers are lost, uncounted.
    pub fn unflushed_processes(&self) -> usize {
        self.processes
            .iter()
            .filter(|&&pid| !self.process_ended(pid))
            .count()
    }
}

/// The files of the executable mappings of a `/proc/<pid>/maps` text
/// (`start-end perms offset dev inode path`), in order, with repeats; a
/// mapping of a file since deleted keeps its path without the mark.
fn executable_mappings(maps: &[u8]) -> impl Iterator<Item = std::path::PathBuf> + '_ {
    use std::os::unix::ffi::OsStrExt;
    maps.split(|&b| b == b'\n').filter_map(|line| {
        let mut fields = line.splitn(6, |&b| b == b' ');
        let perms = fields.nth(1)?;
        if perms.get(2) != Some(&b'x') {
            return None;
        }
        let path = fields.nth(3)?.trim_ascii_start();
        let path = path.strip_suffix(b" (deleted)").unwrap_or(path);
        path.starts_with(b"/")
            .then(|| std::path::Path::new(std::ffi::OsStr::from_bytes(path)).to_path_buf())
    })
}

/// Decodes a message's records into `out[..kept]`, leaving out window
/// markers, unwritten records and records of loads that are not in `valid`;
/// returns `(kept, invalid, unwritten)`. Branch-free per record: every
/// record is stored and the next one overwrites it unless it was kept. `out`
/// keeps its largest length between calls, so it is never cleared or
/// refilled.
/// Library records' trace index: `objects[id >> 24] + (id & 0xff_ffff)`
/// (see [`Assembler::with_objects`]); markers and the executable's ids as
/// they are; an unknown object's an id no load has.
fn dense_id(objects: &[u32], base: u32, id: u32) -> u32 {
    const SHIFT: u32 = 24;
    let object = (id >> SHIFT) as usize;
    if id >= UNWRITTEN_MARKER {
        return id;
    }
    if object == 0 {
        // An executable's own load (`base`: where a joined program's loads
        // start in the trace; 0 for the traced executable).
        return base + id;
    }
    if objects.is_empty() {
        return id;
    }
    match objects.get(object) {
        Some(&base) if base != u32::MAX => base + (id & ((1 << SHIFT) - 1)),
        _ => UNKNOWN_LOAD,
    }
}

/// An id no trace load has (below the markers).
const UNKNOWN_LOAD: u32 = UNWRITTEN_MARKER - 1;

fn valid_records(
    payload: &[u8],
    valid: &[bool],
    (objects, base): (&[u32], u32),
    out: &mut Vec<(u32, u64)>,
) -> (usize, u64, u64) {
    let n = payload.len() / protocol::RECORD_BYTES;
    if out.len() < n {
        out.resize(n, (0, 0));
    }
    let out = &mut out[..n];
    let mut kept = 0;
    let mut invalid = 0u64;
    let mut unwritten = 0u64;
    for (load, addr) in protocol::records(payload) {
        let load = dense_id(objects, base, load);
        let ok = valid.get(load as usize).copied().unwrap_or(false);
        // `kept <= ` records seen so far `< n`.
        out[kept.min(n - 1)] = (load, addr);
        kept += usize::from(ok);
        let marker = load == UNWRITTEN_MARKER;
        unwritten += u64::from(marker);
        invalid += u64::from(!ok & (load != WINDOW_MARKER) & !marker);
    }
    (kept, invalid, unwritten)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgaze_trace::protocol::{MessageHeader, MessageKind};

    #[derive(Default)]
    struct Collected {
        samples: Vec<(u32, Vec<(u32, u64)>)>,
        switches: Vec<u32>,
        /// Runs of spatial records, per thread, in order.
        spatial: Vec<(u32, Vec<(u32, u64)>)>,
        in_spatial: bool,
        /// Every record in arrival order: `(thread, load, addr, spatial)`.
        order: Vec<(u32, u32, u64, bool)>,
    }

    impl RecordSink for Collected {
        fn begin_sample(&mut self, thread: u32) -> SinkResult {
            self.samples.push((thread, Vec::new()));
            self.in_spatial = false;
            Ok(())
        }
        fn switch_thread(&mut self, thread: u32) -> SinkResult {
            self.switches.push(thread);
            self.in_spatial = false;
            Ok(())
        }
        fn begin_spatial(&mut self, thread: u32) -> SinkResult {
            self.spatial.push((thread, Vec::new()));
            self.in_spatial = true;
            Ok(())
        }
        fn push(&mut self, load: u32, addr: u64) -> SinkResult {
            let (thread, records) = if self.in_spatial {
                self.spatial.last_mut().unwrap()
            } else {
                self.samples.last_mut().unwrap()
            };
            records.push((load, addr));
            let thread = *thread;
            self.order.push((thread, load, addr, self.in_spatial));
            Ok(())
        }
    }

    #[test]
    fn spatial_records_follow_their_threads_window_and_count_apart() {
        let mut sink = Collected::default();
        let mut asm = Assembler::new(&mut sink, vec![true, true, false], false, 2);
        let (m, s) = (WINDOW_MARKER, protocol::SPATIAL_FLAG);
        // Thread 1: a window, spatial records, an unknown spatial load.
        asm.message(&message(
            MessageKind::Records,
            1,
            10,
            &[(m, 0), (0, 1), (1 | s, 0x40), (s, 0x80), (2 | s, 9)],
        ))
        .unwrap();
        // Thread 2 before thread 1's window is complete in the sink's eyes.
        asm.message(&message(
            MessageKind::Records,
            2,
            5,
            &[(1 | s, 0x100), (m, 0), (0, 7), (1, 8)],
        ))
        .unwrap();
        asm.message(&message(
            MessageKind::Final,
            1,
            20,
            &[(s, 0x88), (m, 1), (1, 4), (0, 5)],
        ))
        .unwrap();
        asm.finish().unwrap();
        assert_eq!((asm.records, asm.spatial_records, asm.samples), (5, 4, 3));
        assert_eq!(asm.invalid_records, 1);
        drop(asm);
        assert_eq!(
            sink.spatial,
            vec![
                (0, vec![(1, 0x40), (0, 0x80)]),
                (1, vec![(1, 0x100)]),
                (0, vec![(0, 0x88)]),
            ]
        );
        // Each thread's records keep their order: the window cut short by
        // a spatial record comes before it.
        let thread0: Vec<_> = sink
            .order
            .iter()
            .filter(|r| r.0 == 0)
            .map(|r| (r.2, r.3))
            .collect();
        assert_eq!(
            thread0,
            [
                (1, false),
                (0x40, true),
                (0x80, true),
                (0x88, true),
                (4, false),
                (5, false)
            ]
        );
    }

    fn message(kind: MessageKind, tid: u32, executions: u64, records: &[(u32, u64)]) -> Vec<u8> {
        let header = MessageHeader {
            kind,
            pid: 100,
            tid,
            executions,
            dropped: 0,
            slot: tid,
            count: records.len() as u32,
        };
        let mut out = header.encode().to_vec();
        for &(load, addr) in records {
            out.extend_from_slice(&load.to_le_bytes());
            out.extend_from_slice(&addr.to_le_bytes());
        }
        out
    }

    /// `Objects` messages carry `/proc/self/maps` in parts cut anywhere
    /// (a line may span two): joined, they give each executable file once,
    /// without anonymous mappings, data mappings or the deletion mark; they
    /// count as no process of their own.
    #[test]
    fn objects_messages_give_the_executable_files_mapped() {
        let maps = b"55d0-55d1 r--p 00000000 08:01 12 /bin/prog\n\
55d1-55d2 r-xp 00001000 08:01 12 /bin/prog\n\
7f00-7f01 r-xp 00000000 08:01 34                         /tmp/a b/libmgsum.so\n\
7f01-7f02 rw-p 00001000 08:01 35 /tmp/libdata.so\n\
7f02-7f03 rw-p 00000000 00:00 0 \n\
7f03-7f04 r-xp 00000000 08:01 36 /tmp/libgone.so (deleted)\n\
7f04-7f05 r-xp 00000000 00:00 0                          [vdso]\n\
7f05-7f06 r-xp 00002000 08:01 34 /tmp/a b/libmgsum.so\n";
        let mut sink = Collected::default();
        let mut asm = Assembler::new(&mut sink, vec![true], true, 1);
        for part in [&maps[..70], &maps[70..200], &maps[200..]] {
            let header = MessageHeader {
                kind: MessageKind::Objects,
                pid: 100,
                tid: 100,
                executions: 0,
                dropped: 0,
                slot: 0,
                count: part.len() as u32,
            };
            let mut bytes = header.encode().to_vec();
            bytes.extend_from_slice(part);
            asm.message(&bytes).unwrap();
        }
        assert_eq!(
            asm.loaded_objects(),
            ["/bin/prog", "/tmp/a b/libmgsum.so", "/tmp/libgone.so"].map(std::path::PathBuf::from)
        );
        assert!(asm.processes.is_empty());
        assert_eq!(asm.bad_messages, 0);
    }

    /// A process image that starts after its process sent an `Exec` is the
    /// program it exec'd: its slot 1 and thread 1 are new ones (the old
    /// image's executions are not overwritten), the exec counts as joined,
    /// not untraced; escape counters of both images add up.
    #[test]
    fn an_exec_d_image_joins_as_an_image_of_its_own() {
        let mut sink = Collected::default();
        let mut asm = Assembler::new(&mut sink, vec![true, true], true, 1);
        asm.message(&message(MessageKind::Start, 1, 0, &[]))
            .unwrap();
        asm.message(&message(MessageKind::Records, 1, 50, &[(0, 1), (1, 2)]))
            .unwrap();
        asm.message(&message(MessageKind::Escapes, 1, 0, &[(0, 3)]))
            .unwrap();
        asm.message(&message(MessageKind::Exec, 1, 0, &[])).unwrap();
        assert_eq!(asm.execed.len(), 1);
        asm.message(&message(MessageKind::Start, 1, 0, &[]))
            .unwrap();
        asm.message(&message(MessageKind::Final, 1, 20, &[(1, 3)]))
            .unwrap();
        asm.message(&message(MessageKind::Escapes, 1, 0, &[(0, 2), (1, 1)]))
            .unwrap();
        asm.message(&message(MessageKind::ProcessExit, 1, 0, &[]))
            .unwrap();
        assert_eq!(asm.executions(), 70);
        assert_eq!(asm.joined_execs, 1);
        assert!(asm.execed.is_empty());
        assert_eq!(asm.threads(), 2);
        assert_eq!(asm.unflushed_processes(), 0);
        assert!(asm.process_ended(asm.image(100)));
        assert_eq!(asm.escapes, HashMap::from([(0, 5), (1, 1)]));
    }

    /// A spawned process (`Spawn`, sent by its parent) joins when its
    /// messages arrive, before or after the `Spawn`; one never heard from
    /// is an untraced exec'd program, to be timed.
    #[test]
    fn spawned_processes_join_or_count_as_untraced() {
        let of = |kind, pid, records: &[(u32, u64)]| {
            let mut bytes = message(kind, pid, records.len() as u64, records);
            bytes[protocol::offsets::PID as usize..][..4].copy_from_slice(&pid.to_le_bytes());
            bytes
        };
        let mut sink = Collected::default();
        let mut asm = Assembler::new(&mut sink, vec![true], true, 1);
        asm.message(&of(MessageKind::Records, 1, &[(0, 1)]))
            .unwrap();
        // Its Start first, its records after the Spawn.
        asm.message(&of(MessageKind::Start, 2, &[])).unwrap();
        asm.message(&of(MessageKind::Spawn, 2, &[])).unwrap();
        asm.message(&of(MessageKind::ProcessExit, 2, &[])).unwrap();
        // The Spawn first.
        asm.message(&of(MessageKind::Spawn, 3, &[])).unwrap();
        asm.message(&of(MessageKind::Start, 3, &[])).unwrap();
        asm.message(&of(MessageKind::ProcessExit, 3, &[])).unwrap();
        // Never heard from.
        asm.message(&of(MessageKind::Spawn, 4, &[])).unwrap();
        asm.message(&of(MessageKind::ProcessExit, 1, &[])).unwrap();
        assert_eq!(asm.joined_execs, 2);
        assert_eq!(asm.execed.keys().copied().collect::<Vec<_>>(), vec![4]);
        assert_eq!(asm.new_execs, vec![2, 3, 4]);
        assert_eq!(asm.unflushed_processes(), 0);
    }

    #[test]
    fn sampled_windows_of_interleaved_threads_stay_whole() {
        let mut sink = Collected::default();
        let mut asm = Assembler::new(&mut sink, vec![true, true, false], false, 3);
        let m = WINDOW_MARKER;
        asm.message(&message(
            MessageKind::Records,
            1,
            10,
            &[(m, 0), (0, 1), (1, 2)],
        ))
        .unwrap();
        asm.message(&message(MessageKind::Records, 2, 5, &[(m, 0), (0, 7)]))
            .unwrap();
        asm.message(&message(
            MessageKind::Records,
            1,
            20,
            &[(0, 3), (m, 1), (0, 4)],
        ))
        .unwrap();
        asm.message(&message(MessageKind::Final, 2, 9, &[(2, 9), (1, 8)]))
            .unwrap();
        asm.finish().unwrap();
        assert_eq!(asm.executions(), 29);
        assert_eq!(asm.invalid_records, 1);
        assert_eq!(asm.records, 6);
        assert_eq!(asm.samples, 3);
        drop(asm);
        assert_eq!(
            sink.samples,
            vec![
                (0, vec![(0, 1), (1, 2), (0, 3)]),
                (0, vec![(0, 4)]),
                (1, vec![(0, 7), (1, 8)]),
            ]
        );
    }

    #[test]
    fn full_trace_is_one_sample_with_thread_switches() {
        let mut sink = Collected::default();
        let mut asm = Assembler::new(&mut sink, vec![true], true, u64::MAX);
        let m = WINDOW_MARKER;
        asm.message(&message(
            MessageKind::Records,
            1,
            2,
            &[(m, 0), (0, 1), (0, 2)],
        ))
        .unwrap();
        asm.message(&message(MessageKind::Records, 2, 1, &[(m, 0), (0, 5)]))
            .unwrap();
        asm.message(&message(MessageKind::Final, 1, 3, &[(0, 3)]))
            .unwrap();
        asm.finish().unwrap();
        assert_eq!((asm.records, asm.samples), (4, 1));
        drop(asm);
        assert_eq!(
            sink.samples,
            vec![(0, vec![(0, 1), (0, 2), (0, 5), (0, 3)])]
        );
        assert_eq!(sink.switches, vec![1, 0]);
    }

    #[test]
    fn full_trace_drops_markers_and_counts_invalid_loads() {
        let mut sink = Collected::default();
        let mut asm = Assembler::new(&mut sink, vec![true, true, false], true, u64::MAX);
        let m = WINDOW_MARKER;
        asm.message(&message(
            MessageKind::Records,
            1,
            6,
            &[(m, 0), (0, 1), (2, 2), (1, 3), (99, 4), (0, 5), (m, 6)],
        ))
        .unwrap();
        // Only invalid records: no sample begun, nothing pushed.
        asm.message(&message(MessageKind::Records, 2, 1, &[(2, 7)]))
            .unwrap();
        // A shorter message after a longer one reuses the batch.
        asm.message(&message(MessageKind::Final, 1, 7, &[(1, 8)]))
            .unwrap();
        asm.finish().unwrap();
        assert_eq!((asm.records, asm.samples, asm.invalid_records), (4, 1, 3));
        drop(asm);
        assert_eq!(
            sink.samples,
            vec![(0, vec![(0, 1), (1, 3), (0, 5), (1, 8)])]
        );
        assert!(sink.switches.is_empty());
    }

    #[test]
    fn unwritten_records_are_dropped_and_counted_in_both_modes() {
        let u = UNWRITTEN_MARKER;
        let m = WINDOW_MARKER;
        for full in [true, false] {
            let mut sink = Collected::default();
            let mut asm = Assembler::new(&mut sink, vec![true, true], full, 4);
            asm.message(&message(
                MessageKind::Records,
                1,
                5,
                &[(m, 0), (0, 1), (u, 0), (1, 3), (u, 0), (7, 4)],
            ))
            .unwrap();
            asm.finish().unwrap();
            assert_eq!(
                (asm.records, asm.unwritten_records, asm.invalid_records),
                (2, 2, 1),
                "full: {full}"
            );
            assert_eq!(asm.dropped(), 2, "full: {full}");
            drop(asm);
            assert_eq!(
                sink.samples,
                vec![(0, vec![(0, 1), (1, 3)])],
                "full: {full}"
            );
        }
    }
}
