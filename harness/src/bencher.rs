//! [`Bencher`]: what a bench body receives, the measured region it opens, and
//! how many times it runs the routine ([`IterationPolicy`]).

use crate::region::{Region, memgaze_region_samples};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// How the bench executable was asked to run its benches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Without `--bench` (e.g. `cargo test --benches`): run every routine
    /// once, quickly, to check that it works. Bodies should pick a reduced
    /// input size here ([`Bencher::size`]).
    Smoke,
    /// With `--bench` (`cargo bench`, `cargo memgaze bench`): run the routine
    /// at full size, repeatedly ([`IterationPolicy`]); this is the run
    /// `cargo memgaze` records.
    Measure,
}

/// How many times [`Bencher::iter`] runs its routine in a measured run.
///
/// Like criterion's calibration: first a warm-up outside the measured
/// region (at least one run, and until [`warm_up`](Self::warm_up) has
/// passed) estimates the time of one run; then the routine runs
/// `ceil(measure / time of one run)` times (at least once, at most
/// [`max_iterations`](Self::max_iterations)) inside one region. The region
/// markers enclose the measured repetitions only, so a recorder sees each
/// run of the routine after a warm one, never the warm-up.
///
/// [`exact`](Self::exact) replaces the calibration by a fixed count without
/// warm-up: `cargo memgaze golden` and `validate` set `MEMGAZE_ITERATIONS=1`
/// so their full traces are deterministic and cheap.
///
/// Under a `cargo memgaze` recorder, a [`sample_target`](Self::sample_target)
/// ends the measured runs early, once the recorder has taken that many time
/// samples since the region began (a recorded run is several times slower
/// than a calibrated one, and the analysis needs samples, not seconds);
/// without a recorder the target changes nothing.
///
/// From the environment ([`IterationPolicy::from_env`]):
/// `MEMGAZE_ITERATIONS=N` (exact count), `MEMGAZE_WARM_UP_S` and
/// `MEMGAZE_MEASURE_S` (seconds, e.g. `0.5`), `MEMGAZE_SAMPLE_TARGET=N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IterationPolicy {
    /// Warm-up time before the measured runs (default 0.2 s).
    pub warm_up: Duration,
    /// Target time of the measured runs (default 1 s).
    pub measure: Duration,
    /// Upper bound on measured runs (a routine that takes nanoseconds).
    pub max_iterations: u64,
    /// A fixed number of measured runs, without warm-up or calibration.
    pub exact: Option<u64>,
    /// Time samples after which a recorded region stops repeating (not with
    /// [`exact`](Self::exact)).
    pub sample_target: Option<u64>,
}

/// Environment variable: a fixed number of measured runs per `iter`.
pub const ITERATIONS_ENV: &str = "MEMGAZE_ITERATIONS";
/// Environment variable: warm-up seconds.
pub const WARM_UP_ENV: &str = "MEMGAZE_WARM_UP_S";
/// Environment variable: target seconds of the measured runs.
pub const MEASURE_ENV: &str = "MEMGAZE_MEASURE_S";
/// Environment variable: the recorder's sample target (set by `cargo
/// memgaze bench`).
pub const SAMPLE_TARGET_ENV: &str = "MEMGAZE_SAMPLE_TARGET";

impl Default for IterationPolicy {
    fn default() -> Self {
        IterationPolicy {
            warm_up: Duration::from_millis(200),
            measure: Duration::from_secs(1),
            max_iterations: u64::from(u32::MAX),
            exact: None,
            sample_target: None,
        }
    }
}

impl IterationPolicy {
    /// Exactly `n` measured runs (at least one), no warm-up.
    pub fn exact(n: u64) -> Self {
        IterationPolicy {
            exact: Some(n.max(1)),
            ..Self::default()
        }
    }

