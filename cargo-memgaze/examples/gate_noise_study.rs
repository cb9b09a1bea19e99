//! How much the gated metrics move between runs of an unchanged program
//! when only the sampling jitter changes: the measurement behind the
//! default limits (ARCHITECTURE.md, "Default regression limits").
//!
//! A measurement, not a check (it analyses dozens of full-size traces); run
//! it to reproduce the table:
//!
//! ```text
//! N=500000 R=100 SEEDS=6 cargo run --release -p cargo-memgaze --example gate_noise_study
//! ```
//!
//! It prints, per synthetic microbenchmark at the default sampling (w =
//! 1000, period 100 K), each metric's mean over the seeds and its range
//! (max − min), absolute and relative.
//!
//! The whole-run metrics (`MR_*`, `misses_*`) come from spatial sampling
//! at the default rate 1/128, emulated on the kernel's full trace. Their
//! noise between runs is which blocks are tracked: the hash is fixed, but
//! the addresses move with ASLR and allocation order. A different odd hash
//! multiplier per seed draws a different set of tracked blocks, as a
//! different layout does. The cache sizes are fixed (32K, 1M, 32M) so that
//! the figures do not depend on the machine.

#[path = "../tests/it/support/synthetic.rs"]
mod synthetic;

use memgaze::gate::Metric;
use memgaze_analysis::{AnalysisOptions, CacheSizes, analyze_trace};
use memgaze_trace::{SpatialSampling, TraceReader};
use synthetic::{Kernel, Synthetic, write_trace};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| v.parse().expect("a number"))
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let (elements, reps, seeds) = (env("N", 500_000), env("R", 100), env("SEEDS", 6));
    let caches = CacheSizes {
        l1: 32 << 10,
        l2: 1 << 20,
        llc: 32 << 20,
        source: "--cache-sizes".into(),
    };
    for kernel in Kernel::ALL {
        let mut values: Vec<Vec<Option<f64>>> = Vec::new();
        let mut samples = 0;
        let full = dir.path().join("full.mgz");
        write_trace(
            &full,
            &Synthetic {
                kernel,
                elements,
                reps,
                sampling: None,
                seed: 1,
            },
        );
        for seed in 1..=seeds {
            let path = dir.path().join("trace.mgz");
            let run = Synthetic {
                kernel,
                elements,
                reps,
                sampling: Some((1000, 100_000)),
                seed,
            };
            write_trace(&path, &run);
            let a = analyze_trace(
                TraceReader::open(&path).unwrap(),
                &AnalysisOptions::default(),
            )
            .unwrap();
            samples = a.summary.samples;
            let k = memgaze::gate::metric::common_window_k(&a, &a);
            // A different tracked set per seed: an odd multiplier from the seed.
            let mut spatial = SpatialSampling::with_rate(1.0 / 128.0).unwrap();
            spatial.multiplier = SpatialSampling::DEFAULT_MULTIPLIER
                .wrapping_mul(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1)
                | 1;
            let whole = analyze_trace(
                TraceReader::open(&full).unwrap(),
                &AnalysisOptions {
                    cache_sizes: Some(caches.clone()),
                    emulate_spatial: Some(spatial),
                    ..AnalysisOptions::default()
                },
            )
            .unwrap();
            values.push(
                Metric::ALL
                    .iter()
                    .map(|m| {
                        if m.name().starts_with("MR_") || m.name().starts_with("misses_") {
                            m.value(&whole, k)
                        } else {
                            m.value(&a, k)
                        }
                    })
                    .collect(),
            );
        }
        print!("{:12} samples {samples:5}", kernel.name());
        for (i, metric) in Metric::ALL.iter().enumerate() {
            let v: Vec<f64> = values.iter().filter_map(|r| r[i]).collect();
            if v.is_empty() {
                continue;
            }
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            let relative = if mean != 0.0 {
                100.0 * (hi - lo) / mean.abs()
            } else {
                0.0
            };
            print!(
                " | {metric} {mean:.4} range {:.4} ({relative:.1}%)",
                hi - lo
            );
        }
        println!();
    }
}
