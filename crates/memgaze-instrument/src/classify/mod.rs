//! Load classification (Constant / Strided / Irregular) and basic-block
//! proxy compression (MemGaze paper §III-B, Fig. 2).
//!
//! For each explicit load ([`operands`]) of a function:
//!
//! * **Constant** — a scalar without index relative to the stack (`rsp`, or
//!   `rbp` when it is the frame pointer), RIP-relative, or at an absolute
//!   address. `fs:`/`gs:` (TLS) loads follow the same rule and are flagged.
//! * **Strided** — inside a loop, the address is an affine function of a
//!   loop induction variable with all other parts loop-invariant
//!   ([`values`]): tested in the innermost loop first, then in the enclosing
//!   ones while the address stays invariant.
//! * **Strided** too — the reads of string instructions (`rep movs`,
//!   `cmps`, `scas`, `lods`): consecutive elements at the element size, up
//!   or down with the direction flag ([`operands::string_reads`]).
//! * **Irregular** — everything else: gathers, addresses derived from values
//!   loaded in the loop, non-linear index arithmetic, and (as in the paper)
//!   non-frame loads outside loops or at loop-invariant addresses.
//!
//! Proxy compression: in each basic block, Constant loads are not
//! instrumented when the block has a Strided or Irregular load; the first
//! such load carries `implied` = their number. A block with only Constant
//! loads instruments its first one as proxy, implying the others. The
//! static compression ratio is all explicit loads / instrumented loads.

pub mod frame;
pub mod operands;
pub mod values;

use crate::annotation::{
    ANNOTATION_SCHEMA, Annotation, FunctionSite, InlineChain, LoadSite, Segment, Text,
};
use crate::binary::lines::partition_point_from;
use crate::binary::usage::Usages;
use crate::binary::{
    Binary, ChainCursor, Function, FunctionCode, LineTable, SourceLocation, stack,
};
use foldhash::{HashMap, HashMapExt};
use frame::{Frame, FrameBuffers};
use iced_x86::Register;
use memgaze_trace::LoadClass;
pub use operands::{ImplicitLoad, LoadOperand};
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use values::{Change, Evaluator, EvaluatorBuffers, Why};

/// Why a load has its class: what the table shows the user.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Constant: RIP-relative or absolute scalar.
    GlobalScalar,
    /// Constant: stack-frame scalar (`rsp`, frame-pointer `rbp`).
    FrameScalar,
    /// Strided: `register` is an induction variable of the loop headed at
    /// `header`, updated at `update`.
    Induction {
        /// The address register that moves.
        register: Register,
        /// Address of the loop-carried update.
        update: u64,
        /// Address of the loop header.
        header: u64,
    },
    /// Irregular: `register` derives from the value loaded at `load`.
    DependsOnLoad {
        /// The address register.
        register: Register,
        /// Address of the load it derives from.
        load: u64,
    },
    /// Irregular: `register` is computed non-linearly at `at`.
    NonLinear {
        /// The address register.
        register: Register,
        /// Address of the instruction.
        at: u64,
    },
    /// Irregular: `register` comes from a call at `call`.
    CallResult {
        /// The address register.
        register: Register,
        /// Address of the call.
        call: u64,
    },
    /// Irregular: `register` was defined at `at` by something not modelled.
    Unmodelled {
        /// The address register.
        register: Register,
        /// Address of the instruction.
        at: u64,
    },
    /// Irregular: inside loops, but the (non-frame, non-global) address is
    /// the same in every iteration of all of them.
    LoopInvariant,
    /// Irregular: a non-frame, non-global address outside any loop.
    NotInLoop,
    /// Irregular: a gather (vector of indices).
    Gather,
    /// Irregular: a bit test at a register offset, which reads the byte
    /// `offset >> 3` past its operand (see
    /// `operands::bit_offset_register`).
    BitOffset {
        /// The bit-offset register.
        register: Register,
    },
    /// Strided: a string instruction's read through `rsi` or `rdi`, one
    /// element per iteration.
    StringInstruction,
}

