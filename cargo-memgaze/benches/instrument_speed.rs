//! `cargo bench -p cargo-memgaze --bench instrument_speed`: wall time and
//! peak memory of `cargo memgaze instrument` on real executables, as a
//! ratio to `objdump -d` of the same file measured in the same run.
//!
//! Inputs, each left out with a line saying why when missing:
//! - `cargo-memgaze` itself (this build's release executable: large Rust
//!   code with DWARF line tables),
//! - Debian's `python3` (C, a few MB of code),
//! - `gzip` (about 100 KB),
//! - the bundled microbenchmarks' bench executable (built here, release
//!   with line tables as `cargo memgaze bench` builds benches, into the
//!   bench's `CARGO_TARGET_TMPDIR`; `MEMGAZE_BENCH_MICRO=<path>` names
//!   another).
//!
//! `MEMGAZE_BENCH_RUNS=<n>` sets the alternating (objdump, instrument)
//! pairs per input (default 5); positional arguments that name files are
//! measured instead of the default inputs; others (`--bench`, filters) are
//! ignored. `MEMGAZE_BENCH_INSTRUMENTER=<cargo-memgaze>` measures another
//! build's `instrument` on the same inputs; `MEMGAZE_BENCH_BASELINE=
//! <cargo-memgaze>` measures a baseline build alongside this one, in the
//! same alternation (objdump, baseline, this build; every other round this
//! build first), and says whether their executables are byte-identical and
//! their annotations have the same header and decompressed body. Each
//! instrumentation is a child process: its peak RSS is the kernel's
//! `ru_maxrss` from `wait4`. Also reported: the annotation's size
//! on disk and the instrumented executable's size against the original.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// One child run: wall seconds and peak resident set in bytes.
struct Run {
    wall: f64,
    max_rss: u64,
}

/// Runs `command` to completion with its output discarded, measuring wall
/// time and the peak RSS of the child (`wait4`, not `RUSAGE_CHILDREN`,
/// which is the maximum over every child so far).
fn run(command: &mut Command) -> Run {
    use std::os::unix::process::CommandExt;
    // A hook makes std fork rather than `posix_spawn` (a vfork): the
    // kernel folds the exec'ing image's peak RSS into the child's, and
    // after a vfork that image is this process (its file reads included).
    // SAFETY: the hook does nothing, so nothing unsafe runs after fork.
    unsafe {
        command.pre_exec(|| Ok(()));
    }
    let started = Instant::now();
    #[allow(
        clippy::zombie_processes,
        reason = "reaped by wait4 below, which also gives its rusage"
    )]
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits");
    let mut status = 0;
    // SAFETY: `rusage` is plain old data; `wait4` writes it whole.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: reaping our own child; `child` is not waited on afterwards.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = started.elapsed().as_secs_f64();
    assert_eq!(
        reaped,
        pid,
        "wait4 failed: {}",
        std::io::Error::last_os_error()
    );
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{command:?} failed (wait status {status:#x})"
    );
    Run {
        wall,
        max_rss: u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024,
    }
}

/// Median, minimum and maximum.
fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (median, v[0], v[n - 1])
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// The microbenchmarks' bench executable, built (cached) in a private
/// target directory so that the outer `cargo bench`'s lock does not block.
fn micro_bench_executable() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("MEMGAZE_BENCH_MICRO") {
        return Some(PathBuf::from(path));
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("instrument-speed-micro");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!(
        "building the microbenchmarks' bench executable into {} (cached) …",
        target.display()
    );
    let output = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--offline",
            "--quiet",
            "-p",
            "microbenches",
            "--bench",
            "micro",
            "--message-format",
            "json",
        ])
        .current_dir(workspace)
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "line-tables-only")
        .env("CARGO_PROFILE_RELEASE_STRIP", "none")
        .env_remove("RUSTFLAGS")
        .stderr(Stdio::inherit())
        .output()
        .ok()?;
    if !output.status.success() {
        eprintln!("building the microbenchmarks failed: left out");
        return None;
    }
    // The last compiler-artifact line with an executable is the bench.
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|v| v.get("executable")?.as_str().map(PathBuf::from))
        .next_back()
}

