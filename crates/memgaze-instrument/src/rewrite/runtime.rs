//! The software recorder runtime: machine code generated into the
//! instrumented executable (no libc, raw system calls only).
//!
//! # Where the state lives
//!
//! - **Per thread, in the TCB.** glibc's `tcbhead_t` has two words no one
//!   uses (`unused_vgetcpu_cache`, at `fs:0x38` and `fs:0x40`), zero in every
//!   new thread. `fs:0x38` is the thread's *countdown* `C`: the number of
//!   instrumented-load executions to let pass before the next slow-path
//!   entry. `fs:0x40` points to the thread's *slot* (below). Per-thread
//!   countdowns make the fast path exact under threads without atomics.
//!   The entry hook checks the slot word is zero in the main thread and
//!   disables recording otherwise (a libc that uses it), then zeroes the
//!   countdown, which instrumented libraries' loads before the entry leave
//!   non-zero ([`super::library`]).
//! - **Config** ([`cfg`](mod@cfg)) in the executable's bss (grown by the rewriter):
//!   descriptor, sampling parameters, the region switch. Inherited by forks.
//! - **Process block** ([`process`]) and **slots** ([`slot`]): anonymous
//!   mappings marked `MADV_WIPEONFORK`, so a forked child sees them zeroed
//!   and starts its own bookkeeping instead of re-sending the parent's
//!   buffered records. A slot holds a thread's counters and a 64 KiB record
//!   buffer that is sent as one `SOCK_SEQPACKET` message.
//!
//! # Entry points (all preserve every register and the flags)
//!
//! - `probe_append` and `probe_append_tracked` (`rdi` = effective address,
//!   `esi` = load id; clobber the flags, so only the slow stubs of
//!   flags-dead probes call them): zero the countdown (which the probe's
//!   `sub`/`jb` wrapped to −1), append a record into the thread's grant
//!   with one `xadd` (see [`slot::CLAIM`]), two pushes and no other saves,
//!   and go on to `record` or `record_tracked` (which return to the caller)
//!   without a slot or a grant. One routine shared by every stub keeps the
//!   stubs as short as a call: the same code inline in each stub was half
//!   of a large executable's copies.
//! - `spatial_append` (`rdi` = effective address, `esi` = load id; clobbers
//!   the flags, so only the stubs of checks where they are dead call it):
//!   appends a spatial record into the thread's open *spatial grant* (see
//!   below) with one `xadd`, two pushes and no other saves, and goes on to
//!   `spatial` (which returns to the caller) without a slot, a grant, or
//!   with the region switch off. One routine shared by every check keeps
//!   the stubs as short as a call: the same code inline in each stub made
//!   a large executable a sixth larger.
//! - `spatial` (`rdi` = effective address, `esi` = load id): called by a
//!   probe's spatial check outside every window when the load's 64-byte
//!   block is tracked (`cfg::SPATIAL_THRESHOLD`) and `spatial_append` could
//!   not append the record (see *spatial grant* below); appends a
//!   spatial record ([`memgaze_trace::protocol::SPATIAL_FLAG`]) while
//!   recording is enabled, counting nothing. `record_tracked` is `record`
//!   for the loads with a spatial check: the one slow-path entry that
//!   records nothing (a thread's first, which picks its random phase)
//!   takes the spatial sample that the check, skipped by the slow path,
//!   did not.
//! - `record` (`rdi` = effective address, `esi` = load id): the slow path,
//!   called by a probe when its thread's countdown is zero. Its hot path
//!   appends a record while the thread holds a *grant* (appends the cold
//!   path allowed: inside an open window, neither its last record nor the
//!   one that fills the buffer), claiming the record with one `xadd` (see
//!   [`slot::CLAIM`]); flags-dead probes make the same claim through
//!   `probe_append`, which goes on here only when it fails. Everything
//!   else (window start and end, flushes, slot creation, forks) goes
//!   through a cold path that saves the flags, takes the grant back and
//!   issues the next one.
//!   Outside every window, while the run takes spatial samples and the
//!   region switch is on, the next one is a *spatial grant* of at most
//!   `SPATIAL_GRANT_RECORDS` (256) records, claimed through its own word
//!   ([`slot::SPATIAL_CLAIM`], so the time probes' claims keep failing
//!   there and reach the cold path): `spatial_append` appends into it,
//!   and its records count no execution when taken back
//!   ([`slot::SPATIAL_GRANT`]). One grant is open at a time, so the
//!   buffer keeps the program's order of time and spatial records.
//! - `entry`: the process entry hook (`e_entry`); parses
//!   [`memgaze_trace::protocol::RECORDER_ENV`] from the initial stack,
//!   validates the socket (or, where the process does not hold it, an
//!   exec'd program, connects anew to [`memgaze_trace::protocol::LISTEN_ENV`]),
//!   marks it close-on-exec, then jumps to the original entry point.
//! - `fini`: the `DT_FINI` hook; folds every thread's unconsumed countdown
//!   into its execution count, flushes every slot, sends `ProcessExit`, then
//!   jumps to the original `DT_FINI` function.
//! - `region_begin` / `region_end`: called at the entry of the harness's
//!   region markers.
//! - `region_samples`: called at the entry of the harness's
//!   `memgaze_region_samples`; sets `rdi` (the function's argument and
//!   result) to the windows every thread opened so far, so `iter` can stop
//!   once its region has the sample target (the argument, returned
//!   unchanged without a recorder, tells the harness none is there).
//! - `exit_now` / `exec_flush`: called by the stubs the rewriter puts in
//!   front of the program's `_exit`-like and `exec`-like imports (see
//!   [`super::process_end`]): a process that ends without `exit` runs no
//!   `DT_FINI`, and its last buffers would be lost without a word.
//!
//! # Counting
//!
//! `executions` of a slot grows by the skip budget a thread consumed (when
//! its countdown reaches zero, or folded at region end and exit) plus one per
//! slow-path entry while recording is enabled. A sample window is `w`
//! consecutive slow-path entries; the skip budget after it is `z ± z/8`
//! (uniform, xorshift64* seeded from `--seed` and the slot's creation index).
//! The first window of a thread starts after a uniform random offset in
//! `[1, w + z]` so samples do not cluster at thread starts.

use iced_x86::code_asm::*;
use iced_x86::{BlockEncoderOptions, Code, Instruction, MemoryOperand, Register};
pub(crate) use memgaze_trace::layout::slot;

mod template;
use memgaze_trace::protocol::{self, MESSAGE_MAGIC, MessageKind, RECORD_BYTES, WINDOW_MARKER};

/// `CLAIM` of a slot whose grant the cold path took back (see
/// [`slot::CLAIM`]): above every user-space address, and failed claims
/// adding [`RECORD_BYTES`] to it never wrap.
pub const CLAIM_REVOKED: u64 = 1 << 62;

/// Most spatial records one spatial grant allows: a grant marks its
/// records unwritten when given, and the one open when a window starts is
/// taken back mostly unused.
pub(crate) const SPATIAL_GRANT_RECORDS: u32 = 256;

/// Offset of the countdown in the thread control block (`fs:0x38`).
pub(crate) const TCB_COUNTDOWN: u64 = 0x38;
/// Offset of the slot pointer in the thread control block (`fs:0x40`).
pub(crate) const TCB_SLOT: u64 = 0x40;

/// log2 of the spatially sampled block (64-byte lines), fixed in the probes.
pub(crate) const SPATIAL_BLOCK_SHIFT: u32 = 6;

/// Countdown that effectively never expires (no collector: recording off).
pub(crate) const COUNTDOWN_NEVER: u64 = 1 << 62;
/// Countdown a thread of a sampled run gets while recording is switched
/// off by a region marker: it re-checks the switch this often (a full
/// trace re-checks at every load, see [`recheck_countdown`]).
pub(crate) const COUNTDOWN_RECHECK: u64 = 4096;

/// Bytes of state the rewriter reserves in the executable's bss.
pub(crate) const STATE_BYTES: u64 = 1280;

/// The config block at the start of the `STATE_BYTES` the rewriter
/// reserves in bss: every word a `u64` the runtime accesses as a qword.
/// Only the generated code reads and writes it; the struct derives the
/// offsets in [`mod@cfg`], so no two fields overlap.
#[repr(C)]
pub struct Config {
    /// 0 before the entry hook ran, `cfg::STATE_DISABLED`,
    /// `cfg::STATE_ACTIVE`.
    pub state: u64,
    /// Socket descriptor.
    pub fd: u64,
    /// Socket inode.
    pub inode: u64,
    /// Socket device.
    pub device: u64,
    /// `w`.
    pub window: u64,
    /// `w + z`.
    pub period: u64,
    /// Jitter seed.
    pub seed: u64,
    /// Pointer to the process block (`ProcessBlock`).
    pub process: u64,
    /// Region switch: 1 while recording is on.
    pub enabled: u64,
    /// Set once a write to the socket failed: nothing more is sent.
    pub broken: u64,
    /// Half-width of the period jitter.
    pub jitter: u64,
    /// 1 for a full trace (`z = 0`).
    pub full: u64,
    /// Address of the shared record chunks (0: none, every message goes
    /// through the socket).
    pub shared: u64,
    /// Number of shared chunks.
    pub(crate) shared_chunks: u64,
    /// The multiplier of the spatial block hash (a multiple of 2^32).
    pub spatial_multiplier: u64,
    /// A load's block `b = addr >> 6` is tracked iff `b · multiplier mod
    /// 2^64` is below it: 0 (spatial sampling off) until the entry hook
    /// found a sampled recording that asks for spatial samples.
    pub spatial_threshold: u64,
    /// The threshold the environment gave, until the entry hook accepts it.
    pub(crate) spatial_pending: u64,
    /// Toggle hooks (divan's `sync_impl`) opened and not yet closed: every
    /// thread of a `threads` bench opens and closes its own.
    pub(crate) open_toggles: u64,
    /// Address of the cold path, where an instrumented library's `record`
    /// forwards (a slot's [`slot::RUNTIME`] points at this block).
    pub(crate) cold_path: u64,
    /// Address of the instrumented libraries' escape counters in the
    /// process block ([`process::library_counters`]); 0 until mapped.
    pub(crate) library_counters: u64,
    /// Per object number, the escape sites of the instrumented library
    /// that registered under it (see [`super::library`]); 0: none. In
    /// bss, so a forked child keeps the list while its counters, in the
    /// process block, start from zero.
    pub(crate) library_sites: [u64; LIBRARY_SLOTS],
}

/// Entries of [`Config::library_sites`]: one per object number, object 0
/// (the executable) unused.
pub(crate) const LIBRARY_SLOTS: usize = super::library::MAX_OBJECT as usize + 1;

/// Offsets of the config block's fields ([`Config`]) and its state values.
pub mod cfg {
    use super::Config;
    use core::mem::offset_of;

    /// Offset of [`Config::state`].
    pub(crate) const STATE: i32 = offset_of!(Config, state) as i32;
    /// Offset of [`Config::fd`].
    pub(crate) const FD: i32 = offset_of!(Config, fd) as i32;
    /// Offset of [`Config::inode`].
    pub(crate) const INODE: i32 = offset_of!(Config, inode) as i32;
    /// Offset of [`Config::device`].
    pub(crate) const DEVICE: i32 = offset_of!(Config, device) as i32;
    /// Offset of [`Config::window`].
    pub const WINDOW: i32 = offset_of!(Config, window) as i32;
    /// Offset of [`Config::period`].
    pub(crate) const PERIOD: i32 = offset_of!(Config, period) as i32;
    /// Offset of [`Config::seed`].
    pub const SEED: i32 = offset_of!(Config, seed) as i32;
    /// Offset of [`Config::process`].
    pub(crate) const PROCESS: i32 = offset_of!(Config, process) as i32;
    /// Offset of [`Config::enabled`].
    pub(crate) const ENABLED: i32 = offset_of!(Config, enabled) as i32;
    /// Offset of [`Config::broken`].
    pub(crate) const BROKEN: i32 = offset_of!(Config, broken) as i32;
    /// Offset of [`Config::jitter`].
    pub(crate) const JITTER: i32 = offset_of!(Config, jitter) as i32;
    /// Offset of [`Config::full`].
    pub const FULL: i32 = offset_of!(Config, full) as i32;
    /// Offset of [`Config::shared`].
    pub(crate) const SHARED: i32 = offset_of!(Config, shared) as i32;
    /// Offset of `Config::shared_chunks`.
    pub const SHARED_CHUNKS: i32 = offset_of!(Config, shared_chunks) as i32;
    /// Offset of [`Config::spatial_multiplier`].
    pub(crate) const SPATIAL_MULTIPLIER: i32 = offset_of!(Config, spatial_multiplier) as i32;
    /// Offset of [`Config::spatial_threshold`].
    pub(crate) const SPATIAL_THRESHOLD: i32 = offset_of!(Config, spatial_threshold) as i32;
    /// Offset of `Config::spatial_pending`.
    pub(crate) const SPATIAL_PENDING: i32 = offset_of!(Config, spatial_pending) as i32;
    /// Offset of `Config::open_toggles`.
    pub(crate) const OPEN_TOGGLES: i32 = offset_of!(Config, open_toggles) as i32;
    /// Offset of `Config::cold_path`.
    pub(crate) const COLD_PATH: i32 = offset_of!(Config, cold_path) as i32;
    /// Offset of `Config::library_counters`.
    pub(crate) const LIBRARY_COUNTERS: i32 = offset_of!(Config, library_counters) as i32;
    /// Offset of `Config::library_sites`.
    pub(crate) const LIBRARY_SITES: i32 = offset_of!(Config, library_sites) as i32;
    /// `STATE` values.
    pub(crate) const STATE_DISABLED: i32 = 1;
    /// `STATE` values.
    pub(crate) const STATE_ACTIVE: i32 = 2;
}

const _: () = assert!(size_of::<Config>() <= STATE_BYTES as usize);

/// Words of the instrumented segment's 64-byte header after its signature.
pub mod header {
    /// Offset of the spatial checks' skip table descriptor, four `u32`s
    /// (offsets from the header): the table, its entries, the first byte
    /// of the first check and the length up to the end of the last. A
    /// table entry is the check's offset (`u32`), its length (`u32`), the
    /// offsets in it of its multiplier's and threshold's immediates (`u8`
    /// each) and that many bytes that replace it (`probe::spatial_skip`).
    /// No entries: nothing to skip or patch.
    pub const SPATIAL_SKIPS: usize = 32;
    /// Offset of the `u32` mask of the CPUID leaf 7 `ebx` feature bits the
    /// copies use (BMI2: bit 8); the entry hook refuses to
    /// run on a CPU without all of them. 0: none (no test).
    pub const CPU_FEATURES: usize = 48;
}

/// BMI2 (`rorx`) in CPUID leaf 7 `ebx`.
pub(crate) const CPUID7_EBX_BMI2: u32 = 1 << 8;

/// The process block: an anonymous mapping of [`process::bytes`], wiped on
/// fork. Every word a `u64`; the struct derives the offsets in [`process`].
#[repr(C)]
pub(crate) struct ProcessBlock {
    /// Process id; 0 means "wiped by fork, re-initialise".
    pub pid: u64,
    /// Head of the slot list.
    pub head: u64,
    /// Next slot serial.
    pub serial: u64,
    /// Records lost at process level (slot creation failed, unflushable slots).
    pub dropped: u64,
    /// Set by the exit hook before it snapshots other threads' slots: their
    /// own flushes then drop instead of sending.
    pub closed: u64,
    /// Set when the exit hook starts (it runs once).
    pub(crate) finishing: u64,
}

/// Offsets of the process block's fields (`ProcessBlock`).
pub mod process {
    use super::ProcessBlock;
    use core::mem::offset_of;

    /// Offset of `ProcessBlock::pid`.
    pub const PID: i32 = offset_of!(ProcessBlock, pid) as i32;
    /// Offset of `ProcessBlock::head`.
    pub const HEAD: i32 = offset_of!(ProcessBlock, head) as i32;
    /// Offset of `ProcessBlock::serial`.
    pub const SERIAL: i32 = offset_of!(ProcessBlock, serial) as i32;
    /// Offset of `ProcessBlock::dropped`.
    pub const DROPPED: i32 = offset_of!(ProcessBlock, dropped) as i32;
    /// Offset of `ProcessBlock::closed`.
    pub(crate) const CLOSED: i32 = offset_of!(ProcessBlock, closed) as i32;
    /// Offset of `ProcessBlock::finishing`.
    pub(crate) const FINISHING: i32 = offset_of!(ProcessBlock, finishing) as i32;
    /// Offset of the first escape counter (one `u64` per escape site,
    /// counted by the copies' escape checks, see
    /// [`super::super::probe::escape_stub`]); the `Escapes` message is built
    /// after the last.
    pub const ESCAPES: i32 = 64;
    /// Most escape sites counted per object (the executable, each
    /// library): their message stays within one shared chunk.
    pub const MAX_ESCAPE_SITES: u32 = 4096;
    /// Bytes of one library's escape counters (see [`library_counters`]).
    pub const LIBRARY_COUNTER_BYTES: i32 = 8 * MAX_ESCAPE_SITES as i32;

    /// Offset of the `Escapes` message with `sites` counters: room for
    /// [`MAX_ESCAPE_SITES`] records, as each object's counters are sent
    /// in a message of their own.
    pub const fn escape_message(sites: u32) -> i32 {
        ESCAPES + 8 * sites as i32
    }

    /// Offset of the instrumented libraries' escape counters in a process
    /// block with `sites` escape counters of the executable's: those of
    /// object `o` (1..=`MAX_OBJECT`) at `(o - 1) ·`
    /// [`LIBRARY_COUNTER_BYTES`] from it. Only the pages of counters that
    /// count are ever touched.
    pub const fn library_counters(sites: u32) -> i32 {
        let message_end = escape_message(sites)
            + memgaze_trace::protocol::HEADER_BYTES as i32
            + MAX_ESCAPE_SITES as i32 * memgaze_trace::protocol::RECORD_BYTES as i32;
        (message_end + 4095) & !4095
    }

    /// Bytes mapped for a process block with `sites` escape counters.
    pub const fn bytes(sites: u32) -> i32 {
        library_counters(sites) + super::super::library::MAX_OBJECT as i32 * LIBRARY_COUNTER_BYTES
    }
}

const _: () = assert!(size_of::<ProcessBlock>() <= process::ESCAPES as usize);
const _: () =
    assert!(process::MAX_ESCAPE_SITES as usize * RECORD_BYTES <= protocol::SHARED_CHUNK_BYTES);

const SYS_CLOSE: i32 = 3;
const SYS_READ: i32 = 0;
const SYS_OPEN: i32 = 2;
const SYS_MUNMAP: i32 = 11;
const SYS_MPROTECT: i32 = 10;
const SYS_FSTAT: i32 = 5;
const SYS_MMAP: i32 = 9;
const SYS_SCHED_YIELD: i32 = 24;
const SYS_FUTEX: i32 = 202;
const SYS_MADVISE: i32 = 28;
const SYS_GETPID: i32 = 39;
const SYS_READLINK: i32 = 89;
const SYS_SENDTO: i32 = 44;
const SYS_FCNTL: i32 = 72;
const SYS_SOCKET: i32 = 41;
const SYS_CONNECT: i32 = 42;
const SYS_GETTID: i32 = 186;
const SYS_PROCESS_VM_READV: i32 = 310;
const MADV_WIPEONFORK: i32 = 18;
const MAP_SHARED: i32 = 1;
const MSG_NOSIGNAL: i32 = 0x4000;
const F_SETFD: i32 = 2;
const FD_CLOEXEC: i32 = 1;
const EINTR: i32 = -4;
const EAGAIN: i32 = -11;
const S_IFMT: u32 = 0o170000;
const S_IFSOCK: u32 = 0o140000;
const AF_UNIX: u32 = 1;
const SOCK_SEQPACKET: u32 = 5;
const SOCK_CLOEXEC: u32 = 0o2000000;

