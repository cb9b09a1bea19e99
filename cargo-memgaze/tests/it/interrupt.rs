//! Interrupted, time-limited and killed recordings, end to end through the
//! built `cargo-memgaze`: signals to the recorder are forwarded to the
//! program and leave a valid trace marked interrupted with the shell's exit
//! code; `--timeout` exits 124; a killed recorder takes the program with
//! it; a trace that cannot be written ends the recording instead of
//! deadlocking; `run` leaves no temporary files. Nothing may be left
//! behind: no process of the run, no temporary file, no shared memory.
//!
//! The time bounds are generous upper limits (the issue's "within the grace
//! period", "within a second", "within seconds"): a hang or an orphan
//! fails them by minutes.

use crate::rewriter_support;

use rewriter_support::*;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Sampled recording: the traces stay small, their analysis quick.
const SAMPLED: &[&str] = &["--period", "10000", "--window", "100"];

/// The instrumented `forever.c`: sums an array for `argv[1]` seconds
/// (forever when negative), ignoring SIGINT/SIGTERM/SIGHUP with `ignore`.
fn forever() -> &'static Path {
    static INSTRUMENTED: OnceLock<PathBuf> = OnceLock::new();
    INSTRUMENTED.get_or_init(|| {
        let binary = build("forever.c", &["-O2", "-g"]);
        instrument(&binary, None, "forever").path
    })
}

/// A fresh, empty directory for the command's `TMPDIR` (and its trace).
fn sandbox() -> tempfile::TempDir {
    tempfile::tempdir_in(scratch()).expect("tempdir")
}

/// `cargo memgaze record <flags>` of `forever` started in the background,
/// its temporary files in `dir/tmp`, with SIGHUP at its default action
/// whatever the test runner inherited (under `nohup` the recorder keeps
/// ignoring it, as the last test here checks).
fn start_record(dir: &Path, flags: &[&str], args: &[&str]) -> Child {
    start_record_with_sighup(dir, flags, args, libc::SIG_DFL)
}

/// [`start_record`] with SIGHUP's disposition set to `sighup` in the
/// recorder.
fn start_record_with_sighup(
    dir: &Path,
    flags: &[&str],
    args: &[&str],
    sighup: libc::sighandler_t,
) -> Child {
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let mut command = memgaze();
    // SAFETY: `signal` is async-signal-safe, as `pre_exec` requires.
    unsafe {
        command.pre_exec(move || {
            libc::signal(libc::SIGHUP, sighup);
            Ok(())
        });
    }
    command
        .args(["record", "-q"])
        .args(flags)
        .arg("-o")
        .arg(dir.join("t.trace"))
        .arg("--")
        .arg(forever())
        .args(args)
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cargo-memgaze record")
}

/// The recorded program: the recorder's child, once it has one (and has
/// had a moment to record something).
fn program_of(recorder: &Child) -> u32 {
    let children = format!("/proc/{0}/task/{0}/children", recorder.id());
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        // Not the dynamic loader `--libs` lists the program's libraries
        // with, nor a child caught between its fork and its exec (still
        // running `cargo-memgaze`, as the recorder does).
        let recorder_exe = std::fs::read_link(format!("/proc/{}/exe", recorder.id()));
        if let Ok(text) = std::fs::read_to_string(&children)
            && let Some(pid) = text.split_whitespace().find(|pid| {
                std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| {
                    !exe.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("ld-linux"))
                        && recorder_exe.as_ref().is_ok_and(|r| *r != exe)
                })
            })
        {
            std::thread::sleep(Duration::from_millis(500));
            return pid.parse().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the recorder started no program within 30 s");
}

/// Whether `pid` is gone (no such process, or a zombie: it has exited and
/// only waits for a parent that is not ours to reap it).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn send(child: &Child, signal: i32) {
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

