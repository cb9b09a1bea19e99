//! [`Benches`]: the registry of a bench executable, and running it through
//! libtest-mimic.

use crate::bencher::{Bencher, Mode};
use libtest_mimic::{Arguments, Conclusion, Failed, Measurement, Trial};
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

/// The environment variable `cargo memgaze`'s collectors set (to `1`) in the
/// environment of every program they record.
///
/// When it is set (to anything but `0` or nothing), the harness runs benches
/// one at a time on the main thread, whatever `--test-threads` says, so the
/// samples of two benches never interleave.
pub const RECORDING_ENV: &str = "MEMGAZE_RECORDING";

/// Whether this process runs under a `cargo memgaze` collector
/// ([`RECORDING_ENV`]).
pub fn recording() -> bool {
    recording_value(std::env::var_os(RECORDING_ENV).as_deref())
}

fn recording_value(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| !v.is_empty() && v != "0")
}

type Body = Box<dyn FnOnce(&mut Bencher<'_>) + Send>;

/// One registered bench: a name, a body, and whether it is ignored.
pub struct Bench {
    name: String,
    ignored: bool,
    body: Body,
}

impl Bench {
    /// The bench's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Marks the bench as ignored, like `#[ignore]`: it runs only with
    /// `--ignored` or `--include-ignored`.
    pub fn ignore(&mut self) -> &mut Self {
        self.ignored = true;
        self
    }
}

impl fmt::Debug for Bench {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bench")
            .field("name", &self.name)
            .field("ignored", &self.ignored)
            .finish_non_exhaustive()
    }
}

/// The benches of one bench executable, in registration order.
///
/// ```no_run
/// use memgaze_harness::{Benches, black_box};
///
/// fn register(benches: &mut Benches) {
///     benches.bench("sum", |b| {
///         let data: Vec<u64> = (0..b.size(1_000_000, 1_000) as u64).collect(); // setup
///         b.iter(|| data.iter().sum::<u64>()); // measured
///     });
///     benches.bench_with_inputs("lookup", [1_000, 100_000], |b, &n| {
///         let map: std::collections::HashMap<u64, u64> = (0..n).map(|k| (k, k)).collect();
///         b.iter(|| (0..n).filter(|k| map.contains_key(black_box(k))).count());
///     }); // registers `lookup/1000` and `lookup/100000`
/// }
/// memgaze_harness::main!(register);
/// ```
#[derive(Debug, Default)]
pub struct Benches {
    benches: Vec<Bench>,
}

