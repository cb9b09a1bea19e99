//! `run`'s cache of instrumented copies (`<target>/memgaze/instrumented/`):
//! one program under two names, with and without `--libs`, and an entry
//! that lost its annotation after `run` had mirrored the original's path
//! into it.

use super::rewriter_support::{memgaze, scratch};
use std::path::{Path, PathBuf};

/// Runs `run` with `args` on `program` (cached under `target`); asserts it
/// succeeded and returns whether it instrumented the program now.
fn run_instruments(target: &Path, args: &[&str], program: &Path) -> bool {
    let out = memgaze()
        .args(["memgaze", "run"])
        .args(args)
        .arg("--")
        .arg(program)
        .env("CARGO_TARGET_DIR", target)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "run {args:?} -- {}: {}\n{stderr}",
        program.display(),
        out.status
    );
    let name = program.file_name().unwrap().to_string_lossy();
    stderr
        .lines()
        .any(|l| l.contains("instrumenting") && l.contains(&*name))
}

/// The cache entry holding the instrumented copy named `name`.
fn entry_of(cache: &Path, name: &str) -> PathBuf {
    let entries: Vec<PathBuf> = std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join(name).is_file())
        .collect();
    assert_eq!(entries.len(), 1, "entries holding {name}: {entries:?}");
    entries.into_iter().next().unwrap()
}

/// The reported sequence: `run -- true`, then `run --libs none` on a copy
/// of `/usr/bin/true` under another name, failed with "cannot create
/// <entry>: Directory not empty": both were looked up under one key, the
/// second by a name the entry did not hold. Each name now has its entry,
/// reused by the next run whatever `--libs` says; an entry whose
/// annotation was deleted is completed once (not instrumented again on
/// every run) and keeps its mirror; no staging directory is left.
#[test]
fn one_program_under_two_names_with_and_without_libs_is_cached_under_each() {
    let dir = scratch().join("run-cache");
    let _ = std::fs::remove_dir_all(&dir);
    let target = dir.join("target");
    std::fs::create_dir_all(&target).unwrap();
    let prog = dir.join("prog");
    std::fs::copy("/usr/bin/true", &prog).unwrap();
    let cache = target.join("memgaze/instrumented");

    assert!(run_instruments(&target, &[], Path::new("true")));
    assert!(run_instruments(&target, &["--libs", "none"], &prog));
    assert!(!run_instruments(&target, &[], &prog), "prog is cached");
    assert!(!run_instruments(
        &target,
        &["--libs", "none"],
        Path::new("/usr/bin/true")
    ));

    let entry = entry_of(&cache, "true");
    assert!(
        entry.join("mirror").is_dir(),
        "{} has no mirror",
        entry.display()
    );
    assert_ne!(entry, entry_of(&cache, "prog"));
    std::fs::remove_file(entry.join("true.memgaze.json")).unwrap();
    assert!(run_instruments(
        &target,
        &["--libs", "none"],
        Path::new("true")
    ));
    assert!(entry.join("true.memgaze.json").is_file());
    assert!(entry.join("mirror").is_dir(), "the mirror was kept");
    assert!(
        !run_instruments(&target, &["--libs", "none"], Path::new("true")),
        "the completed entry is reused"
    );

    for name in std::fs::read_dir(&cache).unwrap() {
        let name = name.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            name.len() == 24 && name.bytes().all(|b| b.is_ascii_hexdigit()),
            "{name} is not a cache entry"
        );
    }
}

/// One program under one name in two directories shares a cache entry:
/// the second `run` reported the first's path as `run.binary`, and its
/// mirror went through the first mirror's link to the original's directory,
/// so the original ran uninstrumented (nothing recorded). Each run now
/// names its own path and records the same loads.
#[test]
fn one_name_in_two_directories_names_and_records_each_path() {
    let dir = scratch().join("run-cache-two-dirs");
    let _ = std::fs::remove_dir_all(&dir);
    let target = dir.join("target");
    std::fs::create_dir_all(&target).unwrap();
    let binary = super::rewriter_support::build("kernels.c", &["-O2"]);
    let paths = [dir.join("one/bin/prog"), dir.join("two/prog")];
    for path in &paths {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::copy(&binary, path).unwrap();
    }
    let mut records = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let out = memgaze()
            .args([
                "memgaze", "run", "--full", "--libs", "none", "--format", "json",
            ])
            .arg("--")
            .arg(path)
            .arg("1")
            .env("CARGO_TARGET_DIR", &target)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(7), "{}: {stderr}", path.display());
        assert_eq!(stderr.contains("instrumenting"), i == 0, "{stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let analysis: serde_json::Value =
            serde_json::from_str(&stdout[stdout.find('{').unwrap()..]).unwrap();
        assert_eq!(
            analysis["run"]["binary"].as_str(),
            Some(path.to_str().unwrap()),
            "{stderr}"
        );
        records.push(analysis["coverage"]["records"].as_u64().unwrap());
    }
    assert!(records[0] > 0);
    assert_eq!(records[0], records[1], "the second path ran its copy");
}
