//! Baselines and regression gates on analysed synthetic traces: round
//! trip, listing, unchanged code within default limits, a worse access
//! pattern caught, mismatched recordings refused, fail-fast.

use crate::support;

use memgaze::gate::{
    BenchKey, BenchRun, Gate, Limits, Metric, compare, list_baselines, load_baseline,
    save_baseline, save_baseline_bench,
};
use memgaze_analysis::{Analysis, AnalysisOptions, CacheSizes, analyze_trace};
use memgaze_error::{Exit, exit_for, one_line};
use memgaze_metadata::analysis::ObjectLoadCoverage;
use memgaze_trace::{SpatialSampling, TraceReader};
use std::path::Path;
use support::synthetic::{Kernel, Synthetic, write_trace_placed};

fn analyse(dir: &Path, kernel: Kernel, seed: u64, sampling: (u64, u64)) -> Analysis {
    analyse_placed(dir, kernel, seed, sampling, 0)
}

/// [`analyse`] with the kernel's data moved by `shift` bytes.
fn analyse_placed(
    dir: &Path,
    kernel: Kernel,
    seed: u64,
    sampling: (u64, u64),
    shift: u64,
) -> Analysis {
    let path = dir.join(format!(
        "{}-{seed}-{}-{shift}.mgz",
        kernel.name().replace(['/', '|'], "_"),
        sampling.1
    ));
    write_trace_placed(
        &path,
        &Synthetic {
            kernel,
            elements: 100_000,
            reps: 30,
            sampling: Some(sampling),
            seed,
        },
        shift,
    );
    analyze_trace(
        TraceReader::open(&path).unwrap(),
        &AnalysisOptions::default(),
    )
    .unwrap()
}

fn run(bench: &str, analysis: Analysis) -> BenchRun {
    BenchRun {
        key: BenchKey::new("microbenches", "micro", bench),
        analysis,
        binary: None,
        profile: Some("bench".into()),
    }
}

const SAMPLING: (u64, u64) = (1000, 50_000);

#[test]
fn baselines_round_trip_and_are_listed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    assert!(list_baselines(&root).unwrap().is_empty());
    let runs = [
        run("str1", analyse(dir.path(), Kernel::Str1, 1, SAMPLING)),
        run("str/irr", analyse(dir.path(), Kernel::StrIrr, 1, SAMPLING)),
    ];
    let saved = save_baseline(&root, "main", &runs).unwrap();
    assert!(saved.ends_with("baselines/main"));
    assert!(
        saved
            .join("microbenches/micro/str%2Firr/baseline.json")
            .is_file()
    );
    save_baseline_bench(&root, "pr-7", &runs[0]).unwrap();

    let main = load_baseline(&root, "main").unwrap();
    assert_eq!(main.benches.len(), 2);
    let back = main.bench(&runs[1].key).unwrap();
    assert_eq!(
        back.analysis, runs[1].analysis,
        "the analysis survives the round trip"
    );
    assert_eq!(back.recording.window, Some(SAMPLING.0));
    assert_eq!(back.recording.period, Some(SAMPLING.1));

    let list = list_baselines(&root).unwrap();
    let names: Vec<(&str, usize)> = list.iter().map(|b| (b.name.as_str(), b.benches)).collect();
    assert_eq!(names, [("main", 2), ("pr-7", 1)]);

    let e = load_baseline(&root, "nope").unwrap_err();
    assert!(
        one_line(&e).contains("baseline `nope` not found"),
        "{}",
        one_line(&e)
    );
    assert!(
        one_line(&e).contains("saved baselines: main, pr-7"),
        "{}",
        one_line(&e)
    );
    let e = load_baseline(&root, "../etc").unwrap_err();
    assert_eq!(exit_for(&e), Exit::Usage);
}

