//! How much the gated metrics move between runs of an unchanged program:
//! when only the sampling jitter changes (the seed), and when only the
//! placement of its data changes (every data address moved by a few bytes,
//! as an allocation before it or another bench in the same binary does).
//! The measurement behind the default limits (ARCHITECTURE.md, "Default
//! regression limits").
//!
//! A measurement, not a check (it analyses dozens of full-size traces); run
//! it to reproduce the table:
//!
//! ```text
//! N=500000 R=100 SEEDS=6 cargo run --release -p cargo-memgaze --example gate_noise_study
//! ```
//!
//! It prints, per synthetic microbenchmark at the default sampling (w =
//! 1000, period 100 K), each metric's mean over the seeds and two ranges
//! (max − min, absolute and relative to the mean): over `SEEDS` seeds at
//! one placement, and over placements shifted by 0, 8, …, 56 bytes at
//! seed 1. Address-level metrics do not move with placement at all (moving
//! data keeps distinct addresses distinct); line-level ones (`dF_lines`,
//! `F_lines`, `D_*`) do.

#[path = "../tests/it/support/synthetic.rs"]
mod synthetic;

use memgaze::gate::Metric;
use memgaze_analysis::{AnalysisOptions, analyze_trace};
use memgaze_trace::TraceReader;
use synthetic::{Kernel, Synthetic, write_trace_placed};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| v.parse().expect("a number"))
}

/// Per metric of [`Metric::ALL`], its value in each run.
type Values = Vec<Vec<Option<f64>>>;

/// Mean, range and relative range of metric `i` over `values`; `None`
/// where no run defines it.
fn spread(values: &Values, i: usize) -> Option<(f64, f64, f64)> {
    let v: Vec<f64> = values.iter().filter_map(|r| r[i]).collect();
    if v.is_empty() {
        return None;
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let relative = if mean == 0.0 {
        0.0
    } else {
        100.0 * (hi - lo) / mean.abs()
    };
    Some((mean, hi - lo, relative))
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let (elements, reps, seeds) = (env("N", 500_000), env("R", 100), env("SEEDS", 6));
    let path = dir.path().join("trace.mgz");
    let measure = |kernel, seed, shift| -> (Vec<Option<f64>>, u64) {
        let run = Synthetic {
            kernel,
            elements,
            reps,
            sampling: Some((1000, 100_000)),
            seed,
        };
        write_trace_placed(&path, &run, shift);
        let a = analyze_trace(
            TraceReader::open(&path).unwrap(),
            &AnalysisOptions::default(),
        )
        .unwrap();
        let k = memgaze::gate::metric::common_window_k(&a, &a);
        let values = Metric::ALL.iter().map(|m| m.value(&a, k)).collect();
        (values, a.summary.samples)
    };
    for kernel in Kernel::ALL {
        let samples = measure(kernel, 1, 0).1;
        let by_seed: Values = (1..=seeds).map(|seed| measure(kernel, seed, 0).0).collect();
        let by_place: Values = (0..8).map(|i| measure(kernel, 1, 8 * i).0).collect();
        println!("{} (samples {samples})", kernel.name());
        for (i, metric) in Metric::ALL.iter().enumerate() {
            let (Some((mean, seed_range, seed_rel)), Some((_, place_range, place_rel))) =
                (spread(&by_seed, i), spread(&by_place, i))
            else {
                continue;
            };
            println!(
                "  {:12} mean {mean:12.4}  seeds: range {seed_range:.4} ({seed_rel:.1}%)  placements: range {place_range:.4} ({place_rel:.1}%)",
                metric.name()
            );
        }
    }
}
