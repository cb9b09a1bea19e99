//! What every chart shares: canvas, fonts, palette, header, legend and the
//! number formats of axis labels.
//!
//! Text is emitted as SVG `<text>` with the generic `sans-serif` family, so
//! the charts carry no font files and need no system font library; plotters'
//! built-in width estimate is enough to lay out labels.

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::fmt::Display;

/// The drawing area every chart draws on.
pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Font family of all text: resolved by the viewer, never embedded.
pub(crate) const FONT: &str = "sans-serif";

/// Okabe–Ito colours: distinguishable with the common colour-vision
/// deficiencies. Named by what they show.
pub(crate) const OKABE_BLUE: RGBColor = RGBColor(0x00, 0x72, 0xB2);
pub(crate) const OKABE_GREEN: RGBColor = RGBColor(0x00, 0x9E, 0x73);
pub(crate) const OKABE_VERMILLION: RGBColor = RGBColor(0xD5, 0x5E, 0x00);
pub(crate) const OKABE_PURPLE: RGBColor = RGBColor(0xCC, 0x79, 0xA7);
pub(crate) const OKABE_ORANGE: RGBColor = RGBColor(0xE6, 0x9F, 0x00);
/// Old values (a baseline) are drawn in grey next to the current run.
pub(crate) const BASELINE_GREY: RGBColor = RGBColor(0x99, 0x99, 0x99);
pub(crate) const DARK: RGBColor = RGBColor(0x22, 0x22, 0x22);
pub(crate) const MUTED: RGBColor = RGBColor(0x55, 0x55, 0x55);
pub(crate) const GRID: RGBColor = RGBColor(0xE4, 0xE4, 0xE4);

/// Colours of successive series in bar charts (current run first).
pub(crate) const SERIES: [RGBColor; 4] = [OKABE_BLUE, BASELINE_GREY, OKABE_ORANGE, OKABE_GREEN];

/// Height of the title + subtitle block at the top of every chart.
pub(crate) const HEADER: u32 = 54;

/// The axis and grid style every x–y chart shares: text sizes, a light
/// grid with few subdivisions.
pub(crate) fn house_style<'m, 'a, 'b, X, Y, DB>(
    mesh: &'m mut plotters::chart::MeshStyle<'a, 'b, X, Y, DB>,
) -> &'m mut plotters::chart::MeshStyle<'a, 'b, X, Y, DB>
where
    X: Ranged,
    Y: Ranged,
    DB: DrawingBackend,
{
    mesh.axis_desc_style((FONT, 14))
        .label_style((FONT, 12))
        .max_light_lines(2)
        .light_line_style(GRID.mix(0.6))
        .bold_line_style(GRID)
}

/// Turns a plotters error (generic over the backend) into an `anyhow` one.
pub(crate) fn plot_error(error: impl Display) -> anyhow::Error {
    anyhow!("cannot draw chart: {error}")
}

/// Text style of the given size and colour, anchored at `h`/`v`.
pub(crate) fn text(size: u32, color: &RGBColor, h: HPos, v: VPos) -> TextStyle<'static> {
    TextStyle {
        font: (FONT, size).into_font(),
        color: color.to_backend_color(),
        pos: Pos::new(h, v),
    }
}

/// Creates the SVG canvas, draws the header and hands the area below it to
/// `draw`; returns the SVG document.
pub(crate) fn render_svg(
    size: (u32, u32),
    title: &str,
    subtitle: &str,
    draw: impl FnOnce(&Area) -> Result<()>,
) -> Result<String> {
    render_svg_with_overlay(size, title, subtitle, |area| {
        draw(area).map(|()| String::new())
    })
}

