//! Overhead of the software recorder and speed of the rewriter.
//!
//! `cargo bench -p cargo-memgaze --bench overhead [-- --reps N] [--kernels-only] [--libs GLOBS] [--escape-checks]`
//!
//! With `--libs GLOBS` (as `cargo memgaze record --libs` takes them, e.g.
//! `libc.so.6` or `default`) it measures only recording with those
//! libraries instrumented: per repetition, the native kernel, `cargo
//! memgaze record -q` (default sampling) of the instrumented kernels
//! without and with `--libs GLOBS` (the instrumented libraries cached
//! beforehand), and the native kernel again, for the strided and irregular
//! kernels and for `libc_strings.c` (copies, comparisons and scans of 32
//! MiB buffers, mostly libc). These ratios include the command's whole
//! cost (start-up, the libraries' annotations and trace header, the
//! trace's end), as a user pays it.
//!
//! Reports, as ratios measured in the same run (median and min–max over
//! interleaved repetitions, so a busy machine affects both sides alike):
//! - instrumented/native run time of a strided and an irregular kernel
//!   (`crates/memgaze-fixtures/fixtures/rewriter/bench_kernels.c`, gcc -O2, volatile scalar
//!   loads) at the default sampling (w = 1000 per 100 000 executions, ≈1%,
//!   and spatial samples of 1/128 of the blocks), at the same without
//!   spatial samples (`--spatial-rate 0`), and in full-trace mode, all
//!   including the collector writing the trace file; as wall time and as
//!   the program's CPU time (user + system of the child, which the
//!   collector's own work on another core does not inflate); and the
//!   default recording's records (time samples and spatial) as a share of
//!   the full trace's;
//! - with `MEMGAZE_BENCH_BASELINE=PATH` (an instrumented copy of the same
//!   kernels made by another build, e.g. main's `cargo memgaze instrument
//!   bench_kernels -o PATH`, its annotation beside it), the same default and
//!   rate-0 recordings of that copy in every repetition, and this build's
//!   run time against it;
//! - `valgrind --tool=lackey --trace-mem=yes` on the same kernels (smaller
//!   input), against the native and the full-trace run;
//! - with `--escape-checks`, only this: recording (default sampling) of
//!   programs with indirect jumps, instrumented with and without escape
//!   checks (`MEMGAZE_NO_ESCAPE_CHECKS=1`), against native in the same
//!   repetitions: the computed-goto interpreter fixture (`interp.c`),
//!   `python3` on a dict/list script (`PYTHONHASHSEED=0`) and `lua5.4` on
//!   a table script when installed; each copy's escape checks counted;
//! - instrumentation time of a Rust binary with ~2 MB of code
//!   (`bench_big.rs`, built once and cached) against `objdump -d` of the
//!   same file.

use memgaze_metadata::annotation::InstrumentationMode;
use memgaze_record as record;
use memgaze_trace::{Sampling, SpatialSampling, TraceTotals, TraceWriter};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    memgaze_fixtures::fixtures().join("rewriter").join(name)
}

/// The bench's scratch directory, in cargo's target directory (wherever
/// `CARGO_TARGET_DIR` puts it), not the workspace's.
fn work_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("memgaze-bench");
    std::fs::create_dir_all(&dir).expect("bench directory");
    dir
}

fn run_ok(cmd: &mut Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed: {status}");
}

