//! The trace model: what a recorded (sampled) load-address trace says.
//!
//! These plain types are the contract between the collectors (software
//! recorder, Intel PT, Lackey import), the trace file format and the
//! analysis. Words and symbols follow `docs/METRICS.md`.

use crate::error::FilterError;
pub use memgaze_metadata::model::{Backend, BinaryIdentity, Dropped, LoadClass};
use serde::{Deserialize, Serialize};

/// One execution of an instrumented load, as the analysis sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    /// Address of the load instruction in the **original** binary.
    pub ip: u64,
    /// Effective data address (virtual, byte granularity).
    pub addr: u64,
    /// The load's class.
    pub class: LoadClass,
    /// Constant loads this record stands for besides itself (proxy compression).
    pub implied: u32,
    /// Index of the sample the record belongs to.
    pub sample: u64,
    /// Thread the record came from (small integers assigned by the collector).
    pub thread: u32,
    /// Taken by spatial sampling outside any time sample (docs/METRICS.md,
    /// "Whole-run locality"). Time-window metrics skip such records; whole-run
    /// locality uses them together with the time-sample records whose block
    /// [`SpatialSampling::tracks`]. Records inside a time sample are never
    /// marked, even when their block is tracked.
    pub spatial: bool,
}

/// The sampling parameters of a run: `w` records out of every `w + z`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Sampling {
    /// `w`: consecutive records per sample.
    pub window: u64,
    /// `w + z`: instrumented-load executions per period (software backend)
    /// or loads counted by the sampling event (Intel PT). Equal to `window`
    /// for a full trace (`z = 0`).
    pub period: u64,
    /// Seed of the period jitter, when the collector used one.
    pub seed: Option<u64>,
}

impl Sampling {
    /// Parameters of a full trace (one sample holding every record).
    pub fn full() -> Sampling {
        Sampling {
            window: u64::MAX,
            period: u64::MAX,
            seed: None,
        }
    }

    /// `z = 0`: every execution is recorded.
    pub fn is_full(&self) -> bool {
        self.window == self.period
    }

    /// `z`, the executions skipped per period.
    pub fn skipped(&self) -> u64 {
        self.period - self.window
    }
}

/// Spatial sampling (docs/METRICS.md, "Whole-run locality"): a block of
/// `2^block_shift` bytes is *tracked* iff `h(b) = b · multiplier mod 2^64`
/// is below `threshold`, and every execution of a Strided or Irregular load
/// on a tracked block is recorded for the whole run. A multiplicative hash
/// keeps the probe's test to a shift, a multiply and a compare.
///
/// [`SpatialSampling::with_rate`] chooses a multiplier and a threshold that
/// are multiples of `2^32` (`m · 2^32`, `t · 2^32`): then `h(b) < threshold`
/// iff `(b mod 2^32) · m mod 2^32 < t`, the 32-bit multiplicative hash that
/// the probes compute with two immediates (`imul r32, r32, m; cmp r32, t`)
/// and no load. Traces carry both words, so a trace of any multiplier and
/// threshold (odd 64-bit multipliers in older traces) is analysed with its
/// own hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SpatialSampling {
    /// log2 of the block size in bytes (6: 64-byte lines).
    pub block_shift: u32,
    /// The multiplier of the block hash.
    pub multiplier: u64,
    /// A block is tracked iff its hash is below this; the rate is
    /// `R = threshold / 2^64`.
    pub threshold: u64,
}

impl SpatialSampling {
    /// The default multiplier's 32-bit factor: `2^32 / φ`, odd (Knuth's
    /// multiplicative hashing).
    pub const DEFAULT_MULTIPLIER_32: u32 = 0x9E37_79B9;
    /// The default multiplier, `DEFAULT_MULTIPLIER_32 · 2^32`.
    pub(crate) const DEFAULT_MULTIPLIER: u64 = (Self::DEFAULT_MULTIPLIER_32 as u64) << 32;
    /// The default block: a 64-byte cache line.
    pub const DEFAULT_BLOCK_SHIFT: u32 = 6;

