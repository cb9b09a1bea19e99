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
use gimli::{AttributeValue, EndianSlice, LittleEndian, ReaderOffset, SectionId, UnitOffset};
use std::borrow::Cow;

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
    /// `file:line`, allocated once at its exact size (an annotation holds
    /// one or more per load: `to_string`'s growth doubled their memory,
    /// and spare capacity is reallocated away when the text is shared).
    /// The line's digits are written by hand: the formatter's machinery
    /// cost more than the rest of making the text.
    pub fn to_text(&self) -> String {
        let mut digits = [0u8; 10];
        let (mut at, mut line) = (digits.len(), self.line);
        loop {
            at -= 1;
            digits[at] = b'0' + (line % 10) as u8;
            line /= 10;
            if line == 0 {
                break;
            }
        }
        let digits = std::str::from_utf8(&digits[at..]).expect("ASCII digits");
        let mut text = String::with_capacity(self.file.len() + 1 + digits.len());
        text.push_str(self.file);
        text.push(':');
        text.push_str(digits);
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
        holding: &mut [usize],
        chain: &mut Vec<SourceLocation<'t>>,
    ) {
        chain.clear();
        chain.push(first);
        self.extend_call_sites(holding, chain);
    }

    /// Appends to `chain` the call sites of the inlined ranges `holding`
    /// (highest index first; reordered here), innermost first.
    fn extend_call_sites<'t>(&'t self, holding: &mut [usize], chain: &mut Vec<SourceLocation<'t>>) {
        holding.sort_by_key(|&i| std::cmp::Reverse(self.inlines[i].depth));
        self.push_call_sites(holding.iter().copied(), chain);
    }

    /// Appends to `chain` the call sites of the inlined ranges
    /// `deepest_first` (sorted by depth, deepest first), innermost first.
    fn push_call_sites<'t>(
        &'t self,
        deepest_first: impl Iterator<Item = usize>,
        chain: &mut Vec<SourceLocation<'t>>,
    ) {
        // One inlined subroutine may list the same range twice (split
        // `DW_AT_ranges`); its call site counts once.
        let mut last = None;
        for i in deepest_first {
            let r = &self.inlines[i];
            let site = (r.depth, r.file, r.line);
            if last == Some(site) {
                continue;
            }
            last = Some(site);
            if r.line != 0 {
                chain.push(SourceLocation {
                    file: &self.files[r.file as usize],
                    line: r.line,
                });
            }
        }
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
        let wanted = wanted.map(WantedIndex::new);
        let abbreviations = SharedAbbreviations::of(&headers);
        let read = |header| {
            let near = (&is_code, wanted.as_ref());
            UnitLines::read((&dwarf, &abbreviations), header, near, &release)
        };
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

/// The abbreviation tables more than one unit uses, each parsed once, by
/// the first unit that reads it (gimli parses a unit's table for each
/// unit: the own release binary's 2,488 units use 487 tables, and their
/// parsing was a tenth of reading the units).
struct SharedAbbreviations {
    /// By offset in `.debug_abbrev`.
    tables: HashMap<usize, SharedTable>,
}

/// A shared abbreviation table, once parsed.
type SharedTable = std::sync::OnceLock<Result<std::sync::Arc<gimli::Abbreviations>, gimli::Error>>;

impl SharedAbbreviations {
    /// The tables that more than one of `headers` uses, none parsed yet.
    fn of(headers: &[gimli::UnitHeader<Reader<'_>>]) -> SharedAbbreviations {
        let mut users: HashMap<usize, usize> = HashMap::new();
        for header in headers {
            *users.entry(header.debug_abbrev_offset().0).or_default() += 1;
        }
        let tables = users
            .into_iter()
            .filter(|&(_, count)| count > 1)
            .map(|(offset, _)| (offset, SharedTable::new()))
            .collect();
        SharedAbbreviations { tables }
    }

    /// The unit of `header`, as [`gimli::Dwarf::unit`] gives it, its
    /// abbreviations parsed here once where they are shared.
    fn unit<'a>(
        &self,
        dwarf: &gimli::Dwarf<Reader<'a>>,
        header: gimli::UnitHeader<Reader<'a>>,
    ) -> Result<gimli::Unit<Reader<'a>>, gimli::Error> {
        let offset = header.debug_abbrev_offset();
        let Some(table) = self.tables.get(&offset.0) else {
            return dwarf.unit(header);
        };
        let parse = || {
            dwarf
                .debug_abbrev
                .abbreviations(offset)
                .map(std::sync::Arc::new)
        };
        let abbreviations = table.get_or_init(parse).clone()?;
        gimli::Unit::new_with_abbreviations(dwarf, header, abbreviations)
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
    let mut merged = Vec::with_capacity(total);
    if let Some(order) = disjoint_order(units.iter().map(|u| u.as_slice())) {
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

/// The order of `runs` (each sorted by `begin`, none empty) by their
/// first `begin`, where each then begins after the last range of the one
/// before begins: their concatenation in that order is sorted, and is what
/// a stable sort of them joined in the given order gives (no two ranges of
/// different runs begin together). `None` where runs interleave or touch.
fn disjoint_order<'r>(runs: impl Iterator<Item = &'r [Inline]>) -> Option<Vec<usize>> {
    let bounds: Vec<(u64, u64)> = runs
        .map(|run| (run[0].begin, run[run.len() - 1].begin))
        .collect();
    let mut order: Vec<usize> = (0..bounds.len()).collect();
    order.sort_by_key(|&r| bounds[r].0);
    let disjoint = order
        .windows(2)
        .all(|pair| bounds[pair[0]].1 < bounds[pair[1]].0);
    disjoint.then_some(order)
}

/// `inlines` sorted by `begin` as a stable sort orders them, where the
/// entries of each group (from one of `starts`, ascending, to the next)
/// mostly cover code of their own: one function's inlined ranges. Each
/// group is sorted alone and the groups joined by their first range
/// (a sort of the whole unit was a fifth of reading its inlined ranges);
/// groups whose ranges interleave leave the whole sorted at once.
fn sort_in_groups(mut inlines: Vec<Inline>, starts: &[usize]) -> Vec<Inline> {
    let mut groups: Vec<std::ops::Range<usize>> = Vec::with_capacity(starts.len() + 1);
    let mut from = 0;
    for &start in starts.iter().chain([&inlines.len()]) {
        if start > from {
            groups.push(from..start);
            from = start;
        }
    }
    for group in &groups {
        inlines[group.clone()].sort_by_key(|r| r.begin);
    }
    // Sorting each group kept the order of its ranges beginning together,
    // so a stable sort of the groups joined is still that of `inlines`.
    match disjoint_order(groups.iter().map(|g| &inlines[g.clone()])) {
        Some(order) if order.windows(2).any(|pair| pair[0] > pair[1]) => {
            let mut sorted = Vec::with_capacity(inlines.len());
            for g in order {
                sorted.extend_from_slice(&inlines[groups[g].clone()]);
            }
            sorted
        }
        Some(_) => inlines,
        None => {
            inlines.sort_by_key(|r| r.begin);
            inlines
        }
    }
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
    /// Counts the changes of `holding`: the call sites read at one
    /// generation are those of every address located in it.
    generation: u64,
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
            generation: 0,
        }
    }

    /// The same chain as [`LineTable::locate_chain`] of `address`.
    #[cfg(test)]
    pub(crate) fn locate_chain(&mut self, address: u64) -> Vec<SourceLocation<'t>> {
        let mut chain = Vec::new();
        self.locate_chain_into(address, &mut chain);
        chain
    }

    /// [`ChainCursor::locate_chain`] into `chain` (cleared first).
    #[cfg(test)]
    pub(crate) fn locate_chain_into(&mut self, address: u64, chain: &mut Vec<SourceLocation<'t>>) {
        chain.clear();
        if let Some(first) = self.locate(address) {
            chain.push(first);
            self.call_sites_into(chain);
        }
    }

    /// The line-table position of `address` (the first of its chain),
    /// none where the table has none; otherwise the cursor moves to it:
    /// [`ChainCursor::call_sites_into`] gives the rest of its chain.
    pub(crate) fn locate(&mut self, address: u64) -> Option<SourceLocation<'t>> {
        let rows = &self.table.rows;
        self.row_after = partition_point_from(rows, self.row_after, |r| r.address <= address);
        let first = self.table.position_before(self.row_after)?;
        let inlines = &self.table.inlines;
        if self.last.is_some_and(|last| last <= address) {
            let (entered, held) = (self.next, self.holding.len());
            while inlines.get(self.next).is_some_and(|r| r.begin <= address) {
                self.holding.push(self.next);
                self.next += 1;
            }
            self.holding.retain(|&i| inlines[i].end > address);
            if self.next != entered || self.holding.len() != held {
                self.generation += 1;
            }
        } else {
            self.holding.clear();
            self.next = self.table.scan_holding(address, &mut self.holding);
            self.holding.reverse();
            self.generation += 1;
        }
        self.last = Some(address);
        Some(first)
    }

    /// Counts the changes of the inlined ranges holding the located
    /// address: where it is the same as at an earlier address, so are the
    /// call sites.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Appends to `chain` the call sites of the address last located
    /// ([`ChainCursor::locate`]), innermost first: its chain past the
    /// first entry.
    pub(crate) fn call_sites_into(&mut self, chain: &mut Vec<SourceLocation<'t>>) {
        // Ranges holding one address nest, an inner one beginning at or
        // after the one holding it: lowest index first, they are mostly
        // outermost first already, and read backwards without a sort.
        let inlines = &self.table.inlines;
        if self.holding.is_sorted_by_key(|&i| inlines[i].depth) {
            let deepest_first = self.holding.iter().rev().copied();
            self.table.push_call_sites(deepest_first, chain);
            return;
        }
        self.order.clear();
        self.order.extend(self.holding.iter().rev());
        self.table.extend_call_sites(&mut self.order, chain);
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
    /// Where in `inlines`, as read, each subprogram's ranges begin (until
    /// they are sorted).
    inline_groups: Vec<usize>,
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
        (dwarf, abbreviations): (&gimli::Dwarf<Reader<'a>>, &SharedAbbreviations),
        header: gimli::UnitHeader<Reader<'a>>,
        (is_code, near): (&impl Fn(u64) -> bool, Option<&WantedIndex<'_>>),
        release: &impl Fn(&'a [u8]),
    ) -> UnitLines {
        let wanted = near.map(|w| w.addresses);
        let info = header.debug_info_offset().and_then(|start| {
            let end = start.0.checked_add(header.length_including_self())?;
            gimli::Section::reader(&dwarf.debug_info)
                .slice()
                .get(start.0..end)
        });
        let mut out = UnitLines::default();
        let Ok(unit) = abbreviations.unit(dwarf, header) else {
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
        let mut range_slots = FileSlots::default();
        let mut kept = RowSink::new(is_code, near);
        // The program is run here; where that leaves it to gimli, gimli
        // runs it from its start again (and names the files it defines),
        // its sequences kept whole and filtered once ended.
        let mut gimli_rows;
        let rows_header = if run_line_program(program.header(), &mut kept).is_some() {
            program.header()
        } else {
            kept = RowSink::new(is_code, None);
            gimli_rows = program.clone().rows();
            loop {
                let (_, row) = match gimli_rows.next_row() {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(e) => {
                        out.problem = Some(format!("malformed line program: {e}"));
                        break;
                    }
                };
                let line = row.line().map_or(0, |l| l.get());
                kept.row(row.address(), row.file_index(), line, row.end_sequence());
            }
            if let Some(wanted) = wanted {
                for sequence in &mut kept.sequences {
                    *sequence = rows_serving(sequence, wanted);
                }
            }
            gimli_rows.header()
        };
        out.sequences = kept.sequences;
        let row_slots = kept.slots;
        if let Err(e) = add_inlines(
            &mut out,
            dwarf,
            &unit,
            &mut range_slots,
            &mut |begin, end| is_code(begin) && near.is_none_or(|w| w.holds_any(begin, end)),
        ) {
            out.problem = Some(format!("malformed inlined subroutine: {e}"));
        }
        // Paths as the rows' program (with any file it defined) and the
        // unit's header name them.
        let (files, file_ids) = (&mut out.files, &mut HashMap::new());
        let comp_dir = comp_dir.as_deref();
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
        out.inlines = sort_in_groups(std::mem::take(&mut out.inlines), &out.inline_groups);
        out
    }
}

/// What [`UnitLines::read`] keeps of a unit's rows as its line program
/// gives them: the sequences that begin in code, each as
/// [`rows_serving`] keeps it for `wanted` addresses (whole without).
/// The rows are filtered as they come (most rows of a large unit serve no
/// wanted address, and keeping each to filter its sequence at the end
/// was most of taking them); a sequence found going backwards is marked
/// to be given again and kept whole ([`RowSink::read_again`]).
struct RowSink<'s, C> {
    is_code: &'s C,
    wanted: Option<&'s WantedIndex<'s>>,
    /// The sequences kept, each ending with its end row.
    sequences: Vec<Vec<Row>>,
    /// The rows kept of the sequence under way (all of them where it is
    /// kept whole).
    current: Vec<Row>,
    /// The last row of the sequence under way where it is not kept yet:
    /// it is if a wanted address lies before the next row.
    held: Option<Row>,
    /// The address of the last row of the sequence under way.
    last_address: u64,
    /// The first wanted address at or after `last_address`, by index.
    next_wanted: usize,
    /// Whether the sequence under way went backwards: it was left out and
    /// is to be given again.
    backwards: bool,
    /// Whether the sequence under way is kept whole.
    whole: bool,
    slots: FileSlots,
    /// The last file index met and its slot.
    last_file: Option<(u64, u32)>,
}

impl<'s, C: Fn(u64) -> bool> RowSink<'s, C> {
    fn new(is_code: &'s C, wanted: Option<&'s WantedIndex<'s>>) -> Self {
        RowSink {
            is_code,
            wanted,
            sequences: Vec::new(),
            current: Vec::new(),
            held: None,
            last_address: 0,
            next_wanted: 0,
            backwards: false,
            whole: false,
            slots: FileSlots::default(),
            last_file: None,
        }
    }

    /// Takes a row of the program: its address, file index and line (0:
    /// none), or the end of its sequence. Inlined into the program's run
    /// (a call for each of a large binary's million rows cost a fifth of
    /// taking them, and LLVM kept the call with `#[inline]`); the end of
    /// a sequence and the first row of a filtered one are out of line.
    #[inline(always)]
    fn row(&mut self, address: u64, index: u64, line: u64, end_sequence: bool) {
        if end_sequence {
            self.end_sequence(address);
            return;
        }
        // Consecutive rows mostly name the same file.
        let file = match self.last_file {
            Some((last, id)) if last == index => id,
            _ => {
                let slot = self.slots.slot(index);
                self.last_file = Some((index, slot));
                slot
            }
        };
        let row = Row {
            address,
            file,
            line: clamp_line(line),
        };
        match self.wanted {
            Some(wanted) if !self.whole => {
                if self.current.is_empty() {
                    self.begin_filtered(row, wanted);
                } else {
                    self.pass_to(address, wanted.addresses);
                    self.held = Some(row);
                }
            }
            _ => self.current.push(row),
        }
    }

    /// Keeps `row`, the first of a sequence filtered for `wanted`.
    #[inline(never)]
    fn begin_filtered(&mut self, row: Row, wanted: &WantedIndex<'_>) {
        self.current.push(row);
        self.last_address = row.address;
        self.next_wanted = wanted.first_at_or_after(row.address);
    }

    /// Decides the held row of a filtered sequence whose next row is at
    /// `address`: kept where a wanted address lies before it.
    #[inline(always)]
    fn pass_to(&mut self, address: u64, wanted: &[u64]) {
        if address < self.last_address {
            self.backwards = true;
        }
        if wanted.get(self.next_wanted).is_some_and(|&a| a < address) {
            if let Some(held) = self.held {
                self.current.push(held);
            }
            while wanted.get(self.next_wanted).is_some_and(|&a| a < address) {
                self.next_wanted += 1;
            }
        }
        self.held = None;
        self.last_address = address;
    }

    /// Ends the sequence under way with its end row at `address`: kept
    /// (what [`rows_serving`] keeps of it) if it begins in code, unless it
    /// went backwards ([`RowSink::read_again`]).
    #[inline(never)]
    fn end_sequence(&mut self, address: u64) {
        if let Some(wanted) = self.wanted
            && !self.whole
            && !self.current.is_empty()
        {
            self.pass_to(address, wanted.addresses);
        }
        self.current.push(Row {
            address,
            file: NO_FILE,
            line: 0,
        });
        if !self.backwards
            && self
                .current
                .first()
                .is_some_and(|r| (self.is_code)(r.address))
        {
            self.sequences.push(self.current.clone());
        }
        self.current.clear();
        self.whole = false;
    }

    /// Whether the sequence just ended went backwards and was left out:
    /// it is to be given again from its first row, and is then kept whole.
    fn read_again(&mut self) -> bool {
        self.whole = std::mem::take(&mut self.backwards);
        self.whole
    }
}

/// Runs a line program into `sink` as gimli's `LineRows` runs it, for
/// the registers the table keeps (address, file, line; tombstoned
/// sequences skipped alike), its special opcodes' advances looked up
/// (gimli's rows were the larger part of the units' reading: each
/// instruction returned as an enum and every register kept). `None`
/// where it leaves the program to gimli, `sink` then to be dropped: a
/// program that is malformed (gimli gives the rows before the fault and
/// names it), defines files, has more than one operation per instruction
/// or addresses of other than 8 bytes.
fn run_line_program<C: Fn(u64) -> bool>(
    header: &gimli::LineProgramHeader<Reader<'_>>,
    sink: &mut RowSink<'_, C>,
) -> Option<()> {
    use gimli::Reader as _;
    let (base, range) = (header.opcode_base(), header.line_range());
    if header.maximum_operations_per_instruction() != 1 || header.address_size() != 8 || range == 0
    {
        return None;
    }
    let min_length = u64::from(header.minimum_instruction_length());
    let line_base = i64::from(header.line_base());
    // Special opcode -> (address advance, line advance): an array a byte
    // indexes without a bound check, made without an allocation per unit.
    let special: [(u64, i64); 256] = std::array::from_fn(|opcode| {
        let adjusted = (opcode as u8).wrapping_sub(base);
        let advance = u64::from(adjusted / range).wrapping_mul(min_length);
        (advance, line_base + i64::from(adjusted % range))
    });
    let const_add_pc = u64::from(255u8.wrapping_sub(base) / range).wrapping_mul(min_length);
    let lengths = header.standard_opcode_lengths().slice();
    // gimli's tombstones: an address below the last, or -2 and up.
    const MIN_TOMBSTONE: u64 = u64::MAX - 1;
    let mut input = header.raw_program_buf();
    // Where the sink's sequence under way began: one it finds going
    // backwards is run again from there.
    let mut sequence_start = input;
    let (mut address, mut file, mut line, mut tombstone) = (0u64, 1u64, 1u64, false);
    let advance_line = |line: u64, by: i64| {
        if by < 0 {
            line.saturating_sub(by.unsigned_abs())
        } else {
            line.wrapping_add(by as u64)
        }
    };
    // Each opcode taken off the slice's front (gimli's `read_u8` is a
    // `Result` for every one of a large binary's millions).
    while let Some((&opcode, rest)) = input.slice().split_first() {
        input = EndianSlice::new(rest, LittleEndian);
        let mut emit = false;
        let mut end_sequence = false;
        if opcode >= base && opcode != 0 {
            let (by, lines) = special[usize::from(opcode)];
            line = advance_line(line, lines);
            if !tombstone {
                address = address.checked_add(by)?;
            }
            emit = true;
        } else if opcode == 0 {
            let length = usize::try_from(read_uleb128(&mut input).ok()?).ok()?;
            let mut rest = input.split(length).ok()?;
            match gimli::DwLne(rest.read_u8().ok()?) {
                gimli::DW_LNE_end_sequence => (emit, end_sequence) = (true, true),
                gimli::DW_LNE_set_address => {
                    let to = rest.read_address(8).ok()?;
                    tombstone = to < address || to >= MIN_TOMBSTONE;
                    if !tombstone {
                        address = to;
                    }
                }
                gimli::DW_LNE_define_file if header.version() <= 4 => return None,
                gimli::DW_LNE_set_discriminator => {
                    rest.read_uleb128().ok()?;
                }
                _ => {}
            }
        } else {
            match gimli::DwLns(opcode) {
                gimli::DW_LNS_copy => emit = true,
                gimli::DW_LNS_advance_pc => {
                    let by = read_uleb128(&mut input).ok()?;
                    if !tombstone {
                        address = address.checked_add(min_length.wrapping_mul(by))?;
                    }
                }
                gimli::DW_LNS_advance_line => {
                    line = advance_line(line, read_sleb128(&mut input).ok()?);
                }
                gimli::DW_LNS_set_file => file = read_uleb128(&mut input).ok()?,
                gimli::DW_LNS_set_column | gimli::DW_LNS_set_isa => {
                    read_uleb128(&mut input).ok()?;
                }
                gimli::DW_LNS_negate_stmt
                | gimli::DW_LNS_set_basic_block
                | gimli::DW_LNS_set_prologue_end
                | gimli::DW_LNS_set_epilogue_begin => {}
                gimli::DW_LNS_const_add_pc => {
                    if !tombstone {
                        address = address.checked_add(const_add_pc)?;
                    }
                }
                gimli::DW_LNS_fixed_advance_pc => {
                    let by = input.read_u16().ok()?;
                    if !tombstone {
                        address = address.checked_add(u64::from(by))?;
                    }
                }
                _ => {
                    // An opcode this version does not define: its
                    // arguments, as the header counts them, skipped.
                    let arguments = *lengths.get(usize::from(opcode - 1))?;
                    for _ in 0..arguments {
                        input.read_uleb128().ok()?;
                    }
                }
            }
        }
        if !emit {
            continue;
        }
        if !tombstone {
            sink.row(address, file, line, end_sequence);
            if end_sequence {
                if sink.read_again() {
                    input = sequence_start;
                }
                sequence_start = input;
            }
        }
        if end_sequence {
            (address, file, line, tombstone) = (0, 1, 1, false);
        }
    }
    Some(())
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

    /// The slot of file `index`. Inlined where a dense slot is given
    /// already (a call for each row's and range's file cost more than
    /// the look-up); the first meeting of a file is out of line.
    #[inline]
    fn slot(&mut self, index: u64) -> u32 {
        match self.dense.get(index as usize) {
            Some(&slot) if slot != 0 => slot - 1,
            _ => self.add_slot(index),
        }
    }

    /// The slot of file `index`, given one if it has none.
    #[inline(never)]
    fn add_slot(&mut self, index: u64) -> u32 {
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
/// call site and range attributes are parsed; every other entry is stepped
/// over by its abbreviation's [`EntryPlan`] (parsing each entry whole,
/// then looking its attributes up twice, was a third of the units'
/// reading; skipping them attribute by attribute through gimli, a sixth).
fn add_inlines<'a>(
    out: &mut UnitLines,
    dwarf: &gimli::Dwarf<Reader<'a>>,
    unit: &gimli::Unit<Reader<'a>>,
    slots: &mut FileSlots,
    keep: &mut impl FnMut(u64, u64) -> bool,
) -> Result<(), gimli::Error> {
    use gimli::Reader as _;
    let encoding = unit.encoding();
    let abbreviations = &*unit.abbreviations;
    let mut plans = EntryPlans::default();
    let mut input = unit.header.range_from(unit.header.root_offset()..)?;
    let mut attrs: Vec<SiteAttribute<'a>> = Vec::new();
    // Depths as gimli's entries give them: a null entry closes a list of
    // children, an entry with children opens one after itself.
    let mut depth: isize = 0;
    while !input.is_empty() {
        let entry_depth = depth;
        let code = read_uleb128(&mut input)?;
        if code == 0 {
            depth -= 1;
            continue;
        }
        let plan = plans.plan(code, abbreviations, encoding)?;
        if plan.subprogram {
            out.inline_groups.push(out.inlines.len());
        }
        if plan.has_children {
            depth += 1;
        }
        if let Some(site) = plan.fixed_site {
            let site = &plans.fixed_sites[site as usize];
            let entry = input.split(site.size)?;
            match site.read(entry.slice(), (dwarf, unit))? {
                // Most sites have one range: added here, not through a
                // call for each.
                Some((call, SiteRanges::Single(Some(range)))) => {
                    add_range(out, (entry_depth, call), range, slots, keep);
                }
                Some((_, SiteRanges::Single(None))) | None => {}
                Some((call, ranges)) => add_ranges(out, (entry_depth, call), ranges, slots, keep)?,
            }
            continue;
        }
        attrs.clear();
        if !plan.whole {
            plans.walk(plan, &mut input, (encoding, abbreviations), &mut attrs)?;
        } else {
            let abbrev = abbreviations
                .get(code)
                .ok_or(gimli::Error::InvalidAbbreviationCode(code))?;
            // gimli reads the entry from where its attributes begin; the
            // walk goes on where it stopped.
            let mut entries = gimli::EntriesRaw::new(input, encoding, abbreviations, UnitOffset(0));
            if plan.inlined {
                read_site_attributes(&mut entries, abbrev.attributes(), &mut attrs)?;
            } else {
                entries.skip_attributes(abbrev.attributes())?;
            }
            input.skip(entries.next_offset().0)?;
        }
        if plan.inlined {
            add_site(out, (dwarf, unit), (entry_depth, &attrs), slots, keep)?;
        }
    }
    Ok(())
}

/// Adds the ranges of the inlined subroutine at `depth` with attributes
/// `attrs` (its call site and ranges) that `keep` accepts.
fn add_site<'a>(
    out: &mut UnitLines,
    (dwarf, unit): (&gimli::Dwarf<Reader<'a>>, &gimli::Unit<Reader<'a>>),
    (depth, attrs): (isize, &[SiteAttribute<'a>]),
    slots: &mut FileSlots,
    keep: &mut impl FnMut(u64, u64) -> bool,
) -> Result<(), gimli::Error> {
    let index = match attr_value(attrs, gimli::DW_AT_call_file) {
        Some(AttributeValue::FileIndex(i)) => i,
        Some(other) => match other.udata_value() {
            Some(i) => i,
            None => return Ok(()),
        },
        None => return Ok(()),
    };
    let line = attr_value(attrs, gimli::DW_AT_call_line)
        .and_then(|v| v.udata_value())
        .map_or(0, clamp_line);
    let ranges = site_ranges(dwarf, unit, attrs)?;
    add_ranges(out, (depth, (index, line)), ranges, slots, keep)
}

/// An inlined subroutine's call site: its file index and line.
type CallSite = (u64, u32);

/// A call line as the table keeps it (`u32::MAX` is no line's).
fn clamp_line(line: u64) -> u32 {
    line.min(u64::from(u32::MAX - 1)) as u32
}

/// An unsigned LEB128 number from `input`: one of one byte (most
/// abbreviation codes and line program operands are) read here, a longer
/// one by gimli (whose reader is a call for every number).
#[inline]
fn read_uleb128(input: &mut Reader<'_>) -> Result<u64, gimli::Error> {
    if let [byte, rest @ ..] = input.slice()
        && *byte < 0x80
    {
        *input = EndianSlice::new(rest, LittleEndian);
        return Ok(u64::from(*byte));
    }
    read_uleb128_beyond_byte(input)
}

/// [`read_uleb128`] of a number that is not one byte: one of two bytes
/// (a range list's offsets, most larger operands) read here, a longer one
/// by gimli. Out of line, so that the one-byte path stays small where it
/// is inlined.
#[inline(never)]
fn read_uleb128_beyond_byte(input: &mut Reader<'_>) -> Result<u64, gimli::Error> {
    use gimli::Reader as _;
    if let [low, high, rest @ ..] = input.slice()
        && *high < 0x80
    {
        *input = EndianSlice::new(rest, LittleEndian);
        return Ok(u64::from(low & 0x7f) | (u64::from(*high) << 7));
    }
    input.read_uleb128()
}

/// A signed LEB128 number from `input`: one of one byte (about half a
/// line program's line advances) read here, a longer one by gimli.
#[inline]
fn read_sleb128(input: &mut Reader<'_>) -> Result<i64, gimli::Error> {
    if let [byte, rest @ ..] = input.slice()
        && *byte < 0x80
    {
        *input = EndianSlice::new(rest, LittleEndian);
        // Bit 6 is the sign: shifted into the byte's top bit and back.
        return Ok(i64::from(((*byte << 1) as i8) >> 1));
    }
    read_sleb128_beyond_byte(input)
}

/// [`read_sleb128`] of a number that is not one byte: one of two bytes
/// (most of the rest of a line program's line advances, each a call and
/// a loop in gimli's reader) read here, a longer one by gimli. Out of
/// line, as [`read_uleb128_beyond_byte`].
#[inline(never)]
fn read_sleb128_beyond_byte(input: &mut Reader<'_>) -> Result<i64, gimli::Error> {
    use gimli::Reader as _;
    if let [low, high, rest @ ..] = input.slice()
        && *high < 0x80
    {
        *input = EndianSlice::new(rest, LittleEndian);
        // Fourteen bits, bit 13 the sign: shifted to the top and back.
        let bits = u64::from(low & 0x7f) | (u64::from(*high) << 7);
        return Ok(((bits << 50) as i64) >> 50);
    }
    input.read_sleb128()
}

/// Adds the `ranges` of the inlined subroutine at `depth` called at
/// `(file index, line)` that `keep` accepts.
fn add_ranges(
    out: &mut UnitLines,
    (depth, (index, line)): (isize, CallSite),
    mut ranges: SiteRanges<'_>,
    slots: &mut FileSlots,
    keep: &mut impl FnMut(u64, u64) -> bool,
) -> Result<(), gimli::Error> {
    while let Some(range) = ranges.next()? {
        add_range(out, (depth, (index, line)), range, slots, keep);
    }
    Ok(())
}

/// Adds `range` of the inlined subroutine at `depth` called at `(file
/// index, line)` if it is not empty and `keep` accepts it.
#[inline(always)]
fn add_range(
    out: &mut UnitLines,
    (depth, (index, line)): (isize, CallSite),
    range: gimli::Range,
    slots: &mut FileSlots,
    keep: &mut impl FnMut(u64, u64) -> bool,
) {
    if range.begin < range.end && keep(range.begin, range.end) {
        out.inlines.push(Inline {
            begin: range.begin,
            end: range.end,
            depth: u32::try_from(depth).unwrap_or(0),
            file: slots.slot(index),
            line,
        });
    }
}

/// How [`add_inlines`] meets the entries of one abbreviation.
#[derive(Clone, Copy, Debug)]
struct EntryPlan {
    has_children: bool,
    /// An inlined subroutine: its site attributes are read.
    inlined: bool,
    /// A subprogram: the inlined ranges from it on are sorted apart from
    /// those before ([`sort_in_groups`]).
    subprogram: bool,
    /// Read through gimli: an entry with an attribute of a form not
    /// planned here (`DW_FORM_indirect`, forms gimli does not know either).
    whole: bool,
    /// Its steps in [`EntryPlans::steps`], where not `whole`.
    steps: (u32, u32),
    /// The size of each of its entries, where every attribute has a fixed
    /// size and none is read: most entries are such, and one skip costs
    /// less than going through the steps.
    fixed_size: Option<u32>,
    /// An inlined subroutine's [`FixedSite`] in [`EntryPlans::fixed_sites`],
    /// where its entries have one.
    fixed_site: Option<u32>,
}

/// Where an inlined subroutine's site attributes lie in each entry of an
/// abbreviation whose attributes all have fixed sizes, each site attribute
/// at most once and in a form read here: its values are read at their
/// offsets, without steps or a list of attributes (most of a large
/// binary's inlined subroutines are such, and stepping through their
/// attributes would be most of reading the units' entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FixedSite {
    /// The size of each entry.
    size: usize,
    call_file: Option<SiteField>,
    call_line: Option<SiteField>,
    low_pc: Option<SiteField>,
    /// An end address where [`FixedSite::high_pc_is_address`], else a size.
    high_pc: Option<SiteField>,
    high_pc_is_address: bool,
    /// A section offset of a range list.
    ranges: Option<SiteField>,
}

/// A site attribute's place in an entry of fixed layout: its offset and
/// its width (1, 2, 4 or 8 bytes, a little-endian unsigned value, as
/// [`SiteStep::read`] reads each form planned here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SiteField {
    at: usize,
    width: u8,
}

impl SiteField {
    /// The value in `entry` (an entry's bytes, `at + width` or more).
    /// Always inlined: called for each site field of about a million
    /// inlined subroutines, and LLVM kept the call even with `#[inline]`.
    #[inline(always)]
    fn value(self, entry: &[u8]) -> u64 {
        let bytes = &entry[self.at..];
        match self.width {
            1 => u64::from(bytes[0]),
            2 => u64::from(u16::from_le_bytes([bytes[0], bytes[1]])),
            4 => u64::from(u32::from_le_bytes(
                bytes[..4].try_into().expect("four bytes"),
            )),
            _ => u64::from_le_bytes(bytes[..8].try_into().expect("eight bytes")),
        }
    }
}

impl FixedSite {
    /// The fixed layout of an inlined subroutine's entries walked by
    /// `steps`, where it has one.
    fn of(steps: &[EntryStep], encoding: gimli::Encoding) -> Option<FixedSite> {
        let mut site = FixedSite {
            size: 0,
            call_file: None,
            call_line: None,
            low_pc: None,
            high_pc: None,
            high_pc_is_address: false,
            ranges: None,
        };
        for step in steps {
            match *step {
                EntryStep::Bytes(size) => site.size += size,
                EntryStep::Site(step) => {
                    let width = step.read.fixed_width(encoding)?;
                    let field = SiteField {
                        at: site.size,
                        width,
                    };
                    let slot = match step.name {
                        gimli::DW_AT_call_file => &mut site.call_file,
                        gimli::DW_AT_call_line => &mut site.call_line,
                        gimli::DW_AT_low_pc => &mut site.low_pc,
                        gimli::DW_AT_high_pc => {
                            site.high_pc_is_address = matches!(step.read, SiteRead::Address(_));
                            &mut site.high_pc
                        }
                        _ => &mut site.ranges,
                    };
                    if slot.replace(field).is_some() {
                        return None;
                    }
                    site.size += usize::from(width);
                }
                _ => return None,
            }
        }
        Some(site)
    }

    /// The call site (file index, line) and ranges of the entry `entry`,
    /// as [`add_site`] reads them from its attributes; no call site where
    /// it has no call file.
    fn read<'a>(
        &self,
        entry: &[u8],
        (dwarf, unit): (&gimli::Dwarf<Reader<'a>>, &gimli::Unit<Reader<'a>>),
    ) -> Result<Option<(CallSite, SiteRanges<'a>)>, gimli::Error> {
        let Some(file) = self.call_file else {
            return Ok(None);
        };
        let line = self.call_line.map_or(0, |l| clamp_line(l.value(entry)));
        if let Some(ranges) = self.ranges {
            let offset = gimli::RawRangeListsOffset(ranges.value(entry) as usize);
            let value = AttributeValue::RangeListsRef(offset);
            if let Some(list) = range_list(dwarf, unit, value)? {
                return Ok(Some(((file.value(entry), line), list)));
            }
        }
        let low_pc = self.low_pc.map(|f| f.value(entry));
        let high_pc = self.high_pc.map(|f| f.value(entry));
        let (size, high_pc) = if self.high_pc_is_address {
            (None, high_pc)
        } else {
            (high_pc, None)
        };
        let ranges = SiteRanges::single(low_pc, size, high_pc);
        Ok(Some(((file.value(entry), line), ranges)))
    }
}

/// One step over an entry's attributes: what gimli's `skip_attributes`
/// does for a form, fixed sizes run together, or an attribute read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EntryStep {
    /// A run of attributes of fixed sizes.
    Bytes(usize),
    /// A LEB128 number (`udata`, `sdata`, `ref_udata`, the `*x` indices).
    Leb128,
    /// A block with its length in the 1, 2 or 4 bytes before it.
    Block(u8),
    /// A block or expression with its length in a LEB128 number before it.
    BlockLeb128,
    /// A null-terminated string.
    String,
    /// An inlined subroutine's site attribute ([`is_site_attribute`]) of
    /// a form read here.
    Site(SiteStep),
    /// An inlined subroutine's site attribute of another form, parsed by
    /// gimli.
    Read(gimli::AttributeSpecification),
}

