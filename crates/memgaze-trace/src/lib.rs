//! Traces: the model of recorded load-address samples (`model.rs`: [`Record`],
//! [`TraceHeader`], [`TraceTotals`]…), its file format ([`mod@format`]:
//! [`TraceWriter`], [`TraceReader`]), a text dump ([`dump`]) and their
//! typed errors ([`TraceError`], [`FilterError`]).

#![warn(missing_docs)]

pub mod dump;
mod error;
pub mod format;
pub mod layout;
mod model;
pub mod protocol;
pub mod rng;
pub mod sites;

pub use error::{FilterError, TraceError};
pub use format::{RawRecord, TraceEvent, TraceReader, TraceWriter};
pub use model::*;
pub use sites::EncodedSites;
