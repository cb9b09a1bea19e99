//! Load classes on kernels compiled by gcc (-O0, -O2, -O3, -O3 -mavx2) and
//! rustc (opt-level 3): stride loops Strided, `a[idx[i]]` index Strided and
//! data Irregular, pointer chasing Irregular, stack scalars Constant,
//! matrix-multiply inner loops Strided; proxy compression higher at -O0.
//!
//! Loads of interest are found by the `@Class` tags of the C source through
//! the DWARF line table, or by function, never by address.

use memgaze_fixtures as common;

use memgaze_instrument::binary::Binary;
use memgaze_instrument::classify::{self, BinaryLoads, ClassifiedLoad, Reason, ratio};
use memgaze_trace::LoadClass;
use std::collections::BTreeMap;

const KERNELS: [&str; 7] = [
    "stride_sum",
    "stride_hash",
    "indirect_sum",
    "chase",
    "stack_scalars",
    "matmul_naive",
    "matmul_blocked",
];

/// `line -> expected class` from the `@Class` tags of a fixture.
fn tags(fixture: &str) -> BTreeMap<u32, LoadClass> {
    let text = std::fs::read_to_string(common::fixtures().join(fixture)).unwrap();
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        for class in LoadClass::ALL {
            if line.contains(&format!("@{}", class.as_str())) {
                out.insert(i as u32 + 1, class);
            }
        }
    }
    out
}

fn classify_kernels(binary: &Binary, names: &[&str]) -> BinaryLoads {
    classify::classify_binary(binary, |f| names.contains(&f.name.as_str()))
}

fn loads_of<'a>(binary: &Binary, loads: &'a BinaryLoads, name: &str) -> &'a [ClassifiedLoad] {
    loads
        .functions
        .iter()
        .find(|(i, _)| binary.functions()[*i].name == name)
        .map(|(_, f)| f.loads.as_slice())
        .unwrap_or_else(|| panic!("function {name} not found"))
}

