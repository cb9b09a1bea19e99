//! Every metric of the streaming analysis against the naive reference
//! (`tests/naive`), on random traces with random sample structure: empty
//! samples, single-record samples, all-Constant samples, samples that mix
//! threads, addresses shared by Strided and Irregular loads, proxy
//! (implied) loads, `--functions` filters, block sizes and code windows.

use crate::naive;

use memgaze_analysis::{Analysis, AnalysisOptions, analyze_trace};
use memgaze_trace::{
    Backend, FunctionEntry, LoadClass, LoadEntry, Sampling, TraceHeader, TraceReader, TraceTotals,
    TraceWriter,
};
use naive::{Params, Rec};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Case {
    header: TraceHeader,
    samples: Vec<Vec<Rec>>,
    trailing_empty: u64,
    executions_factor: u64,
    params: Params,
}

fn functions() -> Vec<FunctionEntry> {
    ["alpha", "beta", "gamma"]
        .iter()
        .enumerate()
        .map(|(i, name)| FunctionEntry {
            name: name.to_string(),
            start: 0x1000 * (i as u64 + 1),
            end: 0x1000 * (i as u64 + 1) + 0x800,
        })
        .collect()
}

/// Load sites: class, implied, function (or by ip), a proxy entry.
fn loads() -> impl Strategy<Value = Vec<LoadEntry>> {
    let class = prop_oneof![
        3 => Just(LoadClass::Strided),
        3 => Just(LoadClass::Irregular),
        2 => Just(LoadClass::Constant),
    ];
    let site = (class, 0u32..3, 0u64..4, any::<bool>(), any::<bool>());
    prop::collection::vec(site, 1..7).prop_map(|sites| {
        let mut loads: Vec<LoadEntry> = sites
            .into_iter()
            .enumerate()
            .map(|(i, (class, implied, place, explicit, with_line))| {
                // place 3: outside every function.
                let ip = if place == 3 {
                    0x9000 + 8 * i as u64
                } else {
                    0x1000 * (place + 1) + 16 * i as u64
                };
                LoadEntry {
                    ip,
                    class,
                    implied,
                    function: (explicit && place < 3).then_some(place as u32),
                    line: with_line.then(|| format!("src/lib.rs:{}", 10 + i)),
                    proxy: None,
                }
            })
            .collect();
        // An uninstrumented Constant load implied by load 0.
        loads.push(LoadEntry {
            ip: 0x1000 + 0x400,
            class: LoadClass::Constant,
            implied: 0,
            function: Some(0),
            line: None,
            proxy: Some(0),
        });
        loads
    })
}

/// Addresses from a few regions, with much reuse, so windows, lines, reuse
/// distances and hot regions are all non-trivial.
fn address() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (0u64..48).prop_map(|i| 0x5555_0000_0000 + 8 * i),
        2 => (0u64..256).prop_map(|i| 0x5555_0010_0000 + 64 * i),
        1 => (0u64..8).prop_map(|i| 0x7ffd_0000_0000 + 4 * i),
        1 => any::<u64>(),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let sampling = prop_oneof![
        1 => Just(None),
        3 => prop_oneof![Just(8u64), Just(16), Just(33), Just(64), Just(100)].prop_map(Some),
    ];
    let backend = prop_oneof![
        Just(Backend::Soft),
        Just(Backend::Pt),
        Just(Backend::Lackey)
    ];
    let params = (
        prop_oneof![Just(64u64), Just(16), Just(256)],
        prop_oneof![3 => Just(None), 1 => (0u32..6).prop_map(Some)],
        prop_oneof![Just(10.0f64), Just(30.0), Just(0.0)],
        prop_oneof![Just(4096u64), Just(64), Just(1 << 16)],
        prop_oneof![
            4 => Just(None),
            1 => Just(Some("beta".to_string())),
            1 => Just(Some("*a".to_string()))
        ],
    );
    (sampling, backend, loads(), params, 0u64..3, 1u64..5)
        .prop_flat_map(|(window, backend, loads, params, trailing_empty, factor)| {
            let n_loads = loads.len() as u32 - 1; // the proxy entry is never recorded
            let record = (
                0..n_loads,
                address(),
                prop_oneof![6 => Just(0u32), 1 => Just(1u32)],
            );
            let sample_len = match window {
                Some(w) => 0..=w as usize,
                None => 0..=700usize,
            };
            let sample = prop::collection::vec(record, sample_len).prop_map(|v| {
                v.into_iter()
                    .map(|(load, addr, thread)| Rec { thread, load, addr })
                    .collect::<Vec<_>>()
            });
            let n_samples = if window.is_some() {
                0..8usize
            } else {
                1..2usize
            };
            let samples = prop::collection::vec(sample, n_samples);
            (
                samples,
                Just((window, backend, loads, params, trailing_empty, factor)),
            )
        })
        .prop_map(
            |(samples, (window, backend, loads, params, trailing_empty, factor))| {
                let sampling = match window {
                    Some(w) => Sampling {
                        window: w,
                        period: w * 10,
                        seed: None,
                    },
                    None => Sampling::full(),
                };
                let (block, code_window_k, threshold_percent, min_page, functions) = params;
                Case {
                    header: TraceHeader {
                        backend,
                        sampling,
                        binary: None,
                        command: vec![],
                        functions: functions_list(),
                        loads,
                        labels: vec![],
                        spatial: None,
                    },
                    trailing_empty: if window.is_some() { trailing_empty } else { 0 },
                    samples,
                    executions_factor: factor,
                    params: Params {
                        block,
                        code_window_k,
                        threshold_percent,
                        min_page,
                        functions,
                    },
                }
            },
        )
}

