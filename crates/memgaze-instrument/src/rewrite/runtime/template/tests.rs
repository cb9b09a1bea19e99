use super::super::{assemble, generate};
use super::derive::MAX_ESCAPE_SITES;
use super::*;
use std::cell::RefCell;

/// The environment variable that rewrites `templates.bin` from the
/// assembler instead of comparing it.
const BLESS_ENV: &str = "MEMGAZE_BLESS_RUNTIME";

fn stored_keys() -> Vec<(bool, bool, (u32, u32))> {
    let keys = RefCell::new(Vec::new());
    let none = parse(TEMPLATES, |shape| {
        keys.borrow_mut()
            .push((shape.cpu_test, shape.chains_fini, shape.escape_sites));
        false
    });
    assert!(none.is_none());
    keys.into_inner()
}

#[test]
fn stored_templates_are_what_the_assembler_produces() {
    let derived = derive::shapes();
    if std::env::var_os(BLESS_ENV).is_some_and(|v| v == "1") {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/rewrite/runtime/templates.bin"
        );
        std::fs::write(path, derive::serialize(&derived)).unwrap();
        return;
    }
    let hint = format!("the runtime changed: rerun this test with {BLESS_ENV}=1");
    let keys: Vec<_> = derived
        .iter()
        .map(|s| (s.cpu_test, s.chains_fini, s.escape_sites))
        .collect();
    assert_eq!(stored_keys(), keys, "{hint}");
    for shape in &derived {
        let stored = parse(TEMPLATES, |s| {
            (s.cpu_test, s.chains_fini, s.escape_sites)
                == (shape.cpu_test, shape.chains_fini, shape.escape_sites)
        });
        assert_eq!(stored.as_ref(), Some(shape), "{hint}");
    }
    // Every escape count up to the limit has its template.
    for cpu_test in [false, true] {
        for chains_fini in [false, true] {
            let mut covered: Vec<_> = keys
                .iter()
                .filter(|k| (k.0, k.1) == (cpu_test, chains_fini))
                .map(|k| k.2)
                .collect();
            covered.sort_unstable();
            assert_eq!(covered.first().map(|c| c.0), Some(0));
            assert_eq!(covered.last().map(|c| c.1), Some(MAX_ESCAPE_SITES));
            assert!(covered.windows(2).all(|w| w[0].1 + 1 == w[1].0));
        }
    }
}

/// Placements unlike the canonical one: every address moved, by amounts
/// that are not multiples of a page or of each other (within the ±2 GiB
/// of `rip`-relative operands).
fn placements() -> Vec<RuntimeParams> {
    let mut all = Vec::new();
    for (code_va, state_va, entry) in [
        (0x7_1234_5670, 0x7_2000_0128, 0x7_0002_3450),
        (0x5_2000_0040, 0x5_0009_1238, 0x5_6789_abc0),
    ] {
        for has_regions in [false, true] {
            for cpu_features in [0, super::super::CPUID7_EBX_BMI2] {
                for original_fini in [None, Some(entry + 0x777)] {
                    for escape_sites in [0, 1, 2, 3, 6, 7, 8, 9, 100, 126, 127] {
                        all.push(RuntimeParams {
                            code_va,
                            header_va: code_va - 64,
                            state_va,
                            original_entry: entry,
                            original_fini,
                            has_regions,
                            escape_sites,
                            cpu_features,
                        });
                    }
                }
            }
        }
    }
    all
}

#[test]
fn filled_templates_equal_assembled_runtimes() {
    for params in placements() {
        let filled = instantiate(&params).expect("a template fits");
        assert_eq!(filled, assemble(&params).unwrap().0, "{params:?}");
    }
}

#[test]
fn placements_no_template_fits_are_assembled() {
    let mut many_escapes = placements()[0];
    many_escapes.escape_sites = MAX_ESCAPE_SITES + 1;
    // The chained entry point right after the entry hook's jump to it: a
    // short jump, which the template's 4-byte field cannot be.
    let mut near_entry = placements()[0];
    let shape = parse(TEMPLATES, |s| s.fits(&near_entry)).unwrap();
    let jump = shape
        .holes
        .iter()
        .find(|h| h.coefficients[3] != 0)
        .expect("the entry hook jumps to the original entry");
    near_entry.original_entry = near_entry.code_va + u64::from(jump.offset) + 4 + 16;
    // A chained entry point out of a `rel32`'s reach.
    let mut far_entry = placements()[0];
    far_entry.original_entry = far_entry.code_va + (1 << 32);
    for params in [many_escapes, near_entry, far_entry] {
        assert!(instantiate(&params).is_none(), "{params:?}");
        assert_eq!(
            generate(&params).ok(),
            assemble(&params).ok().map(|(runtime, _)| runtime)
        );
    }
}
