//! Issue 23: criterion and divan benches, unmodified, under `cargo memgaze
//! bench` — the `ring-stats` fixture crate (criterion 0.5, the newest
//! criterion under another name, divan 0.1). One run of the whole suite;
//! the build shares the target directory of `cargo_benches.rs`.

use serde_json::Value;
use std::path::{Path, PathBuf};

fn shared_target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("memgaze-benches")
}

fn manifest() -> PathBuf {
    memgaze_fixtures::fixtures().join("ring-stats/Cargo.toml")
}

/// `cargo memgaze bench` on the fixture, JSON lines on stdout.
fn bench(extra: &[&str]) -> (std::process::Output, Vec<Value>) {
    let mut cmd = crate::support::memgaze_command();
    cmd.args(["memgaze", "bench", "--locked", "--manifest-path"])
        .arg(manifest())
        .arg("--target-dir")
        .arg(shared_target_dir())
        .args(["--message-format", "json", "--no-report", "--seed", "7"])
        .args(extra)
        .env_remove("CI")
        // As for a user who names the target directory only by `--target-dir`.
        .env_remove("CARGO_TARGET_DIR");
    for (name, _) in std::env::vars() {
        if name.starts_with("MEMGAZE_") {
            cmd.env_remove(name);
        }
    }
    let out = cmd.output().unwrap();
    let messages = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (out, messages)
}

