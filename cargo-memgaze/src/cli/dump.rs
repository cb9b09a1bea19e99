//! `cargo memgaze dump <TRACE>`: a trace file as text.

use super::Global;
use anyhow::Context;
use memgaze_error::Exit;
use memgaze_trace::TraceReader;
use memgaze_trace::dump::{DumpError, DumpOptions, dump};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `cargo memgaze dump`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The trace file (as written by `cargo memgaze record`).
    pub trace: PathBuf,
    /// Print at most N records; the rest is still read and checked.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Print only the header, load sites and totals.
    #[arg(long)]
    pub header_only: bool,
}

/// Runs the command.
pub fn run(args: Args, _global: &Global) -> anyhow::Result<Exit> {
    let mut reader =
        TraceReader::open(&args.trace).with_context(|| args.trace.display().to_string())?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let options = DumpOptions {
        limit: args.limit,
        header_only: args.header_only,
    };
    let result = dump(&mut reader, &mut out, options).and_then(|()| Ok(out.flush()?));
    let result = result.map_err(anyhow::Error::from);
    match result {
        Ok(()) => Ok(Exit::Ok),
        // `dump … | head` is normal use, not an error.
        Err(e) if is_broken_pipe(&e) => Ok(Exit::Ok),
        Err(e) => Err(e.context(args.trace.display().to_string())),
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    let broken = |io: &std::io::Error| io.kind() == std::io::ErrorKind::BrokenPipe;
    // A write error arrives as the dump's own `Write` variant, which shows
    // the I/O error's text but is not itself an `io::Error`.
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(broken)
            || matches!(c.downcast_ref::<DumpError>(), Some(DumpError::Write(io)) if broken(io))
    })
}
