//! Building bench targets with `cargo build` and finding their executables
//! in cargo's JSON messages.

use super::args::CargoArgs;
use super::executable::BenchExecutable;
use super::workspace::Workspace;
use anyhow::{Context, bail};
use cargo_metadata::{Message, TargetKind};
use std::ffi::OsString;
use std::io::BufReader;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

/// How to run cargo.
#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    /// Pass `--quiet` to cargo (its errors still show).
    pub quiet: bool,
    /// Print the cargo command line before running it.
    pub verbose: bool,
    /// `--color` for cargo (`auto`, `always`, `never`); `None` lets cargo
    /// decide.
    pub color: Option<&'static str>,
}

/// The cargo to run: `$CARGO` (set when cargo runs a subcommand), else
/// `cargo` from `PATH`.
pub fn cargo_program() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// The `cargo build` command for `args` in `workspace`: bench targets, the
/// chosen profile with line tables and symbols for the workspace's members
/// ([`CargoArgs::profile_config`]),
/// JSON messages on stdout and cargo's rendered diagnostics on stderr.
pub fn build_command(args: &CargoArgs, workspace: &Workspace, options: &BuildOptions) -> Command {
    let mut command = Command::new(cargo_program());
    command
        .arg("build")
        .args(args.build_args(workspace.bench_glob_selects_all()))
        .arg("--message-format=json-render-diagnostics");
    if options.quiet {
        command.arg("--quiet");
    }
    if let Some(color) = options.color {
        command.args(["--color", color]);
    }
    let members: Vec<String> = workspace.members.iter().map(|m| m.name.clone()).collect();
    command.args(args.profile_config(&members));
    command
}

/// Builds the selected bench targets and returns their executables, sorted
/// by package and target. Cargo's progress and errors go straight to
/// stderr; a failed build is an error naming the packages, a build that
/// produced no bench executable is one too.
pub fn build_benches(
    args: &CargoArgs,
    workspace: &Workspace,
    options: &BuildOptions,
) -> anyhow::Result<Vec<BenchExecutable>> {
    let mut command = build_command(args, workspace, options);
    if options.verbose {
        eprintln!("     Running `{command:?}`");
    }
    // Caught while cargo runs, and passed on to its process group (cargo
    // and the compilers it started): a signal sent to `cargo memgaze` alone
    // (a CI timeout, `kill`, or a terminal's ^C, which reaches only our
    // group) stops the whole build instead of leaving it running.
    let watch = memgaze_record::signals::Watch::start();
    let mut child = command
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot run {}", cargo_program().to_string_lossy()))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let building = AtomicBool::new(true);
    let pid = child.id();
    let (read, status) = std::thread::scope(|scope| {
        scope.spawn(|| forward_signals(&watch, pid, &building));
        let read = read_artifacts(stdout, workspace);
        let status = child.wait().context("waiting for cargo");
        building.store(false, Ordering::SeqCst);
        (read, status)
    });
    if let Some(signal) = watch.signal() {
        return Err(memgaze_error::Interrupted {
            code: 128 + signal,
            what: format!(
                "interrupted by {} while cargo was building the benches (cargo was stopped)",
                memgaze_trace::Interruption::Signal(signal).name()
            ),
        }
        .into());
    }
    let (mut executables, status) = (read?, status?);
    let packages = package_list(workspace);
    if !status.success() {
        bail!(
            "could not build the benches of {packages}: `cargo build` failed ({status}); cargo's errors are above"
        );
    }
    if executables.is_empty() {
        bail!(
            "no bench target of {packages} was built (a bench with `required-features` \
             needs them enabled with `--features`)"
        );
    }
    executables.sort_by(|a, b| (&a.package, &a.target).cmp(&(&b.package, &b.target)));
    Ok(executables)
}

/// Sends each signal `watch` catches to cargo's process group (`pid`)
/// while `building`.
fn forward_signals(watch: &memgaze_record::signals::Watch, pid: u32, building: &AtomicBool) {
    let mut sent = 0usize;
    while building.load(Ordering::SeqCst) {
        let received: u64 = memgaze_record::signals::received().iter().sum();
        if let Some(signal) = watch.signal()
            && (received as usize) > sent
        {
            sent = received as usize;
            // SAFETY: a signal to the process group of our own child, which
            // is not reaped before this thread stops.
            unsafe { libc::kill(-(pid as libc::pid_t), signal) };
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The bench executables in cargo's JSON messages.
fn read_artifacts(
    stdout: std::process::ChildStdout,
    workspace: &Workspace,
) -> anyhow::Result<Vec<BenchExecutable>> {
    let mut executables: Vec<BenchExecutable> = Vec::new();
    for message in Message::parse_stream(BufReader::new(stdout)) {
        let message = message.context("reading cargo's JSON messages")?;
        let Message::CompilerArtifact(artifact) = message else {
            continue;
        };
        if !artifact.target.kind.contains(&TargetKind::Bench) {
            continue;
        }
        let Some(path) = artifact.executable else {
            continue;
        };
        let package = workspace
            .member_by_id(&artifact.package_id.repr)
            .map(|m| m.name.clone())
            .unwrap_or_else(|| artifact.target.name.clone());
        let manifest = PathBuf::from(artifact.manifest_path.as_std_path());
        let executable = BenchExecutable {
            package,
            target: artifact.target.name.clone(),
            path: path.into_std_path_buf(),
            src_path: artifact.target.src_path.into_std_path_buf(),
            package_root: manifest.parent().map(PathBuf::from).unwrap_or_default(),
            workspace_root: workspace.root.clone(),
            target_dir: workspace.target_dir.clone(),
            harness: Default::default(),
        };
        if !executables.iter().any(|e| e.path == executable.path) {
            executables.push(executable);
        }
    }
    Ok(executables)
}

fn package_list(workspace: &Workspace) -> String {
    let names: Vec<String> = workspace
        .selected_members()
        .iter()
        .map(|m| format!("`{}`", m.name))
        .collect();
    match names.len() {
        0 => "the workspace".to_string(),
        1 => format!("package {}", names[0]),
        _ => format!("packages {}", names.join(", ")),
    }
}