/// Like [`render_svg`], but `draw` also returns raw SVG elements that are
/// placed on top of what plotters drew: dense content (heatmap cells) is
/// far smaller as one `<path>` per colour than as one `<rect>` per cell.
pub(crate) fn render_svg_with_overlay(
    size: (u32, u32),
    title: &str,
    subtitle: &str,
    draw: impl FnOnce(&Area) -> Result<String>,
) -> Result<String> {
    let mut svg = String::new();
    let overlay;
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let (header, body) = root.split_vertically(HEADER);
        header
            .draw(&Text::new(
                title.to_string(),
                (12, 8),
                TextStyle::from((FONT, 20).into_font().style(FontStyle::Bold))
                    .color(&DARK)
                    .pos(Pos::new(HPos::Left, VPos::Top)),
            ))
            .map_err(plot_error)?;
        if !subtitle.is_empty() {
            header
                .draw(&Text::new(
                    subtitle.to_string(),
                    (12, 34),
                    text(13, &MUTED, HPos::Left, VPos::Top),
                ))
                .map_err(plot_error)?;
        }
        overlay = draw(&body)?;
        root.present().map_err(plot_error)?;
    }
    if !overlay.is_empty() {
        let end = svg
            .rfind("</svg>")
            .ok_or_else(|| anyhow!("plotters wrote no </svg>"))?;
        svg.insert_str(end, &overlay);
    }
    Ok(svg)
}

/// How a legend entry is drawn.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Swatch {
    /// A solid line.
    Line(RGBColor),
    /// A dashed line.
    Dashed(RGBColor),
    /// A filled box (bars, heatmap cells).
    Box(RGBColor),
}

/// Draws legend entries one under the other, starting at `(x, y)` in the
/// area's pixel coordinates. Legends live outside the plotting area, so
/// they never hide data.
pub(crate) fn draw_legend(
    area: &Area,
    (x, y): (i32, i32),
    entries: &[(Swatch, String)],
) -> Result<()> {
    for (i, (swatch, label)) in entries.iter().enumerate() {
        let cy = y + 20 * i as i32;
        match *swatch {
            Swatch::Line(c) => area
                .draw(&PathElement::new(
                    vec![(x, cy), (x + 24, cy)],
                    c.stroke_width(2),
                ))
                .map_err(plot_error)?,
            Swatch::Dashed(c) => {
                for s in [0, 9, 18] {
                    area.draw(&PathElement::new(
                        vec![(x + s, cy), (x + s + 5, cy)],
                        c.stroke_width(2),
                    ))
                    .map_err(plot_error)?;
                }
            }
            Swatch::Box(c) => area
                .draw(&Rectangle::new(
                    [(x + 4, cy - 6), (x + 20, cy + 6)],
                    c.filled(),
                ))
                .map_err(plot_error)?,
        }
        area.draw(&Text::new(
            label.clone(),
            (x + 32, cy),
            text(13, &DARK, HPos::Left, VPos::Center),
        ))
        .map_err(plot_error)?;
    }
    Ok(())
}

/// Draws text at `pos` in backend (whole-canvas) pixels, as returned by
/// `ChartContext::backend_coord`, on an area that may be offset.
pub(crate) fn draw_text_at(
    area: &Area,
    label: String,
    (x, y): (i32, i32),
    style: TextStyle<'_>,
) -> Result<()> {
    let (bx, by) = area.get_base_pixel();
    area.draw(&Text::new(label, (x - bx, y - by), style))
        .map_err(plot_error)
}

/// Draws a centred "nothing to show" note where a chart would be.
pub(crate) fn draw_empty(area: &Area, message: &str) -> Result<()> {
    let (w, h) = area.dim_in_pixel();
    area.draw(&Text::new(
        message.to_string(),
        (w as i32 / 2, h as i32 / 2),
        text(15, &MUTED, HPos::Center, VPos::Center),
    ))
    .map_err(plot_error)
}

/// A count in a few characters: `950`, `12.5K`, `3.1M`, `2.0G` (decimal).
pub fn format_count(value: f64) -> String {
    let a = value.abs();
    let (scaled, suffix) = if a >= 1e9 {
        (value / 1e9, "G")
    } else if a >= 1e6 {
        (value / 1e6, "M")
    } else if a >= 1e4 {
        (value / 1e3, "K")
    } else {
        return if value.fract() == 0.0 || a >= 100.0 {
            format!("{value:.0}")
        } else if a >= 1.0 {
            format!("{value:.1}")
        } else {
            format!("{value:.2}")
        };
    };
    if scaled.abs() >= 100.0 || (scaled * 10.0).round() % 10.0 == 0.0 {
        format!("{scaled:.0}{suffix}")
    } else {
        format!("{scaled:.1}{suffix}")
    }
}

