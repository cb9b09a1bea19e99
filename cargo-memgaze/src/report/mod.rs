//! SVG charts and the HTML report.
//!
//! [`report_results`] (the `report` command) and [`write_report`] (for
//! `bench`, after a run) write one SVG per chart and a self-contained
//! `index.html` into an output directory, by default
//! [`default_report_dir`] = `target/memgaze/report`:
//!
//! ```text
//! <out>/index.html                 overview table, per-bench sections, tables
//! <out>/baseline.svg               (f) old vs new per bench, with a baseline
//! <out>/<bench>/trace-windows.svg  (a) with golden/baseline overlaid
//! <out>/<bench>/reuse.svg          (b)
//! <out>/<bench>/heatmap.svg        (c) needs the trace
//! <out>/<bench>/addresses.svg      (d) needs the trace
//! <out>/<bench>/functions.svg      (e)
//! <out>/<bench>/regions.svg        (e)
//! <out>/.memgaze-report            the files written, for the next report
//! ```
//!
//! A report replaces the previous one in the same directory: files the
//! previous report wrote and this one did not are removed ([`clean`]);
//! nothing else in the directory is touched. Benches are listed
//! regressions first, then by their headline numbers (`glance`).
//!
//! Charts come from plain inputs ([`charts`]); [`profile`] computes the
//! per-record views in a streaming pass over the trace; [`results`] finds
//! the benches of a results tree.

mod adapt;
pub mod charts;
pub mod clean;
mod glance;
mod html;
pub mod profile;
pub mod results;
pub mod summary;

pub use results::{
    ANALYSIS_FILE, BENCH_FILE, COMPARE_DIR, Discovery, GOLDEN_FILE, REPORT_DIR, ReportBench,
    TRACE_FILE, discover,
};

use crate::gate::{Baseline, BenchVerdict, Limits, Regression, compare_analysis};
use anyhow::{Context, Result};
use profile::{ProfileOptions, profile_trace};
use std::collections::BTreeMap;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// How to write a report.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// Output directory (created; files in it are overwritten).
    pub out_dir: PathBuf,
    /// Heading of the page.
    pub title: String,
    /// Grid sizes of the per-record charts.
    pub profile: ProfileOptions,
    /// A baseline to compare with: old-vs-new charts and tables.
    pub baseline: Option<Baseline>,
    /// Limits the comparison tables mark regressions by.
    pub limits: Limits,
    /// Limits of particular packages (by name), replacing [`Self::limits`]
    /// for their benches, as `bench` gates each package with its own.
    pub package_limits: BTreeMap<String, Limits>,
    /// Functions and regions shown in the bar charts.
    pub top: usize,
    /// What charts and tables call the run the report is about: `this run`,
    /// or for `compare OLD NEW` the newer baseline's name.
    pub run_label: String,
    /// Cache sizes a trace is analysed at (`report --cache-sizes`); an
    /// analysis JSON analysed at other sizes is refused. `None`: the
    /// machine's for traces, and analyses as they are.
    pub cache_sizes: Option<memgaze_analysis::CacheSizes>,
}

impl ReportOptions {
    /// Defaults writing into `out_dir`.
    pub fn new(out_dir: impl Into<PathBuf>) -> ReportOptions {
        ReportOptions {
            out_dir: out_dir.into(),
            title: "cargo memgaze report".into(),
            profile: ProfileOptions::default(),
            baseline: None,
            limits: Limits::defaults(),
            package_limits: BTreeMap::new(),
            top: 12,
            run_label: "this run".into(),
            cache_sizes: None,
        }
    }
}

/// What a report wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportOutput {
    /// The `index.html`.
    pub index: PathBuf,
    /// Every SVG written.
    pub charts: Vec<PathBuf>,
    /// Benches reported.
    pub benches: usize,
    /// Problems that did not stop the report (e.g. an unreadable trace:
    /// its per-record charts are missing; a bench directory of the results
    /// tree that could not be read at all; a comparison with the baseline
    /// refused), one line each.
    pub warnings: Vec<String>,
    /// The comparison of each bench with the baseline, in the page's order
    /// (empty without a baseline; refused comparisons are in `warnings`).
    pub verdicts: Vec<BenchVerdict>,
    /// Files of an earlier report in the directory that this one removed
    /// (relative to it).
    pub removed: Vec<PathBuf>,
}

