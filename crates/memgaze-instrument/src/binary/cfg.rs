//! Control flow of one function: instructions, basic blocks, call sites,
//! indirect jumps and resolved jump tables.
//!
//! Blocks end at every control transfer **including calls**: a call may
//! not return (panics unwind, `exit` never returns), so the instructions
//! after it are not certain to run whenever the ones before it do; and the
//! return address is an entry point the rewriter must know about anyway.
//! Leaders are the function start, every intra-function target of a direct
//! branch or of a resolved jump table, and every instruction after a
//! transfer.
//!
//! The instruction list is a linear sweep of the function's bytes, which is
//! exact for compiler output on x86-64 (jump tables live in `.rodata`).

use super::dominators::Dominators;
use super::jump_tables::{self, JumpTable, Recognised};
use super::loops::LoopForest;
use super::stack::{self, StackPos};
use foldhash::{HashMap, HashMapExt};
use iced_x86::{Code, FlowControl, Instruction, Mnemonic, OpKind, Register};
use std::cell::RefCell;
use std::sync::OnceLock;

/// Read access to the bytes of the program image by virtual address (the
/// jump-table reader needs `.rodata`).
pub trait Memory {
    /// `len` bytes at `addr`, if file-backed.
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]>;
}

impl Memory for super::Binary {
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        self.bytes_at(addr, len)
    }
}

/// A flat image: `bytes` mapped at `base` (tests, and code outside ELF files).
#[derive(Clone, Copy, Debug)]
pub struct FlatMemory<'a> {
    /// Address of `bytes[0]`.
    pub base: u64,
    /// The contents.
    pub bytes: &'a [u8],
}

impl Memory for FlatMemory<'_> {
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let off = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        self.bytes.get(off..off.checked_add(len)?)
    }
}

/// How a basic block ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Terminator {
    /// The next instruction starts another block (a branch target).
    FallThrough,
    /// Direct unconditional jump inside the function.
    Jump,
    /// Conditional branch: taken target and fall-through.
    Conditional,
    /// A call (direct or indirect); the block after it starts at the return
    /// address.
    Call,
    /// `ret`.
    Return,
    /// Direct jump (or conditional jump) leaving the function.
    TailCall,
    /// `jmp reg` / `jmp [mem]`: see [`FunctionCode::indirect_jumps`].
    IndirectJump,
    /// `ud2`, `hlt`, `int3`, `int n` and the like.
    Trap,
    /// Bytes that do not decode.
    Invalid,
    /// The function's bytes end without a transfer (code after a call that
    /// does not return, or a size that cuts the last instruction).
    End,
}

/// A block's successors or predecessors (block indices): nearly every
/// block has at most four, kept inline, so building and freeing a
/// function's control flow allocates nothing per block.
pub type BlockList = smallvec::SmallVec<[u32; 4]>;

/// A basic block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasicBlock {
    /// Address of its first instruction.
    pub start: u64,
    /// One past its last byte.
    pub end: u64,
    /// Index of its first instruction in [`FunctionCode::instructions`].
    pub first: u32,
    /// Number of instructions (≥ 1).
    pub len: u32,
    /// Successor blocks (indices), without duplicates.
    pub successors: BlockList,
    /// Predecessor blocks (indices), without duplicates.
    pub predecessors: BlockList,
    /// How it ends.
    pub terminator: Terminator,
}

impl BasicBlock {
    /// Range of its instruction indices.
    pub fn instructions(&self) -> std::ops::Range<usize> {
        self.first as usize..(self.first + self.len) as usize
    }

    /// Index of its last instruction.
    pub fn last(&self) -> usize {
        (self.first + self.len - 1) as usize
    }
}

/// A `call` instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallSite {
    /// Address of the call.
    pub ip: u64,
    /// Its instruction index.
    pub instruction: u32,
    /// Address after it (what the call pushes).
    pub(crate) return_address: u64,
    /// Target of a direct call.
    pub target: Option<u64>,
}

/// What is known about an indirect jump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndirectJumpKind {
    /// A recognised jump table (index into [`FunctionCode::jump_tables`]).
    JumpTable(usize),
    /// A tail call: a jump to a code pointer read from memory (`jmp [m]`,
    /// `jmp r` after `mov r, [b+d]`: GOT, vtable, closure; or a constant
    /// table of function pointers), or `jmp r` of a computed pointer once the
    /// frame is torn down. It leaves the function.
    TailCall,
    /// Anything else (`jmp rax` of a function pointer, unrecognised tables).
    Unresolved,
}

/// An indirect `jmp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndirectJump {
    /// Address of the jump.
    pub ip: u64,
    /// Its instruction index.
    pub instruction: u32,
    /// What it is.
    pub kind: IndirectJumpKind,
}