/// Where the runtime is placed and what it chains to.
#[derive(Clone, Copy, Debug)]
pub struct RuntimeParams {
    /// Address the code is assembled for.
    pub code_va: u64,
    /// Address of the instrumented segment's header (see [`header`]).
    pub header_va: u64,
    /// Address of the `STATE_BYTES` state block in bss.
    pub state_va: u64,
    /// Original `e_entry`.
    pub original_entry: u64,
    /// Original `DT_FINI` function, if the binary had one.
    pub original_fini: Option<u64>,
    /// Whether the binary has region markers (recording starts off).
    pub has_regions: bool,
    /// Escape counters in the process block (at most
    /// [`process::MAX_ESCAPE_SITES`]).
    pub escape_sites: u32,
    /// The CPUID leaf 7 `ebx` feature bits the copies use (see
    /// [`header::CPU_FEATURES`]); 0: the entry hook tests none.
    pub cpu_features: u32,
}

/// The assembled runtime and the addresses of its entry points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Runtime {
    /// Machine code, to be placed at `RuntimeParams::code_va`.
    pub code: Vec<u8>,
    /// `RuntimeParams::cpu_features`, for the segment header.
    pub(crate) cpu_features: u32,
    /// A library's escape counter registration (see
    /// [`super::library`]); 0 in the executable's.
    pub(crate) escape_register: u64,
    /// Slow path called by probes.
    pub record: u64,
    /// Its fast path for flags-dead probes: zeroes the countdown and
    /// appends into the open grant, else `record`.
    pub(crate) probe_append: u64,
    /// `probe_append` for loads with a spatial check: else `record_tracked`.
    pub(crate) probe_append_tracked: u64,
    /// Slow path called by probes of loads with a spatial check.
    pub(crate) record_tracked: u64,
    /// Spatial sample of a tracked block outside the windows.
    pub spatial: u64,
    /// Its fast path for checks whose flags are dead: an append into the
    /// open spatial grant, else `spatial`.
    pub(crate) spatial_append: u64,
    /// Process entry hook.
    pub entry: u64,
    /// `DT_FINI` hook.
    pub fini: u64,
    /// `fini`'s work, returning to its caller (the `_exit` stubs).
    pub(crate) exit_now: u64,
    /// Flushes this thread's buffer and sends `Exec` (the `exec` stubs).
    pub(crate) exec_flush: u64,
    /// Before a `fork`: a thread in a skip folds what it consumed and has
    /// its loads counted one by one until `fork` returns (the `fork` stubs).
    pub(crate) before_fork: u64,
    /// After a `fork` (`rax` = what it returned): the parent gets its skip
    /// back; the child's slot is made (the `fork` stubs).
    pub(crate) after_fork: u64,
    /// Before a `posix_spawn`: the socket made inheritable when following
    /// execs (the `posix_spawn` stubs).
    pub(crate) before_spawn: u64,
    /// After a `posix_spawn` (`rax` = its result, `rdi` = its pid pointer):
    /// a `Spawn` message names the new process.
    pub(crate) after_spawn: u64,
    /// Region begin hook.
    pub region_begin: u64,
    /// Region end hook.
    pub region_end: u64,
    /// Unnamed region begin hook (`rsi` = 0 for the name, then
    /// `region_begin`).
    pub(crate) region_begin_unnamed: u64,
    /// Unnamed region end hook.
    pub(crate) region_end_unnamed: u64,
    /// Begin (unnamed) when `sil` is non-zero, else end. Clobbers the
    /// flags, which are dead at a function's entry, where hooks are called.
    pub(crate) region_toggle: u64,
    /// Sets `rdi` to the windows opened so far (the harness's
    /// `memgaze_region_samples`). Clobbers the flags.
    pub(crate) region_samples: u64,
}

/// Entry points of a [`Runtime`], in the order of [`Runtime::entries`].
const ENTRIES: usize = 20;

impl Runtime {
    /// The addresses of every entry point, in declaration order.
    #[cfg(test)]
    fn entries(&self) -> [u64; ENTRIES] {
        [
            self.record,
            self.probe_append,
            self.probe_append_tracked,
            self.record_tracked,
            self.spatial,
            self.spatial_append,
            self.entry,
            self.fini,
            self.exit_now,
            self.exec_flush,
            self.before_fork,
            self.after_fork,
            self.before_spawn,
            self.after_spawn,
            self.region_begin,
            self.region_end,
            self.region_begin_unnamed,
            self.region_end_unnamed,
            self.region_toggle,
            self.region_samples,
        ]
    }

    /// A runtime of `code` with the entry points of [`Runtime::entries`].
    fn with_entries(code: Vec<u8>, cpu_features: u32, entries: [u64; ENTRIES]) -> Runtime {
        let [
            record,
            probe_append,
            probe_append_tracked,
            record_tracked,
            spatial,
            spatial_append,
            entry,
            fini,
            exit_now,
            exec_flush,
            before_fork,
            after_fork,
            before_spawn,
            after_spawn,
            region_begin,
            region_end,
            region_begin_unnamed,
            region_end_unnamed,
            region_toggle,
            region_samples,
        ] = entries;
        Runtime {
            code,
            cpu_features,
            escape_register: 0,
            record,
            probe_append,
            probe_append_tracked,
            record_tracked,
            spatial,
            spatial_append,
            entry,
            fini,
            exit_now,
            exec_flush,
            before_fork,
            after_fork,
            before_spawn,
            after_spawn,
            region_begin,
            region_end,
            region_begin_unnamed,
            region_end_unnamed,
            region_toggle,
            region_samples,
        }
    }

    /// `probe_append` and `probe_append_tracked`, in that order.
    pub(crate) fn probe_appends(&self) -> [u64; 2] {
        [self.probe_append, self.probe_append_tracked]
    }

    /// The runtime entry a function's entry calls for `hook`.
    pub(crate) fn hook_entry(&self, hook: super::Hook) -> u64 {
        use super::Hook;
        match hook {
            Hook::Begin => self.region_begin,
            Hook::End => self.region_end,
            Hook::BeginUnnamed => self.region_begin_unnamed,
            Hook::EndUnnamed => self.region_end_unnamed,
            Hook::Toggle => self.region_toggle,
            Hook::Samples => self.region_samples,
        }
    }
}

/// `lea reg, [rip → target]`.
pub(super) fn lea_rip(reg: Register, target: u64) -> Instruction {
    Instruction::with2(
        Code::Lea_r64_m,
        reg,
        MemoryOperand::with_base_displ(Register::RIP, target as i64),
    )
    .expect("valid lea")
}

/// `jmp target` to an absolute address outside the assembled block.
fn jmp_abs(target: u64) -> Instruction {
    Instruction::with_branch(Code::Jmp_rel32_64, target).expect("valid jmp")
}

type Asm = CodeAssembler;
type R = Result<(), IcedError>;

fn fs(offset: u64) -> AsmMemoryOperand {
    qword_ptr(offset).fs()
}

/// Generates the runtime for the given placement: from the precomputed
/// template of its shape where one fits (the `template` module), else assembled.
pub fn generate(params: &RuntimeParams) -> Result<Runtime, IcedError> {
    match template::instantiate(params) {
        Some(runtime) => Ok(runtime),
        None => assemble(params).map(|(runtime, _)| runtime),
    }
}

/// Assembles the runtime for the given placement: the single source of
/// its machine code (the templates are derived from it). Also returns
/// the offset of every instruction in the code.
fn assemble(params: &RuntimeParams) -> Result<(Runtime, Vec<u32>), IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut l = Labels::new(&mut a);
    // The routines are laid out in this order; the hot path falls through
    // into the cold path, so those two stay adjacent.
    emit_probe_append(&mut a, &mut l.probe_append, l.record)?;
    emit_probe_append(&mut a, &mut l.probe_append_tracked, l.record_tracked)?;
    emit_record_tracked(&mut a, &mut l)?;
    emit_spatial_append(&mut a, &mut l, params)?;
    emit_spatial(&mut a, &mut l, params)?;
    emit_record(&mut a, &mut l)?;
    emit_cold_path(&mut a, &mut l, params)?;
    emit_ensure_process(&mut a, &mut l)?;
    emit_find_slot(&mut a, &mut l)?;
    emit_rand_below(&mut a, &mut l)?;
    emit_next_skip(&mut a, &mut l)?;
    emit_append(&mut a, &mut l)?;
    emit_check_thread(&mut a, &mut l)?;
    emit_check_thread_marker(&mut a, &mut l)?;
    emit_flush(&mut a, &mut l)?;
    emit_send(&mut a, &mut l)?;
    emit_send_retry(&mut a, &mut l)?;
    emit_fold_live(&mut a, &mut l)?;
    emit_send_region(&mut a, &mut l)?;
    emit_region_begin(&mut a, &mut l, params)?;
    emit_region_end(&mut a, &mut l, params)?;
    emit_unnamed_regions(&mut a, &mut l, params)?;
    emit_region_samples(&mut a, &mut l, params)?;
    emit_fini(&mut a, &mut l, params)?;
    emit_process_end(&mut a, &mut l, params, ProcessEnd::Exit)?;
    emit_process_end(&mut a, &mut l, params, ProcessEnd::Exec)?;
    emit_before_fork(&mut a, &mut l, params)?;
    emit_after_fork(&mut a, &mut l, params)?;
    emit_spawn_hooks(&mut a, &mut l, params)?;
    emit_process_message(&mut a, &mut l)?;
    emit_start_message(&mut a, &mut l)?;
    emit_objects_message(&mut a, &mut l)?;
    emit_send_escapes(&mut a, &mut l, params)?;
    emit_entry(&mut a, &mut l, params)?;
    emit_parse_u64(&mut a, &mut l)?;
    emit_shared_setup(&mut a, &mut l)?;
    emit_reconnect(&mut a, &mut l)?;
    emit_env_prefixes(&mut a, &mut l)?;

    let mut result = a.assemble_options(
        params.code_va,
        BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )?;
    let runtime = Runtime {
        record: result.label_ip(&l.record)?,
        probe_append: result.label_ip(&l.probe_append)?,
        probe_append_tracked: result.label_ip(&l.probe_append_tracked)?,
        record_tracked: result.label_ip(&l.record_tracked)?,
        spatial: result.label_ip(&l.spatial)?,
        spatial_append: result.label_ip(&l.spatial_append)?,
        entry: result.label_ip(&l.entry)?,
        fini: result.label_ip(&l.fini)?,
        exit_now: result.label_ip(&l.exit_now)?,
        exec_flush: result.label_ip(&l.exec_flush)?,
        before_fork: result.label_ip(&l.before_fork)?,
        after_fork: result.label_ip(&l.after_fork)?,
        before_spawn: result.label_ip(&l.before_spawn)?,
        after_spawn: result.label_ip(&l.after_spawn)?,
        region_begin: result.label_ip(&l.region_begin)?,
        region_end: result.label_ip(&l.region_end)?,
        region_begin_unnamed: result.label_ip(&l.region_begin_unnamed)?,
        region_end_unnamed: result.label_ip(&l.region_end_unnamed)?,
        region_toggle: result.label_ip(&l.region_toggle)?,
        region_samples: result.label_ip(&l.region_samples)?,
        escape_register: 0,
        code: std::mem::take(&mut result.inner.code_buffer),
        cpu_features: params.cpu_features,
    };
    Ok((runtime, result.inner.new_instruction_offsets))
}

/// The entry hook's first step in a copy that uses CPU features beyond
/// x86-64's baseline: where CPUID leaf 7 `ebx` lacks any bit of the
/// header's [`header::CPU_FEATURES`] mask, it writes one line to stderr
/// and exits with status 1, before anything of the program runs; else it
/// goes on with every register as it found it (`rdx` is the loader's
/// finaliser). Why: such a copy would otherwise die of SIGILL in its
/// first spatial check, and an instrumented copy run alone must behave
/// like the original.
fn refuse_missing_cpu_features(a: &mut Asm, params: &RuntimeParams) -> R {
    const SYS_WRITE: i32 = 1;
    const SYS_EXIT_GROUP: i32 = 231;
    const MESSAGE: &[u8] = b"error: this instrumented copy needs BMI2, which this CPU lacks: instrument the program again on this machine\n";
    let mut refuse = a.create_label();
    let mut message = a.create_label();
    let mut done = a.create_label();
    for r in [rax, rbx, rcx, rdx] {
        a.push(r)?;
    }
    a.xor(eax, eax)?;
    a.cpuid()?;
    a.cmp(eax, 7)?;
    a.jb(refuse)?;
    a.mov(eax, 7)?;
    a.xor(ecx, ecx)?;
    a.cpuid()?;
    a.add_instruction(lea_rip(
        Register::RAX,
        params.header_va + header::CPU_FEATURES as u64,
    ))?;
    a.mov(eax, dword_ptr(rax))?;
    a.and(ebx, eax)?;
    a.cmp(ebx, eax)?;
    a.jne(refuse)?;
    for r in [rdx, rcx, rbx, rax] {
        a.pop(r)?;
    }
    a.jmp(done)?;
    a.set_label(&mut refuse)?;
    a.mov(eax, SYS_WRITE)?;
    a.mov(edi, 2)?;
    a.lea(rsi, ptr(message))?;
    a.mov(edx, MESSAGE.len() as u32)?;
    a.syscall()?;
    a.mov(eax, SYS_EXIT_GROUP)?;
    a.mov(edi, 1)?;
    a.syscall()?;
    a.set_label(&mut message)?;
    a.db(MESSAGE)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// Finds the environment entry `name=` from `rbx` (a pointer into envp)
/// on: leaves `rsi` just after the `=` and `rbx` at the next entry, or
/// jumps to `not_found` at the end of envp. `prefix` labels the bytes of
/// [`env_prefix`]`(name)`. Clobbers rax, rcx, rdi.
fn find_env(a: &mut Asm, prefix: CodeLabel, name: &str, not_found: CodeLabel) -> R {
    let mut next = a.create_label();
    let mut compare = a.create_label();
    a.set_label(&mut next)?;
    a.mov(rsi, qword_ptr(rbx))?;
    a.test(rsi, rsi)?;
    a.jz(not_found)?;
    a.add(rbx, 8)?;
    a.lea(rdi, ptr(prefix))?;
    a.mov(ecx, env_prefix(name).len() as u32)?;
    a.set_label(&mut compare)?;
    a.mov(al, byte_ptr(rsi))?;
    a.cmp(al, byte_ptr(rdi))?;
    a.jne(next)?;
    a.inc(rsi)?;
    a.inc(rdi)?;
    a.dec(ecx)?;
    a.jnz(compare)?;
    Ok(())
}

/// The string the entry hook looks for in the environment: `NAME=`.
fn env_prefix(name: &str) -> String {
    format!("{name}=")
}

// The routines below follow one register convention: rbx = slot, r12 =
// config, r13 = process block, r14/r15 and rbp preserved; rax, rcx, rdx,
// rsi, rdi, r8–r11 scratch.

/// Hot path: claim a record of the thread's grant (see `slot::CLAIM`)
/// and write it. The flags are kept in ax (`seto al; lahf`, restored by
/// `add al, 0x7f; sahf`), cheaper than `pushfq`/`popfq`. Everything
/// else goes through the cold path.
fn emit_record(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.record)?;
    let to_cold = l.to_cold_entry;
    record_hot_path(a, to_cold)?;
    a.set_label(&mut l.to_cold_entry)?;
    a.add(al, 0x7f)?;
    a.sahf()?;
    Ok(())
}

/// `record` for loads with a spatial check: the same hot path; its cold
/// entry sets rbp (saved) to say the load may be spatially sampled.
fn emit_record_tracked(a: &mut Asm, l: &mut Labels) -> R {
    let mut to_cold = a.create_label();
    a.set_label(&mut l.record_tracked)?;
    record_hot_path(a, to_cold)?;
    a.set_label(&mut to_cold)?;
    a.add(al, 0x7f)?;
    a.sahf()?;
    save_rest(a)?;
    a.mov(ebp, 1)?;
    a.jmp(l.cold_saved)
}

/// The hot path of `record`, branching to `to_cold` (with the flags in ax)
/// for everything else.
pub(super) fn record_hot_path(a: &mut Asm, to_cold: CodeLabel) -> R {
    record_hot_path_then(a, to_cold, |_| Ok(()))
}

/// [`record_hot_path`] with `appended` run after a successful append, before
/// the flags are restored (`rbx` = the slot, `rcx` free, flags free).
pub(super) fn record_hot_path_then(
    a: &mut Asm,
    to_cold: CodeLabel,
    appended: impl FnOnce(&mut Asm) -> R,
) -> R {
    a.push(rax)?;
    a.push(rcx)?;
    a.push(rbx)?;
    a.seto(al)?;
    a.lahf()?;
    claim_record(a, rbx, (rcx, ecx), slot::CLAIM, to_cold)?;
    a.mov(qword_ptr(rcx + 4), rdi)?;
    a.mov(dword_ptr(rcx), esi)?;
    appended(a)?;
    a.add(al, 0x7f)?;
    a.sahf()?;
    a.pop(rbx)?;
    a.pop(rcx)?;
    a.pop(rax)?;
    a.ret()
}

/// `probe_append` at `entry` (`rdi` = address, `esi` = load id, the flags
/// clobbered): zeroes the countdown, claims a record of the thread's grant
/// with one `xadd` on [`slot::CLAIM`] and writes the address, then the id
/// (the writer's last store: see [`slot::CLAIM`]); without a slot or a
/// grant it goes on to `record` with every register as it found it, whose
/// cold path issues the next grant. Libraries' runtimes have one too.
pub(super) fn emit_probe_append(a: &mut Asm, entry: &mut CodeLabel, record: CodeLabel) -> R {
    let mut fail = a.create_label();
    a.set_label(entry)?;
    a.mov(fs(TCB_COUNTDOWN), 0)?;
    a.push(rcx)?;
    a.push(rdx)?;
    claim_record(a, rcx, (rdx, edx), slot::CLAIM, fail)?;
    a.mov(qword_ptr(rdx + 4), rdi)?;
    a.mov(dword_ptr(rdx), esi)?;
    a.pop(rdx)?;
    a.pop(rcx)?;
    a.ret()?;
    a.set_label(&mut fail)?;
    a.pop(rdx)?;
    a.pop(rcx)?;
    a.jmp(record)
}

/// `slot_reg` = the thread's slot and `claim` = a record of its open grant
/// claimed with one `xadd` on the word at `claim_word` (`slot::CLAIM` or
/// `slot::SPATIAL_CLAIM`); to `fail` without a slot, or past the grant's
/// limit. Clobbers the flags.
fn claim_record(
    a: &mut Asm,
    slot_reg: AsmRegister64,
    (claim, claim32): (AsmRegister64, AsmRegister32),
    claim_word: i32,
    fail: CodeLabel,
) -> R {
    a.mov(slot_reg, fs(TCB_SLOT))?;
    a.test(slot_reg, slot_reg)?;
    a.jz(fail)?;
    a.mov(claim32, RECORD_BYTES as u32)?;
    a.xadd(qword_ptr(slot_reg + claim_word), claim)?;
    a.cmp(claim, qword_ptr(slot_reg + slot::LIMIT))?;
    a.jae(fail)
}

/// `spatial_append` (`rdi` = address, `esi` = load id, the flags
/// clobbered): while the region switch is on, claims a record of the
/// thread's spatial grant with one `xadd` on [`slot::SPATIAL_CLAIM`] and
/// writes the address, then the id with the spatial flag (the writer's
/// last store: see [`slot::CLAIM`]); otherwise (switched off, no slot, no
/// grant) it goes on to `spatial` with every register as it found it,
/// whose cold path issues the next grant.
fn emit_spatial_append(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    let mut slow = a.create_label();
    a.set_label(&mut l.spatial_append)?;
    a.push(rcx)?;
    a.push(rdx)?;
    a.add_instruction(
        Instruction::with2(
            Code::Cmp_rm64_imm8,
            MemoryOperand::with_base_displ(
                Register::RIP,
                (params.state_va + cfg::ENABLED as u64) as i64,
            ),
            0,
        )
        .expect("valid cmp"),
    )?;
    a.je(slow)?;
    claim_record(a, rcx, (rdx, edx), slot::SPATIAL_CLAIM, slow)?;
    a.mov(qword_ptr(rdx + 4), rdi)?;
    a.or(esi, protocol::SPATIAL_FLAG)?;
    a.mov(dword_ptr(rdx), esi)?;
    a.pop(rdx)?;
    a.pop(rcx)?;
    a.ret()?;
    a.set_label(&mut slow)?;
    a.pop(rdx)?;
    a.pop(rcx)?;
    a.jmp(l.spatial)
}

