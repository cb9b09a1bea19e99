//! The static rewriter: relocating functions with load probes into a new
//! segment of the executable.

pub mod runtime;
