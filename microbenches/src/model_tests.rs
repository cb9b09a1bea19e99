//! The kernels' access sequences in a pure-Rust model: every access goes
//! through a recording [`Memory`], and the metrics of docs/METRICS.md are
//! computed from the record by brute force. This checks the properties the
//! kernels are designed for (the instrumented, recorded runs are checked by
//! the pipeline's own tests).

use super::*;
use std::collections::{HashMap, HashSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Strided,
    Irregular,
}

/// Records `(address, class)` per access and reads the value normally.
#[derive(Default)]
struct Recorder {
    accesses: Vec<(usize, Class)>,
}

impl Memory for Recorder {
    fn strided<T: Copy>(&mut self, place: &T) -> T {
        self.accesses
            .push((place as *const T as usize, Class::Strided));
        *place
    }
    fn irregular<T: Copy>(&mut self, place: &T) -> T {
        self.accesses
            .push((place as *const T as usize, Class::Irregular));
        *place
    }
}

/// Footprint metrics of a set of accesses (docs/METRICS.md "Footprint").
#[derive(Debug, Default, Clone, Copy)]
struct Footprint {
    f: f64,
    f_lines: f64,
    f_str: f64,
    f_irr: f64,
}

impl Footprint {
    fn of(accesses: &[(usize, Class)]) -> Self {
        let mut per_address: HashMap<usize, (u32, u32)> = HashMap::new();
        let mut lines = HashSet::new();
        for &(addr, class) in accesses {
            let counts = per_address.entry(addr).or_default();
            match class {
                Class::Strided => counts.0 += 1,
                Class::Irregular => counts.1 += 1,
            }
            lines.insert(addr >> 6);
        }
        let (mut f_str, mut f_irr) = (0.0, 0.0);
        for (s, i) in per_address.values() {
            let total = f64::from(s + i);
            f_str += f64::from(*s) / total;
            f_irr += f64::from(*i) / total;
        }
        Footprint {
            f: per_address.len() as f64,
            f_lines: lines.len() as f64,
            f_str,
            f_irr,
        }
    }

    fn irr_frac(&self) -> f64 {
        self.f_irr / self.f
    }

    fn str_frac(&self) -> f64 {
        self.f_str / self.f
    }

    /// Averages over the consecutive windows of `2^k` accesses (tail
    /// dropped), as the trace-window histogram does.
    fn windows(accesses: &[(usize, Class)], k: u32) -> Self {
        let size = 1usize << k;
        let windows: Vec<Footprint> = accesses.chunks_exact(size).map(Self::of).collect();
        assert!(
            !windows.is_empty(),
            "no window of 2^{k} in {}",
            accesses.len()
        );
        let n = windows.len() as f64;
        let mut mean = Footprint::default();
        for w in &windows {
            mean.f += w.f / n;
            mean.f_lines += w.f_lines / n;
            mean.f_str += w.f_str / n;
            mean.f_irr += w.f_irr / n;
        }
        mean
    }
}

const P: Params = Params {
    elements: 4_096,
    reps: 3,
};

fn record<K: Kernel>(params: Params) -> (Vec<(usize, Class)>, u64) {
    let kernel = K::prepare(params);
    let mut recorder = Recorder::default();
    let sum = kernel.run_with(&mut recorder);
    // The model reads exactly what the machine reads.
    assert_eq!(sum, kernel.run(), "{}", K::NAME);
    (recorder.accesses, sum)
}

fn count(accesses: &[(usize, Class)], class: Class) -> usize {
    accesses.iter().filter(|(_, c)| *c == class).count()
}

