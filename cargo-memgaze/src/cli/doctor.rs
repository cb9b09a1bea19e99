//! `cargo memgaze doctor`: which recording backends this machine supports,
//! and why not.
//!
//! Without `--backend` it prints every check of both backends and what
//! `--backend auto` picks. With `--backend X` it answers only "would a
//! recording command use X here?": the choice and its reason, or the one
//! error line (exit 1) that `record --backend X` would print.

use super::pt_decode::write_stdout;
use super::{Format, Global};
use memgaze_error::Exit;
use memgaze_record::pt::probe::{self, BackendReport, BackendRequest, ProbeOptions, ProbeReport};
use serde::Serialize;

/// Arguments of `cargo memgaze doctor`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Resolve this backend request as `record`/`run`/`bench` would, and
    /// print only the outcome (exit 1 when the backend is unusable).
    #[arg(long, value_enum)]
    pub backend: Option<BackendRequest>,
}

/// Runs the command.
pub fn run(args: Args, _global: &Global) -> anyhow::Result<Exit> {
    let self_test: probe::SoftSelfTest<'_> = &|| Ok(super::backend::soft_self_test()?);
    let report = probe::probe(&ProbeOptions::live(Some(self_test)));
    if let Some(request) = args.backend {
        let choice = probe::choose_backend(request, &report)?;
        let text = match args.format {
            Format::Json => serde_json::to_string(&choice)?,
            Format::Table => format!("{}: {}", choice.backend, choice.reason),
        };
        write_stdout(&format!("{text}\n"))?;
        return Ok(Exit::Ok);
    }
    let auto = probe::choose_backend(BackendRequest::Auto, &report).map_err(anyhow::Error::new);
    let text = match args.format {
        Format::Json => serde_json::to_string_pretty(&json(&report, &auto))? + "\n",
        Format::Table => table(&report, &auto),
    };
    write_stdout(&text)?;
    Ok(Exit::Ok)
}

#[derive(Serialize)]
struct DoctorJson<'a> {
    schema: &'static str,
    backends: [BackendJson<'a>; 2],
    auto: AutoJson,
}

#[derive(Serialize)]
struct BackendJson<'a> {
    backend: memgaze_trace::Backend,
    usable: bool,
    checks: &'a [probe::Check],
}

#[derive(Serialize)]
struct AutoJson {
    backend: Option<memgaze_trace::Backend>,
    reason: String,
}

fn json<'a>(
    report: &'a ProbeReport,
    auto: &anyhow::Result<probe::BackendChoice>,
) -> DoctorJson<'a> {
    let backend = |r: &'a BackendReport| BackendJson {
        backend: r.backend,
        usable: r.usable(),
        checks: &r.checks,
    };
    DoctorJson {
        schema: "memgaze.doctor.v1",
        backends: [backend(&report.pt), backend(&report.soft)],
        auto: match auto {
            Ok(choice) => AutoJson {
                backend: Some(choice.backend),
                reason: choice.reason.clone(),
            },
            Err(e) => AutoJson {
                backend: None,
                reason: memgaze_error::one_line(e),
            },
        },
    }
}

fn table(report: &ProbeReport, auto: &anyhow::Result<probe::BackendChoice>) -> String {
    let mut out = String::new();
    let width = report
        .pt
        .checks
        .iter()
        .chain(&report.soft.checks)
        .map(|c| c.name.len())
        .max()
        .unwrap_or(0);
    for (title, r) in [
        ("Intel PT backend (--backend pt)", &report.pt),
        ("Software recorder (--backend soft)", &report.soft),
    ] {
        out.push_str(&format!(
            "{title}: {}\n",
            if r.usable() { "usable" } else { "unusable" }
        ));
        for c in &r.checks {
            out.push_str(&format!(
                "  {:<7} {:<width$}  {}\n",
                c.status.label(),
                c.name,
                c.detail
            ));
        }
        out.push('\n');
    }
    match auto {
        Ok(choice) => out.push_str(&format!(
            "--backend auto picks {}: {}\n",
            choice.backend, choice.reason
        )),
        Err(e) => out.push_str(&format!(
            "--backend auto fails: {}\n",
            memgaze_error::one_line(e)
        )),
    }
    out
}
