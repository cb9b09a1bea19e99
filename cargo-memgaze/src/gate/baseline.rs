//! Saved baselines: per bench, the analysis of a run together with the
//! sampling parameters, backend and binary identity it was recorded with,
//! under `target/memgaze/baselines/<NAME>/<package>/<target>/<bench>/baseline.json`.
//!
//! A run of a subset of benches updates only those; benches saved earlier
//! under the same name stay. Every save replaces the baseline directory as
//! a whole (`staging.rs`): an interrupted save leaves the previous baseline
//! unchanged, never a mix of old and new entries.

use anyhow::{Context, Result, bail};
use memgaze_analysis::Analysis;
use memgaze_error::usage;
use memgaze_trace::{Backend, BinaryIdentity};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Schema tag of baseline files.
pub const BASELINE_SCHEMA: &str = "memgaze.baseline.v1";
/// Directory of the baselines under the results root (`target/memgaze`).
pub const BASELINES_DIR: &str = "baselines";
/// File name of one bench's baseline.
pub const BASELINE_FILE: &str = "baseline.json";

pub use crate::cargo::BenchKey;

/// How a run was recorded: what must match for two runs to be compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recording {
    /// Collector.
    pub backend: Backend,
    /// Whether it is a full trace.
    pub full: bool,
    /// `w` (`None` for a full trace).
    pub window: Option<u64>,
    /// `w + z` (`None` for a full trace).
    pub period: Option<u64>,
}

impl Recording {
    /// The recording parameters of an analysed run.
    pub fn of(analysis: &Analysis) -> Recording {
        Recording {
            backend: analysis.run.backend,
            full: analysis.run.full,
            window: analysis.run.window,
            period: analysis.run.period,
        }
    }
}

impl fmt::Display for Recording {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.full {
            write!(f, "--full with the {} backend", self.backend)
        } else {
            let show = |v: Option<u64>| v.map_or_else(|| "?".to_string(), |v| v.to_string());
            write!(
                f,
                "--period {} --window {} with the {} backend",
                show(self.period),
                show(self.window),
                self.backend
            )
        }
    }
}

/// One bench's result as the gate sees it: what `bench` has after a run.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRun {
    /// Which bench.
    pub key: BenchKey,
    /// Its analysis.
    pub analysis: Analysis,
    /// The original binary, from the trace header.
    pub binary: Option<BinaryIdentity>,
    /// The cargo profile the bench was built with (`None` when unknown).
    pub profile: Option<String>,
}

/// One bench of a saved baseline (the file's contents).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaselineBench {
    /// Always [`BASELINE_SCHEMA`].
    pub schema: String,
    /// Which bench.
    pub bench: BenchKey,
    /// Seconds since the Unix epoch when it was saved.
    pub saved_at: u64,
    /// How it was recorded.
    pub recording: Recording,
    /// The original binary.
    pub binary: Option<BinaryIdentity>,
    /// The cargo profile it was built with (absent in baselines saved
    /// before it was recorded, and when unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The analysis.
    pub analysis: Analysis,
}

/// A loaded baseline: every bench saved under one name.
#[derive(Clone, Debug, PartialEq)]
pub struct Baseline {
    /// Its name.
    pub name: String,
    /// Its directory.
    pub dir: PathBuf,
    /// Its benches, sorted by key.
    pub benches: Vec<BaselineBench>,
}

impl Baseline {
    /// The saved result of `key`, if the baseline has it.
    pub fn bench(&self, key: &BenchKey) -> Option<&BaselineBench> {
        self.benches.iter().find(|b| &b.bench == key)
    }
}

/// What `list_baselines` says of one baseline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BaselineInfo {
    /// Its name.
    pub name: String,
    /// Benches saved in it.
    pub benches: usize,
    /// When its latest bench was saved (seconds since the Unix epoch).
    pub saved_at: u64,
    /// Its directory.
    pub dir: PathBuf,
}

/// `<results root>/baselines`.
pub fn baselines_dir(results_root: &Path) -> PathBuf {
    results_root.join(BASELINES_DIR)
}

/// Checks a baseline name: letters, digits, `_`, `-`, `.`, not leading
/// `.`, at most 64 characters — it becomes a directory name.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(usage(format!(
            "baseline name `{name}`: use 1 to 64 letters, digits, `_`, `-` or `.` (not leading `.`)"
        )))
    }
}

/// Saves one bench's run as part of baseline `name` (replacing what that
/// baseline held for this bench); returns the file written.
pub fn save_baseline_bench(results_root: &Path, name: &str, run: &BenchRun) -> Result<PathBuf> {
    let dir = save_baseline(results_root, name, std::slice::from_ref(run))?;
    Ok(dir.join(run.key.relative_dir()).join(BASELINE_FILE))
}

