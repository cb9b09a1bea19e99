//! How values change from one iteration of a loop to the next.
//!
//! For a loop `L`, every variable (register or stack slot) at a program
//! point has a [`Change`]:
//!
//! * **invariant** — the same in every iteration (defined only outside `L`,
//!   or computed inside from invariant inputs; a value loaded inside `L` from
//!   an invariant address that no store in `L` writes counts as invariant:
//!   a pointer re-read from its struct each iteration);
//! * **induction** — changes by an invariant step per iteration: a
//!   loop-carried definition `v = v + step` (`add`/`sub`/`inc`/`dec`/`lea`,
//!   `step` a literal or an invariant register), including through copies,
//!   zero/sign extensions and stack slots, and anything affine in such a
//!   variable (`lea rdx, [rax*4 + rbx]`, `shl`, `imul` by an invariant);
//! * **varying** — anything else, with the instruction that made it so: a
//!   load from a varying address (the value depends on memory contents, as
//!   in `a[idx[i]]` or `p = p->next`), a non-linear operation, a call.
//!
//! The evaluation chases the in-loop reaching definitions of a variable
//! backwards, recursively. A definition that reaches itself around the back
//! edge is the loop-carried (phi) value: if the cycle adds only an
//! invariant step, the definition is an induction update.
//!
//! A query has a budget of steps and answers `Unknown` when it runs out.
//! Values that depend on definitions still being evaluated are not
//! memoised, so a loop whose definitions feed each other along many paths
//! walks the same definitions again and again; such walks are kept and
//! replayed (`Evaluator::replay`) without changing any answer.

use super::frame::{DefKind, Frame, GPRS, Var, gpr_var};
use crate::binary::usage::Usages;
use crate::binary::{FunctionCode, LoopForest};
use foldhash::{HashMap, HashSet, HashSetExt};
use iced_x86::{Instruction, Mnemonic, OpKind, Register};

/// Why a value varies unpredictably from iteration to iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// Loaded (instruction index) from an address that changes.
    Load(u32),
    /// Computed non-linearly (instruction index).
    NonLinear(u32),
    /// Returned by (or clobbered by) a call (instruction index).
    Call(u32),
    /// Not modelled (instruction index): vector registers, partial
    /// overlaps of stack slots, unknown stack layout.
    Unknown(u32),
}

/// The change of a value over iterations of one loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Same every iteration.
    Invariant,
    /// Changes by an invariant step; `update` is the instruction (index)
    /// of the induction variable's loop-carried update.
    Induction {
        /// Instruction index of the update.
        update: u32,
    },
    /// Anything else.
    Varying(Why),
}

/// Internal lattice: [`Change`] plus the values of definitions still being
/// evaluated (the loop-carried value of the definition at stack depth
/// `root`, possibly plus an invariant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Val {
    Inv,
    Ind(u32),
    Phi(u32),
    PhiStep(u32),
    Varying(Why),
}

impl Val {
    /// Either value (a merge of paths, or a conditional move).
    #[inline]
    fn join(self, other: Val) -> Val {
        use Val::*;
        match (self, other) {
            (Varying(w), _) | (_, Varying(w)) => Varying(w),
            (Inv, x) | (x, Inv) => x,
            (Ind(a), Ind(_)) => Ind(a),
            (Phi(a), Phi(b)) => Phi(a.min(b)),
            // A conditional update (`if c { i += 1 }`): still a monotone
            // stream with an invariant step.
            (Phi(a) | PhiStep(a), Phi(b) | PhiStep(b)) => PhiStep(a.min(b)),
            // Another update site of the same cycle, already finished as an
            // induction update (a variable bumped on two paths).
            (Ind(_), Phi(r) | PhiStep(r)) | (Phi(r) | PhiStep(r), Ind(_)) => PhiStep(r),
        }
    }

    #[inline]
    fn add(self, other: Val, at: u32) -> Val {
        use Val::*;
        match (self, other) {
            (Varying(w), _) | (_, Varying(w)) => Varying(w),
            (Inv, x) | (x, Inv) => match x {
                Phi(r) => PhiStep(r),
                x => x,
            },
            (Ind(a), Ind(_)) => Ind(a),
            _ => Varying(Why::NonLinear(at)),
        }
    }

    /// Multiplication by an invariant.
    #[inline]
    fn scale(self, at: u32) -> Val {
        match self {
            Val::Inv | Val::Ind(_) | Val::Varying(_) => self,
            Val::Phi(_) | Val::PhiStep(_) => Val::Varying(Why::NonLinear(at)),
        }
    }

    #[inline]
    fn mul(self, other: Val, at: u32) -> Val {
        match (self, other) {
            (Val::Varying(w), _) | (_, Val::Varying(w)) => Val::Varying(w),
            (x, Val::Inv) | (Val::Inv, x) => x.scale(at),
            _ => Val::Varying(Why::NonLinear(at)),
        }
    }

    /// A function of the inputs that is not affine.
    #[inline]
    fn opaque(self, at: u32) -> Val {
        match self {
            Val::Inv => Val::Inv,
            Val::Varying(w) => Val::Varying(w),
            _ => Val::Varying(Why::NonLinear(at)),
        }
    }

    #[inline]
    fn root(self) -> Option<u32> {
        match self {
            Val::Phi(r) | Val::PhiStep(r) => Some(r),
            _ => None,
        }
    }
}

/// The in-loop definitions of a variable that reach a use.
#[derive(Clone, Copy)]
enum Reaching {
    None,
    One(u32),
    /// Several: `EvaluatorBuffers::entry_sets[from..to]`.
    Many {
        from: u32,
        to: u32,
    },
}

/// Recent answers of `Evaluator::reaching`, direct-mapped by loop, variable
/// and instruction. A query that does not settle walks the same few
/// definitions over and over (up to [`BUDGET`] steps), and each step asks
/// where its inputs were defined: a block scan, then a map lookup, which
/// were most of that time.
#[derive(Default)]
struct ReachingCache {
    /// `(`[`pair`]`(instruction, variable) | generation, loop, answer)`;
    /// an empty slot holds a key no pair of any generation makes.
    slots: Vec<(u64, u32, Reaching)>,
    /// The current generation, in the bits above a [`pair`]'s: an answer
    /// of an earlier one is not found. Forgetting every answer is a new
    /// generation rather than a fill of all slots, which every function
    /// with loops would pay.
    generation: u64,
}

impl ReachingCache {
    const SLOTS: usize = 1024;
    const EMPTY: u64 = u64::MAX;
    /// The lowest bit of the generation ([`pair`]s have 48 bits).
    const GENERATION_ONE: u64 = 1 << 48;
    /// The generation [`ReachingCache::EMPTY`] has: never a current one.
    const GENERATION_OF_EMPTY: u64 = Self::EMPTY & !(Self::GENERATION_ONE - 1);