#[test]
fn unchanged_code_stays_within_default_limits_across_sampling_jitter() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    let kernels = [
        Kernel::Str1,
        Kernel::Irr,
        Kernel::StrIrr,
        Kernel::IrrStrIrr,
        Kernel::Chase,
    ];
    let old: Vec<BenchRun> = kernels
        .iter()
        .map(|k| run(k.name(), analyse(dir.path(), *k, 1, SAMPLING)))
        .collect();
    save_baseline(&root, "main", &old).unwrap();
    // Another seed: the samples fall elsewhere, the program is the same.
    let new: Vec<BenchRun> = kernels
        .iter()
        .map(|k| run(k.name(), analyse(dir.path(), *k, 2, SAMPLING)))
        .collect();
    let (verdicts, gate) = compare(
        load_baseline(&root, "main").unwrap(),
        &new,
        &Limits::defaults(),
        false,
    )
    .unwrap();
    for v in &verdicts {
        assert!(v.has_baseline);
        assert!(v.regressions.is_empty(), "{}", v.human("main"));
        assert!(
            v.metrics
                .iter()
                .any(|m| m.metric == Metric::DF && m.old.is_some())
        );
    }
    assert_eq!(gate.exit(), Exit::Ok);
    assert!(
        gate.summary()
            .starts_with("5 bench(es) within the limits of baseline `main`")
    );
}

/// Data placed elsewhere (another allocation before it, another bench in
/// the binary) is the same program: every kernel, its data moved by 8 to
/// 56 bytes (across line boundaries) and sampled with another seed, stays
/// within the default limits, line-level `dF_lines` included.
#[test]
fn moved_data_stays_within_default_limits() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    let old: Vec<BenchRun> = Kernel::ALL
        .iter()
        .map(|k| run(k.name(), analyse(dir.path(), *k, 1, SAMPLING)))
        .collect();
    save_baseline(&root, "main", &old).unwrap();
    for shift in [8, 24, 56] {
        let new: Vec<BenchRun> = Kernel::ALL
            .iter()
            .map(|k| {
                let seed = 2 + shift;
                run(
                    k.name(),
                    analyse_placed(dir.path(), *k, seed, SAMPLING, shift),
                )
            })
            .collect();
        let (verdicts, gate) = compare(
            load_baseline(&root, "main").unwrap(),
            &new,
            &Limits::defaults(),
            false,
        )
        .unwrap();
        for v in &verdicts {
            assert!(
                v.regressions.is_empty(),
                "shift {shift}: {}",
                v.human("main")
            );
            assert!(
                v.metrics
                    .iter()
                    .any(|m| m.metric == Metric::DFLines && m.limit.is_some() && m.old.is_some()),
                "{}",
                v.human("main")
            );
        }
        assert_eq!(gate.exit(), Exit::Ok);
    }
}

#[test]
fn a_worse_access_pattern_is_a_regression_in_human_and_json_form() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    // The "same bench" switches from an array scan to a linked-list walk.
    save_baseline(
        &root,
        "main",
        &[run("walk", analyse(dir.path(), Kernel::Str1, 1, SAMPLING))],
    )
    .unwrap();
    let worse = run("walk", analyse(dir.path(), Kernel::Chase, 2, SAMPLING));
    let mut gate = Gate::new(
        load_baseline(&root, "main").unwrap(),
        Limits::defaults(),
        false,
    );
    let verdict = gate.check(&worse).unwrap();
    let metrics: Vec<Metric> = verdict.regressions.iter().map(|r| r.metric).collect();
    assert!(metrics.contains(&Metric::FIrrFrac), "{metrics:?}");
    assert!(metrics.contains(&Metric::FStrFrac), "{metrics:?}");
    assert_eq!(gate.exit(), Exit::Regression);

    let human = verdict.human("main");
    assert!(
        human.contains(
            "regression: microbenches/micro/walk: F_irr_frac 0 → 1 (+1 from 0; limit +0.1)"
        ),
        "{human}"
    );
    assert!(
        human.contains("F_str_frac 1 → 0 (-1; limit -0.1)"),
        "{human}"
    );

    let (comparison, regressions) = verdict.to_messages("main");
    assert_eq!(
        serde_json::to_value(&comparison).unwrap()["reason"],
        "baseline-comparison"
    );
    let json: Vec<serde_json::Value> = regressions
        .iter()
        .map(|r| serde_json::to_value(r).unwrap())
        .collect();
    let regression = json
        .iter()
        .find(|j| j["reason"] == "regression" && j["metric"] == "F_irr_frac")
        .unwrap();
    assert_eq!(regression["bench"], "walk");
    assert_eq!(regression["baseline"], "main");
    assert_eq!(regression["old"], 0.0);
    assert_eq!(regression["new"], 1.0);
    assert_eq!(regression["limit"], "+0.1");
    assert!(regression["change_frac"].is_null());
}

