//! `cargo memgaze golden`: full-trace metrics of the workspace's benches as
//! insta snapshots under `golden/`.

use super::bench::emit;
use super::progress::Progress;
use super::style::styled_eprintln;
use super::suite::{self, Backend, plural};
use super::{Global, MessageFormat};
use crate::cargo::{BenchCase, BenchKey, BenchSuite, BenchTarget, CargoArgs, HarnessArgs};
use crate::golden::store::is_ci;
use crate::golden::{BuildFacts, GoldenMetrics, GoldenStore, Outcome, SnapshotFile, SnapshotMeta};
use crate::pipeline::{self, RunPlan};
use memgaze_analysis::AnalysisOptions;
use memgaze_error::Exit;
use memgaze_metadata::messages::{self, Reason};
use memgaze_trace::Sampling;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Arguments of `cargo memgaze golden`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
Records a full trace of every selected bench (deterministic: no sampling,
address-space randomisation off) and stores its metrics — summary,
trace-window histogram, per-function code windows — as an insta snapshot
golden/<package>__<target>__<bench>.snap, with the compiler and build facts
in its metadata. `cargo memgaze validate` compares sampled runs against them.

Without --update, a snapshot that differs (or is missing) is written beside
it as .snap.new for `cargo insta review`, and the command exits with 3; on
CI (CI set) nothing is written. Snapshots of benches that no longer exist
are reported (and deleted with --update).

Examples:
  cargo memgaze golden -p microbenches            check every microbenchmark
  cargo memgaze golden -p microbenches --update   re-record them
  cargo memgaze golden -- chase                   only benches matching `chase`")]
pub struct Args {
    #[command(flatten)]
    pub cargo: CargoArgs,

    #[command(flatten)]
    pub libs: super::record::SnapshotLibsArgs,

    /// Write the snapshots (accept every difference).
    #[arg(long)]
    pub update: bool,

    #[command(flatten)]
    pub time: super::limits::LimitArgs,

    /// Snapshot directory (default: `golden/` in the workspace root).
    #[arg(long, value_name = "DIR")]
    pub golden_dir: Option<PathBuf>,

    /// Output: lines for people, or one JSON object per line with a
    /// `reason` field.
    #[arg(long, value_enum, value_name = "FMT", default_value_t = MessageFormat::Human)]
    pub message_format: MessageFormat,

    /// Recording backend (full traces use the software recorder).
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,

    /// Arguments for the bench harness (a name filter, `--exact`, `--skip`).
    #[arg(last = true, value_name = "HARNESS-ARGS")]
    pub harness_args: Vec<String>,
}

/// Where snapshots go: `--golden-dir`, else `golden/` in the workspace root.
pub fn golden_dir(option: &Option<PathBuf>, suite: &BenchSuite) -> PathBuf {
    option
        .clone()
        .unwrap_or_else(|| suite.workspace.root.join("golden"))
}

/// Refuses a snapshot directory that cannot take the snapshots, before any
/// bench is recorded: a symbolic link (snapshots are written into a real
/// directory of the repository, never through a link to elsewhere), not a
/// directory, or not writable. A missing directory is made later.
pub fn check_golden_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let problem = match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(format!("cannot be read: {e}")),
        Ok(meta) if meta.file_type().is_symlink() => {
            Some("is a symbolic link; snapshots are written only into a real directory".to_string())
        }
        Ok(meta) if !meta.is_dir() => Some("is not a directory".to_string()),
        Ok(_) => {
            let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
            // SAFETY: a NUL-terminated path.
            let writable = unsafe { libc::access(path.as_ptr(), libc::W_OK) } == 0;
            (!writable).then(|| "is not writable".to_string())
        }
    };
    match problem {
        Some(problem) => Err(anyhow::anyhow!(
            "golden snapshot directory {} {problem}",
            dir.display()
        )),
        None => Ok(()),
    }
}

/// Checks that stored snapshots of the selected benches were recorded under
/// the current build facts; the one message that says otherwise.
pub fn facts_mismatch(
    store: &GoldenStore,
    suite: &BenchSuite,
    facts: &BuildFacts,
) -> anyhow::Result<Option<String>> {
    let mut differences: Vec<String> = Vec::new();
    let mut affected = 0usize;
    for (target, case) in suite.selected() {
        let exe = &target.executable;
        if let Some(file) = store.read(&exe.package, &exe.target, &case.name)? {
            let d = file.meta.facts.differences(facts);
            if !d.is_empty() {
                affected += 1;
                for line in d {
                    if !differences.contains(&line) {
                        differences.push(line);
                    }
                }
            }
        }
    }
    Ok((affected > 0).then(|| {
        format!(
            "{} in {} {} recorded under other build facts ({}; snapshot vs this run): \
             the metrics of compiled code depend on them, so they cannot be compared; \
             re-record them with `cargo memgaze golden --update`",
            plural(affected, "snapshot", "snapshots"),
            store.dir().display(),
            if affected == 1 { "was" } else { "were" },
            differences.join(", ")
        )
    }))
}

