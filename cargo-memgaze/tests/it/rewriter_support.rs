//! Shared helpers of the rewriter's integration tests: fixtures compiled
//! once per test process, running the built `cargo-memgaze`, reading traces
//! and Valgrind Lackey logs.
#![allow(dead_code)]

use memgaze_metadata::annotation::Annotation;
use memgaze_trace::{TraceReader, TraceTotals};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// The built command.
pub fn memgaze() -> Command {
    crate::support::memgaze_command()
}

/// A directory living as long as the test process (removed by a later
/// run, see [`crate::support::process_scratch`]).
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| crate::support::process_scratch("rewriter"))
}

fn fixture(name: &str) -> PathBuf {
    memgaze_fixtures::fixtures().join("rewriter").join(name)
}

/// Runs `cmd`, which must succeed; its output.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (gcc/rustc/valgrind are required)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Builds (once per process) and returns a program from the fixtures.
/// `.c` is compiled by gcc, `.cpp` by g++, anything else by rustc; flags
/// are the compiler's.
pub fn build(source: &str, flags: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let key = format!("{source} {}", flags.join(" "));
    let map = BUILT.get_or_init(Default::default);
    // Hold the lock while compiling: the same fixture is wanted by several
    // tests at once.
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = map.get(&key) {
        return path.clone();
    }
    let tag: String = key
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let out = scratch().join(tag);
    if source.ends_with(".c") || source.ends_with(".cpp") {
        let compiler = if source.ends_with(".c") { "gcc" } else { "g++" };
        run_ok(
            Command::new(compiler)
                .args(flags)
                .arg("-o")
                .arg(&out)
                .arg(fixture(source)),
        );
    } else {
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        run_ok(
            Command::new(rustc)
                .args(["--edition", "2024", "-C", "opt-level=3"])
                .args(flags)
                .arg("-o")
                .arg(&out)
                .arg(fixture(source)),
        );
    }
    map.insert(key, out.clone());
    out
}

/// A copy of a system binary (never modify /usr/bin).
pub fn system_binary(name: &str) -> PathBuf {
    let out = scratch().join(format!("system-{name}"));
    if !out.exists() {
        std::fs::copy(Path::new("/usr/bin").join(name), &out).expect("copy system binary");
    }
    out
}

/// An instrumented program.
pub struct Instrumented {
    /// Its path.
    pub path: PathBuf,
    /// Its annotation.
    pub annotation: Annotation,
    /// The JSON instrumentation report.
    pub report: serde_json::Value,
}

/// Instruments `input` with the built command (all functions unless a glob
/// is given), into a file of its own: two tests instrumenting the same
/// fixture at once must not write over a copy the other is running (the
/// write then fails with "Text file busy").
pub fn instrument(input: &Path, functions: Option<&str>, tag: &str) -> Instrumented {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let output = scratch().join(format!(
        "{}.{tag}.{call}.instrumented",
        input.file_name().unwrap().to_string_lossy()
    ));
    let mut cmd = memgaze();
    cmd.arg("instrument")
        .arg(input)
        .arg("-o")
        .arg(&output)
        .args(["--format", "json"]);
    if let Some(glob) = functions {
        cmd.args(["--functions", glob]);
    }
    let out = cmd.output().expect("run cargo-memgaze");
    assert!(
        out.status.success(),
        "instrument {} failed: {}",
        input.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let annotation = memgaze_instrument::rewrite::read_annotation(&output).expect("annotation");
    let report = serde_json::from_slice(&out.stdout).expect("report JSON");
    Instrumented {
        path: output,
        annotation,
        report,
    }
}

/// Runs a program natively with `args` and stdin from `stdin` (or null).
pub fn native(program: &Path, args: &[&str], stdin: Option<&Path>) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd.stdin(stdin_of(stdin));
    cmd.output().expect("run program")
}

fn stdin_of(stdin: Option<&Path>) -> std::process::Stdio {
    match stdin {
        Some(path) => std::fs::File::open(path).unwrap().into(),
        None => std::process::Stdio::null(),
    }
}

