//! Helpers shared by the integration tests: compiling fixtures into a
//! temporary directory with the system's gcc and the toolchain's rustc;
//! for the PT tests, libipt's encoder (Debian `libipt-dev`) driven through
//! `tests/fixtures/pt_encode.c` (missing `libipt-dev` is a failure with
//! install instructions, never a skip), and a deterministic PRNG.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fixtures directory (`tests/fixtures`).
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
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

use std::sync::OnceLock;

/// Builds the fixture once per test binary.
pub fn encoder_binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pt_encode.c");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(concat!("pt_encode_", env!("CARGO_CRATE_NAME")));
        let result = Command::new("gcc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&out)
            .arg(&source)
            .arg("-lipt")
            .output();
        let output = match result {
            Ok(output) => output,
            Err(e) => panic!("cannot run gcc to build {}: {e}; install it with `apt-get install -y gcc`", source.display()),
        };
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let hint = if stderr.contains("intel-pt.h") || stderr.contains("-lipt") {
                "libipt-dev is not installed: run `sudo apt-get install -y libipt-dev` (ci/test.sh installs it when missing)"
            } else {
                "gcc failed"
            };
            panic!("{hint}\n{stderr}");
        }
        out
    })
}

/// Has libipt encode `spec`: the stream and each packet's (offset, size).
pub fn libipt_encode(spec: &str) -> (Vec<u8>, Vec<(usize, usize)>) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("stream.bin");
    let spec_path = dir.path().join("spec.txt");
    std::fs::write(&spec_path, spec).unwrap();
    let output = Command::new(encoder_binary())
        .arg(&out)
        .stdin(std::fs::File::open(&spec_path).unwrap())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "pt_encode failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let offsets = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (o, n) = l.split_once(' ').unwrap();
            (o.parse().unwrap(), n.parse().unwrap())
        })
        .collect();
    (std::fs::read(&out).unwrap(), offsets)
}

/// A small deterministic PRNG (SplitMix64): reproducible from the seed in a
/// failure message.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub fn bits(&mut self, n: u32) -> u64 {
        if n >= 64 {
            self.next()
        } else {
            self.next() & ((1 << n) - 1)
        }
    }
}
