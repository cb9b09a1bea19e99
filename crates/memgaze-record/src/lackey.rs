//! Importing Valgrind Lackey `--trace-mem=yes` logs as full traces.
//!
//! Lackey prints one line per executed instruction (`I  ADDR,SIZE`) and per
//! data access (` L`, ` S`, ` M` `ADDR,SIZE`, indented). Loads are the ` L`
//! and ` M` (modify: load + store) lines; each is attributed to the
//! preceding `I` line's instruction. Stores are not traced (load-level
//! analysis, docs/METRICS.md).
//!
//! Valgrind maps a position-independent executable at `0x108000`
//! ([`VALGRIND_PIE_BASE`]); instruction addresses are converted back to
//! addresses of the binary file (a fixed-address executable needs no
//! offset; `--load-base` overrides both). Loads whose instruction lies
//! outside the binary's executable segments — the dynamic loader, libc, the
//! vdso, Valgrind's own trampolines — are counted and reported, not
//! analysed.
//!
//! Each load gets its class from the load classifier ([`memgaze_instrument::classify`]),
//! function by function as they first appear. Instructions the classifier
//! lists no explicit load for read memory implicitly: `pop`/`ret`/`leave`
//! read the stack frame, i.e. scalars on the stack, and count as Constant
//! (paper §III-B); anything else (`outs`, string instructions with 32-bit
//! addresses) counts as Irregular. The string instructions the classifier
//! lists (`movs`, `cmps`, …) are Strided, one site per instruction. The result counts both kinds in its notes.
//! The log is streamed: memory does not grow with its length.

use crate::error::{AccessError, LackeyError};
use memgaze_analysis::{Analysis, AnalysisOptions, Analyzer};
use memgaze_instrument::binary::Binary;
use memgaze_instrument::classify::{Classifier, operands::ImplicitLoad, operands::implicit_load};
use memgaze_trace::{
    Backend, FunctionEntry, LoadClass, LoadEntry, Sampling, TraceHeader, TraceTotals,
};
use std::collections::HashMap;
use std::io::{BufRead, Read};
use std::path::Path;

/// Longest log line read: Lackey's lines are a few dozen bytes; only its
/// `==PID==` preamble (the command line) can be longer.
pub(crate) const MAX_LINE: usize = 1 << 16;

/// Where Valgrind (3.x, amd64) maps a position-independent executable.
pub const VALGRIND_PIE_BASE: u64 = 0x108000;

/// Options of a Lackey import.
#[derive(Clone, Debug, Default)]
pub struct LackeyOptions {
    /// Address the binary was mapped at in the traced run; default
    /// [`VALGRIND_PIE_BASE`] for a PIE, 0 for a fixed-address executable.
    pub load_base: Option<u64>,
    /// The analysis parameters (including the `--functions` filter).
    pub analysis: AnalysisOptions,
}

/// What the import saw, beyond the analysis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LackeyStats {
    /// Instruction (`I`) lines.
    pub(crate) instructions: u64,
    /// Loads (` L` + ` M`) in the whole log.
    pub loads: u64,
    /// Of those, loads whose instruction lies outside the binary.
    pub(crate) outside_binary: u64,
    /// Loads at instructions without an explicit load operand that read the
    /// stack (`pop`, `ret`, …): analysed as Constant.
    pub(crate) implicit_stack: u64,
    /// Other loads the classifier does not list: analysed as Irregular.
    pub(crate) unclassified: u64,
    /// Stores (` S`), ignored.
    pub(crate) stores: u64,
    /// Lines that are not Lackey trace lines (Valgrind's `==pid==` banner
    /// excluded), skipped.
    pub(crate) other_lines: u64,
    /// Distinct load instructions inside the binary.
    pub load_sites: u64,
    /// Of those, instructions whose length in the log differs from the
    /// binary's instruction at that address: the log comes from another
    /// executable (or build, or load base).
    pub mismatched_sites: u64,
}

/// Why a log, accepted, may still not be a run of the binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogDoubt {
    /// It has loads, none of them in the binary's code (another
    /// executable, or another load base).
    NoLoadInBinary,
    /// At some load sites (too few to refuse the log) the logged
    /// instruction length differs from the binary's.
    SomeLengthsDiffer,
}

impl LackeyStats {
    /// Whether, and why, the log may not be a run of the binary.
    pub fn doubt(&self) -> Option<LogDoubt> {
        if self.loads > 0 && self.outside_binary == self.loads {
            Some(LogDoubt::NoLoadInBinary)
        } else if self.mismatched_sites > 0 {
            Some(LogDoubt::SomeLengthsDiffer)
        } else {
            None
        }
    }
}

