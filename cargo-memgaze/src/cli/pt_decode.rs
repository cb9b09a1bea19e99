//! `cargo memgaze pt-decode`: the PTW events of a raw Intel PT stream.
//!
//! Prints every PTWRITE operand (payload, the IP of the PTWRITE from its
//! FUP, the last TSC), then the packet counts, decode errors, resyncs and
//! overflows. Input that holds no PT synchronisation point at all is an
//! error (exit 1); damaged streams are decoded and their damage reported.

use super::{Format, Global};
use anyhow::{Context, bail};
use memgaze_error::Exit;
use memgaze_record::pt::decode::{Decoder, Event};
use memgaze_record::pt::packet::PacketKind;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `cargo memgaze pt-decode`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A raw Intel PT byte stream (e.g. `perf record -e intel_pt//` AUX data
    /// extracted with `perf script -D`, or one AUX sample).
    #[arg(value_name = "RAW_PT_FILE")]
    pub file: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Print at most this many PTW events (the counts cover all of them).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

#[derive(Serialize)]
struct PtwJson {
    offset: usize,
    payload: String,
    size: u8,
    ip: Option<String>,
    tsc: Option<u64>,
}

#[derive(Serialize)]
struct ErrorJson {
    offset: usize,
    error: String,
}

#[derive(Serialize)]
struct ReportJson {
    schema: &'static str,
    file: String,
    bytes: usize,
    ptw: Vec<PtwJson>,
    ptw_total: u64,
    ptw_without_ip: u64,
    packets: std::collections::BTreeMap<&'static str, u64>,
    syncs: Vec<usize>,
    overflows: Vec<usize>,
    errors: Vec<ErrorJson>,
    resyncs: u64,
    skipped_bytes: u64,
    ptw_without_fup: u64,
}

/// Runs the command.
pub fn run(args: Args, _global: &Global) -> anyhow::Result<Exit> {
    let data = std::fs::read(&args.file).with_context(|| format!("{}", args.file.display()))?;
    if data.is_empty() {
        bail!("{}: the file is empty", args.file.display());
    }
    let limit = args.limit.unwrap_or(usize::MAX);
    let mut decoder = Decoder::new(&data);
    let mut report = ReportJson {
        schema: "memgaze.pt-decode.v1",
        file: args.file.display().to_string(),
        bytes: data.len(),
        ptw: Vec::new(),
        ptw_total: 0,
        ptw_without_ip: 0,
        packets: Default::default(),
        syncs: Vec::new(),
        overflows: Vec::new(),
        errors: Vec::new(),
        resyncs: 0,
        skipped_bytes: 0,
        ptw_without_fup: 0,
    };
    decoder.for_each_event(|event| match event {
        Event::Ptw(p) => {
            report.ptw_total += 1;
            report.ptw_without_ip += u64::from(p.ip.is_none());
            if report.ptw.len() < limit {
                report.ptw.push(PtwJson {
                    offset: p.offset,
                    payload: format!("{:#x}", p.payload),
                    size: p.size,
                    ip: p.ip.map(|ip| format!("{ip:#x}")),
                    tsc: p.tsc,
                });
            }
        }
        Event::Sync { offset } => report.syncs.push(offset),
        Event::Overflow { offset } => report.overflows.push(offset),
        Event::Error(e) => report.errors.push(ErrorJson {
            offset: e.offset,
            error: e.kind.to_string(),
        }),
    });
    let stats = decoder.stats();
    if report.syncs.is_empty() {
        bail!(
            "{}: no PSB packet in {} bytes: not an Intel PT stream, or one without a synchronisation point",
            args.file.display(),
            data.len()
        );
    }
    for kind in PacketKind::ALL {
        if stats.count(kind) > 0 {
            report.packets.insert(kind.name(), stats.count(kind));
        }
    }
    report.resyncs = stats.resyncs;
    report.skipped_bytes = stats.skipped_bytes;
    report.ptw_without_fup = stats.ptw_without_fup;

    let mut out = String::new();
    match args.format {
        Format::Json => {
            out = serde_json::to_string_pretty(&report)?;
            out.push('\n');
        }
        Format::Table => table(&report, &mut out),
    }
    write_stdout(&out)?;
    Ok(Exit::Ok)
}

fn table(r: &ReportJson, out: &mut String) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "{:>10}  {:>18}  {:>4}  {:>18}  {:>16}",
        "offset", "payload", "size", "ip", "tsc"
    );
    for p in &r.ptw {
        let _ = writeln!(
            out,
            "{:>10}  {:>18}  {:>4}  {:>18}  {:>16}",
            p.offset,
            p.payload,
            p.size,
            p.ip.as_deref().unwrap_or("-"),
            p.tsc.map_or("-".to_string(), |t| format!("{t:#x}"))
        );
    }
    if (r.ptw.len() as u64) < r.ptw_total {
        let _ = writeln!(
            out,
            "… {} more PTW events (--limit)",
            r.ptw_total - r.ptw.len() as u64
        );
    }
    let _ = writeln!(
        out,
        "\n{}: {} bytes, {} PTW events ({} without IP), {} sync points, {} overflows, {} errors, {} resyncs, {} bytes skipped, {} PTW without their FUP",
        r.file,
        r.bytes,
        r.ptw_total,
        r.ptw_without_ip,
        r.syncs.len(),
        r.overflows.len(),
        r.errors.len(),
        r.resyncs,
        r.skipped_bytes,
        r.ptw_without_fup
    );
    let counts: Vec<String> = r.packets.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = writeln!(out, "packets: {}", counts.join(", "));
    for e in r.errors.iter().take(20) {
        let _ = writeln!(out, "error at offset {}: {}", e.offset, e.error);
    }
    if r.errors.len() > 20 {
        let _ = writeln!(
            out,
            "… {} more errors (--format json lists all)",
            r.errors.len() - 20
        );
    }
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
pub(crate) fn write_stdout(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}
