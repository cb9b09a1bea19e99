//! `file:line` of code addresses from DWARF line tables, and the chain of
//! calls inlined code sits in.
//!
//! The line programs of all compilation units are run once (gimli) into one
//! sorted table of rows; a lookup is a binary search. Line-table rows
//! describe the innermost (inlined) source position. The
//! `DW_TAG_inlined_subroutine` entries give, for each address range of
//! inlined code, the `file:line` it was inlined at (`DW_AT_call_file`,
//! `DW_AT_call_line`) and its nesting depth: the chain of an address is its
//! row's position, then the call sites of the inlined ranges holding it,
//! innermost first (what addr2line prints with `-i`). Users read a load in
//! `BTreeMap::get` as the line of their own code that called it. This keeps
//! the tables owned and `Sync`, unlike an `addr2line::Context` borrowing the
//! file.

use foldhash::{HashMap, HashMapExt};
use gimli::{AttributeValue, EndianSlice, LittleEndian, SectionId};

type Reader<'a> = EndianSlice<'a, LittleEndian>;

/// Marks a row that ends a sequence (no source position from there on).
const NO_FILE: u32 = u32::MAX;

/// Every section a line table is read from.
const DWARF_SECTIONS: [SectionId; 9] = [
    SectionId::DebugAbbrev,
    SectionId::DebugAddr,
    SectionId::DebugInfo,
    SectionId::DebugLine,
    SectionId::DebugLineStr,
    SectionId::DebugRanges,
    SectionId::DebugRngLists,
    SectionId::DebugStr,
    SectionId::DebugStrOffsets,
];

#[derive(Clone, Copy, Debug)]
struct Row {
    address: u64,
    file: u32,
    line: u32,
}

/// An address range of inlined code and the call it was inlined at.
#[derive(Clone, Copy, Debug)]
struct Inline {
    begin: u64,
    end: u64,
    /// Depth of the `DW_TAG_inlined_subroutine` in its unit's tree: deeper
    /// is further in (ranges holding one address nest).
    depth: u32,
    /// The call site.
    file: u32,
    line: u32,
}

/// A source position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceLocation<'a> {
    /// File path as recorded by the compiler (joined with the compilation
    /// directory when relative).
    pub file: &'a str,
    /// 1-based line.
    pub line: u32,
}

impl SourceLocation<'_> {
    /// `file:line`, allocated once at its final size (an annotation holds
    /// one or more per load: `to_string`'s growth doubled their memory).
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut text = String::with_capacity(self.file.len() + 1 + 10);
        let _ = write!(text, "{}:{}", self.file, self.line);
        text
    }
}

impl std::fmt::Display for SourceLocation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// All line-table rows of a binary.
#[derive(Debug, Default)]
pub(crate) struct LineTable {
    rows: Vec<Row>,
    files: Vec<String>,
    /// Inlined ranges by `begin`.
    inlines: Vec<Inline>,
    /// `max(end)` of `inlines[..=i]`: a backward scan for the ranges
    /// holding an address stops where no earlier range reaches it.
    inline_reach: Vec<u64>,
    /// Why there are no rows although the binary has DWARF sections (e.g.
    /// compressed with an unsupported algorithm, or malformed).
    pub problem: Option<String>,
}

