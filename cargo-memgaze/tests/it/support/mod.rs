//! Helpers shared by the integration tests.

pub mod results;
pub mod svg;
pub mod synthetic;