/// The default recording: time samples plus spatial sampling at 1/128.
/// The recorder does not write spatial records yet, so the whole-run part
/// is emulated on the kernel's full trace (exactly what the tracked stream
/// of a spatially sampled run holds) and joined to the sampled analysis.
/// Cache sizes are fixed so that the test does not depend on the machine.
fn analyse_default_recording(dir: &Path, kernel: Kernel, seed: u64) -> Analysis {
    analyse_default_recording_placed(dir, kernel, seed, 0)
}

/// [`analyse_default_recording`] with every data address moved by `shift`
/// bytes (another heap placement: other blocks are tracked).
fn analyse_default_recording_placed(dir: &Path, kernel: Kernel, seed: u64, shift: u64) -> Analysis {
    let mut sampled = analyse(dir, kernel, seed, SAMPLING);
    let full = dir.join(format!(
        "{}-{seed}-{shift}-full.mgz",
        kernel.name().replace(['/', '|'], "_")
    ));
    write_trace_placed(
        &full,
        &Synthetic {
            kernel,
            elements: 100_000,
            reps: 30,
            sampling: None,
            seed,
        },
        shift,
    );
    let whole = analyze_trace(
        TraceReader::open(&full).unwrap(),
        &AnalysisOptions {
            cache_sizes: Some(CacheSizes {
                l1: 32 << 10,
                l2: 1 << 20,
                llc: 32 << 20,
                source: "--cache-sizes".into(),
            }),
            emulate_spatial: SpatialSampling::with_rate(1.0 / 128.0),
            ..AnalysisOptions::default()
        },
    )
    .unwrap();
    let (s, w) = (&mut sampled.summary, whole.summary);
    s.whole_run = w.whole_run;
    (s.misses_l1, s.misses_l2, s.misses_llc) = (w.misses_l1, w.misses_l2, w.misses_llc);
    (s.spatial_rate, s.tracked_accesses, s.mrc_groups) =
        (w.spatial_rate, w.tracked_accesses, w.mrc_groups);
    sampled.run.cache_sizes = whole.run.cache_sizes;
    sampled
}

