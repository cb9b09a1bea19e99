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
use super::{BenchPage, ChartFile, glance};
use crate::gate::BenchVerdict;
use maud::{DOCTYPE, Markup, PreEscaped, html};
use memgaze_analysis::{Analysis, FunctionMetrics, LineLocality, ObjectLoadCoverage, WindowRow};

const STYLE: &str = r#"
:root { --ink: #222; --muted: #666; --line: #ddd; --accent: #0072b2; --bad: #b3261e; --bg-bad: #fdecea; --bar: #d5e6f3; --bar-bad: #f4c7c3; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); display: flex; }
nav { position: sticky; top: 0; height: 100vh; overflow-y: auto; width: 190px; flex: none; padding: 16px 10px; border-right: 1px solid var(--line); background: #fafafa; }
nav a { display: block; padding: 2px 0; color: var(--accent); text-decoration: none; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
nav a.bad { color: var(--bad); font-weight: 600; }
nav .target { display: block; color: var(--muted); font-size: 11px; line-height: 1.1; margin: -2px 0 3px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
nav a.bad::before { content: "✗ "; }
nav h2 { font-size: 13px; text-transform: uppercase; letter-spacing: .05em; color: var(--muted); margin: 12px 0 4px; padding: 0; border: 0; }
main { padding: 16px 24px 64px; min-width: 0; flex: 1; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 40px 0 4px; padding-top: 8px; border-top: 2px solid var(--line); }
h3 { font-size: 15px; margin: 24px 0 6px; }
.meta, .note { color: var(--muted); margin: 2px 0; }
.lead { font-size: 15px; margin: 6px 0 8px; max-width: 70em; }
.scroll { overflow-x: auto; max-width: 100%; margin: 6px 0 12px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
caption { caption-side: top; text-align: left; color: var(--muted); font-size: 13px; padding: 2px 0 6px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 7px; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; font-weight: 600; }
th[title] { text-decoration: underline dotted var(--muted); cursor: help; }
th.group { text-align: center; border-left: 2px solid #fff; font-weight: 500; color: var(--muted); text-transform: uppercase; font-size: 12px; letter-spacing: .04em; }
td.start, th.start { border-left: 1px solid var(--line); }
td.bench, th.bench { text-align: left; white-space: nowrap; position: sticky; left: 0; background: #fff; z-index: 1; }
td.bench .target { display: block; color: var(--muted); font-size: 11px; line-height: 1.2; }
th.bench { background: #f3f3f3; }
tr.bad td.bench { background: var(--bg-bad); }
td.name, th.name { text-align: left; white-space: normal; min-width: 14em; max-width: 520px; overflow-wrap: anywhere; }
td.line, th.line { text-align: left; white-space: nowrap; }
td.bar { position: relative; min-width: 5em; }
td.bar .fill { position: absolute; left: 0; top: 3px; bottom: 3px; background: var(--bar); }
td.bar .fill.bad { background: var(--bar-bad); }
td.bar .v { position: relative; }
.worse { color: var(--bad); font-weight: 600; }
.better { color: #1b7a3a; }
tr.bad td { background: var(--bg-bad); }
.regressions { border-left: 4px solid var(--bad); background: var(--bg-bad); padding: 6px 12px; margin: 8px 0; overflow-x: auto; }
.regressions p { margin: 2px 0; font-family: ui-monospace, monospace; white-space: nowrap; }
.regressions p.head { font-family: inherit; font-weight: 600; white-space: normal; }
.ok { border-left: 4px solid #1b7a3a; background: #eaf5ee; padding: 6px 12px; margin: 8px 0; }
figure { margin: 8px 0 16px; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { color: var(--muted); font-size: 13px; }
code { font-family: ui-monospace, monospace; font-size: 13px; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; max-width: 70em; }
dt { font-weight: 600; white-space: nowrap; }
dd { margin: 0; }
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

/// A table in a box that scrolls sideways rather than squeezing its text.
fn scroll(table: Markup) -> Markup {
    html! {
        div.scroll { (table) }
        "\n"
    }
}

/// A column head, with the glossary's definition of `term` as its hover.
fn head(label: Markup, term: &str, class: Option<&str>) -> Markup {
    html! {
        th class=[class] title=[glance::hover(term)] { (label) }
    }
}

/// A value with a bar behind it, `fraction` of the cell wide.
fn bar_cell(text: &str, fraction: Option<f64>, bad: bool, class: Option<&str>) -> Markup {
    let class = match class {
        Some(c) => format!("bar {c}"),
        None => "bar".to_string(),
    };
    html! {
        td class=(class) {
            @if let Some(f) = fraction.filter(|f| f.is_finite() && *f > 0.0) {
                span.fill.bad[bad] style={ "width:" (format!("{:.1}", f.min(1.0) * 100.0)) "%" } {}
            }
            span.v { (text) }
        }
    }
}

fn window_table(rows: &[WindowRow]) -> Markup {
    scroll(html! {
        table {
            tr {
                th { "window (loads)" } th { "windows" } (head(html!("F"), "F", None))
                (head(html!("ΔF"), "ΔF@W_c", None)) th { "F_str" } th { "F_irr" }
                (head(html!("F_str%"), "F_str%", None)) (head(html!("F_irr%"), "F_irr%", None))
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
    })
}

fn functions_table(analysis: &Analysis) -> Markup {
    let total = analysis.summary.a.max(1) as f64;
    let shown = analysis
        .functions
        .iter()
        .filter(|f| f.a > 0 || f.a_const > 0);
    scroll(html! {
        table {
            tr {
                th.name { "function" } (head(html!("A"), "A", None)) th { "A%" }
                (head(html!("Â"), "Â", None)) th { "A_const%" }
                (head(html!("ΔF@W" sub { "c" }), "ΔF@W_c", None))
                (head(html!("F_str%@W" sub { "c" }), "F_str%@W_c", None))
                (head(html!("F_irr%@W" sub { "c" }), "F_irr%@W_c", None))
                th { "code windows" } (head(html!("D" sub { "win" } " mean"), "D", None)) th.name { "hottest loads" }
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
    })
}

/// The three hottest source lines of a function, one per line: loads on
/// the same line (several instructions of one expression) are one entry
/// with their counts added, so a line never appears twice.
fn hot_lines(f: &FunctionMetrics) -> Markup {
    let mut lines: Vec<(String, u64)> = Vec::new();
    for load in &f.hot_loads {
        let place = load.line.clone().unwrap_or_else(|| format_address(load.ip));
        match lines.iter_mut().find(|(p, _)| *p == place) {
            Some((_, count)) => *count += load.count,
            None => lines.push((place, load.count)),
        }
    }
    lines.sort_by_key(|l| std::cmp::Reverse(l.1));
    html! {
        @for (i, (place, count)) in lines.iter().take(3).enumerate() {
            @if i > 0 { br; }
            code { (place) }
            " (" (int(*count)) ")"
        }
    }
}

/// The estimated misses of a line at one cache level.
type LineMisses = fn(&LineLocality) -> f64;

/// Rows of the hottest-lines table.
const TOP_LINES: usize = 10;

/// The hottest source lines of a bench: by estimated executions, with their
/// estimated misses at each cache size (`lines[]` of the analysis), and
/// which line misses most at each level. Without a whole-run curve, the
/// lines of the recorded loads by accesses. Lines are the user's: a load
/// in code inlined from a library is named by its call in the workspace.
fn lines_table(a: &Analysis) -> Markup {
    if a.lines.is_empty() {
        return recorded_lines_table(a);
    }
    let rows = &a.lines[..a.lines.len().min(TOP_LINES)];
    let most = |miss: LineMisses| {
        a.lines
            .iter()
            .filter(|l| miss(l) > 0.0)
            .max_by(|x, y| miss(x).total_cmp(&miss(y)))
    };
    let levels: [(&str, LineMisses); 3] = [
        ("L1", |l| l.misses_l1),
        ("L2", |l| l.misses_l2),
        ("LLC", |l| l.misses_llc),
    ];
    let top_hat = rows.iter().map(|l| l.a_hat).fold(0.0, f64::max);
    let tops = levels.map(|(_, m)| rows.iter().map(m).fold(0.0, f64::max));
    html! {
        @let worst: Vec<Option<&LineLocality>> = levels.iter().map(|(_, m)| most(*m)).collect();
        @if let Some(Some(l)) = worst.first().filter(|first| worst.iter().all(|w| w.map(|x| &x.line) == first.map(|x| &x.line))) {
            p.note {
                "Most estimated misses at every level: " code { (l.line) } "."
            }
        } @else {
        p.note {
            "Most estimated misses: "
            @for (i, (level, miss)) in levels.iter().enumerate() {
                @if i > 0 { "; " }
                (level) " "
                @match most(*miss) {
                    Some(l) => { code { (l.line) } " (" (super::charts::format_count(miss(l))) ")" }
                    None => { "none" }
                }
            }
            "."
        }
        }
        "\n"
        (scroll(html! {
            table.lines {
                tr {
                    th.line title=[glance::hover("source line")] { "source line" } th.name { "function" }
                    (head(html!("Â"), "Â", None))
                    @for (level, _) in levels {
                        (head(html!("est. " (level) " misses"), "MR", None))
                    }
                }
                "\n"
                @for l in rows {
                    tr {
                        td.line { code { (l.line) } }
                        @let function = l.function.as_deref().unwrap_or("–");
                        td.name title=(function) { code { (super::charts::ellipsize(function, 56)) } }
                        (bar_cell(&super::charts::format_count(l.a_hat), ratio(Some(l.a_hat), top_hat), false, None))
                        @for (i, (_, miss)) in levels.iter().enumerate() {
                            (bar_cell(&super::charts::format_count(miss(l)), ratio(Some(miss(l)), tops[i]), false, None))
                        }
                    }
                    "\n"
                }
            }
        }))
    }
}

/// The lines of the recorded loads by accesses, for an analysis without
/// `lines[]`: no whole-run curve, or none of its loads has a source line.
fn recorded_lines_table(a: &Analysis) -> Markup {
    let mut lines: Vec<(&str, u64)> = Vec::new();
    let mut recorded: u64 = 0;
    // Saturating: the counts come from a file, which may hold anything.
    for load in a.loads.iter().filter(|l| !l.implied) {
        recorded = recorded.saturating_add(load.count);
        let Some(line) = load.line.as_deref() else {
            continue;
        };
        match lines.iter_mut().find(|(l, _)| *l == line) {
            Some((_, count)) => *count = count.saturating_add(load.count),
            None => lines.push((line, load.count)),
        }
    }
    lines.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(y.0)));
    lines.retain(|l| l.1 > 0);
    let curve = a.summary.whole_run.mr_l1.is_some();
    recorded_lines_markup(&lines, recorded, curve)
}

/// The table of [`recorded_lines_table`]: `lines` hottest first, out of
/// `recorded` accesses of loads with or without a line; `curve` whether
/// the run has a whole-run curve. Says what share the lines hold, since
/// the hottest code may have none (a dependency built without line
/// tables) and a cold line would otherwise head the table.
fn recorded_lines_markup(lines: &[(&str, u64)], recorded: u64, curve: bool) -> Markup {
    if lines.is_empty() {
        return html! { p.note { "No recorded load has a source line (no DWARF line table)." } "\n" };
    }
    let top = lines[0].1 as f64;
    let with_line = lines.iter().fold(0u64, |sum, l| sum.saturating_add(l.1));
    let why = if curve {
        "No load of the whole-run curve has a source line, so no miss estimates per line: lines by recorded accesses."
    } else {
        "No whole-run curve in this run, so no miss estimates: lines by recorded accesses."
    };
    html! {
        p.note {
            (why)
            @if with_line < recorded {
                " They hold " (pct(with_line as f64 / recorded.max(1) as f64))
                " of the recorded accesses; the rest are in code without a line table \
                 (libraries; in " code { "bench" } ", dependencies, which keep their own profile's "
                code { "debug" } " setting: " code { "CARGO_PROFILE_BENCH_DEBUG=line-tables-only" }
                " gives them lines)."
            }
        }
        "\n"
        (scroll(html! {
            table.lines {
                tr { th.line { "source line" } (head(html!("A"), "A", None)) }
                "\n"
                @for (line, count) in lines.iter().take(TOP_LINES) {
                    tr {
                        td.line { code { (line) } }
                        (bar_cell(&int(*count), ratio(Some(*count as f64), top), false, None))
                    }
                    "\n"
                }
            }
        }))
    }
}

/// Distinct entries of `items`, first occurrence first.
fn distinct(items: &[String]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for item in items {
        if !out.contains(&item.as_str()) {
            out.push(item);
        }
    }
    out
}

fn regions_table(analysis: &Analysis) -> Markup {
    scroll(html! {
        table {
            tr {
                th.name { "region" } th { "size" } (head(html!("A"), "A", None)) th { "A%" }
                th { "blocks" } th { "A/block" } (head(html!("D" sub { "win" } " mean"), "D", None))
                th.name { "accessed by" }
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
                            @let lines = distinct(&f.lines);
                            @if !lines.is_empty() {
                                " at " (lines.iter().take(2).copied().collect::<Vec<_>>().join(", "))
                            }
                        }
                    }
                }
                "\n"
            }
        }
    })
}

/// `↑ +12.5%`, `↓ -3.0%`, `= 0.0%`, marked worse or better where the
/// metric's direction says which (`gated` metrics only); `compact`: a
/// change from 0 as the bare difference (`↑ +0.500`), for the overview's
/// narrow columns.
fn change_cell(
    metric: crate::gate::Metric,
    old: Option<f64>,
    new: Option<f64>,
    compact: bool,
    gated: bool,
    limit: Option<&crate::gate::Limit>,
) -> Markup {
    let (Some(old), Some(new)) = (old, new) else {
        return html! { td { "–" } };
    };
    let change = crate::gate::Change::between(old, new);
    let visible = change
        .relative
        .map_or(change.absolute != 0.0, |r| r.abs() >= 0.0005);
    let arrow = if visible { arrow(change.absolute) } else { "=" };
    // In the unit of the limit beside it, as the regression lines and the
    // Markdown summary show it.
    let text = match (compact, change.relative) {
        (true, None) => format!(
            "{}{}",
            if change.absolute > 0.0 { "+" } else { "" },
            dec(change.absolute)
        ),
        (true, Some(_)) => change.to_string(),
        (false, _) => change.against(limit),
    };
    // Colour only what the gate looks at, and only a visible change.
    let class = match (metric.worse(), change.absolute.partial_cmp(&0.0)) {
        _ if !gated || !visible => None,
        (_, Some(std::cmp::Ordering::Equal) | None) => None,
        (crate::gate::Direction::Either, _) => None,
        (crate::gate::Direction::Increase, Some(std::cmp::Ordering::Greater))
        | (crate::gate::Direction::Decrease, Some(std::cmp::Ordering::Less)) => Some("worse"),
        _ => Some("better"),
    };
    html! {
        td class=[class] { (arrow) " " (text) }
    }
}

/// `↑`, `↓` or `=` for the sign of a change.
pub(crate) fn arrow(change: f64) -> &'static str {
    if change > 0.0 {
        "↑"
    } else if change < 0.0 {
        "↓"
    } else {
        "="
    }
}

fn verdict_block(baseline: &str, run: &str, verdict: &Result<BenchVerdict, String>) -> Markup {
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
        (scroll(html! {
            table {
                tr {
                    th.name { "metric" } th { "baseline " (baseline) } th { (run) }
                    th { "change" } th { "limit" }
                }
                "\n"
                @for m in &verdict.metrics {
                    tr class=[bad_class(m.regressed)] {
                        td.name { code { (m.metric) } }
                        td { (opt(m.old, dec)) }
                        td { (opt(m.new, dec)) }
                        (change_cell(m.metric, m.old, m.new, false, m.limit.is_some(), m.limit.as_ref()))
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
        }))
        @if verdict.metrics.iter().any(|m| m.metric.per_run()) {
            p.note { (crate::gate::metric::PER_RUN_NOTE) "." }
            "\n"
        }
        @if let Some(k) = verdict.window_k {
            p.note {
                "dF, F_str_frac, F_irr_frac: means over windows of " (format_window(k))
                " loads (ΔF@W" sub { "c" } ", F_str%@W" sub { "c" } ", F_irr%@W" sub { "c" } ")."
            }
            "\n"
        }
        @for note in &verdict.notes {
            p.note { (note) }
            "\n"
        }
    }
}

/// Renders the whole page; benches in the order of [`glance::rank`].
pub fn index(
    title: &str,
    source: &str,
    pages: &[BenchPage],
    overview_charts: &[ChartFile],
    baseline: Option<&str>,
) -> String {
    let order = glance::rank(pages);
    let ranked: Vec<&BenchPage> = order.iter().map(|&i| &pages[i]).collect();
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
                (navigation(&ranked))
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
                    (overview(&ranked, overview_charts, baseline))
                    @for page in &ranked {
                        (bench_section(page, baseline))
                    }
                    (glance::glossary())
                }
                "\n"
            }
            "\n"
        }
        "\n"
    };
    page.into_string()
}

/// The side bar: the overview, one link per bench (its bench name, and
/// its package and target where they differ between benches), the
/// glossary.
fn navigation(pages: &[&BenchPage]) -> Markup {
    let targets = targets(pages);
    html! {
        nav {
            "\n"
            a href="#overview" { b { "At a glance" } } "\n"
            h2 { "Benches" } "\n"
            @if let [target] = targets.as_slice() {
                @if !target.is_empty() { p.note { (target) } "\n" }
            }
            @for page in pages {
                a href={ "#" (page.slug) } class=[bad_class(regressed(page))] title=(page.bench.name) {
                    @match &page.bench.key {
                        Some(key) => (key.bench),
                        None => (page.bench.name),
                    }
                }
                @if let (Some(key), true) = (&page.bench.key, targets.len() > 1) {
                    span.target { (key.package) "/" (key.target) }
                }
                "\n"
            }
            h2 { "Reference" } "\n"
            a href="#glossary" { "Glossary" } "\n"
        }
        "\n"
    }
}

/// The `package/target`s the benches come from (an empty string for
/// benches without one).
fn targets(pages: &[&BenchPage]) -> Vec<String> {
    let mut targets: Vec<String> = pages
        .iter()
        .map(|p| {
            p.bench
                .key
                .as_ref()
                .map_or_else(String::new, |k| format!("{}/{}", k.package, k.target))
        })
        .collect();
    targets.sort();
    targets.dedup();
    targets
}

/// The recording parameters of the benches, for the overview's caption:
/// `(description, benches recorded so)`, most common first.
fn recordings(pages: &[&BenchPage]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for page in pages {
        let r = super::adapt::recording(&page.bench.analysis);
        match out.iter_mut().find(|(d, _)| *d == r) {
            Some((_, n)) => *n += 1,
            None => out.push((r, 1)),
        }
    }
    out.sort_by_key(|r| std::cmp::Reverse(r.1));
    out
}

/// The regressions of the run, first thing on the page.
fn regressions_box(pages: &[&BenchPage], baseline: &str) -> Markup {
    let regressed: Vec<&&BenchPage> = pages.iter().filter(|p| regressed(p)).collect();
    let count: usize = regressed
        .iter()
        .map(|p| glance::headline(p).regressions)
        .sum();
    let refused = pages
        .iter()
        .filter(|p| matches!(p.verdict, Some(Err(_))))
        .count();
    html! {
        @if regressed.is_empty() {
            div.ok {
                "No regression against baseline " code { (baseline) } "."
                @if refused > 0 {
                    " " (refused) " bench" @if refused != 1 { "es" } " could not be compared (see its section)."
                }
            }
            "\n"
        } @else {
            div.regressions {
                "\n"
                p.head {
                    (count) " regression" @if count != 1 { "s" } " against baseline "
                    code { (baseline) } " in " (regressed.len()) " bench"
                    @if regressed.len() != 1 { "es" } ":"
                }
                "\n"
                @for page in &regressed {
                    @if let Some(Ok(v)) = &page.verdict {
                        @for r in &v.regressions {
                            p { a href={ "#" (page.slug) } { "regression" } ": " (r.human()) }
                            "\n"
                        }
                    }
                }
            }
            "\n"
        }
    }
}

/// The overview section: regressions, then one row per bench in ranked
/// order with grouped columns, then the charts that compare benches.
fn overview(pages: &[&BenchPage], charts: &[ChartFile], baseline: Option<&str>) -> Markup {
    let cache: Vec<(usize, &str)> = glance::CACHE_LEVELS
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            pages
                .iter()
                .any(|p| glance::headline(p).misses[*i].is_some())
        })
        .map(|(i, (level, _))| (i, *level))
        .collect();
    let scale = Scale::of(pages);
    let recorded = recordings(pages);
    let targets = targets(pages);
    html! {
        section id="overview" {
            "\n"
            h2 { "At a glance" } "\n"
            @if let Some(b) = baseline {
                (regressions_box(pages, b))
            }
            (scroll(html! {
                table.overview {
                    caption {
                        "Benches "
                        @if baseline.is_some() { "with regressions first, then " }
                        "ranked by "
                        @if !cache.is_empty() { "estimated cache misses, " }
                        "F_irr%@W" sub { "c" } " and ΔF@W" sub { "c" } " (largest first). Recorded "
                        @for (i, (how, n)) in recorded.iter().enumerate() {
                            @if i > 0 { "; " }
                            (how)
                            @if recorded.len() > 1 { " (" (n) " bench" @if *n != 1 { "es" } ")" }
                        }
                        @if let [target] = targets.as_slice() {
                            @if !target.is_empty() { ". All from " code { (target) } }
                        }
                        ". Hover a column head for its meaning; – : undefined."
                    }
                    "\n"
                    (overview_head(&cache, baseline))
                    tbody {
                        @for page in pages {
                            (overview_row(page, &cache, &scale, baseline.is_some(), targets.len() > 1))
                        }
                    }
                }
            }))
            @for chart in charts {
                (figure(chart))
            }
        }
        "\n"
    }
}

/// The two header rows of the overview: groups, then columns.
fn overview_head(cache: &[(usize, &str)], baseline: Option<&str>) -> Markup {
    let sub_c = |name: &str| html! { (name) "@W" sub { "c" } };
    html! {
        thead {
            tr {
                th.bench rowspan="2" { "bench" }
                th.group.start colspan="2" { "counts" }
                th.group.start colspan="2" { "footprint" }
                th.group.start colspan="3" { "locality (code windows)" }
                @if !cache.is_empty() {
                    th.group.start colspan=(cache.len()) { "cache" }
                }
                @if let Some(b) = baseline {
                    th.group.start colspan="4" { "against " (b) }
                }
            }
            "\n"
            tr {
                th.start title="Samples recorded (after splitting per thread)." { "samples" }
                (head(html!("Â"), "Â", None))
                (head(html!("F"), "F", Some("start"))) (head(html!("F_irr%"), "F_irr%", None))
                (head(sub_c("F_irr%"), "F_irr%@W_c", Some("start")))
                (head(sub_c("ΔF"), "ΔF@W_c", None))
                (head(html!("D" sub { "win" } " mean"), "D", None))
                @for (i, (_, level)) in cache.iter().enumerate() {
                    (head(html!("est. " (level) " misses"), "MR", (i == 0).then_some("start")))
                }
                @if baseline.is_some() {
                    (head(html!("regr."), "regression", Some("start")))
                    (head(html!("Â"), "Â", None))
                    (head(sub_c("F_irr%"), "F_irr%@W_c", None))
                    (head(sub_c("ΔF"), "ΔF@W_c", None))
                }
            }
            "\n"
        }
    }
}

/// The largest values of the barred columns, so bars compare benches.
struct Scale {
    d_f: f64,
    misses: [f64; 2],
}

impl Scale {
    fn of(pages: &[&BenchPage]) -> Scale {
        let heads: Vec<glance::Headline> = pages.iter().map(|p| glance::headline(p)).collect();
        let max = |get: &dyn Fn(&glance::Headline) -> Option<f64>| {
            heads.iter().filter_map(get).fold(0.0, f64::max)
        };
        Scale {
            d_f: max(&|h| h.d_f),
            misses: [max(&|h| h.misses[0]), max(&|h| h.misses[1])],
        }
    }
}

fn ratio(value: Option<f64>, max: f64) -> Option<f64> {
    value.filter(|_| max > 0.0).map(|v| v / max)
}

/// One bench's overview row; `show_target`: its package and target under
/// its name (when the benches come from several).
fn overview_row(
    page: &BenchPage,
    cache: &[(usize, &str)],
    scale: &Scale,
    compared: bool,
    show_target: bool,
) -> Markup {
    let a = &page.bench.analysis;
    let s = &a.summary;
    let any = glance::has_accesses(a);
    let h = glance::headline(page);
    let verdict = page.verdict.as_ref().and_then(|v| v.as_ref().ok());
    let metric = |m: crate::gate::Metric| {
        verdict
            .and_then(|v| v.metrics.iter().find(|c| c.metric == m))
            .map_or((None, None), |c| (c.old, c.new))
    };
    html! {
        tr class=[bad_class(regressed(page))] {
            td.bench {
                @match (&page.bench.key, show_target) {
                    (Some(key), true) => {
                        a href={ "#" (page.slug) } title=(page.bench.name) { (key.bench) }
                        span.target { (key.package) "/" (key.target) }
                    }
                    (Some(key), false) => a href={ "#" (page.slug) } title=(page.bench.name) { (key.bench) },
                    (None, _) => a href={ "#" (page.slug) } { (page.bench.name) },
                }
            }
            td.start { (int(s.samples)) }
            td { (opt(s.a_hat, super::charts::format_count)) }
            td.start { (int(s.f)) }
            td { (opt(any.then_some(s.f_irr_frac), pct)) }
            (bar_cell(&opt(h.f_irr_frac, pct), h.f_irr_frac, false, Some("start")))
            (bar_cell(&opt(h.d_f, dec), ratio(h.d_f, scale.d_f), false, None))
            td { (opt(s.d_mean, dec)) }
            @for (n, (i, _)) in cache.iter().enumerate() {
                (bar_cell(
                    &opt(h.misses[*i], super::charts::format_count),
                    ratio(h.misses[*i], scale.misses[*i]),
                    false,
                    (n == 0).then_some("start"),
                ))
            }
            @if compared {
                @match verdict {
                    Some(v) if v.has_baseline => {
                        td.start class=[(!v.regressions.is_empty()).then_some("worse")] { (v.regressions.len()) }
                        @for m in [crate::gate::Metric::AHat, crate::gate::Metric::FIrrFrac, crate::gate::Metric::DF] {
                            @let (old, new) = metric(m);
                            (change_cell(m, old, new, true, true, None))
                        }
                    }
                    Some(_) => { td.start title="not in the baseline: nothing compared" { "new" } td { "–" } td { "–" } td { "–" } }
                    None => { td.start title="not compared: see the bench's section" { "–" } td { "–" } td { "–" } td { "–" } }
                }
            }
        }
        "\n"
    }
}

/// One bench's section: two plain sentences, what was recorded, the
/// baseline comparison, then charts and tables by topic, then what the
/// data does not cover.
fn bench_section(page: &BenchPage, baseline: Option<&str>) -> Markup {
    let a = &page.bench.analysis;
    let s = &a.summary;
    html! {
        section id=(page.slug) {
            "\n"
            h2 { (page.bench.name) } "\n"
            (glance::sentences(a))
            p.meta {
                (super::adapt::recording(a)) " · " (super::adapt::volume(a)) " · ρ = "
                (opt(s.rho, dec)) " · κ = " (opt(s.kappa, dec)) " · ΔF" sub { "run" } " = "
                (opt(s.d_f, dec)) " · " (int(s.records))
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
                (verdict_block(name, &page.run_label, verdict))
            }
            (topics(page, WHOLE_RUN))
            @for chart in page.charts.iter().filter(|c| c.section == "windows") {
                h3 { "Trace windows" } "\n"
                (figure(chart))
                (window_table(&a.trace_windows))
            }
            (topics(page, IN_SAMPLES))
            (coverage(page))
        }
        "\n"
    }
}

/// The whole-run topics, which lead a bench's section: the miss-ratio
/// curve and the hottest source lines.
const WHOLE_RUN: &[(&str, &str)] = &[
    ("mrc", "Miss-ratio curve (whole run)"),
    ("lines", "Hottest source lines"),
];

/// The topics after the trace windows. A chart whose section is listed in
/// neither list is not shown: a new chart kind gets its entry.
const IN_SAMPLES: &[(&str, &str)] = &[
    (
        "reuse",
        "Reuse distance within samples (in-window, L1 scale)",
    ),
    ("time", "Accesses over time and per address"),
    ("functions", "Hot functions"),
    ("regions", "Hot regions"),
];

/// Topic subsections of a bench, each with its charts and, for lines,
/// functions and regions, a table (shown even without a chart).
fn topics(page: &BenchPage, sections: &[(&str, &str)]) -> Markup {
    let a = &page.bench.analysis;
    html! {
        @for &(section, heading) in sections {
            @let charts: Vec<&ChartFile> =
                page.charts.iter().filter(|c| c.section == section).collect();
            @if !charts.is_empty() || matches!(section, "functions" | "regions" | "lines") {
                h3 { (heading) } "\n"
                @for chart in charts {
                    (figure(chart))
                }
                @if section == "lines" {
                    (lines_table(a))
                }
                @if section == "reuse" {
                    p.note {
                        @if let Some(w) = a.run.window {
                            "Reuse is counted only within each sample of " (int(w))
                            " consecutive loads: it shows locality at the scale of an L1 \
                            cache. Reuse farther apart is invisible here (a pointer chase can \
                            show a smaller D than a tree that misses far more); the \
                            miss-ratio curve above is the whole-run view. "
                        }
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
    let objects = &page.bench.analysis.summary.coverage_by_object;
    html! {
        @if !notes.is_empty() || !objects.is_empty() {
            h3 { "Coverage" } "\n"
            @if !objects.is_empty() {
                (objects_table(objects))
            }
            @for note in &notes {
                p.note { (note) } "\n"
            }
        }
    }
}

/// Executed-load coverage by object: traced share of each instrumented
/// object's executed loads, and the libraries that ran uninstrumented.
fn objects_table(objects: &[ObjectLoadCoverage]) -> Markup {
    let estimate = |x: f64| int(x.round() as u64);
    scroll(html! {
        table {
            caption { "Executed loads traced, by object (estimates in units of Â; an uninstrumented library's loads are unknown)" }
            tr {
                th.name { "object" } th { "executed loads" } th { "traced" } th { "traced %" }
            }
            "\n"
            @for o in objects {
                tr {
                    td.name { code { (o.object) } }
                    @if o.instrumented {
                        td { (opt(o.loads_executed, estimate)) }
                        td { (opt(o.loads_executed.map(|_| o.loads_traced), estimate)) }
                        (bar_cell(&opt(o.share, pct), o.share, o.share.is_some_and(|s| s < 0.95), None))
                    } @else {
                        td { "unknown" } td { "–" } td.worse { "not instrumented" }
                    }
                }
                "\n"
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_appears_once_per_cell_with_its_counts_added() {
        let load = |ip, line: Option<&str>, count| memgaze_analysis::HotLoad {
            ip,
            line: line.map(str::to_string),
            count,
        };
        let f = FunctionMetrics {
            name: "f".into(),
            object: None,
            a: 100,
            a_const: 0,
            a_const_frac: None,
            a_hat: None,
            d_f: None,
            f_str_frac: None,
            f_irr_frac: None,
            code_windows: 0,
            d_mean: None,
            trace_windows: Vec::new(),
            hot_loads: vec![
                load(0x10, Some("src/map.rs:41"), 30),
                load(0x20, Some("src/lib.rs:7"), 35),
                load(0x14, Some("src/map.rs:41"), 20),
                load(0x30, None, 5),
                load(0x40, Some("src/lib.rs:9"), 1),
            ],
            whole_run: Default::default(),
            coverage_dynamic: None,
        };
        let cell = hot_lines(&f).into_string();
        assert_eq!(cell.matches("src/map.rs:41").count(), 1, "{cell}");
        // 30 + 20 on one line, hottest first; three entries at most.
        assert!(
            cell.starts_with("<code>src/map.rs:41</code> (50)<br><code>src/lib.rs:7</code> (35)"),
            "{cell}"
        );
        assert!(cell.contains("<code>0x30</code> (5)"), "{cell}");
        assert!(!cell.contains("lib.rs:9"), "{cell}");
        assert_eq!(distinct(&["a".into(), "b".into(), "a".into()]), ["a", "b"]);
    }

    /// An instrumented object shows its estimated loads and share; an
    /// uninstrumented library says so, with no invented figure.
    #[test]
    fn objects_table_says_which_objects_were_not_instrumented() {
        let rows = [
            ObjectLoadCoverage {
                object: "libc.so.6".into(),
                instrumented: true,
                loads_executed: Some(2000.0),
                loads_traced: 1500.0,
                share: Some(0.75),
            },
            ObjectLoadCoverage {
                object: "libm.so.6".into(),
                instrumented: false,
                loads_executed: None,
                loads_traced: 0.0,
                share: None,
            },
        ];
        let html = objects_table(&rows).into_string();
        assert!(
            html.contains("<code>libc.so.6</code></td><td>2,000</td><td>1,500</td>"),
            "{html}"
        );
        assert!(html.contains("75.0%"), "{html}");
        assert!(
            html.contains("<code>libm.so.6</code></td><td>unknown</td>"),
            "{html}"
        );
        assert!(html.contains("not instrumented"), "{html}");
    }

    /// A metric gated by an absolute limit shows its change in the
    /// limit's unit, as the regression line and the Markdown summary do.
    #[test]
    fn a_change_reads_in_the_unit_of_its_limit() {
        let absolute = crate::gate::Limit {
            direction: crate::gate::Direction::Increase,
            relative: None,
            absolute: Some(0.1149),
        };
        let cell = |limit| {
            change_cell(
                crate::gate::Metric::MrL1,
                Some(0.2496),
                Some(0.9984),
                false,
                true,
                limit,
            )
            .into_string()
        };
        let gated = cell(Some(&absolute));
        assert!(gated.contains("+0.7488"), "{gated}");
        assert!(!gated.contains('%'), "{gated}");
        let ungated = cell(None);
        assert!(ungated.contains("+300.0%"), "{ungated}");
    }

    /// A run whose hottest code has no line table (sha2 in a dependency
    /// built without one) has a whole-run curve: the note says why no line
    /// has miss estimates and how few accesses the listed lines hold.
    #[test]
    fn recorded_lines_say_what_share_they_hold_and_why_they_have_no_misses() {
        let lines = [("benches/hash.rs:7", 335)];
        let with_curve = recorded_lines_markup(&lines, 669_499, true).into_string();
        assert!(!with_curve.contains("No whole-run curve"), "{with_curve}");
        assert!(
            with_curve.contains("No load of the whole-run curve has a source line"),
            "{with_curve}"
        );
        assert!(
            with_curve.contains("They hold 0.1% of the recorded accesses"),
            "{with_curve}"
        );
        assert!(
            with_curve.contains("CARGO_PROFILE_BENCH_DEBUG=line-tables-only"),
            "{with_curve}"
        );
        let without = recorded_lines_markup(&lines, 335, false).into_string();
        assert!(
            without.contains("No whole-run curve in this run"),
            "{without}"
        );
        assert!(!without.contains("They hold"), "{without}");
        let none = recorded_lines_markup(&[], 100, true).into_string();
        assert!(
            none.contains("No recorded load has a source line"),
            "{none}"
        );
    }

    #[test]
    fn groups_digits() {
        assert_eq!(int(0), "0");
        assert_eq!(int(1234567), "1,234,567");
        assert_eq!(int(100), "100");
    }
}
