//! Outputs where they are asked for, whole or not at all (issue 21): a
//! symbolic link out of the output's directory is refused, an output that
//! cannot be written fails before the program starts, a file-size limit is
//! an error line rather than a silent death, two `bench` runs in one target
//! directory both end with whole results, and a killed `--save-baseline`
//! leaves the previous baseline whole.

use memgaze_fixtures as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    let mut cmd = crate::support::memgaze_command();
    cmd.arg("memgaze").env_remove("CI");
    cmd
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit 1 with exactly one `error:` line on stderr mentioning `needle`.
fn assert_one_error(out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains(needle), "`{needle}` not in: {err}");
}

/// A small C program that creates the file named by its argument (so a
/// test can tell whether it ran) and sums an array at random places (a
/// trace that does not compress to nothing).
fn toucher(dir: &Path) -> PathBuf {
    let source = dir.join("toucher.c");
    std::fs::write(
        &source,
        r#"#include <stdio.h>
long data[1 << 16];
int main(int argc, char **argv) {
    long sum = 0;
    unsigned long x = 1;
    for (int i = 0; i < 200000; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
        sum += data[x >> 48];
    }
    if (argc > 1) { FILE *f = fopen(argv[1], "w"); if (f) fclose(f); }
    return (int)(sum & 1);
}
"#,
    )
    .unwrap();
    let exe = dir.join("toucher");
    common::run(
        Command::new("gcc")
            .args(["-O1", "-g", "-o"])
            .arg(&exe)
            .arg(&source),
    );
    let instrumented = dir.join("toucher.inst");
    let out = bin()
        .args(["instrument", "-q"])
        .arg(&exe)
        .arg("-o")
        .arg(&instrumented)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    instrumented
}

#[test]
fn outputs_through_links_out_of_their_directory_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let program = toucher(dir.path());
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let marker = dir.path().join("ran");

    // `-o LINK` and the default `<program>.trace` in the current directory.
    let link = dir.path().join("t.trace");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let out = bin()
        .args(["record", "-q", "--full", "-o"])
        .arg(&link)
        .arg("--")
        .arg(&program)
        .arg(&marker)
        .output()
        .unwrap();
    assert_one_error(&out, "refusing to write through a symbolic link");
    std::os::unix::fs::symlink(&victim, dir.path().join("toucher.inst.trace")).unwrap();
    let out = bin()
        .current_dir(dir.path())
        .args(["record", "-q", "--full", "--"])
        .arg(&program)
        .arg(&marker)
        .output()
        .unwrap();
    assert_one_error(&out, "toucher.inst.trace");
    assert!(
        !marker.exists(),
        "the program ran before the output was checked"
    );

    // The annotation beside an instrumented executable.
    std::os::unix::fs::symlink(&victim, dir.path().join("other.memgaze.json")).unwrap();
    let out = bin()
        .args(["instrument", "-q"])
        .arg(dir.path().join("toucher"))
        .arg("-o")
        .arg(dir.path().join("other"))
        .output()
        .unwrap();
    assert_one_error(&out, "other.memgaze.json");
    assert!(!dir.path().join("other").exists(), "no half-done output");

    // `index.html` of a report.
    let trace = dir.path().join("good.trace");
    let out = bin()
        .args(["record", "-q", "--full", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&program)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let report = dir.path().join("report");
    std::fs::create_dir(&report).unwrap();
    std::os::unix::fs::symlink(&victim, report.join("index.html")).unwrap();
    let out = bin()
        .args(["report"])
        .arg(&trace)
        .arg("-o")
        .arg(&report)
        .output()
        .unwrap();
    assert_one_error(&out, "index.html");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
}

