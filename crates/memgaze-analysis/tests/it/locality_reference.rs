//! Whole-run stack distances and miss-ratio curves against a brute-force
//! reference (an LRU stack as a list, O(n²)), per trace, function and
//! source line: exact curves of full traces, curves of spatially sampled
//! traces with the SHARDS correction, and the emulation of spatial
//! sampling on a full trace. Also: spatial records leave every other
//! metric exactly as it was, and a trace without spatial sampling has no
//! whole-run fields.

use memgaze_analysis::{
    Analysis, AnalysisOptions, Analyzer, CacheSizes, MrcPoint, WholeRunLocality,
    locality::curve_mae,
};
use memgaze_trace::{
    Backend, FunctionEntry, LoadClass, LoadEntry, Record, Sampling, SpatialSampling, TraceHeader,
    TraceTotals,
};
use proptest::prelude::*;
use std::collections::HashMap;

/// Load sites: two functions, lines shared between sites, some without.
fn sites(classes: &[LoadClass]) -> Vec<LoadEntry> {
    classes
        .iter()
        .enumerate()
        .map(|(i, &class)| LoadEntry {
            ip: 0x1000 * (1 + (i as u64 % 2)) + 16 * i as u64,
            class,
            implied: 0,
            function: None,
            line: (i % 4 != 3).then(|| format!("src/k.rs:{}", i % 3)),
            proxy: None,
        })
        .collect()
}

fn header(
    loads: Vec<LoadEntry>,
    sampling: Sampling,
    spatial: Option<SpatialSampling>,
) -> TraceHeader {
    TraceHeader {
        backend: Backend::Soft,
        sampling,
        binary: None,
        command: vec![],
        functions: ["alpha", "beta"]
            .iter()
            .enumerate()
            .map(|(i, n)| FunctionEntry {
                name: n.to_string(),
                start: 0x1000 * (i as u64 + 1),
                end: 0x1000 * (i as u64 + 1) + 0x800,
            })
            .collect(),
        loads,
        labels: vec![],
        spatial,
    }
}

/// Small caches, so that short random traces reach them.
fn caches() -> CacheSizes {
    CacheSizes {
        l1: 1 << 10,
        l2: 6 << 10,
        llc: 20 << 10,
        source: "--cache-sizes".into(),
    }
}

/// One executed load of the program: thread, site, address.
type Exec = (u32, usize, u64);

fn program() -> impl Strategy<Value = (Vec<LoadClass>, Vec<Exec>)> {
    // Blocks 0..600, skewed towards a hot set, a few bytes apart within.
    let block = prop_oneof![3 => 0u64..40, 2 => 0u64..600];
    program_of(block.boxed(), 0..2500)
}

/// Up to 8 load sites of mixed classes, and `executions` executions: thread
/// 0–2, a site, an address in one of the `block` 64-byte blocks.
fn program_of(
    block: BoxedStrategy<u64>,
    executions: std::ops::Range<usize>,
) -> impl Strategy<Value = (Vec<LoadClass>, Vec<Exec>)> {
    let class = prop_oneof![
        3 => Just(LoadClass::Strided),
        3 => Just(LoadClass::Irregular),
        1 => Just(LoadClass::Constant),
    ];
    let classes = prop::collection::vec(class, 1..8);
    let exec = (0u32..3, 0usize..8, block, 0u64..64);
    (classes, prop::collection::vec(exec, executions)).prop_map(|(classes, execs)| {
        let n = classes.len();
        let execs = execs
            .into_iter()
            .map(|(t, s, b, off)| (t, s % n, 0x10_0000 + b * 64 + off))
            .collect();
        (classes, execs)
    })
}

fn record(loads: &[LoadEntry], (thread, site, addr): Exec, sample: u64, spatial: bool) -> Record {
    Record {
        ip: loads[site].ip,
        addr,
        class: loads[site].class,
        implied: 0,
        sample,
        thread,
        spatial,
    }
}

/// The brute-force reference: tracked accesses in program order per
/// thread, each with its site and stack distance (`None`: cold).
fn naive_distances(tracked: &[Exec]) -> Vec<(usize, Option<u64>)> {
    let mut stacks: HashMap<u32, Vec<u64>> = HashMap::new();
    tracked
        .iter()
        .map(|&(thread, site, addr)| {
            let stack = stacks.entry(thread).or_default();
            let block = addr >> 6;
            let d = match stack.iter().rposition(|&b| b == block) {
                Some(pos) => {
                    stack.remove(pos);
                    Some((stack.len() - pos) as u64)
                }
                None => None,
            };
            stack.push(block);
            (site, d)
        })
        .collect()
}