    /// The default policy adjusted by [`ITERATIONS_ENV`], [`WARM_UP_ENV`]
    /// and [`MEASURE_ENV`]; an unreadable value is an error naming it.
    pub fn from_env() -> Result<Self, PolicyError> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    fn from_vars(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<Self, PolicyError> {
        let mut policy = Self::default();
        let read = |name: &'static str| -> Result<Option<String>, PolicyError> {
            match var(name) {
                None => Ok(None),
                Some(v) if v.is_empty() => Ok(None),
                Some(v) => v
                    .into_string()
                    .map(Some)
                    .map_err(|v| PolicyError::new(name, &v.to_string_lossy(), "not UTF-8")),
            }
        };
        for (name, field, problem) in [
            (
                ITERATIONS_ENV,
                &mut policy.exact,
                "expected a whole number of runs, at least 1",
            ),
            (
                SAMPLE_TARGET_ENV,
                &mut policy.sample_target,
                "expected a whole number of samples, at least 1",
            ),
        ] {
            if let Some(text) = read(name)? {
                match text.trim().parse::<u64>() {
                    Ok(n) if n > 0 => *field = Some(n),
                    _ => return Err(PolicyError::new(name, &text, problem)),
                }
            }
        }
        for (name, field) in [
            (WARM_UP_ENV, &mut policy.warm_up),
            (MEASURE_ENV, &mut policy.measure),
        ] {
            if let Some(text) = read(name)? {
                *field = text
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| PolicyError::new(name, &text, "expected seconds, e.g. 0.5"))?;
            }
        }
        Ok(policy)
    }

    /// How many measured runs to make, given `one`, which runs the routine
    /// once (outside the region) and returns the time of the routine alone.
    fn calibrate(&self, mut one: impl FnMut() -> Duration) -> u64 {
        if let Some(n) = self.exact {
            return n;
        }
        let started = Instant::now();
        let (mut spent, mut runs) = (Duration::ZERO, 0u64);
        while runs == 0 || (started.elapsed() < self.warm_up && runs < self.max_iterations) {
            spent += one();
            runs += 1;
        }
        let per_run = (spent.as_nanos() / u128::from(runs)).max(1);
        let wanted = self.measure.as_nanos().div_ceil(per_run);
        u64::try_from(wanted)
            .unwrap_or(u64::MAX)
            .clamp(1, self.max_iterations.max(1))
    }
}

/// An environment variable of [`IterationPolicy::from_env`] that cannot be
/// read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    /// The variable.
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// What was expected.
    pub problem: &'static str,
}

impl PolicyError {
    fn new(name: &'static str, value: &str, problem: &'static str) -> Self {
        PolicyError {
            name,
            value: value.to_string(),
            problem,
        }
    }
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={:?}: {}", self.name, self.value, self.problem)
    }
}

impl std::error::Error for PolicyError {}

/// What `memgaze_region_samples` returns unchanged without a recorder.
const UNKNOWN_SAMPLES: u64 = u64::MAX;

/// The recorder's sample count at which the measured runs stop: `target`
/// more than it has taken so far; 0 (no early stop) without a recorder. One word, so a region's loop keeps it in a register
/// (a spilled one would be a load in the trace).
#[inline(always)]
fn stop_at(target: u64) -> u64 {
    match memgaze_region_samples(UNKNOWN_SAMPLES) {
        UNKNOWN_SAMPLES => 0,
        now => now.saturating_add(target),
    }
}

/// Whether the recorder's count reached `stop` (never for 0; a recorder
/// that went away counts as reached: more runs record nothing).
#[inline(always)]
fn reached(stop: u64) -> bool {
    stop != 0 && memgaze_region_samples(UNKNOWN_SAMPLES) >= stop
}

/// What a bench's measured runs amounted to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    /// Measured regions (calls of `iter*`).
    pub regions: u32,
    /// Runs of the routine inside them.
    pub iterations: u64,
    /// Wall time of those runs.
    pub elapsed: Duration,
}

/// Handed to every bench body: its name, the [`Mode`], and [`Bencher::iter`],
/// which runs the measured part.
///
/// Everything a body does before and after `iter` (allocating, filling,
/// shuffling, checking results) is setup and stays out of the measured region.
#[derive(Debug)]
pub struct Bencher<'a> {
    name: &'a str,
    mode: Mode,
    policy: IterationPolicy,
    measured: Measured,
}

impl<'a> Bencher<'a> {
    pub(crate) fn new(name: &'a str, mode: Mode, policy: IterationPolicy) -> Self {
        Bencher {
            name,
            mode,
            policy,
            measured: Measured::default(),
        }
    }

    /// The bench's full name, as `--list` prints it (e.g. `lookup/1000`).
    pub fn name(&self) -> &str {
        self.name
    }

    /// Whether this is a smoke run or a measured run.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// `true` under `cargo test --benches` (no `--bench` flag).
    pub fn is_smoke_test(&self) -> bool {
        self.mode == Mode::Smoke
    }

