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

/// Whether this CPU runs AVX2 (the gather fixture needs it).
fn has_avx2() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" avx2"))
}

/// `gather_loop.c`'s hot loop runs one scalar load and one AVX2 gather per
/// iteration; no probe can trace the gather. It read "dynamic 100%": the
/// gather's executions are now counted (10,000, exact, in
/// `untraced_load_executions` and the trace's escape counts), the dynamic
/// coverage drops to about half with a warning naming the function, the
/// program's output is unchanged, `instrument` reports one untraced-load
/// count and no escape check, and `classify` no longer says the gather has
/// a probe.
#[test]
fn untraced_gathers_lower_the_dynamic_coverage() {
    if !has_avx2() {
        eprintln!("skipped: this CPU lacks AVX2");
        return;
    }
    let binary = build("gather_loop.c", &["-O2"]);
    let native = native(&binary, &[], None);
    let inst = instrument(&binary, None, "gather-loop");
    assert_eq!(
        inst.report["untraced_load_counts"].as_u64(),
        Some(1),
        "{}",
        inst.report
    );
    assert_eq!(
        inst.report["escape_checks"].as_u64(),
        Some(0),
        "{}",
        inst.report
    );

    let (out, analysis) = run_json(&binary, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.starts_with(&*String::from_utf8_lossy(&native.stdout)),
        "{printed}"
    );
    let summary = &analysis["summary"];
    assert_eq!(
        summary["untraced_load_executions"].as_u64(),
        Some(10_000),
        "{summary}"
    );
    let coverage = summary["coverage_dynamic"].as_f64().unwrap();
    assert!((0.3..0.7).contains(&coverage), "{coverage}");
    let untraced = &analysis["coverage"]["untraced_functions"][0];
    assert!(
        untraced["name"].as_str().unwrap().starts_with("mixed"),
        "{untraced}"
    );
    assert_eq!(untraced["escapes"].as_u64(), Some(0), "{untraced}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings = stderr
        .lines()
        .filter(|l| l.starts_with("warning: dynamic coverage is"))
        .count();
    assert_eq!(warnings, 1, "{stderr}");
    assert!(
        stderr.contains("10000 executions of loads no probe can trace"),
        "{stderr}"
    );

    let trace = scratch().join("gather-loop.trace");
    let out = record(&inst.path, &[], &["--full"], &trace, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The executable's: libc, instrumented by default, counts its own
    // (`__vfprintf_internal`'s jump table).
    let escapes: Vec<_> = (read_trace(&trace).totals.escapes.into_iter())
        .filter(|e| !e.function.contains('!'))
        .collect();
    assert_eq!(escapes.len(), 1, "{escapes:?}");
    assert!(escapes[0].untraced_load);
    assert_eq!(escapes[0].count, 10_000);

    let out = run_ok(
        memgaze()
            .args(["classify", "--format", "json"])
            .arg(&binary),
    );
    let classified: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gathers: Vec<&serde_json::Value> = classified["loads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["gather"] == true)
        .collect();
    assert_eq!(gathers.len(), 1, "{gathers:?}");
    assert_eq!(gathers[0]["instrumented"], false, "{}", gathers[0]);
    assert!(
        gathers[0]["reason"]
            .as_str()
            .unwrap()
            .contains("not traced: gather")
    );
    let out = run_ok(
        memgaze()
            .args(["classify", "--functions", "mixed*"])
            .arg(&binary),
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table.lines().find(|l| l.contains("vpgatherdd")).unwrap();
    assert!(row.contains(" no "), "{row}");
}

/// `classify`'s per-function `probes` and `kappa` agree with its per-load
/// rows: `gather_loop.c`'s gather, listed `probe no`, is not counted as a
/// probe of its function, in the table's columns nor in the JSON's
/// `functions[]` and summary (static: needs no AVX2).
#[test]
fn classify_counts_no_probe_for_an_untraceable_gather() {
    let binary = build("gather_loop.c", &["-O2"]);
    let out = run_ok(
        memgaze()
            .args(["classify", "--format", "json", "--functions", "mixed*"])
            .arg(&binary),
    );
    let classified: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let loads = classified["loads"].as_array().unwrap();
    assert!(loads.iter().any(|l| l["gather"] == true), "{loads:?}");
    let probed = loads.iter().filter(|l| l["instrumented"] == true).count() as u64;
    assert!(probed > 0, "{loads:?}");
    let rows = classified["functions"].as_array().unwrap();
    let row_probes: u64 = rows
        .iter()
        .map(|f| f["instrumented"].as_u64().unwrap())
        .sum();
    assert_eq!(row_probes, probed, "{rows:?}");
    assert_eq!(
        classified["summary"]["instrumented"].as_u64(),
        Some(probed),
        "{}",
        classified["summary"]
    );
    let kappa = classified["summary"]["compression_ratio"].as_f64().unwrap();
    assert!(
        (kappa - loads.len() as f64 / probed as f64).abs() < 1e-9,
        "{kappa}"
    );

    let out = run_ok(
        memgaze()
            .args(["classify", "--functions", "mixed*"])
            .arg(&binary),
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let yes_rows = table
        .lines()
        .filter(|l| l.starts_with("  0x"))
        .filter(|l| l.split_whitespace().nth(2) == Some("yes"))
        .count() as u64;
    assert_eq!(yes_rows, probed, "{table}");
    let total: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("total ("))
        .unwrap()
        .split_whitespace()
        .collect();
    let (probes, kappa) = (total[total.len() - 2], total[total.len() - 1]);
    assert_eq!(probes, probed.to_string(), "{table}");
    assert_eq!(
        kappa,
        format!("{:.2}", loads.len() as f64 / probed as f64),
        "{table}"
    );
}

/// An instrumented shared library counts its escapes and its untraced
/// loads as the executable does: `gather_lib.c`'s 10,000 gathers (no probe
/// can trace them) and the 4,000 escapes of `mg_escape_step` (3,000 in
/// the process, 1,000 in a forked child, each process sending its own) are
/// counted exactly, full or sampled, under the library's functions; its row
/// of `coverage_by_object` has them as untraced, and nothing says its
/// escapes are not counted.
#[test]
fn an_instrumented_library_counts_its_escapes_and_untraced_loads() {
    if !has_avx2() {
        eprintln!("skipped: this CPU lacks AVX2");
        return;
    }
    let dir = scratch().join("gather-lib");
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = |name: &str| memgaze_fixtures::fixtures().join("rewriter").join(name);
    run_ok(
        std::process::Command::new("gcc")
            .args(["-shared", "-fPIC", "-O2", "-g", "-o"])
            .arg(dir.join("libmggather.so"))
            .arg(fixture("gather_lib.c")),
    );
    let program = dir.join("gather_lib_main");
    run_ok(
        std::process::Command::new("gcc")
            .args(["-O2", "-g", "-o"])
            .arg(&program)
            .arg(fixture("gather_lib_main.c"))
            .arg("-L")
            .arg(&dir)
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-lmggather"),
    );
    let native = native(&program, &[], None);
    for (sampling, name) in [(&["--full"][..], "full"), (&[][..], "sampled")] {
        let json = dir.join(format!("analysis-{name}.json"));
        let out = run_ok(
            memgaze()
                .arg("run")
                .args(sampling)
                .args(["--libs", "libmggather*", "--format", "json", "-o"])
                .arg(&json)
                .arg(&program),
        );
        assert_eq!(out.stdout, native.stdout);
        let analysis: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let summary = &analysis["summary"];
        assert_eq!(
            summary["untraced_load_executions"], 10_000,
            "{name}: {summary}"
        );
        let coverage = &analysis["coverage"];
        assert!(coverage.get("uncounted_libraries").is_none(), "{coverage}");
        let untraced = coverage["untraced_functions"].as_array().unwrap();
        let function = |f: &str| {
            untraced
                .iter()
                .find(|u| u["name"] == format!("libmggather.so!{f}"))
                .unwrap_or_else(|| panic!("{name}: {f} not untraced: {coverage}"))
        };
        assert_eq!(function("mg_escape_step")["escapes"], 4_000, "{name}");
        assert_eq!(function("mg_gather_sum")["escapes"], 0, "{name}");
        assert_eq!(function("mg_gather_sum")["untraced"], 10_000.0, "{name}");
        assert!(
            untraced
                .iter()
                .all(|u| u["name"].as_str().unwrap().starts_with("libmggather.so!")),
            "{name}: the executable has no escapes: {coverage}"
        );
        let notes: Vec<&str> = coverage["notes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n.as_str())
            .collect();
        assert!(
            !notes
                .iter()
                .any(|n| n.contains("in instrumented libraries are not counted")),
            "{notes:?}"
        );
        if name == "full" {
            let row = summary["coverage_by_object"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["object"] == "libmggather.so")
                .unwrap_or_else(|| panic!("no row for the library: {summary}"))
                .clone();
            assert_eq!(row["instrumented"], true, "{row}");
            let traced = row["loads_traced"].as_f64().unwrap();
            let executed = row["loads_executed"].as_f64().unwrap();
            assert!(traced >= 10_000.0, "{row}");
            let lost: f64 = untraced
                .iter()
                .map(|u| u["untraced"].as_f64().unwrap())
                .sum();
            assert!((executed - traced - lost).abs() < 1e-6, "{row} {coverage}");
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr
            .lines()
            .find(|l| l.starts_with("memgaze: dynamic coverage:"))
            .unwrap_or_else(|| panic!("no dynamic coverage line: {stderr}"));
        assert!(
            !line.contains("untraced loads in instrumented libraries"),
            "{line}"
        );
    }
}
