//! The self-contained `index.html`: inline CSS, no script, no external
//! resource; charts are relative links to the SVG files beside it, so the
//! directory works offline and as a CI artifact.

use super::charts::{format_address, format_bytes, format_window};
use super::{BenchPage, ChartFile};
use crate::gate::BenchVerdict;
use memgaze_analysis::{Analysis, FunctionMetrics, WindowRow};
use std::fmt::Write as _;

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

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

fn figure(out: &mut String, chart: &ChartFile) {
    let _ = writeln!(
        out,
        r#"<figure><a href="{0}"><img src="{0}" alt="{1}" width="{2}" height="{3}" loading="lazy"></a><figcaption>{1}</figcaption></figure>"#,
        escape(&chart.file),
        escape(&chart.title),
        chart.size.0,
        chart.size.1
    );
}

fn window_table(out: &mut String, rows: &[WindowRow]) {
    out.push_str("<table><tr><th>window (accesses)</th><th>windows</th><th>F</th><th>ΔF</th><th>F_str</th><th>F_irr</th><th>F_str%</th><th>F_irr%</th></tr>\n");
    for r in rows.iter().filter(|r| r.windows > 0) {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            format_window(r.k),
            int(r.windows),
            dec(r.f),
            dec(r.d_f),
            dec(r.f_str),
            dec(r.f_irr),
            pct(r.f_str_frac),
            pct(r.f_irr_frac)
        );
    }
    out.push_str("</table>\n");
}

fn functions_table(out: &mut String, analysis: &Analysis) {
    let total = analysis.summary.a.max(1) as f64;
    out.push_str("<table><tr><th class=name>function</th><th>A</th><th>A%</th><th>Â</th><th>A_const%</th><th>ΔF</th><th>F_str%</th><th>F_irr%</th><th>code windows</th><th>D mean</th><th class=name>hottest loads</th></tr>\n");
    for f in analysis
        .functions
        .iter()
        .filter(|f| f.a > 0 || f.a_const > 0)
    {
        let _ = writeln!(
            out,
            "<tr><td class=name><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=name>{}</td></tr>",
            escape(&f.name),
            int(f.a),
            pct(f.a as f64 / total),
            opt(f.a_hat, super::charts::format_count),
            opt(f.a_const_frac, pct),
            opt(f.d_f, dec),
            opt(f.f_str_frac, pct),
            opt(f.f_irr_frac, pct),
            int(f.code_windows),
            opt(f.d_mean, dec),
            hot_lines(f)
        );
    }
    out.push_str("</table>\n");
}

fn hot_lines(f: &FunctionMetrics) -> String {
    f.hot_loads
        .iter()
        .take(3)
        .map(|l| {
            let place = l.line.clone().unwrap_or_else(|| format_address(l.ip));
            format!("<code>{}</code> ({})", escape(&place), int(l.count))
        })
        .collect::<Vec<_>>()
        .join("<br>")
}