impl Reason {
    /// A short stable name of the kind of reason (JSON keys, summaries).
    pub fn kind(&self) -> &'static str {
        match self {
            Reason::GlobalScalar => "global-scalar",
            Reason::FrameScalar => "frame-scalar",
            Reason::Induction { .. } => "induction",
            Reason::DependsOnLoad { .. } => "depends-on-load",
            Reason::NonLinear { .. } => "non-linear",
            Reason::CallResult { .. } => "call-result",
            Reason::Unmodelled { .. } => "unmodelled",
            Reason::LoopInvariant => "loop-invariant",
            Reason::NotInLoop => "not-in-loop",
            Reason::Gather => "gather",
            Reason::BitOffset { .. } => "bit-offset",
            Reason::StringInstruction => "string",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = |reg: &Register| format!("{reg:?}").to_lowercase();
        match self {
            Reason::GlobalScalar => f.write_str("global scalar"),
            Reason::FrameScalar => f.write_str("stack-frame scalar"),
            Reason::Induction {
                register,
                update,
                header,
            } => write!(
                f,
                "{} follows an induction variable (step at {update:#x}, loop at {header:#x})",
                r(register)
            ),
            Reason::DependsOnLoad { register, load } => {
                write!(f, "{} comes from the load at {load:#x}", r(register))
            }
            Reason::NonLinear { register, at } => {
                write!(f, "{} is computed non-linearly at {at:#x}", r(register))
            }
            Reason::CallResult { register, call } => {
                write!(f, "{} is set by the call at {call:#x}", r(register))
            }
            Reason::Unmodelled { register, at } => {
                write!(f, "{} is set at {at:#x} in a way not followed", r(register))
            }
            Reason::LoopInvariant => f.write_str("loop-invariant pointer"),
            Reason::NotInLoop => f.write_str("pointer outside loops"),
            Reason::Gather => f.write_str("gather"),
            Reason::BitOffset { register } => {
                write!(f, "bit test at the offset in {}", r(register))
            }
            Reason::StringInstruction => f.write_str("string instruction (element by element)"),
        }
    }
}

/// One classified load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassifiedLoad {
    /// The operand.
    pub operand: LoadOperand,
    /// Its class.
    pub class: LoadClass,
    /// Why.
    pub reason: Reason,
    /// Index of its basic block.
    pub block: u32,
    /// Nesting depth of loops around it (0 = none).
    pub loop_depth: u32,
    /// Whether it carries a probe after proxy compression.
    pub instrumented: bool,
    /// Constant loads its probe stands for.
    pub implied: u32,
    /// For an uninstrumented load: the probe that implies it.
    pub proxy: Option<u64>,
}

/// The loads of one function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionLoads {
    /// Explicit loads in address order.
    pub loads: Vec<ClassifiedLoad>,
    /// Implicit stack reads (`pop`, `ret`, `leave`): not instrumented.
    pub stack_loads: u32,
    /// Implicit string reads not traced (`outs`, 32-bit address size,
    /// `fs:`/`gs:` sources; see [`operands::string_reads`]).
    pub string_loads: u32,
    /// Basic blocks.
    pub blocks: u32,
    /// Natural loops.
    pub loops: u32,
    /// Resolved jump tables.
    pub jump_tables: u32,
    /// Indirect jumps neither resolved nor tail calls.
    pub unresolved_indirect_jumps: u32,
    /// Undecodable instructions.
    pub(crate) invalid_instructions: u32,
}

impl FunctionLoads {
    /// Loads of a class.
    pub fn count(&self, class: LoadClass) -> usize {
        self.loads.iter().filter(|l| l.class == class).count()
    }

    /// Loads carrying a probe.
    pub fn instrumented(&self) -> usize {
        self.loads.iter().filter(|l| l.instrumented).count()
    }

    /// All explicit loads / instrumented loads (1 without loads).
    pub fn compression_ratio(&self) -> f64 {
        ratio(self.loads.len(), self.instrumented())
    }
}

/// `all / instrumented`, 1 when nothing is instrumented.
pub fn ratio(all: usize, instrumented: usize) -> f64 {
    if instrumented == 0 {
        1.0
    } else {
        all as f64 / instrumented as f64
    }
}

/// Reusable scratch state for classifying many functions.
pub struct Classifier {
    usages: Usages,
    /// The load operands of the function being classified, kept from one
    /// function to the next.
    operands: Vec<LoadOperand>,
    /// The value evaluator's allocations, likewise (taken while a function
    /// uses them: a default left in their place would build iced's
    /// instruction information, two allocations, for nothing).
    evaluator: Option<EvaluatorBuffers>,
    /// The frame's allocations, likewise.
    frame: Option<FrameBuffers>,
}

impl Default for Classifier {
    fn default() -> Self {
        Classifier::new()
    }
}

impl Classifier {
    /// A new classifier.
    pub fn new() -> Classifier {
        Classifier {
            usages: Usages::new(),
            operands: Vec::new(),
            evaluator: None,
            frame: None,
        }
    }

