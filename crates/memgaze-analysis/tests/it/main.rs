//! Integration tests of `memgaze-analysis`, one test binary with a module per area.

mod analysis_reference;
mod locality_reference;
mod naive;
