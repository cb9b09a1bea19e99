//! Keeping a report directory to the current run's files.
//!
//! Every report writes [`MANIFEST_FILE`], the list of the files it wrote
//! (relative paths, one a line). The next report into the same directory
//! removes the files of the previous list that it did not write itself
//! (a bench no longer run, `baseline.svg` without `--baseline`), and the
//! directories that this leaves empty. Nothing else is touched: a file the
//! user put beside the report is never in a manifest, and a manifest line
//! that is absolute, climbs out with `..` or names a directory is ignored.
//! A directory written before manifests existed has its known file names
//! (`LEGACY_FILES`, `LEGACY_CHARTS` in a bench's subdirectory) removed
//! the same way.

use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The list of files a report wrote, in its output directory.
pub const MANIFEST_FILE: &str = ".memgaze-report";

/// Files at the top of a report directory from before manifests.
const LEGACY_FILES: [&str; 1] = ["baseline.svg"];
/// Chart files of a bench subdirectory from before manifests.
const LEGACY_CHARTS: [&str; 6] = [
    "trace-windows.svg",
    "reuse.svg",
    "heatmap.svg",
    "addresses.svg",
    "functions.svg",
    "regions.svg",
];

/// Whether `line` is a plain relative path inside the directory.
fn is_inside(line: &str) -> bool {
    let path = Path::new(line);
    !line.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)))
}

/// The files the previous report in `out` wrote, relative to `out`.
fn previous(out: &Path) -> Result<BTreeSet<PathBuf>> {
    let manifest = out.join(MANIFEST_FILE);
    if manifest.is_file() {
        let text = std::fs::read_to_string(&manifest)
            .with_context(|| format!("{}: cannot read", manifest.display()))?;
        return Ok(text
            .lines()
            .filter(|l| is_inside(l))
            .map(PathBuf::from)
            .collect());
    }
    // Before manifests: the known names, only where an index shows that
    // the directory is a report.
    let mut files = BTreeSet::new();
    if !out.join("index.html").is_file() {
        return Ok(files);
    }
    files.extend(LEGACY_FILES.iter().map(PathBuf::from));
    let Ok(entries) = std::fs::read_dir(out) else {
        return Ok(files);
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        if !dir.is_dir() {
            continue;
        }
        for chart in LEGACY_CHARTS {
            if dir.join(chart).is_file() {
                files.insert(PathBuf::from(entry.file_name()).join(chart));
            }
        }
    }
    Ok(files)
}

/// Removes what the previous report in `out` wrote and this one did not
/// (`written`: paths relative to `out`), then records `written` as the
/// new manifest. Returns the files removed, relative to `out`.
pub fn replace_previous(out: &Path, written: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let now: BTreeSet<&PathBuf> = written.iter().collect();
    let mut removed = Vec::new();
    for stale in previous(out)? {
        if now.contains(&stale) {
            continue;
        }
        let path = out.join(&stale);
        // `symlink_metadata`: a link is removed as a link, never followed.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            continue;
        }
        std::fs::remove_file(&path)
            .with_context(|| format!("{}: cannot remove a stale report file", path.display()))?;
        removed.push(stale.clone());
        // Its directories, where now empty (`remove_dir` refuses others).
        let mut dir = stale.parent();
        while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
            if std::fs::remove_dir(out.join(d)).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
    let mut list = String::new();
    for file in written {
        list.push_str(&file.to_string_lossy());
        list.push('\n');
    }
    memgaze_output::write_atomic(&out.join(MANIFEST_FILE), list)?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_count() {
        assert!(is_inside("a/b.svg"));
        assert!(is_inside("index.html"));
        assert!(!is_inside("../x"));
        assert!(!is_inside("/etc/passwd"));
        assert!(!is_inside("a/../../x"));
        assert!(!is_inside("./a"));
        assert!(!is_inside(""));
    }

    #[test]
    fn stale_files_go_and_others_stay() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        std::fs::create_dir_all(out.join("old-bench")).unwrap();
        std::fs::create_dir_all(out.join("kept")).unwrap();
        for file in [
            "index.html",
            "baseline.svg",
            "old-bench/reuse.svg",
            "kept/reuse.svg",
        ] {
            std::fs::write(out.join(file), "x").unwrap();
        }
        std::fs::write(out.join("notes.txt"), "mine").unwrap();
        std::fs::write(out.join("old-bench/notes.txt"), "mine").unwrap();
        // No manifest yet: the known names go.
        let written = [PathBuf::from("index.html"), PathBuf::from("kept/reuse.svg")];
        let removed = replace_previous(out, &written).unwrap();
        assert_eq!(
            removed,
            [
                PathBuf::from("baseline.svg"),
                PathBuf::from("old-bench/reuse.svg")
            ]
        );
        assert!(out.join("notes.txt").is_file());
        assert!(out.join("old-bench/notes.txt").is_file(), "not ours: kept");
        assert!(out.join("kept/reuse.svg").is_file());
        // With a manifest: what it lists and this run did not write goes,
        // with its directory once empty.
        std::fs::create_dir_all(out.join("gone")).unwrap();
        std::fs::write(out.join("gone/mrc.svg"), "x").unwrap();
        replace_previous(
            out,
            &[PathBuf::from("index.html"), PathBuf::from("gone/mrc.svg")],
        )
        .unwrap();
        std::fs::write(
            out.join(MANIFEST_FILE),
            "index.html\ngone/mrc.svg\n../outside\n",
        )
        .unwrap();
        let removed = replace_previous(out, &[PathBuf::from("index.html")]).unwrap();
        assert_eq!(removed, [PathBuf::from("gone/mrc.svg")]);
        assert!(!out.join("gone").exists());
        assert!(out.join("index.html").is_file());
    }
}