    /// Classifies the loads of one function and applies proxy compression.
    pub fn classify(&mut self, code: &FunctionCode) -> FunctionLoads {
        let mut out = FunctionLoads {
            blocks: code.blocks.len() as u32,
            jump_tables: code.jump_tables.len() as u32,
            unresolved_indirect_jumps: code.unresolved_indirect_jumps() as u32,
            invalid_instructions: code.invalid_instructions,
            ..Default::default()
        };
        let mut operands = std::mem::take(&mut self.operands);
        operands.clear();
        for (i, insn) in code.instructions.iter().enumerate() {
            if insn.is_invalid() {
                continue;
            }
            if operands::may_load_explicitly(insn)
                && let Some(op) = operands::explicit_load(self.usages.factory(), insn, i as u32)
            {
                operands.push(op);
            } else if !operands::may_load_implicitly(insn) {
                continue;
            } else if let Some(reads) = operands::string_loads(insn, i as u32) {
                operands.extend(reads);
            } else {
                match operands::implicit_load(insn) {
                    ImplicitLoad::Stack => out.stack_loads += 1,
                    ImplicitLoad::String => out.string_loads += 1,
                    ImplicitLoad::None => {}
                }
            }
        }
        if operands.is_empty() {
            self.operands = operands;
            return out;
        }
        let loops = code.loops();
        out.loops = loops.loops.len() as u32;
        // Whether `rbp` is a frame pointer is asked only by `[rbp + d]`
        // loads, and the frame and the evaluator only by loads inside loops
        // that their addressing leaves undecided (most functions have none,
        // and the frame is iced's instruction info for every instruction).
        let rbp_scalars = operands
            .iter()
            .any(|op| op.base == Register::RBP && op.index == Register::None);
        let known_frame_pointer = rbp_scalars.then(|| stack::frame_pointer(code, &mut self.usages));
        let frame_pointer = known_frame_pointer.flatten().is_some();
        let needs_frame = operands.iter().any(|op| {
            loops
                .innermost(code.block_of[op.instruction as usize])
                .is_some()
                && class_by_form(code, frame_pointer, op).is_none()
        });
        let frame = needs_frame.then(|| {
            Frame::compute_in(
                code,
                loops,
                &mut self.usages,
                known_frame_pointer,
                self.frame.take().unwrap_or_default(),
            )
        });
        let mut evaluator = frame.as_ref().map(|f| {
            Evaluator::with_buffers(code, loops, f, self.evaluator.take().unwrap_or_default())
        });

        // Kept for the whole rewrite: sized once, without growth slack.
        out.loads.reserve_exact(operands.len());
        for op in operands.drain(..) {
            let block = code.block_of[op.instruction as usize];
            let loop_depth = loops.nest(block).count() as u32;
            let (class, reason) =
                classify_operand(code, loops, evaluator.as_mut(), frame_pointer, &op, block);
            out.loads.push(ClassifiedLoad {
                operand: op,
                class,
                reason,
                block,
                loop_depth,
                instrumented: false,
                implied: 0,
                proxy: None,
            });
        }
        self.operands = operands;
        if let Some(evaluator) = evaluator {
            self.evaluator = Some(evaluator.into_buffers());
        }
        if let Some(frame) = frame {
            self.frame = Some(frame.into_buffers());
        }
        compress(&mut out.loads);
        out
    }
}

fn classify_operand(
    code: &FunctionCode,
    loops: &crate::binary::LoopForest,
    evaluator: Option<&mut Evaluator<'_>>,
    frame_pointer: bool,
    op: &LoadOperand,
    block: u32,
) -> (LoadClass, Reason) {
    if let Some(decided) = class_by_form(code, frame_pointer, op) {
        return decided;
    }
    let Some(evaluator) = evaluator else {
        return (LoadClass::Irregular, Reason::NotInLoop);
    };
    let at = op.instruction as usize;
    let mut in_loop = false;
    for l in loops.nest(block) {
        in_loop = true;
        let mut moving: Option<(Register, u32)> = None;
        for reg in [op.index, op.base] {
            if matches!(reg, Register::None | Register::RIP) {
                continue;
            }
            match evaluator.register(l, reg, at) {
                Change::Invariant => {}
                Change::Induction { update } => {
                    moving.get_or_insert((reg, update));
                }
                Change::Varying(why) => {
                    let ip = |i: u32| code.instructions.get(i as usize).map_or(op.ip, |x| x.ip());
                    let reason = match why {
                        Why::Load(i) => Reason::DependsOnLoad {
                            register: reg,
                            load: ip(i),
                        },
                        Why::NonLinear(i) => Reason::NonLinear {
                            register: reg,
                            at: ip(i),
                        },
                        Why::Call(i) => Reason::CallResult {
                            register: reg,
                            call: ip(i),
                        },
                        Why::Unknown(i) => Reason::Unmodelled {
                            register: reg,
                            at: ip(i),
                        },
                    };
                    return (LoadClass::Irregular, reason);
                }
            }
        }
        if let Some((register, update)) = moving {
            let header = code.blocks[loops.loops[l as usize].header as usize].start;
            let update = code.instructions[update as usize].ip();
            return (
                LoadClass::Strided,
                Reason::Induction {
                    register,
                    update,
                    header,
                },
            );
        }
    }
    if in_loop {
        (LoadClass::Irregular, Reason::LoopInvariant)
    } else {
        (LoadClass::Irregular, Reason::NotInLoop)
    }
}

