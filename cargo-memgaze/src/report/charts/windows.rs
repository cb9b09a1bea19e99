//! (a) The trace-window histogram: `F`, `F_str`, `F_irr` (log scale) and
//! `ΔF` with the irregular share `F_irr%` (both in `[0, 1]`) against the
//! window size `2^k`, with other runs (the full-trace golden, a baseline)
//! overlaid as dashed curves.
//!
//! `F_irr%` repeats what `F_str`/`F_irr` show, on a linear axis: when one
//! of them dominates, the log panel draws it on top of `F`, and a switch
//! from strided to irregular access is only visible as a colour change.

use super::style::*;
use anyhow::Result;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

/// One row of a trace-window histogram: metrics averaged over the windows
/// of `2^k` accesses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowPoint {
    /// Window size exponent.
    pub k: u32,
    /// Mean footprint.
    pub f: f64,
    /// Mean footprint growth `ΔF`.
    pub d_f: f64,
    /// Mean strided footprint.
    pub f_str: f64,
    /// Mean irregular footprint.
    pub f_irr: f64,
    /// Mean irregular share of the footprint, `F_irr / F`, in `[0, 1]`.
    pub f_irr_frac: f64,
}

/// One run's histogram and the name the legend gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowCurve {
    /// Legend label, e.g. `sampled`, `full trace (golden)`, `baseline main`.
    pub label: String,
    /// Rows, any order.
    pub points: Vec<WindowPoint>,
}

/// Renders the chart. The first curve is drawn solid (the run the report is
/// about); every further one dashed, in the same metric colours, so that an
/// overlay reads as "the same metric, another run".
pub fn render(title: &str, subtitle: &str, curves: &[WindowCurve]) -> Result<String> {
    render_svg((900, 620), title, subtitle, |body| draw(body, curves))
}

const METRICS: [(&str, RGBColor); 3] = [
    ("F", OKABE_BLUE),
    ("F_str", OKABE_GREEN),
    ("F_irr", OKABE_VERMILLION),
];

