//! Argument combinations the command contract (docs/CLI.md) refuses, each
//! through the built binary: one `error:` line naming what is wrong and the
//! contract's exit code, and no input or output harmed.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Output;
use support::synthetic::{Kernel, Synthetic, write_trace};

fn memgaze(args: &[&std::ffi::OsStr]) -> Output {
    crate::support::memgaze_command()
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

/// The one `error:` line of a failed command, after checking the exit code.
fn error_line(out: &Output, code: i32) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    errors[0].to_string()
}

fn small_elf(dir: &Path) -> PathBuf {
    let system = ["/usr/bin/true", "/bin/true"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("/usr/bin/true");
    let copy = dir.join("prog");
    std::fs::copy(system, &copy).unwrap();
    copy
}

/// A small synthetic trace `t.mgz` in `dir` (`sampling` as in
/// [`Synthetic`]; `None`: a full trace).
fn small_trace(dir: &Path, sampling: Option<(u64, u64)>) -> PathBuf {
    let trace = dir.join("t.mgz");
    write_trace(
        &trace,
        &Synthetic {
            kernel: Kernel::Str1,
            elements: 1_000,
            reps: 2,
            sampling,
            seed: 1,
        },
    );
    trace
}

/// `instrument -o` naming the input (by another spelling, or a hard link
/// to it) would replace the original with its instrumented copy: usage
/// error, the original untouched.
#[test]
fn instrument_refuses_an_output_that_is_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let elf = small_elf(dir.path());
    let original = std::fs::read(&elf).unwrap();
    let link = dir.path().join("link");
    std::fs::hard_link(&elf, &link).unwrap();
    let respelled = dir.path().join(".").join("prog");
    for output in [&elf, &respelled, &link] {
        let out = memgaze(&[
            "instrument".as_ref(),
            elf.as_os_str(),
            "-o".as_ref(),
            output.as_os_str(),
        ]);
        let line = error_line(&out, 2);
        assert!(line.contains("names the input itself"), "{line}");
        assert_eq!(std::fs::read(&elf).unwrap(), original);
    }
    assert!(!dir.path().join("prog.memgaze.json").exists());
}

/// A `--functions` glob that does not parse is bad usage (exit 2) for
/// `analyze` as for `classify` and `instrument`, trace or Lackey log.
#[test]
fn analyze_refuses_a_glob_that_does_not_parse_as_usage() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path(), Some((256, 2_048)));
    let out = memgaze(&[
        "analyze".as_ref(),
        trace.as_os_str(),
        "--functions".as_ref(),
        "[".as_ref(),
    ]);
    let line = error_line(&out, 2);
    assert!(line.contains("--functions \"[\""), "{line}");
    let elf = small_elf(dir.path());
    let out = memgaze(&[
        "analyze".as_ref(),
        "--lackey".as_ref(),
        trace.as_os_str(),
        "--binary".as_ref(),
        elf.as_os_str(),
        "--functions".as_ref(),
        "a[".as_ref(),
    ]);
    error_line(&out, 2);
}

