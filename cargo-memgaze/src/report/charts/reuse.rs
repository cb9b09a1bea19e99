//! (b) The reuse-distance histogram: accesses per power-of-two bin of `D`
//! (`0`, `1`, `2–3`, `4–7`, …), as shares of the accesses that have a `D`,
//! one bar per run when several are compared.

use super::style::*;
use anyhow::Result;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

/// Accesses with `lo ≤ D ≤ hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReuseBin {
    /// Smallest D of the bin.
    pub lo: u64,
    /// Largest D of the bin.
    pub hi: u64,
    /// Accesses.
    pub count: u64,
}

/// One run's reuse-distance histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct ReuseSeries {
    /// Legend label.
    pub label: String,
    /// Bins, any order; empty bins may be left out.
    pub bins: Vec<ReuseBin>,
    /// Accesses without a D (first access to their block in the sample).
    pub cold: u64,
}

/// The label of the bin starting at `lo`: `0`, `1`, `2–3`, `4–7`, ….
pub fn bin_label(lo: u64, hi: u64) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{}–{}", format_count(lo as f64), format_count(hi as f64))
    }
}

/// Renders the histogram. Bars are shares of each run's accesses with a
/// D, so that runs with different access counts compare; the count of the
/// first run is written on each of its bars.
pub fn render(title: &str, subtitle: &str, series: &[ReuseSeries], block: u64) -> Result<String> {
    render_svg((900, 480), title, subtitle, |body| {
        draw(body, series, block)
    })
}

fn draw(body: &Area, series: &[ReuseSeries], block: u64) -> Result<()> {
    let mut bins: Vec<(u64, u64)> = series
        .iter()
        .flat_map(|s| s.bins.iter().filter(|b| b.count > 0).map(|b| (b.lo, b.hi)))
        .collect();
    bins.sort_unstable();
    bins.dedup();
    if bins.is_empty() {
        return draw_empty(
            body,
            "no reuse within any sample: every access is a first access",
        );
    }
    let shares: Vec<Vec<f64>> = series
        .iter()
        .map(|s| {
            // Saturating: counts come from files, and u64 sums overflow.
            let total = s.bins.iter().fold(0u64, |t, b| t.saturating_add(b.count));
            bins.iter()
                .map(|(lo, _)| {
                    let count = s
                        .bins
                        .iter()
                        .filter(|b| b.lo == *lo)
                        .fold(0u64, |t, b| t.saturating_add(b.count));
                    if total == 0 {
                        0.0
                    } else {
                        100.0 * count as f64 / total as f64
                    }
                })
                .collect()
        })
        .collect();
    let top = shares.iter().flatten().fold(0.0f64, |a, b| a.max(*b));
    let smallest = shares
        .iter()
        .flatten()
        .filter(|v| **v > 0.0)
        .fold(f64::INFINITY, |a, b| a.min(*b));
    let legend_width = if series.len() > 1 { 230 } else { 0 };
    let (plot, legend) = body.split_horizontally(body.dim_in_pixel().0 - legend_width);
    let n = bins.len();
    let x_desc = format!(
        "reuse distance D (distinct {block}-byte blocks since the last access to the block)"
    );
    let builder = || {
        let mut builder = ChartBuilder::on(&plot);
        builder
            .margin(8)
            .margin_right(16)
            .x_label_area_size(60)
            .y_label_area_size(72);
        builder
    };
    // One bin usually dominates (a scan reuses its line at D = 0 or 1):
    // on a linear axis the tail, where the misses are, would be invisible
    // slivers. Shares spanning more than two decades get a log axis.
    if top / smallest > 100.0 {
        let floor = smallest / 2.0;
        let mut chart = builder()
            .build_cartesian_2d(0f64..n as f64, (floor..top * 2.0).log_scale())
            .map_err(plot_error)?;
        house_style(&mut chart.configure_mesh())
            .disable_x_mesh()
            .x_labels(0)
            .y_labels(6)
            .y_label_formatter(&|v| format_percent(*v))
            .y_desc("share of accesses with a D (log)")
            .x_desc(x_desc)
            .draw()
            .map_err(plot_error)?;
        draw_bars(&mut chart, &plot, series, &bins, &shares, floor)?;
    } else {
        let mut chart = builder()
            .build_cartesian_2d(0f64..n as f64, 0f64..(top * 1.15).max(1.0))
            .map_err(plot_error)?;
        house_style(&mut chart.configure_mesh())
            .disable_x_mesh()
            .x_labels(0)
            .y_labels(6)
            .y_label_formatter(&|v| format!("{v:.0}%"))
            .y_desc("share of accesses with a D")
            .x_desc(x_desc)
            .draw()
            .map_err(plot_error)?;
        draw_bars(&mut chart, &plot, series, &bins, &shares, 0.0)?;
    }
    if series.len() > 1 {
        let entries: Vec<(Swatch, String)> = series
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    Swatch::Box(SERIES[i % SERIES.len()]),
                    ellipsize(&s.label, 24),
                )
            })
            .collect();
        draw_legend(&legend, (8, 24), &entries)?;
    }
    Ok(())
}

/// A share in percent with the digits a log axis needs: `50%`, `2.5%`,
/// `0.04%`.
fn format_percent(value: f64) -> String {
    if (value - value.round()).abs() <= 1e-6 * value {
        format!("{value:.0}%")
    } else if value >= 1.0 {
        format!("{value:.1}%")
    } else {
        // Ticks sit at powers of ten, computed with rounding error.
        let digits = (-(value.log10() + 1e-6).floor()) as usize;
        format!("{value:.digits$}%")
    }
}

/// The bars (one group per bin, one bar per run from `floor` up), the bin
/// labels under the axis and the first run's counts on its bars.
fn draw_bars<'a, Y>(
    chart: &mut ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, Y>,
    >,
    plot: &Area,
    series: &[ReuseSeries],
    bins: &[(u64, u64)],
    shares: &[Vec<f64>],
    floor: f64,
) -> Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    let n = bins.len();
    let group = 0.8 / series.len() as f64;
    for (s, values) in shares.iter().enumerate() {
        let color = SERIES[s % SERIES.len()];
        chart
            .draw_series(
                values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| **v > 0.0)
                    .map(|(i, v)| {
                        let x0 = i as f64 + 0.1 + group * s as f64;
                        Rectangle::new([(x0, floor), (x0 + group * 0.95, *v)], color.filled())
                    }),
            )
            .map_err(plot_error)?;
    }
    // Bin labels under the axis, centred on their group.
    let rotate = n > 12;
    for (i, (lo, hi)) in bins.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64 + 0.5, floor));
        let style = if rotate {
            text(12, &DARK, HPos::Right, VPos::Center).transform(FontTransform::Rotate270)
        } else {
            text(12, &DARK, HPos::Center, VPos::Top)
        };
        draw_text_at(plot, bin_label(*lo, *hi), (x, y + 6), style)?;
    }
    // The first run's counts on its bars.
    if let Some(first) = series.first() {
        for (i, (lo, _)) in bins.iter().enumerate() {
            let count = first
                .bins
                .iter()
                .filter(|b| b.lo == *lo)
                .fold(0u64, |t, b| t.saturating_add(b.count));
            if count == 0 || n > 24 {
                continue;
            }
            let x = i as f64 + 0.1 + group * 0.475;
            let (px, py) = chart.backend_coord(&(x, shares[0][i]));
            draw_text_at(
                plot,
                format_count(count as f64),
                (px, py - 3),
                text(11, &MUTED, HPos::Center, VPos::Bottom),
            )?;
        }
    }
    Ok(())
}