    fn slot(key: u64, l: u32) -> usize {
        let mixed = (key ^ (u64::from(l) << 48)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (mixed >> (64 - Self::SLOTS.trailing_zeros())) as usize
    }

    fn get(&self, key: u64, l: u32) -> Option<Reaching> {
        let &(k, kl, answer) = self.slots.get(Self::slot(key, l))?;
        (k == key | self.generation && kl == l).then_some(answer)
    }

    /// Forgets every answer, keeping the allocation: a new generation,
    /// and a fill of the slots when the generations wrap round.
    fn clear(&mut self) {
        self.generation += Self::GENERATION_ONE;
        if self.generation == Self::GENERATION_OF_EMPTY {
            self.generation = 0;
            self.slots.fill((Self::EMPTY, 0, Reaching::None));
        }
    }

    fn put(&mut self, key: u64, l: u32, answer: Reaching) {
        debug_assert!(key < Self::GENERATION_ONE, "a pair has 48 bits");
        // Allocated on the first answer: most functions ask nothing.
        if self.slots.is_empty() {
            self.slots = vec![(Self::EMPTY, 0, Reaching::None); Self::SLOTS];
        }
        self.slots[Self::slot(key, l)] = (key | self.generation, l, answer);
    }
}

/// The blocks of a loop by block index: each one's position in
/// `Loop::blocks`, over the range from its first block to its last (a
/// loop's blocks are mostly contiguous).
#[derive(Clone)]
struct LoopIndex {
    first: u32,
    /// Position of block `first + i`, `u32::MAX` when not in the loop.
    positions: Vec<u32>,
}

impl LoopIndex {
    /// The index of a loop's `blocks` (sorted, not empty).
    fn of(blocks: &[u32]) -> LoopIndex {
        let first = blocks.first().copied().unwrap_or(0);
        let last = blocks.last().copied().unwrap_or(0);
        let mut positions = vec![u32::MAX; (last - first) as usize + 1];
        for (k, &b) in blocks.iter().enumerate() {
            positions[(b - first) as usize] = k as u32;
        }
        LoopIndex { first, positions }
    }

    /// The position of block `b` in the loop's blocks, if it is one.
    fn position(&self, b: u32) -> Option<usize> {
        let offset = b.checked_sub(self.first)? as usize;
        self.positions
            .get(offset)
            .filter(|&&k| k != u32::MAX)
            .map(|&k| k as usize)
    }
}

/// A finished walk from a definition below the start of a chain whose
/// value still depends on definitions above it on the chain (`Phi` or
/// `PhiStep` of one of them), kept so that the same walk can be replayed
/// instead of repeated: see [`Evaluator::replay`]. Sets of definitions are
/// bit masks of [`Evaluator::node`]'s per-loop bits.
#[derive(Clone, Copy)]
struct Replay {
    /// The definitions the walk looked for on the chain: those it walked
    /// and those it met there.
    asked: u128,
    /// Those of `asked` that were on the chain above the walk.
    above: u128,
    /// Those of `above` the walk met: its value's root is the shallowest.
    met: u128,
    /// `PhiStep` rather than `Phi`.
    step: bool,
    /// Steps of budget the walk took.
    steps: u32,
    /// How many values `memo` held for the loop.
    memo_count: u32,
    /// How far below its start the walk went.
    reach: u32,
}

/// What a definition's walk in progress has seen so far, for its
/// [`Replay`].
#[derive(Clone, Copy)]
struct WalkFrame {
    asked: u128,
    met: u128,
    /// It asked about a definition without a bit (a loop of more than 128
    /// definitions walked): not replayable.
    untracked: bool,
    /// The budget before its step.
    budget: u32,
    memo_count: u32,
    refusals: u32,
    /// The deepest chain position walked below it.
    reach: u32,
}

/// Replays kept per definition, the oldest dropped first: the contexts a
/// walk meets a definition in are few (4 were too few for a loop shared
/// by coreutils' programs, whose walks then took 8,800 real steps of 20,000
/// instead of 560), and a short list is searched faster than a map.
const REPLAYS_PER_NODE: usize = 64;
/// Definitions per loop that get a bit in the sets of [`Replay`].
const NODE_BITS: u32 = 128;

/// Evaluates value changes within the loops of one function.
pub(crate) struct Evaluator<'a> {
    code: &'a FunctionCode,
    loops: &'a LoopForest,
    frame: &'a Frame,
    /// The maps and lists of the evaluation (see [`EvaluatorBuffers`]).
    bufs: EvaluatorBuffers,
    /// Bounds the work per query on pathological functions.
    budget: u32,
    /// How many times a definition was not walked for lack of budget or
    /// depth (a walk that saw one is not replayable).
    refusals: u32,
    /// The set of `in_progress` definitions that have bits.
    chain_set: u128,
    /// Per bit, the chain position of its definition while it is on the
    /// chain.
    bit_depth: [u32; NODE_BITS as usize],
    /// Whether walks are kept and replayed (off only to test that replays
    /// change no answer).
    replaying: bool,
}

/// Evaluation steps allowed per query before giving up (`Unknown`).
const BUDGET: u32 = 20_000;
/// Longest definition chain followed (bounds the recursion, hence the
/// native stack, on huge unrolled code).
const MAX_DEPTH: usize = 256;

/// The maps and lists of an [`Evaluator`], kept from one function to the
/// next ([`Evaluator::with_buffers`], [`Evaluator::into_buffers`]): made
/// anew for every function with loops, they were a tenth of the
/// classification's instructions (allocating, growing and freeing them).
/// Nothing in them outlives a function but their capacity.
#[derive(Default)]
pub(crate) struct EvaluatorBuffers {
    /// Last definition of each variable a block defines, `(variable,
    /// instruction)`, a block's at `last_defs[range]` for its range in
    /// `last_def_ranges`, listed when the block is first asked about (only
    /// loop blocks are, once a loop's variable is). A map keyed by block
    /// and variable, looked up for every block of a loop and every variable
    /// asked, was a twentieth of the evaluator's instructions.
    last_defs: Vec<(Var, u32)>,
    /// Per block, its range of `last_defs` (`u32::MAX` at the start while
    /// not listed).
    last_def_ranges: Vec<(u32, u32)>,
    /// Per loop (index), once one of its variables is asked for, its range
    /// of `loop_def_list`.
    loop_defs: Vec<Option<(u32, u32)>>,
    /// The last definitions in each block of a loop, `(variable, position
    /// of the block in the loop, instruction)`, in the order of the loop's
    /// blocks, a loop's after the other: one scan of its loop's range finds
    /// a variable's defining blocks, where asking every block of the loop
    /// for every variable was a tenth of the evaluator's instructions (and
    /// sorting the range to search it cost more on loops asked about few
    /// variables).
    loop_def_list: Vec<(Var, u32, u32)>,
    /// Values of definitions, keyed by `(loop, `[`pair`]`(definition,
    /// variable))`.
    memo: HashMap<(u32, u64), Val>,
    /// Per instruction, whether `memo` holds a value it defines: the
    /// definitions a query walks again and again are the unsettled ones,
    /// never stored, and this spares their lookups. Entries past the
    /// function's instructions are false.
    memoised: Vec<bool>,
    /// Per loop, how many values `memo` has stored for it.
    memo_count: Vec<u32>,
    /// Walks from an empty chain that ran out of budget, keyed like `memo`:
    /// `(budget before, memo_count of the loop, value, budget after)`. See
    /// `Evaluator::first_def_val`.
    spent: HashMap<(u32, u64), (u32, u32, Val, u32)>,
    /// See `Evaluator::entry_defs`; keyed by [`pair`]`(loop, variable)`:
    /// where the loop's ranges of `entry_sets` (one per block) start in
    /// `entry_ranges`.
    entry_defs: HashMap<u64, u32>,
    /// The ranges of `entry_defs`, one loop's after the other (a list per
    /// (loop, variable) was an allocation each).
    entry_ranges: Vec<(u32, u32)>,
    /// The sets of `entry_defs`, one after the other.
    entry_sets: Vec<u32>,
    /// Buffers of `Evaluator::entry_defs`, kept from one (loop, variable)
    /// to the next: the definitions by their bit in the blocks' entry
    /// sets `(position of the block in the loop, instruction)`, those
    /// sets.
    entry_defs_by_bit: Vec<(u32, u32)>,
    entry_sets_bits: EntrySets,
    /// Recent answers of `Evaluator::reaching`.
    reaching_cache: ReachingCache,
    /// Per loop (index), once asked for, where its blocks' entries start in
    /// `pred_first`: block `k` of the loop (its position in `Loop::blocks`)
    /// has its in-loop predecessors (positions) at
    /// `pred_list[pred_first[start + k]..pred_first[start + k + 1]]`.
    /// Flat lists: a list per block was most of the evaluator's
    /// allocations.
    loop_preds: Vec<Option<u32>>,
    pred_first: Vec<u32>,
    pred_list: Vec<u32>,
    /// Per loop (index), its blocks' positions, once asked for.
    loop_index: Vec<Option<LoopIndex>>,
    /// The definitions `(instruction, variable)` being evaluated, in the
    /// order of the chain, so each one's depth is its position (each is
    /// there once: a definition met again is the loop-carried value, not
    /// followed).
    in_progress: Vec<(u32, Var)>,
    /// Per instruction, how many entries of `in_progress` it has and the
    /// depth of the latest: a query that does not settle goes round a
    /// cycle of definitions up to [`MAX_DEPTH`] deep, and a scan of the
    /// chain at every step was a fifth of its time. Entries past the
    /// function's instructions are `(0, 0)`.
    on_chain: Vec<(u16, u32)>,
    /// Register lists for `opaque_inputs` to reuse (it recurses: one per
    /// level in use).
    read_lists: Vec<Vec<Register>>,
    /// Per loop, the addressing forms (base, index, scale, displacement)
    /// its instructions store through, once asked for.
    stored_forms: HashMap<u32, HashSet<(Register, Register, u32, u64)>>,
    /// The instructions' register and memory usage (iced's lists are kept,
    /// like the buffers).
    usages: Usages,
    /// Per `(loop, `[`pair`]`(definition, variable))` walked, its node
    /// number: an index of `node_bits` and `replays`.
    nodes: HashMap<(u32, u64), u32>,
    /// Per node, its bit in its loop's sets (`NODE_BITS` or more: none).
    node_bits: Vec<u32>,
    /// Per loop, how many of its nodes have a bit.
    loop_bits: Vec<u32>,
    /// Per node, the walks from it kept for [`Evaluator::replay`]; the
    /// lists past the function's nodes are empty ones kept from earlier
    /// functions, for their allocations.
    replays: Vec<Vec<Replay>>,
    /// The bit of each definition of `in_progress` (`NODE_BITS` or more:
    /// none).
    chain_bits: Vec<u32>,
    /// One per entry of `in_progress`.
    frames: Vec<WalkFrame>,
}

