//! The self-contained `index.html`: inline CSS, no script, no external
//! resource; charts are relative links to the SVG files beside it, so the
//! directory works offline and as a CI artifact.
//!
//! The page is written with maud's `html!`: every value spliced in is
//! escaped unless it is wrapped in `PreEscaped` (only the constant style
//! sheet is), so a bench name, a path or a baseline note cannot inject
//! markup. The `"\n"` literals keep one element or table row per line, as
//! the page had before, so the source stays readable and diffs stay small.

use super::charts::{format_address, format_bytes, format_window};
use super::{BenchPage, ChartFile};
use crate::gate::BenchVerdict;
use maud::{DOCTYPE, Markup, PreEscaped, html};
use memgaze_analysis::{Analysis, FunctionMetrics, WindowRow};

const STYLE: &str = r#"
:root { --ink: #222; --muted: #666; --line: #ddd; --accent: #0072b2; --bad: #b3261e; --bg-bad: #fdecea; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); display: flex; }
nav { position: sticky; top: 0; height: 100vh; overflow-y: auto; width: 230px; flex: none; padding: 16px; border-right: 1px solid var(--line); background: #fafafa; }
nav a { display: block; padding: 2px 0; color: var(--accent); text-decoration: none; overflow-wrap: anywhere; }
nav a.bad::after { content: " ✗"; color: var(--bad); }
nav h2 { font-size: 13px; text-transform: uppercase; letter-spacing: .05em; color: var(--muted); margin: 12px 0 4px; }
main { padding: 16px 32px 64px; min-width: 0; flex: 1; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 40px 0 4px; padding-top: 8px; border-top: 2px solid var(--line); }
h3 { font-size: 15px; margin: 24px 0 6px; }
.meta, .note { color: var(--muted); margin: 2px 0; }
table { border-collapse: collapse; margin: 6px 0 12px; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; font-weight: 600; }
td.name, th.name { text-align: left; white-space: normal; max-width: 460px; overflow-wrap: anywhere; }
tr.bad td { background: var(--bg-bad); }
.regressions { border-left: 4px solid var(--bad); background: var(--bg-bad); padding: 6px 12px; margin: 8px 0; }
.regressions p { margin: 2px 0; font-family: ui-monospace, monospace; }
figure { margin: 8px 0 16px; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { color: var(--muted); font-size: 13px; }
code { font-family: ui-monospace, monospace; font-size: 13px; }
"#;

/// `1,234,567`.
fn int(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn opt(value: Option<f64>, f: impl Fn(f64) -> String) -> String {
    value.map_or_else(|| "–".to_string(), f)
}

fn dec(value: f64) -> String {
    super::charts::format_value(value)
}

fn pct(value: f64) -> String {
    format!("{:.1}%", value * 100.0)
}

/// Whether the bench has regressions against the baseline (marked in the
/// navigation and the overview).
fn regressed(page: &BenchPage) -> bool {
    page.verdict
        .as_ref()
        .is_some_and(|v| v.as_ref().is_ok_and(|v| !v.regressions.is_empty()))
}

/// `class="bad"` where `bad`, no attribute otherwise.
fn bad_class(bad: bool) -> Option<&'static str> {
    bad.then_some("bad")
}

fn figure(chart: &ChartFile) -> Markup {
    html! {
        figure {
            a href=(chart.file) {
                img src=(chart.file) alt=(chart.title) width=(chart.size.0)
                    height=(chart.size.1) loading="lazy";
            }
            figcaption { (chart.title) }
        }
        "\n"
    }
}

fn window_table(rows: &[WindowRow]) -> Markup {
    html! {
        table {
            tr {
                th { "window (accesses)" } th { "windows" } th { "F" } th { "ΔF" }
                th { "F_str" } th { "F_irr" } th { "F_str%" } th { "F_irr%" }
            }
            "\n"
            @for r in rows.iter().filter(|r| r.windows > 0) {
                tr {
                    td { (format_window(r.k)) }
                    td { (int(r.windows)) }
                    td { (dec(r.f)) }
                    td { (dec(r.d_f)) }
                    td { (dec(r.f_str)) }
                    td { (dec(r.f_irr)) }
                    td { (pct(r.f_str_frac)) }
                    td { (pct(r.f_irr_frac)) }
                }
                "\n"
            }
        }
        "\n"
    }
}

fn functions_table(analysis: &Analysis) -> Markup {
    let total = analysis.summary.a.max(1) as f64;
    let shown = analysis
        .functions
        .iter()
        .filter(|f| f.a > 0 || f.a_const > 0);
    html! {
        table {
            tr {
                th.name { "function" } th { "A" } th { "A%" } th { "Â" } th { "A_const%" }
                th { "ΔF" } th { "F_str%" } th { "F_irr%" } th { "code windows" }
                th { "D mean" } th.name { "hottest loads" }
            }
            "\n"
            @for f in shown {
                tr {
                    td.name { code { (f.name) } }
                    td { (int(f.a)) }
                    td { (pct(f.a as f64 / total)) }
                    td { (opt(f.a_hat, super::charts::format_count)) }
                    td { (opt(f.a_const_frac, pct)) }
                    td { (opt(f.d_f, dec)) }
                    td { (opt(f.f_str_frac, pct)) }
                    td { (opt(f.f_irr_frac, pct)) }
                    td { (int(f.code_windows)) }
                    td { (opt(f.d_mean, dec)) }
                    td.name { (hot_lines(f)) }
                }
                "\n"
            }
        }
        "\n"
    }
}

/// The three hottest loads of a function, one per line.
fn hot_lines(f: &FunctionMetrics) -> Markup {
    html! {
        @for (i, l) in f.hot_loads.iter().take(3).enumerate() {
            @if i > 0 { br; }
            code { (l.line.clone().unwrap_or_else(|| format_address(l.ip))) }
            " (" (int(l.count)) ")"
        }
    }
}

fn regions_table(analysis: &Analysis) -> Markup {
    html! {
        table {
            tr {
                th.name { "region" } th { "size" } th { "A" } th { "A%" } th { "blocks" }
                th { "A/block" } th { "D mean" } th.name { "accessed by" }
            }
            "\n"
            @for r in &analysis.regions {
                tr {
                    td.name { code { (format_address(r.start)) "–" (format_address(r.end)) } }
                    td { (format_bytes(r.end - r.start)) }
                    td { (int(r.a)) }
                    td { (pct(r.a_frac)) }
                    td { (int(r.blocks)) }
                    td { (dec(r.a_per_block)) }
                    td { (opt(r.d_mean, dec)) }
                    td.name {
                        @for (i, f) in r.functions.iter().take(3).enumerate() {
                            @if i > 0 { br; }
                            code { (f.name) } " (" (int(f.a)) ")"
                            @if !f.lines.is_empty() {
                                " at " (f.lines.iter().take(2).cloned().collect::<Vec<_>>().join(", "))
                            }
                        }
                    }
                }
                "\n"
            }
        }
        "\n"
    }
}

fn verdict_block(baseline: &str, verdict: &Result<BenchVerdict, String>) -> Markup {
    let verdict = match verdict {
        Ok(v) => v,
        Err(message) => {
            return html! {
                p.note { "Not compared with baseline " code { (baseline) } ": " (message) }
                "\n"
            };
        }
    };
    if !verdict.has_baseline {
        return html! {
            p.note { "Not in baseline " code { (baseline) } "." }
            "\n"
        };
    }
    html! {
        @if !verdict.regressions.is_empty() {
            div.regressions {
                "\n"
                @for r in &verdict.regressions {
                    p { "regression: " (r.human()) }
                    "\n"
                }
            }
            "\n"
        }
        table {
            tr {
                th.name { "metric" } th { "baseline " (baseline) } th { "this run" }
                th { "change" } th { "limit" }
            }
            "\n"
            @for m in &verdict.metrics {
                tr class=[bad_class(m.regressed)] {
                    td.name { code { (m.metric) } }
                    td { (opt(m.old, dec)) }
                    td { (opt(m.new, dec)) }
                    td {
                        @match (m.old, m.new) {
                            (Some(old), Some(new)) => (crate::gate::Change::between(old, new)),
                            _ => "–",
                        }
                    }
                    td {
                        @match m.limit {
                            Some(limit) => (limit),
                            None => "–",
                        }
                    }
                }
                "\n"
            }
        }
        "\n"
        @if let Some(k) = verdict.window_k {
            p.note {
                "dF, F_str_frac, F_irr_frac: means over windows of " (format_window(k))
                " accesses."
            }
            "\n"
        }
        @for note in &verdict.notes {
            p.note { (note) }
            "\n"
        }
    }
}

/// Renders the whole page.
pub fn index(
    title: &str,
    source: &str,
    pages: &[BenchPage],
    overview_charts: &[ChartFile],
    baseline: Option<&str>,
) -> String {
    let page = html! {
        (DOCTYPE) "\n"
        html lang="en" {
            "\n"
            head {
                "\n"
                meta charset="utf-8"; "\n"
                meta name="viewport" content="width=device-width, initial-scale=1"; "\n"
                title { (title) } "\n"
                style { (PreEscaped(STYLE)) } "\n"
            }
            "\n"
            body {
                "\n"
                (navigation(pages))
                main {
                    "\n"
                    h1 { (title) } "\n"
                    p.meta {
                        (pages.len()) " bench" @if pages.len() != 1 { "es" }
                        " from " code { (source) }
                        @if let Some(b) = baseline {
                            " · compared with baseline " code { (b) }
                        }
                    }
                    "\n"
                    (overview(pages, overview_charts))
                    @for page in pages {
                        (bench_section(page, baseline))
                    }
                }
                "\n"
            }
            "\n"
        }
        "\n"
    };
    page.into_string()
}

/// The side bar: the overview and one link per bench.
fn navigation(pages: &[BenchPage]) -> Markup {
    html! {
        nav {
            "\n"
            a href="#overview" { b { "Overview" } } "\n"
            h2 { "Benches" } "\n"
            @for page in pages {
                a href={ "#" (page.slug) } class=[bad_class(regressed(page))] {
                    (page.bench.name)
                }
                "\n"
            }
        }
        "\n"
    }
}

/// The overview section: one row of whole-run values per bench, then the
/// charts that compare benches.
fn overview(pages: &[BenchPage], charts: &[ChartFile]) -> Markup {
    html! {
        section id="overview" {
            "\n"
            h2 { "Overview" } "\n"
            p.note {
                "Whole-run values over the recorded samples. ΔF@W" sub { "c" } ", F_str%@W"
                sub { "c" } ": means over code windows (comparable between sampled and full \
                traces); whole-run F of a sampled trace is what the samples saw."
            }
            "\n"
            table {
                tr {
                    th.name { "bench" } th { "recording" } th { "samples" } th { "A" }
                    th { "Â" } th { "F" } th { "ΔF" } th { "F_str%" } th { "F_irr%" }
                    th { "ΔF@W" sub { "c" } } th { "F_str%@W" sub { "c" } } th { "D mean" }
                    th { "D max" }
                }
                "\n"
                @for page in pages {
                    (overview_row(page))
                }
            }
            "\n"
            @for chart in charts {
                (figure(chart))
            }
        }
        "\n"
    }
}

fn overview_row(page: &BenchPage) -> Markup {
    let a = &page.bench.analysis;
    let s = &a.summary;
    // The largest trace window that fits in a code window: its means are
    // comparable between sampled and full traces.
    let row = a
        .trace_windows
        .iter()
        .filter(|r| r.k <= a.run.code_window_k && r.windows > 0)
        .max_by_key(|r| r.k);
    html! {
        tr class=[bad_class(regressed(page))] {
            td.name { a href={ "#" (page.slug) } { (page.bench.name) } }
            td { (super::adapt::recording(a)) }
            td { (int(s.samples)) }
            td { (int(s.a)) }
            td { (opt(s.a_hat, super::charts::format_count)) }
            td { (int(s.f)) }
            td { (opt(s.d_f, dec)) }
            td { (pct(s.f_str_frac)) }
            td { (pct(s.f_irr_frac)) }
            td { (opt(row.map(|r| r.d_f), dec)) }
            td { (opt(row.map(|r| r.f_str_frac), pct)) }
            td { (opt(s.d_mean, dec)) }
            td { (s.d_max.map_or("–".into(), int)) }
        }
        "\n"
    }
}

/// One bench's section: what was recorded, the baseline comparison, then
/// charts and tables by topic, then what the data does not cover.
fn bench_section(page: &BenchPage, baseline: Option<&str>) -> Markup {
    let a = &page.bench.analysis;
    let s = &a.summary;
    html! {
        section id=(page.slug) {
            "\n"
            h2 { (page.bench.name) } "\n"
            p.meta {
                (super::adapt::recording(a)) " · " (super::adapt::volume(a)) " · ρ = "
                (opt(s.rho, dec)) " · κ = " (opt(s.kappa, dec)) " · " (int(s.records))
                " records"
            }
            "\n"
            @if !a.run.command.is_empty() || a.run.binary.is_some() {
                p.meta {
                    @if let Some(binary) = &a.run.binary {
                        "binary " code { (binary) } " · command "
                    }
                    code { (a.run.command.join(" ")) }
                }
                "\n"
            }
            @if let (Some(name), Some(verdict)) = (baseline, &page.verdict) {
                h3 { "Against the baseline" } "\n"
                (verdict_block(name, verdict))
            }
            @for chart in page.charts.iter().filter(|c| c.section == "windows") {
                h3 { "Trace windows" } "\n"
                (figure(chart))
                (window_table(&a.trace_windows))
            }
            (topics(page))
            (coverage(page))
        }
        "\n"
    }
}

/// The topic subsections of a bench, each with its charts and, for
/// functions and regions, a table (shown even without a chart).
fn topics(page: &BenchPage) -> Markup {
    let a = &page.bench.analysis;
    let sections = [
        ("reuse", "Reuse distance"),
        ("time", "Accesses over time and per address"),
        ("functions", "Hot functions"),
        ("regions", "Hot regions"),
    ];
    html! {
        @for (section, heading) in sections {
            @let charts: Vec<&ChartFile> =
                page.charts.iter().filter(|c| c.section == section).collect();
            @if !charts.is_empty() || matches!(section, "functions" | "regions") {
                h3 { (heading) } "\n"
                @for chart in charts {
                    (figure(chart))
                }
                @if section == "reuse" {
                    p.note {
                        (int(a.reuse.cold)) " accesses had no earlier access to their "
                        (a.reuse.block) "-byte block in their sample (cold); "
                        (int(a.reuse.captures)) " blocks were reused within a sample \
                        (captures), " (int(a.reuse.survivals)) " were not (survivals)."
                    }
                    "\n"
                }
                @if section == "functions" {
                    (functions_table(a))
                }
                @if section == "regions" {
                    @if a.regions.is_empty() {
                        p.note { "No hot region." } "\n"
                    } @else {
                        (regions_table(a))
                    }
                }
            }
        }
    }
}

/// What the data leaves out: lost records, an unfinished run, records
/// outside every function, and the notes of the analysis and the report.
fn coverage(page: &BenchPage) -> Markup {
    let c = &page.bench.analysis.coverage;
    let mut notes: Vec<String> = c.notes.clone();
    notes.extend(page.notes.iter().cloned());
    if c.dropped.records > 0 || c.dropped.samples > 0 {
        notes.push(format!(
            "the collector lost {} records and {} samples",
            int(c.dropped.records),
            int(c.dropped.samples)
        ));
    }
    if !c.complete {
        notes.push("the trace is incomplete: the program did not finish cleanly".into());
    }
    if c.outside_functions > 0 {
        notes.push(format!(
            "{} records lie outside every known function",
            int(c.outside_functions)
        ));
    }
    html! {
        @if !notes.is_empty() {
            h3 { "Coverage" } "\n"
            @for note in &notes {
                p.note { (note) } "\n"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_digits() {
        assert_eq!(int(0), "0");
        assert_eq!(int(1234567), "1,234,567");
        assert_eq!(int(100), "100");
    }
}