/// Reference probability that an access of sampled distance `d'` misses
/// at `c` blocks: exact (`R = 1`) or, for `d' < 64` when sampled, the
/// posterior of the true distance `D` (binomial likelihood, prior
/// `1/(D + 1)`), summed term by term from binomial coefficients;
/// `d' ≥ 64` compare `d'/R` with `c`.
fn miss_probability(d: Option<u64>, c: u64, rate: f64) -> f64 {
    let Some(d) = d else { return 1.0 };
    if rate == 1.0 || d >= 64 {
        return if d as f64 >= c as f64 * rate {
            1.0
        } else {
            0.0
        };
    }
    thread_local! {
        static MEMO: std::cell::RefCell<HashMap<(u64, u64, u64), f64>> = Default::default();
    }
    let key = (d, c, rate.to_bits());
    if let Some(p) = MEMO.with(|m| m.borrow().get(&key).copied()) {
        return p;
    }
    let q: f64 = 1.0 - rate;
    let (mut above, mut total) = (0.0, 0.0);
    // ln C(D, d) from scratch at every D (slow, independent).
    let ln_choose = |big: u64| -> f64 {
        (0..d)
            .map(|j| ((big - j) as f64).ln() - ((j + 1) as f64).ln())
            .sum()
    };
    let limit = ((d + 1) as f64 / rate * 40.0) as u64 + 1000;
    for big in d..limit {
        let w = (ln_choose(big) + (big - d) as f64 * q.ln()).exp() / (big + 1) as f64;
        total += w;
        if big >= c {
            above += w;
        }
    }
    let p = above / total;
    MEMO.with(|m| m.borrow_mut().insert(key, p));
    p
}

/// How the reference turns a sampled distance `d'` into the probability
/// of a miss at `c` blocks: [`miss_probability`] under the scale-free
/// prior, or under a prior measured from the time samples
/// ([`measured_model`]) for `d' < 64`.
struct Model {
    rate: f64,
    measured: Option<MeasuredPrior>,
}

/// A prior of `D` measured by brute force: Kaplan–Meier survival `S(k)`
/// for `k ≤ H`, then `c/(D + 1)`.
struct MeasuredPrior {
    survival: Vec<f64>,
    tail: f64,
    /// Per `d'`: the posterior weights of `D = d', d' + 1, …`.
    memo: std::cell::RefCell<HashMap<u64, Vec<f64>>>,
}

impl Model {
    fn scale_free(rate: f64) -> Model {
        Model {
            rate,
            measured: None,
        }
    }

    fn miss(&self, d: Option<u64>, c: u64) -> f64 {
        match (&self.measured, d) {
            (Some(prior), Some(d)) if self.rate < 1.0 && d < 64 => prior.miss(d, c, self.rate),
            _ => miss_probability(d, c, self.rate),
        }
    }
}

impl MeasuredPrior {
    fn prior(&self, big: u64) -> f64 {
        let head = self.survival.len() - 1;
        match usize::try_from(big) {
            Ok(k) if k < head => self.survival[k] - self.survival[k + 1],
            _ => self.tail / (big + 1) as f64,
        }
    }

    /// `P(D ≥ c | d')`: binomial likelihood times the prior, term by term
    /// from binomial coefficients; the scale-free row when the prior gives
    /// `d'` no weight.
    fn miss(&self, d: u64, c: u64, rate: f64) -> f64 {
        let mut memo = self.memo.borrow_mut();
        let weights = memo.entry(d).or_insert_with(|| {
            let head = (self.survival.len() - 1) as u64;
            let limit = ((d + 1) as f64 / rate * 40.0) as u64 + 1000 + head;
            (d..limit)
                .map(|big| {
                    let ln_choose: f64 = (0..d)
                        .map(|j| ((big - j) as f64).ln() - ((j + 1) as f64).ln())
                        .sum();
                    (ln_choose + (big - d) as f64 * (1.0 - rate).ln()).exp() * self.prior(big)
                })
                .collect()
        });
        let total: f64 = weights.iter().sum();
        if total > 0.0 {
            let first_miss = c.saturating_sub(d) as usize;
            weights.iter().skip(first_miss).sum::<f64>() / total
        } else {
            miss_probability(Some(d), c, rate)
        }
    }
}