/// The bench's source file relative to the workspace root.
fn source(target: &BenchTarget, root: &Path) -> String {
    let src = &target.executable.src_path;
    src.strip_prefix(root).unwrap_or(src).display().to_string()
}

/// Runs the command.
pub fn run(args: Args, global: &Global) -> anyhow::Result<Exit> {
    let harness = HarnessArgs::parse(&args.harness_args)?;
    suite::choose_backend(args.backend)?;
    let json = args.message_format == MessageFormat::Json;
    // A `--golden-dir` that cannot take snapshots fails before the build;
    // the default directory is known once the workspace is.
    if let Some(dir) = &args.golden_dir {
        check_golden_dir(dir)?;
    }
    let facts = BuildFacts::current(&args.cargo)?;
    let suite = suite::discover(&args.cargo, &harness, global)?;
    let suite = suite::without_criterion_targets(suite, &args.cargo, "golden")?;
    let store = GoldenStore::new(golden_dir(&args.golden_dir, &suite));
    if args.golden_dir.is_none() {
        check_golden_dir(store.dir())?;
    }
    let ci = is_ci();
    if !args.update
        && let Some(message) = facts_mismatch(&store, &suite, &facts)?
    {
        if json {
            emit(&messages::GoldenFactsDiffer {
                message: message.clone(),
                reason: Reason::GoldenFactsDiffer,
            });
        }
        styled_eprintln!("error: {message}");
        return Ok(Exit::Regression);
    }
    let selected: Vec<(&BenchTarget, &BenchCase)> = suite.selected().collect();
    let layout = suite.workspace.results_layout();
    // Caught from here on: a signal while waiting for the lock, while the
    // targets are instrumented, between two benches or while one is
    // analysed stops the run instead of killing it halfway through writing
    // results.
    let watch = memgaze_record::signals::Watch::start();
    // One command at a time writes this results tree (cargo/lock.rs).
    let _lock = layout.lock(global.quiet, &watch)?;
    let started = Instant::now();
    let progress = Progress::new(selected.len() as u64, global.quiet);
    let instrumented =
        suite::instrument_targets(&suite, &progress, &args.libs.to_libs_args(), global)?;
    let mut exit = Exit::Ok;
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    let mut pending_written = false;
    for (target, case) in &selected {
        if let Some(code) = watch.stopped("before the next bench") {
            exit = exit.worst(Exit::Interrupted(code));
            break;
        }
        let exe = &target.executable;
        let instrumented = instrumented.with_libraries(exe);
        progress.start("Tracing", &format!("{} {}", exe.display_name(), case.name));
        let plan = RunPlan {
            sampling: Sampling::full(),
            spatial: None,
            analysis: AnalysisOptions::default(),
            trace_file: None,
            per_sample: false,
            env: vec![pipeline::one_iteration()],
            limits: args.time.limits(),
        };
        let recording = pipeline::record_bench(target, case, instrumented, &plan)?;
        let tally = (&mut exit, &mut counts);
        match suite::after_recording(&recording, (exe, &case.name), json, &progress, tally) {
            suite::AfterRecording::Use => {}
            suite::AfterRecording::Next => continue,
            // A signal ends the whole run.
            suite::AfterRecording::Stop => break,
        }
        if let Some(why) = incomplete_trace(&recording.totals, &recording.notes) {
            // No snapshot can be written or checked from it; the other
            // benches still are, and the run ends with an error.
            let snapshot = store.path(&exe.package, &exe.target, &case.name);
            let bench = (exe, case.name.as_str(), snapshot.as_path());
            report_incomplete(bench, &recording, &why, json, &progress);
            *counts.entry("incomplete").or_default() += 1;
            exit = exit.worst(Exit::Error);
            progress.advance();
            continue;
        }
        // The full-trace analysis beside the bench's results, for the
        // report's overlay.
        let dir = layout.create_bench_dir(&BenchKey::new(&exe.package, &exe.target, &case.name))?;
        pipeline::write_analysis(&dir.join(pipeline::GOLDEN_FILE), &recording.analysis)?;
        let metrics = GoldenMetrics::from_analysis(
            &exe.package,
            &exe.target,
            &case.name,
            &recording.analysis,
        );
        let file = SnapshotFile {
            meta: SnapshotMeta {
                source: source(target, &suite.workspace.root),
                expression: format!(
                    "full trace of bench `{}` ({})",
                    case.name,
                    exe.display_name()
                ),
                facts: facts.clone(),
            },
            metrics,
        };
        let outcome = store.check(&file, args.update, !ci)?;
        let snapshot = store.path(&exe.package, &exe.target, &case.name);
        let (status, pending, changes): (&str, Option<&PathBuf>, &[String]) = match &outcome {
            Outcome::Unchanged => ("unchanged", None, &[]),
            Outcome::Created => ("created", None, &[]),
            Outcome::Updated => ("updated", None, &[]),
            Outcome::Missing { pending } => ("missing", pending.as_ref(), &[]),
            Outcome::Differs { pending, changes } => ("differs", pending.as_ref(), changes),
        };
        *counts.entry(status).or_default() += 1;
        if outcome.is_difference() {
            exit = exit.worst(Exit::Regression);
            pending_written |= pending.is_some();
        }
        if json {
            emit(&messages::Golden {
                changes: changes.to_vec(),
                elapsed_s: recording.elapsed.as_secs_f64(),
                name: case.name.clone(),
                package: exe.package.clone(),
                pending: pending.cloned(),
                reason: Reason::Golden,
                records: recording.analysis.summary.records,
                snapshot: snapshot.clone(),
                status: status.to_string(),
                target: exe.target.clone(),
            });
        } else {
            let lines = outcome_lines(&outcome, &snapshot, exe, &case.name, changes, &recording);
            progress.print(|| {
                for line in &lines {
                    println!("{line}");
                }
            });
        }
        progress.advance();
    }
    progress.finish();
    exit = suite::exit_after_benches(&watch, exit, "after the last bench");

    // Orphans: snapshots of benches the targets no longer have.
    for target in &suite.targets {
        let exe = &target.executable;
        let all: Vec<String> = exe
            .list(&HarnessArgs::default())?
            .into_iter()
            .map(|c| c.name)
            .collect();
        for orphan in store.orphans(&exe.package, &exe.target, &all) {
            // `--update` is an explicit request: it writes snapshots on CI
            // too, so it also deletes the orphans there.
            let deleted = args.update;
            if deleted {
                std::fs::remove_file(&orphan)
                    .map_err(|e| anyhow::anyhow!("cannot remove {}: {e}", orphan.display()))?;
            }
            if json {
                emit(&messages::GoldenOrphan {
                    deleted,
                    reason: Reason::GoldenOrphan,
                    snapshot: orphan.clone(),
                });
            } else {
                styled_eprintln!(
                    "{}: {} belongs to no bench of `{}`{}",
                    if deleted { "note" } else { "warning" },
                    orphan.display(),
                    exe.display_name(),
                    if deleted {
                        "; deleted"
                    } else {
                        " (`--update` deletes it)"
                    }
                );
            }
        }
    }

    suite::print_summary(
        json,
        global,
        ("snapshot", "snapshots"),
        selected.len(),
        &counts,
        started,
    );
    if !json && !global.quiet {
        if pending_written {
            styled_eprintln!(
                "note: review the new snapshots with `cargo insta review --workspace` (or accept them all with `cargo memgaze golden --update`)"
            );
        } else if exit == Exit::Regression && ci {
            styled_eprintln!(
                "note: on CI nothing is written; run `cargo memgaze golden` locally to review the differences"
            );
        }
    }
    Ok(exit)
}