impl LineTable {
    /// Whether any row exists.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The source position of the instruction at `address`.
    pub(crate) fn locate(&self, address: u64) -> Option<SourceLocation<'_>> {
        self.position_before(self.rows.partition_point(|r| r.address <= address))
    }

    /// The source position of the row before `rows[after]`.
    fn position_before(&self, after: usize) -> Option<SourceLocation<'_>> {
        let row = self.rows.get(after.checked_sub(1)?)?;
        if row.file == NO_FILE || row.line == 0 {
            return None;
        }
        Some(SourceLocation {
            file: &self.files[row.file as usize],
            line: row.line,
        })
    }

    /// The source positions of the instruction at `address`, innermost
    /// first: its line-table position, then each call its code was inlined
    /// at, out to the line in the function that holds it. Empty where the
    /// line table has no position.
    pub fn locate_chain(&self, address: u64) -> Vec<SourceLocation<'_>> {
        let Some(first) = self.locate(address) else {
            return Vec::new();
        };
        thread_local! {
            /// The ranges holding the address, by index: reused across
            /// lookups, which come by the hundred thousand from all cores.
            static HOLDING: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        HOLDING.with_borrow_mut(|holding| {
            holding.clear();
            self.scan_holding(address, holding);
            let mut chain = Vec::with_capacity(1 + holding.len());
            self.chain_into(first, holding, &mut chain);
            chain
        })
    }

    /// Pushes the indices of the inlined ranges holding `address`, from
    /// the last to begin at or before it back (highest index first);
    /// returns the index of the first range beginning after `address`.
    fn scan_holding(&self, address: u64, holding: &mut Vec<usize>) -> usize {
        let after = self.inlines.partition_point(|r| r.begin <= address);
        let mut i = after;
        while i > 0 && self.inline_reach[i - 1] > address {
            i -= 1;
            if self.inlines[i].end > address {
                holding.push(i);
            }
        }
        after
    }

    /// The chain of an address whose row position is `first`, inside the
    /// inlined ranges `holding` (highest index first; reordered here),
    /// into `chain` (cleared first).
    fn chain_into<'t>(
        &'t self,
        first: SourceLocation<'t>,
        holding: &mut Vec<usize>,
        chain: &mut Vec<SourceLocation<'t>>,
    ) {
        holding.sort_by_key(|&i| std::cmp::Reverse(self.inlines[i].depth));
        // One inlined subroutine may list the same range twice (split
        // `DW_AT_ranges`); its call site counts once.
        holding.dedup_by_key(|&mut i| {
            let r = &self.inlines[i];
            (r.depth, r.file, r.line)
        });
        chain.clear();
        chain.push(first);
        chain.extend(
            holding
                .iter()
                .map(|&i| &self.inlines[i])
                .filter(|r| r.line != 0)
                .map(|r| SourceLocation {
                    file: &self.files[r.file as usize],
                    line: r.line,
                }),
        );
    }

    /// Builds the table. `section` returns the (decompressed) contents of a
    /// DWARF section by name, or an empty slice when absent.
    /// `is_code` tells whether an address lies in executable code: sequences
    /// that start elsewhere (address 0 tombstones of functions the linker
    /// discarded) are dropped. With `wanted` (sorted addresses), only what
    /// their lookups read is kept: the rows whose range holds one of them,
    /// each sequence's first and last row, and the inlined ranges holding
    /// one. Those lookups answer as in the whole table, which for a large
    /// Rust binary is hundreds of MB. The units are read at `pace`.
    pub fn build<'a>(
        section: impl Fn(&str) -> &'a [u8],
        is_code: impl Fn(u64) -> bool + Sync,
        (wanted, pace): (Option<&[u64]>, UnitPace<'_>),
        release: impl Fn(&'a [u8]) + Sync,
    ) -> LineTable {
        use rayon::prelude::*;
        let mut table = LineTable::default();
        if section(".debug_line").is_empty() {
            return table;
        }
        let loaded: Result<gimli::Dwarf<Reader<'a>>, gimli::Error> =
            gimli::Dwarf::load(|id: SectionId| {
                Ok(EndianSlice::new(section(id.name()), LittleEndian))
            });
        let dwarf = match loaded {
            Ok(d) => d,
            Err(e) => {
                table.problem = Some(format!("cannot read DWARF: {e}"));
                return table;
            }
        };
        // The units' headers are read in order; the units themselves (on
        // this thread until hurried, then) on all cores, each into rows and
        // ranges of its own, joined in order.
        let mut headers = Vec::new();
        let mut units_problem = None;
        let mut units = dwarf.units();
        loop {
            match units.next() {
                Ok(Some(h)) => headers.push(h),
                Ok(None) => break,
                Err(e) => {
                    units_problem = Some(format!("malformed .debug_info: {e}"));
                    break;
                }
            }
        }
        let read = |header| UnitLines::read(&dwarf, header, (&is_code, wanted), &release);
        let mut unit_lines: Vec<UnitLines> = Vec::with_capacity(headers.len());
        let mut headers = headers.into_iter();
        if let UnitPace::UntilHurried(hurry) = pace {
            while !hurry.load(std::sync::atomic::Ordering::Relaxed) {
                match headers.next() {
                    Some(header) => unit_lines.push(read(header)),
                    None => break,
                }
            }
        }
        let rest: Vec<_> = headers.collect();
        unit_lines.par_extend(rest.into_par_iter().map(read));
        // Nothing reads the sections again: their pages are not resident
        // under the merge (the units' shared sections: strings, ranges,
        // abbreviations).
        for id in DWARF_SECTIONS {
            release(section(id.name()));
        }
        let mut sequences: Vec<Vec<Row>> = Vec::new();
        let mut unit_inlines: Vec<Vec<Inline>> = Vec::with_capacity(unit_lines.len());
        let mut file_ids: HashMap<String, u32> = HashMap::new();
        for unit in unit_lines {
            let ids: Vec<u32> = unit
                .files
                .into_iter()
                .map(|path| table.intern(&mut file_ids, path))
                .collect();
            let id = |file: u32| {
                if file == NO_FILE {
                    NO_FILE
                } else {
                    ids[file as usize]
                }
            };
            for mut sequence in unit.sequences {
                for row in &mut sequence {
                    row.file = id(row.file);
                }
                sequences.push(sequence);
            }
            let mut inlines = unit.inlines;
            for r in &mut inlines {
                r.file = id(r.file);
            }
            unit_inlines.push(inlines);
            if unit.problem.is_some() {
                table.problem = unit.problem;
            }
        }
        if units_problem.is_some() {
            table.problem = units_problem;
        }
        sequences.sort_by_key(|s| s.first().map_or(0, |r| r.address));
        table.inlines = merge_by_begin(unit_inlines);
        let mut reach = 0;
        table.inline_reach = table
            .inlines
            .iter()
            .map(|r| {
                reach = reach.max(r.end);
                reach
            })
            .collect();
        table.rows.reserve(sequences.iter().map(Vec::len).sum());
        for seq in sequences {
            table.rows.extend(seq);
        }
        // Sequences do not overlap in linked code; a stable sort keeps each
        // sequence's own order should two share an address at a boundary.
        table.rows.sort_by_key(|r| r.address);
        table
    }
}

/// How [`LineTable::build`] reads the compilation units.
#[derive(Clone, Copy)]
pub(crate) enum UnitPace<'h> {
    /// All on the pool's threads.
    Pool,
    /// One at a time on the calling thread until the flag is set, the
    /// rest then on the pool's threads. Meant for a thread of its own
    /// beside one serial thread of other work: one thread reading takes
    /// the core that work leaves idle, where the pool's two would take
    /// the other's core too.
    UntilHurried(&'h std::sync::atomic::AtomicBool),
}