/// `spatial` (`rdi` = address, `esi` = load id): appends a spatial record
/// while recording is enabled. Outside every window (the probes call it
/// only there, when their stub found no spatial grant to claim from or
/// the flags live): it takes back the grant, appends, and gives the next
/// spatial grant, as every append of a cold path does. Counts no
/// execution.
fn emit_spatial(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    let mut done = a.create_label();
    let mut busy = a.create_label();
    let mut interrupted = a.create_label();
    a.set_label(&mut l.spatial)?;
    a.push(rax)?;
    a.push(rcx)?;
    a.push(rbx)?;
    save_rest(a)?;
    a.add_instruction(lea_rip(Register::R12, params.state_va))?;
    a.mov(r14, rdi)?;
    a.mov(r15, rsi)?;
    a.cmp(qword_ptr(r12 + cfg::STATE), cfg::STATE_ACTIVE)?;
    a.jne(done)?;
    a.cmp(qword_ptr(r12 + cfg::ENABLED), 0)?;
    a.je(done)?;
    // The config decides: a check left with the default rate's immediates
    // (see `skip_spatial_checks`) may call where the run tracks nothing.
    a.mov(rax, r14)?;
    a.shr(rax, SPATIAL_BLOCK_SHIFT)?;
    a.imul_2(rax, qword_ptr(r12 + cfg::SPATIAL_MULTIPLIER))?;
    a.cmp(rax, qword_ptr(r12 + cfg::SPATIAL_THRESHOLD))?;
    a.jae(done)?;
    a.call(l.ensure_process)?;
    a.call(l.find_slot)?;
    a.test(rbx, rbx)?;
    a.jz(done)?;
    a.cmp(qword_ptr(rbx + slot::BUSY), 0)?;
    a.jne(busy)?;
    enter_cold(a)?;
    take_grant(a, Some(interrupted))?;
    append_spatial(a, l)?;
    give_grant(a)?;
    leave_cold(a)?;
    a.jmp(done)?;
    // A signal handler interrupted the runtime (or a hot path between its
    // claim and its write): the spatial record is lost, and counted.
    a.set_label(&mut interrupted)?;
    a.inc(qword_ptr(rbx + slot::DROPPED))?;
    leave_cold(a)?;
    a.jmp(done)?;
    a.set_label(&mut busy)?;
    a.inc(qword_ptr(rbx + slot::DROPPED))?;
    a.set_label(&mut done)?;
    restore_rest(a)?;
    a.pop(rbx)?;
    a.pop(rcx)?;
    a.pop(rax)?;
    a.ret()
}

/// Appends the spatial record of load r15d at address r14 (inside a cold
/// path, grant taken).
fn append_spatial(a: &mut Asm, l: &mut Labels) -> R {
    a.mov(edi, r15d)?;
    a.or(edi, protocol::SPATIAL_FLAG)?;
    a.mov(rsi, r14)?;
    a.call(l.append)
}

/// Cold paths: save the flags and every other register.
fn emit_cold_path(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    a.set_label(&mut l.cold_entry)?;
    save_rest(a)?;
    a.xor(ebp, ebp)?;
    a.set_label(&mut l.cold_saved)?;
    a.add_instruction(lea_rip(Register::R12, params.state_va))?;
    a.mov(r14, rdi)?;
    a.mov(r15, rsi)?;
    a.cmp(qword_ptr(r12 + cfg::STATE), cfg::STATE_ACTIVE)?;
    a.je(l.cold_active)?;
    a.cmp(qword_ptr(r12 + cfg::STATE), cfg::STATE_DISABLED)?;
    a.jne(l.cold_return)?; // before the entry hook: stay at zero, try again later
    a.mov(rax, COUNTDOWN_NEVER)?;
    a.mov(fs(TCB_COUNTDOWN), rax)?;
    a.jmp(l.cold_return)?;
    a.set_label(&mut l.cold_active)?;
    a.call(l.ensure_process)?;
    a.call(l.find_slot)?;
    a.test(rbx, rbx)?;
    a.jz(l.cold_return)?;
    a.cmp(qword_ptr(rbx + slot::BUSY), 0)?;
    a.jne(l.cold_nested)?;
    enter_cold(a)?;
    a.jmp(l.cold_body)?;
    a.set_label(&mut l.cold_nested)?;
    a.inc(qword_ptr(rbx + slot::NESTED))?;
    a.jmp(l.cold_return)?;

    a.set_label(&mut l.cold_body)?;
    take_grant(a, Some(l.cold_interrupted))?;
    // Fold the consumed skip budget.
    a.mov(rax, qword_ptr(rbx + slot::BUDGET))?;
    a.add(qword_ptr(rbx + slot::EXECUTIONS), rax)?;
    a.mov(qword_ptr(rbx + slot::BUDGET), 0)?;
    a.cmp(qword_ptr(rbx + slot::FORKING), 0)?;
    a.jne(l.cold_forking)?;
    a.cmp(qword_ptr(r12 + cfg::ENABLED), 0)?;
    a.jne(l.cold_enabled)?;
    // Switched off by a region marker: close the window, re-check later.
    a.mov(qword_ptr(rbx + slot::REMAINING), 0)?;
    a.mov(qword_ptr(rbx + slot::STARTED), 0)?;
    recheck_countdown(a)?;
    a.jmp(l.cold_release)?;
    a.set_label(&mut l.cold_enabled)?;
    // Loads run since a region began, before this thread noticed (see
    // `unaware_at_begin`): executions to count; in a full trace also
    // records lost.
    let mut unaware_done = a.create_label();
    a.mov(rax, qword_ptr(rbx + slot::UNAWARE))?;
    a.add(qword_ptr(rbx + slot::EXECUTIONS), rax)?;
    a.cmp(qword_ptr(r12 + cfg::FULL), 0)?;
    a.je(unaware_done)?;
    a.add(qword_ptr(rbx + slot::DROPPED), rax)?;
    a.set_label(&mut unaware_done)?;
    a.mov(qword_ptr(rbx + slot::UNAWARE), 0)?;
    a.inc(qword_ptr(rbx + slot::EXECUTIONS))?;
    a.cmp(qword_ptr(rbx + slot::REMAINING), 0)?;
    a.jne(l.cold_record)?;
    a.cmp(qword_ptr(r12 + cfg::FULL), 0)?;
    a.jne(l.cold_open_window)?;
    a.cmp(qword_ptr(rbx + slot::STARTED), 0)?;
    a.jne(l.cold_open_window)?;
    // First entry since the thread (or region) started: random phase. The
    // probe skipped its spatial check to come here: take the sample.
    let mut phase = a.create_label();
    a.test(ebp, ebp)?;
    a.jz(phase)?;
    a.mov(rax, r14)?;
    a.shr(rax, SPATIAL_BLOCK_SHIFT)?;
    a.imul_2(rax, qword_ptr(r12 + cfg::SPATIAL_MULTIPLIER))?;
    a.cmp(rax, qword_ptr(r12 + cfg::SPATIAL_THRESHOLD))?;
    a.jae(phase)?;
    append_spatial(a, l)?;
    a.set_label(&mut phase)?;
    a.mov(qword_ptr(rbx + slot::STARTED), 1)?;
    a.mov(rdi, qword_ptr(r12 + cfg::PERIOD))?;
    a.call(l.rand_below)?;
    a.mov(qword_ptr(rbx + slot::BUDGET), rax)?;
    a.mov(fs(TCB_COUNTDOWN), rax)?;
    a.jmp(l.cold_release)?;
    a.set_label(&mut l.cold_open_window)?;
    a.call(l.check_thread)?;
    a.mov(rax, qword_ptr(r12 + cfg::WINDOW))?;
    a.cmp(qword_ptr(r12 + cfg::FULL), 0)?;
    a.je(l.window_sized)?;
    a.mov(rax, -1i64)?;
    a.set_label(&mut l.window_sized)?;
    a.mov(qword_ptr(rbx + slot::REMAINING), rax)?;
    a.mov(edi, WINDOW_MARKER)?;
    a.mov(rsi, qword_ptr(rbx + slot::WINDOWS))?;
    a.inc(qword_ptr(rbx + slot::WINDOWS))?;
    a.call(l.append)?;
    a.set_label(&mut l.cold_record)?;
    a.mov(edi, r15d)?;
    a.mov(rsi, r14)?;
    a.call(l.append)?;
    a.dec(qword_ptr(rbx + slot::REMAINING))?;
    // fall through into the checks shared with the hot path

    a.set_label(&mut l.cold_after_saved)?;
    a.cmp(qword_ptr(rbx + slot::REMAINING), 0)?;
    a.jne(l.cold_check_full)?;
    // Window complete: issue the skip budget. The buffer is sent when full
    // (every few windows): a send per window would cost more than the
    // window's records.
    a.call(l.next_skip)?;
    a.mov(qword_ptr(rbx + slot::BUDGET), rax)?;
    a.mov(fs(TCB_COUNTDOWN), rax)?;
    a.set_label(&mut l.cold_check_full)?;
    a.cmp(qword_ptr(rbx + slot::COUNT), slot::CAPACITY)?;
    a.jb(l.cold_release)?;
    a.mov(edi, MessageKind::Records as u32)?;
    a.call(l.flush)?;
    a.cmp(qword_ptr(r12 + cfg::FULL), 0)?;
    a.je(l.cold_release)?;
    // A full trace has one endless window per thread: re-check who owns the
    // slot at every flush (a dead thread's TCB can be reused by a new one).
    a.call(l.check_thread_marker)?;

    a.set_label(&mut l.cold_release)?;
    give_grant(a)?;
    a.set_label(&mut l.cold_leave)?;
    leave_cold(a)?;
    a.set_label(&mut l.cold_return)?;
    restore_rest(a)?;
    a.pop(rbx)?;
    a.pop(rcx)?;
    a.pop(rax)?;
    a.ret()?;
    // Inside `fork` out of a skip (see `emit_before_fork`): count the load
    // and keep the countdown at zero, no window.
    a.set_label(&mut l.cold_forking)?;
    a.inc(qword_ptr(rbx + slot::EXECUTIONS))?;
    a.mov(fs(TCB_COUNTDOWN), 0)?;
    a.jmp(l.cold_release)?;
    // A signal handler interrupted a hot path between its claim and its
    // write: count this execution as dropped and leave everything as it
    // is until the interrupted writer has run on.
    a.set_label(&mut l.cold_interrupted)?;
    a.inc(qword_ptr(rbx + slot::NESTED))?;
    a.jmp(l.cold_leave)?;
    Ok(())
}

/// ensure_process: r13 = process block, re-initialised after a fork.
fn emit_ensure_process(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.ensure_process)?;
    a.mov(r13, qword_ptr(r12 + cfg::PROCESS))?;
    a.cmp(qword_ptr(r13 + process::PID), 0)?;
    a.jne(l.ensure_done)?;
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.mov(qword_ptr(r13 + process::PID), rax)?;
    a.set_label(&mut l.ensure_done)?;
    a.ret()?;
    Ok(())
}

/// find_slot: rbx = this thread's slot, created if needed (re-initialised
/// in place if a fork wiped it); 0 on failure.
fn emit_find_slot(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.find_slot)?;
    a.mov(rbx, fs(TCB_SLOT))?;
    a.test(rbx, rbx)?;
    a.jz(l.new_slot)?;
    a.cmp(qword_ptr(rbx + slot::MAGIC), slot::MAGIC_VALUE)?;
    a.jne(l.init_slot)?;
    a.ret()?;
    a.set_label(&mut l.new_slot)?;
    map_anonymous(a, slot::BYTES)?;
    a.cmp(rax, -4095)?;
    a.jae(l.new_slot_failed)?;
    a.mov(rbx, rax)?;
    a.set_label(&mut l.init_slot)?;
    a.mov(eax, SYS_MADVISE)?;
    a.mov(rdi, rbx)?;
    a.mov(esi, slot::BYTES)?;
    a.mov(edx, MADV_WIPEONFORK)?;
    a.syscall()?;
    a.mov(qword_ptr(rbx + slot::MAGIC), slot::MAGIC_VALUE)?;
    a.lea(rax, ptr(l.to_cold_entry))?;
    a.mov(qword_ptr(r12 + cfg::COLD_PATH), rax)?;
    a.mov(qword_ptr(rbx + slot::RUNTIME), r12)?;
    a.mov(rax, fs(0))?;
    a.mov(qword_ptr(rbx + slot::TCB), rax)?;
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    a.mov(qword_ptr(rbx + slot::TID), rax)?;
    a.mov(eax, 1)?;
    a.lock().xadd(qword_ptr(r13 + process::SERIAL), rax)?;
    a.mov(qword_ptr(rbx + slot::SERIAL), rax)?;
    // rng = splitmix64(seed + serial·φ), never zero.
    a.mov(rcx, 0x9e37_79b9_7f4a_7c15u64)?;
    a.imul_2(rax, rcx)?;
    a.add(rax, qword_ptr(r12 + cfg::SEED))?;
    a.mov(rdx, rax)?;
    a.shr(rdx, 30)?;
    a.xor(rax, rdx)?;
    a.mov(rcx, 0xbf58_476d_1ce4_e5b9u64)?;
    a.imul_2(rax, rcx)?;
    a.mov(rdx, rax)?;
    a.shr(rdx, 27)?;
    a.xor(rax, rdx)?;
    a.or(rax, 1)?;
    a.mov(qword_ptr(rbx + slot::RNG), rax)?;
    a.set_label(&mut l.register_loop)?;
    a.mov(rax, qword_ptr(r13 + process::HEAD))?;
    a.mov(qword_ptr(rbx + slot::NEXT), rax)?;
    a.lock().cmpxchg(qword_ptr(r13 + process::HEAD), rbx)?;
    a.jne(l.register_loop)?;
    a.mov(fs(TCB_SLOT), rbx)?;
    a.ret()?;
    a.set_label(&mut l.new_slot_failed)?;
    a.lock().inc(qword_ptr(r13 + process::DROPPED))?;
    a.mov(rax, COUNTDOWN_NEVER)?;
    a.mov(fs(TCB_COUNTDOWN), rax)?;
    a.xor(ebx, ebx)?;
    a.ret()?;
    Ok(())
}

/// rand_below(rdi = n > 0) -> rax uniform in [0, n).
fn emit_rand_below(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.rand_below)?;
    a.mov(rax, qword_ptr(rbx + slot::RNG))?;
    a.mov(rdx, rax)?;
    a.shr(rdx, 12)?;
    a.xor(rax, rdx)?;
    a.mov(rdx, rax)?;
    a.shl(rdx, 25)?;
    a.xor(rax, rdx)?;
    a.mov(rdx, rax)?;
    a.shr(rdx, 27)?;
    a.xor(rax, rdx)?;
    a.mov(qword_ptr(rbx + slot::RNG), rax)?;
    a.mov(rcx, 0x2545_f491_4f6c_dd1du64)?;
    a.imul_2(rax, rcx)?;
    a.mul(rdi)?; // rdx = ⌊rax·n / 2^64⌋
    a.mov(rax, rdx)?;
    a.ret()?;
    Ok(())
}

/// next_skip -> rax = z − J + rand_below(2J + 1), J = cfg.JITTER.
fn emit_next_skip(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.next_skip)?;
    a.mov(rdi, qword_ptr(r12 + cfg::JITTER))?;
    a.lea(rdi, qword_ptr(rdi + rdi * 1 + 1))?;
    a.call(l.rand_below)?;
    a.add(rax, qword_ptr(r12 + cfg::PERIOD))?;
    a.sub(rax, qword_ptr(r12 + cfg::WINDOW))?;
    a.sub(rax, qword_ptr(r12 + cfg::JITTER))?;
    a.ret()?;
    Ok(())
}

/// append(edi = id, rsi = address): flushes first when the buffer is full.
fn emit_append(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.append)?;
    a.mov(rcx, qword_ptr(rbx + slot::COUNT))?;
    a.cmp(rcx, slot::CAPACITY)?;
    a.jb(l.append_room)?;
    a.push(rdi)?;
    a.push(rsi)?;
    a.mov(edi, MessageKind::Records as u32)?;
    a.call(l.flush)?;
    a.pop(rsi)?;
    a.pop(rdi)?;
    a.xor(ecx, ecx)?;
    a.set_label(&mut l.append_room)?;
    a.lea(rax, qword_ptr(rcx + rcx * 2))?;
    a.mov(dword_ptr(rbx + rax * 4 + slot::RECORDS), edi)?;
    a.mov(qword_ptr(rbx + rax * 4 + (slot::RECORDS + 4)), rsi)?;
    a.inc(rcx)?;
    a.mov(qword_ptr(rbx + slot::COUNT), rcx)?;
    a.ret()?;
    Ok(())
}

/// check_thread: if another thread now owns this TCB (and so this slot),
/// send the buffered records under the old owner and adopt the new one.
fn emit_check_thread(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.check_thread)?;
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    a.cmp(rax, qword_ptr(rbx + slot::TID))?;
    a.je(l.check_thread_done)?;
    a.push(rax)?;
    a.push(rax)?;
    a.mov(edi, MessageKind::Records as u32)?;
    a.call(l.flush)?;
    a.pop(rax)?;
    a.pop(rax)?;
    a.mov(qword_ptr(rbx + slot::TID), rax)?;
    a.mov(eax, 1)?; // changed
    a.ret()?;
    a.set_label(&mut l.check_thread_done)?;
    a.xor(eax, eax)?;
    a.ret()?;
    Ok(())
}

/// check_thread_marker: check_thread, and open a new window (marker) for
/// the new owner.
fn emit_check_thread_marker(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.check_thread_marker)?;
    a.call(l.check_thread)?;
    a.test(eax, eax)?;
    a.jz(l.check_thread_marker_done)?;
    a.mov(edi, WINDOW_MARKER)?;
    a.mov(rsi, qword_ptr(rbx + slot::WINDOWS))?;
    a.inc(qword_ptr(rbx + slot::WINDOWS))?;
    a.call(l.append)?;
    a.set_label(&mut l.check_thread_marker_done)?;
    a.ret()?;
    Ok(())
}

/// flush(edi = kind): sends the buffer as one message (header filled
/// here), empties it. Records are counted as dropped if sending fails,
/// or if the exit hook already closed the process (it sent or will send
/// this buffer itself). The fence pairs with the exit hook's: either it
/// sees this thread inside the runtime (BUSY set), or this thread sees
/// CLOSED.
fn emit_flush(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.flush)?;
    a.mfence()?;
    a.cmp(qword_ptr(r13 + process::CLOSED), 0)?;
    a.je(l.flush_unchecked)?;
    a.mov(rcx, qword_ptr(rbx + slot::COUNT))?;
    a.add(qword_ptr(rbx + slot::DROPPED), rcx)?;
    a.mov(qword_ptr(rbx + slot::COUNT), 0)?;
    a.ret()?;
    a.set_label(&mut l.flush_unchecked)?;
    a.mov(
        dword_ptr(rbx + (slot::MESSAGE + protocol::offsets::KIND)),
        edi,
    )?;
    fill_header(a)?;
    a.lea(rsi, qword_ptr(rcx + rcx * 2))?;
    a.lea(rsi, qword_ptr(rsi * 4 + protocol::HEADER_BYTES as i32))?;
    a.lea(rdi, qword_ptr(rbx + slot::MESSAGE))?;
    a.call(l.send)?;
    a.test(eax, eax)?;
    a.jz(l.flush_sent)?;
    a.mov(rcx, qword_ptr(rbx + slot::COUNT))?;
    a.add(qword_ptr(rbx + slot::DROPPED), rcx)?;
    a.set_label(&mut l.flush_sent)?;
    a.mov(qword_ptr(rbx + slot::COUNT), 0)?;
    a.ret()?;
    Ok(())
}

