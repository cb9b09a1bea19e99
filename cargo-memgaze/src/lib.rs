//! cargo memgaze: sampled load-address traces of x86-64 programs and the
//! locality metrics computed from them.
//!
//! This crate is the command layer over the pipeline's library crates (see
//! ARCHITECTURE.md): build ([`cargo`]) → instrument (`memgaze-instrument`) →
//! record (`memgaze-record`) → trace (`memgaze-trace`) → analyse
//! (`memgaze-analysis`) → validate ([`golden`]) → report ([`report`]) → gate
//! ([`gate`]). [`pipeline`] strings instrument, record and analyse together
//! for a workspace's benches; [`cli`] is the commands over them.

pub mod cargo;
pub mod cli;
pub mod gate;
pub mod golden;
pub mod pipeline;
pub mod report;
