//! Write memory-locality benchmarks for `cargo memgaze`.
//!
//! A bench file (`benches/<name>.rs`, declared with `harness = false`)
//! registers bench bodies and hands control to [`main!`]. Each body does its
//! setup, then calls [`Bencher::iter`] with the routine to measure; `iter`
//! warms up, then runs the routine repeatedly between the region markers
//! [`memgaze_region_begin`] and [`memgaze_region_end`], which `cargo
//! memgaze` turns into "record" and "stop recording" ([`IterationPolicy`]
//! says how often; [`Bencher::iter_batched`] keeps per-run setup outside,
//! [`Bencher::iter_once`] runs a routine exactly once).
//!
//! ```toml
//! # Cargo.toml
//! [dev-dependencies]
//! memgaze-harness = "0.1"
//!
//! [[bench]]
//! name = "lookup"
//! harness = false
//!
//! # Keep `cargo bench -- <filter>` from also running the library's unit tests
//! # as a libtest bench executable:
//! [lib]
//! bench = false
//! ```
//!
//! ```no_run
//! // benches/lookup.rs
//! use memgaze_harness::{Bencher, Benches, black_box};
//! use std::collections::HashMap;
//!
//! fn hashmap(b: &mut Bencher, n: &u64) {
//!     let map: HashMap<u64, u64> = (0..*n).map(|k| (k, k)).collect(); // setup
//!     b.iter(|| (0..*n).filter(|k| map.contains_key(black_box(k))).count());
//! }
//!
//! fn sum(b: &mut Bencher) {
//!     let data: Vec<u64> = (0..b.size(1_000_000, 1_000) as u64).collect();
//!     b.iter(|| data.iter().sum::<u64>());
//! }
//!
//! fn register(benches: &mut Benches) {
//!     benches.bench_with_inputs("hashmap", [1_000, 100_000], hashmap);
//! }
//!
//! // `sum` is registered under its function name; `register` adds
//! // `hashmap/1000` and `hashmap/100000`.
//! memgaze_harness::main!(benches = [sum], groups = [register]);
//! ```
//!
//! The executable speaks libtest's command line (through libtest-mimic):
//! a substring filter, `--exact`, `--skip`, `--list`, `--ignored`,
//! `--include-ignored`, `--format`, `--test-threads`, `--bench`. Without
//! `--bench` (as under `cargo test --benches`) each body runs once in
//! [`Mode::Smoke`] — pick small inputs there with [`Bencher::size`]; with
//! `--bench` (`cargo bench`, `cargo memgaze bench`) it runs in
//! [`Mode::Measure`] and reports the wall time per run of the routine and
//! the number of runs.
//! With `--bench`, benches run one at a time (unless `--test-threads`
//! says otherwise), as libtest and criterion measure them: two at once
//! would share the caches and memory bandwidth being measured. Under a
//! `cargo memgaze` recorder ([`RECORDING_ENV`]) they always run on one
//! thread. A body that panics fails its bench, and the process
//! exits with 101.

mod bencher;
mod benches;
mod region;

pub use bencher::{
    Bencher, ITERATIONS_ENV, IterationPolicy, MEASURE_ENV, Mode, PolicyError, SAMPLE_TARGET_ENV,
    WARM_UP_ENV,
};
pub use benches::{
    Bench, Benches, RECORDING_ENV, RegistrationError, arguments_for_environment, recording,
};
pub use libtest_mimic::{Arguments, Conclusion};
pub use region::{memgaze_region_begin, memgaze_region_end, memgaze_region_samples};
/// Keeps the optimiser from deleting or constant-folding a value
/// (re-exported [`std::hint::black_box`]).
pub use std::hint::black_box;

