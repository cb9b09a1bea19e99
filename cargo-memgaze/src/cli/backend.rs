//! The `--backend` choice of the recording commands and the software
//! recorder's self-test that `doctor` runs.
//!
//! Every recording command (`record`, `run`, `bench`, `golden`, `validate`)
//! probes the machine the way `doctor` does and resolves its `--backend`
//! request with [`probe::choose_backend`]: `auto` takes Intel PT only when
//! every PT check passes and says which backend it chose; an explicit
//! backend that cannot run here is one error line (exit 1).
//!
//! Recording commands skip the self-test (the recording itself is the
//! test, and it would cost a rewrite per command); `doctor` runs it.

use anyhow::{Context, Result, bail};
use memgaze_metadata::annotation::InstrumentationMode;
use memgaze_record as record;
use memgaze_record::pt::probe::{self, BackendChoice, BackendRequest, ProbeOptions};
use memgaze_trace::{Backend, Sampling};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Probes this machine (without the self-test) and resolves `request`.
pub fn resolve(request: BackendRequest) -> Result<BackendChoice> {
    Ok(probe::choose_backend(
        request,
        &probe::probe(&ProbeOptions::live(None)),
    )?)
}

/// What a backend choice means for a command that can only record with the
/// software recorder (bench suites): the software recorder, with a note when
/// `auto` would have taken Intel PT, or an error for an explicit `pt`.
pub fn software_only(request: BackendRequest, what: &str) -> Result<BackendChoice> {
    let choice = resolve(request)?;
    match (choice.backend, request) {
        (Backend::Soft | Backend::Lackey, _) => Ok(choice),
        (Backend::Pt, BackendRequest::Pt) => bail!(
            "--backend pt: {what} records with the software recorder only (Intel PT recording of bench suites is not implemented); use --backend soft"
        ),
        (Backend::Pt, _) => Ok(BackendChoice {
            backend: Backend::Soft,
            reason: format!(
                "auto: software recorder; Intel PT is usable here, but {what} records with the software recorder only"
            ),
        }),
    }
}

/// The program the self-test instruments: `true` from the usual places.
fn self_test_program() -> Option<PathBuf> {
    ["/usr/bin/true", "/bin/true"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The software backend's self-test: instruments `true` (all functions),
/// records `true --version` as a full trace, and checks that the program
/// behaved exactly as the original (same stdout, same exit status) and that
/// every recorded execution was delivered.
pub fn soft_self_test() -> Result<String> {
    let Some(program) = self_test_program() else {
        bail!("no /usr/bin/true or /bin/true to test-instrument");
    };
    let dir = memgaze_output::private_tempdir().context("cannot create a temporary directory")?;
    let output = dir.path().join("true");
    let instrumented =
        super::instrument::instrument_file(&program, &output, None, InstrumentationMode::Soft)
            .with_context(|| format!("instrumenting {}", program.display()))?;
    let native = Command::new(&program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", program.display()))?;

    let mut command = Command::new(&output);
    command
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    let stdout_file = dir.path().join("stdout");
    command.stdout(
        std::fs::File::create(&stdout_file)
            .with_context(|| format!("{}: cannot create", stdout_file.display()))?,
    );
    let mut counter = record::CountingSink::default();
    let recording = record::record_command(
        command,
        &instrumented.annotation,
        &Sampling::full(),
        &mut counter,
    )?;
    let stdout = std::fs::read(&stdout_file)
        .with_context(|| format!("{}: cannot read", stdout_file.display()))?;
    let native_code = native.status.code().unwrap_or(-1);
    if recording.exit_code() != native_code {
        bail!(
            "instrumented {} exited with {} instead of {native_code}",
            program.display(),
            recording.exit_code()
        );
    }
    if stdout != native.stdout {
        bail!(
            "instrumented {} printed different output than the original",
            program.display()
        );
    }
    if recording.totals.executions == 0 {
        bail!(
            "instrumented {} recorded no load executions",
            program.display()
        );
    }
    if counter.records != recording.totals.executions || recording.totals.dropped.records > 0 {
        bail!(
            "full trace of {} lost records: {} of {} executions delivered",
            program.display(),
            counter.records,
            recording.totals.executions
        );
    }
    Ok(format!(
        "instrumented {} ({} functions, {} loads) and recorded `true --version` in full: {} records, same output and exit status",
        display(&program),
        instrumented.report.functions_instrumented,
        instrumented.report.loads_instrumented,
        counter.records
    ))
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
