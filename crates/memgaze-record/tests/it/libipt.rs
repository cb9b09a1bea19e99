//! Shared by the PT tests: libipt's encoder (Debian `libipt-dev`) driven
//! through `crates/memgaze-fixtures/fixtures/pt_encode.c`, and a deterministic PRNG.
//!
//! Missing `libipt-dev` is a test failure with install instructions, never
//! a skip.

#![allow(dead_code)]

use memgaze_trace::rng::SplitMix64;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Builds the fixture once per test binary.
pub fn encoder_binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let source = memgaze_fixtures::fixtures().join("pt_encode.c");
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

/// The workspace's generator with the draws these tests use: reproducible
/// from the seed in a failure message.
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed))
    }
    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// `next() % n`, not [`SplitMix64::below`]: the streams the seeds in
    /// these tests name were drawn this way.
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
