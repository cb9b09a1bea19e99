//! Every parser and renderer survives bad input (issue 21): per input kind
//! (trace, analysis JSON, results directory, baseline, golden snapshot,
//! annotation, Lackey log, ELF), thousands of deterministically mutated
//! cases (`support/mutate.rs`: bit flips, truncations, splices, numeric
//! and structural JSON mutations) go through the library functions the
//! commands call, each in a thread of its own with a time limit: an error
//! is fine, a panic or a hang fails the test and names the case
//! (`MEMGAZE_FUZZ_CASES=N` runs more). A few cases of each command kind go
//! through the binary: exit 0, or exit 1 with exactly one `error:` line.

use crate::support;

use memgaze::gate::{BenchKey, BenchRun, Gate, Limits, load_baseline, save_baseline};
use memgaze::golden::{GoldenMetrics, SnapshotFile};
use memgaze::report::{ReportOptions, report_results};
use memgaze_analysis::{Analysis, AnalysisOptions, analyze_trace};
use memgaze_instrument::binary::Binary;
use memgaze_metadata::annotation::Annotation;
use memgaze_trace::{Sampling, TraceHeader, TraceReader, TraceTotals, TraceWriter};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::mutate::{Rng, cases, mutate_bytes, mutate_json, mutate_json_text, survive};
use support::synthetic::{Kernel, Synthetic, write_trace};

/// Time limit of one case (debug build, a loaded machine).
const LIMIT: Duration = Duration::from_secs(20);

fn analysis_of(trace: &Path) -> Analysis {
    analyze_trace(
        TraceReader::open(trace).unwrap(),
        &AnalysisOptions::default(),
    )
    .unwrap()
}

/// A small sampled trace of a kernel mixing strided and irregular loads.
fn small_trace(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    write_trace(
        &path,
        &Synthetic {
            kernel: Kernel::StrIrr,
            elements: 4_000,
            reps: 4,
            sampling: Some((256, 2_048)),
            seed: 7,
        },
    );
    path
}

