//! The rewriter and the software recorder, end to end through the built
//! `cargo-memgaze`: behaviour preserved (stdout byte-identical, same exit
//! status) in full and sampled modes, full traces equal to Valgrind
//! Lackey's loads, exact execution counts, forks, threads, panics, signals,
//! region markers and bad input.

use crate::rewriter_support;

use rewriter_support::*;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const SAMPLED: &[&str] = &["--period", "1000", "--window", "50", "--seed", "7"];
const FULL: &[&str] = &["--full"];
/// The executable alone (`--libs none`), for tests whose counts are the
/// executable's: of its processes (libc's code in a forked or spawned child
/// before its hook records under a process of its own), or of its loads.
const SAMPLED_EXE: &[&str] = &[
    "--period", "1000", "--window", "50", "--seed", "7", "--libs", "none",
];
const FULL_EXE: &[&str] = &["--full", "--libs", "none"];

fn assert_same_behaviour(native: &Output, recorded: &Output, what: &str) {
    assert_eq!(
        native.stdout,
        recorded.stdout,
        "{what}: stdout differs\nnative: {}\nrecorded: {}\nstderr: {}",
        String::from_utf8_lossy(&native.stdout),
        String::from_utf8_lossy(&recorded.stdout),
        String::from_utf8_lossy(&recorded.stderr)
    );
    assert_eq!(
        native.status.code(),
        recorded.status.code(),
        "{what}: exit status differs; stderr: {}",
        String::from_utf8_lossy(&recorded.stderr)
    );
}

fn trace_path(tag: &str) -> std::path::PathBuf {
    scratch().join(format!("{tag}.trace"))
}

/// Behaviour and Lackey exactness for one gcc build of the kernels fixture.
fn check_c_build(flags: &[&str]) {
    let tag = flags.join("");
    let binary = build("kernels.c", flags);
    let inst = instrument(&binary, None, &tag);
    let native = native(&binary, &["3"], None);
    assert_eq!(native.status.code(), Some(7));

    // Without a collector the instrumented program just runs.
    assert_same_behaviour(
        &native,
        &super_native(&inst.path, &["3"]),
        &format!("{tag} alone"),
    );

    let full_trace = trace_path(&format!("kernels{tag}-full"));
    let full_out = record(&inst.path, &["3"], FULL, &full_trace, None);
    assert_same_behaviour(&native, &full_out, &format!("{tag} --full"));
    let sampled_trace = trace_path(&format!("kernels{tag}-sampled"));
    let sampled = record(&inst.path, &["3"], SAMPLED, &sampled_trace, None);
    assert_same_behaviour(&native, &sampled, &format!("{tag} sampled"));

    let full = read_trace(&full_trace);
    let sampled = read_trace(&sampled_trace);
    assert!(full.totals.complete && sampled.totals.complete);
    assert_eq!(full.totals.executions, full.totals.records);
    // Exact counting: a sampled run counts the same executions.
    assert_eq!(sampled.totals.executions, full.totals.executions, "{tag}");
    assert!(
        sampled.totals.records * 10 < full.totals.records,
        "{tag}: not sampled"
    );
    assert!(sampled.samples > 10);

    let lackey = lackey(&binary, &["3"], None);
    let c = compare(&inst.annotation, &full, &lackey, &escaped(&inst.report));
    assert!(
        c.over.is_empty(),
        "{tag}: more records than Lackey loads at {:x?}",
        c.over
    );
    assert!(
        c.count_mismatches.is_empty(),
        "{tag}: count mismatches (ip, lackey, recorded): {:x?}",
        c.count_mismatches
    );
    assert!(
        c.delta_mismatches.is_empty(),
        "{tag}: address deltas differ at {:x?}",
        c.delta_mismatches
    );
    assert!(
        c.implied_mismatches.is_empty(),
        "{tag}: implied loads whose Lackey count differs from their proxy's records (ip, lackey, proxy): {:x?}",
        c.implied_mismatches
    );
    assert!(c.lackey_loads > 10_000, "{tag}: {} loads", c.lackey_loads);
    assert!(c.recorded as f64 >= 0.995 * c.lackey_loads as f64);
    let coverage = c.covered_loads as f64 / c.explicit_loads as f64;
    assert!(coverage >= 0.95, "{tag}: coverage {coverage:.3}");
    // The report's static coverage is what users see.
    let reported = inst.report["coverage"].as_f64().expect("report coverage");
    assert!(reported >= 0.95, "{tag}: reported coverage {reported}");
    let text = String::from_utf8_lossy(&full_out.stderr);
    assert!(text.contains("memgaze: coverage: "), "{tag}: {text}");
    eprintln!(
        "{tag}: {} of {} Lackey loads recorded, coverage {:.2}% (static {:.2}%)",
        c.recorded,
        c.lackey_loads,
        100.0 * coverage,
        100.0 * reported
    );
}

fn super_native(program: &Path, args: &[&str]) -> Output {
    native(program, args, None)
}

#[test]
fn gcc_pie_programs_at_o0_o2_o3_behave_and_match_lackey() {
    for opt in ["-O0", "-O2", "-O3"] {
        check_c_build(&[opt, "-g"]);
    }
}

#[test]
fn gcc_non_pie_programs_at_o0_o2_o3_behave_and_match_lackey() {
    for opt in ["-O0", "-O2", "-O3"] {
        check_c_build(&[opt, "-no-pie"]);
    }
}

#[test]
fn rust_panics_are_caught_across_instrumented_frames() {
    let binary = build("panics.rs", &["-C", "debuginfo=line-tables-only"]);
    let inst = instrument(&binary, None, "all");
    let report = &inst.report;
    assert!(report["lsdas"].as_u64().unwrap() > 10, "{report}");
    let native = native(&binary, &[], None);
    assert!(String::from_utf8_lossy(&native.stdout).contains("caught 10"));
    for (sampling, name) in [(FULL, "full"), (SAMPLED, "sampled")] {
        let trace = trace_path(&format!("panics-{name}"));
        let out = record(&inst.path, &[], sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("panics {name}"));
        assert!(read_trace(&trace).totals.records > 0);
    }
    // The user's frames (with landing pads) against Lackey.
    let focused = instrument(&binary, Some("*panics::*"), "focused");
    let trace = trace_path("panics-focused");
    let out = record(&focused.path, &[], FULL, &trace, None);
    assert_same_behaviour(&native, &out, "panics focused");
    let full = read_trace(&trace);
    let c = compare(
        &focused.annotation,
        &full,
        &lackey(&binary, &[], None),
        &escaped(&focused.report),
    );
    assert!(c.over.is_empty() && c.count_mismatches.is_empty(), "{c:?}");
    assert!(c.recorded > 100, "{c:?}");
}

/// The frames of an uncaught panic in the backtrace printed on `out`'s
/// stderr, in the order printed.
fn backtrace_frames(out: &Output) -> Vec<String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let Some((_, backtrace)) = stderr.split_once("stack backtrace:") else {
        panic!("no backtrace: {stderr}");
    };
    backtrace
        .lines()
        .filter_map(|line| line.trim().split_once(": "))
        .filter(|(number, _)| number.parse::<usize>().is_ok())
        .map(|(_, frame)| frame.to_string())
        .collect()
}

#[test]
fn rust_backtraces_name_the_instrumented_frames() {
    let binary = build("backtrace.rs", &["-C", "debuginfo=line-tables-only"]);
    let inst = instrument(&binary, None, "all");
    // Named from the line tables natively (`innermost_panics`), from the
    // symbol table in the copies (`backtrace::innermost_panics`).
    let expected = ["innermost_panics", "middle_frame", "outer_frame"];
    let names = |frame: &str, function: &str| {
        frame == function || frame == format!("backtrace::{function}")
    };
    let native = Command::new(&binary)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run program");
    assert_eq!(native.status.code(), Some(101));
    let trace = trace_path("backtrace");
    let recorded = memgaze()
        .env("RUST_BACKTRACE", "1")
        .arg("record")
        .args(SAMPLED)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(&inst.path)
        .output()
        .expect("run cargo-memgaze record");
    assert_same_behaviour(&native, &recorded, "backtrace");
    for (what, out) in [("native", &native), ("instrumented", &recorded)] {
        let frames = backtrace_frames(out);
        let found: Vec<&str> = frames
            .iter()
            .filter_map(|f| expected.iter().find(|&&e| names(f, e)))
            .copied()
            .collect();
        assert_eq!(found, expected, "{what}: the user's frames in {frames:#?}");
    }
}

#[test]
fn rust_threads_are_recorded_per_thread() {
    let binary = build("threads.rs", &[]);
    let inst = instrument(&binary, None, "all");
    let native = native(&binary, &[], None);
    for (sampling, name) in [(FULL, "full"), (SAMPLED, "sampled")] {
        let trace = trace_path(&format!("threads-{name}"));
        let out = record(&inst.path, &[], sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("threads {name}"));
        let summary = read_trace(&trace);
        assert!(summary.totals.complete);
        assert!(
            summary.threads.len() >= 7,
            "{name}: records from {} threads",
            summary.threads.len()
        );
        assert_eq!(summary.totals.dropped.records, 0);
    }
}

/// A sampled run counts every execution of threads whose stacks glibc
/// would unmap when they exit (64 MiB each, past its stack cache): the exit
/// hook folds each exited thread's partly consumed skip budget from its
/// TCB, which the recorder keeps mapped, so the count equals the full
/// trace's.
#[test]
fn exited_threads_with_large_stacks_are_counted_exactly() {
    let binary = build("big_stack_threads.c", &["-O2", "-pthread"]);
    let inst = instrument(&binary, None, "all");
    let native = native(&binary, &[], None);
    let mut executions = Vec::new();
    for (sampling, name) in [(FULL_EXE, "full"), (SAMPLED_EXE, "sampled")] {
        let trace = trace_path(&format!("big-stack-threads-{name}"));
        let out = record(&inst.path, &[], sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("big stack threads {name}"));
        let summary = read_trace(&trace);
        assert!(summary.totals.complete);
        // The eight workers (the main thread's few loads open no window).
        assert!(summary.threads.len() >= 8, "{name}: {:?}", summary.threads);
        executions.push(summary.totals.executions);
    }
    assert_eq!(executions[0], executions[1], "full, sampled");
}

/// GCC's `.cold` parts are functions of their own that a conditional
/// branch enters and that jump back into the hot part: the copies keep
/// every register the cold part may read, and a call-free loop whose cold
/// path returns into its body keeps its countdown in memory (entered past
/// its entry code, a register loop ran with `rsp` 144 bytes off and
/// crashed: Debian's python3.11 in `json.dumps`, g++ code with exceptions).
#[test]
fn cold_parts_that_jump_back_into_loops_run_as_native() {
    let binary = build("cold_paths.c", &["-O2"]);
    let inst = instrument(&binary, None, "all");
    let native = native(&binary, &[], None);
    assert!(String::from_utf8_lossy(&native.stdout).contains("cold path at 4998: -4998"));
    assert_same_behaviour(&native, &super_native(&inst.path, &[]), "cold parts alone");
    for (sampling, name) in [(FULL_EXE, "full"), (SAMPLED_EXE, "sampled")] {
        let trace = trace_path(&format!("cold-paths-{name}"));
        let out = record(&inst.path, &[], sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("cold parts {name}"));
        assert!(read_trace(&trace).totals.complete, "{name}");
    }
}

#[test]
fn forked_children_do_not_corrupt_the_trace() {
    let binary = build("fork.c", &["-O2"]);
    let inst = instrument(&binary, None, "all");
    let native = native(&binary, &[], None);
    // The exec'd shell sees no recorder socket (close-on-exec) and no
    // shared-chunk memfd (closed by the entry hook once mapped).
    assert!(String::from_utf8_lossy(&native.stdout).contains("\n0\n"));
    // Counts the executable's processes: `--libs none`.
    for (sampling, name) in [(FULL_EXE, "full"), (SAMPLED_EXE, "sampled")] {
        let trace = trace_path(&format!("fork-{name}"));
        let out = record(&inst.path, &[], sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("fork {name}"));
        let summary = read_trace(&trace);
        assert!(summary.totals.complete);
        if name == "full" {
            // Parent and child, each its own "thread" of the trace.
            assert_eq!(summary.threads.len(), 2, "{:?}", summary.threads);
            assert_eq!(summary.totals.executions, summary.totals.records);
        }
    }
}

