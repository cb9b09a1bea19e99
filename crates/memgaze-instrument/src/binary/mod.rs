//! Reading x86-64 ELF executables: functions, symbols, source lines,
//! decoded instructions and control flow.
//!
//! [`Binary::open`] reads and checks a file once and keeps owned copies of
//! what later stages ask for: sections, segments, the dynamic table, the
//! discovered [`Function`]s (sorted, non-overlapping) and, on first use, the
//! DWARF line table. Everything is addressed by virtual address of the
//! original file; nothing here modifies the binary.
//!
//! ```no_run
//! # fn main() -> Result<(), memgaze_instrument::InstrumentError> {
//! let binary = memgaze_instrument::binary::Binary::open("target/release/app")?;
//! for f in binary.functions() {
//!     let insns = binary.decode(f);
//!     println!("{} {:#x} {} instructions", f.name, f.start, insns.len());
//! }
//! # Ok(()) }
//! ```

pub mod cfg;
mod debug_file;
pub mod demangle;
pub mod dominators;
pub mod eh_frame;
pub mod elf;
mod file_bytes;
pub mod functions;
pub mod imports;
pub mod jump_tables;
pub mod lines;
pub mod loops;
pub mod stack;
pub(crate) mod usage;

pub use cfg::{
    BasicBlock, BlockList, CallSite, FlatMemory, FunctionCode, IndirectJump, IndirectJumpKind,
    Memory, Terminator,
};
pub use dominators::Dominators;
pub(crate) use elf::Section;
pub use elf::{BinaryError, DynamicEntry, ExecutableKind, Segment};
pub use functions::{DiscoveryStats, Function, FunctionSource};
pub use jump_tables::{JumpTable, JumpTableBound, JumpTableEntries};
pub use lines::SourceLocation;
use lines::UnitPace;
pub(crate) use lines::{ChainCursor, LineTable};
pub use loops::{Loop, LoopForest};

use crate::error::InstrumentError;
use file_bytes::FileBytes;
use goblin::elf::Elf;
use goblin::elf::note::NT_GNU_BUILD_ID;
use goblin::elf::sym::{STB_GLOBAL, STB_WEAK, STT_FUNC, STT_GNU_IFUNC};
use iced_x86::{Decoder, DecoderOptions, Instruction};
use memgaze_trace::BinaryIdentity;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;

/// File size from which a file is hashed on a thread of its own, started
/// as it is opened ([`HashUnderWay`]): [`Binary::open`] waits for it once
/// the functions are found, [`Binary::open_hashing_later`]'s caller once
/// it has done work of its own ([`Binary::finish_sha256`]).
const HASH_APART: usize = 8 << 20;

/// Bytes of a mapped file read into the buffer and hashed at a time
/// (`sha256_of`): small enough to stay in the CPU's caches between the
/// read and the hash.
const HASH_PIECE: usize = 256 << 10;

/// When [`Binary::parse`] hashes the file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hashing {
    /// Before it returns.
    Now,
    /// A large file's later ([`Binary::finish_sha256`]), a small one's now.
    LaterIfLarge,
}

/// Inputs of at most this many bytes are instrumented without giving
/// memory back to the system as the stages go (their input's pages, the
/// allocator's free pages: the peak is a few MB) and without a thread
/// beside the writer: for a 60 KB input, the kernel's work of returning
/// pages and faulting them in again was a large part of the whole.
pub(crate) const SMALL_INPUT: usize = 1 << 20;

/// Inputs whose functions span at most this many bytes of code are
/// instrumented without holding the process's peak down
/// ([`Binary::holds_peak_down`]): freed memory is not given back to the
/// system as the stages go and the input's pages stay resident. Their
/// peak stays far under the own release binary's (9.5 MB of code, 350 MB)
/// either way, and the pages given back were faulted in again.
pub(crate) const PEAK_HELD_ABOVE_CODE: u64 = 4 << 20;

/// An x86-64 ELF file, read and checked.
#[derive(Debug)]
pub struct Binary {
    path: PathBuf,
    data: FileBytes,
    identity: BinaryIdentity,
    kind: ExecutableKind,
    entry: u64,
    interpreter: Option<String>,
    needed: Vec<String>,
    sections: Vec<Section>,
    segments: Vec<Segment>,
    dynamic: Vec<DynamicEntry>,
    functions: Vec<Function>,
    discovery: DiscoveryStats,
    debug_file: Option<DebugFile>,
    lines: OnceLock<LineTable>,
    /// Whether its code is over [`PEAK_HELD_ABOVE_CODE`].
    holds_peak_down: bool,
    /// The hash of a file opened hashing later, while it is computed.
    sha256_under_way: Option<HashUnderWay>,
}