/// Defines `fn main` for a bench executable.
///
/// Two forms:
/// - `main!(group_a, group_b)`: each is a `fn(&mut Benches)` that registers
///   benches (criterion-style groups);
/// - `main!(benches = [f, g], groups = [group_a])`: each `f` is a
///   `fn(&mut Bencher)` registered under its own name; `groups` is optional.
///
/// `main` parses the libtest command line, runs the selected benches, and
/// exits with 0 when all passed, 101 otherwise.
#[macro_export]
macro_rules! main {
    (benches = [$($bench:ident),* $(,)?] $(, groups = [$($group:path),* $(,)?])? $(,)?) => {
        fn main() {
            let mut benches = $crate::Benches::new();
            $( benches.bench(::core::stringify!($bench), $bench); )*
            $($( $group(&mut benches); )*)?
            benches.run_and_exit()
        }
    };
    ($($group:path),+ $(,)?) => {
        fn main() {
            let mut benches = $crate::Benches::new();
            $( $group(&mut benches); )+
            benches.run_and_exit()
        }
    };
}

/// Test-only observation of the region markers: they append to a
/// thread-local log (unit tests run benches on the calling thread).
#[cfg(test)]
pub(crate) mod tests_support {
    use std::cell::RefCell;

    /// What happened, in order, on this thread.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum Event {
        Begin(String),
        End(String),
        /// Pushed by test bench bodies.
        Note(&'static str),
    }

    thread_local! {
        static LOG: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
    }

    pub fn marker_event(begin: bool, ptr: *const u8, len: usize) {
        // SAFETY: the harness passes the pointer and length of a live `&str`.
        let name = unsafe { std::str::from_utf8_unchecked(std::slice::from_raw_parts(ptr, len)) };
        let event = if begin {
            Event::Begin(name.to_string())
        } else {
            Event::End(name.to_string())
        };
        LOG.with(|log| log.borrow_mut().push(event));
    }

    thread_local! {
        static SAMPLES: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
    }

    /// What the test recorder's `memgaze_region_samples` answers: the
    /// samples set by [`set_samples`], or `unknown` (no recorder).
    pub fn samples(unknown: u64) -> u64 {
        SAMPLES.with(|s| s.get()).unwrap_or(unknown)
    }

    /// Sets (or with `None` removes) the test recorder's sample count.
    pub fn set_samples(samples: Option<u64>) {
        SAMPLES.with(|s| s.set(samples));
    }

    /// Whether the last marker this thread called was a region begin.
    pub fn in_region() -> bool {
        LOG.with(|log| {
            log.borrow()
                .iter()
                .rev()
                .find(|e| !matches!(e, Event::Note(_)))
                .is_some_and(|e| matches!(e, Event::Begin(_)))
        })
    }

    pub fn note(what: &'static str) {
        LOG.with(|log| log.borrow_mut().push(Event::Note(what)));
    }