/// What time windows miss: a Vec walked with a stride of 64 bytes instead
/// of 8 is all Strided loads either way (F_str_frac, F_irr_frac unchanged),
/// but every load now touches a new cache line. The whole-run miss ratios,
/// gated by default, catch it with exit 3; another seed or another
/// placement of the data (other blocks tracked) passes.
#[test]
fn a_wider_stride_fails_on_the_whole_run_miss_ratios() {
    let limits = Limits::defaults();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    let baseline = analyse_default_recording(dir.path(), Kernel::Str1, 1);
    save_baseline(&root, "main", &[run("walk", baseline.clone())]).unwrap();
    // Unchanged code, another sampling seed or placement: within the
    // default limits.
    for (seed, shift) in [(2, 0), (1, 3 * 4096 + 24), (3, 40_000)] {
        let mut gate = Gate::new(load_baseline(&root, "main").unwrap(), limits.clone(), false);
        let same = gate
            .check(&run(
                "walk",
                analyse_default_recording_placed(dir.path(), Kernel::Str1, seed, shift),
            ))
            .unwrap();
        assert!(same.regressions.is_empty(), "{}", same.human("main"));
    }

    let wider = analyse_default_recording(dir.path(), Kernel::Str8, 1);
    let mut gate = Gate::new(load_baseline(&root, "main").unwrap(), limits.clone(), false);
    let verdict = gate.check(&run("walk", wider.clone())).unwrap();
    let metrics: Vec<Metric> = verdict.regressions.iter().map(|r| r.metric).collect();
    assert!(metrics.contains(&Metric::MrL1), "{metrics:?}");
    assert!(metrics.contains(&Metric::MrL2), "{metrics:?}");
    assert!(!metrics.contains(&Metric::FIrrFrac) && !metrics.contains(&Metric::FStrFrac));
    assert_eq!(gate.exit(), Exit::Regression);
    // From one miss per 8 loads to one per load.
    let (old, new) = (
        baseline.summary.whole_run.mr_l1.unwrap(),
        wider.summary.whole_run.mr_l1.unwrap(),
    );
    assert!(
        (old - 0.125).abs() < 0.02 && new > 0.95,
        "MR_L1 {old} → {new}"
    );
    let human = verdict.human("main");
    assert!(human.contains("MR_L1"), "{human}");
}

/// Benches the baseline lacks pass, but the closing line must not count
/// them as compared: a run none of whose benches is in the baseline (an
/// empty or stale one, renamed benches) says that nothing was compared.
#[test]
fn the_summary_counts_benches_missing_from_the_baseline_apart() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    let a = analyse(dir.path(), Kernel::Str1, 1, SAMPLING);
    save_baseline(&root, "main", &[run("one", a.clone())]).unwrap();

    let (_, gate) = compare(
        load_baseline(&root, "main").unwrap(),
        &[run("renamed", a.clone()), run("new", a.clone())],
        &Limits::defaults(),
        false,
    )
    .unwrap();
    assert_eq!(gate.exit(), Exit::Ok);
    assert_eq!(
        gate.summary(),
        "nothing compared with baseline `main`: none of the 2 bench(es) checked is in it"
    );

    let (_, gate) = compare(
        load_baseline(&root, "main").unwrap(),
        &[run("one", a.clone()), run("new", a)],
        &Limits::defaults(),
        false,
    )
    .unwrap();
    let summary = gate.summary();
    assert!(
        summary.starts_with("1 bench(es) within the limits of baseline `main` ("),
        "{summary}"
    );
    assert!(
        summary.ends_with("; 1 not in the baseline (nothing compared)"),
        "{summary}"
    );
}

#[test]
fn runs_recorded_differently_are_refused_with_one_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    save_baseline(
        &root,
        "main",
        &[run("irr", analyse(dir.path(), Kernel::Irr, 1, SAMPLING))],
    )
    .unwrap();
    let other = run("irr", analyse(dir.path(), Kernel::Irr, 1, (1000, 20_000)));
    let mut gate = Gate::new(
        load_baseline(&root, "main").unwrap(),
        Limits::defaults(),
        false,
    );
    let e = gate.check(&other).unwrap_err();
    assert_eq!(exit_for(&e), Exit::Usage);
    assert_eq!(
        one_line(&e),
        "cannot compare microbenches/micro/irr with baseline `main`: the baseline was recorded with \
         --period 50000 --window 1000 with the soft backend, this run with --period 20000 --window 1000 \
         with the soft backend; record both the same way (or save a new baseline)"
    );
}