/// The prior of small distances a sampled run measures (docs/METRICS.md,
/// "Small distances"), by brute force from its records: per window (a
/// sample's records of one thread) a list stack of the Strided and
/// Irregular records' blocks gives each access its in-window distance, or
/// a right-censored one (cold in the window: at least the distinct blocks
/// seen before it); both are capped at 4,096. The Kaplan–Meier estimate by
/// its definition until fewer than 1,000 observations remain at risk (`H`);
/// past `H` the scale-free tail holds the rest up to the footprint `M`
/// (per thread the distinct tracked blocks, summed, over `R`, at least
/// `2H`). With `H < 2`, wholly scale-free.
fn measured_model(loads: &[LoadEntry], records: &[Record], tracked: &[Exec], rate: f64) -> Model {
    let mut windows: HashMap<(u64, u32), Vec<u64>> = HashMap::new();
    // (value, exact): an event at `value`, or censored at `value`.
    let mut observations: Vec<(u64, bool)> = Vec::new();
    for r in records.iter().filter(|r| !r.spatial && r.class.is_access()) {
        debug_assert!(loads.iter().any(|l| l.ip == r.ip));
        let window = windows.entry((r.sample, r.thread)).or_default();
        let block = r.addr >> 6;
        match window.iter().rposition(|&b| b == block) {
            Some(pos) => {
                window.remove(pos);
                let d = (window.len() - pos) as u64;
                observations.push(if d < 4096 { (d, true) } else { (4096, false) });
            }
            None => observations.push(((window.len() as u64).min(4096), false)),
        }
        window.push(block);
    }
    let mut survival = vec![1.0f64];
    for k in 0..4096u64 {
        let at_risk = observations
            .iter()
            .filter(|&&(v, exact)| if exact { v >= k } else { v > k })
            .count();
        if at_risk < 1000 {
            break;
        }
        let events = observations.iter().filter(|&&o| o == (k, true)).count();
        survival.push(survival[k as usize] * (1.0 - events as f64 / at_risk as f64));
    }
    let head = survival.len() - 1;
    let (survival, tail) = if head >= 2 {
        let mut per_thread: HashMap<u32, std::collections::HashSet<u64>> = HashMap::new();
        for e in tracked {
            per_thread.entry(e.0).or_default().insert(e.2 >> 6);
        }
        let distinct: usize = per_thread.values().map(|b| b.len()).sum();
        let footprint = (distinct as f64 / rate).max(2.0 * head as f64);
        let tail = survival[head] / ((footprint + 1.0) / (head as f64 + 1.0)).ln();
        (survival, tail)
    } else {
        (vec![1.0], 1.0)
    };
    Model {
        rate,
        measured: Some(MeasuredPrior {
            survival,
            tail,
            memo: Default::default(),
        }),
    }
}

/// Reference `MR̂(C)` of the accesses of the sites `keep` selects; the
/// denominator is `N·R` (`N` the sites' estimated executions) when
/// positive, else the tracked count.
fn naive_curve(
    distances: &[(usize, Option<u64>)],
    executions: &[f64],
    keep: impl Fn(usize) -> bool,
    sizes: &[u64],
    model: &Model,
) -> Vec<f64> {
    let rate = model.rate;
    let tracked = distances.iter().filter(|(s, _)| keep(*s)).count() as f64;
    let n: f64 = (0..executions.len())
        .filter(|&s| keep(s))
        .map(|s| executions[s])
        .sum();
    let den = if n * rate > 0.0 { n * rate } else { tracked };
    sizes
        .iter()
        .map(|&c| (naive_misses(distances, &keep, c, model) * rate / den).clamp(0.0, 1.0))
        .collect()
}

/// Estimated misses at `c` blocks: miss probabilities weighted `1/R`.
fn naive_misses(
    distances: &[(usize, Option<u64>)],
    keep: impl Fn(usize) -> bool,
    c: u64,
    model: &Model,
) -> f64 {
    distances
        .iter()
        .filter(|(s, _)| keep(*s))
        .map(|(_, d)| model.miss(*d, c))
        .sum::<f64>()
        / model.rate
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-7 * (1.0 + a.abs().max(b.abs()))
}

fn ratios(curve: &[MrcPoint]) -> Vec<f64> {
    curve.iter().map(|p| p.miss_ratio).collect()
}

