//! `cargo memgaze classify` through the built binary: bad input gets one
//! clear error line and exit code 1; good input gives the table and the
//! JSON document of docs/CLI.md.

use memgaze_fixtures as common;

use std::path::Path;
use std::process::{Command, Output};

fn memgaze(args: &[&str]) -> Output {
    crate::support::memgaze_command()
        .arg("memgaze")
        .args(args)
        .output()
        .unwrap()
}

/// Runs `classify <path>` and checks: exit 1, exactly one stderr line that
/// names the path and contains `expected`.
fn assert_rejected(path: &Path, expected: &str) {
    let out = memgaze(&["classify", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}: {stderr}", path.display());
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(lines[0].contains(&path.display().to_string()), "{stderr}");
    assert!(
        lines[0].contains(expected),
        "expected {expected:?} in {stderr}"
    );
    assert!(!stderr.contains("panicked"));
    assert!(out.stdout.is_empty());
}

/// A minimal ELF header: class, data encoding, type, machine.
fn elf_header(class: u8, machine: u16) -> Vec<u8> {
    let mut h = vec![0u8; if class == 1 { 52 } else { 64 }];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = class;
    h[5] = 1;
    h[6] = 1;
    h[16..18].copy_from_slice(&2u16.to_le_bytes());
    h[18..20].copy_from_slice(&machine.to_le_bytes());
    h
}

#[test]
fn bad_inputs_get_one_clear_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    let text = d.join("notes.txt");
    std::fs::write(&text, "just some text\n").unwrap();
    assert_rejected(&text, "not an ELF file");

    let empty = d.join("empty");
    std::fs::write(&empty, "").unwrap();
    assert_rejected(&empty, "not an ELF file");

    let i386 = d.join("i386.elf");
    std::fs::write(&i386, elf_header(1, 3)).unwrap();
    assert_rejected(&i386, "32-bit ELF file");

    let arm = d.join("aarch64.elf");
    std::fs::write(&arm, elf_header(2, 183)).unwrap();
    assert_rejected(&arm, "AArch64");

    assert_rejected(&d.join("missing"), "No such file");
    assert_rejected(d, "is a directory");

    // A shared library.
    let src = d.join("lib.c");
    std::fs::write(&src, "int answer(void) { return 42; }\n").unwrap();
    let so = d.join("libanswer.so");
    common::run(
        Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&src),
    );
    assert_rejected(&so, "shared object");

    // An object file.
    let obj = d.join("answer.o");
    common::run(Command::new("gcc").args(["-c", "-o"]).arg(&obj).arg(&src));
    assert_rejected(&obj, "relocatable object file");

    // Truncated copies of a real executable.
    let exe = std::fs::read("/usr/bin/gzip").unwrap();
    for (name, len) in [
        ("cut40", 40),
        ("cut_half", exe.len() / 2),
        ("cut_last", exe.len() - 1),
    ] {
        let path = d.join(name);
        std::fs::write(&path, &exe[..len]).unwrap();
        assert_rejected(&path, "truncated");
    }
}

#[test]
fn no_matching_function_is_an_error_and_a_bad_glob_a_usage_error() {
    let out = memgaze(&[
        "classify",
        "/usr/bin/gzip",
        "--functions",
        "no_such_function",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no function matches"));
    let out = memgaze(&["classify", "/usr/bin/gzip", "--functions", "a[b"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn json_lists_functions_and_loads_as_the_spec_says() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::gcc("kernels.c", &["-O2"], dir.path());
    let out = memgaze(&[
        "classify",
        exe.to_str().unwrap(),
        "--functions",
        "indirect_*",
        "--functions",
        "stack_scalars",
        "--format",
        "json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["schema"], "memgaze.classify.v1");
    let functions = doc["functions"].as_array().unwrap();
    let names: Vec<&str> = functions
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["indirect_sum", "stack_scalars"]);
    for f in functions {
        assert!(f["start"].as_str().unwrap().starts_with("0x"));
        assert!(f["size"].as_u64().unwrap() > 0);
        let loads = &f["loads"];
        let sum: u64 = ["Strided", "Irregular", "Constant"]
            .iter()
            .map(|c| loads[c].as_u64().unwrap())
            .sum();
        assert_eq!(sum, loads["total"].as_u64().unwrap());
        assert!(f["compression_ratio"].as_f64().unwrap() >= 1.0);
    }
    let loads = doc["loads"].as_array().unwrap();
    assert!(!loads.is_empty());
    for l in loads {
        assert!(l["ip"].as_str().unwrap().starts_with("0x"));
        assert!(["Strided", "Irregular", "Constant"].contains(&l["class"].as_str().unwrap()));
        assert!(l["line"].as_str().unwrap().contains("kernels.c:"));
        assert_eq!(
            l["instrumented"].as_bool().unwrap(),
            !l["implied"].as_bool().unwrap()
        );
        assert!(l["instruction"].as_str().unwrap().contains('['));
        assert!(!l["reason"].as_str().unwrap().is_empty());
    }
    let irregular = loads.iter().find(|l| l["class"] == "Irregular").unwrap();
    assert_eq!(irregular["function"], "indirect_sum");
    assert!(
        irregular["reason"]
            .as_str()
            .unwrap()
            .contains("comes from the load at")
    );
    let implied: u64 = loads.iter().map(|l| l["implies"].as_u64().unwrap()).sum();
    let uninstrumented = loads.iter().filter(|l| l["implied"] == true).count() as u64;
    assert_eq!(implied, uninstrumented);
}

#[test]
fn table_explains_each_load_when_functions_are_selected() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::gcc("kernels.c", &["-O2"], dir.path());
    let out = memgaze(&["classify", exe.to_str().unwrap(), "--functions", "chase"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("chase"), "{text}");
    assert!(text.contains("Irregular"), "{text}");
    assert!(text.contains("comes from the load at"), "{text}");
    assert!(text.contains("kernels.c:"), "{text}");
    // Without --functions: a per-function summary and a hint.
    let out = memgaze(&["classify", exe.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("matmul_blocked") && text.contains("total ("),
        "{text}"
    );
    assert!(text.contains("--functions"), "{text}");
}

/// An instrumented copy is classified with a warning to classify the
/// original instead (its functions begin with the jump to their copies);
/// the original gets none.
#[test]
fn an_instrumented_file_is_classified_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::gcc("kernels.c", &["-O2"], dir.path());
    let copy = dir.path().join("kernels.mg");
    let out = memgaze(&[
        "instrument",
        "-q",
        exe.to_str().unwrap(),
        "-o",
        copy.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (path, warned) in [(&exe, false), (&copy, true)] {
        let out = memgaze(&["classify", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert_eq!(
            err.contains("is instrumented by cargo memgaze"),
            warned,
            "{}: {err}",
            path.display()
        );
    }
}
