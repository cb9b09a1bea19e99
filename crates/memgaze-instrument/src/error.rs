//! The errors of the public entry points: opening a binary
//! ([`crate::binary::Binary::open`]), instrumenting it
//! ([`crate::rewrite::instrument`], [`crate::instrument_file`]) and loading
//! or saving an annotation ([`crate::annotation::Annotation::read`],
//! [`crate::rewrite::read_annotation`]).
//!
//! Unlike trace errors, these name the file themselves: a binary or an
//! annotation is found beside others (the executable, its annotation, the
//! output), so the one that failed is part of the problem. The text is the
//! line `cargo memgaze` prints after `error: `.

use crate::binary::BinaryError;
use memgaze_error::UsageError;
pub use memgaze_metadata::annotation::AnnotationError;
use std::io;
use std::path::PathBuf;

/// Why a binary could not be opened, selected from or instrumented.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstrumentError {
    /// A command-line mistake (an invalid `--functions` glob): the CLI
    /// exits with 2 for it, so the [`UsageError`] stays in the chain.
    #[error("{0}")]
    Usage(#[source] UsageError),
    /// The path is a directory.
    #[error("{}: is a directory, not an executable", path.display())]
    IsDirectory {
        /// The path given.
        path: PathBuf,
    },
    /// The file could not be read.
    #[error("{}: cannot read", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The file is not an executable this tool supports (not ELF, not
    /// x86-64, a library, an object file, truncated…): the refusals of
    /// [`BinaryError`], whose messages are the ones people read.
    #[error("{}", path.display())]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        #[source]
        source: BinaryError,
    },
    /// A `--functions` glob that selects none of the binary's functions.
    #[error("--functions {glob}: no function of {} matches", binary.display())]
    NoFunctionMatch {
        /// The pattern as given.
        glob: String,
        /// The binary.
        binary: PathBuf,
    },
    /// The rewriter refuses the executable's layout (already instrumented,
    /// no room for the new segment, the writable segment not last…).
    #[error("{reason}")]
    Refused {
        /// The refusal, as people read it.
        reason: String,
    },
    /// The software recorder needs an exit hook and the executable has no
    /// `DT_FINI` entry or spare `.dynamic` slot for one.
    #[error("no DT_FINI entry or spare .dynamic slot for the exit hook")]
    NoExitHook,
    /// Rewriting failed for a reason below the refusals (relocating code,
    /// assembling the runtime, unwind tables). The rewriter's modules report
    /// these with `anyhow` context chains, kept whole here.
    #[error(transparent)]
    Rewrite(#[from] anyhow::Error),
    /// An error about the input binary `path`, from a step that does not
    /// name it itself (the rewriter).
    #[error("{}", path.display())]
    InFile {
        /// The input binary.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: Box<InstrumentError>,
    },
    /// An output refused before it was written, or whose temporary file
    /// could not be created or renamed into place.
    #[error(transparent)]
    Output(#[from] memgaze_output::OutputError),
    /// The instrumented executable or its annotation could not be written.
    #[error("{}: cannot write", path.display())]
    Write {
        /// The output file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The instrumented executable could not be made executable.
    #[error("{}: cannot make executable", path.display())]
    MakeExecutable {
        /// The output file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::Binary;

    #[test]
    fn open_names_the_path_and_the_refusal() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            Binary::open(dir.path()),
            Err(InstrumentError::IsDirectory { .. })
        ));
        let missing = dir.path().join("missing");
        assert!(matches!(
            Binary::open(&missing),
            Err(InstrumentError::Read { path, .. }) if path == missing
        ));
        let text = dir.path().join("script.sh");
        std::fs::write(&text, "#!/bin/sh\n").unwrap();
        let e = Binary::open(&text).unwrap_err();
        assert!(
            matches!(
                &e,
                InstrumentError::Unsupported {
                    source: BinaryError::NotElf(_),
                    ..
                }
            ),
            "{e}"
        );
        // The line people read: the path, then the refusal.
        let line = memgaze_error::one_line(&anyhow::Error::new(e));
        assert_eq!(
            line,
            format!(
                "{}: not an ELF file (it starts with bytes 23 21 2f 62)",
                text.display()
            )
        );
    }

    #[test]
    fn a_bad_glob_is_a_usage_error() {
        let binary = Binary::open(std::env::current_exe().unwrap()).unwrap();
        let e = crate::annotate(&binary, Some("[")).unwrap_err();
        assert!(matches!(e, InstrumentError::Usage(_)), "{e}");
        let e = anyhow::Error::new(e).context("instrument");
        assert_eq!(memgaze_error::exit_for(&e), memgaze_error::Exit::Usage);
        let e = crate::annotate(&binary, Some("no_such_function_*")).unwrap_err();
        assert!(
            matches!(&e, InstrumentError::NoFunctionMatch { glob, .. } if glob == "no_such_function_*"),
            "{e}"
        );
    }
}
