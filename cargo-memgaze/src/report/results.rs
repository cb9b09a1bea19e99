//! Finding results to report on: a trace file, an analysis JSON, or a
//! results tree (`target/memgaze/…`) holding one directory per bench.
//!
//! A bench directory holds any of these files (names shared with `bench`,
//! `golden` and `validate`):
//!
//! | file | what |
//! |---|---|
//! | [`BENCH_FILE`] `bench.json` | `{"package", "target", "bench"}`: which bench the directory is |
//! | [`TRACE_FILE`] `trace.mgz` | the recorded (sampled) trace |
//! | [`ANALYSIS_FILE`] `analysis.json` | its analysis (`memgaze.analysis.v1`) |
//! | [`GOLDEN_FILE`] `golden.json` | the analysis of a full trace of the same bench, overlaid on the trace-window chart |
//!
//! A directory with a trace but no analysis is analysed with the default
//! options. Under `report --cache-sizes`, every trace is analysed at those
//! sizes (a bench directory's trace in place of its analysis), and an
//! analysis without its trace must have been analysed at them: its
//! `lines[]` estimates cannot be read again at other sizes.

use crate::gate::{BASELINES_DIR, BenchKey};
use crate::pipeline::instrumented::CACHE_DIR;
use anyhow::{Context, Result, bail};
use memgaze_analysis::{ANALYSIS_SCHEMA, Analysis, AnalysisOptions, CacheSizes, analyze_trace};
use memgaze_trace::TraceReader;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Which bench a results directory belongs to.
pub const BENCH_FILE: &str = "bench.json";
/// The trace of a bench.
pub const TRACE_FILE: &str = "trace.mgz";
/// The analysis of [`TRACE_FILE`].
pub const ANALYSIS_FILE: &str = "analysis.json";
/// The analysis of a full trace of the bench (golden reference).
pub const GOLDEN_FILE: &str = "golden.json";
/// Where reports go under the results root, by default.
pub const REPORT_DIR: &str = "report";
/// Where `compare` writes its reports under the results root, by default.
pub const COMPARE_DIR: &str = "compare";

/// One bench's results, ready to report on.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportBench {
    /// The name shown: `bench (package/target)`, or a file name.
    pub name: String,
    /// The bench's identity, when known (matches baselines).
    pub key: Option<BenchKey>,
    /// Its analysis.
    pub analysis: Analysis,
    /// Its trace, for the per-record charts (heatmap, per-address).
    pub trace: Option<PathBuf>,
    /// The full-trace analysis to overlay, when one exists.
    pub golden: Option<Analysis>,
}

impl ReportBench {
    /// A bench from its analysis alone.
    pub fn new(name: impl Into<String>, analysis: Analysis) -> ReportBench {
        ReportBench {
            name: name.into(),
            key: None,
            analysis,
            trace: None,
            golden: None,
        }
    }
}

/// Whether `path` starts like a trace file.
fn is_trace(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == memgaze_trace::format::MAGIC)
}

/// Reads an analysis JSON document, checking its schema.
pub fn read_analysis(path: &Path) -> Result<Analysis> {
    let text = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let value: serde_json::Value = serde_json::from_slice(&text).with_context(|| {
        format!(
            "{}: not JSON (expected a trace file or an analysis JSON)",
            path.display()
        )
    })?;
    match value.get("schema").and_then(|s| s.as_str()) {
        Some(ANALYSIS_SCHEMA) => {}
        Some(other) => bail!(
            "{}: schema `{other}`, expected `{ANALYSIS_SCHEMA}`",
            path.display()
        ),
        None => bail!(
            "{}: JSON without a `schema` field: not a memgaze analysis",
            path.display()
        ),
    }
    let analysis: Analysis = serde_json::from_value(value).with_context(|| {
        format!(
            "{}: not a valid `{ANALYSIS_SCHEMA}` document",
            path.display()
        )
    })?;
    memgaze_analysis::checks::check_document(&analysis)
        .map_err(|e| anyhow::anyhow!("{}: not a plausible analysis: {e}", path.display()))?;
    Ok(analysis)
}

/// Analyses a trace file with the default options, at `cache_sizes`
/// (default: this machine's).
pub fn analyse_trace_file(path: &Path, cache_sizes: Option<&CacheSizes>) -> Result<Analysis> {
    let reader = TraceReader::open(path).with_context(|| path.display().to_string())?;
    let options = AnalysisOptions {
        cache_sizes: cache_sizes.cloned(),
        ..AnalysisOptions::default()
    };
    analyze_trace(reader, &options).with_context(|| path.display().to_string())
}

/// Reads an analysis JSON document that `report --cache-sizes` may show:
/// one without miss ratios, or with them at `cache_sizes`. Another
/// analysis is a usage error: its per-line miss estimates exist at its own
/// sizes only.
fn read_analysis_at(path: &Path, cache_sizes: Option<&CacheSizes>) -> Result<Analysis> {
    let analysis = read_analysis(path)?;
    if let (Some(wanted), Some(had)) = (cache_sizes, &analysis.run.cache_sizes)
        && (wanted.l1, wanted.l2, wanted.llc) != (had.l1, had.l2, had.llc)
    {
        return Err(memgaze_error::usage(format!(
            "{}: analysed at cache sizes {}/{}/{} B, not the {}/{}/{} B of --cache-sizes, and there is no trace to analyse again: \
             leave --cache-sizes out, or report on the trace",
            path.display(),
            had.l1,
            had.l2,
            had.llc,
            wanted.l1,
            wanted.l2,
            wanted.llc
        )));
    }
    Ok(analysis)
}