    /// Spatial sampling of 64-byte blocks at `rate` (`0 < rate ≤ 1`), or
    /// `None` for a rate of 0 (spatial sampling off) or one outside `[0, 1]`.
    /// The threshold is `⌊rate · 2^32⌋ · 2^32`: the rate in steps of
    /// `2^-32`, at least one step, and `2^32 − 1` steps for rate 1.
    pub fn with_rate(rate: f64) -> Option<SpatialSampling> {
        if !(rate > 0.0 && rate <= 1.0) {
            return None;
        }
        let steps = (rate * 4_294_967_296.0).clamp(1.0, 4_294_967_295.0) as u64;
        Some(SpatialSampling {
            block_shift: Self::DEFAULT_BLOCK_SHIFT,
            multiplier: Self::DEFAULT_MULTIPLIER,
            threshold: steps << 32,
        })
    }

    /// The 32-bit multiplier and threshold of the probes' hash (see the
    /// type's documentation), where both words are multiples of `2^32` and
    /// the blocks are 64 bytes; `None` otherwise.
    pub fn immediates(&self) -> Option<(u32, u32)> {
        let low = 0xFFFF_FFFF;
        (self.block_shift == Self::DEFAULT_BLOCK_SHIFT
            && self.multiplier & low == 0
            && self.threshold & low == 0)
            .then_some((
                (self.multiplier >> 32) as u32,
                (self.threshold >> 32) as u32,
            ))
    }

    /// `R`, the share of blocks tracked.
    pub fn rate(&self) -> f64 {
        self.threshold as f64 / 18_446_744_073_709_551_616.0
    }

    /// The block an address lies in.
    #[inline]
    pub fn block(&self, addr: u64) -> u64 {
        addr >> self.block_shift
    }

    /// Whether the block of `addr` is tracked.
    #[inline]
    pub fn tracks(&self, addr: u64) -> bool {
        self.block(addr).wrapping_mul(self.multiplier) < self.threshold
    }
}

/// A function of the original binary, as carried by a trace so that it can
/// be analysed without the binary at hand.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FunctionEntry {
    /// Demangled name (or `sub_<hex>` for unnamed code found via `.eh_frame`).
    pub name: String,
    /// First address (original binary, file addresses).
    pub start: u64,
    /// One past the last address.
    pub end: u64,
}

/// A load site that records in the trace may refer to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LoadEntry {
    /// Address of the load in the original binary.
    pub ip: u64,
    /// Its class.
    pub class: LoadClass,
    /// Constant loads each execution of it implies besides itself.
    pub implied: u32,
    /// Index into [`TraceHeader::functions`], when known.
    pub function: Option<u32>,
    /// `file:line` of the load when debug info exists.
    pub line: Option<String>,
    /// For a Constant load left uninstrumented by proxy compression: the
    /// index (into [`TraceHeader::loads`]) of the load whose records imply
    /// it. Such entries never appear in records; the analysis lists them
    /// with the proxy's count and `"implied": true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<u32>,
}

/// Everything known about a trace before its first record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Which collector wrote it.
    pub backend: Backend,
    /// `w`, `w + z` and the jitter seed.
    pub sampling: Sampling,
    /// The original (uninstrumented) binary.
    pub binary: Option<BinaryIdentity>,
    /// Command line of the traced program (program first).
    pub command: Vec<String>,
    /// Functions of the original binary (may be empty).
    pub functions: Vec<FunctionEntry>,
    /// Load sites; records refer to them by index.
    pub loads: Vec<LoadEntry>,
    /// Free-form facts a collector wants to keep (e.g. the bench name).
    pub labels: Vec<(String, String)>,
    /// Spatial sampling of the run, when it used one (absent in older
    /// traces and in full traces, which hold every record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spatial: Option<SpatialSampling>,
}

/// Label key ([`TraceHeader::labels`]) naming a shared library the traced
/// executable links (`DT_NEEDED`), one label per library: only the
/// executable is instrumented, so the loads of these libraries, and of any
/// they load, are not in the trace.
pub const SHARED_LIBRARY_LABEL: &str = "shared_library";

/// Label key ([`TraceHeader::labels`]) of an instrumented shared library
/// whose functions and loads follow the executable's in the header, one
/// label per library in header order: `<first function index> <first load
/// index> <name>` (`12 40 libc.so.6`). Its `ip`s and function addresses
/// are offsets in that library's file.
pub const OBJECT_LABEL: &str = "object";

/// Label key ([`TraceHeader::labels`]) of a header whose instrumented
/// libraries ([`OBJECT_LABEL`]) count their escapes and untraced loads in
/// the totals' `escapes`, as the executable does (value
/// [`LIBRARY_ESCAPES_COUNTED`]). Traces recorded before libraries counted
/// them lack it: their dynamic coverage leaves the libraries' out.
pub const LIBRARY_ESCAPES_LABEL: &str = "library_escapes";