impl EvaluatorBuffers {
    /// Empties everything for a function of `n` instructions, `blocks`
    /// blocks and `loop_count` loops, sizing the per-instruction, per-block
    /// and per-loop lists.
    fn reset(&mut self, n: usize, blocks: usize, loop_count: usize) {
        self.last_defs.clear();
        refill(&mut self.last_def_ranges, blocks, (u32::MAX, 0));
        refill(&mut self.loop_defs, loop_count, None);
        self.loop_def_list.clear();
        // `memoised` is true only for the definitions of `memo`'s keys:
        // those are unset rather than every instruction's entry.
        for &(_, key) in self.memo.keys() {
            self.memoised[(key >> 16) as usize] = false;
        }
        debug_assert!(!self.memoised.contains(&true), "memoised follows memo");
        grow(&mut self.memoised, n, false);
        self.memo.clear();
        refill(&mut self.memo_count, loop_count, 0);
        self.spent.clear();
        self.entry_defs.clear();
        self.entry_ranges.clear();
        self.entry_sets.clear();
        // `entry_defs_by_bit` and `entry_sets_bits`: each use
        // clears what it reads.
        self.reaching_cache.clear();
        refill(&mut self.loop_preds, loop_count, None);
        self.pred_first.clear();
        self.pred_list.clear();
        refill(&mut self.loop_index, loop_count, None);
        // A walk puts back the entry of `on_chain` it changed: with no walk
        // in progress, every entry is `(0, 0)` already.
        debug_assert!(self.in_progress.is_empty(), "no walk in progress");
        self.in_progress.clear();
        debug_assert!(
            self.on_chain.iter().all(|&e| e == (0, 0)),
            "on_chain is empty between walks"
        );
        grow(&mut self.on_chain, n, (0, 0));
        // `read_lists`: each use clears the list it takes.
        self.stored_forms.clear();
        self.nodes.clear();
        self.node_bits.clear();
        refill(&mut self.loop_bits, loop_count, 0);
        // `replays`: each node's list is emptied when the node is given
        // (the lists, allocated for earlier functions' nodes, are kept).
        self.chain_bits.clear();
        self.frames.clear();
    }
}

/// The in-loop definitions of one variable that reach each block's entry
/// in a loop, as bit sets: bit `i` is the `i`-th block (in the loop's
/// order) that defines the variable, standing for its last definition
/// there.
///
/// A block with one predecessor in the loop has that predecessor's own bit
/// (when it defines the variable) or that predecessor's set: only the
/// other blocks, the joins, have sets of their own, iterated to the fixed
/// point, and each block names where its set is
/// ([`EntrySets::source`]). Most blocks have one predecessor, and
/// computing and comparing their sets in every round was most of the
/// sets' work.
#[derive(Default)]
struct EntrySets {
    /// Words per set.
    words: usize,
    /// Per block (position in the loop's blocks), its bit if it defines the
    /// variable, else [`EntrySets::NONE`].
    own: Vec<u32>,
    /// Per block, what its set is: the set of join `j` (`j`; a join's is
    /// its own), bit `b` alone (`b | `[`EntrySets::BIT`]) or nothing
    /// ([`EntrySets::NONE`]).
    source: Vec<u32>,
    /// The joins: the blocks without exactly one predecessor in the loop,
    /// in the loop's order.
    joins: Vec<u32>,
    /// The joins' sets, `words` per block (the other blocks' left empty).
    bits: Vec<u64>,
    /// Per join (in the order of `joins`, one more at the end), where its
    /// inputs from other joins' sets start in `join_inputs`.
    join_input_first: Vec<u32>,
    /// The joins whose sets flow into each join's, other than its own.
    join_inputs: Vec<u32>,
    /// The blocks of the chain of single predecessors being followed.
    chain: Vec<u32>,
}

/// What a block's entry set is: [`EntrySets::source`] decoded.
#[derive(Clone, Copy)]
enum SetSource {
    /// Nothing flows in.
    Empty,
    /// One definition's bit alone.
    Bit(u32),
    /// The set of the join at this position (a join's is its own).
    Join(u32),
}

impl EntrySets {
    const NONE: u32 = u32::MAX;
    /// Marks a [`EntrySets::source`] that is one bit.
    const BIT: u32 = 1 << 31;
    /// The [`EntrySets::source`] of a block not yet followed.
    const UNKNOWN: u32 = u32::MAX - 1;
    /// The [`EntrySets::source`] of a block on the chain being followed.
    const ON_CHAIN: u32 = u32::MAX - 2;

    /// Computes the sets of the `n` blocks, `defining` listing the
    /// positions of those that define the variable (increasing), the in-loop
    /// predecessors (positions) of block `k` being
    /// `pred_list[pred_first[k]..pred_first[k + 1]]`: each block's set is
    /// the union over its predecessors of their own bit, or of their set
    /// when they define nothing, the least such sets (from empty sets, the
    /// joins' sets recomputed until none changes).
    fn solve(
        &mut self,
        n: usize,
        defining: impl Iterator<Item = usize>,
        pred_first: &[u32],
        pred_list: &[u32],
    ) {
        self.own.clear();
        self.own.resize(n, Self::NONE);
        let mut next = 0;
        for k in defining {
            self.own[k] = next;
            next += 1;
        }
        let words = (next as usize).div_ceil(64);
        self.words = words;
        self.bits.clear();
        self.bits.resize(n * words, 0);
        let preds = |k: usize| &pred_list[pred_first[k] as usize..pred_first[k + 1] as usize];
        self.find_sources(preds);
        self.gather_join_inputs(preds);
        let mut changed = !self.join_inputs.is_empty();
        while changed {
            changed = false;
            for (x, &j) in self.joins.iter().enumerate() {
                let from = self.join_input_first[x] as usize;
                let inputs = &self.join_inputs[from..self.join_input_first[x + 1] as usize];
                if inputs.is_empty() {
                    continue;
                }
                let j = j as usize;
                for w in 0..words {
                    let old = self.bits[j * words + w];
                    let set = inputs
                        .iter()
                        .fold(old, |set, &s| set | self.bits[s as usize * words + w]);
                    // The sets only grow from one round to the next (their
                    // inputs do): a set that differs is a larger one.
                    if set != old {
                        self.bits[j * words + w] = set;
                        changed = true;
                    }
                }
            }
        }
    }

