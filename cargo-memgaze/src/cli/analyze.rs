//! `cargo memgaze analyze`: the locality metrics of a trace, or of a
//! Valgrind Lackey log (a full trace) of a binary.

use super::style::styled_eprintln;
use super::{ColorChoice, Format, Global};
use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use memgaze_analysis::table::{TableOptions, render};
use memgaze_analysis::{Analysis, AnalysisOptions, Analyzer, MAX_CODE_WINDOW_K};
use memgaze_error::{Exit, usage};
use memgaze_record::lackey::{LackeyOptions, LackeyStats, LogDoubt, analyze_lackey};
use memgaze_trace::TraceReader;
use std::fs::File;
use std::io::{BufReader, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Arguments of `cargo memgaze analyze`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  cargo memgaze analyze target/memgaze/bench.trace
  cargo memgaze analyze run.trace --format json > metrics.json
  valgrind --tool=lackey --trace-mem=yes --log-file=lackey.log ./prog
  cargo memgaze analyze --lackey lackey.log --binary ./prog --functions 'kernel_*'")]
pub struct Args {
    /// The trace file (from `cargo memgaze record`).
    #[arg(value_name = "TRACE", required_unless_present = "lackey")]
    pub trace: Option<PathBuf>,
    /// Analyse a `valgrind --tool=lackey --trace-mem=yes` log instead (a
    /// full trace); needs --binary.
    #[arg(long, value_name = "LOG", conflicts_with = "trace")]
    pub lackey: Option<PathBuf>,
    /// The executable the Lackey log was recorded from.
    #[arg(long, value_name = "ELF")]
    pub binary: Option<PathBuf>,
    /// Address the executable was mapped at in the Lackey run (default:
    /// 0x108000, where Valgrind maps a PIE; 0 for a fixed-address binary).
    #[arg(long, value_name = "ADDR", value_parser = parse_address)]
    pub load_base: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Only records of functions whose name matches this glob (e.g.
    /// 'my_crate::*'); records outside any function are left out too.
    #[arg(long, value_name = "GLOB")]
    pub functions: Option<String>,
    /// Access block for reuse distance D, in bytes (a power of two).
    #[arg(long, value_name = "BYTES", default_value_t = 64, value_parser = parse_power_of_two)]
    pub block: u64,
    /// Code-window size W_c in accesses (a power of two); default
    /// min(w, 1024) rounded down to a power of two (1024 for a full trace).
    #[arg(long, value_name = "ACCESSES", value_parser = parse_power_of_two)]
    pub code_window: Option<u64>,
    /// Hot-region threshold: a sub-region is hot with at least this share
    /// of its parent region's accesses, in percent.
    #[arg(long, value_name = "PERCENT", default_value_t = 10.0, value_parser = parse_percent)]
    pub hot_threshold: f64,
    /// Smallest page of the hot-region zoom, in bytes (a power of two ≥ 64).
    #[arg(long, value_name = "BYTES", default_value_t = 4096, value_parser = parse_page)]
    pub min_page: u64,
    #[command(flatten)]
    pub caches: super::caches::CacheSizesArgs,
    /// Full traces only: build the whole-run miss-ratio curve as a run
    /// spatially sampled at this rate would (e.g. 1/128), to see the
    /// estimate's error against the exact curve.
    #[arg(long, value_name = "R", value_parser = parse_rate)]
    pub emulate_spatial_rate: Option<f64>,
    /// Rows shown in the functions, loads and regions tables.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,
    /// Write the output to FILE instead of standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs the command.
pub fn run(args: Args, global: &Global) -> Result<Exit> {
    if args.lackey.is_some() && args.binary.is_none() {
        return Err(usage(
            "--lackey needs --binary <ELF>: the executable the log was recorded from",
        ));
    }
    if args.lackey.is_none() && (args.binary.is_some() || args.load_base.is_some()) {
        return Err(usage(
            "--binary and --load-base only apply with --lackey <LOG>",
        ));
    }
    // A pattern that does not parse is bad usage, as in `classify` and
    // `instrument`, whatever the input turns out to hold.
    if let Some(glob) = &args.functions
        && let Err(memgaze_trace::FilterError::InvalidPattern { source, .. }) =
            memgaze_trace::function_matcher(glob)
    {
        return Err(usage(format!("--functions {glob:?}: {source}")));
    }
    let code_window_k = args.code_window.map(|w| w.trailing_zeros());
    if let Some(k) = code_window_k
        && k > MAX_CODE_WINDOW_K
    {
        return Err(usage(format!(
            "--code-window may be at most {} accesses",
            1u64 << MAX_CODE_WINDOW_K
        )));
    }
    let options = AnalysisOptions {
        block: args.block,
        code_window_k,
        region_threshold_percent: args.hot_threshold,
        region_min_page: args.min_page,
        functions: args.functions.clone(),
        cache_sizes: args.caches.cache_sizes.clone(),
        emulate_spatial: args
            .emulate_spatial_rate
            .and_then(memgaze_trace::SpatialSampling::with_rate),
        ..AnalysisOptions::default()
    };
    let progress = Progress::new(global);

    let analysis = match (&args.trace, &args.lackey) {
        (_, Some(log)) => {
            let binary = args.binary.as_ref().expect("checked above");
            let total = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
            progress.start(total, "reading Lackey log");
            let lackey = LackeyOptions {
                load_base: args.load_base,
                analysis: options,
            };
            let (analysis, stats) =
                analyze_lackey(log, binary, &lackey, |bytes| progress.set(bytes))?;
            progress.finish();
            if !global.quiet {
                warn_on_mismatch(log, binary, &stats);
            }
            analysis
        }
        (Some(trace), None) => analyze_file(trace, &options, &progress)?,
        (None, None) => return Err(usage("give a TRACE file, or --lackey <LOG> --binary <ELF>")),
    };
    progress.finish();

    let text = match args.format {
        Format::Json => {
            let mut json = serde_json::to_string_pretty(&analysis).context("cannot encode JSON")?;
            json.push('\n');
            json
        }
        Format::Table => {
            let color = match global.color {
                ColorChoice::Always => true,
                ColorChoice::Never => false,
                ColorChoice::Auto => args.output.is_none() && std::io::stdout().is_terminal(),
            };
            render(
                &analysis,
                &TableOptions {
                    color,
                    top: args.top,
                },
            )
        }
    };
    write_output(args.output.as_deref(), &text)?;
    Ok(Exit::Ok)
}

/// Warns on stderr when the Lackey log does not look like a run of the
/// binary: an empty or odd analysis would otherwise be the only sign.
fn warn_on_mismatch(log: &Path, binary: &Path, stats: &LackeyStats) {
    match stats.doubt() {
        Some(LogDoubt::NoLoadInBinary) => styled_eprintln!(
            "warning: {}: none of its {} loads lies in the code of {}: was the log recorded from this executable? (a PIE is taken to be mapped at 0x108000, as Valgrind does; --load-base sets another address)",
            log.display(),
            stats.loads,
            binary.display()
        ),
        Some(LogDoubt::SomeLengthsDiffer) => styled_eprintln!(
            "warning: {}: at {} of {} load instructions the log's instruction length differs from {}: the log may come from another build",
            log.display(),
            stats.mismatched_sites,
            stats.load_sites,
            binary.display()
        ),
        None => {}
    }
}

fn analyze_file(path: &Path, options: &AnalysisOptions, progress: &Progress) -> Result<Analysis> {
    let name = || path.display().to_string();
    let total = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    // The reader holds the file while records stream through the visitor,
    // so the bytes read for the progress bar are counted beside it.
    let bytes = Arc::new(AtomicU64::new(0));
    let counted = CountingRead {
        inner: file,
        bytes: Arc::clone(&bytes),
    };
    let mut reader =
        TraceReader::new(BufReader::with_capacity(1 << 16, counted)).with_context(name)?;
    if let Some(glob) = &options.functions {
        reader
            .header()
            .require_function_match(glob)
            .with_context(name)?;
    }
    let mut analyzer = Analyzer::new(reader.header(), options).with_context(name)?;
    progress.start(total, "analysing");
    let mut n = 0u64;
    memgaze_analysis::feed(&mut reader, &mut analyzer, || {
        n += 1;
        if n.is_multiple_of(1 << 20) {
            progress.set(bytes.load(Ordering::Relaxed));
        }
    })
    .with_context(name)?;
    let totals = reader
        .totals()
        .expect("totals after the last record")
        .clone();
    Ok(analyzer.finish(&totals))
}

/// A reader that counts the bytes it hands out (it may read on the
/// analysis' decoding thread).
struct CountingRead<R> {
    inner: R,
    bytes: Arc<AtomicU64>,
}

impl<R: Read> Read for CountingRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

fn write_output(path: Option<&Path>, text: &str) -> Result<()> {
    match path {
        Some(path) => Ok(memgaze_output::write_atomic(path, text)?),
        None => {
            let mut out = std::io::stdout().lock();
            match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                Ok(()) => Ok(()),
                // `analyze … | head` is normal use.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                Err(e) => Err(e).context("cannot write to standard output"),
            }
        }
    }
}

/// A progress bar on stderr for long inputs, when stderr is a terminal.
struct Progress(Option<ProgressBar>);

impl Progress {
    fn new(global: &Global) -> Self {
        let show = !global.quiet && std::io::stderr().is_terminal();
        Progress(show.then(ProgressBar::hidden))
    }

    fn start(&self, total: u64, message: &'static str) {
        if let Some(bar) = &self.0 {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            bar.set_length(total);
            bar.set_style(
                ProgressStyle::with_template("{msg} {bar:40} {bytes}/{total_bytes} ({eta})")
                    .expect("valid template"),
            );
            bar.set_message(message);
        }
    }

    fn set(&self, bytes: u64) {
        if let Some(bar) = &self.0 {
            bar.set_position(bytes);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

fn parse_address(text: &str) -> Result<u64, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| format!("{text:?} is not an address (e.g. 0x108000)"))
}

fn parse_percent(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        _ => Err(format!("{text:?} is not a percentage between 0 and 100")),
    }
}

/// A spatial sampling rate in `(0, 1]`: a decimal or `1/N`.
pub(crate) fn parse_rate(text: &str) -> Result<f64, String> {
    let value = match text.split_once('/') {
        Some((a, b)) => match (a.trim().parse::<f64>(), b.trim().parse::<f64>()) {
            (Ok(a), Ok(b)) if b != 0.0 => Some(a / b),
            _ => None,
        },
        None => text.trim().parse::<f64>().ok(),
    };
    match value {
        Some(r) if r > 0.0 && r <= 1.0 => Ok(r),
        _ => Err(format!(
            "{text:?} is not a rate in (0, 1] such as 1/128 or 0.0078125"
        )),
    }
}

fn parse_page(text: &str) -> Result<u64, String> {
    match parse_power_of_two(text) {
        Ok(n) if n >= 64 => Ok(n),
        _ => Err(format!("{text:?} is not a power of two of at least 64")),
    }
}

fn parse_power_of_two(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if n.is_power_of_two() => Ok(n),
        _ => Err(format!("{text:?} is not a power of two (e.g. 1024)")),
    }
}