/// The default inputs: (label, path).
fn default_inputs() -> Vec<(String, PathBuf)> {
    let mut inputs = vec![(
        "cargo-memgaze (release)".to_string(),
        PathBuf::from(env!("CARGO_BIN_EXE_cargo-memgaze")),
    )];
    match std::fs::canonicalize("/usr/bin/python3") {
        Ok(p) => inputs.push(("python3".into(), p)),
        Err(_) => {
            eprintln!("python3: /usr/bin/python3 missing (apt-get install -y python3), left out")
        }
    }
    match std::fs::canonicalize("/usr/bin/gzip").or_else(|_| std::fs::canonicalize("/bin/gzip")) {
        Ok(p) => inputs.push(("gzip".into(), p)),
        Err(_) => eprintln!("gzip: not installed, left out"),
    }
    match micro_bench_executable() {
        Some(p) => inputs.push(("microbenches bench".into(), p)),
        None => eprintln!("microbenches bench executable: not built, left out"),
    }
    inputs
}

/// Size of the `.text` section (what objdump and the rewriter decode).
fn text_size(path: &Path) -> u64 {
    let data = std::fs::read(path).expect("readable");
    goblin::elf::Elf::parse(&data)
        .ok()
        .and_then(|elf| {
            elf.section_headers
                .iter()
                .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(".text"))
                .map(|s| s.sh_size)
        })
        .unwrap_or(0)
}

/// The annotation file written beside `output` (whatever its format).
fn annotation_size(output: &Path) -> u64 {
    let path = memgaze_instrument::rewrite::annotation_path(output);
    std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0)
}

/// One instrumenter's runs on one input.
#[derive(Default)]
struct Series {
    walls: Vec<f64>,
    ratios: Vec<f64>,
    rss: Vec<f64>,
}

