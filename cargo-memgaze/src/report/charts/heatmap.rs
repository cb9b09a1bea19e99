//! (c) Time × address heatmap of accesses (the view Daptrace and DAMON
//! users know): darker cells hold more accesses; the address axis shows
//! only the touched ranges, each labelled, with the gaps between them cut
//! out.

use super::style::*;
use crate::report::profile::{AddressAxis, Heatmap};
use anyhow::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};
use std::fmt::Write as _;

/// Colour steps between "one access" and the fullest cell.
const LEVELS: usize = 10;
/// Lightest and darkest colours (ColorBrewer "Blues" ends).
const LIGHT: (f64, f64, f64) = (222.0, 235.0, 247.0);
const DARKEST: (f64, f64, f64) = (8.0, 48.0, 107.0);

/// The colour of a level in `1..=LEVELS`.
fn level_color(level: usize) -> RGBColor {
    let t = if LEVELS > 1 {
        (level - 1) as f64 / (LEVELS - 1) as f64
    } else {
        1.0
    };
    let mix = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    RGBColor(
        mix(LIGHT.0, DARKEST.0),
        mix(LIGHT.1, DARKEST.1),
        mix(LIGHT.2, DARKEST.2),
    )
}

/// The level of a cell count on a log scale up to `max` (0 for empty cells).
fn level(count: u32, max: u32) -> usize {
    if count == 0 {
        return 0;
    }
    if max <= 1 {
        return LEVELS;
    }
    let t = (count as f64).ln() / (max as f64).ln();
    1 + ((t * (LEVELS - 1) as f64).round() as usize).min(LEVELS - 1)
}

/// The smallest and largest cell counts drawn at level `l` (empty when
/// `lower > upper`: no count maps to it).
fn level_bounds(l: usize, max: u32) -> (u32, u32) {
    let lowest = |l: usize| -> u32 {
        if l <= 1 {
            1
        } else if l > LEVELS {
            max + 1
        } else {
            // level(c) ≥ l  ⇔  ln c / ln max ≥ (l − 1.5) / (LEVELS − 1)
            let mut c = (max as f64)
                .powf((l as f64 - 1.5) / (LEVELS - 1) as f64)
                .floor() as u32;
            c = c.max(1);
            while c <= max && level(c, max) < l {
                c += 1;
            }
            while c > 1 && level(c - 1, max) >= l {
                c -= 1;
            }
            c
        }
    };
    (lowest(l), lowest(l + 1) - 1)
}

/// Renders the heatmap. `time_desc` names the x axis (e.g. "time (sampled
/// accesses in trace order)").
pub fn render(title: &str, subtitle: &str, heatmap: &Heatmap, time_desc: &str) -> Result<String> {
    render_svg_with_overlay((960, 600), title, subtitle, |body| {
        draw(body, heatmap, time_desc)
    })
}

fn draw(body: &Area, map: &Heatmap, time_desc: &str) -> Result<String> {
    let max = map.cells.iter().copied().max().unwrap_or(0);
    if max == 0 || map.axis.ranges.is_empty() {
        draw_empty(body, "no Strided or Irregular accesses in this trace")?;
        return Ok(String::new());
    }
    let (plot, scale) = body.split_horizontally(body.dim_in_pixel().0 - 120);
    // The x axis counts accesses; a column spans `width` of them.
    let accesses = map.accesses as f64;
    let width = accesses / map.columns as f64;
    let mut chart = ChartBuilder::on(&plot)
        .margin(8)
        .margin_right(12)
        .x_label_area_size(44)
        .y_label_area_size(150)
        .build_cartesian_2d(0f64..accesses, 0f64..map.rows as f64)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .y_labels(0)
        .x_labels(8)
        .x_label_formatter(&|x| format_count(*x))
        .x_desc(time_desc)
        .y_desc("address, growing upward (touched ranges; gaps cut out)")
        .axis_desc_style((FONT, 14))
        .label_style((FONT, 12))
        .draw()
        .map_err(plot_error)?;

    // Cells, with equal neighbours in a row merged, as one path per colour
    // level: a strided sweep or a uniform irregular region costs a few
    // path commands instead of one element per cell.
    let mut paths = vec![String::new(); LEVELS + 1];
    for row in 0..map.rows {
        let mut column = 0;
        while column < map.columns {
            let l = level(map.cell(row, column), max);
            let mut end = column + 1;
            while end < map.columns && level(map.cell(row, end), max) == l {
                end += 1;
            }
            if l > 0 {
                let (x0, y0) = chart.backend_coord(&(column as f64 * width, row as f64 + 1.0));
                let (x1, y1) = chart.backend_coord(&(end as f64 * width, row as f64));
                let _ = write!(paths[l], "M{x0} {y0}h{}v{}h{}z", x1 - x0, y1 - y0, x0 - x1);
            }
            column = end;
        }
    }
    let mut overlay = String::new();
    for (l, d) in paths.iter().enumerate().filter(|(_, d)| !d.is_empty()) {
        let c = level_color(l);
        let _ = writeln!(
            overlay,
            r##"<path fill="#{:02X}{:02X}{:02X}" stroke="none" d="{d}"/>"##,
            c.0, c.1, c.2
        );
    }
    // Separators between the address ranges, over the cells.
    for range in map.axis.ranges.iter().skip(1) {
        let (x0, y) = chart.backend_coord(&(0.0, range.first as f64));
        let (x1, _) = chart.backend_coord(&(accesses, range.first as f64));
        let _ = writeln!(
            overlay,
            r##"<path stroke="#555555" stroke-width="1" fill="none" d="M{x0} {y}H{x1}"/>"##
        );
    }
    draw_range_labels(&plot, &chart, &map.axis)?;
    draw_scale(&scale, max)?;
    Ok(overlay)
}

