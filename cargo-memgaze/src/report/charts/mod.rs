//! The charts, as SVG documents rendered with plotters from plain inputs
//! (points, bins, grids), so that they depend on no analysis internals.
//!
//! | chart | module | input |
//! |---|---|---|
//! | (a) trace-window histogram, golden/baseline overlaid | [`windows`] | [`windows::WindowCurve`] |
//! | (b) reuse-distance histogram | [`reuse`] | [`reuse::ReuseSeries`] |
//! | (c) time × address heatmap | [`heatmap`] | [`crate::report::profile::Heatmap`] |
//! | (d) accesses and inter-access distance per address | [`address`] | [`crate::report::profile::AddressProfile`] |
//! | (e) hot functions, hot regions; (f) baseline vs current | [`bars`] | [`bars::BarChart`] |
//! | (g) whole-run miss-ratio curve, baseline overlaid | [`mrc`] | [`mrc::MrcCurve`] |

pub mod address;
pub mod bars;
pub mod heatmap;
pub mod mrc;
pub mod reuse;
pub(crate) mod style;
pub mod windows;

pub use style::{
    ellipsize, ellipsize_front, format_address, format_bytes, format_count, format_value,
    format_window,
};
