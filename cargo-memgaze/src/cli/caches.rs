//! `--cache-sizes`: the cache sizes the whole-run miss ratios are read at,
//! on every command that analyses (`analyze`, `run`, `bench`, `report`).

use memgaze_analysis::{AnalysisOptions, CacheSizes};

/// The cache sizes flag.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct CacheSizesArgs {
    /// Cache sizes L1,L2,LLC at which MR_L1, MR_L2 and MR_LLC are read
    /// (e.g. 48K,2M,32M); default: this machine's, from sysfs.
    #[arg(
        long,
        value_name = "L1,L2,LLC",
        value_parser = memgaze_analysis::locality::parse_cache_sizes
    )]
    pub cache_sizes: Option<CacheSizes>,
}

impl CacheSizesArgs {
    /// The default analysis options with these cache sizes.
    pub fn analysis_options(&self) -> AnalysisOptions {
        AnalysisOptions {
            cache_sizes: self.cache_sizes.clone(),
            ..AnalysisOptions::default()
        }
    }
}