/// Analyses the Lackey log at `log` of a run of `binary`.
/// `progress(bytes_read)` is called now and then for a progress display.
pub fn analyze_lackey(
    log: &Path,
    binary: &Path,
    options: &LackeyOptions,
    progress: impl FnMut(u64),
) -> Result<(Analysis, LackeyStats), LackeyError> {
    let binary = Binary::open(binary)?;
    let file = std::fs::File::open(log).map_err(|source| LackeyError::Open {
        path: log.to_path_buf(),
        source,
    })?;
    let reader = std::io::BufReader::with_capacity(1 << 20, file);
    import(reader, &binary, options, progress).map_err(|e| LackeyError::InFile {
        path: log.to_path_buf(),
        source: Box::new(e),
    })
}

/// Analyses a Lackey log read from `input` (see [`analyze_lackey`]).
pub fn import(
    mut input: impl BufRead,
    binary: &Binary,
    options: &LackeyOptions,
    mut progress: impl FnMut(u64),
) -> Result<(Analysis, LackeyStats), LackeyError> {
    let base = options.load_base.unwrap_or(if binary.is_pie() {
        VALGRIND_PIE_BASE
    } else {
        0
    });
    let code: Vec<(u64, u64)> = binary
        .segments()
        .iter()
        .filter(|s| s.is_load() && s.is_executable())
        .map(|s| (s.vaddr, s.vaddr + s.mem_size))
        .collect();
    let header = TraceHeader {
        backend: Backend::Lackey,
        sampling: Sampling::full(),
        binary: Some(binary.identity().clone()),
        command: Vec::new(),
        functions: binary
            .functions()
            .iter()
            .map(|f| FunctionEntry {
                name: f.name.clone(),
                start: f.start,
                end: f.end(),
            })
            .collect(),
        loads: Vec::new(),
        labels: Vec::new(),
        spatial: None,
    };
    if let Some(glob) = &options.analysis.functions {
        header.require_function_match(glob)?;
    }
    let mut analyzer = Analyzer::new(&header, &options.analysis)?;
    let mut sites = Sites::new(binary);
    let mut stats = LackeyStats::default();
    let mut command: Option<String> = None;

    let mut line = Vec::with_capacity(256);
    let mut bytes = 0u64;
    let mut next_progress = 0u64;
    // The current instruction: its load site (None until its first load),
    // and whether it lies in the binary.
    let mut current_ip: Option<u64> = None;
    let mut current_len: Option<u64> = None;
    let mut current_site: Option<(u32, Kind)> = None;
    let mut records = 0u64;
    let mut number = 0u64;
    loop {
        line.clear();
        // At most one byte more than a line may hold: a file without
        // newlines (`/dev/zero`) is never read whole into memory.
        let n = (&mut input)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(LackeyError::Read)?;
        if n == 0 {
            break;
        }
        number += 1;
        if line.len() > MAX_LINE {
            return Err(LackeyError::LineTooLong {
                line: number,
                max: MAX_LINE,
            });
        }
        bytes += n as u64;
        if bytes >= next_progress {
            progress(bytes);
            next_progress = bytes + (16 << 20);
        }
        let text = trim_newline(&line);
        // Only the last line of a log can lack its newline.
        let cut = line.last() != Some(&b'\n');
        match text {
            [b'I', b' ', rest @ ..] => {
                stats.instructions += 1;
                let ip = parse_access(rest).map_err(|e| bad_line(number, text, cut, e))?;
                let file_ip = ip.wrapping_sub(base);
                current_ip = code
                    .iter()
                    .any(|&(lo, hi)| lo <= file_ip && file_ip < hi)
                    .then_some(file_ip);
                current_len = current_ip.and_then(|_| parse_size(rest));
                current_site = None;
            }
            [b' ', kind @ (b'L' | b'M'), b' ', rest @ ..] => {
                stats.loads += 1;
                let addr = parse_access(rest).map_err(|e| bad_line(number, text, cut, e))?;
                let _ = kind;
                let Some(ip) = current_ip else {
                    stats.outside_binary += 1;
                    continue;
                };
                let (site, kind) = match current_site {
                    Some(site) => site,
                    None => {
                        let site = sites.site(ip, current_len, &mut analyzer);
                        current_site = Some(site);
                        site
                    }
                };
                match kind {
                    Kind::Explicit => {}
                    Kind::ImplicitStack => stats.implicit_stack += 1,
                    Kind::Unclassified => stats.unclassified += 1,
                }
                analyzer.push_load(site, addr, 0, 0);
                records += 1;
            }
            [b' ', b'S', b' ', ..] => stats.stores += 1,
            [b'=', b'=', ..] => {
                if command.is_none()
                    && let Some(at) = find(text, b"Command: ")
                {
                    command = Some(String::from_utf8_lossy(&text[at + 9..]).into_owned());
                }
            }
            [] => {}
            _ => stats.other_lines += 1,
        }
    }
    progress(bytes);
    if stats.instructions == 0 {
        return Err(LackeyError::NotALackeyLog);
    }
    analyzer.set_outside_binary(stats.outside_binary);
    if stats.implicit_stack > 0 {
        analyzer.note(format!(
            "{} loads by pop/ret/leave (implicit stack reads) analysed as Constant",
            stats.implicit_stack
        ));
    }
    if stats.unclassified > 0 {
        analyzer.note(format!(
            "{} loads at instructions with no classified load operand (outside known functions, string instructions, …) analysed as Irregular",
            stats.unclassified
        ));
    }
    if stats.other_lines > 0 {
        analyzer.note(format!(
            "{} log lines are not Lackey trace lines and were skipped",
            stats.other_lines
        ));
    }
    stats.load_sites = sites.index.len() as u64;
    stats.mismatched_sites = sites.mismatched;
    // A log of this binary matches at every site; another build matches
    // only by chance (a third to a half of the sites on small programs).
    // The margin keeps a rare odd instruction from failing a real log.
    if stats.mismatched_sites * 10 > stats.load_sites {
        return Err(LackeyError::WrongBinary {
            binary: binary.identity().path.clone(),
            mismatched: stats.mismatched_sites,
            sites: stats.load_sites,
        });
    }
    match stats.doubt() {
        Some(LogDoubt::NoLoadInBinary) => analyzer.note(
            "no load of the log lies in the binary's code: was the log recorded from this executable, at this --load-base?",
        ),
        Some(LogDoubt::SomeLengthsDiffer) => analyzer.note(format!(
            "{} of {} load instructions have another length in the log than in the binary: the log may come from another build",
            stats.mismatched_sites, stats.load_sites
        )),
        None => {}
    }
    let totals = TraceTotals::clean(records, records, u64::from(records > 0));
    let mut analysis = analyzer.finish(&totals);
    if let Some(command) = command {
        analysis.run.command = command.split_whitespace().map(str::to_string).collect();
    }
    Ok((analysis, stats))
}

