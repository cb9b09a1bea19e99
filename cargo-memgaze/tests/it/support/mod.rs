//! Helpers shared by the integration tests.

pub mod mutate;
pub mod results;
pub mod svg;
pub mod synthetic;