/// A label per address range in the y-label area: its first address and size.
fn draw_range_labels<'a>(
    plot: &Area,
    chart: &ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    axis: &AddressAxis,
) -> Result<()> {
    for range in &axis.ranges {
        let (_, y_low) = chart.backend_coord(&(0.0, range.first as f64));
        let (x, y_high) = chart.backend_coord(&(0.0, (range.first + range.slots) as f64));
        let centre = (y_low + y_high) / 2;
        let size = format!("{} range", format_bytes(range.end - range.start));
        if y_low - y_high >= 30 {
            draw_text_at(
                plot,
                format_address(range.start),
                (x - 6, centre - 8),
                text(12, &DARK, HPos::Right, VPos::Center),
            )?;
            draw_text_at(
                plot,
                size,
                (x - 6, centre + 8),
                text(11, &MUTED, HPos::Right, VPos::Center),
            )?;
        } else {
            draw_text_at(
                plot,
                format_address(range.start),
                (x - 6, centre),
                text(11, &DARK, HPos::Right, VPos::Center),
            )?;
        }
    }
    Ok(())
}

/// The colour scale: one box per level with the access counts it spans.
fn draw_scale(area: &Area, max: u32) -> Result<()> {
    area.draw(&Text::new(
        "accesses per cell",
        (6, 12),
        text(12, &DARK, HPos::Left, VPos::Top),
    ))
    .map_err(plot_error)?;
    let top = 36;
    let step = 22;
    // Only levels some count maps to (with a small maximum, several
    // levels are empty).
    let levels: Vec<(usize, u32, u32)> = (1..=LEVELS)
        .rev()
        .map(|l| {
            let (lower, upper) = level_bounds(l, max);
            (l, lower, upper)
        })
        .filter(|(_, lower, upper)| lower <= upper)
        .collect();
    for (i, (l, lower, upper)) in levels.iter().enumerate() {
        let y = top + step * i as i32;
        area.draw(&Rectangle::new(
            [(8, y), (28, y + step - 2)],
            level_color(*l).filled(),
        ))
        .map_err(plot_error)?;
        let label = if lower == upper {
            format_count(*lower as f64)
        } else {
            format!(
                "{}–{}",
                format_count(*lower as f64),
                format_count(*upper as f64)
            )
        };
        area.draw(&Text::new(
            label,
            (34, y + step / 2 - 1),
            text(11, &DARK, HPos::Left, VPos::Center),
        ))
        .map_err(plot_error)?;
    }
    let y = top + step * levels.len() as i32 + 8;
    area.draw(&Text::new(
        "log scale; white = 0",
        (6, y),
        text(11, &MUTED, HPos::Left, VPos::Top),
    ))
    .map_err(plot_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_span_one_to_max_on_a_log_scale() {
        assert_eq!(level(0, 100), 0);
        assert_eq!(level(1, 100), 1);
        assert_eq!(level(100, 100), LEVELS);
        assert_eq!(level(1, 1), LEVELS);
        assert!(level(10, 100) > 1 && level(10, 100) < LEVELS);
        assert_ne!(level_color(1), level_color(LEVELS));
        // The levels' bounds tile 1..=max.
        for max in [1, 2, 7, 416, 100_000] {
            let mut next = 1;
            for l in 1..=LEVELS {
                let (lo, hi) = level_bounds(l, max);
                if lo > hi {
                    continue;
                }
                assert_eq!(lo, next, "max {max} level {l}");
                assert!((lo..=hi).all(|c| level(c, max) == l));
                next = hi + 1;
            }
            assert_eq!(next, max + 1);
        }
    }
}
