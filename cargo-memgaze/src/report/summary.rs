//! The short Markdown summary of a comparison with a baseline
//! (`--summary-md FILE`): what a pull-request comment or a CI job summary
//! shows. The first line says whether anything regressed and names the
//! regressed benches; one GitHub-flavoured Markdown table follows with the
//! regressions first, then the other gated metrics that changed, each with
//! an arrow, old and new value and its limit; the last line points at the
//! full report.

use super::charts::format_value;
use crate::gate::{BenchVerdict, Change, MetricComparison};
use std::fmt::Write as _;

/// Rows of the table at most; the rest are counted under it.
pub const MAX_ROWS: usize = 20;

/// A change smaller than this share of the old value (or, from 0, in
/// absolute terms) is "unchanged" and left out of the table.
const NOTICEABLE: f64 = 0.01;

/// `text` with Markdown's special characters escaped, for a table cell
/// (a bench name may hold `|`, `*` or `_`).
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(
            c,
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '#' | '!' | '~' | '&'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether a metric moved enough to list.
fn changed(m: &MetricComparison) -> bool {
    match (m.old, m.new) {
        (Some(old), Some(new)) => {
            let c = Change::between(old, new);
            match c.relative {
                Some(r) => r.abs() >= NOTICEABLE,
                None => c.absolute.abs() >= NOTICEABLE,
            }
        }
        (None, None) => false,
        _ => true,
    }
}

/// How much a metric moved, for ordering: relative where defined.
fn size(m: &MetricComparison) -> f64 {
    match (m.old, m.new) {
        (Some(old), Some(new)) => {
            let c = Change::between(old, new);
            c.relative.unwrap_or(c.absolute).abs()
        }
        _ => f64::INFINITY,
    }
}

fn value(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), format_value)
}

/// `↑ +50.0%`.
fn change(m: &MetricComparison) -> String {
    match (m.old, m.new) {
        (Some(old), Some(new)) => {
            let c = Change::between(old, new);
            let shown = c.against(m.limit.as_ref());
            format!("{} {shown}", super::html::arrow(c.absolute))
        }
        _ => "–".to_string(),
    }
}

fn row(out: &mut String, verdict: &BenchVerdict, m: &MetricComparison) {
    let status = if m.regressed { "❌ regression" } else { "" };
    let limit = m.limit.map_or_else(|| "–".to_string(), |l| l.to_string());
    let _ = writeln!(
        out,
        "| {status} | {} | `{}` | {} | {} | {} | {} |",
        escape(&verdict.bench.to_string()),
        m.metric,
        value(m.old),
        value(m.new),
        change(m),
        escape(&limit)
    );
}