/// send(rdi = buffer, rsi = length) -> eax = 0 sent, 1 failed. Checks the
/// descriptor is still the collector's socket first. A large payload goes
/// into a free shared chunk when the collector offered them (a user-space
/// copy into memory the collector reads directly), and only a reference
/// travels through the socket; without a free chunk the whole message is
/// copied through the socket, which also applies back-pressure.
fn emit_send(a: &mut Asm, l: &mut Labels) -> R {
    let mut send_plain = a.create_label();
    let mut claim_loop = a.create_label();
    let mut claim_scan = a.create_label();
    let mut claim_wait = a.create_label();
    let mut claimed = a.create_label();
    let mut send_return = a.create_label();
    a.set_label(&mut l.send)?;
    a.push(rbp)?;
    a.push(r14)?;
    a.push(r15)?;
    a.mov(r14, rdi)?;
    a.mov(r15, rsi)?;
    a.cmp(qword_ptr(r12 + cfg::BROKEN), 0)?;
    a.jne(l.send_failed)?;
    a.mov(rbp, rsp)?;
    a.sub(rsp, 144)?; // struct stat
    a.and(rsp, -16)?;
    a.mov(eax, SYS_FSTAT)?;
    a.mov(rdi, qword_ptr(r12 + cfg::FD))?;
    a.mov(rsi, rsp)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jnz(l.send_bad_fd)?;
    a.mov(rax, qword_ptr(rsp + 8))?; // st_ino
    a.cmp(rax, qword_ptr(r12 + cfg::INODE))?;
    a.jne(l.send_bad_fd)?;
    a.mov(rax, qword_ptr(rsp))?; // st_dev
    a.cmp(rax, qword_ptr(r12 + cfg::DEVICE))?;
    a.jne(l.send_bad_fd)?;
    a.mov(rsp, rbp)?;
    a.cmp(
        r15,
        (protocol::HEADER_BYTES + protocol::SHARED_MIN_PAYLOAD) as i32,
    )?;
    a.jb(send_plain)?;
    a.cmp(
        r15,
        (protocol::HEADER_BYTES + protocol::SHARED_CHUNK_BYTES) as i32,
    )?;
    a.ja(send_plain)?;
    a.cmp(qword_ptr(r12 + cfg::SHARED), 0)?;
    a.je(send_plain)?;
    a.mov(ebp, protocol::SHARED_WAIT_ROUNDS)?;
    a.set_label(&mut claim_scan)?;
    a.mov(r8, qword_ptr(r12 + cfg::SHARED))?;
    a.mov(r9, qword_ptr(r12 + cfg::SHARED_CHUNKS))?;
    // The generation before the scan: a chunk freed after it changes it,
    // so the futex wait below returns at once instead of missing the wake.
    a.mov(r11d, dword_ptr(r8 + protocol::SHARED_GENERATION as i32))?;
    a.xor(ecx, ecx)?;
    a.set_label(&mut claim_loop)?;
    a.cmp(rcx, r9)?;
    a.jae(claim_wait)?; // every chunk in flight
    a.xor(eax, eax)?;
    a.mov(edx, 1)?;
    a.lock().cmpxchg(qword_ptr(r8 + rcx * 8), rdx)?;
    a.je(claimed)?;
    a.inc(rcx)?;
    a.jmp(claim_loop)?;
    // Every chunk in flight: the collector is behind. Wait for it to free
    // one (woken by its release, or after 1 ms) rather than copy the
    // records through the socket, a few rounds, then fall back to the
    // socket (which also covers a collector that died).
    a.set_label(&mut claim_wait)?;
    a.dec(ebp)?;
    a.jz(send_plain)?;
    a.mov(edx, 1)?;
    a.xchg(qword_ptr(r8 + protocol::SHARED_WAITING as i32), rdx)?; // a full barrier
    a.sub(rsp, 16)?;
    a.mov(qword_ptr(rsp), 0)?;
    a.mov(qword_ptr(rsp + 8), 1_000_000)?; // 1 ms
    a.mov(eax, SYS_FUTEX)?;
    a.lea(rdi, qword_ptr(r8 + protocol::SHARED_GENERATION as i32))?;
    a.xor(esi, esi)?; // FUTEX_WAIT (shared: the collector wakes it)
    a.mov(edx, r11d)?;
    a.mov(r10, rsp)?;
    a.xor(r8d, r8d)?;
    a.xor(r9d, r9d)?;
    a.syscall()?;
    a.add(rsp, 16)?;
    a.jmp(claim_scan)?;
    a.set_label(&mut claimed)?;
    a.mov(rbp, rcx)?;
    a.mov(rdi, rcx)?;
    a.shl(rdi, protocol::SHARED_CHUNK_BYTES.trailing_zeros())?;
    a.lea(
        rdi,
        qword_ptr(r8 + rdi + protocol::SHARED_STATE_BYTES as i32),
    )?;
    a.lea(rsi, qword_ptr(r14 + protocol::HEADER_BYTES as i32))?;
    a.lea(rcx, qword_ptr(r15 - protocol::HEADER_BYTES as i32))?;
    a.cld()?;
    a.rep().movsb()?;
    const SHARED_MESSAGE: i32 = (protocol::HEADER_BYTES + protocol::SHARED_PAYLOAD_BYTES) as i32;
    a.sub(rsp, SHARED_MESSAGE)?;
    for offset in (0..protocol::HEADER_BYTES as i32).step_by(8) {
        a.mov(rax, qword_ptr(r14 + offset))?;
        a.mov(qword_ptr(rsp + offset), rax)?;
    }
    a.or(
        dword_ptr(rsp + protocol::offsets::KIND),
        protocol::SHARED_FLAG as i32,
    )?;
    a.mov(dword_ptr(rsp + protocol::HEADER_BYTES as i32), ebp)?;
    a.lea(rax, qword_ptr(r15 - protocol::HEADER_BYTES as i32))?;
    a.mov(dword_ptr(rsp + (protocol::HEADER_BYTES as i32 + 4)), eax)?;
    a.mov(r14, rsp)?;
    a.mov(r15d, SHARED_MESSAGE as u32)?;
    a.call(l.send_retry)?;
    a.add(rsp, SHARED_MESSAGE)?;
    a.test(eax, eax)?;
    a.jz(send_return)?;
    // Not sent: the collector is gone; give the chunk back anyway.
    a.mov(r8, qword_ptr(r12 + cfg::SHARED))?;
    a.mov(qword_ptr(r8 + rbp * 8), 0)?;
    a.jmp(send_return)?;
    a.set_label(&mut send_plain)?;
    a.call(l.send_retry)?;
    a.set_label(&mut send_return)?;
    a.pop(r15)?;
    a.pop(r14)?;
    a.pop(rbp)?;
    a.ret()?;
    a.set_label(&mut l.send_bad_fd)?;
    a.mov(rsp, rbp)?;
    a.mov(qword_ptr(r12 + cfg::BROKEN), 1)?;
    a.set_label(&mut l.send_failed)?;
    a.mov(eax, 1)?;
    a.jmp(send_return)?;
    Ok(())
}

/// send_raw(r14 = message, r15 = length) -> eax = 0 sent, 1 failed (the
/// socket is then marked broken).
fn emit_send_retry(a: &mut Asm, l: &mut Labels) -> R {
    let mut send_raw_broken = a.create_label();
    a.set_label(&mut l.send_retry)?;
    a.mov(eax, SYS_SENDTO)?;
    a.mov(rdi, qword_ptr(r12 + cfg::FD))?;
    a.mov(rsi, r14)?;
    a.mov(rdx, r15)?;
    a.mov(r10d, MSG_NOSIGNAL)?;
    a.xor(r8d, r8d)?;
    a.xor(r9d, r9d)?;
    a.syscall()?;
    a.cmp(rax, EINTR)?;
    a.je(l.send_retry)?;
    a.cmp(rax, EAGAIN)?;
    a.je(l.send_yield)?;
    a.test(rax, rax)?;
    a.js(send_raw_broken)?;
    a.xor(eax, eax)?;
    a.ret()?;
    a.set_label(&mut l.send_yield)?;
    a.mov(eax, SYS_SCHED_YIELD)?;
    a.syscall()?;
    a.jmp(l.send_retry)?;
    a.set_label(&mut send_raw_broken)?;
    a.mov(qword_ptr(r12 + cfg::BROKEN), 1)?;
    a.mov(eax, 1)?;
    a.ret()?;
    Ok(())
}

/// fold_live(rax = countdown now): executions += budget − countdown, when
/// the countdown is still within the budget issued.
fn emit_fold_live(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.fold_live)?;
    a.mov(rcx, qword_ptr(rbx + slot::BUDGET))?;
    a.cmp(rax, rcx)?;
    a.ja(l.fold_live_skip)?;
    a.sub(rcx, rax)?;
    a.add(qword_ptr(rbx + slot::EXECUTIONS), rcx)?;
    a.set_label(&mut l.fold_live_skip)?;
    a.mov(qword_ptr(rbx + slot::BUDGET), 0)?;
    a.ret()?;
    Ok(())
}

/// send_region(edi = kind, r14 = name, r15 = length): the buffer must be
/// empty; the name goes where the records would.
fn emit_send_region(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.send_region)?;
    a.mov(
        dword_ptr(rbx + (slot::MESSAGE + protocol::offsets::KIND)),
        edi,
    )?;
    a.mov(rcx, r15)?;
    a.cmp(rcx, protocol::REGION_NAME_MAX as i32)?;
    a.jbe(l.region_len_ok)?;
    a.mov(ecx, protocol::REGION_NAME_MAX as u32)?;
    a.set_label(&mut l.region_len_ok)?;
    a.mov(qword_ptr(rbx + slot::COUNT), rcx)?; // header count = name bytes
    a.mov(rsi, r14)?;
    a.lea(rdi, qword_ptr(rbx + slot::RECORDS))?;
    a.cld()?;
    a.rep().movsb()?;
    // flush() computes the length from COUNT as records; compute it here.
    fill_header(a)?;
    a.lea(rsi, qword_ptr(rcx + protocol::HEADER_BYTES as i32))?;
    a.lea(rdi, qword_ptr(rbx + slot::MESSAGE))?;
    a.call(l.send)?;
    a.mov(qword_ptr(rbx + slot::COUNT), 0)?;
    a.ret()?;
    Ok(())
}

fn emit_region_begin(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    a.set_label(&mut l.region_begin)?;
    save_all(a)?;
    a.add_instruction(lea_rip(Register::R12, params.state_va))?;
    a.mov(r14, rdi)?;
    a.mov(r15, rsi)?;
    a.cmp(qword_ptr(r12 + cfg::STATE), cfg::STATE_ACTIVE)?;
    a.jne(l.region_begin_done)?;
    a.call(l.ensure_process)?;
    a.call(l.find_slot)?;
    a.test(rbx, rbx)?;
    a.jz(l.region_begin_done)?;
    a.cmp(qword_ptr(rbx + slot::BUSY), 0)?;
    a.jne(l.region_begin_done)?;
    enter_cold(a)?;
    take_grant(a, None)?;
    a.cmp(qword_ptr(rbx + slot::COUNT), 0)?;
    a.je(l.region_begin_empty)?;
    a.mov(edi, MessageKind::Records as u32)?;
    a.call(l.flush)?;
    a.set_label(&mut l.region_begin_empty)?;
    a.mov(edi, MessageKind::RegionBegin as u32)?;
    a.call(l.send_region)?;
    a.mov(rax, fs(TCB_COUNTDOWN))?;
    a.call(l.fold_live)?;
    a.mov(qword_ptr(rbx + slot::REMAINING), 0)?;
    a.mov(qword_ptr(rbx + slot::STARTED), 0)?;
    a.mov(fs(TCB_COUNTDOWN), 0)?;
    unaware_at_begin(a)?;
    a.mov(qword_ptr(r12 + cfg::ENABLED), 1)?;
    leave_cold(a)?;
    a.set_label(&mut l.region_begin_done)?;
    restore_all(a)?;
    a.ret()?;
    Ok(())
}

fn emit_region_end(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    a.set_label(&mut l.region_end)?;
    save_all(a)?;
    a.add_instruction(lea_rip(Register::R12, params.state_va))?;
    a.mov(r14, rdi)?;
    a.mov(r15, rsi)?;
    a.cmp(qword_ptr(r12 + cfg::STATE), cfg::STATE_ACTIVE)?;
    a.jne(l.region_end_done)?;
    // An end with no region open (criterion's merged `start_profiling`
    // hook) is ignored.
    a.cmp(qword_ptr(r12 + cfg::ENABLED), 0)?;
    a.je(l.region_end_done)?;
    a.mov(qword_ptr(r12 + cfg::ENABLED), 0)?;
    a.call(l.ensure_process)?;
    a.call(l.find_slot)?;
    a.test(rbx, rbx)?;
    a.jz(l.region_end_done)?;
    a.cmp(qword_ptr(rbx + slot::BUSY), 0)?;
    a.jne(l.region_end_done)?;
    enter_cold(a)?;
    take_grant(a, None)?;
    unaware_at_end(a)?;
    a.mov(rax, fs(TCB_COUNTDOWN))?;
    a.call(l.fold_live)?;
    a.mov(qword_ptr(rbx + slot::REMAINING), 0)?;
    a.mov(qword_ptr(rbx + slot::STARTED), 0)?;
    recheck_countdown(a)?;
    a.mov(edi, MessageKind::Records as u32)?;
    a.call(l.flush)?;
    a.mov(edi, MessageKind::RegionEnd as u32)?;
    a.call(l.send_region)?;
    leave_cold(a)?;
    a.set_label(&mut l.region_end_done)?;
    restore_all(a)?;
    a.ret()?;
    Ok(())
}

/// The unnamed region entries a framework's measurement functions call
/// (criterion's `Measurement::start`/`end`, divan's `sync_impl`): their
/// arguments are not a name, so they pass length 0 (`mov` leaves the flags
/// alone), keeping rsi for the hooked function; the toggle opens or closes
/// by `sil`.
/// The unnamed region hooks, and the toggle (`sil` non-zero: open). The
/// toggle's region is process-wide and counted: divan's `threads` bench
/// calls `sync_impl` on each of its threads, so the region begins at the
/// first thread's open and ends at the last one's close — not when the
/// fastest thread is done while the others still run the routine.
fn emit_unnamed_regions(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    // The hooked function's arguments are not a name: pass length 0 (`mov`
    // leaves the flags alone), keeping rsi for the function.
    for (label, target) in [
        (&mut l.region_begin_unnamed, l.region_begin),
        (&mut l.region_end_unnamed, l.region_end),
    ] {
        a.set_label(label)?;
        a.push(rsi)?;
        a.mov(esi, 0u32)?;
        a.call(target)?;
        a.pop(rsi)?;
        a.ret()?;
    }
    let mut close = a.create_label();
    let mut keep_open = a.create_label();
    let mut none_open = a.create_label();
    a.set_label(&mut l.region_toggle)?;
    a.push(rax)?;
    a.push(rcx)?;
    a.add_instruction(lea_rip(
        Register::RCX,
        params.state_va + cfg::OPEN_TOGGLES as u64,
    ))?;
    a.test(sil, sil)?;
    a.jz(close)?;
    a.mov(eax, 1)?;
    a.lock().xadd(qword_ptr(rcx), rax)?;
    a.test(rax, rax)?;
    // `pop` leaves the flags alone: the first open begins the region.
    a.pop(rcx)?;
    a.pop(rax)?;
    a.jz(l.region_begin_unnamed)?;
    a.ret()?;
    a.set_label(&mut close)?;
    a.mov(rax, -1i64)?;
    a.lock().xadd(qword_ptr(rcx), rax)?;
    a.cmp(rax, 1)?;
    a.jg(keep_open)?;
    a.jl(none_open)?;
    // The last close ends the region.
    a.pop(rcx)?;
    a.pop(rax)?;
    a.jmp(l.region_end_unnamed)?;
    // A close with none open (a hook missed its open) restores the count
    // and ends nothing: an end with no region open is ignored anyway.
    a.set_label(&mut none_open)?;
    a.lock().inc(qword_ptr(rcx))?;
    a.set_label(&mut keep_open)?;
    a.pop(rcx)?;
    a.pop(rax)?;
    a.ret()?;
    Ok(())
}

/// The harness's progress query: `rdi` = the windows (time samples) every
/// thread of the process opened so far, read without a lock (each count is
/// a qword only its owner writes, and a stale one only delays the stop by an
/// iteration); `rdi` unchanged while recording is off for good (no
/// collector), 0 before the first slot exists. Preserves the other
/// registers; clobbers the flags, dead at a function's entry.
fn emit_region_samples(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    let mut walk = a.create_label();
    let mut done = a.create_label();
    a.set_label(&mut l.region_samples)?;
    a.push(rax)?;
    a.add_instruction(lea_rip(Register::RAX, params.state_va))?;
    a.cmp(qword_ptr(rax + cfg::STATE), cfg::STATE_ACTIVE)?;
    a.jne(done)?;
    a.mov(rax, qword_ptr(rax + cfg::PROCESS))?;
    a.xor(edi, edi)?;
    a.test(rax, rax)?;
    a.jz(done)?;
    a.mov(rax, qword_ptr(rax + process::HEAD))?;
    a.set_label(&mut walk)?;
    a.test(rax, rax)?;
    a.jz(done)?;
    a.add(rdi, qword_ptr(rax + slot::WINDOWS))?;
    a.mov(rax, qword_ptr(rax + slot::NEXT))?;
    a.jmp(walk)?;
    a.set_label(&mut done)?;
    a.pop(rax)?;
    a.ret()?;
    Ok(())
}

/// The exit hook: flushes this thread's slot, then every other thread's,
/// sends `ProcessExit` (all in `fini_body`, which returns) and chains to the
/// original `DT_FINI` function.
fn emit_fini(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    a.set_label(&mut l.fini)?;
    a.call(l.fini_body)?;
    match params.original_fini {
        Some(target) => a.add_instruction(jmp_abs(target))?,
        None => a.ret()?,
    }
    emit_fini_own_slot(a, l, params)?;
    emit_fini_other_slots(a, l)?;
    emit_fini_exit_message(a, l)
}

/// `fini` up to the other slots: runs once per process, folds this thread's
/// countdown exactly and sends its buffer.
fn emit_fini_own_slot(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    a.set_label(&mut l.fini_body)?;
    enter_active(a, params, l.fini_done)?;
    a.call(l.ensure_process)?;
    a.cmp(qword_ptr(r13 + process::FINISHING), 0)?;
    a.jne(l.fini_done)?;
    a.mov(qword_ptr(r13 + process::FINISHING), 1)?;
    // This thread: exact fold of its countdown, final flush, stop counting
    // (BUSY stays set: anything it records later is not sent).
    this_threads_slot(a, l.fini_others)?;
    enter_cold(a)?;
    take_grant(a, None)?;
    a.mov(r14, rbx)?;
    a.mov(rax, fs(TCB_COUNTDOWN))?;
    a.call(l.fold_live)?;
    a.mov(rax, COUNTDOWN_NEVER)?;
    a.mov(fs(TCB_COUNTDOWN), rax)?;
    a.mov(edi, MessageKind::Final as u32)?;
    a.call(l.flush)?;
    Ok(())
}

/// Every other slot (live threads, and dead ones whose buffers still hold
/// records): close the process to their own flushes, then take a
/// seqlock-consistent snapshot of each into a staging slot and send it.
fn emit_fini_other_slots(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.fini_others)?;
    a.mov(qword_ptr(r13 + process::CLOSED), 1)?;
    a.mfence()?;
    map_anonymous(a, slot::BYTES)?;
    a.xor(r15d, r15d)?;
    a.cmp(rax, -4095)?;
    a.jae(l.fini_staging_ready)?;
    a.mov(r15, rax)?;
    a.set_label(&mut l.fini_staging_ready)?;
    a.mov(rbx, qword_ptr(r13 + process::HEAD))?;
    a.set_label(&mut l.fini_loop)?;
    a.test(rbx, rbx)?;
    a.jz(l.fini_exit_message)?;
    a.cmp(rbx, r14)?;
    a.je(l.fini_next)?;
    a.test(r15, r15)?;
    a.jz(l.fini_unflushed)?;
    a.mov(ebp, 1 << 24)?;
    a.set_label(&mut l.fini_retry)?;
    a.mov(r8, qword_ptr(rbx + slot::SEQ))?;
    a.cmp(qword_ptr(rbx + slot::BUSY), 0)?;
    a.jne(l.fini_wait)?;
    emit_fini_snapshot(a, l)?;
    a.set_label(&mut l.fini_wait)?;
    a.pause()?;
    a.dec(ebp)?;
    a.jnz(l.fini_retry)?;
    a.set_label(&mut l.fini_unflushed)?;
    a.mov(rax, qword_ptr(rbx + slot::COUNT))?;
    a.add(qword_ptr(r13 + process::DROPPED), rax)?;
    a.set_label(&mut l.fini_next)?;
    a.mov(rbx, qword_ptr(rbx + slot::NEXT))?;
    a.jmp(l.fini_loop)?;
    Ok(())
}

