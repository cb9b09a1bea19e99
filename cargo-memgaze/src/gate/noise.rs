//! Sampling noise of the whole-run metrics (`MR_*`, `misses_*`), so that
//! their limits hold for unchanged code.
//!
//! A spatially sampled curve is built from the accesses to the 64-byte
//! blocks a hash picks (1/128 of them by default). Which blocks those are
//! changes whenever data moves (another allocation before it, another
//! bench in the binary), so two runs of the same program differ by the
//! luck of the draw: on a bench whose data spans a few hundred blocks, a
//! handful are tracked and `MR_L1` moved from 0.03 to 0.19 on placement
//! alone. That noise is set by the tracked *blocks* and how unevenly their
//! misses are spread, not by the tracked accesses, and a binomial bound on
//! accesses would understate it. The analysis already splits the tracked
//! blocks into 32 groups by a second hash (`summary.mrc_groups`, each
//! group's share of the curve): the groups are independent draws of the
//! same block population, so their spread estimates the standard deviation
//! of the curve itself, whatever the program.
//!
//! A limit of a whole-run metric is widened to [`NOISE_SIGMAS`] standard
//! deviations of the difference of the two runs (`√(σ_old² + σ_new²)`),
//! and for `misses_*` to at least [`MISSES_FLOOR`] of the loads per run:
//! its absolute part becomes the larger of the two, and a relative-only
//! limit gains that absolute part (a change must exceed both). Full traces
//! (rate 1) have no groups and no noise: their `MR_*` limits stay as
//! written.
//! docs/METRICS.md ("Gate limits of whole-run metrics") and
//! docs/performance.md (the noise study) say why 4.

use super::limits::Limit;
use super::metric::Metric;
use memgaze_analysis::Analysis;

/// How many standard deviations of the run-to-run difference a change of
/// a whole-run metric must exceed to count (see the module documentation).
pub const NOISE_SIGMAS: f64 = 4.0;

/// Whether `metric` is estimated from spatially sampled blocks.
pub fn is_whole_run(metric: Metric) -> bool {
    matches!(
        metric,
        Metric::MrL1
            | Metric::MrL2
            | Metric::MrLlc
            | Metric::MissesL1
            | Metric::MissesL2
            | Metric::MissesLlc
    )
}

/// The cache level (0: L1, 1: L2, 2: LLC) a whole-run metric is read at.
fn level(metric: Metric) -> Option<usize> {
    match metric {
        Metric::MrL1 | Metric::MissesL1 => Some(0),
        Metric::MrL2 | Metric::MissesL2 => Some(1),
        Metric::MrLlc | Metric::MissesLlc => Some(2),
        _ => None,
    }
}

/// The standard deviation of `MR̂` at `bytes` in `analysis`, from the
/// spread of its block groups: the curve is the sum of `G` group shares,
/// so its variance is `G/(G − 1) · Σ (x_g − x̄)²`. The groups are read at
/// the curve's point nearest to `bytes` in log size (the baseline of
/// another machine is read at this run's sizes). 0 without groups (a full
/// trace: exact).
pub fn miss_ratio_sigma(analysis: &Analysis, bytes: u64) -> f64 {
    let s = &analysis.summary;
    let groups = &s.mrc_groups;
    if groups.len() < 2 || s.whole_run.mrc.is_empty() {
        return 0.0;
    }
    let target = (bytes.max(1) as f64).log2();
    let Some(at) = s
        .whole_run
        .mrc
        .iter()
        .enumerate()
        .min_by(|(_, a), (_, b)| {
            let da = ((a.bytes.max(1) as f64).log2() - target).abs();
            let db = ((b.bytes.max(1) as f64).log2() - target).abs();
            da.total_cmp(&db)
        })
        .map(|(i, _)| i)
    else {
        return 0.0;
    };
    let shares: Vec<f64> = groups.iter().filter_map(|g| g.get(at).copied()).collect();
    let g = shares.len() as f64;
    if g < 2.0 {
        return 0.0;
    }
    let mean = shares.iter().sum::<f64>() / g;
    let squares: f64 = shares.iter().map(|x| (x - mean).powi(2)).sum();
    (g / (g - 1.0) * squares).sqrt()
}