/// Checks the analysis's trace, function and line curves against the
/// reference over `tracked` (`executions`: `N` per site).
fn check_against_reference(
    got: &Analysis,
    loads: &[LoadEntry],
    tracked: &[Exec],
    executions: &[f64],
    model: &Model,
) -> Result<(), TestCaseError> {
    let rate = model.rate;
    let distances = naive_distances(tracked);
    let s = &got.summary;
    prop_assert_eq!(s.tracked_accesses, Some(tracked.len() as u64));
    prop_assert_eq!(s.spatial_rate, Some(rate));
    let caches = caches();
    let cache_blocks = [caches.l1 / 64, caches.l2 / 64, caches.llc / 64];
    let mut sizes: Vec<u64> = (6..=24).map(|k| 1u64 << k).chain(cache_blocks).collect();
    sizes.sort_unstable();
    sizes.dedup();
    if tracked.is_empty() {
        prop_assert!(s.whole_run.mrc.is_empty());
        prop_assert_eq!(s.whole_run.mr_l1, None);
        return Ok(());
    }
    let blocks: Vec<u64> = s.whole_run.mrc.iter().map(|p| p.blocks).collect();
    prop_assert_eq!(&blocks, &sizes);
    prop_assert!(s.whole_run.mrc.iter().all(|p| p.bytes == p.blocks * 64));
    let access = |site: usize| loads[site].class.is_access();
    let want = naive_curve(&distances, executions, access, &sizes, model);
    let got_curve = ratios(&s.whole_run.mrc);
    for (g, w) in got_curve.iter().zip(&want) {
        prop_assert!(close(*g, *w), "trace curve {:?} want {:?}", got_curve, want);
    }
    if !s.mrc_groups.is_empty() || rate < 1.0 {
        // The block groups add up to the curve (before clamping).
        prop_assert_eq!(s.mrc_groups.len(), 32);
        for (i, w) in want.iter().enumerate() {
            let sum: f64 = s.mrc_groups.iter().map(|g| g[i]).sum();
            prop_assert!(close(sum.clamp(0.0, 1.0), *w), "groups {} want {}", sum, w);
        }
    }
    let at = |c: u64| sizes.iter().position(|&x| x == c).unwrap();
    for (mr, c) in [s.whole_run.mr_l1, s.whole_run.mr_l2, s.whole_run.mr_llc]
        .iter()
        .zip(cache_blocks)
    {
        prop_assert!(close(mr.unwrap(), want[at(c)]));
    }
    for (m, c) in [s.misses_l1, s.misses_l2, s.misses_llc]
        .iter()
        .zip(cache_blocks)
    {
        prop_assert!(close(
            m.unwrap(),
            naive_misses(&distances, access, c, model)
        ));
    }

    // Per function: sites by ip range (alpha 0x1000.., beta 0x2000..).
    for f in &got.functions {
        let base = if f.name == "alpha" { 0x1000 } else { 0x2000 };
        let keep = |site: usize| access(site) && loads[site].ip & !0xfff == base;
        let tracked_here = distances.iter().any(|(s, _)| keep(*s));
        if !tracked_here {
            prop_assert!(
                f.whole_run.mrc.is_empty(),
                "{} has a curve without tracked accesses",
                f.name
            );
            continue;
        }
        let want = naive_curve(&distances, executions, keep, &sizes, model);
        let got_curve = ratios(&f.whole_run.mrc);
        prop_assert_eq!(got_curve.len(), want.len());
        for (g, w) in got_curve.iter().zip(&want) {
            prop_assert!(close(*g, *w), "{}: {:?} want {:?}", f.name, got_curve, want);
        }
        prop_assert!(close(f.whole_run.mr_l2.unwrap(), want[at(cache_blocks[1])]));
    }

    // Per line.
    let mut lines_seen = 0;
    for line in &got.lines {
        lines_seen += 1;
        let keep =
            |site: usize| access(site) && loads[site].line.as_deref() == Some(line.line.as_str());
        for (m, c) in [line.misses_l1, line.misses_l2, line.misses_llc]
            .iter()
            .zip(cache_blocks)
        {
            prop_assert!(
                close(*m, naive_misses(&distances, keep, c, model)),
                "{}",
                line.line
            );
        }
        let tracked_here = distances.iter().filter(|(s, _)| keep(*s)).count() as f64;
        let n: f64 = (0..loads.len())
            .filter(|&s| keep(s))
            .map(|s| executions[s])
            .sum();
        let want_a = if n > 0.0 { n } else { tracked_here / rate };
        prop_assert!(
            close(line.a_hat, want_a),
            "{}: A_hat {} want {}",
            line.line,
            line.a_hat,
            want_a
        );
    }
    let want_lines: std::collections::HashSet<&str> = distances
        .iter()
        .filter_map(|(s, _)| loads[*s].line.as_deref())
        .collect();
    prop_assert_eq!(lines_seen, want_lines.len());
    Ok(())
}