/// A trace output that is a directory or lies in a missing one is refused
/// before anything is instrumented or run, in one line naming it once
/// (`record -o`, `run --save-trace`).
#[test]
fn trace_outputs_that_cannot_be_written_are_refused_first_naming_them_once() {
    let dir = tempfile::tempdir().unwrap();
    let elf = small_elf(dir.path());
    let instrumented = dir.path().join("prog-i");
    let out = memgaze(&[
        "instrument".as_ref(),
        "-q".as_ref(),
        elf.as_os_str(),
        "-o".as_ref(),
        instrumented.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a_directory = dir.path().join("traces");
    std::fs::create_dir(&a_directory).unwrap();
    let in_a_missing_directory = dir.path().join("missing").join("t.trace");
    for output in [&a_directory, &in_a_missing_directory] {
        let record = memgaze(&[
            "record".as_ref(),
            "--libs".as_ref(),
            "none".as_ref(),
            "-o".as_ref(),
            output.as_os_str(),
            "--".as_ref(),
            instrumented.as_os_str(),
        ]);
        let run = memgaze(&[
            "run".as_ref(),
            "--libs".as_ref(),
            "none".as_ref(),
            "--save-trace".as_ref(),
            output.as_os_str(),
            "--".as_ref(),
            elf.as_os_str(),
        ]);
        for out in [record, run] {
            let line = error_line(&out, 1);
            let name = output.display().to_string();
            assert_eq!(line.matches(&name).count(), 1, "{line}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!err.contains("instrumenting"), "{err}");
        }
    }
    assert!(!in_a_missing_directory.parent().unwrap().exists());
}

/// A `--golden-dir` that cannot hold snapshots is refused before cargo
/// builds anything: outside any cargo project the error is still about
/// the directory, not the missing manifest.
#[test]
fn golden_and_validate_refuse_a_bad_golden_dir_before_building() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let missing = dir.path().join("missing");
    for (command, golden_dir, problem) in [
        ("golden", &file, "is not a directory"),
        ("validate", &file, "is not a directory"),
        ("validate", &missing, "does not exist"),
    ] {
        let out = crate::support::memgaze_command()
            .args([command, "--golden-dir"])
            .arg(golden_dir)
            .current_dir(dir.path())
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        let line = error_line(&out, 1);
        assert!(
            line.contains(&format!(
                "golden snapshot directory {}",
                golden_dir.display()
            )) && line.contains(problem),
            "{command}: {line}"
        );
    }
}

/// `report -o` naming an existing file: one line saying it is not a
/// directory (the report is a directory), the file untouched.
#[test]
fn report_refuses_an_output_that_is_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path(), None);
    let file = dir.path().join("taken");
    std::fs::write(&file, b"keep").unwrap();
    let out = memgaze(&[
        "report".as_ref(),
        trace.as_os_str(),
        "-o".as_ref(),
        file.as_os_str(),
    ]);
    let line = error_line(&out, 1);
    assert!(
        line.contains(&format!("{}: not a directory", file.display())),
        "{line}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
}

/// `run prog | head`: the reader closing the pipe is normal use. The
/// program dies of SIGPIPE and `run` exits with its status (141, as with
/// `--output`), with no `error:` line for the analysis it could not print
/// (it used to fail with `error: Broken pipe`, exit 1).
#[test]
fn run_into_a_closed_pipe_exits_like_the_program() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let yes = ["/usr/bin/yes", "/bin/yes"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("/usr/bin/yes");
    let mut child = crate::support::memgaze_command()
        .args(["memgaze", "run", "-q", "--libs", "none", "--"])
        .arg(&yes)
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 4];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    assert_eq!(&first, b"y\ny\n");
    // The pipe's reader is gone once `stdout` is dropped above.
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("error"), "{err}");
    assert_eq!(out.status.code(), Some(128 + 13), "{err}");
}

/// A program this user may not execute is refused by `run` as `execve`
/// would refuse it, in one line naming it, before anything is instrumented
/// (the instrumented copy used to run where the original could not); a
/// bare name skips such a file on `PATH`, as a shell does.
#[test]
fn run_refuses_a_program_that_is_not_executable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let not_executable = small_elf(dir.path());
    std::fs::set_permissions(&not_executable, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = memgaze(&[
        "run".as_ref(),
        "--libs".as_ref(),
        "none".as_ref(),
        "--".as_ref(),
        not_executable.as_os_str(),
    ]);
    let line = error_line(&out, 1);
    assert!(
        line.contains(&not_executable.display().to_string()) && line.contains("not executable"),
        "{line}"
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("instrumenting"));

    // First on PATH: a copy of `true` nobody may execute; then `false`.
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    std::fs::create_dir_all(&first).unwrap();
    std::fs::create_dir_all(&second).unwrap();
    std::fs::rename(&not_executable, first.join("mgprog")).unwrap();
    let system_false = ["/usr/bin/false", "/bin/false"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("/usr/bin/false");
    std::fs::copy(system_false, second.join("mgprog")).unwrap();
    let path = std::env::join_paths([&first, &second]).unwrap();
    let out = crate::support::memgaze_command()
        .args(["run", "-q", "--libs", "none", "--", "mgprog"])
        .env("PATH", path)
        .env("NO_COLOR", "1")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("error"), "{err}");
    assert_eq!(out.status.code(), Some(1), "`false` ran: {err}");
}

