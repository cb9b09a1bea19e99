//! Helpers shared by the integration tests.

pub mod svg;
pub mod synthetic;