fn done(kind: &str, n: u64, started: Instant) {
    eprintln!(
        "{kind}: {n} mutated cases in {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn mutated_traces_are_refused_or_analysed() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(small_trace(dir.path(), "t.mgz")).unwrap();
    let header = TraceReader::new(&bytes[..]).unwrap().header().clone();
    let header_json = serde_json::to_value(&header).unwrap();
    let started = Instant::now();
    let n = cases(3000);
    for case in 0..n {
        let mut rng = Rng::new(case);
        let input = if case % 3 == 2 {
            // Past the checksums: a valid file around a mutated header,
            // odd records and odd totals.
            let Ok(header) =
                serde_json::from_value::<TraceHeader>(mutate_json(&header_json, &mut rng))
            else {
                continue;
            };
            let Ok(mut w) = TraceWriter::new(Vec::new(), &header) else {
                continue;
            };
            let mut records = 0;
            let samples = 1 + rng.below(3) as u64;
            for _ in 0..samples {
                if w.begin_sample((rng.next() >> rng.below(64)) as u32)
                    .is_err()
                {
                    break;
                }
                for _ in 0..rng.below(300) {
                    let load = rng.below(header.loads.len() + 1) as u32;
                    if w.push(load, rng.next() >> rng.below(64)).is_ok() {
                        records += 1;
                    }
                }
            }
            let executions = [0, records / 2, records, rng.next()][rng.below(4)];
            let Ok(bytes) = w.finish(&TraceTotals::clean(executions, records, samples)) else {
                continue;
            };
            bytes
        } else {
            mutate_bytes(&bytes, &mut rng)
        };
        // Every ninth case also through the report (heatmap and
        // per-address charts read the trace itself).
        let report_dir = (case % 9 == 2).then(|| dir.path().join(format!("case-{case}")));
        survive(&format!("trace case {case}"), LIMIT, move || {
            if let Ok(reader) = TraceReader::new(&input[..]) {
                let analysed = analyze_trace(reader, &AnalysisOptions::default());
                if let (Ok(_), Some(out)) = (analysed, report_dir) {
                    std::fs::create_dir(&out).unwrap();
                    let file = out.join("t.mgz");
                    std::fs::write(&file, &input).unwrap();
                    let _ = report_results(&file, &ReportOptions::new(out.join("report")));
                }
            }
        });
    }
    done("trace", n, started);
}

/// The report of an analysis JSON document; rendering is the slow part, so
/// fewer cases than the parsers get.
#[test]
fn mutated_analysis_json_is_refused_or_reported() {
    let dir = tempfile::tempdir().unwrap();
    let analysis = analysis_of(&small_trace(dir.path(), "t.mgz"));
    let value = serde_json::to_value(&analysis).unwrap();
    let drawn = std::sync::Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let n = cases(2000);
    for case in 0..n {
        let mut rng = Rng::new(case);
        let input = mutate_json_text(&value, &mut rng);
        let case_dir = dir.path().join(format!("case-{case}"));
        std::fs::create_dir(&case_dir).unwrap();
        let file = case_dir.join("a.json");
        std::fs::write(&file, &input).unwrap();
        let drawn = drawn.clone();
        survive(&format!("analysis case {case}"), LIMIT, move || {
            let options = ReportOptions::new(case_dir.join("report"));
            if report_results(&file, &options).is_ok() {
                drawn.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    done("analysis JSON", n, started);
    eprintln!("  of which reported: {}", drawn.load(Ordering::Relaxed));
}

/// A results tree (two benches: bench.json, trace.mgz, analysis.json,
/// golden.json) with one file mutated per case.
#[test]
fn mutated_results_directories_are_reported_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    for kernel in [Kernel::StrIrr, Kernel::Irr] {
        support::results::bench_dir(
            &root,
            &Synthetic {
                kernel,
                elements: 4_000,
                reps: 4,
                sampling: Some((256, 2_048)),
                seed: 3,
            },
            true,
        );
    }
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    files.sort();
    let originals: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let started = Instant::now();
    let n = cases(600);
    for case in 0..n {
        let mut rng = Rng::new(case);
        let i = rng.below(files.len());
        let original = &originals[i];
        let mutated = match serde_json::from_slice::<serde_json::Value>(original) {
            Ok(value) => mutate_json_text(&value, &mut rng),
            Err(_) => mutate_bytes(original, &mut rng),
        };
        std::fs::write(&files[i], &mutated).unwrap();
        let (root, out) = (root.clone(), dir.path().join(format!("report-{case}")));
        survive(
            &format!("results case {case} ({})", files[i].display()),
            LIMIT,
            move || {
                let _ = report_results(&root, &ReportOptions::new(out));
            },
        );
        std::fs::write(&files[i], original).unwrap();
    }
    done("results directory", n, started);
}

fn bench_run(analysis: Analysis) -> BenchRun {
    BenchRun {
        key: BenchKey::new("p", "t", "b"),
        analysis,
        binary: None,
        profile: Some("bench".into()),
    }
}

#[test]
fn mutated_baselines_are_refused_or_compared() {
    let dir = tempfile::tempdir().unwrap();
    let analysis = analysis_of(&small_trace(dir.path(), "t.mgz"));
    let root = dir.path().join("memgaze");
    let run = bench_run(analysis);
    let saved = save_baseline(&root, "main", std::slice::from_ref(&run)).unwrap();
    let file = saved.join("p/t/b/baseline.json");
    let value: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let started = Instant::now();
    let n = cases(1500);
    for case in 0..n {
        let mut rng = Rng::new(case);
        std::fs::write(&file, mutate_json_text(&value, &mut rng)).unwrap();
        let (root, run) = (root.clone(), run.clone());
        survive(&format!("baseline case {case}"), LIMIT, move || {
            if let Ok(baseline) = load_baseline(&root, "main") {
                let mut gate = Gate::new(baseline, Limits::defaults(), false);
                if let Ok(verdict) = gate.check(&run) {
                    let _ = verdict.human("main");
                    let _ = verdict.to_messages("main");
                }
            }
        });
    }
    done("baseline", n, started);
}

#[test]
fn mutated_golden_snapshots_are_refused_or_compared() {
    let dir = tempfile::tempdir().unwrap();
    let analysis = analysis_of(&small_trace(dir.path(), "t.mgz"));
    let metrics = GoldenMetrics::from_analysis("p", "t", "b", &analysis);
    let file = SnapshotFile {
        meta: memgaze::golden::SnapshotMeta {
            source: "benches/b.rs".into(),
            expression: "full trace of bench `b`".into(),
            facts: memgaze::golden::BuildFacts {
                rustc: "rustc 1.95.0".into(),
                host: "x86_64-unknown-linux-gnu".into(),
                profile: "bench".into(),
                features: String::new(),
                env: String::new(),
            },
        },
        metrics: metrics.clone(),
    };
    let text = file.to_text();
    let contents: serde_json::Value = serde_json::from_str(&file.contents()).unwrap();
    let head = &text[..text.len() - file.contents().len() - 1];
    let started = Instant::now();
    let n = cases(3000);
    for case in 0..n {
        let mut rng = Rng::new(case);
        let input = if rng.one_in(2) {
            let mut t = head.to_string();
            t.push_str(&String::from_utf8_lossy(&mutate_json_text(
                &contents, &mut rng,
            )));
            t
        } else {
            String::from_utf8_lossy(&mutate_bytes(text.as_bytes(), &mut rng)).into_owned()
        };
        let old = metrics.clone();
        survive(&format!("snapshot case {case}"), LIMIT, move || {
            if let Ok(parsed) = SnapshotFile::parse(&input) {
                let _ = memgaze::golden::snapshot::describe_differences(&old, &parsed.metrics, 20);
                let _ = parsed.to_text();
            }
        });
    }
    done("golden snapshot", n, started);
}

/// A small dynamically linked x86-64 executable every machine has.
fn system_binary() -> PathBuf {
    ["/usr/bin/true", "/bin/true"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("/usr/bin/true")
}

#[test]
fn mutated_annotations_are_refused_or_used() {
    let binary = Binary::open(system_binary()).unwrap();
    let annotation =
        memgaze_instrument::classify::classify_binary(&binary, |_| true).to_annotation(&binary);
    let value: serde_json::Value = serde_json::from_str(&annotation.to_json()).unwrap();
    let started = Instant::now();
    let n = cases(1500);
    for case in 0..n {
        let mut rng = Rng::new(case);
        let text = String::from_utf8_lossy(&mutate_json_text(&value, &mut rng)).into_owned();
        survive(&format!("annotation case {case}"), LIMIT, move || {
            if let Ok(a) = Annotation::from_json(&text) {
                let header = memgaze_record::trace_header(&a, Sampling::full(), vec![]);
                if let Ok(mut w) = TraceWriter::new(Vec::new(), &header) {
                    let _ = w.begin_sample(0);
                    let _ = w.push(0, 0x1000);
                }
                let _ = a.load_at(0x1000);
            }
        });
    }
    done("annotation", n, started);
}

/// A Lackey log of loads at the first instructions of the binary's code.
fn lackey_log(binary: &Binary) -> String {
    let code = binary
        .segments()
        .iter()
        .find(|s| s.is_load() && s.is_executable())
        .unwrap();
    let base = memgaze_record::lackey::VALGRIND_PIE_BASE;
    let mut log = String::from("==1== Lackey, an example Valgrind tool\n==1== Command: ./true\n");
    for i in 0..200u64 {
        let ip = base + code.vaddr + (i * 7) % code.mem_size.max(1);
        log.push_str(&format!(
            "I  {ip:08x},3\n L {:08x},8\n",
            0x1ff_f000 + 64 * i
        ));
        if i % 5 == 0 {
            log.push_str(&format!(
                " S {:08x},8\n M {:08x},4\n",
                0x5000 + i,
                0x6000 + i
            ));
        }
    }
    log
}

#[test]
fn mutated_lackey_logs_are_refused_or_analysed() {
    let binary = std::sync::Arc::new(Binary::open(system_binary()).unwrap());
    let log = lackey_log(&binary);
    let started = Instant::now();
    let n = cases(1500);
    for case in 0..n {
        let mut rng = Rng::new(case);
        let input = mutate_bytes(log.as_bytes(), &mut rng);
        let binary = binary.clone();
        survive(&format!("lackey case {case}"), LIMIT, move || {
            let options = memgaze_record::lackey::LackeyOptions::default();
            let _ = memgaze_record::lackey::import(&input[..], &binary, &options, |_| {});
        });
    }
    done("Lackey log", n, started);
}

/// A log with no newline at all (`/dev/zero`) is refused after one bounded
/// line, not read into memory whole (it aborted on a 4 GB allocation).
#[test]
fn a_lackey_log_without_newlines_is_refused_after_one_bounded_line() {
    let binary = Binary::open(system_binary()).unwrap();
    let zero = std::io::BufReader::new(std::fs::File::open("/dev/zero").unwrap());
    let started = Instant::now();
    let e = memgaze_record::lackey::import(
        zero,
        &binary,
        &memgaze_record::lackey::LackeyOptions::default(),
        |_| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("longer than"), "{e:#}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn mutated_elf_files_are_refused_or_classified() {
    let path = system_binary();
    let bytes = std::fs::read(&path).unwrap();
    let started = Instant::now();
    let n = cases(300);
    for case in 0..n {
        let mut rng = Rng::new(case);
        let input = mutate_bytes(&bytes, &mut rng);
        let path = path.clone();
        survive(&format!("ELF case {case}"), LIMIT, move || {
            if let Ok(binary) = Binary::from_bytes(&path, input, false) {
                let loads = memgaze_instrument::classify::classify_binary(&binary, |_| true);
                let _ = loads.to_annotation(&binary);
            }
        });
    }
    done("ELF", n, started);
}

// --- Through the binary: exit 0, 3 (a mutated baseline can read as a
// regression: `report -q --baseline` then fails the gate, silently), or 1
// with exactly one error line.

fn assert_clean_exit(out: &std::process::Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {}
        Some(3) => {
            assert!(!err.contains("internal error"), "{what}: {err}");
            assert!(!err.contains("panicked"), "{what}: {err}");
        }
        Some(1) => {
            let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
            assert_eq!(errors.len(), 1, "{what}: {err}");
            assert!(!err.contains("internal error"), "{what}: {err}");
            assert!(!err.contains("panicked"), "{what}: {err}");
        }
        other => panic!("{what}: exit {other:?}: {err}"),
    }
}

#[test]
fn the_commands_give_one_error_line_for_mutated_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path(), "t.mgz");
    let bytes = std::fs::read(&trace).unwrap();
    let value = serde_json::to_value(analysis_of(&trace)).unwrap();
    let system = system_binary();
    let log = lackey_log(&Binary::open(&system).unwrap());
    // A results tree with one bench and a baseline of it, for
    // `report --baseline`.
    let root = dir.path().join("memgaze");
    let (_, analysis) = support::results::bench_dir(
        &root,
        &Synthetic {
            kernel: Kernel::Str1,
            elements: 4_000,
            reps: 4,
            sampling: Some((256, 2_048)),
            seed: 3,
        },
        false,
    );
    let mut run = bench_run(analysis);
    run.key = BenchKey::new("microbenches", "micro", "str1");
    let saved = save_baseline(&root, "main", &[run]).unwrap();
    let baseline_file = saved.join("microbenches/micro/str1/baseline.json");
    let baseline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&baseline_file).unwrap()).unwrap();
    let bin = env!("CARGO_BIN_EXE_cargo-memgaze");
    let started = Instant::now();
    let n = cases(160);
    for case in 0..n {
        let mut rng = Rng::new(case);
        let mut cmd = Command::new(bin);
        cmd.arg("memgaze");
        let file = match case % 4 {
            0 => {
                let file = dir.path().join(format!("m{case}.mgz"));
                std::fs::write(&file, mutate_bytes(&bytes, &mut rng)).unwrap();
                cmd.args(["analyze", "--format", "json"]).arg(&file);
                file
            }
            1 => {
                let file = dir.path().join(format!("m{case}.json"));
                std::fs::write(&file, mutate_json_text(&value, &mut rng)).unwrap();
                cmd.args(["report", "-q"]).arg(&file);
                cmd.arg("-o").arg(dir.path().join(format!("r{case}")));
                file
            }
            2 => {
                let file = dir.path().join(format!("m{case}.log"));
                std::fs::write(&file, mutate_bytes(log.as_bytes(), &mut rng)).unwrap();
                cmd.args(["analyze", "--format", "json", "--lackey"])
                    .arg(&file)
                    .arg("--binary")
                    .arg(&system);
                file
            }
            _ => {
                std::fs::write(&baseline_file, mutate_json_text(&baseline, &mut rng)).unwrap();
                cmd.args(["report", "-q", "--baseline", "main"])
                    .arg(&root)
                    .arg("-o")
                    .arg(dir.path().join(format!("r{case}")));
                baseline_file.clone()
            }
        };
        let out = cmd.output().unwrap();
        if let Some(keep) = std::env::var_os("MEMGAZE_FUZZ_KEEP") {
            // Keep the inputs for replaying a failure.
            let name = format!("{case}-{}", file.file_name().unwrap().to_string_lossy());
            let _ = std::fs::copy(&file, Path::new(&keep).join(name));
        }
        assert_clean_exit(&out, &format!("case {case}: {}", file.display()));
    }
    done("command line", n, started);
}

/// `report` of a trace touching 100 000 separate address spans (pages
/// 2 MiB apart): `join_closest` was quadratic (8.9 s for 100 K spans).
/// Prints the time; fails only past 20 s (a debug build on a busy
/// machine), far above the few hundred milliseconds it takes.
#[test]
fn a_report_of_100k_separate_spans_is_fast() {
    let dir = tempfile::tempdir().unwrap();
    let mut header = support::synthetic::header(
        Kernel::Irr,
        Sampling {
            window: 1000,
            period: 1000,
            seed: Some(1),
        },
    );
    header.labels.clear();
    let mut w = TraceWriter::create(&dir.path().join("spans.mgz"), &header).unwrap();
    let spans = 100_000u64;
    let mut rng = Rng::new(5);
    let mut records = 0;
    for s in 0..spans / 1000 {
        w.begin_sample(0).unwrap();
        for i in 0..1000 {
            let span = s * 1000 + i;
            w.push(2, 0x1000_0000 + (span << 21) + 8 * rng.below(512) as u64)
                .unwrap();
            records += 1;
        }
    }
    let samples = w.samples();
    w.finish(&TraceTotals::clean(records, records, samples))
        .unwrap()
        .commit()
        .unwrap();
    let started = Instant::now();
    let out = report_results(
        &dir.path().join("spans.mgz"),
        &ReportOptions::new(dir.path().join("report")),
    )
    .unwrap();
    let elapsed = started.elapsed();
    eprintln!(
        "report of {spans} separate spans ({} charts): {elapsed:?}",
        out.charts.len()
    );
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
}
