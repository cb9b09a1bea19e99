//! A trace file as text: header, load sites, records and totals
//! (`cargo memgaze dump`). Streams: memory does not grow with the trace.

use super::error::TraceError;
use super::format::{TraceEvent, TraceReader};
use super::model::{ProgramExit, TraceTotals};
use std::io::{Read, Write};

/// Why a dump stopped: the trace is bad, or the output cannot be written
/// (a closed pipe under `dump … | head` included, which callers check for).
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// Reading the trace failed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// Writing the text failed.
    #[error(transparent)]
    Write(#[from] std::io::Error),
}

type Result<T> = std::result::Result<T, DumpError>;

/// What to print.
#[derive(Clone, Copy, Debug, Default)]
pub struct DumpOptions {
    /// Print at most this many records (the rest is still read and checked,
    /// and counted in a closing line).
    pub limit: Option<u64>,
    /// Print only the header, load sites and totals.
    pub header_only: bool,
}

/// Writes the text form of the trace read by `reader` to `out`.
pub fn dump<R: Read>(
    reader: &mut TraceReader<R>,
    out: &mut dyn Write,
    options: DumpOptions,
) -> Result<()> {
    let header = reader.header().clone();
    writeln!(out, "# memgaze trace (format version {})", reader.version())?;
    writeln!(out, "backend     {}", header.backend)?;
    let s = header.sampling;
    if s.is_full() {
        writeln!(out, "sampling    full trace (z = 0)")?;
    } else {
        write!(
            out,
            "sampling    w = {} records per period of {} (z = {})",
            s.window,
            s.period,
            s.skipped()
        )?;
        match s.seed {
            Some(seed) => writeln!(out, ", seed {seed}")?,
            None => writeln!(out)?,
        }
    }
    if let Some(spatial) = header.spatial {
        writeln!(
            out,
            "spatial     rate {} ({}-byte blocks, multiplier {:#x}, threshold {:#x})",
            spatial.rate(),
            1u64 << spatial.block_shift,
            spatial.multiplier,
            spatial.threshold
        )?;
    }
    if let Some(b) = &header.binary {
        write!(
            out,
            "binary      {} ({} bytes, sha256 {}",
            b.path, b.size, b.sha256
        )?;
        match &b.build_id {
            Some(id) => writeln!(out, ", build-id {id})")?,
            None => writeln!(out, ")")?,
        }
    }
    if !header.command.is_empty() {
        writeln!(out, "command     {}", header.command.join(" "))?;
    }
    for (key, value) in &header.labels {
        writeln!(out, "label       {key} = {value}")?;
    }
    writeln!(out, "functions   {}", header.functions.len())?;
    for (i, f) in header.functions.iter().enumerate() {
        writeln!(out, "  f{i:<5} {:#x}..{:#x}  {}", f.start, f.end, f.name)?;
    }
    writeln!(out, "loads       {}", header.loads.len())?;
    for (i, l) in header.loads.iter().enumerate() {
        write!(out, "  l{i:<5} {:#x}  {:<9}", l.ip, l.class.as_str())?;
        if l.implied > 0 {
            write!(out, "  implies {}", l.implied)?;
        }
        if let Some(p) = l.proxy {
            write!(out, "  implied by l{p}")?;
        }
        if let Some(f) = l.function {
            write!(out, "  {}", header.functions[f as usize].name)?;
        }
        if let Some(line) = &l.line {
            write!(out, "  {line}")?;
        }
        writeln!(out)?;
    }

    let limit = if options.header_only {
        0
    } else {
        options.limit.unwrap_or(u64::MAX)
    };
    let mut shown = 0u64;
    if limit > 0 {
        writeln!(
            out,
            "records     (sample thread ip addr class implied; sample S: spatial)"
        )?;
    }
    while let Some(event) = reader.next_event()? {
        if shown >= limit {
            continue;
        }
        match event {
            TraceEvent::Sample { sample, thread } => {
                writeln!(out, "# sample {sample} thread {thread}")?
            }
            TraceEvent::Thread { thread } => writeln!(out, "# thread {thread}")?,
            TraceEvent::Spatial { thread } => writeln!(out, "# spatial thread {thread}")?,
            TraceEvent::Record(r) => {
                let load = &header.loads[r.load as usize];
                let sample = if r.spatial {
                    "S".to_string()
                } else {
                    r.sample.to_string()
                };
                writeln!(
                    out,
                    "{} {} {:#x} {:#x} {} {}",
                    sample,
                    r.thread,
                    load.ip,
                    r.addr,
                    load.class.as_str(),
                    load.implied
                )?;
                shown += 1;
            }
        }
    }
    let read = reader.records_read();
    if !options.header_only && read > shown {
        writeln!(out, "# … {} more records not shown", read - shown)?;
    }
    if let Some(totals) = reader.totals() {
        write_totals(out, totals)?;
    }
    Ok(())
}

fn write_totals(out: &mut dyn Write, t: &TraceTotals) -> Result<()> {
    writeln!(
        out,
        "totals      {} records in {} samples",
        t.records, t.samples
    )?;
    if t.spatial_records > 0 {
        writeln!(out, "spatial     {} records", t.spatial_records)?;
    }
    writeln!(out, "executions  {}", t.executions)?;
    let d = t.dropped;
    writeln!(
        out,
        "dropped     {} records, {} samples, {} bytes",
        d.records, d.samples, d.bytes
    )?;
    match t.exit {
        Some(ProgramExit::Code(c)) => writeln!(out, "exit        code {c}")?,
        Some(ProgramExit::Signal(s)) => writeln!(out, "exit        signal {s}")?,
        None => writeln!(out, "exit        (no program run)")?,
    }
    writeln!(
        out,
        "complete    {}",
        if t.complete {
            "yes"
        } else if d.records > 0 {
            "no (records are missing, or the trace is a prefix)"
        } else {
            "no (the trace is a prefix)"
        }
    )?;
    if let Some(interruption) = t.interrupted {
        writeln!(
            out,
            "interrupted {} (the recording was cut short)",
            interruption.name()
        )?;
    }
    Ok(())
}
