//! The Intel PT backend: capability probing, perf AUX collection, packet
//! decoding and address reconstruction.
//!
//! - `sysfs`: PMU descriptions (`type`, `format/*`, `caps/*`) below a
//!   configurable root.
//! - `config`: the `intel_pt` group leader and the load-sampling member,
//!   built from the format files.
//! - [`probe`]: the checks of `cargo memgaze doctor` and the `--backend`
//!   choice every recording command makes ([`probe::choose_backend`]).
//! - [`ring`], [`collect`]: draining the perf rings and running a program
//!   under collection.
//! - [`packet`], [`decode`], [`encode`]: the PT packet layer and the
//!   streaming `ptwrite` event decoder.
//! - [`reconstruct`]: PTW payloads + annotation → load addresses → the
//!   trace format every backend writes.
//!
//! [`record`] strings collection and reconstruction together: it is what
//! `cargo memgaze record --backend pt` runs.

pub mod collect;
pub(crate) mod config;
pub mod decode;
pub mod encode;
mod error;
pub mod packet;
pub mod probe;
pub mod reconstruct;
pub mod ring;
pub(crate) mod sysfs;

pub use error::{AnnotationProblem, PtError, RingProblem};

use error::{Context, Result};
use memgaze_metadata::annotation::Annotation;
use memgaze_trace::TraceTotals;
use std::ffi::OsString;
use std::io::Write;
use std::path::Path;

/// How `record --backend pt` collects.
#[derive(Clone, Debug)]
pub struct PtRecordOptions {
    /// Sampled (AUX sample every `period` loads) or full.
    pub mode: collect::CollectMode,
    /// Ring, AUX and sample sizes.
    pub buffers: probe::BufferPlan,
    /// `intel_pt` event options.
    pub pt: config::PtOptions,
}

impl Default for PtRecordOptions {
    fn default() -> PtRecordOptions {
        PtRecordOptions {
            mode: collect::CollectMode::Sampled {
                period: DEFAULT_LOAD_PERIOD,
            },
            buffers: probe::BufferPlan::default(),
            pt: config::PtOptions::default(),
        }
    }
}

/// Default loads between AUX samples. A 16 KiB sample holds roughly a
/// thousand PTW+FUP pairs, so the period must be far larger for samples not
/// to overlap; MemGaze used periods of this order.
pub const DEFAULT_LOAD_PERIOD: u64 = 1_000_003;

/// What a PT recording produced besides the trace.
#[derive(Clone, Debug)]
pub struct PtRecording {
    /// The trace's totals (exit status, ρ numerator, drops).
    pub totals: TraceTotals,
    /// What the reconstruction could not use, by cause.
    pub stats: reconstruct::ReconstructStats,
    /// What the kernel reported lost.
    pub losses: ring::Losses,
}

/// Runs the ptwrite-instrumented `program` with `args` under Intel PT
/// collection and writes its trace to `out`.
///
/// The program gets `MEMGAZE_RECORDING=1` in its environment (the harness
/// contract). Call [`probe::choose_backend`] first: this function
/// assumes the machine passed the PT checks.
pub fn record<W: Write>(
    out: W,
    program: &Path,
    args: &[OsString],
    annotation: &Annotation,
    options: &PtRecordOptions,
) -> Result<(W, PtRecording)> {
    // Refuse an unusable annotation before running anything.
    reconstruct::PtwriteMap::new(annotation)
        .with_context(|| format!("annotation of {}", program.display()))?;
    let collection = collect::collect(
        program,
        args,
        &[("MEMGAZE_RECORDING".into(), "1".into())],
        &collect::CollectOptions {
            mode: options.mode,
            pt: options.pt.clone(),
            buffers: options.buffers,
            root: sysfs::SystemRoot::live(),
        },
    )?;
    let kind = match options.mode {
        collect::CollectMode::Sampled { period } => {
            reconstruct::TraceKind::Sampled { period, seed: None }
        }
        collect::CollectMode::Full => reconstruct::TraceKind::Full,
    };
    let mut command = vec![program.display().to_string()];
    command.extend(args.iter().map(|a| a.to_string_lossy().into_owned()));
    let (out, totals, stats) =
        reconstruct::trace_from_collection(out, annotation, program, &collection, kind, command)?;
    Ok((
        out,
        PtRecording {
            totals,
            stats,
            losses: collection.losses,
        },
    ))
}