/// A large file's SHA-256, computed on a thread of its own from the moment
/// the file is opened: the hash is one thread's work (SHA-256 is a chain),
/// and the parsing and function discovery before the classification leave
/// a core idle, which it takes. The file is read through a descriptor of
/// its own, a piece at a time ([`hash_through`]); the thread stops at the
/// next piece once this is dropped unfinished.
#[derive(Debug)]
struct HashUnderWay {
    thread: Option<std::thread::JoinHandle<Option<String>>>,
    stop: std::sync::Arc<AtomicBool>,
}

impl HashUnderWay {
    /// Starts hashing the file `bytes` are mapped from (`None` for bytes
    /// in memory, or when no thread could be had).
    fn start(bytes: &FileBytes) -> Option<HashUnderWay> {
        let file = bytes.mapped_file()?.try_clone().ok()?;
        let len = bytes.as_slice().len();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopped = std::sync::Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("memgaze-sha256".into())
            .spawn(move || hash_through(&file, len, &stopped))
            .ok()?;
        Some(HashUnderWay {
            thread: Some(thread),
            stop,
        })
    }

    /// The hash, once the thread has it; hashed here from `bytes` (the same
    /// file's) if the thread could not read the file.
    fn finish(mut self, bytes: &FileBytes) -> String {
        let hashed = self.thread.take().and_then(|t| t.join().ok().flatten());
        hashed.unwrap_or_else(|| sha256_of(bytes))
    }

    /// The hash of `bytes`: `under_way`'s, finished, or computed here when
    /// none was started.
    fn finish_or_hash(under_way: Option<HashUnderWay>, bytes: &FileBytes) -> String {
        match under_way {
            Some(under_way) => under_way.finish(bytes),
            None => sha256_of(bytes),
        }
    }
}

impl Drop for HashUnderWay {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A separate debug file found for a binary.
#[derive(Debug)]
struct DebugFile {
    path: PathBuf,
    /// Why its symbols could not be read.
    problem: Option<String>,
}

/// The separate debug file of the stripped ELF file at `path` (found by its
/// build-id or `.gnu_debuglink`, as gdb finds it); `None` when the file
/// keeps its own `.symtab`, names none, or cannot be read. What
/// [`Binary::open`] takes function names from: a cache of instrumented
/// copies keys on it.
pub fn separate_debug_file(path: &Path) -> Option<PathBuf> {
    let bytes = FileBytes::open(path).ok()?;
    let data = bytes.as_slice();
    elf::check_ident(data).ok()?;
    let elf = Elf::parse(data).ok()?;
    let section = |name: &str| {
        elf.section_headers.iter().find(|s| {
            elf.shdr_strtab.get_at(s.sh_name) == Some(name)
                && s.sh_type != goblin::elf::section_header::SHT_NOBITS
        })
    };
    if elf
        .section_headers
        .iter()
        .any(|s| s.sh_type == goblin::elf::section_header::SHT_SYMTAB)
    {
        return None;
    }
    let link = section(".gnu_debuglink")
        .and_then(|s| {
            data.get(s.sh_offset as usize..s.sh_offset.saturating_add(s.sh_size) as usize)
        })
        .and_then(debug_file::parse_debuglink);
    let build_id = elf
        .iter_note_sections(data, Some(".note.gnu.build-id"))
        .and_then(|mut notes| {
            notes
                .find_map(|n| {
                    n.ok()
                        .filter(|n| n.n_type == NT_GNU_BUILD_ID && n.name == "GNU")
                })
                .map(|n| n.desc)
        });
    debug_file::find(path, debug_file::DebugLink { build_id, link })
}

/// The sized `STT_FUNC` and `STT_GNU_IFUNC` symbols of a symbol table.
fn function_symbols(
    table: &goblin::elf::Symtab,
    strtab: &goblin::strtab::Strtab,
) -> Vec<functions::SymbolCandidate> {
    table
        .iter()
        .filter(|s| (s.st_type() == STT_FUNC || s.st_type() == STT_GNU_IFUNC) && s.st_size > 0)
        .filter_map(|s| {
            let name = strtab.get_at(s.st_name)?;
            Some(functions::SymbolCandidate {
                name: name.to_string(),
                start: s.st_value,
                size: s.st_size,
                binding_rank: match s.st_bind() {
                    STB_GLOBAL => 0,
                    STB_WEAK => 1,
                    _ => 2,
                },
            })
        })
        .collect()
}

impl Binary {
    /// Reads an x86-64 executable (fixed-address or PIE).
    ///
    /// Errors name the path and the problem in one line: missing or
    /// unreadable file, not an ELF file, not x86-64 (32-bit, other
    /// architectures, big-endian), a shared library, an object file, a core
    /// dump, a truncated or malformed file.
    pub fn open(path: impl AsRef<Path>) -> Result<Binary, InstrumentError> {
        Binary::open_inner(path.as_ref(), false, Hashing::Now)
    }

