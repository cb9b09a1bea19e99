//! The committed golden snapshots of the bundled microbenchmarks
//! (`cargo memgaze golden -p microbenches` writes them; `cargo memgaze
//! validate` reads them).
//!
//! This file lives in `golden/` on purpose: `cargo insta review` looks for
//! pending `.snap.new` files in package and target source directories, so a
//! test target here is what lets it find the ones `cargo memgaze golden`
//! writes. The test itself checks the snapshots are complete and readable:
//! one per microbenchmark, none orphaned, each parsed by insta's own reader
//! and by ours, recorded at the default size in the bench profile.

use memgaze::golden::{GoldenStore, SnapshotFile};
use std::path::Path;

#[test]
fn every_microbenchmark_has_a_readable_golden_snapshot() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../golden");
    let store = GoldenStore::new(&dir);
    let names: Vec<String> = microbenches::kernels::KERNEL_NAMES
        .iter()
        .map(|n| n.to_string())
        .collect();
    for name in &names {
        let path = store.path("microbenches", "micro", name);
        let file = store
            .read("microbenches", "micro", name)
            .unwrap()
            .unwrap_or_else(|| panic!("no golden snapshot {}", path.display()));
        let m = &file.metrics;
        assert_eq!(
            (m.package.as_str(), m.bench.as_str()),
            ("microbenches", name.as_str())
        );
        // Full trace at the default size: 100 sweeps of 500 000 elements.
        assert_eq!(m.summary.samples, 1, "{name}");
        assert!(m.summary.a >= 50_000_000, "{name}: A = {}", m.summary.a);
        assert_eq!(m.trace_windows.last().map(|r| r.k), Some(20), "{name}");
        assert_eq!(file.meta.facts.profile, "bench");
        assert_eq!(
            file.meta.facts.env, "",
            "{name}: recorded with non-default sizes"
        );
        let snapshot = insta::Snapshot::from_file(&path).unwrap();
        assert_eq!(snapshot.as_text().unwrap().to_string(), file.contents());
        assert_eq!(
            SnapshotFile::parse(&std::fs::read_to_string(&path).unwrap()).unwrap(),
            file
        );
    }
    let orphans = store.orphans("microbenches", "micro", &names);
    assert!(orphans.is_empty(), "orphaned snapshots: {orphans:?}");
}
