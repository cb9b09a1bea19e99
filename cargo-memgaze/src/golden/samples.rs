//! Per-sample breakdown of a sampled trace: each sample's own window sums,
//! so validation can bootstrap confidence intervals over samples.
//!
//! Trace windows and code windows never cross a sample (docs/METRICS.md), so
//! a sampled trace's window averages are sums over samples divided by window
//! counts over samples; resampling samples with replacement resamples those
//! sums. Rather than re-implement the window metrics, [`SampleBreakdown`]
//! runs the analysis engine ([`Analyzer`]) on each sample alone — a header
//! holding just the loads and functions the sample touches, its `w` records
//! — and keeps the sums of the result. A sample is at most `w` records, so
//! the extra work is proportional to the (small) sampled trace.

use memgaze_analysis::{AnalysisOptions, Analyzer};
use memgaze_trace::{FunctionEntry, LoadEntry, TraceHeader, TraceTotals};
use std::collections::HashMap;

/// Window sums of one level `k` within one sample.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LevelSums {
    /// Windows of `2^k` accesses.
    pub windows: u64,
    /// Σ F over those windows.
    pub f: f64,
    /// Σ ΔF.
    pub d_f: f64,
    /// Σ F_str.
    pub f_str: f64,
    /// Σ F_irr.
    pub f_irr: f64,
}

impl LevelSums {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &LevelSums) {
        self.windows += other.windows;
        self.f += other.f;
        self.d_f += other.d_f;
        self.f_str += other.f_str;
        self.f_irr += other.f_irr;
    }

    /// The mean of a metric over the windows (`None` without windows).
    pub fn mean(&self, metric: TraceMetric) -> Option<f64> {
        (self.windows > 0).then(|| {
            let sum = match metric {
                TraceMetric::F => self.f,
                TraceMetric::DF => self.d_f,
                TraceMetric::FStr => self.f_str,
                TraceMetric::FIrr => self.f_irr,
            };
            sum / self.windows as f64
        })
    }
}

/// The trace-window metrics validation compares (docs/METRICS.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceMetric {
    /// Footprint.
    F,
    /// Footprint growth.
    DF,
    /// Strided footprint.
    FStr,
    /// Irregular footprint.
    FIrr,
}

impl TraceMetric {
    /// All of them, in table order.
    pub const ALL: [TraceMetric; 4] = [
        TraceMetric::F,
        TraceMetric::DF,
        TraceMetric::FStr,
        TraceMetric::FIrr,
    ];

    /// The spelling of docs/CLI.md (`F`, `dF`, `F_str`, `F_irr`).
    pub fn name(self) -> &'static str {
        match self {
            TraceMetric::F => "F",
            TraceMetric::DF => "dF",
            TraceMetric::FStr => "F_str",
            TraceMetric::FIrr => "F_irr",
        }
    }

    /// The metric's value in an analysis row.
    pub fn of_row(self, row: &memgaze_analysis::WindowRow) -> f64 {
        match self {
            TraceMetric::F => row.f,
            TraceMetric::DF => row.d_f,
            TraceMetric::FStr => row.f_str,
            TraceMetric::FIrr => row.f_irr,
        }
    }
}

/// A function's sums within one sample.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FunctionSums {
    /// Observed accesses.
    pub a: u64,
    /// Constant loads.
    pub a_const: u64,
    /// Code windows (`2^k_c` of its accesses).
    pub windows: u64,
    /// Σ code-window ΔF.
    pub d_f: f64,
    /// Σ code-window F_str%.
    pub f_str_frac: f64,
    /// Σ code-window F_irr%.
    pub f_irr_frac: f64,
}

impl FunctionSums {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &FunctionSums) {
        self.a += other.a;
        self.a_const += other.a_const;
        self.windows += other.windows;
        self.d_f += other.d_f;
        self.f_str_frac += other.f_str_frac;
        self.f_irr_frac += other.f_irr_frac;
    }
}

/// One sample's sums.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampleSums {
    /// Per trace-window level: index `k - 3`.
    pub levels: Vec<LevelSums>,
    /// Per function (index into [`SampleSet::functions`]).
    pub functions: Vec<(usize, FunctionSums)>,
}