    /// Picks an input size: `full` when measured, `smoke` in a smoke run, so
    /// `cargo test --benches` stays fast.
    pub fn size(&self, full: usize, smoke: usize) -> usize {
        match self.mode {
            Mode::Measure => full,
            Mode::Smoke => smoke,
        }
    }

    /// How many measured runs the policy asks for (one in a smoke run).
    fn runs(&self, one: impl FnMut() -> Duration) -> u64 {
        match self.mode {
            Mode::Smoke => 1,
            Mode::Measure => self.policy.calibrate(one),
        }
    }

    /// The policy's sample target where it applies: `None` in a smoke run,
    /// with an exact count, or without one. Read before a region opens, so
    /// the region holds no load of the policy.
    fn sample_target(&self) -> Option<u64> {
        self.policy
            .sample_target
            .filter(|_| self.mode == Mode::Measure && self.policy.exact.is_none())
    }

    /// Runs `routine` repeatedly inside one measured region, as criterion's
    /// and divan's `iter` do, and returns the result of its last run.
    ///
    /// A measured run first warms up and calibrates outside the region, then
    /// runs `routine` the number of times [`IterationPolicy`] asks for
    /// between the region markers (`memgaze_region_begin`/`_end`); a smoke
    /// run runs it once. Every result passes through
    /// [`black_box`](crate::black_box) so the work cannot be optimised away;
    /// all but the last are dropped inside the region. The reported time is
    /// per run. A routine that must run exactly once uses
    /// [`iter_once`](Self::iter_once).
    pub fn iter<R>(&mut self, mut routine: impl FnMut() -> R) -> R {
        // A run with a sample target goes its own way before anything else,
        // so a run without one keeps the region loop, and the loads in it,
        // it always had.
        if let Some(target) = self.sample_target() {
            return self.iter_to_target(routine, target);
        }
        let runs = self.runs(|| {
            let start = Instant::now();
            black_box(routine());
            start.elapsed()
        });
        let start = Instant::now();
        let last = {
            let _region = Region::begin(self.name);
            for _ in 1..runs {
                black_box(routine());
            }
            black_box(routine())
        };
        self.add(1, runs, start.elapsed());
        last
    }

    /// [`iter`](Self::iter) under a sample target: the calibrated runs (at
    /// least 1) in one region, ended early once the recorder's count has
    /// grown by `target` (without a recorder, all of them). The count is
    /// read before the warm-up: recording is off until the region opens.
    #[inline(never)]
    fn iter_to_target<R>(&mut self, mut routine: impl FnMut() -> R, target: u64) -> R {
        let stop = stop_at(target);
        let runs = self.runs(|| {
            let start = Instant::now();
            black_box(routine());
            start.elapsed()
        });
        let start = Instant::now();
        let (last, left) = {
            let _region = Region::begin(self.name);
            let mut left = runs;
            loop {
                let out = black_box(routine());
                left -= 1;
                if left == 0 || reached(stop) {
                    break (out, left);
                }
                drop(out);
            }
        };
        self.add(1, runs - left, start.elapsed());
        last
    }

    /// Runs `routine` on a fresh input from `setup` each time, with only
    /// `routine` inside the measured region (one region per run) and only
    /// its time counted; the inputs are built and the outputs dropped
    /// outside. Like criterion's `iter_batched` with one input per batch.
    pub fn iter_batched<I, R>(
        &mut self,
        mut setup: impl FnMut() -> I,
        mut routine: impl FnMut(I) -> R,
    ) {
        // The warm-up runs outside the region: a region is opened only for
        // the measured runs below.
        let runs = self.runs(|| {
            let input = setup();
            let start = Instant::now();
            let output = black_box(routine(input));
            let spent = start.elapsed();
            drop(output);
            spent
        });
        // Under a sample target the count is read after the warm-up
        // (recording is still off), and the loop that checks it is its own.
        if let Some(target) = self.sample_target() {
            let stop = stop_at(target);
            return self.batches_to_target(setup, routine, runs, stop);
        }
        let mut spent = Duration::ZERO;
        for _ in 0..runs {
            let input = setup();
            let start = Instant::now();
            let output = {
                let _region = Region::begin(self.name);
                black_box(routine(input))
            };
            spent += start.elapsed();
            drop(output);
        }
        let regions = u32::try_from(runs).unwrap_or(u32::MAX);
        self.add(regions, runs, spent);
    }

