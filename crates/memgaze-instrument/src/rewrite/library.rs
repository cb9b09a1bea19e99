//! The runtime of an instrumented shared library: a hot path and a
//! forwarder, not a second recorder.
//!
//! Every object of a process shares the thread's countdown (`fs:0x38`) and
//! slot (`fs:0x40`), so a library's probes and inline stubs work unchanged:
//! they count against the same countdown and claim records from the same
//! grant as the executable's. Only the library's `record` differs. Its hot
//! path is the executable's; what that cannot do (a window starts or ends,
//! the buffer is full, the thread has no slot yet) goes to the executable
//! runtime's cold path, whose address the executable runtime's config
//! block holds, which every slot points to ([`slot::RUNTIME`],
//! `cfg::COLD_PATH`). The library keeps that address in its own state
//! word once it has seen it, so a thread whose first instrumented load is
//! in the library (every thread: `start_thread` is in libc) reaches the
//! runtime that creates its slot.
//!
//! A thread without a slot whose forward finds no runtime (code that the
//! dynamic loader runs before the executable's entry, a new thread in
//! `start_thread` before any thread appended or forwarded here) is sent
//! back with a zero countdown: its library loads until its first
//! executable load are not counted, and that load reaches the runtime,
//! which creates the slot. After `SLOTLESS_ASKS` (2^20) such forwards in a
//! process (one whose executable is not instrumented, a program the
//! recorded one `exec`s with the same environment, never gets a slot) it
//! gets a re-check countdown (`COUNTDOWN_RECHECK`) instead, and runs at
//! nearly full speed, uncounted.
//!
//! Spatial checks in library code read the library's own config words,
//! which stay zero (no spatial sample): only the executable's entry hook
//! parses the recorder's environment.
//!
//! Record ids carry the object in their high bits (`object << 24 | load`,
//! [`OBJECT_SHIFT`]), so the collector can tell whose annotation a record
//! refers to.
//!
//! Escapes and untraced loads count in counters of the library's own
//! (`runtime::process::library_counters`: in the executable's process
//! block, wiped on fork as the executable's are, one stretch per object
//! number). A library check finds them through two words of the library's
//! state, which its `escape_register` routine fills on the first count
//! that finds this thread's slot: the executable runtime's config (whose
//! region switch it tests) and the counters. Registering writes the
//! library's number of sites into the config's per-object table
//! (`Config::library_sites`), which the executable's `send_escapes` walks;
//! the ids it sends are `object << 24 | site`, as records'. A count before
//! the library registers (before the executable's entry, or in a thread
//! without a slot while no thread registered it) is not made: loads there
//! are not recorded either.

use super::runtime::{self, Runtime, lea_rip, record_hot_path_then, slot};
use iced_x86::code_asm::*;
use iced_x86::{BlockEncoderOptions, Register};

/// A record id is `object << OBJECT_SHIFT | load` (object 0: the
/// executable).
pub const OBJECT_SHIFT: u32 = 24;
/// The largest object number: ids stay below
/// [`memgaze_trace::protocol::SPATIAL_FLAG`].
pub const MAX_OBJECT: u32 = (1 << (31 - OBJECT_SHIFT)) - 1;
/// Loads an object may have.
pub const MAX_LOADS: usize = 1 << OBJECT_SHIFT;

/// Escape sites a library may count (its checks past that are copied
/// without one): ids `object << OBJECT_SHIFT | site` stay ids of the
/// object.
pub const MAX_ESCAPE_SITES: u32 = runtime::process::MAX_ESCAPE_SITES;
const _: () = assert!(MAX_ESCAPE_SITES as usize <= MAX_LOADS);
const _: () = assert!(
    (MAX_OBJECT << OBJECT_SHIFT) + (MAX_ESCAPE_SITES - 1) < memgaze_trace::protocol::SPATIAL_FLAG
);