/// The class of a load that its instruction and addressing decide alone
/// (string reads, gathers, bit tests, scalars), whatever its loops;
/// `frame_pointer`: whether `rbp` is one.
fn class_by_form(
    code: &FunctionCode,
    frame_pointer: bool,
    op: &LoadOperand,
) -> Option<(LoadClass, Reason)> {
    if op.string {
        return Some((LoadClass::Strided, Reason::StringInstruction));
    }
    if op.gather {
        return Some((LoadClass::Irregular, Reason::Gather));
    }
    // The byte read moves with the bit offset, which the evaluator does not
    // follow: never a Constant scalar, whatever the operand.
    if let Some(register) = code
        .instructions
        .get(op.instruction as usize)
        .and_then(operands::bit_offset_register)
    {
        return Some((LoadClass::Irregular, Reason::BitOffset { register }));
    }
    if op.index == Register::None {
        match op.base {
            Register::None | Register::RIP => {
                return Some((LoadClass::Constant, Reason::GlobalScalar));
            }
            Register::RSP => return Some((LoadClass::Constant, Reason::FrameScalar)),
            Register::RBP if frame_pointer => {
                return Some((LoadClass::Constant, Reason::FrameScalar));
            }
            _ => {}
        }
    }
    None
}

/// Proxy compression within each basic block (loads sorted by address).
fn compress(loads: &mut [ClassifiedLoad]) {
    let mut start = 0;
    while start < loads.len() {
        let block = loads[start].block;
        let end = start
            + loads[start..]
                .iter()
                .take_while(|l| l.block == block)
                .count();
        let group = &mut loads[start..end];
        // Prefer a carrier the rewriter can instrument (not TLS, not a gather).
        // A string read is never one: its probe records per element, not
        // per execution.
        let plain = |l: &ClassifiedLoad| !l.operand.is_tls() && !l.operand.gather;
        let pick = |group: &[ClassifiedLoad], want: &dyn Fn(&ClassifiedLoad) -> bool| {
            group
                .iter()
                .position(|l| want(l) && plain(l))
                .or_else(|| group.iter().position(want))
        };
        let carrier = pick(group, &|l| {
            l.class != LoadClass::Constant && !l.operand.string
        })
        .or_else(|| pick(group, &|l| l.class == LoadClass::Constant));
        let Some(carrier) = carrier else {
            // String reads only: each has its own probe.
            group.iter_mut().for_each(|l| l.instrumented = true);
            start = end;
            continue;
        };
        let carrier_ip = group[carrier].operand.ip;
        let mut implied = 0;
        for (k, l) in group.iter_mut().enumerate() {
            if l.class != LoadClass::Constant || k == carrier {
                l.instrumented = true;
            } else {
                l.instrumented = false;
                l.proxy = Some(carrier_ip);
                implied += 1;
            }
        }
        group[carrier].implied = implied;
        start = end;
    }
}

/// The classified loads of a set of functions of one binary.
#[derive(Clone, Debug, Default)]
pub struct BinaryLoads {
    /// `(index into Binary::functions(), its loads)`, in address order.
    pub functions: Vec<(usize, FunctionLoads)>,
}

/// Totals over functions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Functions analysed.
    pub functions: usize,
    /// Explicit loads.
    pub loads: usize,
    /// By class: Strided, Irregular, Constant.
    pub strided: usize,
    /// See `strided`.
    pub irregular: usize,
    /// See `strided`.
    pub constant: usize,
    /// Loads carrying a probe.
    pub instrumented: usize,
    /// TLS loads (flagged; the rewriter may skip them).
    pub tls: usize,
    /// Implicit stack reads.
    pub stack_loads: usize,
    /// Implicit string reads.
    pub string_loads: usize,
    /// Jump tables resolved.
    pub jump_tables: usize,
    /// Indirect jumps left unresolved.
    pub unresolved_indirect_jumps: usize,
}