/// The decoded, partitioned code of one function.
#[derive(Clone, Debug, Default)]
pub struct FunctionCode {
    /// First address.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Linear decoding of `[start, end)`.
    pub instructions: Vec<Instruction>,
    /// Basic blocks in address order; block 0 is the entry.
    pub blocks: Vec<BasicBlock>,
    /// Block index of each instruction.
    pub block_of: Vec<u32>,
    /// Every call.
    pub calls: Vec<CallSite>,
    /// Every indirect `jmp`.
    pub indirect_jumps: Vec<IndirectJump>,
    /// Recognised jump tables.
    pub jump_tables: Vec<JumpTable>,
    /// Every intra-function target of a direct branch or jump-table entry,
    /// sorted and unique.
    pub branch_targets: Vec<u64>,
    /// Instructions that did not decode.
    pub(crate) invalid_instructions: u32,
    /// The natural loops, found on first use: the classification and the
    /// rewriter's register loops both read them.
    pub(crate) loops: OnceLock<LoopForest>,
}

impl FunctionCode {
    /// Decodes `code` (the function's bytes, starting at `start`) and
    /// builds its control flow. `memory` gives access to jump tables.
    pub fn build(code: &[u8], start: u64, memory: &dyn Memory) -> FunctionCode {
        let mut instructions = Vec::new();
        super::decode_bytes(code, start, &mut instructions);
        FunctionCode::from_instructions(instructions, start, start + code.len() as u64, memory)
    }

    /// Builds the control flow of already decoded instructions covering
    /// `[start, end)`: branch sources and calls, indirect jumps (jump tables
    /// recognised), leaders, basic blocks, then their edges.
    pub(crate) fn from_instructions(
        instructions: Vec<Instruction>,
        start: u64,
        end: u64,
        memory: &dyn Memory,
    ) -> FunctionCode {
        CFG_BUFFERS.with_borrow_mut(|bufs| {
            FunctionCode::from_instructions_in(instructions, start, end, memory, bufs)
        })
    }

    /// [`FunctionCode::from_instructions`] with the thread's buffers.
    fn from_instructions_in(
        mut instructions: Vec<Instruction>,
        start: u64,
        end: u64,
        memory: &dyn Memory,
        bufs: &mut CfgBuffers,
    ) -> FunctionCode {
        let index_of = IndexOf::in_buffer(
            &instructions,
            start,
            end,
            std::mem::take(&mut bufs.at_offset),
        );
        let found = &mut bufs.transfers;
        found.scan(&mut instructions, start, end, &index_of, memory);
        let (indirect_jumps, jump_tables, not_table_shaped) = indirect_jumps(
            &instructions,
            &found.indirect,
            start,
            end,
            &index_of,
            memory,
        );
        add_target_leaders(
            &mut found.leader,
            &mut found.branch_targets,
            &jump_tables,
            &index_of,
            start,
            end,
        );
        let (mut blocks, block_of) = basic_blocks(&instructions, &found.leader);
        link_blocks(
            &mut blocks,
            &instructions,
            &block_of,
            &index_of,
            &indirect_jumps,
            &jump_tables,
        );

        let mut code = FunctionCode {
            start,
            end,
            instructions,
            blocks,
            block_of,
            // Copied at their size: the function keeps them for the whole
            // rewrite.
            calls: found.calls.to_vec(),
            indirect_jumps,
            jump_tables,
            branch_targets: found.branch_targets.to_vec(),
            invalid_instructions: found.invalid,
            loops: OnceLock::new(),
        };
        bufs.at_offset = index_of.into_buffer();
        code.resolve_frame_tail_calls(not_table_shaped);
        code
    }

    /// `jmp r` of a computed pointer after the frame is torn down (the
    /// stack pointer back where it was at entry) is a tail call: marks the
    /// indirect jumps `not_table_shaped` (indices) that are.
    fn resolve_frame_tail_calls(&mut self, not_table_shaped: Vec<usize>) {
        if !not_table_shaped.is_empty() {
            let fp = stack::frame_pointer(self, &mut super::usage::Usages::new());
            let positions = stack::positions(self, fp);
            for k in not_table_shaped {
                let j = &mut self.indirect_jumps[k];
                if positions[j.instruction as usize] == Some(StackPos::entry(0)) {
                    j.kind = IndirectJumpKind::TailCall;
                }
            }
        }
    }

    /// The block holding instruction `index`.
    pub fn block_of_instruction(&self, index: usize) -> &BasicBlock {
        &self.blocks[self.block_of[index] as usize]
    }

    /// The instruction index at address `ip`, if an instruction starts there.
    pub fn instruction_at(&self, ip: u64) -> Option<usize> {
        let i = self.instructions.partition_point(|x| x.ip() < ip);
        (i < self.instructions.len() && self.instructions[i].ip() == ip).then_some(i)
    }

    /// Indirect jumps that are neither jump tables nor tail calls through
    /// memory: control may go anywhere from them.
    pub fn unresolved_indirect_jumps(&self) -> usize {
        self.indirect_jumps
            .iter()
            .filter(|j| j.kind == IndirectJumpKind::Unresolved)
            .count()
    }

    /// Dominator tree of the blocks (entry = block 0).
    pub fn dominators(&self) -> Dominators {
        Dominators::compute(&self.blocks)
    }