/// Debian's dash ends every forked child with `_exit` and runs external
/// commands in a `vfork` child that execs (or, for a command not found,
/// `_exit`s after failed `execve`s): each forked child's records arrive (a
/// thread of its own in a full trace; all were lost when only `DT_FINI`
/// flushed), the exec'd program is counted as untraced, and nothing is
/// dropped.
#[test]
fn dash_children_that_exit_or_exec_are_flushed() {
    let dash = system_binary("dash");
    let inst = instrument(&dash, None, "all");
    let hooks = inst.report["process_end_hooks"].to_string();
    assert!(
        hooks.contains("_exit") && hooks.contains("execve"),
        "{hooks}"
    );
    let script =
        "x=$(echo hi); (exit 3); echo $? $x; /bin/echo ext; nosuchcmd 2>/dev/null; echo $?";
    let args = ["-c", script];
    let native = native(&dash, &args, None);
    // Counts the executable's processes: `--libs none`.
    for (sampling, name) in [(FULL_EXE, "full"), (SAMPLED_EXE, "sampled")] {
        let trace = trace_path(&format!("dash-{name}"));
        let out = record(&inst.path, &args, sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("dash {name}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("1 process(es) replaced themselves with another program"),
            "{stderr}"
        );
        let summary = read_trace(&trace);
        assert!(summary.totals.complete, "{stderr}");
        assert_eq!(summary.totals.dropped.records, 0);
        if name == "full" {
            // dash, `$(echo hi)` and `(exit 3)`.
            assert_eq!(summary.threads.len(), 3, "{:?}", summary.threads);
            assert_eq!(summary.totals.executions, summary.totals.records);
        }
    }
}

/// An exec'd uninstrumented program (`sleep 0.3`, run by dash in a `vfork`
/// child) is counted as untraced time: from the `Exec` message to its exit,
/// in the trace's totals, the note and `analyze`'s JSON summary.
#[test]
fn an_execd_uninstrumented_program_is_counted_as_untraced_time() {
    let dash = system_binary("dash");
    let inst = instrument(&dash, None, "all");
    let args = ["-c", "sleep 0.3; echo done"];
    let trace = trace_path("dash-sleep");
    let out = record(&inst.path, &args, FULL, &trace, None);
    assert_same_behaviour(&native(&dash, &args, None), &out, "dash sleep");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("1 process(es) replaced themselves with another program (exec): what that program ran is not traced (0."),
        "{stderr}"
    );
    let totals = read_trace(&trace).totals;
    assert!(totals.complete, "{stderr}");
    assert_eq!(totals.execs_untraced, 1);
    // sleep's 0.3 s, and less than the whole run took under load.
    assert!(
        (290_000..5_000_000).contains(&totals.execs_untraced_micros),
        "{totals:?}"
    );
    let analyzed = memgaze()
        .args(["analyze", "--format", "json"])
        .arg(&trace)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&analyzed.stdout);
    let json: serde_json::Value =
        serde_json::from_str(&stdout[stdout.find('{').unwrap()..]).unwrap();
    let untraced = &json["summary"]["execs_untraced"];
    assert_eq!(untraced["programs"].as_u64(), Some(1), "{untraced}");
    let seconds = untraced["seconds"].as_f64().unwrap();
    assert!((0.29..5.0).contains(&seconds), "{seconds}");
}

/// `make`, instrumented, running its recipes with an instrumented dash as
/// `SHELL`: make starts each recipe's shell with `posix_spawn` (hooked: a
/// `Spawn` message names the new process), and dash forks and execs in
/// turn. With `MEMGAZE_FOLLOW_EXEC=0` the shells are counted (and
/// timed) as untraced programs and the trace is complete. By default both
/// join (connecting anew: the socket is close-on-exec), and dash's loads are added to the trace as an object of its own,
/// under which their records are filed (never under make's loads), their
/// forked children's too; nothing is dropped and the trace is complete;
/// `/bin/echo`, exec'd by dash, is the untraced program.
#[test]
fn make_running_an_instrumented_shell() {
    let make = system_binary("make");
    let dash = system_binary("dash");
    let make_inst = instrument(&make, None, "all");
    let hooks = make_inst.report["process_end_hooks"].to_string();
    assert!(hooks.contains("posix_spawn"), "{hooks}");
    let dash_inst = instrument(&dash, None, "all");
    let dir = scratch().join("make-shell");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("Makefile"),
        "all: one two\none:\n\t@echo one $$(echo sub)\ntwo:\n\t@(exit 0); /bin/echo two\n",
    )
    .unwrap();
    let dir_arg = dir.to_string_lossy().to_string();
    let shell = |dash: &Path| format!("SHELL={}", dash.display());
    let native_shell = shell(&dash);
    let native = native(
        &make,
        &["-s", "-C", dir_arg.as_str(), native_shell.as_str()],
        None,
    );
    assert_eq!(String::from_utf8_lossy(&native.stdout), "one sub\ntwo\n");
    let inst_shell = shell(&dash_inst.path);
    let args = ["-s", "-C", dir_arg.as_str(), inst_shell.as_str()];
    let run = |follow: bool, tag: &str| {
        let trace = trace_path(tag);
        let mut cmd = memgaze();
        if !follow {
            cmd.env("MEMGAZE_FOLLOW_EXEC", "0");
        }
        // The process counts below are make's and dash's: `--libs none`
        // (see `FULL_EXE`).
        let out = cmd
            .args(["record", "--full", "--libs", "none", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&make_inst.path)
            .args(args)
            .output()
            .unwrap();
        assert_same_behaviour(&native, &out, tag);
        let summary = read_trace(&trace);
        (out, summary, trace)
    };
    let (out, alone, _) = run(false, "make-shell-alone");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("2 process(es) replaced themselves with another program"),
        "{stderr}"
    );
    assert!(alone.totals.complete, "{stderr}");
    assert_eq!(alone.totals.execs_untraced, 2);
    assert_eq!(alone.threads.len(), 1, "{:?}", alone.threads);

    let (out, both, trace) = run(true, "make-shell-follow");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("2 exec'd instrumented program(s) joined the trace"),
        "{stderr}"
    );
    assert!(
        stderr.contains("1 other instrumented program(s) joined the trace with loads of their own"),
        "{stderr}"
    );
    let dash_name = dash.file_name().unwrap().to_string_lossy();
    let (dash_records, base, make_records) = object_records(&trace, &dash_name);
    assert_eq!(base as usize, make_inst.annotation.loads.len());
    let dash_records: u64 = dash_records.threads.values().sum();
    assert!(dash_records > 1000, "{dash_records} of dash's records");
    assert!(make_records > 1000, "{make_records} of make's records");
    // make, the two dashes and their two forked children (`$(echo sub)`,
    // `(exit 0)`), which name their program in a `Start` of their own
    // however soon they exit: nothing is dropped.
    assert_eq!(both.threads.len(), 5, "{:?}", both.threads);
    assert_eq!(both.totals.dropped.records, 0, "{stderr}");
    assert!(both.totals.complete, "{stderr}");
    assert_eq!(both.totals.execs_untraced, 1, "{stderr}");
}

/// The recorder socket is close-on-exec in every recorded process, so
/// following exec'd programs (the default) hands no descriptor to an
/// uninstrumented one: `ls /proc/self/fd`, exec'd by an instrumented dash,
/// lists the same descriptors natively and under `record`. And an
/// uninstrumented program the traced one leaves running (`sleep` in the
/// background) does not hold the recording open: `record` ends with the
/// traced shell (well before the sleep does), the trace complete, the
/// `sleep` counted as an untraced exec still running.
#[test]
fn an_execd_uninstrumented_program_sees_no_recorder_descriptor() {
    let dash = system_binary("dash");
    let dash_inst = instrument(&dash, None, "all");
    let list = ["-c", "exec ls /proc/self/fd"];
    let native = native(&dash, &list, None);
    assert!(native.status.success());
    let trace = trace_path("dash-exec-ls");
    let out = record(&dash_inst.path, &list, FULL, &trace, None);
    assert_same_behaviour(&native, &out, "dash -c 'exec ls /proc/self/fd'");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(listed, String::from_utf8_lossy(&native.stdout));

    let background = ["-c", "sleep 5 >/dev/null 2>&1 </dev/null & echo started"];
    let trace = trace_path("dash-background-sleep");
    let began = Instant::now();
    let out = memgaze()
        .args(["record", "--full", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&dash_inst.path)
        .args(background)
        .output()
        .unwrap();
    let took = began.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "started\n");
    assert!(
        took < Duration::from_secs(3),
        "record took {took:?}: {stderr}"
    );
    assert!(
        stderr.contains("1 of them still running when the recording ended"),
        "{stderr}"
    );
    let summary = read_trace(&trace);
    assert!(summary.totals.complete, "{stderr}");
    assert_eq!(summary.totals.execs_untraced, 1, "{stderr}");
    assert_eq!(summary.totals.dropped.records, 0, "{stderr}");
}

/// rustc calls `fork` and `_exit` through their GOT slots, never a PLT
/// entry (as the `libc` crate's declarations are called): the hooks catch
/// those calls too, so each child's last buffer arrives (a thread of its own
/// in a full trace; both were lost while only PLT entries were hooked) and a
/// sampled run counts the children's executions exactly.
#[test]
fn rust_children_that_fork_and_exit_through_the_got_are_flushed() {
    let binary = build("fork_exit_rs.rs", &[]);
    let inst = instrument(&binary, None, "all");
    let hooks = inst.report["process_end_hooks"].to_string();
    assert!(hooks.contains("_exit") && hooks.contains("fork"), "{hooks}");
    assert!(inst.report["process_end_got_calls"].as_u64().unwrap() >= 2);
    let native = native(&binary, &[], None);
    assert_eq!(
        String::from_utf8_lossy(&native.stdout),
        "statuses [6, 6] loads 1700\n"
    );
    let mut executions = Vec::new();
    // The executable's processes and executions: `--libs none` (`FULL_EXE`).
    for (sampling, name) in [(FULL_EXE, "full"), (SAMPLED_EXE, "sampled")] {
        let trace = trace_path(&format!("fork-exit-rs-{name}"));
        let out = record(&inst.path, &[], sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("fork_exit_rs {name}"));
        let summary = read_trace(&trace);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(summary.totals.complete, "{stderr}");
        assert_eq!(summary.totals.dropped.records, 0);
        if name == "full" {
            assert_eq!(summary.threads.len(), 3, "{:?}", summary.threads);
            assert_eq!(summary.totals.executions, summary.totals.records);
            // Each child_sum iteration loads one element.
            assert!(summary.totals.records >= 1700, "{:?}", summary.totals);
        }
        executions.push(summary.totals.executions);
    }
    assert_eq!(executions[0], executions[1]);
}

/// Executions per process of a recording of `program`, read from the
/// headers of the messages its runtime sent (`strace` of `sendto`): per
/// process, in the order each first sent one, the sum over its slots of the
/// last `executions` a `Records` or `Final` message gave.
fn record_counting_processes(
    program: &Path,
    sampling: &[&str],
    trace: &Path,
) -> (Output, Vec<u64>) {
    use memgaze_trace::protocol::{HEADER_BYTES, MESSAGE_MAGIC, MessageKind, SHARED_FLAG, offsets};
    let log = trace.with_extension("sendto");
    let out = Command::new("strace")
        .args(["-f", "-qq", "-s", "40", "-xx", "-e", "trace=sendto", "-o"])
        .arg(&log)
        .arg(env!("CARGO_BIN_EXE_cargo-memgaze"))
        .env("MEMGAZE_LIBS_CACHE", crate::support::LIBS_CACHE)
        .arg("record")
        .args(sampling)
        .arg("-o")
        .arg(trace)
        .arg("--")
        .arg(program)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("strace is required");
    let text = std::fs::read_to_string(&log).unwrap();
    let mut processes: Vec<u32> = Vec::new();
    let mut by_slot = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some(call) = line.find("sendto(") else {
            continue;
        };
        let Some(quoted) = line[call..].split('"').nth(1) else {
            continue;
        };
        let bytes: Vec<u8> = quoted
            .split("\\x")
            .skip(1)
            .map(|hex| u8::from_str_radix(hex, 16).unwrap())
            .collect();
        if bytes.len() < HEADER_BYTES || bytes[..4] != MESSAGE_MAGIC.to_le_bytes() {
            continue;
        }
        let word =
            |at: i32| u32::from_le_bytes(bytes[at as usize..at as usize + 4].try_into().unwrap());
        let pid = word(offsets::PID);
        if !processes.contains(&pid) {
            processes.push(pid);
        }
        let kind = word(offsets::KIND) & !SHARED_FLAG;
        if kind == MessageKind::Records as u32 || kind == MessageKind::Final as u32 {
            let at = offsets::EXECUTIONS as usize;
            let executions = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
            by_slot.insert((pid, word(offsets::SLOT)), executions);
        }
    }
    let executions = processes
        .iter()
        .map(|&pid| {
            by_slot
                .iter()
                .filter(|((of, _), _)| *of == pid)
                .map(|(_, executions)| executions)
                .sum()
        })
        .collect();
    (out, executions)
}