    /// Starts each join's set with the bits its predecessors give it
    /// whatever the other sets hold (their own definitions, or the one
    /// definition their chain of single predecessors ends at) and lists the
    /// other joins whose sets flow into it: the rounds then only merge
    /// those sets. Starting from those bits rather than from empty sets
    /// reaches the same least fixed point, as they are in it.
    fn gather_join_inputs<'p>(&mut self, preds: impl Fn(usize) -> &'p [u32]) {
        self.join_input_first.clear();
        self.join_inputs.clear();
        for x in 0..self.joins.len() {
            self.join_input_first.push(self.join_inputs.len() as u32);
            let j = self.joins[x] as usize;
            for &p in preds(j) {
                match self.outflow(p as usize) {
                    SetSource::Empty => {}
                    SetSource::Bit(bit) => {
                        self.bits[j * self.words + bit as usize / 64] |= 1 << (bit % 64);
                    }
                    // A join's own set adds nothing to itself.
                    SetSource::Join(s) if s as usize == j => {}
                    SetSource::Join(s) => self.join_inputs.push(s),
                }
            }
        }
        self.join_input_first.push(self.join_inputs.len() as u32);
    }

    /// Lists the joins and each block's [`EntrySets::source`]: a join's
    /// own set; for a block with one predecessor, that predecessor's bit if
    /// it defines the variable, else its source, followed up the chain of
    /// single predecessors to a join or a definition. A chain that closes
    /// on itself has neither, and nothing flows into it: its sets are
    /// empty.
    fn find_sources<'p>(&mut self, preds: impl Fn(usize) -> &'p [u32]) {
        let n = self.own.len();
        self.joins.clear();
        self.source.clear();
        self.source.resize(n, Self::UNKNOWN);
        for k in 0..n {
            if preds(k).len() != 1 {
                self.joins.push(k as u32);
                self.source[k] = k as u32;
            }
        }
        for k in 0..n {
            if self.source[k] != Self::UNKNOWN {
                continue;
            }
            self.chain.clear();
            let mut x = k;
            let found = loop {
                match self.source[x] {
                    Self::UNKNOWN => {
                        self.source[x] = Self::ON_CHAIN;
                        self.chain.push(x as u32);
                        let p = preds(x)[0] as usize;
                        if self.own[p] != Self::NONE {
                            break self.own[p] | Self::BIT;
                        }
                        x = p;
                    }
                    Self::ON_CHAIN => break Self::NONE,
                    known => break known,
                }
            };
            for &y in &self.chain {
                self.source[y as usize] = found;
            }
        }
    }

    /// Decodes a packed [`EntrySets::source`] (kept packed in one `u32`
    /// a block, which the rounds over the joins read).
    fn decode(source: u32) -> SetSource {
        match source {
            Self::NONE => SetSource::Empty,
            s if s & Self::BIT != 0 => SetSource::Bit(s & !Self::BIT),
            j => SetSource::Join(j),
        }
    }

    /// What block `k`'s set is.
    fn source_of(&self, k: usize) -> SetSource {
        Self::decode(self.source[k])
    }

    /// What flows from block `p` into its successors' sets: its own bit
    /// when it defines the variable, else its set.
    fn outflow(&self, p: usize) -> SetSource {
        match self.own[p] {
            Self::NONE => self.source_of(p),
            bit => SetSource::Bit(bit),
        }
    }

    /// The bits of block `k`'s set, in increasing order.
    fn members(&self, k: usize) -> impl Iterator<Item = usize> + '_ {
        let (single, set) = match self.source_of(k) {
            SetSource::Empty => (None, &self.bits[..0]),
            SetSource::Bit(bit) => (Some(bit as usize), &self.bits[..0]),
            SetSource::Join(j) => {
                let j = j as usize;
                (None, &self.bits[j * self.words..(j + 1) * self.words])
            }
        };
        single.into_iter().chain(
            set.iter()
                .enumerate()
                .flat_map(|(w, &word)| bits_of(u128::from(word)).map(move |b| w * 64 + b as usize)),
        )
    }
}

/// Empties `v`, then fills it with `n` copies of `x`.
fn refill<T: Clone>(v: &mut Vec<T>, n: usize, x: T) {
    v.clear();
    v.resize(n, x);
}

/// Lengthens `v` to at least `n` entries with copies of `x` (a list whose
/// entries are all `x` again between uses).
fn grow<T: Clone>(v: &mut Vec<T>, n: usize, x: T) {
    if v.len() < n {
        v.resize(n, x);
    }
}

impl<'a> Evaluator<'a> {
    /// Prepares the evaluator.
    #[cfg(test)]
    pub fn new(code: &'a FunctionCode, loops: &'a LoopForest, frame: &'a Frame) -> Evaluator<'a> {
        Evaluator::with_buffers(code, loops, frame, EvaluatorBuffers::default())
    }

    /// Prepares the evaluator in the allocations of `buffers` (from
    /// [`Evaluator::into_buffers`] or new): the same evaluator as with new
    /// ones, whatever they held.
    pub fn with_buffers(
        code: &'a FunctionCode,
        loops: &'a LoopForest,
        frame: &'a Frame,
        mut bufs: EvaluatorBuffers,
    ) -> Evaluator<'a> {
        bufs.reset(
            code.instructions.len(),
            code.blocks.len(),
            loops.loops.len(),
        );
        Evaluator {
            code,
            loops,
            frame,
            bufs,
            budget: BUDGET,
            refusals: 0,
            chain_set: 0,
            bit_depth: [0; NODE_BITS as usize],
            replaying: true,
        }
    }

    /// The evaluator's allocations, for the next function's.
    pub fn into_buffers(self) -> EvaluatorBuffers {
        self.bufs
    }

