//! A results tree like `cargo memgaze bench` leaves behind, built from
//! synthetic microbenchmark traces.

#![allow(dead_code)]

use super::synthetic::{Kernel, Synthetic, write_trace};
use memgaze::gate::BenchKey;
use memgaze::report::{ANALYSIS_FILE, BENCH_FILE, GOLDEN_FILE, TRACE_FILE};
use memgaze_analysis::{Analysis, AnalysisOptions, analyze_trace};
use memgaze_trace::TraceReader;
use std::path::{Path, PathBuf};

/// Writes one bench directory under `root`: its trace, analysis and
/// `bench.json`; with `golden`, also the analysis of a full trace of the
/// same kernel. Returns the directory and the analysis.
pub fn bench_dir(root: &Path, run: &Synthetic, golden: bool) -> (PathBuf, Analysis) {
    let name = run.kernel.name();
    let dir = root
        .join("microbenches")
        .join("micro")
        .join(name.replace('/', "%2F").replace('|', "%7C"));
    std::fs::create_dir_all(&dir).unwrap();
    let key = BenchKey::new("microbenches", "micro", name);
    std::fs::write(dir.join(BENCH_FILE), serde_json::to_string(&key).unwrap()).unwrap();
    let trace = dir.join(TRACE_FILE);
    write_trace(&trace, run);
    let analysis = analyze(&trace);
    std::fs::write(
        dir.join(ANALYSIS_FILE),
        serde_json::to_vec(&analysis).unwrap(),
    )
    .unwrap();
    if golden {
        let full = dir.join("full.mgz");
        write_trace(
            &full,
            &Synthetic {
                sampling: None,
                reps: 2,
                ..*run
            },
        );
        std::fs::write(
            dir.join(GOLDEN_FILE),
            serde_json::to_vec(&analyze(&full)).unwrap(),
        )
        .unwrap();
        std::fs::remove_file(full).unwrap();
    }
    (dir, analysis)
}

/// Analyses a trace file with the default options.
pub fn analyze(path: &Path) -> Analysis {
    analyze_trace(
        TraceReader::open(path).unwrap(),
        &AnalysisOptions::default(),
    )
    .unwrap()
}

/// A small sampled run of `kernel` (about 60 samples of 1000 records).
pub fn small(kernel: Kernel, seed: u64) -> Synthetic {
    Synthetic {
        kernel,
        elements: 50_000,
        reps: 12,
        sampling: Some((1000, 20_000)),
        seed,
    }
}
