//! `file:line` of code addresses from DWARF line tables.
//!
//! The line programs of all compilation units are run once (gimli) into one
//! sorted table of rows; a lookup is a binary search. Line-table rows
//! describe the innermost (inlined) source position, which is what a load
//! should be attributed to. This keeps the table owned and `Sync`, unlike an
//! `addr2line::Context` borrowing the file.

use gimli::{AttributeValue, EndianSlice, LittleEndian, SectionId};
use std::collections::HashMap;

type Reader<'a> = EndianSlice<'a, LittleEndian>;

/// Marks a row that ends a sequence (no source position from there on).
const NO_FILE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Row {
    address: u64,
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
        let i = self.rows.partition_point(|r| r.address <= address);
        let row = self.rows.get(i.checked_sub(1)?)?;
        if row.file == NO_FILE || row.line == 0 {
            return None;
        }
        Some(SourceLocation {
            file: &self.files[row.file as usize],
            line: row.line,
        })
    }

    /// Builds the table. `section` returns the (decompressed) contents of a
    /// DWARF section by name, or an empty slice when absent.
    /// `is_code` tells whether an address lies in executable code: sequences
    /// that start elsewhere (address 0 tombstones of functions the linker
    /// discarded) are dropped.
    pub fn build<'a>(
        section: impl Fn(&str) -> &'a [u8],
        is_code: impl Fn(u64) -> bool,
    ) -> LineTable {
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
        let mut sequences: Vec<Vec<Row>> = Vec::new();
        let mut file_ids: HashMap<String, u32> = HashMap::new();
        let mut units = dwarf.units();
        loop {
            let header = match units.next() {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    table.problem = Some(format!("malformed .debug_info: {e}"));
                    break;
                }
            };
            let Ok(unit) = dwarf.unit(header) else {
                table.problem = Some("malformed compilation unit".into());
                continue;
            };
            let Some(program) = unit.line_program.clone() else {
                continue;
            };
            let comp_dir = unit
                .comp_dir
                .map(|d| String::from_utf8_lossy(d.slice()).into_owned());
            // Unit-local file index -> table file id.
            let mut unit_files: HashMap<u64, u32> = HashMap::new();
            let mut rows = program.rows();
            let mut current: Vec<Row> = Vec::new();
            loop {
                let (header, row) = match rows.next_row() {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(e) => {
                        table.problem = Some(format!("malformed line program: {e}"));
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
                        sequences.push(std::mem::take(&mut current));
                    } else {
                        current.clear();
                    }
                    continue;
                }
                let index = row.file_index();
                let file = match unit_files.get(&index) {
                    Some(&f) => f,
                    None => {
                        let path = header
                            .file(index)
                            .map(|entry| {
                                let mut path = comp_dir.clone().unwrap_or_default();
                                if let Some(dir) = entry.directory(header) {
                                    push_path(&mut path, &attr_text(&dwarf, &unit, dir));
                                }
                                push_path(&mut path, &attr_text(&dwarf, &unit, entry.path_name()));
                                path
                            })
                            .unwrap_or_else(|| "<unknown>".to_string());
                        let next = table.files.len() as u32;
                        let id = *file_ids.entry(path.clone()).or_insert_with(|| {
                            table.files.push(path);
                            next
                        });
                        unit_files.insert(index, id);
                        id
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
        }
        sequences.sort_by_key(|s| s.first().map_or(0, |r| r.address));
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
            problem: None,
        };
        assert_eq!(table.locate(0x0f), None);
        assert_eq!(table.locate(0x10).unwrap().to_string(), "a.c:3");
        assert_eq!(table.locate(0x1f).unwrap().line, 4);
        assert_eq!(table.locate(0x20), None);
    }
}