    pub fn take() -> Vec<Event> {
        LOG.with(|log| std::mem::take(&mut *log.borrow_mut()))
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::{Event, note, take};
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Arguments as the command line would give them, run on this thread,
    /// with libtest's report discarded (unless `--logfile` is given).
    fn args(cli: &[&str]) -> Arguments {
        let mut args = Arguments::from_iter(std::iter::once("bench").chain(cli.iter().copied()));
        args.test_threads = Some(1);
        args.logfile.get_or_insert_with(|| "/dev/null".to_string());
        args
    }

    /// Benches `a`, `ab`, `b/1`, `b/2` that record which ran and in what mode.
    fn sample(ran: &Arc<Mutex<Vec<(String, Mode)>>>) -> Benches {
        let mut benches = Benches::new();
        for name in ["a", "ab"] {
            let ran = Arc::clone(ran);
            benches.bench(name, move |b| {
                ran.lock().unwrap().push((b.name().to_string(), b.mode()));
                b.iter(|| ());
            });
        }
        let ran = Arc::clone(ran);
        benches.bench_with_inputs("b", [1, 2], move |b, _| {
            ran.lock().unwrap().push((b.name().to_string(), b.mode()));
            b.iter(|| ());
        });
        benches
    }

    fn ran_names(cli: &[&str]) -> (Vec<String>, Conclusion) {
        let ran = Arc::new(Mutex::new(Vec::new()));
        let conclusion = sample(&ran).run(&args(cli)).unwrap();
        let names = ran.lock().unwrap().iter().map(|(n, _)| n.clone()).collect();
        (names, conclusion)
    }

    #[test]
    fn filters_work_as_in_libtest() {
        assert_eq!(ran_names(&[]).0, ["a", "ab", "b/1", "b/2"]);
        assert_eq!(ran_names(&["a"]).0, ["a", "ab"]);
        assert_eq!(ran_names(&["--exact", "a"]).0, ["a"]);
        assert_eq!(ran_names(&["--skip", "a"]).0, ["b/1", "b/2"]);
        assert_eq!(
            ran_names(&["--exact", "--skip", "a"]).0,
            ["ab", "b/1", "b/2"]
        );
        assert_eq!(ran_names(&["b/"]).0, ["b/1", "b/2"]);
        let (names, conclusion) = ran_names(&["--exact", "b/2", "--bench"]);
        assert_eq!(names, ["b/2"]);
        assert_eq!(conclusion.num_measured, 1);
        assert_eq!(conclusion.num_filtered_out, 3);
    }

    #[test]
    fn mode_follows_the_bench_flag() {
        let ran = Arc::new(Mutex::new(Vec::new()));
        let _ = sample(&ran).run(&args(&["--exact", "a"])).unwrap();
        let _ = sample(&ran)
            .run(&args(&["--exact", "a", "--bench"]))
            .unwrap();
        let modes: Vec<Mode> = ran.lock().unwrap().iter().map(|(_, m)| *m).collect();
        assert_eq!(modes, [Mode::Smoke, Mode::Measure]);
    }

    #[test]
    fn list_prints_libtest_lines_and_runs_nothing() {
        let log =
            std::env::temp_dir().join(format!("memgaze-harness-list-{}.txt", std::process::id()));
        let ran = Arc::new(Mutex::new(Vec::new()));
        let mut benches = sample(&ran);
        benches.bench("slow", |b| b.iter(|| ())).ignore();
        let cli = [
            "--list",
            "--format",
            "terse",
            "--logfile",
            log.to_str().unwrap(),
        ];
        let _ = benches.run(&args(&cli)).unwrap();
        let listed = std::fs::read_to_string(&log).unwrap();
        std::fs::remove_file(&log).unwrap();
        assert_eq!(
            listed,
            "a: bench\nab: bench\nb/1: bench\nb/2: bench\nslow: bench\n"
        );
        assert!(ran.lock().unwrap().is_empty());
    }

    #[test]
    fn ignored_benches_run_only_when_asked() {
        let run = |cli: &[&str]| {
            let mut benches = Benches::new();
            benches.bench("kept", |b| b.iter(|| ()));
            benches
                .bench("slow", |b| b.iter(|| note("slow ran")))
                .ignore();
            take();
            let conclusion = benches.run(&args(cli)).unwrap();
            (take().contains(&Event::Note("slow ran")), conclusion)
        };
        let (slow_ran, conclusion) = run(&[]);
        assert!(!slow_ran);
        assert_eq!(conclusion.num_ignored, 1);
        assert!(run(&["--ignored"]).0);
        assert!(run(&["--include-ignored"]).0);
    }

    #[test]
    fn markers_enclose_exactly_the_measured_body() {
        let mut benches = Benches::new();
        benches.bench("first", |b| {
            note("setup");
            let out = b.iter(|| {
                note("body");
                7
            });
            assert_eq!(out, 7);
            note("teardown");
        });
        benches.bench("second", |b| {
            note("setup 2");
            b.iter(|| note("body 2"));
        });
        benches.policy(IterationPolicy::exact(1));
        take();
        let conclusion = benches.run(&args(&["--bench"])).unwrap();
        assert_eq!(conclusion.num_measured, 2);
        let b = |s: &str| Event::Begin(s.to_string());
        let e = |s: &str| Event::End(s.to_string());
        assert_eq!(
            take(),
            [
                Event::Note("setup"),
                b("first"),
                Event::Note("body"),
                e("first"),
                Event::Note("teardown"),
                Event::Note("setup 2"),
                b("second"),
                Event::Note("body 2"),
                e("second"),
            ]
        );
    }

    /// A measured `iter` warms up outside the region, then repeats the
    /// routine inside one region; `iter_batched` builds each input outside
    /// its own region; `iter_once` runs once; a smoke run runs once.
    #[test]
    fn iter_repeats_inside_one_region_after_a_warm_up_outside() {
        let b = |s: &str| Event::Begin(s.to_string());
        let e = |s: &str| Event::End(s.to_string());
        let body = Event::Note("body");
        let run = |cli: &[&str], policy: IterationPolicy| {
            let mut benches = Benches::new();
            benches.bench("r", |b| b.iter(|| note("body")));
            benches.policy(policy);
            take();
            let conclusion = benches.run(&args(cli)).unwrap();
            assert!(!conclusion.has_failed());
            take()
        };
        let exact = IterationPolicy::exact(3);
        assert_eq!(
            run(&["--bench"], exact),
            [b("r"), body.clone(), body.clone(), body.clone(), e("r")]
        );
        assert_eq!(run(&[], exact), [b("r"), body.clone(), e("r")]);
        // Calibrated: at least one warm-up run before the region, and the
        // region holds one or more runs (as many as fill `measure`).
        let calibrated = IterationPolicy {
            warm_up: std::time::Duration::from_millis(1),
            measure: std::time::Duration::from_millis(2),
            ..IterationPolicy::default()
        };
        let events = run(&["--bench"], calibrated);
        let begin = events.iter().position(|x| *x == b("r")).unwrap();
        assert!(begin >= 1 && events[..begin].iter().all(|x| *x == body));
        assert_eq!(events.last(), Some(&e("r")));
        assert!(
            events[begin + 1..events.len() - 1]
                .iter()
                .all(|x| *x == body)
        );
        assert!(events.len() - begin - 2 >= 1);

        let mut benches = Benches::new();
        benches.bench("batched", |b| {
            b.iter_batched(|| note("setup"), |()| note("body"));
        });
        benches.bench("once", |b| b.iter_once(|| note("body")));
        benches.policy(IterationPolicy::exact(2));
        take();
        let conclusion = benches.run(&args(&["--bench"])).unwrap();
        assert_eq!(conclusion.num_measured, 2);
        let setup = Event::Note("setup");
        assert_eq!(
            take(),
            [
                setup.clone(),
                b("batched"),
                body.clone(),
                e("batched"),
                setup,
                b("batched"),
                body.clone(),
                e("batched"),
                b("once"),
                body,
                e("once"),
            ]
        );
    }

    /// Under a recorder, `iter` and `iter_batched` stop once the recorder's
    /// count has grown by the sample target since the runs began; without
    /// one, or with an exact count, the target changes nothing.
    #[test]
    fn a_sample_target_ends_the_runs_once_the_recorder_has_it() {
        use super::tests_support::{samples, set_samples};
        let run = |recorder: Option<u64>, policy: IterationPolicy| {
            let mut benches = Benches::new();
            // Each recorded run "takes" 4 samples where a recorder runs
            // (the warm-up runs outside the region take none).
            let body = || {
                note("body");
                if samples(u64::MAX) != u64::MAX && super::tests_support::in_region() {
                    set_samples(Some(samples(0) + 4));
                }
            };
            benches.bench("iter", move |b| b.iter(body));
            benches.bench("batched", move |b| b.iter_batched(|| (), |()| body()));
            benches.policy(policy);
            set_samples(recorder);
            take();
            let conclusion = benches.run(&args(&["--bench"])).unwrap();
            set_samples(None);
            assert!(!conclusion.has_failed());
            let events = take();
            let in_region = |name: &str| {
                let begin = events.iter().position(|x| *x == Event::Begin(name.into()));
                let end = events.iter().rposition(|x| *x == Event::End(name.into()));
                events[begin.unwrap()..end.unwrap()]
                    .iter()
                    .filter(|x| **x == Event::Note("body"))
                    .count()
            };
            (in_region("iter"), in_region("batched"))
        };
        let targeted = IterationPolicy {
            warm_up: std::time::Duration::ZERO,
            measure: std::time::Duration::from_secs(3600),
            max_iterations: 50,
            sample_target: Some(10),
            ..IterationPolicy::default()
        };
        // 4, 8, 12 samples: the third run reaches 10.
        assert_eq!(run(Some(7), targeted), (3, 3));
        assert_eq!(run(None, targeted), (50, 50));
        let exact = IterationPolicy {
            exact: Some(5),
            ..targeted
        };
        assert_eq!(run(Some(7), exact), (5, 5));
    }

    #[test]
    fn a_panicking_body_fails_its_bench_and_still_ends_its_region() {
        let mut benches = Benches::new();
        benches.bench("boom", |b| {
            b.iter(|| {
                note("body");
                panic!("kaboom")
            });
        });
        benches.bench("fine", |b| b.iter(|| ()));
        benches.policy(IterationPolicy::exact(1));
        take();
        let conclusion = benches.run(&args(&["--bench"])).unwrap();
        assert!(conclusion.has_failed());
        assert_eq!(conclusion.num_failed, 1);
        assert_eq!(conclusion.num_measured, 1);
        let events = take();
        assert_eq!(
            &events[..3],
            [
                Event::Begin("boom".into()),
                Event::Note("body"),
                Event::End("boom".into())
            ]
        );
    }

    #[test]
    fn a_body_that_never_measures_fails() {
        let mut benches = Benches::new();
        benches.bench("lazy", |_| ());
        let conclusion = benches.run(&args(&[])).unwrap();
        assert_eq!(conclusion.num_failed, 1);
    }

    #[test]
    fn bad_names_are_rejected_before_running() {
        let check = |names: &[&str]| {
            let mut benches = Benches::new();
            for name in names {
                benches.bench(*name, |b| b.iter(|| ()));
            }
            benches.validate().map_err(|e| e.to_string())
        };
        assert_eq!(check(&["a", "b/c", "irr|str|irr"]), Ok(()));
        assert_eq!(
            check(&["a", "a"]),
            Err("bench name \"a\" is registered twice".into())
        );
        assert!(check(&[""]).unwrap_err().contains("is empty"));
        assert!(check(&["a\nb"]).unwrap_err().contains("line break"));
        assert!(check(&[" a"]).unwrap_err().contains("whitespace"));
    }

    #[test]
    fn size_follows_the_mode() {
        let p = IterationPolicy::default();
        assert_eq!(Bencher::new("x", Mode::Smoke, p).size(1000, 10), 10);
        assert_eq!(Bencher::new("x", Mode::Measure, p).size(1000, 10), 1000);
        assert!(Bencher::new("x", Mode::Smoke, p).is_smoke_test());
    }

    /// Both forms of `main!` expand to a `fn main` that type-checks; the
    /// registrations they make are exercised end to end by the microbench
    /// and fixture executables (`cargo-memgaze/tests/it/cargo_benches.rs`).
    #[test]
    fn main_macro_forms_compile() {
        mod functions_and_groups {
            use crate::{Bencher, Benches};
            fn lone(b: &mut Bencher) {
                b.iter(|| ());
            }
            fn g(benches: &mut Benches) {
                benches.bench_with_input("sized", 3, |b, n| b.iter(|| *n));
            }
            crate::main!(benches = [lone], groups = [g]);
            pub fn entry() -> fn() {
                main
            }
        }
        mod groups_only {
            fn g(benches: &mut crate::Benches) {
                benches.bench("g", |b| b.iter(|| ()));
            }
            crate::main!(g);
            pub fn entry() -> fn() {
                main
            }
        }
        let _ = (functions_and_groups::entry(), groups_only::entry());
    }
}