#[test]
fn unwritable_outputs_fail_before_the_program_starts() {
    let dir = tempfile::tempdir().unwrap();
    let program = toucher(dir.path());
    let marker = dir.path().join("ran");
    let missing = dir.path().join("no/such/dir/t.trace");
    let out = bin()
        .args(["record", "-q", "--full", "-o"])
        .arg(&missing)
        .arg("--")
        .arg(&program)
        .arg(&marker)
        .output()
        .unwrap();
    assert_one_error(&out, "no/such/dir/t.trace");
    assert!(!marker.exists(), "record started the program");

    let out = bin()
        .args(["run", "-q", "--full", "-o"])
        .arg(dir.path().join("no/such/dir/analysis.json"))
        .arg("--")
        .arg(dir.path().join("toucher"))
        .arg(&marker)
        .output()
        .unwrap();
    assert_one_error(&out, "no/such/dir/analysis.json");
    assert!(!marker.exists(), "run started the program");

    // A directory where the trace should go.
    let out = bin()
        .args(["record", "-q", "--full", "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(&program)
        .arg(&marker)
        .output()
        .unwrap();
    assert_one_error(&out, "is a directory");
    assert!(!marker.exists());
}

/// `ulimit -f`: the write fails with EFBIG and says which file, instead of
/// SIGXFSZ killing cargo memgaze without a word; no partial file is left.
#[test]
fn a_file_size_limit_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let program = toucher(dir.path());
    let trace = dir.path().join("limited.trace");
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#"ulimit -f 4; exec "$@""#)
        .arg("bash")
        .arg(env!("CARGO_BIN_EXE_cargo-memgaze"))
        .env("MEMGAZE_LIBS_CACHE", crate::support::LIBS_CACHE)
        .args(["memgaze", "record", "-q", "--full", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&program)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{:?} {err}", out.status);
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(line.contains("limited.trace"), "{err}");
    assert!(line.contains("File too large"), "{err}");
    assert!(!trace.exists(), "a partial trace was left");
    let debris: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(debris.is_empty(), "{debris:?}");
}

// --- bench: the fixture crate in the target directory the cargo tests
// share (built once for all of them).

fn shared_target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("memgaze-benches")
}

fn fixture_manifest() -> PathBuf {
    memgaze_fixtures::fixtures().join("hashmap-vs-btree/Cargo.toml")
}

/// The bench tests of this file change the shared results tree: one at a
/// time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn bench(extra: &[&str]) -> Command {
    let mut cmd = bin();
    cmd.args(["bench", "--locked", "--manifest-path"])
        .arg(fixture_manifest())
        .arg("--target-dir")
        .arg(shared_target_dir())
        .args(extra);
    cmd
}

/// Every bench file of a baseline, by relative path.
fn baseline_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                files.push((path.strip_prefix(dir).unwrap().to_path_buf(), bytes));
            }
        }
    }
    files.sort();
    files
}

