//! Each message kind's exact JSON, pinned: the literal is what the
//! `json!` code of cargo-memgaze wrote before these types existed, and
//! `old` rebuilds that code's value (a `serde_json::Value`, whose keys are
//! sorted) to show the two agree.

use super::*;
use crate::analysis::{Coverage, Summary};
use crate::model::Dropped;
use serde_json::{Value, json};

/// `message` serialises to exactly `expected`, which is also what the
/// old `json!` value `old` printed; and it reads back.
fn pin<T>(message: &T, expected: &str, old: Value)
where
    T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug,
{
    let text = serde_json::to_string(message).unwrap();
    assert_eq!(text, old.to_string(), "differs from the old json! line");
    assert_eq!(text, expected);
    let back: T = serde_json::from_str(&text).unwrap();
    assert_eq!(&back, message);
}

fn sampled() -> SamplingInfo {
    SamplingInfo::Sampled {
        period: 100_000,
        seed: Some(1),
        window: 1000,
    }
}

/// The old `sampling_json` of a sampled run.
fn sampled_json() -> Value {
    json!({"full": false, "window": 1000, "period": 100_000, "seed": 1})
}

fn summary() -> Summary {
    Summary {
        a: 498_000,
        a_const: 12,
        a_const_frac: Some(0.25),
        kappa: Some(1.0000240963855422),
        rho: Some(100.0),
        a_hat: None,
        samples: 498,
        records: 498_000,
        f: 3,
        f_hat: Some(300.0),
        f_lines: 1,
        f_str: 2.5,
        f_irr: 0.5,
        f_str_frac: 0.8333333333333334,
        f_irr_frac: 0.16666666666666666,
        d_f: Some(6.024096385542169e-6),
        d_mean: None,
        d_max: Some(7),
        threads: 1,
        ..Summary::default()
    }
}

fn coverage() -> Coverage {
    Coverage {
        records: 498_000,
        spatial_records: None,
        trace_samples: 498,
        empty_samples: 0,
        outside_functions: 1,
        filtered_out: 0,
        dropped: Dropped {
            records: 2,
            samples: 0,
            bytes: 0,
        },
        complete: true,
        classified: true,
        outside_binary: None,
        untraced_libraries: Vec::new(),
        objects: Vec::new(),
        untraced_functions: Vec::new(),
        uncounted_libraries: Vec::new(),
        notes: vec!["a note".into()],
    }
}

#[test]
fn build_finished() {
    pin(
        &BuildFinished {
            reason: Reason::BuildFinished,
            success: true,
            targets: vec![BuiltTarget {
                benches: vec!["str1".into(), "irr|str|irr".into()],
                executable: "/t/release/deps/micro-1".into(),
                package: "microbenches".into(),
                target: "micro".into(),
            }],
        },
        r#"{"reason":"build-finished","success":true,"targets":[{"benches":["str1","irr|str|irr"],"executable":"/t/release/deps/micro-1","package":"microbenches","target":"micro"}]}"#,
        json!({"reason": "build-finished", "success": true, "targets": [json!({
            "package": "microbenches",
            "target": "micro",
            "executable": "/t/release/deps/micro-1",
            "benches": ["str1", "irr|str|irr"],
        })]}),
    );
}

#[test]
fn bench_listed() {
    pin(
        &BenchListed {
            executable: "/t/micro".into(),
            ignored: false,
            name: "str1".into(),
            package: "microbenches".into(),
            reason: Reason::BenchListed,
            target: "micro".into(),
        },
        r#"{"executable":"/t/micro","ignored":false,"name":"str1","package":"microbenches","reason":"bench-listed","target":"micro"}"#,
        json!({
            "reason": "bench-listed",
            "package": "microbenches",
            "target": "micro",
            "name": "str1",
            "ignored": false,
            "executable": "/t/micro",
        }),
    );
}

#[test]
fn bench_started() {
    pin(
        &BenchStarted {
            name: "str1".into(),
            package: "microbenches".into(),
            reason: Reason::BenchStarted,
            target: "micro".into(),
        },
        r#"{"name":"str1","package":"microbenches","reason":"bench-started","target":"micro"}"#,
        json!({
            "reason": "bench-started",
            "package": "microbenches",
            "target": "micro",
            "name": "str1",
        }),
    );
}