/// Why a bench's full trace cannot be snapshotted, if it cannot: it lacks
/// records (dropped, or a process that never said it ended). The
/// recorder's note on the drops says why; it already starts with their
/// count.
fn incomplete_trace(totals: &memgaze_trace::TraceTotals, notes: &[String]) -> Option<String> {
    if totals.complete && totals.dropped.records == 0 {
        return None;
    }
    Some(
        notes
            .iter()
            .find(|n| n.contains("records dropped"))
            .or(notes.first())
            .cloned()
            .unwrap_or_else(|| format!("{} records dropped", totals.dropped.records)),
    )
}

/// Reports a bench whose full trace is incomplete: one `error:` line and,
/// in JSON, a `golden` message of status `incomplete` whose `changes` say
/// why.
fn report_incomplete(
    (exe, bench, snapshot): (&crate::cargo::BenchExecutable, &str, &Path),
    recording: &pipeline::BenchRecording,
    why: &str,
    json: bool,
    progress: &Progress,
) {
    let message = format!(
        "the full trace of bench `{bench}` of `{}` is incomplete ({why}): a golden snapshot must hold every record, so none is written or checked",
        exe.display_name(),
    );
    if json {
        emit(&messages::Golden {
            changes: vec![message.clone()],
            elapsed_s: recording.elapsed.as_secs_f64(),
            name: bench.to_string(),
            package: exe.package.clone(),
            pending: None,
            reason: Reason::Golden,
            records: recording.analysis.summary.records,
            snapshot: snapshot.to_path_buf(),
            status: "incomplete".to_string(),
            target: exe.target.clone(),
        });
    }
    progress.error(&format!("error: {message}"));
}

