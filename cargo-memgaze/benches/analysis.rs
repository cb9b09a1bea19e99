//! Analysis throughput on a synthetic 50 M-record trace.
//!
//! `cargo bench -p cargo-memgaze --bench analysis`
//!
//! Writes traces of the same synthetic program — a full trace (one sample
//! of every record) and a sampled one (w = 1024) — with a realistic
//! mix: strided streams over two 4 MiB arrays, a column walk (stride
//! 4 KiB), irregular gathers over an 8 MiB table and a 256 KiB hash table,
//! phases that alternate gathers from the table with strided scans of it
//! (`irr|str|irr`: addresses touched by both classes), and Constant (stack) loads with implied proxies, spread
//! over six functions. Each trace is then analysed in a fresh child process
//! (full metric set: `analyze_trace`, decoding included) a few times; the
//! report gives records/s as median and min–max over the repeats, per
//! wall-clock second and per CPU second (user + system, less sensitive to
//! other processes on a shared machine) and per CPU second of the busier
//! "thread": the main one, or the analysis's other threads together (the
//! whole-run stacks, decoding, the table fill helper) — the wall rate of
//! an idle machine with two cores, one for each side; the decode-only
//! rate for comparison, and the child's peak RSS (`VmHWM`). Two more traces check
//! that memory follows the distinct addresses, not the trace length (a
//! tenth of the length), and measure a stress case: gathers and strided
//! scans of the same table interleaved every 4096 loads, so that nearly
//! every address is touched by both classes in windows of 2^13 and up.
//!
//! Harness: plain `main` (harness = false), not criterion — one iteration
//! takes seconds, must run in its own process to measure peak memory, and a
//! handful of repeats with their spread is the useful statistic.
//!
//! Environment: `MEMGAZE_BENCH_RECORDS` (default 50 000 000),
//! `MEMGAZE_BENCH_REPEATS` (default 3). For profiling, the bench binary
//! also takes `--write PATH RECORDS full|W` (write a trace) and
//! `--child PATH analyze|decode` (analyse one).
//!
//! Trace codec alone: `--codec [RECORDS] [REPEATS]` (defaults 10 000 000
//! and 5) generates RECORDS records of this mix, and of a purely strided
//! program (four loads, 8-byte strides), into memory first, then times
//! `TraceWriter::push` + `finish` (encoding and zstd, into memory) and
//! decoding with `TraceReader::next_raw` and `TraceReader::for_each_raw`:
//! M records/s, median and min–max over the repeats, and the encoded size
//! per record.