/// A run that traced shared libraries' loads (`--libs default`) is not
/// compared with one that traced none; two with different libraries are,
/// with a note.
#[test]
fn runs_tracing_libraries_are_not_compared_with_runs_tracing_none() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    let plain = analyse(dir.path(), Kernel::Irr, 1, SAMPLING);
    let with = |objects: &[&str]| {
        let mut analysis = plain.clone();
        analysis.summary.coverage_by_object = objects
            .iter()
            .map(|name| ObjectLoadCoverage {
                object: name.to_string(),
                instrumented: true,
                loads_executed: Some(100.0),
                loads_traced: 100.0,
                share: Some(1.0),
            })
            .collect();
        analysis
    };
    save_baseline(&root, "none", &[run("irr", plain.clone())]).unwrap();
    let gate = |baseline: &str| {
        Gate::new(
            load_baseline(&root, baseline).unwrap(),
            Limits::defaults(),
            false,
        )
    };
    let e = gate("none")
        .check(&run("irr", with(&["micro", "libm.so.6", "libc.so.6"])))
        .unwrap_err();
    assert_eq!(exit_for(&e), Exit::Usage);
    assert_eq!(
        one_line(&e),
        "cannot compare microbenches/micro/irr with baseline `none`: the baseline traced the loads of \
         shared libraries none (--libs none), this run of libc.so.6, libm.so.6; record both with the \
         same --libs (or save a new baseline)"
    );
    // The executable alone is no library.
    let verdict = gate("none").check(&run("irr", with(&["micro"]))).unwrap();
    assert!(verdict.regressions.is_empty(), "{:?}", verdict.regressions);
    save_baseline(&root, "libc", &[run("irr", with(&["micro", "libc.so.6"]))]).unwrap();
    let verdict = gate("libc")
        .check(&run("irr", with(&["micro", "libc.so.6", "libm.so.6"])))
        .unwrap();
    assert!(
        verdict.notes.iter().any(|n| n
            == "the instrumented libraries differ (baseline libc.so.6, this run libc.so.6, libm.so.6): \
                their loads are in one run's totals only"),
        "{:?}",
        verdict.notes
    );
    assert!(gate("libc").check(&run("irr", plain.clone())).is_err());
}

#[test]
fn builds_of_another_profile_are_refused_and_unknown_profiles_compared() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    let analysis = analyse(dir.path(), Kernel::Irr, 1, SAMPLING);
    save_baseline(&root, "main", &[run("irr", analysis.clone())]).unwrap();
    let saved =
        std::fs::read_to_string(root.join("baselines/main/microbenches/micro/irr/baseline.json"))
            .unwrap();
    assert!(saved.contains(r#""profile":"bench""#), "{saved}");
    let gate = |baseline: &str, profile: Option<&str>| {
        let mut gate = Gate::new(
            load_baseline(&root, baseline).unwrap(),
            Limits::defaults(),
            false,
        );
        let mut this = run("irr", analysis.clone());
        this.profile = profile.map(str::to_string);
        gate.check(&this).map(|v| v.regressions.len())
    };
    let e = gate("main", Some("dev")).unwrap_err();
    assert_eq!(exit_for(&e), Exit::Usage);
    assert_eq!(
        one_line(&e),
        "cannot compare microbenches/micro/irr with baseline `main`: the baseline was built with the \
         `bench` profile, this run with `dev`; build both with the same --profile (or save a new baseline)"
    );
    assert_eq!(gate("main", Some("bench")).unwrap(), 0);
    assert_eq!(gate("main", None).unwrap(), 0);

    // A baseline saved before profiles were recorded has none: compared.
    save_baseline(
        &root,
        "old",
        &[BenchRun {
            profile: None,
            ..run("irr", analysis.clone())
        }],
    )
    .unwrap();
    assert_eq!(gate("old", Some("dev")).unwrap(), 0);
}

#[test]
fn fail_fast_stops_at_the_first_regression_and_new_benches_pass() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    let a = analyse(dir.path(), Kernel::Str1, 1, SAMPLING);
    save_baseline(&root, "main", &[run("one", a.clone()), run("two", a)]).unwrap();
    let worse = analyse(dir.path(), Kernel::Chase, 1, SAMPLING);
    let runs = [
        run("one", worse.clone()),
        run("two", worse.clone()),
        run("three", worse),
    ];
    let (verdicts, gate) = compare(
        load_baseline(&root, "main").unwrap(),
        &runs,
        &Limits::defaults(),
        true,
    )
    .unwrap();
    assert_eq!(verdicts.len(), 1, "stopped after the first bench");
    assert_eq!(gate.regressions().len(), 1, "and at its first regression");
    assert!(gate.summary().contains("stopped at the first"));

    let (verdicts, gate) = compare(
        load_baseline(&root, "main").unwrap(),
        &runs,
        &Limits::parse("dF=+50%").unwrap(),
        false,
    )
    .unwrap();
    assert_eq!(verdicts.len(), 3);
    assert!(
        !verdicts[2].has_baseline,
        "a bench the baseline lacks is new, not a regression"
    );
    assert!(verdicts[2].human("main").contains("not in baseline `main`"));
    assert_eq!(
        gate.exit(),
        Exit::Ok,
        "dF alone does not change from scan to walk: {}",
        verdicts[0].human("main")
    );
}