/// `--cache-sizes` on every command that analyses (`analyze`, `run`,
/// `bench`, `report`): one parser, one `error:` line naming the value and
/// exit 2 for a bad one.
#[test]
fn every_analysing_command_takes_cache_sizes_and_refuses_a_bad_one() {
    for command in [
        &["analyze", "t.mgz"][..],
        &["run", "--", "true"],
        &["bench"],
        &["report", "t.mgz"],
    ] {
        let head = [command[0], "--cache-sizes", "banana"];
        let args: Vec<&std::ffi::OsStr> = head
            .iter()
            .chain(&command[1..])
            .map(std::ffi::OsStr::new)
            .collect();
        let line = error_line(&memgaze(&args), 2);
        assert!(
            line.contains("'banana' for '--cache-sizes") && line.contains("48K,2M,32M"),
            "{command:?}: {line}"
        );
    }
}

/// `run --cache-sizes` reads the whole-run miss ratios at the given sizes.
#[test]
fn run_reads_miss_ratios_at_the_given_cache_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let elf = small_elf(dir.path());
    let out = memgaze(&[
        "run".as_ref(),
        "-q".as_ref(),
        "--libs".as_ref(),
        "none".as_ref(),
        "--full".as_ref(),
        "--format".as_ref(),
        "json".as_ref(),
        "--cache-sizes".as_ref(),
        "20K,300K,5M".as_ref(),
        "--".as_ref(),
        elf.as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sizes = &json["run"]["cache_sizes"];
    assert_eq!(
        (&sizes["L1"], &sizes["L2"], &sizes["LLC"], &sizes["source"]),
        (
            &serde_json::json!(20 << 10),
            &serde_json::json!(300 << 10),
            &serde_json::json!(5 << 20),
            &serde_json::json!("--cache-sizes")
        ),
        "{sizes}"
    );
}

/// `report --cache-sizes`: a trace is analysed at the sizes (a bench
/// directory's trace in place of its analysis); an analysis JSON is shown
/// only if it was analysed at them, else refused in one line (exit 2): its
/// per-line miss estimates cannot be read again at other sizes.
#[test]
fn report_analyses_traces_at_the_given_cache_sizes_and_refuses_other_analyses() {
    let dir = tempfile::tempdir().unwrap();
    let bench = dir.path().join("bench");
    std::fs::create_dir(&bench).unwrap();
    let trace = small_trace(&bench, None);
    std::fs::rename(&trace, bench.join("trace.mgz")).unwrap();
    let trace = bench.join("trace.mgz");
    let analysis = bench.join("analysis.json");
    let analyse = memgaze(&[
        "analyze".as_ref(),
        trace.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
        "--cache-sizes".as_ref(),
        "20K,300K,5M".as_ref(),
        "-o".as_ref(),
        analysis.as_os_str(),
    ]);
    assert_eq!(analyse.status.code(), Some(0));
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&analysis).unwrap()).unwrap();
    assert_eq!(json["run"]["cache_sizes"]["L2"], 300 << 10);

    let report = |input: &Path, out: &str, sizes: &str| {
        memgaze(&[
            "report".as_ref(),
            input.as_os_str(),
            "-o".as_ref(),
            dir.path().join(out).as_os_str(),
            "--cache-sizes".as_ref(),
            sizes.as_ref(),
        ])
    };
    for input in [&analysis, &bench] {
        let out = report(input, "same", "20K,300K,5M");
        assert_eq!(out.status.code(), Some(0), "{input:?}");
    }
    // The bench directory's trace is analysed at the other sizes; its
    // analysis alone is refused.
    let out = report(&bench, "dir", "32K,1M,16M");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    std::fs::rename(&trace, dir.path().join("moved.mgz")).unwrap();
    for input in [&analysis, &bench] {
        let line = error_line(&report(input, "other", "32K,1M,16M"), 2);
        assert!(
            line.contains(&analysis.display().to_string())
                && line.contains("analysed at cache sizes 20480/307200/5242880 B"),
            "{line}"
        );
    }
    assert!(!dir.path().join("other").exists());
}