    /// Natural loops (from back edges) and their nesting, found once.
    pub fn loops(&self) -> &LoopForest {
        self.loops.get_or_init(|| LoopForest::of(&self.blocks))
    }
}

/// The lists [`FunctionCode::from_instructions`] fills and drops, kept per
/// thread from one function to the next: made anew for every function, they
/// were most of its allocations (and of the classification's).
#[derive(Default)]
struct CfgBuffers {
    /// [`IndexOf`]'s table.
    at_offset: Vec<u32>,
    /// What the sweep over the instructions finds.
    transfers: Transfers,
}

thread_local! {
    static CFG_BUFFERS: RefCell<CfgBuffers> = RefCell::default();
}

/// The index of the instruction starting at each address of a function,
/// by direct indexing on the offset from its start: built for every
/// function, a hash map of every instruction's address was a sizeable
/// part of building the control flow.
pub(crate) struct IndexOf {
    start: u64,
    /// Per byte offset: the index of the instruction starting there, or
    /// `u32::MAX`.
    at_offset: Vec<u32>,
}

impl IndexOf {
    /// The index of `instructions`, which lie in `[start, end)` in address
    /// order (a linear sweep), in `at_offset`'s allocation (its contents
    /// are replaced).
    fn in_buffer(
        instructions: &[Instruction],
        start: u64,
        end: u64,
        mut at_offset: Vec<u32>,
    ) -> IndexOf {
        at_offset.clear();
        at_offset.resize(end.saturating_sub(start) as usize, u32::MAX);
        for (i, insn) in instructions.iter().enumerate() {
            if let Some(slot) = insn
                .ip()
                .checked_sub(start)
                .and_then(|offset| at_offset.get_mut(offset as usize))
            {
                *slot = i as u32;
            }
        }
        IndexOf { start, at_offset }
    }

    /// The table's allocation, for the next function's.
    fn into_buffer(self) -> Vec<u32> {
        self.at_offset
    }

    /// The index of the instruction starting at `ip`, if one does.
    pub(crate) fn get(&self, ip: u64) -> Option<u32> {
        let offset = usize::try_from(ip.checked_sub(self.start)?).ok()?;
        self.at_offset
            .get(offset)
            .copied()
            .filter(|&i| i != u32::MAX)
    }

    /// Whether an instruction starts at `ip`.
    pub(crate) fn contains(&self, ip: u64) -> bool {
        self.get(ip).is_some()
    }
}

/// The address a direct branch to `target` should go to: the locked
/// instruction itself when `target` skips its `lock` prefix, else
/// `target`. glibc's `catomic_*` operations (in `malloc`'s `_int_malloc`
/// and `_int_free`) test for a single thread and jump over the prefix
/// (`je 1f; lock; 1: cmpxchg`): a branch into the middle of an
/// instruction, which no copy can reproduce. The locked form does what
/// the unlocked one does, atomically as well, so one instruction serves
/// both paths and the function can be copied.
fn lock_skip_retarget(
    instructions: &[Instruction],
    target: u64,
    index_of: &IndexOf,
    memory: &dyn Memory,
) -> u64 {
    const LOCK: u8 = 0xf0;
    if target == 0 || index_of.contains(target) {
        return target;
    }
    match index_of.get(target - 1) {
        Some(locked)
            if instructions[locked as usize].has_lock_prefix()
                && memory.read(target - 1, 1) == Some(&[LOCK][..]) =>
        {
            target - 1
        }
        _ => target,
    }
}

/// What one sweep over a function's instructions finds of its control
/// transfers (one sweep rather than one per kind: each reads every
/// instruction's flow control again).
#[derive(Default)]
struct Transfers {
    /// Every call.
    calls: Vec<CallSite>,
    /// Instructions that did not decode.
    invalid: u32,
    /// Instruction indices of the indirect jumps.
    indirect: Vec<u32>,
    /// Leaders so far: the first instruction and every one after a
    /// transfer (the branch targets are added by [`add_target_leaders`]).
    leader: Vec<bool>,
    /// Direct branch targets inside the function, unsorted, repeated.
    branch_targets: Vec<u64>,
}

