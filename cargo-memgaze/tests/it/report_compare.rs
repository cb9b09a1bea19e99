//! Comparing without running: `report --baseline` and `compare OLD NEW`
//! on saved results, their exit status 3 on a regression, the Markdown
//! summary for pull requests (parsed with a Markdown parser), the page's
//! order (regressions first) and a report directory that holds only the
//! current report's files.
//!
//! The scenario is the README's walkthrough: bench `sum` of package `ring`,
//! target `walk`, sums a Vec (baseline `main`), then walks a linked list.

use crate::support;

use memgaze::gate::{BenchKey, BenchRun, save_baseline};
use memgaze::report::{ANALYSIS_FILE, BENCH_FILE, TRACE_FILE};
use memgaze_analysis::Analysis;
use pulldown_cmark::{Event, Parser, Tag, TagEnd};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::results::{analyze, small};
use support::synthetic::{Kernel, write_trace};

fn bin() -> Command {
    crate::support::memgaze_command()
}

fn key() -> BenchKey {
    BenchKey::new("ring", "walk", "sum")
}

/// Writes `ring/walk/sum` under `root` as `bench` leaves it: a trace of
/// `kernel`, its analysis and `bench.json`.
fn walk_dir(root: &Path, kernel: Kernel, seed: u64) -> Analysis {
    let dir = root.join("ring/walk/sum");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(BENCH_FILE), serde_json::to_string(&key()).unwrap()).unwrap();
    let trace = dir.join(TRACE_FILE);
    write_trace(&trace, &small(kernel, seed));
    let analysis = analyze(&trace);
    std::fs::write(
        dir.join(ANALYSIS_FILE),
        serde_json::to_vec(&analysis).unwrap(),
    )
    .unwrap();
    analysis
}

fn save(root: &Path, name: &str, analysis: Analysis) {
    save_baseline(
        root,
        name,
        &[BenchRun {
            key: key(),
            analysis,
            binary: None,
            profile: None,
        }],
    )
    .unwrap();
}

/// A results root whose baseline `main` sums a Vec and whose current run
/// walks a linked list; baseline `list` holds the linked-list run.
fn walkthrough() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("memgaze");
    let vec = walk_dir(&root, Kernel::Str1, 1);
    save(&root, "main", vec);
    let list = walk_dir(&root, Kernel::Chase, 2);
    save(&root, "list", list);
    (tmp, root)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The rows of the first table of a Markdown document, as cell texts
/// (the header row first); `None` when the parser finds no table.
fn first_table(markdown: &str) -> Option<Vec<Vec<String>>> {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut in_table = false;
    let mut cell: Option<String> = None;
    for event in Parser::new_ext(markdown, pulldown_cmark::Options::ENABLE_TABLES) {
        match event {
            Event::Start(Tag::Table(_)) => in_table = true,
            Event::End(TagEnd::Table) => return Some(rows),
            Event::Start(Tag::TableHead | Tag::TableRow) if in_table => rows.push(Vec::new()),
            Event::Start(Tag::TableCell) if in_table => cell = Some(String::new()),
            Event::End(TagEnd::TableCell) if in_table => {
                rows.last_mut().unwrap().push(cell.take().unwrap());
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some(c) = cell.as_mut() {
                    c.push_str(&t);
                }
            }
            _ => {}
        }
    }
    None
}

