//! The short Markdown summary of a comparison with a baseline
//! (`--summary-md FILE`): what a pull-request comment or a CI job summary
//! shows. The first line says whether anything regressed and names the
//! regressed benches; one GitHub-flavoured Markdown table follows with the
//! regressions first, then the other gated metrics that changed, each with
//! an arrow, old and new value and its limit; the last line points at the
//! full report.

use crate::gate::metric::Metric;
use crate::gate::{BenchVerdict, Change, MetricComparison};
use std::fmt::Write as _;

/// Rows of the table at most; the rest are counted under it.
pub const MAX_ROWS: usize = 20;

/// A change smaller than this share of the old value (or, from 0, in
/// absolute terms; for an [`absolute_fraction`], in absolute terms always)
/// is "unchanged" and left out of the table.
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

/// Whether `metric` is a fraction whose changes the gate's default limits
/// measure in absolute terms (`F_irr_frac +0.1`, `MR_L1 +0.02`): a move from
/// 1e-6 to 2e-6 doubles it and means nothing.
fn absolute_fraction(metric: Metric) -> bool {
    matches!(
        metric,
        Metric::AConstFrac
            | Metric::FStrFrac
            | Metric::FIrrFrac
            | Metric::MrL1
            | Metric::MrL2
            | Metric::MrLlc
    )
}

/// How much a metric moved, in the unit [`NOTICEABLE`] is in: the absolute
/// change of an [`absolute_fraction`] or from 0, else the relative one.
/// `None` unless both sides have a value: a value that appeared or vanished
/// (a whole-run curve empty on one side) was not compared, and is named in
/// a note instead of a row (see [`one_sided`]).
fn size(m: &MetricComparison) -> Option<f64> {
    let (old, new) = (m.old?, m.new?);
    let c = Change::between(old, new);
    Some(if absolute_fraction(m.metric) {
        c.absolute.abs()
    } else {
        c.relative.unwrap_or(c.absolute).abs()
    })
}

/// Whether a metric moved enough to list.
fn changed(m: &MetricComparison) -> bool {
    size(m).is_some_and(|s| s >= NOTICEABLE)
}

/// How a row writes its two values: one format for both, so that they
/// read alike.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scale {
    /// Fixed decimals.
    Decimals(usize),
    /// Divided by a power of 1000 and suffixed (`K`, `M`, `G`), with these
    /// decimals.
    Suffixed(f64, &'static str, usize),
    /// Scientific notation (magnitudes below 0.001).
    Exponent,
}

impl Scale {
    /// The scale of `metric`'s values `values`: three decimals for an
    /// [`absolute_fraction`], else chosen by the largest magnitude.
    fn of(metric: Metric, values: &[Option<f64>]) -> Scale {
        if absolute_fraction(metric) {
            return Scale::Decimals(3);
        }
        let a = values.iter().flatten().map(|v| v.abs()).fold(0.0, f64::max);
        let suffixed =
            |unit: f64, suffix| Scale::Suffixed(unit, suffix, usize::from(a / unit < 100.0));
        if a >= 1e9 {
            suffixed(1e9, "G")
        } else if a >= 1e6 {
            suffixed(1e6, "M")
        } else if a >= 1e4 {
            suffixed(1e3, "K")
        } else if a >= 100.0 {
            Scale::Decimals(0)
        } else if a >= 10.0 {
            Scale::Decimals(1)
        } else if a >= 1.0 {
            Scale::Decimals(2)
        } else if a >= 0.001 || a == 0.0 {
            Scale::Decimals(3)
        } else {
            Scale::Exponent
        }
    }

    /// `old` and `new` of `metric` in one format ([`Scale::of`] both),
    /// except that a nonzero value which would read as zero at the larger
    /// one's scale (`6` beside `2.0M`, not `0.0M`) is written at its own.
    fn format_pair(metric: Metric, old: Option<f64>, new: Option<f64>) -> (String, String) {
        let shared = Scale::of(metric, &[old, new]);
        let one = |value: Option<f64>| {
            let text = shared.format(value);
            let reads_zero = !text.chars().any(|c| c.is_ascii_digit() && c != '0');
            match value {
                Some(v) if v != 0.0 && reads_zero => Scale::of(metric, &[value]).format(value),
                _ => text,
            }
        };
        (one(old), one(new))
    }

