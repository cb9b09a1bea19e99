//! Saving a baseline as a whole: the new baseline directory (the benches of
//! this run, plus the benches of the previous baseline of that name that
//! this run did not measure) is built under a hidden staging name beside it
//! and swapped in with one `renameat2(RENAME_EXCHANGE)`. An interrupted or
//! failed save leaves the previous baseline exactly as it was (at worst a
//! hidden `.NAME.staging.*` directory, which listing ignores and the next
//! save of any baseline removes); readers see the old baseline or the new
//! one, never a mix.

use super::baseline::{BASELINE_FILE, BenchRun, baselines_dir, check_name, saved_bench};
use anyhow::{Context, Result, bail};
use memgaze_output::exchange;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Writes one file of a baseline being staged (the real one is a plain
/// write into the private staging directory; tests fail chosen entries).
pub(crate) type EntryWriter<'a> = dyn FnMut(&Path, &[u8]) -> Result<()> + 'a;

/// Saves `runs` as baseline `name` through `write` (see the module
/// documentation); returns the baseline's directory.
pub(crate) fn save_whole(
    results_root: &Path,
    name: &str,
    runs: &[BenchRun],
    write: &mut EntryWriter<'_>,
) -> Result<PathBuf> {
    check_name(name)?;
    let baselines = baselines_dir(results_root);
    memgaze_output::create_dir_within(results_root, &baselines)?;
    remove_stale_staging(&baselines);
    let dest = baselines.join(name);
    let staging = Staging::create(&baselines, name)?;
    let replaced: BTreeSet<PathBuf> = runs.iter().map(|r| r.key.relative_dir()).collect();
    // The previous baseline's other benches are carried over unchanged.
    if dest.is_dir() {
        for file in super::baseline::baseline_files(&dest)? {
            let Ok(relative) = file.strip_prefix(&dest) else {
                continue;
            };
            if relative.parent().is_some_and(|dir| replaced.contains(dir)) {
                continue;
            }
            let bytes =
                std::fs::read(&file).with_context(|| format!("{}: cannot read", file.display()))?;
            let copy = staging.path.join(relative);
            create_parent(&copy)?;
            write(&copy, &bytes)?;
        }
    }
    for run in runs {
        let json = serde_json::to_vec(&saved_bench(run)).context("cannot encode the baseline")?;
        let file = staging
            .path
            .join(run.key.relative_dir())
            .join(BASELINE_FILE);
        create_parent(&file)?;
        write(&file, &json)?;
    }
    staging.swap_into(&dest)?;
    Ok(dest)
}

/// `read(dir)` of one version of a baseline directory, never a mix of two
/// saves. The directory is opened first and read through that handle
/// (`/proc/self/fd/N`), so every file comes from the directory that was
/// there when the read began, even if a save swaps in another one
/// meanwhile; the read counts if that directory is still the one at `dir`
/// afterwards (while the handle is open its inode cannot be reused, and a
/// swapped-out directory never comes back), else it is repeated. Errors are
/// reported by a read of `dir` itself, so they name the real path.
pub(crate) fn read_consistently<T>(dir: &Path, read: impl Fn(&Path) -> Result<T>) -> Result<T> {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::io::AsRawFd;
    let identity = |m: std::fs::Metadata| (m.dev(), m.ino());
    for _ in 0..50 {
        let Ok(handle) = std::fs::File::open(dir) else {
            break;
        };
        let through = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()));
        if !through.is_dir() {
            // No /proc: read the path itself.
            break;
        }
        let result = read(&through);
        let held = handle.metadata().ok().map(identity);
        let now = std::fs::metadata(dir).ok().map(identity);
        if held.is_some() && held == now {
            return match result {
                Ok(value) => Ok(value),
                Err(_) => read(dir),
            };
        }
    }
    read(dir)
}

/// The plain entry writer.
pub(crate) fn write_entry(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("{}: cannot write", path.display()))
}

fn create_parent(file: &Path) -> Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))
}

/// Prefix of staging directories: hidden (baseline names never start with
/// `.`), so `list_baselines` skips them.
fn staging_prefix(name: &str) -> String {
    format!(".{name}.staging.")
}