/// `kill -INT` to a `bench` started in the background by a script (whose
/// shell ignores SIGINT in it, as for any `&` job without job control)
/// while it waits for another command's lock on the results tree stops it
/// there, exit 130 with one line, as it would during the build or a
/// recording; it used to go on waiting, then run every bench and exit 0.
#[test]
fn a_signal_while_waiting_for_the_results_lock_stops_the_bench() {
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};
    let _serial = serial();
    let out = bench(&["-q", "--no-report", "--", "--list"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let root = shared_target_dir().join("memgaze");
    std::fs::create_dir_all(&root).unwrap();
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(root.join(".memgaze-lock"))
        .unwrap();
    held.lock().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let mut command = bench(&["--no-report"]);
    command
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap());
    // SAFETY: `signal` is async-signal-safe, as `pre_exec` requires.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    let waiting = Instant::now();
    while !std::fs::read_to_string(&err_path)
        .unwrap()
        .contains("Blocking waiting for file lock on")
    {
        assert!(
            waiting.elapsed() < Duration::from_secs(120),
            "never waited for the lock: {}",
            std::fs::read_to_string(&err_path).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: a signal to our own child, not yet reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let sent = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if sent.elapsed() > Duration::from_secs(10) {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(held);
    let err = std::fs::read_to_string(&err_path).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(130), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(
        errors,
        [format!(
            "error: interrupted by SIGINT while waiting for file lock on {}",
            root.join(".memgaze-lock").display()
        )],
        "{err}"
    );
    assert!(!err.contains("Recording"), "{err}");
}

/// Two `bench` runs started at once in one target directory: the second
/// waits for the first's lock, both exit 0, and every bench's trace is
/// whole and agrees with its analysis.
#[test]
fn two_concurrent_benches_both_finish_with_whole_results() {
    let _serial = serial();
    // Build (and take no part in the race) first.
    let out = bench(&["-q", "--no-report", "--", "--list"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let children: Vec<_> = (1..=2)
        .map(|seed| {
            bench(&["--no-report", "--seed", &seed.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for out in &outputs {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    }
    let waited = outputs
        .iter()
        .any(|o| stderr(o).contains("Blocking waiting for file lock on"));
    eprintln!("one run waited for the other's lock: {waited}");
    let root = shared_target_dir().join("memgaze/hashmap-vs-btree/lookup");
    let mut checked = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("trace.mgz").exists() {
            // A bench of another feature set, from another test.
            continue;
        }
        let out = bin()
            .args(["analyze", "--format", "json"])
            .arg(dir.join("trace.mgz"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}: {}", dir.display(), stderr(&out));
        let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let saved: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("analysis.json")).unwrap()).unwrap();
        assert_eq!(
            again["summary"]["samples"],
            saved["summary"]["samples"],
            "{}: trace and analysis from different runs",
            dir.display()
        );
        assert_eq!(again["summary"]["A"], saved["summary"]["A"]);
        checked += 1;
    }
    // The five benches of the default features, and those of other
    // feature sets other tests recorded into the same target directory.
    assert!(checked >= 5, "{checked}");
}

/// `bench --save-baseline NAME` killed at various points of its run:
/// baseline NAME is afterwards either exactly the previous one or wholly
/// the new one, and always loadable.
#[test]
fn a_killed_save_baseline_keeps_the_previous_baseline_whole() {
    let _serial = serial();
    let name = "killed-e2e";
    let baselines = shared_target_dir().join("memgaze/baselines");
    let out = bench(&["-q", "--no-report", "--seed", "1", "--save-baseline", name])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let before = baseline_files(&baselines.join(name));
    assert_eq!(before.len(), 5);
    for delay_ms in [50u64, 150, 300, 450, 600, 800] {
        let mut child = bench(&["-q", "--no-report", "--seed", "2", "--save-baseline", name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
        let after = baseline_files(&baselines.join(name));
        assert_eq!(after.len(), 5, "killed after {delay_ms} ms");
        let unchanged = after.iter().filter(|f| before.contains(f)).count();
        assert!(
            unchanged == 0 || unchanged == 5,
            "killed after {delay_ms} ms: {unchanged} of 5 entries from the previous save"
        );
        memgaze::gate::load_baseline(&shared_target_dir().join("memgaze"), name).unwrap();
        // A save that completed is the new "previous".
        if unchanged == 0 {
            eprintln!("the run killed after {delay_ms} ms had finished its save");
            return;
        }
    }
}

/// A bench's `trace.mgz` planted as a link out of its results directory:
/// the run fails with one line naming it, before the bench runs, and the
/// link's target is untouched.
#[test]
fn a_planted_link_in_the_results_tree_is_refused() {
    let _serial = serial();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let out = bench(&["-q", "--no-report", "--", "--list"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = shared_target_dir().join("memgaze/hashmap-vs-btree/lookup/scan");
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.mgz");
    let _ = std::fs::remove_file(&trace);
    std::os::unix::fs::symlink(&victim, &trace).unwrap();
    let out = bench(&["-q", "--no-report", "--", "--exact", "scan"])
        .output()
        .unwrap();
    std::fs::remove_file(&trace).unwrap();
    assert_one_error(&out, "refusing to write through a symbolic link");
    assert!(stderr(&out).contains("scan/trace.mgz"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
}

/// A bench's results directory planted as a link to a directory elsewhere:
/// the run fails with one line naming it, and nothing is written where the
/// link points.
#[test]
fn a_planted_directory_link_in_the_results_tree_is_refused() {
    let _serial = serial();
    let outside = tempfile::tempdir().unwrap();
    let out = bench(&["-q", "--no-report", "--", "--list"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let lookup = shared_target_dir().join("memgaze/hashmap-vs-btree/lookup");
    std::fs::create_dir_all(lookup.join("scan")).unwrap();
    let aside = lookup.join(format!(".scan-aside-{}", std::process::id()));
    std::fs::rename(lookup.join("scan"), &aside).unwrap();
    std::os::unix::fs::symlink(outside.path(), lookup.join("scan")).unwrap();
    let out = bench(&["-q", "--no-report", "--", "--exact", "scan"])
        .output()
        .unwrap();
    std::fs::remove_file(lookup.join("scan")).unwrap();
    std::fs::rename(&aside, lookup.join("scan")).unwrap();
    assert_one_error(&out, "refusing to write through a symbolic link");
    assert!(stderr(&out).contains("lookup/scan"), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

/// `report -o DIR` where a bench's page directory inside DIR is a link to
/// elsewhere: refused in one line, nothing written through it.
#[test]
fn a_report_page_directory_that_is_a_link_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let exe = toucher(work.path());
    let trace = work.path().join("t.trace");
    let out = bin()
        .args(["record", "-q", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{}",
        stderr(&out)
    );
    let report = work.path().join("report");
    let out = bin()
        .args(["report", "-q"])
        .arg(&trace)
        .arg("-o")
        .arg(&report)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // The page directory the report made, replaced by a link.
    let page = std::fs::read_dir(&report)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .expect("a page directory");
    std::fs::remove_dir_all(&page).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), &page).unwrap();
    let out = bin()
        .args(["report", "-q"])
        .arg(&trace)
        .arg("-o")
        .arg(&report)
        .output()
        .unwrap();
    assert_one_error(&out, "refusing to write through a symbolic link");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

/// `record` caches the header's sites beside the copy (the executable's
/// alone, and those followed by its instrumented libraries' in a file of
/// their own); a trace written with the cache is the trace written
/// without it, and a damaged or foreign cache file is not used but
/// replaced.
#[test]
fn cached_header_sites_give_the_same_trace() {
    for (libs, file) in [
        ("none", "toucher.inst.memgaze.sites"),
        ("libc.so.6", "toucher.inst.memgaze.libs.sites"),
    ] {
        cached_header_sites_give_the_same_trace_with(libs, file);
    }
}

fn cached_header_sites_give_the_same_trace_with(libs: &str, file: &str) {
    let dir = tempfile::tempdir().unwrap();
    let program = toucher(dir.path());
    let marker = dir.path().join("ran");
    let sites = dir.path().join(file);
    // One trace path: the analysis names its input.
    let trace = dir.path().join("t.trace");
    let record = || {
        let out = bin()
            .args(["record", "-q", "--full", "--libs", libs, "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&program)
            .arg(&marker)
            .output()
            .unwrap();
        assert!(out.status.success(), "--libs {libs}: {}", stderr(&out));
        let analysis = bin()
            .args(["analyze", "--format", "json"])
            .arg(&trace)
            .output()
            .unwrap();
        assert!(analysis.status.success(), "{}", stderr(&analysis));
        let header = bin()
            .args(["dump", "--header-only"])
            .arg(&trace)
            .output()
            .unwrap();
        assert!(header.status.success(), "{}", stderr(&header));
        (header.stdout, analysis.stdout)
    };
    assert!(!sites.exists());
    let made = record();
    if libs != "none" {
        let text = String::from_utf8_lossy(&made.0);
        assert!(
            text.contains("libc.so.6!"),
            "the header lists libc's functions: {}",
            &text[..text.len().min(400)]
        );
    }
    let cache = std::fs::read(&sites).expect("the sites are cached beside the copy");
    assert!(cache.starts_with(b"MGZSITE1"));
    assert_eq!(record(), made, "--libs {libs}");
    for damaged in [b"MGZSITE1 cut".to_vec(), cache[..cache.len() - 1].to_vec()] {
        std::fs::write(&sites, damaged).unwrap();
        assert_eq!(record(), made, "--libs {libs}");
        assert_eq!(std::fs::read(&sites).unwrap(), cache, "rewritten");
    }
    // A cache of another annotation (another key) is not used.
    let mut foreign = cache.clone();
    foreign[8] ^= 1;
    std::fs::write(&sites, &foreign).unwrap();
    assert_eq!(record(), made, "--libs {libs}");
    assert_eq!(std::fs::read(&sites).unwrap(), cache);
}
