//! Traces: the model of recorded load-address samples and its file format.

mod model;

pub use model::*;