use memgaze_analysis::{AnalysisOptions, analyze_trace};
use memgaze_trace::{
    Backend, Dropped, FunctionEntry, LoadClass, LoadEntry, Sampling, TraceHeader, TraceReader,
    TraceTotals, TraceWriter,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        child(Path::new(&args[i + 1]), &args[i + 2]);
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--write") {
        // For profiling: `--write PATH RECORDS full|W`.
        let window = args[i + 3].parse().ok();
        write_trace(
            Path::new(&args[i + 1]),
            args[i + 2].parse().unwrap(),
            window,
            18,
        );
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--codec") {
        let arg = |k: usize, default: u64| {
            args.get(i + k)
                .and_then(|v| v.replace('_', "").parse().ok())
                .unwrap_or(default)
        };
        codec(arg(1, 10_000_000), arg(2, 5) as usize);
        return;
    }
    if args.iter().any(|a| a == "--list") {
        println!("analysis: bench");
        return;
    }
    let records: u64 = env("MEMGAZE_BENCH_RECORDS", 50_000_000);
    let repeats: usize = env("MEMGAZE_BENCH_REPEATS", 3);
    let dir = tempfile::tempdir().expect("temporary directory");
    println!("analysis benchmark: {records} records per trace, {repeats} repeats, one core");
    let variants: [(&str, Option<u64>, u32, u64); 4] = [
        ("full", None, 18, records),
        ("sampled w=1024", Some(1024), 18, records),
        (
            "full, 1/10 the length (memory check)",
            None,
            18,
            records / 10,
        ),
        (
            "full, irr|str|irr interleaved every 4096 loads (stress)",
            None,
            12,
            records,
        ),
    ];
    for (i, (name, window, mixed_run_log2, records)) in variants.into_iter().enumerate() {
        let path = dir.path().join(format!("v{i}.trace"));
        let started = Instant::now();
        let (bytes, samples) = write_trace(&path, records, window, mixed_run_log2);
        println!(
            "\n{name}: {records} records in {samples} samples ({:.1} MiB, {:.2} bytes/record, written in {:.1} s)",
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / records as f64,
            started.elapsed().as_secs_f64()
        );
        let decode = run_child(&path, "decode");
        println!(
            "  decode only    {:>6.1} M records/s wall, {:>6.1} M/s CPU            peak RSS {:>6.1} MiB",
            decode.rate() / 1e6,
            decode.cpu_rate() / 1e6,
            decode.hwm_kib as f64 / 1024.0
        );
        let repeats = if i >= 2 { 1 } else { repeats };
        let mut runs: Vec<ChildResult> =
            (0..repeats).map(|_| run_child(&path, "analyze")).collect();
        let stats = |rate: fn(&ChildResult) -> f64, runs: &mut Vec<ChildResult>| {
            runs.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
            (
                rate(&runs[runs.len() / 2]) / 1e6,
                rate(&runs[0]) / 1e6,
                rate(&runs[runs.len() - 1]) / 1e6,
            )
        };
        let wall = stats(ChildResult::rate, &mut runs);
        let cpu = stats(ChildResult::cpu_rate, &mut runs);
        let busiest = stats(ChildResult::busiest_rate, &mut runs);
        let hwm = runs.iter().map(|r| r.hwm_kib).max().unwrap();
        println!(
            "  full analysis  {:>6.1} M records/s wall (min {:.1}, max {:.1}), {:.1} M/s CPU (min {:.1}, max {:.1})",
            wall.0, wall.1, wall.2, cpu.0, cpu.1, cpu.2
        );
        println!(
            "                 {:.1} M/s per CPU second of the busier thread (min {:.1}, max {:.1})",
            busiest.0, busiest.1, busiest.2
        );
        println!(
            "                 peak RSS {:.1} MiB for F = {} addresses, {} lines: {:.0} bytes per distinct address",
            hwm as f64 / 1024.0,
            runs[0].footprint,
            runs[0].lines,
            hwm as f64 * 1024.0 / runs[0].footprint as f64
        );
    }
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

struct ChildResult {
    records: u64,
    seconds: f64,
    cpu_seconds: f64,
    /// CPU seconds of the busier side: the main thread, or the others
    /// together.
    busiest_seconds: f64,
    hwm_kib: u64,
    footprint: u64,
    lines: u64,
}

impl ChildResult {
    /// Records per wall-clock second.
    fn rate(&self) -> f64 {
        self.records as f64 / self.seconds
    }

    /// Records per CPU second (user + system): less sensitive to other
    /// processes competing for the cores.
    fn cpu_rate(&self) -> f64 {
        self.records as f64 / self.cpu_seconds
    }

    /// Records per CPU second of the busier side (main thread or the
    /// others): the wall rate of an idle machine with a core for each.
    fn busiest_rate(&self) -> f64 {
        self.records as f64 / self.busiest_seconds
    }
}

fn run_child(path: &PathBuf, mode: &str) -> ChildResult {
    let out = Command::new(std::env::current_exe().unwrap())
        .arg("--child")
        .arg(path)
        .arg(mode)
        .output()
        .expect("run the benchmark child");
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let field = |name: &str| -> f64 {
        text.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .unwrap_or_else(|| panic!("{name} missing in {text:?}"))
            .parse()
            .unwrap()
    };
    ChildResult {
        records: field("records") as u64,
        seconds: field("seconds"),
        cpu_seconds: field("cpu"),
        busiest_seconds: field("busiest"),
        hwm_kib: field("hwm_kib") as u64,
        footprint: field("F") as u64,
        lines: field("lines") as u64,
    }
}

