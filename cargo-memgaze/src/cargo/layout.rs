//! [`ResultsLayout`]: where a bench's results live,
//! `<target-dir>/memgaze/<package>/<bench-target>/<bench>/`.
//!
//! Bench names are free text (`str/irr`, `irr|str|irr`, `lookup/1000`), so
//! each path component is encoded reversibly: ASCII letters, digits, `_`,
//! `-` and `.` (not leading) stay, every other byte becomes `%XX`. A name
//! whose encoding would exceed [`MAX_COMPONENT`] bytes is cut and suffixed
//! with `~` and a hash (not reversible: `~` never appears otherwise); the
//! original names are always stored in the directory's [`BENCH_FILE`].

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

/// Longest encoded path component, in bytes (file systems allow 255).
pub const MAX_COMPONENT: usize = 200;

/// The file in every bench directory naming what it holds.
pub const BENCH_FILE: &str = "bench.json";

/// Schema tag of [`BENCH_FILE`].
pub const BENCH_SCHEMA: &str = "memgaze.bench.v1";

/// Which bench a result belongs to: its results directory (named in its
/// [`BENCH_FILE`]), its baselines and its gate verdicts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BenchKey {
    /// Package name.
    pub package: String,
    /// Bench target name.
    pub target: String,
    /// Bench name as the harness lists it.
    pub bench: String,
}

impl BenchKey {
    /// A key from its three parts.
    pub fn new(package: &str, target: &str, bench: &str) -> BenchKey {
        BenchKey {
            package: package.into(),
            target: target.into(),
            bench: bench.into(),
        }
    }

    /// The key as a relative path: one reversible, file-system-safe
    /// component per part (see the module documentation).
    pub fn relative_dir(&self) -> PathBuf {
        [&self.package, &self.target, &self.bench]
            .iter()
            .map(|part| encode_component(part))
            .collect()
    }
}

impl fmt::Display for BenchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.package, self.target, self.bench)
    }
}

/// [`BENCH_FILE`]'s contents: the key with a schema tag (readers ignore
/// the tag, so the file also reads as a plain [`BenchKey`]).
#[derive(Serialize)]
struct BenchFile<'a> {
    schema: &'static str,
    #[serde(flatten)]
    key: &'a BenchKey,
}

/// The results tree under a target directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResultsLayout {
    root: PathBuf,
}

impl ResultsLayout {
    /// The layout under `target_dir` (results in `target_dir/memgaze`).
    pub fn new(target_dir: &Path) -> Self {
        ResultsLayout {
            root: target_dir.join("memgaze"),
        }
    }

    /// `<target-dir>/memgaze`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of one bench (not created).
    pub fn bench_dir(&self, key: &BenchKey) -> PathBuf {
        self.root.join(key.relative_dir())
    }

    /// Creates the directory of one bench and writes its [`BENCH_FILE`].
    pub fn create_bench_dir(&self, key: &BenchKey) -> anyhow::Result<PathBuf> {
        let dir = self.bench_dir(key);
        memgaze_output::create_dir_within(&self.root, &dir)?;
        let file = dir.join(BENCH_FILE);
        let file_contents = BenchFile {
            schema: BENCH_SCHEMA,
            key,
        };
        let json = serde_json::to_string_pretty(&file_contents).expect("plain strings serialise");
        memgaze_output::write_atomic(&file, json + "\n")?;
        Ok(dir)
    }

    /// Every bench directory under the root, with its identity, sorted by
    /// path. Directories without a readable [`BENCH_FILE`] are skipped.
    pub fn bench_dirs(&self) -> Vec<(PathBuf, BenchKey)> {
        let mut found = Vec::new();
        let levels = |dir: &Path| -> Vec<PathBuf> {
            let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect();
            dirs.sort();
            dirs
        };
        for package in levels(&self.root) {
            for target in levels(&package) {
                for bench in levels(&target) {
                    let id = std::fs::read_to_string(bench.join(BENCH_FILE))
                        .ok()
                        .and_then(|text| serde_json::from_str::<BenchKey>(&text).ok());
                    if let Some(id) = id {
                        found.push((bench, id));
                    }
                }
            }
        }
        found
    }
}

