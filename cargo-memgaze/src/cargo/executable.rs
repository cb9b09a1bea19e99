//! [`BenchExecutable`]: one built bench target — checking that it uses
//! memgaze-harness, listing its benches, and running one of them.

use super::frameworks::{self, BenchHarness};
use super::harness_args::HarnessArgs;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

pub use memgaze_trace::protocol::{RECORDING_ENV, REGION_BEGIN_SYMBOL, REGION_END_SYMBOL};

/// Why a bench executable's `--list` failed, in one line: its stderr's
/// first line, and for a Rust panic, whose first line is only
/// `thread 'main' panicked at FILE:LINE:COL:`, the message on the line after
/// it as well.
pub(super) fn listing_failure_reason(stderr: &str) -> String {
    let mut lines = stderr.lines().map(str::trim).skip_while(|l| l.is_empty());
    let Some(first) = lines.next() else {
        return "no message".to_string();
    };
    match lines.next() {
        Some(message) if first.contains("panicked at") && !message.is_empty() => {
            format!("{first} {message}")
        }
        _ => first.to_string(),
    }
}

/// A bench executable cargo built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BenchExecutable {
    /// Package name.
    pub package: String,
    /// Bench target name (`[[bench]] name`).
    pub target: String,
    /// The executable.
    pub path: PathBuf,
    /// The target's main source file.
    pub src_path: PathBuf,
    /// The package's directory (where `cargo bench` runs benches from).
    pub package_root: PathBuf,
    /// The workspace's root: source files under it are the user's code
    /// (hot lines are attributed to them rather than to inlined library
    /// code).
    pub workspace_root: PathBuf,
    /// The build's target directory: criterion benches are told it
    /// (`CARGO_TARGET_DIR`) so that they do not run `cargo metadata` to
    /// find it, a program the recorder would count as untraced.
    pub target_dir: PathBuf,
    /// What drives it (set by `discover` from its symbols).
    pub harness: BenchHarness,
}

/// Addresses (symbol values) of the region markers in an executable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionMarkers {
    /// `memgaze_region_begin`.
    pub begin: u64,
    /// `memgaze_region_end`.
    pub end: u64,
}

/// One bench as the harness lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BenchCase {
    /// Its name (`str/irr`, `lookup/1000`).
    pub name: String,
    /// Marked ignored; it is listed, and runs only when the user's harness
    /// arguments ask for ignored benches.
    pub ignored: bool,
}

/// How a bench run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BenchOutcome {
    /// It ran; the harness measured its region(s).
    Measured {
        /// Wall time of the measured runs, ns, where the harness reports it.
        nanos: Option<u64>,
        /// Runs of the routine inside the region(s), where the harness
        /// reports them.
        iterations: Option<u64>,
        /// Runs of the routine per timed batch, where the harness chose
        /// the batch size and reports it (divan).
        runs_per_batch: Option<u64>,
    },
    /// The body failed (panicked, never measured) or the process died.
    Failed {
        /// The harness's or the system's account of it.
        message: String,
    },
}

/// The result of running one bench.
#[derive(Clone, Debug)]
pub struct BenchRun {
    /// How it ended.
    pub outcome: BenchOutcome,
    /// The process's exit status.
    pub status: ExitStatus,
    /// Everything it wrote to stdout (libtest JSON events and the body's own
    /// output).
    pub stdout: String,
    /// Everything it wrote to stderr (panic messages).
    pub stderr: String,
}

/// Finds the region markers in the `.symtab` (or `.dynsym`) of an ELF
/// executable; `Ok(None)` when it has none, i.e. was not built with
/// memgaze-harness.
pub fn find_region_markers(path: &Path) -> anyhow::Result<Option<RegionMarkers>> {
    let bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
    let elf = goblin::elf::Elf::parse(&bytes)
        .with_context(|| format!("{}: not an ELF executable", path.display()))?;
    let (mut begin, mut end) = (None, None);
    let tables = [(&elf.syms, &elf.strtab), (&elf.dynsyms, &elf.dynstrtab)];
    for (symbols, names) in tables {
        for symbol in symbols.iter() {
            if !symbol.is_function() || symbol.st_value == 0 {
                continue;
            }
            match names.get_at(symbol.st_name) {
                Some(REGION_BEGIN_SYMBOL) => begin = begin.or(Some(symbol.st_value)),
                Some(REGION_END_SYMBOL) => end = end.or(Some(symbol.st_value)),
                _ => {}
            }
        }
    }
    Ok(begin
        .zip(end)
        .map(|(begin, end)| RegionMarkers { begin, end }))
}

