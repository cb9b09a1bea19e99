//! Cargo integration: building bench targets, finding their executables,
//! listing and running their benches, and where results go.
//!
//! What the commands that work on a workspace's benches (`bench`, `golden`,
//! `validate`) call:
//!
//! 1. flatten [`CargoArgs`] into their clap `Args`, and parse the harness
//!    arguments after `--` with [`HarnessArgs::parse`];
//! 2. [`discover`] builds the benches (bench profile, line tables, symbols;
//!    the user's `Cargo.toml` untouched), checks each executable carries the
//!    harness's region markers, and lists the benches the harness arguments
//!    select → a [`BenchSuite`];
//! 3. for each `(target, case)` of [`BenchSuite::selected`], run
//!    [`BenchExecutable::run_command`] through the instrumented copy of
//!    `target.executable.path` (with [`RECORDING_ENV`] set by the recorder),
//!    or [`BenchExecutable::run_native`] for a plain run;
//! 4. store results in [`ResultsLayout::create_bench_dir`] of
//!    [`Workspace::results_layout`].
//!
//! Errors are single lines naming the input: an unknown package, no bench
//! targets, a `--bench` name that matches no bench target (checked against
//! `cargo metadata` before cargo runs), a failed build (cargo's own errors are on stderr above it), a
//! bench not built with memgaze-harness (when named, or when it is the only
//! kind; otherwise it is skipped with a warning).

mod args;
mod build;
mod executable;
mod frameworks;
mod harness_args;
mod layout;
mod lock;
mod settings;
mod workspace;

pub use args::{CargoArgs, DEFAULT_PROFILE};
pub use build::{BuildOptions, build_benches, build_command, cargo_program};
pub use executable::{
    BenchCase, BenchExecutable, BenchOutcome, BenchRun, RECORDING_ENV, REGION_BEGIN_SYMBOL,
    REGION_END_SYMBOL, RegionMarkers, find_region_markers, interpret_run,
};
pub use frameworks::{BenchHarness, CRITERION_PROFILE_SECS};
pub use harness_args::HarnessArgs;
pub use layout::{
    BENCH_FILE, BENCH_SCHEMA, BenchKey, MAX_COMPONENT, ResultsLayout, decode_component,
    encode_component,
};
pub use lock::{LOCK_FILE, ResultsLock};
pub use settings::{KNOWN_KEYS, check_settings};
pub use workspace::{Member, Workspace};

/// A built bench target, its region markers and its listed benches.
#[derive(Clone, Debug)]
pub struct BenchTarget {
    /// The executable.
    pub executable: BenchExecutable,
    /// Where its region markers are.
    pub markers: RegionMarkers,
    /// The benches the harness arguments select, in the harness's order
    /// (ignored ones included, marked).
    pub cases: Vec<BenchCase>,
}

/// Everything [`discover`] found.
#[derive(Clone, Debug)]
pub struct BenchSuite {
    /// The workspace (target dir, results layout).
    pub workspace: Workspace,
    /// The bench targets, sorted by package and target name.
    pub targets: Vec<BenchTarget>,
    /// Whether ignored benches run (`--ignored`/`--include-ignored`).
    pub run_ignored: bool,
    /// Bench targets left out because they do not use memgaze-harness
    /// (e.g. criterion benches next to memgaze ones), with the reason; the
    /// command prints these as warnings.
    pub skipped: Vec<(BenchExecutable, String)>,
}

impl BenchSuite {
    /// The benches to run, in order: every listed case except ignored ones
    /// (unless the harness arguments ask for them).
    pub fn selected(&self) -> impl Iterator<Item = (&BenchTarget, &BenchCase)> {
        self.targets.iter().flat_map(move |target| {
            target
                .cases
                .iter()
                .filter(move |case| !case.ignored || self.run_ignored)
                .map(move |case| (target, case))
        })
    }

    /// The listed benches that will not run because they are ignored.
    pub fn ignored(&self) -> impl Iterator<Item = (&BenchTarget, &BenchCase)> {
        self.targets.iter().flat_map(move |target| {
            target
                .cases
                .iter()
                .filter(move |case| case.ignored && !self.run_ignored)
                .map(move |case| (target, case))
        })
    }
}