/// Every sample's sums, in trace order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampleSet {
    /// Function names the samples refer to (one per name: distinct
    /// functions of one name share an entry, as validation compares them).
    pub functions: Vec<String>,
    /// Code-window exponent of the analysis.
    pub code_window_k: u32,
    /// The samples (empty ones included).
    pub samples: Vec<SampleSums>,
}

impl SampleSet {
    /// The index of a function by name.
    pub fn function_index(&self, name: &str) -> Option<usize> {
        self.functions.iter().position(|f| f == name)
    }
}

/// Collects a sampled trace's records and analyses each sample alone (see
/// the module documentation). Feed it the same records, in the same order,
/// as the whole-trace [`Analyzer`].
pub struct SampleBreakdown {
    header: TraceHeader,
    options: AnalysisOptions,
    /// Function of each load (resolved once: the header's, else by address).
    load_functions: Vec<Option<u32>>,
    records: Vec<(u32, u64, u32)>,
    open: bool,
    set: SampleSet,
    names: HashMap<String, usize>,
}

impl SampleBreakdown {
    /// A breakdown for a trace with this header, analysed with `options`
    /// (the whole-trace analysis's).
    pub fn new(header: &TraceHeader, options: &AnalysisOptions) -> Self {
        let mut ranges: Vec<(u64, u64, u32)> = header
            .functions
            .iter()
            .enumerate()
            .map(|(i, f)| (f.start, f.end, i as u32))
            .collect();
        ranges.sort_unstable();
        let load_functions = header
            .loads
            .iter()
            .map(|load| {
                load.function.or_else(|| {
                    let i = ranges.partition_point(|&(start, _, _)| start <= load.ip);
                    ranges[..i]
                        .iter()
                        .rev()
                        .find(|&&(start, end, _)| start <= load.ip && load.ip < end)
                        .map(|&(_, _, f)| f)
                })
            })
            .collect();
        SampleBreakdown {
            header: header.clone(),
            options: options.clone(),
            load_functions,
            records: Vec::new(),
            open: false,
            set: SampleSet::default(),
            names: HashMap::new(),
        }
    }

    /// Another program joined the recording: its loads follow the header's
    /// ([`memgaze_record::JoinedProgram::extend_header`]), so
    /// [`SampleBreakdown::loads`] must be `program.load_base`.
    pub fn join_program(&mut self, program: &memgaze_record::JoinedProgram) {
        program.extend_header(&mut self.header);
        let added = &self.header.loads[program.load_base as usize..];
        self.load_functions
            .extend(added.iter().map(|load| load.function));
    }

    /// Load sites known so far (the header's, then those of joined
    /// programs).
    pub fn loads(&self) -> usize {
        self.header.loads.len()
    }

    /// The next sample begins.
    pub fn begin_sample(&mut self) -> anyhow::Result<()> {
        self.close()?;
        self.open = true;
        Ok(())
    }

    /// One record of the current sample (load-site index into the header).
    pub fn push(&mut self, load: u32, addr: u64, thread: u32) {
        self.records.push((load, addr, thread));
    }

    /// Every sample's sums.
    pub fn finish(mut self) -> anyhow::Result<SampleSet> {
        self.close()?;
        Ok(self.set)
    }