/// Removes staging directories that interrupted saves left behind (older
/// than an hour, so a save running beside this one is left alone).
fn remove_stale_staging(baselines: &Path) {
    let Ok(entries) = std::fs::read_dir(baselines) else {
        return;
    };
    let hour = std::time::Duration::from_secs(3600);
    for entry in entries.flatten() {
        let stale = entry
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > hour);
        if stale && entry.file_name().to_string_lossy().contains(".staging.") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A staging directory, removed when dropped unless it was swapped in.
struct Staging {
    path: PathBuf,
}

impl Staging {
    fn create(baselines: &Path, name: &str) -> Result<Staging> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        for attempt in 0..100u32 {
            let path = baselines.join(format!(
                "{}{}-{nanos:08x}-{attempt}",
                staging_prefix(name),
                std::process::id()
            ));
            // `create_dir` fails on anything already there (no link is
            // followed); the directory gets the usual mode, as it becomes
            // the baseline.
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(Staging { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("{}: cannot create", baselines.display()));
                }
            }
        }
        bail!("{}: cannot create a staging directory", baselines.display())
    }

    /// Puts the staged baseline at `dest`, atomically when `dest` exists
    /// (exchange, then removal of the old one), else by a plain rename.
    fn swap_into(self, dest: &Path) -> Result<()> {
        let failed = |e: std::io::Error| {
            anyhow::Error::new(e).context(format!("{}: cannot save the baseline", dest.display()))
        };
        if std::fs::symlink_metadata(dest).is_err() {
            match std::fs::rename(&self.path, dest) {
                Ok(()) => {
                    std::mem::forget(self);
                    return Ok(());
                }
                // Another save created it meanwhile: exchange with that.
                Err(e) if dest.exists() => drop(e),
                Err(e) => return Err(failed(e)),
            }
        }
        match exchange(&self.path, dest) {
            // `self.path` now holds the previous baseline; drop removes it.
            Ok(()) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
                // No RENAME_EXCHANGE on this file system: move the old one
                // aside first (a reader may briefly find no baseline).
                let aside = self.path.with_extension("old");
                std::fs::rename(dest, &aside).map_err(failed)?;
                if let Err(e) = std::fs::rename(&self.path, dest) {
                    let _ = std::fs::rename(&aside, dest);
                    return Err(failed(e));
                }
                let _ = std::fs::remove_dir_all(&aside);
                std::mem::forget(self);
                Ok(())
            }
            Err(e) => Err(failed(e)),
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cargo::BenchKey;
    use crate::gate::load_baseline;
    use memgaze_analysis::{Analysis, AnalysisOptions, Analyzer};
    use memgaze_trace::{Backend, LoadClass, LoadEntry, Sampling, TraceHeader, TraceTotals};

    /// A small analysis whose `A` is `records`.
    fn analysis(records: u64) -> Analysis {
        let header = TraceHeader {
            backend: Backend::Soft,
            sampling: Sampling::full(),
            binary: None,
            command: vec![],
            functions: vec![],
            loads: vec![LoadEntry {
                ip: 0x10,
                class: LoadClass::Strided,
                implied: 0,
                function: None,
                line: None,
                proxy: None,
            }],
            labels: vec![],
            spatial: None,
        };
        let mut a = Analyzer::new(&header, &AnalysisOptions::default()).unwrap();
        for i in 0..records {
            a.push_load(0, 0x1000 + 8 * i, 0, 0);
        }
        a.finish(&TraceTotals::clean(records, records, 1))
    }

    fn run(bench: &str, records: u64) -> BenchRun {
        BenchRun {
            key: BenchKey::new("p", "t", bench),
            analysis: analysis(records),
            binary: None,
            profile: Some("bench".into()),
        }
    }

    fn entries(root: &Path) -> Vec<(String, u64)> {
        load_baseline(root, "main")
            .unwrap()
            .benches
            .iter()
            .map(|b| (b.bench.bench.clone(), b.analysis.summary.a))
            .collect()
    }

    /// The write of the `n`th entry fails, as an interrupted save would
    /// stop: the previous baseline stays loadable and unchanged, and no
    /// staging directory is left.
    #[test]
    fn a_save_failing_at_any_entry_keeps_the_previous_baseline_whole() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let old: Vec<BenchRun> = ["a", "b", "c", "d"].iter().map(|b| run(b, 10)).collect();
        super::super::save_baseline(root, "main", &old).unwrap();
        let before = entries(root);
        assert_eq!(before.len(), 4);
        let new: Vec<BenchRun> = ["a", "b", "c", "e"].iter().map(|b| run(b, 20)).collect();
        // 5 entries are staged: `d` carried over, then the 4 new ones.
        for fail_at in 0..5 {
            let mut n = 0;
            let mut write = |path: &Path, bytes: &[u8]| {
                n += 1;
                if n > fail_at {
                    bail!("{}: injected failure", path.display());
                }
                write_entry(path, bytes)
            };
            assert!(save_whole(root, "main", &new, &mut write).is_err());
            assert_eq!(entries(root), before, "failure at entry {fail_at}");
            let names: Vec<String> = std::fs::read_dir(baselines_dir(root))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(names, ["main"], "failure at entry {fail_at}");
        }
        save_whole(root, "main", &new, &mut write_entry).unwrap();
        let after = entries(root);
        assert_eq!(
            after,
            [("a", 20), ("b", 20), ("c", 20), ("d", 10), ("e", 20)]
                .map(|(b, a)| (b.to_string(), a))
        );
    }

    /// Saves racing each other (one baseline, different contents) each
    /// leave one whole baseline: every entry from the same save.
    #[test]
    fn concurrent_saves_leave_one_whole_baseline() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let benches = ["a", "b", "c", "d", "e", "f"];
        std::thread::scope(|scope| {
            for records in 1..=4u64 {
                scope.spawn(move || {
                    let runs: Vec<BenchRun> =
                        benches.iter().map(|b| run(b, records * 10)).collect();
                    for _ in 0..10 {
                        super::super::save_baseline(root, "main", &runs).unwrap();
                    }
                });
            }
            scope.spawn(|| {
                for _ in 0..200 {
                    if let Ok(baseline) = load_baseline(root, "main") {
                        let a: BTreeSet<u64> = baseline
                            .benches
                            .iter()
                            .map(|b| b.analysis.summary.a)
                            .collect();
                        assert!(a.len() <= 1, "a mixed baseline: {a:?}");
                    }
                }
            });
        });
        let a: BTreeSet<u64> = entries(root).iter().map(|e| e.1).collect();
        assert_eq!(a.len(), 1);
        assert_eq!(entries(root).len(), benches.len());
    }
}