impl ReportOutput {
    /// Every regression against the baseline.
    pub fn regressions(&self) -> impl Iterator<Item = &Regression> {
        self.verdicts.iter().flat_map(|v| &v.regressions)
    }
}

/// `<results root>/report`: where `bench` writes its report.
pub fn default_report_dir(results_root: &Path) -> PathBuf {
    results_root.join(REPORT_DIR)
}

/// Reports on everything under `results` (a trace, an analysis JSON or a
/// results tree).
pub fn report_results(results: &Path, options: &ReportOptions) -> Result<ReportOutput> {
    let found = discover(results, options.cache_sizes.as_ref())?;
    let mut output = write_report(&found.benches, &results.display().to_string(), options)?;
    output.warnings.splice(0..0, found.skipped);
    Ok(output)
}

/// One chart file as the page links it.
#[derive(Clone, Debug)]
pub(crate) struct ChartFile {
    /// Caption.
    pub title: String,
    /// Path relative to the page.
    pub file: String,
    /// Pixel size.
    pub size: (u32, u32),
    /// Which part of the bench section it belongs to.
    pub section: &'static str,
}

/// One bench's part of the page.
pub(crate) struct BenchPage<'a> {
    pub bench: &'a ReportBench,
    pub slug: String,
    pub charts: Vec<ChartFile>,
    /// The comparison with the baseline (`Err`: refused, with the reason).
    pub verdict: Option<std::result::Result<BenchVerdict, String>>,
    pub notes: Vec<String>,
    /// What tables call the run the page is about ([`ReportOptions::run_label`]).
    pub run_label: String,
}

/// A file-system- and URL-safe directory name for a bench, unique in `taken`.
fn slug(name: &str, taken: &mut HashSet<String>) -> String {
    let mut base: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    base = base
        .split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    if base.is_empty() {
        base = "bench".into();
    }
    base.truncate(80);
    let mut candidate = base.clone();
    let mut n = 2;
    while !taken.insert(candidate.clone()) {
        candidate = format!("{base}-{n}");
        n += 1;
    }
    candidate
}

