//! The metrics a gate compares, their names on the command line and where
//! each comes from in an [`Analysis`].

use memgaze_analysis::Analysis;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Which way a metric gets worse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// Larger is worse (`+` in a limit).
    Increase,
    /// Smaller is worse (`-`).
    Decrease,
    /// Any change is suspicious (`±`).
    Either,
}

impl Direction {
    /// The sign written in limits: `+`, `-` or `±`.
    pub fn sign(self) -> &'static str {
        match self {
            Direction::Increase => "+",
            Direction::Decrease => "-",
            Direction::Either => "±",
        }
    }
}

/// A gated metric.
///
/// `dF`, `dF_lines`, `F_str_frac` and `F_irr_frac` are the bench's
/// **code-window** values: the trace-window row at the code-window size `W_c` (the largest
/// window size both runs have, up to `W_c`). Whole-run footprints of a
/// sampled trace depend on where the samples fell and are not comparable
/// between runs (docs/METRICS.md); averages over windows of a fixed size are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Metric {
    /// `Â = ρ·(A + A_const)`: estimated executed loads.
    #[serde(rename = "A_hat")]
    AHat,
    /// Observed accesses `A` (depends on the sampling).
    #[serde(rename = "A")]
    A,
    /// `A_const / (A + A_const)`.
    #[serde(rename = "A_const_frac")]
    AConstFrac,
    /// `κ = 1 + A_const / A`.
    #[serde(rename = "kappa")]
    Kappa,
    /// Footprint growth `ΔF` over code windows.
    #[serde(rename = "dF")]
    DF,
    /// New 64-byte lines per load over code windows, `ΔF_lines@W_c`: the
    /// line-level counterpart of `dF`, which sees a walk that strides
    /// across cache lines although every load stays Strided.
    #[serde(rename = "dF_lines")]
    DFLines,
    /// Strided share of the footprint over code windows.
    #[serde(rename = "F_str_frac")]
    FStrFrac,
    /// Irregular share of the footprint over code windows.
    #[serde(rename = "F_irr_frac")]
    FIrrFrac,
    /// Observed whole-run footprint (distinct addresses).
    #[serde(rename = "F")]
    F,
    /// `F̂ = ρ·F`.
    #[serde(rename = "F_hat")]
    FHat,
    /// Observed distinct 64-byte lines.
    #[serde(rename = "F_lines")]
    FLines,
    /// Mean reuse distance (intra-sample; comparable only at equal `w`).
    #[serde(rename = "D_mean")]
    DMean,
    /// Largest reuse distance.
    #[serde(rename = "D_max")]
    DMax,
    /// Whole-run miss ratio at the L1 data cache's size.
    #[serde(rename = "MR_L1")]
    MrL1,
    /// Whole-run miss ratio at the L2 cache's size.
    #[serde(rename = "MR_L2")]
    MrL2,
    /// Whole-run miss ratio at the last-level cache's size.
    #[serde(rename = "MR_LLC")]
    MrLlc,
    /// Estimated misses at the L1 size (`MR_L1 ×` estimated accesses), per
    /// run of the routine.
    #[serde(rename = "misses_L1")]
    MissesL1,
    /// Estimated misses at the L2 size.
    #[serde(rename = "misses_L2")]
    MissesL2,
    /// Estimated misses at the last-level-cache size.
    #[serde(rename = "misses_LLC")]
    MissesLlc,
}

/// Says what [`Metric::per_run`] metrics are, under the tables that list
/// them beside the analysis's totals.
pub const PER_RUN_NOTE: &str = "A_hat, misses_L1, misses_L2, misses_LLC: per run of the bench's routine (the recording's estimate divided by its iterations), not the totals of the analysis";

impl Metric {
    /// Every metric, in the order reports list them.
    pub const ALL: [Metric; 19] = [
        Metric::AHat,
        Metric::DF,
        Metric::DFLines,
        Metric::FStrFrac,
        Metric::FIrrFrac,
        Metric::DMean,
        Metric::MrL1,
        Metric::MrL2,
        Metric::MrLlc,
        Metric::MissesL1,
        Metric::MissesL2,
        Metric::MissesLlc,
        Metric::A,
        Metric::AConstFrac,
        Metric::Kappa,
        Metric::F,
        Metric::FHat,
        Metric::FLines,
        Metric::DMax,
    ];

    /// Whether it is a whole-run miss ratio (`MR_L1`, `MR_L2`, `MR_LLC`).
    pub fn is_miss_ratio(self) -> bool {
        matches!(self, Metric::MrL1 | Metric::MrL2 | Metric::MrLlc)
    }

    /// Whether it depends on how often loads miss a cache: the whole-run
    /// miss ratios and the misses per run (`misses_L1`, `misses_L2`,
    /// `misses_LLC`).
    pub fn counts_misses(self) -> bool {
        self.is_miss_ratio()
            || matches!(
                self,
                Metric::MissesL1 | Metric::MissesL2 | Metric::MissesLlc
            )
    }

