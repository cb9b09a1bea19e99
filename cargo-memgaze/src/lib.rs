//! cargo memgaze: sampled load-address traces of x86-64 programs and the
//! locality metrics computed from them.
//!
//! The pipeline, one module per stage (see ARCHITECTURE.md):
//! build ([`cargo`]) → binary analysis ([`binary`], [`classify`]) →
//! instrument ([`instrument`]) → record ([`record`], [`pt`]) → trace
//! ([`trace`]) → analyse ([`analysis`]) → validate ([`golden`]) → report
//! ([`report`]) → gate ([`gate`]). [`pipeline`] strings instrument, record
//! and analyse together for a workspace's benches; [`cli`] is the command
//! layer over them.

pub mod analysis;
pub mod annotation;
pub mod binary;
pub mod cargo;
pub mod classify;
pub mod cli;
pub mod error;
pub mod gate;
pub mod golden;
pub mod instrument;
pub mod lackey;
pub mod pipeline;
pub mod pt;
pub mod record;
pub mod report;
pub mod trace;