/// The summary names the regressions in its first lines and renders as a
/// table whose first rows are the regressions, each with an arrow, old
/// and new values and the limit it broke.
fn check_summary(markdown: &str, current: &str) {
    let mut lines = markdown.lines();
    let first = lines.next().unwrap();
    assert!(
        first.starts_with("### ❌ memgaze: ") && first.contains(" regressions in 1 of 1 bench "),
        "{markdown}"
    );
    assert!(first.contains("against baseline `main`"), "{markdown}");
    let named = markdown.lines().take(3).collect::<Vec<_>>().join("\n");
    assert!(
        named.contains("**Regressed:** ring/walk/sum (") && named.contains("F_irr_frac"),
        "the regressed bench and metrics in the first lines: {markdown}"
    );
    let table = first_table(markdown).expect("a Markdown table");
    assert_eq!(
        table[0],
        [
            "",
            "bench",
            "metric",
            "baseline main",
            current,
            "change",
            "limit"
        ],
        "{markdown}"
    );
    let body = &table[1..];
    let regressions = body.iter().take_while(|r| r[0] == "❌ regression").count();
    assert!(regressions >= 2, "{markdown}");
    assert!(
        body[regressions..].iter().all(|r| r[0].is_empty()),
        "regressions first: {markdown}"
    );
    let f_irr = body
        .iter()
        .find(|r| r[2] == "F_irr_frac")
        .expect("F_irr_frac listed");
    assert_eq!(f_irr[0], "❌ regression");
    assert_eq!(f_irr[1], "ring/walk/sum");
    // A fraction is written with three decimals on both sides.
    assert_eq!((f_irr[3].as_str(), f_irr[4].as_str()), ("0.000", "1.000"));
    assert!(f_irr[5].starts_with("↑ +1 from 0"), "{markdown}");
    assert_eq!(f_irr[6], "+0.1");
    assert!(markdown.contains("Full report: `"), "{markdown}");
}

