//! The whole-run miss-ratio curve of a default *recorded* run (time samples
//! plus spatial sampling at 1/128, as `cargo memgaze run` records without
//! flags) against the exact curve of the same program's full trace
//! (issue 22: MAE ≤ 0.02 at the sizes `2^6 … 2^24` blocks).

use memgaze_fixtures as common;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn memgaze(args: &[&str]) -> Output {
    crate::support::memgaze_command()
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

/// A trace's time-sample records as `(load, address, sample, thread)`, its
/// spatial records' count and its totals.
type Records = (Vec<(u32, u64, u64, u32)>, usize, memgaze_trace::TraceTotals);

/// The records of a trace: time-sample records and spatial ones apart.
fn records_of(trace: &Path) -> Records {
    let mut reader = memgaze_trace::TraceReader::open(trace).unwrap();
    let mut timed = Vec::new();
    let mut spatial = 0;
    reader
        .for_each_raw(|r| {
            if r.spatial {
                spatial += 1;
            } else {
                timed.push((r.load, r.addr, r.sample, r.thread));
            }
        })
        .unwrap();
    (timed, spatial, reader.totals().unwrap().clone())
}

/// A run with `--spatial-rate 0` executes no spatial check (the runtime
/// overwrites them with skips) and records exactly the time samples of the
/// default run with the same seed: the checks leave the countdown alone, and
/// the skipped checks leave the program's state alone. `--full` is covered
/// by the Lackey tests, which run with the checks skipped too.
#[test]
fn spatial_rate_0_records_exactly_the_time_samples_of_the_default_run() {
    let dir = tempfile::tempdir().unwrap();
    let program = common::gcc("mrc_small.c", &["-O2", "-g"], dir.path());
    let mut traces = Vec::new();
    for (name, flags) in [
        ("default", &[][..]),
        ("rate0", &["--spatial-rate", "0"][..]),
    ] {
        let trace = dir.path().join(format!("{name}.mgz"));
        let mut args = vec!["run", "-q", "--seed", "7"];
        args.extend_from_slice(flags);
        args.extend(["--save-trace", trace.to_str().unwrap(), "--"]);
        args.push(program.to_str().unwrap());
        let out = memgaze(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        traces.push(records_of(&trace));
    }
    let (default, rate0) = (&traces[0], &traces[1]);
    assert!(default.1 > 1000, "{} spatial records", default.1);
    assert_eq!(rate0.1, 0);
    assert!(default.0.len() > 1000, "{} records", default.0.len());
    assert!(default.0 == rate0.0, "the time samples differ");
    let totals = |t: &memgaze_trace::TraceTotals| (t.executions, t.records, t.samples);
    assert_eq!(totals(&default.2), totals(&rate0.2));
    assert_eq!(rate0.2.spatial_records, 0);
}

/// The entry hook overwrites the spatial checks exactly when the run takes
/// no spatial samples: the fixture counts the checks in its own running
/// copy of a strided loop.
#[test]
fn runs_without_spatial_samples_execute_no_spatial_check() {
    let dir = tempfile::tempdir().unwrap();
    let program = common::gcc("rewriter/spatial_skip.c", &["-O2"], dir.path());
    let instrumented = dir.path().join("spatial_skip.mg");
    let out = memgaze(&[
        "instrument",
        program.to_str().unwrap(),
        "-o",
        instrumented.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = dir.path().join("t.mgz");
    let program_says = |flags: &[&str]| -> String {
        let out = if flags.is_empty() {
            Command::new(&instrumented).output().unwrap()
        } else {
            let mut args = vec!["record", "-q", "-o", trace.to_str().unwrap()];
            args.extend_from_slice(flags);
            args.extend(["--", instrumented.to_str().unwrap()]);
            memgaze(&args)
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // Alone (no collector), at rate 0, in a full trace: none left.
    assert_eq!(
        program_says(&[]).trim(),
        "copied=1 checks=0 sum=0 multiplier=0 threshold=0"
    );
    for flags in [&["--spatial-rate", "0"][..], &["--full"][..]] {
        assert!(
            program_says(flags).contains("copied=1 checks=0 "),
            "{flags:?}"
        );
    }
    // Default and any other rate: the check runs, with the rate's
    // threshold `R · 2^32` as its immediate (the default's as emitted, the
    // other written by the entry hook).
    for (flags, threshold) in [
        (&["--seed", "1"][..], "0x2000000"),
        (&["--spatial-rate", "1/4"][..], "0x40000000"),
    ] {
        let says = program_says(flags);
        assert!(says.contains("copied=1 checks=1 "), "{flags:?}: {says}");
        assert!(
            says.contains(&format!("multiplier=0x9e3779b9 threshold={threshold}")),
            "{flags:?}: {says}"
        );
    }
}
