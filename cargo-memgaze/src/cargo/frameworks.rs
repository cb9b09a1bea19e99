//! Bench targets written with criterion or divan instead of
//! memgaze-harness: recognising them in the built executable, listing their
//! benches and running one under the recorder.
//!
//! The measured region is placed by the rewriter at the frameworks' own
//! measurement functions (see memgaze-instrument's `rewrite::hooks`), so the
//! benches run unmodified. Criterion benches run in its profiling mode
//! (`--profile-time`): a fixed 1 s warm-up of the routine and no analysis
//! or plots, which is long enough for ≥ 30 samples of anything but an empty
//! routine, and no longer.

use super::executable::{
    BenchCase, BenchExecutable, BenchOutcome, BenchRun, listing_failure_reason,
};
use anyhow::{Context, bail};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};

/// What drives a bench executable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BenchHarness {
    /// memgaze-harness (region markers, libtest's command line).
    #[default]
    Memgaze,
    /// criterion (0.3 to 0.8): regions at `WallTime::start`/`end`.
    Criterion,
    /// divan (0.1): regions at its sample loop's `sync_impl`.
    Divan,
}

impl BenchHarness {
    /// The name used in messages and JSON (`memgaze`, `criterion`, `divan`).
    pub fn name(self) -> &'static str {
        match self {
            BenchHarness::Memgaze => "memgaze",
            BenchHarness::Criterion => "criterion",
            BenchHarness::Divan => "divan",
        }
    }
}

/// Seconds criterion profiles each bench (`--profile-time`); its warm-up
/// alone takes 1 s whatever is asked.
pub const CRITERION_PROFILE_SECS: &str = "1";

/// Said of a criterion bench whose `WallTime` functions LTO inlined: its
/// region is the fallback one (see memgaze-instrument's `rewrite::hooks`).
pub const CRITERION_ROUTINE_NOTE: &str = "criterion's `WallTime::start`/`end` were inlined \
     (LTO): the region is each bench's `Routine::warm_up` and `bench` up to `stop_profiling`, \
     so it also holds the timing loop, the clock reads and `iter_batched`'s setup and drops";

/// Which framework's measurement functions `path` has, by symbol
/// (mangled names, so no demangling is needed), with a note when the region
/// is a fallback; `None` for neither.
pub fn detect(path: &Path) -> anyhow::Result<Option<(BenchHarness, Option<&'static str>)>> {
    let bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
    let elf = goblin::elf::Elf::parse(&bytes)
        .with_context(|| format!("{}: not an ELF executable", path.display()))?;
    let (mut start, mut end, mut divan) = (false, false, false);
    let (mut warm_up, mut profiler) = (false, false);
    for symbol in elf.syms.iter() {
        if !symbol.is_function() || symbol.st_value == 0 {
            continue;
        }
        let Some(name) = elf.strtab.get_at(symbol.st_name) else {
            continue;
        };
        if name.contains(
            "criterion..measurement..WallTime$u20$as$u20$criterion..measurement..Measurement$GT$",
        ) {
            start |= name.contains("$GT$5start");
            end |= name.contains("$GT$3end");
        }
        warm_up |= name.contains("$u20$as$u20$criterion..routine..Routine$LT$")
            && name.contains("$GT$7warm_up");
        profiler |= name.contains(
            "criterion..profiler..ExternalProfiler$u20$as$u20$criterion..profiler..Profiler$GT$14stop_profiling",
        );
        divan |= name.contains("5divan9benchmark12BenchContext15sample_recorder")
            && name.contains("9sync_impl");
    }
    Ok(if start && end {
        Some((BenchHarness::Criterion, None))
    } else if warm_up && profiler {
        Some((BenchHarness::Criterion, Some(CRITERION_ROUTINE_NOTE)))
    } else if divan {
        Some((BenchHarness::Divan, None))
    } else {
        None
    })
}