/// How [`EntryPlans::walk`] reads a site attribute of a common form
/// itself, giving the value gimli's `Attribute::value` gives (gimli's
/// parse and conversion of these four or five attributes of every
/// inlined subroutine were a fifth of the units' reading).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SiteStep {
    name: gimli::DwAt,
    form: gimli::DwForm,
    read: SiteRead,
}

/// The bytes of a [`SiteStep`]'s value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SiteRead {
    /// `DW_FORM_data1`, `data2`, `data4` or `data8`: that many bytes.
    Data(u8),
    /// `DW_FORM_udata`.
    Udata,
    /// `DW_FORM_addr`: an address of the unit's size.
    Address(u8),
    /// `DW_FORM_sec_offset`: an offset of the unit's format.
    Offset(gimli::Format),
}

impl SiteRead {
    /// The width of every value read so, where it is fixed and read as a
    /// little-endian unsigned number of 1, 2, 4 or 8 bytes.
    fn fixed_width(self, encoding: gimli::Encoding) -> Option<u8> {
        let width = match self {
            SiteRead::Data(width) | SiteRead::Address(width) => width,
            SiteRead::Udata => return None,
            SiteRead::Offset(_) => encoding.format.word_size(),
        };
        matches!(width, 1 | 2 | 4 | 8).then_some(width)
    }
}

