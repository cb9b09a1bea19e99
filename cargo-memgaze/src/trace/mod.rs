//! Traces: the model of recorded load-address samples (`model.rs`: [`Record`],
//! [`TraceHeader`], [`TraceTotals`]…), its file format ([`mod@format`]:
//! [`TraceWriter`], [`TraceReader`]) and a text dump ([`dump`]).

pub mod dump;
pub mod format;
mod model;
pub mod output;

pub use format::{RawRecord, TraceEvent, TraceReader, TraceWriter};
pub use model::*;
pub use output::{AtomicFile, write_atomic};