    /// The same evaluator, repeating every walk instead of replaying it
    /// (to test that replays change no answer).
    #[cfg(test)]
    pub(crate) fn without_replays(mut self) -> Evaluator<'a> {
        self.replaying = false;
        self
    }

    /// The budget the last query left.
    #[cfg(test)]
    pub(crate) fn budget_left(&self) -> u32 {
        self.budget
    }

    /// The in-loop definitions of `v` reaching the entry of each block of
    /// loop `l` (in `Loop::blocks` order), as `reaching` finds them (to
    /// test them against a search of the control flow).
    #[cfg(test)]
    pub(crate) fn entry_definitions(&mut self, l: u32, v: Var) -> Vec<Vec<u32>> {
        let ranges = self.entry_defs(l, v).to_vec();
        ranges
            .iter()
            .map(|&(from, to)| self.bufs.entry_sets[from as usize..to as usize].to_vec())
            .collect()
    }

    /// The change of register `reg` just before instruction `at`, over
    /// iterations of loop `l`.
    pub fn register(&mut self, l: u32, reg: Register, at: usize) -> Change {
        self.budget = BUDGET;
        let v = self.reg_val(l, reg, at);
        finish(v, at)
    }

    /// The position in loop `l`'s blocks of block `b`, if it is one (an
    /// index per loop, built on first use: the evaluation asks this at
    /// every definition it follows, and a search of the loop's block list
    /// was most of its time on large loops).
    fn loop_position(&mut self, l: u32, b: u32) -> Option<usize> {
        let blocks = &self.loops.loops[l as usize].blocks;
        self.bufs.loop_index[l as usize]
            .get_or_insert_with(|| LoopIndex::of(blocks))
            .position(b)
    }

    /// Whether instruction `i` lies in loop `l`.
    fn in_loop(&mut self, l: u32, i: usize) -> bool {
        self.loop_position(l, self.code.block_of[i]).is_some()
    }

    /// In-loop definitions of `v` that reach instruction `at`: the last one
    /// before it in its block, else those reaching the block's entry.
    fn reaching(&mut self, l: u32, v: Var, at: usize) -> Reaching {
        let key = pair(at as u32, v);
        if let Some(answer) = self.bufs.reaching_cache.get(key, l) {
            return answer;
        }
        let answer = self.find_reaching(l, v, at);
        self.bufs.reaching_cache.put(key, l, answer);
        answer
    }

    /// [`Evaluator::reaching`], not cached.
    fn find_reaching(&mut self, l: u32, v: Var, at: usize) -> Reaching {
        let b = self.code.block_of[at];
        let block = &self.code.blocks[b as usize];
        for i in (block.first as usize..at).rev() {
            if self.frame.def_kind(i, v).is_some() {
                return Reaching::One(i as u32);
            }
        }
        let k = self.loop_position(l, b).expect("query inside the loop");
        let (from, to) = self.entry_defs(l, v)[k];
        match to - from {
            0 => Reaching::None,
            1 => Reaching::One(self.bufs.entry_sets[from as usize]),
            _ => Reaching::Many { from, to },
        }
    }

    /// For each block of loop `l` (in `Loop::blocks` order), the in-loop
    /// definitions of `v` that reach its entry: a forward data-flow pass
    /// over the loop, computed once per (loop, variable).
    fn entry_defs(&mut self, l: u32, v: Var) -> &[(u32, u32)] {
        let n = self.loops.loops[l as usize].blocks.len();
        let start = match self.bufs.entry_defs.get(&pair(l, v)) {
            Some(&start) => start as usize,
            None => self.find_entry_defs(l, v),
        };
        &self.bufs.entry_ranges[start..start + n]
    }

    /// [`Evaluator::entry_defs`], not yet known: appends the loop's ranges
    /// to `entry_ranges` and returns where they start.
    ///
    /// Each block that defines `v` gives its last definition a bit, in the
    /// order of the loop's blocks (address order, so the bits' order is the
    /// definitions'); a block's entry set is then the union of its in-loop
    /// predecessors' bits (their own definition's, or their entry set when
    /// they define nothing), iterated from empty sets to the least fixed
    /// point. Sets of definitions as sorted lists, merged and deduplicated
    /// per block and round, were half of the evaluator's instructions.
    fn find_entry_defs(&mut self, l: u32, v: Var) -> usize {
        let n = self.loops.loops[l as usize].blocks.len();
        let (from, to) = self.loop_defs_of(l);
        let mut by_bit = std::mem::take(&mut self.bufs.entry_defs_by_bit);
        by_bit.clear();
        by_bit.extend(
            self.bufs.loop_def_list[from..to]
                .iter()
                .filter(|&&(w, _, _)| w == v)
                .map(|&(_, k, i)| (k, i)),
        );
        let start = self.bufs.entry_ranges.len();
        if by_bit.is_empty() {
            // Defined nowhere in the loop: every set is empty.
            let at = self.bufs.entry_sets.len() as u32;
            self.bufs
                .entry_ranges
                .extend(std::iter::repeat_n((at, at), n));
        } else if let [(_, only)] = by_bit[..] {
            // Defined in one block: a natural loop's blocks all reach each
            // other inside it (each reaches a latch, the header every
            // block), and no other definition stops the one, so it reaches
            // every block's entry; one shared set, without solving.
            let at = self.bufs.entry_sets.len() as u32;
            self.bufs.entry_sets.push(only);
            self.bufs
                .entry_ranges
                .extend(std::iter::repeat_n((at, at + 1), n));
        } else {
            // Predecessors inside the loop, as positions: the same for every
            // variable of the loop.
            let preds_at = self.loop_preds_of(l);
            let mut sets = std::mem::take(&mut self.bufs.entry_sets_bits);
            sets.solve(
                n,
                by_bit.iter().map(|&(k, _)| k as usize),
                &self.bufs.pred_first[preds_at..=preds_at + n],
                &self.bufs.pred_list,
            );
            // The joins' sets first: a block whose set is a join's shares
            // its range.
            self.bufs.entry_ranges.resize(start + n, (0, 0));
            for &j in &sets.joins {
                let from = self.bufs.entry_sets.len() as u32;
                self.bufs
                    .entry_sets
                    .extend(sets.members(j as usize).map(|bit| by_bit[bit].1));
                debug_assert!(
                    self.bufs.entry_sets[from as usize..].is_sorted(),
                    "a loop's blocks are in address order"
                );
                self.bufs.entry_ranges[start + j as usize] =
                    (from, self.bufs.entry_sets.len() as u32);
            }
            for k in 0..n {
                let at = self.bufs.entry_sets.len() as u32;
                self.bufs.entry_ranges[start + k] = match sets.source_of(k) {
                    SetSource::Join(j) if j as usize == k => continue,
                    SetSource::Empty => (at, at),
                    SetSource::Bit(bit) => {
                        self.bufs.entry_sets.push(by_bit[bit as usize].1);
                        (at, at + 1)
                    }
                    SetSource::Join(j) => self.bufs.entry_ranges[start + j as usize],
                };
            }
            self.bufs.entry_sets_bits = sets;
        }
        self.bufs.entry_defs.insert(pair(l, v), start as u32);
        self.bufs.entry_defs_by_bit = by_bit;
        start
    }

    /// Where loop `l`'s blocks' entries start in `pred_first` (see
    /// [`EvaluatorBuffers::loop_preds`]), listed on first use.
    fn loop_preds_of(&mut self, l: u32) -> usize {
        if let Some(start) = self.bufs.loop_preds[l as usize] {
            return start as usize;
        }
        let lp = &self.loops.loops[l as usize];
        let bufs = &mut self.bufs;
        let start = bufs.pred_first.len();
        for &b in &lp.blocks {
            bufs.pred_first.push(bufs.pred_list.len() as u32);
            bufs.pred_list.extend(
                self.code.blocks[b as usize]
                    .predecessors
                    .iter()
                    .filter_map(|p| lp.blocks.binary_search(p).ok())
                    .map(|k| k as u32),
            );
        }
        bufs.pred_first.push(bufs.pred_list.len() as u32);
        bufs.loop_preds[l as usize] = Some(start as u32);
        start
    }

    /// Loop `l`'s range of `loop_def_list` (see
    /// [`EvaluatorBuffers::loop_def_list`]), listed on first use.
    fn loop_defs_of(&mut self, l: u32) -> (usize, usize) {
        if let Some((from, to)) = self.bufs.loop_defs[l as usize] {
            return (from as usize, to as usize);
        }
        let from = self.bufs.loop_def_list.len();
        for (k, &b) in self.loops.loops[l as usize].blocks.iter().enumerate() {
            let (mut first, mut end) = self.bufs.last_def_ranges[b as usize];
            if first == u32::MAX {
                (first, end) = self.list_last_defs(b);
            }
            let bufs = &mut self.bufs;
            bufs.loop_def_list.extend(
                bufs.last_defs[first as usize..end as usize]
                    .iter()
                    .map(|&(v, i)| (v, k as u32, i)),
            );
        }
        let to = self.bufs.loop_def_list.len();
        self.bufs.loop_defs[l as usize] = Some((from as u32, to as u32));
        (from, to)
    }

    /// Lists the last definition of each variable block `b` defines in
    /// `last_defs` (in the order of their first definitions) and returns
    /// the block's entry of `last_def_ranges`.
    fn list_last_defs(&mut self, b: u32) -> (u32, u32) {
        let from = self.bufs.last_defs.len();
        for i in self.code.blocks[b as usize].instructions() {
            for &(v, _) in self.frame.defs(i) {
                match self.bufs.last_defs[from..]
                    .iter_mut()
                    .find(|(w, _)| *w == v)
                {
                    Some(last) => last.1 = i as u32,
                    None => self.bufs.last_defs.push((v, i as u32)),
                }
            }
        }
        let entry = (from as u32, self.bufs.last_defs.len() as u32);
        self.bufs.last_def_ranges[b as usize] = entry;
        entry
    }

    fn var_val(&mut self, l: u32, v: Var, at: usize) -> Val {
        match self.reaching(l, v, at) {
            Reaching::None => Val::Inv,
            Reaching::One(d) => Val::Inv.join(self.def_val(l, d, v)),
            Reaching::Many { from, to } => {
                let mut acc = Val::Inv;
                for k in from..to {
                    let d = self.bufs.entry_sets[k as usize];
                    acc = acc.join(self.def_val(l, d, v));
                    if matches!(acc, Val::Varying(_)) {
                        break;
                    }
                }
                acc
            }
        }
    }

    fn reg_val(&mut self, l: u32, reg: Register, at: usize) -> Val {
        if self.frame.is_invariant_register(reg) {
            return Val::Inv;
        }
        match gpr_var(reg) {
            Some(v) => self.var_val(l, v, at),
            // Vector or other registers: not followed.
            None => Val::Varying(Why::Unknown(at as u32)),
        }
    }

    fn def_val(&mut self, l: u32, d: u32, v: Var) -> Val {
        if self.bufs.memoised[d as usize]
            && let Some(&val) = self.bufs.memo.get(&(l, pair(d, v)))
        {
            return val;
        }
        if let Some(depth) = self.chain_depth(d, v) {
            self.note_met(depth);
            return Val::Phi(depth);
        }
        if self.budget == 0 || self.bufs.in_progress.len() >= MAX_DEPTH {
            self.refusals += 1;
            return Val::Varying(Why::Unknown(d));
        }
        let node = self.node(l, d, v);
        if self.bufs.in_progress.is_empty() {
            self.first_def_val(l, d, v, node)
        } else if let Some(val) = self.replay(l, node) {
            val
        } else {
            self.walk_def(l, d, v, node)
        }
    }

    /// The node number of definition `(d, v)` in loop `l`, given on first
    /// use, with a bit in the loop's sets while the loop has bits left.
    fn node(&mut self, l: u32, d: u32, v: Var) -> u32 {
        let next = self.bufs.node_bits.len() as u32;
        let node = *self.bufs.nodes.entry((l, pair(d, v))).or_insert(next);
        if node == next {
            let bits = &mut self.bufs.loop_bits[l as usize];
            self.bufs.node_bits.push(*bits);
            *bits = (*bits + 1).min(NODE_BITS);
            match self.bufs.replays.get_mut(node as usize) {
                Some(kept) => kept.clear(),
                None => self.bufs.replays.push(Vec::new()),
            }
        }
        node
    }

    /// Notes in the innermost walk that it met the definition at chain
    /// position `depth`.
    fn note_met(&mut self, depth: u32) {
        let bit = self.bufs.chain_bits[depth as usize];
        let frame = self
            .bufs
            .frames
            .last_mut()
            .expect("a definition on the chain is being walked");
        match mask(bit) {
            Some(m) => {
                frame.asked |= m;
                frame.met |= m;
            }
            None => frame.untracked = true,
        }
    }

    /// The value of a walk from `node`, below the start of the chain, when a
    /// kept [`Replay`] says what it is; the budget is charged its steps.
    ///
    /// A walk is a function of the definitions it looks for on the chain,
    /// whether each is there, the values `memo` holds for the loop, the
    /// budget and how deep it starts, and of nothing else: `reaching` and
    /// the other maps are caches, and the positions of the definitions it
    /// meets on the chain only become its value's root. A replayable walk
    /// stored nothing in `memo` (it ended below its root), refused nothing
    /// and met definitions above it, so its value is `Phi`/`PhiStep` of the
    /// shallowest of those. Asked again with the same definitions of
    /// `asked` on the chain, the same `memo` and at least its steps of
    /// budget left, the walk would ask the same questions in the same order
    /// and get the same answers, whatever else the chain holds: it would
    /// walk the same definitions, take the same steps and return the same
    /// value, with the root at the shallowest position of `met` now. So a
    /// replay leaves the evaluator as the walk would, budget included, and
    /// a query that runs out of budget runs out at the same definition and
    /// answers the same, having walked only the parts not seen before.
    fn replay(&mut self, l: u32, node: u32) -> Option<Val> {
        if !self.replaying {
            return None;
        }
        let depth = self.bufs.in_progress.len() as u32;
        let memo_count = self.bufs.memo_count[l as usize];
        let chain = self.chain_set;
        let budget = self.budget;
        // Kept in the order they were made, so by `memo_count`, which only
        // grows: those made with fewer values stored, which can never match
        // again, come first and are passed over, and the rest were made
        // with as many as now.
        let kept = &self.bufs.replays[node as usize];
        let live = kept.partition_point(|r| r.memo_count < memo_count);
        let kept = kept[live..].iter().find(|r| {
            debug_assert_eq!(r.memo_count, memo_count, "no replay is from later");
            r.steps <= budget && chain & r.asked == r.above && (depth + r.reach) < MAX_DEPTH as u32
        })?;
        let kept = *kept;
        self.budget -= kept.steps;
        let root = bits_of(kept.met)
            .map(|bit| self.bit_depth[bit as usize])
            .min()
            .expect("a replayable walk met the chain above it");
        let frame = self
            .bufs
            .frames
            .last_mut()
            .expect("a replay is below a walk");
        frame.asked |= kept.asked;
        frame.met |= kept.met;
        frame.reach = frame.reach.max(depth + kept.reach);
        Some(if kept.step {
            Val::PhiStep(root)
        } else {
            Val::Phi(root)
        })
    }

    /// [`Evaluator::def_val`] at the start of a chain. Such a walk is a
    /// function of the definition, the budget left and the values `memo`
    /// holds for the loop (the other maps are caches): one that ran out of
    /// budget without storing a value is replayed from `spent` when asked
    /// again in the same state. The loads of one loop often start from the
    /// same definitions (gzip's walks that run out of budget do).
    fn first_def_val(&mut self, l: u32, d: u32, v: Var, node: u32) -> Val {
        let key = (l, pair(d, v));
        let (budget, stored) = (self.budget, self.bufs.memo_count[l as usize]);
        if let Some(&(before, count, val, after)) = self.bufs.spent.get(&key)
            && (before, count) == (budget, stored)
        {
            self.budget = after;
            return val;
        }
        let val = self.walk_def(l, d, v, node);
        if self.budget == 0 && self.bufs.memo_count[l as usize] == stored {
            self.bufs
                .spent
                .insert(key, (budget, stored, val, self.budget));
        }
        val
    }

    /// [`Evaluator::def_val`] of a definition neither stored nor on the
    /// chain, with budget left.
    fn walk_def(&mut self, l: u32, d: u32, v: Var, node: u32) -> Val {
        let bit = self.bufs.node_bits[node as usize];
        let depth = self.bufs.in_progress.len() as u32;
        self.bufs.frames.push(WalkFrame {
            asked: mask(bit).unwrap_or(0),
            met: 0,
            untracked: bit >= NODE_BITS,
            budget: self.budget,
            memo_count: self.bufs.memo_count[l as usize],
            refusals: self.refusals,
            reach: depth,
        });
        self.budget -= 1;
        self.bufs.in_progress.push((d, v));
        self.bufs.chain_bits.push(bit);
        if let Some(m) = mask(bit) {
            self.chain_set |= m;
            self.bit_depth[bit as usize] = depth;
        }
        let outer = self.bufs.on_chain[d as usize];
        self.bufs.on_chain[d as usize] = (outer.0 + 1, depth);
        let raw = self.semantics(l, d as usize, v);
        self.bufs.on_chain[d as usize] = outer;
        self.bufs.in_progress.pop();
        self.bufs.chain_bits.pop();
        self.chain_set &= !mask(bit).unwrap_or(0);
        let frame = self.close_frame(bit);
        let val = match raw.root() {
            Some(r) if r == depth => match raw {
                Val::Phi(_) => Val::Inv,
                _ => Val::Ind(d),
            },
            Some(_) => {
                self.keep_replay(l, node, &frame, raw);
                return raw;
            }
            None => raw,
        };
        if matches!(val, Val::Varying(Why::Unknown(_))) && self.budget == 0 {
            return val;
        }
        self.bufs.memo.insert((l, pair(d, v)), val);
        self.bufs.memoised[d as usize] = true;
        self.bufs.memo_count[l as usize] += 1;
        val
    }

    /// Ends the innermost walk's frame (of the definition with bit `bit`,
    /// just taken off the chain) and adds what it saw to the walk above.
    fn close_frame(&mut self, bit: u32) -> WalkFrame {
        let mut frame = self.bufs.frames.pop().expect("one frame per walk");
        frame.met &= !mask(bit).unwrap_or(0);
        if let Some(outer) = self.bufs.frames.last_mut() {
            outer.asked |= frame.asked;
            outer.met |= frame.met;
            outer.untracked |= frame.untracked;
            outer.reach = outer.reach.max(frame.reach);
        }
        frame
    }

    /// Keeps the walk of `node` that just ended with `val`, rooted above
    /// it, for [`Evaluator::replay`] if it is replayable: it stored no
    /// value, refused nothing and asked only about definitions with bits.
    fn keep_replay(&mut self, l: u32, node: u32, frame: &WalkFrame, val: Val) {
        if !self.replaying
            || frame.untracked
            || frame.refusals != self.refusals
            || frame.memo_count != self.bufs.memo_count[l as usize]
        {
            return;
        }
        let depth = self.bufs.in_progress.len() as u32;
        debug_assert_eq!(
            val.root(),
            bits_of(frame.met)
                .map(|bit| self.bit_depth[bit as usize])
                .min(),
            "a replayable walk's root is the shallowest definition it met"
        );
        let replay = Replay {
            asked: frame.asked,
            above: frame.asked & self.chain_set,
            met: frame.met,
            step: matches!(val, Val::PhiStep(_)),
            steps: frame.budget - self.budget,
            memo_count: frame.memo_count,
            reach: frame.reach - depth,
        };
        let kept = &mut self.bufs.replays[node as usize];
        debug_assert!(
            kept.last()
                .is_none_or(|r| r.memo_count <= replay.memo_count),
            "a node's replays are kept in the order of their memo_count"
        );
        if kept.len() == REPLAYS_PER_NODE {
            kept.remove(0);
        }
        kept.push(replay);
    }

    /// The depth of definition `(d, v)` in `in_progress`, if it is there.
    fn chain_depth(&self, d: u32, v: Var) -> Option<u32> {
        let (count, latest) = self.bufs.on_chain[d as usize];
        match count {
            0 => None,
            _ if self.bufs.in_progress.get(latest as usize) == Some(&(d, v)) => Some(latest),
            1 => None,
            // Another variable of the same instruction is the latest.
            _ => self
                .bufs
                .in_progress
                .iter()
                .position(|&p| p == (d, v))
                .map(|k| k as u32),
        }
    }

    /// The value a memory operand of instruction `at` reads.
    fn load_val(&mut self, l: u32, at: usize, insn: &Instruction) -> Val {
        if let Some(slot) = self.frame.operand_slot(at, insn) {
            return self.var_val(l, slot, at);
        }
        if insn.is_vsib() {
            return Val::Varying(Why::Load(at as u32));
        }
        match self.address_val(l, at, insn) {
            Val::Inv if !self.stored_in_loop(l, insn) => Val::Inv,
            _ => Val::Varying(Why::Load(at as u32)),
        }
    }

    fn address_val(&mut self, l: u32, at: usize, insn: &Instruction) -> Val {
        let base = match insn.memory_base() {
            Register::RIP | Register::None => Val::Inv,
            b => self.reg_val(l, b, at),
        };
        let index = match insn.memory_index() {
            Register::None => Val::Inv,
            i => self.reg_val(l, i, at).scale(at as u32),
        };
        base.add(index, at as u32)
    }

    /// Whether loop `l` stores through the same addressing form as the
    /// memory operand of `insn` (so a reload may see a new value).
    fn stored_in_loop(&mut self, l: u32, insn: &Instruction) -> bool {
        let form = (
            insn.memory_base(),
            insn.memory_index(),
            insn.memory_index_scale(),
            insn.memory_displacement64(),
        );
        if !self.bufs.stored_forms.contains_key(&l) {
            let mut forms = HashSet::new();
            for &b in &self.loops.loops[l as usize].blocks {
                for i in self.code.blocks[b as usize].instructions() {
                    let x = &self.code.instructions[i];
                    for m in self.bufs.usages.of(x).1 {
                        if matches!(
                            m.access(),
                            iced_x86::OpAccess::Write
                                | iced_x86::OpAccess::ReadWrite
                                | iced_x86::OpAccess::CondWrite
                                | iced_x86::OpAccess::ReadCondWrite
                        ) {
                            forms.insert((m.base(), m.index(), m.scale(), m.displacement()));
                        }
                    }
                }
            }
            self.bufs.stored_forms.insert(l, forms);
        }
        self.bufs.stored_forms[&l].contains(&form)
    }

    /// The value instruction `at` gives variable `v`.
    fn semantics(&mut self, l: u32, at: usize, v: Var) -> Val {
        let code = self.code;
        let insn = &code.instructions[at];
        let a = at as u32;
        if !self.in_loop(l, at) {
            return Val::Inv;
        }
        match self.frame.def_kind(at, v) {
            Some(DefKind::CallClobber) => return Val::Varying(Why::Call(a)),
            Some(DefKind::Clobber) | None => return Val::Varying(Why::Unknown(a)),
            Some(DefKind::Value) => {}
        }
        if v >= GPRS {
            return self.slot_semantics(l, at, v, insn);
        }
        let dst_is_v = insn.op_count() > 0
            && insn.op0_kind() == OpKind::Register
            && gpr_var(insn.op0_register()) == Some(v);
        let partial = dst_is_v && insn.op0_register().size() < 4;
        let src = |this: &mut Self| -> Val {
            match insn.op1_kind() {
                OpKind::Register => this.reg_val(l, insn.op1_register(), at),
                OpKind::Memory => this.load_val(l, at, insn),
                _ => Val::Inv,
            }
        };
        match insn.mnemonic() {
            Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd if dst_is_v => {
                let s = src(self);
                if partial {
                    self.reg_val(l, insn.op0_register(), at).join(s).opaque(a)
                } else {
                    s
                }
            }
            Mnemonic::Cdqe | Mnemonic::Cwde | Mnemonic::Cbw => self.reg_val(l, Register::RAX, at),
            Mnemonic::Lea if dst_is_v => {
                if insn.memory_base() == Register::RIP {
                    Val::Inv
                } else {
                    self.address_val(l, at, insn)
                }
            }
            Mnemonic::Add | Mnemonic::Sub if dst_is_v => {
                if insn.mnemonic() == Mnemonic::Sub
                    && insn.op1_kind() == OpKind::Register
                    && insn.op1_register() == insn.op0_register()
                {
                    Val::Inv
                } else {
                    let d = self.reg_val(l, insn.op0_register(), at);
                    let s = src(self);
                    d.add(s, a)
                }
            }
            Mnemonic::Inc | Mnemonic::Dec if dst_is_v => {
                self.reg_val(l, insn.op0_register(), at).add(Val::Inv, a)
            }
            Mnemonic::Neg if dst_is_v => self.reg_val(l, insn.op0_register(), at).scale(a),
            Mnemonic::Imul if dst_is_v && insn.op_count() == 3 => src(self).scale(a),
            Mnemonic::Imul if dst_is_v && insn.op_count() == 2 => {
                let d = self.reg_val(l, insn.op0_register(), at);
                let s = src(self);
                d.mul(s, a)
            }
            Mnemonic::Shl | Mnemonic::Sal | Mnemonic::Shr | Mnemonic::Sar if dst_is_v => {
                let count = match insn.op1_kind() {
                    OpKind::Register => self.reg_val(l, insn.op1_register(), at),
                    _ => Val::Inv,
                };
                let d = self.reg_val(l, insn.op0_register(), at);
                if count == Val::Inv {
                    d.scale(a)
                } else {
                    d.join(count).opaque(a)
                }
            }
            Mnemonic::And if dst_is_v && is_extension_mask(insn) => {
                self.reg_val(l, insn.op0_register(), at)
            }
            Mnemonic::Xor
                if dst_is_v
                    && insn.op1_kind() == OpKind::Register
                    && insn.op1_register() == insn.op0_register() =>
            {
                Val::Inv
            }
            Mnemonic::Xchg => {
                // Each operand receives the other's value.
                let other = if dst_is_v { 1 } else { 0 };
                match insn.op_kind(other) {
                    OpKind::Register => self.reg_val(l, insn.op_register(other), at),
                    _ => self.load_val(l, at, insn),
                }
            }
            m if is_cmov(m) && dst_is_v => {
                let d = self.reg_val(l, insn.op0_register(), at);
                let s = src(self);
                d.join(s)
            }
            Mnemonic::Pop => match self.frame.rsp_delta[at].and_then(|d| self.frame.slot_var(d)) {
                Some(slot) => self.var_val(l, slot, at),
                None => Val::Varying(Why::Unknown(a)),
            },
            _ => self.opaque_inputs(l, at, insn),
        }
    }

    /// A store to a stack slot.
    fn slot_semantics(&mut self, l: u32, at: usize, v: Var, insn: &Instruction) -> Val {
        let a = at as u32;
        match insn.mnemonic() {
            Mnemonic::Mov if insn.op0_kind() == OpKind::Memory => match insn.op1_kind() {
                OpKind::Register => self.reg_val(l, insn.op1_register(), at),
                _ => Val::Inv,
            },
            Mnemonic::Push => match insn.op0_kind() {
                OpKind::Register => self.reg_val(l, insn.op0_register(), at),
                OpKind::Memory => self.load_val(l, at, insn),
                _ => Val::Inv,
            },
            Mnemonic::Add | Mnemonic::Sub if insn.op0_kind() == OpKind::Memory => {
                let old = self.var_val(l, v, at);
                let s = match insn.op1_kind() {
                    OpKind::Register => self.reg_val(l, insn.op1_register(), at),
                    _ => Val::Inv,
                };
                old.add(s, a)
            }
            Mnemonic::Inc | Mnemonic::Dec if insn.op0_kind() == OpKind::Memory => {
                self.var_val(l, v, at).add(Val::Inv, a)
            }
            // A register stored through another mnemonic (`movq [m], xmm`,
            // `setcc [m]`, …): a function of the inputs, like any other.
            _ if insn.op0_kind() == OpKind::Memory => self.opaque_inputs(l, at, insn),
            _ => Val::Varying(Why::Unknown(a)),
        }
    }

    /// Inputs that are all invariant give an invariant; anything else is
    /// non-linear. Flags are not followed: an instruction reading them
    /// (`setcc`, `adc`, `sbb`) is non-linear.
    fn opaque_inputs(&mut self, l: u32, at: usize, insn: &Instruction) -> Val {
        let a = at as u32;
        if insn.rflags_read() != 0 {
            return Val::Varying(Why::NonLinear(a));
        }
        let mut reads = self.bufs.read_lists.pop().unwrap_or_default();
        reads.clear();
        reads.extend(
            self.bufs
                .usages
                .factory()
                .info(insn)
                .used_registers()
                .iter()
                .filter(|r| {
                    matches!(
                        r.access(),
                        iced_x86::OpAccess::Read
                            | iced_x86::OpAccess::ReadWrite
                            | iced_x86::OpAccess::CondRead
                            | iced_x86::OpAccess::ReadCondWrite
                    )
                })
                .map(|r| r.register()),
        );
        let mut acc = self.join_reads(l, at, &reads);
        self.bufs.read_lists.push(reads);
        if matches!(acc, Val::Varying(_)) {
            return acc;
        }
        if (0..insn.op_count()).any(|i| insn.op_kind(i) == OpKind::Memory) {
            acc = acc.join(self.load_val(l, at, insn)).opaque(a);
        }
        acc.opaque(a)
    }

    /// The registers `reads` (of instruction `at`) combined as by
    /// `opaque_inputs`, up to the first that varies.
    fn join_reads(&mut self, l: u32, at: usize, reads: &[Register]) -> Val {
        let a = at as u32;
        let mut acc = Val::Inv;
        for &r in reads {
            if r.is_segment_register() || r == Register::RIP {
                continue;
            }
            let val = if gpr_var(r).is_some() {
                self.reg_val(l, r, at)
            } else {
                Val::Varying(Why::Unknown(a))
            };
            acc = acc.join(val).opaque(a);
            if matches!(acc, Val::Varying(_)) {
                return acc;
            }
        }
        acc
    }
}