    fn format(self, value: Option<f64>) -> String {
        let Some(v) = value else {
            return "–".to_string();
        };
        match self {
            Scale::Decimals(d) => format!("{v:.d$}"),
            Scale::Suffixed(unit, suffix, d) => format!("{:.d$}{suffix}", v / unit),
            Scale::Exponent => format!("{v:.1e}"),
        }
    }
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
    let (old, new) = Scale::format_pair(m.metric, m.old, m.new);
    let _ = writeln!(
        out,
        "| {status} | {} | `{}` | {} | {} | {} | {} |",
        escape(&verdict.bench.to_string()),
        m.metric,
        old,
        new,
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
            .then(size(b).unwrap_or(0.0).total_cmp(&size(a).unwrap_or(0.0)))
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
        "not listed: changes under {:.0}% (of `F_*_frac`, `A_const_frac` and `MR_*`: under {NOTICEABLE} in absolute terms){}",
        NOTICEABLE * 100.0,
        match ungated {
            0 => String::new(),
            n => format!(
                " and {n} change{} of ungated metrics (see the report)",
                if n == 1 { "" } else { "s" }
            ),
        }
    ));
    notes.extend(one_sided(&compared, baseline, current, report.is_some()));
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

/// Benches named in a [`one_sided`] note at most; the rest are counted.
const MAX_ONE_SIDED_BENCHES: usize = 3;

