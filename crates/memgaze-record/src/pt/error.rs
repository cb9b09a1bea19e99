//! The errors of the Intel PT backend ([`PtError`]).
//!
//! The text is the line `cargo memgaze` prints after `error: ` (or a check
//! of `cargo memgaze doctor` shows); a step that fails because of another
//! names itself and keeps the other as its source ([`PtError::Context`]).

use super::sysfs::FormatError;
use memgaze_trace::TraceError;
use std::io;
use std::num::ParseIntError;

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
    /// The machine cannot do what was asked: a missing PMU capability, a
    /// limit, no usable backend.
    #[error("{0}")]
    Unsupported(String),
    /// Options, a program or an annotation the backend refuses.
    #[error("{0}")]
    Invalid(String),
    /// Data from the kernel, sysfs or procfs that is inconsistent or
    /// truncated.
    #[error("{0}")]
    Malformed(String),
    /// Something looked for is not there (a program on `PATH`, a PMU, a
    /// line of a procfs file).
    #[error("{0}")]
    NotFound(String),
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