/// Bytes of state the rewriter reserves in a library's bss: a config block
/// that stays zero (the copies' spatial checks read it), then the words
/// below.
pub(crate) const STATE_BYTES: u64 = 256;
/// Offset in the library's state of the word caching the executable
/// runtime's cold path (past the config block's fields the copies read).
const RUNTIME_WORD: u64 = STATE_BYTES - 8;
/// Offset of the word counting forwards of slotless threads that found no
/// runtime (see [`SLOTLESS_ASKS`]).
const SLOTLESS_WORD: u64 = RUNTIME_WORD - 8;
/// Offset of the word holding the executable runtime's config block once
/// the library registered its escape counters (0 before).
const CONFIG_WORD: u64 = SLOTLESS_WORD - 8;
/// Offset of the word holding the address of the library's first escape
/// counter (written before [`CONFIG_WORD`]).
const COUNTERS_WORD: u64 = CONFIG_WORD - 8;
const _: () = assert!(std::mem::offset_of!(runtime::Config, cold_path) as u64 <= COUNTERS_WORD);
/// Forwards of slotless threads that find no runtime after which they get a
/// re-check countdown instead of asking at their next load: bounds the cost
/// in a process whose executable is not instrumented (about 30 cycles each).
const SLOTLESS_ASKS: u32 = 1 << 20;

/// Where a library's escape checks count, for its runtime at `state_va`
/// whose registration routine is at `register`.
pub fn counters(state_va: u64, register: u64) -> super::probe::LibraryCounters {
    super::probe::LibraryCounters {
        config: state_va + CONFIG_WORD,
        counters: state_va + COUNTERS_WORD,
        register,
    }
}