/// CPU time (user + system) of all waited-for children so far.
fn children_cpu() -> Duration {
    // SAFETY: getrusage fills the struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[derive(Clone, Copy)]
struct Timing {
    wall: Duration,
    cpu: Duration,
}

fn native(program: &Path, args: &[&str]) -> Timing {
    let cpu = children_cpu();
    let start = Instant::now();
    run_ok(
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    Timing {
        wall: start.elapsed(),
        cpu: children_cpu() - cpu,
    }
}

fn recorded(
    program: &Path,
    args: &[&str],
    annotation: &memgaze_metadata::annotation::Annotation,
    sampling: Sampling,
    spatial: Option<SpatialSampling>,
    trace: &Path,
) -> (Timing, TraceTotals) {
    let args: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    let mut header = record::trace_header(annotation, sampling, vec![]);
    header.spatial = spatial;
    // The program inherits our stdout: point it at /dev/null meanwhile.
    let _quiet = QuietStdout::new();
    let cpu = children_cpu();
    let start = Instant::now();
    let mut writer = TraceWriter::create(trace, &header).expect("trace file");
    let recording = record::record(
        program,
        &args,
        annotation,
        &sampling,
        spatial,
        &mut writer,
        &Default::default(),
    )
    .expect("record");
    writer
        .finish(&recording.totals)
        .expect("trace footer")
        .commit()
        .expect("trace file");
    let wall = start.elapsed();
    assert_eq!(recording.exit_code(), 0);
    let timing = Timing {
        wall,
        cpu: children_cpu() - cpu,
    };
    // The kernel's writeback of the trace (hundreds of MB for a full
    // trace) would otherwise take a core from whichever run comes next.
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
    (timing, recording.totals)
}

/// The default sampling of the recorder.
fn default_sampling() -> Sampling {
    Sampling {
        window: record::DEFAULT_WINDOW,
        period: record::DEFAULT_PERIOD,
        seed: Some(1),
    }
}

/// Redirects file descriptor 1 to /dev/null until dropped.
struct QuietStdout(i32);

impl QuietStdout {
    fn new() -> Self {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        // SAFETY: plain descriptor juggling on fds we own.
        unsafe {
            let saved = libc::dup(1);
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
            libc::dup2(null, 1);
            libc::close(null);
            QuietStdout(saved)
        }
    }
}

impl Drop for QuietStdout {
    fn drop(&mut self) {
        // SAFETY: restores the saved descriptor.
        unsafe {
            libc::dup2(self.0, 1);
            libc::close(self.0);
        }
    }
}

fn lackey(program: &Path, args: &[&str]) -> Timing {
    let cpu = children_cpu();
    let start = Instant::now();
    run_ok(
        Command::new("valgrind")
            .args(["--tool=lackey", "--trace-mem=yes", "--log-file=/dev/null"])
            .arg(program)
            .args(args)
            .stdout(Stdio::null()),
    );
    Timing {
        wall: start.elapsed(),
        cpu: children_cpu() - cpu,
    }
}

/// Median, min and max of ratios.
fn summary(ratios: Vec<f64>) -> String {
    summary_of(ratios, "×")
}

fn summary_of(mut ratios: Vec<f64>, unit: &str) -> String {
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    format!(
        "{median:7.2}{unit}  ({:.2}–{:.2}, n = {})",
        ratios[0],
        ratios[ratios.len() - 1],
        ratios.len()
    )
}

/// The programs one kernel row runs.
struct Subjects<'a> {
    native: &'a Path,
    instrumented: &'a Path,
    annotation: &'a memgaze_metadata::annotation::Annotation,
    baseline: Option<&'a (PathBuf, memgaze_metadata::annotation::Annotation)>,
    trace: &'a Path,
}

/// Runs and prints one kernel's rows: `reps` interleaved repetitions.
fn kernel_rows(
    subjects: &Subjects<'_>,
    (kernel, elements, reps_inner): (&str, &str, &str),
    reps: usize,
    spatial: Option<SpatialSampling>,
) {
    let Subjects {
        native: kernels,
        instrumented,
        annotation,
        baseline,
        trace,
    } = *subjects;
    let args = [kernel, elements, reps_inner];
    let mut sampled = (Vec::new(), Vec::new());
    let mut plain = (Vec::new(), Vec::new());
    let mut vs_plain = (Vec::new(), Vec::new());
    let mut full = (Vec::new(), Vec::new());
    let mut share = Vec::new();
    let mut base_rows: [(Vec<f64>, Vec<f64>); 4] = Default::default();
    for _ in 0..reps {
        let n = native(kernels, &args);
        let (s, totals) = recorded(
            instrumented,
            &args,
            annotation,
            default_sampling(),
            spatial,
            trace,
        );
        let (p, _) = recorded(
            instrumented,
            &args,
            annotation,
            default_sampling(),
            None,
            trace,
        );
        let n2 = native(kernels, &args);
        let (f, full_totals) = recorded(
            instrumented,
            &args,
            annotation,
            Sampling::full(),
            None,
            trace,
        );
        let base_wall = (n.wall + n2.wall).as_secs_f64() / 2.0;
        let base_cpu = (n.cpu + n2.cpu).as_secs_f64() / 2.0;
        if let Some((program, annotation)) = &baseline {
            let (bs, _) = recorded(
                program,
                &args,
                annotation,
                default_sampling(),
                spatial,
                trace,
            );
            let (bp, _) = recorded(program, &args, annotation, default_sampling(), None, trace);
            // Against native (the two native runs' mean), then this
            // build against the baseline in the same repetition.
            let ratios = [
                (
                    bs.wall.as_secs_f64() / base_wall,
                    bs.cpu.as_secs_f64() / base_cpu,
                ),
                (
                    bp.wall.as_secs_f64() / base_wall,
                    bp.cpu.as_secs_f64() / base_cpu,
                ),
                (
                    s.wall.as_secs_f64() / bs.wall.as_secs_f64(),
                    s.cpu.as_secs_f64() / bs.cpu.as_secs_f64(),
                ),
                (
                    p.wall.as_secs_f64() / bp.wall.as_secs_f64(),
                    p.cpu.as_secs_f64() / bp.cpu.as_secs_f64(),
                ),
            ];
            for (row, (wall, cpu)) in base_rows.iter_mut().zip(ratios) {
                row.0.push(wall);
                row.1.push(cpu);
            }
        }
        sampled.0.push(s.wall.as_secs_f64() / base_wall);
        sampled.1.push(s.cpu.as_secs_f64() / base_cpu);
        plain.0.push(p.wall.as_secs_f64() / base_wall);
        plain.1.push(p.cpu.as_secs_f64() / base_cpu);
        vs_plain.0.push(s.wall.as_secs_f64() / p.wall.as_secs_f64());
        vs_plain.1.push(s.cpu.as_secs_f64() / p.cpu.as_secs_f64());
        full.0.push(f.wall.as_secs_f64() / base_wall);
        full.1.push(f.cpu.as_secs_f64() / base_cpu);
        share.push(
            100.0 * (totals.records + totals.spatial_records) as f64 / full_totals.records as f64,
        );
    }
    let loads = if kernel == "str" { "1" } else { "2" };
    println!(
        "  {kernel} ({elements} elements × {reps_inner}, {loads} load/iteration)\n    default (1% + spatial 1/128)  wall {}   cpu {}\n    spatial rate 0                wall {}   cpu {}\n    default / spatial rate 0      wall {}   cpu {}\n    full trace                    wall {}   cpu {}\n    default records / full trace's: {}",
        summary(sampled.0),
        summary(sampled.1),
        summary(plain.0),
        summary(plain.1),
        summary(vs_plain.0),
        summary(vs_plain.1),
        summary(full.0),
        summary(full.1),
        summary_of(share, "%")
    );
    if baseline.is_some() {
        let labels = [
            "baseline default              ",
            "baseline spatial rate 0       ",
            "default / baseline default    ",
            "rate 0 / baseline rate 0      ",
        ];
        for (label, (wall, cpu)) in labels.into_iter().zip(base_rows) {
            println!("    {label}wall {}   cpu {}", summary(wall), summary(cpu));
        }
    }
}

/// Runs `cargo memgaze record -q [--libs GLOBS]` of `program` (cargo
/// memgaze's cache of instrumented libraries under `cache_root`).
fn cli_recorded(
    program: &Path,
    args: &[&str],
    libs: Option<&str>,
    trace: &Path,
    cache_root: &Path,
) -> Timing {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cargo-memgaze"));
    command.args(["record", "-q", "-o"]).arg(trace);
    if let Some(libs) = libs {
        command.args(["--libs", libs]);
    }
    command
        .arg("--")
        .arg(program)
        .args(args)
        .env("CARGO_TARGET_DIR", cache_root)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let cpu = children_cpu();
    let start = Instant::now();
    run_ok(&mut command);
    Timing {
        wall: start.elapsed(),
        cpu: children_cpu() - cpu,
    }
}

/// `--libs GLOBS`: one kernel's rows, recorded through the command with
/// and without the libraries, against native in the same repetitions.
fn libs_rows(
    (native_program, instrumented): (&Path, &Path),
    args: &[&str],
    libs: &str,
    reps: usize,
    (trace, cache_root): (&Path, &Path),
) {
    // Fills the library cache (and the site cache) outside the timing.
    cli_recorded(instrumented, args, Some(libs), trace, cache_root);
    cli_recorded(instrumented, args, None, trace, cache_root);
    let mut exe_only = (Vec::new(), Vec::new());
    let mut with_libs = (Vec::new(), Vec::new());
    let mut libs_vs_exe = (Vec::new(), Vec::new());
    let mut native_cpu = Vec::new();
    for _ in 0..reps {
        let n = native(native_program, args);
        let e = cli_recorded(instrumented, args, None, trace, cache_root);
        let l = cli_recorded(instrumented, args, Some(libs), trace, cache_root);
        let n2 = native(native_program, args);
        let base_wall = (n.wall + n2.wall).as_secs_f64() / 2.0;
        let base_cpu = (n.cpu + n2.cpu).as_secs_f64() / 2.0;
        native_cpu.push(base_cpu);
        exe_only.0.push(e.wall.as_secs_f64() / base_wall);
        exe_only.1.push(e.cpu.as_secs_f64() / base_cpu);
        with_libs.0.push(l.wall.as_secs_f64() / base_wall);
        with_libs.1.push(l.cpu.as_secs_f64() / base_cpu);
        libs_vs_exe
            .0
            .push(l.wall.as_secs_f64() / e.wall.as_secs_f64());
        libs_vs_exe
            .1
            .push(l.cpu.as_secs_f64() / e.cpu.as_secs_f64());
    }
    println!(
        "  {} (native CPU {})\n    record, executable only      wall {}   cpu {}\n    record --libs {libs:<14} wall {}   cpu {}\n    --libs / executable only     wall {}   cpu {}",
        args.join(" "),
        summary_of(native_cpu, " s"),
        summary(exe_only.0),
        summary(exe_only.1),
        summary(with_libs.0),
        summary(with_libs.1),
        summary(libs_vs_exe.0),
        summary(libs_vs_exe.1),
    );
}

/// `--libs GLOBS`: the kernels and `libc_strings.c` recorded with those
/// libraries instrumented.
fn libs_section(dir: &Path, (kernels, instrumented): (&Path, &Path), libs: &str, reps: usize) {
    let strings = dir.join("libc_strings");
    run_ok(
        Command::new("gcc")
            .args(["-O2", "-g", "-o"])
            .arg(&strings)
            .arg(fixture("libc_strings.c")),
    );
    let strings_instrumented = dir.join("libc_strings.instrumented");
    memgaze_instrument::instrument_file(
        &strings,
        &strings_instrumented,
        None,
        InstrumentationMode::Soft,
    )
    .expect("instrument libc_strings");
    let trace = dir.join("bench-libs.trace");
    println!(
        "cargo memgaze overhead benchmark, libraries `{libs}` instrumented ({reps} interleaved repetitions per row)\n"
    );
    println!(
        "`cargo memgaze record -q` (default sampling) / native, median (min–max); CPU = user + system of the command and the program"
    );
    for args in [["str", "4000000", "25"], ["irr", "4000000", "10"]] {
        libs_rows((kernels, instrumented), &args, libs, reps, (&trace, dir));
    }
    libs_rows(
        (&strings, &strings_instrumented),
        &["33554432"],
        libs,
        reps,
        (&trace, dir),
    );
}

/// Instruments `program` into `output` through `cargo memgaze instrument`,
/// with or without escape checks; returns the annotation and the number
/// of escape checks the rewriter reported.
fn instrument_cli(
    program: &Path,
    output: &Path,
    escape_checks: bool,
) -> (memgaze_metadata::annotation::Annotation, u64) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cargo-memgaze"));
    command
        .args(["instrument", "-q", "--format", "json"])
        .arg(program)
        .arg("-o")
        .arg(output)
        .env_remove("MEMGAZE_NO_ESCAPE_CHECKS");
    if !escape_checks {
        command.env("MEMGAZE_NO_ESCAPE_CHECKS", "1");
    }
    let out = command.output().expect("run cargo memgaze instrument");
    assert!(
        out.status.success(),
        "instrument {}: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    let checks = report["escape_checks"].as_u64().expect("escape_checks");
    let annotation = memgaze_instrument::rewrite::read_annotation(output).expect("annotation");
    (annotation, checks)
}

/// `--escape-checks`: one program's row, recorded with and without escape
/// checks, against native in the same repetitions.
fn escape_rows(label: &str, program: &Path, args: &[&str], dir: &Path, reps: usize) {
    let name = program.file_name().unwrap().to_string_lossy().into_owned();
    let checked = dir.join(format!("{name}.escape-checks"));
    let unchecked = dir.join(format!("{name}.no-escape-checks"));
    let (checked_annotation, checks) = instrument_cli(program, &checked, true);
    let (unchecked_annotation, no_checks) = instrument_cli(program, &unchecked, false);
    assert_eq!(no_checks, 0, "{label}: escape checks left in");
    let trace = dir.join("bench-escape.trace");
    let mut with = (Vec::new(), Vec::new());
    let mut without = Vec::new();
    let mut ratio = Vec::new();
    let mut escapes = 0u64;
    for _ in 0..reps {
        let n = native(program, args);
        let (c, totals) = recorded(
            &checked,
            args,
            &checked_annotation,
            default_sampling(),
            None,
            &trace,
        );
        let (u, _) = recorded(
            &unchecked,
            args,
            &unchecked_annotation,
            default_sampling(),
            None,
            &trace,
        );
        let n2 = native(program, args);
        let base_cpu = (n.cpu + n2.cpu).as_secs_f64() / 2.0;
        with.0.push(c.cpu.as_secs_f64() / base_cpu);
        with.1.push(base_cpu);
        without.push(u.cpu.as_secs_f64() / base_cpu);
        ratio.push(c.cpu.as_secs_f64() / u.cpu.as_secs_f64());
        escapes = totals.escapes.iter().map(|e| e.count).sum();
    }
    println!(
        "  {label} (native CPU {}; {checks} escape checks, {escapes} escapes counted in the last run)\n    with escape checks / native     cpu {}\n    without escape checks / native  cpu {}\n    with / without                  cpu {}",
        summary_of(with.1, " s"),
        summary(with.0),
        summary(without),
        summary(ratio),
    );
    let _ = std::fs::remove_file(&trace);
}

/// `--escape-checks`: the interpreter fixture, python3 and lua5.4.
fn escape_section(dir: &Path, reps: usize) {
    let interp = dir.join("interp");
    run_ok(
        Command::new("gcc")
            .args(["-O2", "-freorder-blocks-and-partition", "-o"])
            .arg(&interp)
            .arg(fixture("interp.c")),
    );
    println!(
        "cargo memgaze escape checks ({reps} interleaved repetitions per row)\n\nrecording (default sampling, no spatial samples), program CPU (user + system) / native, median (min–max)"
    );
    escape_rows(
        "interp.c 20000 (computed goto and switch)",
        &interp,
        &["20000"],
        dir,
        reps,
    );
    // Whoever runs the bench sets PYTHONHASHSEED=0 for python3; the
    // children inherit it, native and recorded alike.
    let script = dir.join("escape_bench.py");
    std::fs::write(
        &script,
        "d = {}\nfor i in range(300000):\n    d[str(i)] = [i, i * 2]\ns = 0\nfor k in sorted(d):\n    s += d[k][1]\nprint(s)\n",
    )
    .expect("python script");
    let python = PathBuf::from("/usr/bin/python3");
    let python = std::fs::canonicalize(&python).unwrap_or(python);
    escape_rows(
        "python3 dict/list script",
        &python,
        &["-S", script.to_str().unwrap()],
        dir,
        reps,
    );
    let lua = Path::new("/usr/bin/lua5.4");
    if lua.exists() {
        let script = dir.join("escape_bench.lua");
        std::fs::write(
            &script,
            "local t = {}\nfor i = 1, 300000 do t[tostring(i)] = {i, i * 2} end\nlocal s = 0\nfor k, v in pairs(t) do s = s + v[2] end\nprint(s)\n",
        )
        .expect("lua script");
        let lua = std::fs::canonicalize(lua).unwrap();
        escape_rows(
            "lua5.4 table script",
            &lua,
            &[script.to_str().unwrap()],
            dir,
            reps,
        );
    } else {
        println!("  lua5.4: not installed, not measured");
    }
}

fn main() {
    let mut reps = 7usize;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--reps") {
        reps = args[i + 1].parse().expect("--reps N");
    }
    if args.iter().any(|a| a == "--list") {
        return; // `cargo bench -- --list` (libtest convention)
    }
    let dir = work_dir();
    if args.iter().any(|a| a == "--escape-checks") {
        escape_section(&dir, reps);
        return;
    }

    // Kernels.
    let kernels = dir.join("bench_kernels");
    run_ok(
        Command::new("gcc")
            .args(["-O2", "-o"])
            .arg(&kernels)
            .arg(fixture("bench_kernels.c")),
    );
    let instrumented = dir.join("bench_kernels.instrumented");
    let result = memgaze_instrument::instrument_file(
        &kernels,
        &instrumented,
        None,
        InstrumentationMode::Soft,
    )
    .expect("instrument the kernels");
    let annotation = result.annotation;
    println!(
        "bench_kernels.c instrumented: {} escape checks",
        result.report.escape_checks
    );
    if let Some(i) = args.iter().position(|a| a == "--libs") {
        let libs = args.get(i + 1).expect("--libs GLOBS");
        libs_section(&dir, (&kernels, &instrumented), libs, reps);
        return;
    }
    let trace = dir.join("bench.trace");
    let baseline = std::env::var_os("MEMGAZE_BENCH_BASELINE").map(|path| {
        let path = PathBuf::from(path);
        let mut annotation_path = path.clone().into_os_string();
        annotation_path.push(".memgaze.json");
        let annotation =
            memgaze_metadata::annotation::Annotation::read(Path::new(&annotation_path))
                .expect("MEMGAZE_BENCH_BASELINE: the annotation beside it");
        (path, annotation)
    });

    println!("cargo memgaze overhead benchmark ({reps} interleaved repetitions per row)\n");
    println!("kernel run time, instrumented / native (median (min–max))");
    let spatial = SpatialSampling::with_rate(1.0 / 128.0);
    let subjects = Subjects {
        native: &kernels,
        instrumented: &instrumented,
        annotation: &annotation,
        baseline: baseline.as_ref(),
        trace: &trace,
    };
    for kernel in [("str", "4000000", "25"), ("irr", "4000000", "10")] {
        kernel_rows(&subjects, kernel, reps, spatial);
    }
    if args.iter().any(|a| a == "--kernels-only") {
        return;
    }

    println!(
        "\nvalgrind --tool=lackey --trace-mem=yes (log to /dev/null), same kernels with 400 K elements × 2"
    );
    for kernel in ["str", "irr"] {
        let args = [kernel, "400000", "2"];
        let mut vs_native = Vec::new();
        let mut vs_full = Vec::new();
        let mut vs_sampled = Vec::new();
        for _ in 0..reps.min(3) {
            let n = native(&kernels, &args);
            let l = lackey(&kernels, &args);
            let (f, _) = recorded(
                &instrumented,
                &args,
                &annotation,
                Sampling::full(),
                None,
                &trace,
            );
            let (s, _) = recorded(
                &instrumented,
                &args,
                &annotation,
                default_sampling(),
                spatial,
                &trace,
            );
            vs_native.push(l.wall.as_secs_f64() / n.wall.as_secs_f64());
            vs_full.push(l.wall.as_secs_f64() / f.wall.as_secs_f64());
            vs_sampled.push(l.wall.as_secs_f64() / s.wall.as_secs_f64());
        }
        println!(
            "  {kernel}: lackey / native {}\n       lackey / full trace {}\n       lackey / sampled {}",
            summary(vs_native),
            summary(vs_full),
            summary(vs_sampled)
        );
    }

    // Instrumentation time.
    let big = dir.join("bench_big");
    if !big.exists() {
        eprintln!("building the ~2 MB Rust benchmark binary (once; a few minutes)…");
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        run_ok(
            Command::new(rustc)
                .args([
                    "--edition",
                    "2024",
                    "-C",
                    "opt-level=3",
                    "-C",
                    "debuginfo=0",
                    "-o",
                ])
                .arg(&big)
                .arg(fixture("bench_big.rs")),
        );
    }
    let size = std::fs::metadata(&big).map(|m| m.len()).unwrap_or(0);
    let out = dir.join("bench_big.instrumented");
    let mut ratios = Vec::new();
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for _ in 0..reps {
        let start = Instant::now();
        run_ok(
            Command::new("objdump")
                .arg("-d")
                .arg(&big)
                .stdout(Stdio::null()),
        );
        let objdump = start.elapsed().as_secs_f64();
        let start = Instant::now();
        memgaze_instrument::instrument_file(&big, &out, None, InstrumentationMode::Soft)
            .expect("instrument the big binary");
        let instrument = start.elapsed().as_secs_f64();
        ratios.push(instrument / objdump);
        ours.push(instrument);
        theirs.push(objdump);
    }
    ours.sort_by(f64::total_cmp);
    theirs.sort_by(f64::total_cmp);
    println!(
        "\ninstrumentation time of {} ({:.1} MB file), all functions, classify + rewrite + write\n  instrument / objdump -d {}\n  instrument {:.3}s (median), objdump -d {:.3}s (median)",
        big.display(),
        size as f64 / 1e6,
        summary(ratios),
        ours[ours.len() / 2],
        theirs[theirs.len() / 2]
    );
}