#[test]
fn undersampled_runs_widen_the_limits_of_sampled_metrics_but_still_catch_a_new_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    // 3 M loads, one sample per 600 K: 5 samples.
    let sparse = (1000, 600_000);
    let old = analyse(dir.path(), Kernel::Str1, 1, sparse);
    assert_eq!(old.summary.samples, 5);
    save_baseline(&root, "main", &[run("walk", old)]).unwrap();
    let limit_of = |v: &memgaze::gate::BenchVerdict, metric: Metric| {
        v.metrics
            .iter()
            .find(|m| m.metric == metric)
            .and_then(|m| m.limit)
            .map(|l| l.to_string())
    };

    // The same program: within the widened limits, and the verdict says
    // by how much they were widened.
    let mut gate = Gate::new(
        load_baseline(&root, "main").unwrap(),
        Limits::defaults(),
        false,
    );
    let same = gate
        .check(&run("walk", analyse(dir.path(), Kernel::Str1, 2, sparse)))
        .unwrap();
    assert!(same.regressions.is_empty(), "{}", same.human("main"));
    assert!(
        same.notes
            .iter()
            .any(|n| n == "limits of sampled metrics widened ×2.45 (√(30/5)) to keep sampling noise inside them"),
        "{:?}",
        same.notes
    );
    assert_eq!(
        limit_of(&same, Metric::DFLines).as_deref(),
        Some("+49% and +0.049")
    );
    assert_eq!(limit_of(&same, Metric::FIrrFrac).as_deref(), Some("+0.245"));
    // Â is counted, not sampled: its limit stays.
    assert_eq!(limit_of(&same, Metric::AHat).as_deref(), Some("+10%"));

    // A linked-list walk instead of the array scan is still caught.
    let worse = gate
        .check(&run("walk", analyse(dir.path(), Kernel::Chase, 2, sparse)))
        .unwrap();
    let metrics: Vec<Metric> = worse.regressions.iter().map(|r| r.metric).collect();
    assert!(metrics.contains(&Metric::FIrrFrac), "{metrics:?}");
    assert!(
        worse
            .human("main")
            .contains("F_irr_frac 0 → 1 (+1 from 0; limit +0.245)"),
        "{}",
        worse.human("main")
    );
    assert_eq!(gate.exit(), Exit::Regression);
}

#[test]
fn the_noise_factor_grows_as_one_over_the_root_of_the_samples() {
    use memgaze::gate::compare::noise_factor;
    assert_eq!(noise_factor(0), None, "nothing sampled: nothing compared");
    assert_eq!(noise_factor(1), Some(5.48));
    assert_eq!(noise_factor(4), Some(2.74));
    assert_eq!(noise_factor(29), Some(1.02));
    assert_eq!(noise_factor(30), None);
    assert_eq!(noise_factor(1000), None);
}