/// The pixel size of a rendered chart (from its root element).
fn svg_size(svg: &str) -> (u32, u32) {
    let attr = |name: &str| -> u32 {
        let head = &svg[..svg.find('>').unwrap_or(svg.len())];
        head.split(&format!(" {name}=\""))
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (attr("width"), attr("height"))
}

/// Writes the charts and `index.html` for `benches`. `source` names where
/// they came from (shown on the page).
pub fn write_report(
    benches: &[ReportBench],
    source: &str,
    options: &ReportOptions,
) -> Result<ReportOutput> {
    let out = &options.out_dir;
    // `create_dir_all` on a file says "File exists", which reads as if the
    // directory were in the way.
    if out.exists() && !out.is_dir() {
        anyhow::bail!(
            "{}: not a directory (the report is a directory of files)",
            out.display()
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("{}: cannot create", out.display()))?;
    let mut taken = HashSet::from(["index".to_string(), "baseline".to_string()]);
    let slugs: Vec<String> = benches.iter().map(|b| slug(&b.name, &mut taken)).collect();

    // Benches are independent: render them on all cores.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(benches.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<Option<Result<BenchPage>>> = (0..benches.len()).map(|_| None).collect();
    let joined: Result<()> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= benches.len() {
                            break;
                        }
                        done.push((i, bench_page(&benches[i], &slugs[i], options)));
                    }
                    done
                })
            })
            .collect();
        for worker in workers {
            // A chart that panics (a bug) fails the report with an error
            // rather than taking the whole command down.
            let done = worker
                .join()
                .map_err(|_| anyhow::anyhow!("{}: a chart could not be drawn", out.display()))?;
            for (i, page) in done {
                results[i] = Some(page);
            }
        }
        Ok(())
    });
    joined?;
    let mut pages = Vec::new();
    for result in results {
        pages.push(result.context("a bench was not rendered")??);
    }

    let mut overview = Vec::new();
    let mut written: Vec<PathBuf> = Vec::new();
    if let Some(baseline) = &options.baseline {
        let pairs: Vec<(
            String,
            &memgaze_analysis::Analysis,
            &memgaze_analysis::Analysis,
        )> = pages
            .iter()
            .filter_map(|p| {
                let key = p.bench.key.as_ref()?;
                let old = baseline.bench(key)?;
                // Only comparable runs go side by side.
                matches!(p.verdict, Some(Ok(_)))
                    .then(|| (p.bench.name.clone(), &old.analysis, &p.bench.analysis))
            })
            .collect();
        if !pairs.is_empty() {
            let chart = adapt::baseline_chart(&baseline.name, &options.run_label, &pairs);
            let svg = charts::bars::render(&chart)?;
            overview.push(write_chart(
                out,
                "baseline.svg",
                &svg,
                &chart.title,
                "overview",
            )?);
            written.push(out.join("baseline.svg"));
        }
    }
    for page in &pages {
        written.extend(page.charts.iter().map(|c| out.join(&c.file)));
    }
    let page = html::index(
        &options.title,
        source,
        &pages,
        &overview,
        options.baseline.as_ref().map(|b| b.name.as_str()),
    );
    let index = out.join("index.html");
    memgaze_output::write_atomic(&index, page)?;
    let mut relative: Vec<PathBuf> = written
        .iter()
        .filter_map(|p| p.strip_prefix(out).ok().map(Path::to_path_buf))
        .collect();
    relative.push(PathBuf::from("index.html"));
    let removed = clean::replace_previous(out, &relative)?;
    let mut warnings: Vec<String> = pages
        .iter()
        .flat_map(|p| {
            p.notes
                .iter()
                .map(move |n| format!("{}: {n}", p.bench.name))
        })
        .collect();
    let mut verdicts = Vec::new();
    for i in glance::rank(&pages) {
        match &pages[i].verdict {
            Some(Ok(v)) => verdicts.push(v.clone()),
            Some(Err(e)) => warnings.push(format!("{}: not compared: {e}", pages[i].bench.name)),
            None => {}
        }
    }
    Ok(ReportOutput {
        index,
        charts: written,
        benches: pages.len(),
        warnings,
        verdicts,
        removed,
    })
}

fn write_chart(
    out: &Path,
    file: &str,
    svg: &str,
    title: &str,
    section: &'static str,
) -> Result<ChartFile> {
    let path = out.join(file);
    memgaze_output::write_atomic(&path, svg)?;
    Ok(ChartFile {
        title: title.to_string(),
        file: file.to_string(),
        size: svg_size(svg),
        section,
    })
}