/// The standard deviation of whole-run `metric` in `analysis`, in the
/// metric's units (`misses_*` per run of the routine, as
/// [`Metric::value`] gives them); `None` for other metrics or without the
/// cache sizes.
pub fn sigma(metric: Metric, analysis: &Analysis) -> Option<f64> {
    let level = level(metric)?;
    let sizes = analysis.run.cache_sizes.as_ref()?;
    let bytes = [sizes.l1, sizes.l2, sizes.llc][level];
    let mr_sigma = miss_ratio_sigma(analysis, bytes);
    if metric.is_miss_ratio() {
        return Some(mr_sigma);
    }
    if mr_sigma == 0.0 {
        return Some(0.0);
    }
    Some(mr_sigma * executions_per_run(analysis)?)
}

/// `N` per run of the routine: the Strided and Irregular executions the
/// curve divides by (`misses = MR̂ · N`), from any level whose ratio is
/// neither 0 nor clamped; `None` when none is.
fn executions_per_run(analysis: &Analysis) -> Option<f64> {
    let s = &analysis.summary;
    let executions = [
        (s.whole_run.mr_l1, s.misses_l1),
        (s.whole_run.mr_l2, s.misses_l2),
        (s.whole_run.mr_llc, s.misses_llc),
    ]
    .into_iter()
    .find_map(|pair| match pair {
        (Some(mr), Some(misses)) if mr > 0.0 && mr < 1.0 => Some(misses / mr),
        _ => None,
    })?;
    Some(executions / s.iterations.unwrap_or(1).max(1) as f64)
}

/// The smallest change of `misses_*` per run that counts, as a share of
/// the loads per run: the miss-ratio limit's `0.02` in misses. Cold misses
/// are spread over the runs a harness repeats, and the run count follows
/// the machine's speed, so data that fits a cache misses more per run in a
/// shorter run (a 100,000-entry `HashMap` that fits the LLC: 1,853 → 3,301
/// `misses_LLC` per run of 400 K loads, `MR_LLC` 0.005 → 0.008).
pub const MISSES_FLOOR: f64 = 0.02;

