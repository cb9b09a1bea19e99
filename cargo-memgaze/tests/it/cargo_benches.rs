//! Cargo integration on real crates: the example fixture crate
//! (`crates/memgaze-fixtures/fixtures/hashmap-vs-btree`), the bundled microbenchmarks, and the
//! error cases of `cargo memgaze bench`.
//!
//! Every build shares one target directory under `CARGO_TARGET_TMPDIR`, so
//! the harness and its dependencies compile once (in the bench profile) for
//! all tests; the two suites are built once per test run.

use memgaze::cargo::{
    self, BenchCase, BenchKey, BenchOutcome, BenchSuite, BuildOptions, CargoArgs, HarnessArgs,
};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

fn shared_target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("memgaze-benches")
}

fn fixture(name: &str) -> PathBuf {
    memgaze_fixtures::fixtures().join(name).join("Cargo.toml")
}

fn workspace_manifest() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml")
}

fn args(manifest: PathBuf, packages: &[&str]) -> CargoArgs {
    CargoArgs {
        manifest_path: Some(manifest),
        packages: packages.iter().map(|p| p.to_string()).collect(),
        target_dir: Some(shared_target_dir()),
        locked: true,
        ..CargoArgs::default()
    }
}

fn quiet() -> BuildOptions {
    BuildOptions {
        quiet: true,
        ..BuildOptions::default()
    }
}

fn fixture_suite() -> &'static BenchSuite {
    static SUITE: OnceLock<BenchSuite> = OnceLock::new();
    SUITE.get_or_init(|| {
        cargo::discover(
            &args(fixture("hashmap-vs-btree"), &[]),
            &HarnessArgs::default(),
            &quiet(),
        )
        .unwrap()
    })
}

fn micro_suite() -> &'static BenchSuite {
    static SUITE: OnceLock<BenchSuite> = OnceLock::new();
    SUITE.get_or_init(|| {
        cargo::discover(
            &args(workspace_manifest(), &["microbenches"]),
            &HarnessArgs::default(),
            &quiet(),
        )
        .unwrap()
    })
}

fn names(cases: &[BenchCase]) -> Vec<&str> {
    cases.iter().map(|c| c.name.as_str()).collect()
}

#[test]
fn fixture_crate_is_built_discovered_and_runs() {
    let suite = fixture_suite();
    assert_eq!(suite.targets.len(), 1);
    let target = &suite.targets[0];
    let exe = &target.executable;
    assert_eq!(
        (exe.package.as_str(), exe.target.as_str()),
        ("hashmap-vs-btree", "lookup")
    );
    assert!(
        exe.path.starts_with(shared_target_dir().join("release")),
        "{exe:?}"
    );
    assert!(exe.src_path.ends_with("benches/lookup.rs"));
    assert_ne!(target.markers.begin, target.markers.end);
    assert_eq!(
        names(&target.cases),
        [
            "scan",
            "hashmap/1000",
            "hashmap/100000",
            "btreemap/1000",
            "btreemap/100000"
        ]
    );
    assert!(target.cases.iter().all(|c| !c.ignored));
    assert_eq!(suite.selected().count(), 5);

    // The executable carries line tables (the members' profile override), and the
    // results layout sits in the target dir cargo used.
    let bytes = std::fs::read(&exe.path).unwrap();
    let elf = goblin::elf::Elf::parse(&bytes).unwrap();
    let sections: Vec<&str> = elf
        .section_headers
        .iter()
        .filter_map(|s| elf.shdr_strtab.get_at(s.sh_name))
        .collect();
    assert!(sections.contains(&".debug_line"), "{sections:?}");
    assert!(sections.contains(&".symtab"));
    // The markers as the rewriter will find them: distinct functions of
    // `nop ×5; ret`, room for a 5-byte entry patch and no load.
    for (symbol, address) in [
        (cargo::REGION_BEGIN_SYMBOL, target.markers.begin),
        (cargo::REGION_END_SYMBOL, target.markers.end),
    ] {
        let sym = elf
            .syms
            .iter()
            .find(|s| elf.strtab.get_at(s.st_name) == Some(symbol))
            .unwrap();
        assert_eq!(sym.st_value, address);
        assert!(sym.st_size >= 5, "{symbol}: {} bytes", sym.st_size);
        let text = elf
            .section_headers
            .iter()
            .find(|s| s.sh_addr <= address && address < s.sh_addr + s.sh_size)
            .unwrap();
        let at = (address - text.sh_addr + text.sh_offset) as usize;
        assert_eq!(
            &bytes[at..at + 6],
            [0x90, 0x90, 0x90, 0x90, 0x90, 0xc3],
            "{symbol}"
        );
    }
    assert_eq!(suite.workspace.target_dir, shared_target_dir());
    assert_eq!(
        suite.workspace.results_layout().bench_dir(&BenchKey::new(
            &exe.package,
            &exe.target,
            "hashmap/1000"
        )),
        shared_target_dir().join("memgaze/hashmap-vs-btree/lookup/hashmap%2F1000")
    );

    let case = &target.cases[1];
    let run = exe.run_native(case).unwrap();
    assert!(
        matches!(
            run.outcome,
            BenchOutcome::Measured { nanos: Some(nanos), iterations: Some(runs), .. }
                if nanos > 0 && runs >= 1
        ),
        "{run:?}"
    );
}

