//! Ways a process ends without `DT_FINI`: `_exit` (a forked child's usual
//! end: `dash` ends every child so) and `exec`. Their PLT entries are
//! redirected to stubs that first call the runtime (`exit_now`: what the exit
//! hook does; `exec_flush`: send this thread's buffer and an `Exec`
//! message), then take the PLT entry's own jump through the GOT, so lazy
//! binding and the called function are unchanged. Without them a child's
//! last, partly filled buffer (up to `slot::CAPACITY` records) vanished and
//! the trace said it was complete. `fork` is wrapped too: the child
//! inherits the thread's countdown but not the slot holding its budget, and
//! the runtime's `after_fork` gives it one.
//!
//! Each stub is `call runtime; jmp qword [rip → got]`: the runtime entry
//! preserves every register and the flags and returns, so the import sees
//! its arguments (variadic `execl` included) and stack exactly as the PLT
//! entry would have.

use super::elf::ElfEditor;
use super::runtime::Runtime;
use crate::binary::imports::PltImport;
use crate::error::RewriteError;
use iced_x86::{Code, Encoder, Instruction, MemoryOperand, Register};

/// Imports after which the process is gone without `DT_FINI`.
pub(crate) const EXIT_IMPORTS: [&str; 3] = ["_exit", "_Exit", "quick_exit"];

/// Imports that create a process: wrapped, so the child's runtime learns
/// its inherited countdown (see the runtime's `after_fork`).
pub(crate) const FORK_IMPORTS: [&str; 2] = ["fork", "_Fork"];

/// Imports that replace the process image (when they succeed).
pub(crate) const EXEC_IMPORTS: [&str; 9] = [
    "execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle", "fexecve", "execveat",
];

/// Whether `name` is an import this module puts a stub in front of.
pub(crate) fn ends_process(name: &str) -> bool {
    EXIT_IMPORTS.contains(&name) || EXEC_IMPORTS.contains(&name) || FORK_IMPORTS.contains(&name)
}

/// Bytes per stub (at most 20 used, padded so each starts aligned).
const STUB_BYTES: u64 = 32;

/// The stubs, to be placed at their address, and the PLT jumps to patch.
#[derive(Clone, Debug, Default)]
pub(crate) struct ProcessEndStubs {
    /// Machine code of the stubs.
    pub code: Vec<u8>,
    /// `(PLT jump, its length, stub)` to patch.
    pub patches: Vec<(u64, usize, u64)>,
    /// The imports hooked, by name, in address order.
    pub hooked: Vec<String>,
}

/// Stubs at `va` for the exit-like and exec-like ones of `imports`.
pub(crate) fn assemble(
    imports: &[PltImport],
    va: u64,
    rt: &Runtime,
) -> Result<ProcessEndStubs, RewriteError> {
    let mut stubs = ProcessEndStubs::default();
    for import in imports {
        let name = import.name.as_str();
        // Our `jmp rel32` must fit the PLT jump it replaces.
        if import.jump_len < 5 {
            continue;
        }
        let at = va + stubs.code.len() as u64;
        let through_got = |code| {
            Instruction::with1(
                code,
                MemoryOperand::with_base_displ(Register::RIP, import.got as i64),
            )
        };
        let code = if EXIT_IMPORTS.contains(&name) || EXEC_IMPORTS.contains(&name) {
            let hook = if EXIT_IMPORTS.contains(&name) {
                rt.exit_now
            } else {
                rt.exec_flush
            };
            vec![
                Instruction::with_branch(Code::Call_rel32_64, hook)
                    .map_err(RewriteError::Runtime)?,
                through_got(Code::Jmp_rm64).map_err(RewriteError::Runtime)?,
            ]
        } else if FORK_IMPORTS.contains(&name) {
            // A frame of its own (fork takes no stack arguments), kept
            // 16-byte aligned for the call.
            vec![
                Instruction::with2(Code::Sub_rm64_imm8, Register::RSP, 8)
                    .map_err(RewriteError::Runtime)?,
                through_got(Code::Call_rm64).map_err(RewriteError::Runtime)?,
                Instruction::with_branch(Code::Call_rel32_64, rt.after_fork)
                    .map_err(RewriteError::Runtime)?,
                Instruction::with2(Code::Add_rm64_imm8, Register::RSP, 8)
                    .map_err(RewriteError::Runtime)?,
                Instruction::with(Code::Retnq),
            ]
        } else {
            continue;
        };
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
        stubs.patches.push((import.jump, import.jump_len, at));
        stubs.hooked.push(import.name.clone());
    }
    Ok(stubs)
}

/// Replaces each PLT jump with a `jmp rel32` to its stub (the rest of the
/// instruction becomes `nop`s, never reached).
pub(crate) fn patch(editor: &mut ElfEditor, stubs: &ProcessEndStubs) -> Result<(), RewriteError> {
    for &(jump, len, stub) in &stubs.patches {
        let rel = i32::try_from(stub as i64 - (jump as i64 + 5))
            .map_err(|_| RewriteError::ProcessEndStubOutOfReach { jump })?;
        let mut bytes = vec![0x90; len];
        bytes[0] = 0xe9;
        bytes[1..5].copy_from_slice(&rel.to_le_bytes());
        editor.patch(jump, &bytes)?;
    }
    Ok(())
}