fn is_extension_mask(insn: &Instruction) -> bool {
    matches!(
        insn.op1_kind(),
        OpKind::Immediate8to32
            | OpKind::Immediate32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64
    ) && matches!(insn.immediate(1), 0xff | 0xffff | 0xffff_ffff)
}

fn is_cmov(m: Mnemonic) -> bool {
    matches!(
        m,
        Mnemonic::Cmova
            | Mnemonic::Cmovae
            | Mnemonic::Cmovb
            | Mnemonic::Cmovbe
            | Mnemonic::Cmove
            | Mnemonic::Cmovg
            | Mnemonic::Cmovge
            | Mnemonic::Cmovl
            | Mnemonic::Cmovle
            | Mnemonic::Cmovne
            | Mnemonic::Cmovno
            | Mnemonic::Cmovnp
            | Mnemonic::Cmovns
            | Mnemonic::Cmovo
            | Mnemonic::Cmovp
            | Mnemonic::Cmovs
    )
}

/// The set of bit `bit`, if it is one of the `NODE_BITS`.
fn mask(bit: u32) -> Option<u128> {
    (bit < NODE_BITS).then(|| 1u128 << bit)
}

/// The bits of a set, in increasing order.
pub(super) fn bits_of(mut set: u128) -> impl Iterator<Item = u32> {
    std::iter::from_fn(move || {
        (set != 0).then(|| {
            let bit = set.trailing_zeros();
            set &= set - 1;
            bit
        })
    })
}

/// One key of a number (block, loop or instruction) and a variable: one
/// word hashes faster than a tuple of fields.
fn pair(n: u32, v: Var) -> u64 {
    (u64::from(n) << 16) | u64::from(v)
}

/// Converts a top-level value (no definitions in progress).
fn finish(v: Val, at: usize) -> Change {
    match v {
        Val::Inv => Change::Invariant,
        Val::Ind(u) => Change::Induction { update: u },
        Val::Varying(w) => Change::Varying(w),
        Val::Phi(_) | Val::PhiStep(_) => Change::Varying(Why::Unknown(at as u32)),
    }
}