#[test]
fn bench_finished() {
    let undersampled = "str1: 3 samples (300000 load executions for a period of 100000): its metrics are not reliable; lower --period";
    for (sampling, sampling_json, trace, warnings) in [
        (
            sampled(),
            sampled_json(),
            Some("/r/str1/trace.mgz"),
            vec![undersampled.to_string()],
        ),
        (SamplingInfo::Full, json!({"full": true}), None, vec![]),
    ] {
        let message = BenchFinished {
            analysis: "/r/str1/analysis.json".into(),
            coverage: coverage(),
            elapsed_s: 0.115952124,
            harness: "memgaze".into(),
            iterations: Some(3),
            name: "str1".into(),
            package: "microbenches".into(),
            reason: Reason::BenchFinished,
            region_ns: Some(1_234_567),
            results: "/r/str1".into(),
            sampling,
            summary: summary(),
            target: "micro".into(),
            trace: trace.map(PathBuf::from),
            warnings: warnings.clone(),
        };
        let old = json!({
            "reason": "bench-finished",
            "package": "microbenches",
            "target": "micro",
            "name": "str1",
            "harness": "memgaze",
            "iterations": 3,
            "results": "/r/str1",
            "trace": trace,
            "analysis": "/r/str1/analysis.json",
            "region_ns": 1_234_567u64,
            "sampling": sampling_json,
            "elapsed_s": 0.115952124,
            "summary": summary(),
            "coverage": coverage(),
            "warnings": warnings,
        });
        let expected = if trace.is_some() {
            r#"{"analysis":"/r/str1/analysis.json","coverage":{"classified":true,"complete":true,"dropped":{"bytes":0,"records":2,"samples":0},"empty_samples":0,"filtered_out":0,"notes":["a note"],"outside_binary":null,"outside_functions":1,"records":498000,"trace_samples":498},"elapsed_s":0.115952124,"harness":"memgaze","iterations":3,"name":"str1","package":"microbenches","reason":"bench-finished","region_ns":1234567,"results":"/r/str1","sampling":{"full":false,"period":100000,"seed":1,"window":1000},"summary":{"A":498000,"A_const":12,"A_const_frac":0.25,"A_hat":null,"D_max":7,"D_mean":null,"F":3,"F_hat":300.0,"F_irr":0.5,"F_irr_frac":0.16666666666666666,"F_lines":1,"F_str":2.5,"F_str_frac":0.8333333333333334,"dF":6.024096385542169e-6,"kappa":1.0000240963855422,"records":498000,"rho":100.0,"samples":498,"threads":1},"target":"micro","trace":"/r/str1/trace.mgz","warnings":["str1: 3 samples (300000 load executions for a period of 100000): its metrics are not reliable; lower --period"]}"#
        } else {
            r#"{"analysis":"/r/str1/analysis.json","coverage":{"classified":true,"complete":true,"dropped":{"bytes":0,"records":2,"samples":0},"empty_samples":0,"filtered_out":0,"notes":["a note"],"outside_binary":null,"outside_functions":1,"records":498000,"trace_samples":498},"elapsed_s":0.115952124,"harness":"memgaze","iterations":3,"name":"str1","package":"microbenches","reason":"bench-finished","region_ns":1234567,"results":"/r/str1","sampling":{"full":true},"summary":{"A":498000,"A_const":12,"A_const_frac":0.25,"A_hat":null,"D_max":7,"D_mean":null,"F":3,"F_hat":300.0,"F_irr":0.5,"F_irr_frac":0.16666666666666666,"F_lines":1,"F_str":2.5,"F_str_frac":0.8333333333333334,"dF":6.024096385542169e-6,"kappa":1.0000240963855422,"records":498000,"rho":100.0,"samples":498,"threads":1},"target":"micro","trace":null,"warnings":[]}"#
        };
        pin(&message, expected, old);
        // Messages of versions without `warnings` still read.
        let mut older: Value = serde_json::from_str(expected).unwrap();
        older.as_object_mut().unwrap().remove("warnings");
        let back: BenchFinished = serde_json::from_value(older).unwrap();
        assert!(back.warnings.is_empty());
    }
}

#[test]
fn bench_failed() {
    pin(
        &BenchFailed {
            message: "exit status: 101".into(),
            name: "str1".into(),
            package: "microbenches".into(),
            reason: Reason::BenchFailed,
            target: "micro".into(),
        },
        r#"{"message":"exit status: 101","name":"str1","package":"microbenches","reason":"bench-failed","target":"micro"}"#,
        json!({
            "reason": "bench-failed",
            "package": "microbenches",
            "target": "micro",
            "name": "str1",
            "message": "exit status: 101",
        }),
    );
}

