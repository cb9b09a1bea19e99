//! (d) The classic access-pattern views per address: how often each
//! address is accessed, and the mean ± standard deviation of the distance
//! (in accesses) between consecutive accesses to it.

use super::style::*;
use crate::report::profile::AddressProfile;
use anyhow::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

/// Renders the two panels over a shared address axis.
pub fn render(title: &str, subtitle: &str, profile: &AddressProfile) -> Result<String> {
    render_svg((960, 640), title, subtitle, |body| draw(body, profile))
}

/// A y axis that is logarithmic when the values span more than two decades.
fn wants_log(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    (hi > 0.0 && hi / lo > 100.0).then_some((lo, hi))
}

fn draw(body: &Area, profile: &AddressProfile) -> Result<()> {
    let n = profile.bins.len();
    if n == 0 || profile.bins.iter().all(|b| b.accesses == 0) {
        return draw_empty(body, "no Strided or Irregular accesses in this trace");
    }
    let unit = if profile.per_address {
        "address"
    } else {
        "address range"
    };
    // Inter-access distance, mean ± std, where an address recurs within a
    // sample.
    let stats: Vec<(usize, f64, f64)> = profile
        .bins
        .iter()
        .enumerate()
        .filter_map(|(i, b)| Some((i, b.interval_mean?, b.interval_std.unwrap_or(0.0))))
        .collect();
    let height = body.dim_in_pixel().1;
    // Without distances the lower panel would be an empty box between the
    // bars and their address labels: the bars take the space, the labels
    // go right under them and a one-line note says why there is no panel.
    let (upper, lower) = if stats.is_empty() {
        body.split_vertically(height - 130)
    } else {
        body.split_vertically(height * 46 / 100)
    };
    let (upper_axis, note) = lower.split_vertically(80);
    let x_range = 0f64..n as f64;

    // Accesses.
    let counts: Vec<f64> = profile.bins.iter().map(|b| b.accesses as f64).collect();
    let log = wants_log(counts.iter().copied());
    let top = counts.iter().fold(0.0f64, |a, b| a.max(*b));
    let y_desc = format!("accesses per {unit}");
    if let Some((lo, hi)) = log {
        let mut chart = ChartBuilder::on(&upper)
            .margin(8)
            .margin_right(16)
            .x_label_area_size(10)
            .y_label_area_size(80)
            .build_cartesian_2d(x_range.clone(), (lo / 2.0..hi * 2.0).log_scale())
            .map_err(plot_error)?;
        mesh(&mut chart, &format!("{y_desc} (log)"))?;
        chart
            .draw_series(
                counts
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| **c > 0.0)
                    .map(|(i, c)| {
                        Rectangle::new(
                            [(i as f64 + 0.1, lo / 2.0), (i as f64 + 0.9, *c)],
                            OKABE_BLUE.filled(),
                        )
                    }),
            )
            .map_err(plot_error)?;
        separators(&mut chart, profile, lo / 2.0, hi * 2.0)?;
        if stats.is_empty() {
            range_labels(body, &upper_axis, &chart, profile, lo / 2.0)?;
        }
    } else {
        let mut chart = ChartBuilder::on(&upper)
            .margin(8)
            .margin_right(16)
            .x_label_area_size(10)
            .y_label_area_size(80)
            .build_cartesian_2d(x_range.clone(), 0f64..top * 1.1)
            .map_err(plot_error)?;
        mesh(&mut chart, &y_desc)?;
        chart
            .draw_series(
                counts
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| **c > 0.0)
                    .map(|(i, c)| {
                        Rectangle::new(
                            [(i as f64 + 0.1, 0.0), (i as f64 + 0.9, *c)],
                            OKABE_BLUE.filled(),
                        )
                    }),
            )
            .map_err(plot_error)?;
        separators(&mut chart, profile, 0.0, top * 1.1)?;
        if stats.is_empty() {
            range_labels(body, &upper_axis, &chart, profile, 0.0)?;
        }
    }

    let y_desc = "distance between accesses: mean ± std";
    let (lower_plot, x_axis) = lower.split_vertically(lower.dim_in_pixel().1 - 70);
    if stats.is_empty() {
        draw_empty(
            &note,
            "no address was accessed twice within a sample, so no distances between accesses to plot",
        )?;
    } else {
        let hi = stats.iter().map(|(_, m, s)| m + s).fold(0.0f64, f64::max);
        let log = wants_log(stats.iter().map(|(_, m, _)| *m));
        let (y0, y1) = match log {
            Some((lo, _)) => (lo / 2.0, hi * 2.0),
            None => (0.0, hi * 1.1 + 1.0),
        };
        if log.is_some() {
            let mut chart = ChartBuilder::on(&lower_plot)
                .margin(8)
                .margin_right(16)
                .x_label_area_size(4)
                .y_label_area_size(80)
                .build_cartesian_2d(x_range.clone(), (y0..y1).log_scale())
                .map_err(plot_error)?;
            mesh(&mut chart, &format!("{y_desc} (log)"))?;
            error_bars(&mut chart, &stats, y0)?;
            separators(&mut chart, profile, y0, y1)?;
            range_labels(body, &x_axis, &chart, profile, y0)?;
        } else {
            let mut chart = ChartBuilder::on(&lower_plot)
                .margin(8)
                .margin_right(16)
                .x_label_area_size(4)
                .y_label_area_size(80)
                .build_cartesian_2d(x_range, y0..y1)
                .map_err(plot_error)?;
            mesh(&mut chart, y_desc)?;
            error_bars(&mut chart, &stats, y0)?;
            separators(&mut chart, profile, y0, y1)?;
            range_labels(body, &x_axis, &chart, profile, y0)?;
        }
    }
    Ok(())
}