/// The error for a bench target driven by none of the supported harnesses
/// (a libtest `#[bench]` target, a custom `main`): one line naming it and
/// what is supported.
pub fn unsupported(executable: &BenchExecutable) -> anyhow::Error {
    anyhow::anyhow!(
        "bench `{}` ({}) is not run: it uses neither memgaze-harness nor criterion nor divan \
         (libtest `#[bench]` and custom `main`s are not supported; make it a `[[bench]]` with \
         `harness = false` whose `main` comes from `memgaze_harness::main!`, \
         `criterion_main!` or `divan::main()`)",
        executable.display_name(),
        executable.src_path.display()
    )
}

/// Packages whose benches cargo memgaze can run depend on one of these.
pub const SUPPORTED_PACKAGES: [&str; 3] = ["memgaze-harness", "criterion", "divan"];

/// The bench targets of `package` that cargo memgaze cannot run, as far as
/// cargo metadata and the manifest tell before anything is built, with a
/// one-line reason each: every bench target when the package depends on
/// none of [`SUPPORTED_PACKAGES`], and libtest `#[bench]` targets
/// (`harness = true`, the default for a `benches/*.rs` without a
/// `[[bench]]` entry). A manifest that cannot be read tells nothing.
pub fn unsupported_benches(package: &cargo_metadata::Package) -> Vec<(String, String)> {
    let benches = package
        .targets
        .iter()
        .filter(|t| t.kind.contains(&cargo_metadata::TargetKind::Bench));
    let supported_dependency = package
        .dependencies
        .iter()
        .any(|d| SUPPORTED_PACKAGES.contains(&d.name.as_str()));
    let display = |target: &str| format!("{}/{target}", package.name);
    if !supported_dependency {
        return benches
            .map(|t| {
                let reason = format!(
                    "bench `{}` is not run: package `{}` depends on none of memgaze-harness, \
                     criterion and divan (the supported bench harnesses)",
                    display(&t.name),
                    package.name
                );
                (t.name.clone(), reason)
            })
            .collect();
    }
    let Ok(text) = std::fs::read_to_string(package.manifest_path.as_std_path()) else {
        return Vec::new();
    };
    let Ok(manifest) = text.parse::<toml_edit::DocumentMut>() else {
        return Vec::new();
    };
    let entries = manifest
        .get("bench")
        .and_then(|b| b.as_array_of_tables())
        .map(|a| a.iter().collect::<Vec<_>>())
        .unwrap_or_default();
    benches
        .filter(|t| {
            let entry = entries
                .iter()
                .find(|e| e.get("name").and_then(|n| n.as_str()) == Some(t.name.as_str()));
            entry
                .and_then(|e| e.get("harness"))
                .and_then(|h| h.as_bool())
                .unwrap_or(true)
        })
        .map(|t| {
            let reason = format!(
                "bench `{}` ({}) is not run: it is a libtest `#[bench]` target (`harness = true`); \
                 supported: a `[[bench]]` with `harness = false` using memgaze-harness, criterion \
                 or divan",
                display(&t.name),
                t.src_path
            );
            (t.name.clone(), reason)
        })
        .collect()
}

/// The user's selection (after `--`) as criterion takes it. Every
/// criterion version (0.3 to 0.8) reads its filter as a regular expression,
/// but only 0.5 and later know `--exact` (0.3 and 0.4 reject it), so a
/// selection with `--exact` becomes the anchored, escaped filter
/// `^name$`, which selects the same bench in all of them. libtest's
/// `--skip` and `--ignored` have no criterion equivalent and are dropped.
pub fn criterion_selection(selection: &[String]) -> Vec<String> {
    let exact = selection.iter().any(|a| a == "--exact");
    let mut out = Vec::new();
    let mut args = selection.iter();
    let mut positional_only = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--skip" if !positional_only => {
                args.next();
            }
            "--ignored" | "--exact" if !positional_only => {}
            "--" if !positional_only => {
                positional_only = true;
                out.push(arg.clone());
            }
            filter if exact && (positional_only || !filter.starts_with('-')) => {
                out.push(criterion_exact_filter(filter));
            }
            _ => out.push(arg.clone()),
        }
    }
    out
}

/// The criterion filter that matches the bench `name` and nothing else:
/// `name` with the regular-expression metacharacters escaped, anchored at
/// both ends.
pub fn criterion_exact_filter(name: &str) -> String {
    let mut filter = String::with_capacity(name.len() + 2);
    filter.push('^');
    for c in name.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            filter.push('\\');
        }
        filter.push(c);
    }
    filter.push('$');
    filter
}