/// The lines `golden` prints for one bench: its outcome, the metrics that
/// changed and, for a difference, the threads note.
fn outcome_lines(
    outcome: &Outcome,
    snapshot: &Path,
    exe: &crate::cargo::BenchExecutable,
    bench: &str,
    changes: &[String],
    recording: &pipeline::BenchRecording,
) -> Vec<String> {
    let what = match outcome {
        Outcome::Unchanged => "unchanged".to_string(),
        Outcome::Created => format!("created {}", snapshot.display()),
        Outcome::Updated => format!("updated {}", snapshot.display()),
        Outcome::Missing { pending: Some(p) } => {
            format!("no snapshot yet; new one in {}", p.display())
        }
        Outcome::Missing { pending: None } => {
            format!("no snapshot {} (CI: nothing written)", snapshot.display())
        }
        Outcome::Differs { pending, .. } => match pending {
            Some(p) => format!(
                "differs from {}; new one in {}",
                snapshot.display(),
                p.display()
            ),
            None => format!("differs from {} (CI: nothing written)", snapshot.display()),
        },
    };
    let mut lines = vec![format!(
        "{:>12} {} {}: {what} ({} records, {:.1}s)",
        if outcome.is_difference() {
            "Differs"
        } else {
            "Golden"
        },
        exe.display_name(),
        bench,
        recording.analysis.summary.records,
        recording.elapsed.as_secs_f64()
    )];
    lines.extend(changes.iter().map(|c| format!("{:>12}   {c}", "")));
    if matches!(outcome, Outcome::Differs { .. })
        && let Some(note) = threads_note(
            bench,
            recording.analysis.summary.samples,
            recording.analysis.coverage.trace_samples,
        )
    {
        lines.push(note);
    }
    lines
}

/// Why a multithreaded bench's snapshot differs, when it does: its
/// threads' loads interleave differently from run to run (thread start-up
/// alone runs a varying number of loads), so its full trace, unlike a
/// single-threaded bench's, is not reproducible. A full trace is one
/// sample (`trace_samples`), which the analysis splits into one piece per
/// thread (`pieces`, the summary's `samples`).
fn threads_note(bench: &str, pieces: u64, trace_samples: u64) -> Option<String> {
    (trace_samples == 1 && pieces > 1).then(|| {
        format!(
            "note: `{bench}` runs {pieces} threads, whose interleaving changes from run to run: its full trace is not reproducible, so its snapshot cannot match exactly (golden snapshots suit single-threaded benches)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::{check_golden_dir, incomplete_trace, threads_note};

    #[test]
    fn a_linked_or_unwritable_snapshot_directory_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let real = root.path().join("golden");
        std::fs::create_dir(&real).unwrap();
        check_golden_dir(&real).unwrap();
        check_golden_dir(&root.path().join("missing")).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let link = root.path().join("linked");
        std::os::unix::fs::symlink(elsewhere.path(), &link).unwrap();
        let e = check_golden_dir(&link).unwrap_err().to_string();
        assert!(e.contains("linked") && e.contains("symbolic link"), "{e}");
        let file = root.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(
            check_golden_dir(&file)
                .unwrap_err()
                .to_string()
                .contains("not a directory")
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o500)).unwrap();
        // root may write anywhere: only check where permissions bind.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                check_golden_dir(&real)
                    .unwrap_err()
                    .to_string()
                    .contains("not writable")
            );
        }
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    }

    #[test]
    fn an_incomplete_trace_is_explained_by_the_recorders_note_on_drops() {
        let mut totals = memgaze_trace::TraceTotals::clean(10, 10, 1);
        let notes = vec![
            "1 process exec'd another program".to_string(),
            "7 records dropped (loads of threads …)".to_string(),
        ];
        assert_eq!(incomplete_trace(&totals, &notes), None);
        totals.dropped.records = 7;
        assert_eq!(
            incomplete_trace(&totals, &notes).unwrap(),
            "7 records dropped (loads of threads …)"
        );
        assert_eq!(incomplete_trace(&totals, &[]).unwrap(), "7 records dropped");
        // Incomplete without drops (a process that never said it ended):
        // the recorder's first note says so.
        totals.dropped.records = 0;
        totals.complete = false;
        assert_eq!(
            incomplete_trace(&totals, &notes[..1]).unwrap(),
            "1 process exec'd another program"
        );
    }

    #[test]
    fn only_a_full_trace_of_several_threads_gets_the_threads_note() {
        assert_eq!(threads_note("seq", 1, 1), None);
        assert_eq!(threads_note("empty", 0, 1), None);
        let note = threads_note("par", 5, 1).unwrap();
        assert!(note.starts_with("note: `par` runs 5 threads"), "{note}");
        // Not a full trace (several samples): no claim about threads.
        assert_eq!(threads_note("sampled", 40, 20), None);
    }
}