/// A power-of-two window size `2^k` in accesses: `8`, `512`, `1K`, `64K`,
/// `1M` (binary multiples, as window sizes are powers of two).
pub fn format_window(k: u32) -> String {
    match k {
        0..=9 => format!("{}", 1u64 << k),
        10..=19 => format!("{}K", 1u64 << (k - 10)),
        20..=29 => format!("{}M", 1u64 << (k - 20)),
        _ => format!("{}G", 1u64 << (k.min(63) - 30)),
    }
}

/// A byte count with a binary unit: `64 B`, `4 KiB`, `1.5 MiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value >= 100.0 || value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// An address as `0x…` hex.
pub fn format_address(address: u64) -> String {
    format!("{address:#x}")
}

/// An axis tick: like [`format_value`] without trailing zeros (`0.1`, not `0.100`).
pub fn format_tick(value: f64) -> String {
    let text = format_value(value);
    if text.contains('.')
        && !text.contains('e')
        && text.chars().last().is_some_and(|c| c.is_ascii_digit())
    {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// A metric value for a bar label or table: three significant digits for
/// small numbers, compact counts for large ones.
pub fn format_value(value: f64) -> String {
    let a = value.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e4 {
        format_count(value)
    } else if a >= 100.0 {
        format!("{value:.0}")
    } else if a >= 10.0 {
        format!("{value:.1}")
    } else if a >= 1.0 {
        format!("{value:.2}")
    } else if a >= 0.001 {
        format!("{value:.3}")
    } else {
        format!("{value:.1e}")
    }
}

/// Shortens `name` to at most `max` characters with a trailing ellipsis
/// (long demangled Rust paths would otherwise run over the plot).
pub fn ellipsize(name: &str, max: usize) -> String {
    if name.chars().count() <= max {
        return name.to_string();
    }
    let mut out: String = name.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Shortens `name` to at most `max` characters by dropping its start: the
/// end of a Rust path (`…kernels::str1_kernel`) says the most.
pub fn ellipsize_front(name: &str, max: usize) -> String {
    let count = name.chars().count();
    if count <= max {
        return name.to_string();
    }
    let mut out = String::from("…");
    out.extend(name.chars().skip(count - max.saturating_sub(1)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_compact() {
        assert_eq!(format_count(950.0), "950");
        assert_eq!(format_count(12_500.0), "12.5K");
        assert_eq!(format_count(3_100_000.0), "3.1M");
        assert_eq!(format_count(2.5), "2.5");
        assert_eq!(format_count(0.25), "0.25");
        assert_eq!(format_count(250_000.0), "250K");
        assert_eq!(format_count(50_000.0), "50K");
        assert_eq!(format_count(12.0), "12");
    }

    #[test]
    fn windows_use_binary_multiples() {
        assert_eq!(format_window(3), "8");
        assert_eq!(format_window(9), "512");
        assert_eq!(format_window(10), "1K");
        assert_eq!(format_window(16), "64K");
        assert_eq!(format_window(20), "1M");
    }

    #[test]
    fn bytes_use_binary_units() {
        assert_eq!(format_bytes(64), "64 B");
        assert_eq!(format_bytes(4096), "4 KiB");
        assert_eq!(format_bytes(1536 * 1024), "1.5 MiB");
    }

    #[test]
    fn values_and_names() {
        assert_eq!(format_value(0.15634), "0.156");
        assert_eq!(format_value(2.654), "2.65");
        assert_eq!(format_value(291_000.0), "291K");
        assert_eq!(ellipsize("abcdef", 4), "abc…");
        assert_eq!(ellipsize("abc", 4), "abc");
        assert_eq!(ellipsize_front("a::b::kernel", 8), "…:kernel");
    }
}