#[test]
fn microbench_filters_select_like_libtest() {
    let target = &micro_suite().targets[0];
    let exe = &target.executable;
    assert_eq!(
        (exe.package.as_str(), exe.target.as_str()),
        ("microbenches", "micro")
    );
    assert_eq!(
        names(&target.cases),
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
    let list = |harness: &[&str]| -> Vec<String> {
        let harness: Vec<String> = harness.iter().map(|s| s.to_string()).collect();
        let cases = exe.list(&HarnessArgs::parse(&harness).unwrap()).unwrap();
        cases.into_iter().map(|c| c.name).collect()
    };
    assert_eq!(list(&["chase"]), ["chase"]);
    assert_eq!(list(&["--exact", "irr"]), ["irr"]);
    assert_eq!(list(&["--exact", "str/irr"]), ["str/irr"]);
    assert_eq!(list(&["--skip", "irr"]), ["str1", "str8", "chase"]);
    assert_eq!(list(&["str", "--skip", "|"]), ["str1", "str8", "str/irr"]);
    assert_eq!(
        list(&["--exact", "--skip", "irr", "irr"]),
        Vec::<String>::new()
    );
    assert_eq!(list(&["nothing-matches"]), Vec::<String>::new());
}

#[test]
fn every_microbench_runs_alone_at_a_tiny_size_under_a_recorder() {
    let target = &micro_suite().targets[0];
    let exe = &target.executable;
    for case in &target.cases {
        let run = exe
            .run(&exe.path, case, |command| {
                command
                    .env("MEMGAZE_MICRO_ELEMENTS", "1000")
                    .env("MEMGAZE_MICRO_REPS", "2")
                    .env(cargo::RECORDING_ENV, "1");
            })
            .unwrap();
        assert!(
            matches!(run.outcome, BenchOutcome::Measured { .. }),
            "{}: {run:?}",
            case.name
        );
        // Exactly this bench ran: one bench event, nothing else measured.
        let events: Vec<&str> = run
            .stdout
            .lines()
            .filter(|l| l.contains("\"type\": \"bench\""))
            .collect();
        assert_eq!(events.len(), 1, "{}", run.stdout);
        assert!(events[0].contains(&format!("\"name\": \"{}\"", case.name.replace('"', "\\\""))));
    }
    // A bad size is the bench's failure, reported with the harness's reason.
    let run = exe
        .run(&exe.path, &target.cases[0], |command| {
            command.env("MEMGAZE_MICRO_ELEMENTS", "lots");
        })
        .unwrap();
    match run.outcome {
        BenchOutcome::Failed { message } => {
            assert!(message.contains("MEMGAZE_MICRO_ELEMENTS"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    // A name the harness does not know is an error, not a silent success.
    let missing = BenchCase {
        name: "str".into(),
        ignored: false,
    };
    let e = exe.run_native(&missing).unwrap_err();
    assert!(
        format!("{e:#}").contains("no bench named exactly `str`"),
        "{e:#}"
    );
}

/// Runs `cargo-memgaze bench <args>` on a crate.
fn cargo_memgaze(manifest: &Path, extra: &[&str]) -> Output {
    crate::support::memgaze_command()
        .args(["memgaze", "bench", "--locked", "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(shared_target_dir())
        .args(extra)
        .output()
        .unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn last_line(text: &str) -> &str {
    text.lines().last().unwrap_or("")
}

#[test]
fn unknown_package_is_one_line_before_any_build() {
    let out = cargo_memgaze(&fixture("hashmap-vs-btree"), &["-p", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: package `nope` is not a member of the workspace at "),
        "{err}"
    );
    assert!(err.contains("members: hashmap-vs-btree"), "{err}");
}

/// `--baseline` naming a baseline not saved is one line naming it and
/// where it was looked for, before anything is built (a fresh target
/// directory stays without build output), also when the same name is
/// to be saved.
#[test]
fn missing_baseline_is_one_line_before_any_build() {
    let target_dir = crate::support::process_scratch("missing-baseline");
    let _ = std::fs::remove_dir_all(&target_dir);
    for extra in [&[][..], &["--save-baseline", "nope"]] {
        let out = crate::support::memgaze_command()
            .args(["memgaze", "bench", "--locked", "--manifest-path"])
            .arg(fixture("hashmap-vs-btree"))
            .arg("--target-dir")
            .arg(&target_dir)
            .args(["--baseline", "nope"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = stderr(&out);
        assert_eq!(
            err,
            format!(
                "error: baseline `nope` not found in {}: no baseline is saved yet \
                 (save one with --save-baseline NAME)\n",
                target_dir.join("memgaze/baselines").display()
            )
        );
        assert!(!target_dir.join("release").exists(), "built: {extra:?}");
    }
    let _ = std::fs::remove_dir_all(&target_dir);
}

/// An unknown `--bench` name is one line naming it and the bench targets
/// there are, before cargo runs (not cargo's error followed by ours).
#[test]
fn unknown_bench_name_is_one_line_before_any_build() {
    let out = cargo_memgaze(&fixture("hashmap-vs-btree"), &["--bench", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(
        err,
        "error: no bench target named `nope` in package `hashmap-vs-btree` \
         (benches: compare, inlined, lookup, map_sizes, plain)\n"
    );
    let out = cargo_memgaze(
        &fixture("hashmap-vs-btree"),
        &["--bench", "look*", "--bench", "x?"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: no bench target matches `x?` in package `hashmap-vs-btree` \
         (benches: compare, inlined, lookup, map_sizes, plain)\n"
    );
}

/// `--limits` and baseline names are usage errors (exit 2) told before
/// cargo runs: the manifest here does not even exist, and a typo must not
/// cost a build first.
#[test]
fn bad_limits_and_baseline_names_are_usage_errors_before_any_build() {
    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-crate/Cargo.toml");
    for (extra, expected) in [
        (
            &["--limits", "dF=abc"][..],
            "error: --limits: dF=abc: not a number",
        ),
        (
            &["--save-baseline", "a/b"][..],
            "error: baseline name `a/b`: use 1 to 64",
        ),
        (
            &["--baseline", "../x"][..],
            "error: baseline name `../x`: use 1 to 64",
        ),
    ] {
        let out = cargo_memgaze(&missing, extra);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{extra:?}: {err}");
        assert!(err.starts_with(expected), "{extra:?}: {err}");
    }
}

#[test]
fn a_crate_without_benches_is_an_error() {
    let out = cargo_memgaze(&fixture("no-benches"), &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: no bench targets in package `no-benches`"),
        "{err}"
    );
}

/// `[package.metadata.memgaze]` holds only keys cargo memgaze reads: a
/// key it does not know (`period = 10000`, which belongs on the command
/// line) is a usage error naming it, before anything is built.
#[test]
fn an_unknown_memgaze_metadata_key_is_a_usage_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let source = memgaze_fixtures::fixtures().join("no-benches");
    std::fs::create_dir(dir.path().join("src")).unwrap();
    for file in ["Cargo.lock", "src/lib.rs"] {
        std::fs::copy(source.join(file), dir.path().join(file)).unwrap();
    }
    let manifest = std::fs::read_to_string(source.join("Cargo.toml")).unwrap()
        + "\n[package.metadata.memgaze]\nlimits = \"dF=+5%\"\nperiod = 10000\n";
    std::fs::write(dir.path().join("Cargo.toml"), manifest).unwrap();
    let out = cargo_memgaze(&dir.path().join("Cargo.toml"), &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "Cargo.toml: [package.metadata.memgaze]: unknown key `period` (known keys: limits"
        ),
        "{err}"
    );
}

#[test]
fn a_build_failure_shows_cargos_error_then_one_line() {
    let out = cargo_memgaze(
        &fixture("hashmap-vs-btree"),
        &["-q", "--features", "compile-error"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("the `compile-error` feature is on"), "{err}");
    assert!(
        last_line(&err).starts_with(
            "error: could not build the benches of package `hashmap-vs-btree`: `cargo build` failed"
        ),
        "{err}"
    );
}

#[test]
fn a_bench_without_the_harness_is_skipped_unless_named() {
    let manifest = fixture("hashmap-vs-btree");
    let out = cargo_memgaze(
        &manifest,
        &["-q", "--features", "plain-bench", "--", "--list"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with("warning: bench `hashmap-vs-btree/plain` (")
            && err.contains("is not run: it uses neither memgaze-harness nor criterion nor divan")
            && err.lines().next().unwrap().ends_with("; skipped"),
        "{err}"
    );
    // `-q` keeps the warning and hides the `Listing` progress line.
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 5);
}

#[test]
fn a_named_bench_without_the_harness_is_an_error() {
    let out = cargo_memgaze(
        &fixture("hashmap-vs-btree"),
        &["-q", "--features", "plain-bench", "--bench", "plain"],
    );
    // Naming a target the tool cannot run is a usage error.
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        last_line(&err).starts_with("error: bench `hashmap-vs-btree/plain` (")
            && last_line(&err).contains("uses neither memgaze-harness nor criterion nor divan"),
        "{err}"
    );
}

/// Issue 6's own commands on the bundled suite: `-- --list` lists every
/// microbenchmark, `-- chase` records only `chase` (at a small size here).
#[test]
fn microbench_list_and_filter_through_the_command_line() {
    let manifest = workspace_manifest();
    let out = cargo_memgaze(&manifest, &["-q", "-p", "microbenches", "--", "--list"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "str1: bench\nstr8: bench\nirr: bench\nirr-rand: bench\nirr-half: bench\n\
         str/irr: bench\nirr|str|irr: bench\nchase: bench\n"
    );
    // Several filters, as `cargo bench` takes them: the benches any of
    // them selects, once each, in the filters' order.
    let out = cargo_memgaze(
        &manifest,
        &[
            "-q",
            "-p",
            "microbenches",
            "--",
            "--list",
            "chase",
            "str",
            "str8",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "chase: bench\nstr1: bench\nstr8: bench\nstr/irr: bench\nirr|str|irr: bench\n"
    );

    let out = crate::support::memgaze_command()
        .args(["memgaze", "bench", "--locked", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(shared_target_dir())
        .args([
            "-q",
            "-p",
            "microbenches",
            "--seed",
            "1",
            "--period",
            "1000",
            "--window",
            "100",
            "--message-format",
            "json",
            "--",
            "chase",
        ])
        .env("MEMGAZE_MICRO_ELEMENTS", "4096")
        .env("MEMGAZE_MICRO_REPS", "2")
        .env_remove("CI")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let messages: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ran: Vec<&serde_json::Value> = messages
        .iter()
        .filter(|m| m["reason"] == "bench-started" || m["reason"] == "bench-finished")
        .collect();
    assert_eq!(ran.len(), 2, "{messages:?}");
    assert!(ran.iter().all(|m| m["name"] == "chase"), "{messages:?}");
    let summary = &ran[1]["summary"];
    assert!(summary["samples"].as_u64().unwrap() >= 10, "{summary}");
    assert!(summary["F_irr_frac"].as_f64().unwrap() >= 0.9, "{summary}");
}

#[test]
fn list_and_filters_through_the_command_line() {
    let manifest = fixture("hashmap-vs-btree");
    let out = cargo_memgaze(&manifest, &["-q", "--", "--list"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "scan: bench\nhashmap/1000: bench\nhashmap/100000: bench\nbtreemap/1000: bench\nbtreemap/100000: bench\n"
    );
    let out = cargo_memgaze(
        &manifest,
        &[
            "-q",
            "--message-format",
            "json",
            "--",
            "--list",
            "btree",
            "--skip",
            "100000",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let messages: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Every line is a JSON message; the build's comes first.
    assert_eq!(messages[0]["reason"], "build-finished");
    let lines: Vec<&serde_json::Value> = messages
        .iter()
        .filter(|m| m["reason"] == "bench-listed")
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["reason"], "bench-listed");
    assert_eq!(lines[0]["name"], "btreemap/1000");
    assert_eq!(lines[0]["package"], "hashmap-vs-btree");
    assert_eq!(lines[0]["target"], "lookup");

    // No match: nothing to do, not an error; the JSON summary has the
    // fields of a run that measured.
    let out = cargo_memgaze(&manifest, &["-q", "--", "zzz"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = cargo_memgaze(&manifest, &["-q", "--message-format", "json", "--", "zzz"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["reason"], "summary", "{stdout}");
    assert_eq!(summary["benches"], 0, "{stdout}");
    assert!(
        summary["results"]
            .as_str()
            .is_some_and(|r| r.ends_with("memgaze"))
            && summary["elapsed_s"].is_number(),
        "{stdout}"
    );
    // A bad harness argument is a usage error.
    let out = cargo_memgaze(&manifest, &["-q", "--", "--frobnicate"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1);
}