/// Alternates `objdump -d` of `input` with each of `instrumenters`
/// (label, executable) `runs` times and prints each one's figures; with
/// several, also whether their executables are byte-identical and their
/// annotations' bodies the same.
fn measure(
    instrumenters: &[(&str, &Path)],
    label: &str,
    input: &Path,
    runs: usize,
    scratch: &Path,
) {
    let output_of = |k: usize| scratch.join(format!("instrumented-{k}"));
    let instrument = |k: usize| {
        let mut c = Command::new(instrumenters[k].1);
        c.arg("instrument")
            .arg(input)
            .arg("-o")
            .arg(output_of(k))
            .arg("-q");
        c
    };
    let objdump = || {
        let mut c = Command::new("objdump");
        c.arg("-d").arg(input);
        c
    };
    // Unmeasured: brings the file into the page cache for both tools.
    run(&mut objdump());
    let mut theirs = vec![];
    let mut series: Vec<Series> = instrumenters.iter().map(|_| Series::default()).collect();
    for round in 0..runs {
        let o = run(&mut objdump());
        theirs.push(o.wall);
        // Every other round in reverse order: on a VM the first
        // memory-hungry run after objdump pays for the pages the host
        // took back (10–20% on the own binary, the same build in both
        // places), which a fixed order would charge to one build alone.
        let mut order: Vec<usize> = (0..series.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for k in order {
            let s = &mut series[k];
            let i = run(&mut instrument(k));
            s.ratios.push(i.wall / o.wall);
            s.walls.push(i.wall);
            s.rss.push(i.max_rss as f64);
        }
    }
    let (o, o_min, o_max) = stats(theirs);
    let original = std::fs::metadata(input).map(|m| m.len()).unwrap_or(0);
    println!(
        "{label}: {} ({:.2} MB file, {:.2} MB .text) | objdump -d {o:.3} s [{o_min:.3}–{o_max:.3}]",
        input.display(),
        mb(original),
        mb(text_size(input))
    );
    for (k, s) in series.into_iter().enumerate() {
        let output = output_of(k);
        let (i, i_min, i_max) = stats(s.walls);
        let (r, r_min, r_max) = stats(s.ratios);
        let (m, m_min, m_max) = stats(s.rss);
        let instrumented = std::fs::metadata(&output).map(|m| m.len()).unwrap_or(0);
        println!(
            "  {}: instrument {i:.3} s [{i_min:.3}–{i_max:.3}] | ratio {r:.2}x [{r_min:.2}–{r_max:.2}]",
            instrumenters[k].0
        );
        println!(
            "    peak RSS {:.0} MB [{:.0}–{:.0}] | annotation {:.2} MB ({:.2}x the original) | executable {:.2} → {:.2} MB (+{:.2} MB, {:.2}x)",
            m / 1e6,
            m_min / 1e6,
            m_max / 1e6,
            mb(annotation_size(&output)),
            annotation_size(&output) as f64 / original.max(1) as f64,
            mb(original),
            mb(instrumented),
            mb(instrumented.saturating_sub(original)),
            instrumented as f64 / original.max(1) as f64,
        );
    }
    if instrumenters.len() > 1 {
        let bytes = |path: &Path| std::fs::read(path).unwrap_or_default();
        let same_executables =
            (1..instrumenters.len()).all(|k| bytes(&output_of(0)) == bytes(&output_of(k)));
        let annotation =
            |k| annotation_body(&memgaze_instrument::rewrite::annotation_path(&output_of(k)));
        let same_annotations = (1..instrumenters.len()).all(|k| annotation(0) == annotation(k));
        let said = |same| if same { "identical" } else { "DIFFER" };
        println!(
            "  outputs: executables byte-{} | annotations' bodies {}",
            said(same_executables),
            said(same_annotations)
        );
    }
}

/// A compact annotation's header and decompressed body (a JSON one's
/// bytes): the compressed frames' boundaries may differ between builds for
/// one body. Not decoded into an `Annotation`: its many small blocks, freed,
/// would stay resident in this process and count in every later child's
/// peak RSS (a forked child starts with this process's pages).
fn annotation_body(path: &Path) -> Vec<u8> {
    const HEADER: usize = 20;
    let bytes = std::fs::read(path).unwrap_or_default();
    if !memgaze_metadata::annotation::compact::is_compact(&bytes) || bytes.len() < HEADER {
        return bytes;
    }
    let mut body = bytes[..HEADER].to_vec();
    match zstd::stream::decode_all(&bytes[HEADER..]) {
        Ok(decompressed) => body.extend_from_slice(&decompressed),
        Err(_) => return bytes,
    }
    body
}

fn main() {
    let files: Vec<(String, PathBuf)> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-') && Path::new(a).is_file())
        .map(|a| (a.clone(), PathBuf::from(a)))
        .collect();
    let inputs = if files.is_empty() {
        default_inputs()
    } else {
        files
    };
    let runs: usize = std::env::var("MEMGAZE_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(5);
    let memgaze = std::env::var_os("MEMGAZE_BENCH_INSTRUMENTER").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_cargo-memgaze")),
        PathBuf::from,
    );
    let baseline = std::env::var_os("MEMGAZE_BENCH_BASELINE").map(PathBuf::from);
    let mut instrumenters: Vec<(&str, &Path)> = Vec::new();
    if let Some(baseline) = &baseline {
        instrumenters.push(("baseline", baseline.as_path()));
    }
    instrumenters.push(("this build", memgaze.as_path()));
    for (label, path) in &instrumenters {
        println!("{label}: {}", path.display());
    }
    let scratch = tempfile::tempdir().expect("temporary directory");
    println!(
        "{runs} alternating pairs per input; medians [min–max]; load average {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    for (label, input) in &inputs {
        measure(&instrumenters, label, input, runs, scratch.path());
    }
}
