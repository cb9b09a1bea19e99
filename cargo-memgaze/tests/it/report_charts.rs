//! Every chart kind, rendered from realistic inputs, parsed back and
//! rendered to PNG.

use crate::support;

use memgaze::report::charts::{bars, heatmap, reuse, windows};
use memgaze::report::profile::{ProfileOptions, profile_trace};
use support::svg::{assert_text_containing, assert_texts, count, render_png};
use support::synthetic::{Kernel, Synthetic, write_trace};

fn curve(label: &str, scale: f64) -> windows::WindowCurve {
    windows::WindowCurve {
        label: label.into(),
        points: (3..=9)
            .map(|k| {
                let n = (1u64 << k) as f64;
                windows::WindowPoint {
                    k,
                    f: n * 0.55 * scale,
                    d_f: 0.37 * scale,
                    f_str: n * 0.05,
                    f_irr: n * 0.5 * scale,
                    f_irr_frac: 0.5 * scale / (0.55 * scale),
                }
            })
            .collect(),
    }
}

#[test]
fn trace_window_histogram_with_golden_overlay() {
    let svg = windows::render(
        "irr: trace-window histogram",
        "sampled w=1000, period=100000 · 312 samples",
        &[curve("sampled", 1.0), curve("full trace (golden)", 0.95)],
    )
    .unwrap();
    assert_texts(
        &svg,
        &[
            "irr: trace-window histogram",
            "F",
            "F_str",
            "F_irr",
            "ΔF (new data per load)",
            "F_irr% (share of F)",
            "sampled",
            "full trace (golden)",
            "8",
            "512",
        ],
    );
    assert_text_containing(&svg, "window size (accesses");
    assert_text_containing(&svg, "footprint");
    // The [0, 1] axis ticks share one precision.
    let ticks: Vec<String> = support::svg::texts(&svg)
        .into_iter()
        .filter(|t| t.starts_with("0.") || t == "1.0")
        .collect();
    assert!(!ticks.is_empty(), "ticks of the ΔF axis");
    assert!(
        ticks.iter().all(|t| t.len() == 3),
        "one decimal on every tick: {ticks:?}"
    );
    render_png(&svg, "a-trace-windows");
}

#[test]
fn heatmap_and_address_views_of_a_chase_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.mgz");
    write_trace(
        &path,
        &Synthetic {
            kernel: Kernel::IrrStrIrr,
            elements: 50_000,
            reps: 20,
            sampling: Some((1000, 10_000)),
            seed: 7,
        },
    );
    let profile = profile_trace(&path, &ProfileOptions::default()).unwrap();
    let svg = heatmap::render(
        "irr|str|irr: accesses over time",
        "",
        &profile.heatmap,
        "time (sampled accesses in trace order)",
    )
    .unwrap();
    assert_texts(&svg, &["accesses per cell"]);
    assert_text_containing(&svg, "0x7f3a1c000000");
    render_png(&svg, "c-heatmap");
    let svg = memgaze::report::charts::address::render(
        "irr|str|irr: accesses per address",
        "",
        &profile.addresses,
    )
    .unwrap();
    assert_text_containing(&svg, "accesses per address");
    render_png(&svg, "d-addresses");
}

#[test]
fn reuse_histogram() {
    let bins = |scale: u64| -> Vec<reuse::ReuseBin> {
        let mut v = vec![
            reuse::ReuseBin {
                lo: 0,
                hi: 0,
                count: 5000 * scale,
            },
            reuse::ReuseBin {
                lo: 1,
                hi: 1,
                count: 1200,
            },
        ];
        for j in 1..10 {
            v.push(reuse::ReuseBin {
                lo: 1 << j,
                hi: (2 << j) - 1,
                count: 3000 / j as u64,
            });
        }
        v
    };
    let svg = reuse::render(
        "chase: reuse distance",
        "",
        &[reuse::ReuseSeries {
            label: "this run".into(),
            bins: bins(1),
            cold: 900,
        }],
        64,
    )
    .unwrap();
    assert_texts(&svg, &["0", "1", "2–3", "512–1023"]);
    // Shares from 30 % down to 2.6 %: a linear axis.
    assert_texts(&svg, &["share of accesses with a D"]);
    render_png(&svg, "b-reuse");

    // One bin holds nearly everything (a scan): the tail would be slivers
    // on a linear axis, so the axis turns logarithmic.
    let mut skewed = bins(1);
    skewed[0].count = 5_000_000;
    let svg = reuse::render(
        "str1: reuse distance",
        "",
        &[reuse::ReuseSeries {
            label: "this run".into(),
            bins: skewed,
            cold: 900,
        }],
        64,
    )
    .unwrap();
    assert_texts(
        &svg,
        &["share of accesses with a D (log)", "100%", "1%", "0.01%"],
    );
    render_png(&svg, "b-reuse-log");
    let svg = reuse::render(
        "chase: reuse distance",
        "",
        &[
            reuse::ReuseSeries {
                label: "this run".into(),
                bins: bins(1),
                cold: 900,
            },
            reuse::ReuseSeries {
                label: "baseline main".into(),
                bins: bins(2),
                cold: 900,
            },
        ],
        64,
    )
    .unwrap();
    render_png(&svg, "f-reuse-compare");
}