fn options() -> AnalysisOptions {
    AnalysisOptions {
        cache_sizes: Some(caches()),
        ..AnalysisOptions::default()
    }
}

fn full_trace(loads: &[LoadEntry], execs: &[Exec], options: &AnalysisOptions) -> Analysis {
    let header = header(loads.to_vec(), Sampling::full(), None);
    let mut a = Analyzer::new(&header, options).unwrap();
    for &e in execs {
        a.push(&record(loads, e, 0, false));
    }
    let n = execs.len() as u64;
    a.finish(&TraceTotals::clean(n, n, u64::from(n > 0)))
}

/// Which executions a spatially sampled run records: runs of the program
/// fall in time samples (`in_sample`), the others are recorded only when
/// their load is Strided or Irregular and their block tracked.
struct Sampled {
    records: Vec<Record>,
    /// Per site: time-sample records.
    time_records: Vec<u64>,
    time_total: u64,
    /// What the whole-run curve sees, in order.
    tracked: Vec<Exec>,
}

fn sample_run(
    loads: &[LoadEntry],
    execs: &[Exec],
    in_sample: &[bool],
    spatial: SpatialSampling,
) -> Sampled {
    let mut out = Sampled {
        records: Vec::new(),
        time_records: vec![0; loads.len()],
        time_total: 0,
        tracked: Vec::new(),
    };
    let mut sample = 0u64;
    let mut previous = false;
    for (i, &e) in execs.iter().enumerate() {
        let inside = in_sample[i % in_sample.len()];
        let access = loads[e.1].class.is_access();
        let tracked = access && spatial.tracks(e.2);
        if inside {
            if !previous && i > 0 {
                sample += 1;
            }
            out.records.push(record(loads, e, sample, false));
            out.time_records[e.1] += 1;
            out.time_total += 1;
        } else if tracked {
            out.records.push(record(loads, e, sample, true));
        }
        if tracked {
            out.tracked.push(e);
        }
        previous = inside;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// A full trace: Mattson's exact curve over every Strided and
    /// Irregular record, per thread.
    #[test]
    fn exact_curve_matches_the_brute_force_stack((classes, execs) in program()) {
        let loads = sites(&classes);
        let got = full_trace(&loads, &execs, &options());
        let tracked: Vec<Exec> = execs.iter().copied().filter(|e| loads[e.1].class.is_access()).collect();
        let mut executions = vec![0.0; loads.len()];
        for e in &tracked {
            executions[e.1] += 1.0;
        }
        check_against_reference(&got, &loads, &tracked, &executions, &Model::scale_free(1.0))?;
        prop_assert!(got.summary.mrc_groups.is_empty(), "exact curves have no bootstrap groups");
        prop_assert_eq!(got.run.cache_sizes, Some(caches()));
    }

    /// Spatial sampling emulated on a full trace: the tracked records, `N`
    /// exact; and the time-window metrics are those of the full trace.
    #[test]
    fn emulated_curve_matches_the_reference((classes, execs) in program(), log2_inverse in 0u32..4) {
        let loads = sites(&classes);
        let spatial = SpatialSampling::with_rate(1.0 / f64::from(1 << log2_inverse)).unwrap();
        let options = AnalysisOptions { emulate_spatial: Some(spatial), ..options() };
        let got = full_trace(&loads, &execs, &options);
        let tracked: Vec<Exec> = execs
            .iter()
            .copied()
            .filter(|e| loads[e.1].class.is_access() && spatial.tracks(e.2))
            .collect();
        let mut executions = vec![0.0; loads.len()];
        for e in execs.iter().filter(|e| loads[e.1].class.is_access()) {
            executions[e.1] += 1.0;
        }
        check_against_reference(&got, &loads, &tracked, &executions, &Model::scale_free(spatial.rate()))?;
        let exact = full_trace(&loads, &execs, &self::options());
        prop_assert_eq!(&got.trace_windows, &exact.trace_windows);
        prop_assert_eq!(got.summary.d_mean, exact.summary.d_mean);
    }

    /// A spatially sampled trace: spatial records and the time-sample
    /// records on tracked blocks, `N = ρ ×` time-sample records; spatial
    /// records change nothing but the whole-run fields.
    #[test]
    fn sampled_curve_matches_the_reference_and_leaves_the_rest_alone(
        (classes, execs) in program(),
        in_sample in prop::collection::vec(any::<bool>(), 1..40),
        log2_inverse in 0u32..4,
    ) {
        let loads = sites(&classes);
        let spatial = SpatialSampling::with_rate(1.0 / f64::from(1 << log2_inverse)).unwrap();
        let run = sample_run(&loads, &execs, &in_sample, spatial);
        let sampling = Sampling { window: 50, period: 500, seed: None };
        let samples = run.records.last().map_or(0, |r| r.sample + 1);
        let executions_total = execs.len() as u64;
        let totals = TraceTotals::clean(executions_total, run.time_total, samples);
        // In-window distances at 128-byte blocks: no measured prior (the
        // reference's is scale-free; the measured one has its own test).
        let options = AnalysisOptions { block: 128, ..options() };
        let analyse = |spatial_header: Option<SpatialSampling>, with_spatial: bool| {
            let h = header(loads.clone(), sampling, spatial_header);
            let mut a = Analyzer::new(&h, &options).unwrap();
            for r in run.records.iter().filter(|r| with_spatial || !r.spatial) {
                a.push(r);
            }
            a.finish(&totals)
        };
        let got = analyse(Some(spatial), true);
        let rho = (run.time_total > 0 && executions_total >= run.time_total)
            .then(|| executions_total as f64 / run.time_total as f64);
        prop_assert_eq!(got.summary.rho, rho);
        let executions: Vec<f64> = match rho {
            Some(rho) => run.time_records.iter().map(|&n| rho * n as f64).collect(),
            // No ρ: no N, every site's curve divides by its tracked count.
            None => vec![0.0; loads.len()],
        };
        check_against_reference(&got, &loads, &run.tracked, &executions, &Model::scale_free(spatial.rate()))?;
        // The spatial records are counted apart from the time-sample ones.
        let spatial_records = run.records.iter().filter(|r| r.spatial).count() as u64;
        prop_assert_eq!(got.coverage.spatial_records, (spatial_records > 0).then_some(spatial_records));
        prop_assert_eq!(got.coverage.records, run.time_total);

        // Without spatial sampling (old traces, `--spatial-rate 0`): no
        // whole-run fields, and everything else identical.
        let plain = analyse(None, false);
        prop_assert!(plain.summary.whole_run.mrc.is_empty() && plain.lines.is_empty());
        prop_assert_eq!(plain.summary.tracked_accesses, None);
        prop_assert_eq!(plain.run.cache_sizes.clone(), None);
        let mut stripped = got.clone();
        strip_whole_run(&mut stripped);
        let mut plain_stripped = plain.clone();
        strip_whole_run(&mut plain_stripped);
        prop_assert_eq!(stripped, plain_stripped);
        let json = serde_json::to_value(&plain).unwrap();
        prop_assert!(json.get("lines").is_none() && json["summary"].get("mrc").is_none());
        prop_assert!(json["summary"].get("MR_L1").is_none() && json["run"].get("cache_sizes").is_none());
    }
}

/// An analysis without its whole-run fields (and the note about them).
fn strip_whole_run(a: &mut Analysis) {
    let s = &mut a.summary;
    s.whole_run = WholeRunLocality::default();
    [s.misses_l1, s.misses_l2, s.misses_llc] = [None; 3];
    s.spatial_rate = None;
    s.tracked_accesses = None;
    s.mrc_groups.clear();
    a.run.cache_sizes = None;
    a.coverage.spatial_records = None;
    a.lines.clear();
    for f in &mut a.functions {
        f.whole_run = WholeRunLocality::default();
    }
    a.coverage
        .notes
        .retain(|n| !n.contains("whole-run") && !n.contains("spatial"));
}

/// A small program's access stream: a table of 64 K blocks probed at
/// random, an array of 8 K blocks walked in order and a warm set of 2 K
/// blocks — reuse at every scale from L1 to beyond L2. Spatial sampling
/// at the default 1/128 gives a curve within the accuracy target (MAE ≤
/// 0.02) of the exact one.
#[test]
fn default_rate_curve_is_within_the_accuracy_target() {
    let loads = sites(&[
        LoadClass::Irregular,
        LoadClass::Strided,
        LoadClass::Irregular,
    ]);
    let mut execs: Vec<Exec> = Vec::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..24u64 {
        for i in 0..8192u64 {
            execs.push((0, 1, 0x4000_0000 + i * 64 + 8 * (round % 8)));
            let probe = next() % (64 * 1024);
            execs.push((0, 0, 0x8000_0000 + probe * 64));
            execs.push((0, 2, 0x1000_0000 + (next() % 2048) * 64));
        }
    }
    let machine = AnalysisOptions {
        cache_sizes: Some(CacheSizes {
            l1: 32 << 10,
            l2: 1 << 20,
            llc: 32 << 20,
            source: "--cache-sizes".into(),
        }),
        ..AnalysisOptions::default()
    };
    let exact = full_trace(&loads, &execs, &machine);
    let spatial = SpatialSampling::with_rate(1.0 / 128.0).unwrap();
    let emulated = full_trace(
        &loads,
        &execs,
        &AnalysisOptions {
            emulate_spatial: Some(spatial),
            ..machine.clone()
        },
    );
    let tracked = emulated.summary.tracked_accesses.unwrap();
    assert!(tracked >= 1000, "{tracked} tracked accesses");
    let mae = curve_mae(
        &emulated.summary.whole_run.mrc,
        &exact.summary.whole_run.mrc,
    )
    .unwrap();
    assert!(mae <= 0.02, "MAE {mae}");
    // The curve is not trivial: it falls from near 1 to the cold misses.
    let first = exact.summary.whole_run.mrc.first().unwrap().miss_ratio;
    let last = exact.summary.whole_run.mrc.last().unwrap().miss_ratio;
    assert!(first > 0.5 && last < 0.2, "{first} … {last}");
}

/// A line inlined into both functions is attributed to the one with the
/// most executions of its loads, whatever the order of the load sites;
/// equal executions go to the first name.
#[test]
fn line_goes_to_the_function_with_most_of_its_executions() {
    let line = "src/k.rs:7";
    // Sites 0 and 2 in alpha, site 1 in beta; alpha's first site has the
    // lowest address.
    let mut loads = sites(&[LoadClass::Irregular; 3]);
    for load in &mut loads {
        load.line = Some(line.into());
    }
    let function_of = |execs: &[(usize, u32)]| {
        let execs: Vec<Exec> = execs
            .iter()
            .flat_map(|&(site, n)| (0..u64::from(n)).map(move |i| (0, site, 0x10_0000 + 64 * i)))
            .collect();
        let a = full_trace(&loads, &execs, &options());
        assert_eq!(a.lines.len(), 1, "{:?}", a.lines);
        assert_eq!(a.lines[0].line, line);
        a.lines[0].function.clone().unwrap()
    };
    // beta's one site outnumbers both of alpha's, met first or last.
    assert_eq!(function_of(&[(0, 2), (2, 2), (1, 5)]), "beta");
    assert_eq!(function_of(&[(1, 5), (0, 2), (2, 2)]), "beta");
    // alpha's two sites together outnumber beta's.
    assert_eq!(function_of(&[(1, 5), (0, 3), (2, 3)]), "alpha");
    assert_eq!(function_of(&[(0, 3), (1, 5), (2, 3)]), "alpha");
    // A tie goes to the first name, not to the first site.
    assert_eq!(function_of(&[(1, 4), (0, 2), (2, 2)]), "alpha");
}

/// The prior of small distances measured from the time samples, by brute
/// force: in-window distances on a list stack per window (cold accesses
/// censored at the distinct blocks seen, both capped at 4,096), the
/// Kaplan–Meier estimate by its definition until fewer than 1,000 remain at
/// risk, the scale-free tail holding the rest up to the footprint, and
/// each `d' < 64` spread by its posterior summed from binomial
/// coefficients. Long windows over a hot set make the measured head
/// matter (the scale-free prior gives another curve).
#[test]
fn sampled_curve_with_a_measured_prior_matches_the_reference() {
    let loads = sites(&[LoadClass::Irregular]);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let execs: Vec<Exec> = (0..60_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let block = match state % 10 {
                0..=4 => (state >> 20) % 8,
                5..=7 => (state >> 20) % 300,
                _ => (state >> 20) % 5000,
            };
            (0, 0, 0x10_0000 + block * 64)
        })
        .collect();
    let in_sample: Vec<bool> = (0..1000).map(|i| i < 400).collect();
    let spatial = SpatialSampling::with_rate(0.25).unwrap();
    let rate = spatial.rate();
    let run = sample_run(&loads, &execs, &in_sample, spatial);
    let h = header(
        loads.clone(),
        Sampling {
            window: 400,
            period: 1000,
            seed: None,
        },
        Some(spatial),
    );
    let mut a = Analyzer::new(&h, &options()).unwrap();
    for r in &run.records {
        a.push(r);
    }
    let samples = run.records.last().map_or(0, |r| r.sample + 1);
    let got = a.finish(&TraceTotals::clean(
        execs.len() as u64,
        run.time_total,
        samples,
    ));

    let model = measured_model(&loads, &run.records, &run.tracked, rate);
    let head = model.measured.as_ref().map_or(0, |m| m.survival.len() - 1);
    assert!(head >= 100, "head {head}");
    let executions = [execs.len() as f64];
    if let Err(e) = check_against_reference(&got, &loads, &run.tracked, &executions, &model) {
        panic!("{e}");
    }
    // The measured head matters: the scale-free prior gives another curve.
    let sizes: Vec<u64> = got.summary.whole_run.mrc.iter().map(|p| p.blocks).collect();
    let distances = naive_distances(&run.tracked);
    let scale_free = naive_curve(
        &distances,
        &executions,
        |_| true,
        &sizes,
        &Model::scale_free(rate),
    );
    let differs = ratios(&got.summary.whole_run.mrc)
        .iter()
        .zip(&scale_free)
        .any(|(g, w)| (g - w).abs() > 1e-4);
    assert!(differs, "the measured prior changed nothing");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A sampled run analysed at 64-byte blocks, so its small distances
    /// are spread under the prior its own windows measure: the trace,
    /// function and line curves, misses and bootstrap groups against the
    /// brute-force [`measured_model`], threads and load sites mixed. The
    /// runs are long enough (mostly inside windows) for the measured head
    /// to reach past the first distances in most cases.
    #[test]
    fn sampled_curves_under_the_measured_prior_match_the_reference(
        (classes, execs) in long_program(),
        in_sample in long_windows(),
        log2_inverse in 0u32..4,
    ) {
        let loads = sites(&classes);
        let spatial = SpatialSampling::with_rate(1.0 / f64::from(1 << log2_inverse)).unwrap();
        let rate = spatial.rate();
        let run = sample_run(&loads, &execs, &in_sample, spatial);
        let samples = run.records.last().map_or(0, |r| r.sample + 1);
        let executions_total = execs.len() as u64;
        let totals = TraceTotals::clean(executions_total, run.time_total, samples);
        let h = header(loads.clone(), Sampling { window: 50, period: 500, seed: None }, Some(spatial));
        let mut a = Analyzer::new(&h, &options()).unwrap();
        for r in &run.records {
            a.push(r);
        }
        let got = a.finish(&totals);
        let rho = (run.time_total > 0 && executions_total >= run.time_total)
            .then(|| executions_total as f64 / run.time_total as f64);
        let executions: Vec<f64> = match rho {
            Some(rho) => run.time_records.iter().map(|&n| rho * n as f64).collect(),
            None => vec![0.0; loads.len()],
        };
        let model = measured_model(&loads, &run.records, &run.tracked, rate);
        check_against_reference(&got, &loads, &run.tracked, &executions, &model)?;
    }
}

/// Which executions fall in time samples, cyclically: runs of 1–400
/// executions in or out, mostly in.
fn long_windows() -> impl Strategy<Value = Vec<bool>> {
    prop::collection::vec((prop::bool::weighted(0.8), 1usize..400), 1..12).prop_map(|runs| {
        runs.into_iter()
            .flat_map(|(inside, n)| std::iter::repeat_n(inside, n))
            .collect()
    })
}

/// [`program`]'s shape, longer: 3,000–6,000 executions, so that the
/// windows hold more than the 1,000 observations a measured prior needs.
fn long_program() -> impl Strategy<Value = (Vec<LoadClass>, Vec<Exec>)> {
    let block = prop_oneof![4 => 0u64..24, 2 => 0u64..200, 1 => 0u64..3000];
    program_of(block.boxed(), 3000..6000)
}
