//! The report as a browser lays it out: headless Chromium (Debian's
//! `chromium`, installed by ci/test.sh) renders the report of a run of the
//! bundled microbenchmark kernels, compared with a baseline, at 1,280 and
//! 1,440 px, and a test-only probe script (support/layout_probe.js, added
//! to a copy of the page, never to the product) measures it: no bench
//! name laid out on two lines, no table cell squeezed into a column of
//! letters, no table wider than the page unless it scrolls in its own box,
//! and a page that never scrolls sideways.
//!
//! Without Chromium the test fails, saying how to install it;
//! `MEMGAZE_SKIP_BROWSER=1` skips it with a note on stderr. With
//! `MEMGAZE_SCREENSHOTS=DIR` it also writes PNG screenshots there.

use crate::support;

use memgaze::gate::{BenchKey, BenchRun, load_baseline, save_baseline};
use memgaze::report::{ANALYSIS_FILE, BENCH_FILE, ReportOptions, TRACE_FILE, report_results};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::results::{analyze, small};
use support::synthetic::{Kernel, write_trace};

const PROBE: &str = include_str!("support/layout_probe.js");

/// What the probe found.
#[derive(Debug, Deserialize)]
struct Probe {
    width: u32,
    broken: Vec<String>,
    squeezed: Vec<String>,
    overflowing: Vec<String>,
    page_overflow: f64,
}

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser"]
        .into_iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join(name))
                    .find(|p| p.is_file())
            })
        })
}