#[test]
fn baseline_comparison() {
    pin(
        &BaselineComparison {
            baseline: "main".into(),
            bench: "str1".into(),
            has_baseline: true,
            metrics: vec![
                MetricComparison {
                    change: Some(0.125),
                    change_frac: Some(1.0),
                    limit: Some("+10% and +0.02".into()),
                    metric: "dF".into(),
                    new: Some(0.25),
                    old: Some(0.125),
                    regressed: true,
                },
                MetricComparison {
                    change: None,
                    change_frac: None,
                    limit: None,
                    metric: "D_max".into(),
                    new: Some(3.0),
                    old: None,
                    regressed: false,
                },
            ],
            notes: vec!["undersampled".into()],
            package: "microbenches".into(),
            reason: Reason::BaselineComparison,
            regressions: 1,
            target: "micro".into(),
            window_k: Some(9),
        },
        r#"{"baseline":"main","bench":"str1","has_baseline":true,"metrics":[{"change":0.125,"change_frac":1.0,"limit":"+10% and +0.02","metric":"dF","new":0.25,"old":0.125,"regressed":true},{"change":null,"change_frac":null,"limit":null,"metric":"D_max","new":3.0,"old":null,"regressed":false}],"notes":["undersampled"],"package":"microbenches","reason":"baseline-comparison","regressions":1,"target":"micro","window_k":9}"#,
        json!({
            "reason": "baseline-comparison",
            "baseline": "main",
            "package": "microbenches",
            "target": "micro",
            "bench": "str1",
            "has_baseline": true,
            "window_k": 9,
            "metrics": [
                json!({
                    "metric": "dF",
                    "old": 0.125,
                    "new": 0.25,
                    "change": 0.125,
                    "change_frac": 1.0,
                    "limit": "+10% and +0.02",
                    "regressed": true,
                }),
                json!({
                    "metric": "D_max",
                    "old": None::<f64>,
                    "new": 3.0,
                    "change": None::<f64>,
                    "change_frac": None::<f64>,
                    "limit": None::<String>,
                    "regressed": false,
                }),
            ],
            "regressions": 1,
            "notes": ["undersampled"],
        }),
    );
}

#[test]
fn regression() {
    pin(
        &Regression {
            baseline: "main".into(),
            bench: "str1".into(),
            change: 0.125,
            change_frac: None,
            limit: "+10% and +0.02".into(),
            metric: "dF".into(),
            new: 0.25,
            old: 0.125,
            package: "microbenches".into(),
            reason: Reason::Regression,
            target: "micro".into(),
        },
        r#"{"baseline":"main","bench":"str1","change":0.125,"change_frac":null,"limit":"+10% and +0.02","metric":"dF","new":0.25,"old":0.125,"package":"microbenches","reason":"regression","target":"micro"}"#,
        json!({
            "reason": "regression",
            "baseline": "main",
            "package": "microbenches",
            "target": "micro",
            "bench": "str1",
            "metric": "dF",
            "old": 0.125,
            "new": 0.25,
            "change": 0.125,
            "change_frac": None::<f64>,
            "limit": "+10% and +0.02",
        }),
    );
}

#[test]
fn report() {
    pin(
        &Report {
            benches: 8,
            index: "/r/report/index.html".into(),
            reason: Reason::Report,
            warnings: vec!["str1: no trace".into()],
        },
        r#"{"benches":8,"index":"/r/report/index.html","reason":"report","warnings":["str1: no trace"]}"#,
        json!({
            "reason": "report",
            "index": "/r/report/index.html",
            "benches": 8,
            "warnings": ["str1: no trace"],
        }),
    );
}

#[test]
fn bench_summary() {
    pin(
        &BenchSummary {
            benches: 0,
            elapsed_s: 0.0,
            failed: 0,
            measured: 0,
            reason: Reason::Summary,
            results: "/r".into(),
        },
        r#"{"benches":0,"elapsed_s":0.0,"failed":0,"measured":0,"reason":"summary","results":"/r"}"#,
        json!({
            "reason": "summary",
            "benches": 0,
            "measured": 0,
            "failed": 0,
            "results": "/r",
            "elapsed_s": 0.0,
        }),
    );
}

#[test]
fn suite_summary() {
    let counts: BTreeMap<String, usize> = [("unchanged".into(), 7), ("differs".into(), 1)].into();
    pin(
        &SuiteSummary {
            benches: 8,
            counts: counts.clone(),
            elapsed_s: 12.5,
            reason: Reason::Summary,
        },
        r#"{"benches":8,"counts":{"differs":1,"unchanged":7},"elapsed_s":12.5,"reason":"summary"}"#,
        json!({
            "reason": "summary",
            "benches": 8,
            "counts": counts,
            "elapsed_s": 12.5,
        }),
    );
}

#[test]
fn golden() {
    pin(
        &Golden {
            changes: vec!["summary.F: 3 → 4".into()],
            elapsed_s: 1.5,
            name: "str1".into(),
            package: "microbenches".into(),
            pending: Some("/g/str1.snap.new".into()),
            reason: Reason::Golden,
            records: 1_000_000,
            snapshot: "/g/str1.snap".into(),
            status: "differs".into(),
            target: "micro".into(),
        },
        r#"{"changes":["summary.F: 3 → 4"],"elapsed_s":1.5,"name":"str1","package":"microbenches","pending":"/g/str1.snap.new","reason":"golden","records":1000000,"snapshot":"/g/str1.snap","status":"differs","target":"micro"}"#,
        json!({
            "reason": "golden",
            "package": "microbenches",
            "target": "micro",
            "name": "str1",
            "status": "differs",
            "snapshot": "/g/str1.snap",
            "pending": "/g/str1.snap.new",
            "changes": ["summary.F: 3 → 4"],
            "records": 1_000_000u64,
            "elapsed_s": 1.5,
        }),
    );
}

