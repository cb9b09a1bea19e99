//! From an [`Analysis`] to the plain inputs of the charts.

use super::charts::bars::{BarChart, BarPanel, ValueFormat};
use super::charts::reuse::{ReuseBin, ReuseSeries};
use super::charts::windows::{WindowCurve, WindowPoint};
use super::charts::{format_address, format_bytes, format_count, format_window};
use crate::gate::Metric;
use memgaze_analysis::{Analysis, ReuseHistogram, WindowRow};

/// A trace-window histogram as a chart curve.
pub fn window_curve(label: &str, rows: &[WindowRow]) -> WindowCurve {
    WindowCurve {
        label: label.to_string(),
        points: rows
            .iter()
            .filter(|r| r.windows > 0)
            .map(|r| WindowPoint {
                k: r.k,
                f: r.f,
                d_f: r.d_f,
                f_str: r.f_str,
                f_irr: r.f_irr,
                f_irr_frac: r.f_irr_frac,
            })
            .collect(),
    }
}

/// A reuse-distance histogram as a chart series.
pub fn reuse_series(label: &str, reuse: &ReuseHistogram) -> ReuseSeries {
    ReuseSeries {
        label: label.to_string(),
        bins: reuse
            .bins
            .iter()
            .map(|b| ReuseBin {
                lo: b.lo,
                hi: b.hi,
                count: b.count,
            })
            .collect(),
        cold: reuse.cold,
    }
}

/// How a run was recorded, in a few words.
pub fn recording(analysis: &Analysis) -> String {
    let run = &analysis.run;
    let how = if run.full {
        "full trace".to_string()
    } else {
        format!(
            "sampled: w = {}, period = {}",
            run.window.map_or("?".into(), |w| w.to_string()),
            run.period.map_or("?".into(), |p| p.to_string())
        )
    };
    format!("{how} · {} backend", run.backend)
}

/// The hottest functions (by `A`): accesses, code-window `ΔF` and
/// `F_str%`, with a baseline's values beside them (matched by name).
pub fn functions_chart(
    title: &str,
    analysis: &Analysis,
    baseline: Option<(&str, &Analysis)>,
    top: usize,
    run: &str,
) -> BarChart {
    let functions: Vec<_> = analysis
        .functions
        .iter()
        .filter(|f| f.a > 0)
        .take(top)
        .collect();
    let categories = functions.iter().map(|f| f.name.clone()).collect();
    let current =
        |get: &dyn Fn(&memgaze_analysis::FunctionMetrics) -> Option<f64>| -> Vec<Option<f64>> {
            functions.iter().map(|f| get(f)).collect()
        };
    let old = |get: &dyn Fn(&memgaze_analysis::FunctionMetrics) -> Option<f64>| -> Option<Vec<Option<f64>>> {
        let (_, base) = baseline?;
        Some(
            functions
                .iter()
                .map(|f| base.functions.iter().find(|b| b.name == f.name).and_then(get))
                .collect(),
        )
    };
    let values =
        |get: &dyn Fn(&memgaze_analysis::FunctionMetrics) -> Option<f64>| -> Vec<Vec<Option<f64>>> {
            match old(get) {
                Some(old) => vec![old, current(get)],
                None => vec![current(get)],
            }
        };
    let panels = vec![
        BarPanel {
            metric: "A (accesses)".into(),
            values: values(&|f| Some(f.a as f64)),
            format: ValueFormat::Count,
        },
        BarPanel {
            metric: "ΔF (code windows)".into(),
            values: values(&|f| f.d_f),
            format: ValueFormat::Decimal,
        },
        BarPanel {
            metric: "F_str% (code windows)".into(),
            values: values(&|f| f.f_str_frac),
            format: ValueFormat::Percent,
        },
    ];
    let shown = functions.len();
    BarChart {
        title: title.to_string(),
        subtitle: format!(
            "top {shown} of {} functions by accesses · ΔF and F_str% averaged over code windows of {} accesses",
            analysis.functions.len(),
            format_window(analysis.run.code_window_k)
        ),
        categories,
        series: match baseline {
            Some((name, _)) => vec![format!("baseline {name}"), run.into()],
            None => vec![run.into()],
        },
        baseline: baseline.map(|_| 0),
        panels,
    }
}

/// The hot regions of the location zoom tree: accesses, accesses per
/// 64-byte block and mean reuse distance.
pub fn regions_chart(title: &str, analysis: &Analysis, top: usize, run: &str) -> BarChart {
    let mut regions: Vec<_> = analysis.regions.iter().collect();
    regions.sort_by_key(|r| std::cmp::Reverse(r.a));
    regions.truncate(top);
    BarChart {
        title: title.to_string(),
        subtitle: format!(
            "top {} of {} hot regions by accesses (leaves of the location zoom tree, t = {}%)",
            regions.len(),
            analysis.regions.len(),
            analysis.run.region_threshold_percent
        ),
        categories: regions
            .iter()
            .map(|r| {
                format!(
                    "{} ({})",
                    format_address(r.start),
                    format_bytes(r.end - r.start)
                )
            })
            .collect(),
        series: vec![run.into()],
        baseline: None,
        panels: vec![
            BarPanel {
                metric: "A (accesses)".into(),
                values: vec![regions.iter().map(|r| Some(r.a as f64)).collect()],
                format: ValueFormat::Count,
            },
            BarPanel {
                metric: "A per 64-byte block".into(),
                values: vec![regions.iter().map(|r| Some(r.a_per_block)).collect()],
                format: ValueFormat::Decimal,
            },
            BarPanel {
                metric: "D (mean reuse distance)".into(),
                values: vec![regions.iter().map(|r| r.d_mean).collect()],
                format: ValueFormat::Decimal,
            },
        ],
    }
}

/// Old vs new per bench for the gated metrics: one panel per metric, one
/// row per bench, baseline bar above the current one.
pub fn baseline_chart(
    baseline: &str,
    run: &str,
    benches: &[(String, &Analysis, &Analysis)],
) -> BarChart {
    let metrics = [
        (Metric::DF, "ΔF (code windows)", ValueFormat::Decimal),
        (
            Metric::FIrrFrac,
            "F_irr% (code windows)",
            ValueFormat::Percent,
        ),
        (Metric::DMean, "D mean", ValueFormat::Decimal),
        (Metric::AHat, "Â (estimated loads)", ValueFormat::Count),
    ];
    let panels = metrics
        .iter()
        .map(|(metric, heading, format)| {
            let (mut old, mut new) = (Vec::new(), Vec::new());
            for (_, before, after) in benches {
                let k = crate::gate::metric::common_window_k(before, after);
                old.push(metric.value(before, k));
                new.push(metric.value(after, k));
            }
            BarPanel {
                metric: heading.to_string(),
                values: vec![old, new],
                format: *format,
            }
        })
        .collect();
    BarChart {
        title: format!("Baseline {baseline} vs {run}"),
        subtitle: format!(
            "{} bench{} · windowed metrics at the code-window size both runs have · grey: baseline",
            benches.len(),
            if benches.len() == 1 { "" } else { "es" }
        ),
        categories: benches.iter().map(|(name, _, _)| name.clone()).collect(),
        series: vec![format!("baseline {baseline}"), run.into()],
        baseline: Some(0),
        panels,
    }
}

/// `12.5K accesses in 312 samples`.
pub fn volume(analysis: &Analysis) -> String {
    format!(
        "{} accesses in {} sample{}",
        format_count(analysis.summary.a as f64),
        analysis.summary.samples,
        if analysis.summary.samples == 1 {
            ""
        } else {
            "s"
        }
    )
}
