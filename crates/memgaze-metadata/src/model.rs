//! The small trace-model types that the documents share: a load's class,
//! the collector, the binary's identity and what a collector lost.
//!
//! They are defined here, below every other memgaze crate, so that the
//! analysis and annotation documents need nothing else; `memgaze-trace`
//! re-exports them as part of its model.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A load's expected access pattern (MemGaze paper §III-B).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LoadClass {
    /// Address follows a loop induction variable with a constant or
    /// loop-invariant step: prefetchable.
    Strided,
    /// Anything else, notably addresses derived from loaded values.
    Irregular,
    /// A scalar on the stack/frame or a RIP-relative scalar without index:
    /// contributes to `A_const` but never to footprint.
    Constant,
}

impl LoadClass {
    /// All classes, in the order used by tables and file formats.
    pub const ALL: [LoadClass; 3] = [
        LoadClass::Strided,
        LoadClass::Irregular,
        LoadClass::Constant,
    ];

    /// The spelling used in JSON and tables (`Strided`, `Irregular`, `Constant`).
    pub fn as_str(self) -> &'static str {
        match self {
            LoadClass::Strided => "Strided",
            LoadClass::Irregular => "Irregular",
            LoadClass::Constant => "Constant",
        }
    }

    /// Whether records of this class count as observed accesses `A` (and so
    /// take part in footprint and reuse distance).
    pub fn is_access(self) -> bool {
        !matches!(self, LoadClass::Constant)
    }

    /// Stable one-byte code used by binary formats.
    pub fn code(self) -> u8 {
        match self {
            LoadClass::Strided => 0,
            LoadClass::Irregular => 1,
            LoadClass::Constant => 2,
        }
    }
}

impl fmt::Display for LoadClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which collector produced a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// The software sampled recorder injected by the rewriter.
    Soft,
    /// Intel Processor Trace `ptwrite` collection.
    Pt,
    /// A Valgrind Lackey `--trace-mem=yes` log, imported as a full trace.
    Lackey,
}

impl Backend {
    /// The spelling used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Soft => "soft",
            Backend::Pt => "pt",
            Backend::Lackey => "lackey",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identifies the binary a trace (or annotation) belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BinaryIdentity {
    /// Path as given by the user (informational).
    pub path: String,
    /// File size in bytes.
    pub size: u64,
    /// Hex SHA-256 of the file contents.
    pub sha256: String,
    /// GNU build-id note, hex, when the binary has one.
    pub build_id: Option<String>,
}

/// Data a collector knows it lost: never silently dropped, always reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dropped {
    /// Records lost (buffer overrun, PT overflow, unreadable tail…).
    pub records: u64,
    /// Whole samples lost.
    pub samples: u64,
    /// Raw bytes discarded (e.g. PT data with `PERF_RECORD_AUX` truncation).
    pub bytes: u64,
}
