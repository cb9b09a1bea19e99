//! The errors of the trace reader and writer ([`TraceError`]) and of the
//! `--functions` filter ([`FilterError`]).
//!
//! Callers match on the variant; the text is the line a person reads after
//! `error: <file>: ` (docs/CLI.md), so it names the problem and the byte
//! offset but never the path: the caller knows which file it opened and adds
//! it (as `cargo memgaze` does with an `anyhow` context), exactly as
//! `std::fs::File::open` leaves the path to its caller.

use super::format::{OLDEST_READABLE, VERSION};
use std::io;
use std::path::PathBuf;

/// Why a trace could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The input does not start with the trace magic bytes (or is empty).
    #[error("{}", if *empty { "empty file: not a memgaze trace" } else { "not a memgaze trace (wrong magic bytes at byte offset 0)" })]
    NotATrace {
        /// The input has no bytes at all.
        empty: bool,
    },
    /// A format version other than the one this code reads (older versions
    /// are refused too: their records need recording again, not converting).
    #[error("{}", version_message(*version))]
    UnsupportedVersion {
        /// The version the file declares.
        version: u32,
    },
    /// The input ends early: a recording that was interrupted, or a copy
    /// that was cut short.
    #[error("truncated trace: {what}")]
    Truncated {
        /// The byte offset at which the input ends.
        offset: u64,
        /// Where it ends, as the message says it.
        what: String,
    },
    /// Bytes that are not what the format allows: a failed checksum, a bad
    /// chunk, counts that disagree.
    #[error("corrupt trace: {what}")]
    Corrupt {
        /// The byte offset of the chunk (or field) at fault.
        offset: u64,
        /// What is wrong, as the message says it (the offset included).
        what: String,
    },
    /// A header whose cross references do not hold, handed to the writer
    /// (a reader reports the same as [`TraceError::Corrupt`]).
    #[error("{what}")]
    InvalidHeader {
        /// Which reference is broken.
        what: String,
    },
    /// The writer was used against its contract (a record before the first
    /// sample, an unknown load site, totals that disagree): a collector bug.
    #[error("trace writer: {what}")]
    Misuse {
        /// What the caller did.
        what: String,
    },
    /// A record names a load site the header does not list (a collector
    /// bug, like [`TraceError::Misuse`]).
    #[error("trace writer: record refers to load site {load} but the header lists {loads}")]
    UnknownLoad {
        /// The load site index of the record.
        load: u32,
        /// How many load sites the header lists.
        loads: usize,
    },
    /// The output was refused before anything was written, or its
    /// temporary file could not be created or renamed into place (the
    /// message names the path).
    #[error(transparent)]
    Output(#[from] memgaze_output::OutputError),
    /// The trace file could not be opened.
    #[error("cannot open")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The trace file could not be created.
    #[error("cannot create")]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Reading, writing or (de)compressing failed below the format.
    #[error("{what}")]
    Io {
        /// What was being done ("cannot read trace", "cannot write trace"…).
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The header or totals could not be encoded as JSON.
    #[error("{what}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

impl TraceError {
    /// An [`TraceError::Io`] error doing `what`, for `map_err`.
    pub(crate) fn io(what: &'static str) -> impl FnOnce(io::Error) -> TraceError {
        move |source| TraceError::Io { what, source }
    }
}

/// Newer files need a newer cargo memgaze, older ones a new recording: the
/// message says which, since the fixes differ.
fn version_message(version: u32) -> String {
    if version > VERSION {
        format!(
            "trace format version {version} is newer than this cargo memgaze reads (version {VERSION}); upgrade cargo memgaze"
        )
    } else {
        format!(
            "trace format version {version} is older than this cargo memgaze reads (versions {OLDEST_READABLE} to {VERSION}); record the trace again"
        )
    }
}

/// Why a `--functions` glob cannot filter a trace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FilterError {
    /// The glob does not parse.
    #[error("invalid --functions pattern {glob:?}")]
    InvalidPattern {
        /// The pattern as given.
        glob: String,
        /// The parser's complaint.
        #[source]
        source: globset::Error,
    },
    /// The glob matches none of the header's functions: the analysis would
    /// keep no record, and an empty result would hide a mistyped name.
    #[error("no function matches --functions {glob} ({functions} functions in {binary})")]
    NoMatch {
        /// The pattern as given.
        glob: String,
        /// How many functions the header lists.
        functions: usize,
        /// The binary's path, or "the binary" when the header has none.
        binary: String,
    },
}