/// One bench directory under `root` with the given identity.
fn bench(root: &Path, key: &BenchKey, kernel: Kernel, seed: u64) -> memgaze_analysis::Analysis {
    let dir = root
        .join(&key.package)
        .join(&key.target)
        .join(key.bench.replace('/', "%2F").replace('|', "%7C"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(BENCH_FILE), serde_json::to_string(key).unwrap()).unwrap();
    let trace = dir.join(TRACE_FILE);
    write_trace(&trace, &small(kernel, seed));
    let mut analysis = analyze(&trace);
    with_whole_run_view(&mut analysis, &key.package, seed);
    std::fs::write(
        dir.join(ANALYSIS_FILE),
        serde_json::to_vec(&analysis).unwrap(),
    )
    .unwrap();
    analysis
}

/// Gives an analysis of a synthetic trace (which has no spatial samples) a
/// miss-ratio curve and hot lines with long workspace paths, as a real
/// bench run has them, so that the whole-run chart and the hottest-lines
/// table are laid out too.
fn with_whole_run_view(analysis: &mut memgaze_analysis::Analysis, package: &str, seed: u64) {
    use memgaze_analysis::{CacheSizes, LineLocality, MrcPoint};
    let scale = 1.0 / (1.0 + seed as f64);
    analysis.summary.whole_run.mrc = (6..=24)
        .map(|k| MrcPoint {
            blocks: 1 << k,
            bytes: 64 << k,
            miss_ratio: scale * (24 - k) as f64 / 18.0,
        })
        .collect();
    analysis.summary.whole_run.mr_l1 = Some(scale * 0.8);
    analysis.summary.whole_run.mr_l2 = Some(scale * 0.4);
    analysis.summary.whole_run.mr_llc = Some(scale * 0.1);
    analysis.run.cache_sizes = Some(CacheSizes {
        l1: 32 << 10,
        l2: 1 << 20,
        llc: 32 << 20,
        source: "--cache-sizes".into(),
    });
    analysis.lines = (0..12)
        .map(|i| LineLocality {
            line: format!("/home/someone/src/{package}/crates/{package}-core/src/collections/lookup_table.rs:{}", 100 + i),
            function: Some(format!("{package}::collections::lookup_table::LookupTable<K,V>::get_or_insert_with")),
            a_hat: 1e7 / f64::from(i + 1),
            misses_l1: 8e6 * scale / f64::from(i + 1),
            misses_l2: 4e6 * scale / f64::from(i + 1),
            misses_llc: 1e6 * scale / f64::from(i + 1),
        })
        .collect();
}

/// Runs Chromium with `args` on `url`, killed after two minutes; returns
/// its stdout (through a file: a dumped DOM would fill a pipe that is
/// read only after the exit).
fn run_chromium(chromium: &Path, profile: &Path, args: &[String], url: &str) -> String {
    let stdout = profile.with_extension("stdout");
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within two minutes on {url}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    String::from_utf8_lossy(&std::fs::read(&stdout).unwrap()).into_owned()
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

#[test]
fn the_report_fits_laptop_screens_in_chromium() {
    let Some(chromium) = chromium() else {
        if std::env::var_os("MEMGAZE_SKIP_BROWSER").is_some() {
            eprintln!(
                "note: MEMGAZE_SKIP_BROWSER set and no chromium: the layout test did not run"
            );
            return;
        }
        panic!(
            "no `chromium` on PATH: install Debian's chromium (`apt-get install -y chromium`; \
             ci/test.sh does), or set MEMGAZE_SKIP_BROWSER=1 to skip this test"
        );
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("memgaze");
    for (i, kernel) in Kernel::ALL.into_iter().enumerate() {
        let key = BenchKey::new("microbenches", "micro", kernel.name());
        bench(&root, &key, kernel, i as u64 + 1);
    }
    // Long names, as a crate with parameterised benches has them.
    let long = BenchKey::new("hashmap-vs-btree", "lookup", "btreemap_lookup/100000");
    let before = bench(&root, &long, Kernel::Str1, 11);
    save_baseline(
        &root,
        "main",
        &[BenchRun {
            key: long.clone(),
            analysis: before,
            binary: None,
            profile: None,
        }],
    )
    .unwrap();
    bench(&root, &long, Kernel::IrrRand, 12);
    bench(
        &root,
        &BenchKey::new("hashmap-vs-btree", "lookup", "hashmap_lookup/100000"),
        Kernel::IrrHalf,
        13,
    );

    let out = tmp.path().join("report");
    let mut options = ReportOptions::new(&out);
    options.baseline = Some(load_baseline(&root, "main").unwrap());
    let written = report_results(&root, &options).unwrap();
    assert!(
        written.regressions().count() > 0,
        "the long-named bench regressed"
    );
    let html = std::fs::read_to_string(&written.index).unwrap();
    assert!(!html.contains("<script"), "the product has no script");
    // Regressions first: the regressed bench heads the overview.
    let first_row = html
        .split("<td class=\"bench\">")
        .nth(1)
        .and_then(|row| row.split("</td>").next())
        .unwrap();
    assert!(
        first_row.contains(
            ">btreemap_lookup/100000</a><span class=\"target\">hashmap-vs-btree/lookup</span>"
        ),
        "{first_row}"
    );
    let probe_page = out.join("probe.html");
    std::fs::write(
        &probe_page,
        html.replace("</body>", &format!("<script>{PROBE}</script></body>")),
    )
    .unwrap();
    let url = format!("file://{}", probe_page.display());
    let profile = tmp.path().join("chromium-profile");
    let shots = std::env::var_os("MEMGAZE_SCREENSHOTS").map(PathBuf::from);

    for width in [1280, 1440] {
        let dom = run_chromium(
            &chromium,
            &profile,
            &[format!("--window-size={width},2000"), "--dump-dom".into()],
            &url,
        );
        // The last one: the script's own text names the element too.
        let json = dom
            .rsplit("<pre id=\"probe\">")
            .next()
            .filter(|_| dom.contains("<pre id=\"probe\">{"))
            .and_then(|rest| rest.split("</pre>").next())
            .unwrap_or_else(|| panic!("no probe result at {width} px; DOM:\n{dom}"));
        let probe: Probe = serde_json::from_str(&unescape(json)).unwrap();
        assert_eq!(probe.width, width, "{probe:?}");
        assert!(
            probe.broken.is_empty(),
            "{width} px: bench names broken across lines: {:?}",
            probe.broken
        );
        assert!(
            probe.squeezed.is_empty(),
            "{width} px: squeezed cells: {:?}",
            probe.squeezed
        );
        assert!(
            probe.overflowing.is_empty(),
            "{width} px: tables wider than the page without a scroll box: {:?}",
            probe.overflowing
        );
        assert!(
            probe.page_overflow <= 1.0,
            "{width} px: the page scrolls sideways by {} px",
            probe.page_overflow
        );
        if let Some(dir) = &shots {
            std::fs::create_dir_all(dir).unwrap();
            let png = dir.join(format!("report-{width}.png"));
            run_chromium(
                &chromium,
                &profile,
                &[
                    format!("--window-size={width},1100"),
                    format!("--screenshot={}", png.display()),
                ],
                &format!("file://{}", written.index.display()),
            );
            // The regressed bench's section follows the overview.
            let long_page = dir.join(format!("report-{width}-top-4000px.png"));
            run_chromium(
                &chromium,
                &profile,
                &[
                    format!("--window-size={width},4000"),
                    format!("--screenshot={}", long_page.display()),
                ],
                &format!("file://{}", written.index.display()),
            );
        }
    }
}