#[test]
fn str1_and_str8_are_strided_and_str8_touches_8x_the_lines() {
    let n = P.elements;
    let (s1, _) = record::<Str1>(P);
    let (s8, _) = record::<Str8>(P);
    for (name, accesses) in [("str1", &s1), ("str8", &s8)] {
        assert_eq!(accesses.len(), P.reps * n, "{name}");
        let whole = Footprint::of(accesses);
        assert_eq!(whole.f, n as f64, "{name}");
        assert!(whole.str_frac() >= 0.9, "{name}");
    }
    assert_eq!(Footprint::of(&s1).f_lines, (n / 8) as f64);
    assert_eq!(Footprint::of(&s8).f_lines, n as f64);
    // Up to the largest window the model's trace holds (3 sweeps): str8's
    // windows touch 8× as many lines as str1's.
    let largest = (P.reps * n).ilog2();
    for k in [3, 6, 10, largest] {
        let ratio = Footprint::windows(&s8, k).f_lines / Footprint::windows(&s1, k).f_lines;
        assert!((7.9..=8.1).contains(&ratio), "k={k}: ratio {ratio}");
        // Fresh addresses until a window spans more than one sweep.
        let f = Footprint::windows(&s1, k).f;
        let expected = (1usize << k).min(n) as f64;
        assert!((f - expected).abs() < 1e-6, "k={k}: {f}");
    }
}

#[test]
fn index_driven_kernels_split_footprint_about_evenly() {
    let cases = [
        (Irr::NAME, record::<Irr>(P).0, 2 * P.elements),
        (IrrRand::NAME, record::<IrrRand>(P).0, 2 * P.elements),
        (IrrHalf::NAME, record::<IrrHalf>(P).0, P.elements),
    ];
    for (name, accesses, per_sweep) in &cases {
        assert_eq!(accesses.len(), P.reps * per_sweep, "{name}");
        // Index load, then data load, alternately.
        assert!(
            accesses
                .chunks(2)
                .all(|pair| pair[0].1 == Class::Strided && pair[1].1 == Class::Irregular)
        );
        let whole = Footprint::of(accesses);
        assert!(
            (0.4..=0.6).contains(&whole.irr_frac()),
            "{name}: F_irr% {}",
            whole.irr_frac()
        );
        for k in 3..=10 {
            let w = Footprint::windows(accesses, k);
            let frac = w.f_irr / w.f;
            assert!((0.45..=0.55).contains(&frac), "{name} k={k}: {frac}");
        }
    }
    // irr and irr-half visit each element once per sweep: exactly one half.
    assert_eq!(Footprint::of(&cases[0].1).irr_frac(), 0.5);
    assert_eq!(Footprint::of(&cases[2].1).irr_frac(), 0.5);
}

#[test]
fn irr_half_visits_a_contiguous_half_and_irr_everything() {
    let data = |accesses: &[(usize, Class)]| -> Vec<usize> {
        let mut set: Vec<usize> = accesses
            .iter()
            .filter(|(_, c)| *c == Class::Irregular)
            .map(|(a, _)| *a)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        set.sort_unstable();
        set
    };
    let half = data(&record::<IrrHalf>(P).0);
    assert_eq!(half.len(), P.elements / 2);
    assert_eq!(half[half.len() - 1] - half[0], 8 * (P.elements / 2 - 1));
    let all = data(&record::<Irr>(P).0);
    assert_eq!(all.len(), P.elements);
    assert_eq!(all[all.len() - 1] - all[0], 8 * (P.elements - 1));
}

#[test]
fn irr_rand_draws_with_replacement_and_changes_every_sweep() {
    let (accesses, _) = record::<IrrRand>(P);
    let data: Vec<usize> = accesses
        .iter()
        .filter(|(_, c)| *c == Class::Irregular)
        .map(|(a, _)| *a)
        .collect();
    let sweeps: Vec<&[usize]> = data.chunks(P.elements).collect();
    let distinct = |s: &[usize]| s.iter().collect::<HashSet<_>>().len() as f64;
    // ~(1 - 1/e) of the elements per sweep...
    let per_sweep = distinct(sweeps[0]) / P.elements as f64;
    assert!((0.58..=0.68).contains(&per_sweep), "{per_sweep}");
    // ...a different draw each sweep, covering more over the run.
    assert_ne!(sweeps[0], sweeps[1]);
    assert!(distinct(&data) > 1.4 * distinct(sweeps[0]));
}

