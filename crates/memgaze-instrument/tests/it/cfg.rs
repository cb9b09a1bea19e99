//! Control flow on real binaries: structural invariants of blocks and
//! edges, and jump tables from gcc switches and rustc matches.

use memgaze_fixtures as common;

use memgaze_instrument::binary::{
    Binary, FunctionCode, IndirectJumpKind, JumpTableBound, Terminator,
};

/// Checks what every function's CFG must satisfy and returns
/// (indirect jumps, resolved as tables, tail calls through memory).
fn check_invariants(binary: &Binary) -> (usize, usize, usize) {
    let (mut indirect, mut tables, mut tail) = (0, 0, 0);
    for f in binary.functions() {
        let code: FunctionCode = binary.function_code(f);
        if code.instructions.is_empty() {
            continue;
        }
        // Blocks partition the instructions, in order, without gaps.
        let mut next = 0u32;
        for (b, block) in code.blocks.iter().enumerate() {
            assert_eq!(block.first, next, "{}: block {b}", f.name);
            assert!(block.len > 0);
            next += block.len;
            for i in block.instructions() {
                assert_eq!(code.block_of[i] as usize, b);
            }
            assert_eq!(block.start, code.instructions[block.first as usize].ip());
            assert_eq!(block.end, code.instructions[block.last()].next_ip());
            for &s in &block.successors {
                assert!(
                    code.blocks[s as usize].predecessors.contains(&(b as u32)),
                    "{}: edge {b}->{s} lacks its reverse",
                    f.name
                );
            }
            if block.terminator == Terminator::Call {
                let call = code.instructions[block.last()];
                assert!(code.calls.iter().any(|c| c.ip == call.ip()));
            }
        }
        assert_eq!(next as usize, code.instructions.len());
        // Every branch target is a block start.
        for t in &code.branch_targets {
            assert!(
                code.blocks.binary_search_by_key(t, |b| b.start).is_ok(),
                "{}: target {t:#x} inside a block",
                f.name
            );
        }
        for j in &code.indirect_jumps {
            indirect += 1;
            match j.kind {
                IndirectJumpKind::JumpTable(t) => {
                    tables += 1;
                    let jt = &code.jump_tables[t];
                    assert_eq!(jt.jump, j.ip);
                    let block = code.block_of_instruction(j.instruction as usize);
                    assert!(jt.targets.iter().any(|t| f.contains(*t)));
                    for target in jt.targets.iter().filter(|t| f.contains(**t)) {
                        assert!(
                            block
                                .successors
                                .iter()
                                .any(|&s| code.blocks[s as usize].start == *target)
                        );
                    }
                }
                IndirectJumpKind::TailCall => tail += 1,
                IndirectJumpKind::Unresolved => {}
            }
        }
        // Loops: the header dominates every block of its loop.
        let dom = code.dominators();
        let loops = code.loops();
        for l in &loops.loops {
            for &b in &l.blocks {
                assert!(dom.dominates(l.header, b), "{}: loop header", f.name);
            }
            if let Some(p) = l.parent {
                let parent = &loops.loops[p as usize];
                assert!(l.blocks.iter().all(|b| parent.contains(*b)));
                assert_eq!(l.depth, parent.depth + 1);
            }
        }
    }
    (indirect, tables, tail)
}

#[test]
fn gcc_switches_become_bounded_jump_tables() {
    let dir = tempfile::tempdir().unwrap();
    for flags in [&["-O0"][..], &["-O2"], &["-O2", "-no-pie", "-fno-pic"]] {
        let exe = common::gcc("many_functions.c", flags, dir.path());
        let binary = Binary::open(&exe).unwrap();
        let (indirect, tables, tail) = check_invariants(&binary);
        eprintln!("gcc {flags:?}: {indirect} indirect jumps, {tables} tables, {tail} tail calls");
        let picks: Vec<_> = binary
            .functions()
            .iter()
            .filter(|f| f.name.starts_with("pick"))
            .collect();
        assert_eq!(picks.len(), 16);
        for f in picks {
            let code = binary.function_code(f);
            assert_eq!(code.jump_tables.len(), 1, "{} {flags:?}", f.name);
            let jt = &code.jump_tables[0];
            assert_eq!(jt.bound, JumpTableBound::Compare(7), "{} {flags:?}", f.name);
            assert_eq!(jt.targets.len(), 7);
            assert_eq!(code.unresolved_indirect_jumps(), 0);
        }
    }
}

#[test]
fn system_and_rust_binaries_resolve_most_indirect_jumps() {
    let dir = tempfile::tempdir().unwrap();
    let rust = common::rustc("kernels.rs", &[], dir.path());
    for path in [
        rust.as_path(),
        "/usr/bin/gzip".as_ref(),
        "/usr/bin/sort".as_ref(),
    ] {
        let binary = Binary::open(path).unwrap();
        let (indirect, tables, tail) = check_invariants(&binary);
        eprintln!(
            "{}: {} functions, {indirect} indirect jumps, {tables} tables, {tail} tail calls",
            path.display(),
            binary.functions().len()
        );
        assert!(tables > 0);
        // Function-pointer jumps that are not tail calls are rare; anything
        // beyond a few percent means a table shape went unrecognised.
        let unresolved = indirect - tables - tail;
        assert!(
            unresolved * 50 <= indirect,
            "{unresolved} of {indirect} unresolved"
        );
    }
}
