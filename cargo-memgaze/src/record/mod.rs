//! Running an instrumented program and collecting its software-recorder
//! output into a trace.

pub mod protocol;
