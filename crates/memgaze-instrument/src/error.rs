//! The errors of the public entry points: opening a binary
//! ([`crate::binary::Binary::open`]), instrumenting it
//! ([`crate::rewrite::instrument`], [`crate::instrument_file`]) and loading
//! or saving an annotation ([`crate::annotation::Annotation::read`],
//! [`crate::rewrite::read_annotation`]).
//!
//! Unlike trace errors, these name the file themselves: a binary or an
//! annotation is found beside others (the executable, its annotation, the
//! output), so the one that failed is part of the problem. The text is the
//! line `cargo memgaze` prints after `error: `.

use crate::binary::BinaryError;
use memgaze_error::UsageError;
pub use memgaze_metadata::annotation::AnnotationError;
use std::io;
use std::path::PathBuf;

/// Why a binary could not be opened, selected from or instrumented.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstrumentError {
    /// A command-line mistake (an invalid `--functions` glob): the CLI
    /// exits with 2 for it, so the [`UsageError`] stays in the chain.
    #[error("{0}")]
    Usage(#[source] UsageError),
    /// The path is a directory.
    #[error("{}: is a directory, not an executable", path.display())]
    IsDirectory {
        /// The path given.
        path: PathBuf,
    },
    /// The file could not be read.
    #[error("{}: cannot read", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The file is not an executable this tool supports (not ELF, not
    /// x86-64, a library, an object file, truncated…): the refusals of
    /// [`BinaryError`], whose messages are the ones people read.
    #[error("{}", path.display())]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        #[source]
        source: BinaryError,
    },
    /// A `--functions` glob that selects none of the binary's functions.
    #[error("--functions {glob}: no function of {} matches", binary.display())]
    NoFunctionMatch {
        /// The pattern as given.
        glob: String,
        /// The binary.
        binary: PathBuf,
    },
    /// The rewriter refuses the executable's layout (already instrumented,
    /// no room for the new segment, the writable segment not last…).
    #[error(transparent)]
    Refused(ElfError),
    /// The software recorder needs an exit hook and the executable has no
    /// `DT_FINI` entry or spare `.dynamic` slot for one.
    #[error("no DT_FINI entry or spare .dynamic slot for the exit hook")]
    NoExitHook,
    /// A shared library has more loads than its record ids can number.
    #[error("{0} loads: more than a library's record ids can number (2^24)")]
    TooManyLoads(usize),
    /// Rewriting failed for a reason below the refusals (relocating code,
    /// assembling the runtime, unwind tables).
    #[error(transparent)]
    Rewrite(#[from] RewriteError),
    /// An error about the input binary `path`, from a step that does not
    /// name it itself (the rewriter).
    #[error("{}", path.display())]
    InFile {
        /// The input binary.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: Box<InstrumentError>,
    },
    /// An output refused before it was written, or whose temporary file
    /// could not be created or renamed into place.
    #[error(transparent)]
    Output(#[from] memgaze_output::OutputError),
    /// The instrumented executable or its annotation could not be written.
    #[error("{}: cannot write", path.display())]
    Write {
        /// The output file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The instrumented executable could not be made executable.
    #[error("{}: cannot make executable", path.display())]
    MakeExecutable {
        /// The output file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// What the ELF editor refuses or fails at: the layouts this rewriter does
/// not handle, and edits outside the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ElfError {
    /// The file does not start with the ELF magic.
    #[error("not an ELF file")]
    NotElf,
    /// A 32-bit or big-endian ELF file.
    #[error("not a 64-bit little-endian ELF file")]
    NotElf64LittleEndian,
    /// The ELF header could not be read.
    #[error("unreadable ELF header: {0}")]
    Header(goblin::error::Error),
    /// Another architecture.
    #[error("not an x86-64 executable (e_machine {0})")]
    NotX86_64(u16),
    /// A relocatable object or core file.
    #[error("not an executable (ELF type {0})")]
    NotExecutable(u16),
    /// A static-pie executable: no interpreter, and `DF_1_PIE` in
    /// `.dynamic` (or no `.dynamic` at all).
    #[error(
        "statically linked (static-pie) executable: only dynamically linked programs can be instrumented"
    )]
    StaticPie,
    /// A position-independent file without interpreter or `DF_1_PIE`.
    #[error(
        "shared library or dynamic loader (no program interpreter): only executables can be instrumented"
    )]
    SharedLibrary,
    /// A statically linked executable.
    #[error("statically linked executable: only dynamically linked programs can be instrumented")]
    StaticallyLinked,
    /// A Go program (Go's sections or build-ID note): its runtime unwinds
    /// goroutine stacks through its own pc tables, which know nothing of
    /// relocated code ("fatal error: unknown pc"), so it is refused before
    /// it runs.
    #[error(
        "Go program (section `{0}`): the Go runtime walks its stacks by its own pc tables and dies on instrumented code; Go programs are not supported"
    )]
    GoProgram(&'static str),
    /// A segment already starts with cargo memgaze's signature.
    #[error("already instrumented by cargo memgaze (instrument the original binary)")]
    AlreadyInstrumented,
    /// No `PT_LOAD` at all.
    #[error("no loadable segment")]
    NoLoadableSegment,
    /// No writable `PT_LOAD` to grow for the recorder state.
    #[error("no writable segment to hold the recorder state")]
    NoWritableSegment,
    /// The writable segment is not the highest one in memory.
    #[error("the writable segment is not the last one in memory: unsupported layout")]
    WritableSegmentNotLast,
    /// No `PT_NOTE` header to turn into the new `PT_LOAD`.
    #[error("no PT_NOTE program header to turn into the new code segment")]
    NoNoteHeader,
    /// The program header table lies (partly) outside the file.
    #[error("program header table lies outside the file")]
    ProgramHeadersOutsideFile,
    /// `.dynamic` lies (partly) outside the file.
    #[error(".dynamic lies outside the file")]
    DynamicOutsideFile,
    /// An entry patch at an address that is not file-backed.
    #[error("patch at {vaddr:#x} is outside the file's segments")]
    PatchOutsideFile {
        /// The patched address.
        vaddr: u64,
    },
    /// An exit hook asked for where none can be installed.
    #[error("no DT_FINI entry or spare .dynamic slot for the exit hook")]
    NoExitHook,
    /// Reading or writing an ELF structure failed.
    #[error(transparent)]
    Scroll(#[from] scroll::Error),
    /// Writing the ELF header failed.
    #[error(transparent)]
    Goblin(#[from] goblin::error::Error),
}

/// What the `.eh_frame` reader and the unwind-table translation refuse.
///
/// Each message carries its whole text (addresses, opcodes), as the
/// rewriter quotes it in a warning or a skip reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UnwindError {
    /// A read past the end of the data, at the first missing byte.
    #[error("unwind data ends early at {at:#x}")]
    EndsEarly {
        /// The address of the first missing byte.
        at: u64,
    },
    /// A LEB128 value gimli refuses (too long for 64 bits).
    #[error("malformed LEB128 at {at:#x}: {error}")]
    MalformedLeb128 {
        /// Where the value starts.
        at: u64,
        /// gimli's reason.
        error: gimli::Error,
    },
    /// A `DW_EH_PE_*` value format the reader does not handle.
    #[error("unsupported pointer format {0:#x}")]
    PointerFormat(u8),
    /// A `DW_EH_PE_*` application other than absolute or PC-relative.
    #[error("unsupported pointer application {0:#x}")]
    PointerApplication(u8),
    /// A pointer format a new FDE cannot be written in.
    #[error("unsupported pointer format {0:#x} for a new FDE")]
    NewFdePointerFormat(u8),
    /// A value too large for the field it is written to.
    #[error(transparent)]
    OutOfRange(#[from] std::num::TryFromIntError),
    /// An `.eh_frame` entry longer than the rest of the section.
    #[error(".eh_frame entry at {0:#x} runs past the section")]
    EntryPastSection(u64),
    /// An FDE whose CIE pointer leads to no CIE read before it.
    #[error("FDE at {0:#x} refers to an unknown CIE")]
    UnknownCie(u64),
    /// A CIE whose code alignment factor is not 1.
    #[error("code alignment factor {0} is not 1")]
    CodeAlignment(u64),
    /// The FDE's start has no address in the copy.
    #[error("FDE start {0:#x} is not mapped")]
    FdeStartNotMapped(u64),
    /// A CFI row inside an instruction of the copy.
    #[error("CFI row at {0:#x} is not on an instruction boundary of the copy")]
    CfiRowNotOnBoundary(u64),
    /// CFI rows that go backwards in the copy.
    #[error("CFI rows out of order at {0:#x}")]
    CfiRowsOutOfOrder(u64),
    /// A CFI opcode the translation does not know.
    #[error("unsupported CFI opcode {0:#x}")]
    CfiOpcode(u8),
    /// An LSDA outside the file-backed part of the binary.
    #[error("LSDA at {0:#x} is not file-backed")]
    LsdaNotFileBacked(u64),
    /// An LSDA with a landing-pad base other than the function start.
    #[error("LSDA with an explicit landing-pad base")]
    LandingPadBase,
    /// The function's start has no address in the copy.
    #[error("function start not mapped")]
    FunctionStartNotMapped,
    /// A call-site range that does not start and end on instructions of
    /// the copy.
    #[error("LSDA call site {start:#x}+{len:#x} is not on instruction boundaries")]
    CallSiteNotOnBoundaries {
        /// The call site's start.
        start: u64,
        /// Its length.
        len: u64,
    },
    /// A landing pad outside the function.
    #[error("landing pad {0:#x} is outside the function")]
    LandingPadOutside(u64),
    /// A landing pad that would land at offset 0 (which reads as none).
    #[error("landing pad at the function start")]
    LandingPadAtStart,
    /// A type-table entry format the translation does not handle.
    #[error("unsupported type table format {0:#x}")]
    TypeTableFormat(u8),
    /// A type table that overlaps the call sites or is too short.
    #[error("malformed LSDA type table")]
    MalformedTypeTable,
    /// Actions naming types of an LSDA without a type table.
    #[error("LSDA actions refer to a missing type table")]
    MissingTypeTable,
    /// An LSDA whose tables run past its section.
    #[error("LSDA at {0:#x} runs past its section")]
    LsdaPastSection(u64),
    /// An absolute type entry in a PIE, which would need a relocation.
    #[error("LSDA type entry needs a dynamic relocation")]
    TypeEntryNeedsRelocation,
    /// An FDE with an LSDA whose CIE has no LSDA encoding.
    #[error("LSDA without an LSDA encoding in the CIE")]
    NoLsdaEncoding,
    /// An FDE with an LSDA whose CIE has no augmentation data.
    #[error("LSDA in a CIE without augmentation data")]
    NoAugmentationData,
}

/// What the code relocator refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelocateError {
    /// Two copied instructions at the same original address.
    #[error("two instructions claim address {0:#x}")]
    DuplicateAddress(u64),
    /// The encoder refuses an instruction.
    #[error("cannot encode {code:?} (from {ip:#x}): {error}")]
    Encode {
        /// The instruction's code.
        code: iced_x86::Code,
        /// Its original address.
        ip: u64,
        /// The encoder's reason.
        error: iced_x86::IcedError,
    },
    /// A branch whose target is more than ±2 GiB away from the copy.
    #[error("branch target {target:#x} out of reach")]
    OutOfReach {
        /// The target.
        target: u64,
    },
    /// A RIP-relative instruction encoded to another size than measured.
    #[error("RIP-relative {0:?} changed size")]
    RipRelativeSize(iced_x86::Code),
    /// A run of copies encoded to another length than measured.
    #[error("copies encoded to {encoded} bytes where {measured} were laid out")]
    LengthChanged {
        /// Bytes encoded.
        encoded: u64,
        /// Bytes laid out.
        measured: u64,
    },
    /// Building an instruction failed.
    #[error(transparent)]
    Iced(#[from] iced_x86::IcedError),
}

/// Why rewriting failed below the refusals of the layout: each wraps the
/// error of the step with the function or structure it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RewriteError {
    /// Editing the ELF file.
    #[error(transparent)]
    Elf(#[from] ElfError),
    /// Relocating the copies.
    #[error(transparent)]
    Relocate(#[from] RelocateError),
    /// Assembling the recorder runtime.
    #[error("assembling the recorder runtime: {0}")]
    Runtime(iced_x86::IcedError),
    /// Translating the LSDA of `function`.
    #[error("LSDA of {function}")]
    Lsda {
        /// The function.
        function: String,
        /// Why.
        #[source]
        source: UnwindError,
    },
    /// Translating the CFI of `function`.
    #[error("CFI of {function}")]
    Cfi {
        /// The function.
        function: String,
        /// Why.
        #[source]
        source: UnwindError,
    },
    /// Writing the FDE of the copy of `function`.
    #[error("FDE of {function}")]
    Fde {
        /// The function.
        function: String,
        /// Why.
        #[source]
        source: UnwindError,
    },
    /// Writing the new `.eh_frame_hdr`.
    #[error(transparent)]
    EhFrameHdr(#[from] UnwindError),
    /// A process-end stub ([`crate::rewrite`]'s `_exit`/`exec`/`fork`
    /// hooks) larger than the room each one has.
    #[error("a process-end stub does not fit {bytes} bytes")]
    ProcessEndStubTooLarge {
        /// The room per stub.
        bytes: u64,
    },
    /// A process-end stub out of `rel32` reach of the PLT jump it replaces.
    #[error("process-end stub out of rel32 range of {jump:#x}")]
    ProcessEndStubOutOfReach {
        /// The PLT jump.
        jump: u64,
    },
    /// A copy more than ±2 GiB away from its original's entry patch.
    #[error("copy at {to:#x} is out of reach of {from:#x}")]
    CopyOutOfReach {
        /// The patched original address.
        from: u64,
        /// The copy's address.
        to: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::Binary;

    #[test]
    fn open_names_the_path_and_the_refusal() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            Binary::open(dir.path()),
            Err(InstrumentError::IsDirectory { .. })
        ));
        let missing = dir.path().join("missing");
        assert!(matches!(
            Binary::open(&missing),
            Err(InstrumentError::Read { path, .. }) if path == missing
        ));
        let text = dir.path().join("script.sh");
        std::fs::write(&text, "#!/bin/sh\n").unwrap();
        let e = Binary::open(&text).unwrap_err();
        assert!(
            matches!(
                &e,
                InstrumentError::Unsupported {
                    source: BinaryError::NotElf(_),
                    ..
                }
            ),
            "{e}"
        );
        // The line people read: the path, then the refusal.
        let line = memgaze_error::one_line_of(&e);
        assert_eq!(
            line,
            format!(
                "{}: not an ELF file (it starts with `#!/bin/sh`: a script; run its interpreter, an ELF executable, with the script as its argument)",
                text.display()
            )
        );
    }

    #[test]
    fn a_bad_glob_is_a_usage_error() {
        let binary = Binary::open(std::env::current_exe().unwrap()).unwrap();
        let e = crate::annotate(&binary, Some("[")).unwrap_err();
        assert!(matches!(e, InstrumentError::Usage(_)), "{e}");
        assert_eq!(memgaze_error::exit_for_of(&e), memgaze_error::Exit::Usage);
        let e = crate::annotate(&binary, Some("no_such_function_*")).unwrap_err();
        assert!(
            matches!(&e, InstrumentError::NoFunctionMatch { glob, .. } if glob == "no_such_function_*"),
            "{e}"
        );
    }
}
