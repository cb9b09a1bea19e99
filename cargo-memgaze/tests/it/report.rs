//! `cargo memgaze report` and the report library on a results tree of
//! synthetic microbenchmarks: every chart kind present, parseable and
//! drawable; `index.html` self-contained with links that resolve;
//! baselines rendered side by side; bad input refused in one line.

use crate::support;

use memgaze::gate::{BenchKey, BenchRun, Limits, load_baseline, save_baseline};
use memgaze::report::{ReportOptions, report_results};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use support::results::{bench_dir, small};
use support::svg::{assert_text_containing, assert_texts, render_png, texts};
use support::synthetic::Kernel;

/// One results tree for all tests: irr-half (with a golden), str/irr and
/// chase, like `target/memgaze` after a bench run.
fn results() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = crate::support::process_scratch("report-results");
        let root = dir.join("memgaze");
        bench_dir(&root, &small(Kernel::IrrHalf, 1), true);
        bench_dir(&root, &small(Kernel::StrIrr, 1), false);
        bench_dir(&root, &small(Kernel::Chase, 1), false);
        dir
    })
}

fn root() -> PathBuf {
    results().join("memgaze")
}

/// Every `href="…"` and `src="…"` target of a page.
fn links(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for attr in ["href=\"", "src=\""] {
        for part in html.split(attr).skip(1) {
            out.push(part.split('"').next().unwrap().to_string());
        }
    }
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_results_tree_gives_every_chart_and_a_self_contained_page() {
    let out = tempfile::tempdir().unwrap();
    let written = report_results(&root(), &ReportOptions::new(out.path())).unwrap();
    assert_eq!(written.benches, 3);
    assert!(written.warnings.is_empty(), "{:?}", written.warnings);
    let html = read(&written.index);
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no external reference"
    );
    assert!(!html.contains("<script"), "no script");
    let targets = links(&html);
    for target in &targets {
        if let Some(anchor) = target.strip_prefix('#') {
            assert!(
                html.contains(&format!("id=\"{anchor}\"")),
                "anchor {target} exists"
            );
        } else {
            assert!(out.path().join(target).is_file(), "{target} exists");
        }
    }
    for bench in ["irr-half", "str/irr", "chase"] {
        assert!(
            html.contains(&format!(
                "title=\"{bench} (microbenches/micro)\">{bench}</a>"
            )),
            "{bench} in the navigation and the overview, its target in the hover"
        );
    }
    // Six charts per bench, each linked from the page.
    assert_eq!(written.charts.len(), 18);
    for chart in &written.charts {
        let file = chart
            .strip_prefix(out.path())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(targets.contains(&file), "{file} is linked");
        let svg = read(chart);
        assert!(
            !svg.contains("http://") || svg.contains("http://www.w3.org/2000/svg"),
            "{file}: only the SVG namespace"
        );
        assert!(!svg.contains("https://"), "{file}");
    }
    // Tables.
    assert!(
        html.contains(
            "<td class=\"name\"><code>microbenches::kernels::irr_half_kernel</code></td>"
        )
    );
    assert!(html.contains("Hot regions"));
}

/// Renders one bench's charts and checks what a reader must find in each.
#[test]
fn each_chart_kind_has_its_series_titles_and_axes_and_renders() {
    let out = tempfile::tempdir().unwrap();
    report_results(&root(), &ReportOptions::new(out.path())).unwrap();
    let dir = out.path().join("irr-half-microbenches-micro");
    let svg = |file: &str| read(&dir.join(file));

    let windows = svg("trace-windows.svg");
    assert_texts(
        &windows,
        &[
            "irr-half (microbenches/micro): trace-window histogram",
            "F",
            "F_str",
            "F_irr",
            "ΔF (new data per load)",
            "F_irr% (share of F)",
            "this run (sampled)",
            "full trace (golden)",
            "8",
            "512",
        ],
    );
    assert_text_containing(&windows, "window size (accesses");
    assert_text_containing(&windows, "footprint (distinct addresses, log)");
    assert_text_containing(&windows, "sampled: w = 1000, period = 20000");
    render_png(&windows, "a-trace-windows");

    let reuse = svg("reuse.svg");
    assert_texts(
        &reuse,
        &[
            "irr-half (microbenches/micro): reuse distance (in-window)",
            "1",
            "2–3",
            "4–7",
        ],
    );
    assert_text_containing(&reuse, "reuse distance D (distinct 64-byte blocks");
    assert_text_containing(&reuse, "share of accesses with a D");
    render_png(&reuse, "b-reuse");

    let heatmap = svg("heatmap.svg");
    assert_texts(
        &heatmap,
        &[
            "irr-half (microbenches/micro): accesses over time",
            "accesses per cell",
            "0x7f3a1c000000",
            "0x55632a400000",
        ],
    );
    assert_text_containing(&heatmap, "time (sampled accesses in trace order;");
    assert_text_containing(&heatmap, "address, growing upward (touched ranges");
    render_png(&heatmap, "c-heatmap");

    let addresses = svg("addresses.svg");
    assert_texts(
        &addresses,
        &[
            "irr-half (microbenches/micro): accesses per address",
            "0x7f3a1c000000",
        ],
    );
    assert_text_containing(&addresses, "accesses per address range");
    assert_text_containing(&addresses, "distance between accesses: mean ± std");
    render_png(&addresses, "d-addresses");

    let functions = svg("functions.svg");
    assert_texts(
        &functions,
        &[
            "A (accesses)",
            "ΔF (code windows)",
            "F_str% (code windows)",
            "microbenches::kernels::irr_half_kernel",
        ],
    );
    render_png(&functions, "e-functions");

    let regions = svg("regions.svg");
    assert_texts(
        &regions,
        &[
            "A (accesses)",
            "A per 64-byte block",
            "D (mean reuse distance)",
        ],
    );
    assert!(
        texts(&regions)
            .iter()
            .any(|t| t.starts_with("0x7f3a1c") && t.ends_with("KiB)")),
        "regions are labelled by address and size"
    );
    render_png(&regions, "e-regions");
}

