//! The errors of the Intel PT backend ([`PtError`]).
//!
//! The text is the line `cargo memgaze` prints after `error: ` (or a check
//! of `cargo memgaze doctor` shows); a step that fails because of another
//! names itself and keeps the other as its source ([`PtError::Context`]).

use super::sysfs::FormatError;
use memgaze_trace::TraceError;
use std::io;
use std::num::ParseIntError;
use std::path::PathBuf;

/// The backend's `Result`.
pub(crate) type Result<T, E = PtError> = std::result::Result<T, E>;

/// Why probing, configuring, collecting or reconstructing failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PtError {
    /// A system call or a file operation failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A number in a sysfs or procfs file that does not parse.
    #[error(transparent)]
    ParseInt(#[from] ParseIntError),
    /// A PMU `format/*` file that does not parse, or a value that does not
    /// fit its field.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// An executable goblin cannot read.
    #[error(transparent)]
    Elf(#[from] goblin::error::Error),
    /// The trace could not be written.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The CPU has no `ptwrite` (`caps` = what `intel_pt caps/ptwrite`
    /// holds, or `missing`).
    #[error("the CPU has no PTWRITE (intel_pt caps/ptwrite is {caps})")]
    NoPtwrite {
        /// The capability file's value.
        caps: String,
    },
    /// A PSB period the CPU does not allow.
    #[error("psb_period {period} is not one the CPU allows (caps/psb_periods = {allowed:#x})")]
    PsbPeriodNotAllowed {
        /// The period asked for.
        period: u32,
        /// The bit mask of allowed periods.
        allowed: u64,
    },
    /// A PSB period was asked for, but the CPU's is fixed.
    #[error("the CPU has a fixed PSB period (intel_pt caps/psb_cyc is 0)")]
    FixedPsbPeriod,
    /// MTC was asked for, but the CPU offers no MTC period.
    #[error("the CPU reports MTC but no MTC period (caps/mtc_periods is 0)")]
    NoMtcPeriod,
    /// CYC packets were asked for, but the CPU cannot emit them.
    #[error("CYC packets need caps/psb_cyc")]
    NoCyc,
    /// No core PMU: no hardware performance counters (`devices` = the
    /// sysfs directory searched).
    #[error(
        "no `cpu` PMU under {}: the kernel exposes no hardware performance counters \
         (a virtual machine without a virtual PMU?)",
        devices.display()
    )]
    NoCorePmu {
        /// The sysfs `event_source/devices` directory.
        devices: PathBuf,
    },
    /// No core PMU lists this CPU (hybrid CPUs).
    #[error("no core PMU covers CPU {cpu}")]
    NoPmuForCpu {
        /// The CPU.
        cpu: u32,
    },
    /// A PMU's sysfs `format` directory lacks a field.
    #[error("the {pmu} PMU has no `{field}` field in its sysfs format directory")]
    MissingFormatField {
        /// The PMU.
        pmu: String,
        /// The field.
        field: String,
    },
    /// The loads-retired sampling event cannot be set up (`why`: the
    /// failure of reading the core PMUs).
    #[error("{why}")]
    NoLoadEvent {
        /// Why.
        why: String,
    },
    /// `perf_event_open` refused an event.
    #[error("perf_event_open({pmu}, config {config:#x}, CPU {cpu}): {why}")]
    PerfEventOpen {
        /// The event's PMU.
        pmu: String,
        /// Its `config` word.
        config: u64,
        /// The CPU it was opened on.
        cpu: i32,
        /// The error, explained.
        why: String,
    },
    /// A perf ring or AUX area could not be mapped.
    #[error("mmap of the {what} ({len} bytes): {error}{hint}")]
    Mmap {
        /// Which area.
        what: String,
        /// Its length.
        len: usize,
        /// The system's error.
        error: io::Error,
        /// What to check, when the error suggests it.
        hint: &'static str,
    },
    /// The program could not be executed.
    #[error("cannot execute {}: {}", program.display(), io::Error::from_raw_os_error(*errno))]
    Exec {
        /// The program.
        program: PathBuf,
        /// `errno` of the failed `execve`.
        errno: i32,
    },
    /// The program has no slash and is not on `PATH`.
    #[error("{}: not found on PATH", program.display())]
    NotOnPath {
        /// The program as given.
        program: PathBuf,
    },
    /// An argument, variable or path holds a NUL byte.
    #[error("{what} contains a NUL byte: {value:?}")]
    NulByte {
        /// What it is.
        what: String,
        /// Its value.
        value: std::ffi::OsString,
    },
    /// `--backend pt` on a machine where a check fails.
    #[error(
        "--backend pt: Intel PT is unusable on this machine: {why} (`cargo memgaze doctor` lists every check)"
    )]
    PtUnusable {
        /// The failed checks.
        why: String,
    },
    /// `--backend soft` on a machine where the software recorder cannot
    /// run.
    #[error("--backend soft: the software recorder is unusable on this machine: {why}")]
    SoftUnusable {
        /// The failed checks.
        why: String,
    },
    /// `--backend auto` and neither backend is usable.
    #[error(
        "no recording backend is usable on this machine: Intel PT: {pt}; software recorder: {soft}"
    )]
    NoBackend {
        /// Why not Intel PT.
        pt: String,
        /// Why not the software recorder.
        soft: String,
    },
    /// The load sampling period is 0.
    #[error("the load sampling period must be at least 1")]
    ZeroLoadPeriod,
    /// The AUX sample size is out of range.
    #[error("AUX sample size {size} is outside 1..={max} bytes")]
    AuxSampleSize {
        /// The size asked for.
        size: u32,
        /// The largest the backend takes.
        max: u32,
    },
    /// The ring or AUX size is not a power of two pages.
    #[error("ring and AUX sizes must be powers of two pages")]
    BufferNotPowerOfTwo,
    /// An AUX sample larger than the areas that must hold it.
    #[error(
        "an AUX sample ({sample} bytes) must fit the AUX area ({aux_len}) and the data ring ({data_len})"
    )]
    AuxSampleTooLarge {
        /// The sample size.
        sample: u32,
        /// The AUX area's size.
        aux_len: usize,
        /// The data ring's size.
        data_len: usize,
    },
    /// The annotation cannot drive a ptwrite reconstruction.
    #[error(transparent)]
    Annotation(#[from] AnnotationProblem),
    /// A perf ring holds what the kernel cannot have written.
    #[error(transparent)]
    Ring(#[from] RingProblem),
    /// Perf records that did not parse (counted while collecting).
    #[error("{count} perf records did not parse")]
    MalformedRecords {
        /// How many.
        count: u64,
    },
    /// No `PERF_RECORD_MMAP2` maps the program: its addresses cannot be
    /// placed.
    #[error(
        "no executable mapping of {} in process {pid} was recorded (PERF_RECORD_MMAP2)",
        binary.display()
    )]
    NoExecutableMapping {
        /// The program.
        binary: PathBuf,
        /// Its process.
        pid: u32,
    },
    /// `/proc/self/limits` without its `Max locked memory` line.
    #[error("{}: no `Max locked memory` line", path.display())]
    NoMemlockLine {
        /// The file read.
        path: PathBuf,
    },
    /// A sysfs CPU list with a range that does not parse.
    #[error("bad CPU range `{part}`")]
    BadCpuRange {
        /// The range.
        part: String,
    },
    /// `what` failed because of `source`.
    #[error("{what}")]
    Context {
        /// The step, or the file it read.
        what: String,
        /// Why.
        #[source]
        source: Box<PtError>,
    },
}