impl SiteStep {
    /// The step for site attribute `name` of `form`, where read here:
    /// the forms producers give them (call site: constants; `low_pc`: an
    /// address; `high_pc`: an address or a constant; `ranges`: a section
    /// offset). Others (`addrx`, `rnglistx`, `data4` ranges of DWARF 2
    /// and 3, signed constants) go to gimli.
    fn of(name: gimli::DwAt, form: gimli::DwForm, encoding: gimli::Encoding) -> Option<SiteStep> {
        let constant = match form {
            gimli::DW_FORM_data1 => Some(SiteRead::Data(1)),
            gimli::DW_FORM_data2 => Some(SiteRead::Data(2)),
            gimli::DW_FORM_data4 => Some(SiteRead::Data(4)),
            gimli::DW_FORM_data8 => Some(SiteRead::Data(8)),
            gimli::DW_FORM_udata => Some(SiteRead::Udata),
            _ => None,
        };
        let address =
            (form == gimli::DW_FORM_addr).then_some(SiteRead::Address(encoding.address_size));
        let read = match name {
            gimli::DW_AT_call_file | gimli::DW_AT_call_line => constant,
            gimli::DW_AT_low_pc => address,
            gimli::DW_AT_high_pc => constant.or(address),
            gimli::DW_AT_ranges => {
                (form == gimli::DW_FORM_sec_offset).then_some(SiteRead::Offset(encoding.format))
            }
            _ => None,
        }?;
        Some(SiteStep { name, form, read })
    }

