//! [`GoldenStore`]: the `golden/` directory of snapshot files, with insta's
//! conventions.
//!
//! One file per bench, `<package>__<target>__<bench>.snap` (each part
//! encoded like a results directory component, so `str/irr` becomes
//! `str%2Firr`; insta reads the last `__` part as the snapshot name).
//! Checking a new snapshot against the stored one:
//! - identical text: nothing to do (a stale `.snap.new` beside it is
//!   removed);
//! - different or missing, without `--update`: the new one is written as
//!   `<name>.snap.new`, which `cargo insta review` offers to accept — except
//!   on CI (`CI` set), where nothing is written;
//! - with `--update`: the `.snap` is written and any `.snap.new` removed.

use super::snapshot::SnapshotFile;
use crate::cargo::encode_component;
use anyhow::Context;
use std::path::{Path, PathBuf};

/// Extension of accepted snapshots.
pub const SNAPSHOT_EXTENSION: &str = "snap";

/// What checking one snapshot did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The stored snapshot is byte-identical.
    Unchanged,
    /// No snapshot existed; with `--update` it was written.
    Created,
    /// The snapshot differed; with `--update` it was rewritten.
    Updated,
    /// No snapshot exists (check mode); the new one went to `pending`
    /// unless on CI.
    Missing {
        /// The `.snap.new` written, if any.
        pending: Option<PathBuf>,
    },
    /// The snapshot differs (check mode).
    Differs {
        /// The `.snap.new` written, if any.
        pending: Option<PathBuf>,
        /// Which metrics changed, for a short report.
        changes: Vec<String>,
    },
}

impl Outcome {
    /// Whether the stored snapshot does not match (check mode).
    pub fn is_difference(&self) -> bool {
        matches!(self, Outcome::Missing { .. } | Outcome::Differs { .. })
    }
}

/// The snapshot directory.
#[derive(Clone, Debug)]
pub struct GoldenStore {
    dir: PathBuf,
}

/// Whether this is a CI run (insta's rule: `CI` set; `CI=false`/`0`/empty
/// do not count).
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

impl GoldenStore {
    /// The store in `dir` (created when a file is first written).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        GoldenStore { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file name stem of a bench's snapshot.
    pub fn stem(package: &str, target: &str, bench: &str) -> String {
        format!(
            "{}__{}__{}",
            encode_component(package),
            encode_component(target),
            encode_component(bench)
        )
    }

    /// Where a bench's snapshot lives.
    pub fn path(&self, package: &str, target: &str, bench: &str) -> PathBuf {
        self.dir.join(format!(
            "{}.{SNAPSHOT_EXTENSION}",
            Self::stem(package, target, bench)
        ))
    }

    /// Reads a bench's snapshot; `Ok(None)` when there is none.
    pub fn read(
        &self,
        package: &str,
        target: &str,
        bench: &str,
    ) -> anyhow::Result<Option<SnapshotFile>> {
        let path = self.path(package, target, bench);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| path.display().to_string()),
        };
        let file = SnapshotFile::parse(&text).with_context(|| path.display().to_string())?;
        // A snapshot copied or renamed by hand would otherwise check one
        // bench against another's metrics.
        let m = &file.metrics;
        if (m.package.as_str(), m.target.as_str(), m.bench.as_str()) != (package, target, bench) {
            anyhow::bail!(
                "{}: the snapshot is of bench `{}` of {}/{}, not `{bench}` of {package}/{target} (re-record it with `cargo memgaze golden --update`)",
                path.display(),
                m.bench,
                m.package,
                m.target,
            );
        }
        Ok(Some(file))
    }

    /// Compares `new` with the stored snapshot and writes what insta's
    /// conventions say (module documentation). `write_pending` is false on
    /// CI.
    pub fn check(
        &self,
        new: &SnapshotFile,
        update: bool,
        write_pending: bool,
    ) -> anyhow::Result<Outcome> {
        let m = &new.metrics;
        let path = self.path(&m.package, &m.target, &m.bench);
        let pending = pending_path(&path);
        let text = new.to_text();
        let old_text = match std::fs::read_to_string(&path) {
            Ok(old) => Some(old),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| path.display().to_string()),
        };
        if old_text.as_deref() == Some(text.as_str()) {
            remove_if_present(&pending)?;
            return Ok(Outcome::Unchanged);
        }
        if update {
            self.write(&path, &text)?;
            remove_if_present(&pending)?;
            return Ok(if old_text.is_some() {
                Outcome::Updated
            } else {
                Outcome::Created
            });
        }
        let written = if write_pending {
            self.write(&pending, &text)?;
            Some(pending)
        } else {
            None
        };
        match old_text {
            None => Ok(Outcome::Missing { pending: written }),
            Some(old) => {
                let changes = match SnapshotFile::parse(&old) {
                    Ok(old) => {
                        let mut changes = Vec::new();
                        if old.meta != new.meta {
                            changes.push("metadata".to_string());
                        }
                        changes.extend(super::snapshot::describe_differences(
                            &old.metrics,
                            &new.metrics,
                            8,
                        ));
                        changes
                    }
                    Err(e) => vec![format!("the stored snapshot is unreadable: {e:#}")],
                };
                Ok(Outcome::Differs {
                    pending: written,
                    changes,
                })
            }
        }
    }

    fn write(&self, path: &Path, text: &str) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir).with_context(|| self.dir.display().to_string())?;
        Ok(memgaze_output::write_atomic(path, text)?)
    }

    /// Snapshot files of a bench target whose bench is not in `benches`
    /// (the target's complete, unfiltered list).
    pub fn orphans(&self, package: &str, target: &str, benches: &[String]) -> Vec<PathBuf> {
        let prefix = format!(
            "{}__{}__",
            encode_component(package),
            encode_component(target)
        );
        let expected: Vec<String> = benches
            .iter()
            .map(|b| format!("{}.{SNAPSHOT_EXTENSION}", Self::stem(package, target, b)))
            .collect();
        let mut found: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let is_snapshot = name.starts_with(&prefix)
                    && name.ends_with(&format!(".{SNAPSHOT_EXTENSION}"))
                    && !expected.contains(&name);
                is_snapshot.then(|| entry.path())
            })
            .collect();
        found.sort();
        found
    }
}