/// Why an annotation cannot drive a ptwrite reconstruction.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum AnnotationProblem {
    /// The binary was not instrumented in ptwrite mode.
    #[error(
        "the annotation is not of a ptwrite-mode binary (mode {mode}); instrument with --mode ptwrite"
    )]
    NotPtwriteMode {
        /// The annotation's mode (`Debug` form).
        mode: String,
    },
    /// A load's id is not its position.
    #[error("annotation load #{index} has id {id} (ids must equal positions)")]
    IdNotPosition {
        /// Its position.
        index: usize,
        /// Its id.
        id: u32,
    },
    /// An instrumented load with no register ptwrite can observe.
    #[error(
        "load {id} at {ip:#x} is instrumented in ptwrite mode but has no general-purpose source \
         register (base {base}, index {index}): ptwrite cannot observe it"
    )]
    NoSourceRegister {
        /// The load.
        id: u32,
        /// Its address.
        ip: u64,
        /// Its base (`Debug` form).
        base: String,
        /// Its index (`Debug` form).
        index: String,
    },
    /// A scale that is not 1, 2, 4 or 8.
    #[error("load {id} at {ip:#x}: scale {scale} is not 1, 2, 4 or 8")]
    BadScale {
        /// The load.
        id: u32,
        /// Its address.
        ip: u64,
        /// Its scale.
        scale: u8,
    },
    /// A ptwrite site naming a load that is not instrumented.
    #[error("ptwrite at {ip:#x} refers to load {load}, which is not an instrumented load")]
    UnknownLoad {
        /// The site.
        ip: u64,
        /// The load it names.
        load: u32,
    },
    /// A ptwrite site writing an operand its load does not have.
    #[error("ptwrite at {ip:#x} writes the {operand} of load {load}, which has none")]
    NoSuchOperand {
        /// The site.
        ip: u64,
        /// The operand (`Debug` form).
        operand: String,
        /// The load.
        load: u32,
    },
    /// Two sites at one address.
    #[error("two ptwrite sites at {ip:#x}")]
    DuplicateSite {
        /// The address.
        ip: u64,
    },
    /// An instrumented load without the site of one of its registers.
    #[error("load {load} at {ip:#x} lacks a ptwrite site for its {operand}")]
    MissingSite {
        /// The load.
        load: usize,
        /// Its address.
        ip: u64,
        /// `base` or `index`.
        operand: &'static str,
    },
}

