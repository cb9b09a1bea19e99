//! `cargo memgaze dump` and `analyze` through the built binary: output,
//! exit codes and one-line errors for bad trace files.

use memgaze_trace::{
    Backend, FunctionEntry, LoadClass, LoadEntry, Sampling, TraceHeader, TraceTotals, TraceWriter,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    crate::support::memgaze_command()
}

fn header() -> TraceHeader {
    TraceHeader {
        backend: Backend::Soft,
        sampling: Sampling {
            window: 64,
            period: 640,
            seed: Some(1),
        },
        binary: None,
        command: vec!["demo".into()],
        functions: vec![
            FunctionEntry {
                name: "walk".into(),
                start: 0x1000,
                end: 0x1100,
            },
            FunctionEntry {
                name: "sum".into(),
                start: 0x1100,
                end: 0x1200,
            },
        ],
        loads: vec![
            LoadEntry {
                ip: 0x1010,
                class: LoadClass::Strided,
                implied: 1,
                function: Some(0),
                line: Some("demo.c:10".into()),
                proxy: None,
            },
            LoadEntry {
                ip: 0x1120,
                class: LoadClass::Irregular,
                implied: 0,
                function: Some(1),
                line: Some("demo.c:20".into()),
                proxy: None,
            },
            LoadEntry {
                ip: 0x1130,
                class: LoadClass::Constant,
                implied: 0,
                function: Some(1),
                line: None,
                proxy: None,
            },
        ],
        labels: vec![],
        spatial: None,
    }
}

/// A sampled trace: 10 samples of 64 records mixing the three loads.
fn write_trace(path: &Path) {
    let mut w = TraceWriter::create(path, &header()).unwrap();
    let mut x = 12345u64;
    for s in 0..10u64 {
        w.begin_sample(0).unwrap();
        for i in 0..64u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            match i % 4 {
                0 | 1 => w.push(0, 0x10_0000 + 8 * (s * 64 + i)).unwrap(),
                2 => w.push(1, 0x20_0000 + 8 * ((x >> 33) % 512)).unwrap(),
                _ => w.push(2, 0x7ffc_0000).unwrap(),
            }
        }
    }
    let totals = TraceTotals::clean(6400, 640, 10);
    w.finish(&totals).unwrap().commit().unwrap();
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn trace_in(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("demo.trace");
    write_trace(&path);
    path
}

fn stderr_line(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(text.lines().count(), 1, "stderr is not one line: {text:?}");
    assert!(!text.contains("panicked"), "{text}");
    text.trim_end().to_string()
}

#[test]
fn dump_prints_header_records_and_totals() {
    let dir = tempdir();
    let trace = trace_in(&dir);
    let out = bin().arg("dump").arg(&trace).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("w = 64 records per period of 640"));
    assert!(text.contains("demo.c:10"));
    assert!(text.contains("0 0 0x1010 0x100000 Strided 1"), "{text}");
    assert!(text.contains("totals      640 records in 10 samples"));
    assert_eq!(
        text.lines().filter(|l| l.contains(" Irregular ")).count(),
        160 + 1
    );

    let out = bin()
        .args(["memgaze", "dump", "--limit", "5"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("… 635 more records not shown"), "{text}");
}

/// Each bad input: exit 1, one line on stderr naming the file and the problem.
#[test]
fn bad_trace_files_give_one_line_and_exit_1() {
    let dir = tempdir();
    let good = std::fs::read(trace_in(&dir)).unwrap();
    let mut future = good.clone();
    future[8] = memgaze_trace::format::VERSION as u8 + 1;
    let mut old = good.clone();
    old[8] = 1;
    let mut flipped = good.clone();
    let at = good.len() / 2;
    flipped[at] ^= 0x10;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "empty file"),
        (
            "text",
            b"I  0401000,3\n L 1ffe,8\n".to_vec(),
            "not a memgaze trace",
        ),
        ("future", future, "is newer than this cargo memgaze reads"),
        (
            "old",
            old,
            "version 1 is older than this cargo memgaze reads",
        ),
        (
            "truncated",
            good[..good.len() - 40].to_vec(),
            "truncated trace",
        ),
        ("corrupt", flipped, "corrupt trace"),
    ];
    for command in ["dump", "analyze"] {
        for (name, bytes, expected) in &cases {
            let path = dir.path().join(format!("{name}.trace"));
            std::fs::write(&path, bytes).unwrap();
            let out = bin().arg(command).arg(&path).output().unwrap();
            assert_eq!(out.status.code(), Some(1), "{command} {name}");
            let line = stderr_line(&out);
            assert!(line.starts_with("error: "), "{line}");
            assert!(line.contains(&format!("{name}.trace")), "{line}");
            assert!(line.contains(expected), "{command} {name}: {line}");
        }
    }
    let out = bin()
        .arg("dump")
        .arg(dir.path().join("missing.trace"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_line(&out).contains("missing.trace: cannot open"));
}