/// Renders every chart of one bench into `<out>/<slug>/`.
fn bench_page<'a>(
    bench: &'a ReportBench,
    slug: &str,
    options: &ReportOptions,
) -> Result<BenchPage<'a>> {
    let dir = options.out_dir.join(slug);
    memgaze_output::create_dir_within(&options.out_dir, &dir)?;
    let a = &bench.analysis;
    let name = &bench.name;
    let mut charts = Vec::new();
    let mut notes = Vec::new();
    let chart = |file: &str, svg: &str, title: &str, section| {
        write_chart(
            &options.out_dir,
            &format!("{slug}/{file}"),
            svg,
            title,
            section,
        )
    };

    let baseline = options
        .baseline
        .as_ref()
        .and_then(|b| Some((b.name.as_str(), b.bench(bench.key.as_ref()?)?)));
    let verdict = match (&options.baseline, baseline) {
        (Some(b), Some((_, old))) => Some(
            compare_analysis(
                &b.name,
                old,
                bench.key.as_ref().expect("matched by key"),
                a,
                bench
                    .key
                    .as_ref()
                    .and_then(|k| options.package_limits.get(&k.package))
                    .unwrap_or(&options.limits),
            )
            .map_err(|e| memgaze_error::one_line(&e)),
        ),
        (Some(_), None) => Some(Ok(BenchVerdict {
            bench: bench
                .key
                .clone()
                .unwrap_or_else(|| crate::gate::BenchKey::new("", "", name)),
            metrics: Vec::new(),
            regressions: Vec::new(),
            window_k: None,
            has_baseline: false,
            notes: Vec::new(),
        })),
        (None, _) => None,
    };
    let comparable = matches!(verdict, Some(Ok(ref v)) if v.has_baseline);

    // (a) Trace windows, with the golden full trace and the baseline overlaid.
    let run = options.run_label.as_str();
    let this = if a.run.full {
        format!("{run} (full trace)")
    } else {
        format!("{run} (sampled)")
    };
    let mut curves = vec![adapt::window_curve(&this, &a.trace_windows)];
    if let Some(golden) = &bench.golden {
        curves.push(adapt::window_curve(
            "full trace (golden)",
            &golden.trace_windows,
        ));
    }
    if let (true, Some((base, old))) = (comparable, baseline) {
        curves.push(adapt::window_curve(
            &format!("baseline {base}"),
            &old.analysis.trace_windows,
        ));
    }
    let title = format!("{name}: trace-window histogram");
    let subtitle = format!(
        "{} · {} · mean over windows within samples",
        adapt::recording(a),
        adapt::volume(a)
    );
    charts.push(chart(
        "trace-windows.svg",
        &charts::windows::render(&title, &subtitle, &curves)?,
        &title,
        "windows",
    )?);

    // (b) Reuse distance.
    let mut series = vec![adapt::reuse_series(run, &a.reuse)];
    if let (true, Some((base, old))) = (comparable, baseline) {
        series.push(adapt::reuse_series(
            &format!("baseline {base}"),
            &old.analysis.reuse,
        ));
    }
    let title = format!("{name}: reuse distance (in-window)");
    let subtitle = format!(
        "{} · mean D = {} · max D = {} · {} cold accesses (no earlier access to the block in the sample)",
        match a.run.window {
            Some(w) => format!("within samples of {w} loads: L1 scale, farther reuse is not seen"),
            None => "whole run (full trace)".to_string(),
        },
        a.summary.d_mean.map_or("–".into(), charts::format_value),
        a.summary.d_max.map_or("–".into(), |d| d.to_string()),
        charts::format_count(a.reuse.cold as f64)
    );
    charts.push(chart(
        "reuse.svg",
        &charts::reuse::render(&title, &subtitle, &series, a.reuse.block)?,
        &title,
        "reuse",
    )?);

    // (g) Whole-run miss-ratio curve.
    if let Some((svg, title)) = mrc_chart(name, a, run, baseline.filter(|_| comparable))? {
        charts.push(chart("mrc.svg", &svg, &title, "mrc")?);
    }

    // (c), (d) From the trace.
    match &bench.trace {
        Some(trace) => match profile_trace(trace, &options.profile) {
            Ok(p) => {
                let title = format!("{name}: accesses over time");
                let time = if p.full {
                    "time (accesses in program order)".to_string()
                } else {
                    format!(
                        "time (sampled accesses in trace order; {} samples)",
                        p.samples
                    )
                };
                let subtitle = format!(
                    "{} accesses · {} touched address range{} · darker = more accesses",
                    charts::format_count(p.accesses as f64),
                    p.heatmap.axis.ranges.len(),
                    if p.heatmap.axis.ranges.len() == 1 {
                        ""
                    } else {
                        "s"
                    }
                );
                charts.push(chart(
                    "heatmap.svg",
                    &charts::heatmap::render(&title, &subtitle, &p.heatmap, &time)?,
                    &title,
                    "time",
                )?);
                let title = format!("{name}: accesses per address");
                let subtitle = if p.full {
                    "distance: accesses between consecutive accesses to the same address"
                        .to_string()
                } else {
                    "distance: accesses between consecutive accesses to the same address within a sample".to_string()
                };
                charts.push(chart(
                    "addresses.svg",
                    &charts::address::render(&title, &subtitle, &p.addresses)?,
                    &title,
                    "time",
                )?);
            }
            Err(e) => notes.push(format!(
                "no heatmap or per-address chart: {}",
                memgaze_error::one_line(&e)
            )),
        },
        None => notes.push(
            "no heatmap or per-address chart: the trace is not available (only the analysis)"
                .into(),
        ),
    }

    // (e) Hot functions and regions.
    if a.functions.iter().any(|f| f.a > 0) {
        let title = format!("{name}: hot functions");
        let base = if comparable {
            baseline.map(|(n, b)| (n, &b.analysis))
        } else {
            None
        };
        let bars = adapt::functions_chart(&title, a, base, options.top, run);
        charts.push(chart(
            "functions.svg",
            &charts::bars::render(&bars)?,
            &title,
            "functions",
        )?);
    }
    if !a.regions.is_empty() {
        let title = format!("{name}: hot regions");
        let bars = adapt::regions_chart(&title, a, options.top, run);
        charts.push(chart(
            "regions.svg",
            &charts::bars::render(&bars)?,
            &title,
            "regions",
        )?);
    }
    Ok(BenchPage {
        bench,
        slug: slug.to_string(),
        charts,
        verdict,
        notes,
        run_label: options.run_label.clone(),
    })
}

