//! Instrumenting an executable once: classify its loads, rewrite it, and
//! keep the result in a content-addressed cache under
//! `<target-dir>/memgaze/instrumented/`.
//!
//! The cache key is the SHA-256 of the executable's bytes and of the running
//! `cargo memgaze` binary (a rebuilt instrumentor never reuses another's
//! output). An entry is a directory holding the instrumented executable and
//! its annotation; it is written under a temporary name and renamed into
//! place, so an interrupted run never leaves a half-written entry behind.

use crate::annotation::{Annotation, InstrumentationMode};
use crate::binary::Binary;
use crate::instrument::{self, InstrumentOptions, Report};
use anyhow::Context;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Directory of the cache under the results root.
pub const CACHE_DIR: &str = "instrumented";

/// An instrumented bench executable, ready to record.
#[derive(Clone, Debug)]
pub struct InstrumentedBench {
    /// The instrumented executable.
    pub path: PathBuf,
    /// What the recorder and the analysis need to know about its loads.
    pub annotation: Annotation,
    /// The rewriter's report, when it ran now (`None` for a cache hit).
    pub report: Option<Report>,
}

/// Returns the instrumented copy of `executable`, from the cache under
/// `results_root` when present, else made now with `instrumenter` (given the
/// original and where to write the copy; it writes the executable and
/// returns the annotation and report).
pub fn instrumented_with(
    executable: &Path,
    results_root: &Path,
    instrumenter: impl FnOnce(&Path, &Path) -> anyhow::Result<(Annotation, Report)>,
) -> anyhow::Result<InstrumentedBench> {
    let bytes = std::fs::read(executable)
        .with_context(|| format!("cannot read {}", executable.display()))?;
    let mut hasher = Sha256::new();
    hasher.update(&bytes);
    hasher.update(tool_identity());
    let key: String = hasher.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let file_name = executable
        .file_name()
        .with_context(|| format!("{}: not a file", executable.display()))?;
    let cache = results_root.join(CACHE_DIR);
    let entry = cache.join(&key);
    let path = entry.join(file_name);
    let annotation_file = instrument::annotation_path(&path);
    if path.is_file() && annotation_file.is_file() {
        let annotation = read_annotation(&annotation_file)?;
        return Ok(InstrumentedBench {
            path,
            annotation,
            report: None,
        });
    }
    // Build in a fresh temporary directory, then rename it into place.
    std::fs::create_dir_all(&cache).with_context(|| cache.display().to_string())?;
    let staging = tempfile::Builder::new()
        .prefix(&format!("{key}.tmp"))
        .tempdir_in(&cache)
        .with_context(|| format!("cannot create a directory in {}", cache.display()))?;
    let staged = staging.path().join(file_name);
    let (annotation, report) = instrumenter(executable, &staged)
        .with_context(|| format!("instrumenting {}", executable.display()))?;
    let json = serde_json::to_vec(&annotation).context("serialising the annotation")?;
    std::fs::write(instrument::annotation_path(&staged), json)
        .with_context(|| format!("cannot write into {}", staging.path().display()))?;
    let staging = staging.keep();
    if let Err(e) = std::fs::rename(&staging, &entry) {
        // Another run may have won the race; its entry is as good as ours.
        let _ = std::fs::remove_dir_all(&staging);
        if !path.is_file() {
            return Err(e).with_context(|| format!("cannot create {}", entry.display()));
        }
    }
    Ok(InstrumentedBench {
        path,
        annotation,
        report: Some(report),
    })
}

/// [`instrumented_with`] the software-recorder instrumentation: every
/// function classified and rewritten.
pub fn instrumented(executable: &Path, results_root: &Path) -> anyhow::Result<InstrumentedBench> {
    instrumented_with(executable, results_root, instrument_soft)
}

/// Classifies every function of `input` and writes the instrumented
/// executable to `output`.
pub fn instrument_soft(input: &Path, output: &Path) -> anyhow::Result<(Annotation, Report)> {
    let binary = Binary::open(input)?;
    let annotation = crate::classify::classify_binary(&binary, |_| true).to_annotation(&binary);
    let result = instrument::instrument(
        &binary,
        annotation,
        &InstrumentOptions {
            mode: InstrumentationMode::Soft,
        },
    )?;
    write_executable(output, &result.executable)?;
    Ok((result.annotation, result.report))
}

fn write_executable(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", path.display()))
}

fn read_annotation(path: &Path) -> anyhow::Result<Annotation> {
    let text = std::fs::read(path).with_context(|| path.display().to_string())?;
    serde_json::from_slice(&text).with_context(|| {
        format!(
            "{}: invalid annotation (delete the cache entry)",
            path.display()
        )
    })
}

/// A digest of the running `cargo memgaze` executable (computed once).
fn tool_identity() -> &'static [u8] {
    static IDENTITY: OnceLock<Vec<u8>> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let exe = std::env::current_exe()
            .ok()
            .and_then(|p| std::fs::read(p).ok())
            .unwrap_or_else(|| env!("CARGO_PKG_VERSION").as_bytes().to_vec());
        Sha256::digest(&exe).to_vec()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::BinaryIdentity;
    use std::cell::Cell;

    fn executable(dir: &Path, contents: &[u8]) -> std::path::PathBuf {
        let path = dir.join("bench-0123");
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn annotation() -> Annotation {
        Annotation {
            schema: crate::annotation::ANNOTATION_SCHEMA.into(),
            binary: BinaryIdentity {
                path: "x".into(),
                size: 1,
                sha256: "00".into(),
                build_id: None,
            },
            mode: Some(InstrumentationMode::Soft),
            functions: Vec::new(),
            loads: Vec::new(),
            ptwrites: Vec::new(),
        }
    }

    #[test]
    fn an_executable_is_instrumented_once_per_content() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("memgaze");
        let calls = Cell::new(0);
        let fake = |_: &Path, out: &Path| {
            calls.set(calls.get() + 1);
            std::fs::write(out, b"instrumented").unwrap();
            Ok((annotation(), Report::default()))
        };
        let exe = executable(tmp.path(), b"v1");
        let first = instrumented_with(&exe, &root, fake).unwrap();
        assert!(first.report.is_some());
        assert_eq!(std::fs::read(&first.path).unwrap(), b"instrumented");
        let again = instrumented_with(&exe, &root, fake).unwrap();
        assert!(again.report.is_none());
        assert_eq!((again.path.clone(), calls.get()), (first.path.clone(), 1));
        assert_eq!(again.annotation, annotation());
        // New contents, new entry.
        let exe = executable(tmp.path(), b"v2");
        let other = instrumented_with(&exe, &root, fake).unwrap();
        assert_ne!(other.path, first.path);
        assert_eq!(calls.get(), 2);
        // No staging directories are left behind.
        let entries = std::fs::read_dir(root.join(CACHE_DIR)).unwrap().count();
        assert_eq!(entries, 2);
    }

    #[test]
    fn a_failed_instrumentation_leaves_no_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("memgaze");
        let exe = executable(tmp.path(), b"v1");
        let e = instrumented_with(&exe, &root, |_, _| anyhow::bail!("no entry point")).unwrap_err();
        assert_eq!(
            crate::error::one_line(&e),
            format!("instrumenting {}: no entry point", exe.display())
        );
        assert_eq!(std::fs::read_dir(root.join(CACHE_DIR)).unwrap().count(), 0);
    }
}
