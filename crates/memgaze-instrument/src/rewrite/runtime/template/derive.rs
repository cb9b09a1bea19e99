//! Derives the templates from the assembler: each shape's code at its
//! canonical placement, and its holes from assembling again with one
//! parameter moved at a time.

use super::super::assemble;
use super::{ADDRESSES, Hole, MAGIC, PARAMS, RuntimeParams, Shape, canonical, read_signed, values};
use iced_x86::{Decoder, DecoderOptions};
use std::collections::BTreeMap;

/// Most escape counters a template covers: executables with more are
/// large, and their instrumentation dwarfs the assembly.
pub(super) const MAX_ESCAPE_SITES: u32 = 127;

/// How far an address parameter is moved to find the fields it changes.
const MOVE: u64 = 0x1_2340;

/// Every shape's template, in the order they are stored.
pub(super) fn shapes() -> Vec<Shape> {
    let mut shapes = Vec::new();
    for cpu_test in [false, true] {
        for chains_fini in [false, true] {
            let mut first = 0;
            while first <= MAX_ESCAPE_SITES {
                let shape = derive(cpu_test, chains_fini, first);
                first = shape.escape_sites.1 + 1;
                shapes.push(shape);
            }
        }
    }
    shapes
}

/// The template of a shape from `first` escape counters on, covering as
/// many more as its holes fill exactly.
fn derive(cpu_test: bool, chains_fini: bool, first: u32) -> Shape {
    let base = canonical(cpu_test, chains_fini, first);
    let (runtime, offsets) = assemble(&base).expect("the runtime assembles");
    let mut holes = BTreeMap::new();
    for param in 0..PARAMS {
        let Some(moved) = move_param(&base, param) else {
            continue;
        };
        let (other, _) = assemble(&moved).expect("the runtime assembles");
        let step = values(&moved)[param] - values(&base)[param];
        let found = moved_fields(&runtime.code, &other.code, &offsets, base.code_va, step);
        match found {
            Some(fields) => {
                for (offset, width, coefficient) in fields {
                    let hole = holes.entry(offset).or_insert(Hole {
                        offset,
                        width,
                        coefficients: [0; PARAMS],
                    });
                    assert_eq!(hole.width, width, "field at {offset:#x}");
                    hole.coefficients[param] = coefficient;
                }
            }
            // Another escape count may change the layout: a shape of its own.
            None => assert!(
                param >= ADDRESSES,
                "moving parameter {param} changes the runtime's layout"
            ),
        }
    }
    let mut shape = Shape {
        cpu_test,
        chains_fini,
        escape_sites: (first, first),
        entries: runtime
            .entries()
            .map(|ip| u32::try_from(ip - base.code_va).expect("entry in the code")),
        holes: holes.into_values().collect(),
        code: runtime.code,
    };
    while shape.escape_sites.1 < MAX_ESCAPE_SITES {
        let next = RuntimeParams {
            escape_sites: shape.escape_sites.1 + 1,
            ..base
        };
        let assembled = assemble(&next).expect("the runtime assembles").0;
        if shape.fill(&next).as_ref() != Some(&assembled) {
            break;
        }
        shape.escape_sites.1 += 1;
    }
    shape
}

/// `base` with parameter `param` (in the order of [`values`]) moved, or
/// `None` where the shape has no such parameter.
fn move_param(base: &RuntimeParams, param: usize) -> Option<RuntimeParams> {
    let mut moved = *base;
    match param {
        0 => moved.code_va += MOVE,
        1 => moved.header_va += MOVE,
        2 => moved.state_va += MOVE,
        3 => moved.original_entry += MOVE,
        4 => moved.original_fini = Some(base.original_fini? + MOVE),
        5 => moved.has_regions = !base.has_regions,
        6 => moved.escape_sites += 1,
        _ => unreachable!("{PARAMS} parameters"),
    }
    Some(moved)
}

/// The fields (offset, width, change per unit of the parameter) in which
/// `moved` differs from `code`, after the parameter moved by `step`; `None`
/// where the layout differs or a change is not a whole multiple of `step`
/// within one displacement or immediate.
fn moved_fields(
    code: &[u8],
    moved: &[u8],
    offsets: &[u32],
    code_va: u64,
    step: i128,
) -> Option<Vec<(u32, u8, i32)>> {
    if code.len() != moved.len() {
        return None;
    }
    let mut starts: Vec<u32> = offsets.iter().copied().filter(|&o| o != u32::MAX).collect();
    starts.sort_unstable();
    let mut fields: Vec<(u32, u8, i32)> = Vec::new();
    for at in (0..code.len()).filter(|&i| code[i] != moved[i]) {
        let at = at as u32;
        if fields
            .last()
            .is_some_and(|&(o, w, _)| at < o + u32::from(w))
        {
            continue;
        }
        let start = starts[starts.partition_point(|&s| s <= at).checked_sub(1)?];
        let (offset, width) = field_at(code, start, at, code_va)?;
        let range = offset as usize..offset as usize + usize::from(width);
        let change = read_signed(&moved[range.clone()]) - read_signed(&code[range]);
        if change % step != 0 {
            return None;
        }
        fields.push((offset, width, i32::try_from(change / step).ok()?));
    }
    Some(fields)
}

/// The displacement or immediate (offset, width) of the instruction at
/// `start` that holds byte `at`.
fn field_at(code: &[u8], start: u32, at: u32, code_va: u64) -> Option<(u32, u8)> {
    let mut decoder = Decoder::with_ip(
        64,
        &code[start as usize..],
        code_va + u64::from(start),
        DecoderOptions::NONE,
    );
    let insn = decoder.decode();
    let constants = decoder.get_constant_offsets(&insn);
    [
        (
            constants.displacement_offset(),
            constants.displacement_size(),
        ),
        (constants.immediate_offset(), constants.immediate_size()),
        (constants.immediate_offset2(), constants.immediate_size2()),
    ]
    .into_iter()
    .filter(|&(_, size)| size > 0)
    .map(|(offset, size)| (start + offset as u32, size as u8))
    .find(|&(offset, size)| (offset..offset + u32::from(size)).contains(&at))
}

/// The stored form of `shapes` (see [`super::parse`]).
pub(super) fn serialize(shapes: &[Shape]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    for shape in shapes {
        out.push(u8::from(shape.cpu_test));
        out.push(u8::from(shape.chains_fini));
        out.extend(shape.escape_sites.0.to_le_bytes());
        out.extend(shape.escape_sites.1.to_le_bytes());
        for entry in shape.entries {
            out.extend(entry.to_le_bytes());
        }
        out.extend((shape.holes.len() as u32).to_le_bytes());
        for hole in &shape.holes {
            out.extend(hole.offset.to_le_bytes());
            out.push(hole.width);
            for c in hole.coefficients {
                out.extend(c.to_le_bytes());
            }
        }
        let compressed = zstd::bulk::compress(&shape.code, 19).expect("zstd compresses");
        out.extend((shape.code.len() as u32).to_le_bytes());
        out.extend((compressed.len() as u32).to_le_bytes());
        out.extend(compressed);
    }
    out
}
