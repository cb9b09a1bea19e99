//! The static rewriter: relocating functions with load probes into a new
//! segment of the executable.

pub mod elf;
pub mod runtime;

use anyhow::{Context, Result};
use elf::{ElfEditor, SIGNATURE};

/// Builds the segment with only the runtime (no relocated functions).
pub fn runtime_only(bytes: Vec<u8>, has_regions: bool) -> Result<Vec<u8>> {
    let editor = ElfEditor::new(bytes, runtime::STATE_BYTES)?;
    let code_va = editor.segment_va + 64;
    let rt = runtime::generate(&runtime::RuntimeParams {
        code_va,
        state_va: editor.state_va,
        original_entry: editor.entry,
        original_fini: editor.fini(),
        has_regions,
    })
    .map_err(|e| anyhow::anyhow!("assembling the recorder runtime: {e}"))?;
    let mut segment = SIGNATURE.to_vec();
    segment.resize(64, 0);
    segment.extend_from_slice(&rt.code);
    editor
        .finish(&segment, Some(rt.entry), Some(rt.fini), None)
        .context("writing the executable")
}