    /// Reads the attribute from `input`.
    fn read<'a>(self, input: &mut Reader<'a>) -> Result<SiteAttribute<'a>, gimli::Error> {
        use gimli::Reader as _;
        let raw = match self.read {
            SiteRead::Data(1) => u64::from(input.read_u8()?),
            SiteRead::Data(2) => u64::from(input.read_u16()?),
            SiteRead::Data(4) => u64::from(input.read_u32()?),
            SiteRead::Data(_) => input.read_u64()?,
            SiteRead::Udata => input.read_uleb128()?,
            SiteRead::Address(size) => read_sized_address(input, size)?,
            SiteRead::Offset(format) => {
                let offset = input.read_offset(format)?;
                return Ok(SiteAttribute {
                    name: self.name,
                    form: self.form,
                    value: AttributeValue::RangeListsRef(gimli::RawRangeListsOffset(offset)),
                });
            }
        };
        let value = match (self.name, self.read) {
            (gimli::DW_AT_call_file, _) => AttributeValue::FileIndex(raw),
            (_, SiteRead::Address(_)) => AttributeValue::Addr(raw),
            _ => AttributeValue::Udata(raw),
        };
        Ok(SiteAttribute {
            name: self.name,
            form: self.form,
            value,
        })
    }
}

/// An inlined subroutine's site attribute as [`add_site`] reads it: its
/// name, form and value (as gimli's `Attribute::value` gives it).
#[derive(Clone, Copy, Debug)]
struct SiteAttribute<'a> {
    name: gimli::DwAt,
    form: gimli::DwForm,
    value: AttributeValue<Reader<'a>>,
}

impl<'a> SiteAttribute<'a> {
    /// The attribute gimli parsed.
    fn of(attribute: &gimli::Attribute<Reader<'a>>) -> SiteAttribute<'a> {
        SiteAttribute {
            name: attribute.name(),
            form: attribute.form(),
            value: attribute.value(),
        }
    }
}

/// An address of `size` bytes from `input`, an 8-byte one read as such
/// (gimli's `read_address` chooses by the size at every call).
fn read_sized_address(input: &mut Reader<'_>, size: u8) -> Result<u64, gimli::Error> {
    use gimli::Reader as _;
    match size {
        8 => input.read_u64(),
        size => input.read_address(size),
    }
}

/// A unit's [`EntryPlan`]s by abbreviation code, each made when its code
/// is first met.
#[derive(Default)]
struct EntryPlans {
    /// Code -> plan, for codes below [`EntryPlans::DENSE`]; `None` where
    /// not made yet.
    plans: Vec<Option<EntryPlan>>,
    /// Larger code -> plan (producers number a unit's abbreviations from
    /// 1, densely; a vector indexed by a stray large code would be huge).
    sparse: HashMap<u64, EntryPlan>,
    steps: Vec<EntryStep>,
    /// The plans' [`FixedSite`]s.
    fixed_sites: Vec<FixedSite>,
}

impl EntryPlans {
    /// Codes from this one on are kept in [`EntryPlans::sparse`].
    const DENSE: u64 = 1 << 16;

    /// The plan of abbreviation `code`.
    fn plan(
        &mut self,
        code: u64,
        abbreviations: &gimli::Abbreviations,
        encoding: gimli::Encoding,
    ) -> Result<EntryPlan, gimli::Error> {
        let made = if code < Self::DENSE {
            self.plans.get(code as usize).copied().flatten()
        } else {
            self.sparse.get(&code).copied()
        };
        if let Some(plan) = made {
            return Ok(plan);
        }
        let abbrev = abbreviations
            .get(code)
            .ok_or(gimli::Error::InvalidAbbreviationCode(code))?;
        let plan = self.make(abbrev, encoding);
        if code < Self::DENSE {
            let at = code as usize;
            if at >= self.plans.len() {
                self.plans.resize(at + 1, None);
            }
            self.plans[at] = Some(plan);
        } else {
            self.sparse.insert(code, plan);
        }
        Ok(plan)
    }

    /// Plans `abbrev`'s entries, adding its steps.
    fn make(&mut self, abbrev: &gimli::Abbreviation, encoding: gimli::Encoding) -> EntryPlan {
        let has_children = abbrev.has_children();
        let inlined = abbrev.tag() == gimli::DW_TAG_inlined_subroutine;
        let subprogram = abbrev.tag() == gimli::DW_TAG_subprogram;
        let start = self.steps.len();
        for spec in abbrev.attributes() {
            if inlined && is_site_attribute(spec.name()) {
                self.steps
                    .push(match SiteStep::of(spec.name(), spec.form(), encoding) {
                        Some(site) => EntryStep::Site(site),
                        None => EntryStep::Read(*spec),
                    });
                continue;
            }
            let step = match form_size(spec.form(), encoding) {
                Some(size) => EntryStep::Bytes(size),
                None => match spec.form() {
                    gimli::DW_FORM_udata
                    | gimli::DW_FORM_sdata
                    | gimli::DW_FORM_ref_udata
                    | gimli::DW_FORM_strx
                    | gimli::DW_FORM_GNU_str_index
                    | gimli::DW_FORM_addrx
                    | gimli::DW_FORM_GNU_addr_index
                    | gimli::DW_FORM_loclistx
                    | gimli::DW_FORM_rnglistx => EntryStep::Leb128,
                    gimli::DW_FORM_block1 => EntryStep::Block(1),
                    gimli::DW_FORM_block2 => EntryStep::Block(2),
                    gimli::DW_FORM_block4 => EntryStep::Block(4),
                    gimli::DW_FORM_block | gimli::DW_FORM_exprloc => EntryStep::BlockLeb128,
                    gimli::DW_FORM_string => EntryStep::String,
                    _ => {
                        self.steps.truncate(start);
                        return EntryPlan {
                            has_children,
                            inlined,
                            subprogram,
                            whole: true,
                            steps: (0, 0),
                            fixed_size: None,
                            fixed_site: None,
                        };
                    }
                },
            };
            if let EntryStep::Bytes(size) = step {
                // Fixed sizes run together, as gimli adds them up.
                if let (true, Some(EntryStep::Bytes(run))) =
                    (self.steps.len() > start, self.steps.last_mut())
                {
                    *run += size;
                    continue;
                }
                if size == 0 {
                    continue;
                }
            }
            self.steps.push(step);
        }
        let fixed_size = match self.steps[start..] {
            [] => Some(0),
            [EntryStep::Bytes(size)] => u32::try_from(size).ok(),
            _ => None,
        };
        let fixed_site = match inlined {
            true => FixedSite::of(&self.steps[start..], encoding).map(|site| {
                self.fixed_sites.push(site);
                (self.fixed_sites.len() - 1) as u32
            }),
            false => None,
        };
        EntryPlan {
            has_children,
            inlined,
            subprogram,
            whole: false,
            steps: (start as u32, self.steps.len() as u32),
            fixed_size,
            fixed_site,
        }
    }

    /// Steps `input` over the attributes of an entry of `plan`, reading
    /// those it reads into `attrs` (in order).
    fn walk<'a>(
        &self,
        plan: EntryPlan,
        input: &mut Reader<'a>,
        (encoding, abbreviations): (gimli::Encoding, &gimli::Abbreviations),
        attrs: &mut Vec<SiteAttribute<'a>>,
    ) -> Result<(), gimli::Error> {
        use gimli::Reader as _;
        if let Some(size) = plan.fixed_size {
            return input.skip(size as usize);
        }
        for step in &self.steps[plan.steps.0 as usize..plan.steps.1 as usize] {
            match *step {
                EntryStep::Site(site) => attrs.push(site.read(input)?),
                EntryStep::Read(spec) => {
                    let mut entries =
                        gimli::EntriesRaw::new(*input, encoding, abbreviations, UnitOffset(0));
                    attrs.push(SiteAttribute::of(&entries.read_attribute_inline(spec)?));
                    input.skip(entries.next_offset().0)?;
                }
                EntryStep::Bytes(size) => input.skip(size)?,
                EntryStep::Leb128 => input.skip_leb128()?,
                EntryStep::Block(1) => {
                    let size = input.read_u8()?;
                    input.skip(usize::from(size))?;
                }
                EntryStep::Block(2) => {
                    let size = input.read_u16()?;
                    input.skip(usize::from(size))?;
                }
                EntryStep::Block(_) => {
                    let size = input.read_u32()?;
                    input.skip(usize::from_u32(size))?;
                }
                EntryStep::BlockLeb128 => {
                    let size = input.read_uleb128()?;
                    input.skip(usize::from_u64(size)?)?;
                }
                EntryStep::String => {
                    input.read_null_terminated_slice()?;
                }
            }
        }
        Ok(())
    }
}

/// The size of an attribute of `form` whatever its value, as gimli's
/// `get_attribute_size` gives it; `None` for forms of variable size (and
/// unknown ones).
fn form_size(form: gimli::DwForm, encoding: gimli::Encoding) -> Option<usize> {
    let size = match form {
        gimli::DW_FORM_addr => encoding.address_size,
        gimli::DW_FORM_implicit_const | gimli::DW_FORM_flag_present => 0,
        gimli::DW_FORM_data1
        | gimli::DW_FORM_flag
        | gimli::DW_FORM_strx1
        | gimli::DW_FORM_ref1
        | gimli::DW_FORM_addrx1 => 1,
        gimli::DW_FORM_data2
        | gimli::DW_FORM_ref2
        | gimli::DW_FORM_addrx2
        | gimli::DW_FORM_strx2 => 2,
        gimli::DW_FORM_addrx3 | gimli::DW_FORM_strx3 => 3,
        gimli::DW_FORM_data4
        | gimli::DW_FORM_ref_sup4
        | gimli::DW_FORM_ref4
        | gimli::DW_FORM_strx4
        | gimli::DW_FORM_addrx4 => 4,
        gimli::DW_FORM_data8
        | gimli::DW_FORM_ref8
        | gimli::DW_FORM_ref_sig8
        | gimli::DW_FORM_ref_sup8 => 8,
        gimli::DW_FORM_data16 => 16,
        gimli::DW_FORM_sec_offset
        | gimli::DW_FORM_GNU_ref_alt
        | gimli::DW_FORM_strp
        | gimli::DW_FORM_strp_sup
        | gimli::DW_FORM_GNU_strp_alt
        | gimli::DW_FORM_line_strp => encoding.format.word_size(),
        gimli::DW_FORM_ref_addr if encoding.version == 2 => encoding.address_size,
        gimli::DW_FORM_ref_addr => encoding.format.word_size(),
        _ => return None,
    };
    Some(usize::from(size))
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
    attrs: &mut Vec<SiteAttribute<'a>>,
) -> Result<(), gimli::Error> {
    attrs.clear();
    let mut skipped_from = 0;
    for (i, spec) in specs.iter().enumerate() {
        if is_site_attribute(spec.name()) {
            entries.skip_attributes(&specs[skipped_from..i])?;
            attrs.push(SiteAttribute::of(&entries.read_attribute_inline(*spec)?));
            skipped_from = i + 1;
        }
    }
    entries.skip_attributes(&specs[skipped_from..])
}

/// The value of the first attribute `name` in `attrs`, as gimli's
/// `DebuggingInformationEntry::attr_value` gives it.
fn attr_value<'a>(
    attrs: &[SiteAttribute<'a>],
    name: gimli::DwAt,
) -> Option<AttributeValue<Reader<'a>>> {
    attrs.iter().find(|a| a.name == name).map(|a| a.value)
}

/// The address ranges of an entry with attributes `attrs`, as gimli's
/// `Dwarf::die_ranges` reads them: `DW_AT_ranges` (the first that names a
/// list), else `DW_AT_low_pc` with `DW_AT_high_pc` (an address or a size).
fn site_ranges<'a>(
    dwarf: &gimli::Dwarf<Reader<'a>>,
    unit: &gimli::Unit<Reader<'a>>,
    attrs: &[SiteAttribute<'a>],
) -> Result<SiteRanges<'a>, gimli::Error> {
    let (mut low_pc, mut high_pc, mut size) = (None, None, None);
    for attr in attrs {
        match attr.name {
            gimli::DW_AT_low_pc => {
                low_pc = Some(
                    dwarf
                        .attr_address(unit, attr.value)?
                        .ok_or(gimli::Error::UnsupportedAttributeForm(attr.form))?,
                );
            }
            gimli::DW_AT_high_pc => match attr.value {
                AttributeValue::Udata(val) => size = Some(val),
                value => {
                    high_pc = Some(
                        dwarf
                            .attr_address(unit, value)?
                            .ok_or(gimli::Error::UnsupportedAttributeForm(attr.form))?,
                    );
                }
            },
            gimli::DW_AT_ranges => {
                if let Some(list) = range_list(dwarf, unit, attr.value)? {
                    return Ok(list);
                }
            }
            _ => {}
        }
    }
    Ok(SiteRanges::single(low_pc, size, high_pc))
}

/// The range list a `DW_AT_ranges` value names, where it names one.
fn range_list<'a>(
    dwarf: &gimli::Dwarf<Reader<'a>>,
    unit: &gimli::Unit<Reader<'a>>,
    value: AttributeValue<Reader<'a>>,
) -> Result<Option<SiteRanges<'a>>, gimli::Error> {
    match dwarf.attr_ranges_offset(unit, value)? {
        Some(offset) => Ok(Some(SiteRanges::List(RangeList::of_unit(
            dwarf, unit, offset,
        )?))),
        None => Ok(None),
    }
}

/// The ranges of an inlined subroutine: one, or a range list.
enum SiteRanges<'a> {
    Single(Option<gimli::Range>),
    List(RangeList<'a>),
}

impl SiteRanges<'_> {
    /// The range from `low_pc` to `low_pc + size`, else to `high_pc`;
    /// none without `low_pc` or an end.
    fn single(low_pc: Option<u64>, size: Option<u64>, high_pc: Option<u64>) -> Self {
        let range = low_pc.and_then(|begin| {
            let end = size.map(|size| begin.wrapping_add(size)).or(high_pc);
            end.map(|end| gimli::Range { begin, end })
        });
        SiteRanges::Single(range)
    }

    fn next(&mut self) -> Result<Option<gimli::Range>, gimli::Error> {
        match self {
            SiteRanges::Single(range) => Ok(range.take()),
            SiteRanges::List(list) => list.next(),
        }
    }
}