/// With the default libraries instrumented, libc's `fork` runs loads in the
/// child (`_Fork`'s return) before the fork hook: a sampled child counted
/// them against the skip it inherited, and lost them (8 per child), while a
/// full trace recorded them. Every process counts the same executions
/// sampled as in a full trace, each full trace's executions are its
/// records, and each of its processes' counts its records. The sampled runs
/// take no spatial samples: a full trace overwrites the spatial checks,
/// which splits the executable's code mapping, and Rust's start-up reads
/// `/proc/self/maps` through libc line by line (another number of loads).
#[test]
fn forked_children_count_the_same_executions_sampled_as_full_with_the_default_libraries() {
    const SAMPLED_NO_SPATIAL: &[&str] = &[
        "--period",
        "1000",
        "--window",
        "50",
        "--seed",
        "7",
        "--spatial-rate",
        "0",
        "--libs",
        "default",
    ];
    const FULL_DEFAULT: &[&str] = &["--full", "--libs", "default"];
    for (source, flags) in [
        ("fork_exit_rs.rs", &[][..]),
        ("fork.c", &["-O2"][..]),
        ("fork_exit.c", &["-O2"][..]),
    ] {
        let binary = build(source, flags);
        let inst = instrument(&binary, None, "default-libs-fork");
        let native = native(&binary, &[], None);
        let mut counts = Vec::new();
        for (sampling, name) in [(FULL_DEFAULT, "full"), (SAMPLED_NO_SPATIAL, "sampled")] {
            let trace = trace_path(&format!("default-libs-fork-{source}-{name}"));
            let (out, by_process) = record_counting_processes(&inst.path, sampling, &trace);
            assert_same_behaviour(&native, &out, &format!("{source} {name}"));
            let summary = read_trace(&trace);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(summary.totals.complete, "{source} {name}: {stderr}");
            assert_eq!(
                summary.totals.dropped.records, 0,
                "{source} {name}: {stderr}"
            );
            assert_eq!(
                summary.totals.executions,
                by_process.iter().sum::<u64>(),
                "{source} {name}: {by_process:?}"
            );
            if name == "full" {
                assert_eq!(
                    summary.totals.executions, summary.totals.records,
                    "{source}"
                );
                let mut records: Vec<u64> = summary.threads.values().copied().collect();
                let mut counted: Vec<u64> = by_process.iter().copied().filter(|&n| n > 0).collect();
                records.sort_unstable();
                counted.sort_unstable();
                assert_eq!(records, counted, "{source}: records per thread");
            }
            counts.push((summary.totals.executions, by_process));
        }
        assert!(counts[0].1.len() >= 2, "{source}: {counts:?}");
        assert_eq!(
            counts[0], counts[1],
            "{source}: (full, per process) against sampled"
        );
    }
}

/// A `vfork` child runs on its parent's memory, recorder buffers included,
/// until it `_exit`s or execs; `posix_spawn` clones with `CLONE_VFORK`. The
/// children's loads land in the parent's buffer (a full trace has one
/// thread holding every load, 13,100 by `child_sum`), their `_exit`/`exec`
/// hooks leave the parent's buffers alone, and the exec'd and the spawned
/// `/bin/true` are counted as untraced programs.
#[test]
fn vfork_children_leave_the_parents_buffers_intact() {
    let binary = build("vfork.c", &["-O2"]);
    let inst = instrument(&binary, None, "all");
    let native = native(&binary, &[], None);
    assert!(
        String::from_utf8_lossy(&native.stdout).starts_with("statuses 6 0 0 loads 13100 "),
        "{}",
        String::from_utf8_lossy(&native.stdout)
    );
    let mut executions = Vec::new();
    // The executable's processes and executions: `--libs none` (`FULL_EXE`).
    for (sampling, name) in [(FULL_EXE, "full"), (SAMPLED_EXE, "sampled")] {
        let trace = trace_path(&format!("vfork-{name}"));
        let out = record(&inst.path, &[], sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("vfork {name}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("2 process(es) replaced themselves with another program"),
            "{stderr}"
        );
        let summary = read_trace(&trace);
        assert!(summary.totals.complete, "{stderr}");
        assert_eq!(summary.totals.dropped.records, 0);
        assert_eq!(summary.totals.execs_untraced, 2);
        if name == "full" {
            assert_eq!(summary.threads.len(), 1, "{:?}", summary.threads);
            assert_eq!(summary.totals.executions, summary.totals.records);
            assert!(
                (13_100..13_200).contains(&summary.totals.records),
                "{:?}",
                summary.totals
            );
        }
        executions.push(summary.totals.executions);
    }
    assert_eq!(executions[0], executions[1]);
}

fn text_input(name: &str, lines: usize) -> std::path::PathBuf {
    let path = scratch().join(name);
    if !path.exists() {
        let mut x = 0x1234_5678u64;
        let mut text = String::with_capacity(lines * 40);
        for i in 0..lines {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            text.push_str(&format!("{:016x} line {i} {}\n", x, x % 9973));
        }
        std::fs::write(&path, text).unwrap();
    }
    path
}

#[test]
fn stripped_system_binaries_behave() {
    let gzip = system_binary("gzip");
    let sort = system_binary("sort");
    let gz = instrument(&gzip, None, "all");
    let so = instrument(&sort, None, "all");
    let big = text_input("big.txt", 80_000); // ~3 MB
    let small = text_input("small.txt", 6_000);
    let big_arg = big.to_str().unwrap();
    let small_arg = small.to_str().unwrap();
    let cases: [(&Path, &Path, Vec<&str>, &[&str]); 4] = [
        (&gzip, &gz.path, vec!["-9", "-c", big_arg], SAMPLED),
        (&gzip, &gz.path, vec!["-9", "-c", small_arg], FULL),
        (&sort, &so.path, vec![big_arg], SAMPLED),
        (&sort, &so.path, vec![small_arg], FULL),
    ];
    for (i, (original, instrumented, args, sampling)) in cases.iter().enumerate() {
        let native = native(original, args, None);
        assert!(native.status.success());
        let trace = trace_path(&format!("system-{i}"));
        let out = record(instrumented, args, sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("{} {args:?}", original.display()));
        let summary = read_trace(&trace);
        assert!(summary.totals.complete && summary.totals.records > 1000);
    }
}

/// Exactness on a program that is not ours: stripped Debian gzip (function
/// bounds from `.eh_frame`, jump tables, hand-written-looking loops).
#[test]
fn stripped_gzip_full_trace_matches_lackey() {
    let gzip = system_binary("gzip");
    let inst = instrument(&gzip, None, "lackey");
    // gzip scans its argv[0]: both run under paths of the same length and
    // name, or their loads differ for a reason that is not ours.
    let dir = scratch().join("gzip-lackey");
    for side in ["o", "i"] {
        std::fs::create_dir_all(dir.join(side)).unwrap();
    }
    let original = dir.join("o/gzip");
    let instrumented = dir.join("i/gzip");
    std::fs::copy(&gzip, &original).unwrap();
    std::fs::copy(&inst.path, &instrumented).unwrap();
    let mut annotation = inst.path.clone().into_os_string();
    annotation.push(".memgaze.json");
    std::fs::copy(&annotation, dir.join("i/gzip.memgaze.json")).unwrap();
    let input = text_input("lackey.txt", 400);
    let args = ["-6", "-c", input.to_str().unwrap()];
    let native = native(&original, &args, None);
    let trace = trace_path("gzip-lackey");
    let out = record(&instrumented, &args, FULL, &trace, None);
    assert_same_behaviour(&native, &out, "gzip --full");
    let full = read_trace(&trace);
    let c = compare(
        &inst.annotation,
        &full,
        &lackey(&original, &args, None),
        &escaped(&inst.report),
    );
    assert!(
        c.over.is_empty(),
        "more records than Lackey at {:x?}",
        c.over
    );
    assert!(
        c.count_mismatches.is_empty() && c.delta_mismatches.is_empty(),
        "{c:?}"
    );
    assert!(c.implied_mismatches.is_empty(), "{c:?}");
    assert!(c.lackey_loads > 100_000, "{c:?}");
    assert!(c.recorded as f64 >= 0.995 * c.lackey_loads as f64, "{c:?}");
    let coverage = c.covered_loads as f64 / c.explicit_loads as f64;
    assert!(coverage >= 0.95, "coverage {coverage:.4}");
    eprintln!(
        "gzip: {} of {} Lackey loads recorded, coverage {:.2}%",
        c.recorded,
        c.lackey_loads,
        100.0 * coverage
    );
}

/// Lackey's loads at the annotation's explicit load sites of the functions
/// named `function` (all with `None`), and how many of them the trace
/// recorded: an instrumented load is credited with at most Lackey's count
/// of it, an implied load with at most its proxy's records. Escaped loads
/// count too: this is the share of what ran that was traced.
fn recorded_share(
    annotation: &memgaze_metadata::annotation::Annotation,
    trace: &TraceSummary,
    lackey: &std::collections::BTreeMap<u64, Vec<u64>>,
    function: Option<&str>,
) -> (usize, usize) {
    let (mut seen_total, mut recorded) = (0, 0);
    for load in &annotation.loads {
        let name = &annotation.functions[load.function as usize].name;
        if function.is_some_and(|f| f != name) {
            continue;
        }
        let seen = lackey.get(&load.ip).map_or(0, Vec::len);
        let at = if load.instrumented {
            Some(load.ip)
        } else {
            load.proxy.map(std::num::NonZeroU64::get)
        };
        let got = at.map_or(0, |ip| trace.by_ip.get(&ip).map_or(0, Vec::len));
        seen_total += seen;
        recorded += got.min(seen);
    }
    (recorded, seen_total)
}

/// A bytecode interpreter dispatching by computed goto (a 256-entry table
/// indexed by the opcode byte) and by `switch`, with handlers split off
/// into `.cold` parts outside the functions' symbols: the copies follow the
/// dispatch into the copies of the cold parts, so the trace holds what
/// Lackey sees, per load, in both functions.
#[test]
fn computed_goto_and_cold_split_jump_tables_are_followed() {
    for flags in [
        &["-O2", "-freorder-blocks-and-partition"][..],
        &["-O2", "-freorder-blocks-and-partition", "-no-pie"],
    ] {
        let tag = flags.join("");
        let binary = build("interp.c", flags);
        let inst = instrument(&binary, None, &format!("interp{tag}"));
        assert!(
            inst.report["table_jumps_translated"].as_u64().unwrap() >= 2,
            "{tag}: {}",
            inst.report
        );
        let native = native(&binary, &["40"], None);
        assert_eq!(native.status.code(), Some(0));
        let trace = trace_path(&format!("interp{tag}"));
        let out = record(&inst.path, &["40"], FULL, &trace, None);
        assert_same_behaviour(&native, &out, &format!("interp {tag} --full"));
        let full = read_trace(&trace);
        assert!(full.totals.complete);
        let lackey = lackey(&binary, &["40"], None);
        let c = compare(&inst.annotation, &full, &lackey, &escaped(&inst.report));
        assert!(c.over.is_empty(), "{tag}: over at {:x?}", c.over);
        assert!(
            c.count_mismatches.is_empty() && c.delta_mismatches.is_empty(),
            "{tag}: {c:?}"
        );
        for function in ["run_goto", "run_switch"] {
            let (recorded, seen) = recorded_share(&inst.annotation, &full, &lackey, Some(function));
            assert!(seen > 10_000, "{tag} {function}: {seen} Lackey loads");
            assert!(
                recorded as f64 >= 0.97 * seen as f64,
                "{tag} {function}: {recorded} of {seen} Lackey loads recorded"
            );
            eprintln!("{tag} {function}: {recorded} of {seen} Lackey loads recorded");
        }
        // The cold parts run (the RARE handler), and are traced too.
        let (recorded, seen) = recorded_share(&inst.annotation, &full, &lackey, None);
        assert!(
            recorded as f64 >= 0.97 * seen as f64,
            "{tag}: {recorded} of {seen} Lackey loads in the executable recorded"
        );
    }
}

#[test]
fn a_killed_program_leaves_a_readable_prefix() {
    let binary = build("signals.c", &["-O2"]);
    let inst = instrument(&binary, None, "all");
    let trace = trace_path("killed");
    let out = record(&inst.path, &["kill"], SAMPLED, &trace, None);
    assert_eq!(
        out.status.code(),
        Some(128 + 9),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("signal 9"));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("partial "));
    let summary = read_trace(&trace);
    assert!(!summary.totals.complete);
    assert_eq!(
        summary.totals.exit,
        Some(memgaze_trace::ProgramExit::Signal(9))
    );
    assert!(summary.totals.records > 1000, "{:?}", summary.totals);
}

#[test]
fn a_program_killed_before_its_first_flush_is_reported_as_such() {
    let binary = build("signals.c", &["-O2"]);
    let inst = instrument(&binary, None, "all");
    let trace = trace_path("aborted");
    let out = record(&inst.path, &["abort"], FULL, &trace, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 6), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("early "));
    // The cause is the signal, not a program that is not instrumented.
    assert!(
        stderr.contains("signal 6") && stderr.contains("before the recorder's first flush"),
        "{stderr}"
    );
    assert!(!stderr.contains("may not be instrumented"), "{stderr}");
    let summary = read_trace(&trace);
    assert_eq!(
        summary.totals.exit,
        Some(memgaze_trace::ProgramExit::Signal(6))
    );
}

/// A bench killed in its warm-up, before its measured region began, had
/// recorded nothing: the note says so rather than count its buffers as
/// lost. Killed inside the region, its unsent records are lost (the
/// buffers are the program's private memory) and the note says that; one
/// that exits without a region says it never began.
#[test]
fn a_program_killed_before_its_measured_region_is_reported_as_such() {
    let binary = build("warmup.c", &["-O1"]);
    let inst = instrument(&binary, None, "warmup");
    for (mode, signal) in [("before-kill", 9), ("before-int", 2)] {
        let trace = trace_path(&format!("warmup-{mode}"));
        let out = record(&inst.path, &[mode], FULL, &trace, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(128 + signal), "{mode}: {stderr}");
        let note = stderr
            .lines()
            .find(|l| l.contains(&format!("killed by signal {signal} (")))
            .unwrap_or_else(|| panic!("{mode}: {stderr}"));
        assert!(
            note.ends_with(
                "before its measured region began (in its set-up or warm-up): nothing was recorded, so no record was lost"
            ),
            "{mode}: {note}"
        );
        assert!(!stderr.contains("every record it held is lost"), "{stderr}");
        let summary = read_trace(&trace);
        assert_eq!(summary.totals.records, 0, "{mode}");
        assert_eq!(
            summary.totals.exit,
            Some(memgaze_trace::ProgramExit::Signal(signal))
        );
        assert!(!summary.totals.complete, "{mode}");
    }

    let trace = trace_path("warmup-inside-kill");
    let out = record(&inst.path, &["inside-kill"], FULL, &trace, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 9), "{stderr}");
    assert!(
        stderr.contains("killed by signal 9 (")
            && stderr.contains("the trace holds the records flushed until then"),
        "{stderr}"
    );
    assert!(!stderr.contains("measured region"), "{stderr}");
    // The region's 64 loads were still in the killed thread's buffer.
    assert_eq!(read_trace(&trace).totals.records, 0);

    let trace = trace_path("warmup-never");
    let out = record(&inst.path, &["never"], FULL, &trace, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("measured region never began (it ended in its set-up or warm-up)"),
        "{stderr}"
    );
    assert_eq!(read_trace(&trace).totals.records, 0);
}

