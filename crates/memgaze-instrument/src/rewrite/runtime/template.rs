//! Precomputed runtimes: the assembler's output ([`super::assemble`]) for a
//! canonical placement, one per *shape*, with the fields that depend on
//! the placement marked as holes. Assembling the runtime (some 2,400
//! instructions through iced's block encoder) was a fixed cost of every
//! instrumentation, as large as a small executable's whole rewrite;
//! filling a template's holes costs microseconds.
//!
//! A shape is what changes the code's layout rather than its constants:
//! whether the entry hook tests CPU features, whether `fini` chains to an
//! original `DT_FINI`, and the class of escape counters whose constants
//! encode in the same widths. Within a shape every hole is linear in the
//! [`RuntimeParams`]: a field holds its template value plus, per
//! parameter, a coefficient times the parameter's distance from the
//! canonical placement (`lea r12, [rip → state]` moves with the state
//! and against the code).
//!
//! The templates are derived from the assembler by assembling each shape
//! at the canonical placement and again with one parameter moved at a
//! time, and reading which instruction fields changed and by how much
//! (see `derive`); a test proves the stored templates are what the
//! assembler produces now (`MEMGAZE_BLESS_RUNTIME=1` rewrites them after
//! a change to the runtime), and that filled templates equal assembled
//! runtimes at other placements. Placements no template fits (more
//! escape counters than `derive::MAX_ESCAPE_SITES`, a chained entry point
//! within a short jump, a field out of range) are assembled.

use super::{ENTRIES, Runtime, RuntimeParams};

/// The stored templates (see [`parse`] for the layout).
const TEMPLATES: &[u8] = include_bytes!("templates.bin");

/// The format's signature and version.
const MAGIC: &[u8; 8] = b"MGRT\x00\x00\x00\x01";

/// Parameters a hole may depend on, in the order of [`values`].
const PARAMS: usize = 7;
/// The first this many of them are addresses.
const ADDRESSES: usize = 5;

/// The canonical placement of the templates (`cpu_features`,
/// `original_fini`'s presence and `escape_sites` are the shape's).
const CANONICAL: RuntimeParams = RuntimeParams {
    code_va: 0x40_0000,
    header_va: 0x40_0000 - 64,
    state_va: 0x80_0000,
    original_entry: 0x1_0000,
    original_fini: Some(0x1_1000),
    has_regions: false,
    escape_sites: 0,
    cpu_features: 0,
};

/// The parameters as numbers, in the order of a hole's coefficients.
fn values(params: &RuntimeParams) -> [i128; PARAMS] {
    [
        params.code_va,
        params.header_va,
        params.state_va,
        params.original_entry,
        params.original_fini.unwrap_or(0),
        u64::from(params.has_regions),
        u64::from(params.escape_sites),
    ]
    .map(i128::from)
}

/// A field of the code that depends on the placement.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Hole {
    /// Offset of the field in the code.
    offset: u32,
    /// Its width in bytes (1 or 4, signed).
    width: u8,
    /// Change of the field per unit change of each parameter.
    coefficients: [i32; PARAMS],
}

/// The template of one shape.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Shape {
    /// `cpu_features != 0`.
    cpu_test: bool,
    /// `original_fini.is_some()`.
    chains_fini: bool,
    /// The escape counters it covers, inclusive.
    escape_sites: (u32, u32),
    /// Offsets of the entry points from the code's start.
    entries: [u32; ENTRIES],
    /// The fields that depend on the placement.
    holes: Vec<Hole>,
    /// The code at the canonical placement with the first escape count.
    code: Vec<u8>,
}

impl Shape {
    /// Whether this template is of `params`'s shape.
    fn fits(&self, params: &RuntimeParams) -> bool {
        self.cpu_test == (params.cpu_features != 0)
            && self.chains_fini == params.original_fini.is_some()
            && (self.escape_sites.0..=self.escape_sites.1).contains(&params.escape_sites)
    }

    /// The canonical placement of this shape.
    fn canonical(&self) -> RuntimeParams {
        canonical(self.cpu_test, self.chains_fini, self.escape_sites.0)
    }