/// `x.snap` → `x.snap.new`.
pub fn pending_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".new");
    PathBuf::from(name)
}

fn remove_if_present(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::super::snapshot::{SnapshotMeta, tests as snapshot_tests};
    use super::*;

    fn file(f: f64) -> SnapshotFile {
        let mut metrics = snapshot_tests::sample_metrics();
        metrics.trace_windows[0].f = f;
        SnapshotFile {
            meta: SnapshotMeta {
                source: "microbenches/benches/micro.rs".into(),
                expression: "x".into(),
                facts: snapshot_tests::sample_facts(),
            },
            metrics,
        }
    }

    #[test]
    fn check_follows_insta_conventions() {
        let tmp = tempfile::tempdir().unwrap();
        let store = GoldenStore::new(tmp.path().join("golden"));
        let path = store.path("microbenches", "micro", "str/irr");
        assert!(path.ends_with("golden/microbenches__micro__str%2Firr.snap"));
        let pending = pending_path(&path);

        // Missing, check mode: a pending file, not the snapshot.
        let outcome = store.check(&file(8.0), false, true).unwrap();
        assert_eq!(
            outcome,
            Outcome::Missing {
                pending: Some(pending.clone())
            }
        );
        assert!(!path.exists() && pending.exists());
        // On CI nothing is written.
        std::fs::remove_file(&pending).unwrap();
        let outcome = store.check(&file(8.0), false, false).unwrap();
        assert_eq!(outcome, Outcome::Missing { pending: None });
        assert!(!pending.exists());

        // --update writes; a second run changes nothing.
        assert_eq!(
            store.check(&file(8.0), true, true).unwrap(),
            Outcome::Created
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            store.check(&file(8.0), false, true).unwrap(),
            Outcome::Unchanged
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        assert_eq!(
            store.read("microbenches", "micro", "str/irr").unwrap(),
            Some(file(8.0))
        );

        // A difference: pending written, snapshot untouched, changes named.
        match store.check(&file(9.0), false, true).unwrap() {
            Outcome::Differs {
                pending: p,
                changes,
            } => {
                assert_eq!(p, Some(pending.clone()));
                assert_eq!(changes, ["trace_windows[k=3].F: 8.0 → 9.0"]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        assert!(pending.exists());
        // Going back to the stored value removes the stale pending file.
        assert_eq!(
            store.check(&file(8.0), false, true).unwrap(),
            Outcome::Unchanged
        );
        assert!(!pending.exists());
        // --update takes the new value.
        store.check(&file(9.0), false, true).unwrap();
        assert_eq!(
            store.check(&file(9.0), true, true).unwrap(),
            Outcome::Updated
        );
        assert!(!pending.exists());
    }

    /// A snapshot file holding another bench's metrics (copied or renamed
    /// by hand) is refused, naming the file and both benches (found by an
    /// outside check: validate compared against it).
    #[test]
    fn a_snapshot_of_another_bench_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = GoldenStore::new(tmp.path());
        let stored = file(8.0);
        let m = &stored.metrics;
        store.check(&stored, true, false).unwrap();
        let read = store.read(&m.package, &m.target, &m.bench).unwrap();
        assert_eq!(read.as_ref(), Some(&stored));
        let copy = store.path(&m.package, &m.target, "copy");
        std::fs::copy(store.path(&m.package, &m.target, &m.bench), &copy).unwrap();
        let e = store.read(&m.package, &m.target, "copy").unwrap_err();
        assert_eq!(
            memgaze_error::one_line(&e),
            format!(
                "{}: the snapshot is of bench `{}` of {}/{}, not `copy` of {}/{} (re-record it with `cargo memgaze golden --update`)",
                copy.display(),
                m.bench,
                m.package,
                m.target,
                m.package,
                m.target
            )
        );
    }

    #[test]
    fn orphans_are_snapshots_of_benches_that_are_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let store = GoldenStore::new(tmp.path());
        for name in [
            "microbenches__micro__str1.snap",
            "microbenches__micro__gone.snap",
            "microbenches__micro__gone.snap.new",
            "microbenches__other__x.snap",
            "README.md",
        ] {
            std::fs::write(tmp.path().join(name), "").unwrap();
        }
        let orphans = store.orphans("microbenches", "micro", &["str1".into(), "str8".into()]);
        assert_eq!(orphans, [tmp.path().join("microbenches__micro__gone.snap")]);
        assert!(
            store
                .read("microbenches", "micro", "str8")
                .unwrap()
                .is_none()
        );
        assert!(store.read("microbenches", "micro", "str1").is_err());
    }
}