/// One other slot (rbx) into the staging slot (r15), between two reads of
/// its seqlock (`SEQ` in r8): the committed records, then those claimed
/// under the owner's grant (it may still be appending: each is read id
/// first, and the owner writes the id last, so a record read with its id
/// holds its address; one not yet written keeps its unwritten marker).
/// Sends the snapshot, or goes to `fini_wait` if the owner moved on.
fn emit_fini_snapshot(a: &mut Asm, l: &mut Labels) -> R {
    let mut end_ok = a.create_label();
    let mut ordered = a.create_label();
    let mut copied = a.create_label();
    a.mov(rax, qword_ptr(rbx + slot::CLAIM))?;
    a.mov(rcx, qword_ptr(rbx + slot::SPATIAL_CLAIM))?;
    open_claim(a)?;
    claimed_end(a)?;
    a.mov(r9, qword_ptr(rbx + slot::COUNT))?;
    a.cmp(r9, slot::CAPACITY)?;
    a.jbe(l.fini_count_ok)?;
    a.mov(r9d, slot::CAPACITY as u32)?;
    a.set_label(&mut l.fini_count_ok)?;
    a.lea(rcx, qword_ptr(r9 + r9 * 2))?;
    a.shl(rcx, 2)?;
    a.lea(rsi, qword_ptr(rbx + slot::RECORDS))?;
    a.lea(rdi, qword_ptr(r15 + slot::RECORDS))?;
    a.cld()?;
    a.rep().movsb()?;
    // rsi = first claimed record; claimed ones end at rax, within the buffer.
    a.lea(
        rcx,
        qword_ptr(rbx + (slot::RECORDS + slot::CAPACITY * RECORD_BYTES as i32)),
    )?;
    a.cmp(rax, rcx)?;
    a.jbe(end_ok)?;
    a.mov(rax, rcx)?;
    a.set_label(&mut end_ok)?;
    a.mov(r10, r9)?;
    a.set_label(&mut ordered)?;
    a.cmp(rsi, rax)?;
    a.jae(copied)?;
    a.mov(edx, dword_ptr(rsi))?;
    a.mov(r11, qword_ptr(rsi + 4))?;
    a.mov(dword_ptr(rdi), edx)?;
    a.mov(qword_ptr(rdi + 4), r11)?;
    a.add(rsi, RECORD_BYTES as i32)?;
    a.add(rdi, RECORD_BYTES as i32)?;
    a.inc(r10)?;
    a.jmp(ordered)?;
    a.set_label(&mut copied)?;
    a.mov(qword_ptr(r15 + slot::COUNT), r10)?;
    for field in [
        slot::EXECUTIONS,
        slot::NESTED,
        slot::DROPPED,
        slot::TID,
        slot::SERIAL,
        slot::BUDGET,
        slot::TCB,
    ] {
        a.mov(rax, qword_ptr(rbx + field))?;
        a.mov(qword_ptr(r15 + field), rax)?;
    }
    // The claimed records of a time grant are executions the owner has
    // not committed yet (spatial records count none).
    let mut counted = a.create_label();
    a.cmp(qword_ptr(rbx + slot::SPATIAL_GRANT), 0)?;
    a.jne(counted)?;
    a.sub(r10, r9)?;
    a.add(qword_ptr(r15 + slot::EXECUTIONS), r10)?;
    a.set_label(&mut counted)?;
    a.cmp(qword_ptr(rbx + slot::BUSY), 0)?;
    a.jne(l.fini_wait)?;
    a.cmp(qword_ptr(rbx + slot::SEQ), r8)?;
    a.jne(l.fini_wait)?;
    // process_vm_readv(pid, {buf, 16}, 1, {tcb + 0x38, 16}, 1, 0): the
    // owner's countdown and slot pointer, without faulting if its TCB is
    // gone. Folded only if that TCB still points at this slot.
    a.sub(rsp, 48)?;
    a.lea(rax, qword_ptr(rsp + 32))?;
    a.mov(qword_ptr(rsp), rax)?;
    a.mov(qword_ptr(rsp + 8), 16)?;
    a.mov(rax, qword_ptr(r15 + slot::TCB))?;
    a.add(rax, TCB_COUNTDOWN as i32)?;
    a.mov(qword_ptr(rsp + 16), rax)?;
    a.mov(qword_ptr(rsp + 24), 16)?;
    a.mov(eax, SYS_PROCESS_VM_READV)?;
    a.mov(rdi, qword_ptr(r13 + process::PID))?;
    a.mov(rsi, rsp)?;
    a.mov(edx, 1)?;
    a.lea(r10, qword_ptr(rsp + 16))?;
    a.mov(r8d, 1)?;
    a.xor(r9d, r9d)?;
    a.syscall()?;
    a.mov(rdx, rbx)?;
    a.mov(rbx, r15)?;
    a.cmp(rax, 16)?;
    a.jne(l.fini_unfolded)?;
    a.cmp(qword_ptr(rsp + 40), rdx)?;
    a.jne(l.fini_unfolded)?;
    a.mov(rax, qword_ptr(rsp + 32))?;
    a.push(rdx)?;
    a.call(l.fold_live)?;
    a.pop(rdx)?;
    a.set_label(&mut l.fini_unfolded)?;
    a.add(rsp, 48)?;
    a.push(rdx)?;
    a.push(rdx)?;
    a.mov(edi, MessageKind::Final as u32)?;
    a.call(l.flush_unchecked)?;
    a.pop(rbx)?;
    a.pop(rbx)?;
    a.jmp(l.fini_next)?;
    Ok(())
}

/// The end of `fini_body`: the `ProcessExit` message (process-level drops).
fn emit_fini_exit_message(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.fini_exit_message)?;
    a.call(l.objects_message)?;
    a.call(l.send_escapes)?;
    send_process_header(
        a,
        l,
        protocol::HEADER_BYTES as i32,
        HeaderSource::ProcessBlock(MessageKind::ProcessExit),
    )?;
    a.set_label(&mut l.fini_done)?;
    restore_all(a)?;
    a.ret()?;
    Ok(())
}

/// `rax` = this process's id when it is not the process whose runtime
/// state this is, else 0: a `vfork` child, which shares the parent's memory
/// (the parent's slots and process block) until it execs or exits, must
/// leave them alone. A process block wiped by `fork` (pid 0) is this
/// process's own. Expects r13 = the process block; clobbers rcx and r11.
fn borrowed_process(a: &mut Asm) -> R {
    let mut own = a.create_label();
    let mut done = a.create_label();
    a.cmp(qword_ptr(r13 + process::PID), 0)?;
    a.je(own)?;
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.cmp(rax, qword_ptr(r13 + process::PID))?;
    a.je(own)?;
    a.jmp(done)?;
    a.set_label(&mut own)?;
    a.xor(eax, eax)?;
    a.set_label(&mut done)?;
    a.zero_bytes()
}

/// The process ends that run no `DT_FINI`: each has a runtime entry,
/// called by the stubs in front of the program's imports.
#[derive(Clone, Copy)]
enum ProcessEnd {
    /// `exit_now`: what `fini` does, for a process about to end through
    /// `_exit`, then back to the caller, which goes on to the real `_exit`.
    Exit,
    /// `exec_flush`: before an `exec`, this thread's buffer is sent (the
    /// consumed part of its countdown folded in) and an `Exec` message says
    /// the process may end here. Recording goes on as before, so if the
    /// `exec` fails the process keeps sending and its later messages
    /// supersede the `Exec`. The `Exec` message's `dropped` is what a
    /// successful `exec` loses: the process's own drops and every other
    /// thread's buffered records (the kernel ends those threads).
    Exec,
}

/// The entry of one [`ProcessEnd`]: while recording is active, the end's
/// own work in the process whose runtime state this is; in a `vfork` child,
/// which recorded into its parent's slots (the parent sends those), only a
/// header-only message of the end.
fn emit_process_end(a: &mut Asm, l: &mut Labels, params: &RuntimeParams, end: ProcessEnd) -> R {
    let mut done = a.create_label();
    let mut borrowed = a.create_label();
    let mut send = a.create_label();
    match end {
        ProcessEnd::Exit => a.set_label(&mut l.exit_now)?,
        ProcessEnd::Exec => a.set_label(&mut l.exec_flush)?,
    }
    enter_active(a, params, done)?;
    a.mov(r13, qword_ptr(r12 + cfg::PROCESS))?;
    borrowed_process(a)?;
    a.test(rax, rax)?;
    a.jnz(borrowed)?;
    match end {
        ProcessEnd::Exit => {
            restore_all(a)?;
            a.jmp(l.fini_body)?;
        }
        ProcessEnd::Exec => {
            emit_exec_own_flush(a, l, done)?;
            a.jmp(send)?;
        }
    }
    a.set_label(&mut borrowed)?;
    a.mov(esi, eax)?;
    match end {
        ProcessEnd::Exit => {
            a.mov(edi, MessageKind::ProcessExit as u32)?;
            a.xor(r8d, r8d)?;
        }
        ProcessEnd::Exec => {
            a.xor(r8d, r8d)?;
            a.set_label(&mut send)?;
            a.mov(edi, MessageKind::Exec as u32)?;
        }
    }
    a.call(l.process_message)?;
    a.set_label(&mut done)?;
    restore_all(a)?;
    a.ret()?;
    Ok(())
}

/// The `Exec` end in its own process: sends this thread's buffer, then
/// leaves esi = the pid and r8 = the records the `exec` would lose (the
/// process's drops and what the other threads hold). To `done` if the
/// process is already finishing.
fn emit_exec_own_flush(a: &mut Asm, l: &mut Labels, done: CodeLabel) -> R {
    let mut message = a.create_label();
    let mut unfolded = a.create_label();
    let mut walk = a.create_label();
    let mut next = a.create_label();
    let mut walked = a.create_label();
    a.call(l.ensure_process)?;
    a.cmp(qword_ptr(r13 + process::FINISHING), 0)?;
    a.jne(done)?;
    this_threads_slot(a, message)?;
    a.mov(r14, rbx)?;
    enter_cold(a)?;
    take_grant(a, None)?;
    // Fold what the thread consumed of its budget; the rest stays its
    // budget, so the count stays exact whether or not the exec succeeds.
    a.mov(rax, fs(TCB_COUNTDOWN))?;
    a.mov(rcx, qword_ptr(rbx + slot::BUDGET))?;
    a.cmp(rax, rcx)?;
    a.ja(unfolded)?;
    a.sub(rcx, rax)?;
    a.add(qword_ptr(rbx + slot::EXECUTIONS), rcx)?;
    a.mov(qword_ptr(rbx + slot::BUDGET), rax)?;
    a.set_label(&mut unfolded)?;
    a.mov(edi, MessageKind::Records as u32)?;
    a.call(l.flush)?;
    give_grant(a)?;
    leave_cold(a)?;
    a.set_label(&mut message)?;
    a.call(l.send_escapes)?;
    // r8 = process drops + records other threads hold.
    a.mov(r8, qword_ptr(r13 + process::DROPPED))?;
    a.mov(rdx, qword_ptr(r13 + process::HEAD))?;
    a.set_label(&mut walk)?;
    a.test(rdx, rdx)?;
    a.jz(walked)?;
    a.cmp(rdx, r14)?;
    a.je(next)?;
    a.add(r8, qword_ptr(rdx + slot::COUNT))?;
    a.set_label(&mut next)?;
    a.mov(rdx, qword_ptr(rdx + slot::NEXT))?;
    a.jmp(walk)?;
    a.set_label(&mut walked)?;
    a.mov(rsi, qword_ptr(r13 + process::PID))?;
    Ok(())
}

/// Saves every register and sets r12 = the config; to `inactive` (which
/// restores them) unless recording is active.
fn enter_active(a: &mut Asm, params: &RuntimeParams, inactive: CodeLabel) -> R {
    save_all(a)?;
    a.add_instruction(lea_rip(Register::R12, params.state_va))?;
    a.cmp(qword_ptr(r12 + cfg::STATE), cfg::STATE_ACTIVE)?;
    a.jne(inactive)?;
    Ok(())
}

/// rbx = this thread's slot, r14 = 0; to `none` unless the thread has a
/// slot, intact and not busy.
fn this_threads_slot(a: &mut Asm, none: CodeLabel) -> R {
    a.xor(r14d, r14d)?;
    a.mov(rbx, fs(TCB_SLOT))?;
    a.test(rbx, rbx)?;
    a.jz(none)?;
    a.cmp(qword_ptr(rbx + slot::MAGIC), slot::MAGIC_VALUE)?;
    a.jne(none)?;
    a.cmp(qword_ptr(rbx + slot::BUSY), 0)?;
    a.jne(none)?;
    Ok(())
}

/// Where a header-only message of the process takes its fields.
#[derive(Clone, Copy)]
enum HeaderSource {
    /// This kind; the pid and the drops from the process block in r13
    /// (loaded through rax).
    ProcessBlock(MessageKind),
    /// edi = the kind, esi = the pid, r8 = the drops.
    Registers,
}

/// Sends a header-only message of the process (no records, tid = pid) from
/// a `frame`-byte stack buffer.
fn send_process_header(a: &mut Asm, l: &Labels, frame: i32, source: HeaderSource) -> R {
    a.sub(rsp, frame)?;
    a.mov(dword_ptr(rsp + protocol::offsets::MAGIC), MESSAGE_MAGIC)?;
    match source {
        HeaderSource::ProcessBlock(kind) => {
            a.mov(dword_ptr(rsp + protocol::offsets::KIND), kind as u32)?
        }
        HeaderSource::Registers => a.mov(dword_ptr(rsp + protocol::offsets::KIND), edi)?,
    }
    let pid = match source {
        HeaderSource::ProcessBlock(_) => {
            a.mov(rax, qword_ptr(r13 + process::PID))?;
            eax
        }
        HeaderSource::Registers => esi,
    };
    a.mov(dword_ptr(rsp + protocol::offsets::PID), pid)?;
    a.mov(dword_ptr(rsp + protocol::offsets::TID), pid)?;
    a.mov(qword_ptr(rsp + protocol::offsets::EXECUTIONS), 0)?;
    let dropped = match source {
        HeaderSource::ProcessBlock(_) => {
            a.mov(rax, qword_ptr(r13 + process::DROPPED))?;
            rax
        }
        HeaderSource::Registers => r8,
    };
    a.mov(qword_ptr(rsp + protocol::offsets::DROPPED), dropped)?;
    a.mov(dword_ptr(rsp + protocol::offsets::SLOT), 0)?;
    a.mov(dword_ptr(rsp + protocol::offsets::COUNT), 0)?;
    a.mov(rdi, rsp)?;
    a.mov(esi, protocol::HEADER_BYTES as u32)?;
    a.call(l.send)?;
    a.add(rsp, frame)?;
    Ok(())
}

/// process_message(edi = kind, esi = pid, r8 = dropped): sends a
/// header-only message of the process (`ProcessExit`, `Exec`). Expects r12
/// = the config.
fn emit_process_message(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.process_message)?;
    send_process_header(
        a,
        l,
        protocol::HEADER_BYTES as i32 + 8,
        HeaderSource::Registers,
    )?;
    a.ret()?;
    Ok(())
}

/// Longest executable path a `Start` message carries.
const START_PATH_MAX: i32 = 4096;

/// start_message: sends `Start` for this process with the path of the
/// executable it runs (`/proc/self/exe`) as its payload, so the collector
/// knows the program even when the process is gone by the time it reads
/// the message (none when the link cannot be read whole). Expects r12 =
/// the config; clobbers the scratch registers.
fn emit_start_message(a: &mut Asm, l: &mut Labels) -> R {
    let mut no_path = a.create_label();
    let mut counted = a.create_label();
    let frame = protocol::HEADER_BYTES as i32 + START_PATH_MAX + 8;
    a.set_label(&mut l.start_message)?;
    a.sub(rsp, frame)?;
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.mov(dword_ptr(rsp + protocol::offsets::MAGIC), MESSAGE_MAGIC)?;
    a.mov(
        dword_ptr(rsp + protocol::offsets::KIND),
        MessageKind::Start as u32,
    )?;
    a.mov(dword_ptr(rsp + protocol::offsets::PID), eax)?;
    a.mov(dword_ptr(rsp + protocol::offsets::TID), eax)?;
    a.mov(qword_ptr(rsp + protocol::offsets::EXECUTIONS), 0)?;
    a.mov(qword_ptr(rsp + protocol::offsets::DROPPED), 0)?;
    a.mov(dword_ptr(rsp + protocol::offsets::SLOT), 0)?;
    a.mov(eax, SYS_READLINK)?;
    a.lea(rdi, ptr(l.proc_self_exe))?;
    a.lea(rsi, qword_ptr(rsp + protocol::HEADER_BYTES as i32))?;
    a.mov(edx, START_PATH_MAX)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.js(no_path)?;
    a.cmp(rax, START_PATH_MAX)?;
    a.jb(counted)?;
    a.set_label(&mut no_path)?;
    a.xor(eax, eax)?;
    a.set_label(&mut counted)?;
    a.mov(dword_ptr(rsp + protocol::offsets::COUNT), eax)?;
    a.lea(esi, dword_ptr(rax + protocol::HEADER_BYTES as i32))?;
    a.mov(rdi, rsp)?;
    a.call(l.send)?;
    a.add(rsp, frame)?;
    a.ret()?;
    Ok(())
}

/// Bytes of `/proc/self/maps` one `Objects` message carries at most.
const OBJECTS_CHUNK: i32 = 32 * 1024;

/// objects_message: sends `/proc/self/maps` as `Objects` messages (one per
/// `read`, in order), so the collector learns the objects the process had
/// loaded (`dlopen`ed ones included) while it still can: the maps of the
/// zombie it reads later are empty. Nothing when the file cannot be read.
/// Expects r12 = the config, r13 = the process block; clobbers the
/// scratch registers.
fn emit_objects_message(a: &mut Asm, l: &mut Labels) -> R {
    let mut next = a.create_label();
    let mut close = a.create_label();
    let mut unmap = a.create_label();
    let mut done = a.create_label();
    let buffer = protocol::HEADER_BYTES as i32 + OBJECTS_CHUNK;
    a.set_label(&mut l.objects_message)?;
    a.push(rbx)?;
    a.push(rbp)?;
    map_anonymous(a, buffer)?;
    a.cmp(rax, -4095)?;
    a.jae(done)?;
    a.mov(rbx, rax)?;
    a.mov(eax, SYS_OPEN)?;
    a.lea(rdi, ptr(l.proc_self_maps))?;
    a.mov(esi, 0x80000)?; // O_RDONLY | O_CLOEXEC
    a.xor(edx, edx)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.js(unmap)?;
    a.mov(rbp, rax)?;
    a.set_label(&mut next)?;
    a.mov(eax, SYS_READ)?;
    a.mov(rdi, rbp)?;
    a.lea(rsi, qword_ptr(rbx + protocol::HEADER_BYTES as i32))?;
    a.mov(edx, OBJECTS_CHUNK)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jle(close)?;
    a.mov(dword_ptr(rbx + protocol::offsets::MAGIC), MESSAGE_MAGIC)?;
    a.mov(
        dword_ptr(rbx + protocol::offsets::KIND),
        MessageKind::Objects as u32,
    )?;
    a.mov(dword_ptr(rbx + protocol::offsets::COUNT), eax)?;
    a.lea(esi, dword_ptr(rax + protocol::HEADER_BYTES as i32))?;
    a.mov(rax, qword_ptr(r13 + process::PID))?;
    a.mov(dword_ptr(rbx + protocol::offsets::PID), eax)?;
    a.mov(dword_ptr(rbx + protocol::offsets::TID), eax)?;
    a.mov(qword_ptr(rbx + protocol::offsets::EXECUTIONS), 0)?;
    a.mov(qword_ptr(rbx + protocol::offsets::DROPPED), 0)?;
    a.mov(dword_ptr(rbx + protocol::offsets::SLOT), 0)?;
    a.mov(rdi, rbx)?;
    a.call(l.send)?;
    a.jmp(next)?;
    a.set_label(&mut close)?;
    a.mov(eax, SYS_CLOSE)?;
    a.mov(rdi, rbp)?;
    a.syscall()?;
    a.set_label(&mut unmap)?;
    a.mov(eax, SYS_MUNMAP)?;
    a.mov(rdi, rbx)?;
    a.mov(esi, buffer)?;
    a.syscall()?;
    a.set_label(&mut done)?;
    a.pop(rbp)?;
    a.pop(rbx)?;
    a.ret()?;
    Ok(())
}

