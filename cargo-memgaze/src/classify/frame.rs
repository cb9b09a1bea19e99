//! The stack frame and what each instruction defines.
//!
//! To follow induction variables that live in memory (every local at `-O0`,
//! spilled counters in register-starved optimised loops), stack slots are
//! treated as variables next to the 16 general-purpose registers. A slot is
//! named by its [`StackPos`]: the offset from the stack pointer at function
//! entry, or from the point where the function realigned the stack
//! (`and rsp, -32` before AVX spills). The stack position at each
//! instruction comes from a forward pass over the blocks (`push`/`pop`/
//! `sub rsp, imm`/…), and `rbp`-relative slots are translated when `rbp` is
//! a frame pointer (`mov rbp, rsp` in the entry block and no other writes).
//! Slots whose address escapes are not modelled: a store through another
//! pointer is assumed not to alias them.

use crate::binary::FunctionCode;
use crate::binary::stack::{self, StackPos};
use iced_x86::{FlowControl, Instruction, InstructionInfoFactory, OpAccess, Register};

/// A variable: registers 0..16 (iced register numbers of the 64-bit GPRs),
/// stack slots from 16 on.
pub type Var = u16;

/// Number of register variables.
pub const GPRS: Var = 16;

/// The variable of a general-purpose register (any width), if it is one.
pub fn gpr_var(reg: Register) -> Option<Var> {
    let full = reg.full_register();
    full.is_gpr64().then(|| full.number() as Var)
}

/// How an instruction defines a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefKind {
    /// The instruction's result (register destination, or a store of a
    /// register/immediate to exactly this slot).
    Value,
    /// A call clobbering a caller-saved register.
    CallClobber,
    /// A store overlapping the slot without matching it exactly.
    Clobber,
}

/// Frame facts and per-instruction definitions of one function.
#[derive(Debug)]
pub struct Frame {
    /// Where `rsp` points before each instruction, when known.
    pub rsp_delta: Vec<Option<StackPos>>,
    /// Entry-relative offset `rbp` holds when it is a frame pointer.
    pub frame_pointer: Option<i64>,
    /// Slots and their widest access, sorted; index = var - GPRS.
    pub slots: Vec<(StackPos, u32)>,
    /// Definitions: `defs[def_start[i]..def_start[i+1]]` for instruction `i`.
    def_start: Vec<u32>,
    defs: Vec<(Var, DefKind)>,
}

const CALLER_SAVED: [Register; 9] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
];

impl Frame {
    /// Analyses the frame of `code`.
    pub fn compute(code: &FunctionCode, info: &mut InstructionInfoFactory) -> Frame {
        let frame_pointer = stack::frame_pointer(code, info);
        let rsp_delta = stack::positions(code, frame_pointer);
        let mut frame = Frame {
            rsp_delta,
            frame_pointer,
            slots: Vec::new(),
            def_start: Vec::with_capacity(code.instructions.len() + 1),
            defs: Vec::new(),
        };
        // Slots: every frame access.
        let mut offsets: Vec<(StackPos, u32)> = Vec::new();
        for (i, insn) in code.instructions.iter().enumerate() {
            for m in info.info(insn).used_memory() {
                if let Some(off) = frame.slot_offset(i, m.base(), m.index(), m.displacement()) {
                    offsets.push((off, m.memory_size().size() as u32));
                }
            }
        }
        offsets.sort_unstable();
        offsets.dedup_by(|a, b| {
            if a.0 == b.0 {
                b.1 = b.1.max(a.1);
                true
            } else {
                false
            }
        });
        frame.slots = offsets;

        // Definitions.
        for (i, insn) in code.instructions.iter().enumerate() {
            frame.def_start.push(frame.defs.len() as u32);
            let info = info.info(insn);
            for r in info.used_registers() {
                if matches!(
                    r.access(),
                    OpAccess::Write
                        | OpAccess::ReadWrite
                        | OpAccess::CondWrite
                        | OpAccess::ReadCondWrite
                ) && let Some(v) = gpr_var(r.register())
                    && !frame.is_invariant_register(r.register())
                    && !frame.defs[frame.def_start[i] as usize..]
                        .iter()
                        .any(|d| d.0 == v)
                {
                    frame.defs.push((v, DefKind::Value));
                }
            }
            if matches!(
                insn.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            ) {
                for r in CALLER_SAVED {
                    let v = gpr_var(r).expect("gpr");
                    if !frame.defs[frame.def_start[i] as usize..]
                        .iter()
                        .any(|d| d.0 == v)
                    {
                        frame.defs.push((v, DefKind::CallClobber));
                    }
                }
            }
            for m in info.used_memory() {
                if !matches!(
                    m.access(),
                    OpAccess::Write
                        | OpAccess::ReadWrite
                        | OpAccess::CondWrite
                        | OpAccess::ReadCondWrite
                ) {
                    continue;
                }
                let Some(off) = frame.slot_offset(i, m.base(), m.index(), m.displacement()) else {
                    continue;
                };
                let size = i64::from(m.memory_size().size() as u32).max(1);
                for (k, s) in frame.slots.iter().enumerate() {
                    let overlaps = s.0.anchor == off.anchor
                        && s.0.offset < off.offset + size
                        && off.offset < s.0.offset + i64::from(s.1).max(1);
                    if !overlaps {
                        continue;
                    }
                    let kind = if s.0 == off {
                        DefKind::Value
                    } else {
                        DefKind::Clobber
                    };
                    frame.defs.push((GPRS + k as Var, kind));
                }
            }
        }
        frame.def_start.push(frame.defs.len() as u32);
        frame
    }

    /// Variables instruction `i` defines.
    pub fn defs(&self, i: usize) -> &[(Var, DefKind)] {
        &self.defs[self.def_start[i] as usize..self.def_start[i + 1] as usize]
    }

    /// How instruction `i` defines `v`, if it does.
    pub fn def_kind(&self, i: usize, v: Var) -> Option<DefKind> {
        self.defs(i).iter().find(|d| d.0 == v).map(|d| d.1)
    }

    /// `rsp`, and `rbp` when it is the frame pointer: their values do not
    /// change within a loop iteration in any way that matters for address
    /// classes (frame accesses are slots).
    pub fn is_invariant_register(&self, reg: Register) -> bool {
        match reg.full_register() {
            Register::RSP | Register::RIP | Register::None => true,
            Register::RBP => self.frame_pointer.is_some(),
            _ => false,
        }
    }

    /// Stack position of a frame access `[base + disp]` (no index) at
    /// instruction `i`.
    pub fn slot_offset(
        &self,
        i: usize,
        base: Register,
        index: Register,
        disp: u64,
    ) -> Option<StackPos> {
        if index != Register::None {
            return None;
        }
        let disp = disp as i64;
        match base {
            Register::RSP => Some(self.rsp_delta[i]?.plus(disp)),
            Register::RBP => Some(StackPos::entry(self.frame_pointer? + disp)),
            _ => None,
        }
    }

    /// The variable of the slot at that position, if one was seen.
    pub fn slot_var(&self, offset: StackPos) -> Option<Var> {
        self.slots
            .binary_search_by_key(&offset, |s| s.0)
            .ok()
            .map(|k| GPRS + k as Var)
    }

    /// The slot variable an instruction's explicit memory operand names.
    pub fn operand_slot(&self, i: usize, insn: &Instruction) -> Option<Var> {
        let off = self.slot_offset(
            i,
            insn.memory_base(),
            insn.memory_index(),
            insn.memory_displacement64(),
        )?;
        self.slot_var(off)
    }
}