impl Benches {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a bench. `body` does its setup, then calls
    /// [`Bencher::iter`] with the part to measure. Whatever `body` returns is
    /// dropped (so `|b| b.iter(|| work())` is fine).
    pub fn bench<F, T>(&mut self, name: impl Into<String>, body: F) -> &mut Bench
    where
        F: FnOnce(&mut Bencher<'_>) -> T + Send + 'static,
    {
        self.benches.push(Bench {
            name: name.into(),
            ignored: false,
            body: Box::new(move |b| drop(body(b))),
        });
        self.benches.last_mut().expect("just pushed")
    }

    /// Registers a bench over one input, named `name/input` (the input's
    /// `Display`), e.g. `lookup/1000`.
    pub fn bench_with_input<I, F, T>(&mut self, name: &str, input: I, body: F) -> &mut Bench
    where
        I: fmt::Display + Send + 'static,
        F: FnOnce(&mut Bencher<'_>, &I) -> T + Send + 'static,
    {
        let full = format!("{name}/{input}");
        self.bench(full, move |b| body(b, &input))
    }

    /// Registers one bench per input, each named `name/input`.
    pub fn bench_with_inputs<I, F, T>(
        &mut self,
        name: &str,
        inputs: impl IntoIterator<Item = I>,
        body: F,
    ) -> &mut Self
    where
        I: fmt::Display + Send + 'static,
        F: Fn(&mut Bencher<'_>, &I) -> T + Send + Sync + 'static,
    {
        let body = Arc::new(body);
        for input in inputs {
            let body = Arc::clone(&body);
            self.bench_with_input(name, input, move |b, i| body(b, i));
        }
        self
    }

    /// The registered benches' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.benches.iter().map(|b| b.name.as_str())
    }

    /// Checks the names: non-empty, one line, no surrounding whitespace,
    /// unique. `--list` output and `--exact` selection depend on this.
    pub fn validate(&self) -> Result<(), RegistrationError> {
        let mut seen = HashSet::new();
        for bench in &self.benches {
            let name = bench.name.as_str();
            let problem = if name.is_empty() {
                Some("is empty")
            } else if name.contains(['\n', '\r']) {
                Some("contains a line break")
            } else if name.trim() != name {
                Some("starts or ends with whitespace")
            } else if !seen.insert(name) {
                Some("is registered twice")
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(RegistrationError {
                    name: name.to_string(),
                    problem,
                });
            }
        }
        Ok(())
    }

    /// Runs (or lists) the benches as libtest would with `args`.
    ///
    /// Each selected bench body runs once; with `--bench` it is a
    /// [`Mode::Measure`] run reporting the time of its measured region(s),
    /// otherwise a [`Mode::Smoke`] run. A body that panics, or never calls
    /// [`Bencher::iter`], fails its bench.
    pub fn run(self, args: &Arguments) -> Result<Conclusion, RegistrationError> {
        self.validate()?;
        let trials = self.benches.into_iter().map(trial).collect();
        Ok(libtest_mimic::run(args, trials))
    }

    /// Parses the process's command line (the libtest CLI), applies
    /// [`RECORDING_ENV`], runs, and exits: 0 when every selected bench
    /// passed, 101 otherwise (libtest's codes).
    pub fn run_and_exit(self) -> ! {
        let args = arguments_for_environment(Arguments::from_args(), recording());
        match self.run(&args) {
            Ok(conclusion) => conclusion.exit(),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(101)
            }
        }
    }
}

/// Adjusts parsed arguments for the environment: under a recorder, one
/// thread.
pub fn arguments_for_environment(mut args: Arguments, recording: bool) -> Arguments {
    if recording {
        args.test_threads = Some(1);
    }
    args
}

fn trial(bench: Bench) -> Trial {
    let Bench {
        name,
        ignored,
        body,
    } = bench;
    let runner_name = name.clone();
    Trial::bench(name, move |test_mode| {
        let mode = if test_mode {
            Mode::Smoke
        } else {
            Mode::Measure
        };
        let mut bencher = Bencher::new(&runner_name, mode);
        body(&mut bencher);
        let (regions, elapsed) = bencher.finish();
        if regions == 0 {
            return Err(Failed::from(format!(
                "bench `{runner_name}` never called `Bencher::iter`: nothing was measured"
            )));
        }
        Ok(match mode {
            Mode::Smoke => None,
            Mode::Measure => Some(Measurement {
                avg: u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
                variance: 0,
            }),
        })
    })
    .with_ignored_flag(ignored)
}

/// A bench name the harness cannot work with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrationError {
    /// The offending name.
    pub name: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl fmt::Display for RegistrationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bench name {:?} {}", self.name, self.problem)
    }
}

impl std::error::Error for RegistrationError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recording_is_on_for_any_value_but_empty_or_zero() {
        assert!(!recording_value(None));
        assert!(!recording_value(Some("".as_ref())));
        assert!(!recording_value(Some("0".as_ref())));
        assert!(recording_value(Some("1".as_ref())));
        assert!(recording_value(Some("yes".as_ref())));
    }

    #[test]
    fn recording_forces_one_thread() {
        let args = Arguments {
            test_threads: Some(8),
            ..Arguments::default()
        };
        assert_eq!(
            arguments_for_environment(args.clone(), true).test_threads,
            Some(1)
        );
        assert_eq!(arguments_for_environment(args, false).test_threads, Some(8));
        assert_eq!(
            arguments_for_environment(Arguments::default(), true).test_threads,
            Some(1)
        );
    }
}