/// A range list of `.debug_ranges` (DWARF 2 to 4) or `.debug_rnglists`
/// (DWARF 5), giving the ranges and errors gimli's `RngListIter` gives, in
/// its order: gimli's iterator, made through `Dwarf::attr_ranges` for each
/// of a large binary's hundreds of thousands of inlined subroutines with
/// ranges, parses each entry into a general form before adding the base.
struct RangeList<'a> {
    /// The entries from the next on (empty after the last).
    input: Reader<'a>,
    /// `.debug_rnglists`' `DW_RLE_*` entries, else address pairs.
    rle: bool,
    address_size: u8,
    /// The largest address (every bit of `address_size` set): sums wrap
    /// at it, and a DWARF 4 pair beginning with it sets the base.
    ones: u64,
    /// What address pairs and `DW_RLE_offset_pair`s are offsets from.
    base: u64,
    /// `.debug_addr` and the unit's table in it, for the `DW_RLE_*x`
    /// entries.
    addresses: (gimli::DebugAddr<Reader<'a>>, gimli::DebugAddrBase<usize>),
}

/// An entry of a [`RangeList`].
enum RangeEntry {
    /// The list's end.
    End,
    /// A new base address.
    Base(u64),
    /// Offsets from the base address.
    Offsets(u64, u64),
    /// Addresses.
    Addresses(u64, u64),
}

impl<'a> RangeList<'a> {
    /// The list at `offset` of `unit`'s range list section.
    fn of_unit(
        dwarf: &gimli::Dwarf<Reader<'a>>,
        unit: &gimli::Unit<Reader<'a>>,
        offset: gimli::RangeListsOffset<usize>,
    ) -> Result<RangeList<'a>, gimli::Error> {
        let encoding = unit.encoding();
        let section = if encoding.version > 4 {
            *gimli::Section::reader(dwarf.ranges.debug_rnglists())
        } else {
            *gimli::Section::reader(dwarf.ranges.debug_ranges())
        };
        let addresses = (dwarf.debug_addr, unit.addr_base);
        RangeList::new(section, offset, encoding, unit.low_pc, addresses)
    }

    /// The list at `offset` of `section` (`.debug_rnglists` for DWARF 5,
    /// else `.debug_ranges`), of a unit of `encoding` whose base address
    /// is `base`, as gimli's `RangeLists::ranges` reads it.
    fn new(
        section: Reader<'a>,
        offset: gimli::RangeListsOffset<usize>,
        encoding: gimli::Encoding,
        base: u64,
        addresses: (gimli::DebugAddr<Reader<'a>>, gimli::DebugAddrBase<usize>),
    ) -> Result<RangeList<'a>, gimli::Error> {
        use gimli::Reader as _;
        let mut input = section;
        input.skip(offset.0)?;
        Ok(RangeList {
            input,
            rle: encoding.version > 4,
            address_size: encoding.address_size,
            ones: !0u64 >> (64 - u32::from(encoding.address_size) * 8),
            base,
            addresses,
        })
    }

    /// The next range, skipping empty and reversed ones and those at
    /// tombstone addresses (as gimli does).
    fn next(&mut self) -> Result<Option<gimli::Range>, gimli::Error> {
        use gimli::Reader as _;
        let tombstone = self.ones - 1;
        while !self.input.is_empty() {
            let entry = if self.rle {
                self.rle_entry()
            } else {
                self.pair_entry()
            };
            let (begin, end) = match entry {
                Ok(RangeEntry::Addresses(begin, end)) => (begin, end),
                Ok(RangeEntry::Offsets(begin, end)) => {
                    if self.base >= tombstone {
                        continue;
                    }
                    let at = |offset: u64| self.base.wrapping_add(offset) & self.ones;
                    (at(begin), at(end))
                }
                Ok(RangeEntry::Base(base)) => {
                    self.base = base;
                    continue;
                }
                Ok(RangeEntry::End) => {
                    self.input.empty();
                    break;
                }
                Err(e) => {
                    self.input.empty();
                    return Err(e);
                }
            };
            if begin < tombstone && begin < end {
                return Ok(Some(gimli::Range { begin, end }));
            }
        }
        Ok(None)
    }

    /// Reads a DWARF 2 to 4 entry: two addresses (of 8 bytes, both taken
    /// from the slice at once: gimli's reader checked and split it for
    /// each of the own binary's two million addresses).
    fn pair_entry(&mut self) -> Result<RangeEntry, gimli::Error> {
        let (begin, end) = match self.input.slice().split_first_chunk::<16>() {
            Some((pair, rest)) if self.address_size == 8 => {
                let (begin, end) = pair.split_at(8);
                self.input = EndianSlice::new(rest, LittleEndian);
                (
                    u64::from_le_bytes(begin.try_into().expect("eight bytes")),
                    u64::from_le_bytes(end.try_into().expect("eight bytes")),
                )
            }
            _ => (self.address()?, self.address()?),
        };
        Ok(match (begin, end) {
            (0, 0) => RangeEntry::End,
            (begin, end) if begin == self.ones => RangeEntry::Base(end),
            (begin, end) => RangeEntry::Offsets(begin, end),
        })
    }

    /// Reads a `DW_RLE_*` entry.
    fn rle_entry(&mut self) -> Result<RangeEntry, gimli::Error> {
        use gimli::Reader as _;
        let kind = gimli::DwRle(self.input.read_u8()?);
        Ok(match kind {
            gimli::DW_RLE_end_of_list => RangeEntry::End,
            gimli::DW_RLE_base_addressx => RangeEntry::Base(self.indexed_address()?),
            gimli::DW_RLE_startx_endx => {
                let begin = self.indexed_address()?;
                RangeEntry::Addresses(begin, self.indexed_address()?)
            }
            gimli::DW_RLE_startx_length => {
                let begin = self.indexed_address()?;
                RangeEntry::Addresses(begin, self.after(begin)?)
            }
            gimli::DW_RLE_offset_pair => {
                let begin = read_uleb128(&mut self.input)?;
                RangeEntry::Offsets(begin, read_uleb128(&mut self.input)?)
            }
            gimli::DW_RLE_base_address => RangeEntry::Base(self.address()?),
            gimli::DW_RLE_start_end => {
                let begin = self.address()?;
                RangeEntry::Addresses(begin, self.address()?)
            }
            gimli::DW_RLE_start_length => {
                let begin = self.address()?;
                RangeEntry::Addresses(begin, self.after(begin)?)
            }
            _ => return Err(gimli::Error::UnknownRangeListsEntry(kind)),
        })
    }

    /// Reads an address.
    fn address(&mut self) -> Result<u64, gimli::Error> {
        read_sized_address(&mut self.input, self.address_size)
    }

    /// Reads an index into `.debug_addr` and gives its address.
    fn indexed_address(&mut self) -> Result<u64, gimli::Error> {
        let index = usize::from_u64(read_uleb128(&mut self.input)?)?;
        let (debug_addr, base) = self.addresses;
        debug_addr.get_address(self.address_size, base, gimli::DebugAddrIndex(index))
    }

    /// Reads a length and gives the end of the range of it from `begin`.
    fn after(&mut self, begin: u64) -> Result<u64, gimli::Error> {
        let length = read_uleb128(&mut self.input)?;
        Ok(begin.wrapping_add(length) & self.ones)
    }
}

/// Sorted addresses, indexed for asking whether a range holds one: for
/// each bucket of `1 << shift` bytes from the first address, the index
/// of the first address at or after the bucket's start. An answer is a
/// look-up and a search of one bucket's few addresses (a search galloping
/// from the last range's answer was a quarter of adding a unit's inlined
/// ranges); one index serves every unit.
struct WantedIndex<'w> {
    /// The addresses, sorted.
    addresses: &'w [u64],
    /// The first address: bucket 0 begins there.
    base: u64,
    shift: u32,
    /// Bucket -> index of its first address, and one past the buckets
    /// (each bucket's addresses end where the next's begin). An index of
    /// 32 bits: the addresses are the loads' of one executable.
    firsts: Vec<u32>,
}

impl<'w> WantedIndex<'w> {
    /// Indexes `addresses` (sorted) in buckets of about one address each
    /// on average: a few million addresses over a code section of tens
    /// of megabytes take an index of a few megabytes.
    fn new(addresses: &'w [u64]) -> WantedIndex<'w> {
        let (Some(&base), Some(&last)) = (addresses.first(), addresses.last()) else {
            return WantedIndex {
                addresses,
                base: 0,
                shift: 0,
                firsts: vec![0],
            };
        };
        let per_address = ((last - base) / addresses.len() as u64).max(1);
        let shift = per_address.ilog2();
        let buckets = ((last - base) >> shift) as usize + 1;
        let index_of = |at: usize| u32::try_from(at).expect("fewer than 2^32 addresses");
        // Each address is the first of the buckets from the one after the
        // address before it to its own (a walk over the buckets comparing
        // each's start cost several times more).
        let mut firsts = Vec::with_capacity(buckets + 1);
        for (at, &address) in addresses.iter().enumerate() {
            let (bucket, first) = (((address - base) >> shift) as usize, index_of(at));
            while firsts.len() <= bucket {
                firsts.push(first);
            }
        }
        firsts.resize(buckets + 1, index_of(addresses.len()));
        WantedIndex {
            addresses,
            base,
            shift,
            firsts,
        }
    }

    /// The index of the first address at or after `at`.
    #[inline]
    fn first_at_or_after(&self, at: u64) -> usize {
        let Some(offset) = at.checked_sub(self.base) else {
            return 0;
        };
        let bucket = usize::try_from(offset >> self.shift).unwrap_or(usize::MAX);
        match (
            self.firsts.get(bucket),
            self.firsts.get(bucket.wrapping_add(1)),
        ) {
            (Some(&from), Some(&to)) => {
                let (from, to) = (from as usize, to as usize);
                from + self.addresses[from..to].partition_point(|&a| a < at)
            }
            _ => self.addresses.len(),
        }
    }

    /// Whether an address lies in `[begin, end)`.
    #[inline]
    fn holds_any(&self, begin: u64, end: u64) -> bool {
        let at = self.first_at_or_after(begin);
        self.addresses.get(at).is_some_and(|&a| a < end)
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
    let Some(entry) = header.file(index) else {
        return "<unknown>".to_string();
    };
    // The parts are borrowed from the sections: the path is the one
    // allocation (a file name is made for every unit that names it).
    let comp_dir = comp_dir.unwrap_or_default();
    let dir = entry
        .directory(header)
        .map(|dir| attr_text(dwarf, unit, dir));
    let name = attr_text(dwarf, unit, entry.path_name());
    let dir = dir.as_deref().unwrap_or_default();
    let mut path = String::with_capacity(comp_dir.len() + dir.len() + name.len() + 2);
    path.push_str(comp_dir);
    push_path(&mut path, dir);
    push_path(&mut path, &name);
    path
}

/// The string `value` names (empty where it names none), borrowed from
/// the section unless it is not UTF-8.
fn attr_text<'a>(
    dwarf: &gimli::Dwarf<Reader<'a>>,
    unit: &gimli::Unit<Reader<'a>>,
    value: AttributeValue<Reader<'a>>,
) -> Cow<'a, str> {
    dwarf
        .attr_string(unit, value)
        .map_or(Cow::Borrowed(""), |s| String::from_utf8_lossy(s.slice()))
}