/// send_escapes: the escape counters that are not zero, taken and zeroed
/// one by one (`xchg`: an escape counted meanwhile stays for the next
/// message), sent as one `Escapes` message per object built in the process
/// block: the executable's (ids: site numbers), then those of each
/// instrumented library registered in [`Config::library_sites`] (ids
/// `object << 24 | site`, see [`super::library`]). Nothing for an object
/// that counted none. Expects r12 = the config, r13 = the process block;
/// clobbers the scratch registers.
fn emit_send_escapes(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    let mut object = a.create_label();
    let mut next_object = a.create_label();
    a.set_label(&mut l.send_escapes)?;
    let message = process::escape_message(params.escape_sites);
    if params.escape_sites > 0 {
        let mut libraries = a.create_label();
        a.lea(r9, qword_ptr(r13 + process::ESCAPES))?;
        a.mov(r10d, params.escape_sites)?;
        a.xor(r11d, r11d)?;
        send_escape_counters(a, l, message, libraries)?;
        a.set_label(&mut libraries)?;
    }
    a.push(rbx)?;
    a.mov(ebx, 1)?;
    a.set_label(&mut object)?;
    a.mov(r10, qword_ptr(r12 + rbx * 8 + cfg::LIBRARY_SITES))?;
    a.test(r10, r10)?;
    a.jz(next_object)?;
    a.mov(r9, rbx)?;
    a.dec(r9)?;
    a.shl(r9, process::LIBRARY_COUNTER_BYTES.trailing_zeros())?;
    a.add(r9, qword_ptr(r12 + cfg::LIBRARY_COUNTERS))?;
    a.mov(r11, rbx)?;
    a.shl(r11, super::library::OBJECT_SHIFT)?;
    send_escape_counters(a, l, message, next_object)?;
    a.set_label(&mut next_object)?;
    a.inc(ebx)?;
    a.cmp(ebx, super::library::MAX_OBJECT)?;
    a.jbe(object)?;
    a.pop(rbx)?;
    a.ret()?;
    Ok(())
}

/// Sends the `r10` counters at `r9` that are not zero, taken and zeroed,
/// as one `Escapes` message built at `message` in the process block, each
/// record's id its counter's index or-ed with `r11`; nothing when all are
/// zero. Goes on at `done`, which the caller sets next. Clobbers the
/// scratch registers but rbx.
fn send_escape_counters(a: &mut Asm, l: &mut Labels, message: i32, done: CodeLabel) -> R {
    let mut next = a.create_label();
    let mut scan = a.create_label();
    let mut built = a.create_label();
    a.lea(
        rdi,
        qword_ptr(r13 + (message + protocol::HEADER_BYTES as i32)),
    )?;
    a.xor(edx, edx)?;
    a.xor(r8d, r8d)?;
    a.set_label(&mut scan)?;
    a.cmp(rdx, r10)?;
    a.jae(built)?;
    a.xor(eax, eax)?;
    a.xchg(qword_ptr(r9 + rdx * 8), rax)?;
    a.test(rax, rax)?;
    a.jz(next)?;
    a.lea(ecx, dword_ptr(rdx + r11))?;
    a.mov(dword_ptr(rdi), ecx)?;
    a.mov(qword_ptr(rdi + 4), rax)?;
    a.add(rdi, RECORD_BYTES as i32)?;
    a.inc(r8d)?;
    a.set_label(&mut next)?;
    a.inc(edx)?;
    a.jmp(scan)?;
    a.set_label(&mut built)?;
    a.test(r8d, r8d)?;
    a.jz(done)?;
    a.lea(rdi, qword_ptr(r13 + message))?;
    a.mov(dword_ptr(rdi + protocol::offsets::MAGIC), MESSAGE_MAGIC)?;
    a.mov(
        dword_ptr(rdi + protocol::offsets::KIND),
        MessageKind::Escapes as u32,
    )?;
    a.mov(rax, qword_ptr(r13 + process::PID))?;
    a.mov(dword_ptr(rdi + protocol::offsets::PID), eax)?;
    a.mov(dword_ptr(rdi + protocol::offsets::TID), eax)?;
    a.mov(qword_ptr(rdi + protocol::offsets::EXECUTIONS), 0)?;
    a.mov(qword_ptr(rdi + protocol::offsets::DROPPED), 0)?;
    a.mov(dword_ptr(rdi + protocol::offsets::SLOT), 0)?;
    a.mov(dword_ptr(rdi + protocol::offsets::COUNT), r8d)?;
    a.lea(rsi, qword_ptr(r8 + r8 * 2))?;
    a.lea(rsi, qword_ptr(rsi * 4 + protocol::HEADER_BYTES as i32))?;
    a.call(l.send)?;
    a.jmp(done)
}

/// `before_fork`: `fork` copies the thread's countdown into the child but
/// wipes the slot holding its budget, and libc's `fork` runs loads in the
/// child (`_Fork`'s return, the child's atfork work) before `after_fork`:
/// counted against the inherited skip, they were lost to the child's count,
/// which a full trace records. So a thread in a skip folds what it consumed,
/// keeps the rest in `FORKING` and enters `fork` with a zero countdown: the
/// cold path counts its loads one by one without opening a window, and the
/// child's first load reaches the cold path in a fresh slot, which counts
/// from there. A window open, a full trace or a re-check countdown need
/// nothing: the child's first load reaches the cold path anyway, or its
/// loads are not counted.
fn emit_before_fork(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    let mut done = a.create_label();
    let mut leave = a.create_label();
    a.set_label(&mut l.before_fork)?;
    enter_active(a, params, done)?;
    a.cmp(qword_ptr(r12 + cfg::FULL), 0)?;
    a.jne(done)?;
    a.cmp(qword_ptr(r12 + cfg::ENABLED), 0)?;
    a.je(done)?;
    a.mov(r13, qword_ptr(r12 + cfg::PROCESS))?;
    borrowed_process(a)?;
    a.test(rax, rax)?;
    a.jnz(done)?;
    this_threads_slot(a, done)?;
    enter_cold(a)?;
    a.mov(rax, fs(TCB_COUNTDOWN))?;
    a.test(rax, rax)?;
    a.jz(leave)?;
    a.cmp(rax, qword_ptr(rbx + slot::BUDGET))?;
    a.ja(leave)?;
    // One instruction takes the countdown: a signal handler's loads before
    // it are counted in what it returns, those after by the cold path.
    a.xor(ecx, ecx)?;
    a.xchg(fs(TCB_COUNTDOWN), rcx)?;
    a.mov(rax, qword_ptr(rbx + slot::BUDGET))?;
    a.sub(rax, rcx)?;
    a.add(qword_ptr(rbx + slot::EXECUTIONS), rax)?;
    a.mov(qword_ptr(rbx + slot::BUDGET), 0)?;
    a.mov(qword_ptr(rbx + slot::FORKING), rcx)?;
    a.set_label(&mut leave)?;
    leave_cold(a)?;
    a.set_label(&mut done)?;
    restore_all(a)?;
    a.ret()?;
    Ok(())
}

/// `after_fork` (`rax` = what `fork` returned). In the parent (or after a
/// failed `fork`), a thread that entered `fork` out of a skip gets the rest
/// of it back as its countdown and budget. In the child, whose slot `fork`
/// wiped, a slot its own loads already made counts from its first load
/// (see `emit_before_fork`); otherwise the child gets a fresh slot that
/// takes the inherited countdown as its budget, which the cold path and
/// the exit hook fold in as usual.
fn emit_after_fork(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    let mut done = a.create_label();
    let mut parent = a.create_label();
    let mut fresh = a.create_label();
    a.set_label(&mut l.after_fork)?;
    save_all(a)?;
    a.add_instruction(lea_rip(Register::R12, params.state_va))?;
    a.cmp(qword_ptr(r12 + cfg::STATE), cfg::STATE_ACTIVE)?;
    a.jne(done)?;
    a.test(rax, rax)?;
    a.jnz(parent)?;
    // The child names its program before any of its records: the
    // collector files them under that program's loads even if the child
    // is gone when it reads them.
    a.call(l.start_message)?;
    a.cmp(qword_ptr(r12 + cfg::ENABLED), 0)?;
    a.je(done)?;
    a.mov(rbx, fs(TCB_SLOT))?;
    a.test(rbx, rbx)?;
    a.jz(fresh)?;
    a.cmp(qword_ptr(rbx + slot::MAGIC), slot::MAGIC_VALUE)?;
    a.je(done)?;
    a.set_label(&mut fresh)?;
    a.call(l.ensure_process)?;
    a.call(l.find_slot)?;
    a.test(rbx, rbx)?;
    a.jz(done)?;
    a.cmp(qword_ptr(rbx + slot::BUSY), 0)?;
    a.jne(done)?;
    // A full trace records every load from here on. The countdown may not
    // be the parent's any more: an instrumented library's code that ran in
    // the child before this hook, finding the slot wiped and no runtime it
    // knew, set a re-check countdown, which would have let the child's
    // next loads run unrecorded as a skip budget.
    let mut sampled = a.create_label();
    a.cmp(qword_ptr(r12 + cfg::FULL), 0)?;
    a.je(sampled)?;
    a.mov(fs(TCB_COUNTDOWN), 0)?;
    a.set_label(&mut sampled)?;
    a.mov(rax, fs(TCB_COUNTDOWN))?;
    a.mov(rcx, COUNTDOWN_NEVER)?;
    a.cmp(rax, rcx)?;
    a.jae(done)?;
    a.mov(qword_ptr(rbx + slot::BUDGET), rax)?;
    a.jmp(done)?;
    a.set_label(&mut parent)?;
    this_threads_slot(a, done)?;
    a.mov(rax, qword_ptr(rbx + slot::FORKING))?;
    a.test(rax, rax)?;
    a.jz(done)?;
    enter_cold(a)?;
    a.mov(qword_ptr(rbx + slot::BUDGET), rax)?;
    a.mov(fs(TCB_COUNTDOWN), rax)?;
    a.mov(qword_ptr(rbx + slot::FORKING), 0)?;
    leave_cold(a)?;
    a.set_label(&mut done)?;
    restore_all(a)?;
    a.ret()?;
    Ok(())
}

/// The `posix_spawn` hooks. `before_spawn` does nothing (an instrumented
/// program the spawn starts connects anew, see `reconnect`).
/// `after_spawn` (`rax` = what `posix_spawn` returned, `rdi` = its pid
/// pointer): a successful spawn sends a `Spawn` message naming the new
/// process, so that a program that does not join is counted (and timed) as
/// untraced.
fn emit_spawn_hooks(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    let mut done = a.create_label();
    a.set_label(&mut l.before_spawn)?;
    enter_active(a, params, done)?;
    a.set_label(&mut done)?;
    restore_all(a)?;
    a.ret()?;

    let mut done = a.create_label();
    a.set_label(&mut l.after_spawn)?;
    enter_active(a, params, done)?;
    a.mov(rbx, rax)?;
    a.mov(rbp, rdi)?;
    a.test(ebx, ebx)?;
    a.jnz(done)?;
    a.test(rbp, rbp)?;
    a.jz(done)?;
    a.mov(esi, dword_ptr(rbp))?;
    a.mov(edi, MessageKind::Spawn as u32)?;
    a.xor(r8d, r8d)?;
    a.mov(r13, qword_ptr(r12 + cfg::PROCESS))?;
    a.call(l.process_message)?;
    a.set_label(&mut done)?;
    restore_all(a)?;
    a.ret()?;
    Ok(())
}

/// At the process entry rsp points at argc, rdx holds the function the
/// program must register with atexit; nothing else is defined.
fn emit_entry(a: &mut Asm, l: &mut Labels, params: &RuntimeParams) -> R {
    a.set_label(&mut l.entry)?;
    if params.cpu_features != 0 {
        refuse_missing_cpu_features(a, params)?;
    }
    a.push(rdx)?;
    a.push(rbx)?;
    a.push(rbp)?;
    a.push(r12)?;
    a.push(r13)?;
    a.push(r14)?;
    a.push(r15)?;
    const ENTRY_PUSHED: i32 = 7 * 8;
    a.add_instruction(lea_rip(Register::R12, params.state_va))?;
    a.mov(qword_ptr(r12 + cfg::STATE), cfg::STATE_DISABLED)?;
    a.mov(rax, fs(TCB_SLOT))?;
    a.test(rax, rax)?;
    a.jnz(l.entry_done)?;
    // Instrumented libraries' loads before this entry leave a re-check
    // countdown (see `super::library`): uncounted; counting starts here.
    a.mov(fs(TCB_COUNTDOWN), 0)?;
    a.mov(rcx, qword_ptr(rsp + ENTRY_PUSHED))?; // argc
    a.lea(rbx, qword_ptr(rsp + rcx * 8 + (ENTRY_PUSHED + 16)))?; // envp
    a.mov(rbp, rbx)?;
    find_env(a, l.prefix, protocol::RECORDER_ENV, l.entry_done)?;
    // rsi: "<fd>:<inode>:<device>:<window>:<period>:<seed>"
    for (i, field) in [
        cfg::FD,
        cfg::INODE,
        cfg::DEVICE,
        cfg::WINDOW,
        cfg::PERIOD,
        cfg::SEED,
    ]
    .into_iter()
    .enumerate()
    {
        a.call(l.parse_u64)?;
        a.test(ecx, ecx)?;
        a.jz(l.entry_done)?;
        a.mov(qword_ptr(r12 + field), rax)?;
        if i < 5 {
            a.cmp(byte_ptr(rsi), b':' as u32)?;
            a.jne(l.entry_done)?;
            a.inc(rsi)?;
        }
    }
    // Optionally ":<threshold>:<multiplier>" (spatial sampling).
    let mut fields_done = a.create_label();
    a.cmp(byte_ptr(rsi), 0)?;
    a.je(fields_done)?;
    for (i, field) in [cfg::SPATIAL_PENDING, cfg::SPATIAL_MULTIPLIER]
        .into_iter()
        .enumerate()
    {
        a.cmp(byte_ptr(rsi), b':' as u32)?;
        a.jne(l.entry_done)?;
        a.inc(rsi)?;
        a.call(l.parse_u64)?;
        a.test(ecx, ecx)?;
        a.jz(l.entry_done)?;
        a.mov(qword_ptr(r12 + field), rax)?;
        if i == 1 {
            a.cmp(byte_ptr(rsi), 0)?;
            a.jne(l.entry_done)?;
        }
    }
    a.set_label(&mut fields_done)?;
    // The probes' immediates are the words' high halves (see
    // `skip_spatial_checks`): other words are refused.
    a.mov(eax, dword_ptr(r12 + cfg::SPATIAL_PENDING))?;
    a.or(eax, dword_ptr(r12 + cfg::SPATIAL_MULTIPLIER))?;
    a.jnz(l.entry_done)?;
    // 1 ≤ window ≤ period, fd < 2^31.
    a.mov(rax, qword_ptr(r12 + cfg::WINDOW))?;
    a.test(rax, rax)?;
    a.jz(l.entry_done)?;
    a.cmp(rax, qword_ptr(r12 + cfg::PERIOD))?;
    a.ja(l.entry_done)?;
    a.sete(cl)?;
    a.movzx(ecx, cl)?;
    a.mov(qword_ptr(r12 + cfg::FULL), rcx)?;
    a.mov(rax, qword_ptr(r12 + cfg::PERIOD))?;
    a.sub(rax, qword_ptr(r12 + cfg::WINDOW))?;
    a.shr(rax, 3)?;
    a.mov(qword_ptr(r12 + cfg::JITTER), rax)?;
    a.mov(rax, qword_ptr(r12 + cfg::FD))?;
    a.cmp(rax, 0x7fff_ffff)?;
    a.ja(l.entry_done)?;
    // The descriptor must be the collector's socket.
    a.sub(rsp, 144)?;
    a.mov(eax, SYS_FSTAT)?;
    a.mov(rdi, qword_ptr(r12 + cfg::FD))?;
    a.mov(rsi, rsp)?;
    a.syscall()?;
    a.mov(r13, rax)?;
    a.mov(eax, dword_ptr(rsp + 24))?; // st_mode
    a.and(eax, S_IFMT)?;
    a.mov(r14, qword_ptr(rsp + 8))?;
    a.mov(r15, qword_ptr(rsp))?;
    a.add(rsp, 144)?;
    // Not the collector's socket (close-on-exec: an exec'd program finds
    // the descriptor gone or reused): connect anew, see `reconnect`.
    a.test(r13, r13)?;
    a.jnz(l.reconnect)?;
    a.cmp(eax, S_IFSOCK)?;
    a.jne(l.reconnect)?;
    a.cmp(r14, qword_ptr(r12 + cfg::INODE))?;
    a.jne(l.reconnect)?;
    a.cmp(r15, qword_ptr(r12 + cfg::DEVICE))?;
    a.jne(l.reconnect)?;
    a.set_label(&mut l.connected)?;
    // Process block: anonymous, wiped on fork (required: without it a
    // forked child would re-send its parent's buffered records).
    map_anonymous(a, process::bytes(params.escape_sites))?;
    a.cmp(rax, -4095)?;
    a.jae(l.entry_done)?;
    a.mov(qword_ptr(r12 + cfg::PROCESS), rax)?;
    a.lea(
        rcx,
        qword_ptr(rax + process::library_counters(params.escape_sites)),
    )?;
    a.mov(qword_ptr(r12 + cfg::LIBRARY_COUNTERS), rcx)?;
    a.mov(rdi, rax)?;
    a.mov(eax, SYS_MADVISE)?;
    a.mov(esi, process::bytes(params.escape_sites))?;
    a.mov(edx, MADV_WIPEONFORK)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jnz(l.entry_done)?;
    a.mov(eax, SYS_FCNTL)?;
    a.mov(rdi, qword_ptr(r12 + cfg::FD))?;
    a.mov(esi, F_SETFD)?;
    a.mov(edx, FD_CLOEXEC)?;
    a.syscall()?;
    a.call(l.shared_setup)?;
    a.mov(
        qword_ptr(r12 + cfg::ENABLED),
        if params.has_regions { 0 } else { 1 },
    )?;
    // Spatial samples in sampled recordings only (a full trace has every
    // record).
    let mut spatial_off = a.create_label();
    a.cmp(qword_ptr(r12 + cfg::FULL), 0)?;
    a.jne(spatial_off)?;
    a.mov(rax, qword_ptr(r12 + cfg::SPATIAL_PENDING))?;
    a.mov(qword_ptr(r12 + cfg::SPATIAL_THRESHOLD), rax)?;
    a.set_label(&mut spatial_off)?;
    a.mov(qword_ptr(r12 + cfg::STATE), cfg::STATE_ACTIVE)?;
    // The main thread's slot now, not at its first load in this executable:
    // instrumented libraries find the runtime through it (see
    // `super::library`), so their loads before that one are counted, and
    // so are the executable's that their re-check countdown would hide.
    a.mov(r13, qword_ptr(r12 + cfg::PROCESS))?;
    a.call(l.find_slot)?;
    // `Start`: an image exec'd by a recorded process joins the trace.
    a.call(l.start_message)?;
    a.set_label(&mut l.entry_done)?;
    skip_spatial_checks(a, params)?;
    a.pop(r15)?;
    a.pop(r14)?;
    a.pop(r13)?;
    a.pop(r12)?;
    a.pop(rbp)?;
    a.pop(rbx)?;
    a.pop(rdx)?;
    a.add_instruction(jmp_abs(params.original_entry))?;
    Ok(())
}