impl Transfers {
    /// Sweeps the `instructions` of `[start, end)`, replacing what the
    /// lists held, and points each direct branch that skips a `lock`
    /// prefix at the locked instruction ([`lock_skip_retarget`]) on the
    /// way: a sweep of its own read every instruction's flow control again.
    fn scan(
        &mut self,
        instructions: &mut [Instruction],
        start: u64,
        end: u64,
        index_of: &IndexOf,
        memory: &dyn Memory,
    ) {
        let n = instructions.len();
        let found = self;
        found.calls.clear();
        found.invalid = 0;
        found.indirect.clear();
        found.leader.clear();
        found.leader.resize(n, false);
        found.branch_targets.clear();
        if n > 0 {
            found.leader[0] = true;
        }
        for i in 0..n {
            let insn = &instructions[i];
            let flow = insn.flow_control();
            if insn.is_invalid() {
                found.invalid += 1;
            }
            let ends_block = !matches!(flow, FlowControl::Next | FlowControl::XbeginXabortXend)
                || insn.is_invalid();
            if ends_block && i + 1 < n {
                found.leader[i + 1] = true;
            }
            match flow {
                FlowControl::Call | FlowControl::IndirectCall => {
                    found.calls.push(CallSite {
                        ip: insn.ip(),
                        instruction: i as u32,
                        return_address: insn.next_ip(),
                        target: (flow == FlowControl::Call).then(|| insn.near_branch_target()),
                    });
                }
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch => {
                    let original = insn.near_branch_target();
                    let target = lock_skip_retarget(instructions, original, index_of, memory);
                    if target != original {
                        instructions[i].set_near_branch64(target);
                    }
                    if target >= start && target < end {
                        found.branch_targets.push(target);
                    }
                }
                FlowControl::IndirectBranch => found.indirect.push(i as u32),
                _ => {}
            }
        }
    }
}

/// Direct branch sources per target instruction (for jump-table
/// slicing), each target's in the order they were added: the sweep's
/// branches in one list grouped by target (a hash map of a list per target
/// was most of building them), and beside it, whole, the lists of the
/// targets that resolved jump tables add to.
pub(crate) struct BranchSources {
    /// Per instruction, where its sources start in `swept` (one more at
    /// the end).
    first: Vec<u32>,
    /// The direct branches, by target, each target's in address order.
    swept: Vec<u32>,
    /// Every source of the targets given more after the sweep.
    grown: HashMap<u32, Vec<u32>>,
}

impl BranchSources {
    /// The direct branches of `instructions` to an instruction of theirs,
    /// by target.
    fn of(instructions: &[Instruction], index_of: &IndexOf) -> BranchSources {
        let branches: Vec<(u32, u32)> = (instructions.iter().enumerate())
            .filter(|(_, insn)| {
                matches!(
                    insn.flow_control(),
                    FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
                )
            })
            .filter_map(|(i, insn)| Some((index_of.get(insn.near_branch_target())?, i as u32)))
            .collect();
        // Each target's sources stay in address order.
        let (first, swept) = super::stable_buckets(
            instructions.len(),
            branches
                .iter()
                .map(|&(target, source)| (target as usize, source)),
        );
        BranchSources {
            first,
            swept,
            grown: HashMap::new(),
        }
    }

    /// The sources of instruction `i`.
    pub(crate) fn of_target(&self, i: u32) -> &[u32] {
        if let Some(all) = self.grown.get(&i) {
            return all;
        }
        self.swept_of(i)
    }

    /// The sweep's sources of instruction `i`.
    fn swept_of(&self, i: u32) -> &[u32] {
        swept_sources(&self.first, &self.swept, i)
    }

    /// Adds `source` to the sources of `target`, unless it is one.
    fn add(&mut self, target: u32, source: u32) {
        let BranchSources {
            first,
            swept,
            grown,
        } = self;
        let all =
            (grown.entry(target)).or_insert_with(|| swept_sources(first, swept, target).to_vec());
        if !all.contains(&source) {
            all.push(source);
        }
    }
}

/// Instruction `i`'s sources in `swept`, where `first` gives each
/// instruction's start ([`BranchSources`]' fields).
fn swept_sources<'s>(first: &[u32], swept: &'s [u32], i: u32) -> &'s [u32] {
    match (first.get(i as usize), first.get(i as usize + 1)) {
        (Some(&from), Some(&to)) => &swept[from as usize..to as usize],
        _ => &[],
    }
}