/// Load sites of the binary, classified function by function on first use.
struct Sites<'a> {
    binary: &'a Binary,
    classifier: Classifier,
    /// Per binary function: the classes of its explicit loads, by ip.
    classes: HashMap<usize, HashMap<u64, LoadClass>>,
    /// Load-site index (in the analyzer) and kind, by ip.
    index: HashMap<u64, (u32, Kind)>,
    /// Sites whose instruction length in the log differs from the binary's.
    mismatched: u64,
}

impl<'a> Sites<'a> {
    fn new(binary: &'a Binary) -> Self {
        Sites {
            binary,
            classifier: Classifier::new(),
            classes: HashMap::new(),
            index: HashMap::new(),
            mismatched: 0,
        }
    }

    /// The analyzer's load-site index for the load at `ip`, and its kind.
    /// `len` is the instruction's length as the log gives it, checked
    /// against the binary once per site.
    fn site(&mut self, ip: u64, len: Option<u64>, analyzer: &mut Analyzer) -> (u32, Kind) {
        if let Some(&site) = self.index.get(&ip) {
            return site;
        }
        if len.is_some_and(|len| self.instruction_length(ip) != Some(len)) {
            self.mismatched += 1;
        }
        let function = self.binary.function_index_at(ip);
        let (class, kind) = self.class(ip, function);
        let site = analyzer.add_load(LoadEntry {
            ip,
            class,
            implied: 0,
            function: function.map(|f| f as u32),
            line: self.binary.location(ip).map(|l| l.to_string()),
            proxy: None,
        });
        self.index.insert(ip, (site, kind));
        (site, kind)
    }

    fn class(&mut self, ip: u64, function: Option<usize>) -> (LoadClass, Kind) {
        if let Some(f) = function {
            let binary = self.binary;
            let classifier = &mut self.classifier;
            let classes = self.classes.entry(f).or_insert_with(|| {
                let code = binary.function_code(&binary.functions()[f]);
                classifier
                    .classify(&code)
                    .loads
                    .iter()
                    .map(|l| (l.operand.ip, l.class))
                    .collect()
            });
            if let Some(&class) = classes.get(&ip) {
                return (class, Kind::Explicit);
            }
        }
        if self.reads_stack_implicitly(ip) {
            (LoadClass::Constant, Kind::ImplicitStack)
        } else {
            (LoadClass::Irregular, Kind::Unclassified)
        }
    }

    /// The binary's instruction at `ip`, if one decodes there.
    fn instruction_at(&self, ip: u64) -> Option<iced_x86::Instruction> {
        let bytes = self.binary.bytes_at(ip, 15.min(self.available(ip)))?;
        let mut decoder = iced_x86::Decoder::with_ip(64, bytes, ip, iced_x86::DecoderOptions::NONE);
        let insn = decoder.decode();
        (!insn.is_invalid()).then_some(insn)
    }