    /// Like [`Binary::open`] but also accepts shared objects (libraries),
    /// e.g. to name functions of a library seen in a Lackey log.
    pub fn open_any(path: impl AsRef<Path>) -> Result<Binary, InstrumentError> {
        Binary::open_inner(path.as_ref(), true, Hashing::Now)
    }

    /// [`Binary::open`] (`allow_shared`: [`Binary::open_any`]) without
    /// waiting for a large file's hash: its identity's `sha256` stays empty
    /// until the caller, after work of its own that needs no identity,
    /// calls [`Binary::finish_sha256`] (the hash is one thread's work, and
    /// function discovery, all there is to do beside it here, is shorter).
    pub(crate) fn open_hashing_later(
        path: &Path,
        allow_shared: bool,
    ) -> Result<Binary, InstrumentError> {
        Binary::open_inner(path, allow_shared, Hashing::LaterIfLarge)
    }

    fn open_inner(
        path: &Path,
        allow_shared: bool,
        hashing: Hashing,
    ) -> Result<Binary, InstrumentError> {
        if path.is_dir() {
            return Err(InstrumentError::IsDirectory {
                path: path.to_path_buf(),
            });
        }
        let data = FileBytes::open(path).map_err(|source| InstrumentError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let under_way = if data.as_slice().len() >= HASH_APART {
            HashUnderWay::start(&data)
        } else {
            None
        };
        Binary::parse(path, data, allow_shared, (hashing, under_way)).map_err(|source| {
            InstrumentError::Unsupported {
                path: path.to_path_buf(),
                source,
            }
        })
    }

    /// Parses bytes already in memory; `path` is only recorded (errors do
    /// not name it).
    pub fn from_bytes(
        path: &Path,
        data: Vec<u8>,
        allow_shared: bool,
    ) -> Result<Binary, BinaryError> {
        Binary::parse(
            path,
            FileBytes::Owned(data),
            allow_shared,
            (Hashing::Now, None),
        )
    }

    /// Parses `bytes`, whose hash is already `under_way` or not, and which
    /// `hashing` says when to finish.
    fn parse(
        path: &Path,
        bytes: FileBytes,
        allow_shared: bool,
        (hashing, under_way): (Hashing, Option<HashUnderWay>),
    ) -> Result<Binary, BinaryError> {
        let data = bytes.as_slice();
        let headers = crate::timings::phase("  parse ELF headers");
        elf::check_ident(data)?;
        let header = Elf::parse_header(data)
            .map_err(|e| BinaryError::Malformed(format!("unreadable ELF header ({e})")))?;
        elf::check_extents(data.len() as u64, &header, &[], &[])?;
        let elf = Elf::parse(data)
            .map_err(|e| BinaryError::Malformed(format!("unreadable headers ({e})")))?;
        let sections: Vec<Section> = elf
            .section_headers
            .iter()
            .enumerate()
            .map(|(index, sh)| Section {
                index,
                name: elf.shdr_strtab.get_at(sh.sh_name).unwrap_or("").to_string(),
                kind: sh.sh_type,
                flags: sh.sh_flags,
                addr: sh.sh_addr,
                offset: sh.sh_offset,
                size: sh.sh_size,
                align: sh.sh_addralign,
                entry_size: sh.sh_entsize,
            })
            .collect();
        let segments: Vec<Segment> = elf
            .program_headers
            .iter()
            .enumerate()
            .map(|(index, ph)| Segment {
                index,
                kind: ph.p_type,
                flags: ph.p_flags,
                offset: ph.p_offset,
                vaddr: ph.p_vaddr,
                paddr: ph.p_paddr,
                file_size: ph.p_filesz,
                mem_size: ph.p_memsz,
                align: ph.p_align,
            })
            .collect();
        elf::check_extents(data.len() as u64, &elf.header, &sections, &segments)?;
        let dynamic: Vec<DynamicEntry> = elf
            .dynamic
            .as_ref()
            .map(|d| {
                d.dyns
                    .iter()
                    .map(|e| DynamicEntry {
                        tag: e.d_tag,
                        value: e.d_val,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let kind = elf::executable_kind(elf.header.e_type, &segments, &dynamic);
        if kind == ExecutableKind::SharedObject && !allow_shared {
            return Err(BinaryError::SharedObject);
        }
        if !sections.iter().any(|s| s.is_executable() && s.size > 0) {
            return Err(BinaryError::Malformed(
                "no executable section (section headers stripped?)".into(),
            ));
        }

        let build_id_note = elf
            .iter_note_sections(data, Some(".note.gnu.build-id"))
            .and_then(|notes| {
                notes
                    .filter_map(Result::ok)
                    .find(|n| n.n_type == NT_GNU_BUILD_ID && n.name == "GNU")
                    .map(|n| n.desc)
            });
        let build_id = build_id_note.map(hex);
        drop(headers);
        let symbols_fdes = crate::timings::phase("  symbols, .eh_frame FDEs");

        let section_bytes = |s: &Section| -> Option<&[u8]> {
            if !s.has_file_data() {
                return None;
            }
            data.get(s.offset as usize..(s.offset + s.size) as usize)
        };
        let by_name = |name: &str| sections.iter().find(|s| s.name == name);

        let mut symtab = function_symbols(&elf.syms, &elf.strtab);
        let dynsym = function_symbols(&elf.dynsyms, &elf.dynstrtab);
        let mut has_symtab = sections
            .iter()
            .any(|s| s.kind == goblin::elf::section_header::SHT_SYMTAB);
        // A stripped binary's symbols may lie in a separate debug file.
        let mut separate = None;
        if !has_symtab {
            let link = debug_file::DebugLink {
                build_id: build_id_note,
                link: by_name(".gnu_debuglink")
                    .and_then(section_bytes)
                    .and_then(debug_file::parse_debuglink),
            };
            separate = debug_file::find(path, link).map(|file| {
                let symbols = debug_file::function_symbols(&file);
                (file, symbols)
            });
            if let Some((_, Ok(symbols))) = &mut separate {
                symtab = std::mem::take(symbols);
                has_symtab = true;
            }
        }
        let fdes = match by_name(".eh_frame") {
            Some(eh) => eh_frame::fde_ranges(
                section_bytes(eh).unwrap_or(&[]),
                eh.addr,
                by_name(".text").map_or(0, |s| s.addr),
                by_name(".got").map_or(0, |s| s.addr),
            ),
            None => Default::default(),
        };
        let mut known_names = vec![(elf.entry, "_start")];
        for d in &dynamic {
            match d.tag {
                goblin::elf::dynamic::DT_INIT => known_names.push((d.value, "_init")),
                goblin::elf::dynamic::DT_FINI => known_names.push((d.value, "_fini")),
                _ => {}
            }
        }
        let discover = || {
            let _discovering = crate::timings::phase("  discover functions");
            functions::discover(functions::DiscoveryInput {
                sections: &sections,
                symtab,
                has_symtab,
                dynsym,
                fdes,
                known_names,
                section_bytes: &section_bytes,
            })
        };
        drop(symbols_fdes);
        let (functions, discovery) = discover();
        // A large file has been hashed on a thread of its own meanwhile
        // (for a small one the hand-over would cost more than the hash).
        let (sha256, sha256_under_way) = match (hashing, under_way) {
            (Hashing::LaterIfLarge, under_way) if data.len() >= HASH_APART => {
                (String::new(), under_way)
            }
            (_, under_way) => (HashUnderWay::finish_or_hash(under_way, &bytes), None),
        };
        let identity = BinaryIdentity {
            path: path.display().to_string(),
            size: data.len() as u64,
            sha256,
            build_id,
        };

        let code: u64 = functions.iter().map(|f| f.size).sum();
        let holds_peak_down = code > PEAK_HELD_ABOVE_CODE;
        // Reading the headers, symbols and functions faulted pages in; the
        // stages fault in what they read.
        if holds_peak_down {
            bytes.release_resident();
        }
        Ok(Binary {
            path: path.to_path_buf(),
            identity,
            kind,
            entry: elf.entry,
            interpreter: elf.interpreter.map(str::to_string),
            needed: elf.libraries.iter().map(|l| l.to_string()).collect(),
            functions,
            discovery,
            sections,
            segments,
            dynamic,
            debug_file: separate.map(|(file, symbols)| DebugFile {
                path: file,
                problem: symbols.err(),
            }),
            lines: OnceLock::new(),
            holds_peak_down,
            sha256_under_way,
            data: bytes,
        })
    }

    /// The separate debug file found for a stripped binary (its function
    /// symbols name the functions), and why it could not be read when it
    /// could not.
    pub fn debug_file(&self) -> Option<(&Path, Option<&str>)> {
        self.debug_file
            .as_ref()
            .map(|d| (d.path.as_path(), d.problem.as_deref()))
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file.
    pub fn data(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// Whether the file is at most [`SMALL_INPUT`] bytes.
    pub(crate) fn is_small(&self) -> bool {
        self.data.as_slice().len() <= SMALL_INPUT
    }

    /// Whether the rewriter holds its peak down for this input (its code is
    /// over [`PEAK_HELD_ABOVE_CODE`]): gives the allocator's free pages
    /// back after its stages and drops the input's pages as it goes.
    pub(crate) fn holds_peak_down(&self) -> bool {
        self.holds_peak_down
    }

    /// Drops the resident pages of a mapped input (what the stages so far
    /// read of it) when the peak is held down: later reads fault them in
    /// again.
    pub(crate) fn release_resident(&self) {
        if self.holds_peak_down {
            self.data.release_resident();
        }
    }

    /// [`Binary::release_resident_range`] of `bytes` when they lie in
    /// [`Binary::data`] (not, e.g., a decompressed section).
    pub(crate) fn release_resident_bytes(&self, bytes: &[u8]) {
        let data = self.data().as_ptr_range();
        let at = bytes.as_ptr();
        if data.contains(&at) && bytes.len() <= data.end as usize - at as usize {
            let start = at as usize - data.start as usize;
            self.release_resident_range(start..start + bytes.len());
        }
    }

    /// The open file whose bytes [`Binary::data`] maps, if they are mapped
    /// (not read into memory): the kernel can copy from it directly.
    pub(crate) fn mapped_file(&self) -> Option<&std::fs::File> {
        self.data.mapped_file()
    }

    /// [`Binary::release_resident`] of the pages wholly inside the file
    /// offsets `range`.
    pub(crate) fn release_resident_range(&self, range: std::ops::Range<usize>) {
        if self.holds_peak_down {
            self.data.release_resident_range(range);
        }
    }

    /// Path, size, SHA-256 and build-id.
    pub fn identity(&self) -> &BinaryIdentity {
        debug_assert!(
            !self.identity.sha256.is_empty(),
            "the identity of a binary opened hashing later, asked before its hash was set"
        );
        &self.identity
    }

    /// Sets the SHA-256 of a file [`Binary::open_hashing_later`] left
    /// unhashed: waits for the thread hashing it, or hashes it here when
    /// none could (a large input that is not a mapped file).
    pub(crate) fn finish_sha256(&mut self) {
        if !self.identity.sha256.is_empty() {
            return;
        }
        self.identity.sha256 =
            HashUnderWay::finish_or_hash(self.sha256_under_way.take(), &self.data);
    }

    /// Fixed-address, PIE or (from [`Binary::open_any`]) shared object.
    pub fn kind(&self) -> ExecutableKind {
        self.kind
    }

    /// Whether it is position-independent (loaded at a random base; all
    /// addresses here are file addresses before that bias).
    pub fn is_pie(&self) -> bool {
        self.kind == ExecutableKind::Pie
    }

    /// `e_entry`.
    pub fn entry(&self) -> u64 {
        self.entry
    }

    /// The `PT_INTERP` program (dynamic loader), if any.
    pub fn interpreter(&self) -> Option<&str> {
        self.interpreter.as_deref()
    }

    /// The shared libraries named by `DT_NEEDED` entries, in order (empty
    /// for static executables).
    pub fn needed(&self) -> &[String] {
        &self.needed
    }

    /// All section headers, in file order.
    pub(crate) fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// The first section called `name`.
    pub(crate) fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// The file bytes of a section (`None` for `SHT_NOBITS`).
    pub(crate) fn section_data(&self, section: &Section) -> Option<&[u8]> {
        if !section.has_file_data() {
            return None;
        }
        self.data()
            .get(section.offset as usize..(section.offset + section.size) as usize)
    }

    /// All program headers, in file order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Whether a loadable segment starts with cargo memgaze's signature:
    /// the file is an instrumented copy, whose functions' entries jump to
    /// their copies.
    pub fn is_instrumented(&self) -> bool {
        self.segments
            .iter()
            .filter(|p| p.is_load())
            .any(|p| crate::rewrite::elf::segment_is_signed(self.data(), p.offset, p.file_size))
    }

    /// The `.dynamic` entries (empty for static executables).
    pub fn dynamic(&self) -> &[DynamicEntry] {
        &self.dynamic
    }

    /// The value of the first dynamic entry with this tag.
    pub fn dynamic_value(&self, tag: u64) -> Option<u64> {
        self.dynamic.iter().find(|d| d.tag == tag).map(|d| d.value)
    }

    /// The file offset holding virtual address `vaddr`, through the
    /// `PT_LOAD` segments (`None` when not file-backed).
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.segments
            .iter()
            .filter(|p| p.is_load())
            .find(|p| p.contains_file_vaddr(vaddr))
            .map(|p| p.offset + (vaddr - p.vaddr))
    }

    /// `len` file-backed bytes at virtual address `vaddr`, if all present in
    /// one segment.
    pub fn bytes_at(&self, vaddr: u64, len: usize) -> Option<&[u8]> {
        let p = self
            .segments
            .iter()
            .filter(|p| p.is_load())
            .find(|p| p.contains_file_vaddr(vaddr))?;
        let available = p.file_size - (vaddr - p.vaddr);
        if (len as u64) > available {
            return None;
        }
        let off = (p.offset + (vaddr - p.vaddr)) as usize;
        self.data().get(off..off + len)
    }

    /// Whether `vaddr` lies in an executable section.
    pub fn is_code(&self, vaddr: u64) -> bool {
        self.sections
            .iter()
            .any(|s| s.is_executable() && s.contains(vaddr))
    }

    /// Functions, sorted by start, non-overlapping.
    pub fn functions(&self) -> &[Function] {
        &self.functions
    }

    /// How discovery found them.
    pub fn discovery(&self) -> &DiscoveryStats {
        &self.discovery
    }

    /// Index (into [`Binary::functions`]) of the function containing `addr`.
    pub fn function_index_at(&self, addr: u64) -> Option<usize> {
        let i = self.functions.partition_point(|f| f.start <= addr);
        let i = i.checked_sub(1)?;
        self.functions[i].contains(addr).then_some(i)
    }

    /// The function containing `addr`.
    pub fn function_at(&self, addr: u64) -> Option<&Function> {
        self.function_index_at(addr).map(|i| &self.functions[i])
    }

    /// The machine code of a function.
    pub(crate) fn function_bytes(&self, function: &Function) -> Option<&[u8]> {
        self.bytes_at(function.start, function.size as usize)
    }

    /// Decodes a function linearly from its start (iced-x86,
    /// `Decoder::with_ip`, so branch targets and RIP-relative operands are
    /// absolute addresses). Undecodable bytes appear as
    /// `Code::INVALID` instructions.
    pub fn decode(&self, function: &Function) -> Vec<Instruction> {
        let mut out = Vec::new();
        self.decode_into(function, &mut out);
        // Kept for the whole rewrite: the slack of every function's
        // instructions was a sixth of the rewriter's peak memory (glibc
        // shrinks in place, without a copy).
        out.shrink_to_fit();
        out
    }

    /// [`Binary::decode`] into a reused buffer (cleared first).
    pub(crate) fn decode_into(&self, function: &Function, out: &mut Vec<Instruction>) {
        out.clear();
        if let Some(bytes) = self.function_bytes(function) {
            decode_bytes(bytes, function.start, out);
        }
    }

    /// Decodes a function and builds its control flow (blocks, calls,
    /// indirect jumps, jump tables).
    pub fn function_code(&self, function: &Function) -> FunctionCode {
        FunctionCode::from_instructions(self.decode(function), function.start, function.end(), self)
    }

    /// The DWARF line table (built on first use; empty without DWARF).
    pub(crate) fn line_table(&self) -> &LineTable {
        self.lines
            .get_or_init(|| self.build_line_table(None, UnitPace::Pool))
    }

    /// The part of the DWARF line table that the lookups of `addresses`
    /// (sorted) read ([`LineTable::build`]), built anew and not kept.
    pub(crate) fn line_table_for(&self, addresses: &[u64]) -> LineTable {
        self.build_line_table(Some(addresses), UnitPace::Pool)
    }

    /// [`Binary::line_table_for`], its units read on this thread until
    /// `hurry` is set and then on the pool's ([`UnitPace::UntilHurried`]).
    pub(crate) fn line_table_until_hurried(
        &self,
        addresses: &[u64],
        hurry: &AtomicBool,
    ) -> LineTable {
        self.build_line_table(Some(addresses), UnitPace::UntilHurried(hurry))
    }

    /// The line table, whole or for `wanted` addresses only, its units
    /// read at `pace`.
    fn build_line_table(&self, wanted: Option<&[u64]>, pace: UnitPace<'_>) -> LineTable {
        let mut problem = None;
        let mut decompressed: Vec<(String, Vec<u8>)> = Vec::new();
        for s in self
            .sections
            .iter()
            .filter(|s| s.name.starts_with(".debug_"))
        {
            if s.is_compressed() {
                match decompress(self.section_data(s).unwrap_or(&[])) {
                    Ok(bytes) => decompressed.push((s.name.clone(), bytes)),
                    Err(e) => problem = Some(format!("{}: {e}", s.name)),
                }
            }
        }
        let section = |name: &str| -> &[u8] {
            if let Some((_, bytes)) = decompressed.iter().find(|(n, _)| n == name) {
                return bytes;
            }
            match self.section(name) {
                Some(s) if !s.is_compressed() => self.section_data(s).unwrap_or(&[]),
                _ => &[],
            }
        };
        // A unit's pages are not read again once read: given up as the
        // units are read, they are not all resident at the end (34 MB of
        // the own release binary's peak, beside the rewriter's).
        // [`Binary::is_code`] over the executable sections' address ranges
        // only: it is asked for every sequence and inlined range (a
        // section's flags and end, computed at each, were most of it).
        let code: Vec<std::ops::Range<u64>> = self
            .sections
            .iter()
            .filter(|s| s.is_executable() && s.is_alloc())
            .map(|s| s.addr..s.end())
            .collect();
        let mut table = LineTable::build(
            section,
            |a| code.iter().any(|range| range.contains(&a)),
            (wanted, pace),
            |bytes| self.release_resident_bytes(bytes),
        );
        if table.problem.is_none() {
            table.problem = problem;
        }
        table
    }

    /// Whether DWARF line information exists.
    pub fn has_lines(&self) -> bool {
        !self.line_table().is_empty()
    }

    /// `file:line` of the instruction at `addr`, when DWARF says.
    pub fn location(&self, addr: u64) -> Option<SourceLocation<'_>> {
        self.line_table().locate(addr)
    }

    /// The source positions of the instruction at `addr`, innermost first:
    /// its own, then each call its code was inlined at (DWARF inlined
    /// subroutines). Empty when DWARF has no position.
    pub fn location_chain(&self, addr: u64) -> Vec<SourceLocation<'_>> {
        self.line_table().locate_chain(addr)
    }
}

/// `pairs` of (bucket, value) grouped by bucket, a stable counting sort:
/// bucket `b`'s values are `values[starts[b]..starts[b + 1]]`, in the
/// order `pairs` gives them. Returns `(starts, values)`; `pairs` is walked
/// twice (once to count).
pub(crate) fn stable_buckets(
    buckets: usize,
    pairs: impl Iterator<Item = (usize, u32)> + Clone,
) -> (Vec<u32>, Vec<u32>) {
    let mut starts = vec![0u32; buckets + 1];
    for (bucket, _) in pairs.clone() {
        starts[bucket + 1] += 1;
    }
    for b in 0..buckets {
        starts[b + 1] += starts[b];
    }
    let mut next = starts.clone();
    let mut values = vec![0u32; starts[buckets] as usize];
    for (bucket, value) in pairs {
        values[next[bucket] as usize] = value;
        next[bucket] += 1;
    }
    (starts, values)
}

/// Decodes `bytes` located at `ip` into `out` (appending).
pub(crate) fn decode_bytes(bytes: &[u8], ip: u64, out: &mut Vec<Instruction>) {
    let mut decoder = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    // Compiled code averages about 4 bytes an instruction, many functions
    // less: room for one every 3 bytes spares nearly every function a
    // growth, a copy of all its instructions (`Binary::decode` gives the
    // slack back).
    out.reserve(bytes.len() / 3 + 1);
    // Decoded in place: iced clears the instruction it decodes into, so a
    // default pushed first costs no copy of each decoded one.
    while decoder.can_decode() {
        out.push(Instruction::default());
        let slot = out.last_mut().expect("an instruction was just pushed");
        decoder.decode_out(slot);
    }
}

/// The next of Marsaglia's xorshift64 (13, 7, 17) pseudo-random numbers:
/// the tests' repeatable random source (`state` must not be 0).
#[cfg(test)]
pub(crate) fn xorshift64(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// The instructions iced decodes from `len` pseudo-random bytes (xorshift
/// from `seed`, at 0x1000): every kind of encoding, invalid ones included,
/// for tests that check a table or filter against iced.
#[cfg(test)]
pub(crate) fn random_instructions(seed: u64, len: usize) -> Vec<Instruction> {
    let mut state = seed;
    let bytes: Vec<u8> = (0..len).map(|_| xorshift64(&mut state) as u8).collect();
    let mut instructions = Vec::new();
    decode_bytes(&bytes, 0x1000, &mut instructions);
    instructions
}

/// The hex SHA-256 of `bytes`. A mapped file is read through its
/// descriptor a piece at a time into one small buffer rather than through
/// the mapping: faulting in (and then giving up) every page of a large
/// mapping cost more than the hash itself, and the stages fault in only
/// what they read.
fn sha256_of(bytes: &FileBytes) -> String {
    let data = bytes.as_slice();
    let read = bytes
        .mapped_file()
        .and_then(|file| hash_through(file, data.len(), &AtomicBool::new(false)));
    // Where the file could not be read, the mapping holds the same bytes
    // (a file that shrank since faults on either path).
    read.unwrap_or_else(|| {
        let _hashing = crate::timings::phase("  sha256");
        hex(&Sha256::digest(data))
    })
}

/// The hex SHA-256 of the first `len` bytes of `file`, read a piece at a
/// time into one small buffer; `None` if a read fails or `stop` is set.
fn hash_through(file: &std::fs::File, len: usize, stop: &AtomicBool) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let _hashing = crate::timings::phase("  sha256");
    let mut hasher = Sha256::new();
    let mut piece = vec![0; HASH_PIECE.min(len)];
    for start in (0..len).step_by(HASH_PIECE) {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let piece = &mut piece[..HASH_PIECE.min(len - start)];
        file.read_exact_at(piece, start as u64).ok()?;
        hasher.update(&*piece);
    }
    Some(hex(&hasher.finalize()))
}

/// Lower-case hex of bytes.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Decompresses an `SHF_COMPRESSED` section (`Elf64_Chdr` + payload); the
/// error is the line-table problem to report (a missing line table is not
/// fatal, so it is text, not a variant).
fn decompress(data: &[u8]) -> Result<Vec<u8>, String> {
    const ELFCOMPRESS_ZLIB: u32 = 1;
    const ELFCOMPRESS_ZSTD: u32 = 2;
    if data.len() < 24 {
        return Err("compressed section shorter than its header".into());
    }
    let kind = u32::from_le_bytes(data[0..4].try_into().expect("4 bytes"));
    let size = u64::from_le_bytes(data[8..16].try_into().expect("8 bytes"));
    match kind {
        ELFCOMPRESS_ZSTD => {
            let out = zstd::bulk::decompress(&data[24..], size as usize).map_err(|e| e.to_string())?;
            Ok(out)
        }
        ELFCOMPRESS_ZLIB => Err(
            "zlib-compressed DWARF is not supported (relink with --compress-debug-sections=none or =zstd)".into()
        ),
        other => Err(format!("unknown compression type {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_file_hashed_piece_by_piece_has_its_whole_sha256() {
        // Two whole pieces and part of a third, read through the file.
        let len = 2 * HASH_PIECE + 12_345;
        let contents: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &contents).unwrap();
        let bytes = FileBytes::open(file.path()).unwrap();
        assert_eq!(sha256_of(&bytes), hex(&Sha256::digest(&contents)));
        assert_eq!(bytes.as_slice(), contents.as_slice());
    }

    #[test]
    fn an_input_with_little_code_keeps_its_pages_and_the_peak_free() {
        let gzip = Binary::open("/usr/bin/gzip").unwrap();
        let code: u64 = gzip.functions().iter().map(|f| f.size).sum();
        assert!(
            code > 0 && code <= PEAK_HELD_ABOVE_CODE,
            "gzip: {code} bytes"
        );
        assert!(!gzip.holds_peak_down());
    }

    #[test]
    fn a_large_file_is_hashed_on_a_thread_of_its_own_to_its_whole_sha256() {
        let exe = std::env::current_exe().unwrap();
        let contents = std::fs::read(&exe).unwrap();
        assert!(
            contents.len() >= HASH_APART,
            "the test executable is hashed apart"
        );
        let whole = hex(&Sha256::digest(&contents));
        let mut later = Binary::open_hashing_later(&exe, false).unwrap();
        assert!(later.sha256_under_way.is_some());
        assert_eq!(later.identity.sha256, "");
        later.finish_sha256();
        assert_eq!(later.identity.sha256, whole);
        let now = Binary::open(&exe).unwrap();
        assert!(now.sha256_under_way.is_none());
        assert_eq!(now.identity.sha256, whole);
    }

    #[test]
    fn a_stopped_or_failed_hash_gives_none_and_is_redone_from_the_mapping() {
        let len = HASH_PIECE + 7;
        let contents: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &contents).unwrap();
        let read = std::fs::File::open(file.path()).unwrap();
        let whole = hex(&Sha256::digest(&contents));
        assert_eq!(
            hash_through(&read, len, &AtomicBool::new(false)),
            Some(whole.clone())
        );
        assert_eq!(hash_through(&read, len, &AtomicBool::new(true)), None);
        // Past the end of the file a read fails.
        assert_eq!(hash_through(&read, len + 1, &AtomicBool::new(false)), None);
        let bytes = FileBytes::open(file.path()).unwrap();
        let failed = HashUnderWay {
            thread: Some(std::thread::spawn(|| None)),
            stop: std::sync::Arc::new(AtomicBool::new(false)),
        };
        assert_eq!(failed.finish(&bytes), whole);
    }
}
