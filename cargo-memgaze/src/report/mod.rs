//! SVG charts and the HTML report.

pub mod charts;
pub mod profile;
