//! Integration tests of `cargo-memgaze`, one test binary with a module per area.

mod bench_limits;
mod bench_pipeline;
mod cargo_benches;
mod cli_classify;
mod cli_contract;
mod cli_polish;
mod cli_pt;
mod cli_trace;
mod frameworks;
mod fuzz_inputs;
mod gate;
mod interrupt;
mod lackey;
mod lackey_crosscheck;
mod libs;
mod mrc_accuracy;
mod outputs;
mod region_threads;
mod report;
mod report_browser;
mod report_charts;
mod report_compare;
mod rewriter;
mod rewriter_support;
mod run_cache;
mod support;