/// Seconds divan spends on each bench at least (`--min-time`).
pub const DIVAN_MIN_TIME_SECS: &str = "1";

/// Lists a criterion or divan executable's benches with the user's
/// selection: criterion's `--bench --list`, divan's `--list --format terse`
/// (which divan answers under `NEXTEST=1`); both print `<name>: benchmark`
/// lines (criterion 0.3 and 0.4: `<name>: bench`). Criterion's names are `group/function/parameter`, divan's
/// `module::function::arg`, as each prints them and as `--exact` takes them.
pub fn list_framework(
    harness: BenchHarness,
    path: &Path,
    package_root: &Path,
    display: &str,
    selection: &[String],
) -> anyhow::Result<Vec<BenchCase>> {
    let mut command = Command::new(path);
    command.current_dir(package_root);
    match harness {
        BenchHarness::Divan => {
            command
                .args(["--list", "--format", "terse"])
                .env("NEXTEST", "1")
                .args(selection);
        }
        _ => {
            command
                .args(["--bench", "--list"])
                .args(criterion_selection(selection));
        }
    }
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", path.display()))?;
    if !output.status.success() {
        bail!(
            "listing the {} benches of `{display}` failed ({}): {}",
            harness.name(),
            output.status,
            listing_failure_reason(&String::from_utf8_lossy(&output.stderr))
        );
    }
    Ok(parse_criterion_list(&String::from_utf8_lossy(
        &output.stdout,
    )))
}

/// Parses criterion's (and divan's terse) `--list` output: `<name>:
/// benchmark` lines, `<name>: bench` from criterion 0.3 and 0.4.
fn parse_criterion_list(stdout: &str) -> Vec<BenchCase> {
    stdout
        .lines()
        .filter_map(|line| {
            line.strip_suffix(": benchmark")
                .or_else(|| line.strip_suffix(": bench"))
        })
        .map(|name| BenchCase {
            name: name.to_string(),
            ignored: false,
        })
        .collect()
}

/// The arguments that run one criterion bench by exact name in profiling
/// mode (no analysis, no plots, no saved data); the name goes as an
/// anchored filter, which criterion 0.3 to 0.8 all take (see
/// [`criterion_selection`]).
pub fn criterion_run_args(name: &str) -> Vec<String> {
    vec![
        "--bench".to_string(),
        "--profile-time".to_string(),
        CRITERION_PROFILE_SECS.to_string(),
        criterion_exact_filter(name),
    ]
}

/// The arguments that run one divan bench by exact name for at least
/// [`DIVAN_MIN_TIME_SECS`], or, given `runs`, exactly that many times: one
/// sample of `runs` iterations, which (unlike a time) gives the same full
/// trace on every run.
pub fn divan_run_args(name: &str, runs: Option<u64>) -> Vec<String> {
    let mut args = vec!["--bench".to_string()];
    match runs {
        Some(runs) => args.extend([
            "--sample-count".to_string(),
            "1".to_string(),
            "--sample-size".to_string(),
            runs.to_string(),
        ]),
        None => args.extend(["--min-time".to_string(), DIVAN_MIN_TIME_SECS.to_string()]),
    }
    args.extend(["--exact".to_string(), name.to_string()]);
    args
}

/// How a divan run of `name` ended: its table has a row for the bench's
/// last path component (`chasing` or its argument `1000`), whose last
/// columns are `… │ mean │ samples │ iters`: the routine's runs, with the
/// mean time per run their total time, and over the samples (timed
/// batches of equal size) the runs per batch.
pub fn interpret_divan_run(
    name: &str,
    status: ExitStatus,
    stdout: String,
    stderr: String,
) -> anyhow::Result<BenchRun> {
    let leaf = name.rsplit("::").next().unwrap_or(name);
    let row = stdout.lines().find_map(|l| {
        let row = l.trim_start_matches(['│', '├', '╰', '─', ' ']);
        row.starts_with(&format!("{leaf} ")).then_some(row)
    });
    let outcome = if !status.success() {
        BenchOutcome::Failed {
            message: panic_message(&stderr)
                .unwrap_or_else(|| format!("the process ended with {status}")),
        }
    } else if let Some(row) = row {
        let figures = divan_row_figures(row);
        let iterations = figures.iterations;
        BenchOutcome::Measured {
            nanos: figures
                .mean_ns
                .zip(iterations)
                .map(|(mean, n)| (mean * n as f64).round() as u64),
            iterations,
            runs_per_batch: figures
                .samples
                .zip(iterations)
                .filter(|&(samples, runs)| samples > 0 && runs % samples == 0)
                .map(|(samples, runs)| runs / samples),
        }
    } else {
        bail!("divan ran no bench named exactly `{name}`");
    };
    Ok(BenchRun {
        outcome,
        status,
        stdout,
        stderr,
    })
}