    /// [`iter_batched`](Self::iter_batched)'s measured runs under a sample
    /// target: at most `runs`, until the recorder's count reaches `stop`.
    #[inline(never)]
    fn batches_to_target<I, R>(
        &mut self,
        mut setup: impl FnMut() -> I,
        mut routine: impl FnMut(I) -> R,
        runs: u64,
        stop: u64,
    ) {
        let mut spent = Duration::ZERO;
        let mut ran = 0;
        while ran < runs && !(ran > 0 && reached(stop)) {
            ran += 1;
            let input = setup();
            let start = Instant::now();
            let output = {
                let _region = Region::begin(self.name);
                black_box(routine(input))
            };
            spent += start.elapsed();
            drop(output);
        }
        let regions = u32::try_from(ran).unwrap_or(u32::MAX);
        self.add(regions, ran, spent);
    }

    /// Runs `routine` exactly once inside the measured region, without
    /// warm-up, and returns its result: for bodies that consume their input
    /// or must not repeat.
    pub fn iter_once<R>(&mut self, routine: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let result = {
            let _region = Region::begin(self.name);
            black_box(routine())
        };
        self.add(1, 1, start.elapsed());
        result
    }

    fn add(&mut self, regions: u32, iterations: u64, elapsed: Duration) {
        let m = &mut self.measured;
        m.regions = m.regions.saturating_add(regions);
        m.iterations = m.iterations.saturating_add(iterations);
        m.elapsed += elapsed;
    }

    /// What was measured.
    pub(crate) fn finish(self) -> Measured {
        self.measured
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn policy(vars: &[(&str, &str)]) -> Result<IterationPolicy, String> {
        IterationPolicy::from_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        })
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_environment_sets_the_policy_and_bad_values_are_named() {
        assert_eq!(policy(&[]).unwrap(), IterationPolicy::default());
        assert_eq!(policy(&[(ITERATIONS_ENV, "3")]).unwrap().exact, Some(3));
        let p = policy(&[(WARM_UP_ENV, "0"), (MEASURE_ENV, "0.25")]).unwrap();
        assert_eq!(
            (p.warm_up, p.measure),
            (Duration::ZERO, Duration::from_millis(250))
        );
        assert_eq!(
            policy(&[(ITERATIONS_ENV, "0")]).unwrap_err(),
            "MEMGAZE_ITERATIONS=\"0\": expected a whole number of runs, at least 1"
        );
        assert!(
            policy(&[(MEASURE_ENV, "-1")])
                .unwrap_err()
                .starts_with("MEMGAZE_MEASURE_S")
        );
        assert!(policy(&[(WARM_UP_ENV, "soon")]).is_err());
        assert_eq!(
            policy(&[(SAMPLE_TARGET_ENV, "110")]).unwrap().sample_target,
            Some(110)
        );
        assert_eq!(
            policy(&[(SAMPLE_TARGET_ENV, "0")]).unwrap_err(),
            "MEMGAZE_SAMPLE_TARGET=\"0\": expected a whole number of samples, at least 1"
        );
    }

    #[test]
    fn calibration_fills_the_measurement_time() {
        let p = IterationPolicy {
            warm_up: Duration::from_millis(10),
            measure: Duration::from_millis(100),
            ..IterationPolicy::default()
        };
        let mut warm = 0;
        // A routine that "takes" 1 ms: 100 runs fill 100 ms.
        let runs = p.calibrate(|| {
            warm += 1;
            std::thread::sleep(Duration::from_millis(1));
            Duration::from_millis(1)
        });
        assert_eq!(runs, 100);
        assert!(warm >= 1);
        // Exact: no warm-up at all.
        let runs = IterationPolicy::exact(4).calibrate(|| panic!("no warm-up"));
        assert_eq!(runs, 4);
        // A slow routine still runs once; a very fast one is capped.
        let slow = IterationPolicy {
            warm_up: Duration::ZERO,
            ..IterationPolicy::default()
        };
        assert_eq!(slow.calibrate(|| Duration::from_secs(5)), 1);
        let capped = IterationPolicy {
            warm_up: Duration::ZERO,
            max_iterations: 1000,
            ..IterationPolicy::default()
        };
        assert_eq!(capped.calibrate(|| Duration::ZERO), 1000);
    }
}