impl BenchExecutable {
    /// `package/target`, for messages.
    pub fn display_name(&self) -> String {
        format!("{}/{}", self.package, self.target)
    }

    /// The region markers, or an error saying the bench was not built with
    /// memgaze-harness (or with markers merged onto one address, which would
    /// make begin and end indistinguishable).
    pub fn region_markers(&self) -> anyhow::Result<RegionMarkers> {
        let markers = find_region_markers(&self.path)
            .with_context(|| format!("bench `{}`", self.display_name()))?;
        let Some(markers) = markers else {
            bail!(
                "bench `{}` ({}) is not built with memgaze-harness: its executable \
                 has no `{REGION_BEGIN_SYMBOL}` symbol (make it a `[[bench]]` with \
                 `harness = false` whose `main` comes from `memgaze_harness::main!`)",
                self.display_name(),
                self.src_path.display()
            );
        };
        if markers.begin == markers.end {
            bail!(
                "bench `{}`: `{REGION_BEGIN_SYMBOL}` and `{REGION_END_SYMBOL}` share \
                 one address ({:#x}), so regions cannot be told apart; upgrade \
                 memgaze-harness",
                self.display_name(),
                markers.begin
            );
        }
        Ok(markers)
    }

    /// Lists the benches the user's harness arguments select, in the
    /// harness's order, by running the executable with `--list --format
    /// terse`. Without `--ignored`/`--include-ignored`, a second listing
    /// marks which are ignored (libtest lists them like the others).
    pub fn list(&self, harness: &HarnessArgs) -> anyhow::Result<Vec<BenchCase>> {
        let mut cases: Vec<BenchCase> = Vec::new();
        // One listing per filter; a bench two filters select runs once.
        for selection in harness.selections() {
            for case in self.list_selection(harness, &selection)? {
                if !cases.iter().any(|c| c.name == case.name) {
                    cases.push(case);
                }
            }
        }
        Ok(cases)
    }

    /// [`Self::list`] for one selection (at most one filter).
    fn list_selection(
        &self,
        harness: &HarnessArgs,
        selection: &[String],
    ) -> anyhow::Result<Vec<BenchCase>> {
        if self.harness != BenchHarness::Memgaze {
            return frameworks::list_framework(
                self.harness,
                &self.path,
                &self.package_root,
                &self.display_name(),
                selection,
            );
        }
        let names = self.list_names(selection, false)?;
        let ignored: Vec<String> = if harness.only_ignored() {
            names.clone()
        } else {
            self.list_names(selection, true)?
        };
        Ok(names
            .into_iter()
            .map(|name| {
                let ignored = ignored.contains(&name);
                BenchCase { name, ignored }
            })
            .collect())
    }

    fn list_names(&self, selection: &[String], only_ignored: bool) -> anyhow::Result<Vec<String>> {
        let mut command = Command::new(&self.path);
        command.current_dir(&self.package_root);
        command.args(["--list", "--format", "terse"]);
        if only_ignored {
            command.arg("--ignored");
        }
        // Selection last: it may end with `-- <filter>`.
        command.args(selection);
        let output = command
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {}", self.path.display()))?;
        if !output.status.success() {
            bail!(
                "listing the benches of `{}` failed ({}): {}",
                self.display_name(),
                output.status,
                listing_failure_reason(&String::from_utf8_lossy(&output.stderr))
            );
        }
        Ok(parse_list(&String::from_utf8_lossy(&output.stdout)))
    }