/// Waits for `child` with an upper bound; its output and the time taken.
fn finish(mut child: Child, limit: Duration) -> (Output, Duration) {
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return (child.wait_with_output().unwrap(), started.elapsed());
        }
        if started.elapsed() > limit {
            // What the command and its children wait in, for a hang that
            // only shows under load.
            let state = process_state(child.id());
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}; stderr: {}\n{state}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Each thread of `pid` and of its children: name, state and the kernel
/// function it waits in (`wchan`).
fn process_state(pid: u32) -> String {
    let mut pids = vec![pid];
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
        pids.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    let mut out = String::new();
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let read =
                |file: &str| std::fs::read_to_string(task.path().join(file)).unwrap_or_default();
            let stat = read("stat");
            let state = stat
                .rsplit_once(')')
                .map_or("", |(_, rest)| rest.trim_start());
            out.push_str(&format!(
                "pid {pid} task {}: {} {} wchan {}\n",
                task.file_name().to_string_lossy(),
                read("comm").trim(),
                state.split_whitespace().next().unwrap_or("?"),
                read("wchan").trim(),
            ));
        }
    }
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `analyze --format json` of a trace, which must succeed.
fn analyze(trace: &Path) -> serde_json::Value {
    let out = run_ok(memgaze().args(["analyze", "--format", "json"]).arg(trace));
    serde_json::from_slice(&out.stdout).expect("analysis JSON")
}

/// Nothing left in the command's temporary directory, and no shared
/// memory of ours.
fn assert_nothing_left(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir.join("tmp"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    let shm: Vec<_> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains("memgaze"))
                .collect()
        })
        .unwrap_or_default();
    assert!(shm.is_empty(), "shared memory left: {shm:?}");
}

/// The acceptance check: SIGINT, SIGTERM (and SIGHUP) to `record`
/// of a long-running program end it within the grace period with the
/// shell's code, and leave a trace that `analyze` reads, with records,
/// reported as interrupted; no process or file of the run is left.
#[test]
fn a_signal_to_record_keeps_an_interrupted_trace_and_exits_like_a_shell() {
    for (signal, code, name) in [
        (libc::SIGINT, 130, "SIGINT"),
        (libc::SIGTERM, 143, "SIGTERM"),
        (libc::SIGHUP, 129, "SIGHUP"),
        (libc::SIGQUIT, 131, "SIGQUIT"),
    ] {
        let dir = sandbox();
        let recorder = start_record(
            dir.path(),
            &[SAMPLED, &["--kill-after", "5s"]].concat(),
            &[],
        );
        let program = program_of(&recorder);
        send(&recorder, signal);
        eprintln!("sent {name} to the recorder");
        let (out, took) = finish(recorder, Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(code), "{name}: {}", stderr(&out));
        assert!(
            took < Duration::from_secs(5),
            "{name}: took {took:?}, past the 5 s grace period"
        );
        assert!(
            stderr(&out).contains(&format!("interrupted by {name}")),
            "{name}: {}",
            stderr(&out)
        );
        assert!(gone(program), "{name}: program {program} still running");
        let analysis = analyze(&dir.path().join("t.trace"));
        assert_eq!(analysis["summary"]["interrupted"], name, "{name}");
        assert!(analysis["summary"]["records"].as_u64().unwrap() > 0);
        let notes = analysis["coverage"]["notes"].to_string();
        assert!(notes.contains("interrupted"), "{name}: {notes}");
        let summary = read_trace(&dir.path().join("t.trace"));
        assert!(!summary.totals.complete);
        assert!(summary.totals.records > 0);
        assert_eq!(
            summary.totals.interrupted,
            Some(memgaze_trace::Interruption::Signal(signal))
        );
        if signal == libc::SIGINT {
            // The report says so too.
            let report = dir.path().join("report");
            run_ok(
                memgaze()
                    .arg("report")
                    .arg(dir.path().join("t.trace"))
                    .arg("-o")
                    .arg(&report),
            );
            let html = std::fs::read_to_string(report.join("index.html")).unwrap();
            assert!(html.contains("recording was interrupted (SIGINT)"));
        }
        assert_nothing_left(dir.path());
    }
}