/// The JSON document has exactly the field names of docs/CLI.md.
#[test]
fn analyze_json_has_the_cli_md_fields() {
    let dir = tempdir();
    let trace = trace_in(&dir);
    let out = bin()
        .args(["analyze", "--format", "json"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], "memgaze.analysis.v1");
    let has = |object: &serde_json::Value, keys: &[&str], what: &str| {
        for key in keys {
            assert!(object.get(key).is_some(), "{what} lacks {key}: {object}");
        }
    };
    has(
        &v["summary"],
        &[
            "A",
            "A_const",
            "A_const_frac",
            "kappa",
            "rho",
            "samples",
            "F",
            "F_lines",
            "F_str",
            "F_irr",
            "F_str_frac",
            "F_irr_frac",
            "dF",
            "D_mean",
            "D_max",
        ],
        "summary",
    );
    let row = &v["trace_windows"][0];
    has(
        row,
        &["k", "windows", "F", "F_lines", "dF", "F_str", "F_irr"],
        "trace window",
    );
    assert_eq!(row["k"], 3);
    let f = &v["functions"][0];
    has(
        f,
        &[
            "name",
            "A",
            "A_const",
            "A_const_frac",
            "dF",
            "F_str_frac",
            "F_irr_frac",
            "D_mean",
            "trace_windows",
        ],
        "function",
    );
    let load = &v["loads"][0];
    has(load, &["ip", "class", "count", "function", "line"], "load");
    assert!(load["ip"].as_str().unwrap().starts_with("0x"));
    let region = &v["regions"][0];
    has(
        region,
        &["start", "end", "A", "blocks", "D_mean", "functions"],
        "region",
    );
    // 10 samples of 64: a sampled trace, ρ = 6400 / 640.
    assert_eq!(v["summary"]["rho"], 10.0);
    assert_eq!(v["summary"]["samples"], 10);

    // The table for people, and -o.
    let table = dir.path().join("table.txt");
    let out = bin()
        .args(["analyze", "--top", "3", "-o"])
        .arg(&table)
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&table).unwrap();
    for section in [
        "Summary",
        "Trace windows",
        "Functions",
        "Loads",
        "Hot regions",
        "Reuse distance",
    ] {
        assert!(text.contains(section), "{section} missing:\n{text}");
    }
    assert!(
        text.contains("walk") && text.contains("demo.c:10"),
        "{text}"
    );
}

#[test]
fn analyze_usage_errors_exit_2() {
    let dir = tempdir();
    let trace = trace_in(&dir);
    for args in [
        vec!["analyze", "--code-window", "1000"],
        vec!["analyze", "--binary", "/bin/true"],
        vec!["analyze"],
    ] {
        let out = bin().args(&args).arg(&trace).output().unwrap();
        let code = out.status.code();
        if args.len() == 1 {
            // No trace at all: the trace is given here, so this one succeeds.
            assert_eq!(code, Some(0));
            continue;
        }
        assert_eq!(
            code,
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = bin().arg("analyze").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    for bad in [
        ["--block", "48"],
        ["--min-page", "32"],
        ["--hot-threshold", "101"],
    ] {
        let out = bin().arg("analyze").args(bad).arg(&trace).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}

#[test]
fn analyze_functions_filter_matching_nothing_is_an_error() {
    let dir = tempdir();
    let trace = trace_in(&dir);
    let out = bin()
        .args(["analyze", "--functions", "wlak*"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let line = stderr_line(&out);
    assert!(
        line.contains("demo.trace") && line.contains("no function matches --functions wlak*"),
        "{line}"
    );
    // A glob that matches keeps working.
    let out = bin()
        .args(["analyze", "--functions", "wa*"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
