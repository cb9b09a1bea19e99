//! Ways a process ends without `DT_FINI`: `_exit` (a forked child's usual
//! end: `dash` ends every child so) and `exec`. Their PLT entries are
//! redirected to stubs that first call the runtime (`exit_now`: what the exit
//! hook does; `exec_flush`: send this thread's buffer and an `Exec`
//! message), then take the PLT entry's own jump through the GOT, so lazy
//! binding and the called function are unchanged. Without them a child's
//! last, partly filled buffer (up to `slot::CAPACITY` records) vanished and
//! the trace said it was complete. `fork` is wrapped too: the child
//! inherits the thread's countdown but not the slot holding its budget; the
//! runtime's `before_fork` and `after_fork` keep both processes' counts
//! exact.
//!
//! Calls that bypass the PLT (`call`/`jmp qword [rip → GOT slot]`: Rust's
//! std and `libc` crate, `-fno-plt`) are sent to the same stubs: patched in
//! the original code, and made direct calls of the stub in the copies.
//!
//! Each stub is `call runtime; jmp qword [rip → got]`: the runtime entry
//! preserves every register and the flags and returns, so the import sees
//! its arguments (variadic `execl` included) and stack exactly as the PLT
//! entry would have.

use super::elf::ElfEditor;
use super::runtime::Runtime;
use crate::binary::imports::{GotCall, PltImport};
use crate::error::RewriteError;
use foldhash::HashMap;
use iced_x86::{Code, Encoder, Instruction, MemoryOperand, Register};

/// Imports after which the process is gone without `DT_FINI`.
pub(crate) const EXIT_IMPORTS: [&str; 3] = ["_exit", "_Exit", "quick_exit"];

/// Imports that create a process: wrapped, so that parent and child count
/// their loads exactly (see the runtime's `before_fork`).
pub(crate) const FORK_IMPORTS: [&str; 2] = ["fork", "_Fork"];

/// Imports that start a process running another program (glibc's `clone`
/// with `CLONE_VFORK` and an `exec` inside libc, out of the hooks' reach):
/// wrapped, so the runtime names the new process (`after_spawn`) and, when
/// following execs, lets it inherit the socket (`before_spawn`).
pub(crate) const SPAWN_IMPORTS: [&str; 2] = ["posix_spawn", "posix_spawnp"];

/// Imports that replace the process image (when they succeed).
pub(crate) const EXEC_IMPORTS: [&str; 9] = [
    "execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle", "fexecve", "execveat",
];

/// Whether `name` is an import this module puts a stub in front of.
pub(crate) fn ends_process(name: &str) -> bool {
    EXIT_IMPORTS.contains(&name)
        || EXEC_IMPORTS.contains(&name)
        || FORK_IMPORTS.contains(&name)
        || SPAWN_IMPORTS.contains(&name)
}

/// Bytes per stub (at most 20 used, padded so each starts aligned).
const STUB_BYTES: u64 = 32;

/// The stubs, to be placed at their address, and the jumps and calls to
/// patch.
#[derive(Clone, Debug, Default)]
pub(crate) struct ProcessEndStubs {
    /// Machine code of the stubs.
    pub code: Vec<u8>,
    /// GOT slot → its stub: a copy's `call`/`jmp [rip → slot]` becomes a
    /// direct one to the stub (see `relocate::Entries::got_hooks`).
    pub by_slot: HashMap<u64, u64>,
    /// `(instruction, its length, stub, is a call)` to patch: PLT jumps and
    /// `jmp [rip → slot]` become `jmp stub`, `call [rip → slot]` becomes
    /// `call stub`.
    pub patches: Vec<(u64, usize, u64, bool)>,
    /// The imports hooked (through their PLT entry or a GOT call), by
    /// name, sorted.
    pub hooked: Vec<String>,
    /// How many `call`/`jmp [rip → slot]` of the original code go through
    /// a stub.
    pub got_calls: usize,
}