/// A divan bench whose table gave no run count (a `threads` bench: a row
/// per thread count) ran for `--min-time` as many times as fit: its `Â` and
/// `misses_*` are totals over that count, not gated (a 3× change in the
/// count alone made a false regression), and the verdict says why.
#[test]
fn divan_totals_without_a_run_count_are_not_gated() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    let divan = |runs: f64| {
        let mut a = analyse(dir.path(), Kernel::Str1, 1, SAMPLING);
        a.summary.a_hat = a.summary.a_hat.map(|x| x * runs);
        a.summary.misses_l1 = a.summary.misses_l1.map(|x| x * runs);
        a.summary.iterations = None;
        a.run.command = ["div", "--bench", "--min-time", "1", "--exact", "div::walk"]
            .map(String::from)
            .to_vec();
        a
    };
    save_baseline(&root, "main", &[run("div::walk", divan(1.0))]).unwrap();
    let mut gate = Gate::new(
        load_baseline(&root, "main").unwrap(),
        Limits::defaults(),
        false,
    );
    let verdict = gate.check(&run("div::walk", divan(3.0))).unwrap();
    assert!(verdict.regressions.is_empty(), "{:?}", verdict.regressions);
    assert!(
        verdict
            .notes
            .iter()
            .any(|n| n.starts_with("A_hat and misses_* not compared: divan picks")),
        "{:?}",
        verdict.notes
    );
}

/// A criterion bench's `Â` counts a number of runs criterion's profiling
/// mode chose by time and did not report: two runs that differ only in
/// that count (here 3×) are not a regression, and the verdict says why
/// `A_hat` was left out. Without `--profile-time` in the command the same
/// change is one.
#[test]
fn criterion_a_hat_is_not_gated_and_the_verdict_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    let criterion = |runs: f64, command: &[&str]| {
        let mut a = analyse(dir.path(), Kernel::Str1, 1, SAMPLING);
        a.summary.a_hat = a.summary.a_hat.map(|x| x * runs);
        a.summary.iterations = None;
        a.run.command = command.iter().map(|s| s.to_string()).collect();
        a
    };
    let profiling = ["crit", "--bench", "--profile-time", "1", "--exact", "sum"];
    for (command, gated) in [(&profiling[..], false), (&["plain"][..], true)] {
        save_baseline(&root, "main", &[run("sum", criterion(1.0, command))]).unwrap();
        let mut gate = Gate::new(
            load_baseline(&root, "main").unwrap(),
            Limits::defaults(),
            false,
        );
        let verdict = gate.check(&run("sum", criterion(3.0, command))).unwrap();
        let regressed: Vec<Metric> = verdict.regressions.iter().map(|r| r.metric).collect();
        assert_eq!(regressed.contains(&Metric::AHat), gated, "{regressed:?}");
        let noted = verdict
            .notes
            .iter()
            .any(|n| n.starts_with("A_hat and misses_* not compared: criterion's profiling mode"));
        assert_eq!(noted, !gated, "{:?}", verdict.notes);
        if !gated {
            assert!(regressed.is_empty(), "{regressed:?}");
            assert!(
                verdict
                    .human("main")
                    .contains("A_hat and misses_* not compared")
            );
        }
    }
}