fn functions_list() -> Vec<FunctionEntry> {
    functions()
}

fn run(case: &Case) -> Analysis {
    let mut w = TraceWriter::new(Vec::new(), &case.header).unwrap();
    for sample in &case.samples {
        let first = sample.first().map_or(0, |r| r.thread);
        w.begin_sample(first).unwrap();
        let mut thread = first;
        for r in sample {
            if r.thread != thread {
                w.switch_thread(r.thread).unwrap();
                thread = r.thread;
            }
            w.push(r.load, r.addr).unwrap();
        }
    }
    for _ in 0..case.trailing_empty {
        w.begin_sample(0).unwrap();
    }
    let records = w.records();
    let samples = w.samples();
    let bytes = w
        .finish(&TraceTotals::clean(
            records * case.executions_factor,
            records,
            samples,
        ))
        .unwrap();
    let options = AnalysisOptions {
        block: case.params.block,
        code_window_k: case.params.code_window_k,
        region_threshold_percent: case.params.threshold_percent,
        region_min_page: case.params.min_page,
        functions: case.params.functions.clone(),
        ..AnalysisOptions::default()
    };
    analyze_trace(TraceReader::new(&bytes[..]).unwrap(), &options).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

fn close_opt(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => close(a, b),
        _ => false,
    }
}

macro_rules! check {
    ($ok:expr, $($what:tt)*) => {
        prop_assert!($ok, $($what)*)
    };
}