    fn close(&mut self) -> anyhow::Result<()> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        let records = std::mem::take(&mut self.records);
        let sums = self.analyse(&records)?;
        self.set.samples.push(sums);
        self.records = records;
        self.records.clear();
        Ok(())
    }

    /// One sample through a fresh analyzer whose header holds only what the
    /// sample touches.
    fn analyse(&mut self, records: &[(u32, u64, u32)]) -> anyhow::Result<SampleSums> {
        let mut load_map: HashMap<u32, u32> = HashMap::new();
        let mut function_map: HashMap<u32, u32> = HashMap::new();
        let mut loads: Vec<LoadEntry> = Vec::new();
        let mut functions: Vec<FunctionEntry> = Vec::new();
        let mut local = Vec::with_capacity(records.len());
        for &(load, addr, thread) in records {
            let index = *load_map.entry(load).or_insert_with(|| {
                let entry = &self.header.loads[load as usize];
                let function = self.load_functions[load as usize].map(|f| {
                    *function_map.entry(f).or_insert_with(|| {
                        functions.push(self.header.functions[f as usize].clone());
                        functions.len() as u32 - 1
                    })
                });
                loads.push(LoadEntry {
                    function,
                    proxy: None,
                    line: None,
                    ..entry.clone()
                });
                loads.len() as u32 - 1
            });
            local.push((index, addr, thread));
        }
        // Only what the analysis reads; the big tables are not cloned.
        let header = TraceHeader {
            backend: self.header.backend,
            sampling: self.header.sampling,
            binary: None,
            command: Vec::new(),
            functions,
            loads,
            labels: Vec::new(),
            spatial: None,
        };
        let mut analyzer = Analyzer::new(&header, &self.options)?;
        for &(load, addr, thread) in &local {
            analyzer.push_load(load, addr, 0, thread);
        }
        let n = local.len() as u64;
        let analysis = analyzer.finish(&TraceTotals::clean(n, n, 1));
        self.set.code_window_k = analysis.run.code_window_k;
        let mut levels = vec![LevelSums::default(); analysis.run.max_k.saturating_sub(2) as usize];
        for row in &analysis.trace_windows {
            let n = row.windows as f64;
            if let Some(level) = levels.get_mut(row.k as usize - 3) {
                *level = LevelSums {
                    windows: row.windows,
                    f: row.f * n,
                    d_f: row.d_f * n,
                    f_str: row.f_str * n,
                    f_irr: row.f_irr * n,
                };
            }
        }
        let mut function_sums: Vec<(usize, FunctionSums)> =
            Vec::with_capacity(analysis.functions.len());
        // Where each name's entry is in `function_sums` (a map: a sample of
        // a large program names thousands of functions).
        let mut position: HashMap<usize, usize> = HashMap::new();
        for f in &analysis.functions {
            let index = match self.names.get(&f.name) {
                Some(&i) => i,
                None => {
                    self.set.functions.push(f.name.clone());
                    self.names
                        .insert(f.name.clone(), self.set.functions.len() - 1);
                    self.set.functions.len() - 1
                }
            };
            let n = f.code_windows as f64;
            let sums = FunctionSums {
                a: f.a,
                a_const: f.a_const,
                windows: f.code_windows,
                d_f: f.d_f.unwrap_or(0.0) * n,
                f_str_frac: f.f_str_frac.unwrap_or(0.0) * n,
                f_irr_frac: f.f_irr_frac.unwrap_or(0.0) * n,
            };
            // Distinct functions of one name (a generic function's
            // instances) are one entry per sample, as validation compares
            // them as one.
            match position.get(&index) {
                Some(&at) => function_sums[at].1.add(&sums),
                None => {
                    position.insert(index, function_sums.len());
                    function_sums.push((index, sums));
                }
            }
        }
        Ok(SampleSums {
            levels,
            functions: function_sums,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use memgaze_analysis::Analysis;
    use memgaze_trace::{Backend, LoadClass, Sampling};

    /// A sampled header: two functions, a strided and an irregular load in
    /// the first, a constant load in the second.
    pub(crate) fn header(window: u64, period: u64) -> TraceHeader {
        let load = |ip, class, function| LoadEntry {
            ip,
            class,
            implied: 0,
            function,
            line: None,
            proxy: None,
        };
        TraceHeader {
            backend: Backend::Soft,
            sampling: Sampling {
                window,
                period,
                seed: Some(1),
            },
            binary: None,
            command: vec!["synthetic".into()],
            functions: vec![
                FunctionEntry {
                    name: "kernel".into(),
                    start: 0x1000,
                    end: 0x1100,
                },
                FunctionEntry {
                    name: "helper".into(),
                    start: 0x2000,
                    end: 0x2100,
                },
            ],
            loads: vec![
                load(0x1010, LoadClass::Strided, Some(0)),
                load(0x1020, LoadClass::Irregular, None),
                load(0x2010, LoadClass::Constant, Some(1)),
            ],
            labels: Vec::new(),
            spatial: None,
        }
    }

    /// A deterministic pseudo-random trace: samples of `window` records of
    /// an `a[idx[i]]` kernel with an occasional helper call.
    pub(crate) fn records(samples: u64, window: u64, seed: u64) -> Vec<Vec<(u32, u64)>> {
        let mut rng = memgaze_trace::rng::SplitMix64::new(seed);
        let mut next = move || rng.next_u64();
        (0..samples)
            .map(|s| {
                let mut i = s * 997;
                (0..window)
                    .map(|j| {
                        if j % 50 == 49 {
                            (2, 0x7ff0_0000)
                        } else if j % 2 == 0 {
                            i += 1;
                            (0, 0x10_0000 + 4 * (i % 100_000))
                        } else {
                            (1, 0x80_0000 + 8 * (next() % 200_000))
                        }
                    })
                    .collect()
            })
            .collect()
    }

    fn analyse_both(samples: &[Vec<(u32, u64)>], header: &TraceHeader) -> (Analysis, SampleSet) {
        let options = AnalysisOptions::default();
        let mut whole = Analyzer::new(header, &options).unwrap();
        let mut breakdown = SampleBreakdown::new(header, &options);
        for (s, sample) in samples.iter().enumerate() {
            breakdown.begin_sample().unwrap();
            for &(load, addr) in sample {
                whole.push_load(load, addr, s as u64, 0);
                breakdown.push(load, addr, 0);
            }
        }
        let n: u64 = samples.iter().map(|s| s.len() as u64).sum();
        let analysis = whole.finish(&TraceTotals::clean(n * 10, n, samples.len() as u64));
        (analysis, breakdown.finish().unwrap())
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    /// The per-sample sums add up to exactly what the whole-trace analysis
    /// reports: the breakdown is the engine's result, split by sample.
    #[test]
    fn sums_over_samples_equal_the_whole_trace_analysis() {
        let header = header(1000, 100_000);
        let samples = records(40, 1000, 7);
        let (analysis, set) = analyse_both(&samples, &header);
        assert_eq!(set.samples.len(), 40);
        assert_eq!(set.code_window_k, 9);
        for row in &analysis.trace_windows {
            let mut total = LevelSums::default();
            for s in &set.samples {
                total.add(&s.levels[row.k as usize - 3]);
            }
            assert_eq!(total.windows, row.windows, "k={}", row.k);
            for metric in TraceMetric::ALL {
                assert!(
                    close(total.mean(metric).unwrap(), metric.of_row(row)),
                    "k={} {}",
                    row.k,
                    metric.name()
                );
            }
        }
        for f in &analysis.functions {
            let index = set.function_index(&f.name).unwrap();
            let mut total = FunctionSums::default();
            for s in &set.samples {
                for (i, sums) in &s.functions {
                    if *i == index {
                        total.add(sums);
                    }
                }
            }
            assert_eq!((total.a, total.a_const), (f.a, f.a_const), "{}", f.name);
            assert_eq!(total.windows, f.code_windows, "{}", f.name);
            if total.windows > 0 {
                let n = total.windows as f64;
                assert!(close(total.d_f / n, f.d_f.unwrap()));
                assert!(close(total.f_str_frac / n, f.f_str_frac.unwrap()));
                assert!(close(total.f_irr_frac / n, f.f_irr_frac.unwrap()));
            }
        }
        // The kernel has code windows; the helper (every 50th record) none.
        let kernel = analysis
            .functions
            .iter()
            .find(|f| f.name == "kernel")
            .unwrap();
        assert!(kernel.code_windows > 0);
    }

    #[test]
    fn empty_samples_are_kept() {
        let header = header(8, 100);
        let options = AnalysisOptions::default();
        let mut breakdown = SampleBreakdown::new(&header, &options);
        breakdown.begin_sample().unwrap();
        breakdown.begin_sample().unwrap();
        for i in 0..8 {
            breakdown.push(0, 0x1000 + 4 * i, 0);
        }
        let set = breakdown.finish().unwrap();
        assert_eq!(set.samples.len(), 2);
        assert!(set.samples[0].functions.is_empty());
        assert_eq!(set.samples[1].levels[0].windows, 1);
        assert_eq!(set.samples[1].levels[0].f, 8.0);
    }
}
