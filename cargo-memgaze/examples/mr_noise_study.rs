//! How much the whole-run miss ratios (`MR_L1`, `MR_L2`, `MR_LLC`) of the
//! default spatial sampling (1/128 of the 64-byte blocks) move between
//! runs of an unchanged program, against the noise the gate widens their
//! limits to (`memgaze::gate::noise`: the spread of the 32 block groups).
//! The measurement behind `NOISE_SIGMAS` (docs/performance.md, "Gate
//! limits of the whole-run miss ratios").
//!
//! ```text
//! cargo run --release -p cargo-memgaze --example mr_noise_study
//! ```
//!
//! For each synthetic microbenchmark at three array sizes (1,000 elements:
//! 8 KB, about one tracked block; 20,000; 200,000), a full trace per
//! placement (all data moved by `4096·i + 8·i` bytes, so that other blocks
//! are tracked, as another allocation before the data does) and per data
//! order (`SEEDS` seeds of the irregular kernels' permutation), analysed
//! with spatial sampling emulated at 1/128. It prints per metric the exact
//! value, the range of the estimates, and the largest `|ΔMR| / σ_diff`
//! over every pair of runs, `σ_diff = √(σ_a² + σ_b²)` from each run's
//! groups: a gate limit of `z·σ_diff` holds for unchanged code when this
//! stays below `z`. `PLACEMENTS` (default 6) and `SEEDS` (default 3) set
//! the number of runs.

#[path = "../tests/it/support/synthetic.rs"]
mod synthetic;

use memgaze::gate::Metric;
use memgaze::gate::noise::sigma;
use memgaze_analysis::{Analysis, AnalysisOptions, CacheSizes, analyze_trace};
use memgaze_trace::{SpatialSampling, TraceReader};
use synthetic::{Kernel, Synthetic, write_trace_placed};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| v.parse().expect("a number"))
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.mgz");
    let (placements, seeds) = (env("PLACEMENTS", 6), env("SEEDS", 3));
    let caches = CacheSizes {
        l1: 32 << 10,
        l2: 1 << 20,
        llc: 32 << 20,
        source: "--cache-sizes".into(),
    };
    let analyse = |run: &Synthetic, shift: u64, emulate: bool| -> Analysis {
        write_trace_placed(&path, run, shift);
        analyze_trace(
            TraceReader::open(&path).unwrap(),
            &AnalysisOptions {
                cache_sizes: Some(caches.clone()),
                emulate_spatial: emulate
                    .then(|| SpatialSampling::with_rate(1.0 / 128.0))
                    .flatten(),
                ..AnalysisOptions::default()
            },
        )
        .unwrap()
    };
    let metrics = [Metric::MrL1, Metric::MrL2, Metric::MrLlc];
    let mut worst: f64 = 0.0;
    for elements in [1_000u64, 20_000, 200_000] {
        // About 2 M loads per run whatever the size.
        let reps = (2_000_000 / elements).max(1);
        for kernel in Kernel::ALL {
            let run = |seed| Synthetic {
                kernel,
                elements,
                reps,
                sampling: None,
                seed,
            };
            let exact = analyse(&run(1), 0, false);
            let mut runs = Vec::new();
            for seed in 1..=seeds {
                for i in 0..placements {
                    runs.push(analyse(&run(seed), 4096 * i + 8 * i, true));
                }
            }
            let tracked = runs[0].summary.tracked_accesses.unwrap_or(0);
            print!("{:12} n={elements:7} tracked {tracked:7}", kernel.name());
            for metric in metrics {
                let values: Vec<(f64, f64)> = runs
                    .iter()
                    .filter_map(|a| Some((metric.value(a, None)?, sigma(metric, a)?)))
                    .collect();
                let lo = values.iter().map(|v| v.0).fold(f64::INFINITY, f64::min);
                let hi = values.iter().map(|v| v.0).fold(f64::NEG_INFINITY, f64::max);
                let mut z: f64 = 0.0;
                for (i, a) in values.iter().enumerate() {
                    for b in &values[i + 1..] {
                        let s = (a.1 * a.1 + b.1 * b.1).sqrt();
                        let d = (a.0 - b.0).abs();
                        // A difference inside the fixed 0.02 never counts.
                        if d > 0.02 {
                            z = z.max(if s > 0.0 { d / s } else { f64::INFINITY });
                        }
                    }
                }
                worst = worst.max(z);
                print!(
                    "  {} exact {:.3} est {lo:.3}–{hi:.3} z {z:.2}",
                    metric.name(),
                    metric.value(&exact, None).unwrap_or(f64::NAN)
                );
            }
            println!();
        }
    }
    println!("largest |ΔMR|/σ_diff over pairs differing by more than 0.02: {worst:.2}");
}
