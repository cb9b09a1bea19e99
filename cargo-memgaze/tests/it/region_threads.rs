//! Threads that exist before a measured region begins and outlive it (a
//! rayon pool's workers): their loads in the region are recorded, or the
//! trace says how many were lost — it never claims to be complete with
//! records missing — and a sampled trace still counts every execution.

use crate::rewriter_support;

use rewriter_support::*;

/// `region_threads.c`: 4 workers × `inside(20000)` in the region.
const REGION_LOADS: u64 = 4 * 20_000;

#[test]
fn loads_of_threads_that_predate_the_region_are_recorded_or_counted_as_lost() {
    let binary = build("region_threads.c", &["-O1", "-g", "-pthread"]);
    let inst = instrument(&binary, None, "region-threads");
    let inside = inst
        .annotation
        .functions
        .iter()
        .find(|f| f.name == "inside")
        .expect("inside()");
    let range = inside.start..inside.start + inside.size;

    let trace = scratch().join("region-threads-full.trace");
    let out = record(&inst.path, &[], &["--full"], &trace, None);
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
    // The workers were put on their 4096-load re-check countdown before
    // the region: whatever they ran before noticing it is counted.
    assert!(
        recorded + t.dropped.records >= REGION_LOADS,
        "{recorded} recorded + {} dropped < {REGION_LOADS}: loads lost without a word ({t:?})",
        t.dropped.records
    );
    assert_eq!(t.executions, t.records + t.dropped.records, "{t:?}");
    assert_eq!(t.complete, t.dropped.records == 0, "{t:?}");
    // The idler ran no load in the region: nothing is counted for it.
    assert!(t.dropped.records <= REGION_LOADS, "{t:?}");
    if t.dropped.records > 0 {
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(text.contains("records dropped"), "{text}");
    }

    // Sampled: every execution in the region is counted (ρ stays exact).
    let trace = scratch().join("region-threads-sampled.trace");
    let out = record(
        &inst.path,
        &[],
        &["--period", "1000", "--window", "100", "--seed", "3"],
        &trace,
        None,
    );
    assert!(out.status.success());
    let sampled = read_trace(&trace);
    assert_eq!(
        sampled.totals.executions, t.executions,
        "{:?}",
        sampled.totals
    );
}