#[test]
fn composed_kernels_show_both_classes() {
    let (str_irr, _) = record::<StrIrr>(P);
    let (series, _) = record::<IrrStrIrr>(P);
    let n = P.elements;
    assert_eq!(str_irr.len(), P.reps * (n / 2 + 2 * (n / 2)));
    assert_eq!(series.len(), P.reps * 5 * n);
    let f = Footprint::of(&str_irr);
    assert!((f.irr_frac() - 1.0 / 3.0).abs() < 1e-9, "{}", f.irr_frac());
    let f = Footprint::of(&series);
    assert_eq!(f.irr_frac(), 0.5);
    assert_eq!(f.f, (4 * n) as f64);
    for accesses in [&str_irr, &series] {
        let f = Footprint::of(accesses);
        assert!(f.irr_frac() >= 0.1 && f.str_frac() >= 0.1);
    }
    // In series, windows inside the strided phase have no irregular part and
    // windows inside the irregular phases are half irregular.
    let first_phase = &series[..2 * n];
    let second_phase = &series[2 * n..3 * n];
    assert_eq!(Footprint::of(first_phase).irr_frac(), 0.5);
    assert_eq!(Footprint::of(second_phase).f_irr, 0.0);
}

#[test]
fn chase_is_irregular_and_visits_every_node_once_per_sweep() {
    let (accesses, _) = record::<Chase>(P);
    let n = P.elements;
    assert_eq!(accesses.len(), P.reps * 2 * n);
    assert_eq!(count(&accesses, Class::Irregular), accesses.len());
    let f = Footprint::of(&accesses);
    assert!(f.irr_frac() >= 0.9);
    assert_eq!(f.f, (2 * n) as f64);
    assert_eq!(f.f_lines, (n / 8) as f64);
    // One sweep visits every node exactly once: a single ring.
    let nodes: HashSet<usize> = accesses[..2 * n].iter().map(|(a, _)| a >> 3).collect();
    assert_eq!(nodes.len(), n);
    // Shuffled: consecutive nodes are rarely neighbours in memory.
    let neighbours = accesses[..2 * n]
        .chunks(2)
        .zip(accesses[2..2 * n].chunks(2))
        .filter(|(a, b)| a[0].0.abs_diff(b[0].0) == 8)
        .count();
    assert!(neighbours < n / 100, "{neighbours}");
}

#[test]
fn inputs_are_deterministic() {
    assert_eq!(record::<IrrRand>(P).1, record::<IrrRand>(P).1);
    assert_eq!(record::<Chase>(P).1, record::<Chase>(P).1);
    assert_eq!(
        SplitMix64::new(SEED).permutation(100),
        SplitMix64::new(SEED).permutation(100)
    );
    let mut p = SplitMix64::new(1).permutation(1000);
    p.sort_unstable();
    assert!(p.iter().enumerate().all(|(i, &v)| v as usize == i));
}

#[test]
fn names_are_the_memgaze_ones() {
    assert_eq!(
        KERNEL_NAMES,
        [
            "str1",
            "str8",
            "irr",
            "irr-rand",
            "irr-half",
            "str/irr",
            "irr|str|irr",
            "chase"
        ]
    );
}

#[test]
fn params_come_from_the_environment_text() {
    let d = FULL;
    assert_eq!(Params::with_overrides(d, None, None), Ok(FULL));
    assert_eq!(
        Params::with_overrides(d, Some("1_000"), Some("3")),
        Ok(Params {
            elements: 1000,
            reps: 3
        })
    );
    let e = Params::with_overrides(d, Some("abc"), None).unwrap_err();
    assert!(e.starts_with("MEMGAZE_MICRO_ELEMENTS=\"abc\""), "{e}");
    assert!(Params::with_overrides(d, Some("8"), None).is_err());
    assert!(Params::with_overrides(d, None, Some("0")).is_err());
}

#[test]
fn arrays_start_on_a_line() {
    let a = Aligned::from_fn(13, |i| i as u32);
    assert_eq!(a.as_ptr() as usize % 64, 0);
    assert_eq!(a.len(), 13);
    assert_eq!(a[12], 12);
}
