//! The annotation: what the binary analysis knows about every load.
//!
//! Written by `classify`/`instrument` beside the instrumented executable and
//! read by the rewriter, the collectors (to map recorded load ids back to
//! original IPs) and the Intel PT address reconstruction (scale and
//! displacement literals). The format is versioned JSON (`schema`).

use crate::trace::{BinaryIdentity, LoadClass};
use serde::{Deserialize, Serialize};

/// Schema tag of the current annotation format.
pub const ANNOTATION_SCHEMA: &str = "memgaze.annotation.v1";

/// How a load's instrumentation records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstrumentationMode {
    /// Software recorder stub (countdown fast path, sampled buffer).
    Soft,
    /// Intel PT `ptwrite` of each source register before the load.
    Ptwrite,
}

/// Per-load facts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadSite {
    /// Stable index of this load in [`Annotation::loads`]; the software
    /// recorder writes it into each record.
    pub id: u32,
    /// Address of the load instruction in the original binary.
    pub ip: u64,
    /// Length of the instruction in bytes.
    pub len: u8,
    /// Its class.
    pub class: LoadClass,
    /// Whether the load carries instrumentation (a probe).
    pub instrumented: bool,
    /// Constant loads a probe stands for besides itself (proxy compression).
    pub implied: u32,
    /// For an uninstrumented Constant load: the IP of the probe whose
    /// execution implies it.
    pub proxy: Option<u64>,
    /// Base register (iced-x86 name, lower case, e.g. `rdi`), if any.
    pub base: Option<String>,
    /// Index register, if any.
    pub index: Option<String>,
    /// Scale applied to the index (1, 2, 4 or 8).
    pub scale: u8,
    /// Displacement literal (for RIP-relative operands: the absolute target).
    pub displacement: i64,
    /// Bytes read.
    pub size: u32,
    /// Index into [`Annotation::functions`].
    pub function: u32,
    /// `file:line` when DWARF line tables exist.
    pub line: Option<String>,
    /// Why the load could not be instrumented, when it could not.
    pub skipped: Option<String>,
}

/// Per-function facts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionSite {
    /// Demangled name, or `sub_<hex start>` when unnamed.
    pub name: String,
    /// Mangled/raw symbol name when it differs from `name`.
    pub raw_name: Option<String>,
    /// First address.
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
    /// Whether the function was relocated and instrumented.
    pub instrumented: bool,
    /// Why not, when it was selected but could not be instrumented.
    pub skipped: Option<String>,
}

/// The annotation of one binary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Annotation {
    /// Always [`ANNOTATION_SCHEMA`].
    pub schema: String,
    /// The original binary.
    pub binary: BinaryIdentity,
    /// How the loads are instrumented; `None` for a `classify`-only result.
    pub mode: Option<InstrumentationMode>,
    /// Functions analysed.
    pub functions: Vec<FunctionSite>,
    /// Every explicit load found in them.
    pub loads: Vec<LoadSite>,
    /// `ptwrite` mode: every `ptwrite` the rewriter emitted. The PT decoder
    /// gets the address of each PTWRITE from the FUP that follows its
    /// packet and looks it up here to find the load and operand. Empty in
    /// soft mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ptwrites: Vec<PtwriteSite>,
}

/// Which operand register a `ptwrite` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PtwriteOperand {
    /// The load's base register ([`LoadSite::base`]).
    Base,
    /// The load's index register ([`LoadSite::index`]).
    Index,
}

/// One `ptwrite` instruction emitted before a load (ptwrite mode).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PtwriteSite {
    /// Address of the `ptwrite` in the **instrumented** binary (link-time
    /// virtual address, as the FUP reports it minus the load bias).
    pub ip: u64,
    /// [`LoadSite::id`] of the load whose operand it writes.
    pub load: u32,
    /// Which register of the operand it writes (the full 64-bit register).
    pub operand: PtwriteOperand,
}