/// `cargo memgaze record <sampling> -o <trace> -- program args`.
pub fn record(
    program: &Path,
    args: &[&str],
    sampling: &[&str],
    trace: &Path,
    stdin: Option<&Path>,
) -> Output {
    let mut cmd = memgaze();
    cmd.arg("record")
        .args(sampling)
        .arg("-o")
        .arg(trace)
        .arg("--")
        .arg(program)
        .args(args);
    cmd.stdin(stdin_of(stdin));
    cmd.output().expect("run cargo-memgaze record")
}

/// Records read back from a trace: per IP of the executable, the addresses
/// in order, and the totals.
pub struct TraceSummary {
    /// `ip → addresses` in trace order (per thread order for full traces),
    /// the executable's loads only: instrumented libraries (`--libs`) have
    /// IPs of their own files, which may equal the executable's.
    pub by_ip: BTreeMap<u64, Vec<u64>>,
    /// Records of instrumented libraries and other objects (not in `by_ip`).
    pub object_records: u64,
    /// Records per thread (every object's).
    pub threads: BTreeMap<u32, u64>,
    /// Samples seen.
    pub samples: u64,
    /// Footer.
    pub totals: TraceTotals,
}

/// Reads a whole trace.
pub fn read_trace(path: &Path) -> TraceSummary {
    let mut reader =
        TraceReader::open(path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let header = reader.header().clone();
    // The executable's loads come first; each other object's start at the
    // load index its `object` label names.
    let executable_loads = header
        .labels
        .iter()
        .filter(|(key, _)| key == memgaze_trace::OBJECT_LABEL)
        .map(|(_, value)| value.split(' ').nth(1).unwrap().parse::<u32>().unwrap())
        .min()
        .unwrap_or(u32::MAX);
    let mut by_ip: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut threads: BTreeMap<u32, u64> = BTreeMap::new();
    let mut samples = std::collections::BTreeSet::new();
    let mut object_records = 0;
    while let Some(raw) = reader.next_raw().expect("trace record") {
        if raw.load < executable_loads {
            let ip = header.loads[raw.load as usize].ip;
            by_ip.entry(ip).or_default().push(raw.addr);
        } else {
            object_records += 1;
        }
        *threads.entry(raw.thread).or_default() += 1;
        samples.insert(raw.sample);
    }
    let totals = reader.totals().expect("trace totals").clone();
    TraceSummary {
        by_ip,
        object_records,
        threads,
        samples: samples.len() as u64,
        totals,
    }
}

/// Per original IP, the first data address of every execution that
/// accessed memory, as Valgrind Lackey sees them on the original binary.
/// Lackey reports some instructions (e.g. `xchg` with memory) as a load and
/// a modify of the same address; one execution counts once. PIE binaries
/// are loaded at 0x108000 by Valgrind.
pub fn lackey(program: &Path, args: &[&str], stdin: Option<&Path>) -> BTreeMap<u64, Vec<u64>> {
    lackey_reads(program, args, stdin, false)
}

/// [`lackey`] with every read of an execution (a `cmps` reads twice per
/// iteration), except an ` M` or ` L` repeating the address just read by
/// the same execution (`xchg`'s load and modify).
pub fn lackey_all(program: &Path, args: &[&str]) -> BTreeMap<u64, Vec<u64>> {
    lackey_reads(program, args, None, true)
}

fn lackey_reads(
    program: &Path,
    args: &[&str],
    stdin: Option<&Path>,
    every_read: bool,
) -> BTreeMap<u64, Vec<u64>> {
    // Arguments may be paths: keep the log's name one file name.
    let args_tag: String = args
        .join("_")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let log = scratch().join(format!(
        "lackey-{}-{args_tag}.log",
        program.file_name().unwrap().to_string_lossy(),
    ));
    let status = Command::new("valgrind")
        .args(["--tool=lackey", "--trace-mem=yes"])
        .arg(format!("--log-file={}", log.display()))
        .arg(program)
        .args(args)
        .stdin(stdin_of(stdin))
        .stdout(std::process::Stdio::null())
        .status()
        .expect("valgrind is required");
    assert!(status.code().is_some(), "valgrind died: {status}");
    let bytes = std::fs::read(program).unwrap();
    let pie = u16::from_le_bytes([bytes[16], bytes[17]]) == 3;
    let base = if pie { 0x108000 } else { 0 };
    let text = std::fs::read_to_string(&log).expect("lackey log");
    let mut out: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut ip = None;
    let mut last: Option<u64> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("I  ") {
            let hex = rest.split(',').next().unwrap();
            ip = u64::from_str_radix(hex, 16)
                .ok()
                .map(|a| a.wrapping_sub(base));
            last = None;
        } else if (line.starts_with(" L ") || line.starts_with(" M "))
            && (last.is_none()
                || (every_read
                    && last != u64::from_str_radix(line[3..].split(',').next().unwrap(), 16).ok()))
        {
            let hex = line[3..].split(',').next().unwrap();
            if let (Some(ip), Ok(addr)) = (ip, u64::from_str_radix(hex, 16)) {
                out.entry(ip).or_default().push(addr);
                last = Some(addr);
            }
        }
    }
    out
}