/// Every criterion and divan bench gets a result under the framework's own
/// name, with enough samples, the expected locality, and no load of the
/// batched benches' setup (`fill_setup`) in the recorded functions.
#[test]
fn criterion_and_divan_benches_run_unmodified() {
    let (out, messages) = bench(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The libtest target is left out before the build, in one line.
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .collect();
    assert_eq!(warnings.len(), 2, "{stderr}");
    assert!(
        warnings[0].starts_with("warning: bench `ring-stats/libtest` (")
            && warnings[0].contains("is not run: it is a libtest `#[bench]` target"),
        "{stderr}"
    );
    // `iter_custom` times itself: nothing is recorded, and it is said.
    assert!(
        warnings[1].starts_with("warning: custom: no load was recorded")
            && warnings[1].contains("iter_custom"),
        "{stderr}"
    );
    // Criterion is told the target directory: it does not exec `cargo
    // metadata` to find it, which would be an untraced program per bench.
    assert!(!stderr.contains("replaced themselves"), "{stderr}");
    assert!(
        !messages
            .iter()
            .any(|m| m.to_string().contains("replaced themselves")),
        "a note on an exec'd program"
    );
    let finished: Vec<&Value> = messages
        .iter()
        .filter(|m| m["reason"] == "bench-finished")
        .collect();
    let mut names: Vec<String> = finished
        .iter()
        .map(|m| {
            format!(
                "{} {} {}",
                m["target"].as_str().unwrap(),
                m["harness"].as_str().unwrap(),
                m["name"].as_str().unwrap()
            )
        })
        .collect();
    names.sort();
    let mut expected = Vec::new();
    for target in ["crit", "crit_latest"] {
        for name in [
            "chase/cycle/1000",
            "chase/cycle/100000",
            "sort_batched",
            "sum",
        ] {
            expected.push(format!("{target} criterion {name}"));
        }
    }
    for name in ["large_drop", "batched_ref", "custom", "scoped_sum"] {
        expected.push(format!("crit_forms criterion {name}"));
    }
    for name in ["chase/cycle/1000", "chase/cycle/100000", "sum"] {
        expected.push(format!("twin memgaze {name}"));
    }
    for name in [
        "div_forms::const_sum::1000",
        "div_forms::const_sum::50000",
        "div_forms::inner::nested_sum",
        "div_forms::shared_sum",
        "div_forms::sort_refs",
    ] {
        expected.push(format!("div_forms divan {name}"));
    }
    for name in [
        "div::chasing::1000",
        "div::chasing::100000",
        "div::sort_batched",
        "div::summing::1000",
        "div::summing::50000",
    ] {
        expected.push(format!("div divan {name}"));
    }
    for name in [
        "div_threads::scoped_sum",
        "div_threads::shared_sum",
        "div_threads::summing::1000",
    ] {
        expected.push(format!("div_threads divan {name}"));
    }
    expected.sort();
    assert_eq!(names, expected, "{stderr}");
    twins_agree(&finished);

    for m in &finished {
        let name = format!("{}/{}", m["target"], m["name"]);
        let samples = m["summary"]["samples"].as_u64().unwrap();
        let bench = m["name"].as_str().unwrap();
        if m["target"] == "div_threads" {
            // Recorded on every thread; a `threads` bench has one table row
            // per thread count, so no run count is read for it.
            let threads = m["summary"]["threads"].as_u64().unwrap();
            let least = if bench.ends_with("summing::1000") {
                1
            } else {
                2
            };
            assert!(threads >= least, "{name}: {threads} threads");
            assert!(samples >= 30, "{name}: {samples} samples");
            continue;
        }
        // Divan and the harness report their runs and their time;
        // criterion's profiling mode neither.
        if m["harness"] == "criterion" {
            assert!(m.get("iterations").is_none() && m.get("region_ns").is_none());
        } else {
            assert!(m["iterations"].as_u64().unwrap() > 0, "{name}: {m}");
            assert!(m["region_ns"].as_u64().unwrap() > 0, "{name}: {m}");
            assert_eq!(m["summary"]["iterations"], m["iterations"], "{name}");
        }
        if bench == "custom" {
            assert_eq!(m["summary"]["records"], 0, "{name}: {m}");
            continue;
        }
        assert!(samples >= 30, "{name}: {samples} samples");
        let threads = m["summary"]["threads"].as_u64().unwrap();
        if bench == "scoped_sum" {
            // Both scoped threads of every run contribute records.
            assert!(threads >= 2, "{name}: {threads} threads");
            continue;
        }
        assert_eq!(threads, 1, "{name}");
        let analysis: Value =
            serde_json::from_slice(&std::fs::read(m["analysis"].as_str().unwrap()).unwrap())
                .unwrap();
        let functions: Vec<&str> = analysis["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert!(
            !functions.iter().any(|f| f.contains("fill_setup")),
            "{name}: setup recorded: {functions:?}"
        );
        let str_frac = m["summary"]["F_str_frac"].as_f64().unwrap();
        if bench == "large_drop" {
            // The copy is measured; dropping it (outside) is not.
            assert!(
                functions.iter().any(|f| f.contains("copy_out"))
                    && !functions.iter().any(|f| f.contains("drop_scan")),
                "{name}: {functions:?}"
            );
        } else if bench.contains("chas") {
            assert!(str_frac < 0.05, "{name}: pointer chase F_str {str_frac}");
        } else if bench.contains("sum") {
            assert!(str_frac > 0.95, "{name}: array sum F_str {str_frac}");
        } else {
            assert!(
                functions.iter().any(|f| f.contains("sort")),
                "{name}: {functions:?}"
            );
        }
    }
}

/// The harness twin (`benches/twin.rs`) of criterion's `sum` and
/// `chase/cycle/N` bodies: `F_str` agrees within 5 percentage points for
/// each bench, with criterion 0.5 and the newest criterion.
fn twins_agree(finished: &[&Value]) {
    let f_str = |target: &str, bench: &str| -> f64 {
        let m = finished
            .iter()
            .find(|m| m["target"] == target && m["name"] == bench)
            .unwrap_or_else(|| panic!("{target} {bench}"));
        m["summary"]["F_str_frac"].as_f64().unwrap() * 100.0
    };
    for bench in ["sum", "chase/cycle/1000", "chase/cycle/100000"] {
        let harness = f_str("twin", bench);
        for target in ["crit", "crit_latest"] {
            let criterion = f_str(target, bench);
            eprintln!("{bench}: F_str {criterion:.1}% ({target}) vs {harness:.1}% (harness)");
            assert!(
                (criterion - harness).abs() <= 5.0,
                "{bench}: F_str {criterion:.1}% under {target}, {harness:.1}% under the harness"
            );
        }
    }
}

/// A filter after `--` selects benches by the frameworks' names, and
/// `--list` lists them without running.
#[test]
fn filters_and_listing_use_the_frameworks_names() {
    let (out, messages) = bench(&["--bench", "crit", "--", "--list", "chase"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<&str> = messages
        .iter()
        .filter(|m| m["reason"] == "bench-listed")
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["chase/cycle/1000", "chase/cycle/100000"]);
    // `--exact` reaches criterion as an anchored filter (0.3 and 0.4 have no
    // `--exact`): the 1000 bench alone, not its 100000 sibling.
    let (out, messages) = bench(&[
        "--bench",
        "crit",
        "--",
        "--list",
        "--exact",
        "chase/cycle/1000",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<&str> = messages
        .iter()
        .filter(|m| m["reason"] == "bench-listed")
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["chase/cycle/1000"]);
    let (out, messages) = bench(&["--bench", "div", "--", "--exact", "div::summing::1000"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ran: Vec<&str> = messages
        .iter()
        .filter(|m| m["reason"] == "bench-finished")
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(ran, ["div::summing::1000"]);
}

/// `-q` hides progress and notes, not warnings: a bench whose results may
/// mislead (here `iter_custom`, which times itself, so nothing is
/// recorded) says so under `-q` too, and nothing else is printed.
#[test]
fn quiet_bench_still_prints_its_warnings() {
    let (out, messages) = bench(&["-q", "--bench", "crit_forms", "--", "--exact", "custom"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("warning: custom: no load was recorded"),
        "{stderr}"
    );
    assert!(
        messages.iter().any(|m| m["reason"] == "bench-finished"),
        "{messages:?}"
    );
}

/// With LTO criterion's `WallTime::start`/`end` are inlined: the bench is
/// still recognised (with a note saying what its region holds) and records
/// the routine's loads — the array sum's, not criterion's command-line
/// parsing (clap) that a whole-process recording would hold. Its own target
/// directory: LTO rebuilds everything.
#[test]
fn criterion_with_lto_records_the_routine() {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("memgaze-benches-lto");
    let lto_bench = |args: &[&str]| {
        let mut cmd = crate::support::memgaze_command();
        cmd.args(["memgaze", "bench", "--locked", "--manifest-path"])
            .arg(manifest())
            .arg("--target-dir")
            .arg(&target)
            .args(["--message-format", "json", "--no-report", "--seed", "7"])
            .args(args)
            .env("CARGO_PROFILE_BENCH_LTO", "true")
            .env("CARGO_PROFILE_BENCH_CODEGEN_UNITS", "1")
            .env_remove("CI");
        for (name, _) in std::env::vars() {
            if name.starts_with("MEMGAZE_") {
                cmd.env_remove(name);
            }
        }
        cmd.output().unwrap()
    };
    let out = lto_bench(&["--bench", "crit", "--", "--exact", "sum"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "note: bench `ring-stats/crit`: criterion's `WallTime::start`/`end` were inlined (LTO)"
        ),
        "{stderr}"
    );
    let finished: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|m| m["reason"] == "bench-finished")
        .collect();
    assert_eq!(finished.len(), 1, "{stderr}");
    let m = &finished[0];
    assert_eq!(
        (m["harness"].as_str(), m["name"].as_str()),
        (Some("criterion"), Some("sum"))
    );
    let samples = m["summary"]["samples"].as_u64().unwrap();
    assert!(samples >= 30, "{samples} samples: {m}");
    let str_frac = m["summary"]["F_str_frac"].as_f64().unwrap();
    assert!(str_frac > 0.9, "array sum F_str {str_frac}: {m}");
    let analysis: Value =
        serde_json::from_slice(&std::fs::read(m["analysis"].as_str().unwrap()).unwrap()).unwrap();
    let functions: Vec<&str> = analysis["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(
        !functions.iter().any(|f| f.contains("clap")),
        "criterion's argument parsing recorded: {functions:?}"
    );
    // `-q` hides that note, as every note: a quiet listing prints nothing
    // on stderr.
    let out = lto_bench(&["-q", "--bench", "crit", "--", "--list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr, "", "quiet listing");
    let _ = std::fs::remove_dir_all(&target);
}

/// Naming a bench target the tool cannot run is a usage error, before
/// anything is built.
#[test]
fn naming_a_libtest_bench_is_a_usage_error() {
    let (out, _) = bench(&["--bench", "libtest"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: bench `ring-stats/libtest` ("),
        "{stderr}"
    );
}

/// `cargo memgaze golden` on the fixture, JSON lines on stdout, snapshots
/// in `dir`.
fn golden(dir: &Path, extra: &[&str]) -> (std::process::Output, Vec<Value>) {
    let mut cmd = crate::support::memgaze_command();
    cmd.args(["memgaze", "golden", "--locked", "--manifest-path"])
        .arg(manifest())
        .arg("--target-dir")
        .arg(shared_target_dir())
        .arg("--golden-dir")
        .arg(dir)
        .args(["--message-format", "json"])
        .args(extra)
        .env_remove("CI")
        // As for a user who names the target directory only by `--target-dir`.
        .env_remove("CARGO_TARGET_DIR");
    for (name, _) in std::env::vars() {
        if name.starts_with("MEMGAZE_") {
            cmd.env_remove(name);
        }
    }
    let out = cmd.output().unwrap();
    let messages = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (out, messages)
}

/// The `golden` results' (name, status) pairs.
fn golden_statuses(messages: &[Value]) -> Vec<(String, String)> {
    messages
        .iter()
        .filter(|m| m["reason"] == "golden")
        .map(|m| {
            let field = |k: &str| m[k].as_str().unwrap().to_string();
            (field("name"), field("status"))
        })
        .collect()
}

/// Golden snapshots of divan benches are reproducible: each runs one
/// sample of one iteration, not for a time (which gave a different full
/// trace on every run, so the second `golden` always differed). Criterion
/// cannot be told a count: its targets are skipped with a warning, and
/// naming one is a usage error.
#[test]
fn golden_snapshots_divan_benches_reproducibly_and_leaves_criterion_out() {
    let snapshots = tempfile::tempdir().unwrap();
    let filter = ["--", "--exact", "div::chasing::1000", "div::sort_batched"];
    let (out, messages) = golden(snapshots.path(), &[&["--update"][..], &filter].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for target in ["crit", "crit_forms", "crit_latest"] {
        let warning = format!(
            "warning: bench target `ring-stats/{target}` uses criterion, which picks how many times a routine runs by time"
        );
        assert!(stderr.lines().any(|l| l.starts_with(&warning)), "{stderr}");
    }
    let created = golden_statuses(&messages);
    let names: Vec<&str> = created.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["div::chasing::1000", "div::sort_batched"],
        "{stderr}"
    );
    assert!(created.iter().all(|(_, s)| s == "created"), "{created:?}");

    let (out, messages) = golden(
        snapshots.path(),
        &[&["--bench", "div"][..], &filter].concat(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let again = golden_statuses(&messages);
    assert!(
        again.len() == 2 && again.iter().all(|(_, s)| s == "unchanged"),
        "{again:?}\n{stderr}"
    );

    // Below cargo's own `Finished` line, one error line and nothing traced.
    let (out, messages) = golden(snapshots.path(), &["--bench", "crit"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim_start().starts_with("Finished `bench` profile"))
        .collect();
    assert_eq!(ours.len(), 1, "{stderr}");
    assert!(
        ours[0].starts_with("error: bench target `ring-stats/crit` uses criterion"),
        "{stderr}"
    );
    assert!(golden_statuses(&messages).is_empty(), "{messages:?}");
}

/// Golden snapshots of divan benches that run on several threads (divan's
/// `threads = [1, 2, 4]`, and a body spawning scoped threads): the full
/// trace holds every thread's loads in the region, which begins at the
/// first thread's start of the sample loop and ends at the last one's end —
/// `sum` runs 7 times over 20,000 values in the first (1 + 2 + 4 threads)
/// and once over 40,000 in the second, so their loads are 140 and 40 times
/// those of `summing::1000`. Their threads missed the region's begin, the
/// trace was incomplete and `golden` stopped there with exit 1, the benches
/// after it not recorded at all. A second run checks every bench: the
/// single-threaded one is unchanged; the threaded ones, whose interleaving
/// changes from run to run, may differ (exit 3).
#[test]
fn golden_traces_divan_benches_on_several_threads_whole() {
    let snapshots = tempfile::tempdir().unwrap();
    let (out, messages) = golden(snapshots.path(), &["--update", "--bench", "div_threads"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let names = [
        "div_threads::shared_sum",
        "div_threads::scoped_sum",
        "div_threads::summing::1000",
    ];
    let created = golden_statuses(&messages);
    let expected: Vec<(String, String)> = names
        .iter()
        .map(|n| (n.to_string(), "created".to_string()))
        .collect();
    assert_eq!(created, expected, "{stderr}");
    let sum_loads = |bench: &str| -> u64 {
        let file = std::fs::read_dir(snapshots.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                let name = p.file_name().unwrap().to_string_lossy();
                name.ends_with(".snap") && name.contains(&bench.replace("::", "%3A%3A"))
            })
            .unwrap_or_else(|| panic!("no snapshot of {bench}"));
        let text = std::fs::read_to_string(&file).unwrap();
        let body: Value = serde_json::from_str(text.splitn(3, "---").nth(2).unwrap()).unwrap();
        body["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "ring_stats::sum")
            .unwrap_or_else(|| panic!("{bench}: no ring_stats::sum"))["A"]
            .as_u64()
            .unwrap()
    };
    let single = sum_loads("div_threads::summing::1000");
    assert!(single > 0);
    assert_eq!(sum_loads("div_threads::shared_sum"), 140 * single);
    assert_eq!(sum_loads("div_threads::scoped_sum"), 40 * single);

    let (out, messages) = golden(snapshots.path(), &["--bench", "div_threads"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let checked = golden_statuses(&messages);
    let checked_names: Vec<&str> = checked.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(checked_names, names, "{stderr}");
    assert_eq!(checked[2].1, "unchanged", "{stderr}");
    let differs = checked.iter().any(|(_, s)| s == "differs");
    assert!(
        checked
            .iter()
            .all(|(_, s)| s == "unchanged" || s == "differs"),
        "{checked:?}"
    );
    assert_eq!(
        out.status.code(),
        Some(if differs { 3 } else { 0 }),
        "{stderr}"
    );
}

/// `cargo memgaze bench … | head`: a reader that leaves before the run
/// ends stops it quietly with the status of a program killed by SIGPIPE
/// (141), so that a CI pipeline under `pipefail` fails: it used to exit 0,
/// a gate passing without a verdict.
#[test]
fn a_bench_run_whose_reader_left_exits_like_sigpipe() {
    let (code, stderr) = bench_whose_reader_left(&[
        "--no-report",
        "--bench",
        "div",
        "--",
        "--exact",
        "div::summing::1000",
    ]);
    assert_eq!(code, Some(128 + 13), "{stderr}");
    assert!(!stderr.contains("internal error"), "{stderr}");
}

/// `bench -- --list | head`: a listing whose reader left ends like the
/// run above, quietly with 141, not with `error: Broken pipe`.
#[test]
fn a_listing_whose_reader_left_exits_like_sigpipe() {
    let (code, stderr) = bench_whose_reader_left(&["--bench", "div", "--", "--list"]);
    assert_eq!(code, Some(128 + 13), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
}

/// `cargo memgaze bench <args>` on the fixture whose standard output's
/// reader leaves before its first line: (exit code, stderr).
fn bench_whose_reader_left(args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = crate::support::memgaze_command();
    cmd.args(["memgaze", "bench", "--locked", "--manifest-path"])
        .arg(manifest())
        .arg("--target-dir")
        .arg(shared_target_dir())
        .args(args)
        .env_remove("CI")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The README's `cargo add` names the harness at the repository's
/// top-level `harness/` directory.
#[test]
fn the_readmes_harness_path_exists() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("cargo add --dev memgaze-harness --path"))
        .expect("a cargo add line");
    let path = line.rsplit(' ').next().unwrap().trim_matches('"');
    let relative = path.strip_prefix("$MEMGAZE_REPO/").expect(line);
    let manifest = std::fs::read_to_string(repo.join(relative).join("Cargo.toml")).unwrap();
    assert!(manifest.contains("name = \"memgaze-harness\""), "{path}");
}
