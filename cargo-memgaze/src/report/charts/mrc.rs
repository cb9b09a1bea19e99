//! (g) The whole-run miss-ratio curve: the share of loads a fully
//! associative LRU cache of each size misses on, against the cache size on
//! a log axis, with the machine's L1/L2/LLC sizes marked and a baseline
//! overlaid dashed.
//!
//! The curve is the whole-run view (spatially sampled blocks over the whole
//! run): it shows reuse farther apart than one trace window, which the
//! in-window reuse histogram cannot.

use super::style::*;
use anyhow::Result;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

/// One run's curve and the name the legend gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct MrcCurve {
    /// Legend label, e.g. `sampled (R = 1/128)`, `baseline main`.
    pub label: String,
    /// `(cache size in bytes, miss ratio in [0, 1])`, any order.
    pub points: Vec<(u64, f64)>,
}

/// A cache size marked on the chart: `(level, bytes)`, e.g. `("L2", 2 MiB)`.
pub type CacheMark = (&'static str, u64);

/// Renders the chart. The first curve is drawn solid (the run the report is
/// about), every further one dashed in another colour.
pub fn render(
    title: &str,
    subtitle: &str,
    curves: &[MrcCurve],
    marks: &[CacheMark],
) -> Result<String> {
    render_svg((900, 480), title, subtitle, |body| {
        draw(body, curves, marks)
    })
}

fn draw(body: &Area, curves: &[MrcCurve], marks: &[CacheMark]) -> Result<()> {
    let sizes = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.0))
        .chain(marks.iter().map(|m| m.1))
        .filter(|b| *b > 0);
    let (Some(lo), Some(hi)) = (sizes.clone().min(), sizes.max()) else {
        return draw_empty(body, "no miss-ratio curve: the run tracked no block");
    };
    if curves.iter().all(|c| c.points.is_empty()) {
        return draw_empty(body, "no miss-ratio curve: the run tracked no block");
    }
    let (plot, legend) = body.split_horizontally(body.dim_in_pixel().0 - 230);
    let x_lo = (lo as f64).log2().floor() - 0.5;
    let x_hi = (hi as f64).log2().ceil() + 0.5;
    let mut chart = ChartBuilder::on(&plot)
        .margin(8)
        .margin_right(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(x_lo..x_hi, 0f64..1.05)
        .map_err(plot_error)?;
    let span = (x_hi - x_lo) as usize;
    // Every power of two up to 12 ticks; every second one beyond.
    let every = if span > 12 { 2 } else { 1 };
    house_style(&mut chart.configure_mesh())
        .x_labels(span + 1)
        .x_label_formatter(&|x| {
            let k = x.round();
            if (x - k).abs() > 1e-6 || k < 0.0 || !(k as usize).is_multiple_of(every) {
                String::new()
            } else {
                format_bytes(1u64 << (k as u32).min(62))
            }
        })
        .y_labels(6)
        .y_label_formatter(&|v| format!("{v:.1}"))
        .x_desc("cache size (fully associative LRU, 64-byte blocks; log)")
        .y_desc("miss ratio")
        .draw()
        .map_err(plot_error)?;

    for (level, bytes) in marks.iter().filter(|m| m.1 > 0) {
        let x = (*bytes as f64).log2();
        chart
            .draw_series(DashedLineSeries::new(
                [(x, 0.0), (x, 1.05)],
                3,
                3,
                MUTED.stroke_width(1),
            ))
            .map_err(plot_error)?;
        let at = chart.backend_coord(&(x, 1.05));
        draw_text_at(
            &plot,
            format!("{level} {}", format_bytes(*bytes)),
            (at.0 + 4, at.1 + 2),
            text(12, &MUTED, HPos::Left, VPos::Top),
        )?;
    }

    let colors = [OKABE_BLUE, BASELINE_GREY, OKABE_ORANGE, OKABE_GREEN];
    for (i, curve) in curves.iter().enumerate() {
        let mut points: Vec<(f64, f64)> = curve
            .points
            .iter()
            .filter(|p| p.0 > 0)
            .map(|&(b, mr)| ((b as f64).log2(), mr.clamp(0.0, 1.0)))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = colors[i % colors.len()];
        super::windows::draw_line(&mut chart, &points, color, i)?;
    }

    let entries: Vec<(Swatch, String)> = curves
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let color = colors[i % colors.len()];
            let swatch = if i == 0 {
                Swatch::Line(color)
            } else {
                Swatch::Dashed(color)
            };
            (swatch, ellipsize(&c.label, 24))
        })
        .collect();
    draw_legend(&legend, (8, 24), &entries)?;
    legend
        .draw(&Text::new(
            "whole run",
            (8, 4),
            text(12, &MUTED, HPos::Left, VPos::Top),
        ))
        .map_err(plot_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_levels_and_overlays_a_baseline() {
        let curve = |label: &str, mr: f64| MrcCurve {
            label: label.into(),
            points: (6..=24).map(|k| (64u64 << k, mr / k as f64)).collect(),
        };
        let svg = render(
            "t",
            "s",
            &[curve("this run", 1.0), curve("baseline main", 0.5)],
            &[("L1", 48 << 10), ("L2", 2 << 20), ("LLC", 32 << 20)],
        )
        .unwrap();
        for label in [
            "L1 48 KiB",
            "L2 2 MiB",
            "LLC 32 MiB",
            "baseline main",
            "this run",
        ] {
            assert!(svg.contains(label), "{label} missing");
        }
        // A curve without points draws a note, not an empty axis.
        let empty = render(
            "t",
            "s",
            &[MrcCurve {
                label: "x".into(),
                points: vec![],
            }],
            &[],
        )
        .unwrap();
        assert!(empty.contains("tracked no block"));
    }
}