fn child(path: &Path, mode: &str) {
    let reader = TraceReader::open(path).unwrap();
    let started = Instant::now();
    let cpu_started = cpu_time(libc::RUSAGE_SELF);
    let main_started = cpu_time(libc::RUSAGE_THREAD);
    let (records, footprint, lines) = if mode == "decode" {
        let mut reader = reader;
        let mut n = 0u64;
        let mut checksum = 0u64;
        while let Some(r) = reader.next_raw().unwrap() {
            n += 1;
            checksum = checksum.wrapping_add(r.addr);
        }
        std::hint::black_box(checksum);
        (n, 0, 0)
    } else {
        let analysis = analyze_trace(reader, &AnalysisOptions::default()).unwrap();
        (
            analysis.coverage.records,
            analysis.summary.f,
            analysis.summary.f_lines,
        )
    };
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_time(libc::RUSAGE_SELF) - cpu_started;
    // The analysis hands the whole-run stacks and the decoding to other
    // threads: with one core for the main thread and one for the rest, the
    // busier side bounds the wall time on an otherwise idle machine.
    let main_cpu = cpu_time(libc::RUSAGE_THREAD) - main_started;
    let busiest = main_cpu.max(cpu - main_cpu);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let hwm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    println!(
        "records={records} seconds={seconds} cpu={cpu} busiest={busiest} hwm_kib={hwm_kib} F={footprint} lines={lines}"
    );
}