#[test]
fn a_baseline_is_drawn_side_by_side_and_regressions_are_marked() {
    let out = tempfile::tempdir().unwrap();
    let results = tempfile::tempdir().unwrap();
    let root = results.path().join("memgaze");
    // Baseline: str/irr as an array scan; this run: the same bench name
    // now walks a list.
    let (_, before) = bench_dir(&root, &small(Kernel::Str1, 1), false);
    let key = BenchKey::new("microbenches", "micro", "str1");
    save_baseline(
        &root,
        "main",
        &[BenchRun {
            key: key.clone(),
            analysis: before,
            binary: None,
            profile: None,
        }],
    )
    .unwrap();
    let scan = root.join("microbenches/micro/str1");
    std::fs::remove_dir_all(&scan).unwrap();
    let (dir, _) = bench_dir(&root, &small(Kernel::Chase, 2), false);
    std::fs::rename(&dir, &scan).unwrap();
    std::fs::write(
        scan.join("bench.json"),
        serde_json::to_string(&key).unwrap(),
    )
    .unwrap();

    let mut options = ReportOptions::new(out.path());
    options.baseline = Some(load_baseline(&root, "main").unwrap());
    options.limits = Limits::defaults();
    let written = report_results(&root, &options).unwrap();
    let html = read(&written.index);
    assert!(html.contains("compared with baseline <code>main</code>"));
    assert!(
        html.contains(
            "<p>regression: microbenches/micro/str1: F_irr_frac 0 → 1 (+1 from 0; limit +0.1)</p>"
        ),
        "{html}"
    );
    assert!(html.contains("<tr class=\"bad\"><td class=\"name\"><code>F_irr_frac</code>"));

    let overview = read(&out.path().join("baseline.svg"));
    assert_texts(
        &overview,
        &[
            "Baseline main vs this run",
            "baseline main",
            "this run",
            "ΔF (code windows)",
            "F_irr% (code windows)",
            "D mean",
            "str1 (microbenches/micro)",
        ],
    );
    render_png(&overview, "f-baseline");
    let windows = read(&out.path().join("str1-microbenches-micro/trace-windows.svg"));
    assert_texts(&windows, &["this run (sampled)", "baseline main"]);
    render_png(&windows, "f-trace-windows-baseline");
    let reuse = read(&out.path().join("str1-microbenches-micro/reuse.svg"));
    assert_texts(&reuse, &["this run", "baseline main"]);
}

#[test]
fn an_analysis_alone_is_reported_without_the_per_record_charts() {
    let out = tempfile::tempdir().unwrap();
    let analysis = root().join("microbenches/micro/chase/analysis.json");
    let copy = out.path().join("chase.json");
    std::fs::copy(&analysis, &copy).unwrap();
    let written = report_results(&copy, &ReportOptions::new(out.path().join("report"))).unwrap();
    assert_eq!(written.benches, 1);
    assert_eq!(
        written.warnings,
        ["chase: no heatmap or per-address chart: the trace is not available (only the analysis)"]
    );
    let html = read(&written.index);
    assert!(html.contains("the trace is not available"));
}

