//! `analyze --lackey` on real Valgrind Lackey logs of a small gcc-compiled
//! C program (PIE and fixed-address), checked against an independent
//! reading of the same log: the ELF segments come from goblin directly,
//! the log is parsed here, and per-load counts, the outside-binary count,
//! `A`, `A_const`, `F`, `F_lines` and reuse distances are recomputed from
//! scratch. Needs gcc and valgrind (ci/test.sh installs them).

use memgaze_analysis::Analysis;
use memgaze_trace::LoadClass;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const PROGRAM: &str = r#"
#include <stdio.h>
#include <stdlib.h>

struct item { long key; long value; };

__attribute__((noinline)) long stream_sum(const long *a, int n) {
    long s = 0;
    for (int i = 0; i < n; i++) s += a[i];
    return s;
}

__attribute__((noinline)) long gather(const long *a, const int *idx, int n) {
    long s = 0;
    for (int i = 0; i < n; i++) s += a[idx[i]];
    return s;
}

__attribute__((noinline)) long chase(const struct item *items, int n) {
    long s = 0;
    int at = 0;
    for (int i = 0; i < n; i++) { s += items[at].value; at = (int)items[at].key; }
    return s;
}

int main(int argc, char **argv) {
    int n = 1500 + argc;
    long *a = malloc(n * sizeof *a);
    int *idx = malloc(n * sizeof *idx);
    struct item *items = malloc(n * sizeof *items);
    for (int i = 0; i < n; i++) {
        a[i] = i;
        idx[i] = (int)((i * 7919L) % n);
        items[i].key = (i * 31 + 7) % n;
        items[i].value = i;
    }
    long s = stream_sum(a, n) + gather(a, idx, n) + chase(items, n) + stream_sum(a, n / 2);
    printf("%ld\n", s);
    return 0;
}
"#;

struct Built {
    _dir: tempfile::TempDir,
    exe: PathBuf,
    log: PathBuf,
}

fn build_and_trace(pie: bool) -> Built {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("prog.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let exe = dir.path().join("prog");
    let mut gcc = Command::new("gcc");
    gcc.args(["-O1", "-g", "-o"]).arg(&exe).arg(&src);
    if !pie {
        gcc.arg("-no-pie");
    }
    let status = gcc.status().expect("gcc is installed (ci/test.sh)");
    assert!(status.success(), "gcc failed");
    let log = dir.path().join("lackey.log");
    let out = Command::new("valgrind")
        .args(["--tool=lackey", "--trace-mem=yes"])
        .arg(format!("--log-file={}", log.display()))
        .arg(&exe)
        .output()
        .expect("valgrind is installed (ci/test.sh)");
    assert!(
        out.status.success(),
        "valgrind failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Built {
        _dir: dir,
        exe,
        log,
    }
}

/// `--lackey LOG --binary BINARY`.
fn lackey_args<'a>(log: &'a Path, binary: &'a Path) -> [&'a str; 4] {
    [
        "--lackey",
        log.to_str().unwrap(),
        "--binary",
        binary.to_str().unwrap(),
    ]
}

fn analyze(args: &[&str]) -> std::process::Output {
    crate::support::memgaze_command()
        .arg("analyze")
        .args(args)
        .output()
        .unwrap()
}