/// The units' inlined ranges (each unit's sorted by `begin`) as one list
/// sorted by `begin`, in the order a stable sort of all of them, unit
/// after unit, gives. Units mostly cover disjoint code: ordered by their
/// first range, each begins after the last range of the one before, and
/// the list is their concatenation. Otherwise (units interleaving, or two
/// ranges of different units beginning together, whose order a stable
/// sort takes from the units') the units are joined in order and sorted,
/// their sorted runs merged.
fn merge_by_begin(mut units: Vec<Vec<Inline>>) -> Vec<Inline> {
    units.retain(|u| !u.is_empty());
    let total = units.iter().map(Vec::len).sum();
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by_key(|&u| units[u][0].begin);
    let disjoint = order
        .windows(2)
        .all(|pair| units[pair[0]].last().map(|r| r.begin) < Some(units[pair[1]][0].begin));
    let mut merged = Vec::with_capacity(total);
    if disjoint {
        for u in order {
            merged.append(&mut units[u]);
        }
    } else {
        for mut unit in units {
            merged.append(&mut unit);
        }
        merged.sort_by_key(|r| r.begin);
    }
    merged
}

/// [`LineTable::locate_chain`] for addresses asked in rising order: the
/// inlined ranges holding the last address are kept, and the next
/// address only adds the ranges beginning up to it and drops those ended
/// (a fresh lookup scans back over every range beginning inside the
/// outermost one holding it: thousands in a large inlined function). An
/// address below the last starts afresh, so any order gives the same
/// chains.
pub(crate) struct ChainCursor<'t> {
    table: &'t LineTable,
    /// The address last asked for.
    last: Option<u64>,
    /// The ranges holding `last`, lowest index first.
    holding: Vec<usize>,
    /// The first range beginning after `last`.
    next: usize,
    /// `holding`, highest index first, as [`LineTable::chain_into`] takes it.
    order: Vec<usize>,
    /// The first row past `last`.
    row_after: usize,
}

impl<'t> ChainCursor<'t> {
    /// A cursor over `table`'s inlined ranges.
    pub(crate) fn new(table: &'t LineTable) -> ChainCursor<'t> {
        ChainCursor {
            table,
            last: None,
            holding: Vec::new(),
            next: 0,
            order: Vec::new(),
            row_after: 0,
        }
    }

    /// The same chain as [`LineTable::locate_chain`] of `address`.
    #[cfg(test)]
    pub(crate) fn locate_chain(&mut self, address: u64) -> Vec<SourceLocation<'t>> {
        let mut chain = Vec::new();
        self.locate_chain_into(address, &mut chain);
        chain
    }

    /// [`ChainCursor::locate_chain`] into `chain` (cleared first): one
    /// buffer serves every lookup of a worker.
    pub(crate) fn locate_chain_into(&mut self, address: u64, chain: &mut Vec<SourceLocation<'t>>) {
        chain.clear();
        let rows = &self.table.rows;
        self.row_after = partition_point_from(rows, self.row_after, |r| r.address <= address);
        let Some(first) = self.table.position_before(self.row_after) else {
            return;
        };
        let inlines = &self.table.inlines;
        if self.last.is_some_and(|last| last <= address) {
            while inlines.get(self.next).is_some_and(|r| r.begin <= address) {
                self.holding.push(self.next);
                self.next += 1;
            }
            self.holding.retain(|&i| inlines[i].end > address);
        } else {
            self.holding.clear();
            self.next = self.table.scan_holding(address, &mut self.holding);
            self.holding.reverse();
        }
        self.last = Some(address);
        self.order.clear();
        self.order.extend(self.holding.iter().rev());
        self.table.chain_into(first, &mut self.order, chain);
    }
}

/// What one compilation unit gives the table, its files numbered in the
/// order it names them (the table numbers them over all units in order).
#[derive(Default)]
struct UnitLines {
    /// Its line program's sequences in code (each ending with its end row).
    sequences: Vec<Vec<Row>>,
    /// Its inlined ranges, by `begin`.
    inlines: Vec<Inline>,
    /// The paths its rows and ranges name, by their `file`.
    files: Vec<String>,
    /// Its last problem.
    problem: Option<String>,
}