/// Fits the spatial checks of the copies to the run (see
/// [`header::SPATIAL_SKIPS`]); the checks are emitted with the default
/// rate's immediates. In a run that takes no spatial samples (threshold
/// still 0 when the entry hook is done: no collector, `--spatial-rate 0`, a
/// full trace, a refused environment) each check is overwritten with its
/// skip, so such a run executes none of them; in a run at another rate or
/// multiplier each check's two immediates are overwritten with the config's
/// (`multiplier >> 32`, `threshold >> 32`: the environment's words are
/// multiples of `2^32`); at the default rate nothing is written. The
/// copies' pages are made writable for the writes and executable again
/// after them. Where `mprotect` refuses, the checks keep the default rate's
/// immediates and the run takes no spatial samples (`spatial` re-tests the
/// config's hash, whose threshold is set to 0). Runs before `_start`, on
/// the only thread; clobbers what the entry hook may clobber (`r12` kept).
/// Libraries' copies (instrumented whole, without an entry hook) keep
/// their checks, emitted never to branch.
fn skip_spatial_checks(a: &mut Asm, params: &RuntimeParams) -> R {
    const PROT_RWX: i32 = 7;
    const PROT_RX: i32 = 5;
    const D: usize = header::SPATIAL_SKIPS;
    let default = super::probe::SpatialHash::default_rate();
    let mut done = a.create_label();
    let mut next = a.create_label();
    let mut patch = a.create_label();
    let mut protect = a.create_label();
    let mut patch_one = a.create_label();
    let mut advance = a.create_label();
    let mut refused = a.create_label();
    a.add_instruction(lea_rip(Register::RBX, params.header_va))?;
    a.mov(r14d, dword_ptr(rbx + (D + 4) as i32))?;
    a.test(r14d, r14d)?;
    a.jz(done)?;
    // r10d: 0 to skip the checks, 1 to write r8d and r9d into them.
    a.xor(r10d, r10d)?;
    a.mov(rax, qword_ptr(r12 + cfg::SPATIAL_THRESHOLD))?;
    a.test(rax, rax)?;
    a.jz(protect)?;
    a.mov(rcx, u64::from(default.multiplier) << 32)?;
    a.cmp(qword_ptr(r12 + cfg::SPATIAL_MULTIPLIER), rcx)?;
    a.jne(patch)?;
    a.mov(rcx, u64::from(default.threshold) << 32)?;
    a.cmp(rax, rcx)?;
    a.je(done)?;
    a.set_label(&mut patch)?;
    a.mov(r8, qword_ptr(r12 + cfg::SPATIAL_MULTIPLIER))?;
    a.shr(r8, 32)?;
    a.mov(r9, rax)?;
    a.shr(r9, 32)?;
    a.mov(r10d, 1)?;
    a.set_label(&mut protect)?;
    a.mov(edi, dword_ptr(rbx + (D + 8) as i32))?;
    a.add(rdi, rbx)?;
    a.mov(esi, dword_ptr(rbx + (D + 12) as i32))?;
    a.add(rsi, rdi)?;
    a.and(rdi, -4096)?;
    a.sub(rsi, rdi)?;
    a.mov(rbp, rdi)?;
    a.mov(r13, rsi)?;
    a.mov(edx, PROT_RWX)?;
    a.mov(eax, SYS_MPROTECT)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jnz(refused)?;
    a.mov(esi, dword_ptr(rbx + D as i32))?;
    a.add(rsi, rbx)?;
    a.set_label(&mut next)?;
    a.mov(edi, dword_ptr(rsi))?;
    a.add(rdi, rbx)?;
    a.mov(ecx, dword_ptr(rsi + 4))?;
    a.movzx(eax, byte_ptr(rsi + 8))?;
    a.movzx(edx, byte_ptr(rsi + 9))?;
    a.add(rsi, 10)?;
    a.test(r10d, r10d)?;
    a.jnz(patch_one)?;
    a.rep().movsb()?;
    a.jmp(advance)?;
    a.set_label(&mut patch_one)?;
    a.mov(dword_ptr(rdi + rax), r8d)?;
    a.mov(dword_ptr(rdi + rdx), r9d)?;
    a.add(rsi, rcx)?;
    a.set_label(&mut advance)?;
    a.dec(r14d)?;
    a.jnz(next)?;
    a.mov(rdi, rbp)?;
    a.mov(rsi, r13)?;
    a.mov(edx, PROT_RX)?;
    a.mov(eax, SYS_MPROTECT)?;
    a.syscall()?;
    a.jmp(done)?;
    a.set_label(&mut refused)?;
    a.mov(qword_ptr(r12 + cfg::SPATIAL_THRESHOLD), 0)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// parse_u64(rsi) -> rax value, ecx digits, rsi past the digits.
fn emit_parse_u64(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.parse_u64)?;
    a.xor(eax, eax)?;
    a.xor(ecx, ecx)?;
    a.set_label(&mut l.parse_loop)?;
    a.movzx(edx, byte_ptr(rsi))?;
    a.sub(edx, b'0' as u32)?;
    a.cmp(edx, 9)?;
    a.ja(l.parse_done)?;
    a.imul_3(rax, rax, 10)?;
    a.add(rax, rdx)?;
    a.inc(rsi)?;
    a.inc(ecx)?;
    a.jmp(l.parse_loop)?;
    a.set_label(&mut l.parse_done)?;
    a.ret()?;
    Ok(())
}

/// shared_setup(rbp = envp): maps the shared chunks named by
/// SHARED_ENV (after checking the descriptor is the collector's memfd)
/// and closes the descriptor, so the program never sees it. Any failure
/// leaves cfg.SHARED at 0: every message then goes through the socket.
fn emit_shared_setup(a: &mut Asm, l: &mut Labels) -> R {
    let mut shared_close = a.create_label();
    let mut shared_done = a.create_label();
    a.set_label(&mut l.shared_setup)?;
    a.mov(rbx, rbp)?;
    find_env(a, l.shared_prefix, protocol::SHARED_ENV, shared_done)?;
    // rsi: "<fd>:<inode>:<device>:<chunks>" into r13, r14, r15, rbx.
    for (i, reg) in [r13, r14, r15, rbx].into_iter().enumerate() {
        a.call(l.parse_u64)?;
        a.test(ecx, ecx)?;
        a.jz(shared_done)?;
        a.mov(reg, rax)?;
        let terminator = if i == 3 { 0 } else { b':' as u32 };
        a.cmp(byte_ptr(rsi), terminator)?;
        a.jne(shared_done)?;
        a.inc(rsi)?;
    }
    a.test(rbx, rbx)?;
    a.jz(shared_done)?;
    a.cmp(rbx, protocol::SHARED_CHUNKS_MAX as i32)?;
    a.ja(shared_done)?;
    a.cmp(r13, 0x7fff_ffff)?;
    a.ja(shared_done)?;
    a.sub(rsp, 144)?;
    a.mov(eax, SYS_FSTAT)?;
    a.mov(rdi, r13)?;
    a.mov(rsi, rsp)?;
    a.syscall()?;
    a.mov(rcx, qword_ptr(rsp + 8))?; // st_ino
    a.mov(rdx, qword_ptr(rsp))?; // st_dev
    a.add(rsp, 144)?;
    a.test(rax, rax)?;
    a.jnz(shared_done)?;
    a.cmp(rcx, r14)?;
    a.jne(shared_done)?;
    a.cmp(rdx, r15)?;
    a.jne(shared_done)?;
    a.mov(rsi, rbx)?;
    a.shl(rsi, protocol::SHARED_CHUNK_BYTES.trailing_zeros())?;
    a.add(rsi, protocol::SHARED_STATE_BYTES as i32)?;
    a.mov(eax, SYS_MMAP)?;
    a.xor(edi, edi)?;
    a.mov(edx, 3)?; // PROT_READ | PROT_WRITE
    a.mov(r10d, MAP_SHARED)?;
    a.mov(r8, r13)?;
    a.xor(r9d, r9d)?;
    a.syscall()?;
    a.cmp(rax, -4095)?;
    a.jae(shared_close)?;
    a.mov(qword_ptr(r12 + cfg::SHARED), rax)?;
    a.mov(qword_ptr(r12 + cfg::SHARED_CHUNKS), rbx)?;
    a.set_label(&mut shared_close)?;
    a.mov(eax, SYS_CLOSE)?;
    a.mov(rdi, r13)?;
    a.syscall()?;
    a.set_label(&mut shared_done)?;
    a.ret()?;
    Ok(())
}

/// reconnect (jumped to from the entry hook, rbp = envp): the environment
/// names the collector's socket, but this process does not hold it (an
/// exec'd or spawned program). Connects to the abstract address
/// [`protocol::LISTEN_ENV`] names and takes the new connection as its
/// socket (back to `connected`); without the variable, or if the
/// connection fails, the program runs unrecorded (`entry_done`).
fn emit_reconnect(a: &mut Asm, l: &mut Labels) -> R {
    // sockaddr_un (110 bytes) at rsp, a `struct stat` at rsp + 112.
    const SOCKADDR: i32 = 112 + 144;
    let mut copy = a.create_label();
    let mut copied = a.create_label();
    let mut close = a.create_label();
    let mut fail = a.create_label();
    a.set_label(&mut l.reconnect)?;
    a.mov(rbx, rbp)?;
    find_env(a, l.listen_prefix, protocol::LISTEN_ENV, l.entry_done)?;
    // sockaddr_un: AF_UNIX, a NUL (abstract), then the name.
    a.sub(rsp, SOCKADDR)?;
    a.mov(word_ptr(rsp), AF_UNIX)?;
    a.mov(byte_ptr(rsp + 2), 0)?;
    a.xor(ecx, ecx)?;
    a.set_label(&mut copy)?;
    a.movzx(eax, byte_ptr(rsi + rcx))?;
    a.test(eax, eax)?;
    a.jz(copied)?;
    a.cmp(ecx, protocol::LISTEN_NAME_MAX as u32)?;
    a.jae(fail)?;
    a.mov(byte_ptr(rsp + rcx + 3), al)?;
    a.inc(ecx)?;
    a.jmp(copy)?;
    a.set_label(&mut copied)?;
    a.lea(r14, qword_ptr(rcx + 3))?;
    a.mov(eax, SYS_SOCKET)?;
    a.mov(edi, AF_UNIX)?;
    a.mov(esi, SOCK_SEQPACKET | SOCK_CLOEXEC)?;
    a.xor(edx, edx)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.js(fail)?;
    a.mov(r13, rax)?;
    a.mov(eax, SYS_CONNECT)?;
    a.mov(rdi, r13)?;
    a.mov(rsi, rsp)?;
    a.mov(rdx, r14)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jnz(close)?;
    // The connection's identity, which `send` checks before each message.
    a.mov(eax, SYS_FSTAT)?;
    a.mov(rdi, r13)?;
    a.lea(rsi, qword_ptr(rsp + 112))?;
    a.syscall()?;
    a.mov(r14, qword_ptr(rsp + 112 + 8))?;
    a.mov(r15, qword_ptr(rsp + 112))?;
    a.test(rax, rax)?;
    a.jnz(close)?;
    a.add(rsp, SOCKADDR)?;
    a.mov(qword_ptr(r12 + cfg::FD), r13)?;
    a.mov(qword_ptr(r12 + cfg::INODE), r14)?;
    a.mov(qword_ptr(r12 + cfg::DEVICE), r15)?;
    a.jmp(l.connected)?;
    a.set_label(&mut close)?;
    a.mov(eax, SYS_CLOSE)?;
    a.mov(rdi, r13)?;
    a.syscall()?;
    a.set_label(&mut fail)?;
    a.add(rsp, SOCKADDR)?;
    a.jmp(l.entry_done)?;
    Ok(())
}

fn emit_env_prefixes(a: &mut Asm, l: &mut Labels) -> R {
    a.set_label(&mut l.prefix)?;
    a.db(env_prefix(protocol::RECORDER_ENV).as_bytes())?;
    a.set_label(&mut l.shared_prefix)?;
    a.db(env_prefix(protocol::SHARED_ENV).as_bytes())?;
    a.set_label(&mut l.listen_prefix)?;
    a.db(env_prefix(protocol::LISTEN_ENV).as_bytes())?;
    a.set_label(&mut l.proc_self_exe)?;
    a.db(b"/proc/self/exe\0")?;
    a.set_label(&mut l.proc_self_maps)?;
    a.db(b"/proc/self/maps\0")?;
    Ok(())
}

/// Takes back the thread's grant, time or spatial (inside a cold path,
/// flags saved; clobbers rax, rcx, rdx), and commits the records claimed
/// under it: they join `COUNT` and, from a time grant, `EXECUTIONS` and
/// leave `REMAINING`. With `interrupted`, a claimed record still holding
/// [`protocol::UNWRITTEN_MARKER`] — this cold path runs in a signal
/// handler that interrupted a hot path between its claim and its write —
/// commits nothing and branches there instead (the
/// records stay claimed in `CLAIMED`, and the cold path must leave the
/// buffer alone: the interrupted writer still owns its record); without,
/// such records are committed as they are and the collector counts them
/// as dropped (the exit hook: the writer will not run again).
fn take_grant(a: &mut Asm, interrupted: Option<CodeLabel>) -> R {
    let mut done = a.create_label();
    a.mov(rax, CLAIM_REVOKED)?;
    a.xchg(qword_ptr(rbx + slot::CLAIM), rax)?;
    a.mov(rcx, CLAIM_REVOKED)?;
    a.xchg(qword_ptr(rbx + slot::SPATIAL_CLAIM), rcx)?;
    open_claim(a)?;
    claimed_end(a)?;
    a.mov(qword_ptr(rbx + slot::CLAIMED), rax)?;
    record_address(a, rcx)?;
    a.cmp(rax, rcx)?;
    a.jbe(done)?;
    if let Some(interrupted) = interrupted {
        // From the last claimed record back: an unwritten one belongs to a
        // writer interrupted on this thread's stack, so it is among the
        // latest claims. A handler whose every load re-enters here while
        // the code it interrupted holds a record then finds it at once; a
        // forward scan read the whole grant per load (a 5,441-record grant
        // of a full trace: the handler outlasted its timer's period and the
        // program never resumed to write its record).
        let mut scan = a.create_label();
        a.mov(rdx, rax)?;
        a.set_label(&mut scan)?;
        a.sub(rdx, RECORD_BYTES as i32)?;
        a.cmp(dword_ptr(rdx), protocol::UNWRITTEN_MARKER)?;
        a.je(interrupted)?;
        a.cmp(rdx, rcx)?;
        a.ja(scan)?;
    }
    // (end − start) / 12: exact, so ÷4 then × 3⁻¹ mod 2⁶⁴.
    a.sub(rax, rcx)?;
    a.shr(rax, 2)?;
    a.mov(rdx, 0xaaaa_aaaa_aaaa_aaabu64)?;
    a.imul_2(rax, rdx)?;
    a.add(qword_ptr(rbx + slot::COUNT), rax)?;
    a.cmp(qword_ptr(rbx + slot::SPATIAL_GRANT), 0)?;
    a.jne(done)?;
    a.add(qword_ptr(rbx + slot::EXECUTIONS), rax)?;
    a.sub(qword_ptr(rbx + slot::REMAINING), rax)?;
    a.set_label(&mut done)?;
    a.mov(qword_ptr(rbx + slot::CLAIMED), 0)
}

/// `rax = ` the lower of the two claim words in rax (`CLAIM`) and rcx
/// (`SPATIAL_CLAIM`): the one of the open grant, if any (the other is
/// at least [`CLAIM_REVOKED`], or both are 0 in a slot no grant was given
/// yet).
fn open_claim(a: &mut Asm) -> R {
    a.cmp(rax, rcx)?;
    a.cmova(rax, rcx)
}

/// `rax = ` the end of the records claimed under the grant of the slot in
/// rbx, given its `CLAIM` value in rax (clobbers rcx): `CLAIMED` once the
/// grant was taken back, else `CLAIM` capped at `LIMIT` (failed claims
/// overshoot it).
fn claimed_end(a: &mut Asm) -> R {
    let mut live = a.create_label();
    let mut done = a.create_label();
    a.mov(rcx, CLAIM_REVOKED)?;
    a.cmp(rax, rcx)?;
    a.jb(live)?;
    a.mov(rax, qword_ptr(rbx + slot::CLAIMED))?;
    a.jmp(done)?;
    a.set_label(&mut live)?;
    a.cmp(rax, qword_ptr(rbx + slot::LIMIT))?;
    a.jbe(done)?;
    a.mov(rax, qword_ptr(rbx + slot::LIMIT))?;
    a.set_label(&mut done)?;
    a.zero_bytes()
}

/// `reg = ` address of record `COUNT` of the slot in rbx.
fn record_address(a: &mut Asm, reg: AsmRegister64) -> R {
    a.mov(reg, qword_ptr(rbx + slot::COUNT))?;
    a.lea(reg, qword_ptr(reg + reg * 2))?;
    a.lea(reg, qword_ptr(rbx + reg * 4 + slot::RECORDS))
}

/// Grants the hot paths `min(REMAINING − 1, CAPACITY − 1 − COUNT)` appends
/// when a window is open, or the spatial checks' stubs
/// `min(SPATIAL_GRANT_RECORDS, CAPACITY − 1 − COUNT)` spatial appends when
/// none is and the run takes spatial samples (inside a cold path after
/// [`take_grant`], r12 = the config, flags saved; clobbers rax, rcx, rdx):
/// marks the granted records unwritten, then opens the grant with one
/// store of its claim word.
fn give_grant(a: &mut Asm) -> R {
    let mut none = a.create_label();
    let mut spatial = a.create_label();
    a.mov(rax, qword_ptr(rbx + slot::REMAINING))?;
    a.sub(rax, 1)?;
    a.jb(spatial)?; // no window open
    a.jz(none)?; // only the window's last record left
    a.mov(qword_ptr(rbx + slot::SPATIAL_GRANT), 0)?;
    grant_records(a, slot::CLAIM, none)?;
    a.jmp(none)?;
    // Outside every window the only appends are spatial records; the
    // config decides as `spatial` does (the region switch is checked by
    // the stubs themselves: another thread may turn it off).
    a.set_label(&mut spatial)?;
    a.cmp(qword_ptr(r12 + cfg::SPATIAL_THRESHOLD), 0)?;
    a.je(none)?;
    a.cmp(qword_ptr(r12 + cfg::ENABLED), 0)?;
    a.je(none)?;
    a.mov(qword_ptr(rbx + slot::SPATIAL_GRANT), 1)?;
    a.mov(eax, SPATIAL_GRANT_RECORDS)?;
    grant_records(a, slot::SPATIAL_CLAIM, none)?;
    a.set_label(&mut none)?;
    // A zero-byte instruction, so the caller may label what follows.
    a.zero_bytes()
}

/// Grants `min(rax, CAPACITY − 1 − COUNT)` records through the claim word
/// at `claim` (to `none` if the buffer has no room left).
fn grant_records(a: &mut Asm, claim: i32, none: CodeLabel) -> R {
    let mut sized = a.create_label();
    let mut fill = a.create_label();
    a.mov(ecx, (slot::CAPACITY - 1) as u32)?;
    a.sub(rcx, qword_ptr(rbx + slot::COUNT))?;
    a.jle(none)?;
    a.cmp(rax, rcx)?;
    a.jbe(sized)?;
    a.mov(rax, rcx)?;
    a.set_label(&mut sized)?;
    record_address(a, rcx)?;
    a.lea(rax, qword_ptr(rax + rax * 2))?;
    a.lea(rax, qword_ptr(rcx + rax * 4))?;
    a.mov(rdx, rcx)?;
    a.set_label(&mut fill)?;
    a.mov(dword_ptr(rdx), protocol::UNWRITTEN_MARKER)?;
    a.add(rdx, RECORD_BYTES as i32)?;
    a.cmp(rdx, rax)?;
    a.jb(fill)?;
    a.mov(qword_ptr(rbx + slot::LIMIT), rax)?;
    a.mov(qword_ptr(rbx + claim), rcx)
}