/// The figures of a divan table row
/// (`leaf  fastest │ slowest │ median │ mean │ samples │ iters`).
#[derive(Debug, Default)]
struct DivanRowFigures {
    /// Mean time per run, ns.
    mean_ns: Option<f64>,
    /// Timed batches (divan's samples), each of the same number of runs.
    samples: Option<u64>,
    /// Runs of the routine in all batches.
    iterations: Option<u64>,
}

/// The [`DivanRowFigures`] of a table row; none for a row without them.
fn divan_row_figures(row: &str) -> DivanRowFigures {
    let columns: Vec<&str> = row.split('│').map(str::trim).collect();
    if columns.len() < 6 {
        return DivanRowFigures::default();
    }
    let column = |from_end: usize| columns[columns.len() - from_end];
    DivanRowFigures {
        mean_ns: divan_duration_ns(column(3)),
        samples: column(2).parse::<u64>().ok(),
        iterations: column(1).parse::<u64>().ok(),
    }
}

/// A divan duration (`27.07 µs`, `8.274 ms`, `1.2 s`, `950 ns`, `3 ps`) in
/// nanoseconds.
fn divan_duration_ns(text: &str) -> Option<f64> {
    let (number, unit) = text.trim().split_once(' ')?;
    let scale = match unit.trim() {
        "ps" => 1e-3,
        "ns" => 1.0,
        "µs" | "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return None,
    };
    number.parse::<f64>().ok().map(|x| x * scale)
}

/// The line after `panicked at` in a Rust program's stderr.
fn panic_message(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .skip_while(|l| !l.contains("panicked at"))
        .nth(1)
        .map(|l| l.trim().to_string())
}