/// What is wrong with a perf ring or AUX area.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RingProblem {
    /// A ring area whose size is not a power of two.
    #[error("a ring area must be a power of two bytes, not {len}")]
    NotPowerOfTwo {
        /// Its size.
        len: usize,
    },
    /// The AUX head is behind its tail.
    #[error("AUX head {head} is behind its tail {tail}")]
    AuxHeadBehind {
        /// Head.
        head: u64,
        /// Tail.
        tail: u64,
    },
    /// The AUX head is more than the area ahead of its tail.
    #[error("AUX head {head} is more than the area ({size} bytes) ahead of the tail {tail}")]
    AuxHeadAhead {
        /// Head.
        head: u64,
        /// Tail.
        tail: u64,
        /// The area's size.
        size: usize,
    },
    /// The data ring's head is behind its tail.
    #[error("ring head {head} is behind its tail {tail}")]
    HeadBehind {
        /// Head.
        head: u64,
        /// Tail.
        tail: u64,
    },
    /// The data ring's head is more than the ring ahead of its tail.
    #[error("ring head {head} is more than the ring ({size} bytes) ahead of the tail {tail}")]
    HeadAhead {
        /// Head.
        head: u64,
        /// Tail.
        tail: u64,
        /// The ring's size.
        size: usize,
    },
    /// A record header whose size does not fit what is available.
    #[error(
        "corrupt perf record header at ring position {position}: size {size} with {available} bytes available"
    )]
    CorruptHeader {
        /// Where in the ring.
        position: u64,
        /// The size it claims.
        size: u16,
        /// Bytes between it and the head.
        available: u64,
    },
    /// A record shorter than its type's fields.
    #[error("truncated perf record of type {kind}")]
    Truncated {
        /// Its `PERF_RECORD_*` type.
        kind: u32,
    },
}

/// Names the step a failure happened in, keeping the failure as the
/// source (`anyhow`'s `context` for [`PtError`]).
pub(crate) trait Context<T> {
    /// Wraps an error in [`PtError::Context`] with `what`.
    fn context(self, what: impl Into<String>) -> Result<T>;
    /// [`Context::context`], with the text built only on failure.
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T>;
}

impl<T, E: Into<PtError>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|e| PtError::Context {
            what: what.into(),
            source: Box::new(e.into()),
        })
    }
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| PtError::Context {
            what: what().into(),
            source: Box::new(e.into()),
        })
    }
}
