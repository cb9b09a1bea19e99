//! `cargo memgaze bench`, `golden` and `validate` end to end, through the
//! built binary, on the bundled microbenchmarks and the HashMap/BTreeMap
//! fixture crate.
//!
//! Builds share the target directory of `cargo_benches.rs` (under
//! `CARGO_TARGET_TMPDIR`), so nothing compiles twice; the tests take a lock
//! because `bench` writes the shared results directory.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn shared_target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("memgaze-benches")
}

fn workspace_manifest() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml")
}

fn fixture_manifest() -> PathBuf {
    memgaze_fixtures::fixtures().join("hashmap-vs-btree/Cargo.toml")
}

/// `cargo-memgaze <command> --locked --manifest-path M --target-dir T <extra>`
/// with `env` set (and `CI`/`MEMGAZE_*` from the test's own environment
/// removed, so results do not depend on how the tests were started).
fn memgaze(command: &str, manifest: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = crate::support::memgaze_command();
    cmd.args(["memgaze", command, "--locked", "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(shared_target_dir())
        .args(extra)
        .env_remove("CI");
    for (name, _) in std::env::vars() {
        if name.starts_with("MEMGAZE_") {
            cmd.env_remove(name);
        }
    }
    for (name, value) in env {
        cmd.env(name, value);
    }
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn messages(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn by_reason<'a>(messages: &'a [Value], reason: &str) -> Vec<&'a Value> {
    messages.iter().filter(|m| m["reason"] == reason).collect()
}

fn f64_of(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Issue 25: a bench whose hot loop is `BTreeMap::get` inlined into a user
/// function (`sum_of_lookups`): the report's hottest line, its opening
/// sentence and the analysis's `lines[]` name the user's line, not the
/// standard library's search code.
#[test]
fn hot_lines_name_the_users_line_of_an_inlined_btreemap_lookup() {
    let _lock = serial();
    let manifest = fixture_manifest();
    let out = memgaze(
        "bench",
        &manifest,
        &[
            "-q",
            "--features",
            "inlined-get",
            "--bench",
            "inlined",
            "--seed",
            "2",
            "--message-format",
            "json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lib = memgaze_fixtures::fixtures().join("hashmap-vs-btree/src/lib.rs");
    let source = std::fs::read_to_string(&lib).unwrap();
    let line = 1 + source
        .lines()
        .position(|l| l.contains("// user line: get"))
        .unwrap();
    let user_line = format!("hashmap-vs-btree/src/lib.rs:{line}");

    let results = shared_target_dir().join("memgaze/hashmap-vs-btree/inlined");
    let analysis: Value =
        serde_json::from_slice(&std::fs::read(results.join("btree_get/analysis.json")).unwrap())
            .unwrap();
    let lines = analysis["lines"].as_array().unwrap();
    assert!(
        lines[0]["line"].as_str().unwrap().ends_with(&user_line),
        "{lines:#?}"
    );
    // The standard library's positions are attributed to the caller.
    assert!(
        lines
            .iter()
            .all(|l| !l["line"].as_str().unwrap().contains("/library/alloc/")),
        "{lines:#?}"
    );

    let report = tempfile::tempdir().unwrap();
    let out = crate::support::memgaze_command()
        .args(["memgaze", "report", "-q"])
        .arg(&results)
        .arg("-o")
        .arg(report.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let html = std::fs::read_to_string(report.path().join("index.html")).unwrap();
    let first_hot_line = html
        .split("<table class=\"lines\">")
        .nth(1)
        .and_then(|t| t.split("<code>").nth(1))
        .and_then(|c| c.split("</code>").next())
        .unwrap_or_else(|| panic!("no hot-lines table: {html}"));
    assert!(first_hot_line.ends_with(&user_line), "{first_hot_line}");
    let lead = html.split("<p class=\"lead\">").nth(1).unwrap();
    let lead = lead.split("</p>").next().unwrap();
    assert!(lead.contains(&user_line), "{lead}");
}

/// Issue 6: the locality each microbenchmark is built to show, on a full
/// `cargo memgaze bench -p microbenches` run with default sampling.
#[test]
fn microbench_suite_shows_the_expected_locality() {
    let _lock = serial();
    let out = memgaze(
        "bench",
        &workspace_manifest(),
        &[
            "-q",
            "-p",
            "microbenches",
            "--seed",
            "1",
            "--message-format",
            "json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let all = messages(&out);
    let finished = by_reason(&all, "bench-finished");
    let names: Vec<&str> = finished
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "str1",
            "str8",
            "irr",
            "irr-rand",
            "irr-half",
            "str/irr",
            "irr|str|irr",
            "chase"
        ]
    );
    // Issue 23: with the repeating `iter`, no microbenchmark is undersampled
    // at the default settings: no warning (too few samples) and no note of
    // an undersampled whole-run curve (too few tracked accesses).
    for m in &finished {
        assert_eq!(m["warnings"], serde_json::json!([]), "{}", m["name"]);
        let notes = m["coverage"]["notes"].as_array().unwrap();
        assert!(
            !notes
                .iter()
                .any(|n| n.as_str().unwrap().contains("undersampled")),
            "{}: {notes:?}",
            m["name"]
        );
    }
    let summary = |name: &str| &finished.iter().find(|m| m["name"] == name).unwrap()["summary"];
    let frac = |name: &str, key: &str| f64_of(&summary(name)[key]);
    let analysis = |name: &str| -> Value {
        let m = finished.iter().find(|m| m["name"] == name).unwrap();
        let path = m["analysis"].as_str().unwrap();
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let mut report = Vec::new();
    for name in &names {
        let s = summary(name);
        report.push(format!(
            "{name}: A {} samples {} rho {:.1} F_str% {:.3} F_irr% {:.3}",
            s["A"],
            s["samples"],
            f64_of(&s["rho"]),
            f64_of(&s["F_str_frac"]),
            f64_of(&s["F_irr_frac"])
        ));
        assert!(f64_of(&s["samples"]) >= 400.0, "{name}: {s}");
    }
    eprintln!("{}", report.join("\n"));
    for name in ["str1", "str8"] {
        assert!(frac(name, "F_str_frac") >= 0.9, "{name}: {}", summary(name));
    }
    assert!(frac("chase", "F_irr_frac") >= 0.9, "{}", summary("chase"));
    for name in ["irr", "irr-rand", "irr-half"] {
        let irr = frac(name, "F_irr_frac");
        assert!((0.4..=0.6).contains(&irr), "{name}: {}", summary(name));
        // The kernel's index load is Strided and its data load Irregular:
        // its two hot loads, one of each class, each about half its
        // accesses.
        let a = analysis(name);
        let kernel = format!("microbenches::kernels::{}", name.replace('-', "_"));
        let loads: Vec<&Value> = a["loads"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["function"] == kernel.as_str())
            .collect();
        let total: f64 = loads.iter().map(|l| f64_of(&l["count"])).sum();
        for class in ["Strided", "Irregular"] {
            let hot = loads
                .iter()
                .filter(|l| l["class"] == class)
                .map(|l| f64_of(&l["count"]))
                .fold(0.0, f64::max);
            assert!(
                hot >= 0.4 * total,
                "{name}: the hottest {class} load has {hot} of {total} accesses: {loads:?}"
            );
        }
    }
    for name in ["str/irr", "irr|str|irr"] {
        assert!(frac(name, "F_str_frac") >= 0.1, "{name}: {}", summary(name));
        assert!(frac(name, "F_irr_frac") >= 0.1, "{name}: {}", summary(name));
    }
    // At the largest k of the trace-window histogram str8's windows touch
    // ~8x the lines of str1's.
    let last_row = |name: &str| {
        analysis(name)["trace_windows"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone()
    };
    let (row1, row8) = (last_row("str1"), last_row("str8"));
    assert_eq!(row1["k"], row8["k"]);
    let ratio = f64_of(&row8["F_lines"]) / f64_of(&row1["F_lines"]);
    eprintln!(
        "F_lines at k = {}: str1 {} str8 {} (ratio {ratio:.2})",
        row1["k"], row1["F_lines"], row8["F_lines"]
    );
    assert!((7.0..=9.0).contains(&ratio), "{row1} {row8}");

    // Results layout: trace, analysis and identity per bench.
    let dir = PathBuf::from(finished[5]["results"].as_str().unwrap());
    assert!(
        dir.ends_with("memgaze/microbenches/micro/str%2Firr"),
        "{dir:?}"
    );
    for file in ["bench.json", "trace.mgz", "analysis.json"] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    let last = all.last().unwrap();
    assert_eq!(last["reason"], "summary");
    assert_eq!(
        (last["measured"].as_u64(), last["failed"].as_u64()),
        (Some(8), Some(0))
    );
}

/// The example user crate end to end, filters, and a failing body (101).
#[test]
fn hashmap_vs_btree_fixture_end_to_end() {
    let _lock = serial();
    let manifest = fixture_manifest();
    // Small benches: sample every 10 000 load executions.
    let out = memgaze(
        "bench",
        &manifest,
        &[
            "-q",
            "--seed",
            "3",
            "--period",
            "10000",
            "--message-format",
            "json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let all = messages(&out);
    let finished = by_reason(&all, "bench-finished");
    let names: Vec<&str> = finished
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "scan",
            "hashmap/1000",
            "hashmap/100000",
            "btreemap/1000",
            "btreemap/100000"
        ]
    );
    for m in &finished {
        assert!(Path::new(m["trace"].as_str().unwrap()).is_file(), "{m}");
    }
    let summary = |name: &str| &finished.iter().find(|m| m["name"] == name).unwrap()["summary"];
    // The array scan is strided; lookups in the big maps are sampled often
    // enough to see that hashing scatters them.
    assert!(
        summary("scan")["samples"].as_u64().unwrap() >= 5,
        "{}",
        summary("scan")
    );
    assert!(
        f64_of(&summary("scan")["F_str_frac"]) >= 0.9,
        "{}",
        summary("scan")
    );
    for name in ["hashmap/100000", "btreemap/100000"] {
        assert!(
            summary(name)["samples"].as_u64().unwrap() >= 30,
            "{}",
            summary(name)
        );
    }
    assert!(
        f64_of(&summary("hashmap/100000")["F_irr_frac"]) >= 0.5,
        "{}",
        summary("hashmap/100000")
    );

    // Human output: one table row per bench, only the filtered one.
    let out = memgaze(
        "bench",
        &manifest,
        &["--seed", "3", "--", "--exact", "hashmap/1000"],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = stdout.lines().collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(
        rows[0].starts_with("bench ") && rows[0].contains("F_irr%"),
        "{stdout}"
    );
    assert!(rows[1].starts_with("hashmap/1000 "), "{stdout}");

    // A failing body: the others still run, the failure is reported, 101.
    let out = memgaze(
        "bench",
        &manifest,
        &["-q", "--features", "failing", "--message-format", "json"],
        &[],
    );
    assert_eq!(out.status.code(), Some(101), "{}", stderr(&out));
    // `-q` hides the progress, not the error.
    assert_failed_line(&stderr(&out), "panics");
    let all = messages(&out);
    let failed = by_reason(&all, "bench-failed");
    assert_eq!(failed.len(), 1, "{all:?}");
    assert_eq!(failed[0]["name"], "panics");
    // Nothing of the failed run (or of an earlier one) is left to be
    // reported as its results.
    let panics = shared_target_dir().join("memgaze/hashmap-vs-btree/lookup/panics");
    assert!(panics.join("bench.json").is_file(), "{}", panics.display());
    for file in ["trace.mgz", "analysis.json"] {
        assert!(
            !panics.join(file).exists(),
            "{file} left in {}",
            panics.display()
        );
    }
    let summary = all.last().unwrap();
    assert_eq!(
        (summary["measured"].as_u64(), summary["failed"].as_u64()),
        (Some(5), Some(1)),
        "{summary}"
    );
    assert!(
        failed[0]["message"]
            .as_str()
            .unwrap()
            .contains("fails on purpose"),
        "{}",
        failed[0]
    );
}

/// `err` holds the `error:` line of the fixture's failed bench `name`, once.
fn assert_failed_line(err: &str, name: &str) {
    let prefix = format!("error: bench `{name}` of `hashmap-vs-btree/lookup` failed: ");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with(&prefix)).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("fails on purpose"), "{err}");
}

/// Under `-q` a failed bench is still named on stderr, by `golden` as by
/// `bench`; the progress and notes are not printed.
#[test]
fn quiet_suite_runs_still_name_failed_benches() {
    let _lock = serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("golden");
    let out = memgaze(
        "golden",
        &fixture_manifest(),
        &[
            "-q",
            "--update",
            "--features",
            "failing",
            "--golden-dir",
            dir.to_str().unwrap(),
            "--",
            "--exact",
            "panics",
            "hashmap/1000",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(101), "{}", stderr(&out));
    let err = stderr(&out);
    assert_failed_line(&err, "panics");
    assert_eq!(err.lines().count(), 1, "{err}");
    let snapshot = dir.join("hashmap-vs-btree__lookup__hashmap%2F1000.snap");
    assert!(snapshot.is_file());
}

/// `validate` names each selected bench without a snapshot, validates the
/// others (a failed one named too, under `-q`) and exits 1 (docs/CLI.md).
#[test]
fn validate_names_benches_without_snapshots_and_validates_the_others() {
    let _lock = serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("golden");
    let dir_arg = dir.to_str().unwrap();
    let run = |command: &str, extra: &[&str]| {
        let mut args = vec!["-q", "--features", "failing", "--golden-dir", dir_arg];
        args.extend_from_slice(extra);
        memgaze(command, &fixture_manifest(), &args, &[])
    };
    let out = run("golden", &["--update", "--", "--exact", "hashmap/1000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The failing bench never gets a snapshot: give it the one of
    // `hashmap/1000`, so that it runs (and fails) under `validate`.
    let text =
        std::fs::read_to_string(dir.join("hashmap-vs-btree__lookup__hashmap%2F1000.snap")).unwrap();
    let renamed = text.replace(r#""bench": "hashmap/1000""#, r#""bench": "panics""#);
    assert_ne!(renamed, text);
    std::fs::write(dir.join("hashmap-vs-btree__lookup__panics.snap"), renamed).unwrap();

    let selection = ["--", "--exact", "hashmap/1000", "btreemap/1000", "panics"];
    let out = run(
        "validate",
        &[&["--message-format", "json"][..], &selection].concat(),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let missing: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("no golden snapshot"))
        .collect();
    assert_eq!(
        missing,
        [format!(
            "error: bench `btreemap/1000` of `hashmap-vs-btree/lookup`: no golden snapshot in {dir_arg}: run `cargo memgaze golden --update` to record it"
        )],
        "{err}"
    );
    assert_failed_line(&err, "panics");
    let all = messages(&out);
    // The bench without a snapshot has a line too, of status `missing`.
    let lines = by_reason(&all, "validation");
    let mut validated: Vec<&str> = lines.iter().map(|m| m["name"].as_str().unwrap()).collect();
    validated.sort();
    assert_eq!(validated, ["btreemap/1000", "hashmap/1000"], "{all:?}");
    let without: Vec<&&Value> = lines.iter().filter(|m| m["status"] == "missing").collect();
    assert_eq!(without.len(), 1, "{all:?}");
    assert_eq!(without[0]["name"], "btreemap/1000");
    assert_eq!(
        without[0]["problems"][0].as_str().unwrap(),
        &missing[0]["error: ".len()..],
        "{}",
        without[0]
    );
    let summary = all.last().unwrap();
    assert_eq!(summary["reason"], "summary", "{summary}");
    assert_eq!(
        (
            summary["counts"]["missing"].as_u64(),
            summary["counts"]["failed"].as_u64()
        ),
        (Some(1), Some(1)),
        "{summary}"
    );

    // With no snapshot for any selected bench nothing runs: one line.
    let out = run("validate", &["--", "--exact", "btreemap/1000"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no golden snapshot") && err.contains("for bench `btreemap/1000`"),
        "{err}"
    );
}

/// Golden snapshots: insta's conventions, determinism, the toolchain check
/// and orphans, at a small size in a temporary snapshot directory.
#[test]
fn golden_snapshots_follow_insta_conventions_and_are_deterministic() {
    let _lock = serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("golden");
    let dir_arg = dir.to_str().unwrap();
    let env = [
        ("MEMGAZE_MICRO_ELEMENTS", "4096"),
        ("MEMGAZE_MICRO_REPS", "3"),
    ];
    let golden = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec![
            "-q",
            "-p",
            "microbenches",
            "--golden-dir",
            dir_arg,
            "--message-format",
            "json",
        ];
        args.extend_from_slice(extra);
        memgaze("golden", &workspace_manifest(), &args, env)
    };
    let filter = ["--", "str"];
    let snap = dir.join("microbenches__micro__str%2Firr.snap");
    let pending = dir.join("microbenches__micro__str%2Firr.snap.new");

    // Missing snapshots: pending files for review, exit 3.
    let out = golden(&filter, &env);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let all = messages(&out);
    let results = by_reason(&all, "golden");
    assert_eq!(results.len(), 4, "{all:?}"); // str1, str8, str/irr, irr|str|irr
    assert!(results.iter().all(|m| m["status"] == "missing"));
    assert!(pending.is_file() && !snap.exists());
    // insta can read what we wrote.
    let snapshot = insta::Snapshot::from_file(&pending).unwrap();
    assert_eq!(
        snapshot.metadata().source(),
        Some("microbenches/benches/micro.rs")
    );

    // On CI nothing is written.
    std::fs::remove_dir_all(&dir).unwrap();
    let mut ci_env = env.to_vec();
    ci_env.push(("CI", "true"));
    let out = golden(&filter, &ci_env);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(!dir.exists());

    // --update writes; running again changes nothing, byte for byte.
    let out = golden(&[&["--update"][..], &filter].concat(), &env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let first = std::fs::read(&snap).unwrap();
    let out = golden(&filter, &env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        by_reason(&messages(&out), "golden")
            .iter()
            .all(|m| m["status"] == "unchanged")
    );
    assert_eq!(std::fs::read(&snap).unwrap(), first);
    assert!(!pending.exists());

    // Another size is another program: a difference, with a pending file
    // and the metrics that moved.
    let other = [
        ("MEMGAZE_MICRO_ELEMENTS", "4096"),
        ("MEMGAZE_MICRO_REPS", "4"),
    ];
    let out = golden(&["--", "--exact", "str/irr"], &other);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // (The env fact differs too: one message, no run.)
    let all = messages(&out);
    let facts = by_reason(&all, "golden-facts-differ");
    assert_eq!(facts.len(), 1, "{all:?}");
    let message = facts[0]["message"].as_str().unwrap();
    assert!(
        message.contains("env `MEMGAZE_MICRO_ELEMENTS=4096 MEMGAZE_MICRO_REPS=3` vs `MEMGAZE_MICRO_ELEMENTS=4096 MEMGAZE_MICRO_REPS=4`")
            && message.contains("cargo memgaze golden --update"),
        "{message}"
    );
    assert_eq!(
        stderr(&out)
            .lines()
            .filter(|l| l.starts_with("error:"))
            .count(),
        1
    );

    // A different toolchain: one message suggesting --update.
    let text = String::from_utf8(first.clone()).unwrap();
    let line = text.lines().find(|l| l.starts_with("  rustc: ")).unwrap();
    std::fs::write(
        &snap,
        text.replace(line, "  rustc: \"rustc 1.80.0 (000000000 2024-07-21)\""),
    )
    .unwrap();
    let out = golden(&filter, &env);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("rustc `rustc 1.80.0 (000000000 2024-07-21)` vs `rustc 1."),
        "{err}"
    );
    assert!(err.contains("--update"), "{err}");

    // A changed metric: a pending file naming it.
    std::fs::write(&snap, text.replacen("\"F\": ", "\"F\": 1", 1)).unwrap();
    let out = golden(&["--", "--exact", "str/irr"], &env);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let all = messages(&out);
    let result = by_reason(&all, "golden")[0];
    assert_eq!(result["status"], "differs");
    assert!(
        result["changes"][0]
            .as_str()
            .unwrap()
            .starts_with("summary.F: 1"),
        "{result}"
    );
    assert!(pending.is_file());

    // Orphans are reported, and deleted with --update.
    let orphan = dir.join("microbenches__micro__gone.snap");
    std::fs::write(&orphan, "").unwrap();
    let out = golden(&["--", "--exact", "str1"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let all = messages(&out);
    let orphans = by_reason(&all, "golden-orphan");
    assert_eq!(orphans.len(), 1, "{all:?}");
    assert_eq!(orphans[0]["deleted"], false);
    let out = golden(&["--update", "--", "--exact", "str1"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!orphan.exists());
    // On CI too: `--update` writes snapshots there, so it deletes orphans
    // (it used to keep them, saying "`--update` deletes it").
    std::fs::write(&orphan, "").unwrap();
    let out = golden(&["--update", "--", "--exact", "str1"], &ci_env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let all = messages(&out);
    assert_eq!(
        by_reason(&all, "golden-orphan")[0]["deleted"],
        true,
        "{all:?}"
    );
    assert!(!orphan.exists());

    // A filter matching nothing: a summary line without an empty list of
    // outcomes after it (it ended in ": ").
    let args = [
        "-p",
        "microbenches",
        "--golden-dir",
        dir_arg,
        "--",
        "--exact",
        "zzz",
    ];
    let out = memgaze("golden", &workspace_manifest(), &args, &env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    let last = err.lines().last().unwrap_or_default().trim();
    assert!(
        last.starts_with("Finished 0 snapshots in ") && last.ends_with('s'),
        "{err}"
    );
}

fn validations(out: &Output) -> Vec<Value> {
    messages(out)
        .into_iter()
        .filter(|m| m["reason"] == "validation")
        .collect()
}

/// Issue 7: every microbenchmark validates against the committed golden
/// snapshots at default sampling, within the default limits.
#[test]
fn validate_passes_at_default_sampling_for_every_microbenchmark() {
    let _lock = serial();
    let out = memgaze(
        "validate",
        &workspace_manifest(),
        &["-q", "-p", "microbenches", "--message-format", "json"],
        &[],
    );
    let results = validations(&out);
    for v in &results {
        let mape: Vec<String> = v["trace_windows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| format!("{} {}", e["metric"], e["error"]))
            .collect();
        let code: Vec<String> = v["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                format!(
                    "{}: dF {} F_str% {} F_irr% {} A_const% {}",
                    f["name"],
                    f["dF"]["error"],
                    f["F_str_frac"]["error"],
                    f["F_irr_frac"]["error"],
                    f["A_const_frac"]["error"]
                )
            })
            .collect();
        eprintln!(
            "{} {}: {} samples, trace {:.2}% ({:.2}% with spatial) | MAPE {} | {} | MRC MAE {} {} ({} tracked)",
            v["name"],
            v["status"],
            v["samples"],
            100.0 * f64_of(&v["trace_size_frac"]),
            100.0 * f64_of(&v["trace_size_frac_total"]),
            mape.join(", "),
            code.join("; "),
            v["mrc"]["error"],
            v["mrc"]["ci"],
            v["mrc"]["tracked"]
        );
    }
    assert_eq!(out.status.code(), Some(0), "{}\n{results:#?}", stderr(&out));
    assert_eq!(results.len(), 8);
    for v in &results {
        assert_eq!(v["status"], "ok", "{v}");
        // The whole-run curve of the recorded run (spatial samples at the
        // default 1/128) against the snapshot's exact one.
        let mrc = &v["mrc"];
        assert_eq!(mrc["status"], "ok", "{}: {mrc}", v["name"]);
        assert!(f64_of(&mrc["error"]) <= 0.02, "{}: {mrc}", v["name"]);
        let size = f64_of(&v["trace_size_frac"]);
        assert!(
            (0.005..0.02).contains(&size),
            "{}: trace size {size}",
            v["name"]
        );
        // With the spatial records on top, the trace stays within 2% of
        // the full one.
        let total = f64_of(&v["trace_size_frac_total"]);
        assert!(
            total > size && total <= 0.02,
            "{}: whole trace size {total}",
            v["name"]
        );
    }
}

/// Validation fails (3) when sampling is too sparse, and when a sampled
/// metric is distorted past its limit.
#[test]
fn validate_fails_when_undersampled_or_off_the_limit() {
    let _lock = serial();
    let run = |extra: &[&str]| {
        let mut args = vec!["-q", "-p", "microbenches", "--message-format", "json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "--exact", "str1"]);
        memgaze("validate", &workspace_manifest(), &args, &[])
    };
    // 50 M load executions, one sample every 5 M: 10 samples.
    let out = run(&["--period", "5000000"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = &validations(&out)[0];
    assert_eq!(v["status"], "undersampled", "{v}");
    assert!(
        v["problems"][0].as_str().unwrap().contains("fewer than 30"),
        "{v}"
    );

    let out = run(&["--perturb", "trace:F=1.25"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = &validations(&out)[0];
    assert_eq!(v["status"], "exceeded", "{v}");
    assert_eq!(v["trace_windows"][0]["metric"], "F");
    assert_eq!(v["trace_windows"][0]["status"], "exceeded");

    let out = run(&["--perturb", "code:dF=1.05"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = &validations(&out)[0];
    assert_eq!(v["status"], "exceeded", "{v}");
    assert_eq!(v["functions"][0]["dF"]["status"], "exceeded", "{v}");

    // Unperturbed, the same run passes (the failures above are the hook's).
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// Issue 8: the regression gate through the command line. A baseline of
/// the fixture at default sampling; the same code with another seed passes
/// the default limits (sampling noise only); `--features worse` (the
/// `scan` bench walks a linked list instead of an array) fails with exit
/// 3, naming the regression in human and JSON output and in the report.
#[test]
fn the_gate_fails_a_worse_access_pattern_and_passes_unchanged_code() {
    let _lock = serial();
    let manifest = fixture_manifest();
    let name = "gate-e2e";
    let root = shared_target_dir().join("memgaze");
    let _ = std::fs::remove_dir_all(root.join("baselines").join(name));
    let bench = |extra: &[&str]| memgaze("bench", &manifest, extra, &[]);

    let out = bench(&["-q", "--seed", "1", "--no-report", "--save-baseline", name]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        root.join("baselines/gate-e2e/hashmap-vs-btree/lookup/scan/baseline.json")
            .is_file()
    );

    // Unchanged code, other samples: every bench within the limits.
    let out = bench(&[
        "-q",
        "--seed",
        "2",
        "--no-report",
        "--baseline",
        name,
        "--message-format",
        "json",
    ]);
    let all = messages(&out);
    let comparisons = by_reason(&all, "baseline-comparison");
    let verdicts: Vec<String> = comparisons
        .iter()
        .map(|c| format!("{}: {} {}", c["bench"], c["metrics"], c["notes"]))
        .collect();
    assert_eq!(out.status.code(), Some(0), "{}", verdicts.join("\n"));
    assert_eq!(comparisons.len(), 5, "{all:?}");
    assert!(by_reason(&all, "regression").is_empty());
    let scan = comparisons.iter().find(|c| c["bench"] == "scan").unwrap();
    assert_eq!(scan["has_baseline"], true);
    assert_eq!(scan["regressions"], 0);
    let compared: Vec<&str> = scan["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| !m["limit"].is_null() && !m["old"].is_null() && !m["new"].is_null())
        .map(|m| m["metric"].as_str().unwrap())
        .collect();
    assert_eq!(
        compared,
        [
            "A_hat",
            "dF",
            "dF_lines",
            "F_str_frac",
            "F_irr_frac",
            "MR_L1",
            "MR_L2",
            "MR_LLC",
            "misses_L1",
            "misses_L2",
            "misses_LLC"
        ],
        "{scan}"
    );

    // The worse access pattern, for people: exit 3, the regression named
    // on stdout, the gate's summary on stderr, and in the report.
    let out = bench(&["--seed", "3", "--features", "worse", "--baseline", name]);
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{err}");
    let regressions: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("regression: "))
        .collect();
    assert!(
        regressions.iter().any(|l| l
            .starts_with("regression: hashmap-vs-btree/lookup/scan: F_irr_frac 0 → ")
            && l.ends_with("(+1 from 0; limit +0.1)")),
        "{stdout}"
    );
    assert!(
        regressions
            .iter()
            .all(|l| l.starts_with("regression: hashmap-vs-btree/lookup/scan: ")),
        "only scan changed: {stdout}"
    );
    assert!(
        err.contains("regression(s) against baseline `gate-e2e` in 5 bench(es) checked"),
        "{err}"
    );
    let report = std::fs::read_to_string(root.join("report/index.html")).unwrap();
    assert!(
        report.contains("regression: hashmap-vs-btree/lookup/scan: F_irr_frac 0 → "),
        "the report names the regression"
    );

    // ... and for scripts: `regression` objects with the fields of
    // docs/CLI.md's bench stream.
    let out = bench(&[
        "-q",
        "--seed",
        "4",
        "--features",
        "worse",
        "--no-report",
        "--baseline",
        name,
        "--message-format",
        "json",
        "--",
        "scan",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let all = messages(&out);
    let regressions = by_reason(&all, "regression");
    let irr = regressions
        .iter()
        .find(|r| r["metric"] == "F_irr_frac")
        .unwrap_or_else(|| panic!("{all:?}"));
    assert_eq!(
        (
            &irr["baseline"],
            &irr["package"],
            &irr["target"],
            &irr["bench"]
        ),
        (
            &Value::from(name),
            &Value::from("hashmap-vs-btree"),
            &Value::from("lookup"),
            &Value::from("scan")
        )
    );
    assert_eq!(irr["old"], 0.0);
    assert!(f64_of(&irr["new"]) >= 0.9, "{irr}");
    assert!(f64_of(&irr["change"]) >= 0.9, "{irr}");
    assert!(irr["change_frac"].is_null(), "from 0: no relative change");
    assert_eq!(irr["limit"], "+0.1");
    let scan = by_reason(&all, "baseline-comparison")[0];
    assert_eq!(scan["regressions"].as_u64(), Some(regressions.len() as u64));
}

/// Issue 25: a gate users can trust, at default limits and sampling, each
/// case at two seeds. The `scan` array walked with a 64-byte stride (every
/// load still Strided, every element still read once) fails on
/// `dF_lines` and on the whole-run `MR_L1` and `MR_L2`; an unrelated bench
/// added to the target, or the benches
/// registered in another order, move code and heap addresses but not the
/// programs, and pass.
#[test]
fn the_gate_catches_a_cache_line_stride_and_passes_layout_changes() {
    let _lock = serial();
    let manifest = fixture_manifest();
    let name = "gate-layout";
    let root = shared_target_dir().join("memgaze");
    let _ = std::fs::remove_dir_all(root.join("baselines").join(name));
    let bench = |seed: &str, extra: &[&str]| {
        let mut args = vec!["-q", "--seed", seed, "--no-report"];
        args.extend_from_slice(extra);
        memgaze("bench", &manifest, &args, &[])
    };
    let out = bench("1", &["--save-baseline", name]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    for features in ["extra-bench", "reorder"] {
        for seed in ["2", "3"] {
            let out = bench(
                seed,
                &[
                    "--features",
                    features,
                    "--baseline",
                    name,
                    "--message-format",
                    "json",
                ],
            );
            let all = messages(&out);
            let comparisons = by_reason(&all, "baseline-comparison");
            let verdicts: Vec<String> = comparisons
                .iter()
                .map(|c| format!("{}: {} {}", c["bench"], c["metrics"], c["notes"]))
                .collect();
            assert_eq!(
                out.status.code(),
                Some(0),
                "--features {features} --seed {seed}: {}\n{}",
                verdicts.join("\n"),
                stderr(&out)
            );
            assert!(by_reason(&all, "regression").is_empty());
            let btree = comparisons
                .iter()
                .find(|c| c["bench"] == "btreemap/100000")
                .unwrap_or_else(|| panic!("{all:?}"));
            let lines = btree["metrics"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["metric"] == "dF_lines")
                .unwrap();
            assert!(
                !lines["old"].is_null() && !lines["new"].is_null() && !lines["limit"].is_null(),
                "the line-level measure is gated: {lines}"
            );
            // Warnings reach the JSON lines, not only stderr: every
            // `bench-finished` line carries its list, and each bench's
            // `warning:` lines on stderr are in it.
            let err_text = String::from_utf8_lossy(&out.stderr);
            for finished in by_reason(&all, "bench-finished") {
                let warnings = finished["warnings"].as_array().unwrap();
                let name = finished["name"].as_str().unwrap();
                for line in err_text.lines() {
                    if let Some(warning) = line.strip_prefix("warning: ")
                        && warning.starts_with(&format!("{name}: "))
                    {
                        assert!(warnings.iter().any(|w| w == warning), "{finished}");
                    }
                }
            }
            let expected = if features == "extra-bench" { 6 } else { 5 };
            assert_eq!(comparisons.len(), expected, "{features}: {verdicts:?}");
        }
    }

    for seed in ["2", "3"] {
        let out = bench(
            seed,
            &[
                "--features",
                "stride",
                "--baseline",
                name,
                "--message-format",
                "json",
                "--",
                "--exact",
                "scan",
            ],
        );
        assert_eq!(out.status.code(), Some(3), "seed {seed}: {}", stderr(&out));
        let all = messages(&out);
        let regressed: Vec<&str> = by_reason(&all, "regression")
            .iter()
            .map(|r| {
                assert_eq!(r["bench"], "scan", "{r}");
                r["metric"].as_str().unwrap()
            })
            .collect();
        assert!(regressed.contains(&"dF_lines"), "seed {seed}: {all:?}");
        // The whole-run miss ratios, gated by default: one miss per 8
        // loads becomes one per load at the L1 and L2 sizes.
        assert!(
            regressed.contains(&"MR_L1") && regressed.contains(&"MR_L2"),
            "seed {seed}: {regressed:?}"
        );
        assert!(
            !regressed.contains(&"F_str_frac") && !regressed.contains(&"F_irr_frac"),
            "every load stays Strided: {regressed:?}"
        );
        let lines = by_reason(&all, "regression")
            .into_iter()
            .find(|r| r["metric"] == "dF_lines")
            .unwrap();
        // 8-byte steps: a new line every 8 loads; 64-byte steps: every load.
        assert!(
            f64_of(&lines["new"]) > 4.0 * f64_of(&lines["old"]),
            "{lines}"
        );
    }
}

/// `ci/memgaze-gate.sh`, the CI script of the example workflow, on the
/// fixture: `compare` without a baseline records and warns, `save` keeps
/// one, `compare` on the worse pattern exits 3 with a GitHub annotation
/// and the regressions in the job summary.
#[test]
fn the_ci_gate_script_saves_and_compares() {
    let _lock = serial();
    let manifest = fixture_manifest();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/memgaze-gate.sh");
    let target = shared_target_dir();
    let name = "ci-script";
    let _ = std::fs::remove_dir_all(target.join("memgaze/baselines").join(name));
    let tmp = tempfile::tempdir().unwrap();
    let summary = tmp.path().join("summary.md");
    let run_benches = |mode: &str, extra: &[&str], harness: &[&str]| {
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .arg(mode)
            .args(["--locked", "--manifest-path"])
            .arg(&manifest)
            .args(extra)
            .arg("--")
            .args(harness)
            .env(
                "MEMGAZE_COMMAND",
                format!("{} memgaze", env!("CARGO_BIN_EXE_cargo-memgaze")),
            )
            .env("MEMGAZE_LIBS_CACHE", crate::support::LIBS_CACHE)
            .env("MEMGAZE_BASELINE", name)
            .env("CARGO_TARGET_DIR", &target)
            .env("GITHUB_ACTIONS", "true")
            .env("GITHUB_STEP_SUMMARY", &summary)
            .env_remove("CI");
        cmd.output().unwrap()
    };
    let run = |mode: &str, extra: &[&str]| run_benches(mode, extra, &["--exact", "scan"]);
    let text = |out: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };

    let out = run("compare", &["--no-report"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("::warning::no memgaze baseline `ci-script`"),
        "{}",
        text(&out)
    );

    let out = run("save", &["--no-report"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        target
            .join("memgaze/baselines/ci-script/hashmap-vs-btree/lookup/scan/baseline.json")
            .is_file()
    );

    // A bench the baseline lacks passes, and the job summary (the
    // `--summary-md` Markdown) says it was not compared.
    std::fs::write(&summary, "").unwrap();
    let out = run_benches(
        "compare",
        &["--no-report"],
        &["--skip", "btreemap", "--skip", "hashmap/100000"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let written = std::fs::read_to_string(&summary).unwrap();
    assert!(
        written
            .starts_with("### ✅ memgaze: no regression in 1 bench against baseline `ci-script`")
            && written.contains("1 bench not in the baseline (not compared)"),
        "{written}"
    );

    std::fs::write(&summary, "").unwrap();
    let out = run("compare", &["--features", "worse"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out)
            .contains("::error::memgaze: memory-locality regression against baseline `ci-script`"),
        "{}",
        text(&out)
    );
    let summary = std::fs::read_to_string(&summary).unwrap();
    assert!(
        summary.starts_with("### ❌ memgaze: ")
            && summary.contains("| ❌ regression | hashmap-vs-btree/lookup/scan | `F_irr_frac` | "),
        "{summary}"
    );

    let out = Command::new("bash")
        .arg(&script)
        .arg("nope")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `ci/memgaze-gate.sh` keeps the bench's stderr with its stdout, in the
/// order written: a stand-in for `cargo memgaze` alternates the streams and
/// exits 3, and the script's stdout holds every line in order, and the
/// job summary lists the regression line it wrote on stderr.
#[test]
fn the_ci_gate_script_keeps_both_streams_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = tmp.path().join("fake-memgaze.sh");
    std::fs::write(
        &fake,
        "echo 'out 1'\necho 'err 2' >&2\necho 'out 3'\necho 'regression: p/t/b: dF 1 → 2' >&2\nexit 3\n",
    )
    .unwrap();
    let summary = tmp.path().join("summary.md");
    let target = tmp.path().join("target");
    std::fs::create_dir_all(target.join("memgaze/baselines/main")).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/memgaze-gate.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("compare")
        .env("MEMGAZE_COMMAND", format!("bash {}", fake.display()))
        .env("CARGO_TARGET_DIR", &target)
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_STEP_SUMMARY", &summary)
        .env_remove("MEMGAZE_BASELINE")
        .env_remove("GITHUB_RUN_ID")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let bench_lines: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("::")).collect();
    assert_eq!(
        bench_lines,
        ["out 1", "err 2", "out 3", "regression: p/t/b: dF 1 → 2"],
        "{stdout}"
    );
    let written = std::fs::read_to_string(&summary).unwrap();
    assert!(
        written.contains("- `p/t/b: dF 1 → 2`"),
        "the regression line on stderr reaches the job summary: {written}"
    );
}

/// `microbenches` keeps its own SplitMix64 (the workload depends on nothing
/// of memgaze); this keeps it the same generator as the workspace's.
#[test]
fn the_microbenches_generator_is_the_workspace_one() {
    for seed in [0, 1, microbenches::SEED, u64::MAX] {
        let mut theirs = microbenches::SplitMix64::new(seed);
        let mut ours = memgaze_trace::rng::SplitMix64::new(seed);
        for _ in 0..64 {
            assert_eq!(theirs.next_u64(), ours.next_u64(), "seed {seed}");
        }
        for bound in [1, 2, 3, 1000, 1 << 40] {
            assert_eq!(theirs.below(bound), ours.below(bound as u64) as usize);
        }
    }
}

/// `bench --libs`: a bench whose loads are libc's `bcmp` records them with
/// libc instrumented (its object in the coverage), and not without.
#[test]
fn bench_libs_records_the_loads_of_instrumented_libraries() {
    let _lock = serial();
    let manifest = fixture_manifest();
    let objects = |libs: &str| -> Vec<(String, u64)> {
        let out = memgaze(
            "bench",
            &manifest,
            &[
                "-q",
                "--features",
                "compare",
                "--libs",
                libs,
                "--seed",
                "3",
                "--period",
                "10000",
                "--message-format",
                "json",
                "--",
                "--exact",
                "equal_buffers",
            ],
            &[],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "--libs {libs}: {}",
            stderr(&out)
        );
        let all = messages(&out);
        let finished = by_reason(&all, "bench-finished");
        assert_eq!(finished.len(), 1, "{all:?}");
        finished[0]["coverage"]["objects"]
            .as_array()
            .map(|objects| {
                objects
                    .iter()
                    .map(|o| {
                        (
                            o["object"].as_str().unwrap().to_string(),
                            o["accesses"].as_u64().unwrap(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let with = objects("libc.so.6");
    let libc = with.iter().find(|(name, _)| name == "libc.so.6");
    assert!(
        libc.is_some_and(|&(_, accesses)| accesses > 0),
        "no libc accesses recorded: {with:?}"
    );
    // libc's share is most of the bench's loads: the comparison.
    assert_eq!(with[0].0, "libc.so.6", "{with:?}");
    assert!(objects("none").is_empty());
}

/// One `hashmap/1000` recording at `MEMGAZE_MEASURE_S=0.01`, its
/// `bench-finished` line and stderr.
fn short_hashmap_bench(period: &str) -> (Value, String) {
    hashmap_bench(
        period,
        &[("MEMGAZE_MEASURE_S", "0.01"), ("MEMGAZE_WARM_UP_S", "0")],
    )
}

/// One `hashmap/1000` recording with `env`, its `bench-finished` line and
/// stderr.
fn hashmap_bench(period: &str, env: &[(&str, &str)]) -> (Value, String) {
    let out = memgaze(
        "bench",
        &fixture_manifest(),
        &[
            "--seed",
            "3",
            "--period",
            period,
            "--no-report",
            "--message-format",
            "json",
            "--",
            "--exact",
            "hashmap/1000",
        ],
        env,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let all = messages(&out);
    let finished = by_reason(&all, "bench-finished");
    assert_eq!(finished.len(), 1, "{all:?}");
    (finished[0].clone(), stderr(&out))
}

/// Issue 24: a recorded `iter` stops at the sample target (110) instead
/// of repeating for its whole measuring second, which gives this bench
/// about 3,000 samples at the default period.
#[test]
fn a_recorded_bench_stops_at_the_sample_target() {
    let _lock = serial();
    let (finished, err) = hashmap_bench("100000", &[("MEMGAZE_WARM_UP_S", "0")]);
    let samples = finished["summary"]["samples"].as_u64().unwrap();
    assert!(
        (100..=160).contains(&samples),
        "{samples} samples: {finished}\n{err}"
    );
    let region_s = f64_of(&finished["region_ns"]) / 1e9;
    assert!(region_s < 0.5, "measured for {region_s} s: {finished}");
    assert_eq!(finished["warnings"], serde_json::json!([]), "{finished}");
}

/// Issue 23: a memgaze-harness bench short of 100 samples is recorded once
/// more with a measuring time scaled by the shortfall (criterion-style
/// calibration) and ends with the target; one that cannot reach it within
/// the budget is reported once, with what it reached.
#[test]
fn a_short_bench_is_recorded_again_until_it_reaches_the_sample_target() {
    let _lock = serial();
    // ~30 samples in 10 ms at this period: the second recording runs longer.
    let (finished, err) = short_hashmap_bench("100000");
    let samples = finished["summary"]["samples"].as_u64().unwrap();
    assert!(samples >= 100, "{samples} samples: {finished}\n{err}");
    let region_s = f64_of(&finished["region_ns"]) / 1e9;
    assert!(
        region_s > 0.02,
        "measured for {region_s} s only: {finished}"
    );
    assert_eq!(finished["warnings"], serde_json::json!([]), "{finished}");
    assert!(!err.contains("warning:"), "{err}");

    // A period of 10^8 leaves a few samples even after the budget.
    let (finished, err) = short_hashmap_bench("100000000");
    let samples = finished["summary"]["samples"].as_u64().unwrap();
    assert!(samples < 100, "{finished}");
    let warnings = finished["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{finished}");
    let warning = warnings[0].as_str().unwrap();
    let iterations = finished["iterations"].as_u64().unwrap();
    for part in [
        format!("hashmap/1000: {samples} sample"),
        format!(" in {iterations} iterations"),
        "short of the target of 100 samples".to_string(),
    ] {
        assert!(warning.contains(&part), "{part:?} not in {warning}");
    }
    assert_eq!(err.matches("warning:").count(), 1, "{err}");
}