/// Appends a path component; an absolute component replaces what is there.
fn push_path(path: &mut String, part: &str) {
    if part.is_empty() {
        return;
    }
    if part.starts_with('/') || path.is_empty() {
        path.clear();
        path.push_str(part);
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

    /// DWARF 4, 32-bit offsets, 8-byte addresses: the encoding of the
    /// hand-made entries.
    const DWARF4_32: gimli::Encoding = gimli::Encoding {
        format: gimli::Format::Dwarf32,
        version: 4,
        address_size: 8,
    };

    /// The abbreviations of the hand-made `.debug_abbrev` bytes `abbrevs`
    /// (one table, at offset 0).
    fn abbreviations_of(abbrevs: &[u8]) -> gimli::Abbreviations {
        gimli::DebugAbbrev::new(abbrevs, LittleEndian)
            .abbreviations(gimli::DebugAbbrevOffset(0))
            .unwrap()
    }

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

    proptest! {
        /// Sorting a unit's ranges group by group gives what a stable sort
        /// of all of them gives, whether the groups cover code of their
        /// own, touch or interleave (ranges are told apart by `line`).
        #[test]
        fn ranges_sorted_in_groups_are_the_stable_sort_of_all(
            groups in proptest::collection::vec(
                (0u64..40, proptest::collection::vec(0u64..6, 0..7)),
                0..8,
            ),
        ) {
            let (mut inlines, mut starts, mut line) = (Vec::new(), Vec::new(), 0);
            for (offset, begins) in &groups {
                starts.push(inlines.len());
                for &begin in begins {
                    line += 1;
                    let begin = offset + begin;
                    inlines.push(Inline { begin, end: begin + 1, depth: 0, file: 0, line });
                }
            }
            let mut expected = inlines.clone();
            expected.sort_by_key(|r| r.begin);
            let sorted = sort_in_groups(inlines, &starts);
            let key = |r: &Inline| (r.begin, r.line);
            prop_assert_eq!(
                sorted.iter().map(key).collect::<Vec<_>>(),
                expected.iter().map(key).collect::<Vec<_>>()
            );
        }

        /// A range list read here gives the ranges, and the error, gimli's
        /// `RngListIter` gives: DWARF 4 address pairs and DWARF 5
        /// `DW_RLE_*` entries of every kind (and unknown ones), at 8- and
        /// 4-byte addresses, around tombstones and base selections, cut
        /// short anywhere and read from any offset.
        #[test]
        fn range_lists_read_here_give_what_gimli_gives(
            version in 4u16..6,
            address_size in prop_oneof![Just(8u8), Just(4u8)],
            entries in proptest::collection::vec((0u8..10, 0usize..8, 0usize..8), 0..12),
            base in 0usize..8,
            (offset, cut) in (0usize..40, 0usize..400),
        ) {
            let ones = !0u64 >> (64 - u32::from(address_size) * 8);
            // Values near the interesting ones: zero, small offsets, real
            // addresses, tombstones and the base selection marker.
            let values = [0, 1, 0x10, 0x40, 0x1000, 0x4010, ones - 1, ones];
            let addresses: Vec<u64> = vec![0x1000, 0x2000, 0x30, ones - 1, ones, 0, 0x4000, 0x5000];
            let mut debug_addr = Vec::new();
            for a in &addresses {
                debug_addr.extend_from_slice(&a.to_le_bytes()[..usize::from(address_size)]);
            }
            let mut bytes = Vec::new();
            let address = |out: &mut Vec<u8>, a: u64| {
                out.extend_from_slice(&a.to_le_bytes()[..usize::from(address_size)]);
            };
            let uleb = |out: &mut Vec<u8>, mut v: u64| loop {
                let byte = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    out.push(byte);
                    break;
                }
                out.push(byte | 0x80);
            };
            for &(kind, a, b) in &entries {
                let (a, b) = (values[a], values[b]);
                if version == 4 {
                    let (begin, end) = match kind {
                        0 => (0, 0),
                        1 => (ones, b),
                        _ => (a, b),
                    };
                    address(&mut bytes, begin);
                    address(&mut bytes, end);
                    continue;
                }
                bytes.push(kind);
                let index = |v: u64| v % addresses.len() as u64;
                match gimli::DwRle(kind) {
                    gimli::DW_RLE_base_addressx => uleb(&mut bytes, index(a)),
                    gimli::DW_RLE_startx_endx => {
                        uleb(&mut bytes, index(a));
                        uleb(&mut bytes, index(b) + u64::from(b == ones) * 100);
                    }
                    gimli::DW_RLE_startx_length | gimli::DW_RLE_offset_pair => {
                        uleb(&mut bytes, if kind == 3 { index(a) } else { a });
                        uleb(&mut bytes, b);
                    }
                    gimli::DW_RLE_base_address => address(&mut bytes, a),
                    gimli::DW_RLE_start_end => {
                        address(&mut bytes, a);
                        address(&mut bytes, b);
                    }
                    gimli::DW_RLE_start_length => {
                        address(&mut bytes, a);
                        uleb(&mut bytes, b);
                    }
                    _ => {}
                }
            }
            bytes.truncate(cut);
            let encoding = gimli::Encoding { version, address_size, ..DWARF4_32 };
            let section = EndianSlice::new(&bytes, LittleEndian);
            let addr = gimli::DebugAddr::from(EndianSlice::new(&debug_addr, LittleEndian));
            let (addr_base, base) = (gimli::DebugAddrBase(0), values[base]);
            let offset = gimli::RangeListsOffset(offset.min(bytes.len() + 2));
            let lists = gimli::RangeLists::new(
                gimli::DebugRanges::from(section),
                gimli::DebugRngLists::from(section),
            );
            let read = |mut next: Box<dyn FnMut() -> Result<Option<gimli::Range>, gimli::Error> + '_>| {
                let mut got = Vec::new();
                loop {
                    match next() {
                        Ok(Some(r)) => got.push(Ok(r)),
                        Ok(None) => break,
                        Err(e) => {
                            got.push(Err(e));
                            break;
                        }
                    }
                }
                got
            };
            let theirs = match lists.ranges(offset, encoding, base, &addr, addr_base) {
                Ok(mut list) => read(Box::new(move || list.next())),
                Err(e) => vec![Err(e)],
            };
            let ours = match RangeList::new(section, offset, encoding, base, (addr, addr_base)) {
                Ok(mut list) => read(Box::new(move || list.next())),
                Err(e) => vec![Err(e)],
            };
            prop_assert_eq!(ours, theirs);
        }
    }

    #[test]
    fn a_text_is_the_displayed_position_at_its_exact_size() {
        let mut lines = vec![0, u32::MAX, u32::MAX - 1];
        for digits in 0..10 {
            let power = 10u32.pow(digits);
            lines.extend([power - 1, power, power + 1, power.saturating_mul(7)]);
        }
        for file in [
            "",
            "src/lib.rs",
            "/rustc/\u{e9}t\u{e9}/library/core/src/slice/mod.rs",
        ] {
            for &line in &lines {
                let at = SourceLocation { file, line };
                let text = at.to_text();
                assert_eq!(text, at.to_string());
                assert_eq!(text.capacity(), text.len(), "{text}");
            }
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

    /// An inlined range of file 1 (the tests' user file).
    fn inline(begin: u64, end: u64, depth: u32, line: u32) -> Inline {
        Inline {
            begin,
            end,
            depth,
            file: 1,
            line,
        }
    }

    #[test]
    fn a_chain_lists_the_row_then_the_call_sites_of_the_inlined_ranges_innermost_first() {
        let row = |address, line| Row {
            address,
            file: 0,
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
    fn a_cursor_gives_the_chains_of_ranges_out_of_depth_order_and_twice_listed() {
        // 0x10..0x40: the deeper of two ranges beginning together read
        // first, a range of unknown line and one of the first's site again
        // inside them; 0x50..0x60: one range listed twice, with a range of
        // unknown line inside.
        let inlines = vec![
            inline(0x10, 0x40, 3, 5),
            inline(0x10, 0x40, 2, 7),
            inline(0x18, 0x30, 4, 0),
            inline(0x20, 0x30, 3, 5),
            inline(0x50, 0x60, 2, 9),
            inline(0x50, 0x60, 2, 9),
            inline(0x52, 0x58, 3, 0),
        ];
        let table = LineTable {
            rows: vec![
                Row {
                    address: 0x10,
                    file: 0,
                    line: 100,
                },
                Row {
                    address: 0x70,
                    file: 0,
                    line: 0,
                },
            ],
            files: vec!["map.rs".into(), "user.rs".into()],
            inline_reach: vec![0x40, 0x40, 0x40, 0x40, 0x60, 0x60, 0x60],
            inlines,
            problem: None,
        };
        let text = |chain: Vec<SourceLocation<'_>>| -> Vec<String> {
            chain.iter().map(ToString::to_string).collect()
        };
        let mut cursor = ChainCursor::new(&table);
        for (address, chain) in [
            (0x12, &["map.rs:100", "user.rs:5", "user.rs:7"][..]),
            (0x1c, &["map.rs:100", "user.rs:5", "user.rs:7"]),
            (0x24, &["map.rs:100", "user.rs:5", "user.rs:7"]),
            (0x54, &["map.rs:100", "user.rs:9"]),
            (0x59, &["map.rs:100", "user.rs:9"]),
        ] {
            assert_eq!(text(table.locate_chain(address)), chain, "{address:#x}");
            assert_eq!(text(cursor.locate_chain(address)), chain, "{address:#x}");
        }
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
        let section = |name: &str| uncompressed_section(&binary, name);
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
        // Read as gimli's entry cursor and `die_ranges` read it.
        let binary = dwarf_test_binary();
        let dwarf = gimli_dwarf(&binary);
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

    /// `binary`'s section `name` as stored (empty when missing or
    /// compressed: the tests' binaries keep their DWARF uncompressed).
    fn uncompressed_section<'b>(binary: &'b crate::binary::Binary, name: &str) -> &'b [u8] {
        binary
            .section(name)
            .filter(|s| !s.is_compressed())
            .and_then(|s| binary.section_data(s))
            .unwrap_or(&[])
    }

    /// The encodings the readers are tested in: DWARF 4 and 5, 32- and
    /// 64-bit, 8-byte addresses.
    fn test_encodings() -> [gimli::Encoding; 3] {
        [
            (4, gimli::Format::Dwarf32),
            (5, gimli::Format::Dwarf32),
            (5, gimli::Format::Dwarf64),
        ]
        .map(|(version, format)| gimli::Encoding {
            format,
            version,
            address_size: 8,
        })
    }

    /// gimli's view of `binary`'s uncompressed DWARF sections (a
    /// compressed or missing one reads as empty).
    fn gimli_dwarf(binary: &crate::binary::Binary) -> gimli::Dwarf<EndianSlice<'_, LittleEndian>> {
        gimli::Dwarf::load(|id: SectionId| {
            Ok::<_, gimli::Error>(EndianSlice::new(
                uncompressed_section(binary, id.name()),
                LittleEndian,
            ))
        })
        .unwrap()
    }

    /// This test executable (the dev profile keeps its DWARF), or the
    /// file `MEMGAZE_TEST_DWARF` names (another producer's, a larger one).
    fn dwarf_test_binary() -> crate::binary::Binary {
        let path = std::env::var_os("MEMGAZE_TEST_DWARF").map_or_else(
            || std::env::current_exe().unwrap(),
            std::path::PathBuf::from,
        );
        crate::binary::Binary::open(path).unwrap()
    }

    #[test]
    fn the_line_programs_give_the_rows_gimli_gives() {
        let binary = dwarf_test_binary();
        let dwarf = gimli_dwarf(&binary);
        let every = |_: u64| true;
        let rows_of = |sink: RowSink<'_, _>| -> Vec<(u64, u64, u32)> {
            let file = |r: &Row| match r.file {
                NO_FILE => u64::MAX,
                slot => sink.slots.indices[slot as usize],
            };
            let rows = sink.sequences.iter().flatten();
            rows.map(|r| (r.address, file(r), r.line)).collect()
        };
        let (mut units, mut rows) = (dwarf.units(), 0);
        while let Some(header) = units.next().unwrap() {
            let unit = dwarf.unit(header).unwrap();
            let Some(program) = unit.line_program.clone() else {
                continue;
            };
            let mut ours = RowSink::new(&every, None);
            assert!(run_line_program(program.header(), &mut ours).is_some());
            let mut theirs = RowSink::new(&every, None);
            let mut gimli_rows = program.rows();
            while let Some((_, row)) = gimli_rows.next_row().unwrap() {
                let line = row.line().map_or(0, |l| l.get());
                theirs.row(row.address(), row.file_index(), line, row.end_sequence());
            }
            let (ours, theirs) = (rows_of(ours), rows_of(theirs));
            rows += theirs.len();
            assert_eq!(ours, theirs);
        }
        assert!(rows > 0, "the binary has line rows");
    }

    #[test]
    fn an_entry_plan_steps_over_every_form_as_gimli_skips_it() {
        fn uleb(out: &mut Vec<u8>, mut value: u64) {
            loop {
                let byte = (value & 0x7f) as u8;
                value >>= 7;
                if value == 0 {
                    out.push(byte);
                    return;
                }
                out.push(byte | 0x80);
            }
        }
        // Each form and the bytes of a value of it (DWARF 4, 32-bit, 8-byte
        // addresses).
        let block = |len: usize, prefix: &[u8]| [prefix, &vec![0x5a; len]].concat();
        let forms: Vec<(gimli::DwForm, Vec<u8>)> = vec![
            (gimli::DW_FORM_addr, vec![1; 8]),
            (gimli::DW_FORM_data1, vec![1]),
            (gimli::DW_FORM_data2, vec![1; 2]),
            (gimli::DW_FORM_data4, vec![1; 4]),
            (gimli::DW_FORM_data8, vec![1; 8]),
            (gimli::DW_FORM_data16, vec![1; 16]),
            (gimli::DW_FORM_string, b"abc\0".to_vec()),
            (gimli::DW_FORM_block1, block(3, &[3])),
            (gimli::DW_FORM_block2, block(2, &[2, 0])),
            (gimli::DW_FORM_block4, block(1, &[1, 0, 0, 0])),
            (gimli::DW_FORM_block, block(130, &[0x82, 0x01])),
            (gimli::DW_FORM_exprloc, block(2, &[2])),
            (gimli::DW_FORM_flag, vec![1]),
            (gimli::DW_FORM_flag_present, vec![]),
            (gimli::DW_FORM_implicit_const, vec![]),
            (gimli::DW_FORM_sdata, vec![0x7f]),
            (gimli::DW_FORM_udata, vec![0xe5, 0x8e, 0x26]),
            (gimli::DW_FORM_strp, vec![1; 4]),
            (gimli::DW_FORM_line_strp, vec![1; 4]),
            (gimli::DW_FORM_sec_offset, vec![1; 4]),
            (gimli::DW_FORM_ref_addr, vec![1; 4]),
            (gimli::DW_FORM_ref1, vec![1]),
            (gimli::DW_FORM_ref2, vec![1; 2]),
            (gimli::DW_FORM_ref4, vec![1; 4]),
            (gimli::DW_FORM_ref8, vec![1; 8]),
            (gimli::DW_FORM_ref_udata, vec![0x81, 0x01]),
            (gimli::DW_FORM_ref_sig8, vec![1; 8]),
            (gimli::DW_FORM_strx, vec![5]),
            (gimli::DW_FORM_strx1, vec![1]),
            (gimli::DW_FORM_strx2, vec![1; 2]),
            (gimli::DW_FORM_strx3, vec![1; 3]),
            (gimli::DW_FORM_strx4, vec![1; 4]),
            (gimli::DW_FORM_addrx, vec![0x80, 0x01]),
            (gimli::DW_FORM_addrx1, vec![1]),
            (gimli::DW_FORM_addrx4, vec![1; 4]),
            (gimli::DW_FORM_loclistx, vec![3]),
            (gimli::DW_FORM_rnglistx, vec![3]),
        ];
        // Abbreviation 1: a variable with one attribute of each form; 2:
        // one with an indirect form; 3: an inlined subroutine, its name
        // skipped and its call site and range read.
        let mut abbrevs = Vec::new();
        uleb(&mut abbrevs, 1);
        uleb(&mut abbrevs, gimli::DW_TAG_variable.0.into());
        abbrevs.push(0);
        for (i, (form, _)) in forms.iter().enumerate() {
            uleb(&mut abbrevs, 0x2000 + i as u64);
            uleb(&mut abbrevs, form.0.into());
            if *form == gimli::DW_FORM_implicit_const {
                abbrevs.push(0x7f);
            }
        }
        abbrevs.extend([0, 0]);
        let site = [
            (gimli::DW_AT_name, gimli::DW_FORM_data1),
            (gimli::DW_AT_call_file, gimli::DW_FORM_data1),
            (gimli::DW_AT_call_line, gimli::DW_FORM_udata),
            (gimli::DW_AT_low_pc, gimli::DW_FORM_addr),
            (gimli::DW_AT_high_pc, gimli::DW_FORM_data4),
        ];
        for (code, tag, attributes) in [
            (
                2,
                gimli::DW_TAG_variable,
                &[(gimli::DW_AT_name, gimli::DW_FORM_indirect)][..],
            ),
            (3, gimli::DW_TAG_inlined_subroutine, &site[..]),
        ] {
            uleb(&mut abbrevs, code);
            uleb(&mut abbrevs, tag.0.into());
            abbrevs.push(1);
            for (name, form) in attributes {
                uleb(&mut abbrevs, name.0.into());
                uleb(&mut abbrevs, form.0.into());
            }
            abbrevs.extend([0, 0]);
        }
        abbrevs.push(0);
        let abbreviations = abbreviations_of(&abbrevs);
        let encoding = DWARF4_32;
        let mut entry: Vec<u8> = forms.iter().flat_map(|(_, bytes)| bytes.clone()).collect();
        let size = entry.len();
        entry.push(0xaa);
        let mut plans = EntryPlans::default();
        let plan = plans.plan(1, &abbreviations, encoding).unwrap();
        assert!(!plan.whole && !plan.inlined && !plan.has_children);
        let (mut input, mut attrs) = (EndianSlice::new(&entry, LittleEndian), Vec::new());
        let walk = (encoding, &abbreviations);
        plans.walk(plan, &mut input, walk, &mut attrs).unwrap();
        assert_eq!(
            entry.len() - input.len(),
            size,
            "the plan steps over the entry"
        );
        assert!(attrs.is_empty());
        let mut raw = gimli::EntriesRaw::new(
            EndianSlice::new(&entry, LittleEndian),
            encoding,
            &abbreviations,
            UnitOffset(0),
        );
        let specs = abbreviations.get(1).unwrap().attributes();
        raw.skip_attributes(specs).unwrap();
        assert_eq!(raw.next_offset().0, size, "gimli skips the same bytes");
        // The plan is kept for the code and gives the same steps again; a
        // cut entry is an error, not a step past its end.
        let again = plans.plan(1, &abbreviations, encoding).unwrap();
        assert_eq!(again.steps, plan.steps);
        let mut cut = EndianSlice::new(&entry[..size - 3], LittleEndian);
        assert!(plans.walk(plan, &mut cut, walk, &mut attrs).is_err());
        let indirect = plans.plan(2, &abbreviations, encoding).unwrap();
        assert!(indirect.whole && indirect.has_children, "read by gimli");
        // The inlined subroutine: name 9, call file 2, line 129, code
        // 0x1000..0x1020.
        let site = plans.plan(3, &abbreviations, encoding).unwrap();
        assert!(site.inlined && !site.whole);
        let mut entry = vec![9, 2, 0x81, 0x01];
        entry.extend(0x1000u64.to_le_bytes());
        entry.extend(0x20u32.to_le_bytes());
        entry.push(0xaa);
        let mut input = EndianSlice::new(&entry, LittleEndian);
        plans.walk(site, &mut input, walk, &mut attrs).unwrap();
        assert_eq!(input.len(), 1, "the plan steps over the entry");
        let value = |name| attr_value(&attrs, name).and_then(|v| v.udata_value());
        assert_eq!(attrs.len(), 4, "the name is skipped");
        assert_eq!(
            attr_value(&attrs, gimli::DW_AT_call_file),
            Some(AttributeValue::FileIndex(2))
        );
        assert_eq!(value(gimli::DW_AT_call_line), Some(129));
        assert_eq!(value(gimli::DW_AT_high_pc), Some(0x20));
        assert_eq!(
            attr_value(&attrs, gimli::DW_AT_low_pc),
            Some(AttributeValue::Addr(0x1000))
        );
        assert!(plans.plan(4, &abbreviations, encoding).is_err());
    }

    #[test]
    fn site_attributes_read_by_a_plan_are_what_gimli_reads() {
        // Each site attribute in each form it may come in, alone in an
        // inlined subroutine's abbreviation, read by the plan and by gimli
        // (value, form and bytes), for DWARF 4 and 5, 32- and 64-bit.
        let names = [
            gimli::DW_AT_call_file,
            gimli::DW_AT_call_line,
            gimli::DW_AT_low_pc,
            gimli::DW_AT_high_pc,
            gimli::DW_AT_ranges,
        ];
        let forms = [
            gimli::DW_FORM_data1,
            gimli::DW_FORM_data2,
            gimli::DW_FORM_data4,
            gimli::DW_FORM_data8,
            gimli::DW_FORM_udata,
            gimli::DW_FORM_sdata,
            gimli::DW_FORM_addr,
            gimli::DW_FORM_sec_offset,
            gimli::DW_FORM_addrx,
            gimli::DW_FORM_rnglistx,
        ];
        // Bytes whose values differ by width: 0x81 0x82 ... (a LEB128
        // number of two bytes where one is read).
        let bytes: Vec<u8> = vec![0x81, 0x02, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0xaa];
        let mut read_here = 0;
        for encoding in test_encodings() {
            for name in names {
                for form in forms {
                    let mut abbrevs = vec![1];
                    abbrevs.push(gimli::DW_TAG_inlined_subroutine.0 as u8);
                    abbrevs.push(0);
                    assert!(name.0 < 0x80 && form.0 < 0x80, "one-byte numbers");
                    abbrevs.extend([name.0 as u8, form.0 as u8]);
                    abbrevs.extend([0, 0, 0]);
                    let abbreviations = abbreviations_of(&abbrevs);
                    let mut plans = EntryPlans::default();
                    let plan = plans.plan(1, &abbreviations, encoding).unwrap();
                    assert!(plan.inlined && !plan.whole);
                    read_here += usize::from(matches!(
                        plans.steps[plan.steps.0 as usize],
                        EntryStep::Site(_)
                    ));
                    let mut input = EndianSlice::new(&bytes, LittleEndian);
                    let mut attrs = Vec::new();
                    let walk = (encoding, &abbreviations);
                    plans.walk(plan, &mut input, walk, &mut attrs).unwrap();
                    let mut raw = gimli::EntriesRaw::new(
                        EndianSlice::new(&bytes, LittleEndian),
                        encoding,
                        &abbreviations,
                        UnitOffset(0),
                    );
                    let spec = abbreviations.get(1).unwrap().attributes()[0];
                    let expected = SiteAttribute::of(&raw.read_attribute(spec).unwrap());
                    let case = format!("{name} {form} {encoding:?}");
                    assert_eq!(attrs.len(), 1, "{case}");
                    let got = attrs[0];
                    assert_eq!(
                        (got.name, got.form, got.value),
                        (expected.name, expected.form, expected.value),
                        "{case}"
                    );
                    assert_eq!(bytes.len() - input.len(), raw.next_offset().0, "{case}");
                }
            }
        }
        // call_file, call_line and high_pc in five forms each, high_pc and
        // low_pc as addresses, ranges as offsets: in each encoding.
        assert_eq!(read_here, 3 * (5 * 3 + 2 + 1));
    }

    #[test]
    fn a_large_abbreviation_code_is_planned_once() {
        // Code 70,000 (past the dense codes): a variable with one data1
        // attribute.
        let mut abbrevs = vec![0xf0, 0xa2, 0x04];
        abbrevs.extend([gimli::DW_TAG_variable.0 as u8, 0]);
        abbrevs.extend([
            gimli::DW_AT_name.0 as u8,
            gimli::DW_FORM_data1.0 as u8,
            0,
            0,
            0,
        ]);
        let abbreviations = abbreviations_of(&abbrevs);
        let encoding = DWARF4_32;
        let mut plans = EntryPlans::default();
        let first = plans.plan(70_000, &abbreviations, encoding).unwrap();
        let steps = plans.steps.len();
        assert_eq!(steps, 1);
        for _ in 0..10 {
            let again = plans.plan(70_000, &abbreviations, encoding).unwrap();
            assert_eq!(again.steps, first.steps);
        }
        assert_eq!(plans.steps.len(), steps, "no steps added again");
    }

    #[test]
    fn an_entry_of_fixed_sizes_is_skipped_at_once_as_gimli_skips_it() {
        // Code 1: a variable of fixed forms (name data4, line data1, an
        // address, a flag present); 2: a member without attributes; 3: an
        // inlined subroutine whose call line is read.
        let fixed = [
            (gimli::DW_AT_name, gimli::DW_FORM_data4),
            (gimli::DW_AT_decl_line, gimli::DW_FORM_data1),
            (gimli::DW_AT_location, gimli::DW_FORM_addr),
            (gimli::DW_AT_external, gimli::DW_FORM_flag_present),
        ];
        let site = [
            (gimli::DW_AT_name, gimli::DW_FORM_data4),
            (gimli::DW_AT_call_line, gimli::DW_FORM_data1),
        ];
        let mut abbrevs = Vec::new();
        for (code, tag, attributes) in [
            (1u8, gimli::DW_TAG_variable, &fixed[..]),
            (2, gimli::DW_TAG_member, &[][..]),
            (3, gimli::DW_TAG_inlined_subroutine, &site[..]),
        ] {
            abbrevs.extend([code, tag.0 as u8, 0]);
            for (name, form) in attributes {
                abbrevs.extend([name.0 as u8, form.0 as u8]);
            }
            abbrevs.extend([0, 0]);
        }
        abbrevs.push(0);
        let abbreviations = abbreviations_of(&abbrevs);
        let encoding = DWARF4_32;
        let entry = [7u8; 20];
        let mut plans = EntryPlans::default();
        for (code, size) in [(1, Some(13)), (2, Some(0)), (3, None)] {
            let plan = plans.plan(code, &abbreviations, encoding).unwrap();
            assert_eq!(plan.fixed_size, size, "abbreviation {code}");
            let mut input = EndianSlice::new(&entry, LittleEndian);
            let mut attrs = Vec::new();
            plans
                .walk(plan, &mut input, (encoding, &abbreviations), &mut attrs)
                .unwrap();
            let mut raw = gimli::EntriesRaw::new(
                EndianSlice::new(&entry, LittleEndian),
                encoding,
                &abbreviations,
                UnitOffset(0),
            );
            let specs = abbreviations.get(code).unwrap().attributes();
            raw.skip_attributes(specs).unwrap();
            assert_eq!(
                entry.len() - input.len(),
                raw.next_offset().0,
                "abbreviation {code}"
            );
            assert_eq!(attrs.len(), usize::from(code == 3));
        }
        let plan = plans.plan(1, &abbreviations, encoding).unwrap();
        let mut cut = EndianSlice::new(&entry[..12], LittleEndian);
        let walk = (encoding, &abbreviations);
        assert!(plans.walk(plan, &mut cut, walk, &mut Vec::new()).is_err());
    }

    #[test]
    fn a_fixed_site_reads_the_values_gimli_reads_at_their_offsets() {
        // Inlined subroutines' abbreviations: layouts of fixed sizes
        // (LLVM's first two), and ones a fixed layout cannot read (a site
        // attribute of a LEB128 form or after a block, one twice, a form
        // read by gimli).
        use gimli::{
            DW_AT_abstract_origin as ORIGIN, DW_AT_call_column as COLUMN, DW_AT_call_file as FILE,
            DW_AT_call_line as LINE, DW_AT_high_pc as HIGH, DW_AT_location as LOCATION,
            DW_AT_low_pc as LOW, DW_AT_ranges as RANGES,
        };
        use gimli::{
            DW_FORM_addr as ADDR, DW_FORM_addrx as ADDRX, DW_FORM_data1 as D1, DW_FORM_data2 as D2,
            DW_FORM_data4 as D4, DW_FORM_data8 as D8, DW_FORM_exprloc as EXPRLOC,
            DW_FORM_implicit_const as IMPLICIT, DW_FORM_ref4 as REF4,
            DW_FORM_sec_offset as SEC_OFFSET, DW_FORM_udata as UDATA,
        };
        let layouts: [(&[(gimli::DwAt, gimli::DwForm)], bool); 10] = [
            (
                &[
                    (ORIGIN, REF4),
                    (LOW, ADDR),
                    (HIGH, D4),
                    (FILE, D1),
                    (LINE, D2),
                    (COLUMN, D1),
                ],
                true,
            ),
            (
                &[
                    (ORIGIN, REF4),
                    (RANGES, SEC_OFFSET),
                    (FILE, D1),
                    (LINE, D1),
                    (COLUMN, D1),
                ],
                true,
            ),
            (&[(LOW, ADDR), (HIGH, ADDR), (FILE, D2), (LINE, D4)], true),
            (&[(FILE, D8), (LINE, D8), (HIGH, D8), (LOW, ADDR)], true),
            (&[(ORIGIN, REF4), (LOW, ADDR)], true),
            (
                &[
                    (ORIGIN, REF4),
                    (LOW, ADDR),
                    (HIGH, D4),
                    (FILE, D1),
                    (LINE, UDATA),
                ],
                false,
            ),
            (&[(LOCATION, EXPRLOC), (FILE, D1), (LINE, D1)], false),
            (&[(FILE, D1), (LINE, D1), (LINE, D2)], false),
            (
                &[(FILE, IMPLICIT), (LINE, D1), (LOW, ADDR), (HIGH, D4)],
                false,
            ),
            (&[(LOW, ADDRX), (HIGH, D4), (FILE, D1), (LINE, D1)], false),
        ];
        // Bytes whose values differ by width and place.
        let bytes: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        for encoding in test_encodings() {
            for (layout, fixed) in layouts {
                let mut abbrevs = vec![1, gimli::DW_TAG_inlined_subroutine.0 as u8, 0];
                for (name, form) in layout {
                    assert!(name.0 < 0x80 && form.0 < 0x80, "one-byte numbers");
                    abbrevs.extend([name.0 as u8, form.0 as u8]);
                    if *form == IMPLICIT {
                        abbrevs.push(3);
                    }
                }
                abbrevs.extend([0, 0, 0]);
                let abbreviations = abbreviations_of(&abbrevs);
                let mut plans = EntryPlans::default();
                let plan = plans.plan(1, &abbreviations, encoding).unwrap();
                let case = format!("{layout:?} {encoding:?}");
                assert_eq!(plan.fixed_site.is_some(), fixed, "{case}");
                let Some(site) = plan.fixed_site else {
                    continue;
                };
                let site = plans.fixed_sites[site as usize];
                // gimli reads each attribute in turn; the site's field of
                // that name has its value at the offset gimli read it from.
                let mut raw = gimli::EntriesRaw::new(
                    EndianSlice::new(&bytes, LittleEndian),
                    encoding,
                    &abbreviations,
                    UnitOffset(0),
                );
                for spec in abbreviations.get(1).unwrap().attributes() {
                    let value = match raw.read_attribute(*spec).unwrap().value() {
                        AttributeValue::FileIndex(v)
                        | AttributeValue::Udata(v)
                        | AttributeValue::Addr(v) => v,
                        AttributeValue::RangeListsRef(offset) => offset.0 as u64,
                        _ => continue,
                    };
                    let field = match spec.name() {
                        FILE => site.call_file,
                        LINE => site.call_line,
                        LOW => site.low_pc,
                        HIGH => {
                            assert_eq!(site.high_pc_is_address, spec.form() == ADDR, "{case}");
                            site.high_pc
                        }
                        RANGES => site.ranges,
                        _ => continue,
                    };
                    assert_eq!(field.map(|f| f.value(&bytes)), Some(value), "{case}");
                }
                assert_eq!(site.size, raw.next_offset().0, "{case}");
                let absent = |name| layout.iter().all(|(n, _)| *n != name);
                for (name, field) in [
                    (FILE, site.call_file),
                    (LINE, site.call_line),
                    (LOW, site.low_pc),
                    (HIGH, site.high_pc),
                    (RANGES, site.ranges),
                ] {
                    assert_eq!(field.is_none(), absent(name), "{name} {case}");
                }
            }
        }
    }

    #[test]
    fn the_test_executable_has_inlined_subroutines_of_fixed_layout() {
        // So that the comparison of its inlined ranges with gimli's reads
        // some through a fixed site.
        let binary = dwarf_test_binary();
        let dwarf = gimli_dwarf(&binary);
        let (mut units, mut fixed) = (dwarf.units(), 0);
        while let Some(header) = units.next().unwrap() {
            let unit = dwarf.unit(header).unwrap();
            let mut plans = EntryPlans::default();
            let mut entries = unit.entries_raw(None).unwrap();
            while !entries.is_empty() {
                let Some(abbrev) = entries.read_abbreviation().unwrap() else {
                    continue;
                };
                let plan = plans.plan(abbrev.code(), &unit.abbreviations, unit.encoding());
                fixed += usize::from(plan.unwrap().fixed_site.is_some());
                entries.skip_attributes(abbrev.attributes()).unwrap();
            }
        }
        assert!(fixed > 0, "inlined subroutines read through fixed sites");
    }

    /// Whether a binary search over all of `addresses` finds one in
    /// `[begin, end)`, checking the index's answer and position against it.
    fn check_wanted_index(index: &WantedIndex<'_>, begin: u64, end: u64) {
        let addresses = index.addresses;
        let j = addresses.partition_point(|&a| a < begin);
        assert_eq!(index.first_at_or_after(begin), j, "{begin}");
        let expected = addresses.get(j).is_some_and(|&a| a < end);
        assert_eq!(index.holds_any(begin, end), expected, "{begin}..{end}");
    }

    proptest! {
        /// Addresses spread, bunched or both, and ranges anywhere (before,
        /// inside and past them, at the extremes of `u64`).
        #[test]
        fn the_wanted_index_answers_as_a_binary_search(
            mut addresses in proptest::collection::vec(
                prop_oneof![0u64..64, 0u64..100_000, Just(u64::MAX), Just(u64::MAX - 1)],
                0..200,
            ),
            ranges in proptest::collection::vec(
                (prop_oneof![0u64..64, 0u64..110_000, Just(u64::MAX)], 0u64..300),
                1..60,
            ),
        ) {
            addresses.sort_unstable();
            addresses.dedup();
            let index = WantedIndex::new(&addresses);
            for (begin, length) in ranges {
                check_wanted_index(&index, begin, begin.saturating_add(length));
            }
        }
    }

    #[test]
    fn the_wanted_index_answers_as_a_binary_search_over_many_ranges() {
        let addresses: Vec<u64> = (0..200u64).map(|i| i * 7 + (i % 3)).collect();
        let index = WantedIndex::new(&addresses);
        // Ranges forwards, backwards, far and near, empty and past the end.
        let mut begin = 5u64;
        for i in 0..3000u64 {
            begin = (begin * 31 + i * 17) % 1500;
            check_wanted_index(&index, begin, begin + (i % 11));
        }
        let none = WantedIndex::new(&[]);
        check_wanted_index(&none, 0, u64::MAX);
        check_wanted_index(&none, u64::MAX, u64::MAX);
    }

    #[test]
    fn leb128_numbers_read_here_are_what_gimli_reads() {
        use gimli::Reader as _;
        // Every one-byte and every two-byte number (and two bytes that
        // begin a longer one), numbers of three to ten bytes, numbers cut
        // short and none.
        let mut inputs: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b, 0x55]).collect();
        for low in 0x80..=255u8 {
            inputs.extend((0..=255u8).map(|high| vec![low, high, 0x55]));
            inputs.push(vec![low]);
        }
        inputs.extend([
            vec![0x80, 0x80, 0x01],
            vec![0xff, 0xff, 0x7f],
            vec![0xff, 0xff, 0x40],
            vec![0x80, 0x01],
            vec![0xff, 0x7f],
            vec![0xc0, 0x00],
            vec![0x80, 0x7f],
            vec![0xff; 9].into_iter().chain([0x01]).collect(),
            vec![0xff; 9].into_iter().chain([0x7f]).collect(),
            vec![0x80],
            vec![],
        ]);
        for bytes in &inputs {
            let fresh = || EndianSlice::new(bytes, LittleEndian);
            let (mut ours, mut theirs) = (fresh(), fresh());
            let expected = theirs.read_uleb128().ok();
            assert_eq!(read_uleb128(&mut ours).ok(), expected, "{bytes:x?}");
            assert_eq!(ours.len(), theirs.len(), "{bytes:x?}");
            let (mut ours, mut theirs) = (fresh(), fresh());
            let expected = theirs.read_sleb128().ok();
            assert_eq!(read_sleb128(&mut ours).ok(), expected, "{bytes:x?}");
            assert_eq!(ours.len(), theirs.len(), "{bytes:x?}");
        }
    }

    /// A sequence of a made line program: its first address, its rows'
    /// address advances and lines, and the row after which an address
    /// below the last makes the rest a tombstone (its end too: its rows
    /// and the next sequence's then are one sequence for the sink).
    type MadeSequence = (u64, Vec<(u8, u16)>, Option<usize>);

    /// `.debug_line` bytes of one DWARF 4 line program of `sequences`.
    fn line_program_of(sequences: &[MadeSequence]) -> Vec<u8> {
        use gimli::write;
        let name = |s: &str| write::LineString::String(s.as_bytes().to_vec());
        let line_encoding = gimli::LineEncoding::default();
        let mut program = write::LineProgram::new(
            DWARF4_32,
            line_encoding,
            name("/d"),
            None,
            name("a.rs"),
            None,
        );
        let file = program.add_file(name("a.rs"), program.default_directory(), None);
        for (start, rows, tombstone_after) in sequences {
            program.begin_sequence(Some(write::Address::Constant(*start)));
            let mut offset = 0;
            for (i, &(advance, line)) in rows.iter().enumerate() {
                offset += u64::from(advance);
                let row = program.row();
                (row.address_offset, row.line, row.file) = (offset, u64::from(line), file);
                program.generate_row();
                if *tombstone_after == Some(i) {
                    program.set_address(write::Address::Constant(1));
                }
            }
            program.end_sequence(offset + 1);
        }
        let mut debug_line = write::DebugLine::from(write::EndianVec::new(LittleEndian));
        let (mut line_strings, mut strings) = Default::default();
        program
            .write(&mut debug_line, DWARF4_32, &mut line_strings, &mut strings)
            .unwrap();
        debug_line.slice().to_vec()
    }

    proptest! {
        /// Rows filtered as the program gives them are what filtering each
        /// whole sequence gives, where sequences overlap, go backwards
        /// (rows after a tombstone's) or hold none of the addresses.
        #[test]
        fn rows_filtered_as_they_come_are_those_of_the_whole_sequences(
            sequences in proptest::collection::vec(
                (
                    (1u64..8).prop_map(|block| block * 0x40),
                    proptest::collection::vec((0u8..12, 0u16..300), 0..24),
                    proptest::option::weighted(0.2, 0usize..24),
                ),
                0..8,
            ),
            mut wanted in proptest::collection::vec(0u64..0x300, 0..40),
        ) {
            wanted.sort_unstable();
            wanted.dedup();
            let bytes = line_program_of(&sequences);
            let program = gimli::DebugLine::new(&bytes, LittleEndian)
                .program(gimli::DebugLineOffset(0), 8, None, None)
                .unwrap();
            let every = |_: u64| true;
            let index = WantedIndex::new(&wanted);
            let mut filtered = RowSink::new(&every, Some(&index));
            prop_assert!(run_line_program(program.header(), &mut filtered).is_some());
            let mut whole = RowSink::new(&every, None);
            prop_assert!(run_line_program(program.header(), &mut whole).is_some());
            let expected: Vec<Vec<Row>> = whole
                .sequences
                .iter()
                .map(|sequence| rows_serving(sequence, &wanted))
                .collect();
            prop_assert_eq!(format!("{:?}", filtered.sequences), format!("{expected:?}"));
            prop_assert_eq!(filtered.slots.indices, whole.slots.indices);
        }
    }

    #[test]
    fn a_tombstone_followed_by_lower_rows_keeps_the_sequence_whole() {
        // The first sequence's end is a tombstone's: the second's rows
        // follow its rows in one sequence, going backwards.
        let sequences = [
            (0x100, vec![(0, 1), (4, 2), (4, 3)], Some(2)),
            (0x40, vec![(0, 7), (8, 8), (8, 9)], None),
        ];
        let bytes = line_program_of(&sequences);
        let program = gimli::DebugLine::new(&bytes, LittleEndian)
            .program(gimli::DebugLineOffset(0), 8, None, None)
            .unwrap();
        let every = |_: u64| true;
        let wanted = [0x41];
        let index = WantedIndex::new(&wanted);
        let mut sink = RowSink::new(&every, Some(&index));
        assert!(run_line_program(program.header(), &mut sink).is_some());
        let lines: Vec<Vec<u32>> = sink
            .sequences
            .iter()
            .map(|s| s.iter().map(|r| r.line).collect())
            .collect();
        assert_eq!(lines, [vec![1, 2, 3, 7, 8, 9, 0]]);
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
