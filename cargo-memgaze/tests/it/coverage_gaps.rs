//! Loads that run untraced are never lost silently: escape counts of a
//! process that dies by a signal, untraced explicit loads in instrumented
//! functions, the run cache's entries for programs of the same name, and
//! write failures (docs/METRICS.md, "Dynamic coverage").

use crate::rewriter_support::*;

/// `run --full --libs none --format json -- program args`: its output and
/// the analysis (the JSON after the program's own output).
fn run_json(program: &std::path::Path, args: &[&str]) -> (std::process::Output, serde_json::Value) {
    let out = memgaze()
        .args(["run", "--full", "--libs", "none", "--format", "json", "--"])
        .arg(program)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = &stdout[stdout.find('{').unwrap_or_else(|| {
        panic!(
            "no analysis: {}\n{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        )
    })..];
    let analysis = serde_json::from_str(json).unwrap();
    (out, analysis)
}

/// The runtime sends escape counts from its exit hook: a process killed by
/// SIGKILL, SIGSEGV or abort() takes them along. Its run then reads
/// "unknown" (no `coverage_dynamic`, `escape_counts_missing` 1, one line on
/// stderr), never 100%; a normal exit reports the counted escapes.
#[test]
fn a_run_killed_by_a_signal_does_not_claim_full_dynamic_coverage() {
    let binary = build("escape_dies.c", &["-O1"]);
    let (out, analysis) = run_json(&binary, &["exit"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = &analysis["summary"];
    assert!(
        summary["coverage_dynamic"].as_f64().unwrap() < 0.95,
        "{summary}"
    );
    assert!(summary.get("escape_counts_missing").is_none(), "{summary}");
    for end in ["kill", "segv", "abort"] {
        let (out, analysis) = run_json(&binary, &[end]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{end}: {stderr}");
        let summary = &analysis["summary"];
        assert!(
            summary.get("coverage_dynamic").is_none(),
            "{end}: {summary}"
        );
        assert_eq!(summary["escape_counts_missing"].as_u64(), Some(1), "{end}");
        assert!(
            stderr.contains("memgaze: dynamic coverage unknown: 1 process(es)"),
            "{end}: {stderr}"
        );
        assert!(!stderr.contains("dynamic coverage: 100"), "{end}: {stderr}");
    }
    // `record` keeps the count in the trace, and `analyze` reads it back.
    let inst = instrument(&binary, None, "escape-dies");
    let trace = scratch().join("escape-dies-abort.trace");
    let out = record(&inst.path, &["abort"], &["--full"], &trace, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("dynamic coverage unknown"), "{stderr}");
    assert_eq!(read_trace(&trace).totals.escape_counts_missing, 1);
    let out = run_ok(memgaze().args(["analyze", "--format", "json"]).arg(&trace));
    let analysis: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(analysis["summary"].get("coverage_dynamic").is_none());
    assert_eq!(
        analysis["summary"]["escape_counts_missing"].as_u64(),
        Some(1)
    );
}

/// `cargo-memgaze args…` under `ulimit -f <blocks>`; its one `error:` line.
fn error_under_file_size_limit(blocks: u32, args: &[&std::ffi::OsStr]) -> String {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(r#"ulimit -f {blocks}; exec "$@""#))
        .arg("bash")
        .arg(env!("CARGO_BIN_EXE_cargo-memgaze"))
        .env("MEMGAZE_LIBS_CACHE", crate::support::LIBS_CACHE)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{:?} {stderr}", out.status);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    errors[0].to_string()
}

/// A write that fails (here past `ulimit -f`) is one line naming the file
/// once: the instrumented executable and an analysis written with `-o`
/// said "X: cannot write: X: File too large".
#[test]
fn a_failed_write_names_the_file_once() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build("kernels.c", &["-O2"]);
    let copy = dir.path().join("limited.instrumented");
    let line = error_under_file_size_limit(
        4,
        &[
            "memgaze".as_ref(),
            "instrument".as_ref(),
            binary.as_os_str(),
            "-o".as_ref(),
            copy.as_os_str(),
        ],
    );
    assert_eq!(line.matches("limited.instrumented").count(), 1, "{line}");
    assert!(line.contains("cannot write: File too large"), "{line}");

    let inst = instrument(&binary, None, "write-once");
    let trace = dir.path().join("k.trace");
    let out = record(&inst.path, &["1"], &["--full"], &trace, None);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = dir.path().join("limited.json");
    let line = error_under_file_size_limit(
        1,
        &[
            "memgaze".as_ref(),
            "analyze".as_ref(),
            trace.as_os_str(),
            "--format".as_ref(),
            "json".as_ref(),
            "-o".as_ref(),
            json.as_os_str(),
        ],
    );
    assert_eq!(line.matches("limited.json").count(), 1, "{line}");
    assert!(line.contains("cannot write: File too large"), "{line}");
}
