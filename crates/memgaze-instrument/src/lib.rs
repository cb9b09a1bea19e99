//! Static instrumentation of x86-64 ELF executables for memgaze.
//!
//! The stages, in the order a program goes through them:
//! [`binary`] reads the executable (functions, control-flow graphs, loops,
//! jump tables, line tables, unwind tables); [`classify`] gives every load a
//! class (constant, strided, irregular) and builds the annotation
//! ([`memgaze_metadata::annotation`]) the analysis later reads; [`rewrite`] copies the chosen functions with a probe
//! before each instrumented load, rewrites the unwind tables and appends the
//! recording runtime.

#![warn(missing_docs)]

// The annotation's types live in memgaze-metadata; `crate::annotation`
// names them inside this crate.
use memgaze_metadata::annotation;

pub mod binary;
pub mod classify;
mod error;
mod file;
pub mod rewrite;
mod timings;

pub use error::{
    AnnotationError, ElfError, InstrumentError, RelocateError, RewriteError, UnwindError,
};
pub use file::{
    annotate, annotate_with_code, instrument_file, instrument_file_as, instrument_library_file,
    instrument_library_file_as,
};