/// The value of [`LIBRARY_ESCAPES_LABEL`].
pub const LIBRARY_ESCAPES_COUNTED: &str = "counted";

impl TraceHeader {
    /// The object (file name) whose code function `function` is: an
    /// instrumented library's name ([`OBJECT_LABEL`]) or, below the first
    /// one, the executable's file name (`None` when the header names no
    /// binary).
    pub fn object_of_function(&self, function: u32) -> Option<String> {
        let mut object = self
            .binary
            .as_ref()
            .and_then(|b| std::path::Path::new(&b.path).file_name())
            .map(|n| n.to_string_lossy().into_owned());
        for (key, value) in &self.labels {
            if key != OBJECT_LABEL {
                continue;
            }
            let mut parts = value.splitn(3, ' ');
            let first = parts.next().and_then(|f| f.parse::<u32>().ok());
            let name = parts.nth(1);
            if let (Some(first), Some(name)) = (first, name)
                && function >= first
            {
                object = Some(name.to_string());
            }
        }
        object
    }

    /// The libraries named by [`SHARED_LIBRARY_LABEL`] labels, in order.
    pub fn shared_libraries(&self) -> impl Iterator<Item = &str> {
        self.labels
            .iter()
            .filter(|(key, _)| key == SHARED_LIBRARY_LABEL)
            .map(|(_, value)| value.as_str())
    }

    /// Fails when `glob` (a `--functions` filter) matches none of
    /// [`TraceHeader::functions`]: the analysis would keep no record, and an
    /// empty result would hide a mistyped name.
    pub fn require_function_match(&self, glob: &str) -> Result<(), FilterError> {
        let matcher = function_matcher(glob)?;
        if self.functions.iter().any(|f| matcher.is_match(&f.name)) {
            return Ok(());
        }
        let binary = self
            .binary
            .as_ref()
            .map_or("the binary", |b| b.path.as_str());
        Err(FilterError::NoMatch {
            glob: glob.to_string(),
            functions: self.functions.len(),
            binary: binary.to_string(),
        })
    }
}

/// The matcher of a `--functions` glob over [`FunctionEntry::name`]s.
pub fn function_matcher(glob: &str) -> Result<globset::GlobMatcher, FilterError> {
    Ok(globset::Glob::new(glob)
        .map_err(|source| FilterError::InvalidPattern {
            glob: glob.to_string(),
            source,
        })?
        .compile_matcher())
}

/// How the traced program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProgramExit {
    /// Exited normally with this status.
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
}

/// What is known only when the trace ends.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TraceTotals {
    /// Numerator of ρ: instrumented-load executions counted exactly by the
    /// software recorder, or executed loads counted by the PT sampling event.
    /// Equals the record count for a full trace.
    pub executions: u64,
    /// Records written (all samples), spatial records not included.
    pub records: u64,
    /// Spatial records written ([`Record::spatial`]): outside every
    /// sample, so `records` (and ρ) stay what the time samples say. Absent
    /// (0) in older traces.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spatial_records: u64,
    /// Samples written.
    pub samples: u64,
    /// Known losses.
    pub dropped: Dropped,
    /// How the program ended, when a program was run.
    pub exit: Option<ProgramExit>,
    /// False when the trace is a prefix (program killed before a clean
    /// flush, recording interrupted) or records are known to be missing
    /// (`dropped.records > 0`; traces of older recorders may say true
    /// there).
    pub complete: bool,
    /// Why the recording was cut short by `cargo memgaze` itself (a signal
    /// it forwarded, `--timeout`); absent in traces that ran to their end
    /// and in traces written before this field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<Interruption>,
    /// Escapes into original code the software recorder counted, one entry
    /// per escape site that ran (docs/METRICS.md, "Dynamic coverage");
    /// absent when none ran, and in older traces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escapes: Vec<EscapeCount>,
    /// Processes of the traced executable whose escape counters never
    /// reached the recorder (killed by a signal, or ended by a path no exit
    /// hook sees) while the executable has escape checks: what they counted
    /// is unknown, and so is the dynamic coverage. Absent (0) when every
    /// process sent its counts, and in older traces.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub escape_counts_missing: u64,
    /// Processes that `exec`ed a program that did not join the trace (not
    /// instrumented, or not following execs): what it ran is untraced.
    /// Absent (0) when none did, and in older traces.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub execs_untraced: u64,
    /// Wall time those programs ran, in microseconds: from each `Exec`
    /// message's arrival to the program's exit (or the end of the
    /// recording, for one still running).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub execs_untraced_micros: u64,
}