/// Leaves out, before the build, the bench targets cargo metadata and the
/// manifests already tell cannot run (libtest `#[bench]`, a package without
/// a supported harness): a `--bench` naming one is a usage error (exit 2);
/// otherwise the build names the others, and each left out is returned
/// with its reason (warned about, like targets found unsupported after the
/// build). With nothing runnable left, the first reason is the error.
fn exclude_unsupported(
    args: &CargoArgs,
    workspace: &Workspace,
) -> anyhow::Result<(CargoArgs, Vec<(BenchExecutable, String)>)> {
    let selected = workspace.selected_members();
    let unsupported: Vec<(&Member, &(String, String))> = selected
        .iter()
        .flat_map(|m| m.unsupported_benches.iter().map(move |u| (*m, u)))
        .collect();
    let runnable = |name: &str| {
        selected.iter().any(|m| {
            m.bench_targets.iter().any(|t| t == name)
                && !m.unsupported_benches.iter().any(|(u, _)| u == name)
        })
    };
    for name in &args.bench_targets {
        if let Some((_, (_, reason))) = unsupported.iter().find(|(_, (t, _))| t == name)
            && !runnable(name)
        {
            return Err(memgaze_error::usage(reason.clone()));
        }
    }
    let default_selection = args.bench_targets.is_empty() && !args.all_bench_targets;
    if unsupported.is_empty() || !default_selection || !workspace.bench_glob_selects_all() {
        return Ok((args.clone(), Vec::new()));
    }
    let mut names: Vec<String> = selected
        .iter()
        .flat_map(|m| m.bench_targets.iter())
        .filter(|t| runnable(t))
        .cloned()
        .collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        anyhow::bail!(unsupported[0].1.1.clone());
    }
    let skipped = unsupported
        .iter()
        .map(|(member, (target, reason))| {
            let executable = BenchExecutable {
                package: member.name.clone(),
                target: target.clone(),
                path: Default::default(),
                src_path: Default::default(),
                package_root: member
                    .manifest_path
                    .parent()
                    .map(Into::into)
                    .unwrap_or_default(),
                workspace_root: workspace.root.clone(),
                target_dir: workspace.target_dir.clone(),
                harness: BenchHarness::default(),
            };
            (executable, reason.clone())
        })
        .collect();
    let mut build_args = args.clone();
    build_args.bench_targets = names;
    Ok((build_args, skipped))
}

/// Recognises a criterion or divan bench by its symbols: sets its
/// `harness` and returns placeholder markers (the rewriter finds the
/// frameworks' hooks itself). `None` for neither. A note on what the
/// region holds goes to stderr unless `quiet`.
fn frameworks_of(
    executable: &mut BenchExecutable,
    quiet: bool,
) -> anyhow::Result<Option<RegionMarkers>> {
    let found = frameworks::detect(&executable.path)?;
    if let Some((harness, note)) = found {
        executable.harness = harness;
        if let (Some(note), false) = (note, quiet) {
            eprintln!("note: bench `{}`: {note}", executable.display_name());
        }
    }
    Ok(found.map(|_| RegionMarkers { begin: 0, end: 1 }))
}

/// Loads the workspace, builds its bench targets, checks they use
/// memgaze-harness, and lists their benches (see the module documentation).
///
/// A bench target without the harness is an error when the user named it
/// (`--bench`) or when no target uses the harness; otherwise it is left out
/// and reported in [`BenchSuite::skipped`], so a workspace that also has
/// criterion benches still works.
pub fn discover(
    args: &CargoArgs,
    harness: &HarnessArgs,
    options: &BuildOptions,
) -> anyhow::Result<BenchSuite> {
    discover_checked(args, harness, options, |_| Ok(()))
}

/// [`discover`], with `before_build` checking the loaded workspace (e.g.
/// that a baseline exists in its results directory) before anything is
/// compiled.
pub fn discover_checked(
    args: &CargoArgs,
    harness: &HarnessArgs,
    options: &BuildOptions,
    before_build: impl FnOnce(&Workspace) -> anyhow::Result<()>,
) -> anyhow::Result<BenchSuite> {
    let workspace = Workspace::load(args)?;
    workspace.ensure_bench_targets()?;
    workspace.ensure_bench_names(&args.bench_targets)?;
    before_build(&workspace)?;
    let (build_args, mut skipped) = exclude_unsupported(args, &workspace)?;
    let executables = build_benches(&build_args, &workspace, options)?;
    let mut checked = Vec::with_capacity(executables.len());
    for mut executable in executables {
        match executable.region_markers() {
            Ok(markers) => checked.push((executable, markers)),
            Err(e) => match frameworks_of(&mut executable, options.quiet)? {
                Some(markers) => checked.push((executable, markers)),
                // A target the user named must be a memgaze bench.
                None => {
                    let e = match find_region_markers(&executable.path)? {
                        // Markers at one address: the harness's own error.
                        Some(_) => e,
                        None => frameworks::unsupported(&executable),
                    };
                    // A target the user named must be a supported bench:
                    // naming one that is not is a usage error (exit 2).
                    if !args.bench_targets.is_empty() {
                        return Err(memgaze_error::usage(memgaze_error::one_line(&e)));
                    }
                    skipped.push((executable, memgaze_error::one_line(&e)));
                }
            },
        }
    }
    if checked.is_empty() {
        let (_, reason) = skipped.swap_remove(0);
        anyhow::bail!(reason);
    }
    let mut targets = Vec::with_capacity(checked.len());
    for (executable, markers) in checked {
        let cases = executable.list(harness)?;
        targets.push(BenchTarget {
            executable,
            markers,
            cases,
        });
    }
    Ok(BenchSuite {
        workspace,
        targets,
        run_ignored: harness.runs_ignored(),
        skipped,
    })
}