/// Names come from files, manifests and users: whatever they hold is text
/// on the page, never markup.
#[test]
fn markup_in_a_bench_name_is_escaped() {
    let out = tempfile::tempdir().unwrap();
    let analysis = root().join("microbenches/micro/chase/analysis.json");
    // No `/`: the name is a file name here.
    let name = r#"<script>alert('x') & "q""#;
    let copy = out.path().join(format!("{name}.json"));
    std::fs::copy(&analysis, &copy).unwrap();
    let written = report_results(&copy, &ReportOptions::new(out.path().join("report"))).unwrap();
    let html = read(&written.index);
    assert!(!html.contains("<script"), "{html}");
    let escaped = "&lt;script&gt;alert('x') &amp; &quot;q&quot;";
    // In the navigation, the overview row, the section heading and the
    // source path.
    assert!(html.matches(escaped).count() >= 4, "{html}");
    assert!(html.contains(&format!("<h2>{escaped}</h2>")), "{html}");
}

fn bin() -> Command {
    crate::support::memgaze_command()
}

#[test]
fn the_command_writes_the_report_and_refuses_bad_input_in_one_line() {
    let out = tempfile::tempdir().unwrap();
    let report = out.path().join("r");
    let output = bin()
        .args(["memgaze", "report"])
        .arg(root())
        .arg("-o")
        .arg(&report)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        report.join("index.html").display().to_string()
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("wrote 18 charts for 3 benches"));

    let junk = out.path().join("junk.json");
    std::fs::write(&junk, "{\"hello\": 1}").unwrap();
    let output = bin().args(["report"]).arg(&junk).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("JSON without a `schema` field: not a memgaze analysis"),
        "{stderr}"
    );

    let empty = out.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let output = bin().args(["report"]).arg(&empty).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no bench results found"));

    let output = bin()
        .args(["report"])
        .arg(root())
        .args(["--baseline", "nope", "-o"])
        .arg(&report)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("baseline `nope` not found"));
}

/// A results root outlives upgrades: a bench directory whose trace this
/// version cannot read (an older format, a corrupt file) is skipped with a
/// warning naming it, and the rest is still reported; a tree with nothing
/// readable is refused in one line that says why.
#[test]
fn an_unreadable_bench_directory_is_skipped_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("memgaze");
    bench_dir(&root, &small(Kernel::Chase, 1), false);
    let stale = root.join("old").join("lookup").join("stale");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("trace.mgz"), b"MGZTRACE but not really").unwrap();

    let written = report_results(&root, &ReportOptions::new(tmp.path().join("r"))).unwrap();
    assert_eq!(written.benches, 1);
    assert_eq!(written.warnings.len(), 1, "{:?}", written.warnings);
    let warning = &written.warnings[0];
    assert!(
        warning.starts_with(&format!("skipped {}: ", stale.display()))
            && warning.contains("trace.mgz"),
        "{warning}"
    );

    let output = bin()
        .args(["report"])
        .arg(&root)
        .arg("-o")
        .arg(tmp.path().join("r2"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("warning: skipped ") && l.contains("trace.mgz")),
        "{stderr}"
    );
    assert!(stderr.contains("for 1 bench"), "{stderr}");

    let only_stale = tmp.path().join("only-stale");
    std::fs::create_dir_all(only_stale.join("b")).unwrap();
    std::fs::copy(stale.join("trace.mgz"), only_stale.join("b/trace.mgz")).unwrap();
    let output = bin().args(["report"]).arg(&only_stale).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("no readable bench results (1 unreadable; first: skipped "),
        "{stderr}"
    );
}

/// `run` leaves mirrors of programs' directories in the instrumented-copy
/// cache under the results root: links to directories such as `/usr/lib`,
/// whose trees can link back to themselves (llvm's `build/Release -> ..`).
/// The report's walk follows no link and skips the cache, so it ends and
/// finds the one bench.
#[test]
fn links_and_the_instrumented_cache_under_the_results_are_not_walked() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("memgaze");
    bench_dir(&root, &small(Kernel::Chase, 1), false);
    // A cycle of links: each level links back to its parent.
    let loop_dir = tmp.path().join("elsewhere").join("build");
    std::fs::create_dir_all(&loop_dir).unwrap();
    std::os::unix::fs::symlink("..", loop_dir.join("Release")).unwrap();
    std::os::unix::fs::symlink("..", loop_dir.join("Debug")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("elsewhere"), root.join("linked")).unwrap();
    let mirror = root.join("instrumented").join("0123abcd").join("mirror");
    std::fs::create_dir_all(&mirror).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("elsewhere"), mirror.join("lib")).unwrap();
    // A bench copied into the cache would be found if the cache were walked.
    bench_dir(&mirror, &small(Kernel::Chase, 1), false);

    let written = report_results(&root, &ReportOptions::new(tmp.path().join("r"))).unwrap();
    assert_eq!(written.benches, 1, "{:?}", written.warnings);
}
