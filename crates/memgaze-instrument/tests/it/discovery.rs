//! Function discovery in stripped binaries (`.eh_frame` + gaps) against the
//! `.symtab` of the same program built with symbols, and sanity checks on
//! Debian's stripped system binaries.

use memgaze_fixtures as common;

use memgaze_instrument::binary::{Binary, FunctionSource};
use std::collections::HashSet;

/// Fraction of the sized `.symtab` functions of `unstripped` that discovery
/// on the stripped copy finds with the same start and size, plus the misses.
fn recall(unstripped: &std::path::Path) -> (f64, usize, Vec<String>) {
    let reference = Binary::open(unstripped).unwrap();
    assert!(reference.discovery().has_symtab);
    let stripped = Binary::open(common::stripped(unstripped)).unwrap();
    assert!(!stripped.discovery().has_symtab);
    let found: HashSet<(u64, u64)> = stripped
        .functions()
        .iter()
        .map(|f| (f.start, f.size))
        .collect();
    let symtab: Vec<_> = reference
        .functions()
        .iter()
        .filter(|f| f.source == FunctionSource::Symtab)
        .collect();
    let missed: Vec<String> = symtab
        .iter()
        .filter(|f| !found.contains(&(f.start, f.size)))
        .map(|f| format!("{} {:#x}+{}", f.name, f.start, f.size))
        .collect();
    let frac = 1.0 - missed.len() as f64 / symtab.len() as f64;
    (frac, symtab.len(), missed)
}

fn assert_sane(binary: &Binary) {
    let functions = binary.functions();
    for pair in functions.windows(2) {
        assert!(
            pair[0].end() <= pair[1].start,
            "{} overlaps {}",
            pair[0].name,
            pair[1].name
        );
    }
    for f in functions {
        assert!(f.size > 0);
        assert!(binary.is_code(f.start), "{} outside code", f.name);
        assert!(binary.is_code(f.end() - 1), "{} ends outside code", f.name);
    }
}

#[test]
fn stripped_c_program_functions_match_its_symtab() {
    let dir = tempfile::tempdir().unwrap();
    for opt in ["-O0", "-O2"] {
        let exe = common::gcc("many_functions.c", &[opt], dir.path());
        let (frac, total, missed) = recall(&exe);
        eprintln!("gcc {opt}: {total} symtab functions, recall {frac:.4}, missed {missed:?}");
        assert!(total >= 60, "{total}");
        assert!(frac >= 0.99, "gcc {opt}: recall {frac}, missed {missed:?}");
    }
}

#[test]
fn stripped_rust_program_functions_match_its_symtab() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::rustc("kernels.rs", &[], dir.path());
    let (frac, total, missed) = recall(&exe);
    eprintln!("rustc: {total} symtab functions, recall {frac:.4}, missed {missed:?}");
    assert!(total >= 300, "{total}");
    assert!(frac >= 0.99, "recall {frac}, missed {missed:?}");
}

#[test]
fn discovery_on_debian_system_binaries_is_plausible() {
    for (path, at_least) in [("/usr/bin/gzip", 80), ("/usr/bin/sort", 150)] {
        let binary = Binary::open(path).unwrap();
        let stats = binary.discovery();
        eprintln!("{path}: {} functions, {stats:?}", binary.functions().len());
        assert!(!stats.has_symtab, "{path} is expected to be stripped");
        assert!(binary.functions().len() >= at_least);
        assert!(stats.from_eh_frame > stats.from_gaps * 4);
        assert_sane(&binary);
        // The entry point is a function start and named.
        let entry = binary.function_at(binary.entry()).unwrap();
        assert_eq!(entry.start, binary.entry());
        assert_eq!(entry.name, "_start");
        assert!(binary.identity().build_id.is_some());
        assert!(binary.is_pie());
    }
}

#[test]
fn unstripped_functions_are_named_demangled_and_have_lines() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::rustc("kernels.rs", &[], dir.path());
    let binary = Binary::open(&exe).unwrap();
    assert_sane(&binary);
    let f = binary
        .functions()
        .iter()
        .find(|f| f.name == "stride_sum")
        .expect("stride_sum");
    // A mangled Rust function is demangled without its hash.
    assert!(binary.functions().iter().any(|f| {
        f.name.starts_with("core::")
            && f.raw_name
                .as_deref()
                .is_some_and(|r| r.starts_with("_ZN") || r.starts_with("_R"))
    }));
    // Its first instruction may come from inlined core code; its own lines
    // are attributed to the fixture.
    let insns = binary.decode(f);
    assert!(
        insns.iter().any(|i| binary
            .location(i.ip())
            .is_some_and(|l| l.file.ends_with("fixtures/kernels.rs"))),
        "no instruction of stride_sum maps to kernels.rs"
    );
    assert!(binary.function_at(f.start + f.size - 1).unwrap().start == f.start);
    assert!(
        binary
            .function_at(f.end())
            .is_none_or(|g| g.start == f.end())
    );
    assert!(!insns.is_empty());
    assert_eq!(insns[0].ip(), f.start);
    assert_eq!(insns.last().unwrap().next_ip(), f.end());
}

/// A stripped program whose `.gnu_debuglink` names a separate debug file
/// (`objcopy --only-keep-debug`) beside it has the functions and names of
/// the unstripped one, static functions included; a debug file whose
/// CRC-32 is not the link's is not used.
#[test]
fn separate_debug_file_names_a_stripped_programs_functions() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::gcc("many_functions.c", &["-O2"], dir.path());
    let debug = exe.with_extension("debug");
    common::run(
        std::process::Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&exe)
            .arg(&debug),
    );
    let stripped = common::stripped(&exe);
    common::run(
        std::process::Command::new("objcopy")
            .arg(format!("--add-gnu-debuglink={}", debug.display()))
            .arg(&stripped),
    );
    let named = |b: &Binary| -> Vec<(String, u64, u64)> {
        b.functions()
            .iter()
            .filter(|f| f.source == FunctionSource::Symtab)
            .map(|f| (f.name.clone(), f.start, f.size))
            .collect()
    };
    let reference = Binary::open(&exe).unwrap();
    let linked = Binary::open(&stripped).unwrap();
    assert!(linked.discovery().has_symtab);
    let debug = std::fs::canonicalize(&debug).unwrap();
    assert_eq!(linked.debug_file(), Some((debug.as_path(), None)));
    assert_eq!(
        memgaze_instrument::binary::separate_debug_file(&stripped).as_deref(),
        Some(debug.as_path())
    );
    let want = named(&reference);
    assert!(
        want.iter().any(|(n, _, _)| n.starts_with("fib")),
        "{want:?}"
    );
    assert_eq!(named(&linked), want);
    assert_sane(&linked);

    // Another file under the link's name: its CRC differs, it is ignored.
    let mut bytes = std::fs::read(&debug).unwrap();
    bytes.push(0);
    std::fs::write(&debug, bytes).unwrap();
    let unlinked = Binary::open(&stripped).unwrap();
    assert!(!unlinked.discovery().has_symtab);
    assert_eq!(unlinked.debug_file(), None);
    assert!(named(&unlinked).is_empty());
    assert!(memgaze_instrument::binary::separate_debug_file(&stripped).is_none());
}