impl Totals {
    /// All explicit loads / instrumented loads.
    pub fn compression_ratio(&self) -> f64 {
        ratio(self.loads, self.instrumented)
    }
}

impl BinaryLoads {
    /// Sums over all functions.
    pub fn totals(&self) -> Totals {
        let mut t = Totals {
            functions: self.functions.len(),
            ..Default::default()
        };
        for (_, f) in &self.functions {
            t.loads += f.loads.len();
            t.strided += f.count(LoadClass::Strided);
            t.irregular += f.count(LoadClass::Irregular);
            t.constant += f.count(LoadClass::Constant);
            t.instrumented += f.instrumented();
            t.tls += f.loads.iter().filter(|l| l.operand.is_tls()).count();
            t.stack_loads += f.stack_loads as usize;
            t.string_loads += f.string_loads as usize;
            t.jump_tables += f.jump_tables as usize;
            t.unresolved_indirect_jumps += f.unresolved_indirect_jumps as usize;
        }
        t
    }

    /// The annotation (rewriter input): every load with its class, probe
    /// and proxy, operand literals, function and `file:line`.
    pub fn to_annotation(&self, binary: &Binary) -> Annotation {
        let mut annotation = self.to_annotation_without_lines(binary);
        add_lines(&mut annotation.loads, binary);
        annotation
    }

    /// [`BinaryLoads::to_annotation`] without the loads' source positions
    /// (`line`, `inline_chain`), which [`add_lines`] fills in: the
    /// rewriter does not read them, and while it runs their texts were a
    /// fifth of its memory.
    pub(crate) fn to_annotation_without_lines(&self, binary: &Binary) -> Annotation {
        use rayon::prelude::*;
        let functions: Vec<FunctionSite> = self
            .functions
            .par_iter()
            .map(|(index, f)| {
                let function = &binary.functions()[*index];
                FunctionSite {
                    name: function.name.clone(),
                    raw_name: function.raw_name.clone(),
                    start: function.start,
                    size: function.size,
                    instrumented: false,
                    skipped: None,
                    stack_loads: f.stack_loads,
                    string_loads: f.string_loads,
                }
            })
            .collect();
        // The first load id of each function, and the number of loads last.
        let mut first_load = Vec::with_capacity(self.functions.len() + 1);
        let mut total = 0;
        for (_, f) in &self.functions {
            first_load.push(total);
            total += f.loads.len();
        }
        first_load.push(total);
        // Built on all cores, straight into place: on one thread, faulting
        // in the fresh pages of a million loads was most of this serial
        // step. Each piece of work names registers with its own texts (one
        // shared text per register would have both cores bump the same
        // reference counts).
        let mut loads = Vec::with_capacity(total);
        (0..total)
            .into_par_iter()
            .with_min_len(LOADS_PER_PIECE)
            .map_init(
                || (0, RegisterTexts::default()),
                |(k, names), id| {
                    if !(first_load[*k]..first_load[*k + 1]).contains(&id) {
                        *k = first_load.partition_point(|&first| first <= id) - 1;
                    }
                    let l = &self.functions[*k].1.loads[id - first_load[*k]];
                    load_site(id, *k, l, names)
                },
            )
            .collect_into_vec(&mut loads);
        Annotation {
            schema: ANNOTATION_SCHEMA.to_string(),
            binary: binary.identity().clone(),
            mode: None,
            functions,
            loads,
            ptwrites: Vec::new(),
            shared_libraries: binary.needed().to_vec(),
            escapes: Vec::new(),
            cpu_features: Vec::new(),
        }
    }
}

/// Loads per piece of work of [`BinaryLoads::to_annotation_without_lines`].
const LOADS_PER_PIECE: usize = 4096;

/// Each register's name as a shared [`Text`], made on first use.
#[derive(Default)]
struct RegisterTexts(HashMap<Register, Text>);

impl RegisterTexts {
    /// The name of `r`, none for `Register::None`.
    fn of(&mut self, r: Register) -> Option<Text> {
        (r != Register::None).then(|| {
            self.0
                .entry(r)
                .or_insert_with(|| Text::from(format!("{r:?}").to_lowercase()))
                .clone()
        })
    }
}