/// Generates the runtime of library `object` with `escape_sites` escape
/// counters at `code_va`, its state at `state_va`. Only `code`, `record`,
/// `record_tracked`, `probe_append`, `probe_append_tracked`, `spatial`
/// and `escape_register` are meaningful.
pub fn generate(
    code_va: u64,
    state_va: u64,
    object: u32,
    escape_sites: u32,
) -> Result<Runtime, IcedError> {
    assert!((1..=MAX_OBJECT).contains(&object) && escape_sites <= MAX_ESCAPE_SITES);
    let mut a = CodeAssembler::new(64)?;
    let mut record = a.create_label();
    let mut probe_append = a.create_label();
    let mut spatial = a.create_label();
    let mut forward = a.create_label();
    let mut go = a.create_label();
    let mut none = a.create_label();
    let mut recheck = a.create_label();
    let mut leave = a.create_label();
    let mut known = a.create_label();
    a.set_label(&mut record)?;
    // Learn the runtime from any thread's slot at its first append here,
    // not only at a forward: a full trace's grant may never end in this
    // library, and threads started later need the address (see above).
    record_hot_path_then(&mut a, forward, |a| {
        a.add_instruction(lea_rip(Register::RCX, state_va + RUNTIME_WORD))?;
        a.cmp(qword_ptr(rcx), 0)?;
        a.jne(known)?;
        a.mov(rcx, qword_ptr(rbx + slot::RUNTIME))?;
        a.mov(rcx, qword_ptr(rcx + runtime::cfg::COLD_PATH))?;
        a.add_instruction(lea_rip(Register::RBX, state_va + RUNTIME_WORD))?;
        a.mov(qword_ptr(rbx), rcx)?;
        a.set_label(&mut known)
    })?;
    // rax, rcx, rbx pushed, the flags in ax: rcx and rbx are free.
    a.set_label(&mut forward)?;
    a.add_instruction(lea_rip(Register::RBX, state_va + RUNTIME_WORD))?;
    a.mov(rcx, qword_ptr(rbx))?;
    a.test(rcx, rcx)?;
    a.jnz(go)?;
    emit_executable_config(&mut a, none)?;
    a.mov(rcx, qword_ptr(rcx + runtime::cfg::COLD_PATH))?;
    a.add_instruction(lea_rip(Register::RBX, state_va + RUNTIME_WORD))?;
    a.mov(qword_ptr(rbx), rcx)?;
    a.set_label(&mut go)?;
    a.jmp(rcx)?;
    // No runtime known. A thread without a slot asks again at its next
    // load, so that its first executable load reaches the runtime that
    // creates its slot: a re-check countdown would hide that load and the
    // next thousands uncounted. A process with no runtime to find (an
    // uninstrumented executable) stops asking so often after a while.
    a.set_label(&mut none)?;
    a.mov(rbx, qword_ptr(0x40u64).fs())?;
    a.test(rbx, rbx)?;
    a.jnz(recheck)?;
    a.add_instruction(lea_rip(Register::RBX, state_va + SLOTLESS_WORD))?;
    a.cmp(qword_ptr(rbx), SLOTLESS_ASKS as i32)?;
    a.jae(recheck)?;
    a.inc(qword_ptr(rbx))?;
    a.mov(qword_ptr(0x38u64).fs(), 0)?;
    a.jmp(leave)?;
    a.set_label(&mut recheck)?;
    a.mov(qword_ptr(0x38u64).fs(), runtime::COUNTDOWN_RECHECK as i32)?;
    a.set_label(&mut leave)?;
    a.add(al, 0x7f)?;
    a.sahf()?;
    a.pop(rbx)?;
    a.pop(rcx)?;
    a.pop(rax)?;
    a.ret()?;
    // Never called: the library's spatial threshold stays zero.
    a.set_label(&mut spatial)?;
    a.ret()?;
    // One append for both kinds of load: `record_tracked` is `record`.
    runtime::emit_probe_append(&mut a, &mut probe_append, record)?;
    let mut escape_register = a.create_label();
    emit_escape_register(&mut a, &mut escape_register, state_va, object, escape_sites)?;
    let result =
        a.assemble_options(code_va, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
    let record = result.label_ip(&record)?;
    Ok(Runtime {
        record,
        record_tracked: record,
        probe_append: result.label_ip(&probe_append)?,
        probe_append_tracked: result.label_ip(&probe_append)?,
        spatial: result.label_ip(&spatial)?,
        // None: the stubs call `spatial`, which is never reached either.
        spatial_append: 0,
        entry: 0,
        fini: 0,
        exit_now: 0,
        exec_flush: 0,
        before_fork: 0,
        after_fork: 0,
        before_spawn: 0,
        after_spawn: 0,
        region_begin: 0,
        region_end: 0,
        region_begin_unnamed: 0,
        region_end_unnamed: 0,
        region_toggle: 0,
        region_samples: 0,
        escape_register: result.label_ip(&escape_register)?,
        code: result.inner.code_buffer,
        cpu_features: 0,
    })
}

/// `rbx` = this thread's slot and `rcx` = the executable runtime's config
/// it points at, or a jump to `missing` when the thread has no slot yet or
/// the slot no runtime.
fn emit_executable_config(a: &mut CodeAssembler, missing: CodeLabel) -> Result<(), IcedError> {
    a.mov(rbx, qword_ptr(0x40u64).fs())?;
    a.test(rbx, rbx)?;
    a.jz(missing)?;
    a.cmp(qword_ptr(rbx + slot::MAGIC), slot::MAGIC_VALUE)?;
    a.jne(missing)?;
    a.mov(rcx, qword_ptr(rbx + slot::RUNTIME))?;
    a.test(rcx, rcx)?;
    a.jz(missing)
}

/// `escape_register` at `entry`, called by the library's escape checks
/// while [`CONFIG_WORD`] is zero: through this thread's slot, finds the
/// executable runtime's config and its library counters, writes the
/// library's `escape_sites` into its per-object table, then
/// [`COUNTERS_WORD`] and [`CONFIG_WORD`] (in that order: a check that
/// reads the config word reads the counters word after it). `rax` = the
/// config, or 0 (no slot, or no counters mapped: nothing is recorded);
/// every other register kept, the flags clobbered. Two threads may
/// register at once: they write the same values.
fn emit_escape_register(
    a: &mut CodeAssembler,
    entry: &mut CodeLabel,
    state_va: u64,
    object: u32,
    escape_sites: u32,
) -> Result<(), IcedError> {
    let mut fail = a.create_label();
    let mut leave = a.create_label();
    a.set_label(entry)?;
    a.push(rbx)?;
    a.push(rcx)?;
    emit_executable_config(a, fail)?;
    a.mov(rax, qword_ptr(rcx + runtime::cfg::LIBRARY_COUNTERS))?;
    a.test(rax, rax)?;
    a.jz(fail)?;
    a.mov(
        qword_ptr(rcx + (runtime::cfg::LIBRARY_SITES + 8 * object as i32)),
        escape_sites as i32,
    )?;
    a.add(
        rax,
        (object as i32 - 1) * runtime::process::LIBRARY_COUNTER_BYTES,
    )?;
    a.add_instruction(lea_rip(Register::RBX, state_va + COUNTERS_WORD))?;
    a.mov(qword_ptr(rbx), rax)?;
    a.add_instruction(lea_rip(Register::RBX, state_va + CONFIG_WORD))?;
    a.mov(qword_ptr(rbx), rcx)?;
    a.mov(rax, rcx)?;
    a.jmp(leave)?;
    a.set_label(&mut fail)?;
    a.xor(eax, eax)?;
    a.set_label(&mut leave)?;
    a.pop(rcx)?;
    a.pop(rbx)?;
    a.ret()
}
