//! The errors of an analysis: a trace that cannot be read, a `--functions`
//! filter that cannot apply, or options outside what docs/METRICS.md
//! defines.

use super::MAX_CODE_WINDOW_K;
use memgaze_trace::{FilterError, TraceError};

/// Why an analysis could not start or finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnalysisError {
    /// Reading the trace failed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The `--functions` filter is invalid or matches nothing.
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// The reuse-distance block is not a power of two.
    #[error("--block must be a power of two (got {block})")]
    Block {
        /// The block size given, in bytes.
        block: u64,
    },
    /// The smallest hot-region page is not a power of two of at least 64.
    #[error("the minimum region page must be a power of two of at least 64 bytes (got {page})")]
    RegionMinPage {
        /// The page size given, in bytes.
        page: u64,
    },
    /// The hot-region threshold is not a percentage.
    #[error("the hot-region threshold must be a percentage in 0..=100 (got {percent})")]
    HotThreshold {
        /// The threshold given.
        percent: f64,
    },
    /// The code window is larger than [`MAX_CODE_WINDOW_K`] allows.
    #[error("the code window may be at most 2^{MAX_CODE_WINDOW_K} records (got 2^{k})")]
    CodeWindow {
        /// The exponent given.
        k: u32,
    },
    /// Spatial sampling can be emulated on a full trace only.
    #[error("emulating spatial sampling needs a full trace (this one is sampled)")]
    EmulateOnSampled,
    /// The reader reported the end of the trace without its totals (a
    /// reader bug: it refuses such traces as truncated).
    #[error("trace ended without totals")]
    MissingTotals,
}
