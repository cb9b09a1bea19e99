//! Classification of hand-assembled loops: each shape the classifier must
//! know, with the load of interest marked by a label.

use super::*;
use crate::binary::{FlatMemory, FunctionCode};
use iced_x86::BlockEncoderOptions;
use iced_x86::code_asm::*;
use std::collections::HashMap;

/// Assembles a function; `mark` labels the loads of interest.
struct Asm {
    a: CodeAssembler,
    marks: Vec<(&'static str, CodeLabel)>,
    /// The label bound by `here` and how many instructions existed then
    /// (iced allows one label per instruction).
    last_here: Option<(CodeLabel, usize)>,
}

impl Asm {
    fn new() -> Asm {
        Asm {
            a: CodeAssembler::new(64).unwrap(),
            marks: Vec::new(),
            last_here: None,
        }
    }

    /// Labels the next instruction.
    fn mark(&mut self, name: &'static str) {
        let count = self.a.instructions().len();
        let l = match self.last_here {
            Some((l, at)) if at == count => l,
            _ => {
                let mut l = self.a.create_label();
                self.a.set_label(&mut l).unwrap();
                self.last_here = Some((l, count));
                l
            }
        };
        self.marks.push((name, l));
    }

    fn label(&mut self) -> CodeLabel {
        self.a.create_label()
    }

    fn here(&mut self, l: &mut CodeLabel) {
        self.a.set_label(l).unwrap();
        self.last_here = Some((*l, self.a.instructions().len()));
    }

