//! (e), (f) Horizontal bar charts: one row per category (a function, a
//! region, a bench), one panel per metric (each with its own scale), one bar
//! per series (the current run; a baseline beside it).

use super::style::*;
use anyhow::Result;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

/// How a panel writes its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueFormat {
    /// Counts: `12`, `291K`.
    Count,
    /// Ratios and means: three significant digits.
    Decimal,
    /// Fractions in `[0, 1]` shown as percentages.
    Percent,
}

impl ValueFormat {
    fn label(self, v: f64) -> String {
        match self {
            ValueFormat::Count => format_count(v.round()),
            ValueFormat::Decimal => format_value(v),
            ValueFormat::Percent => format!("{:.1}%", v * 100.0),
        }
    }

    fn tick(self, v: f64) -> String {
        match self {
            ValueFormat::Count => format_count(v),
            ValueFormat::Decimal => format_tick(v),
            ValueFormat::Percent => format!("{:.0}%", v * 100.0),
        }
    }
}

/// One metric: a panel with its own axis.
#[derive(Clone, Debug, PartialEq)]
pub struct BarPanel {
    /// Panel heading: the metric and its unit.
    pub metric: String,
    /// `values[series][category]`; `None` where the metric is undefined.
    pub values: Vec<Vec<Option<f64>>>,
    /// How values and ticks are written.
    pub format: ValueFormat,
}

/// A multi-panel bar chart.
#[derive(Clone, Debug, PartialEq)]
pub struct BarChart {
    /// Chart title.
    pub title: String,
    /// One line under the title saying what is shown.
    pub subtitle: String,
    /// Row labels, top to bottom.
    pub categories: Vec<String>,
    /// Series labels (legend), drawn top to bottom within a row; one
    /// series needs no legend.
    pub series: Vec<String>,
    /// The series that is a baseline (old values), drawn in grey; the
    /// others take the palette in order.
    pub baseline: Option<usize>,
    /// The metrics.
    pub panels: Vec<BarPanel>,
}

const LABEL_COLUMN: u32 = 300;
const PANEL_HEAD: u32 = 30;
const AXIS: u32 = 34;

/// Renders the chart; its height follows the number of rows.
pub fn render(chart: &BarChart) -> Result<String> {
    let series = chart.series.len().max(1);
    let row = (series as u32 * 15 + 12).max(26);
    let legend = if chart.series.len() > 1 { 26 } else { 0 };
    let rows = chart.categories.len().max(1) as u32;
    let height = HEADER + legend + PANEL_HEAD + rows * row + AXIS + 16;
    let width = LABEL_COLUMN + 250 * chart.panels.len().max(1) as u32 + 20;
    render_svg((width, height), &chart.title, &chart.subtitle, |body| {
        draw(body, chart, legend)
    })
}

fn draw(body: &Area, chart: &BarChart, legend_height: u32) -> Result<()> {
    if chart.categories.is_empty() || chart.panels.is_empty() {
        return draw_empty(body, "nothing to show");
    }
    let (legend, body) = body.split_vertically(legend_height);
    if legend_height > 0 {
        let mut x = LABEL_COLUMN as i32;
        for (i, label) in chart.series.iter().enumerate() {
            let label = ellipsize(label, 28);
            let width = 40 + 8 * label.chars().count() as i32;
            draw_legend(
                &legend,
                (x, 12),
                &[(Swatch::Box(series_color(chart, i)), label)],
            )?;
            x += width;
        }
    }
    let (labels, panels) = body.split_horizontally(LABEL_COLUMN);
    let columns = panels.split_evenly((1, chart.panels.len()));
    let n = chart.categories.len();
    let series = chart.series.len().max(1);
    let mut row_centres = Vec::new();
    for (p, (panel, area)) in chart.panels.iter().zip(&columns).enumerate() {
        area.draw(&Text::new(
            panel.metric.clone(),
            (8, 6),
            TextStyle::from((FONT, 14).into_font().style(FontStyle::Bold))
                .color(&DARK)
                .pos(plotters::style::text_anchor::Pos::new(
                    HPos::Left,
                    VPos::Top,
                )),
        ))
        .map_err(plot_error)?;
        let (_, plot_area) = area.split_vertically(PANEL_HEAD);
        let max = panel
            .values
            .iter()
            .flatten()
            .flatten()
            .fold(0.0f64, |a, b| a.max(*b));
        let percent = panel.format == ValueFormat::Percent;
        let top = if percent {
            (max * 1.3).clamp(0.05, 1.3)
        } else if max > 0.0 {
            max * 1.35
        } else {
            1.0
        };
        let format = panel.format;
        let mut ctx = ChartBuilder::on(&plot_area)
            .margin_left(8)
            .margin_right(12)
            .x_label_area_size(AXIS)
            .y_label_area_size(0)
            .build_cartesian_2d(0f64..top, 0f64..n as f64)
            .map_err(plot_error)?;
        ctx.configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_labels(4)
            .x_label_formatter(&|v| format.tick(*v))
            .label_style((FONT, 11))
            .max_light_lines(2)
            .light_line_style(GRID.mix(0.5))
            .bold_line_style(GRID)
            .draw()
            .map_err(plot_error)?;
        let band = 0.8 / series as f64;
        for (s, values) in panel.values.iter().enumerate() {
            let color = series_color(chart, s);
            for (c, value) in values.iter().enumerate().take(n) {
                // Category 0 at the top.
                let y1 = (n - c) as f64 - 0.1 - band * s as f64;
                let y0 = y1 - band * 0.9;
                let label = match value {
                    Some(v) => {
                        let v = v.max(0.0);
                        ctx.draw_series(std::iter::once(Rectangle::new(
                            [(0.0, y0), (v.min(top), y1)],
                            color.filled(),
                        )))
                        .map_err(plot_error)?;
                        format.label(v)
                    }
                    None => "–".to_string(),
                };
                let x = value.unwrap_or(0.0).clamp(0.0, top);
                let pos = ctx.backend_coord(&(x, (y0 + y1) / 2.0));
                draw_text_at(
                    &plot_area,
                    label,
                    (pos.0 + 4, pos.1),
                    text(11, &DARK, HPos::Left, VPos::Center),
                )?;
            }
        }
        if p == 0 {
            row_centres = (0..n)
                .map(|c| ctx.backend_coord(&(0.0, (n - c) as f64 - 0.5)).1)
                .collect();
        }
    }
    for (category, y) in chart.categories.iter().zip(row_centres) {
        draw_text_at(
            &labels,
            ellipsize_front(category, 42),
            (LABEL_COLUMN as i32 - 6, y),
            text(12, &DARK, HPos::Right, VPos::Center),
        )?;
    }
    Ok(())
}

/// The colour of series `i`: grey for the baseline, the palette otherwise.
fn series_color(chart: &BarChart, i: usize) -> RGBColor {
    if chart.baseline == Some(i) {
        return BASELINE_GREY;
    }
    let rank = i - usize::from(chart.baseline.is_some_and(|b| b < i));
    [OKABE_BLUE, OKABE_ORANGE, OKABE_GREEN, OKABE_PURPLE][rank % 4]
}