/// The annotation's load `id` (without its source position): `l`, of
/// the annotation's function `function`.
fn load_site(
    id: usize,
    function: usize,
    l: &ClassifiedLoad,
    names: &mut RegisterTexts,
) -> LoadSite {
    let op = &l.operand;
    LoadSite {
        id: id as u32,
        ip: op.ip,
        len: op.len,
        class: l.class,
        instrumented: l.instrumented,
        implied: l.implied,
        // An instruction at address 0 would be the file's header.
        proxy: l.proxy.and_then(std::num::NonZeroU64::new),
        base: names.of(op.base),
        index: names.of(op.index),
        scale: op.scale,
        displacement: op.displacement as i64,
        size: op.size,
        function: function as u32,
        line: None,
        inline_chain: InlineChain::default(),
        skipped: None,
        segment: match op.segment {
            Register::FS => Some(Segment::Fs),
            Register::GS => Some(Segment::Gs),
            _ => None,
        },
        gather: op.gather,
        read_modify_write: op.read_modify_write,
        control: op.control,
    }
}

/// Fills in each load's `line` and `inline_chain` from DWARF (on all
/// cores; each load on its own), from the part of the line table that
/// serves the loads' addresses. Each distinct position is one shared
/// [`Text`]: one string per load and chain entry was the largest part of
/// an annotation in memory.
pub(crate) fn add_lines(loads: &mut [LoadSite], binary: &Binary) {
    let table = line_table_of(loads, binary);
    // The DWARF sections' pages are not read again.
    binary.release_resident();
    add_lines_from(loads, &table);
}

/// The part of `binary`'s line table that the lookups of `loads`' addresses
/// read.
pub(crate) fn line_table_of(loads: &[LoadSite], binary: &Binary) -> LineTable {
    binary.line_table_for(&sorted_addresses(loads))
}

/// `loads`' addresses, sorted, each once.
pub(crate) fn sorted_addresses(loads: &[LoadSite]) -> Vec<u64> {
    let mut addresses: Vec<u64> = loads.iter().map(|l| l.ip).collect();
    addresses.sort_unstable();
    addresses.dedup();
    addresses
}

/// [`add_lines`] with the line table already built ([`line_table_of`]).
pub(crate) fn add_lines_from(loads: &mut [LoadSite], table: &LineTable) {
    use rayon::prelude::*;
    let shared = PositionTexts::default();
    // Each worker takes a run of loads in order (they are sorted by `ip`),
    // which a chain cursor follows.
    loads.par_iter_mut().for_each_init(
        || PositionReader::new(table, &shared),
        |reader, load| (load.line, load.inline_chain) = reader.position(load.ip),
    );
}

/// A load's `line` and `inline_chain`.
pub(crate) type Position = (Option<Text>, InlineChain);

/// The positions [`add_lines_from`] gives loads at `addresses` (sorted,
/// distinct), one for each, made before the loads are final (the table
/// can then go, and [`add_positions`] only hands them out). On this
/// thread a run at a time until `hurry` is set, then on all cores.
pub(crate) fn positions_until_hurried(
    addresses: &[u64],
    table: &LineTable,
    hurry: &AtomicBool,
) -> Vec<Position> {
    use rayon::prelude::*;
    const RUN: usize = 4096;
    let shared = PositionTexts::default();
    let mut positions = Vec::with_capacity(addresses.len());
    let mut runs = addresses.chunks(RUN);
    let mut reader = PositionReader::new(table, &shared);
    while !hurry.load(Ordering::Relaxed) {
        match runs.next() {
            Some(run) => positions.extend(run.iter().map(|&a| reader.position(a))),
            None => break,
        }
    }
    let rest: Vec<&[u64]> = runs.collect();
    // A worker keeps its reader from run to run: a reader per run read
    // every text it gave again from the shared map and scanned the ranges
    // afresh.
    positions.par_extend(
        rest.into_par_iter()
            .map_init(
                || PositionReader::new(table, &shared),
                |reader, run| run.iter().map(|&a| reader.position(a)).collect::<Vec<_>>(),
            )
            .flatten_iter(),
    );
    positions
}

/// Gives each load the position of its address in `positions` (one for
/// each of `addresses`, [`positions_until_hurried`]), moved out of it
/// where the loads are in address order (the positions are left empty):
/// a clone, and the drop of the one left behind, each touched two shared
/// counts per load. Whether every load's address was among them; when
/// not, the loads and the positions are left as they were.
#[must_use]
pub(crate) fn add_positions(loads: &mut [LoadSite], looked_up: (&[u64], &mut [Position])) -> bool {
    add_positions_split(loads, looked_up, PARALLEL_POSITIONS)
}