impl UnitLines {
    /// Reads the unit of `header`: what [`LineTable::build`] keeps of its
    /// line program and its inlined ranges. Its bytes in `.debug_info` and its line program's are given to
    /// `release` once read (no other unit reads them).
    fn read<'a>(
        dwarf: &gimli::Dwarf<Reader<'a>>,
        header: gimli::UnitHeader<Reader<'a>>,
        (is_code, wanted): (&impl Fn(u64) -> bool, Option<&[u64]>),
        release: &impl Fn(&'a [u8]),
    ) -> UnitLines {
        let info = header.debug_info_offset().and_then(|start| {
            let end = start.0.checked_add(header.length_including_self())?;
            gimli::Section::reader(&dwarf.debug_info)
                .slice()
                .get(start.0..end)
        });
        let mut out = UnitLines::default();
        let Ok(unit) = dwarf.unit(header) else {
            out.problem = Some("malformed compilation unit".into());
            return out;
        };
        let Some(program) = unit.line_program.clone() else {
            return out;
        };
        let program_bytes = program.header().raw_program_buf().slice();
        let comp_dir = unit
            .comp_dir
            .map(|d| String::from_utf8_lossy(d.slice()).into_owned());
        let mut row_slots = FileSlots::default();
        let mut range_slots = FileSlots::default();
        let mut last_file: Option<(u64, u32)> = None;
        let mut rows = program.rows();
        let mut current: Vec<Row> = Vec::new();
        loop {
            let (_, row) = match rows.next_row() {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    out.problem = Some(format!("malformed line program: {e}"));
                    break;
                }
            };
            if row.end_sequence() {
                current.push(Row {
                    address: row.address(),
                    file: NO_FILE,
                    line: 0,
                });
                if current.first().is_some_and(|r| is_code(r.address)) {
                    out.sequences.push(match wanted {
                        Some(wanted) => rows_serving(&current, wanted),
                        None => current.clone(),
                    });
                }
                current.clear();
                continue;
            }
            let index = row.file_index();
            // Consecutive rows mostly name the same file.
            let file = match last_file {
                Some((last, id)) if last == index => id,
                _ => {
                    let slot = row_slots.slot(index);
                    last_file = Some((index, slot));
                    slot
                }
            };
            let line = row
                .line()
                .map_or(0, |l| l.get().min(u64::from(u32::MAX - 1)) as u32);
            current.push(Row {
                address: row.address(),
                file,
                line,
            });
        }
        let mut near = wanted.map(WantedCursor::new);
        if let Err(e) = add_inlines(
            &mut out,
            dwarf,
            &unit,
            &mut range_slots,
            &mut |begin, end| {
                is_code(begin) && near.as_mut().is_none_or(|w| w.holds_any(begin, end))
            },
        ) {
            out.problem = Some(format!("malformed inlined subroutine: {e}"));
        }
        // Paths as the rows' program (with any file it defined) and the
        // unit's header name them.
        let (files, file_ids) = (&mut out.files, &mut HashMap::new());
        let comp_dir = comp_dir.as_deref();
        let rows_header = rows.header();
        row_slots.name(
            out.sequences.iter_mut().flatten().map(|r| &mut r.file),
            (&mut *files, &mut *file_ids),
            |index| file_path(dwarf, &unit, rows_header, comp_dir, index),
        );
        if let Some(program) = &unit.line_program {
            range_slots.name(
                out.inlines.iter_mut().map(|r| &mut r.file),
                (files, file_ids),
                |index| file_path(dwarf, &unit, program.header(), comp_dir, index),
            );
        }
        release(program_bytes);
        if let Some(info) = info {
            release(info);
        }
        // Sorted here, on the pool, after the files were named in the
        // entries' order: the table then merges runs instead of sorting
        // all units' ranges on one core (a stable sort keeps the order of
        // ranges beginning together).
        out.inlines.sort_by_key(|r| r.begin);
        out
    }
}

/// A unit's files as its rows and inlined ranges name them while it is
/// read: a slot for each file index met, given a path only if a kept row
/// or range names it (most rows of a large unit are not kept, and the
/// paths of all the files they named were most of the units' memory).
#[derive(Default)]
struct FileSlots {
    /// File index -> slot + 1 (0: none yet), for indices below
    /// [`FileSlots::DENSE`] (a unit's file table is far smaller; hashing
    /// the index of every row's file was a tenth of reading the rows).
    dense: Vec<u32>,
    /// Larger file index -> slot.
    sparse: HashMap<u64, u32>,
    /// Slot -> file index.
    indices: Vec<u64>,
}

impl FileSlots {
    /// File indices below this are looked up in a vector.
    const DENSE: u64 = 1 << 16;

    /// The slot of file `index`.
    fn slot(&mut self, index: u64) -> u32 {
        if index >= Self::DENSE {
            return *self.sparse.entry(index).or_insert_with(|| {
                self.indices.push(index);
                (self.indices.len() - 1) as u32
            });
        }
        let at = index as usize;
        if at >= self.dense.len() {
            self.dense.resize(at + 1, 0);
        }
        if self.dense[at] == 0 {
            self.indices.push(index);
            self.dense[at] = self.indices.len() as u32;
        }
        self.dense[at] - 1
    }

    /// Turns the slots in `named` into ids of `files`, naming each file
    /// met once (`path_of` a file index).
    fn name<'n>(
        &self,
        named: impl Iterator<Item = &'n mut u32>,
        (files, file_ids): (&mut Vec<String>, &mut HashMap<String, u32>),
        path_of: impl Fn(u64) -> String,
    ) {
        let mut ids: Vec<Option<u32>> = vec![None; self.indices.len()];
        for file in named.filter(|f| **f != NO_FILE) {
            let slot = *file as usize;
            *file = *ids[slot]
                .get_or_insert_with(|| intern(files, file_ids, path_of(self.indices[slot])));
        }
    }
}

/// The id of `path` in `files`, added when new.
fn intern(files: &mut Vec<String>, ids: &mut HashMap<String, u32>, path: String) -> u32 {
    if let Some(&id) = ids.get(&path) {
        return id;
    }
    let id = files.len() as u32;
    files.push(path.clone());
    ids.insert(path, id);
    id
}

impl LineTable {
    /// The id of `path` in [`LineTable::files`], added when new.
    fn intern(&mut self, ids: &mut HashMap<String, u32>, path: String) -> u32 {
        intern(&mut self.files, ids, path)
    }
}