    /// The command that runs one bench (`--bench --format json --exact --
    /// <name>`, from the package root) through `program` — the executable itself, or an
    /// instrumented copy of it. The caller adds the environment (a recorder
    /// sets [`RECORDING_ENV`]) and the stdio it wants.
    ///
    /// `runs` fixes how many times the routine runs where the framework
    /// can be told on its command line (divan); memgaze-harness takes the
    /// count from its environment ([`crate::pipeline::ITERATIONS_ENV`]),
    /// and criterion cannot be told one.
    pub fn run_command(&self, program: &Path, case: &BenchCase, runs: Option<u64>) -> Command {
        let mut command = Command::new(program);
        match self.harness {
            BenchHarness::Criterion => command.args(frameworks::criterion_run_args(&case.name)),
            BenchHarness::Divan => command.args(frameworks::divan_run_args(&case.name, runs)),
            BenchHarness::Memgaze => {
                command.args(HarnessArgs::run_one_args(&case.name, case.ignored))
            }
        };
        command.stdin(Stdio::null());
        // `cargo bench` runs benches from the package root; relative paths
        // in bench bodies resolve the same way here.
        command.current_dir(&self.package_root);
        if self.harness == BenchHarness::Criterion
            && std::env::var_os("CARGO_TARGET_DIR").is_none()
            && !self.target_dir.as_os_str().is_empty()
        {
            // Where criterion keeps its results (`<target>/criterion`), as
            // under `cargo bench`, without its `cargo metadata` child.
            command.env("CARGO_TARGET_DIR", &self.target_dir);
        }
        command
    }

    /// Runs one bench through `program` (the executable itself for a
    /// native run, or an instrumented copy) after `configure` adjusts the
    /// command (environment, e.g. [`RECORDING_ENV`] or
    /// `MEMGAZE_MICRO_ELEMENTS`), and reports how it ended. An error means it
    /// could not be started or did not run (no bench of exactly that name);
    /// a failing body is `Ok` with [`BenchOutcome::Failed`].
    pub fn run(
        &self,
        program: &Path,
        case: &BenchCase,
        configure: impl FnOnce(&mut Command),
    ) -> anyhow::Result<BenchRun> {
        let mut command = self.run_command(program, case, None);
        configure(&mut command);
        let output = command
            .output()
            .with_context(|| format!("cannot run {}", program.display()))?;
        self.interpret(
            &case.name,
            output.status,
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
        .with_context(|| format!("bench `{}` of `{}`", case.name, self.display_name()))
    }

    /// How a run of bench `name` ended, read from its output the way its
    /// framework reports ([`interpret_run`] for memgaze-harness).
    pub fn interpret(
        &self,
        name: &str,
        status: ExitStatus,
        stdout: String,
        stderr: String,
    ) -> anyhow::Result<BenchRun> {
        match self.harness {
            BenchHarness::Criterion => {
                frameworks::interpret_criterion_run(name, status, stdout, stderr)
            }
            BenchHarness::Divan => frameworks::interpret_divan_run(name, status, stdout, stderr),
            BenchHarness::Memgaze => interpret_run(name, status, stdout, stderr),
        }
    }

    /// [`run`](Self::run) on the executable itself, unchanged.
    pub fn run_native(&self, case: &BenchCase) -> anyhow::Result<BenchRun> {
        self.run(&self.path, case, |_| {})
    }
}

/// Parses `--list --format terse` output: `<name>: bench` per line.
fn parse_list(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|line| line.strip_suffix(": bench"))
        .map(str::to_string)
        .collect()
}

/// The libtest event on one line of a `--format json` run's stdout, if any.
///
/// An event normally fills its line, but a body that prints without a
/// final newline (`print!`) leaves its text in front of the next event on
/// the same line; the event then starts at a `{ "type":` further on.
fn libtest_event(line: &str) -> Option<serde_json::Value> {
    let trimmed = line.trim_start();
    let starts = std::iter::once(line.len() - trimmed.len())
        .filter(|_| trimmed.starts_with('{'))
        .chain(
            line.match_indices("{ \"type\":")
                .chain(line.match_indices("{\"type\":"))
                .map(|(i, _)| i),
        );
    starts
        .filter_map(|i| serde_json::from_str::<serde_json::Value>(&line[i..]).ok())
        .find(|event| event.get("type").is_some())
}