/// Runs `analyze` with `args`, checks that it exits with `code` and one
/// line on stderr, and returns that line.
fn fails_with(args: &[&str], code: i32) -> String {
    let out = analyze(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

fn analyze_json(built: &Built, extra: &[&str]) -> Analysis {
    let mut args = lackey_args(&built.log, &built.exe).to_vec();
    args.extend_from_slice(&["--format", "json"]);
    args.extend_from_slice(extra);
    let out = analyze(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("analysis JSON")
}

/// The log read independently: per file-relative load ip, the addresses
/// loaded, in order; and the loads outside the executable's code.
struct Reference {
    loads: Vec<(u64, u64)>,
    outside: u64,
    symbols: Vec<(u64, u64, String)>,
}

fn reference(built: &Built) -> Reference {
    let bytes = std::fs::read(&built.exe).unwrap();
    let elf = goblin::elf::Elf::parse(&bytes).unwrap();
    let base = if elf.header.e_type == goblin::elf::header::ET_DYN {
        0x108000
    } else {
        0
    };
    let code: Vec<(u64, u64)> = elf
        .program_headers
        .iter()
        .filter(|p| p.p_type == goblin::elf::program_header::PT_LOAD && p.is_executable())
        .map(|p| (p.p_vaddr, p.p_vaddr + p.p_memsz))
        .collect();
    let symbols = elf
        .syms
        .iter()
        .filter(|s| s.is_function() && s.st_size > 0)
        .map(|s| {
            (
                s.st_value,
                s.st_value + s.st_size,
                elf.strtab.get_at(s.st_name).unwrap_or("").to_string(),
            )
        })
        .collect();
    let text = std::fs::read_to_string(&built.log).unwrap();
    let mut current: Option<u64> = None;
    let mut loads = Vec::new();
    let mut outside = 0;
    for line in text.lines() {
        let hex = |s: &str| u64::from_str_radix(s.trim().split(',').next().unwrap(), 16).unwrap();
        if let Some(rest) = line.strip_prefix("I ") {
            let ip = hex(rest) - base;
            current = code
                .iter()
                .any(|&(lo, hi)| lo <= ip && ip < hi)
                .then_some(ip);
        } else if let Some(rest) = line
            .strip_prefix(" L ")
            .or_else(|| line.strip_prefix(" M "))
        {
            match current {
                Some(ip) => loads.push((ip, hex(rest))),
                None => outside += 1,
            }
        }
    }
    Reference {
        loads,
        outside,
        symbols,
    }
}

fn lru_distances(blocks: &[u64]) -> Vec<Option<u64>> {
    let mut stack: Vec<u64> = Vec::new();
    blocks
        .iter()
        .map(|&b| {
            let d = stack.iter().rev().position(|&x| x == b).map(|i| i as u64);
            stack.retain(|&x| x != b);
            stack.push(b);
            d
        })
        .collect()
}

fn check_against_reference(built: &Built) {
    let got = analyze_json(built, &[]);
    let want = reference(built);

    // Counts per load ip equal the log's.
    let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
    for &(ip, _) in &want.loads {
        *counts.entry(ip).or_default() += 1;
    }
    let got_counts: BTreeMap<u64, u64> = got.loads.iter().map(|l| (l.ip, l.count)).collect();
    assert_eq!(got_counts, counts, "per-load counts");
    assert_eq!(got.coverage.outside_binary, Some(want.outside));
    assert_eq!(got.coverage.records, want.loads.len() as u64);

    // Metrics from the classes the analysis reports.
    let class: HashMap<u64, LoadClass> = got.loads.iter().map(|l| (l.ip, l.class)).collect();
    let accesses: Vec<u64> = want
        .loads
        .iter()
        .filter(|(ip, _)| class[ip] != LoadClass::Constant)
        .map(|&(_, addr)| addr)
        .collect();
    let s = &got.summary;
    assert_eq!(s.a, accesses.len() as u64);
    assert_eq!(s.a + s.a_const, want.loads.len() as u64);
    assert_eq!(s.f, accesses.iter().collect::<HashSet<_>>().len() as u64);
    assert_eq!(
        s.f_lines,
        accesses
            .iter()
            .map(|a| a >> 6)
            .collect::<HashSet<_>>()
            .len() as u64
    );
    let ds: Vec<u64> = lru_distances(&accesses.iter().map(|a| a >> 6).collect::<Vec<_>>())
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(s.d_max, ds.iter().copied().max());
    let mean = ds.iter().sum::<u64>() as f64 / ds.len() as f64;
    assert!((s.d_mean.unwrap() - mean).abs() < 1e-9 * mean.max(1.0));
    assert_eq!(s.rho, Some(1.0));
    assert!(!got.run.full || got.run.window.is_none());

    // The kernels are found by name, with their loads and classes.
    for name in ["stream_sum", "gather", "chase"] {
        let f = got
            .functions
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("function {name} missing"));
        let &(lo, hi, _) = want.symbols.iter().find(|(_, _, n)| n == name).unwrap();
        let in_function = want
            .loads
            .iter()
            .filter(|(ip, _)| lo <= *ip && *ip < hi)
            .count() as u64;
        assert_eq!(f.a + f.a_const, in_function, "{name}");
        assert!(
            f.hot_loads
                .iter()
                .all(|l| l.line.as_deref().is_some_and(|l| l.contains("prog.c:")))
        );
    }
    let loads_of = |name: &str| {
        let f = got.functions.iter().find(|f| f.name == name).unwrap();
        f.hot_loads.iter().map(|h| class[&h.ip]).collect::<Vec<_>>()
    };
    assert!(loads_of("stream_sum").contains(&LoadClass::Strided));
    assert!(loads_of("chase").contains(&LoadClass::Irregular));
}

#[test]
fn pie_log_matches_an_independent_reading() {
    // One build and trace serves both checks (valgrind is the slow part).
    let built = build_and_trace(true);
    check_against_reference(&built);
    functions_filter_load_base_and_usage_errors(&built);
}

#[test]
fn fixed_address_log_matches_an_independent_reading() {
    check_against_reference(&build_and_trace(false));
}

fn functions_filter_load_base_and_usage_errors(built: &Built) {
    let want = reference(built);

    // --functions keeps exactly the loads of matching functions.
    let got = analyze_json(built, &["--functions", "gather"]);
    let &(lo, hi, _) = want.symbols.iter().find(|(_, _, n)| n == "gather").unwrap();
    let expected = want
        .loads
        .iter()
        .filter(|(ip, _)| lo <= *ip && *ip < hi)
        .count() as u64;
    assert_eq!(got.summary.a + got.summary.a_const, expected);
    assert!(
        got.loads
            .iter()
            .all(|l| l.function.as_deref() == Some("gather"))
    );
    assert_eq!(
        got.coverage.filtered_out,
        want.loads.len() as u64 - expected
    );

    // An explicit --load-base equal to Valgrind's gives the same result; a
    // wrong one leaves every load outside the binary.
    let explicit = analyze_json(built, &["--load-base", "0x108000"]);
    assert_eq!(explicit.summary, analyze_json(built, &[]).summary);
    let wrong = analyze_json(built, &["--load-base", "0"]);
    assert_eq!(wrong.summary.a + wrong.summary.a_const, 0);
    assert_eq!(
        wrong.coverage.outside_binary,
        Some(want.outside + want.loads.len() as u64)
    );

    // ... and says so on stderr, the only sign besides an empty analysis.
    let out = analyze(
        &[
            &lackey_args(&built.log, &built.exe)[..],
            &["--load-base", "0"],
        ]
        .concat(),
    );
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("lackey.log") && err.contains("none of its") && err.contains("--load-base"),
        "{err}"
    );

    // A --functions glob that matches no function of the binary is an
    // error naming the binary, not an empty analysis.
    let err = fails_with(
        &[
            &lackey_args(&built.log, &built.exe)[..],
            &["--functions", "gahter"],
        ]
        .concat(),
        1,
    );
    assert!(
        err.contains("no function matches --functions gahter") && err.contains("prog"),
        "{err}"
    );

    // The log of one build against another build of the same program: the
    // instruction lengths at the logged addresses do not match.
    let other = built.exe.with_extension("O0");
    let status = Command::new("gcc")
        .args(["-O0", "-g", "-o"])
        .arg(&other)
        .arg(built.exe.with_extension("c"))
        .status()
        .unwrap();
    assert!(status.success());
    let err = fails_with(&lackey_args(&built.log, &other), 1);
    assert!(
        err.contains("lackey.log") && err.contains("does not match") && err.contains("prog.O0"),
        "{err}"
    );

    // Usage errors: exit 2 with one line.
    let err = fails_with(&["--lackey", built.log.to_str().unwrap()], 2);
    assert!(err.contains("--lackey needs --binary"), "{err}");

    // A file that is not a Lackey log: exit 1, one line naming it.
    let bogus = built.exe.with_extension("txt");
    std::fs::write(&bogus, "hello\nworld\n").unwrap();
    let err = fails_with(&lackey_args(&bogus, &built.exe), 1);
    assert!(
        err.contains("prog.txt") && err.contains("not a Valgrind Lackey log"),
        "{err}"
    );

    // A log cut short in the middle of a load line says it is truncated.
    let log = std::fs::read(&built.log).unwrap();
    let line = log
        .windows(4)
        .position(|w| w == b"\n L ")
        .expect("a load line");
    let cut = built.exe.with_extension("cut.log");
    std::fs::write(&cut, &log[..line + 6]).unwrap();
    let err = fails_with(&lackey_args(&cut, &built.exe), 1);
    assert!(
        err.contains("prog.cut.log")
            && err.contains("truncated log: it ends in the middle of line"),
        "{err}"
    );

    // The binary must be an executable.
    fails_with(&lackey_args(&built.log, &bogus), 1);
}