/// Adds the inlined ranges of one unit that `keep` accepts (`begin`,
/// `end`): those in code only (a discarded function's ranges start at
/// address 0). The entries are read raw: only an inlined subroutine's
/// call site and range attributes are parsed, every other attribute (and
/// every other entry's) is skipped by its form's size (parsing each entry
/// whole, then looking its attributes up twice, was a third of the units'
/// reading).
fn add_inlines<'a>(
    out: &mut UnitLines,
    dwarf: &gimli::Dwarf<Reader<'a>>,
    unit: &gimli::Unit<Reader<'a>>,
    slots: &mut FileSlots,
    keep: &mut impl FnMut(u64, u64) -> bool,
) -> Result<(), gimli::Error> {
    let mut entries = unit.entries_raw(None)?;
    let mut attrs: Vec<gimli::Attribute<Reader<'a>>> = Vec::new();
    while !entries.is_empty() {
        let depth = entries.next_depth();
        let Some(abbrev) = entries.read_abbreviation()? else {
            continue;
        };
        if abbrev.tag() != gimli::DW_TAG_inlined_subroutine {
            entries.skip_attributes(abbrev.attributes())?;
            continue;
        }
        read_site_attributes(&mut entries, abbrev.attributes(), &mut attrs)?;
        let index = match attr_value(&attrs, gimli::DW_AT_call_file) {
            Some(AttributeValue::FileIndex(i)) => i,
            Some(other) => match other.udata_value() {
                Some(i) => i,
                None => continue,
            },
            None => continue,
        };
        let line = attr_value(&attrs, gimli::DW_AT_call_line)
            .and_then(|v| v.udata_value())
            .map_or(0, |l| l.min(u64::from(u32::MAX - 1)) as u32);
        let depth = u32::try_from(depth).unwrap_or(0);
        let mut ranges = site_ranges(dwarf, unit, &attrs)?;
        while let Some(range) = ranges.next()? {
            if range.begin < range.end && keep(range.begin, range.end) {
                out.inlines.push(Inline {
                    begin: range.begin,
                    end: range.end,
                    depth,
                    file: slots.slot(index),
                    line,
                });
            }
        }
    }
    Ok(())
}

/// Whether [`add_inlines`] reads attribute `name` of an inlined
/// subroutine: its call site and its address ranges.
fn is_site_attribute(name: gimli::DwAt) -> bool {
    matches!(
        name,
        gimli::DW_AT_call_file
            | gimli::DW_AT_call_line
            | gimli::DW_AT_low_pc
            | gimli::DW_AT_high_pc
            | gimli::DW_AT_ranges
    )
}

/// Reads the entry's attributes of `specs` into `attrs` (in order) where
/// [`is_site_attribute`] says, and skips each run of the others at once.
fn read_site_attributes<'a>(
    entries: &mut gimli::EntriesRaw<'_, Reader<'a>>,
    specs: &[gimli::AttributeSpecification],
    attrs: &mut Vec<gimli::Attribute<Reader<'a>>>,
) -> Result<(), gimli::Error> {
    attrs.clear();
    let mut skipped_from = 0;
    for (i, spec) in specs.iter().enumerate() {
        if is_site_attribute(spec.name()) {
            entries.skip_attributes(&specs[skipped_from..i])?;
            attrs.push(entries.read_attribute_inline(*spec)?);
            skipped_from = i + 1;
        }
    }
    entries.skip_attributes(&specs[skipped_from..])
}

/// The value of the first attribute `name` in `attrs`, as gimli's
/// `DebuggingInformationEntry::attr_value` gives it.
fn attr_value<'a>(
    attrs: &[gimli::Attribute<Reader<'a>>],
    name: gimli::DwAt,
) -> Option<AttributeValue<Reader<'a>>> {
    attrs
        .iter()
        .find(|a| a.name() == name)
        .map(gimli::Attribute::value)
}

/// The address ranges of an entry with attributes `attrs`, as gimli's
/// `Dwarf::die_ranges` reads them: `DW_AT_ranges` (the first that names a
/// list), else `DW_AT_low_pc` with `DW_AT_high_pc` (an address or a size).
fn site_ranges<'a>(
    dwarf: &gimli::Dwarf<Reader<'a>>,
    unit: &gimli::Unit<Reader<'a>>,
    attrs: &[gimli::Attribute<Reader<'a>>],
) -> Result<SiteRanges<'a>, gimli::Error> {
    let (mut low_pc, mut high_pc, mut size) = (None, None, None);
    for attr in attrs {
        match attr.name() {
            gimli::DW_AT_low_pc => {
                low_pc = Some(
                    dwarf
                        .attr_address(unit, attr.value())?
                        .ok_or(gimli::Error::UnsupportedAttributeForm(attr.form()))?,
                );
            }
            gimli::DW_AT_high_pc => match attr.value() {
                AttributeValue::Udata(val) => size = Some(val),
                value => {
                    high_pc = Some(
                        dwarf
                            .attr_address(unit, value)?
                            .ok_or(gimli::Error::UnsupportedAttributeForm(attr.form()))?,
                    );
                }
            },
            gimli::DW_AT_ranges => {
                if let Some(list) = dwarf.attr_ranges(unit, attr.value())? {
                    return Ok(SiteRanges::List(list));
                }
            }
            _ => {}
        }
    }
    let range = low_pc.and_then(|begin| {
        let end = size.map(|size| begin.wrapping_add(size)).or(high_pc);
        end.map(|end| gimli::Range { begin, end })
    });
    Ok(SiteRanges::Single(range))
}

/// The ranges of an inlined subroutine: one, or a range list.
enum SiteRanges<'a> {
    Single(Option<gimli::Range>),
    List(gimli::RngListIter<Reader<'a>>),
}

impl SiteRanges<'_> {
    fn next(&mut self) -> Result<Option<gimli::Range>, gimli::Error> {
        match self {
            SiteRanges::Single(range) => Ok(range.take()),
            SiteRanges::List(list) => list.next(),
        }
    }
}

/// Whether sorted addresses hold one in a range, asked for ranges that
/// mostly lie near the one asked before (a unit's inlined ranges come
/// function by function): the search gallops out from the last answer
/// instead of halving all the addresses (a binary search per range was a
/// tenth of the units' reading).
struct WantedCursor<'w> {
    /// The addresses, sorted.
    addresses: &'w [u64],
    /// The index of the first address at or after the last range's begin.
    at: usize,
}