/// Saves every run as baseline `name` (replacing what it held for those
/// benches, keeping its other benches), all or nothing; returns its
/// directory.
pub fn save_baseline(results_root: &Path, name: &str, runs: &[BenchRun]) -> Result<PathBuf> {
    super::staging::save_whole(results_root, name, runs, &mut super::staging::write_entry)
}

/// The file contents saved for one run.
pub(crate) fn saved_bench(run: &BenchRun) -> BaselineBench {
    BaselineBench {
        schema: BASELINE_SCHEMA.to_string(),
        bench: run.key.clone(),
        saved_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        recording: Recording::of(&run.analysis),
        binary: run.binary.clone(),
        profile: run.profile.clone(),
        analysis: run.analysis.clone(),
    }
}

/// Whether baseline `name` is saved under `results_root`.
pub fn baseline_exists(results_root: &Path, name: &str) -> bool {
    baselines_dir(results_root).join(name).is_dir()
}

/// Checks that baseline `name` is saved: the error of a missing one names
/// where it was looked for and lists the saved ones.
pub fn check_baseline_exists(results_root: &Path, name: &str) -> Result<()> {
    check_name(name)?;
    if baseline_exists(results_root, name) {
        return Ok(());
    }
    let saved = list_baselines(results_root)?;
    let names: Vec<&str> = saved.iter().map(|b| b.name.as_str()).collect();
    let hint = if names.is_empty() {
        "no baseline is saved yet (save one with --save-baseline NAME)".to_string()
    } else {
        format!("saved baselines: {}", names.join(", "))
    };
    bail!(
        "baseline `{name}` not found in {}: {hint}",
        baselines_dir(results_root).display()
    );
}

/// Loads baseline `name`. A missing baseline is an error that lists the
/// saved ones ([`check_baseline_exists`]).
pub fn load_baseline(results_root: &Path, name: &str) -> Result<Baseline> {
    check_baseline_exists(results_root, name)?;
    let dir = baselines_dir(results_root).join(name);
    let benches = super::staging::read_consistently(&dir, read_benches)?;
    Ok(Baseline {
        name: name.to_string(),
        dir,
        benches,
    })
}

/// Every bench file of a baseline directory, sorted by key.
fn read_benches(dir: &Path) -> Result<Vec<BaselineBench>> {
    let mut benches = Vec::new();
    for file in baseline_files(dir)? {
        let text =
            std::fs::read(&file).with_context(|| format!("{}: cannot read", file.display()))?;
        let bench: BaselineBench = serde_json::from_slice(&text)
            .with_context(|| format!("{}: not a memgaze baseline file", file.display()))?;
        if bench.schema != BASELINE_SCHEMA {
            bail!(
                "{}: baseline schema `{}`, this cargo memgaze reads `{BASELINE_SCHEMA}`: save the baseline again",
                file.display(),
                bench.schema
            );
        }
        memgaze_analysis::checks::check_document(&bench.analysis).map_err(|e| {
            anyhow::anyhow!("{}: not a plausible baseline analysis: {e}", file.display())
        })?;
        benches.push(bench);
    }
    benches.sort_by(|a, b| a.bench.cmp(&b.bench));
    Ok(benches)
}

/// The saved baselines, by name.
pub fn list_baselines(results_root: &Path) -> Result<Vec<BaselineInfo>> {
    let root = baselines_dir(results_root);
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot list", root.display())),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("{}: cannot list", root.display()))?;
        let dir = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !dir.is_dir() || check_name(&name).is_err() {
            continue;
        }
        let files = baseline_files(&dir)?;
        let saved_at = files
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok()?.modified().ok())
            .filter_map(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs())
            .max()
            .unwrap_or(0);
        found.push(BaselineInfo {
            name,
            benches: files.len(),
            saved_at,
            dir,
        });
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}

/// Every `baseline.json` below `dir`.
pub(crate) fn baseline_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("{}: cannot list", dir.display()))?
        {
            let path = entry
                .with_context(|| format!("{}: cannot list", dir.display()))?
                .path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == BASELINE_FILE) {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cargo::encode_component;

    #[test]
    fn components_are_safe_and_distinct() {
        assert_eq!(encode_component("str1"), "str1");
        assert_eq!(encode_component("str/irr"), "str%2Firr");
        assert_eq!(encode_component("irr|str|irr"), "irr%7Cstr%7Cirr");
        assert_eq!(encode_component(".."), "%2E.");
        assert_eq!(encode_component(""), "%");
        assert_ne!(encode_component("a/b"), encode_component("a%2Fb"));
    }

    #[test]
    fn names_are_checked() {
        for good in ["main", "pr-42", "v1.2_rc"] {
            check_name(good).unwrap();
        }
        for bad in ["", ".hidden", "a/b", "with space", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