    /// Length of the binary's instruction at `ip`, if one decodes there.
    fn instruction_length(&self, ip: u64) -> Option<u64> {
        self.instruction_at(ip).map(|insn| insn.len() as u64)
    }

    fn reads_stack_implicitly(&self, ip: u64) -> bool {
        self.instruction_at(ip)
            .is_some_and(|insn| implicit_load(&insn) == ImplicitLoad::Stack)
    }

    /// Bytes of the binary's file image from `ip` (at most 15 are needed).
    fn available(&self, ip: u64) -> usize {
        self.binary
            .segments()
            .iter()
            .filter(|s| s.is_load() && s.vaddr <= ip && ip < s.vaddr + s.file_size)
            .map(|s| (s.vaddr + s.file_size - ip) as usize)
            .max()
            .unwrap_or(0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Explicit,
    ImplicitStack,
    Unclassified,
}

fn trim_newline(line: &[u8]) -> &[u8] {
    let mut end = line.len();
    while end > 0 && (line[end - 1] == b'\n' || line[end - 1] == b'\r') {
        end -= 1;
    }
    &line[..end]
}

/// What is wrong with line `number`; `cut` when it is the last line and
/// lacks its newline, i.e. the log was cut short in the middle of it.
/// The error for line `number` (its bytes `text`) whose access does not
/// parse: a cut last line is a truncated log, not a malformed one.
fn bad_line(number: u64, text: &[u8], cut: bool, problem: AccessError) -> LackeyError {
    let text: String = String::from_utf8_lossy(text).chars().take(60).collect();
    if cut {
        LackeyError::Truncated {
            line: number,
            text,
            problem,
        }
    } else {
        LackeyError::MalformedLine {
            line: number,
            text,
            problem,
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The `SIZE` of `  HEXADDR,SIZE` (decimal), if well-formed.
fn parse_size(rest: &[u8]) -> Option<u64> {
    let comma = rest.iter().position(|&b| b == b',')?;
    std::str::from_utf8(&rest[comma + 1..])
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Parses `  HEXADDR,SIZE` (leading spaces allowed) and returns the address.
fn parse_access(rest: &[u8]) -> Result<u64, AccessError> {
    let rest = match rest.iter().position(|&b| b != b' ') {
        Some(i) => &rest[i..],
        None => return Err(AccessError::MissingAddress),
    };
    let mut value = 0u64;
    let mut digits = 0;
    for &b in rest {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            b',' => break,
            _ => return Err(AccessError::UnexpectedCharacter(b as char)),
        };
        if digits == 16 {
            return Err(AccessError::TooLong);
        }
        value = (value << 4) | u64::from(d);
        digits += 1;
    }
    if digits == 0 || rest.get(digits) != Some(&b',') {
        return Err(AccessError::NoSize);
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_access_lines() {
        assert_eq!(parse_access(b" 0401ab70,3").unwrap(), 0x401ab70);
        assert_eq!(parse_access(b"1fff000778,8").unwrap(), 0x1f_ff00_0778);
        assert_eq!(
            parse_access(b" 04zz,3"),
            Err(AccessError::UnexpectedCharacter('z'))
        );
        assert_eq!(parse_access(b" 0401ab70"), Err(AccessError::NoSize));
        assert_eq!(parse_access(b""), Err(AccessError::MissingAddress));
        assert_eq!(
            parse_access(b"11112222333344445,8"),
            Err(AccessError::TooLong)
        );
    }

    #[test]
    fn bad_logs_are_typed_errors() {
        let binary = Binary::open(std::env::current_exe().unwrap()).unwrap();
        let import = |log: &str| {
            super::import(log.as_bytes(), &binary, &LackeyOptions::default(), |_| ()).unwrap_err()
        };
        assert!(matches!(import(""), LackeyError::NotALackeyLog));
        assert!(matches!(
            import("I  0401000,3\n L zz,8\n"),
            LackeyError::MalformedLine {
                line: 2,
                problem: AccessError::UnexpectedCharacter('z'),
                ..
            }
        ));
        assert!(matches!(
            import("I  0401000,3\n L 1ffe"),
            LackeyError::Truncated {
                line: 2,
                problem: AccessError::NoSize,
                ..
            }
        ));
        // The line people read.
        let e = import("I  0401000,3\n L zz,8\n");
        assert_eq!(
            memgaze_error::one_line_of(&e),
            "line 2 is not a valid Lackey line: \" L zz,8\": unexpected character 'z' in the address"
        );
    }

    #[test]
    fn parses_instruction_sizes() {
        assert_eq!(parse_size(b" 0401ab70,3"), Some(3));
        assert_eq!(parse_size(b"  04011b0,15"), Some(15));
        assert_eq!(parse_size(b" 0401ab70,"), None);
        assert_eq!(parse_size(b" 0401ab70"), None);
    }
}