/// The summary of `verdicts` against baseline `baseline` (`current`
/// names what was compared with it: `this run`, or another baseline);
/// `report` is the path or link of the full report, when one was written.
pub fn markdown(
    baseline: &str,
    current: &str,
    verdicts: &[BenchVerdict],
    report: Option<&str>,
) -> String {
    let compared: Vec<&BenchVerdict> = verdicts.iter().filter(|v| v.has_baseline).collect();
    let regressed: Vec<&BenchVerdict> = compared
        .iter()
        .copied()
        .filter(|v| !v.regressions.is_empty())
        .collect();
    let count: usize = regressed.iter().map(|v| v.regressions.len()).sum();
    let mut out = String::new();
    let _ = if count > 0 {
        writeln!(
            out,
            "### ❌ memgaze: {count} regression{} in {} of {} bench{} against baseline `{baseline}`",
            if count == 1 { "" } else { "s" },
            regressed.len(),
            compared.len(),
            if compared.len() == 1 { "" } else { "es" }
        )
    } else if compared.is_empty() {
        writeln!(
            out,
            "### memgaze: nothing compared with baseline `{baseline}` (no bench of {current} is in it)"
        )
    } else {
        writeln!(
            out,
            "### ✅ memgaze: no regression in {} bench{} against baseline `{baseline}`",
            compared.len(),
            if compared.len() == 1 { "" } else { "es" }
        )
    };
    out.push('\n');
    if !regressed.is_empty() {
        let names: Vec<String> = regressed
            .iter()
            .map(|v| {
                let metrics: Vec<&str> = v.regressions.iter().map(|r| r.metric.name()).collect();
                format!("{} ({})", escape(&v.bench.to_string()), metrics.join(", "))
            })
            .collect();
        let _ = writeln!(out, "**Regressed:** {}", names.join("; "));
        out.push('\n');
    }

    // Regressions, then the gated metrics that changed, largest first;
    // ungated metrics (sampling noise on whole-run values, mostly) are
    // only counted: they are in the report.
    let mut rows: Vec<(&BenchVerdict, &MetricComparison)> = compared
        .iter()
        .flat_map(|v| v.metrics.iter().map(move |m| (*v, m)))
        .filter(|(_, m)| m.regressed || (m.limit.is_some() && changed(m)))
        .collect();
    rows.sort_by(|(_, a), (_, b)| {
        b.regressed
            .cmp(&a.regressed)
            .then(size(b).total_cmp(&size(a)))
    });
    let ungated = compared
        .iter()
        .flat_map(|v| &v.metrics)
        .filter(|m| m.limit.is_none() && changed(m))
        .count();
    if rows.is_empty() {
        if !compared.is_empty() {
            let _ = writeln!(
                out,
                "No gated metric changed by {:.0}% or more.",
                NOTICEABLE * 100.0
            );
            out.push('\n');
        }
    } else {
        let _ = writeln!(
            out,
            "| | bench | metric | {} | {} | change | limit |",
            escape(&format!("baseline {baseline}")),
            escape(current)
        );
        out.push_str("|:--|:--|:--|--:|--:|--:|:--|\n");
        for (verdict, m) in rows.iter().take(MAX_ROWS) {
            row(&mut out, verdict, m);
        }
        out.push('\n');
        if rows.len() > MAX_ROWS {
            let _ = writeln!(
                out,
                "…and {} more changed metric{} in the report.",
                rows.len() - MAX_ROWS,
                if rows.len() - MAX_ROWS == 1 { "" } else { "s" }
            );
            out.push('\n');
        }
    }
    let new = verdicts.len() - compared.len();
    let mut notes = Vec::new();
    if new > 0 {
        notes.push(format!(
            "{new} bench{} not in the baseline (not compared)",
            if new == 1 { "" } else { "es" }
        ));
    }
    if compared.iter().any(|v| {
        v.metrics
            .iter()
            .any(|m| m.metric.per_run() && m.old.is_some())
    }) {
        notes.push(
            crate::gate::metric::PER_RUN_NOTE
                .replace("A_hat", "`A_hat`")
                .replace("misses_L1", "`misses_L1`")
                .replace("misses_L2", "`misses_L2`")
                .replace("misses_LLC", "`misses_LLC`"),
        );
    }
    let windows: Vec<u32> = compared.iter().filter_map(|v| v.window_k).collect();
    if !windows.is_empty() {
        notes
            .push("`dF`, `F_str_frac`, `F_irr_frac`: means over code windows (ΔF@W_c)".to_string());
    }
    notes.push(format!(
        "not listed: changes under {:.0}%{}",
        NOTICEABLE * 100.0,
        match ungated {
            0 => String::new(),
            n => format!(
                " and {n} change{} of ungated metrics (see the report)",
                if n == 1 { "" } else { "s" }
            ),
        }
    ));
    let _ = writeln!(out, "<sub>{}.</sub>", notes.join(" · "));
    if let Some(report) = report {
        out.push('\n');
        if report.contains("://") {
            let _ = writeln!(out, "Full report: [{}]({report})", escape(report));
        } else {
            let _ = writeln!(out, "Full report: `{report}`");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_characters_are_escaped() {
        assert_eq!(escape("irr|str*x_y"), r"irr\|str\*x\_y");
        assert_eq!(escape("a/b/c (d)"), "a/b/c (d)");
    }
}