fn regions_table(out: &mut String, analysis: &Analysis) {
    out.push_str("<table><tr><th class=name>region</th><th>size</th><th>A</th><th>A%</th><th>blocks</th><th>A/block</th><th>D mean</th><th class=name>accessed by</th></tr>\n");
    for r in &analysis.regions {
        let by = r
            .functions
            .iter()
            .take(3)
            .map(|f| {
                let lines = if f.lines.is_empty() {
                    String::new()
                } else {
                    format!(
                        " at {}",
                        f.lines
                            .iter()
                            .take(2)
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                format!(
                    "<code>{}</code> ({}){}",
                    escape(&f.name),
                    int(f.a),
                    escape(&lines)
                )
            })
            .collect::<Vec<_>>()
            .join("<br>");
        let _ = writeln!(
            out,
            "<tr><td class=name><code>{}–{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=name>{}</td></tr>",
            format_address(r.start),
            format_address(r.end),
            format_bytes(r.end - r.start),
            int(r.a),
            pct(r.a_frac),
            int(r.blocks),
            dec(r.a_per_block),
            opt(r.d_mean, dec),
            by
        );
    }
    out.push_str("</table>\n");
}

fn verdict_block(out: &mut String, baseline: &str, verdict: &Result<BenchVerdict, String>) {
    let verdict = match verdict {
        Ok(v) => v,
        Err(message) => {
            let _ = writeln!(
                out,
                "<p class=note>Not compared with baseline <code>{}</code>: {}</p>",
                escape(baseline),
                escape(message)
            );
            return;
        }
    };
    if !verdict.has_baseline {
        let _ = writeln!(
            out,
            "<p class=note>Not in baseline <code>{}</code>.</p>",
            escape(baseline)
        );
        return;
    }
    if !verdict.regressions.is_empty() {
        out.push_str("<div class=regressions>\n");
        for r in &verdict.regressions {
            let _ = writeln!(out, "<p>regression: {}</p>", escape(&r.human()));
        }
        out.push_str("</div>\n");
    }
    let _ = writeln!(
        out,
        "<table><tr><th class=name>metric</th><th>baseline {}</th><th>this run</th><th>change</th><th>limit</th></tr>",
        escape(baseline)
    );
    for m in &verdict.metrics {
        let change = match (m.old, m.new) {
            (Some(old), Some(new)) => crate::gate::Change::between(old, new).to_string(),
            _ => "–".into(),
        };
        let _ = writeln!(
            out,
            "<tr{}><td class=name><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if m.regressed { " class=bad" } else { "" },
            m.metric,
            opt(m.old, dec),
            opt(m.new, dec),
            change,
            m.limit.map_or("–".into(), |l| l.to_string())
        );
    }
    out.push_str("</table>\n");
    if let Some(k) = verdict.window_k {
        let _ = writeln!(
            out,
            "<p class=note>dF, F_str_frac, F_irr_frac: means over windows of {} accesses.</p>",
            format_window(k)
        );
    }
    for note in &verdict.notes {
        let _ = writeln!(out, "<p class=note>{}</p>", escape(note));
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
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        escape(title)
    );
    out.push_str("<nav>\n<a href=\"#overview\"><b>Overview</b></a>\n<h2>Benches</h2>\n");
    for page in pages {
        let bad = page
            .verdict
            .as_ref()
            .is_some_and(|v| v.as_ref().is_ok_and(|v| !v.regressions.is_empty()));
        let _ = writeln!(
            out,
            "<a href=\"#{}\"{}>{}</a>",
            page.slug,
            if bad { " class=bad" } else { "" },
            escape(&page.bench.name)
        );
    }
    out.push_str("</nav>\n<main>\n");
    let _ = writeln!(out, "<h1>{}</h1>", escape(title));
    let _ = writeln!(
        out,
        "<p class=meta>{} bench{} from <code>{}</code>{}</p>",
        pages.len(),
        if pages.len() == 1 { "" } else { "es" },
        escape(source),
        baseline.map_or(String::new(), |b| format!(
            " · compared with baseline <code>{}</code>",
            escape(b)
        ))
    );

    // Overview.
    out.push_str("<section id=\"overview\">\n<h2>Overview</h2>\n");
    out.push_str("<p class=note>Whole-run values over the recorded samples. ΔF@W<sub>c</sub>, F_str%@W<sub>c</sub>: means over code windows (comparable between sampled and full traces); whole-run F of a sampled trace is what the samples saw.</p>\n");
    out.push_str("<table><tr><th class=name>bench</th><th>recording</th><th>samples</th><th>A</th><th>Â</th><th>F</th><th>ΔF</th><th>F_str%</th><th>F_irr%</th><th>ΔF@W<sub>c</sub></th><th>F_str%@W<sub>c</sub></th><th>D mean</th><th>D max</th></tr>\n");
    for page in pages {
        let a = &page.bench.analysis;
        let s = &a.summary;
        let row = a
            .trace_windows
            .iter()
            .filter(|r| r.k <= a.run.code_window_k && r.windows > 0)
            .max_by_key(|r| r.k);
        let _ = writeln!(
            out,
            "<tr{}><td class=name><a href=\"#{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if page
                .verdict
                .as_ref()
                .is_some_and(|v| v.as_ref().is_ok_and(|v| !v.regressions.is_empty()))
            {
                " class=bad"
            } else {
                ""
            },
            page.slug,
            escape(&page.bench.name),
            escape(&super::adapt::recording(a)),
            int(s.samples),
            int(s.a),
            opt(s.a_hat, super::charts::format_count),
            int(s.f),
            opt(s.d_f, dec),
            pct(s.f_str_frac),
            pct(s.f_irr_frac),
            opt(row.map(|r| r.d_f), dec),
            opt(row.map(|r| r.f_str_frac), pct),
            opt(s.d_mean, dec),
            s.d_max.map_or("–".into(), int)
        );
    }
    out.push_str("</table>\n");
    for chart in overview_charts {
        figure(&mut out, chart);
    }
    out.push_str("</section>\n");

    for page in pages {
        bench_section(&mut out, page, baseline);
    }
    out.push_str("</main>\n</body>\n</html>\n");
    out
}

fn bench_section(out: &mut String, page: &BenchPage, baseline: Option<&str>) {
    let a = &page.bench.analysis;
    let s = &a.summary;
    let _ = writeln!(
        out,
        "<section id=\"{}\">\n<h2>{}</h2>",
        page.slug,
        escape(&page.bench.name)
    );
    let _ = writeln!(
        out,
        "<p class=meta>{} · {} · ρ = {} · κ = {} · {} records</p>",
        escape(&super::adapt::recording(a)),
        escape(&super::adapt::volume(a)),
        opt(s.rho, dec),
        opt(s.kappa, dec),
        int(s.records)
    );
    if !a.run.command.is_empty() || a.run.binary.is_some() {
        let _ = writeln!(
            out,
            "<p class=meta>{}<code>{}</code></p>",
            a.run.binary.as_ref().map_or(String::new(), |b| format!(
                "binary <code>{}</code> · command ",
                escape(b)
            )),
            escape(&a.run.command.join(" "))
        );
    }
    if let (Some(name), Some(verdict)) = (baseline, &page.verdict) {
        out.push_str("<h3>Against the baseline</h3>\n");
        verdict_block(out, name, verdict);
    }
    for chart in &page.charts {
        if chart.section == "windows" {
            out.push_str("<h3>Trace windows</h3>\n");
            figure(out, chart);
            window_table(out, &a.trace_windows);
        }
    }
    let sections = [
        ("reuse", "Reuse distance"),
        ("time", "Accesses over time and per address"),
        ("functions", "Hot functions"),
        ("regions", "Hot regions"),
    ];
    for (section, heading) in sections {
        let charts: Vec<&ChartFile> = page
            .charts
            .iter()
            .filter(|c| c.section == section)
            .collect();
        let has_table = matches!(section, "functions" | "regions");
        if charts.is_empty() && !has_table {
            continue;
        }
        let _ = writeln!(out, "<h3>{heading}</h3>");
        for chart in charts {
            figure(out, chart);
        }
        if section == "reuse" {
            let r = &a.reuse;
            let _ = writeln!(
                out,
                "<p class=note>{} accesses had no earlier access to their {}-byte block in their sample (cold); {} blocks were reused within a sample (captures), {} were not (survivals).</p>",
                int(r.cold),
                r.block,
                int(r.captures),
                int(r.survivals)
            );
        }
        if section == "functions" {
            functions_table(out, a);
        }
        if section == "regions" {
            if a.regions.is_empty() {
                out.push_str("<p class=note>No hot region.</p>\n");
            } else {
                regions_table(out, a);
            }
        }
    }
    let c = &a.coverage;
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
    if !notes.is_empty() {
        out.push_str("<h3>Coverage</h3>\n");
        for note in notes {
            let _ = writeln!(out, "<p class=note>{}</p>", escape(&note));
        }
    }
    out.push_str("</section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_groups_digits() {
        assert_eq!(escape("Vec<T> & \"x\""), "Vec&lt;T&gt; &amp; &quot;x&quot;");
        assert_eq!(int(0), "0");
        assert_eq!(int(1234567), "1,234,567");
        assert_eq!(int(100), "100");
    }
}