/// Reads the outcome of a `--format json` run of one bench from its libtest
/// events (the body's own output around them is skipped).
pub fn interpret_run(
    name: &str,
    status: ExitStatus,
    stdout: String,
    stderr: String,
) -> anyhow::Result<BenchRun> {
    let mut measured = None;
    let mut iterations = None;
    let mut failed = None;
    let mut ran = 0u64;
    for event in stdout.lines().filter_map(libtest_event) {
        let field = |key: &str| event.get(key).and_then(|v| v.as_str());
        let is_this = field("name") == Some(name);
        match (field("type"), field("event")) {
            (Some("bench"), _) if is_this => {
                // Time per run; the `iterations` event below gives the total.
                measured = measured.or(event.get("median").and_then(|v| v.as_u64()));
            }
            (Some("memgaze"), Some("iterations")) if is_this => {
                iterations = event.get("iterations").and_then(|v| v.as_u64());
                measured = event.get("region_ns").and_then(|v| v.as_u64()).or(measured);
            }
            (Some("test"), Some("failed")) if is_this => {
                let message = field("stdout").map(str::trim).unwrap_or("").to_string();
                failed = Some(message);
            }
            (Some("suite"), Some("ok" | "failed")) => {
                ran = ["measured", "failed", "passed"]
                    .iter()
                    .filter_map(|k| event.get(*k).and_then(|v| v.as_u64()))
                    .sum();
            }
            _ => {}
        }
    }
    let panic_line = || {
        stderr
            .lines()
            .skip_while(|l| !l.contains("panicked at"))
            .nth(1)
            .map(|l| l.trim().to_string())
    };
    let outcome = if let Some(message) = failed {
        let message = panic_line()
            .or((!message.is_empty()).then_some(message))
            .unwrap_or_else(|| "the bench failed".to_string());
        BenchOutcome::Failed { message }
    } else if !status.success() {
        let message = panic_line().unwrap_or_else(|| format!("the process ended with {status}"));
        BenchOutcome::Failed { message }
    } else if let Some(nanos) = measured {
        BenchOutcome::Measured {
            nanos: Some(nanos),
            iterations,
            runs_per_batch: None,
        }
    } else if ran == 0 {
        bail!("the harness ran no bench named exactly `{name}`");
    } else {
        bail!("the harness reported no measurement");
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
    fn a_failed_listing_keeps_the_panic_message_after_its_location() {
        // Rust 1.73 and later print the location and the message on two lines.
        let panicked = "thread 'main' (638) panicked at src/benchmark_group.rs:490:9:\n\
                        Function name must not be empty.\n\
                        note: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(
            listing_failure_reason(panicked),
            "thread 'main' (638) panicked at src/benchmark_group.rs:490:9: \
             Function name must not be empty."
        );
        assert_eq!(
            listing_failure_reason("\nerror: unexpected argument '--list'\nUsage: x\n"),
            "error: unexpected argument '--list'"
        );
        assert_eq!(listing_failure_reason(" \n"), "no message");
    }

    #[test]
    fn list_lines_are_names_with_a_bench_suffix() {
        let out = "str1: bench\nstr/irr: bench\na: b: bench\nsome test: test\nnoise\n";
        assert_eq!(parse_list(out), ["str1", "str/irr", "a: b"]);
    }

    fn status(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    #[test]
    fn json_events_give_the_outcome() {
        let ok = concat!(
            "{ \"type\": \"suite\", \"event\": \"started\", \"test_count\": 1 }\n",
            "{ \"type\": \"test\", \"event\": \"started\", \"name\": \"chase\" }\n",
            "body output {not json\n",
            "{ \"type\": \"bench\", \"name\": \"chase\", \"median\": 1234, \"deviation\": 0 }\n",
            "{ \"type\": \"suite\", \"event\": \"ok\", \"passed\": 0, \"failed\": 0, \"ignored\": 0, \"measured\": 1, \"filtered_out\": 7, \"exec_time\": 0.1 }\n",
        );
        let run = interpret_run("chase", status(0), ok.into(), String::new()).unwrap();
        assert_eq!(
            run.outcome,
            BenchOutcome::Measured {
                nanos: Some(1234),
                iterations: None,
                runs_per_batch: None
            }
        );
        // A repeating harness: time per run, then the runs and their total
        // (printed after the suite's last event).
        let repeated = format!(
            "{ok}{}\n",
            r#"{ "type": "memgaze", "event": "iterations", "name": "chase", "iterations": 5, "region_ns": 6170 }"#
        );
        let run = interpret_run("chase", status(0), repeated, String::new()).unwrap();
        assert_eq!(
            run.outcome,
            BenchOutcome::Measured {
                nanos: Some(6170),
                iterations: Some(5),
                runs_per_batch: None
            }
        );

        let failed = concat!(
            "{ \"type\": \"test\", \"name\": \"boom\", \"event\": \"failed\", \"stdout\": \"Error: \\\"test panicked: kaboom\\\"\\n\" }\n",
            "{ \"type\": \"suite\", \"event\": \"failed\", \"passed\": 0, \"failed\": 1, \"ignored\": 0, \"measured\": 0, \"filtered_out\": 0, \"exec_time\": 0.1 }\n",
        );
        let stderr = "\nthread 'main' panicked at benches/b.rs:3:5:\nkaboom\nnote: run with `RUST_BACKTRACE=1`\n";
        let run = interpret_run("boom", status(101), failed.into(), stderr.into()).unwrap();
        assert_eq!(
            run.outcome,
            BenchOutcome::Failed {
                message: "kaboom".into()
            }
        );

        let killed = interpret_run("x", ExitStatus::from_raw(9), String::new(), String::new());
        match killed.unwrap().outcome {
            BenchOutcome::Failed { message } => assert!(message.contains("signal"), "{message}"),
            other => panic!("{other:?}"),
        }

        let none = "{ \"type\": \"suite\", \"event\": \"ok\", \"passed\": 0, \"failed\": 0, \"ignored\": 0, \"measured\": 0, \"filtered_out\": 8, \"exec_time\": 0.0 }\n";
        let e = interpret_run("nope", status(0), none.into(), String::new()).unwrap_err();
        assert!(
            e.to_string().contains("no bench named exactly `nope`"),
            "{e}"
        );
    }

    /// A body that prints without a newline (`print!`) puts its text in
    /// front of the next libtest event, on the same line: the event is
    /// still read (it was skipped, and the bench was an error).
    #[test]
    fn events_after_a_bodys_unterminated_output_are_read() {
        let out = concat!(
            "{ \"type\": \"suite\", \"event\": \"started\", \"test_count\": 1 }\n",
            "{ \"type\": \"test\", \"event\": \"started\", \"name\": \"p\" }\n",
            "no newline {here{ \"type\": \"bench\", \"name\": \"p\", \"median\": 77, \"deviation\": 0 }\n",
            "{ \"type\": \"suite\", \"event\": \"ok\", \"passed\": 0, \"failed\": 0, \"ignored\": 0, \"measured\": 1, \"filtered_out\": 1, \"exec_time\": 0.1 }\n",
        );
        let run = interpret_run("p", status(0), out.into(), String::new()).unwrap();
        assert_eq!(
            run.outcome,
            BenchOutcome::Measured {
                nanos: Some(77),
                iterations: None,
                runs_per_batch: None
            }
        );

        // The failure event after a prefix, the rest of the run as usual.
        let failed = concat!(
            "partial{ \"type\": \"test\", \"name\": \"p\", \"event\": \"failed\" }\n",
            "{ \"type\": \"suite\", \"event\": \"failed\", \"passed\": 0, \"failed\": 1, \"ignored\": 0, \"measured\": 0, \"filtered_out\": 1, \"exec_time\": 0.1 }\n",
        );
        let run = interpret_run("p", status(0), failed.into(), String::new()).unwrap();
        assert_eq!(
            run.outcome,
            BenchOutcome::Failed {
                message: "the bench failed".into()
            }
        );
    }

    #[test]
    fn an_executable_without_the_harness_has_no_markers() {
        assert_eq!(find_region_markers(Path::new("/bin/true")).unwrap(), None);
        let e = find_region_markers(Path::new("Cargo.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("not an ELF"), "{e:#}");
    }
}
