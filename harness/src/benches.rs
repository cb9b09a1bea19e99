//! [`Benches`]: the registry of a bench executable, and running it through
//! libtest-mimic.

use crate::bencher::{Bencher, IterationPolicy, Measured, Mode};
use libtest_mimic::{Arguments, Conclusion, Failed, FormatSetting, Measurement, Trial};
use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};

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
    policy: IterationPolicy,
}

/// The measured runs of each bench, as the trials finish.
type Reports = Arc<Mutex<Vec<(String, Measured)>>>;

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

    /// Sets how many times `iter` runs its routine in a measured run (the
    /// default is [`IterationPolicy::default`]; [`run_and_exit`] reads
    /// [`IterationPolicy::from_env`]).
    ///
    /// [`run_and_exit`]: Self::run_and_exit
    pub fn policy(&mut self, policy: IterationPolicy) -> &mut Self {
        self.policy = policy;
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
    /// With `--bench` each selected body runs in [`Mode::Measure`]: its
    /// `iter` repeats the routine as the [`IterationPolicy`] says, and the
    /// bench reports the time per run (libtest's `ns/iter`), followed, once
    /// all have run, by one line per bench with its runs: a JSON event
    /// `{ "type": "memgaze", "event": "iterations", "name", "iterations",
    /// "region_ns" }` under `--format json`, else `name: N iterations, T ns
    /// in total`. Without `--bench` each routine runs once
    /// ([`Mode::Smoke`]). A body that panics, or never calls `iter`, fails
    /// its bench.
    pub fn run(self, args: &Arguments) -> Result<Conclusion, RegistrationError> {
        self.validate()?;
        let reports = Reports::default();
        let policy = self.policy;
        let trials = self
            .benches
            .into_iter()
            .map(|bench| trial(bench, policy, Arc::clone(&reports)))
            .collect();
        let conclusion = libtest_mimic::run(args, trials);
        if args.logfile.is_none() {
            let reports = reports.lock().unwrap_or_else(|e| e.into_inner());
            print_reports(&reports, args.format);
        }
        Ok(conclusion)
    }

    /// Parses the process's command line (the libtest CLI) and the
    /// iteration policy's environment ([`IterationPolicy::from_env`]),
    /// applies [`RECORDING_ENV`], runs, and exits: 0 when every selected
    /// bench passed, 101 otherwise (libtest's codes; also for an unreadable
    /// policy variable, with one `error:` line naming it).
    pub fn run_and_exit(mut self) -> ! {
        let args = arguments_for_environment(Arguments::from_args(), recording());
        match IterationPolicy::from_env() {
            Ok(policy) => self.policy = policy,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(101)
            }
        }
        match self.run(&args) {
            Ok(conclusion) => conclusion.exit(),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(101)
            }
        }
    }
}

/// Prints the runs of each measured bench (see [`Benches::run`]).
fn print_reports(reports: &[(String, Measured)], format: Option<FormatSetting>) {
    use std::io::Write;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for (name, m) in reports {
        let nanos = m.elapsed.as_nanos();
        let _ = match format {
            Some(FormatSetting::Json) => writeln!(
                out,
                r#"{{ "type": "memgaze", "event": "iterations", "name": {}, "iterations": {}, "region_ns": {} }}"#,
                json_string(name),
                m.iterations,
                nanos
            ),
            _ => writeln!(
                out,
                "{name}: {} in {:.3?}",
                if m.iterations == 1 {
                    "1 iteration".to_string()
                } else {
                    format!("{} iterations", m.iterations)
                },
                m.elapsed
            ),
        };
    }
    let _ = out.flush();
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Adjusts parsed arguments for the environment: under a recorder, one
/// thread; when measuring (`--bench`), one thread unless `--test-threads`
/// asks for more, as libtest and criterion measure one bench at a time
/// (two at once share the caches and the memory bandwidth they measure).
pub fn arguments_for_environment(mut args: Arguments, recording: bool) -> Arguments {
    if recording || (args.bench && args.test_threads.is_none()) {
        args.test_threads = Some(1);
    }
    args
}

fn trial(bench: Bench, policy: IterationPolicy, reports: Reports) -> Trial {
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
        let mut bencher = Bencher::new(&runner_name, mode, policy);
        body(&mut bencher);
        let measured = bencher.finish();
        if measured.regions == 0 {
            return Err(Failed::from(format!(
                "bench `{runner_name}` never called `Bencher::iter`: nothing was measured"
            )));
        }
        Ok(match mode {
            Mode::Smoke => None,
            Mode::Measure => {
                reports
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((runner_name.clone(), measured));
                let per_run = measured.elapsed.as_nanos() / u128::from(measured.iterations.max(1));
                Some(Measurement {
                    avg: u64::try_from(per_run).unwrap_or(u64::MAX),
                    variance: 0,
                })
            }
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

    #[test]
    fn measuring_runs_one_bench_at_a_time_unless_told_otherwise() {
        let measuring = Arguments {
            bench: true,
            ..Arguments::default()
        };
        assert_eq!(
            arguments_for_environment(measuring.clone(), false).test_threads,
            Some(1)
        );
        let told = Arguments {
            test_threads: Some(4),
            ..measuring
        };
        assert_eq!(arguments_for_environment(told, false).test_threads, Some(4));
        // Smoke runs (`cargo test --benches`) keep libtest's threads.
        assert_eq!(
            arguments_for_environment(Arguments::default(), false).test_threads,
            None
        );
    }
}
