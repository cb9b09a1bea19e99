//! Traces: the model of recorded load-address samples (`model.rs`: [`Record`],
//! [`TraceHeader`], [`TraceTotals`]…), its file format ([`mod@format`]:
//! [`TraceWriter`], [`TraceReader`]) and a text dump ([`dump`]).

#![warn(missing_docs)]

pub mod dump;
pub mod format;
pub mod layout;
mod model;
pub mod protocol;
pub mod rng;

pub use format::{RawRecord, TraceEvent, TraceReader, TraceWriter};
pub use model::*;