/// Criterion picks its iteration count — and `iter_batched` its batch of
/// live inputs — from a timed warm-up, so a run on a loaded machine can
/// execute half the work of the baseline with other whole-run miss ratios
/// (a user's `sort_unstable` bench read `MR_LLC 0.0043 → 0.0418` with no
/// code change). Runs whose executed loads differ by more than ×1.25 have
/// their `MR_*` left out with a note; runs of like work are still gated.
#[test]
fn criterion_miss_ratios_of_unlike_amounts_of_work_are_not_gated() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    let criterion = |work: f64, mr_llc: f64| {
        let mut a = analyse(dir.path(), Kernel::Str1, 1, SAMPLING);
        a.summary.a_hat = a.summary.a_hat.map(|x| x * work);
        a.summary.whole_run.mr_llc = Some(mr_llc);
        a.summary.iterations = None;
        a.run.command = ["crit", "--bench", "--profile-time", "1", "--exact", "sort"]
            .map(String::from)
            .to_vec();
        a
    };
    save_baseline(&root, "main", &[run("sort", criterion(1.0, 0.0043))]).unwrap();
    for (work, gated) in [(2.0, false), (1.1, true)] {
        let mut gate = Gate::new(
            load_baseline(&root, "main").unwrap(),
            Limits::defaults(),
            false,
        );
        let verdict = gate.check(&run("sort", criterion(work, 0.0418))).unwrap();
        let regressed: Vec<Metric> = verdict.regressions.iter().map(|r| r.metric).collect();
        assert_eq!(
            regressed.contains(&Metric::MrLlc),
            gated,
            "×{work}: {regressed:?}"
        );
        let noted = verdict
            .notes
            .iter()
            .any(|n| n.starts_with("MR_* not compared"));
        assert_eq!(noted, !gated, "×{work}: {:?}", verdict.notes);
        if !gated {
            assert!(
                verdict.metrics.iter().all(|m| m.metric != Metric::MrLlc),
                "MR_LLC left out of the table"
            );
        }
    }
}

/// Divan doubles its batch (runs per timed sample) until a batch outlasts
/// the timer's precision, and makes all of a batch's `with_inputs` inputs
/// before timing it: a user's `sum` over a fresh 8 KiB `Vec` per run read
/// `MR_L1 0.015 → 0.256` and `misses_L1 7.5 → 128.5` per run with no code
/// change, divan having picked larger batches. Runs with other batch sizes
/// have their `MR_*` and `misses_*` left out with a note; runs with the
/// same batch size are still gated on them.
#[test]
fn divan_miss_ratios_of_other_batch_sizes_are_not_gated() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("memgaze");
    let divan = |runs_per_batch: u64, mr_l1: f64| {
        let mut a = analyse(dir.path(), Kernel::Str1, 1, SAMPLING);
        a.summary.whole_run.mr_l1 = Some(mr_l1);
        a.summary.misses_l1 = a.summary.a_hat.map(|loads| loads * mr_l1);
        a.summary.iterations = Some(400_000);
        a.summary.runs_per_batch = Some(runs_per_batch);
        a.run.command = ["div", "--bench", "--min-time", "1", "--exact", "div::sum"]
            .map(String::from)
            .to_vec();
        a
    };
    save_baseline(&root, "main", &[run("div::sum", divan(1, 0.015))]).unwrap();
    for (runs_per_batch, gated) in [(16, false), (1, true)] {
        let mut gate = Gate::new(
            load_baseline(&root, "main").unwrap(),
            Limits::defaults(),
            false,
        );
        let verdict = gate
            .check(&run("div::sum", divan(runs_per_batch, 0.256)))
            .unwrap();
        let regressed: Vec<Metric> = verdict.regressions.iter().map(|r| r.metric).collect();
        for metric in [Metric::MrL1, Metric::MissesL1] {
            assert_eq!(
                regressed.contains(&metric),
                gated,
                "batch {runs_per_batch}: {regressed:?}"
            );
        }
        let noted = verdict.notes.iter().any(|n| {
            n.starts_with(
                "MR_* and misses_* not compared: the framework picked batches of 1 and 16 runs",
            )
        });
        assert_eq!(noted, !gated, "batch {runs_per_batch}: {:?}", verdict.notes);
        if !gated {
            assert!(regressed.is_empty(), "{regressed:?}");
            assert!(
                verdict.metrics.iter().all(|m| !m.metric.counts_misses()),
                "MR_* and misses_* left out of the table"
            );
        }
    }
}