fn kept(byte: u8, first: bool) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' || (byte == b'.' && !first)
}

/// Encodes a name as one path component (see the module documentation).
pub fn encode_component(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, &byte) in name.as_bytes().iter().enumerate() {
        if kept(byte, i == 0) {
            out.push(byte as char);
        } else {
            write!(out, "%{byte:02X}").expect("writing to a String");
        }
    }
    if out.is_empty() {
        // An empty name (which the harness never lists) still gets a
        // directory of its own.
        out.push('%');
    }
    if out.len() > MAX_COMPONENT {
        let digest = Sha256::digest(name.as_bytes());
        let mut cut = MAX_COMPONENT - 17;
        // Never split a `%XX` escape.
        while out.as_bytes()[..cut]
            .iter()
            .rev()
            .take(2)
            .any(|&b| b == b'%')
        {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('~');
        for byte in &digest[..8] {
            write!(out, "{byte:02x}").expect("writing to a String");
        }
    }
    out
}

/// Decodes [`encode_component`]'s output; `None` for a hashed (cut) or
/// malformed component.
pub fn decode_component(component: &str) -> Option<String> {
    if component == "%" {
        return Some(String::new());
    }
    if component.contains('~') {
        return None;
    }
    let bytes = component.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = component.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn microbench_names_become_safe_components() {
        for (name, encoded) in [
            ("str1", "str1"),
            ("str/irr", "str%2Firr"),
            ("irr|str|irr", "irr%7Cstr%7Cirr"),
            ("irr-rand", "irr-rand"),
            ("lookup/1000", "lookup%2F1000"),
            ("..", "%2E."),
            (".hidden", "%2Ehidden"),
            ("a b%", "a%20b%25"),
            ("ü", "%C3%BC"),
        ] {
            assert_eq!(encode_component(name), encoded);
            assert_eq!(decode_component(encoded).as_deref(), Some(name));
        }
    }

    #[test]
    fn long_names_are_cut_and_hashed() {
        let long = "x/".repeat(200);
        let encoded = encode_component(&long);
        assert!(encoded.len() <= MAX_COMPONENT, "{}", encoded.len());
        assert!(encoded.contains('~'));
        assert_eq!(decode_component(&encoded), None);
        assert_ne!(encoded, encode_component(&"x/".repeat(201)));
    }

    #[test]
    fn bench_dirs_round_trip_through_the_bench_file() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = ResultsLayout::new(tmp.path());
        let id = BenchKey::new("microbenches", "micro", "irr|str|irr");
        let dir = layout.create_bench_dir(&id).unwrap();
        assert_eq!(
            dir,
            tmp.path()
                .join("memgaze/microbenches/micro/irr%7Cstr%7Cirr")
        );
        layout
            .create_bench_dir(&BenchKey::new("microbenches", "micro", "str/irr"))
            .unwrap();
        let found = layout.bench_dirs();
        let names: Vec<&str> = found.iter().map(|(_, id)| id.bench.as_str()).collect();
        assert_eq!(names, ["irr|str|irr", "str/irr"]);
        let file: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(BENCH_FILE)).unwrap()).unwrap();
        assert_eq!(
            file,
            serde_json::json!({
                "schema": "memgaze.bench.v1",
                "package": "microbenches",
                "target": "micro",
                "bench": "irr|str|irr",
            })
        );
    }

    proptest! {
        #[test]
        fn encoding_is_reversible_and_path_safe(name in "\\PC{0,16}") {
            // At most 16 × 4 UTF-8 bytes × 3: always under the length limit.
            let encoded = encode_component(&name);
            prop_assert!(!encoded.contains('/') && !encoded.contains('\0'));
            prop_assert!(encoded != "." && encoded != "..");
            prop_assert!(!encoded.starts_with('.'));
            prop_assert_eq!(decode_component(&encoded), Some(name));
        }

        #[test]
        fn distinct_names_get_distinct_components(a in "\\PC{0,120}", b in "\\PC{0,120}") {
            prop_assume!(a != b);
            let (ea, eb) = (encode_component(&a), encode_component(&b));
            prop_assert!(ea.len() <= MAX_COMPONENT && eb.len() <= MAX_COMPONENT);
            prop_assert_ne!(ea, eb);
        }
    }
}
