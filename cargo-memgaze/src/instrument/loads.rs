//! Which instructions are explicit loads, and a plain annotation listing
//! them for when no classification is at hand.
//!
//! The load *classes* and proxy compression are the classifier's job
//! (`classify`); [`unclassified_annotation`] only enumerates loads so the
//! rewriter and its tests can run on any binary (every load instrumented,
//! class `Irregular`, nothing implied).

use crate::annotation::{ANNOTATION_SCHEMA, Annotation, FunctionSite, LoadSite};
use crate::binary::{Binary, Function};
use crate::trace::LoadClass;
use iced_x86::{Instruction, InstructionInfoFactory, OpAccess, OpKind};

/// Whether `insn` reads memory through an explicit memory operand (not
/// `push`/`pop`/`ret` stack traffic, not string instructions, not `lea`,
/// `nop` or prefetches).
pub fn is_explicit_load(insn: &Instruction, info: &mut InstructionInfoFactory) -> bool {
    let Some(operand) = (0..insn.op_count()).find(|&i| insn.op_kind(i) == OpKind::Memory) else {
        return false;
    };
    matches!(
        info.info(insn).op_access(operand),
        OpAccess::Read | OpAccess::CondRead | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

/// An annotation of `functions` (indices into `binary.functions()`) where
/// every explicit load is instrumented and classed `Irregular`.
pub fn unclassified_annotation(binary: &Binary, functions: &[usize]) -> Annotation {
    let mut info = InstructionInfoFactory::new();
    let mut sites = Vec::with_capacity(functions.len());
    let mut loads = Vec::new();
    for (fi, &index) in functions.iter().enumerate() {
        let f: &Function = &binary.functions()[index];
        sites.push(FunctionSite {
            name: f.name.clone(),
            raw_name: f.raw_name.clone(),
            start: f.start,
            size: f.size,
            instrumented: false,
            skipped: None,
        });
        for insn in binary.decode(f) {
            if insn.is_invalid() || !is_explicit_load(&insn, &mut info) {
                continue;
            }
            loads.push(LoadSite {
                id: loads.len() as u32,
                ip: insn.ip(),
                len: insn.len() as u8,
                class: LoadClass::Irregular,
                instrumented: true,
                implied: 0,
                proxy: None,
                base: register_name(insn.memory_base()),
                index: register_name(insn.memory_index()),
                scale: insn.memory_index_scale() as u8,
                displacement: insn.memory_displacement64() as i64,
                size: insn.memory_size().size() as u32,
                function: fi as u32,
                line: binary.location(insn.ip()).map(|l| l.to_string()),
                skipped: None,
                segment: register_name(insn.segment_prefix()),
                gather: false,
                read_modify_write: false,
                control: false,
            });
        }
    }
    Annotation {
        schema: ANNOTATION_SCHEMA.to_string(),
        binary: binary.identity().clone(),
        mode: None,
        functions: sites,
        loads,
    }
}

fn register_name(reg: iced_x86::Register) -> Option<String> {
    if reg == iced_x86::Register::None {
        None
    } else {
        Some(format!("{reg:?}").to_lowercase())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn load(bytes: &[u8]) -> bool {
        let insn = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE).decode();
        is_explicit_load(&insn, &mut InstructionInfoFactory::new())
    }

    #[test]
    fn explicit_loads_only() {
        assert!(load(&[0x8b, 0x04, 0x8f])); // mov eax,[rdi+rcx*4]
        assert!(load(&[0x01, 0x07])); // add [rdi],eax (read-modify-write)
        assert!(load(&[0xff, 0x35, 0, 0, 0, 0])); // push qword [rip]
        assert!(!load(&[0x89, 0x07])); // mov [rdi],eax
        assert!(!load(&[0x8d, 0x04, 0x8f])); // lea
        assert!(!load(&[0x50])); // push rax
        assert!(!load(&[0xc3])); // ret
        assert!(!load(&[0xa4])); // movsb
        assert!(!load(&[0x0f, 0x18, 0x0f])); // prefetcht0 [rdi]
        assert!(!load(&[0x0f, 0x1f, 0x40, 0x00])); // nop [rax]
    }
}