fn draw(body: &Area, curves: &[WindowCurve]) -> Result<()> {
    let ks = curves.iter().flat_map(|c| c.points.iter().map(|p| p.k));
    let (Some(k_min), Some(k_max)) = (ks.clone().min(), ks.max()) else {
        return draw_empty(body, "no window of 8 or more accesses in any sample");
    };
    let (plots, legend) = body.split_horizontally(body.dim_in_pixel().0 - 230);
    let height = plots.dim_in_pixel().1;
    let (upper, lower) = plots.split_vertically(height * 58 / 100);

    let x_range = k_min as f64 - 0.5..k_max as f64 + 0.5;
    let x_labels = (k_max - k_min + 1) as usize;
    let every = if x_labels > 12 { 2 } else { 1 };
    let x_format = move |x: &f64| {
        let k = x.round();
        if (x - k).abs() > 1e-6
            || k < 0.0
            || !(k as u32).saturating_sub(k_min).is_multiple_of(every)
        {
            String::new()
        } else {
            format_window(k as u32)
        }
    };

    // Footprints: log scale, they span 8 … 2^20 over the window sizes.
    let positive = curves
        .iter()
        .flat_map(|c| c.points.iter())
        .flat_map(|p| [p.f, p.f_str, p.f_irr])
        .filter(|v| *v > 0.0);
    let y_min = positive.clone().fold(f64::INFINITY, f64::min);
    let y_max = positive.fold(0.0, f64::max);
    let (y_min, y_max) = if y_max > 0.0 {
        (y_min / 1.6, y_max * 1.6)
    } else {
        (0.5, 10.0)
    };
    let mut chart = ChartBuilder::on(&upper)
        .margin(8)
        .margin_right(16)
        .x_label_area_size(28)
        .y_label_area_size(72)
        .build_cartesian_2d(x_range.clone(), (y_min..y_max).log_scale())
        .map_err(plot_error)?;
    house_style(&mut chart.configure_mesh())
        .x_labels(x_labels)
        .x_label_formatter(&x_format)
        .y_label_formatter(&|v| format_count(*v))
        .y_desc("footprint (distinct addresses, log)")
        .draw()
        .map_err(plot_error)?;
    for (i, curve) in curves.iter().enumerate() {
        let mut points = curve.points.clone();
        points.sort_by_key(|p| p.k);
        for (m, (_, color)) in METRICS.iter().enumerate() {
            let series: Vec<(f64, f64)> = points
                .iter()
                .map(|p| (p.k as f64, [p.f, p.f_str, p.f_irr][m]))
                .collect();
            // A zero has no place on a log axis: it breaks the line.
            for run in series.split(|(_, v)| *v <= 0.0).filter(|r| !r.is_empty()) {
                draw_line(&mut chart, run, *color, i)?;
            }
        }
    }

    // Footprint growth and the irregular share live in [0, 1]: a linear
    // axis of their own.
    let d_max = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.d_f.max(p.f_irr_frac)))
        .fold(0.0, f64::max);
    let d_top = if d_max > 0.5 {
        1.05
    } else {
        (d_max * 1.25).max(0.01)
    };
    // One precision for every tick (`0.2 … 1.0`, not `0.800` next to
    // `1.00`): enough decimals for a tick step of about a fifth of the axis.
    let decimals = (-(d_top / 5.0).log10()).ceil().max(1.0) as usize;
    let mut chart = ChartBuilder::on(&lower)
        .margin(8)
        .margin_right(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(x_range, 0f64..d_top)
        .map_err(plot_error)?;
    house_style(&mut chart.configure_mesh())
        .x_labels(x_labels)
        .x_label_formatter(&x_format)
        .y_label_formatter(&|v| format!("{v:.decimals$}"))
        .y_labels(6)
        .x_desc("window size (accesses; 1K = 1024)")
        .y_desc("ΔF, F_irr share")
        .draw()
        .map_err(plot_error)?;
    for (i, curve) in curves.iter().enumerate() {
        let mut points = curve.points.clone();
        points.sort_by_key(|p| p.k);
        let d_f: Vec<(f64, f64)> = points.iter().map(|p| (p.k as f64, p.d_f)).collect();
        draw_line(&mut chart, &d_f, OKABE_PURPLE, i)?;
        let share: Vec<(f64, f64)> = points.iter().map(|p| (p.k as f64, p.f_irr_frac)).collect();
        draw_line(&mut chart, &share, OKABE_ORANGE, i)?;
    }

    let mut entries: Vec<(Swatch, String)> = METRICS
        .iter()
        .map(|(name, color)| (Swatch::Line(*color), name.to_string()))
        .collect();
    entries.push((Swatch::Line(OKABE_PURPLE), "ΔF (new data per load)".into()));
    entries.push((Swatch::Line(OKABE_ORANGE), "F_irr% (share of F)".into()));
    draw_legend(&legend, (8, 24), &entries)?;
    if curves.len() > 1 {
        let y = 24 + 20 * entries.len() as i32 + 16;
        let runs: Vec<(Swatch, String)> = curves
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let swatch = if i == 0 {
                    Swatch::Line(DARK)
                } else {
                    Swatch::Dashed(DARK)
                };
                (swatch, ellipsize(&c.label, 24))
            })
            .collect();
        draw_legend(&legend, (8, y), &runs)?;
    }
    legend
        .draw(&Text::new(
            "mean over windows",
            (8, 4),
            text(12, &MUTED, HPos::Left, VPos::Top),
        ))
        .map_err(plot_error)?;
    Ok(())
}

/// Draws one curve: solid with point markers for the main run, dashed for
/// overlays.
pub(super) fn draw_line<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    points: &[(f64, f64)],
    color: RGBColor,
    curve: usize,
) -> Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    if curve == 0 {
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(plot_error)?;
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(plot_error)?;
    } else {
        chart
            .draw_series(DashedLineSeries::new(
                points.iter().copied(),
                6,
                4,
                color.mix(0.85).stroke_width(2),
            ))
            .map_err(plot_error)?;
    }
    Ok(())
}