/// What [`discover`] found.
#[derive(Debug)]
pub struct Discovery {
    /// The benches, sorted by name.
    pub benches: Vec<ReportBench>,
    /// Bench directories of a results tree left out because their files
    /// cannot be read (e.g. a trace from an older cargo memgaze), one line
    /// each naming the file and the problem.
    pub skipped: Vec<String>,
}

/// Everything to report on under `results`: a trace file, an analysis
/// JSON, or a directory scanned recursively for bench directories (the
/// `baselines/`, `report/` and `compare/` directories of a results root are
/// skipped).
///
/// A file named directly must be readable. In a tree, a bench directory
/// that is not is skipped and named in [`Discovery::skipped`]: a results
/// root outlives upgrades and holds benches not run this time, and one
/// stale directory must not hide the rest of the report. An analysis at
/// other cache sizes than `cache_sizes` is not skipped but refused.
pub fn discover(results: &Path, cache_sizes: Option<&CacheSizes>) -> Result<Discovery> {
    let meta = std::fs::metadata(results)
        .with_context(|| format!("{}: cannot read", results.display()))?;
    if meta.is_file() {
        if results
            .file_name()
            .is_some_and(|n| n == ANALYSIS_FILE || n == TRACE_FILE)
        {
            // One file of a bench directory: report on the whole directory.
            let dir = results
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if let Some(bench) = bench_in(dir, dir, cache_sizes)? {
                return Ok(Discovery {
                    benches: vec![bench],
                    skipped: Vec::new(),
                });
            }
        }
        let stem = results
            .file_stem()
            .map_or_else(|| "trace".to_string(), |s| s.to_string_lossy().into_owned());
        let bench = if is_trace(results) {
            let mut bench = ReportBench::new(stem, analyse_trace_file(results, cache_sizes)?);
            bench.trace = Some(results.to_path_buf());
            bench
        } else {
            ReportBench::new(stem, read_analysis_at(results, cache_sizes)?)
        };
        return Ok(Discovery {
            benches: vec![bench],
            skipped: Vec::new(),
        });
    }
    let mut benches = Vec::new();
    let mut skipped = Vec::new();
    let mut stack = vec![results.to_path_buf()];
    while let Some(dir) = stack.pop() {
        match bench_in(&dir, results, cache_sizes) {
            Ok(Some(bench)) => benches.push(bench),
            Ok(None) => {}
            Err(e) if memgaze_error::exit_for(&e) == memgaze_error::Exit::Usage => return Err(e),
            Err(e) => skipped.push(format!(
                "skipped {}: {}",
                dir.display(),
                memgaze_error::one_line(&e)
            )),
        }
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("{}: cannot list", dir.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("{}: cannot list", dir.display()))?;
            let path = entry.path();
            // The instrumented copies' cache holds `run`'s mirrors: links
            // to the original's directories (`/usr/lib`, whose trees may
            // link back to themselves). Results are real directories, so
            // the walk never follows a link.
            let skip = dir == results
                && path.file_name().is_some_and(|n| {
                    n == BASELINES_DIR || n == REPORT_DIR || n == COMPARE_DIR || n == CACHE_DIR
                });
            if entry.file_type().is_ok_and(|t| t.is_dir()) && !skip {
                stack.push(path);
            }
        }
    }
    if benches.is_empty() {
        if let Some(first) = skipped.first() {
            bail!(
                "{}: no readable bench results ({} unreadable; first: {first})",
                results.display(),
                skipped.len()
            );
        }
        bail!(
            "{}: no bench results found (no {TRACE_FILE} or {ANALYSIS_FILE} in it or below it)",
            results.display()
        );
    }
    benches.sort_by(|a, b| a.name.cmp(&b.name));
    skipped.sort();
    Ok(Discovery { benches, skipped })
}

/// The bench whose files are in `dir`, if any. With `cache_sizes`, its
/// trace is analysed at them rather than its analysis read.
fn bench_in(
    dir: &Path,
    root: &Path,
    cache_sizes: Option<&CacheSizes>,
) -> Result<Option<ReportBench>> {
    let trace = dir.join(TRACE_FILE);
    let analysis_file = dir.join(ANALYSIS_FILE);
    let trace = trace.is_file().then_some(trace);
    let analysis = match (&trace, analysis_file.is_file()) {
        (Some(trace), _) if cache_sizes.is_some() => analyse_trace_file(trace, cache_sizes)?,
        (_, true) => read_analysis_at(&analysis_file, cache_sizes)?,
        (Some(trace), false) => analyse_trace_file(trace, None)?,
        (None, false) => return Ok(None),
    };
    let key = read_key(&dir.join(BENCH_FILE))?;
    let name = match &key {
        Some(key) => format!("{} ({}/{})", key.bench, key.package, key.target),
        None => {
            let relative = dir.strip_prefix(root).unwrap_or(dir);
            let text = relative.to_string_lossy().into_owned();
            if text.is_empty() {
                dir.file_name()
                    .map_or_else(|| "bench".to_string(), |n| n.to_string_lossy().into_owned())
            } else {
                text
            }
        }
    };
    let golden_file = dir.join(GOLDEN_FILE);
    let golden = if golden_file.is_file() {
        Some(read_analysis(&golden_file)?)
    } else {
        None
    };
    Ok(Some(ReportBench {
        name,
        key,
        analysis,
        trace,
        golden,
    }))
}

/// Reads a [`BENCH_FILE`]; `None` when there is none.
fn read_key(path: &Path) -> Result<Option<BenchKey>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let key: BenchKey = serde_json::from_slice(&text).with_context(|| {
        format!(
            "{}: expected {{\"package\", \"target\", \"bench\"}}",
            path.display()
        )
    })?;
    Ok(Some(key))
}