/// A program that closes every inherited descriptor (daemons, `closefrom`)
/// closes the recorder's too: the recording says that this may be why it
/// got nothing, and the runtime never writes into the file that reuses the
/// descriptor's number.
#[test]
fn a_program_that_closes_the_recorders_descriptor_is_told_apart() {
    let binary = build("closes_fds.c", &["-O2"]);
    let inst = instrument(&binary, None, "all");
    let trace = trace_path("closes_fds");
    let file = scratch().join("closes_fds.out");
    let out = record(&inst.path, &[file.to_str().unwrap()], FULL, &trace, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(std::fs::read(&file).unwrap(), b"hello\n", "{stderr}");
    assert!(
        stderr.contains("the recorder sent nothing") && stderr.contains("closefrom"),
        "{stderr}"
    );
    assert_eq!(read_trace(&trace).totals.records, 0);
}

/// A program that closes every descriptor only before it exits has sent
/// flushed buffers but its exit hook cannot reach the recorder: the note
/// names the closed descriptor as a cause, not only a raw exit.
#[test]
fn a_program_that_closes_the_recorders_descriptor_late_is_told_apart() {
    let binary = build("closes_fds.c", &["-O2"]);
    let inst = instrument(&binary, None, "all");
    let trace = trace_path("closes_fds_late");
    let file = scratch().join("closes_fds_late.out");
    let out = record(
        &inst.path,
        &[file.to_str().unwrap(), "late"],
        FULL,
        &trace,
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(std::fs::read(&file).unwrap(), b"hello\n", "{stderr}");
    assert!(
        stderr.contains("without its exit hook reaching the recorder")
            && stderr.contains("closed the recorder's descriptor"),
        "{stderr}"
    );
    assert!(read_trace(&trace).totals.records > 0, "{stderr}");
}

#[test]
fn signal_handlers_running_instrumented_code_are_safe() {
    let binary = build("signals.c", &["-O1"]);
    let inst = instrument(&binary, None, "all");
    let native = native(&binary, &[], None);
    // Records are checked against the executable's loads: `--libs none`.
    for (sampling, name) in [(FULL_EXE, "full"), (SAMPLED_EXE, "sampled")] {
        let trace = trace_path(&format!("signals-{name}"));
        let out = record(&inst.path, &[], sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("signals {name}"));
        let summary = read_trace(&trace);
        // Complete unless re-entered executions were dropped (never
        // claimed with records missing).
        assert_eq!(
            summary.totals.complete,
            summary.totals.dropped.records == 0,
            "{:?}",
            summary.totals
        );
        // Every record names an instrumented load (none torn).
        let known: std::collections::HashSet<u64> = inst
            .annotation
            .loads
            .iter()
            .filter(|l| l.instrumented)
            .map(|l| l.ip)
            .collect();
        assert!(summary.by_ip.keys().all(|ip| known.contains(ip)));
        if name == "full" {
            // Re-entered executions are counted, and reported as dropped.
            assert_eq!(
                summary.totals.executions,
                summary.totals.records + summary.totals.dropped.records
            );
        }
    }
}

/// Every block tracked: nearly every execution outside the windows appends
/// a spatial record from its check's stub, so the 5 kHz timer interrupts
/// those inline appends between their claim and their write, and its
/// handler's own loads append, take the cold path or call `spatial`.
#[test]
fn signal_handlers_interrupting_inline_spatial_appends_lose_nothing_silently() {
    let binary = build("signals.c", &["-O1"]);
    let inst = instrument(&binary, None, "all");
    let native = native(&binary, &[], None);
    let full_trace = trace_path("signals-spatial-full");
    let out = record(&inst.path, &[], FULL_EXE, &full_trace, None);
    assert_same_behaviour(&native, &out, "signals full");
    let full = read_trace(&full_trace);
    let trace = trace_path("signals-spatial-all");
    let mut sampling = SAMPLED_EXE.to_vec();
    sampling.extend(["--spatial-rate", "1"]);
    let out = record(&inst.path, &[], &sampling, &trace, None);
    assert_same_behaviour(&native, &out, "signals, every block tracked");
    let summary = read_trace(&trace);
    let totals = &summary.totals;
    assert_eq!(totals.complete, totals.dropped.records == 0, "{totals:?}");
    // At rate 1 every execution of `work`'s load has a record (a window's
    // or a spatial one) or is counted as dropped: at least the main loop's
    // 2000 × 8192, besides the handler's (which a register countdown may
    // leave uncounted in `executions`, so they bound nothing).
    let work = inst
        .annotation
        .functions
        .iter()
        .position(|f| f.name == "work")
        .expect("work in the annotation") as u32;
    let checked: Vec<u64> = inst
        .annotation
        .loads
        .iter()
        .filter(|l| {
            l.instrumented
                && l.function == work
                && l.class != memgaze_metadata::model::LoadClass::Constant
        })
        .map(|l| l.ip)
        .collect();
    assert_eq!(checked.len(), 1, "{checked:?}");
    let recorded = summary.by_ip[&checked[0]].len() as u64;
    assert!(
        recorded + totals.dropped.records >= 2000 * 8192,
        "{recorded} records of work's load, {totals:?}"
    );
    assert!(totals.spatial_records > totals.executions / 2, "{totals:?}");
    // No torn record: each address is one its load reads in the full trace
    // (stack addresses move with the environment: not compared).
    for (ip, addresses) in &summary.by_ip {
        let known: std::collections::HashSet<&u64> = full.by_ip[ip].iter().collect();
        assert!(
            addresses
                .iter()
                .all(|a| *a >= 0x7f00_0000_0000 || known.contains(a)),
            "load {ip:#x}: an address the full trace never reads"
        );
    }
}

#[test]
fn region_markers_switch_recording() {
    let binary = build("regions.c", &["-O1", "-g"]);
    let inst = instrument(&binary, None, "all");
    assert_eq!(inst.report["region_markers"], true, "{}", inst.report);
    let native = native(&binary, &[], None);
    let trace = trace_path("regions");
    let out = record(&inst.path, &[], FULL, &trace, None);
    assert_same_behaviour(&native, &out, "regions");
    let summary = read_trace(&trace);
    let inside = inst
        .annotation
        .functions
        .iter()
        .find(|f| f.name == "inside")
        .expect("inside()");
    let range = inside.start..inside.start + inside.size;
    assert!(!summary.by_ip.is_empty());
    for ip in summary.by_ip.keys() {
        assert!(range.contains(ip), "record at {ip:#x} outside the regions");
    }
    // Exactly the explicit loads of the two regions (inside(4096) +
    // inside(100)).
    let lackey = lackey(&binary, &[], None);
    let expected: usize = inst
        .annotation
        .loads
        .iter()
        .filter(|l| range.contains(&l.ip))
        .map(|l| lackey.get(&l.ip).map_or(0, Vec::len))
        .sum();
    assert_eq!(summary.totals.records as usize, expected);
    assert_eq!(summary.totals.executions, summary.totals.records);
}

/// String instructions' reads are traced (`movsb`, `cmpsb`, `lodsb`,
/// `scasb`, `lodsq`: six load sites, two for the `cmpsb`), not counted as
/// implicit; `instrument` still counts the implicit stack reads in its
/// report, in JSON and in text, with the classifier's own counts, and the
/// program still behaves.
#[test]
fn instrument_reports_the_implicit_loads_it_does_not_trace() {
    let binary = build("strings.c", &["-O1", "-g"]);
    let classify = |functions: &str| -> serde_json::Value {
        let out = run_ok(memgaze().arg("classify").arg(&binary).args([
            "--functions",
            functions,
            "--format",
            "json",
        ]));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["summary"].clone()
    };
    let strings = instrument(&binary, Some("strings"), "strings");
    assert_eq!(strings.report["string_loads"], 0, "{}", strings.report);
    let classified = classify("strings");
    assert_eq!(classified["string_loads"], 0);
    assert_eq!(classified["reasons"]["string"], 6, "{classified}");
    assert_eq!(strings.report["stack_loads"], classified["stack_loads"]);
    assert!(strings.report["stack_loads"].as_u64().unwrap() >= 1); // ret
    let plain = instrument(&binary, Some("no_strings"), "no_strings");
    assert_eq!(plain.report["string_loads"], 0);
    assert_eq!(
        plain.report["stack_loads"],
        classify("no_strings")["stack_loads"]
    );

    let out = run_ok(
        memgaze()
            .arg("instrument")
            .arg(&binary)
            .arg("-o")
            .arg(scratch().join("strings.text.instrumented"))
            .args(["--functions", "strings"]),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("implicit loads not traced (by design): "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(" 0 string instructions ("), "{line}");
    assert!(line.ends_with("stack reads (pop, ret, leave)"), "{line}");

    let native = native(&binary, &[], None);
    assert_eq!(native.status.code(), Some(0));
    assert_same_behaviour(&native, &super_native(&strings.path, &[]), "strings");
}

/// Every string-instruction form (`rep movs`, `rep lods`, `repe`/`repne`
/// `cmps` and `scas` at each element size, without `rep`, backwards) is
/// traced element by element: a full trace equals Lackey's reads at every
/// load (counts and address deltas, both reads of a `cmps`), except where
/// Valgrind 3.19 itself is wrong — it runs `rep lods` once, reads nothing
/// for `lodsl` and `scas` without `rep` — where the trace has what the
/// fixture executes. A sampled run counts the same executions, and each of
/// its windows is `w` consecutive executions of the full trace: the
/// elements advance the countdown one by one.
#[test]
fn string_instructions_are_traced_element_by_element_as_lackey_sees_them() {
    let binary = build("string_forms.c", &["-O1", "-g"]);
    let inst = instrument(&binary, None, "string_forms");
    assert_eq!(inst.report["string_loads"], 0, "{}", inst.report);
    let native = native(&binary, &[], None);
    assert_eq!(native.status.code(), Some(0));
    assert_same_behaviour(
        &native,
        &super_native(&inst.path, &[]),
        "string_forms alone",
    );
    let full_trace = trace_path("string_forms-full");
    let out = record(&inst.path, &[], FULL, &full_trace, None);
    assert_same_behaviour(&native, &out, "string_forms --full");
    let full = read_trace(&full_trace);
    assert!(full.totals.complete);
    assert_eq!(full.totals.executions, full.totals.records);

    let program = memgaze_instrument::binary::Binary::open(&binary).unwrap();
    let string_at = |ip: u64| {
        let bytes = program.bytes_at(ip, 4).unwrap();
        let insn =
            iced_x86::Decoder::with_ip(64, bytes, ip, iced_x86::DecoderOptions::NONE).decode();
        memgaze_instrument::classify::operands::string_reads(&insn).map(|r| (r, insn))
    };
    // What the fixture executes where Valgrind is wrong: 3 rounds of
    // 1000-byte strings.
    let valgrind_wrong = |ip: u64| -> Option<usize> {
        use memgaze_instrument::classify::operands::StringKind;
        let (reads, insn) = string_at(ip)?;
        match (reads.kind, reads.rep, reads.size) {
            (StringKind::Lods, true, size) => Some(3 * 1000 / size as usize),
            (StringKind::Lods, false, 4) | (StringKind::Scas, false, _) => Some(3),
            _ => {
                let _ = insn;
                None
            }
        }
    };
    let lackey = lackey_all(&binary, &[]);
    let mut string_sites = 0;
    let mut string_reads = 0;
    for load in &inst.annotation.loads {
        let Some((reads, _)) = string_at(load.ip) else {
            continue;
        };
        assert!(load.instrumented, "{load:?}");
        assert_eq!(load.class, memgaze_trace::LoadClass::Strided);
        assert_eq!(load.size, reads.size);
        string_sites += 1;
        let got = full.by_ip.get(&load.ip).map_or(&[][..], |v| &v[..]);
        let seen = lackey.get(&load.ip).map_or(&[][..], |v| &v[..]);
        string_reads += got.len();
        if let Some(expected) = valgrind_wrong(load.ip) {
            assert_eq!(got.len(), expected, "{:#x} {reads:?}", load.ip);
            // Consecutive elements within a round.
            assert!(
                got.windows(2)
                    .filter(|w| w[1] != w[0] + u64::from(reads.size))
                    .count()
                    <= 2
            );
            continue;
        }
        assert_eq!(got.len(), seen.len(), "{:#x} {reads:?}", load.ip);
        assert!(
            deltas_match(got, seen),
            "{:#x} {reads:?}: address deltas differ",
            load.ip
        );
    }
    // 29 instructions, 6 of them `cmps` (two sites each).
    assert_eq!(string_sites, 35);
    assert!(string_reads > 40_000, "{string_reads}");
    let rest = memgaze_metadata::annotation::Annotation {
        loads: inst
            .annotation
            .loads
            .iter()
            .filter(|l| string_at(l.ip).is_none())
            .cloned()
            .collect(),
        ..inst.annotation.clone()
    };
    let c = compare(&rest, &full, &lackey, &escaped(&inst.report));
    assert!(
        c.over.is_empty() && c.count_mismatches.is_empty() && c.delta_mismatches.is_empty(),
        "{c:?}"
    );

    let sampled_trace = trace_path("string_forms-sampled");
    let sampled_out = record(&inst.path, &[], SAMPLED, &sampled_trace, None);
    assert_same_behaviour(&native, &sampled_out, "string_forms sampled");
    let sampled = read_trace(&sampled_trace);
    assert_eq!(sampled.totals.executions, full.totals.executions);
    assert!(sampled.samples > 10, "{}", sampled.samples);
    let sequence = |path: &Path| {
        let mut reader = memgaze_trace::TraceReader::open(path).unwrap();
        let mut records = Vec::new();
        while let Some(r) = reader.next_record().unwrap() {
            if !r.spatial {
                records.push((r.sample, r.ip, r.addr));
            }
        }
        records
    };
    let whole: Vec<(u64, u64)> = sequence(&full_trace).iter().map(|r| (r.1, r.2)).collect();
    let records = sequence(&sampled_trace);
    for window in records.chunk_by(|a, b| a.0 == b.0) {
        let window: Vec<(u64, u64)> = window.iter().map(|r| (r.1, r.2)).collect();
        assert!(window.len() <= 50);
        assert!(
            whole.windows(window.len()).any(|w| w == window),
            "a window is not consecutive executions: {window:x?}"
        );
    }
}

/// `bt`/`bts`/`btr`/`btc [mem], reg` read the byte `offset >> 3` past
/// their operand: the trace must follow the byte Lackey sees (equal counts
/// and address deltas), for register-based operands and RIP-relative or
/// absolute ones (which must not be taken for Constant scalars and left to
/// a proxy), with 64-, 32- and 16-bit and negative offsets.
#[test]
fn bit_tests_at_a_register_offset_record_the_byte_they_read() {
    for flags in [&["-O2"][..], &["-O1", "-no-pie"]] {
        let opt = flags.join("");
        let binary = build("bittest.c", flags);
        let inst = instrument(&binary, Some("bits"), &format!("bittest{opt}"));
        let native = native(&binary, &["3000"], None);
        let trace = trace_path(&format!("bittest{opt}"));
        let recorded = record(&inst.path, &["3000"], FULL, &trace, None);
        assert_same_behaviour(&native, &recorded, &format!("bittest {opt}"));
        let full = read_trace(&trace);
        let lackey = lackey(&binary, &["3000"], None);
        let c = compare(&inst.annotation, &full, &lackey, &escaped(&inst.report));
        assert!(
            c.over.is_empty()
                && c.count_mismatches.is_empty()
                && c.delta_mismatches.is_empty()
                && c.implied_mismatches.is_empty(),
            "{opt}: {c:?}"
        );
        // Every load whose bytes move is traced: the four bitmap walks and
        // the `bt` at `i & 127`; the immediate form walks whole words.
        let moving: Vec<_> = inst
            .annotation
            .loads
            .iter()
            .filter(|l| {
                lackey.get(&l.ip).is_some_and(|a| {
                    a.len() == 3000 && a.iter().collect::<std::collections::BTreeSet<_>>().len() > 1
                })
            })
            .collect();
        assert!(moving.len() >= 6, "{opt}: {moving:?}");
        for l in moving {
            assert!(l.instrumented, "{opt}: {l:?} is not traced");
        }
    }
}

fn one_error_line(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr
}

/// A dynamically linked cgo program (external linking) is refused by
/// `instrument` and by `run` before it runs: the Go runtime would die on
/// the first stack walk through relocated code ("fatal error: unknown pc").
#[test]
fn a_cgo_go_program_is_refused_before_it_runs() {
    let dir = scratch().join("go");
    std::fs::create_dir_all(&dir).unwrap();
    let program = dir.join("cgo");
    run_ok(
        Command::new("go")
            .args(["build", "-o"])
            .arg(&program)
            .arg(memgaze_fixtures::fixtures().join("rewriter/cgo.go"))
            .env("GOCACHE", dir.join("cache"))
            .env("GOPATH", dir.join("gopath"))
            .env("GO111MODULE", "off")
            .env("CGO_ENABLED", "1"),
    );
    // It is the kind the issue names: dynamically linked, with an
    // interpreter (a static Go binary is refused as statically linked).
    let elf = std::fs::read(&program).unwrap();
    assert!(elf.windows(12).any(|w| w == b"/lib64/ld-li"), "not dynamic");
    let out = memgaze()
        .arg("instrument")
        .arg(&program)
        .arg("-o")
        .arg(dir.join("cgo.out"))
        .output()
        .unwrap();
    assert!(one_error_line(&out).contains("Go program"));
    assert!(!dir.join("cgo.out").exists());
    let out = memgaze()
        .args(["run", "-q", "--"])
        .arg(&program)
        .output()
        .unwrap();
    let line = one_error_line(&out);
    assert!(
        line.contains("Go program") && line.contains(".go"),
        "{line}"
    );
    // The program did not run (it prints its sum when it does).
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn bad_input_gets_one_error_line_and_exit_1() {
    let dir = scratch();
    let static_binary = build("kernels.c", &["-O1", "-static"]);
    let out = memgaze()
        .arg("instrument")
        .arg(&static_binary)
        .arg("-o")
        .arg(dir.join("static.out"))
        .output()
        .unwrap();
    assert!(one_error_line(&out).contains("statically linked"));
    // A static-pie is a statically linked executable, not a library.
    let static_pie = build("kernels.c", &["-O1", "-static-pie"]);
    let out = memgaze()
        .arg("instrument")
        .arg(&static_pie)
        .arg("-o")
        .arg(dir.join("static-pie.out"))
        .output()
        .unwrap();
    assert!(
        one_error_line(&out).contains("statically linked (static-pie) executable"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let binary = build("kernels.c", &["-O1"]);
    let inst = instrument(&binary, None, "twice");
    let out = memgaze()
        .arg("instrument")
        .arg(&inst.path)
        .arg("-o")
        .arg(dir.join("twice.out"))
        .output()
        .unwrap();
    assert!(one_error_line(&out).contains("already instrumented"));

    let out = memgaze()
        .arg("instrument")
        .arg(&binary)
        .arg("-o")
        .arg("/nonexistent-directory/out")
        .output()
        .unwrap();
    assert!(one_error_line(&out).contains("cannot write"));

    let out = memgaze()
        .args(["record", "--", "/nonexistent-directory/program"])
        .output()
        .unwrap();
    assert!(one_error_line(&out).contains("/nonexistent-directory/program"));

    let out = memgaze()
        .arg("record")
        .arg("--")
        .arg(&binary)
        .output()
        .unwrap();
    assert!(one_error_line(&out).contains("not instrumented"));
}

#[test]
fn ptwrite_mode_writes_base_and_index_before_each_load_and_the_address_of_tracked_blocks() {
    use iced_x86::{Code, Decoder, DecoderOptions};
    let binary = build("kernels.c", &["-O2"]);
    let output = scratch().join("kernels-ptwrite");
    let out = memgaze()
        .arg("instrument")
        .arg(&binary)
        .arg("-o")
        .arg(&output)
        .args(["--mode", "ptwrite", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let annotation = memgaze_instrument::rewrite::read_annotation(&output).unwrap();
    let expected: usize = annotation
        .loads
        .iter()
        .filter(|l| l.instrumented)
        .map(|l| usize::from(l.base.is_some()) + usize::from(l.index.is_some()))
        .sum();
    let start = report["copies_start"].as_u64().unwrap();
    let end = report["copies_end"].as_u64().unwrap();
    let image = std::fs::read(&output).unwrap();
    let text = segment_bytes(&image, start, end);
    let mut decoder = Decoder::with_ip(64, &text, start, DecoderOptions::NONE);
    let mut ptwrites = 0;
    let mut pending: Vec<iced_x86::Register> = Vec::new();
    let mut checked = 0;
    let mut spatial = 0;
    while decoder.can_decode() {
        let insn = decoder.decode();
        if insn.code() == Code::Ptwrite_rm64 {
            ptwrites += 1;
            pending.push(insn.op0_register());
            continue;
        }
        if !pending.is_empty() && insn.code() == Code::Pop_r64 {
            // A spatial check's stub: the address in rdi, then rdi restored.
            assert_eq!(pending, [iced_x86::Register::RDI]);
            spatial += 1;
            pending.clear();
            continue;
        }
        if !pending.is_empty() {
            let mut regs = vec![
                insn.memory_base().full_register(),
                insn.memory_index().full_register(),
            ];
            regs.retain(|r| r.is_gpr64());
            assert_eq!(
                pending,
                regs,
                "ptwrites before {:?} at {:#x}",
                insn.code(),
                insn.ip()
            );
            checked += 1;
            pending.clear();
        }
    }
    // Every Strided or Irregular load has a spatial check whose stub writes
    // its address, listed as an `address` site.
    let checks = annotation
        .loads
        .iter()
        .filter(|l| l.instrumented && l.class != memgaze_metadata::model::LoadClass::Constant)
        .count();
    assert!(checks > 10, "{checks} spatial checks");
    assert_eq!(spatial, checks);
    assert_eq!(ptwrites, expected + checks);
    assert!(checked > 20);
    // The annotation lists each ptwrite at its address, with its load and
    // operand (the PT reconstruction's convention).
    assert_eq!(annotation.ptwrites.len(), expected + checks);
    for site in &annotation.ptwrites {
        let at = (site.ip - start) as usize;
        let insn = Decoder::with_ip(64, &text[at..], site.ip, DecoderOptions::NONE).decode();
        assert_eq!(insn.code(), Code::Ptwrite_rm64, "at {:#x}", site.ip);
        let load = &annotation.loads[site.load as usize];
        let register = match site.operand {
            memgaze_metadata::annotation::PtwriteOperand::Base => load.base.as_deref(),
            memgaze_metadata::annotation::PtwriteOperand::Index => load.index.as_deref(),
            memgaze_metadata::annotation::PtwriteOperand::Address => Some("rdi"),
        }
        .expect("operand register");
        let written = format!("{:?}", insn.op0_register()).to_lowercase();
        let full = format!(
            "{:?}",
            iced_x86::Register::values()
                .find(|r| format!("{r:?}").to_lowercase() == register)
                .expect("register name")
                .full_register()
        )
        .to_lowercase();
        assert_eq!(written, full, "ptwrite at {:#x}", site.ip);
    }
}

/// Bytes of the file backing `[start, end)` (found through the program
/// headers).
fn segment_bytes(image: &[u8], start: u64, end: u64) -> Vec<u8> {
    let phoff = u64::from_le_bytes(image[32..40].try_into().unwrap()) as usize;
    let phnum = u16::from_le_bytes(image[56..58].try_into().unwrap()) as usize;
    for i in 0..phnum {
        let h = &image[phoff + 56 * i..];
        let kind = u32::from_le_bytes(h[0..4].try_into().unwrap());
        let offset = u64::from_le_bytes(h[8..16].try_into().unwrap());
        let vaddr = u64::from_le_bytes(h[16..24].try_into().unwrap());
        let filesz = u64::from_le_bytes(h[32..40].try_into().unwrap());
        if kind == 1 && vaddr <= start && end <= vaddr + filesz {
            let at = (offset + start - vaddr) as usize;
            return image[at..at + (end - start) as usize].to_vec();
        }
    }
    panic!("no segment holds {start:#x}..{end:#x}");
}

/// A load the rewriter leaves out (a gather, which this run does not
/// execute): `run` prints the static coverage beside the dynamic one, as
/// `record` does (`coverage_gaps::untraced_gathers_lower_the_dynamic_coverage`
/// runs one).
#[test]
fn run_reports_the_static_coverage_of_loads_left_out() {
    let binary = build("uncovered_gather.c", &["-O2"]);
    let out = memgaze()
        .current_dir(scratch())
        .args(["run", "--full", "--libs", "none", "--format", "json", "-o"])
        .arg(scratch().join("uncovered-gather.json"))
        .arg("--")
        .arg(&binary)
        .output()
        .unwrap();
    let native = native(&binary, &[], None);
    assert_same_behaviour(&native, &out, "run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("memgaze: coverage: 4 of 5 explicit loads"),
        "{stderr}"
    );
}

#[test]
fn run_instruments_records_and_analyses() {
    let binary = build("kernels.c", &["-O2", "-g"]);
    let report = scratch().join("run-analysis.json");
    let out = memgaze()
        .current_dir(scratch())
        .args(["run", "--full", "--format", "json", "-o"])
        .arg(&report)
        .arg("--")
        .arg(&binary)
        .arg("2")
        .output()
        .unwrap();
    let native = native(&binary, &["2"], None);
    assert_same_behaviour(&native, &out, "run");
    let analysis: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).expect("analysis JSON");
    assert_eq!(analysis["schema"], "memgaze.analysis.v1");
    assert!(
        analysis["summary"]["A"].as_u64().unwrap() > 1000,
        "{}",
        analysis["summary"]
    );
    let functions: Vec<&str> = analysis["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert!(
        functions.contains(&"irregular") && functions.contains(&"strided"),
        "{functions:?}"
    );
}

/// C++ through the rewriter: exceptions thrown through several relocated
/// frames (their LSDAs and FDEs rewritten), caught by base class, rethrown
/// and nested; virtual calls through vtables into relocated functions;
/// static constructors and destructors. Same output and exit status alone,
/// in full and sampled recording, and a full trace equal to Lackey's.
#[test]
fn cxx_exceptions_virtual_calls_and_static_constructors_behave() {
    for flags in [&["-O0", "-g"][..], &["-O2"], &["-O2", "-no-pie"]] {
        let tag = format!("cxx{}", flags.join(""));
        let binary = build("cxx.cpp", flags);
        let inst = instrument(&binary, None, &tag);
        let native = native(&binary, &[], None);
        assert_eq!(native.status.code(), Some(3), "{tag}");
        let text = String::from_utf8_lossy(&native.stdout);
        assert!(
            text.contains("limit 20 -> ") && text.contains("limit 39 escaped: deep 39"),
            "{text}"
        );
        assert_same_behaviour(
            &native,
            &super_native(&inst.path, &[]),
            &format!("{tag} alone"),
        );
        let full_trace = trace_path(&format!("{tag}-full"));
        let full_out = record(&inst.path, &[], FULL, &full_trace, None);
        assert_same_behaviour(&native, &full_out, &format!("{tag} --full"));
        // What is not traced is said: the libraries by name (libstdc++ is
        // never among `--libs default`; libc is, when that is in effect).
        let said = String::from_utf8_lossy(&full_out.stderr);
        let executable_only = said
            .contains("memgaze: not traced: loads in shared libraries (libstdc++.so.6, ")
            && said.contains("libc.so.6; only the executable is instrumented)");
        let with_libc = said.contains(
            "memgaze: not traced: loads in shared libraries (libstdc++.so.6; instrumented: the executable, ",
        ) && said.contains("libc.so.6");
        assert!(executable_only || with_libc, "{said}");
        let sampled_trace = trace_path(&format!("{tag}-sampled"));
        let sampled = record(&inst.path, &[], SAMPLED, &sampled_trace, None);
        assert_same_behaviour(&native, &sampled, &format!("{tag} sampled"));

        let full = read_trace(&full_trace);
        assert!(full.totals.complete, "{tag}");
        assert_eq!(full.totals.executions, full.totals.records, "{tag}");
        assert_eq!(
            read_trace(&sampled_trace).totals.executions,
            full.totals.executions,
            "{tag}"
        );
        let c = compare(
            &inst.annotation,
            &full,
            &lackey(&binary, &[], None),
            &escaped(&inst.report),
        );
        assert!(c.over.is_empty(), "{tag}: over {:x?}", c.over);
        assert!(
            c.count_mismatches.is_empty(),
            "{tag}: count mismatches {:x?}",
            c.count_mismatches
        );
        assert!(c.lackey_loads > 1000, "{tag}: {c:?}");
    }
}

/// Programs that find their files relative to their own executable (cmake
/// exits 1 with "Could not find CMAKE_ROOT" when its copy runs from
/// elsewhere): `run` runs the instrumented copy from a mirror of the
/// original's directories, with `argv[0]` as given, so they behave as
/// natively; the same copy run from another directory does not.
#[test]
fn run_keeps_the_programs_own_layout() {
    let prefix = scratch().join("selfpath-prefix");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::fs::create_dir_all(prefix.join("share/selfpath")).unwrap();
    std::fs::write(prefix.join("share/selfpath/data"), "CMAKE_ROOT\n").unwrap();
    std::fs::write(prefix.join("bin/sibling.txt"), "beside\n").unwrap();
    let program = prefix.join("bin/selfpath");
    std::fs::copy(build("selfpath.c", &["-O2"]), &program).unwrap();
    let native = native(&program, &[], None);
    assert_eq!(native.status.code(), Some(0), "{native:?}");

    let elsewhere = instrument(&program, None, "selfpath");
    let moved = super_native(&elsewhere.path, &[]);
    assert_eq!(
        moved.status.code(),
        Some(1),
        "the fixture must notice its move"
    );

    // Full with the default `--libs` (libc instrumented: no untraced
    // library), sampled with `--libs none` (libc named as untraced).
    for (sampling, libs) in [(FULL, "default"), (SAMPLED, "none")] {
        let analysis = scratch().join("selfpath-run.json");
        let out = memgaze()
            .current_dir(scratch())
            .arg("run")
            .args(sampling)
            .args(["--libs", libs])
            .args(["--format", "json", "-o"])
            .arg(&analysis)
            .arg("--")
            .arg(&program)
            .output()
            .unwrap();
        assert_same_behaviour(&native, &out, &format!("run selfpath {sampling:?}"));
        let analysis: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&analysis).unwrap()).unwrap();
        let coverage = &analysis["coverage"];
        let untraced_note = coverage["notes"].as_array().unwrap().iter().any(|n| {
            n == "loads in shared libraries that ran uninstrumented are not traced: libc.so.6"
        });
        if libs == "none" {
            assert_eq!(
                coverage["untraced_libraries"],
                serde_json::json!(["libc.so.6"])
            );
            assert!(untraced_note, "{coverage}");
        } else {
            assert!(coverage["untraced_libraries"].is_null(), "{coverage}");
            assert!(!untraced_note, "{coverage}");
            let objects = &analysis["summary"]["coverage_by_object"];
            assert!(
                objects
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|o| o["object"] == "libc.so.6"
                        && o["instrumented"] == true
                        && o["loads_traced"].as_f64().unwrap() > 0.0),
                "{objects}"
            );
        }
    }
}

/// Escapes are counted only while loads are recorded: `escape_region.c`
/// runs the unresolvable escape 300 times before its region, 100 times in
/// it and 500 times after it; the trace counts the region's 100, so a
/// program whose start-up escapes (argument parsing, say) does not read as
/// untraced inside its region.
#[test]
fn escapes_outside_the_region_are_not_counted() {
    let binary = build("escape_region.c", &["-O1"]);
    let inst = instrument(&binary, None, "escape-region");
    let native = native(&binary, &[], None);
    for (sampling, name) in [(FULL, "full"), (SAMPLED, "sampled")] {
        let trace = trace_path(&format!("escape-region-{name}"));
        let out = record(&inst.path, &[], sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("escape_region {name}"));
        let escapes = read_trace(&trace).totals.escapes;
        assert_eq!(escapes.len(), 1, "{escapes:?}");
        assert_eq!(escapes[0].function, "step");
        assert_eq!(escapes[0].count, 100, "the region's calls of step only");
    }
}

/// An escaping jump that ends a superblock is counted whichever way the
/// block runs: `escape_superblock.c`'s `step` reads two loads and its
/// table before the computed goto (one superblock check), so a full trace
/// runs the block's counting fragment on every call and a sampled one
/// inside its windows; both count the 2000 escapes, one per call.
#[test]
fn escapes_at_the_end_of_a_superblock_are_counted_in_every_mode() {
    let binary = build("escape_superblock.c", &["-O1"]);
    let inst = instrument(&binary, None, "escape-superblock");
    assert!(
        inst.report["probe_kinds"]["superblock check"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{}",
        inst.report
    );
    let native = native(&binary, &[], None);
    for (sampling, name) in [(FULL_EXE, "full"), (SAMPLED_EXE, "sampled")] {
        let trace = trace_path(&format!("escape-superblock-{name}"));
        let out = record(&inst.path, &[], sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("escape_superblock {name}"));
        let escapes = read_trace(&trace).totals.escapes;
        assert_eq!(escapes.len(), 1, "{name}: {escapes:?}");
        assert_eq!(escapes[0].function, "step");
        assert_eq!(escapes[0].count, 2000, "{name}: one escape per call");
    }
}

/// `MEMGAZE_NO_ESCAPE_CHECKS=1` leaves the escape checks out: `escape.c`'s
/// copy reports none, behaves the same, and its recording counts no escape
/// although `step` still lands in original code; `run` with the knob does
/// not reuse the cached copy with checks (nor the reverse).
#[test]
fn no_escape_checks_knob_leaves_the_checks_out() {
    let binary = build("escape.c", &["-O1"]);
    let output = scratch().join("escape.no-escape-checks.instrumented");
    let out = run_ok(
        memgaze()
            .env("MEMGAZE_NO_ESCAPE_CHECKS", "1")
            .args(["instrument", "--format", "json"])
            .arg(&binary)
            .arg("-o")
            .arg(&output),
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["escape_checks"].as_u64(), Some(0), "{report}");
    let native = native(&binary, &[], None);
    let trace = trace_path("escape-unchecked");
    let out = record(&output, &[], FULL, &trace, None);
    assert_same_behaviour(&native, &out, "escape without checks");
    // libc, instrumented by `record` without the knob, counts its own.
    let escapes = read_trace(&trace).totals.escapes;
    assert!(
        escapes.iter().all(|e| e.function.starts_with("libc.so.6!")),
        "{escapes:?}"
    );

    let cache = scratch().join("escape-knob-cache");
    std::fs::create_dir_all(&cache).unwrap();
    let run = |knob: Option<&str>| {
        let mut cmd = memgaze();
        cmd.env("CARGO_TARGET_DIR", &cache)
            .env_remove("MEMGAZE_NO_ESCAPE_CHECKS")
            .args(["run", "--full", "--format", "json", "--"])
            .arg(&binary);
        if let Some(value) = knob {
            cmd.env("MEMGAZE_NO_ESCAPE_CHECKS", value);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let json = stdout.split_once('\n').unwrap().1.to_string();
        let analysis: serde_json::Value = serde_json::from_str(&json).unwrap();
        // The executable's (a library's are named `<library>!<function>`).
        (analysis["coverage"]["untraced_functions"].as_array()).map_or(0, |a| {
            a.iter()
                .filter(|f| !f["name"].as_str().unwrap().contains('!'))
                .count()
        })
    };
    // With checks the escape is seen (`step` untraced); without, it is not;
    // with checks again (the knob at 0), seen again.
    assert_eq!(run(None), 1);
    assert_eq!(run(Some("1")), 0);
    assert_eq!(run(Some("0")), 1);
}

/// A computed goto through a table filled at run time and xor-ed with a
/// volatile (`escape.c`) cannot be resolved: in the copy it lands in
/// `step`'s original code. Each landing is counted (one per call of
/// `step`, full or sampled), dynamic coverage drops with `step` named, and
/// `record` and `run` print one warning; a program without escapes
/// (kernels) counts none and does not warn.
#[test]
fn unresolvable_escape_lowers_dynamic_coverage_and_warns() {
    let binary = build("escape.c", &["-O1"]);
    let inst = instrument(&binary, None, "escape");
    assert!(
        inst.report["escape_checks"].as_u64().unwrap() >= 1,
        "{}",
        inst.report
    );
    let native = native(&binary, &[], None);
    for (sampling, name) in [(FULL, "full"), (SAMPLED, "sampled")] {
        let trace = trace_path(&format!("escape-{name}"));
        let out = record(&inst.path, &[], sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("escape {name}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("warning: dynamic coverage is"))
            .collect();
        assert_eq!(warnings.len(), 1, "{stderr}");
        assert!(warnings[0].contains("largest: step "), "{stderr}");
        // The executable's: libc, instrumented by default, counts its own
        // (`__vfprintf_internal`'s jump table).
        let escapes: Vec<_> = (read_trace(&trace).totals.escapes.into_iter())
            .filter(|e| !e.function.contains('!'))
            .collect();
        assert_eq!(escapes.len(), 1, "{escapes:?}");
        assert_eq!(escapes[0].function, "step");
        assert_eq!(escapes[0].count, 2000, "one escape per call of step");
        assert!(escapes[0].loads > 0);
    }

    let out = memgaze()
        .args(["run", "--full", "--format", "json", "--"])
        .arg(&binary)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (printed, json) = stdout.split_once('\n').unwrap();
    assert_eq!(printed.as_bytes(), native.stdout.trim_ascii_end());
    let analysis: serde_json::Value = serde_json::from_str(json).unwrap();
    let overall = analysis["summary"]["coverage_dynamic"].as_f64().unwrap();
    assert!(overall < 0.95, "{overall}");
    let step = analysis["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "step")
        .unwrap();
    assert!(step["coverage_dynamic"].as_f64().unwrap() < overall);
    assert_eq!(
        analysis["coverage"]["untraced_functions"][0]["name"],
        "step"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.starts_with("warning: dynamic coverage is"))
            .count(),
        1,
        "{stderr}"
    );

    // No escape in the executable, no warning; libc's (`printf`'s jump
    // table, one landing estimated at its reachable loads) stay above the
    // warning's 95%.
    let kernels = build("kernels.c", &["-O2"]);
    let inst = instrument(&kernels, None, "no-escape");
    let trace = trace_path("kernels-dyncov");
    let out = record(&inst.path, &["3"], FULL, &trace, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("warning: dynamic coverage"), "{stderr}");
    let escapes = read_trace(&trace).totals.escapes;
    assert!(
        escapes.iter().all(|e| e.function.starts_with("libc.so.6!")),
        "{escapes:?}"
    );
    let out = memgaze()
        .args(["run", "--full", "--format", "json", "--"])
        .arg(&kernels)
        .arg("3")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = &stdout[stdout.find('{').unwrap()..];
    let analysis: serde_json::Value = serde_json::from_str(json).unwrap();
    let overall = analysis["summary"]["coverage_dynamic"].as_f64().unwrap();
    assert!(overall > 0.95, "{overall}");
    let untraced = analysis["coverage"]["untraced_functions"].as_array();
    assert!(
        (untraced.into_iter().flatten()).all(|f| f["name"].as_str().unwrap().contains('!')),
        "{untraced:?}"
    );
}

/// By default, an instrumented program that execs an
/// instrumented program (itself, through `/proc/self/exe`) is traced on:
/// the new image joins the trace as a process of its own (both images'
/// `work` loops are in the full trace), nothing is counted as untraced, and
/// the trace is complete. With `MEMGAZE_FOLLOW_EXEC=0`, the exec is counted
/// as untraced (and `an_execd_uninstrumented_program_sees_no_recorder_descriptor`
/// checks no descriptor leaks).
#[test]
fn an_exec_of_an_instrumented_program_joins_the_trace() {
    let binary = build("exec_self.c", &["-O1"]);
    let inst = instrument(&binary, None, "exec");
    let native = native(&binary, &[], None);
    assert_eq!(
        String::from_utf8_lossy(&native.stdout),
        "first 5997000\nsecond 5997000\n"
    );
    let one = trace_path("exec-self-one");
    record(&inst.path, &["second"], FULL, &one, None);
    let one = read_trace(&one);
    let alone = trace_path("exec-self-opt-out");
    let out = memgaze()
        .env("MEMGAZE_FOLLOW_EXEC", "0")
        .args(["record", "--full", "-o"])
        .arg(&alone)
        .arg("--")
        .arg(&inst.path)
        .output()
        .unwrap();
    assert_same_behaviour(&native, &out, "exec_self --full, MEMGAZE_FOLLOW_EXEC=0");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("1 process(es) replaced themselves with another program"),
        "{stderr}"
    );
    let trace = trace_path("exec-self");
    let out = record(&inst.path, &[], FULL, &trace, None);
    assert_same_behaviour(&native, &out, "exec_self --full, default");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("1 exec'd instrumented program(s) joined the trace"),
        "{stderr}"
    );
    assert!(!stderr.contains("replaced themselves"), "{stderr}");
    let both = read_trace(&trace);
    assert!(both.totals.complete, "{stderr}");
    assert_eq!(both.totals.dropped.records, 0);
    assert_eq!(both.threads.len(), 2, "{:?}", both.threads);
    assert_eq!(both.totals.executions, both.totals.records);
    // Each image runs `work` (2,000 loads) and main's loops.
    assert!(
        both.totals.records >= 2 * one.totals.records - 10,
        "{} vs 2 × {}",
        both.totals.records,
        one.totals.records
    );
}

/// The records of `trace` that name loads of the object `name` (an
/// `object` label: `<first function> <first load> <name>`), as a summary
/// of their own; that object's first load index; and how many records
/// name loads below it.
fn object_records(trace: &Path, name: &str) -> (TraceSummary, u32, u64) {
    let mut reader = memgaze_trace::TraceReader::open(trace).unwrap();
    let header = reader.header().clone();
    let firsts: Vec<(u32, &str)> = header
        .labels
        .iter()
        .filter(|(key, _)| key == memgaze_trace::OBJECT_LABEL)
        .map(|(_, value)| {
            let parts: Vec<&str> = value.splitn(3, ' ').collect();
            (parts[1].parse::<u32>().unwrap(), parts[2])
        })
        .collect();
    let base = firsts
        .iter()
        .find(|(_, object)| *object == name)
        .unwrap_or_else(|| panic!("no object {name} in {:?}", header.labels))
        .0;
    let end = firsts
        .iter()
        .map(|&(first, _)| first)
        .filter(|&first| first > base)
        .min()
        .unwrap_or(header.loads.len() as u32);
    let mut by_ip: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    let mut threads: std::collections::BTreeMap<u32, u64> = Default::default();
    let mut below = 0;
    while let Some(raw) = reader.next_raw().unwrap() {
        if (base..end).contains(&raw.load) {
            let ip = header.loads[raw.load as usize].ip;
            by_ip.entry(ip).or_default().push(raw.addr);
            *threads.entry(raw.thread).or_default() += 1;
        }
        below += u64::from(raw.load < base);
    }
    let summary = TraceSummary {
        by_ip,
        object_records: 0,
        threads,
        samples: 1,
        totals: reader.totals().unwrap().clone(),
    };
    (summary, base, below)
}

/// By default, an instrumented program whose forked
/// child execs another instrumented executable: that program's loads are
/// added to the trace as an object of its own (functions `<file>!name`),
/// its records are filed under them, exactly as Lackey counts its loads,
/// the parent's stay under the parent's, nothing is dropped and the trace
/// is complete; `analyze` names the object on the child's loads.
#[test]
fn an_execd_instrumented_program_of_another_executable_joins_with_its_loads() {
    let parent = build("exec_other.c", &["-O1"]);
    let child = build("exec_child.c", &["-O1"]);
    let parent_inst = instrument(&parent, None, "exec-other");
    let child_inst = instrument(&child, None, "exec-child");
    // Named as the original executable (as the traced one is).
    let child_name = child.file_name().unwrap().to_string_lossy().into_owned();
    let native = native(&parent, &[child.to_str().unwrap(), "3000"], None);
    assert_eq!(
        String::from_utf8_lossy(&native.stdout),
        "parent 5997000\nchild 22492500\nstatus 0\n"
    );
    let trace = trace_path("exec-other");
    let out = memgaze()
        // The objects' load numbering and the parent's records below are
        // the two executables' alone: `--libs none`.
        .args(["record", "--full", "--libs", "none", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&parent_inst.path)
        .arg(&child_inst.path)
        .arg("3000")
        .output()
        .unwrap();
    assert_same_behaviour(&native, &out, "exec_other --full, default");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("1 other instrumented program(s) joined the trace with loads of their own"),
        "{stderr}"
    );
    let all = read_trace(&trace);
    assert!(all.totals.complete, "{stderr}");
    assert_eq!(all.totals.dropped.records, 0, "{stderr}");
    assert_eq!(all.totals.executions, all.totals.records);
    let (ours, base, parent_records) = object_records(&trace, &child_name);
    assert_eq!(base as usize, parent_inst.annotation.loads.len());
    // The child's records against Lackey's loads of the child binary.
    let lackey = lackey(&child, &["3000"], None);
    let c = compare(
        &child_inst.annotation,
        &ours,
        &lackey,
        &escaped(&child_inst.report),
    );
    assert!(
        c.over.is_empty(),
        "more records than Lackey loads at {:x?}",
        c.over
    );
    assert!(
        c.count_mismatches.is_empty(),
        "count mismatches (ip, lackey, recorded): {:x?}",
        c.count_mismatches
    );
    assert!(c.recorded >= 3000, "{} records", c.recorded);
    assert!(c.recorded as f64 >= 0.995 * c.lackey_loads as f64);
    // The rest are the parent's, under the parent's loads.
    let child_records: u64 = ours.threads.values().sum();
    assert!(parent_records >= 2000, "{parent_records}");
    assert_eq!(all.totals.records, child_records + parent_records);
    // `analyze` names the object on the child's loads and functions.
    let analyzed = memgaze()
        .args(["analyze", "--format", "json"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        analyzed.status.success(),
        "{}",
        String::from_utf8_lossy(&analyzed.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&analyzed.stdout).unwrap();
    let sum = json["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"].as_str() == Some(&format!("{child_name}!child_sum")))
        .unwrap_or_else(|| panic!("no {child_name}!child_sum in {}", json["functions"]));
    assert_eq!(sum["object"].as_str(), Some(child_name.as_str()), "{sum}");
    let child_loads: u64 = json["loads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["object"].as_str() == Some(child_name.as_str()))
        .map(|l| l["count"].as_u64().unwrap())
        .sum();
    assert_eq!(child_loads, child_records);
}

/// `run` (the recording streamed into the analysis) with a forked child
/// that execs another instrumented executable: the analysis takes that
/// program as an object of its own mid-run, so its functions
/// (`<file>!name`) and loads are in `run --json` with every record the
/// child sent, as Lackey counts its loads; the object has its row in the
/// coverage by object; nothing is dropped; and the streamed analysis is
/// the analysis of the trace `--save-trace` kept (its header rewritten as
/// `record`'s). A copy of the child without its annotation beside it
/// cannot be filed: its records are counted as dropped, with the note.
#[test]
fn run_analyses_an_execd_instrumented_program_of_another_executable() {
    let parent = build("exec_other.c", &["-O1"]);
    let child = build("exec_child.c", &["-O1"]);
    let child_inst = instrument(&child, None, "run-exec-child");
    let child_name = child.file_name().unwrap().to_string_lossy().into_owned();
    let native = native(&parent, &[child.to_str().unwrap(), "3000"], None);
    let trace = trace_path("run-exec-other");
    // `--libs none`: the objects' load numbering is the two executables'.
    let run = |child: &Path, trace: &Path| {
        memgaze()
            .args(["run", "--full", "--libs", "none", "--format", "json"])
            .arg("--save-trace")
            .arg(trace)
            .arg("--")
            .arg(&parent)
            .arg(child)
            .arg("3000")
            .output()
            .unwrap()
    };
    let out = run(&child_inst.path, &trace);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("1 other instrumented program(s) joined the trace with loads of their own"),
        "{stderr}"
    );
    assert!(!stderr.contains("could not be filed"), "{stderr}");
    assert!(!stderr.contains("records dropped"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(&*String::from_utf8_lossy(&native.stdout)),
        "{stdout}"
    );
    let json: serde_json::Value = serde_json::from_str(&stdout[stdout.find('{').unwrap()..])
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let sum = json["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"].as_str() == Some(&format!("{child_name}!child_sum")))
        .unwrap_or_else(|| panic!("no {child_name}!child_sum in {}", json["functions"]));
    assert_eq!(sum["object"].as_str(), Some(child_name.as_str()), "{sum}");
    // The child's loads per IP: every record it sent, as Lackey counts them
    // (rows of loads implied by another also carry that one's count).
    let mut run_counts: std::collections::BTreeMap<u64, u64> = Default::default();
    for load in json["loads"].as_array().unwrap() {
        if load["object"].as_str() == Some(child_name.as_str()) {
            let ip = load["ip"].as_str().unwrap().trim_start_matches("0x");
            *run_counts
                .entry(u64::from_str_radix(ip, 16).unwrap())
                .or_default() += load["count"].as_u64().unwrap();
        }
    }
    let (ours, _, parent_records) = object_records(&trace, &child_name);
    let trace_counts: std::collections::BTreeMap<u64, u64> = ours
        .by_ip
        .iter()
        .map(|(&ip, addrs)| (ip, addrs.len() as u64))
        .collect();
    for (ip, n) in &trace_counts {
        assert_eq!(run_counts.get(ip), Some(n), "{ip:x}");
    }
    assert!(ours.totals.complete);
    assert_eq!(ours.totals.dropped.records, 0);
    assert!(parent_records >= 2000, "{parent_records}");
    let lackey = lackey(&child, &["3000"], None);
    let c = compare(
        &child_inst.annotation,
        &ours,
        &lackey,
        &escaped(&child_inst.report),
    );
    assert!(
        c.over.is_empty() && c.count_mismatches.is_empty(),
        "{:x?} {:x?}",
        c.over,
        c.count_mismatches
    );
    assert!(c.recorded as f64 >= 0.995 * c.lackey_loads as f64);
    let child_row = json["summary"]["coverage_by_object"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["object"].as_str() == Some(child_name.as_str()))
        .unwrap_or_else(|| {
            panic!(
                "no {child_name} in {}",
                json["summary"]["coverage_by_object"]
            )
        });
    assert_eq!(child_row["instrumented"], true, "{child_row}");
    assert_eq!(child_row["share"].as_f64(), Some(1.0), "{child_row}");
    assert_eq!(json["summary"]["coverage_dynamic"].as_f64(), Some(1.0));
    // The streamed analysis is the saved trace's.
    let analyzed = memgaze()
        .args(["analyze", "--format", "json"])
        .arg(&trace)
        .output()
        .unwrap();
    let from_file: serde_json::Value = serde_json::from_slice(&analyzed.stdout).unwrap();
    for key in ["functions", "loads"] {
        assert_eq!(json[key], from_file[key], "{key}");
    }
    assert_eq!(
        json["summary"]["coverage_by_object"],
        from_file["summary"]["coverage_by_object"]
    );

    // Without an annotation beside it, the child's records are dropped,
    // counted.
    let bare_dir = tempfile::tempdir().unwrap();
    let bare = bare_dir.path().join("bare_child");
    std::fs::copy(&child_inst.path, &bare).unwrap();
    let bare_trace = trace_path("run-exec-bare");
    let out = run(&bare, &bare_trace);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("1 process image(s) could not be filed under their program's loads"),
        "{stderr}"
    );
    let bare_totals = read_trace(&bare_trace).totals;
    assert!(!bare_totals.complete);
    assert!(
        bare_totals.dropped.records >= c.recorded,
        "{} dropped, the child sends {}",
        bare_totals.dropped.records,
        c.recorded
    );
}

/// `run` of a program that execs itself: the new image joins the analysis
/// as a process of its own (both images' loads, two threads), nothing
/// dropped.
#[test]
fn run_analyses_an_exec_of_the_same_instrumented_program() {
    let binary = build("exec_self.c", &["-O1"]);
    let analyse = |args: &[&str]| {
        let out = memgaze()
            .args(["run", "--full", "--libs", "none", "--format", "json", "--"])
            .arg(&binary)
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let json: serde_json::Value =
            serde_json::from_str(&stdout[stdout.find('{').unwrap()..]).unwrap();
        (json, stderr)
    };
    let (one, _) = analyse(&["second"]);
    let (both, stderr) = analyse(&[]);
    assert!(
        stderr.contains("1 exec'd instrumented program(s) joined the trace"),
        "{stderr}"
    );
    assert!(!stderr.contains("dropped"), "{stderr}");
    let records = |json: &serde_json::Value| json["summary"]["records"].as_u64().unwrap();
    assert_eq!(both["summary"]["threads"].as_u64(), Some(2));
    assert!(
        records(&both) >= 2 * records(&one) - 10,
        "{} vs 2 × {}",
        records(&both),
        records(&one)
    );
    assert_eq!(both["summary"]["coverage_dynamic"].as_f64(), Some(1.0));
}

#[test]
fn a_function_running_off_its_end_continues_into_the_next() {
    let program = build("fallthrough.c", &["-O2"]);
    let inst = instrument(&program, None, "fallthrough");
    let native = native(&program, &["1000"], None);
    assert_eq!(native.stdout, b"42000\n");
    // A copy that ran into its own probe stubs would loop for ever.
    let alone = Command::new("timeout")
        .arg("60")
        .arg(&inst.path)
        .arg("1000")
        .output()
        .unwrap();
    assert_same_behaviour(&native, &alone, "fallthrough alone");
    let trace = trace_path("fallthrough-full");
    let out = Command::new("timeout")
        .arg("60")
        .arg(env!("CARGO_BIN_EXE_cargo-memgaze"))
        .env("MEMGAZE_LIBS_CACHE", crate::support::LIBS_CACHE)
        .args(["record", "--full", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&inst.path)
        .arg("1000")
        .output()
        .unwrap();
    assert_same_behaviour(&native, &out, "fallthrough --full");
    // Both loads, the one before the fall and the one after it, once a
    // round.
    let full = read_trace(&trace);
    for name in ["load_then_add", "add_second"] {
        let function = inst
            .annotation
            .functions
            .iter()
            .position(|f| f.name == name)
            .unwrap_or_else(|| panic!("{name} not in the annotation"));
        let loads: Vec<u64> = inst
            .annotation
            .loads
            .iter()
            .filter(|l| l.function as usize == function && l.instrumented)
            .map(|l| l.ip)
            .collect();
        assert_eq!(loads.len(), 1, "{name}: loads {loads:x?}");
        let count = full.by_ip.get(&loads[0]).map_or(0, Vec::len);
        assert_eq!(count, 1000, "{name}: load at {:#x}", loads[0]);
    }
}

/// Forked children with libc instrumented: libc's own `fork` code runs in
/// the child before the fork hook does, finds the thread's slot wiped and
/// leaves a re-check countdown behind; a full trace must still record
/// every load of parent and children (the child's loads ran unrecorded as
/// a skip budget, counted as executions and not as drops).
#[test]
fn forked_children_are_recorded_whole_with_libc_instrumented() {
    let target = scratch().join("libc-fork-target");
    std::fs::create_dir_all(&target).unwrap();
    for source in ["fork.c", "fork_exit.c"] {
        let binary = build(source, &["-O2"]);
        let inst = instrument(&binary, None, "libc-fork");
        let native = native(&binary, &[], None);
        let trace = trace_path(&format!("libc-fork-{source}"));
        let out = Command::new("timeout")
            .arg("300")
            .arg(env!("CARGO_BIN_EXE_cargo-memgaze"))
            .env("MEMGAZE_LIBS_CACHE", crate::support::LIBS_CACHE)
            .args(["record", "--libs", "libc.so.6"])
            .args(FULL)
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(&inst.path)
            .stdin(std::process::Stdio::null())
            .env("CARGO_TARGET_DIR", &target)
            .output()
            .unwrap();
        assert_same_behaviour(&native, &out, &format!("{source}, libc instrumented"));
        let summary = read_trace(&trace);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(summary.totals.complete, "{source}: {stderr}");
        assert_eq!(summary.totals.dropped.records, 0, "{source}: {stderr}");
        assert!(
            summary.threads.len() >= 2,
            "{source}: {:?}",
            summary.threads
        );
        assert_eq!(
            summary.totals.executions, summary.totals.records,
            "{source}: {stderr}"
        );
    }
}

/// The behaviour corpus with libc instrumented too (`--libs libc.so.6`):
/// C at -O2, Rust threads and panics, fork, signal handlers, C++
/// exceptions, dash's children, gzip and sort; the same stdout and exit
/// status as the program alone, sampled and full.
#[test]
fn the_corpus_behaves_with_libc_instrumented() {
    // The instrumented libc is made once, cached here.
    let target = scratch().join("libc-corpus-target");
    std::fs::create_dir_all(&target).unwrap();
    let text = text_input("libc-corpus.txt", 6_000);
    let text = text.to_str().unwrap();
    let dash_script = "x=$(echo hi); (exit 3); echo $? $x; /bin/echo ext; echo $(printf '%05d' 42)";
    let cases: Vec<(std::path::PathBuf, Vec<&str>)> = vec![
        (build("kernels.c", &["-O2", "-g"]), vec!["3"]),
        (build("threads.rs", &[]), vec![]),
        (
            build("panics.rs", &["-C", "debuginfo=line-tables-only"]),
            vec![],
        ),
        (build("fork.c", &["-O2"]), vec![]),
        (build("signals.c", &["-O1"]), vec![]),
        (build("cxx.cpp", &["-O2"]), vec![]),
        (system_binary("dash"), vec!["-c", dash_script]),
        (system_binary("gzip"), vec!["-9", "-c", text]),
        (system_binary("sort"), vec![text]),
    ];
    for (binary, args) in &cases {
        let inst = instrument(binary, None, "libc-corpus");
        let native = native(binary, args, None);
        for (sampling, name) in [(FULL, "full"), (SAMPLED, "sampled")] {
            let out = Command::new("timeout")
                .arg("300")
                .arg(env!("CARGO_BIN_EXE_cargo-memgaze"))
                .env("MEMGAZE_LIBS_CACHE", crate::support::LIBS_CACHE)
                .args(["record", "--libs", "libc.so.6"])
                .args(sampling)
                .arg("-o")
                .arg(trace_path(&format!("libc-corpus-{name}")))
                .arg("--")
                .arg(&inst.path)
                .args(args)
                .stdin(std::process::Stdio::null())
                .env("CARGO_TARGET_DIR", &target)
                .output()
                .unwrap();
            let what = format!("{} {args:?} {name}, libc instrumented", binary.display());
            assert_same_behaviour(&native, &out, &what);
        }
    }
}

/// A constant table in `.text` between functions, in a stripped binary:
/// only the gap scan finds it, and its bytes decode as code. The rewriter
/// copies such gap "functions" but never writes into their original bytes
/// (an entry patch inside the table changed the program's result, as in
/// OpenSSL's SHA-256, whose constants sit between its functions): the
/// instrumented program prints the same table sum, sampled and full, and
/// the report counts the gap functions left unpatched.
#[test]
fn a_table_in_text_found_by_the_gap_scan_is_left_unpatched() {
    let binary = build("text_table.c", &["-O2", "-s"]);
    let inst = instrument(&binary, None, "all");
    let unpatched = inst.report["gap_entries_unpatched"].as_u64().unwrap();
    assert!(unpatched >= 1, "{}", inst.report);
    let native = native(&binary, &[], None);
    for (sampling, name) in [(FULL_EXE, "full"), (SAMPLED_EXE, "sampled")] {
        let trace = trace_path(&format!("text-table-{name}"));
        let out = record(&inst.path, &[], sampling, &trace, None);
        assert_same_behaviour(&native, &out, &format!("text_table {name}"));
    }
}

/// `rorx r64, r64, 6` (VEX.LZ.F2.0F3A.W1 F0 /r ib) in `bytes`, any registers.
fn rorx_by_6_count(bytes: &[u8]) -> usize {
    bytes
        .windows(6)
        .filter(|w| w[0] == 0xc4 && w[1] & 0x1f == 3 && w[2] == 0xfb && w[3] == 0xf0)
        .filter(|w| w[4] >= 0xc0 && w[5] == 6)
        .count()
}

/// `MEMGAZE_SPATIAL_BMI2` decides the spatial checks' form: `0` keeps the
/// baseline `lea; shr` (no `rorx`, no CPU test, nothing in the annotation),
/// `1` takes the block of a load through one register with `rorx` (the
/// annotation lists `bmi2`, the segment header masks BMI2's CPUID bit);
/// both copies behave as the original and record the same records. A copy
/// whose CPU lacks a feature in the mask (here a reserved CPUID bit no CPU
/// sets, patched into the header: a CPU without BMI2 as the copy sees it)
/// refuses to run before the program does, in one line with exit 1.
#[test]
fn spatial_bmi2_knob_chooses_the_check_form_and_a_cpu_without_it_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let binary = build("bench_kernels.c", &["-O2"]);
    let args = ["irr", "20000", "2"];
    let copy = |knob: &str| {
        let output = scratch().join(format!("bench_kernels.bmi2-{knob}.instrumented"));
        run_ok(
            memgaze()
                .env("MEMGAZE_SPATIAL_BMI2", knob)
                .args(["instrument", "--annotation-format", "json"])
                .arg(&binary)
                .arg("-o")
                .arg(&output),
        );
        let bytes = std::fs::read(&output).unwrap();
        let annotation = std::fs::read(format!("{}.memgaze.json", output.display())).unwrap();
        let annotation: serde_json::Value = serde_json::from_slice(&annotation).unwrap();
        let signature = b"cargo-memgaze instrumented v1\0";
        let header = bytes
            .windows(signature.len())
            .position(|w| w == signature)
            .expect("the segment's signature");
        let mask = u32::from_le_bytes(bytes[header + 48..header + 52].try_into().unwrap());
        (
            output,
            bytes,
            annotation["cpu_features"].clone(),
            mask,
            header,
        )
    };
    let (baseline, baseline_bytes, baseline_features, baseline_mask, _) = copy("0");
    assert_eq!(rorx_by_6_count(&baseline_bytes), 0);
    assert_eq!(baseline_features, serde_json::Value::Null);
    assert_eq!(baseline_mask, 0);
    let (bmi2, bmi2_bytes, bmi2_features, bmi2_mask, header) = copy("1");
    // Every check of the kernels' loops: `[rdi]`, `[rsi]`, `[rax]`.
    assert!(rorx_by_6_count(&bmi2_bytes) >= 3);
    assert_eq!(bmi2_features, serde_json::json!(["bmi2"]));
    assert_eq!(bmi2_mask, 1 << 8);

    let original = native(&binary, &args, None);
    if std::is_x86_feature_detected!("bmi2") {
        for (copy, tag) in [(&baseline, "bmi2-0"), (&bmi2, "bmi2-1")] {
            assert_same_behaviour(&original, &native(copy, &args, None), tag);
        }
        for sampling in [FULL_EXE, SAMPLED_EXE] {
            let sampling = [sampling, &["--spatial-rate", "1/8"]].concat();
            let traces: Vec<_> = [(&baseline, "bmi2-0"), (&bmi2, "bmi2-1")]
                .into_iter()
                .map(|(copy, tag)| {
                    let trace = trace_path(tag);
                    let out = record(copy, &args, &sampling, &trace, None);
                    assert_same_behaviour(&original, &out, tag);
                    read_trace(&trace).by_ip
                })
                .collect();
            assert!(!traces[0].is_empty());
            assert_eq!(traces[0], traces[1], "{sampling:?}");
        }
    } else {
        one_error_line(&native(&bmi2, &args, None));
    }

    // Bit 22 of CPUID leaf 7 ebx is reserved: no CPU has it.
    let mut refused_bytes = bmi2_bytes.clone();
    let mask = bmi2_mask | 1 << 22;
    refused_bytes[header + 48..header + 52].copy_from_slice(&mask.to_le_bytes());
    let refused = scratch().join("bench_kernels.bmi2-refused.instrumented");
    std::fs::write(&refused, &refused_bytes).unwrap();
    std::fs::set_permissions(&refused, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = native(&refused, &args, None);
    let line = one_error_line(&out);
    assert!(line.contains("BMI2"), "{line}");
    assert!(out.stdout.is_empty(), "the program ran");

    // `record` reads the annotation's features first: one line of its own.
    let unknown = scratch().join("bench_kernels.bmi2-unknown.instrumented");
    std::fs::copy(&bmi2, &unknown).unwrap();
    let annotation = std::fs::read(format!("{}.memgaze.json", bmi2.display())).unwrap();
    let mut annotation: serde_json::Value = serde_json::from_slice(&annotation).unwrap();
    annotation["cpu_features"] = serde_json::json!(["bmi2", "avx1024"]);
    std::fs::write(
        format!("{}.memgaze.json", unknown.display()),
        annotation.to_string(),
    )
    .unwrap();
    let out = record(
        &unknown,
        &args,
        SAMPLED_EXE,
        &trace_path("bmi2-unknown"),
        None,
    );
    let line = one_error_line(&out);
    assert!(line.contains("avx1024, which this CPU lacks"), "{line}");
    assert!(out.stdout.is_empty(), "the program ran");
}