fn compare(case: &Case) -> Result<(), TestCaseError> {
    let got = run(case);
    let total_samples = case.samples.len() as u64 + case.trailing_empty;
    let executions =
        case.samples.iter().map(|s| s.len() as u64).sum::<u64>() * case.executions_factor;
    let want = naive::analyze(
        &case.header,
        &case.samples,
        total_samples,
        executions,
        &case.params,
    );

    // JSON never holds NaN or infinity, and round-trips.
    let json = serde_json::to_string(&got).unwrap();
    let back: Analysis = serde_json::from_str(&json).unwrap();
    prop_assert_eq!(&back, &got);

    let s = &got.summary;
    prop_assert_eq!(s.a, want.a);
    prop_assert_eq!(s.a_const, want.a_const);
    prop_assert_eq!(s.samples, want.samples);
    prop_assert_eq!(s.records, want.records);
    prop_assert_eq!(s.f, want.f);
    prop_assert_eq!(s.f_lines, want.f_lines);
    check!(
        close_opt(s.kappa, want.kappa),
        "kappa {:?} {:?}",
        s.kappa,
        want.kappa
    );
    check!(close_opt(s.rho, want.rho), "rho {:?} {:?}", s.rho, want.rho);
    check!(
        close(s.f_str, want.f_str),
        "F_str {} {}",
        s.f_str,
        want.f_str
    );
    check!(
        close(s.f_irr, want.f_irr),
        "F_irr {} {}",
        s.f_irr,
        want.f_irr
    );
    check!(close(s.f_str + s.f_irr, s.f as f64), "F_str + F_irr = F");
    check!(close_opt(s.d_f, want.d_f), "dF {:?} {:?}", s.d_f, want.d_f);
    check!(
        close_opt(s.d_mean, want.d_mean),
        "D_mean {:?} {:?}",
        s.d_mean,
        want.d_mean
    );
    prop_assert_eq!(s.d_max, want.d_max);
    let bins: Vec<u64> = got.reuse.bins.iter().map(|b| b.count).collect();
    prop_assert_eq!(&bins, &want.d_bins);
    prop_assert_eq!(got.reuse.cold, want.cold);
    prop_assert_eq!(got.reuse.captures, want.captures);
    prop_assert_eq!(got.reuse.survivals, want.survivals);
    prop_assert_eq!(got.coverage.empty_samples, want.empty_samples);
    prop_assert_eq!(got.coverage.outside_functions, want.outside_functions);
    prop_assert_eq!(got.coverage.filtered_out, want.filtered_out);

    compare_rows("trace", &got.trace_windows, &want.rows, true)?;

    prop_assert_eq!(got.functions.len(), want.functions.len());
    for (g, w) in got.functions.iter().zip(&want.functions) {
        prop_assert_eq!(&g.name, &w.name);
        prop_assert_eq!(g.a, w.a);
        prop_assert_eq!(g.a_const, w.a_const);
        prop_assert_eq!(g.code_windows, w.code_windows, "code windows of {}", g.name);
        check!(
            close_opt(g.d_f, w.d_f),
            "{} dF {:?} {:?}",
            g.name,
            g.d_f,
            w.d_f
        );
        check!(
            close_opt(g.f_str_frac, w.f_str_frac),
            "{} F_str% {:?} {:?}",
            g.name,
            g.f_str_frac,
            w.f_str_frac
        );
        check!(close_opt(g.f_irr_frac, w.f_irr_frac), "{} F_irr%", g.name);
        check!(
            close_opt(g.d_mean, w.d_mean),
            "{} D_mean {:?} {:?}",
            g.name,
            g.d_mean,
            w.d_mean
        );
        compare_rows(&g.name, &g.trace_windows, &w.rows, false)?;
        let hot: Vec<(u64, Option<String>, u64)> = g
            .hot_loads
            .iter()
            .map(|l| (l.ip, l.line.clone(), l.count))
            .collect();
        prop_assert_eq!(&hot, &w.hot_loads, "hot loads of {}", g.name);
    }

    let loads: Vec<(u64, LoadClass, u64, bool)> = got
        .loads
        .iter()
        .map(|l| (l.ip, l.class, l.count, l.implied))
        .collect();
    let want_loads: Vec<(u64, LoadClass, u64, bool)> =
        want.loads.iter().map(|l| (l.0, l.1, l.2, l.3)).collect();
    prop_assert_eq!(&loads, &want_loads);
    for (g, w) in got.loads.iter().zip(&want.loads) {
        check!(close_opt(g.d_mean, w.4), "load {:#x} D_mean", g.ip);
    }

    prop_assert_eq!(
        got.regions.len(),
        want.regions.len(),
        "regions {:?} vs {:?}",
        got.regions,
        want.regions
    );
    for (g, w) in got.regions.iter().zip(&want.regions) {
        prop_assert_eq!(
            (g.start, g.end, g.a, g.blocks, g.depth),
            (w.start, w.end, w.a, w.blocks, w.depth)
        );
        check!(close_opt(g.d_mean, w.d_mean), "region D_mean");
        let functions: Vec<(String, u64)> =
            g.functions.iter().map(|f| (f.name.clone(), f.a)).collect();
        prop_assert_eq!(&functions, &w.functions);
    }

    prop_assert_eq!(got.intervals.levels.len(), want.levels.len());
    for (g, w) in got.intervals.levels.iter().zip(&want.levels) {
        prop_assert_eq!((g.h, g.nodes), (w.h, w.nodes));
        check!(
            close(g.a, w.a) && close(g.f, w.f),
            "interval level {} A/F",
            g.h
        );
        check!(
            close_opt(g.d_f, w.d_f),
            "interval level {} dF {:?} {:?}",
            g.h,
            g.d_f,
            w.d_f
        );
    }
    match (got.intervals.nodes.first(), want.root) {
        (None, None) => {}
        (Some(root), Some((samples, a, f, lines))) => {
            prop_assert_eq!(
                (root.samples, root.a, root.f, root.f_lines),
                (samples, a, f, lines)
            );
        }
        (g, w) => prop_assert!(false, "root {:?} vs {:?}", g, w),
    }
    Ok(())
}