/// ^C during a bench's warm-up (before its measured region began): the
/// program dies of the forwarded SIGINT with nothing recorded, and the
/// note says that the region never began rather than that records were
/// lost.
#[test]
fn a_signal_during_the_warm_up_says_the_measured_region_never_began() {
    let binary = build("warmup.c", &["-O1"]);
    let instrumented = instrument(&binary, None, "warmup-spin").path;
    let dir = sandbox();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let recorder = memgaze()
        .arg("record")
        .args(SAMPLED)
        .arg("-o")
        .arg(dir.path().join("t.trace"))
        .arg("--")
        .arg(&instrumented)
        .arg("spin")
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cargo-memgaze record");
    let program = program_of(&recorder);
    send(&recorder, libc::SIGINT);
    let (out, _) = finish(recorder, Duration::from_secs(60));
    let stderr = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted by SIGINT"), "{stderr}");
    assert!(
        stderr.contains("killed by signal 2 (SIGINT")
            && stderr.contains(
                "before its measured region began (in its set-up or warm-up): nothing was recorded, so no record was lost"
            ),
        "{stderr}"
    );
    assert!(gone(program), "program {program} still running");
    let summary = read_trace(&dir.path().join("t.trace"));
    assert_eq!(summary.totals.records, 0);
    assert_eq!(
        summary.totals.interrupted,
        Some(memgaze_trace::Interruption::Signal(libc::SIGINT))
    );
    assert_nothing_left(dir.path());
}

