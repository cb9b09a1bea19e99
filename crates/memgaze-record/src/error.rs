//! The errors of recording a program ([`RecordError`]) and of importing a
//! Valgrind Lackey log ([`LackeyError`]).
//!
//! The text is the line `cargo memgaze` prints after `error: `; variants
//! that concern a file or program carry its path and name it, as the
//! messages always have.

use memgaze_analysis::AnalysisError;
use memgaze_instrument::InstrumentError;
use memgaze_trace::FilterError;
use std::io;
use std::path::PathBuf;

/// Why recording a program failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// Sampling parameters the recorder cannot follow.
    #[error("window {window} must be between 1 and the period {period}")]
    InvalidSampling {
        /// Records per sample.
        window: u64,
        /// Records per period.
        period: u64,
    },
    /// Spatial sampling of blocks the runtime cannot test.
    #[error("spatial sampling of {}-byte blocks: the recorder tests 64-byte blocks only", 1u64 << block_shift.min(&63))]
    SpatialBlock {
        /// log2 of the block size asked for.
        block_shift: u32,
    },
    /// The socket or shared memory between the program and the collector
    /// could not be set up.
    #[error("{what}")]
    Setup {
        /// The step that failed.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The program could not be started.
    #[error("{}: cannot run", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Waiting for the program failed.
    #[error("{}: cannot wait for the program", program.display())]
    Wait {
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The thread waiting for the program panicked (a bug).
    #[error("the process waiter panicked")]
    WaiterPanicked,
    /// Reading the recorder's socket failed.
    #[error("reading the recorder's output")]
    ReadOutput(#[source] io::Error),
    /// The caller's [`crate::RecordSink`] failed (writing the trace, the
    /// analysis…), with the sink's own error.
    #[error(transparent)]
    Sink(SinkError),
}

/// The error a [`crate::RecordSink`] returns: the caller's own, boxed, as
/// sinks belong to the caller (a trace writer's `TraceError`, an error of
/// the command layer).
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// What [`crate::RecordSink`]'s methods return.
pub type SinkResult = Result<(), SinkError>;

/// A sink's error, named by the file the sink writes
/// ([`crate::NamedSink`]): `t.trace: cannot write trace: No space left on
/// device`.
#[derive(Debug, thiserror::Error)]
#[error("{}", path.display())]
pub struct SinkFileError {
    /// The file.
    pub(crate) path: PathBuf,
    /// The sink's error.
    #[source]
    pub(crate) source: SinkError,
}

/// Why a Lackey log could not be imported.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LackeyError {
    /// The binary the log was recorded from could not be opened.
    #[error(transparent)]
    Binary(#[from] InstrumentError),
    /// The log could not be opened.
    #[error("{}: cannot open", path.display())]
    Open {
        /// The log.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Reading the log failed.
    #[error("cannot read the log")]
    Read(#[source] io::Error),
    /// A line that is not what Lackey writes.
    #[error("line {line} is not a valid Lackey line: {text:?}")]
    MalformedLine {
        /// Its number, from 1.
        line: u64,
        /// Its start (60 characters at most).
        text: String,
        /// What is wrong with it.
        #[source]
        problem: AccessError,
    },
    /// The log ends inside a line: valgrind was interrupted, or the file
    /// was copied in part.
    #[error(
        "truncated log: it ends in the middle of line {line} ({text:?}; was valgrind interrupted or the file copied in part?)"
    )]
    Truncated {
        /// The number of the last line, from 1.
        line: u64,
        /// Its start (60 characters at most).
        text: String,
        /// What is wrong with it.
        #[source]
        problem: AccessError,
    },
    /// A line longer than any Lackey writes (a log is never read whole
    /// into memory to find its end).
    #[error(
        "line {line} is longer than {max} bytes: not a Valgrind Lackey log (run valgrind --tool=lackey --trace-mem=yes)"
    )]
    LineTooLong {
        /// Its number, from 1.
        line: u64,
        /// The longest line read.
        max: usize,
    },
    /// No instruction lines at all: not a Lackey log (or one recorded
    /// without `--trace-mem=yes`).
    #[error(
        "not a Valgrind Lackey log: no instruction lines (run valgrind --tool=lackey --trace-mem=yes)"
    )]
    NotALackeyLog,
    /// The log was recorded from another executable or build.
    #[error(
        "does not match {binary}: at {mismatched} of its {sites} load instructions the log's instruction length differs from the binary's (was it recorded from another executable or build?)"
    )]
    WrongBinary {
        /// The binary's path.
        binary: String,
        /// Load sites whose instruction length differs.
        mismatched: u64,
        /// Load sites of the log in the binary.
        sites: u64,
    },
    /// The `--functions` filter is invalid or matches nothing.
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// The analysis refused its options.
    #[error(transparent)]
    Analysis(#[from] AnalysisError),
    /// An error about the log `path`.
    #[error("{}", path.display())]
    InFile {
        /// The log.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<LackeyError>,
    },
}

/// What is wrong with the `ADDRESS,SIZE` part of a Lackey line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AccessError {
    /// Nothing after the line's tag.
    #[error("missing address")]
    MissingAddress,
    /// A character that is not a hexadecimal digit.
    #[error("unexpected character {0:?} in the address")]
    UnexpectedCharacter(char),
    /// More than 16 hexadecimal digits.
    #[error("address longer than 64 bits")]
    TooLong,
    /// No `,SIZE` after the address.
    #[error("expected ADDRESS,SIZE")]
    NoSize,
}
