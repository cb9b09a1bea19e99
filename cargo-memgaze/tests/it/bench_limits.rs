//! `--timeout` and signals in `cargo memgaze bench`: a bench that runs past
//! its time limit is a failed bench with its own line (exit 101) and the
//! run goes on; SIGINT stops the run after the interrupted bench, keeps its
//! trace (marked interrupted) and exits 130.
//!
//! Builds the bundled microbenchmarks in the target directory the cargo
//! integration tests share (`CARGO_TARGET_TMPDIR/memgaze-benches`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("memgaze-benches")
}

fn bench(extra: &[&str]) -> Command {
    suite_command(&["bench", "--no-report"], extra)
}

/// `cargo memgaze <command>` on the bundled microbenchmarks, at sizes no
/// bench ends within the tests' limits, with JSON messages and `extra`.
fn suite_command(command: &[&str], extra: &[&str]) -> Command {
    let mut memgaze = crate::support::memgaze_command();
    memgaze
        .arg("memgaze")
        .args(command)
        .args(["--locked", "-p", "microbenches", "--manifest-path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir())
        .args(["--message-format", "json"])
        .args(extra)
        // Large enough that no bench ends on its own within the limits.
        .env("MEMGAZE_MICRO_ELEMENTS", "2000000")
        .env("MEMGAZE_MICRO_REPS", "100000")
        .stdin(Stdio::null());
    memgaze
}

/// Each bench `str` selects failed on its own line after 300 ms.
fn assert_each_str_bench_timed_out(stderr: &str) {
    for name in ["str1", "str8"] {
        assert!(
            stderr.contains(&format!(
                "error: bench `{name}` of `microbenches/micro` failed: timed out after 300ms"
            )),
            "{stderr}"
        );
    }
}

#[test]
fn a_bench_past_its_timeout_is_a_failed_bench_and_the_run_goes_on() {
    let out = bench(&["--timeout", "300ms", "--", "str"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(101), "{stderr}");
    // `str` selects several benches: each times out on its own line, and
    // every one is started (a timeout does not stop the run).
    assert_each_str_bench_timed_out(&stderr);
    let count = |reason: &str| {
        stdout
            .lines()
            .filter(|l| l.contains(&format!("\"reason\":\"{reason}\"")))
            .count()
    };
    assert!(count("bench-started") >= 3, "{stdout}");
    assert_eq!(count("bench-failed"), count("bench-started"), "{stdout}");
}

/// `golden` treats a bench past its time limit as `bench` does: a failed
/// bench with its own line (exit 101), and the run goes on (`validate`
/// shares the step, `suite::after_recording`; its checked-in snapshots
/// were recorded at other sizes than this test's endless ones).
#[test]
fn golden_fails_a_bench_past_its_timeout_and_goes_on() {
    let snapshots = tempfile::tempdir().unwrap();
    let golden_dir = snapshots.path().to_str().unwrap();
    let out = suite_command(
        &["golden", "--update"],
        &[
            "--golden-dir",
            golden_dir,
            "--timeout",
            "300ms",
            "--",
            "str",
        ],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(101), "{stderr}");
    assert_each_str_bench_timed_out(&stderr);
    // Nothing half-made was written.
    assert_eq!(std::fs::read_dir(snapshots.path()).unwrap().count(), 0);
}

/// The bench program `cargo memgaze` is recording, once it runs one (not
/// cargo's build).
fn recorded_bench(memgaze: u32) -> u32 {
    let children = format!("/proc/{memgaze}/task/{memgaze}/children");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(600) {
        let text = std::fs::read_to_string(&children).unwrap_or_default();
        for pid in text.split_whitespace() {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            if exe.to_string_lossy().contains("instrumented") {
                std::thread::sleep(Duration::from_millis(500));
                return pid.parse().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no bench started within 10 minutes");
}

#[test]
fn sigint_stops_the_run_after_the_interrupted_bench() {
    // `irr-` selects irr-rand and irr-half (and nothing the other test
    // runs: the two share the results directory).
    let mut child = bench(&["--full", "--", "irr-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let program = recorded_bench(child.id());
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("bench still running 60 s after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        !Path::new(&format!("/proc/{program}")).exists()
            || std::fs::read_to_string(format!("/proc/{program}/stat"))
                .is_ok_and(|s| s.contains(") Z")),
        "bench program {program} left running"
    );
    // Only the first bench started; its trace is kept, marked interrupted.
    let started: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("\"reason\":\"bench-started\""))
        .collect();
    assert_eq!(started.len(), 1, "{stdout}");
    let trace = target_dir().join("memgaze/microbenches/micro/irr-rand/trace.mgz");
    let analysis = crate::support::memgaze_command()
        .args(["memgaze", "analyze", "--format", "json"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        analysis.status.success(),
        "{}",
        String::from_utf8_lossy(&analysis.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&analysis.stdout).unwrap();
    assert_eq!(json["summary"]["interrupted"], "SIGINT", "{stderr}");
}

/// A signal while cargo builds the benches stops cargo and its compilers
/// (their process group) and exits with the shell's code and one line.
#[test]
fn a_signal_during_the_build_stops_cargo_and_exits_143() {
    // A fresh target directory: the build takes long enough to be caught
    // in the middle.
    let fresh = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut child = crate::support::memgaze_command()
        .args(["memgaze", "bench", "--locked", "-p", "microbenches"])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"))
        .arg("--target-dir")
        .arg(fresh.path())
        .arg("--no-report")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let children = format!("/proc/{0}/task/{0}/children", child.id());
    let started = Instant::now();
    // The `cargo build` child: `cargo metadata` runs before it, and a
    // signal then is another path.
    let cargo: i32 = loop {
        let text = std::fs::read_to_string(&children).unwrap_or_default();
        let build = text.split_whitespace().find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline.split(|&b| b == 0).any(|arg| arg == b"build"))
        });
        if let Some(pid) = build {
            break pid.parse().unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no cargo build"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Let it start compiling.
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("still building 30 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ")
            && last.contains("interrupted by SIGTERM while cargo was building"),
        "{stderr}"
    );
    // Cargo and every compiler of its group are gone (compilers that got
    // the signal may take a moment to exit and be reaped on a busy machine).
    let started = Instant::now();
    // SAFETY: signal 0 only checks for processes of that group.
    while unsafe { libc::kill(-cargo, 0) } == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "processes of cargo's group {cargo} left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
