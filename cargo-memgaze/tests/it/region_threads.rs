//! Threads that exist before a measured region begins and outlive it (a
//! rayon pool's workers): a full trace records every load they run in the
//! region (a region is process-wide), and a sampled trace still counts
//! every execution.

use crate::rewriter_support;

use rewriter_support::*;

/// `region_threads.c`: 4 workers × `inside(20000)` in the region.
const REGION_LOADS: u64 = 4 * 20_000;

#[test]
fn loads_of_threads_that_predate_the_region_are_recorded() {
    region_loads_are_recorded_or_counted("none");
}

/// With libc instrumented, each worker's first instrumented loads are
/// libc's (`start_thread`), before the thread has a slot: the library must
/// reach the runtime that creates it rather than hide the worker's next
/// loads behind an uncounted re-check countdown.
#[test]
fn loads_of_threads_that_start_in_instrumented_libc_are_recorded() {
    region_loads_are_recorded_or_counted("default");
}

fn region_loads_are_recorded_or_counted(libs: &str) {
    let binary = build("region_threads.c", &["-O1", "-g", "-pthread"]);
    let inst = instrument(&binary, None, "region-threads");
    let inside = inst
        .annotation
        .functions
        .iter()
        .find(|f| f.name == "inside")
        .expect("inside()");
    let range = inside.start..inside.start + inside.size;

    let trace = scratch().join(format!("region-threads-full-{libs}.trace"));
    let out = record(&inst.path, &[], &["--full", "--libs", libs], &trace, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let full = read_trace(&trace);
    let t = full.totals;
    let recorded: u64 = full
        .by_ip
        .iter()
        .filter(|(ip, _)| range.contains(ip))
        .map(|(_, addrs)| addrs.len() as u64)
        .sum();
    // In a full trace a thread outside a region re-checks the switch at
    // every load: the workers waiting since before the region miss none of
    // its loads (they used to run up to 4096 each unrecorded, counted as
    // dropped, and the trace was incomplete).
    assert_eq!(
        (recorded, t.dropped.records),
        (REGION_LOADS, 0),
        "(recorded, dropped) in `inside`: {t:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(t.executions, t.records, "{t:?}");
    assert!(t.complete, "{t:?}");

    // Sampled: every execution in the region is counted (ρ stays exact).
    let trace = scratch().join(format!("region-threads-sampled-{libs}.trace"));
    let out = record(
        &inst.path,
        &[],
        &[
            "--period", "1000", "--window", "100", "--seed", "3", "--libs", libs,
        ],
        &trace,
        None,
    );
    assert!(out.status.success());
    let sampled = read_trace(&trace);
    if libs == "none" {
        assert_eq!(
            sampled.totals.executions, t.executions,
            "{:?}",
            sampled.totals
        );
    } else {
        // libc's barrier waits run a timing-dependent number of loads: the
        // executable's region loads are all counted, libc's vary by run.
        assert!(
            sampled.totals.executions >= REGION_LOADS,
            "{:?}",
            sampled.totals
        );
    }
}

/// Builds the `pool-threads` fixture crate (rayon and a `std::thread`
/// pool) once per test process, release profile, offline.
fn pool_threads() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("pool-threads");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            run_ok(
                std::process::Command::new(cargo)
                    .args([
                        "build",
                        "--release",
                        "--offline",
                        "--locked",
                        "--manifest-path",
                    ])
                    .arg(memgaze_fixtures::fixtures().join("pool-threads/Cargo.toml"))
                    .arg("--target-dir")
                    .arg(&target)
                    .env_remove("RUSTFLAGS")
                    .env_remove("CARGO_ENCODED_RUSTFLAGS"),
            );
            target.join("release/pool-threads")
        })
        .clone()
}

/// A rayon `par_chunks` sum and a `std::thread::spawn` pool, both on
/// threads created before their region that outlive it, under `--full`:
/// per instrumented load of the functions that run only in the regions,
/// the records are what Valgrind Lackey sees on the original program,
/// none dropped.
#[test]
fn rayon_and_thread_pool_loads_match_lackey() {
    let binary = pool_threads();
    let inst = instrument(&binary, None, "pool-threads");
    let seen = lackey(&binary, &[], None);
    let trace_path = scratch().join("pool-threads-full.trace");
    let out = record(&inst.path, &[], &["--full"], &trace_path, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The program's own result is the original's.
    let native = native(&binary, &[], None);
    assert_eq!(out.stdout, native.stdout);
    let trace = read_trace(&trace_path);
    let t = trace.totals;
    assert_eq!(t.executions, t.records + t.dropped.records, "{t:?}");
    assert_eq!(t.complete, t.dropped.records == 0, "{t:?}");
    if t.dropped.records > 0 {
        assert!(stderr.contains("records dropped"), "{stderr}");
    }
    let mut missing_total = 0;
    for (function, expected) in [("rayon_chunk", 120_000u64), ("pool_chunk", 120_000)] {
        let f = inst
            .annotation
            .functions
            .iter()
            .find(|f| f.name.ends_with(function))
            .unwrap_or_else(|| panic!("{function} in the annotation"));
        let range = f.start..f.start + f.size;
        let (mut lackey_loads, mut recorded) = (0u64, 0u64);
        for load in inst
            .annotation
            .loads
            .iter()
            .filter(|l| l.instrumented && range.contains(&l.ip))
        {
            let lackey_n = seen.get(&load.ip).map_or(0, |v| v.len() as u64);
            let got = trace.by_ip.get(&load.ip).map_or(0, |v| v.len() as u64);
            assert!(
                got <= lackey_n,
                "{function} {:#x}: {got} records, Lackey saw {lackey_n}",
                load.ip
            );
            lackey_loads += lackey_n;
            recorded += got;
        }
        // Every element is loaded once in the region (one load per
        // element: the folds are not vectorised).
        assert_eq!(lackey_loads, expected, "{function}: Lackey");
        missing_total += lackey_loads - recorded;
        eprintln!(
            "{function}: {recorded} recorded of {lackey_loads} Lackey loads; {} dropped in the trace",
            t.dropped.records
        );
    }
    assert_eq!(
        (missing_total, t.dropped.records),
        (0, 0),
        "(loads missing, dropped): {t:?}"
    );
    assert!(t.complete, "{t:?}");
}