/// Checks every tagged line: its loads inside loops that are not Constant
/// all have the tagged class (at least one exists); a Constant line's loads
/// are all Constant.
fn check_tagged_lines(binary: &Binary, loads: &BinaryLoads, fixture: &str, what: &str) {
    let tags = tags(fixture);
    let mut by_line: BTreeMap<u32, Vec<&ClassifiedLoad>> = BTreeMap::new();
    for (_, f) in &loads.functions {
        for l in &f.loads {
            if let Some(loc) = binary.location(l.operand.ip)
                && loc.file.ends_with(fixture)
            {
                by_line.entry(loc.line).or_default().push(l);
            }
        }
    }
    for (line, expected) in &tags {
        let at_line = by_line.get(line).map(Vec::as_slice).unwrap_or(&[]);
        let describe = || {
            at_line
                .iter()
                .map(|l| {
                    format!(
                        "{:#x} {} depth {} ({})",
                        l.operand.ip, l.class, l.loop_depth, l.reason
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        let relevant: Vec<&&ClassifiedLoad> = match expected {
            LoadClass::Constant => at_line.iter().collect(),
            _ => at_line
                .iter()
                .filter(|l| l.class != LoadClass::Constant && l.loop_depth > 0)
                .collect(),
        };
        assert!(
            !relevant.is_empty(),
            "{what}: {fixture}:{line} has no {expected} candidate loads: {}",
            describe()
        );
        assert!(
            relevant.iter().all(|l| l.class == *expected),
            "{what}: {fixture}:{line} expected {expected}: {}",
            describe()
        );
    }
}

/// `a[idx[i]]`: inside the loop, the index loads are Strided, the data
/// loads Irregular, and each data load derives from an index load (or, in
/// unoptimised code, from a stack slot holding one: then the chain still
/// ends at a Strided load).
fn check_indirect(loads: &[ClassifiedLoad], what: &str) {
    let in_loop: Vec<&ClassifiedLoad> = loads
        .iter()
        .filter(|l| l.loop_depth > 0 && l.class != LoadClass::Constant)
        .collect();
    let show = || {
        in_loop
            .iter()
            .map(|l| format!("{:#x} {} ({})", l.operand.ip, l.class, l.reason))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let index: Vec<u64> = in_loop
        .iter()
        .filter(|l| l.class == LoadClass::Strided)
        .map(|l| l.operand.ip)
        .collect();
    let data: Vec<&&ClassifiedLoad> = in_loop
        .iter()
        .filter(|l| l.class == LoadClass::Irregular)
        .collect();
    assert!(!index.is_empty() && !data.is_empty(), "{what}: {}", show());
    for d in data {
        match d.reason {
            Reason::DependsOnLoad { load, .. } => {
                assert!(index.contains(&load), "{what}: {}", show())
            }
            other => panic!("{what}: data load {:#x}: {other}", d.operand.ip),
        }
    }
}

fn kernel_ratio(loads: &BinaryLoads) -> f64 {
    let t = loads.totals();
    ratio(t.loads, t.instrumented)
}

#[test]
fn gcc_kernels_classify_at_every_optimisation_level() {
    let dir = tempfile::tempdir().unwrap();
    let mut ratios = BTreeMap::new();
    for flags in [&["-O0"][..], &["-O2"], &["-O3"], &["-O3", "-mavx2"]] {
        let exe = common::gcc("kernels.c", flags, dir.path());
        let binary = Binary::open(&exe).unwrap();
        let loads = classify_kernels(&binary, &KERNELS);
        assert_eq!(loads.functions.len(), KERNELS.len());
        let what = format!("gcc {}", flags.join(" "));
        check_tagged_lines(&binary, &loads, "kernels.c", &what);
        ratios.insert(flags.join(" "), kernel_ratio(&loads));

        // Vector loads classify like scalar ones.
        if flags.contains(&"-O3") {
            let widest = loads_of(&binary, &loads, "stride_sum")
                .iter()
                .filter(|l| l.class == LoadClass::Strided)
                .map(|l| l.operand.size)
                .max()
                .unwrap();
            let expected = if flags.contains(&"-mavx2") { 32 } else { 16 };
            assert_eq!(widest, expected, "{what}: stride_sum is vectorised");
        }
        check_indirect(loads_of(&binary, &loads, "indirect_sum"), &what);
    }
    eprintln!("compression ratios (kernels): {ratios:?}");
    let (o0, o3) = (ratios["-O0"], ratios["-O3"]);
    // Paper §VI-C: about 2x unoptimised, 1.2x optimised.
    assert!(o0 >= 1.8, "-O0 ratio {o0}");
    assert!(o3 <= 1.5, "-O3 ratio {o3}");
    assert!(o0 > 1.5 * o3, "-O0 {o0} vs -O3 {o3}");
}

#[test]
fn rust_kernels_classify_per_function() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::rustc("kernels.rs", &[], dir.path());
    let binary = Binary::open(&exe).unwrap();
    let names = [
        "stride_sum",
        "stride_hash",
        "indirect_sum",
        "chase_indices",
        "chase_boxes",
        "stack_scalars",
        "matmul_naive",
        "matmul_blocked",
    ];
    let loads = classify_kernels(&binary, &names);
    let in_loops = |name: &str| -> Vec<ClassifiedLoad> {
        loads_of(&binary, &loads, name)
            .iter()
            .filter(|l| l.loop_depth > 0 && l.class != LoadClass::Constant)
            .copied()
            .collect()
    };
    let show = |v: &[ClassifiedLoad]| {
        v.iter()
            .map(|l| format!("{:#x} {} ({})", l.operand.ip, l.class, l.reason))
            .collect::<Vec<_>>()
            .join("; ")
    };
    for name in [
        "stride_sum",
        "stride_hash",
        "matmul_naive",
        "matmul_blocked",
    ] {
        let v = in_loops(name);
        assert!(!v.is_empty(), "{name}");
        assert!(
            v.iter().all(|l| l.class == LoadClass::Strided),
            "{name}: {}",
            show(&v)
        );
    }
    assert!(
        in_loops("stride_sum").iter().any(|l| l.operand.size == 16),
        "stride_sum is vectorised: {}",
        show(&in_loops("stride_sum"))
    );
    assert!(in_loops("stride_hash").iter().all(|l| l.operand.size == 8));
    for name in ["chase_indices", "chase_boxes"] {
        let v = in_loops(name);
        assert!(v.len() >= 2, "{name}");
        assert!(
            v.iter().all(|l| l.class == LoadClass::Irregular),
            "{name}: {}",
            show(&v)
        );
    }
    check_indirect(loads_of(&binary, &loads, "indirect_sum"), "rustc");
    let stack = loads_of(&binary, &loads, "stack_scalars");
    assert!(stack.len() >= 2);
    assert!(
        stack
            .iter()
            .all(|l| l.class == LoadClass::Constant && l.reason == Reason::FrameScalar)
    );
    eprintln!(
        "rustc kernels compression ratio {:.2}",
        kernel_ratio(&loads)
    );
}

#[test]
fn annotation_of_a_whole_binary_is_consistent_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::gcc("kernels.c", &["-O2"], dir.path());
    let binary = Binary::open(&exe).unwrap();
    let loads = classify::classify_binary(&binary, |_| true);
    let annotation = loads.to_annotation(&binary);
    assert_eq!(
        annotation.schema,
        memgaze_metadata::annotation::ANNOTATION_SCHEMA
    );
    assert_eq!(annotation.binary.sha256.len(), 64);
    assert!(annotation.loads.windows(2).all(|w| w[0].ip < w[1].ip));
    for (i, l) in annotation.loads.iter().enumerate() {
        assert_eq!(l.id as usize, i);
        let f = &annotation.functions[l.function as usize];
        assert!(l.ip >= f.start && l.ip < f.start + f.size);
        match l.proxy {
            Some(p) => {
                let carrier = annotation.load_at(p.get()).unwrap();
                assert!(!l.instrumented && carrier.instrumented && carrier.function == l.function);
                assert_eq!(l.class, LoadClass::Constant);
            }
            None => assert!(l.instrumented),
        }
    }
    // Implied counts add up to the uninstrumented loads.
    let implied: u32 = annotation.loads.iter().map(|l| l.implied).sum();
    let uninstrumented = annotation.loads.iter().filter(|l| !l.instrumented).count();
    assert_eq!(implied as usize, uninstrumented);
    assert!(
        annotation
            .loads
            .iter()
            .any(|l| l.line.as_deref().is_some_and(|s| s.contains("kernels.c:")))
    );
    let path = dir.path().join("kernels.memgaze.json");
    annotation.write(&path).unwrap();
    assert_eq!(
        memgaze_metadata::annotation::Annotation::read(&path).unwrap(),
        annotation
    );
}