#[test]
fn golden_orphan() {
    pin(
        &GoldenOrphan {
            deleted: false,
            reason: Reason::GoldenOrphan,
            snapshot: "/g/old.snap".into(),
        },
        r#"{"deleted":false,"reason":"golden-orphan","snapshot":"/g/old.snap"}"#,
        json!({"reason": "golden-orphan", "snapshot": "/g/old.snap", "deleted": false}),
    );
}

#[test]
fn golden_facts_differ() {
    pin(
        &GoldenFactsDiffer {
            message: "recorded with rustc 1.0".into(),
            reason: Reason::GoldenFactsDiffer,
        },
        r#"{"message":"recorded with rustc 1.0","reason":"golden-facts-differ"}"#,
        json!({"reason": "golden-facts-differ", "message": "recorded with rustc 1.0"}),
    );
}

#[test]
fn validation() {
    // The per-metric rows as cargo-memgaze's accuracy types write them
    // (declaration order, not sorted): the line sorts their keys.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Row {
        metric: String,
        rows: usize,
        error: Option<f64>,
        ci: Option<[f64; 2]>,
        limit: f64,
        status: String,
    }
    let row = Row {
        metric: "F".into(),
        rows: 7,
        error: Some(0.0123),
        ci: Some([-0.01, 0.02]),
        limit: 0.15,
        status: "ok".into(),
    };
    let message = Validation {
        code_window_k: 9,
        elapsed_s: 0.5,
        functions: vec![json!({"name": "f", "share": 1.0, "status": "ok"})],
        k_max: 9,
        mrc: None,
        name: "str1".into(),
        package: "microbenches".into(),
        period: 100_000,
        problems: vec![],
        reason: Reason::Validation,
        samples: 498,
        sampling: sampled(),
        status: "ok".into(),
        target: "micro".into(),
        trace_size_frac: Some(0.01),
        trace_size_frac_total: Some(0.015),
        trace_windows: vec![row.clone()],
        window: 1000,
    };
    // The old code: the message, then the comparison's fields but
    // `status` merged in.
    let mut old = json!({
        "reason": "validation",
        "package": "microbenches",
        "target": "micro",
        "name": "str1",
        "status": "ok",
        "sampling": sampled_json(),
        "elapsed_s": 0.5,
    });
    let comparison = json!({
        "samples": 498,
        "window": 1000,
        "period": 100_000,
        "k_max": 9,
        "code_window_k": 9,
        "trace_size_frac": 0.01,
        "trace_size_frac_total": 0.015,
        "trace_windows": [serde_json::to_value(&row).unwrap()],
        "functions": [{"name": "f", "share": 1.0, "status": "ok"}],
        "problems": [],
        "status": "ok",
    });
    for (key, value) in comparison.as_object().unwrap() {
        if key != "status" {
            old.as_object_mut()
                .unwrap()
                .insert(key.clone(), value.clone());
        }
    }
    let text = serde_json::to_string(&message).unwrap();
    assert_eq!(text, old.to_string());
    assert_eq!(
        text,
        r#"{"code_window_k":9,"elapsed_s":0.5,"functions":[{"name":"f","share":1.0,"status":"ok"}],"k_max":9,"name":"str1","package":"microbenches","period":100000,"problems":[],"reason":"validation","samples":498,"sampling":{"full":false,"period":100000,"seed":1,"window":1000},"status":"ok","target":"micro","trace_size_frac":0.01,"trace_size_frac_total":0.015,"trace_windows":[{"ci":[-0.01,0.02],"error":0.0123,"limit":0.15,"metric":"F","rows":7,"status":"ok"}],"window":1000}"#
    );
    let back: Validation<Row> = serde_json::from_str(&text).unwrap();
    assert_eq!(back.trace_windows, vec![row]);
}

#[test]
fn sampling_reads_back_and_a_line_dispatches_on_its_reason() {
    for s in [sampled(), SamplingInfo::Full] {
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<SamplingInfo>(&text).unwrap(), s);
    }
    assert!(serde_json::from_str::<SamplingInfo>(r#"{"full":false}"#).is_err());
    #[derive(Deserialize)]
    struct Head {
        reason: Reason,
    }
    let line = r#"{"name":"str1","package":"p","reason":"bench-started","target":"t"}"#;
    let head: Head = serde_json::from_str(line).unwrap();
    assert_eq!(head.reason, Reason::BenchStarted);
}
