//! Report generation for the whole microbenchmark suite: 8 benches whose
//! sampled traces are ~1 % of their loads (w = 1000, period = 100 K, the
//! full-size kernels: 500 K elements, 100 sweeps), each with the
//! `trace.mgz` and `analysis.json` that `bench` leaves behind.
//!
//! `cargo bench -p cargo-memgaze --bench report` prints the wall time of
//! [`report_results`] (median, min, max over the repetitions) for the
//! full report and — measured in the same run, for the ratio — for a
//! report without the per-record charts (analyses only), which isolates
//! the cost of the two streaming passes over the traces.
//!
//! `MEMGAZE_BENCH_REPS` sets the repetitions (default 5).

#[path = "../tests/it/support/synthetic.rs"]
mod synthetic;

use memgaze::gate::BenchKey;
use memgaze::report::{ANALYSIS_FILE, BENCH_FILE, ReportOptions, TRACE_FILE, report_results};
use memgaze_analysis::{AnalysisOptions, analyze_trace};
use memgaze_trace::TraceReader;
use std::path::Path;
use std::time::{Duration, Instant};
use synthetic::{Kernel, Synthetic, write_trace};

fn build_suite(root: &Path, with_traces: bool) -> u64 {
    let mut records = 0;
    for (i, kernel) in Kernel::ALL.into_iter().enumerate() {
        let dir = root.join("microbenches/micro").join(format!("bench-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let key = BenchKey::new("microbenches", "micro", kernel.name());
        std::fs::write(dir.join(BENCH_FILE), serde_json::to_string(&key).unwrap()).unwrap();
        let trace = dir.join(TRACE_FILE);
        let run = Synthetic {
            kernel,
            elements: 500_000,
            reps: 100,
            sampling: Some((1000, 100_000)),
            seed: 1,
        };
        records += write_trace(&trace, &run).0;
        let analysis = analyze_trace(
            TraceReader::open(&trace).unwrap(),
            &AnalysisOptions::default(),
        )
        .unwrap();
        std::fs::write(
            dir.join(ANALYSIS_FILE),
            serde_json::to_vec(&analysis).unwrap(),
        )
        .unwrap();
        if !with_traces {
            std::fs::remove_file(&trace).unwrap();
        }
    }
    records
}

fn time(root: &Path, out: &Path, reps: usize) -> Vec<Duration> {
    let mut times: Vec<Duration> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            let written = report_results(root, &ReportOptions::new(out)).unwrap();
            let elapsed = start.elapsed();
            assert_eq!(written.benches, 8);
            elapsed
        })
        .collect();
    times.sort();
    times
}

fn show(label: &str, times: &[Duration]) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{label}: median {:.0} ms (min {:.0}, max {:.0}; {} runs)",
        ms(times[times.len() / 2]),
        ms(times[0]),
        ms(times[times.len() - 1]),
        times.len()
    );
}

fn size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                size(&path)
            } else {
                e.metadata().map_or(0, |m| m.len())
            }
        })
        .sum()
}

fn main() {
    // `cargo test --benches` runs bench targets in test mode: nothing to check.
    if std::env::args().any(|a| a == "--test") {
        return;
    }
    let reps: usize =
        std::env::var("MEMGAZE_BENCH_REPS").map_or(5, |v| v.parse().expect("a number"));
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("with-traces");
    let bare = dir.path().join("analyses-only");
    eprintln!("building the synthetic suite (8 benches, w = 1000, period = 100 K)…");
    let records = build_suite(&full, true);
    build_suite(&bare, false);
    println!(
        "suite: 8 benches, {records} sampled records ({:.1} MiB of traces and analyses)",
        size(&full) as f64 / (1 << 20) as f64
    );
    let with = time(&full, &dir.path().join("out-full"), reps);
    let without = time(&bare, &dir.path().join("out-bare"), reps);
    show("report, all charts (traces + analyses)", &with);
    show("report, analyses only (no heatmap / per-address)", &without);
    println!(
        "ratio all / analyses only: {:.2}",
        with[with.len() / 2].as_secs_f64() / without[without.len() / 2].as_secs_f64()
    );
}