/// How a criterion run of `name` ended: criterion prints `Benchmarking
/// <name>: Complete` when the profiling run finished. It reports neither
/// time nor iterations in this mode (both `None`).
pub fn interpret_criterion_run(
    name: &str,
    status: ExitStatus,
    stdout: String,
    stderr: String,
) -> anyhow::Result<BenchRun> {
    let complete = format!("Benchmarking {name}: Complete");
    let outcome = if !status.success() {
        let message =
            panic_message(&stderr).unwrap_or_else(|| format!("the process ended with {status}"));
        BenchOutcome::Failed { message }
    } else if stdout.contains(&complete) {
        BenchOutcome::Measured {
            nanos: None,
            iterations: None,
            runs_per_batch: None,
        }
    } else {
        bail!("criterion ran no bench named exactly `{name}`");
    };
    Ok(BenchRun {
        outcome,
        status,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn criterion_lists_and_selections() {
        let out = "sum: benchmark\n\nchase/cycle/1000: benchmark\n\nnoise\n";
        let names: Vec<String> = parse_criterion_list(out)
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["sum", "chase/cycle/1000"]);
        let sel: Vec<String> = ["--exact", "--skip", "x", "--ignored", "--", "sum"]
            .map(String::from)
            .to_vec();
        assert_eq!(criterion_selection(&sel), ["--", "^sum$"]);
        let sel: Vec<String> = ["chase/cycle/10.5", "--exact"].map(String::from).to_vec();
        assert_eq!(criterion_selection(&sel), [r"^chase/cycle/10\.5$"]);
        // Without --exact the filter stays the user's regular expression.
        let sel: Vec<String> = ["chase/.*", "--skip", "sum"].map(String::from).to_vec();
        assert_eq!(criterion_selection(&sel), ["chase/.*"]);
        assert_eq!(
            criterion_exact_filter("a(b)+[c]|d^$*?{1}\\"),
            r"^a\(b\)\+\[c\]\|d\^\$\*\?\{1\}\\$"
        );
        assert_eq!(
            criterion_run_args("req/req"),
            [
                "--bench",
                "--profile-time",
                CRITERION_PROFILE_SECS,
                "^req/req$"
            ]
        );
    }

    /// A fixed run count reaches divan as one sample of that many
    /// iterations, in place of the minimum time.
    #[test]
    fn divan_runs_for_a_time_or_a_fixed_count() {
        assert_eq!(
            divan_run_args("div::sum::10", None),
            [
                "--bench",
                "--min-time",
                DIVAN_MIN_TIME_SECS,
                "--exact",
                "div::sum::10"
            ]
        );
        assert_eq!(
            divan_run_args("div::sum::10", Some(3)),
            [
                "--bench",
                "--sample-count",
                "1",
                "--sample-size",
                "3",
                "--exact",
                "div::sum::10"
            ]
        );
    }

    /// Criterion 0.3 and 0.4 end list lines with `: bench` (captured from
    /// httparse's criterion 0.3.6 bench).
    #[test]
    fn criterion_03_lists() {
        let out = "req/req: bench\nreq_short/req_short: bench\nresp/resp: bench\n";
        let names: Vec<String> = parse_criterion_list(out)
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["req/req", "req_short/req_short", "resp/resp"]);
    }

    #[test]
    fn criterion_outcomes() {
        let ok = ExitStatus::from_raw(0);
        let out = "Benchmarking sum\nBenchmarking sum: Profiling for 1.0000 s\nBenchmarking sum: Complete (Analysis Disabled)\n";
        let run = interpret_criterion_run("sum", ok, out.into(), String::new()).unwrap();
        assert_eq!(
            run.outcome,
            BenchOutcome::Measured {
                nanos: None,
                iterations: None,
                runs_per_batch: None
            }
        );
        assert!(interpret_criterion_run("other", ok, out.into(), String::new()).is_err());
        let failed = ExitStatus::from_raw(101 << 8);
        let stderr = "thread 'main' panicked at benches/c.rs:3:5:\nboom\n";
        let run = interpret_criterion_run("sum", failed, String::new(), stderr.into()).unwrap();
        assert_eq!(
            run.outcome,
            BenchOutcome::Failed {
                message: "boom".into()
            }
        );
    }

    #[test]
    fn divan_outcomes() {
        let ok = ExitStatus::from_raw(0);
        let out = "div              fastest       │ slowest       │ median        │ mean          │ samples │ iters\n╰─ chasing                      │               │               │               │         │\n   ╰─ 1000       27.07 µs      │ 78.62 µs      │ 28.1 µs       │ 29.5 µs       │ 100     │ 3200\n";
        let run = interpret_divan_run("div::chasing::1000", ok, out.into(), String::new()).unwrap();
        assert_eq!(
            run.outcome,
            BenchOutcome::Measured {
                nanos: Some(94_400_000),
                iterations: Some(3200),
                runs_per_batch: Some(32)
            }
        );
        assert!(interpret_divan_run("div::chasing::5", ok, out.into(), String::new()).is_err());
        // A row without the count columns is still the bench's result.
        let out = "div              fastest\n╰─ sort_batched  169.3 µs      │ 8.274 ms\n";
        let run = interpret_divan_run("div::sort_batched", ok, out.into(), String::new()).unwrap();
        assert_eq!(
            run.outcome,
            BenchOutcome::Measured {
                nanos: None,
                iterations: None,
                runs_per_batch: None
            }
        );
        assert_eq!(divan_duration_ns("8.25 ms"), Some(8_250_000.0));
        assert_eq!(divan_duration_ns("950 ns"), Some(950.0));
        assert_eq!(divan_duration_ns("1.5 s"), Some(1.5e9));
        assert_eq!(divan_duration_ns("lots"), None);
    }

    #[test]
    fn plain_executables_have_no_framework() {
        assert_eq!(detect(Path::new("/bin/true")).unwrap(), None);
    }
}