/// The whole-run miss-ratio curve of a bench (with the baseline's, when
/// compared) and its title; `None` when the analysis has no curve (a
/// sampled run without spatial sampling, an old analysis).
fn mrc_chart(
    name: &str,
    a: &memgaze_analysis::Analysis,
    run: &str,
    baseline: Option<(&str, &crate::gate::BaselineBench)>,
) -> Result<Option<(String, String)>> {
    if a.summary.whole_run.mrc.is_empty() {
        return Ok(None);
    }
    let curve = |label: String, analysis: &memgaze_analysis::Analysis| charts::mrc::MrcCurve {
        label,
        points: analysis
            .summary
            .whole_run
            .mrc
            .iter()
            .map(|p| (p.bytes, p.miss_ratio))
            .collect(),
    };
    let mut curves = vec![curve(run.to_string(), a)];
    if let Some((base, old)) =
        baseline.filter(|(_, old)| !old.analysis.summary.whole_run.mrc.is_empty())
    {
        curves.push(curve(format!("baseline {base}"), &old.analysis));
    }
    let marks: Vec<charts::mrc::CacheMark> = a
        .run
        .cache_sizes
        .as_ref()
        .map(|c| vec![("L1", c.l1), ("L2", c.l2), ("LLC", c.llc)])
        .unwrap_or_default();
    let s = &a.summary;
    let level =
        |l: &str, v: Option<f64>| v.map(|v| format!("MR_{l} = {}", charts::format_value(v)));
    let mut parts: Vec<String> = [
        ("L1", s.whole_run.mr_l1),
        ("L2", s.whole_run.mr_l2),
        ("LLC", s.whole_run.mr_llc),
    ]
    .into_iter()
    .filter_map(|(l, v)| level(l, v))
    .collect();
    parts.push(match (s.spatial_rate, s.tracked_accesses) {
        (Some(r), Some(n)) if r < 1.0 => format!(
            "estimated from {} accesses to spatially sampled blocks (R = {})",
            charts::format_count(n as f64),
            charts::format_value(r)
        ),
        _ => "exact (every access)".to_string(),
    });
    let title = format!("{name}: miss-ratio curve (whole run)");
    let svg = charts::mrc::render(&title, &parts.join(" · "), &curves, &marks)?;
    Ok(Some((svg, title)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_safe_and_unique() {
        let mut taken = HashSet::from(["index".to_string()]);
        assert_eq!(
            slug("str/irr (microbenches/micro)", &mut taken),
            "str-irr-microbenches-micro"
        );
        assert_eq!(slug("irr|str|irr", &mut taken), "irr-str-irr");
        assert_eq!(slug("irr str irr", &mut taken), "irr-str-irr-2");
        assert_eq!(slug("Index", &mut taken), "index-2");
        assert_eq!(slug("…", &mut taken), "bench");
    }

    #[test]
    fn svg_size_reads_the_root_element() {
        assert_eq!(
            svg_size(r#"<svg width="900" height="620" viewBox="0 0 900 620" xmlns="">"#),
            (900, 620)
        );
    }
}