impl<'w> WantedCursor<'w> {
    fn new(addresses: &'w [u64]) -> WantedCursor<'w> {
        WantedCursor { addresses, at: 0 }
    }

    /// Whether an address lies in `[begin, end)`.
    fn holds_any(&mut self, begin: u64, end: u64) -> bool {
        self.at = partition_point_from(self.addresses, self.at, |&a| a < begin);
        self.addresses.get(self.at).is_some_and(|&a| a < end)
    }
}

/// `items.partition_point(before)`, searched outwards from `from` in
/// doubling steps: a few probes where the answer lies near `from`.
pub(crate) fn partition_point_from<T>(
    items: &[T],
    from: usize,
    before: impl Fn(&T) -> bool,
) -> usize {
    // The answer lies in `lo..=hi`: the items below `lo` are before, those
    // from `hi` on are not.
    let (mut lo, mut hi) = (from.min(items.len()), from.min(items.len()));
    let mut step = 1;
    if items.get(lo).is_some_and(&before) {
        lo += 1;
        hi = loop {
            let probe = lo + step - 1;
            if probe >= items.len() {
                break items.len();
            }
            if !before(&items[probe]) {
                break probe;
            }
            lo = probe + 1;
            step *= 2;
        };
    } else {
        while lo > 0 && !before(&items[lo - 1]) {
            hi = lo - 1;
            lo = hi.saturating_sub(step);
            step *= 2;
        }
    }
    lo + items[lo..hi].partition_point(before)
}

/// The rows of one sequence (ending with its end row) that a lookup of a
/// `wanted` address can return: the row whose range `[address, next
/// row's)` holds one, and the first and last rows (the first orders the
/// sequences, the last answers every address past the sequence). A
/// lookup returns the last row at or before its address, so in each
/// sequence it stops at one of these. A sequence whose addresses go
/// backwards is kept whole.
fn rows_serving(sequence: &[Row], wanted: &[u64]) -> Vec<Row> {
    if !sequence.is_sorted_by_key(|r| r.address) {
        return sequence.to_vec();
    }
    let last = sequence.len() - 1;
    // The rows and the wanted addresses are both sorted: one walk over
    // each (a binary search per row was most of the units' reading).
    let mut next_wanted = wanted.partition_point(|&a| a < sequence[0].address);
    let mut kept = Vec::new();
    for (i, row) in sequence.iter().enumerate() {
        while wanted.get(next_wanted).is_some_and(|&a| a < row.address) {
            next_wanted += 1;
        }
        let serves = i == 0
            || i == last
            || wanted
                .get(next_wanted)
                .is_some_and(|&a| a < sequence[i + 1].address);
        if serves {
            kept.push(*row);
        }
    }
    kept
}

/// The path of file `index` of a unit's line program, joined with the
/// compilation directory when relative.
fn file_path<'a>(
    dwarf: &gimli::Dwarf<Reader<'a>>,
    unit: &gimli::Unit<Reader<'a>>,
    header: &gimli::LineProgramHeader<Reader<'a>>,
    comp_dir: Option<&str>,
    index: u64,
) -> String {
    header
        .file(index)
        .map(|entry| {
            let mut path = comp_dir.unwrap_or_default().to_string();
            if let Some(dir) = entry.directory(header) {
                push_path(&mut path, &attr_text(dwarf, unit, dir));
            }
            push_path(&mut path, &attr_text(dwarf, unit, entry.path_name()));
            path
        })
        .unwrap_or_else(|| "<unknown>".to_string())
}

fn attr_text<'a>(
    dwarf: &gimli::Dwarf<Reader<'a>>,
    unit: &gimli::Unit<Reader<'a>>,
    value: AttributeValue<Reader<'a>>,
) -> String {
    dwarf
        .attr_string(unit, value)
        .map(|s| String::from_utf8_lossy(s.slice()).into_owned())
        .unwrap_or_default()
}