fn deltas(addrs: &[u64]) -> Vec<i64> {
    addrs
        .windows(2)
        .map(|w| w[1].wrapping_sub(w[0]) as i64)
        .collect()
}

/// A delta this large jumps between mappings (stack, heap, the binary's
/// data), which Valgrind places at other distances than the kernel does.
const REGION_JUMP: u64 = 1 << 30;

/// Whether two equally long address sequences of one load move alike: every
/// delta equal, except where either side jumps between mappings (a string
/// routine that reads argv on the stack and then a heap buffer).
pub fn deltas_match(got: &[u64], seen: &[u64]) -> bool {
    deltas(got)
        .into_iter()
        .zip(deltas(seen))
        .all(|(a, b)| a == b || a.unsigned_abs() >= REGION_JUMP || b.unsigned_abs() >= REGION_JUMP)
}

/// The comparison of a full trace with Lackey over the instrumented loads.
#[derive(Debug, Default)]
pub struct Comparison {
    /// Loads Lackey saw at instrumented IPs reached only through copies.
    pub lackey_loads: u64,
    /// Records at those IPs.
    pub recorded: u64,
    /// IPs whose counts differ.
    pub count_mismatches: Vec<(u64, usize, usize)>,
    /// IPs whose address deltas differ (other than jumps between
    /// mappings, see `deltas_match`).
    pub delta_mismatches: Vec<u64>,
    /// IPs with more records than Lackey loads.
    pub over: Vec<u64>,
    /// Implied (proxy-compressed) loads whose Lackey count differs from
    /// their proxy's record count: `(ip, lackey, proxy records)`.
    pub implied_mismatches: Vec<(u64, usize, usize)>,
    /// Explicit loads Lackey saw in the selected functions, and how many of
    /// them are instrumented or implied (dynamic coverage).
    pub explicit_loads: u64,
    /// See `explicit_loads`.
    pub covered_loads: u64,
}

/// Compares a full trace with Lackey's view of the original program.
pub fn compare(
    annotation: &Annotation,
    trace: &TraceSummary,
    lackey: &BTreeMap<u64, Vec<u64>>,
    escaped: &[u64],
) -> Comparison {
    let mut c = Comparison::default();
    for load in &annotation.loads {
        let seen = lackey.get(&load.ip).map_or(&[][..], |v| &v[..]);
        c.explicit_loads += seen.len() as u64;
        if load.instrumented || load.proxy.is_some() {
            c.covered_loads += seen.len() as u64;
        }
        if let Some(proxy) = load.proxy.map(std::num::NonZeroU64::get)
            && !escaped.contains(&proxy)
        {
            let implied = trace.by_ip.get(&proxy).map_or(0, Vec::len);
            if implied != seen.len() {
                c.implied_mismatches.push((load.ip, seen.len(), implied));
            }
        }
        if !load.instrumented {
            continue;
        }
        let got = trace.by_ip.get(&load.ip).map_or(&[][..], |v| &v[..]);
        if got.len() > seen.len() {
            c.over.push(load.ip);
        }
        if escaped.contains(&load.ip) {
            continue;
        }
        c.lackey_loads += seen.len() as u64;
        c.recorded += got.len() as u64;
        if got.len() != seen.len() {
            c.count_mismatches.push((load.ip, seen.len(), got.len()));
        } else if !deltas_match(got, seen) {
            c.delta_mismatches.push(load.ip);
        }
    }
    c
}

/// Escaped load IPs listed by a JSON report.
pub fn escaped(report: &serde_json::Value) -> Vec<u64> {
    report["escaped_loads"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
        .unwrap_or_default()
}