/// `limit` of whole-run `metric` widened to [`NOISE_SIGMAS`] standard
/// deviations of the difference between `old` and `new`; `None` when the
/// noise is within the limit already (or `metric` is not whole-run), so
/// the limit applies unchanged.
pub fn widened(metric: Metric, limit: &Limit, old: &Analysis, new: &Analysis) -> Option<Limit> {
    if !is_whole_run(metric) {
        return None;
    }
    let (a, b) = (sigma(metric, old)?, sigma(metric, new)?);
    let mut floor = NOISE_SIGMAS * (a * a + b * b).sqrt();
    if !metric.is_miss_ratio() {
        let loads = [old, new]
            .into_iter()
            .filter_map(executions_per_run)
            .fold(0.0, f64::max);
        floor = floor.max(MISSES_FLOOR * loads);
    }
    if floor <= 0.0 || limit.absolute.is_some_and(|abs| abs >= floor) {
        return None;
    }
    if limit.relative.is_none() && limit.absolute.is_none() {
        return None;
    }
    Some(Limit {
        direction: limit.direction,
        relative: limit.relative,
        absolute: Some(floor),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::metric::Direction;
    use memgaze_analysis::{AnalysisOptions, Analyzer, CacheSizes, MrcPoint};
    use memgaze_trace::{Backend, LoadClass, LoadEntry, Sampling, TraceHeader, TraceTotals};

    /// An analysis whose curve (3 points, the L1 size first) has `groups`.
    fn analysis(groups: Vec<Vec<f64>>) -> Analysis {
        let header = TraceHeader {
            backend: Backend::Soft,
            sampling: Sampling::full(),
            binary: None,
            command: vec![],
            functions: vec![],
            loads: vec![LoadEntry {
                ip: 0x10,
                class: LoadClass::Strided,
                implied: 0,
                function: None,
                line: None,
                proxy: None,
            }],
            labels: vec![],
            spatial: None,
        };
        let mut analyzer = Analyzer::new(&header, &AnalysisOptions::default()).unwrap();
        analyzer.push_load(0, 0x1000, 0, 0);
        let mut a = analyzer.finish(&TraceTotals::clean(1, 1, 1));
        a.run.cache_sizes = Some(CacheSizes {
            l1: 32 << 10,
            l2: 1 << 20,
            llc: 32 << 20,
            source: "test".into(),
        });
        a.summary.whole_run.mrc = [512u64, 16384, 524288]
            .map(|blocks| MrcPoint {
                blocks,
                bytes: blocks << 6,
                miss_ratio: 0.5,
            })
            .to_vec();
        a.summary.mrc_groups = groups;
        a.summary.whole_run.mr_l1 = Some(0.5);
        a.summary.misses_l1 = Some(500.0);
        a
    }

    #[test]
    fn the_groups_spread_is_the_curves_standard_deviation() {
        // Every group equal: no spread.
        let even = analysis(vec![vec![0.5 / 32.0; 3]; 32]);
        assert_eq!(miss_ratio_sigma(&even, 32 << 10), 0.0);
        // One group holds all: σ ≈ the estimate itself.
        let mut one = vec![vec![0.0; 3]; 32];
        one[0] = vec![0.5; 3];
        let sigma = miss_ratio_sigma(&analysis(one.clone()), 32 << 10);
        assert!((sigma - 0.5).abs() < 1e-9, "{sigma}");
        // misses: σ_MR × N (N = 1000), per run.
        let mut a = analysis(one);
        a.summary.iterations = Some(4);
        let misses = super::sigma(Metric::MissesL1, &a).unwrap();
        assert!((misses - 0.5 * 1000.0 / 4.0).abs() < 1e-6, "{misses}");
        // A full trace: no groups, exact.
        assert_eq!(miss_ratio_sigma(&analysis(Vec::new()), 32 << 10), 0.0);
    }

    #[test]
    fn limits_widen_to_the_noise_only_where_it_is_larger() {
        let mut one = vec![vec![0.0; 3]; 32];
        one[0] = vec![0.1; 3];
        let noisy = analysis(one);
        let exact = analysis(Vec::new());
        let mr = Limit {
            direction: Direction::Increase,
            relative: None,
            absolute: Some(0.02),
        };
        let wide = widened(Metric::MrL1, &mr, &noisy, &noisy).unwrap();
        let want = NOISE_SIGMAS * (2.0f64 * 0.1 * 0.1).sqrt();
        assert!((wide.absolute.unwrap() - want).abs() < 1e-9);
        assert_eq!(widened(Metric::MrL1, &mr, &exact, &exact), None);
        assert_eq!(widened(Metric::DF, &mr, &noisy, &noisy), None);
        // A relative-only limit gains the absolute part (both must be exceeded).
        let misses = Limit {
            direction: Direction::Increase,
            relative: Some(0.1),
            absolute: None,
        };
        let wide = widened(Metric::MissesL1, &misses, &noisy, &exact).unwrap();
        assert_eq!(wide.relative, Some(0.1));
        assert!(wide.absolute.unwrap() > 0.0);
        // Exact runs: misses still need 2% of the loads per run (N = 1000).
        let floor = widened(Metric::MissesL1, &misses, &exact, &exact).unwrap();
        assert!((floor.absolute.unwrap() - 20.0).abs() < 1e-9, "{floor:?}");
    }
}