/// A program that ignores the forwarded signal is killed after
/// `--kill-after`; a second SIGINT kills it at once and still leaves a
/// readable trace prefix.
#[test]
fn kill_after_and_a_second_signal_stop_a_program_that_ignores_signals() {
    let dir = sandbox();
    let recorder = start_record(
        dir.path(),
        &[SAMPLED, &["--kill-after", "1s"]].concat(),
        &["-1", "ignore"],
    );
    let program = program_of(&recorder);
    send(&recorder, libc::SIGTERM);
    let (out, took) = finish(recorder, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    // Not before the grace period: the program ignored SIGTERM.
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(gone(program));
    assert_eq!(
        analyze(&dir.path().join("t.trace"))["summary"]["interrupted"],
        "SIGTERM"
    );

    let dir = sandbox();
    let recorder = start_record(
        dir.path(),
        // Full: the collector stops in the middle of a stream of records.
        &["--full", "--kill-after", "600s"],
        &["-1", "ignore"],
    );
    let program = program_of(&recorder);
    send(&recorder, libc::SIGINT);
    std::thread::sleep(Duration::from_millis(300));
    send(&recorder, libc::SIGINT);
    let (out, took) = finish(recorder, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(gone(program));
    let analysis = analyze(&dir.path().join("t.trace"));
    assert_eq!(analysis["summary"]["interrupted"], "SIGINT");
    assert!(analysis["summary"]["records"].as_u64().unwrap() > 0);
    assert_nothing_left(dir.path());
}

/// A recorder killed with SIGKILL takes the program with it
/// (`PR_SET_PDEATHSIG`): no orphan left running.
#[test]
fn the_program_dies_with_a_killed_recorder() {
    let dir = sandbox();
    let mut recorder = start_record(dir.path(), SAMPLED, &[]);
    let program = program_of(&recorder);
    assert!(!gone(program));
    recorder.kill().unwrap();
    recorder.wait().unwrap();
    let started = Instant::now();
    while !gone(program) && started.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        gone(program),
        "program {program} still running 1 s after its recorder was killed"
    );
    assert_nothing_left(dir.path());
}

/// `--timeout 2s` on a program that runs forever: exit 124 and a valid
/// trace marked as timed out.
#[test]
fn timeout_stops_a_program_that_runs_forever() {
    let dir = sandbox();
    let recorder = start_record(dir.path(), &[SAMPLED, &["--timeout", "2s"]].concat(), &[]);
    let (out, took) = finish(recorder, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(took >= Duration::from_secs(2), "{took:?}");
    assert!(took < Duration::from_secs(2 + 5), "{took:?}");
    assert!(stderr(&out).contains("timed out"), "{}", stderr(&out));
    let analysis = analyze(&dir.path().join("t.trace"));
    assert_eq!(analysis["summary"]["interrupted"], "timeout");
    assert!(analysis["summary"]["records"].as_u64().unwrap() > 0);
    assert_nothing_left(dir.path());

    let out = memgaze()
        .args(["record", "--timeout", "2x", "--"])
        .arg(forever())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("invalid duration"),
        "{}",
        stderr(&out)
    );
}

/// A trace that cannot be written (here past `RLIMIT_FSIZE`, as on a full
/// disk) ends a full recording within seconds: exit 1, one error line
/// naming the trace, the program killed. It used to deadlock: the collector
/// stopped reading and waited for a program blocked on the full socket.
#[test]
fn a_trace_that_cannot_be_written_ends_the_recording_with_its_path() {
    let dir = sandbox();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let trace = dir.path().join("full.trace");
    let mut command = memgaze();
    command
        .args(["record", "-q", "--full", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(forever())
        .arg("600")
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            // Past the header (half a megabyte with libc's sites under
            // `--libs default`): the records must be what cannot be written.
            let limit = libc::rlimit {
                rlim_cur: 4 << 20,
                rlim_max: 4 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let recorder = command.spawn().unwrap();
    let program = program_of(&recorder);
    let (out, took) = finish(recorder, Duration::from_secs(120));
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("error: "), "{text}");
    assert!(text.contains(&trace.display().to_string()), "{text}");
    assert!(gone(program));
    assert_nothing_left(dir.path());
}

/// `run` outside a cargo project instruments into a temporary directory;
/// it is removed whatever the program's exit: a code, a signal of its own,
/// a timeout, a SIGTERM to `run`.
#[test]
fn run_leaves_no_temporary_files() {
    let kernels = build("kernels.c", &["-O2", "-g"]);
    let signals = build("signals.c", &["-O2", "-g"]);
    let forever = build("forever.c", &["-O2", "-g"]);
    // (program, args, flags, SIGTERM to `run` once the program runs, exit)
    for (program, args, flags, terminate, code) in [
        (&kernels, &["3"][..], &[][..], false, 7),
        (
            &signals,
            &["abort"][..],
            &[][..],
            false,
            128 + libc::SIGABRT,
        ),
        (&forever, &["-1"][..], &["--timeout", "1s"][..], false, 124),
        (&forever, &["-1"][..], &[][..], true, 128 + libc::SIGTERM),
    ] {
        let dir = sandbox();
        let tmp = dir.path().join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let child = memgaze()
            .args(["run", "-q", "--period", "1000", "--window", "100"])
            .args(flags)
            .arg("--")
            .arg(program)
            .args(args)
            // Outside a cargo project: no target directory to cache in.
            .current_dir(dir.path())
            .env_remove("CARGO_TARGET_DIR")
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if terminate {
            let program = program_of(&child);
            send(&child, libc::SIGTERM);
            let (out, _) = finish(child, Duration::from_secs(120));
            assert_eq!(out.status.code(), Some(code), "{}", stderr(&out));
            assert!(gone(program));
            assert_nothing_left(dir.path());
            continue;
        }
        let (out, _) = finish(child, Duration::from_secs(120));
        assert_eq!(
            out.status.code(),
            Some(code),
            "{}: {}",
            program.display(),
            stderr(&out)
        );
        assert!(!dir.path().join("target").exists());
        assert_nothing_left(dir.path());
    }
}

/// SIGKILL of `run` cannot be caught: its temporary directory (named after
/// its process id) stays until the next command that makes one, which
/// removes it because its owner is gone.
#[test]
fn a_killed_runs_temporary_directory_is_removed_by_the_next_run() {
    let kernels = build("kernels.c", &["-O2", "-g"]);
    let forever = build("forever.c", &["-O2", "-g"]);
    let dir = sandbox();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let start = |program: &Path, args: &[&str]| {
        memgaze()
            .args(["run", "-q", "--period", "1000", "--window", "100", "--"])
            .arg(program)
            .args(args)
            .current_dir(dir.path())
            .env_remove("CARGO_TARGET_DIR")
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let killed = start(&forever, &["-1"]);
    let program = program_of(&killed);
    send(&killed, libc::SIGKILL);
    let (out, _) = finish(killed, Duration::from_secs(30));
    assert_eq!(out.status.signal(), Some(libc::SIGKILL));
    let started = Instant::now();
    while !gone(program) && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone(program));
    let left: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].starts_with(".memgaze."), "{left:?}");
    let (out, _) = finish(start(&kernels, &["3"]), Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert_nothing_left(dir.path());
}

/// A signal while `run` and `record` instrument the program's libraries
/// (seconds for libc) stops the command before the program starts: the
/// recording counts only signals from its own start, so one that came
/// earlier was lost and a program ignoring SIGTERM ran on.
#[test]
fn a_signal_while_the_libraries_are_instrumented_stops_before_the_program_starts() {
    use std::io::{BufRead, BufReader, Read};
    let forever_original = build("forever.c", &["-O2", "-g"]);
    for (command, program, output) in [
        ("run", forever_original.as_path(), "a.json"),
        ("record", forever(), "t.trace"),
    ] {
        let dir = sandbox();
        let tmp = dir.path().join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let mut child = memgaze()
            .arg(command)
            .args(SAMPLED)
            .args(["--libs", "default", "--kill-after", "1s", "-o"])
            .arg(dir.path().join(output))
            .arg("--")
            .arg(program)
            .args(["-1", "ignore"])
            // An empty cache: libc is instrumented now, not found ready.
            .env("MEMGAZE_LIBS_CACHE", dir.path().join("libs"))
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cargo-memgaze");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut text = String::new();
        loop {
            let mut line = String::new();
            let read = stderr.read_line(&mut line).unwrap();
            text.push_str(&line);
            assert!(read > 0, "{command}: libc was not instrumented: {text}");
            if line.contains("instrumenting") && line.contains("libc.so.6") {
                break;
            }
        }
        send(&child, libc::SIGTERM);
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > Duration::from_secs(60) {
                // The program ignores SIGTERM: it dies with its recorder.
                let _ = child.kill();
                let _ = child.wait();
                panic!("{command}: still running 60 s after SIGTERM: {text}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        stderr.read_to_string(&mut text).unwrap();
        assert_eq!(status.code(), Some(143), "{command}: {text}");
        assert!(
            text.contains("interrupted by SIGTERM before the program started"),
            "{command}: {text}"
        );
        assert!(!dir.path().join(output).exists(), "{command}");
        assert_nothing_left(dir.path());
    }
}

/// Under `nohup` (SIGHUP ignored when the recorder starts) SIGHUP is
/// ignored throughout, as the program would have ignored it natively; a
/// later SIGINT still ends the recording as interrupted.
#[test]
fn an_ignored_sighup_stays_ignored() {
    let dir = sandbox();
    let recorder = start_record_with_sighup(
        dir.path(),
        &[SAMPLED, &["--kill-after", "5s"]].concat(),
        &[],
        libc::SIG_IGN,
    );
    let program = program_of(&recorder);
    send(&recorder, libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!gone(program), "the program stopped on an ignored SIGHUP");
    send(&recorder, libc::SIGINT);
    let (out, _) = finish(recorder, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(gone(program), "program {program} still running");
    let summary = read_trace(&dir.path().join("t.trace"));
    assert_eq!(
        summary.totals.interrupted,
        Some(memgaze_trace::Interruption::Signal(libc::SIGINT))
    );
    assert_nothing_left(dir.path());
}
