//! The machine-readable output of `cargo memgaze`, as plain `serde` types.
//!
//! Everything a program may read from `cargo memgaze` is defined here, in
//! one crate that depends on nothing but `serde` (as `nextest-metadata` is
//! for cargo-nextest):
//!
//! - [`analysis`]: the `memgaze.analysis.v1` document (`analyze`, `run`,
//!   `analysis.json` in a bench's results directory);
//! - [`annotation`]: the `memgaze.annotation.v1` file written beside an
//!   instrumented executable;
//! - [`messages`]: the JSON lines of `bench`, `golden` and `validate`
//!   (`--message-format json`), one type per `"reason"`;
//! - [`classify`]: the rows of `classify --format json`;
//! - [`model`]: the small trace-model types the documents share.
//!
//! The field names and the JSON are the contract of docs/CLI.md; the tests
//! pin the exact bytes of each kind.

#![warn(missing_docs)]

pub mod analysis;
pub mod annotation;
pub mod classify;
pub mod messages;
pub mod model;

pub use model::{Backend, BinaryIdentity, Dropped, LoadClass};