/// [`add_positions`], the loads in order split in two halves from
/// `split_from` loads on.
fn add_positions_split(
    loads: &mut [LoadSite],
    (addresses, positions): (&[u64], &mut [Position]),
    split_from: usize,
) -> bool {
    // Loads are sorted by `ip`: each search starts at the last answer.
    let mut at = 0;
    let mut found = Vec::with_capacity(loads.len());
    for load in loads.iter() {
        at = partition_point_from(addresses, at, |&a| a < load.ip);
        match addresses.get(at) {
            Some(&a) if a == load.ip => found.push(at),
            _ => return false,
        }
    }
    if !found.is_sorted() {
        for (load, at) in loads.iter_mut().zip(found) {
            (load.line, load.inline_chain) = positions[at].clone();
        }
        return true;
    }
    // Two halves on two cores (this pass is all the process does then,
    // and it waits on memory), split where the address changes: each half
    // takes the positions of its own addresses.
    let mut half = loads.len() / 2;
    while half > 0 && half < loads.len() && found[half] == found[half - 1] {
        half += 1;
    }
    if loads.len() < split_from || half == 0 || half == loads.len() {
        move_positions(loads, &found, positions, 0);
        return true;
    }
    let (loads_before, loads_after) = loads.split_at_mut(half);
    let (found_before, found_after) = found.split_at(half);
    let (positions_before, positions_after) = positions.split_at_mut(found[half]);
    rayon::join(
        || move_positions(loads_before, found_before, positions_before, 0),
        || move_positions(loads_after, found_after, positions_after, found[half]),
    );
    true
}

/// Loads from which [`add_positions`] splits its work in two: a split
/// costs a wake-up of a worker, tens of microseconds.
const PARALLEL_POSITIONS: usize = 4096;

/// Moves into `loads` their positions: `found` holds, for each load in
/// order, the index of its position, in `positions` counted from `first`.
/// The loads of one address follow each other: the first takes the
/// position, the others copy it from the load before.
fn move_positions(
    loads: &mut [LoadSite],
    found: &[usize],
    positions: &mut [Position],
    first: usize,
) {
    let mut previous = None;
    for (i, &at) in found.iter().enumerate() {
        if previous == Some(at) {
            let (before, from) = loads.split_at_mut(i);
            let last = &before[i - 1];
            (from[0].line, from[0].inline_chain) = (last.line.clone(), last.inline_chain.clone());
        } else {
            (loads[i].line, loads[i].inline_chain) = std::mem::take(&mut positions[at - first]);
        }
        previous = Some(at);
    }
}

/// What one thread needs to look positions up: the table's chain cursor,
/// its own view of the shared texts, and the last position it gave.
struct PositionReader<'t> {
    texts: LocalTexts<'t>,
    chains: ChainCursor<'t>,
    last: LastPosition<'t>,
}

impl<'t> PositionReader<'t> {
    fn new(table: &'t LineTable, shared: &'t PositionTexts) -> PositionReader<'t> {
        PositionReader {
            texts: LocalTexts {
                shared,
                seen: HashMap::new(),
                recent: RecentTexts::default(),
            },
            chains: ChainCursor::new(table),
            last: LastPosition::default(),
        }
    }

    /// The position of the instruction at `ip`. The loads of one run of
    /// code mostly share their chain, or its call sites, with the load
    /// before: the call sites are read again only where the inlined ranges
    /// holding the address changed, and the texts of what did not change
    /// (the line, the call sites, the whole chain) are the last ones.
    fn position(&mut self, ip: u64) -> Position {
        let Some(first) = self.chains.locate(ip) else {
            return (None, InlineChain::default());
        };
        let last = &mut self.last;
        let mut changed = false;
        let generation = self.chains.generation();
        if last.generation != Some(generation) {
            last.generation = Some(generation);
            last.next_sites.clear();
            self.chains.call_sites_into(&mut last.next_sites);
            // The outer call sites the two share keep their texts: where
            // the ranges change, mostly the innermost ones do.
            let (sites, next) = (&last.sites, &last.next_sites);
            let shared = sites
                .iter()
                .rev()
                .zip(next.iter().rev())
                .take_while(|(a, b)| PositionTexts::key(a) == PositionTexts::key(b))
                .count();
            if shared != sites.len() || shared != next.len() {
                last.site_texts.truncate(shared);
                let texts = &mut self.texts;
                last.site_texts.extend(
                    next[..next.len() - shared]
                        .iter()
                        .rev()
                        .map(|at| texts.text(at)),
                );
                std::mem::swap(&mut last.sites, &mut last.next_sites);
                changed = true;
            }
        }
        let key = PositionTexts::key(&first);
        if last.line_key != Some(key) {
            last.line_key = Some(key);
            last.line = Some(self.texts.text(&first));
            changed = true;
        }
        if changed {
            last.inline_chain = match (&last.line, last.sites.is_empty()) {
                (Some(line), false) => InlineChain::of_reversed(line, &last.site_texts),
                _ => InlineChain::default(),
            };
        }
        (last.line.clone(), last.inline_chain.clone())
    }
}