/// Stubs at `va` for `slots`, the GOT slots of the exit-like, exec-like and
/// fork-like imports (`(slot, name)`), and the patches that send `imports`'
/// PLT jumps and `got_calls` through them.
pub(crate) fn assemble(
    slots: &[(u64, String)],
    imports: &[PltImport],
    got_calls: &[GotCall],
    va: u64,
    rt: &Runtime,
) -> Result<ProcessEndStubs, RewriteError> {
    let mut stubs = ProcessEndStubs::default();
    for (got, name) in slots {
        let at = va + stubs.code.len() as u64;
        let code = stub_code(name, *got, rt)?;
        let mut encoder = Encoder::new(64);
        let mut ip = at;
        for insn in &code {
            ip += encoder.encode(insn, ip).map_err(RewriteError::Runtime)? as u64;
        }
        let mut bytes = encoder.take_buffer();
        if bytes.len() as u64 > STUB_BYTES {
            return Err(RewriteError::ProcessEndStubTooLarge { bytes: STUB_BYTES });
        }
        bytes.resize(STUB_BYTES as usize, 0xcc);
        stubs.code.extend_from_slice(&bytes);
        stubs.by_slot.insert(*got, at);
    }
    let mut hooked = std::collections::BTreeSet::new();
    // Our `jmp rel32` must fit the PLT jump it replaces.
    for import in imports.iter().filter(|i| i.jump_len >= 5) {
        if let Some(&stub) = stubs.by_slot.get(&import.got) {
            stubs
                .patches
                .push((import.jump, import.jump_len, stub, false));
            hooked.insert(import.name.clone());
        }
    }
    let names: HashMap<u64, &String> = slots.iter().map(|(g, n)| (*g, n)).collect();
    for call in got_calls {
        if let (Some(&stub), Some(name)) = (stubs.by_slot.get(&call.got), names.get(&call.got)) {
            stubs.patches.push((call.at, call.len, stub, call.call));
            stubs.got_calls += 1;
            hooked.insert((*name).clone());
        }
    }
    stubs.hooked = hooked.into_iter().collect();
    Ok(stubs)
}

/// The stub for the import `name` reached through GOT slot `got`.
fn stub_code(name: &str, got: u64, rt: &Runtime) -> Result<Vec<Instruction>, RewriteError> {
    let through_got = |code| {
        Instruction::with1(
            code,
            MemoryOperand::with_base_displ(Register::RIP, got as i64),
        )
        .map_err(RewriteError::Runtime)
    };
    if SPAWN_IMPORTS.contains(&name) {
        // The pid pointer kept in the frame (which also aligns the stack;
        // posix_spawn takes no stack arguments).
        return Ok(vec![
            Instruction::with1(Code::Push_r64, Register::RDI).map_err(RewriteError::Runtime)?,
            Instruction::with_branch(Code::Call_rel32_64, rt.before_spawn)
                .map_err(RewriteError::Runtime)?,
            through_got(Code::Call_rm64)?,
            Instruction::with2(
                Code::Mov_r64_rm64,
                Register::RDI,
                MemoryOperand::with_base(Register::RSP),
            )
            .map_err(RewriteError::Runtime)?,
            Instruction::with_branch(Code::Call_rel32_64, rt.after_spawn)
                .map_err(RewriteError::Runtime)?,
            Instruction::with2(Code::Add_rm64_imm8, Register::RSP, 8)
                .map_err(RewriteError::Runtime)?,
            Instruction::with(Code::Retnq),
        ]);
    }
    if FORK_IMPORTS.contains(&name) {
        // A frame of its own (fork takes no stack arguments), kept 16-byte
        // aligned for the call; entered by a call or a tail jump alike.
        return Ok(vec![
            Instruction::with2(Code::Sub_rm64_imm8, Register::RSP, 8)
                .map_err(RewriteError::Runtime)?,
            Instruction::with_branch(Code::Call_rel32_64, rt.before_fork)
                .map_err(RewriteError::Runtime)?,
            through_got(Code::Call_rm64)?,
            Instruction::with_branch(Code::Call_rel32_64, rt.after_fork)
                .map_err(RewriteError::Runtime)?,
            Instruction::with2(Code::Add_rm64_imm8, Register::RSP, 8)
                .map_err(RewriteError::Runtime)?,
            Instruction::with(Code::Retnq),
        ]);
    }
    let hook = if EXIT_IMPORTS.contains(&name) {
        rt.exit_now
    } else {
        rt.exec_flush
    };
    Ok(vec![
        Instruction::with_branch(Code::Call_rel32_64, hook).map_err(RewriteError::Runtime)?,
        through_got(Code::Jmp_rm64)?,
    ])
}

/// Replaces each patched jump or call with a `jmp`/`call rel32` to its stub
/// (the rest of the instruction becomes `nop`s, never reached; a `call`
/// returns past them).
pub(crate) fn patch(
    editor: &mut ElfEditor<'_>,
    stubs: &ProcessEndStubs,
) -> Result<(), RewriteError> {
    for &(jump, len, stub, call) in &stubs.patches {
        let rel = i32::try_from(stub as i64 - (jump as i64 + 5))
            .map_err(|_| RewriteError::ProcessEndStubOutOfReach { jump })?;
        let mut bytes = vec![0x90; len];
        bytes[0] = if call { 0xe8 } else { 0xe9 };
        bytes[1..5].copy_from_slice(&rel.to_le_bytes());
        editor.patch(jump, &bytes)?;
    }
    Ok(())
}