    /// Classifies and returns the loads by mark name.
    fn classify(self) -> (FunctionLoads, HashMap<&'static str, ClassifiedLoad>) {
        let Asm { mut a, marks, .. } = self;
        let r = a
            .assemble_options(0x1000, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
            .unwrap();
        let bytes = r.inner.code_buffer.clone();
        let code = FunctionCode::build(
            &bytes,
            0x1000,
            &FlatMemory {
                base: 0x1000,
                bytes: &bytes,
            },
        );
        let loads = Classifier::new().classify(&code);
        let mut by_mark = HashMap::new();
        for (name, label) in marks {
            let ip = r.label_ip(&label).unwrap();
            let load = loads
                .loads
                .iter()
                .find(|l| l.operand.ip == ip)
                .unwrap_or_else(|| panic!("no load at mark {name}"));
            by_mark.insert(name, *load);
        }
        (loads, by_mark)
    }
}

fn class_of(m: &HashMap<&str, ClassifiedLoad>, name: &str) -> LoadClass {
    m[name].class
}

#[test]
fn index_induction_variable_is_strided() {
    let mut f = Asm::new();
    let mut top = f.label();
    f.a.xor(eax, eax).unwrap();
    f.a.xor(ecx, ecx).unwrap();
    f.here(&mut top);
    f.mark("load");
    f.a.add(rax, qword_ptr(rdi + rcx * 8)).unwrap();
    f.a.inc(rcx).unwrap();
    f.a.cmp(rcx, rsi).unwrap();
    f.a.jne(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(class_of(&m, "load"), LoadClass::Strided);
    match m["load"].reason {
        Reason::Induction { register, .. } => assert_eq!(register, Register::RCX),
        other => panic!("{other:?}"),
    }
}

#[test]
fn pointer_bump_and_runtime_stride_are_strided() {
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    f.mark("bump");
    f.a.add(eax, dword_ptr(rdi)).unwrap();
    f.mark("runtime");
    f.a.add(rax, qword_ptr(r8 + rcx * 8)).unwrap();
    f.a.add(rdi, 4).unwrap();
    f.a.add(rcx, rdx).unwrap(); // rdx: invariant, unknown stride
    f.a.cmp(rdi, rsi).unwrap();
    f.a.jne(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(class_of(&m, "bump"), LoadClass::Strided);
    assert_eq!(class_of(&m, "runtime"), LoadClass::Strided);
}

#[test]
fn copies_and_extensions_of_an_induction_variable_are_followed() {
    // Unrolled/remainder-loop shapes: mov rdx,rsi; add rsi,4 / mov edx,esi /
    // movsxd, lea with scale.
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    f.a.mov(rdx, rsi).unwrap();
    f.a.add(rsi, 4).unwrap();
    f.mark("copy");
    f.a.mov(eax, dword_ptr(rdi + rdx)).unwrap();
    f.a.mov(r8d, ecx).unwrap();
    f.mark("zext");
    f.a.add(eax, dword_ptr(rdi + r8 * 4)).unwrap();
    f.a.movsxd(r9, ecx).unwrap();
    f.a.lea(r10, ptr(rdi + r9 * 8 + 16)).unwrap();
    f.mark("sext_lea");
    f.a.add(rax, qword_ptr(r10)).unwrap();
    f.a.inc(ecx).unwrap();
    f.a.cmp(rsi, r11).unwrap();
    f.a.jb(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    for name in ["copy", "zext", "sext_lea"] {
        assert_eq!(
            class_of(&m, name),
            LoadClass::Strided,
            "{name}: {:?}",
            m[name].reason
        );
    }
}

#[test]
fn index_loaded_from_memory_makes_the_data_load_irregular() {
    // mov eax,[rsi+rcx*4]; mov edx,[rdi+rax*4]: a[idx[i]]
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    f.mark("index");
    f.a.mov(eax, dword_ptr(rsi + rcx * 4)).unwrap();
    f.mark("data");
    f.a.mov(edx, dword_ptr(rdi + rax * 4)).unwrap();
    f.a.add(r8, rdx).unwrap();
    f.a.inc(rcx).unwrap();
    f.a.cmp(rcx, r9).unwrap();
    f.a.jne(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(class_of(&m, "index"), LoadClass::Strided);
    assert_eq!(class_of(&m, "data"), LoadClass::Irregular);
    assert_eq!(
        m["data"].reason,
        Reason::DependsOnLoad {
            register: Register::RAX,
            load: m["index"].operand.ip
        }
    );
}

#[test]
fn index_loaded_in_the_previous_iteration_is_irregular() {
    // mov eax,edx … mov edx,[rdi+rax*4]: the next index comes from memory.
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    f.a.mov(eax, edx).unwrap();
    f.mark("chase");
    f.a.mov(edx, dword_ptr(rdi + rax * 4)).unwrap();
    f.a.dec(rsi).unwrap();
    f.a.jne(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(class_of(&m, "chase"), LoadClass::Irregular);
}

#[test]
fn linked_list_loads_are_irregular() {
    let mut f = Asm::new();
    let mut top = f.label();
    f.a.xor(eax, eax).unwrap();
    f.here(&mut top);
    f.mark("value");
    f.a.add(rax, qword_ptr(rdi + 8)).unwrap();
    f.mark("next");
    f.a.mov(rdi, qword_ptr(rdi)).unwrap();
    f.a.test(rdi, rdi).unwrap();
    f.a.jne(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(class_of(&m, "value"), LoadClass::Irregular);
    assert_eq!(class_of(&m, "next"), LoadClass::Irregular);
}

#[test]
fn scalars_on_the_stack_globals_and_tls_are_constant() {
    let mut f = Asm::new();
    let mut data = f.label();
    f.mark("stack");
    f.a.mov(rax, qword_ptr(rsp + 8)).unwrap();
    f.mark("global");
    f.a.add(rax, qword_ptr(data)).unwrap();
    f.mark("tls");
    f.a.add(rax, qword_ptr(0x28).fs()).unwrap();
    f.mark("heap");
    f.a.add(rax, qword_ptr(rdi + 8)).unwrap();
    f.mark("stack_array");
    f.a.add(rax, qword_ptr(rsp + rcx * 8)).unwrap();
    f.a.ret().unwrap();
    f.here(&mut data);
    f.a.dq(&[0]).unwrap();
    let (_, m) = f.classify();
    assert_eq!(class_of(&m, "stack"), LoadClass::Constant);
    assert_eq!(m["stack"].reason, Reason::FrameScalar);
    assert_eq!(class_of(&m, "global"), LoadClass::Constant);
    assert_eq!(class_of(&m, "tls"), LoadClass::Constant);
    assert!(m["tls"].operand.is_tls());
    assert_eq!(m["heap"].reason, Reason::NotInLoop);
    assert_eq!(class_of(&m, "stack_array"), LoadClass::Irregular);
}

#[test]
fn unoptimised_loop_with_induction_variable_in_a_stack_slot_is_strided() {
    // gcc -O0: for (int i = 0; i < n; i++) s += a[i];
    let mut f = Asm::new();
    let (mut cond, mut body) = (f.label(), f.label());
    f.a.push(rbp).unwrap();
    f.a.mov(rbp, rsp).unwrap();
    f.a.mov(qword_ptr(rbp - 24), rdi).unwrap();
    f.a.mov(dword_ptr(rbp - 28), esi).unwrap();
    f.a.mov(dword_ptr(rbp - 4), 0).unwrap();
    f.a.jmp(cond).unwrap();
    f.here(&mut body);
    f.mark("i");
    f.a.mov(eax, dword_ptr(rbp - 4)).unwrap();
    f.a.cdqe().unwrap();
    f.a.lea(rdx, ptr(rax * 4)).unwrap();
    f.mark("a");
    f.a.mov(rax, qword_ptr(rbp - 24)).unwrap();
    f.a.add(rax, rdx).unwrap();
    f.mark("element");
    f.a.mov(eax, dword_ptr(rax)).unwrap();
    f.mark("sum");
    f.a.add(dword_ptr(rbp - 8), eax).unwrap();
    f.mark("increment");
    f.a.add(dword_ptr(rbp - 4), 1).unwrap();
    f.here(&mut cond);
    f.a.mov(eax, dword_ptr(rbp - 4)).unwrap();
    f.a.cmp(eax, dword_ptr(rbp - 28)).unwrap();
    f.a.jl(body).unwrap();
    f.a.mov(eax, dword_ptr(rbp - 8)).unwrap();
    f.a.pop(rbp).unwrap();
    f.a.ret().unwrap();
    let (loads, m) = f.classify();
    assert_eq!(
        class_of(&m, "element"),
        LoadClass::Strided,
        "{:?}",
        m["element"].reason
    );
    for name in ["i", "a", "sum", "increment"] {
        assert_eq!(class_of(&m, name), LoadClass::Constant, "{name}");
    }
    // The body block: 5 loads, one probe implying the 4 Constant ones.
    assert_eq!(m["element"].implied, 4);
    assert!(m["element"].instrumented);
    assert_eq!(m["i"].proxy, Some(m["element"].operand.ip));
    assert!(!m["sum"].instrumented);
    assert!(loads.compression_ratio() > 1.5);
    assert_eq!(loads.stack_loads, 2); // pop, ret
}

#[test]
fn unoptimised_index_from_a_slot_holding_a_loaded_value_is_irregular() {
    // for (...) { j = idx[i]; s += a[j]; } with j in a stack slot.
    let mut f = Asm::new();
    let mut body = f.label();
    f.a.push(rbp).unwrap();
    f.a.mov(rbp, rsp).unwrap();
    f.here(&mut body);
    f.a.mov(eax, dword_ptr(rbp - 4)).unwrap(); // i
    f.a.lea(rdx, ptr(rax * 4)).unwrap();
    f.a.mov(rax, qword_ptr(rbp - 32)).unwrap(); // idx
    f.a.add(rax, rdx).unwrap();
    f.mark("index");
    f.a.mov(eax, dword_ptr(rax)).unwrap();
    f.a.mov(dword_ptr(rbp - 8), eax).unwrap(); // j = idx[i]
    f.a.mov(eax, dword_ptr(rbp - 8)).unwrap();
    f.a.lea(rdx, ptr(rax * 4)).unwrap();
    f.a.mov(rax, qword_ptr(rbp - 24)).unwrap(); // a
    f.a.add(rax, rdx).unwrap();
    f.mark("data");
    f.a.mov(eax, dword_ptr(rax)).unwrap();
    f.a.add(dword_ptr(rbp - 12), eax).unwrap();
    f.a.add(dword_ptr(rbp - 4), 1).unwrap();
    f.a.cmp(dword_ptr(rbp - 4), 99).unwrap();
    f.a.jle(body).unwrap();
    f.a.pop(rbp).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(class_of(&m, "index"), LoadClass::Strided);
    assert_eq!(class_of(&m, "data"), LoadClass::Irregular);
}

#[test]
fn spilled_induction_variable_in_an_rsp_slot_is_strided() {
    let mut f = Asm::new();
    let mut top = f.label();
    f.a.sub(rsp, 24).unwrap();
    f.here(&mut top);
    f.a.mov(rax, qword_ptr(rsp + 16)).unwrap();
    f.mark("load");
    f.a.add(ecx, dword_ptr(rdi + rax * 4)).unwrap();
    f.a.add(rax, 1).unwrap();
    f.a.mov(qword_ptr(rsp + 16), rax).unwrap();
    f.a.cmp(rax, rsi).unwrap();
    f.a.jne(top).unwrap();
    f.a.add(rsp, 24).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(
        class_of(&m, "load"),
        LoadClass::Strided,
        "{:?}",
        m["load"].reason
    );
}

#[test]
fn invariant_reloaded_pointer_is_a_fine_base_but_itself_irregular() {
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    f.mark("reload");
    f.a.mov(r8, qword_ptr(rdi)).unwrap(); // self.ptr re-read each iteration
    f.mark("element");
    f.a.add(rax, qword_ptr(r8 + rcx * 8)).unwrap();
    f.a.mov(qword_ptr(rdx + rcx * 8), rax).unwrap(); // a store elsewhere
    f.a.inc(rcx).unwrap();
    f.a.cmp(rcx, rsi).unwrap();
    f.a.jne(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(class_of(&m, "element"), LoadClass::Strided);
    assert_eq!(m["reload"].reason, Reason::LoopInvariant);
}

#[test]
fn a_pointer_stored_and_reloaded_in_the_loop_is_not_invariant() {
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    f.a.mov(r8, qword_ptr(rdi)).unwrap();
    f.mark("deref");
    f.a.add(rax, qword_ptr(r8)).unwrap();
    f.a.mov(r8, qword_ptr(r8 + 8)).unwrap();
    f.a.mov(qword_ptr(rdi), r8).unwrap(); // *head = head->next
    f.a.dec(rsi).unwrap();
    f.a.jne(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(class_of(&m, "deref"), LoadClass::Irregular);
}

#[test]
fn outer_loop_induction_counts_when_invariant_in_the_inner_loop() {
    // for i { for j { s += a[i] + b[j] } }
    let mut f = Asm::new();
    let (mut outer, mut inner) = (f.label(), f.label());
    f.here(&mut outer);
    f.a.xor(edx, edx).unwrap();
    f.here(&mut inner);
    f.mark("a_i");
    f.a.add(rax, qword_ptr(rdi + rcx * 8)).unwrap();
    f.mark("b_j");
    f.a.add(rax, qword_ptr(rsi + rdx * 8)).unwrap();
    f.a.inc(rdx).unwrap();
    f.a.cmp(rdx, r8).unwrap();
    f.a.jne(inner).unwrap();
    f.a.inc(rcx).unwrap();
    f.a.cmp(rcx, r9).unwrap();
    f.a.jne(outer).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(
        class_of(&m, "a_i"),
        LoadClass::Strided,
        "{:?}",
        m["a_i"].reason
    );
    assert_eq!(class_of(&m, "b_j"), LoadClass::Strided);
    assert_eq!(m["b_j"].loop_depth, 2);
}

#[test]
fn vector_loads_classify_like_scalar_ones_and_gathers_are_irregular() {
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    f.mark("vector");
    f.a.movdqu(xmm0, xmmword_ptr(rdi + rax)).unwrap();
    f.mark("avx");
    f.a.vpaddd(ymm1, ymm1, ymmword_ptr(rsi + rax * 2)).unwrap();
    f.mark("gather");
    f.a.vpgatherdd_3(xmm2, dword_ptr(rdx + xmm3 * 4), xmm4)
        .unwrap();
    f.a.add(rax, 16).unwrap();
    f.a.cmp(rax, rcx).unwrap();
    f.a.jb(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(class_of(&m, "vector"), LoadClass::Strided);
    assert_eq!(m["vector"].operand.size, 16);
    assert_eq!(class_of(&m, "avx"), LoadClass::Strided);
    assert_eq!(class_of(&m, "gather"), LoadClass::Irregular);
    assert_eq!(m["gather"].reason, Reason::Gather);
}

#[test]
fn bit_tests_at_a_register_offset_are_never_constant() {
    let mut f = Asm::new();
    let mut data = f.label();
    f.mark("bitmap");
    f.a.bt(qword_ptr(data), rsi).unwrap();
    f.mark("bitmap_set");
    f.a.bts(qword_ptr(data), rsi).unwrap();
    f.mark("immediate");
    f.a.bt(qword_ptr(data), 45).unwrap();
    f.a.ret().unwrap();
    f.here(&mut data);
    f.a.dq(&[0]).unwrap();
    let (_, m) = f.classify();
    for name in ["bitmap", "bitmap_set"] {
        assert_eq!(class_of(&m, name), LoadClass::Irregular, "{name}");
        assert_eq!(
            m[name].reason,
            Reason::BitOffset {
                register: Register::RSI
            }
        );
    }
    assert_eq!(class_of(&m, "immediate"), LoadClass::Constant);
}

#[test]
fn binary_search_and_hashing_are_irregular() {
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    f.a.lea(rax, ptr(r8 + r9)).unwrap();
    f.a.shr(rax, 1).unwrap();
    f.mark("probe");
    f.a.cmp(qword_ptr(rdi + rax * 8), rsi).unwrap();
    f.a.cmovb(r8, rax).unwrap();
    f.a.cmovae(r9, rax).unwrap();
    f.a.imul_3(r10, rcx, 0x9e37).unwrap();
    f.a.and(r10, 1023).unwrap();
    f.mark("hash");
    f.a.add(r11, qword_ptr(rdx + r10 * 8)).unwrap();
    f.a.inc(rcx).unwrap();
    f.a.cmp(r8, r9).unwrap();
    f.a.jb(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(
        class_of(&m, "probe"),
        LoadClass::Irregular,
        "{:?}",
        m["probe"].reason
    );
    assert_eq!(
        class_of(&m, "hash"),
        LoadClass::Irregular,
        "{:?}",
        m["hash"].reason
    );
}

#[test]
fn call_results_as_indices_are_irregular() {
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    f.a.call(0x9000u64).unwrap();
    f.mark("load");
    f.a.add(rbx, qword_ptr(r12 + rax * 8)).unwrap();
    f.a.dec(r13).unwrap();
    f.a.jne(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(class_of(&m, "load"), LoadClass::Irregular);
    assert!(matches!(m["load"].reason, Reason::CallResult { .. }));
}

#[test]
fn constant_only_block_instruments_its_first_load_as_proxy() {
    let mut f = Asm::new();
    f.mark("first");
    f.a.mov(rax, qword_ptr(rsp + 8)).unwrap();
    f.mark("second");
    f.a.add(rax, qword_ptr(rsp + 16)).unwrap();
    f.mark("third");
    f.a.add(rax, qword_ptr(rsp + 24)).unwrap();
    f.a.ret().unwrap();
    let (loads, m) = f.classify();
    assert!(m["first"].instrumented);
    assert_eq!(m["first"].implied, 2);
    assert!(!m["second"].instrumented && !m["third"].instrumented);
    assert_eq!(m["third"].proxy, Some(m["first"].operand.ip));
    assert_eq!(loads.compression_ratio(), 3.0);
}

#[test]
fn blocks_are_compressed_separately() {
    let mut f = Asm::new();
    let mut next = f.label();
    f.mark("a");
    f.a.mov(rax, qword_ptr(rsp + 8)).unwrap();
    f.mark("b");
    f.a.add(rax, qword_ptr(rdi)).unwrap(); // irregular: carries "a"
    f.a.test(rax, rax).unwrap();
    f.a.je(next).unwrap();
    f.mark("c");
    f.a.add(rax, qword_ptr(rsp + 16)).unwrap();
    f.here(&mut next);
    f.mark("d");
    f.a.add(rax, qword_ptr(rsp + 24)).unwrap();
    f.a.ret().unwrap();
    let (loads, m) = f.classify();
    assert_eq!((m["b"].instrumented, m["b"].implied), (true, 1));
    assert_eq!(m["a"].proxy, Some(m["b"].operand.ip));
    assert_eq!((m["c"].instrumented, m["c"].implied), (true, 0));
    assert_eq!((m["d"].instrumented, m["d"].implied), (true, 0));
    assert_eq!(loads.instrumented(), 3);
}

#[test]
fn very_long_definition_chains_end_without_exhausting_the_stack() {
    // Runs on a test thread (2 MiB stack): the chase must stay bounded.
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    for _ in 0..3000 {
        f.a.lea(rax, ptr(rax + rcx)).unwrap();
    }
    f.mark("load");
    f.a.mov(rdx, qword_ptr(rdi + rax)).unwrap();
    f.a.dec(rsi).unwrap();
    f.a.jne(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert!(matches!(
        m["load"].class,
        LoadClass::Irregular | LoadClass::Strided
    ));
}

#[test]
fn values_computed_from_flags_are_not_invariant() {
    // setb al; movzx eax, al: a data-dependent 0/1 index.
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    f.a.cmp(qword_ptr(rsi + rcx * 8), rdx).unwrap();
    f.a.setb(al).unwrap();
    f.a.movzx(eax, al).unwrap();
    f.mark("load");
    f.a.add(r8, qword_ptr(rdi + rax * 8)).unwrap();
    f.a.inc(rcx).unwrap();
    f.a.cmp(rcx, r9).unwrap();
    f.a.jne(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(
        class_of(&m, "load"),
        LoadClass::Irregular,
        "{:?}",
        m["load"].reason
    );
}

#[test]
fn a_loop_of_thousands_of_blocks_classifies_in_linear_time() {
    // 4,000 conditional blocks in one loop body, each with a load: the
    // per-(loop, variable) data flow keeps this linear (a per-query search
    // made it quadratic: 18 s on /usr/bin/gcov). Runs in milliseconds.
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    for k in 0..4000 {
        let mut skip = f.label();
        if k == 3999 {
            f.mark("last");
        }
        f.a.mov(rax, qword_ptr(rdi + rcx * 8 + k * 8)).unwrap();
        f.a.test(rax, rax).unwrap();
        f.a.je(skip).unwrap();
        f.a.add(rdx, rax).unwrap();
        f.here(&mut skip);
    }
    f.a.inc(rcx).unwrap();
    f.a.cmp(rcx, rsi).unwrap();
    f.a.jne(top).unwrap();
    f.a.ret().unwrap();
    let (loads, m) = f.classify();
    assert_eq!(loads.loads.len(), 4000);
    assert_eq!(loads.count(LoadClass::Strided), 4000);
    assert_eq!(class_of(&m, "last"), LoadClass::Strided);
}

#[test]
fn string_reads_are_strided_and_never_carry_a_blocks_constant_loads() {
    let mut f = Asm::new();
    f.mark("stack");
    f.a.mov(rcx, qword_ptr(rsp + 8)).unwrap();
    f.mark("movs");
    f.a.rep().movsb().unwrap();
    f.mark("cmps");
    f.a.repe().cmpsq().unwrap();
    f.a.ret().unwrap();
    let (loads, m) = f.classify();
    // A site per source: movsb [rsi]; cmpsq es:[rdi], [rsi].
    let strings: Vec<&ClassifiedLoad> = loads.loads.iter().filter(|l| l.operand.string).collect();
    assert_eq!(strings.len(), 3);
    for l in &strings {
        assert_eq!(
            (l.class, l.reason),
            (LoadClass::Strided, Reason::StringInstruction)
        );
        assert!(l.instrumented && l.implied == 0 && l.proxy.is_none());
    }
    assert_eq!(m["movs"].operand.size, 1);
    assert_eq!(m["cmps"].operand.base, Register::RDI);
    assert_eq!(m["cmps"].operand.size, 8);
    // The Constant load carries its own probe rather than ride on a
    // string read's per-element records.
    assert!(m["stack"].instrumented && m["stack"].proxy.is_none());
    assert_eq!(loads.string_loads, 0);
}

#[test]
fn a_swap_cycle_through_both_registers_of_one_instruction_closes() {
    // `xchg` defines rax and rbx: following rax goes through rbx back to
    // the same instruction, which is then on the chain twice (once per
    // register) and must be found there, not walked again to the depth
    // limit.
    let mut f = Asm::new();
    let mut top = f.label();
    f.here(&mut top);
    f.a.xchg(rax, rbx).unwrap();
    f.mark("load");
    f.a.add(rdx, qword_ptr(rdi + rax * 8)).unwrap();
    f.a.dec(rsi).unwrap();
    f.a.jne(top).unwrap();
    f.a.ret().unwrap();
    let (_, m) = f.classify();
    assert_eq!(m["load"].reason, Reason::LoopInvariant, "{:?}", m["load"]);
}

/// A small deterministic generator (xorshift), so that the random loops
/// below are the same on every run.
struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A loop of `blocks` blocks that move, copy and bump four pointers
/// (`mov`, `lea`, `add`, `inc`, through a stack slot too), with forward
/// branches between the blocks and a load through each pointer: like
/// gzip's matching loop, whose value queries never settle.
fn pointer_shuffling_loop(seed: u64, blocks: usize) -> FunctionCode {
    let regs = [rax, rbx, rcx, rdx];
    let mut rng = Xorshift(seed | 1);
    let mut a = CodeAssembler::new(64).unwrap();
    let mut labels: Vec<CodeLabel> = (0..=blocks).map(|_| a.create_label()).collect();
    for b in 0..blocks {
        a.set_label(&mut labels[b]).unwrap();
        for _ in 0..1 + rng.below(3) {
            let dst = regs[rng.below(4) as usize];
            let src = regs[rng.below(4) as usize];
            match rng.below(6) {
                0 => a.mov(dst, src).unwrap(),
                1 => a.lea(dst, ptr(src + 1 + rng.below(3) as i32)).unwrap(),
                2 => a.add(dst, 1 + rng.below(3) as i32).unwrap(),
                3 => a.inc(dst).unwrap(),
                4 => a.mov(qword_ptr(rsp + 0x28), src).unwrap(),
                _ => a.mov(dst, qword_ptr(rsp + 0x28)).unwrap(),
            }
        }
        let reg = regs[rng.below(4) as usize];
        a.movzx(r8d, byte_ptr(rdi + reg)).unwrap();
        a.cmp(r8d, esi).unwrap();
        let target = b + 1 + rng.below(4) as usize;
        a.je(labels[target.min(blocks)]).unwrap();
    }
    a.set_label(&mut labels[blocks]).unwrap();
    a.dec(r9).unwrap();
    a.jne(labels[0]).unwrap();
    a.ret().unwrap();
    let bytes = a.assemble(0x1000).unwrap();
    FunctionCode::build(
        &bytes,
        0x1000,
        &FlatMemory {
            base: 0x1000,
            bytes: &bytes,
        },
    )
}

/// Asks two evaluators of `code`, one replaying walks and one repeating
/// them, every question the classifier asks of its loads, in its order,
/// and requires the same answers and the same budget left after each.
/// Returns how many queries ran out of budget.
fn replays_answer_as_walks(code: &FunctionCode) -> usize {
    let loops = code.loops();
    let frame = Frame::compute(code, loops, &mut Usages::new());
    let mut replaying = Evaluator::new(code, loops, &frame);
    let mut walking = Evaluator::new(code, loops, &frame).without_replays();
    let mut info = iced_x86::InstructionInfoFactory::new();
    let mut exhausted = 0;
    for (i, insn) in code.instructions.iter().enumerate() {
        let Some(op) = operands::explicit_load(&mut info, insn, i as u32) else {
            continue;
        };
        for l in loops.nest(code.block_of[i]) {
            for reg in [op.index, op.base] {
                if matches!(reg, Register::None | Register::RIP | Register::RSP) {
                    continue;
                }
                let expected = walking.register(l, reg, i);
                let got = replaying.register(l, reg, i);
                assert_eq!(got, expected, "loop {l}, {reg:?} before {insn}");
                assert_eq!(replaying.budget_left(), walking.budget_left());
                if walking.budget_left() == 0 {
                    exhausted += 1;
                }
            }
        }
    }
    exhausted
}

#[test]
fn replayed_walks_answer_as_the_walks_they_replace() {
    // Each loop's queries include ones that run out of budget; the answer
    // of those depends on exactly where the budget ran out, so any step
    // a replay charges wrongly, or any replay of a walk in a context where
    // it would have gone differently, changes an answer or the budget
    // left.
    let mut exhausted = 0;
    for seed in 0..24 {
        let code = pointer_shuffling_loop(seed * 7919 + 11, 40);
        exhausted += replays_answer_as_walks(&code);
    }
    assert!(
        exhausted >= 10,
        "only {exhausted} queries ran out of budget"
    );
}

/// The last definition of `v` in block `b`, by a scan of its instructions.
fn last_definition(code: &FunctionCode, frame: &Frame, b: u32, v: frame::Var) -> Option<u32> {
    code.blocks[b as usize]
        .instructions()
        .rev()
        .find(|&i| frame.def_kind(i, v).is_some())
        .map(|i| i as u32)
}

/// The definitions that reach the entry of the block at position `k` of
/// a loop whose blocks are `blocks` and whose blocks' last definitions of a
/// variable are `last`, by a search backwards along the loop's edges: a
/// predecessor that defines the variable gives its last definition, one
/// that does not is searched through. Sorted.
fn definitions_reaching_entry(
    code: &FunctionCode,
    blocks: &[u32],
    last: &[Option<u32>],
    k: usize,
) -> Vec<u32> {
    let mut searched = vec![false; blocks.len()];
    searched[k] = true;
    let mut stack = vec![k];
    let mut found = Vec::new();
    while let Some(x) = stack.pop() {
        for p in &code.blocks[blocks[x] as usize].predecessors {
            let Ok(p) = blocks.binary_search(p) else {
                continue;
            };
            match last[p] {
                Some(d) => found.push(d),
                None if !searched[p] => {
                    searched[p] = true;
                    stack.push(p);
                }
                None => {}
            }
        }
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// Compares the evaluator's entry definitions with
/// [`definitions_reaching_entry`] for every loop of `code`, every register
/// and every stack slot of its frame. Returns how many (loop, variable)
/// pairs had definitions in the loop and how many had more than 64
/// defining blocks (sets of several words).
fn entry_definitions_match_a_search(code: &FunctionCode) -> (usize, usize) {
    let loops = code.loops();
    if loops.loops.is_empty() {
        return (0, 0);
    }
    let frame = Frame::compute(code, loops, &mut Usages::new());
    let mut evaluator = Evaluator::new(code, loops, &frame);
    let vars = frame::GPRS + frame.slots.len() as frame::Var;
    let (mut defined, mut wide) = (0, 0);
    for (l, lp) in loops.loops.iter().enumerate() {
        for v in 0..vars {
            let got = evaluator.entry_definitions(l as u32, v);
            assert_eq!(got.len(), lp.blocks.len());
            let last: Vec<Option<u32>> = lp
                .blocks
                .iter()
                .map(|&b| last_definition(code, &frame, b, v))
                .collect();
            let defining = last.iter().flatten().count();
            defined += usize::from(defining > 0);
            wide += usize::from(defining > 64);
            for (k, got) in got.iter().enumerate() {
                let expected = definitions_reaching_entry(code, &lp.blocks, &last, k);
                assert_eq!(
                    *got, expected,
                    "function {:#x}, loop {l}, variable {v}, block {}",
                    code.start, lp.blocks[k]
                );
            }
        }
    }
    (defined, wide)
}

#[test]
fn entry_definitions_are_those_a_search_of_the_loop_finds() {
    // This test executable's functions (compiled loops of every shape) and
    // generated loops of up to 300 blocks, whose registers are defined in
    // more than 64 blocks.
    let binary = crate::binary::Binary::open(std::env::current_exe().unwrap()).unwrap();
    use rayon::prelude::*;
    let defined: usize = binary
        .functions()
        .par_iter()
        .map(|f| entry_definitions_match_a_search(&binary.function_code(f)).0)
        .sum();
    assert!(defined > 10_000, "{defined} (loop, variable) pairs defined");
    let mut wide = 0;
    for (seed, blocks) in [(3, 40), (5, 120), (7, 300)] {
        wide += entry_definitions_match_a_search(&pointer_shuffling_loop(seed, blocks)).1;
    }
    assert!(wide >= 4, "{wide} (loop, variable) pairs of wide sets");
}

#[test]
fn positions_looked_up_ahead_are_the_ones_added_to_the_loads() {
    // This test executable's loads (its functions about lines) and their
    // positions as `add_lines` gives them.
    let binary = Binary::open(std::env::current_exe().unwrap()).unwrap();
    let annotation = crate::file::annotate(&binary, Some("*lines*")).unwrap();
    let loads = annotation.loads;
    assert!(loads.len() > 100, "{} loads", loads.len());
    assert!(loads.iter().any(|l| l.line.is_some()));
    assert!(loads.iter().any(|l| !l.inline_chain.is_empty()));
    let addresses = sorted_addresses(&loads);
    let table = binary.line_table_for(&addresses);
    let blank = |loads: &[LoadSite]| -> Vec<LoadSite> {
        let mut blank = loads.to_vec();
        for load in &mut blank {
            (load.line, load.inline_chain) = (None, InlineChain::default());
        }
        blank
    };
    // Looked up on this thread (never hurried) and on the pool (hurried
    // from the start).
    for hurried in [false, true] {
        let positions = positions_until_hurried(&addresses, &table, &AtomicBool::new(hurried));
        assert_eq!(positions.len(), addresses.len());
        let mut added = blank(&loads);
        let mut taken = positions.clone();
        assert!(add_positions(&mut added, (&addresses, &mut taken)));
        assert_eq!(added, loads, "hurried: {hurried}");
    }
    // Loads sharing an address (each load twice, or all but a few of them
    // one address), and loads out of order: each is given its address's
    // position all the same, the loads in order whole or in two halves.
    let positions = positions_until_hurried(&addresses, &table, &AtomicBool::new(false));
    let twice: Vec<LoadSite> = loads.iter().flat_map(|l| [l.clone(), l.clone()]).collect();
    let mut bunched = loads.clone();
    let (n, last) = (bunched.len(), loads[loads.len() - 3].clone());
    bunched[n / 4..n - 2].fill(last);
    let reversed: Vec<LoadSite> = loads.iter().rev().cloned().collect();
    for (expected, split_from) in [(twice, 2), (bunched, 2), (reversed, 2), (loads.clone(), 0)] {
        for split_from in [split_from, usize::MAX] {
            let (mut added, mut taken) = (blank(&expected), positions.clone());
            assert!(add_positions_split(
                &mut added,
                (&addresses, &mut taken),
                split_from
            ));
            assert_eq!(added, expected, "split from {split_from}");
        }
    }
    // A load at an address without a position is not given one, nor is
    // any other.
    let positions = positions_until_hurried(&addresses, &table, &AtomicBool::new(false));
    let mut stray = blank(&loads);
    stray.last_mut().unwrap().ip = u64::MAX;
    let before = stray.clone();
    let mut kept = positions.clone();
    assert!(!add_positions(&mut stray, (&addresses, &mut kept)));
    assert_eq!(stray, before);
    assert_eq!(kept, positions);
}

#[test]
fn a_position_reader_gives_the_texts_of_the_tables_chains() {
    // This test executable's instructions in its functions about lines
    // and in every 11th function (inlined code among them), and addresses
    // with no position, asked in rising order and then in one with falls:
    // each position is the texts of the table's own chain of its address.
    let binary = Binary::open(std::env::current_exe().unwrap()).unwrap();
    let mut addresses: Vec<u64> = Vec::new();
    for (i, f) in binary.functions().iter().enumerate() {
        if f.name.contains("lines") || i % 11 == 0 {
            addresses.extend(binary.decode(f).iter().map(iced_x86::Instruction::ip));
        }
    }
    addresses.extend([0, 1, u64::MAX]);
    addresses.sort_unstable();
    addresses.dedup();
    let table = binary.line_table_for(&addresses);
    let expected = |a: u64| -> (Option<String>, Vec<String>) {
        let chain = table.locate_chain(a);
        let texts: Vec<String> = chain.iter().map(ToString::to_string).collect();
        let line = texts.first().cloned();
        (line, if texts.len() < 2 { Vec::new() } else { texts })
    };
    let text = |(line, chain): Position| -> (Option<String>, Vec<String>) {
        (
            line.map(|t| t.to_string()),
            chain.iter().map(|t| t.to_string()).collect(),
        )
    };
    let shared = PositionTexts::default();
    let mut reader = PositionReader::new(&table, &shared);
    let (mut inlined, mut missing) = (0, 0);
    for &a in &addresses {
        let want = expected(a);
        inlined += usize::from(!want.1.is_empty());
        missing += usize::from(want.0.is_none());
        assert_eq!(text(reader.position(a)), want, "{a:#x}");
    }
    assert!(
        inlined > 10 && missing >= 2,
        "{inlined} inlined, {missing} without"
    );
    for &a in addresses
        .iter()
        .rev()
        .step_by(3)
        .chain(addresses.iter().step_by(7))
    {
        assert_eq!(text(reader.position(a)), expected(a), "{a:#x}");
    }
    // Back and forth between neighbours, as the loads of an inlined body
    // go between its lines: texts from the recent slots, the cursor
    // starting afresh at each fall.
    for near in addresses.windows(3) {
        for a in [near[0], near[2], near[1], near[2], near[0]] {
            assert_eq!(text(reader.position(a)), expected(a), "{a:#x}");
        }
    }
}