/// A worker's last position, in parts: its line, the call sites of the
/// inlined ranges holding it (as of a [`ChainCursor::generation`]), their
/// texts and the inline chain of both. The default is no position yet.
#[derive(Default)]
struct LastPosition<'t> {
    /// The line's key ([`PositionTexts::key`]) and text.
    line_key: Option<(usize, u32)>,
    line: Option<Text>,
    /// The cursor's generation `sites` were read at.
    generation: Option<u64>,
    /// The call sites, innermost first (the chain past its line).
    sites: Vec<SourceLocation<'t>>,
    /// The call sites being read (a buffer swapped with `sites`).
    next_sites: Vec<SourceLocation<'t>>,
    /// `sites`' texts, outermost first (the part a change of the
    /// innermost sites keeps is a prefix).
    site_texts: Vec<Text>,
    /// The line, then the call sites; empty without call sites.
    inline_chain: InlineChain,
}

/// One worker's view of [`PositionTexts`]: the texts it has already been
/// given, looked up without the shared map's lock (taking a lock for every
/// load and chain entry was most of the time of this pass).
struct LocalTexts<'a> {
    shared: &'a PositionTexts,
    seen: HashMap<(usize, u32), Text>,
    /// The text last given in each slot by its key: a load's line and call
    /// sites mostly are those of a load shortly before, and a hit here
    /// costs a fraction of the map's lookup.
    recent: RecentTexts,
}

/// Slots of [`LocalTexts`]' recent texts.
const RECENT_TEXTS: usize = 256;

/// A position's key ([`PositionTexts::key`]) and its text.
type KeyedText = ((usize, u32), Text);

/// [`LocalTexts`]' recent texts by slot, empty at first.
struct RecentTexts(Box<[Option<KeyedText>; RECENT_TEXTS]>);

impl Default for RecentTexts {
    fn default() -> RecentTexts {
        RecentTexts(Box::new([const { None }; RECENT_TEXTS]))
    }
}

impl LocalTexts<'_> {
    fn text(&mut self, at: &SourceLocation<'_>) -> Text {
        let key = PositionTexts::key(at);
        let slot = ((key.0 >> 4) ^ (key.1 as usize).wrapping_mul(0x9e37_79b9)) % RECENT_TEXTS;
        if let Some((recent, text)) = &self.recent.0[slot]
            && *recent == key
        {
            return text.clone();
        }
        let text = match self.seen.get(&key) {
            Some(text) => text.clone(),
            None => {
                let text = self.shared.text(at);
                self.seen.insert(key, text.clone());
                text
            }
        };
        self.recent.0[slot] = Some((key, text.clone()));
        text
    }
}

/// The `file:line` [`Text`] of each source position asked for, made once
/// and shared. Positions are keyed by the line table's file string (its
/// address: the table outlives this) and line; the map is split into
/// shards, each behind its own lock, so that all cores can ask at once.
struct PositionTexts {
    shards: Vec<Mutex<HashMap<(usize, u32), Text>>>,
}

impl PositionTexts {
    const SHARDS: usize = 64;

    /// The key of a position: its file string's address and its line.
    fn key(at: &SourceLocation<'_>) -> (usize, u32) {
        (at.file.as_ptr() as usize, at.line)
    }

    fn text(&self, at: &SourceLocation<'_>) -> Text {
        let key = Self::key(at);
        let shard = (key.0 >> 3)
            .wrapping_add(key.1 as usize)
            .wrapping_mul(0x9e37_79b9)
            >> 7;
        let mut texts = self.shards[shard % Self::SHARDS]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        texts
            .entry(key)
            .or_insert_with(|| Text::from(at.to_text()))
            .clone()
    }
}

impl Default for PositionTexts {
    fn default() -> PositionTexts {
        PositionTexts {
            shards: (0..Self::SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

/// Classifies the functions of `binary` that `select` accepts.
pub fn classify_binary(binary: &Binary, select: impl Fn(&Function) -> bool) -> BinaryLoads {
    let mut classifier = Classifier::new();
    let mut functions = Vec::new();
    for (index, function) in binary.functions().iter().enumerate() {
        if !select(function) {
            continue;
        }
        let code = binary.function_code(function);
        functions.push((index, classifier.classify(&code)));
    }
    BinaryLoads { functions }
}

#[cfg(test)]
mod tests;