/// Every indirect jump, classified (tail call, jump table, unresolved);
/// the jump tables (overlaps trimmed); and the indices of the unresolved
/// jumps that are not shaped like a table dispatch.
///
/// Recognition repeats while it resolves tables: a computed-goto
/// interpreter's handlers are reached only through its table jumps, so the
/// table base each handler's own dispatch reads (set once at entry) is
/// found only along the edges of the tables already resolved.
fn indirect_jumps(
    instructions: &[Instruction],
    indirect: &[u32],
    start: u64,
    end: u64,
    index_of: &IndexOf,
    memory: &dyn Memory,
) -> (Vec<IndirectJump>, Vec<JumpTable>, Vec<usize>) {
    let mut indirect_jumps: Vec<IndirectJump> = indirect
        .iter()
        .map(|&i| IndirectJump {
            ip: instructions[i as usize].ip(),
            instruction: i,
            kind: IndirectJumpKind::Unresolved,
        })
        .collect();
    let mut jump_tables: Vec<JumpTable> = Vec::new();
    if indirect_jumps.is_empty() {
        return (indirect_jumps, jump_tables, Vec::new());
    }
    let mut shaped_unlike_a_table = vec![false; indirect_jumps.len()];
    // Only the slicer reads them: made for functions with indirect jumps.
    let mut sources = BranchSources::of(instructions, index_of);
    let mut pending: Vec<usize> = (0..indirect_jumps.len()).collect();
    while !pending.is_empty() {
        let slicer = jump_tables::Slicer {
            instructions,
            sources: &sources,
        };
        let mut still = Vec::new();
        let mut resolved = Vec::new();
        for k in pending {
            let i = indirect_jumps[k].instruction as usize;
            let insn = &instructions[i];
            let kind = if is_memory_tail_call(insn) {
                IndirectJumpKind::TailCall
            } else {
                match jump_tables::recognise(&slicer, i, start, end, index_of, memory) {
                    Some(Recognised::Table(table)) => {
                        resolved.push((i as u32, table.targets.clone()));
                        jump_tables.push(table);
                        IndirectJumpKind::JumpTable(jump_tables.len() - 1)
                    }
                    Some(Recognised::TailCall) => IndirectJumpKind::TailCall,
                    Some(Recognised::NotTableShaped) => {
                        shaped_unlike_a_table[k] = true;
                        still.push(k);
                        IndirectJumpKind::Unresolved
                    }
                    None => {
                        shaped_unlike_a_table[k] = false;
                        still.push(k);
                        IndirectJumpKind::Unresolved
                    }
                }
            };
            indirect_jumps[k].kind = kind;
        }
        if resolved.is_empty() {
            break;
        }
        for (jump, targets) in resolved {
            for t in targets {
                if let Some(ti) = index_of.get(t) {
                    sources.add(ti, jump);
                }
            }
        }
        pending = still;
    }
    // Table indices in `JumpTable(t)` follow `jump_tables`; trimming only
    // shortens scanned tables.
    jump_tables::trim_overlapping(&mut jump_tables);
    let not_table_shaped = (0..indirect_jumps.len())
        .filter(|&k| {
            shaped_unlike_a_table[k] && indirect_jumps[k].kind == IndirectJumpKind::Unresolved
        })
        .collect();
    (indirect_jumps, jump_tables, not_table_shaped)
}

/// Adds the jump-table targets inside `[start, end)` to the direct
/// `branch_targets` (then sorted, deduplicated), and marks every target
/// instruction a `leader`.
fn add_target_leaders(
    leader: &mut [bool],
    branch_targets: &mut Vec<u64>,
    jump_tables: &[JumpTable],
    index_of: &IndexOf,
    start: u64,
    end: u64,
) {
    for table in jump_tables {
        branch_targets.extend(
            table
                .targets
                .iter()
                .copied()
                .filter(|&t| t >= start && t < end),
        );
    }
    branch_targets.sort_unstable();
    branch_targets.dedup();
    for t in branch_targets.iter() {
        if let Some(i) = index_of.get(*t) {
            leader[i as usize] = true;
        }
    }
}

/// The basic blocks from their leaders (no edges yet), and the block of
/// each instruction: a block at a time, from one leader to the next, its
/// instructions' block numbers written as one run.
fn basic_blocks(instructions: &[Instruction], leader: &[bool]) -> (Vec<BasicBlock>, Vec<u32>) {
    let n = instructions.len();
    let mut blocks: Vec<BasicBlock> = Vec::with_capacity(leader.iter().filter(|&&l| l).count());
    let mut block_of = Vec::with_capacity(n);
    let mut first = 0;
    // Instruction 0 is a leader: each block runs from `first` to the next
    // leader or the end.
    for next in 1..=n {
        if next < n && !leader[next] {
            continue;
        }
        block_of.resize(next, blocks.len() as u32);
        blocks.push(BasicBlock {
            start: instructions[first].ip(),
            end: instructions[next - 1].next_ip(),
            first: first as u32,
            len: (next - first) as u32,
            successors: BlockList::new(),
            predecessors: BlockList::new(),
            terminator: Terminator::FallThrough,
        });
        first = next;
    }
    (blocks, block_of)
}

/// Sets each block's terminator and successors, and its successors'
/// predecessors (blocks in order, so each predecessor list is in order and
/// without duplicates: a block's successors are).
fn link_blocks(
    blocks: &mut [BasicBlock],
    instructions: &[Instruction],
    block_of: &[u32],
    index_of: &IndexOf,
    indirect_jumps: &[IndirectJump],
    jump_tables: &[JumpTable],
) {
    for b in 0..blocks.len() {
        let (terminator, successors) = block_exit(
            &blocks[b],
            instructions,
            block_of,
            index_of,
            indirect_jumps,
            jump_tables,
        );
        for &s in &successors {
            blocks[s as usize].predecessors.push(b as u32);
        }
        blocks[b].terminator = terminator;
        blocks[b].successors = successors;
    }
}