#[test]
fn report_against_a_saved_baseline_exits_3_with_a_summary() {
    let (tmp, root) = walkthrough();
    let out = tmp.path().join("r");
    let summary = tmp.path().join("summary.md");
    let output = bin()
        .args(["memgaze", "report"])
        .arg(&root)
        .args(["--baseline", "main", "-o"])
        .arg(&out)
        .arg("--summary-md")
        .arg(&summary)
        .output()
        .unwrap();
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(3), "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("regression: ring/walk/sum: F_irr_frac 0 → 1")),
        "{err}"
    );
    assert!(
        err.contains("regression(s) against baseline `main`"),
        "{err}"
    );
    let markdown = std::fs::read_to_string(&summary).unwrap();
    check_summary(&markdown, "this run");
    assert!(
        markdown.contains(&out.join("index.html").display().to_string()),
        "{markdown}"
    );

    // The page leads with the regression and overlays the baseline.
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    let overview = &html[html.find("id=\"overview\"").unwrap()..];
    assert!(
        overview.find("class=\"regressions\"").unwrap() < overview.find("<table").unwrap(),
        "regressions before the table"
    );
    assert!(html.contains("id=\"glossary\""));
    assert!(html.contains("<th title=\"Observed accesses"));
    let windows = std::fs::read_to_string(out.join("sum-ring-walk/trace-windows.svg")).unwrap();
    assert!(windows.contains("baseline main"), "baseline overlaid");

    // Against itself: nothing regressed, exit 0.
    let output = bin()
        .args(["report"])
        .arg(&root)
        .args(["--baseline", "list", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn two_saved_baselines_are_compared_without_running_anything() {
    let (tmp, root) = walkthrough();
    // No trace or analysis outside the baselines: nothing could be run or read.
    std::fs::remove_dir_all(root.join("ring")).unwrap();
    let summary = tmp.path().join("summary.md");
    let output = bin()
        .args(["memgaze", "compare", "main", "list", "--results"])
        .arg(&root)
        .arg("--summary-md")
        .arg(&summary)
        .output()
        .unwrap();
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(3), "{err}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("regression: ring/walk/sum: F_irr_frac 0 → 1")),
        "{stdout}"
    );
    assert!(
        err.contains("regression(s) against baseline `main`"),
        "{err}"
    );
    let index = root.join("compare/main..list/index.html");
    assert!(index.is_file(), "{err}");
    let html = std::fs::read_to_string(&index).unwrap();
    assert!(html.contains("compared with baseline <code>main</code>"));
    check_summary(&std::fs::read_to_string(&summary).unwrap(), "baseline list");

    // The other way round: the Vec is better than the list; F_str_frac
    // rose and F_irr_frac fell, nothing regressed.
    let output = bin()
        .args(["compare", "list", "main", "--no-report", "--results"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    // Bad input: one line, the contract's codes.
    let output = bin()
        .args(["compare", "main", "nope", "--results"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("baseline `nope` not found"), "{err}");
    let output = bin()
        .args(["compare", "main", "main", "--results"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
}

#[test]
fn a_report_directory_holds_only_the_current_reports_files() {
    let (tmp, root) = walkthrough();
    let out = tmp.path().join("r");
    let run = |baseline: bool| {
        let mut cmd = bin();
        cmd.args(["report"]).arg(&root).arg("-o").arg(&out);
        if baseline {
            cmd.args(["--baseline", "main"]);
        }
        cmd.output().unwrap()
    };
    assert_eq!(run(true).status.code(), Some(3));
    assert!(out.join("baseline.svg").is_file());
    std::fs::write(out.join("mine.txt"), "kept").unwrap();
    // A bench that is gone from the results.
    let stale = out.join("old-bench");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("reuse.svg"), "<svg/>").unwrap();
    let manifest = out.join(memgaze::report::clean::MANIFEST_FILE);
    let mut listed = std::fs::read_to_string(&manifest).unwrap();
    listed.push_str("old-bench/reuse.svg\n");
    std::fs::write(&manifest, listed).unwrap();

    assert_eq!(run(false).status.code(), Some(0));
    assert!(
        !out.join("baseline.svg").exists(),
        "stale overview chart removed"
    );
    assert!(!stale.exists(), "stale bench directory removed");
    assert!(
        out.join("mine.txt").is_file(),
        "a file the report did not write stays"
    );
    assert!(out.join("sum-ring-walk/reuse.svg").is_file());
}

/// A bench that recorded no access (only Constant loads) has no ratio to
/// show: its overview row says `–`, never `0.0%`, and its section says why.
#[test]
fn a_bench_without_accesses_shows_dashes() {
    use memgaze_trace::{
        Backend, LoadClass, LoadEntry, Sampling, TraceHeader, TraceTotals, TraceWriter,
    };
    let tmp = tempfile::tempdir().unwrap();
    let header = TraceHeader {
        backend: Backend::Soft,
        sampling: Sampling::full(),
        binary: None,
        command: vec![],
        functions: vec![],
        loads: vec![LoadEntry {
            ip: 0x1000,
            class: LoadClass::Constant,
            implied: 0,
            function: None,
            line: None,
            proxy: None,
        }],
        labels: vec![],
        spatial: None,
    };
    let path = tmp.path().join("constant.mgz");
    let mut w = TraceWriter::new(std::fs::File::create(&path).unwrap(), &header).unwrap();
    w.begin_sample(0).unwrap();
    for _ in 0..10 {
        w.push(0, 0x10).unwrap();
    }
    let totals = TraceTotals::clean(w.records(), w.records(), w.samples());
    w.finish(&totals).unwrap();
    let analysis = analyze(&path);
    assert_eq!(analysis.summary.a, 0);
    let bench = memgaze::report::ReportBench::new("constant-only", analysis);
    let written = memgaze::report::write_report(
        &[bench],
        "test",
        &memgaze::report::ReportOptions::new(tmp.path().join("r")),
    )
    .unwrap();
    let html = std::fs::read_to_string(&written.index).unwrap();
    let row = html
        .split("<td class=\"bench\">")
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .unwrap();
    assert!(!row.contains("0.0%") && !row.contains(">0.000<"), "{row}");
    assert!(row.matches(">–<").count() >= 3, "{row}");
    assert!(
        html.contains("No access of this bench was recorded"),
        "{html}"
    );
}