/// Fills the header of the message of the slot in rbx, all but its kind,
/// from the slot (`count` = `COUNT`, left in rcx) and the process block in
/// r13 (clobbers rax). Executions that found the slot busy count as
/// executions and as dropped records.
fn fill_header(a: &mut Asm) -> R {
    a.mov(
        dword_ptr(rbx + (slot::MESSAGE + protocol::offsets::MAGIC)),
        MESSAGE_MAGIC,
    )?;
    a.mov(rax, qword_ptr(r13 + process::PID))?;
    a.mov(
        dword_ptr(rbx + (slot::MESSAGE + protocol::offsets::PID)),
        eax,
    )?;
    a.mov(rax, qword_ptr(rbx + slot::TID))?;
    a.mov(
        dword_ptr(rbx + (slot::MESSAGE + protocol::offsets::TID)),
        eax,
    )?;
    a.mov(rax, qword_ptr(rbx + slot::SERIAL))?;
    a.mov(
        dword_ptr(rbx + (slot::MESSAGE + protocol::offsets::SLOT)),
        eax,
    )?;
    a.mov(rcx, qword_ptr(rbx + slot::COUNT))?;
    a.mov(
        dword_ptr(rbx + (slot::MESSAGE + protocol::offsets::COUNT)),
        ecx,
    )?;
    a.mov(rax, qword_ptr(rbx + slot::EXECUTIONS))?;
    a.add(rax, qword_ptr(rbx + slot::NESTED))?;
    a.mov(
        qword_ptr(rbx + (slot::MESSAGE + protocol::offsets::EXECUTIONS)),
        rax,
    )?;
    a.mov(rax, qword_ptr(rbx + slot::DROPPED))?;
    a.add(rax, qword_ptr(rbx + slot::NESTED))?;
    a.mov(
        qword_ptr(rbx + (slot::MESSAGE + protocol::offsets::DROPPED)),
        rax,
    )?;
    Ok(())
}

/// `mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
/// -1, 0)`: rax = the mapping, or an error above `-4096`.
fn map_anonymous(a: &mut Asm, bytes: i32) -> R {
    a.mov(eax, SYS_MMAP)?;
    a.xor(edi, edi)?;
    a.mov(esi, bytes)?;
    a.mov(edx, 3)?; // PROT_READ | PROT_WRITE
    a.mov(r10d, 0x22)?; // MAP_PRIVATE | MAP_ANONYMOUS
    a.mov(r8, -1i64)?;
    a.xor(r9d, r9d)?;
    a.syscall()
}

/// `process_vm_readv` of the countdown and slot pointer of the owner of
/// slot `rdx` into `[rsp + 32]` and `[rsp + 40]` (the caller pushed `rdx`,
/// then reserved 48 bytes at `rsp`), without faulting if its TCB is gone.
/// Leaves `rax` = 16 on success; clobbers the system call's registers, and
/// restores `rdx` from `[rsp + 48]`.
fn read_owner_countdown(a: &mut Asm) -> R {
    a.lea(rax, qword_ptr(rsp + 32))?;
    a.mov(qword_ptr(rsp), rax)?;
    a.mov(qword_ptr(rsp + 8), 16)?;
    a.mov(rax, qword_ptr(rdx + slot::TCB))?;
    a.add(rax, TCB_COUNTDOWN as i32)?;
    a.mov(qword_ptr(rsp + 16), rax)?;
    a.mov(qword_ptr(rsp + 24), 16)?;
    a.mov(eax, SYS_PROCESS_VM_READV)?;
    a.mov(rdi, qword_ptr(r13 + process::PID))?;
    a.mov(rsi, rsp)?;
    a.mov(edx, 1)?;
    a.lea(r10, qword_ptr(rsp + 16))?;
    a.mov(r8d, 1)?;
    a.xor(r9d, r9d)?;
    a.syscall()?;
    a.mov(rdx, qword_ptr(rsp + 48))
}

/// At a region's begin (recording still off; `rbx` = the beginning
/// thread's slot, `r13` = the process block): every other thread is on a
/// re-check countdown of at most `COUNTDOWN_RECHECK` (in a full trace 0,
/// so nothing is pending there) and runs that many
/// loads in the region before it notices — neither recorded nor counted (a
/// rayon pool's workers lost up to 4096 loads each this way while the trace
/// said nothing was lost). Each one's countdown goes into its slot's
/// [`slot::UNAWARE`], for its cold path (or the region's end) to count:
/// as executions (so a sampled trace's ρ stays exact), and in a full trace
/// also as dropped records (as a signal handler's re-entries are). Making the threads notice at once instead would mean writing
/// their countdowns from this thread, racing with their own non-atomic
/// updates of it.
fn unaware_at_begin(a: &mut Asm) -> R {
    let mut walk = a.create_label();
    let mut next = a.create_label();
    let mut skip = a.create_label();
    let mut walked = a.create_label();
    a.cmp(qword_ptr(r12 + cfg::ENABLED), 0)?;
    a.jne(walked)?;
    a.mov(rdx, qword_ptr(r13 + process::HEAD))?;
    a.set_label(&mut walk)?;
    a.test(rdx, rdx)?;
    a.jz(walked)?;
    a.cmp(rdx, rbx)?;
    a.je(next)?;
    a.push(rdx)?;
    a.sub(rsp, 48)?;
    read_owner_countdown(a)?;
    a.cmp(rax, 16)?;
    a.jne(skip)?;
    a.cmp(qword_ptr(rsp + 40), rdx)?;
    a.jne(skip)?;
    a.mov(rax, qword_ptr(rsp + 32))?;
    // Only re-check countdowns (a wrapped, negative one is left alone).
    a.cmp(rax, COUNTDOWN_RECHECK as i32)?;
    a.ja(skip)?;
    a.mov(qword_ptr(rdx + slot::UNAWARE), rax)?;
    a.set_label(&mut skip)?;
    a.add(rsp, 48)?;
    a.pop(rdx)?;
    a.set_label(&mut next)?;
    a.mov(rdx, qword_ptr(rdx + slot::NEXT))?;
    a.jmp(walk)?;
    a.set_label(&mut walked)?;
    a.zero_bytes()
}

/// At a region's end (`rbx`, `r12`, `r13` as for [`unaware_at_begin`]): a
/// thread that still has not noticed the region ran its `UNAWARE` minus
/// its countdown now of loads in it, uncounted: they are added to the
/// slot's executions (sent with its final flush) and, in a full trace, to
/// the process's dropped records (sent at exit). A thread whose countdown cannot
/// be read (it exited) counts in full: better too many than a trace that
/// claims to be whole. A busy thread is in its cold path and counts for
/// itself.
fn unaware_at_end(a: &mut Asm) -> R {
    let mut walk = a.create_label();
    let mut next = a.create_label();
    let mut counted = a.create_label();
    let mut full = a.create_label();
    let mut walked = a.create_label();
    a.mov(rdx, qword_ptr(r13 + process::HEAD))?;
    a.set_label(&mut walk)?;
    a.test(rdx, rdx)?;
    a.jz(walked)?;
    a.cmp(rdx, rbx)?;
    a.je(next)?;
    a.cmp(qword_ptr(rdx + slot::UNAWARE), 0)?;
    a.je(next)?;
    a.cmp(qword_ptr(rdx + slot::BUSY), 0)?;
    a.jne(next)?;
    a.push(rdx)?;
    a.sub(rsp, 48)?;
    read_owner_countdown(a)?;
    a.mov(rcx, qword_ptr(rdx + slot::UNAWARE))?;
    a.cmp(rax, 16)?;
    a.jne(full)?;
    a.cmp(qword_ptr(rsp + 40), rdx)?;
    a.jne(full)?;
    a.mov(rax, qword_ptr(rsp + 32))?;
    // A countdown above what was pending: the thread noticed meanwhile
    // (and counted for itself).
    a.cmp(rax, rcx)?;
    a.ja(counted)?;
    a.sub(rcx, rax)?;
    a.set_label(&mut full)?;
    // Executions the owner did not count; in a full trace, records lost.
    a.lock().add(qword_ptr(rdx + slot::EXECUTIONS), rcx)?;
    a.cmp(qword_ptr(r12 + cfg::FULL), 0)?;
    a.je(counted)?;
    a.lock().add(qword_ptr(r13 + process::DROPPED), rcx)?;
    a.set_label(&mut counted)?;
    a.mov(qword_ptr(rdx + slot::UNAWARE), 0)?;
    a.add(rsp, 48)?;
    a.pop(rdx)?;
    a.set_label(&mut next)?;
    a.mov(rdx, qword_ptr(rdx + slot::NEXT))?;
    a.jmp(walk)?;
    a.set_label(&mut walked)?;
    a.zero_bytes()
}

/// The countdown of a thread while recording is switched off (`r12` = the
/// config): a sampled run re-checks the switch every
/// [`COUNTDOWN_RECHECK`] loads (the loads a thread runs in a region before
/// noticing it are counted, not recorded: see [`unaware_at_begin`]); a full
/// trace re-checks at every load, so that no thread runs a load of a
/// region unrecorded — a region is process-wide, and a full trace holds
/// every load in it. Costs a runtime call per load outside regions, in
/// full traces only.
fn recheck_countdown(a: &mut Asm) -> R {
    let mut full = a.create_label();
    let mut done = a.create_label();
    a.cmp(qword_ptr(r12 + cfg::FULL), 0)?;
    a.jne(full)?;
    a.mov(fs(TCB_COUNTDOWN), COUNTDOWN_RECHECK as i32)?;
    a.jmp(done)?;
    a.set_label(&mut full)?;
    a.mov(fs(TCB_COUNTDOWN), 0)?;
    a.set_label(&mut done)?;
    a.zero_bytes()
}

/// Enters the runtime from a cold path (BUSY checked to be 0 by the caller).
fn enter_cold(a: &mut Asm) -> R {
    a.mov(qword_ptr(rbx + slot::BUSY), 1)
}

/// Leaves the runtime from a cold path.
fn leave_cold(a: &mut Asm) -> R {
    a.inc(qword_ptr(rbx + slot::SEQ))?;
    a.mov(qword_ptr(rbx + slot::BUSY), 0)
}

/// Saves what the cold paths use besides rax, rcx, rbx (already pushed).
fn save_rest(a: &mut Asm) -> R {
    a.pushfq()?;
    for reg in [rdx, rsi, rdi, rbp, r8, r9, r10, r11, r12, r13, r14, r15] {
        a.push(reg)?;
    }
    Ok(())
}

fn restore_rest(a: &mut Asm) -> R {
    for reg in [r15, r14, r13, r12, r11, r10, r9, r8, rbp, rdi, rsi, rdx] {
        a.pop(reg)?;
    }
    a.popfq()
}

fn save_all(a: &mut Asm) -> R {
    a.pushfq()?;
    for reg in [
        rax, rcx, rdx, rbx, rsi, rdi, rbp, r8, r9, r10, r11, r12, r13, r14, r15,
    ] {
        a.push(reg)?;
    }
    Ok(())
}

fn restore_all(a: &mut Asm) -> R {
    for reg in [
        r15, r14, r13, r12, r11, r10, r9, r8, rbp, rdi, rsi, rbx, rdx, rcx, rax,
    ] {
        a.pop(reg)?;
    }
    a.popfq()
}

struct Labels {
    record: CodeLabel,
    probe_append: CodeLabel,
    probe_append_tracked: CodeLabel,
    record_tracked: CodeLabel,
    spatial: CodeLabel,
    spatial_append: CodeLabel,
    cold_saved: CodeLabel,
    to_cold_entry: CodeLabel,
    init_slot: CodeLabel,
    cold_entry: CodeLabel,
    cold_active: CodeLabel,
    cold_leave: CodeLabel,
    cold_interrupted: CodeLabel,
    cold_forking: CodeLabel,
    cold_body: CodeLabel,
    cold_enabled: CodeLabel,
    cold_open_window: CodeLabel,
    window_sized: CodeLabel,
    cold_record: CodeLabel,
    cold_after_saved: CodeLabel,
    cold_check_full: CodeLabel,
    cold_release: CodeLabel,
    cold_nested: CodeLabel,
    cold_return: CodeLabel,
    ensure_process: CodeLabel,
    ensure_done: CodeLabel,
    find_slot: CodeLabel,
    new_slot: CodeLabel,
    new_slot_failed: CodeLabel,
    register_loop: CodeLabel,
    rand_below: CodeLabel,
    next_skip: CodeLabel,
    append: CodeLabel,
    append_room: CodeLabel,
    check_thread: CodeLabel,
    check_thread_done: CodeLabel,
    check_thread_marker: CodeLabel,
    check_thread_marker_done: CodeLabel,
    flush: CodeLabel,
    flush_sent: CodeLabel,
    send: CodeLabel,
    send_retry: CodeLabel,
    send_yield: CodeLabel,
    send_bad_fd: CodeLabel,
    send_failed: CodeLabel,
    fold_live: CodeLabel,
    fold_live_skip: CodeLabel,
    send_region: CodeLabel,
    region_len_ok: CodeLabel,
    region_begin: CodeLabel,
    region_begin_empty: CodeLabel,
    region_begin_done: CodeLabel,
    region_end: CodeLabel,
    region_end_done: CodeLabel,
    region_begin_unnamed: CodeLabel,
    region_end_unnamed: CodeLabel,
    region_toggle: CodeLabel,
    region_samples: CodeLabel,
    fini: CodeLabel,
    fini_body: CodeLabel,
    exit_now: CodeLabel,
    exec_flush: CodeLabel,
    before_fork: CodeLabel,
    after_fork: CodeLabel,
    before_spawn: CodeLabel,
    after_spawn: CodeLabel,
    process_message: CodeLabel,
    send_escapes: CodeLabel,
    fini_others: CodeLabel,
    fini_loop: CodeLabel,
    fini_staging_ready: CodeLabel,
    fini_retry: CodeLabel,
    fini_count_ok: CodeLabel,
    fini_wait: CodeLabel,
    fini_unflushed: CodeLabel,
    flush_unchecked: CodeLabel,
    fini_unfolded: CodeLabel,
    fini_next: CodeLabel,
    fini_exit_message: CodeLabel,
    fini_done: CodeLabel,
    entry: CodeLabel,
    entry_done: CodeLabel,
    parse_u64: CodeLabel,
    parse_loop: CodeLabel,
    parse_done: CodeLabel,
    prefix: CodeLabel,
    shared_prefix: CodeLabel,
    listen_prefix: CodeLabel,
    reconnect: CodeLabel,
    connected: CodeLabel,
    start_message: CodeLabel,
    proc_self_exe: CodeLabel,
    shared_setup: CodeLabel,
    objects_message: CodeLabel,
    proc_self_maps: CodeLabel,
}

impl Labels {
    fn new(a: &mut Asm) -> Labels {
        let mut n = || a.create_label();
        Labels {
            record: n(),
            probe_append: n(),
            probe_append_tracked: n(),
            record_tracked: n(),
            spatial: n(),
            spatial_append: n(),
            cold_saved: n(),
            to_cold_entry: n(),
            init_slot: n(),
            cold_entry: n(),
            cold_active: n(),
            cold_leave: n(),
            cold_interrupted: n(),
            cold_forking: n(),
            cold_body: n(),
            cold_enabled: n(),
            cold_open_window: n(),
            window_sized: n(),
            cold_record: n(),
            cold_after_saved: n(),
            cold_check_full: n(),
            cold_release: n(),
            cold_nested: n(),
            cold_return: n(),
            ensure_process: n(),
            ensure_done: n(),
            find_slot: n(),
            new_slot: n(),
            new_slot_failed: n(),
            register_loop: n(),
            rand_below: n(),
            next_skip: n(),
            append: n(),
            append_room: n(),
            check_thread: n(),
            check_thread_done: n(),
            check_thread_marker: n(),
            check_thread_marker_done: n(),
            flush: n(),
            flush_sent: n(),
            send: n(),
            send_retry: n(),
            send_yield: n(),
            send_bad_fd: n(),
            send_failed: n(),
            fold_live: n(),
            fold_live_skip: n(),
            send_region: n(),
            region_len_ok: n(),
            region_begin: n(),
            region_begin_empty: n(),
            region_begin_done: n(),
            region_end: n(),
            region_end_done: n(),
            region_begin_unnamed: n(),
            region_end_unnamed: n(),
            region_toggle: n(),
            region_samples: n(),
            fini: n(),
            fini_body: n(),
            exit_now: n(),
            exec_flush: n(),
            before_fork: n(),
            after_fork: n(),
            before_spawn: n(),
            after_spawn: n(),
            process_message: n(),
            fini_others: n(),
            fini_loop: n(),
            fini_staging_ready: n(),
            fini_retry: n(),
            fini_count_ok: n(),
            fini_wait: n(),
            fini_unflushed: n(),
            flush_unchecked: n(),
            fini_unfolded: n(),
            fini_next: n(),
            fini_exit_message: n(),
            fini_done: n(),
            entry: n(),
            entry_done: n(),
            parse_u64: n(),
            parse_loop: n(),
            parse_done: n(),
            prefix: n(),
            shared_prefix: n(),
            shared_setup: n(),
            send_escapes: n(),
            listen_prefix: n(),
            reconnect: n(),
            connected: n(),
            start_message: n(),
            proc_self_exe: n(),
            objects_message: n(),
            proc_self_maps: n(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};

    fn params() -> RuntimeParams {
        RuntimeParams {
            code_va: 0x10_0000,
            header_va: 0x10_0000 - 64,
            state_va: 0x20_0000,
            original_entry: 0x1040,
            original_fini: Some(0x1200),
            has_regions: false,
            escape_sites: 3,
            cpu_features: 0,
        }
    }

    #[test]
    fn runtime_assembles_and_decodes_cleanly() {
        let rt = generate(&params()).unwrap();
        assert!(rt.code.len() > 500, "{} bytes", rt.code.len());
        for ip in [
            rt.record,
            rt.record_tracked,
            rt.probe_append,
            rt.probe_append_tracked,
            rt.spatial,
            rt.entry,
            rt.fini,
            rt.region_begin,
            rt.region_end,
            rt.region_begin_unnamed,
            rt.region_end_unnamed,
            rt.region_toggle,
            rt.region_samples,
        ] {
            assert!(ip >= 0x10_0000 && ip < 0x10_0000 + rt.code.len() as u64);
        }
        // Everything up to the env prefix decodes to valid instructions.
        let mut decoder = Decoder::with_ip(64, &rt.code, 0x10_0000, DecoderOptions::NONE);
        let mut formatter = IntelFormatter::new();
        let mut text = String::new();
        let mut saw_fs_countdown = false;
        while decoder.can_decode() {
            let insn = decoder.decode();
            if insn.is_invalid() {
                break;
            }
            text.clear();
            formatter.format(&insn, &mut text);
            if text.contains("fs:[38h]") {
                saw_fs_countdown = true;
            }
        }
        assert!(saw_fs_countdown);
    }

    /// Every count of escape sites assembles (an executable without any
    /// still sends its libraries' counts), and so does a library's runtime
    /// with its registration.
    #[test]
    fn runtimes_assemble_with_any_number_of_escape_sites() {
        for sites in [0, 1, process::MAX_ESCAPE_SITES] {
            let params = RuntimeParams {
                escape_sites: sites,
                ..params()
            };
            let rt = generate(&params).unwrap();
            assert_eq!(rt.escape_register, 0);
            assert!(
                process::bytes(sites)
                    >= process::library_counters(sites)
                        + super::super::library::MAX_OBJECT as i32 * process::LIBRARY_COUNTER_BYTES
            );
            let library = super::super::library::generate(0x30_0000, 0x40_0000, 1, sites)
                .unwrap_or_else(|e| panic!("{sites} sites: {e}"));
            assert!(
                (0x30_0000..0x30_0000 + library.code.len() as u64)
                    .contains(&library.escape_register)
            );
        }
    }

    #[test]
    fn hot_path_restores_the_flags_it_changes() {
        // From `record` to the first ret, flags may change only between
        // `seto al; lahf` and `add al, 0x7f; sahf`, which keep and restore
        // them (OF through al, the rest through ah).
        let rt = generate(&params()).unwrap();
        let offset = (rt.record - 0x10_0000) as usize;
        let mut decoder = Decoder::with_ip(64, &rt.code[offset..], rt.record, DecoderOptions::NONE);
        let (mut saved, mut previous, mut restores) = (false, Code::INVALID, 0);
        loop {
            let insn = decoder.decode();
            match insn.code() {
                Code::Lahf => {
                    assert_eq!(previous, Code::Seto_rm8, "OF kept before lahf");
                    saved = true;
                }
                Code::Sahf => {
                    assert_eq!(previous, Code::Add_AL_imm8, "OF restored before sahf");
                    saved = false;
                    restores += 1;
                }
                Code::Retnq => break,
                _ => assert!(
                    saved || insn.rflags_modified() == 0,
                    "{:?} at {:#x} modifies unsaved flags",
                    insn.code(),
                    insn.ip()
                ),
            }
            previous = insn.code();
        }
        assert_eq!(restores, 1);
        assert!(!saved);
    }
}
