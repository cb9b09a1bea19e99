//! How close unchanged benches come to the default regression limits when
//! only the sampling seed changes, on real recorded runs: the results of
//! each run saved as a baseline and compared with every other run's by the
//! gate itself (as `cargo memgaze compare OLD NEW` would), reporting per
//! gated metric the largest share of its limit used. A share of 1 would be
//! a false regression.
//!
//! The measurement behind the default limits under the harness's repeating
//! `iter` (ARCHITECTURE.md, "Default regression limits"); run it to
//! reproduce the table in docs/performance.md (each argument a copy of one
//! run's `target/memgaze/<package>` results directory):
//!
//! ```text
//! for s in 1 2 3; do
//!   cargo memgaze bench -p microbenches --no-report --seed $s
//!   cp -r target/memgaze/microbenches /tmp/seed$s
//! done
//! cargo run --release -p cargo-memgaze --example gate_seed_study -- /tmp/seed1 /tmp/seed2 /tmp/seed3
//! ```
//!
//! The share of a limit is how far the change in the metric's bad
//! direction goes towards it: for a limit with a relative and an absolute
//! part (both must be exceeded) the smaller of `change / (relative · |old|)`
//! and `change / absolute`; the limits are the effective ones, widened to
//! the spatial-sampling noise of the two runs for `MR_*` and `misses_*`.

use memgaze::cargo::BenchKey;
use memgaze::gate::{
    BenchRun, Direction, Limit, Limits, compare_bench, load_baseline, save_baseline,
};
use memgaze::report::results::read_analysis;
use std::collections::BTreeMap;
use std::path::Path;

/// Every bench of one results directory (`<target>/<bench>/bench.json` and
/// `analysis.json`), as runs to save.
fn runs_in(dir: &Path) -> anyhow::Result<Vec<BenchRun>> {
    let mut runs = Vec::new();
    for target in std::fs::read_dir(dir)? {
        for bench in std::fs::read_dir(target?.path())? {
            let bench = bench?.path();
            let analysis = bench.join("analysis.json");
            if !analysis.is_file() {
                continue;
            }
            let key: serde_json::Value =
                serde_json::from_slice(&std::fs::read(bench.join("bench.json"))?)?;
            let part = |name: &str| key[name].as_str().unwrap_or_default().to_string();
            runs.push(BenchRun {
                key: BenchKey::new(&part("package"), &part("target"), &part("bench")),
                analysis: read_analysis(&analysis)?,
                binary: None,
                profile: None,
            });
        }
    }
    Ok(runs)
}

/// How far going from `old` to `new` goes towards `limit` (1 = at it).
fn share(limit: &Limit, old: f64, new: f64) -> f64 {
    let worse = match limit.direction {
        Direction::Increase => new - old,
        Direction::Decrease => old - new,
        Direction::Either => (new - old).abs(),
    };
    if worse <= 0.0 {
        return 0.0;
    }
    let relative = limit.relative.map(|r| {
        if old == 0.0 {
            f64::INFINITY
        } else {
            worse / (r * old.abs())
        }
    });
    let absolute = limit.absolute.map(|a| worse / a);
    match (relative, absolute) {
        (Some(r), Some(a)) => r.min(a),
        (Some(x), None) | (None, Some(x)) => x,
        (None, None) => 0.0,
    }
}

/// The worst comparison seen for one metric.
#[derive(Default)]
struct Worst {
    share: f64,
    what: String,
    largest_relative: f64,
    compared: usize,
    regressions: usize,
}

fn main() -> anyhow::Result<()> {
    let dirs: Vec<String> = std::env::args().skip(1).collect();
    assert!(dirs.len() >= 2, "usage: RESULTS_DIR RESULTS_DIR…");
    let root = tempfile::tempdir()?;
    let mut baselines = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let name = format!("run{}", i + 1);
        save_baseline(root.path(), &name, &runs_in(Path::new(dir))?)?;
        baselines.push(load_baseline(root.path(), &name)?);
        println!("{name}: {dir}");
    }
    let limits = Limits::defaults();
    let mut worst: BTreeMap<&'static str, Worst> = BTreeMap::new();
    let mut pairs = 0;
    for old in &baselines {
        for new in &baselines {
            if old.name == new.name {
                continue;
            }
            pairs += 1;
            for bench in &new.benches {
                let Some(before) = old.bench(&bench.bench) else {
                    continue;
                };
                let run = BenchRun {
                    key: bench.bench.clone(),
                    analysis: bench.analysis.clone(),
                    binary: bench.binary.clone(),
                    profile: bench.profile.clone(),
                };
                let verdict = compare_bench(&old.name, before, &run, &limits)?;
                for m in &verdict.metrics {
                    let (Some(limit), Some(o), Some(n)) = (m.limit, m.old, m.new) else {
                        continue;
                    };
                    let entry = worst.entry(m.metric.name()).or_default();
                    entry.compared += 1;
                    entry.regressions += usize::from(m.regressed);
                    if o != 0.0 {
                        entry.largest_relative = entry.largest_relative.max(((n - o) / o).abs());
                    }
                    let s = share(&limit, o, n);
                    if s >= entry.share {
                        entry.share = s;
                        entry.what = format!(
                            "{} {} → {} ({} → {}, limit {limit})",
                            bench.bench.bench, old.name, new.name, o, n
                        );
                    }
                }
            }
        }
    }
    println!(
        "{} runs, {pairs} ordered pairs, default limits",
        baselines.len()
    );
    println!(
        "metric | comparisons | regressions | largest |relative change| | largest share of limit | where"
    );
    for (metric, w) in &worst {
        println!(
            "{metric} | {} | {} | {:.1} % | {:.2} | {}",
            w.compared,
            w.regressions,
            100.0 * w.largest_relative,
            w.share,
            w.what
        );
    }
    Ok(())
}