/// Notes naming the metrics that have a value on one side only, e.g. the
/// `MR_*` of a bench whose baseline curve was empty (no spatially sampled
/// block touched): they were not compared, so they are neither a change
/// nor a regression, but a reader of the table must not take their absence
/// for "unchanged". One note per side and set of metrics, naming its
/// benches; `report` says whether a full report (whose bench pages give
/// the reason) was written.
fn one_sided(
    compared: &[&BenchVerdict],
    baseline: &str,
    current: &str,
    report: bool,
) -> Vec<String> {
    // Whether the baseline has no value, and the metrics: benches with the
    // same gap share a note.
    type Gap = (bool, Vec<Metric>);
    let mut groups: Vec<(Gap, Vec<String>)> = Vec::new();
    for verdict in compared {
        for missing_old in [true, false] {
            let metrics: Vec<Metric> = verdict
                .metrics
                .iter()
                .filter(|m| m.old.is_some() != m.new.is_some() && m.old.is_none() == missing_old)
                .map(|m| m.metric)
                .collect();
            if metrics.is_empty() {
                continue;
            }
            let key = (missing_old, metrics);
            let bench = escape(&verdict.bench.to_string());
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, benches)) => benches.push(bench),
                None => groups.push((key, vec![bench])),
            }
        }
    }
    groups
        .into_iter()
        .map(|((missing_old, metrics), benches)| {
            let names: Vec<String> = metrics.iter().map(|m| format!("`{m}`")).collect();
            let shown = benches.len().min(MAX_ONE_SIDED_BENCHES);
            let mut of = benches[..shown].join(", ");
            if benches.len() > shown {
                let _ = write!(of, " and {} more", benches.len() - shown);
            }
            let side = if missing_old {
                escape(&format!("baseline {baseline}"))
            } else {
                escape(current)
            };
            format!(
                "not compared: {} of {of} (no value in {side}{})",
                names.join(", "),
                if report {
                    "; the report's bench notes say why"
                } else {
                    ""
                }
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cargo::BenchKey;
    use crate::gate::{Direction, Limit};

    fn compared(metric: Metric, old: f64, new: f64, limit: Option<Limit>) -> MetricComparison {
        MetricComparison {
            metric,
            old: Some(old),
            new: Some(new),
            limit,
            regressed: false,
        }
    }

    fn limit(relative: Option<f64>, absolute: Option<f64>) -> Option<Limit> {
        Some(Limit {
            direction: Direction::Increase,
            relative,
            absolute,
        })
    }

    /// A tiny move of a fraction (1e-6 of `F_irr_frac`, which doubles it)
    /// is not a change; a row writes its two values alike (`1.000` and
    /// `0.950`, not `1.00` and `0.950`; `50.0K` and `50.6K`, not `50K`).
    #[test]
    fn rows_list_noticeable_changes_in_one_format() {
        let verdict = BenchVerdict {
            bench: BenchKey::new("p", "t", "b"),
            metrics: vec![
                compared(Metric::FIrrFrac, 1e-6, 2e-6, limit(None, Some(0.1))),
                compared(Metric::MrL1, 0.5, 0.505, limit(None, Some(0.02))),
                compared(Metric::FStrFrac, 1.0, 0.95, limit(None, Some(0.1))),
                compared(Metric::DF, 1.0, 0.94, limit(Some(0.1), Some(0.02))),
                compared(Metric::MissesL1, 50_000.0, 50_600.0, limit(Some(0.1), None)),
                compared(Metric::AHat, 120.0, 120.5, limit(Some(0.1), None)),
                compared(Metric::DMean, 0.0004, 0.0002, None),
                compared(Metric::AConstFrac, 1e-6, 3e-6, None),
            ],
            regressions: Vec::new(),
            window_k: None,
            has_baseline: true,
            notes: Vec::new(),
        };
        let text = markdown("main", "this run", &[verdict], None);
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("|  |")).collect();
        assert_eq!(
            rows,
            [
                "|  | p/t/b | `dF` | 1.00 | 0.94 | ↓ -6.0% | +10% and +0.02 |",
                "|  | p/t/b | `F_str_frac` | 1.000 | 0.950 | ↓ -0.05 | +0.1 |",
                "|  | p/t/b | `misses_L1` | 50.0K | 50.6K | ↑ +1.2% | +10% |",
            ],
            "{text}"
        );
        assert!(
            text.contains("and 1 change of ungated metrics"),
            "D_mean halved is counted, A_const_frac's 2e-6 is not: {text}"
        );
    }

    /// A metric with a value on one side only (the baseline's whole-run
    /// curve was empty, so its `MR_*` were not estimated) was not compared:
    /// no row with a dash and no change, but a note naming it and the side
    /// without a value, benches with the same gap named together.
    #[test]
    fn metrics_without_a_baseline_value_are_named_in_a_note_not_a_row() {
        let one_sided = |bench: &str| BenchVerdict {
            bench: BenchKey::new("p", "t", bench),
            metrics: vec![
                compared(Metric::DF, 0.5, 1.0, limit(Some(0.1), Some(0.02))),
                MetricComparison {
                    metric: Metric::MrL1,
                    old: None,
                    new: Some(0.25),
                    limit: limit(None, Some(0.02)),
                    regressed: false,
                },
                MetricComparison {
                    metric: Metric::MissesL1,
                    old: None,
                    new: Some(5e5),
                    limit: limit(Some(0.1), None),
                    regressed: false,
                },
                MetricComparison {
                    metric: Metric::DMean,
                    old: Some(1.5),
                    new: None,
                    limit: None,
                    regressed: false,
                },
            ],
            regressions: Vec::new(),
            window_k: None,
            has_baseline: true,
            notes: Vec::new(),
        };
        let text = markdown(
            "main",
            "this run",
            &[one_sided("a"), one_sided("b")],
            Some("r/index.html"),
        );
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("|  |")).collect();
        assert_eq!(
            rows,
            [
                "|  | p/t/a | `dF` | 0.50 | 1.00 | ↑ +100.0% | +10% and +0.02 |",
                "|  | p/t/b | `dF` | 0.50 | 1.00 | ↑ +100.0% | +10% and +0.02 |",
            ],
            "{text}"
        );
        assert!(
            text.contains(
                "not compared: `MR_L1`, `misses_L1` of p/t/a, p/t/b (no value in baseline main; \
                 the report's bench notes say why) · not compared: `D_mean` of p/t/a, p/t/b \
                 (no value in this run; the report's bench notes say why)."
            ),
            "{text}"
        );
        assert!(!text.contains("change of ungated"), "{text}");
        let many: Vec<BenchVerdict> = ["a", "b", "c", "d", "e"].map(one_sided).into();
        let text = markdown("main", "this run", &many, None);
        assert!(
            text.contains(
                "not compared: `MR_L1`, `misses_L1` of p/t/a, p/t/b, p/t/c and 2 more \
                 (no value in baseline main)"
            ),
            "{text}"
        );
    }

    #[test]
    fn scales_are_shared_by_both_values() {
        let of = |metric, old, new| {
            let scale = Scale::of(metric, &[Some(old), Some(new)]);
            (scale.format(Some(old)), scale.format(Some(new)))
        };
        assert_eq!(
            of(Metric::AHat, 9_990.0, 10_010.0),
            ("10.0K".into(), "10.0K".into())
        );
        assert_eq!(of(Metric::AHat, 2.4e6, 250e6), ("2M".into(), "250M".into()));
        assert_eq!(
            of(Metric::DF, 0.0012, 0.002),
            ("0.001".into(), "0.002".into())
        );
        assert_eq!(
            of(Metric::DF, 0.0005, 0.0002),
            ("5.0e-4".into(), "2.0e-4".into())
        );
        assert_eq!(
            of(Metric::MrLlc, 0.0, 1.0),
            ("0.000".into(), "1.000".into())
        );
        assert_eq!(Scale::of(Metric::DF, &[None, None]).format(None), "–");
        // A value that would read 0.0M beside 2.0M keeps its own scale.
        assert_eq!(
            Scale::format_pair(Metric::AHat, Some(6.0), Some(2_000_004.0)),
            ("6.00".into(), "2.0M".into())
        );
        assert_eq!(
            Scale::format_pair(Metric::AHat, Some(0.0), Some(2_000_004.0)),
            ("0.0M".into(), "2.0M".into())
        );
    }

    #[test]
    fn special_characters_are_escaped() {
        assert_eq!(escape("irr|str*x_y"), r"irr\|str\*x\_y");
        assert_eq!(escape("a/b/c (d)"), "a/b/c (d)");
    }
}