    /// The runtime for `params` (of this shape), or `None` where a field
    /// leaves its width, or where a 4-byte field that depends on an
    /// address (a branch or a `rip`-relative operand) would fit in a
    /// byte: the block encoder shortens such branches.
    fn fill(&self, params: &RuntimeParams) -> Option<Runtime> {
        let now = values(params);
        let base = values(&self.canonical());
        let moved: [i128; PARAMS] = std::array::from_fn(|i| now[i] - base[i]);
        let mut code = self.code.clone();
        for hole in &self.holes {
            let at = hole.offset as usize;
            let width = usize::from(hole.width);
            let field = code.get_mut(at..at + width)?;
            let delta: i128 = (0..PARAMS)
                .map(|i| i128::from(hole.coefficients[i]) * moved[i])
                .sum();
            let value = read_signed(field) + delta;
            match width {
                1 => field.copy_from_slice(&i8::try_from(value).ok()?.to_le_bytes()),
                4 => {
                    let address = hole.coefficients[..ADDRESSES].iter().any(|&c| c != 0);
                    if address && i8::try_from(value).is_ok() {
                        return None;
                    }
                    field.copy_from_slice(&i32::try_from(value).ok()?.to_le_bytes());
                }
                _ => return None,
            }
        }
        let entries = self
            .entries
            .map(|offset| params.code_va + u64::from(offset));
        Some(Runtime::with_entries(code, params.cpu_features, entries))
    }
}

/// A little-endian signed field of 1, 2, 4 or 8 bytes.
fn read_signed(field: &[u8]) -> i128 {
    let mut bytes = [0u8; 8];
    bytes[..field.len()].copy_from_slice(field);
    let unsigned = u64::from_le_bytes(bytes);
    let shift = 64 - 8 * field.len() as u32;
    i128::from(((unsigned << shift) as i64) >> shift)
}

/// The canonical placement of a shape.
fn canonical(cpu_test: bool, chains_fini: bool, escape_sites: u32) -> RuntimeParams {
    RuntimeParams {
        original_fini: CANONICAL.original_fini.filter(|_| chains_fini),
        escape_sites,
        cpu_features: if cpu_test { super::CPUID7_EBX_BMI2 } else { 0 },
        ..CANONICAL
    }
}

/// The runtime for `params` from its shape's template, or `None` where no
/// template fits (the caller assembles it).
pub(super) fn instantiate(params: &RuntimeParams) -> Option<Runtime> {
    parse(TEMPLATES, |shape| shape.fits(params))?.fill(params)
}

/// Reads the templates, decompressing the code of the first for which
/// `wanted` holds. The layout, little-endian: [`MAGIC`], then per shape
/// `cpu_test: u8`, `chains_fini: u8`, the escape range (`u32`, `u32`),
/// the entries (`u32` each), the hole count (`u32`) and per hole its
/// offset (`u32`), width (`u8`) and coefficients (`i32` each), then the
/// code's length (`u32`), the compressed length (`u32`) and the code
/// compressed with zstd.
fn parse(mut data: &[u8], wanted: impl Fn(&Shape) -> bool) -> Option<Shape> {
    data = data.strip_prefix(MAGIC)?;
    while !data.is_empty() {
        let mut shape = Shape {
            cpu_test: take::<1>(&mut data)?[0] != 0,
            chains_fini: take::<1>(&mut data)?[0] != 0,
            escape_sites: (take_u32(&mut data)?, take_u32(&mut data)?),
            entries: [0; ENTRIES],
            holes: Vec::new(),
            code: Vec::new(),
        };
        for entry in &mut shape.entries {
            *entry = take_u32(&mut data)?;
        }
        let holes = take_u32(&mut data)?;
        for _ in 0..holes {
            let offset = take_u32(&mut data)?;
            let width = take::<1>(&mut data)?[0];
            let mut coefficients = [0; PARAMS];
            for c in &mut coefficients {
                *c = take_u32(&mut data)? as i32;
            }
            shape.holes.push(Hole {
                offset,
                width,
                coefficients,
            });
        }
        let code_len = take_u32(&mut data)? as usize;
        let compressed_len = take_u32(&mut data)? as usize;
        let compressed = data.get(..compressed_len)?;
        data = &data[compressed_len..];
        if wanted(&shape) {
            shape.code = zstd::bulk::decompress(compressed, code_len).ok()?;
            return (shape.code.len() == code_len).then_some(shape);
        }
    }
    None
}

fn take<const N: usize>(data: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = data.split_first_chunk::<N>()?;
    *data = rest;
    Some(*head)
}

fn take_u32(data: &mut &[u8]) -> Option<u32> {
    take::<4>(data).map(u32::from_le_bytes)
}

#[cfg(test)]
mod derive;

#[cfg(test)]
mod tests;