/// The executions of one escape site (an indirect jump of an instrumented
/// copy that landed in original code) and what each is estimated to leave
/// untraced.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EscapeCount {
    /// Original address of the jump.
    pub at: u64,
    /// The function the escapes land in.
    pub function: String,
    /// Executions of the jump that landed in original code.
    pub count: u64,
    /// Estimated untraced loads per escape, instrumented or implied (units
    /// of `Â`).
    pub loads: u32,
    /// Of `loads`, those with a probe (units of `executions`).
    pub probed: u32,
    /// Not a jump: an explicit load no probe can trace, `count` its
    /// executions (`loads` 1). Absent (false) for escapes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub untraced_load: bool,
}

impl EscapeCount {
    /// Estimated untraced load executions, in the units of `Â`.
    pub fn untraced_loads(&self) -> f64 {
        self.count as f64 * f64::from(self.loads)
    }
}

/// How a recording was cut short: the trace is a prefix of the run, and the
/// command exits with [`Interruption::exit_code`] (docs/CLI.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Interruption {
    /// `cargo memgaze` received this signal (SIGINT, SIGTERM, SIGHUP) and
    /// forwarded it to the program.
    Signal(i32),
    /// `--timeout` expired: the program was sent SIGTERM.
    Timeout,
}

impl Interruption {
    /// `SIGINT`, `SIGTERM`, `SIGHUP`, `signal N`, or `timeout`: what
    /// `summary.interrupted` says.
    pub fn name(&self) -> String {
        match *self {
            Interruption::Timeout => "timeout".into(),
            Interruption::Signal(1) => "SIGHUP".into(),
            Interruption::Signal(2) => "SIGINT".into(),
            Interruption::Signal(3) => "SIGQUIT".into(),
            Interruption::Signal(15) => "SIGTERM".into(),
            Interruption::Signal(n) => format!("signal {n}"),
        }
    }

    /// The exit code a shell expects: 128 + N for signal N, 124 for a
    /// timeout (as `timeout(1)`).
    pub fn exit_code(&self) -> i32 {
        match *self {
            Interruption::Timeout => 124,
            Interruption::Signal(n) => 128 + n,
        }
    }
}

impl TraceTotals {
    /// Totals of a trace that ended cleanly with nothing lost and no
    /// program exit to report (imports, in-memory analyses, tests).
    pub fn clean(executions: u64, records: u64, samples: u64) -> TraceTotals {
        TraceTotals {
            executions,
            records,
            spatial_records: 0,
            samples,
            dropped: Dropped::default(),
            exit: None,
            complete: true,
            interrupted: None,
            escapes: Vec::new(),
            escape_counts_missing: 0,
            execs_untraced: 0,
            execs_untraced_micros: 0,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::SpatialSampling;

    /// The default hash is the 32-bit multiplicative hash of the block the
    /// probes compute with immediates, at every rate's threshold.
    #[test]
    fn default_words_are_the_32_bit_hash_of_the_probes() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for rate in [1.0, 0.5, 0.3, 0.01, 1.0 / 128.0, 1e-7] {
            let s = SpatialSampling::with_rate(rate).unwrap();
            let (m, t) = s.immediates().unwrap();
            assert_eq!(m, SpatialSampling::DEFAULT_MULTIPLIER_32);
            assert!((s.rate() - rate).abs() <= 2f64.powi(-32), "rate {rate}");
            for _ in 0..10_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let addr = x >> 16;
                let b = (addr >> 6) as u32;
                assert_eq!(s.tracks(addr), b.wrapping_mul(m) < t);
            }
        }
        assert_eq!(
            SpatialSampling::with_rate(1.0 / 128.0).unwrap().threshold,
            1 << 57
        );
        let odd = SpatialSampling {
            multiplier: 0x9E37_79B9_7F4A_7C15,
            ..SpatialSampling::with_rate(0.5).unwrap()
        };
        assert_eq!(odd.immediates(), None);
    }
}