/// How `block` ends and its successors (sorted, without duplicates).
#[inline(always)]
fn block_exit(
    block: &BasicBlock,
    instructions: &[Instruction],
    block_of: &[u32],
    index_of: &IndexOf,
    indirect_jumps: &[IndirectJump],
    jump_tables: &[JumpTable],
) -> (Terminator, BlockList) {
    let block_at = |addr: u64| index_of.get(addr).map(|i| block_of[i as usize]);
    let last = block.last();
    let insn = &instructions[last];
    let next = block_of.get(last + 1).copied();
    let mut succ = BlockList::new();
    if insn.is_invalid() {
        return (Terminator::Invalid, succ);
    }
    // `hlt` (the one code of its mnemonic) stops: a trap without successors.
    if insn.code() == Code::Hlt {
        return (Terminator::Trap, succ);
    }
    let terminator = match insn.flow_control() {
        FlowControl::Next | FlowControl::XbeginXabortXend => {
            push_some(&mut succ, next);
            if next.is_some() {
                Terminator::FallThrough
            } else {
                Terminator::End
            }
        }
        FlowControl::UnconditionalBranch => match block_at(insn.near_branch_target()) {
            Some(t) => {
                succ.push(t);
                Terminator::Jump
            }
            None => Terminator::TailCall,
        },
        FlowControl::ConditionalBranch => {
            let taken = block_at(insn.near_branch_target());
            push_some(&mut succ, taken);
            push_some(&mut succ, next);
            if taken.is_some() {
                Terminator::Conditional
            } else {
                // Into another function, such as GCC's `.cold` part,
                // which may use any register and jump back anywhere.
                Terminator::TailCall
            }
        }
        FlowControl::Call | FlowControl::IndirectCall => {
            push_some(&mut succ, next);
            Terminator::Call
        }
        FlowControl::Return => Terminator::Return,
        FlowControl::IndirectBranch => {
            // The jumps are in instruction order.
            let jump = indirect_jumps.binary_search_by_key(&(last as u32), |j| j.instruction);
            if let Ok(k) = jump
                && let IndirectJumpKind::JumpTable(t) = indirect_jumps[k].kind
            {
                succ.extend(jump_tables[t].targets.iter().filter_map(|&a| block_at(a)));
            }
            Terminator::IndirectJump
        }
        FlowControl::Interrupt | FlowControl::Exception => {
            // `int3`/`ud2` trap; `syscall`/`int 0x80` continue.
            if matches!(insn.mnemonic(), Mnemonic::Syscall | Mnemonic::Int) {
                push_some(&mut succ, next);
                Terminator::FallThrough
            } else {
                Terminator::Trap
            }
        }
    };
    if succ.len() > 1 {
        succ.sort_unstable();
        succ.dedup();
    }
    (terminator, succ)
}

/// Appends `b` to `list` if there is one (an inlined push: `extend` of an
/// `Option` is an out-of-line call per edge).
fn push_some(list: &mut BlockList, b: Option<u32>) {
    if let Some(b) = b {
        list.push(b);
    }
}

