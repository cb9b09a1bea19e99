//! The whole-run miss-ratio curve of a default *recorded* run (time samples
//! plus spatial sampling at 1/128, as `cargo memgaze run` records without
//! flags) against the exact curve of the same program's full trace
//! (issue 22: MAE ≤ 0.02 at the sizes `2^6 … 2^24` blocks).

use memgaze_fixtures as common;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn memgaze(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cargo-memgaze"))
        .arg("memgaze")
        .args(args)
        .output()
        .unwrap()
}

/// `run [flags] --save-trace TRACE -- program`, then the trace's analysis
/// (JSON) at fixed cache sizes.
fn record_and_analyse(dir: &Path, program: &Path, name: &str, flags: &[&str]) -> Value {
    let trace = dir.join(format!("{name}.mgz"));
    let trace_arg = trace.to_str().unwrap();
    let mut args = vec!["run", "-q"];
    args.extend_from_slice(flags);
    args.extend(["--save-trace", trace_arg, "--", program.to_str().unwrap()]);
    let out = memgaze(&args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = memgaze(&[
        "analyze",
        trace_arg,
        "--cache-sizes",
        "32K,1M,32M",
        "--format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `(blocks, miss_ratio)` of a summary's curve at the powers of two.
fn standard_curve(analysis: &Value) -> Vec<(u64, f64)> {
    analysis["summary"]["mrc"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["blocks"].as_u64().unwrap(),
                p["miss_ratio"].as_f64().unwrap(),
            )
        })
        .filter(|(b, _)| b.is_power_of_two() && (6..=24).contains(&b.trailing_zeros()))
        .collect()
}

#[test]
fn a_default_recorded_run_is_within_0_02_of_the_exact_curve() {
    let dir = tempfile::tempdir().unwrap();
    let program = common::gcc("mrc_small.c", &["-O2", "-g"], dir.path());
    let exact = record_and_analyse(dir.path(), &program, "full", &["--full"]);
    let sampled = record_and_analyse(dir.path(), &program, "sampled", &[]);

    let s = &sampled["summary"];
    assert_eq!(s["spatial_rate"].as_f64(), Some(1.0 / 128.0), "{s}");
    let tracked = s["tracked_accesses"].as_u64().unwrap();
    // The curve comes from the recorded spatial records: ~1.7 M Strided and
    // Irregular loads give ~13 K tracked accesses, where the ~17 K records
    // of the time samples alone would give ~130.
    assert!(
        tracked >= 5000,
        "spatial records missing: {tracked} tracked"
    );
    let (exact_curve, sampled_curve) = (standard_curve(&exact), standard_curve(&sampled));
    assert_eq!(exact_curve.len(), 19);
    assert_eq!(
        exact_curve.iter().map(|p| p.0).collect::<Vec<_>>(),
        sampled_curve.iter().map(|p| p.0).collect::<Vec<_>>()
    );
    // The program reuses at L1, L2 and LLC sizes: the exact curve falls
    // from near 1/8 (a new line every 8 loads) through the middle.
    let at = |curve: &[(u64, f64)], blocks: u64| curve.iter().find(|p| p.0 == blocks).unwrap().1;
    assert!(at(&exact_curve, 64) > 0.3 && at(&exact_curve, 1 << 20) < 0.1);
    let mae = exact_curve
        .iter()
        .zip(&sampled_curve)
        .map(|(e, s)| (e.1 - s.1).abs())
        .sum::<f64>()
        / exact_curve.len() as f64;
    assert!(
        mae <= 0.02,
        "MAE {mae:.4} ({tracked} tracked)\nexact   {exact_curve:?}\nsampled {sampled_curve:?}"
    );
}