fn mesh<'a, Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    y_desc: &str,
) -> Result<()> {
    house_style(&mut chart.configure_mesh())
        .disable_x_mesh()
        .x_labels(0)
        .y_labels(6)
        .y_label_formatter(&|v| format_count(*v))
        .y_desc(y_desc)
        .draw()
        .map_err(plot_error)
}

fn error_bars<'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    stats: &[(usize, f64, f64)],
    floor: f64,
) -> Result<()> {
    let thin = stats.len() > 120;
    for &(i, mean, std) in stats {
        let x = i as f64 + 0.5;
        let lo = (mean - std).max(floor);
        let hi = mean + std;
        if std > 0.0 {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x, lo), (x, hi)],
                    OKABE_VERMILLION.mix(0.7).stroke_width(1),
                )))
                .map_err(plot_error)?;
            if !thin {
                for y in [lo, hi] {
                    chart
                        .draw_series(std::iter::once(PathElement::new(
                            vec![(x - 0.3, y), (x + 0.3, y)],
                            OKABE_VERMILLION.mix(0.7).stroke_width(1),
                        )))
                        .map_err(plot_error)?;
                }
            }
        }
        chart
            .draw_series(std::iter::once(Circle::new(
                (x, mean),
                if thin { 2 } else { 3 },
                OKABE_VERMILLION.filled(),
            )))
            .map_err(plot_error)?;
    }
    Ok(())
}

/// Vertical lines where one touched range ends and the next begins.
fn separators<'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    profile: &AddressProfile,
    y0: f64,
    y1: f64,
) -> Result<()> {
    for range in profile.axis.ranges.iter().skip(1) {
        let x = range.first as f64;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, y0), (x, y1)],
                MUTED.mix(0.6).stroke_width(1),
            )))
            .map_err(plot_error)?;
    }
    Ok(())
}

/// Labels under the x axis: each range's first address and its size (on
/// `body`, so that they are not clipped to `area`, which holds the axis
/// description below them).
fn range_labels<'a, Y: Ranged<ValueType = f64>>(
    body: &Area,
    area: &Area,
    chart: &ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    profile: &AddressProfile,
    y0: f64,
) -> Result<()> {
    let mut next_free = i32::MIN;
    for range in &profile.axis.ranges {
        let (x, y) = chart.backend_coord(&(range.first as f64, y0));
        if x < next_free {
            continue;
        }
        draw_text_at(
            body,
            format_address(range.start),
            (x + 2, y + 6),
            text(12, &DARK, HPos::Left, VPos::Top),
        )?;
        draw_text_at(
            body,
            format!("{} range", format_bytes(range.end - range.start)),
            (x + 2, y + 22),
            text(11, &MUTED, HPos::Left, VPos::Top),
        )?;
        next_free = x + 130;
    }
    let (w, _) = area.dim_in_pixel();
    let desc = match profile.distinct {
        Some(distinct) if profile.per_address => {
            format!("address ({distinct} distinct, in address order; touched ranges left to right)")
        }
        _ => format!(
            "address (touched ranges left to right, pooled into {} bins)",
            profile.bins.len()
        ),
    };
    area.draw(&Text::new(
        desc,
        (w as i32 / 2, 48),
        text(14, &DARK, HPos::Center, VPos::Top),
    ))
    .map_err(plot_error)?;
    Ok(())
}