#[test]
fn hot_functions_and_baseline_bars() {
    let chart = bars::BarChart {
        title: "str/irr: hot functions".into(),
        subtitle: "code windows of 512 accesses".into(),
        categories: vec![
            "microbenches::kernels::str_irr_kernel".into(),
            "core::ptr::drop_in_place<alloc::vec::Vec<u64>>".into(),
            "main".into(),
        ],
        series: vec!["this run".into()],
        baseline: None,
        panels: vec![
            bars::BarPanel {
                metric: "A (accesses)".into(),
                values: vec![vec![Some(291_000.0), Some(2000.0), Some(12.0)]],
                format: bars::ValueFormat::Count,
            },
            bars::BarPanel {
                metric: "ΔF".into(),
                values: vec![vec![Some(0.156), Some(0.01), None]],
                format: bars::ValueFormat::Decimal,
            },
            bars::BarPanel {
                metric: "F_str%".into(),
                values: vec![vec![Some(0.664), Some(1.0), None]],
                format: bars::ValueFormat::Percent,
            },
        ],
    };
    let svg = bars::render(&chart).unwrap();
    assert_texts(
        &svg,
        &[
            "A (accesses)",
            "ΔF",
            "F_str%",
            "microbenches::kernels::str_irr_kernel",
            "291K",
            "66.4%",
            "–",
        ],
    );
    render_png(&svg, "e-functions");
    let chart = bars::BarChart {
        title: "baseline main vs this run".into(),
        subtitle: "".into(),
        categories: Kernel::ALL.iter().map(|k| k.name().to_string()).collect(),
        series: vec!["baseline main".into(), "this run".into()],
        baseline: Some(0),
        panels: vec![
            bars::BarPanel {
                metric: "ΔF".into(),
                values: vec![
                    (0..8).map(|i| Some(0.1 * i as f64)).collect(),
                    (0..8).map(|i| Some(0.09 * i as f64)).collect(),
                ],
                format: bars::ValueFormat::Decimal,
            },
            bars::BarPanel {
                metric: "F_irr%".into(),
                values: vec![
                    (0..8).map(|i| Some(0.12 * i as f64)).collect(),
                    (0..8).map(|i| Some(0.1 * i as f64)).collect(),
                ],
                format: bars::ValueFormat::Percent,
            },
            bars::BarPanel {
                metric: "D mean".into(),
                values: vec![
                    (0..8).map(|i| Some(3.0 * i as f64)).collect(),
                    (0..8).map(|i| Some(2.5 * i as f64)).collect(),
                ],
                format: bars::ValueFormat::Decimal,
            },
        ],
    };
    let svg = bars::render(&chart).unwrap();
    assert_eq!(count(&svg, "svg"), 1);
    render_png(&svg, "f-compare");
}

#[test]
fn empty_inputs_say_so_instead_of_drawing_nothing() {
    let svg = windows::render("t", "", &[]).unwrap();
    assert_text_containing(&svg, "no window of 8 or more accesses");
    let svg = reuse::render(
        "t",
        "",
        &[reuse::ReuseSeries {
            label: "x".into(),
            bins: vec![],
            cold: 10,
        }],
        64,
    )
    .unwrap();
    assert_text_containing(&svg, "no reuse within any sample");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.mgz");
    // Eight accesses, none to the same address twice.
    write_trace(
        &path,
        &Synthetic {
            kernel: Kernel::Str1,
            elements: 8,
            reps: 1,
            sampling: None,
            seed: 1,
        },
    );
    let profile = profile_trace(&path, &ProfileOptions::default()).unwrap();
    assert!(profile.addresses.per_address);
    let svg = memgaze::report::charts::address::render("t", "", &profile.addresses).unwrap();
    assert_text_containing(&svg, "no address was accessed twice within a sample");
    // The address labels sit right under the bars, not under an empty panel.
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let y_of = |prefix: &str| -> f64 {
        doc.descendants()
            .find(|n| {
                n.has_tag_name("text") && n.text().is_some_and(|t| t.trim().starts_with(prefix))
            })
            .and_then(|n| n.attribute("y"))
            .unwrap_or_else(|| panic!("no text {prefix:?}"))
            .parse()
            .unwrap()
    };
    let (label, note) = (y_of("0x7f3a1c"), y_of("no address was accessed"));
    assert!(
        label < note && label > 0.7 * 640.0,
        "label at {label}, note at {note}"
    );
    let svg = heatmap::render("t", "", &profile.heatmap, "time").unwrap();
    assert_texts(&svg, &["accesses per cell", "0x7f3a1c000000"]);
    let svg = bars::render(&bars::BarChart {
        title: "t".into(),
        subtitle: String::new(),
        categories: vec![],
        series: vec![],
        baseline: None,
        panels: vec![],
    })
    .unwrap();
    assert_text_containing(&svg, "nothing to show");
}