/// `jmp [m]` without index: a jump through one pointer slot (GOT entry,
/// vtable slot), i.e. a tail call.
fn is_memory_tail_call(insn: &Instruction) -> bool {
    insn.op0_kind() == OpKind::Memory
        && insn.memory_index() == Register::None
        && insn.code() != Code::INVALID
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::code_asm::*;

    pub(crate) fn assemble(
        build: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>,
    ) -> Vec<u8> {
        let mut a = CodeAssembler::new(64).unwrap();
        build(&mut a).unwrap();
        a.assemble(0x1000).unwrap()
    }

    fn cfg(code: &[u8]) -> FunctionCode {
        FunctionCode::build(
            code,
            0x1000,
            &FlatMemory {
                base: 0x1000,
                bytes: code,
            },
        )
    }

    /// Blocks and their edges as they were made an instruction at a time,
    /// with a map from each table jump to its table and the predecessors
    /// added where not yet listed: the reference for [`basic_blocks`] and
    /// [`link_blocks`].
    fn blocks_by_instruction(code: &FunctionCode, index_of: &IndexOf) -> Vec<BasicBlock> {
        let instructions = &code.instructions;
        let n = instructions.len();
        let mut blocks: Vec<BasicBlock> = Vec::new();
        let mut block_of = vec![0u32; n];
        for i in 0..n {
            if code.block_of[i] as usize == blocks.len() {
                blocks.push(BasicBlock {
                    start: instructions[i].ip(),
                    end: instructions[i].next_ip(),
                    first: i as u32,
                    len: 0,
                    successors: BlockList::new(),
                    predecessors: BlockList::new(),
                    terminator: Terminator::FallThrough,
                });
            }
            let b = blocks.last_mut().unwrap();
            b.len += 1;
            b.end = instructions[i].next_ip();
            block_of[i] = (blocks.len() - 1) as u32;
        }
        assert_eq!(block_of, code.block_of);
        let block_at = |addr: u64| index_of.get(addr).map(|i| block_of[i as usize]);
        let table_of: std::collections::HashMap<u32, usize> = (code.indirect_jumps.iter())
            .filter_map(|j| match j.kind {
                IndirectJumpKind::JumpTable(t) => Some((j.instruction, t)),
                _ => None,
            })
            .collect();
        for block in blocks.iter_mut() {
            let last = block.last();
            let insn = &instructions[last];
            let next = (last + 1 < n).then(|| block_of[last + 1]);
            let mut succ = BlockList::new();
            let terminator = if insn.is_invalid() {
                Terminator::Invalid
            } else {
                match insn.flow_control() {
                    FlowControl::Next | FlowControl::XbeginXabortXend => {
                        succ.extend(next);
                        if next.is_some() {
                            Terminator::FallThrough
                        } else {
                            Terminator::End
                        }
                    }
                    FlowControl::UnconditionalBranch => match block_at(insn.near_branch_target()) {
                        Some(t) => {
                            succ.push(t);
                            Terminator::Jump
                        }
                        None => Terminator::TailCall,
                    },
                    FlowControl::ConditionalBranch => {
                        let taken = block_at(insn.near_branch_target());
                        succ.extend(taken);
                        succ.extend(next);
                        if taken.is_some() {
                            Terminator::Conditional
                        } else {
                            Terminator::TailCall
                        }
                    }
                    FlowControl::Call | FlowControl::IndirectCall => {
                        succ.extend(next);
                        Terminator::Call
                    }
                    FlowControl::Return => Terminator::Return,
                    FlowControl::IndirectBranch => {
                        if let Some(&t) = table_of.get(&(last as u32)) {
                            let targets = code.jump_tables[t].targets.iter();
                            succ.extend(targets.filter_map(|&a| block_at(a)));
                        }
                        Terminator::IndirectJump
                    }
                    FlowControl::Interrupt | FlowControl::Exception => {
                        if matches!(insn.mnemonic(), Mnemonic::Syscall | Mnemonic::Int) {
                            succ.extend(next);
                            Terminator::FallThrough
                        } else {
                            Terminator::Trap
                        }
                    }
                }
            };
            if insn.mnemonic() == Mnemonic::Hlt {
                succ.clear();
            }
            succ.sort_unstable();
            succ.dedup();
            block.terminator = if insn.mnemonic() == Mnemonic::Hlt {
                Terminator::Trap
            } else {
                terminator
            };
            block.successors = succ;
        }
        for b in 0..blocks.len() {
            for k in 0..blocks[b].successors.len() {
                let s = blocks[b].successors[k];
                let preds = &mut blocks[s as usize].predecessors;
                if !preds.contains(&(b as u32)) {
                    preds.push(b as u32);
                }
            }
        }
        blocks
    }

    /// The blocks, terminators and edges of every function of this test
    /// executable are those made an instruction at a time, and `hlt` is
    /// the one code of its mnemonic.
    #[test]
    fn blocks_and_edges_are_those_made_an_instruction_at_a_time() {
        let mut tables = 0;
        for_each_test_function(|code, index_of| {
            assert_eq!(
                code.blocks,
                blocks_by_instruction(code, index_of),
                "function at {:#x}",
                code.start
            );
            tables += code.jump_tables.len();
        });
        assert!(tables > 10, "only {tables} jump tables");
        let halts: Vec<Code> = Code::values()
            .filter(|c| c.mnemonic() == Mnemonic::Hlt)
            .collect();
        assert_eq!(halts, [Code::Hlt]);
    }

    /// [`BranchSources`] gives every instruction of every function of this
    /// test executable the direct branches to it, in address order, as a
    /// hash map of a list per target does; sources added after the sweep
    /// follow them, each once.
    #[test]
    fn branch_sources_are_a_list_per_target() {
        let mut branches = 0;
        for_each_test_function(|code, index_of| {
            let mut reference: HashMap<u32, Vec<u32>> = HashMap::new();
            for (i, insn) in code.instructions.iter().enumerate() {
                if matches!(
                    insn.flow_control(),
                    FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
                ) && let Some(t) = index_of.get(insn.near_branch_target())
                {
                    reference.entry(t).or_default().push(i as u32);
                    branches += 1;
                }
            }
            let mut sources = BranchSources::of(&code.instructions, index_of);
            for t in 0..code.instructions.len() as u32 {
                let expected = reference.get(&t).map_or(&[][..], Vec::as_slice);
                assert_eq!(sources.of_target(t), expected, "{:#x}: {t}", code.start);
            }
            if let Some((&t, swept)) = reference.iter().next() {
                let mut grown = swept.clone();
                grown.push(u32::MAX);
                sources.add(t, swept[0]);
                sources.add(t, u32::MAX);
                sources.add(t, u32::MAX);
                assert_eq!(sources.of_target(t), grown);
            }
        });
        assert!(branches > 10_000, "only {branches} branches");
    }

    /// Calls `visit` with the control flow of every function of this test
    /// executable and the index of its instructions by address.
    fn for_each_test_function(mut visit: impl FnMut(&FunctionCode, &IndexOf)) {
        let binary = crate::binary::Binary::open(std::env::current_exe().unwrap()).unwrap();
        for function in binary.functions() {
            let code = binary.function_code(function);
            let index_of = IndexOf::in_buffer(&code.instructions, code.start, code.end, Vec::new());
            visit(&code, &index_of);
        }
    }

    #[test]
    fn a_conditional_branch_into_another_function_leaves_it() {
        // GCC's `.cold` parts: `js foo.cold` (below the function), which
        // jumps back into the hot part.
        let code = assemble(|a| {
            a.test(rdi, rdi)?;
            a.js(0x800u64)?;
            a.ret()
        });
        let f = cfg(&code);
        assert_eq!(f.blocks[0].terminator, Terminator::TailCall);
        assert_eq!(f.blocks[0].successors.as_slice(), [1]);
        assert_eq!(f.branch_targets, Vec::<u64>::new());
    }

    #[test]
    fn a_branch_over_a_lock_prefix_enters_the_locked_instruction() {
        // glibc's catomic_compare_and_exchange: `je 1f; lock; 1: cmpxchg`.
        let code = [
            0x74, 0x01, // je past the lock prefix
            0xf0, 0x48, 0x0f, 0xb1, 0x19, // lock cmpxchg [rcx], rbx
            0xc3, // ret
        ];
        let f = cfg(&code);
        assert_eq!(f.instructions[0].near_branch_target(), 0x1002);
        assert_eq!(f.branch_targets, vec![0x1002]);
        assert_eq!(f.blocks[0].successors.as_slice(), [1]);
        assert_eq!(crate::rewrite::relocate::unrelocatable(&f), None);

        // A branch into the middle of any other instruction is left alone.
        let code = [
            0x74, 0x01, // je into the middle of the next instruction
            0x48, 0x0f, 0xb1, 0x19, // cmpxchg [rcx], rbx (no lock)
            0xc3, // ret
        ];
        let f = cfg(&code);
        assert_eq!(f.instructions[0].near_branch_target(), 0x1003);
        assert!(crate::rewrite::relocate::unrelocatable(&f).is_some());
    }

    #[test]
    fn loop_with_call_splits_blocks_and_links_edges() {
        let code = assemble(|a| {
            let mut top = a.create_label();
            let mut done = a.create_label();
            a.xor(eax, eax)?;
            a.set_label(&mut top)?;
            a.test(rdi, rdi)?;
            a.je(done)?;
            a.add(rax, qword_ptr(rdi))?;
            a.call(0x5000u64)?;
            a.mov(rdi, qword_ptr(rdi + 8))?;
            a.jmp(top)?;
            a.set_label(&mut done)?;
            a.ret()
        });
        let f = cfg(&code);
        let shape: Vec<(Terminator, Vec<u32>)> = f
            .blocks
            .iter()
            .map(|b| (b.terminator, b.successors.to_vec()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (Terminator::FallThrough, vec![1]),
                (Terminator::Conditional, vec![2, 4]),
                (Terminator::Call, vec![3]),
                (Terminator::Jump, vec![1]),
                (Terminator::Return, vec![]),
            ]
        );
        assert_eq!(f.blocks[1].predecessors[..], [0, 3]);
        assert_eq!(f.calls.len(), 1);
        assert_eq!(f.calls[0].target, Some(0x5000));
        assert_eq!(f.calls[0].return_address, f.blocks[3].start);
        assert_eq!(f.branch_targets, vec![f.blocks[1].start, f.blocks[4].start]);
        let loops = f.loops();
        assert_eq!(loops.loops.len(), 1);
        assert_eq!(loops.loops[0].header, 1);
        assert_eq!(loops.loops[0].blocks, vec![1, 2, 3]);
        assert_eq!(loops.innermost(4), None);
        assert_eq!(loops.innermost(2), Some(0));
    }

    #[test]
    fn tail_calls_and_got_jumps_leave_the_function() {
        let code = assemble(|a| {
            let mut other = a.create_label();
            let mut slot = a.create_label();
            a.test(edi, edi)?;
            a.jne(other)?;
            a.jmp(0x9000u64)?;
            a.set_label(&mut other)?;
            a.jmp(qword_ptr(slot))?;
            a.set_label(&mut slot)?;
            a.int3()
        });
        let f = cfg(&code);
        assert_eq!(f.blocks[0].terminator, Terminator::Conditional);
        assert_eq!(f.blocks[1].terminator, Terminator::TailCall);
        assert_eq!(f.blocks[2].terminator, Terminator::IndirectJump);
        assert_eq!(f.indirect_jumps[0].kind, IndirectJumpKind::TailCall);
        assert_eq!(f.unresolved_indirect_jumps(), 0);
    }

    #[test]
    fn computed_jump_is_a_tail_call_only_once_the_frame_is_gone() {
        let torn_down = assemble(|a| {
            a.push(rbx)?;
            a.mov(rax, rdi)?;
            a.pop(rbx)?;
            a.jmp(rax)
        });
        assert_eq!(
            cfg(&torn_down).indirect_jumps[0].kind,
            IndirectJumpKind::TailCall
        );
        let inside_frame = assemble(|a| {
            a.push(rbx)?;
            a.mov(rax, rdi)?;
            a.jmp(rax)
        });
        let f = cfg(&inside_frame);
        assert_eq!(f.indirect_jumps[0].kind, IndirectJumpKind::Unresolved);
        assert_eq!(f.unresolved_indirect_jumps(), 1);
    }
}