    /// Whether the gate compares it per run of the bench's routine (the
    /// whole recording's estimate divided by its iterations), unlike the
    /// analysis, which gives totals.
    pub fn per_run(self) -> bool {
        matches!(
            self,
            Metric::AHat | Metric::MissesL1 | Metric::MissesL2 | Metric::MissesLlc
        )
    }

    /// The name used in limits, JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            Metric::AHat => "A_hat",
            Metric::A => "A",
            Metric::AConstFrac => "A_const_frac",
            Metric::Kappa => "kappa",
            Metric::DF => "dF",
            Metric::DFLines => "dF_lines",
            Metric::FStrFrac => "F_str_frac",
            Metric::FIrrFrac => "F_irr_frac",
            Metric::F => "F",
            Metric::FHat => "F_hat",
            Metric::FLines => "F_lines",
            Metric::DMean => "D_mean",
            Metric::DMax => "D_max",
            Metric::MrL1 => "MR_L1",
            Metric::MrL2 => "MR_L2",
            Metric::MrLlc => "MR_LLC",
            Metric::MissesL1 => "misses_L1",
            Metric::MissesL2 => "misses_L2",
            Metric::MissesLlc => "misses_LLC",
        }
    }

    /// The metric called `name` (exact spelling, as in docs/METRICS.md).
    pub fn from_name(name: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Valid names, comma-separated, for error messages.
    pub fn valid_names() -> String {
        Metric::ALL.map(Metric::name).join(", ")
    }

    /// Which way the metric gets worse, used when a limit has no sign.
    pub fn worse(self) -> Direction {
        match self {
            Metric::FStrFrac => Direction::Decrease,
            Metric::AConstFrac | Metric::Kappa | Metric::A => Direction::Either,
            _ => Direction::Increase,
        }
    }

    /// Whether the metric is a fraction in `[0, 1]` (absolute limits are
    /// the natural ones there).
    pub fn is_fraction(self) -> bool {
        matches!(
            self,
            Metric::AConstFrac
                | Metric::FStrFrac
                | Metric::FIrrFrac
                | Metric::DF
                | Metric::DFLines
                | Metric::MrL1
                | Metric::MrL2
                | Metric::MrLlc
        )
    }

    /// Whether the metric is estimated from the time samples, so that two
    /// runs of the same program differ by a noise that shrinks with the
    /// samples (limits widen below 30 samples). `Â` is not: the software
    /// recorder counts every instrumented-load execution, so `ρ` scales the
    /// sampled loads back to an exact count. Neither are the whole-run
    /// `MR_*` and `misses_*`: they come from spatial sampling over the
    /// whole run, whose precision is set by the tracked accesses, not by
    /// the number of time samples (the verdict notes a curve with fewer
    /// than 1,000).
    pub fn is_sampled(self) -> bool {
        !matches!(
            self,
            Metric::AHat
                | Metric::MrL1
                | Metric::MrL2
                | Metric::MrLlc
                | Metric::MissesL1
                | Metric::MissesL2
                | Metric::MissesLlc
        )
    }

    /// Whether the metric is a mean over code windows (needs a window size
    /// both runs have).
    pub fn is_windowed(self) -> bool {
        matches!(
            self,
            Metric::DF | Metric::DFLines | Metric::FStrFrac | Metric::FIrrFrac
        )
    }

    /// The metric's value in `analysis`; windowed metrics at window
    /// exponent `k`. `None` where undefined (no accesses, no reuse, no
    /// window of that size).
    pub fn value(self, analysis: &Analysis, k: Option<u32>) -> Option<f64> {
        let s = &analysis.summary;
        let runs = s.iterations.unwrap_or(1).max(1) as f64;
        let row = || {
            let k = k?;
            analysis
                .trace_windows
                .iter()
                .find(|r| r.k == k && r.windows > 0)
        };
        match self {
            // Per run of the routine: a repeating harness picks its run
            // count by time, so totals of two runs differ by that alone.
            m if m.per_run() && run_count_chosen_by_time(analysis) => None,
            Metric::AHat => s.a_hat.map(|a| a / runs),
            Metric::A => Some(s.a as f64),
            Metric::AConstFrac => s.a_const_frac,
            Metric::Kappa => s.kappa,
            Metric::DF => row().map(|r| r.d_f),
            // A ratio of the row's means (the row keeps no per-window
            // line ratio); absent in analyses written before rows had
            // `F_lines`.
            Metric::DFLines => row().and_then(|r| {
                let loads = 2f64.powi(r.k as i32) + r.a_const;
                r.f_lines.map(|lines| lines / loads)
            }),
            Metric::FStrFrac => row().map(|r| r.f_str_frac),
            Metric::FIrrFrac => row().map(|r| r.f_irr_frac),
            Metric::F => Some(s.f as f64),
            Metric::FHat => s.f_hat,
            Metric::FLines => Some(s.f_lines as f64),
            Metric::DMean => s.d_mean,
            Metric::DMax => s.d_max.map(|d| d as f64),
            Metric::MrL1 => s.whole_run.mr_l1,
            Metric::MrL2 => s.whole_run.mr_l2,
            Metric::MrLlc => s.whole_run.mr_llc,
            // Per run of the routine, like `A_hat`.
            Metric::MissesL1 => s.misses_l1.map(|m| m / runs),
            Metric::MissesL2 => s.misses_l2.map(|m| m / runs),
            Metric::MissesLlc => s.misses_llc.map(|m| m / runs),
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether the routine ran a number of times that its framework chose by
/// time and did not report: criterion's profiling mode (`--profile-time`,
/// how `bench` runs criterion benches) calls the routine in batches sized
/// from a timed warm-up and prints no count; divan (`--min-time`) prints
/// one, but not in a row `bench` can read for every bench (a `threads`
/// bench has a row per thread count). `iterations` is then absent and `Â`
/// is a total over a count that changes from run to run with the machine's
/// speed. Such an `Â` has no per-run value to gate on.
pub fn run_count_chosen_by_time(analysis: &Analysis) -> bool {
    analysis.summary.iterations.is_none() && timed_framework(analysis).is_some()
}

/// The framework that ran a bench for a time rather than a count, by its
/// option in the recorded command: `criterion` (`--profile-time`) or
/// `divan` (`--min-time`).
pub fn timed_framework(analysis: &Analysis) -> Option<&'static str> {
    let command = &analysis.run.command;
    if command.iter().any(|a| a == "--profile-time") {
        Some("criterion")
    } else if command.iter().any(|a| a == "--min-time") {
        Some("divan")
    } else {
        None
    }
}

/// `baseline` with its `MR_*` and `misses_*` read at the cache sizes of
/// `new` when the two were analysed with different ones (another machine,
/// another `--cache-sizes`): off its miss-ratio curve, interpolated in
/// log size between its points. `None` when the sizes agree or either has
/// no curve.
pub fn at_cache_sizes_of(baseline: &Analysis, new: &Analysis) -> Option<Analysis> {
    use memgaze_analysis::locality::interpolate;
    let (old_sizes, new_sizes) = (
        baseline.run.cache_sizes.as_ref()?,
        new.run.cache_sizes.as_ref()?,
    );
    let same =
        (old_sizes.l1, old_sizes.l2, old_sizes.llc) == (new_sizes.l1, new_sizes.l2, new_sizes.llc);
    if same || baseline.summary.whole_run.mrc.is_empty() {
        return None;
    }
    let mut adjusted = baseline.clone();
    let s = &mut adjusted.summary;
    // Estimated accesses, from MR_L1 and misses_L1 at the old sizes.
    let accesses = match (s.whole_run.mr_l1, s.misses_l1) {
        (Some(mr), Some(misses)) if mr > 0.0 => Some(misses / mr),
        _ => None,
    };
    let at = |bytes: u64| interpolate(&baseline.summary.whole_run.mrc, (bytes >> 6).max(1));
    s.whole_run.mr_l1 = at(new_sizes.l1);
    s.whole_run.mr_l2 = at(new_sizes.l2);
    s.whole_run.mr_llc = at(new_sizes.llc);
    let scale = |mr: Option<f64>| accesses.zip(mr).map(|(n, mr)| n * mr);
    s.misses_l1 = scale(s.whole_run.mr_l1);
    s.misses_l2 = scale(s.whole_run.mr_l2);
    s.misses_llc = scale(s.whole_run.mr_llc);
    adjusted.run.cache_sizes = new.run.cache_sizes.clone();
    Some(adjusted)
}

/// The window exponent at which two runs' windowed metrics are compared:
/// the code-window exponent if both have windows of that size, else the
/// largest smaller one both have (a sample dense in Constant loads may
/// hold fewer than `W_c` accesses).
pub fn common_window_k(old: &Analysis, new: &Analysis) -> Option<u32> {
    let k_c = old.run.code_window_k.min(new.run.code_window_k);
    let has = |a: &Analysis, k: u32| a.trace_windows.iter().any(|r| r.k == k && r.windows > 0);
    (0..=k_c).rev().find(|&k| has(old, k) && has(new, k))
}

/// Windows of size `2^k` that `analysis` averaged.
pub fn windows_at(analysis: &Analysis, k: u32) -> u64 {
    analysis
        .trace_windows
        .iter()
        .find(|r| r.k == k)
        .map_or(0, |r| r.windows)
}