/// Appends a path component; an absolute component replaces what is there.
fn push_path(path: &mut String, part: &str) {
    if part.is_empty() {
        return;
    }
    if part.starts_with('/') || path.is_empty() {
        *path = part.to_string();
    } else {
        if !path.ends_with('/') {
            path.push('/');
        }
        path.push_str(part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Merging the units' sorted ranges gives what a stable sort of
        /// all of them, unit after unit, gives (ranges are told apart by
        /// their `line`).
        #[test]
        fn merged_ranges_are_the_stable_sort_of_all_units(
            units in proptest::collection::vec(
                (0u64..24, proptest::collection::vec(0u64..4, 0..5)),
                0..8,
            ),
        ) {
            // Each unit's ranges begin near its own offset: units come
            // disjoint, touching (one's last begin another's first) or
            // interleaved.
            let mut line = 0;
            let units: Vec<Vec<Inline>> = units
                .iter()
                .enumerate()
                .map(|(u, (offset, begins))| {
                    begins
                        .iter()
                        .map(|&begin| {
                            line += 1;
                            let begin = offset + begin;
                            Inline { begin, end: begin + 1, depth: 0, file: u as u32, line }
                        })
                        .collect()
                })
                .collect();
            let mut expected: Vec<Inline> = units.concat();
            expected.sort_by_key(|r| r.begin);
            let sorted_units = units
                .into_iter()
                .map(|mut u| {
                    u.sort_by_key(|r| r.begin);
                    u
                })
                .collect();
            let merged = merge_by_begin(sorted_units);
            let key = |r: &Inline| (r.begin, r.file, r.line);
            prop_assert_eq!(
                merged.iter().map(key).collect::<Vec<_>>(),
                expected.iter().map(key).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn paths_join_relative_parts_and_restart_at_absolute_ones() {
        let mut p = "/build".to_string();
        push_path(&mut p, "src");
        push_path(&mut p, "main.rs");
        assert_eq!(p, "/build/src/main.rs");
        push_path(&mut p, "/rustc/abc/library/core/src/slice.rs");
        assert_eq!(p, "/rustc/abc/library/core/src/slice.rs");
    }

    #[test]
    fn lookup_finds_the_last_row_at_or_before_and_stops_at_sequence_ends() {
        let table = LineTable {
            rows: vec![
                Row {
                    address: 0x10,
                    file: 0,
                    line: 3,
                },
                Row {
                    address: 0x18,
                    file: 0,
                    line: 4,
                },
                Row {
                    address: 0x20,
                    file: NO_FILE,
                    line: 0,
                },
            ],
            files: vec!["a.c".into()],
            ..LineTable::default()
        };
        assert_eq!(table.locate(0x0f), None);
        assert_eq!(table.locate(0x10).unwrap().to_string(), "a.c:3");
        assert_eq!(table.locate(0x1f).unwrap().line, 4);
        assert_eq!(table.locate(0x20), None);
    }

    #[test]
    fn a_chain_lists_the_row_then_the_call_sites_of_the_inlined_ranges_innermost_first() {
        let row = |address, line| Row {
            address,
            file: 0,
            line,
        };
        let inline = |begin, end, depth, line| Inline {
            begin,
            end,
            depth,
            file: 1,
            line,
        };
        // `user` (file 1) inlines a call at line 7 covering 0x10..0x40, whose
        // body inlines another at line 2 covering 0x20..0x28; a second,
        // unrelated range 0x50..0x60 follows.
        let inlines = vec![
            inline(0x10, 0x40, 2, 7),
            inline(0x20, 0x28, 3, 2),
            inline(0x50, 0x60, 2, 9),
        ];
        let table = LineTable {
            rows: vec![row(0x10, 100), row(0x20, 200), row(0x70, 0)],
            files: vec!["/rustc/x/map.rs".into(), "/w/src/user.rs".into()],
            inline_reach: vec![0x40, 0x40, 0x60],
            inlines,
            problem: None,
        };
        let text = |a| -> Vec<String> {
            table
                .locate_chain(a)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(
            text(0x24),
            [
                "/rustc/x/map.rs:200",
                "/w/src/user.rs:2",
                "/w/src/user.rs:7"
            ]
        );
        assert_eq!(text(0x30), ["/rustc/x/map.rs:200", "/w/src/user.rs:7"]);
        assert_eq!(text(0x44), ["/rustc/x/map.rs:200"]);
        assert_eq!(text(0x55), ["/rustc/x/map.rs:200", "/w/src/user.rs:9"]);
        assert!(text(0x08).is_empty());
    }

    #[test]
    fn a_table_for_some_addresses_answers_their_lookups_as_the_whole_table() {
        // This test executable's own DWARF (the dev profile keeps it).
        let binary = crate::binary::Binary::open(std::env::current_exe().unwrap()).unwrap();
        assert!(binary.has_lines(), "the test executable has line tables");
        // Every instruction start of every 7th function, and bytes past
        // each function's end.
        let mut wanted: Vec<u64> = Vec::new();
        for f in binary.functions().iter().step_by(7) {
            wanted.extend(binary.decode(f).iter().map(iced_x86::Instruction::ip));
            wanted.push(f.end());
        }
        wanted.sort_unstable();
        wanted.dedup();
        let part = binary.line_table_for(&wanted);
        let whole = binary.line_table();
        assert!(part.rows.len() < whole.rows.len() / 2, "rows are left out");
        assert!(
            part.inlines.len() < whole.inlines.len(),
            "inlined ranges are left out"
        );
        let mut inlined = 0;
        for &a in &wanted {
            assert_eq!(part.locate(a), whole.locate(a), "{a:#x}");
            let chain = whole.locate_chain(a);
            inlined += usize::from(chain.len() > 1);
            assert_eq!(part.locate_chain(a), chain, "{a:#x}");
        }
        assert!(inlined > 0, "some addresses lie in inlined code");
        // A cursor gives the same chains, in rising order and in another
        // (each fall starts it afresh).
        let mut cursor = ChainCursor::new(&part);
        for &a in &wanted {
            assert_eq!(cursor.locate_chain(a), whole.locate_chain(a), "{a:#x}");
        }
        let mut cursor = ChainCursor::new(&part);
        for &a in wanted
            .iter()
            .rev()
            .step_by(3)
            .chain(wanted.iter().step_by(5))
        {
            assert_eq!(cursor.locate_chain(a), whole.locate_chain(a), "{a:#x}");
        }
    }

    #[test]
    fn units_read_until_hurried_give_the_table_the_pool_gives() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        // This test executable's own DWARF, every 5th function's
        // instructions wanted.
        let binary = crate::binary::Binary::open(std::env::current_exe().unwrap()).unwrap();
        let section = |name: &str| -> &[u8] {
            binary
                .section(name)
                .filter(|s| !s.is_compressed())
                .and_then(|s| binary.section_data(s))
                .unwrap_or(&[])
        };
        let mut wanted: Vec<u64> = Vec::new();
        for f in binary.functions().iter().step_by(5) {
            wanted.extend(binary.decode(f).iter().map(iced_x86::Instruction::ip));
        }
        wanted.sort_unstable();
        wanted.dedup();
        let is_code = |_: u64| true;
        let pool = LineTable::build(section, is_code, (Some(&wanted), UnitPace::Pool), |_| ());
        assert!(pool.rows.len() > 100 && !pool.inlines.is_empty());
        let units = AtomicUsize::new(0);
        // Never hurried (every unit on this thread), hurried from the
        // start (every unit on the pool), and hurried after the sixth
        // release (a unit's line program and entries are released once
        // read: about the third unit).
        for hurry_after in [usize::MAX, 0, 6] {
            units.store(0, Ordering::Relaxed);
            let hurry = AtomicBool::new(hurry_after == 0);
            let release = |_: &[u8]| {
                if units.fetch_add(1, Ordering::Relaxed) + 1 == hurry_after {
                    hurry.store(true, Ordering::Relaxed);
                }
            };
            let paced = LineTable::build(
                section,
                is_code,
                (Some(&wanted), UnitPace::UntilHurried(&hurry)),
                release,
            );
            assert_eq!(hurry.load(Ordering::Relaxed), hurry_after != usize::MAX);
            assert_eq!(format!("{:?}", paced.rows), format!("{:?}", pool.rows));
            assert_eq!(
                format!("{:?}", paced.inlines),
                format!("{:?}", pool.inlines)
            );
            assert_eq!(paced.files, pool.files);
            assert_eq!(paced.inline_reach, pool.inline_reach);
            for &a in &wanted {
                assert_eq!(paced.locate_chain(a), pool.locate_chain(a), "{a:#x}");
            }
        }
    }

    #[test]
    fn raw_entries_give_the_inlined_ranges_that_whole_entries_give() {
        // This test executable's own DWARF, read as gimli's entry cursor
        // and `die_ranges` read it.
        let binary = crate::binary::Binary::open(std::env::current_exe().unwrap()).unwrap();
        let section = |name: &str| -> &[u8] {
            binary
                .section(name)
                .filter(|s| !s.is_compressed())
                .and_then(|s| binary.section_data(s))
                .unwrap_or(&[])
        };
        let dwarf = gimli::Dwarf::load(|id: SectionId| {
            Ok::<_, gimli::Error>(EndianSlice::new(section(id.name()), LittleEndian))
        })
        .unwrap();
        let mut units = dwarf.units();
        let mut inlined = 0;
        while let Some(header) = units.next().unwrap() {
            let unit = dwarf.unit(header).unwrap();
            let (mut raw, mut slots) = (UnitLines::default(), FileSlots::default());
            add_inlines(&mut raw, &dwarf, &unit, &mut slots, &mut |_, _| true).unwrap();
            let mut expected = Vec::new();
            let mut entries = unit.entries();
            while let Some(entry) = entries.next_dfs().unwrap() {
                if entry.tag() != gimli::DW_TAG_inlined_subroutine {
                    continue;
                }
                let file = match entry.attr_value(gimli::DW_AT_call_file) {
                    Some(AttributeValue::FileIndex(i)) => i,
                    Some(other) => match other.udata_value() {
                        Some(i) => i,
                        None => continue,
                    },
                    None => continue,
                };
                let line = entry
                    .attr_value(gimli::DW_AT_call_line)
                    .and_then(|v| v.udata_value())
                    .unwrap_or(0);
                let mut ranges = dwarf.die_ranges(&unit, entry).unwrap();
                while let Some(r) = ranges.next().unwrap() {
                    if r.begin < r.end {
                        let depth = u32::try_from(entry.depth()).unwrap();
                        expected.push((r.begin, r.end, depth, file, line as u32));
                    }
                }
            }
            let got: Vec<_> = raw
                .inlines
                .iter()
                .map(|r| {
                    (
                        r.begin,
                        r.end,
                        r.depth,
                        slots.indices[r.file as usize],
                        r.line,
                    )
                })
                .collect();
            inlined += got.len();
            assert_eq!(got, expected);
        }
        assert!(inlined > 0, "the test executable has inlined code");
    }

    #[test]
    fn the_wanted_cursor_answers_as_a_binary_search_from_anywhere() {
        let addresses: Vec<u64> = (0..200u64).map(|i| i * 7 + (i % 3)).collect();
        let mut cursor = WantedCursor::new(&addresses);
        // Ranges forwards, backwards, far and near, empty and past the end.
        let mut begin = 5u64;
        for i in 0..3000u64 {
            begin = (begin * 31 + i * 17) % 1500;
            let end = begin + (i % 11);
            let j = addresses.partition_point(|&a| a < begin);
            let expected = addresses.get(j).is_some_and(|&a| a < end);
            assert_eq!(cursor.holds_any(begin, end), expected, "{begin}..{end}");
            assert_eq!(cursor.at, j, "{begin}");
        }
        let mut none = WantedCursor::new(&[]);
        assert!(!none.holds_any(0, u64::MAX));
    }

    #[test]
    fn a_sequence_whose_addresses_go_backwards_is_kept_whole() {
        let row = |address, line| Row {
            address,
            file: 0,
            line,
        };
        let backwards = [row(0x20, 1), row(0x10, 2), row(0x30, 3), row(0x40, 0)];
        assert_eq!(rows_serving(&backwards, &[0x31]).len(), 4);
        let forwards = [row(0x10, 1), row(0x20, 2), row(0x30, 3), row(0x40, 0)];
        let kept: Vec<u32> = rows_serving(&forwards, &[0x31])
            .iter()
            .map(|r| r.line)
            .collect();
        assert_eq!(kept, [1, 3, 0]);
    }
}