/// User + system CPU seconds of this process (`RUSAGE_SELF`) or of the
/// calling thread (`RUSAGE_THREAD`).
fn cpu_time(who: libc::c_int) -> f64 {
    // SAFETY: getrusage writes into the struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The synthetic program's load sites: (function, class, implied).
const LOADS: &[(usize, LoadClass, u32)] = &[
    (0, LoadClass::Strided, 1),   // 0 stream: a[i]
    (0, LoadClass::Strided, 0),   // 1 stream: b[i]
    (1, LoadClass::Strided, 0),   // 2 column walk m[j][i]
    (2, LoadClass::Irregular, 2), // 3 gather: table[idx]
    (3, LoadClass::Irregular, 0), // 4 hash probe
    (4, LoadClass::Constant, 1),  // 5 stack scalar
    (4, LoadClass::Constant, 0),  // 6 global scalar
    (5, LoadClass::Strided, 0),   // 7 scan of the gather table (mixed with 3)
];
const FUNCTIONS: &[&str] = &[
    "bench::stream_add",
    "bench::column_walk",
    "bench::gather",
    "bench::hash_probe",
    "bench::bookkeeping",
    "bench::rescan",
];

const A: u64 = 0x5555_0000_0000; // 4 MiB
const B: u64 = 0x5555_0100_0000; // 4 MiB
const M: u64 = 0x5555_0200_0000; // 4 MiB matrix, 1024 columns of 4 KiB rows
const TABLE: u64 = 0x7f00_0000_0000; // 8 MiB
const HASH: u64 = 0x7f00_1000_0000; // 256 KiB
const STACK: u64 = 0x7ffd_0000_0000;

struct Program {
    /// For profiling one access pattern: `MEMGAZE_BENCH_PHASE=0..4`.
    only_phase: Option<u32>,
    /// log2 of the length of the gather and scan runs of the `irr|str|irr`
    /// phase (18: a scan of a quarter of the table; 12: the stress case).
    mixed_run_log2: u32,
    rng: u64,
    phase: u32,
    left: u64,
    i: u64,
}

impl Program {
    fn next_rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// The next load executed: (load site, address).
    fn next(&mut self) -> (u32, u64) {
        if self.left == 0 {
            self.phase = match self.only_phase {
                Some(p) => p,
                None => (self.next_rand() % 5) as u32,
            };
            self.left = 50_000 + self.next_rand() % 200_000;
        }
        self.left -= 1;
        self.i += 1;
        let i = self.i;
        let r = self.next_rand();
        // One load in five is bookkeeping on the stack or a global.
        if r.is_multiple_of(5) {
            return if r.is_multiple_of(3) {
                (6, 0x5555_0300_0040)
            } else {
                (5, STACK + 8 * ((r >> 8) % 16))
            };
        }
        match self.phase {
            0 => {
                let e = (i / 2) % (1 << 19);
                if i.is_multiple_of(2) {
                    (0, A + 8 * e)
                } else {
                    (1, B + 8 * e)
                }
            }
            1 => {
                let row = i % 1024;
                let col = (i / 1024) % 512;
                (2, M + 4096 * row + 8 * col)
            }
            2 => (3, TABLE + 8 * ((r >> 16) % (1 << 20))),
            3 => (4, HASH + 8 * ((r >> 16) % (1 << 15))),
            _ => {
                // irr|str|irr: runs of gathers from the table alternate
                // with runs of a strided scan over it.
                if (i >> self.mixed_run_log2).is_multiple_of(2) {
                    (3, TABLE + 8 * ((r >> 16) % (1 << 20)))
                } else {
                    (7, TABLE + 8 * (i % (1 << 20)))
                }
            }
        }
    }
}

fn header(window: Option<u64>) -> TraceHeader {
    TraceHeader {
        backend: Backend::Soft,
        sampling: match window {
            Some(w) => Sampling {
                window: w,
                period: 100 * w,
                seed: Some(1),
            },
            None => Sampling::full(),
        },
        binary: None,
        command: vec!["synthetic".into()],
        functions: FUNCTIONS
            .iter()
            .enumerate()
            .map(|(i, name)| FunctionEntry {
                name: name.to_string(),
                start: 0x10000 + 0x1000 * i as u64,
                end: 0x10800 + 0x1000 * i as u64,
            })
            .collect(),
        loads: LOADS
            .iter()
            .enumerate()
            .map(|(i, &(f, class, implied))| LoadEntry {
                ip: 0x10000 + 0x1000 * f as u64 + 0x10 * i as u64,
                class,
                implied,
                function: Some(f as u32),
                line: Some(format!("benches/synthetic.rs:{}", 100 + i)),
                proxy: None,
            })
            .collect(),
        labels: vec![],
        spatial: None,
    }
}

/// Writes the trace; returns (file size, samples).
fn write_trace(path: &Path, records: u64, window: Option<u64>, mixed_run_log2: u32) -> (u64, u64) {
    let mut writer = TraceWriter::create(path, &header(window)).unwrap();
    let mut program = Program {
        mixed_run_log2,
        only_phase: std::env::var("MEMGAZE_BENCH_PHASE")
            .ok()
            .and_then(|p| p.parse().ok()),
        rng: 0x2545_f491_4f6c_dd1d,
        phase: 0,
        left: 0,
        i: 0,
    };
    let mut executions = 0u64;
    match window {
        None => {
            writer.begin_sample(0).unwrap();
            for _ in 0..records {
                let (load, addr) = program.next();
                writer.push(load, addr).unwrap();
            }
            executions = records;
        }
        Some(w) => {
            // Every 100th window of w loads is recorded; the program runs
            // through the skipped part (so samples see the phases change).
            let mut written = 0;
            while written < records {
                writer.begin_sample(0).unwrap();
                for _ in 0..w.min(records - written) {
                    let (load, addr) = program.next();
                    writer.push(load, addr).unwrap();
                    written += 1;
                    executions += 1;
                }
                for _ in 0..99 * w {
                    program.next();
                    executions += 1;
                }
            }
        }
    }
    let totals = TraceTotals {
        spatial_records: 0,
        executions,
        records,
        samples: writer.samples(),
        dropped: Dropped::default(),
        exit: None,
        complete: true,
        interrupted: None,
        escapes: Vec::new(),
        escape_counts_missing: 0,
        execs_untraced: 0,
        execs_untraced_micros: 0,
    };
    let samples = writer.samples();
    writer.finish(&totals).unwrap().commit().unwrap();
    (std::fs::metadata(path).unwrap().len(), samples)
}

/// `--codec`: the trace writer and reader alone, on records generated
/// beforehand (so the program's generator is not timed).
fn codec(records: u64, repeats: usize) {
    let mut program = Program {
        mixed_run_log2: 18,
        only_phase: None,
        rng: 0x2545_f491_4f6c_dd1d,
        phase: 0,
        left: 0,
        i: 0,
    };
    let mix: Vec<(u32, u64)> = (0..records).map(|_| program.next()).collect();
    let strided: Vec<(u32, u64)> = (0..records)
        .map(|i| ((i % 4) as u32, A + ((i % 4) << 24) + 8 * (i / 4)))
        .collect();
    println!("trace codec: {records} records per trace, {repeats} repeats, one core");
    for (name, trace) in [("analysis mix", &mix), ("strided", &strided)] {
        let mut bytes = Vec::new();
        let mut write_rates = Vec::new();
        let mut batch_rates = Vec::new();
        let mut read_rates = Vec::new();
        let mut visit_rates = Vec::new();
        for _ in 0..repeats {
            let started = Instant::now();
            let mut writer =
                TraceWriter::new(Vec::with_capacity(bytes.len()), &header(None)).unwrap();
            writer.begin_sample(0).unwrap();
            for &(load, addr) in trace.iter() {
                writer.push(load, addr).unwrap();
            }
            let totals = TraceTotals {
                spatial_records: 0,
                executions: records,
                records,
                samples: 1,
                dropped: Dropped::default(),
                exit: None,
                complete: true,
                interrupted: None,
                escapes: Vec::new(),
                escape_counts_missing: 0,
                execs_untraced: 0,
                execs_untraced_micros: 0,
            };
            bytes = writer.finish(&totals).unwrap();
            write_rates.push(records as f64 / started.elapsed().as_secs_f64() / 1e6);
            // The collector's path: `push_records` of message-sized batches
            // (a full runtime buffer is 5447 records); the same bytes.
            let started = Instant::now();
            let mut writer =
                TraceWriter::new(Vec::with_capacity(bytes.len()), &header(None)).unwrap();
            writer.begin_sample(0).unwrap();
            for batch in trace.chunks(5447) {
                writer.push_records(batch).unwrap();
            }
            let batched = writer.finish(&totals).unwrap();
            batch_rates.push(records as f64 / started.elapsed().as_secs_f64() / 1e6);
            assert!(batched == bytes, "push_records wrote other bytes than push");
            let started = Instant::now();
            let mut reader = TraceReader::new(&bytes[..]).unwrap();
            let mut checksum = 0u64;
            let mut n = 0u64;
            while let Some(r) = reader.next_raw().unwrap() {
                n += 1;
                checksum = checksum.wrapping_add(r.addr ^ u64::from(r.load));
            }
            read_rates.push(n as f64 / started.elapsed().as_secs_f64() / 1e6);
            // The same through `for_each_raw`.
            let started = Instant::now();
            let mut reader = TraceReader::new(&bytes[..]).unwrap();
            let (mut m, mut sum) = (0u64, 0u64);
            reader
                .for_each_raw(|r| {
                    m += 1;
                    sum = sum.wrapping_add(r.addr ^ u64::from(r.load));
                })
                .unwrap();
            assert_eq!((m, sum), (n, checksum));
            visit_rates.push(m as f64 / started.elapsed().as_secs_f64() / 1e6);
            let expected = trace
                .iter()
                .fold(0u64, |c, &(l, a)| c.wrapping_add(a ^ u64::from(l)));
            assert_eq!((n, checksum), (records, expected), "decoded trace differs");
        }
        let stats = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[0], v[v.len() - 1])
        };
        let b = stats(&mut batch_rates);
        let (w, r, v) = (
            stats(&mut write_rates),
            stats(&mut read_rates),
            stats(&mut visit_rates),
        );
        println!(
            "{name:>13}: {:.3} bytes/record; write (push + zstd) {:>6.1} M records/s (min {:.1}, max {:.1}); decode: next_raw {:>6.1} M records/s (min {:.1}, max {:.1}), for_each_raw {:>6.1} (min {:.1}, max {:.1})",
            bytes.len() as f64 / records as f64,
            w.0,
            w.1,
            w.2,
            r.0,
            r.1,
            r.2,
            v.0,
            v.1,
            v.2
        );
        println!(
            "{name:>13}: write (push_records of 5447) {:>6.1} M records/s (min {:.1}, max {:.1})",
            b.0, b.1, b.2
        );
    }
}
