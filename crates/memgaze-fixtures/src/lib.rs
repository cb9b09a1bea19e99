//! Test fixtures of the memgaze crates (C and Rust programs, cargo
//! projects) and the helpers that compile them into a temporary directory
//! with the system's gcc and the toolchain's rustc. Only tests and benches
//! depend on this crate.

#![warn(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fixtures directory (`crates/memgaze-fixtures/fixtures`).
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Runs a command and panics with its output when it fails: a missing
/// compiler must fail the test, never skip it.
pub fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (gcc/binutils/rustc are required)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles a C fixture with gcc (`-g`, the given flags) into `dir`.
pub fn gcc(fixture: &str, flags: &[&str], dir: &Path) -> PathBuf {
    let stem = Path::new(fixture).file_stem().unwrap().to_string_lossy();
    let tag: String = flags
        .iter()
        .map(|f| f.trim_start_matches('-').replace(['=', ','], "_"))
        .collect::<Vec<_>>()
        .join("_");
    let out = dir.join(format!("{stem}_{tag}"));
    run(Command::new("gcc")
        .args(flags)
        .arg("-g")
        .arg("-o")
        .arg(&out)
        .arg(fixtures().join(fixture)));
    out
}

/// Compiles a Rust fixture with rustc at opt-level 3 with line tables.
pub fn rustc(fixture: &str, flags: &[&str], dir: &Path) -> PathBuf {
    let stem = Path::new(fixture).file_stem().unwrap().to_string_lossy();
    let out = dir.join(format!("{stem}_rs"));
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    run(Command::new(rustc)
        .args([
            "--edition",
            "2024",
            "-C",
            "opt-level=3",
            "-C",
            "debuginfo=line-tables-only",
        ])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(fixtures().join(fixture)));
    out
}

/// A stripped copy of `path` (`strip --strip-all`).
pub fn stripped(path: &Path) -> PathBuf {
    let out = path.with_extension("stripped");
    run(Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&out)
        .arg(path));
    out
}