fn compare_rows(
    what: &str,
    got: &[memgaze_analysis::WindowRow],
    want: &[naive::Row],
    lines: bool,
) -> Result<(), TestCaseError> {
    let got_k: Vec<(u32, u64)> = got.iter().map(|r| (r.k, r.windows)).collect();
    let want_k: Vec<(u32, u64)> = want.iter().map(|r| (r.k, r.windows)).collect();
    prop_assert_eq!(&got_k, &want_k, "{} window rows", what);
    for (g, w) in got.iter().zip(want) {
        let ok = close(g.f, w.f)
            && close(g.d_f, w.d_f)
            && close(g.f_str, w.f_str)
            && close(g.f_irr, w.f_irr)
            && close(g.f_str_frac, w.f_str_frac)
            && close(g.f_irr_frac, w.f_irr_frac)
            && close(g.a_const, w.a_const)
            && (!lines || close(g.f_lines.unwrap(), w.f_lines));
        prop_assert!(ok, "{} k = {}: got {:?}, want {:?}", what, g.k, g, w);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn every_metric_matches_the_naive_reference(case in case()) {
        compare(&case)?;
    }
}

/// Fixed structures the random generator might rarely produce.
#[test]
fn edge_structures() {
    let header = |window: Option<u64>, loads: Vec<LoadEntry>| TraceHeader {
        backend: Backend::Soft,
        sampling: window.map_or(Sampling::full(), |w| Sampling {
            window: w,
            period: 4 * w,
            seed: None,
        }),
        binary: None,
        command: vec![],
        functions: functions(),
        loads,
        labels: vec![],
        spatial: None,
    };
    let load = |class, function| LoadEntry {
        ip: 0x1000 * (u64::from(function) + 1) + 8,
        class,
        implied: 1,
        function: Some(function),
        line: None,
        proxy: None,
    };
    let params = Params {
        block: 64,
        code_window_k: None,
        threshold_percent: 10.0,
        min_page: 4096,
        functions: None,
    };
    let rec = |load, addr, thread| Rec { thread, load, addr };
    let cases = vec![
        // Only empty samples.
        Case {
            header: header(Some(8), vec![load(LoadClass::Strided, 0)]),
            samples: vec![vec![], vec![]],
            trailing_empty: 2,
            executions_factor: 3,
            params: params.clone(),
        },
        // Single-record samples and an all-Constant sample.
        Case {
            header: header(
                Some(16),
                vec![load(LoadClass::Irregular, 1), load(LoadClass::Constant, 2)],
            ),
            samples: vec![
                vec![rec(0, 0x100, 0)],
                vec![rec(1, 0x7ff0, 0); 16],
                vec![rec(0, 0x100, 0)],
            ],
            trailing_empty: 0,
            executions_factor: 10,
            params: params.clone(),
        },
        // One address alternating between a Strided and an Irregular load,
        // with two interleaved threads, in a full trace.
        Case {
            header: header(
                None,
                vec![load(LoadClass::Strided, 0), load(LoadClass::Irregular, 1)],
            ),
            samples: vec![
                (0..2000u64)
                    .map(|i| {
                        rec(
                            (i % 3 == 0) as u32,
                            0x4000 + 8 * ((i * 7) % 40),
                            ((i / 50) % 2) as u32,
                        )
                    })
                    .collect(),
            ],
            trailing_empty: 0,
            executions_factor: 1,
            params: params.clone(),
        },
    ];
    for case in &cases {
        compare(case).unwrap();
    }
}
