//! The static rewriter: relocating functions with load probes into a new
//! segment of the executable.
//!
//! [`instrument`] takes a [`Binary`] and its [`Annotation`] (which loads to
//! instrument, from the classifier) and returns the new executable, the
//! annotation updated with what was actually instrumented, and a
//! [`Report`]. Stages:
//!
//! 1. plan every selected function: decode and build its CFG (`binary`),
//!    check it can be copied faithfully and patched at its entry, check its
//!    unwind information can be translated, pick a probe variant per load
//!    from register/flags liveness ([`liveness`], [`probe`]);
//! 2. generate the recorder runtime ([`runtime`]) and encode all copies as
//!    one block after it (`relocate`);
//! 3. write an FDE (and LSDA) per copy and a new `.eh_frame_hdr`
//!    ([`unwind`]);
//! 4. patch function entries and jump-table targets in the original code to
//!    jump into the copies, hook `e_entry`, `DT_FINI` and the region
//!    markers, and lay the segment out ([`elf`]), with a symbol per copy
//!    in `.symtab` past it (`symbols`).

pub mod elf;
mod escapes;
pub mod hooks;
pub mod library;
pub mod liveness;
pub(crate) mod output;
pub mod probe;
pub mod process_end;
mod reg_countdown;
pub mod relocate;
pub mod report;
pub mod runtime;
mod symbols;
mod tables;
pub mod unwind;

pub(crate) use report::Escape;
pub use report::Report;

use crate::annotation::{Annotation, InstrumentationMode, PtwriteSite, TextTable};
use crate::binary::imports::code_addresses_in_data;
use crate::binary::lines::partition_point_from;
use crate::binary::{Binary, Function, FunctionCode, FunctionSource, IndirectJumpKind};
use crate::error::{AnnotationError, InstrumentError, RewriteError};
use elf::{ElfEditor, SIGNATURE, align_up};
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic, Register};
use liveness::RegSet;
use memgaze_trace::LoadClass;
use output::Output;
use probe::FastPath;
use relocate::{CopyPlan, Insert};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) use hooks::Hook;

/// The fields that tell most instructions apart (code, the first three
/// operands' registers, memory base and index, the second operand's kind),
/// packed for the direct-mapped caches keyed by an `Instruction`
/// (`relocate`'s encodings, `liveness`'s register usage), whose `==` on a
/// hit compares every field: hashing every field through `Hash` cost about
/// as much as a cache saves.
fn distinguishing_fields(insn: &iced_x86::Instruction) -> u64 {
    (insn.code() as u64)
        | (insn.op0_register() as u64) << 16
        | (insn.op1_register() as u64) << 24
        | (insn.op2_register() as u64) << 32
        | (insn.memory_base() as u64) << 40
        | (insn.memory_index() as u64) << 48
        | (insn.op1_kind() as u64) << 56
}

/// Bytes of a `jmp rel32` entry patch.
const PATCH: u64 = 5;

/// Options of [`instrument`].
#[derive(Clone, Copy, Debug)]
pub struct InstrumentOptions {
    /// Software probes or `ptwrite`.
    pub mode: InstrumentationMode,
    /// `None` for an executable; for a shared library, its object number
    /// (1..=[`library::MAX_OBJECT`]), the high bits of its record ids: it
    /// gets [`library`]'s forwarding runtime and no entry or exit hook.
    pub library: Option<u32>,
    /// Whether indirect jumps of the copies that may land in original code
    /// count those landings (the escape checks); `false` copies them
    /// unchecked, to measure what the checks cost
    /// ([`NO_ESCAPE_CHECKS_ENV`]).
    pub escape_checks: bool,
    /// Whether an executable's soft-mode spatial checks may take a load's
    /// block number with BMI2's `rorx` ([`spatial_bmi2_from_env`]): the
    /// copy then runs only on a CPU with BMI2, its entry hook refuses
    /// others, and its annotation lists `bmi2` in `cpu_features`. Libraries
    /// and ptwrite mode always use the baseline form.
    pub spatial_bmi2: bool,
}

/// The environment variable that, set to anything but empty or `0`, leaves
/// the escape checks out of the instrumented copies that `instrument`,
/// `record`, `run` and `bench` make ([`escape_checks_from_env`]).
pub const NO_ESCAPE_CHECKS_ENV: &str = "MEMGAZE_NO_ESCAPE_CHECKS";

/// `false` when [`NO_ESCAPE_CHECKS_ENV`] asks to leave the escape checks out.
#[must_use]
pub fn escape_checks_from_env() -> bool {
    std::env::var_os(NO_ESCAPE_CHECKS_ENV).is_none_or(|v| v.is_empty() || v == "0")
}

impl InstrumentOptions {
    /// Whether the spatial checks take `rorx` where they can: only in an
    /// executable's soft mode, whose entry hook refuses a CPU without BMI2
    /// (a library's code can run before it, from its initialisers).
    fn spatial_rorx(&self) -> bool {
        self.mode == InstrumentationMode::Soft && self.library.is_none() && self.spatial_bmi2
    }
}

/// The environment variable that decides whether spatial checks use BMI2
/// ([`InstrumentOptions::spatial_bmi2`]): `0` never, any other non-empty
/// value always (on a CPU without BMI2 such a copy refuses to run), unset
/// or empty where the instrumenting CPU has BMI2 ([`spatial_bmi2_from_env`]).
pub const SPATIAL_BMI2_ENV: &str = "MEMGAZE_SPATIAL_BMI2";

/// Whether spatial checks use BMI2, as [`SPATIAL_BMI2_ENV`] decides.
#[must_use]
pub fn spatial_bmi2_from_env() -> bool {
    match std::env::var_os(SPATIAL_BMI2_ENV) {
        Some(v) if !v.is_empty() => v != "0",
        _ => cpu_has_bmi2(),
    }
}

/// Whether this CPU has BMI2 (`rorx`).
#[must_use]
pub fn cpu_has_bmi2() -> bool {
    std::is_x86_feature_detected!("bmi2")
}

/// The result of [`instrument`].
#[derive(Clone, Debug)]
pub struct Instrumented {
    /// The instrumented executable (empty from [`crate::instrument_file`]
    /// and the like, which write it and free it before the annotation's
    /// source positions are read).
    pub executable: Vec<u8>,
    /// The annotation, with `mode`, `instrumented` and `skipped` filled in.
    pub annotation: Annotation,
    /// What happened.
    pub report: Report,
}

/// The annotation file written beside an instrumented executable. The name
/// is the same for both formats (the content says which: compact or JSON),
/// so paths that scripts and users know stay valid.
pub fn annotation_path(executable: &Path) -> PathBuf {
    let mut name = executable.as_os_str().to_owned();
    name.push(".memgaze.json");
    PathBuf::from(name)
}

/// Reads the annotation beside an instrumented executable.
pub fn read_annotation(executable: &Path) -> Result<Annotation, AnnotationError> {
    let path = annotation_path(executable);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(source) => {
            return Err(AnnotationError::NotInstrumented {
                executable: executable.to_path_buf(),
                path,
                source,
            });
        }
    };
    Annotation::from_bytes(&text).map_err(|source| AnnotationError::InFile {
        path,
        source: Box::new(source),
    })
}

/// Per-function plan.
struct Planned {
    function: usize,
    annotation_function: Option<usize>,
    code: FunctionCode,
    inserts: Vec<(usize, Insert)>,
    blocks: Vec<relocate::Superblock>,
    /// Innermost loops counting in a register ([`reg_countdown`]).
    register_loops: Vec<reg_countdown::RegisterLoop>,
    /// Loads with a spatial check: index → (load id, probe).
    spatial: HashMap<usize, (u32, probe::SpatialProbe)>,
    prologue_call: Option<u64>,
    /// Jump-table targets to patch.
    table_patches: Vec<u64>,
    /// Jump-table reads redirected to translated tables ([`tables`]).
    redirects: HashMap<usize, relocate::TableRedirect>,
    /// Instruction indices of the indirect jumps that may land in original
    /// code ([`escapes::candidates`]).
    escape_jumps: Vec<usize>,
    /// Instruction indices of the explicit loads no probe can trace
    /// ([`probe::unsupported_operand`]): counted at each execution with the
    /// escapes, so the dynamic coverage sees them.
    untraced_loads: Vec<usize>,
    /// Those that got a counted check: `(instruction index, site)`.
    escape_ids: Vec<(usize, u32)>,
    /// How much of `code` is still held ([`CodeHeld`]).
    held: CodeHeld,
    /// Addresses of its instrumented loads, taken before its instructions
    /// are freed ([`Planned::free_instructions`]).
    probed_ips: Vec<u64>,
}

/// Frees `code`'s control flow, keeping its instructions and bounds.
fn drop_control_flow(code: &mut FunctionCode) {
    code.blocks = Vec::new();
    code.block_of = Vec::new();
    code.loops = Default::default();
    code.calls = Vec::new();
    code.branch_targets = Vec::new();
}

/// How much of a plan's code is held. The copies of most functions need
/// their instructions only to be encoded and their control flow only to be
/// planned: holding every function's decoded code from planning to the
/// patches was the rewriter's largest cost in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CodeHeld {
    /// Instructions and control flow.
    Whole,
    /// Instructions (and bounds) only: what the encoder reads of a copy
    /// without register loops.
    Instructions,
    /// Bounds only.
    Bounds,
}

/// What planning one function gave: its plan, or why it is left alone.
enum PlanOutcome {
    Planned {
        plan: Box<Planned>,
        /// Loads of the function that get no probe, and why.
        skipped_loads: Vec<(usize, String)>,
    },
    Skipped {
        function: usize,
        annotation_function: Option<usize>,
        reason: String,
    },
}

/// Where a function left uninstrumented is recorded: the annotation, the
/// report and the list of loads without a probe.
struct Skipped<'a> {
    annotation: &'a mut Annotation,
    report: &'a mut Report,
    loads: &'a mut Vec<(usize, String)>,
}

impl Skipped<'_> {
    /// Records annotation function `ai` (binary function `f`) as not
    /// instrumented for `reason`, with every load of it (`loads_of`).
    fn function(&mut self, ai: usize, f: &Function, loads_of: &LoadsOf, reason: String) {
        self.annotation.functions[ai].skipped = Some(reason.clone());
        for &li in loads_of.of(ai) {
            self.loads
                .push((li, format!("function not instrumented: {reason}")));
        }
        self.report
            .skipped
            .push((f.name.clone(), f.start, reason.clone()));
        *self.report.functions_skipped.entry(reason).or_default() += 1;
    }
}

impl Planned {
    /// Whether a stage after planning reads its control flow: one with
    /// indirect jumps (their patches, escapes and translated tables) or
    /// register loops (the encoder reads their blocks).
    fn needs_control_flow(&self) -> bool {
        !self.code.indirect_jumps.is_empty()
            || !self.register_loops.is_empty()
            || !self.escape_jumps.is_empty()
            || !self.redirects.is_empty()
    }

    /// Frees its control flow unless a later stage reads it.
    fn free_control_flow(&mut self) {
        if self.held != CodeHeld::Whole || self.needs_control_flow() {
            return;
        }
        drop_control_flow(&mut self.code);
        self.held = CodeHeld::Instructions;
    }

    /// Keeps the addresses of its instrumented loads: read after its
    /// instructions are freed.
    fn keep_probed_ips(&mut self) {
        let code = &self.code;
        self.probed_ips = self
            .probed_indices()
            .map(|i| code.instructions[i].ip())
            .collect();
    }

    /// Decodes its instructions again where the encoder freed them.
    fn decode_again(&mut self, binary: &Binary) {
        if self.held == CodeHeld::Instructions && self.code.instructions.is_empty() {
            self.code = binary.function_code(&binary.functions()[self.function]);
            drop_control_flow(&mut self.code);
        }
    }

    /// Once encoded, frees the instructions of a plan whose control flow
    /// is freed (those the encoder has not freed already).
    fn free_instructions(&mut self) {
        if self.held == CodeHeld::Instructions {
            self.code.instructions = Vec::new();
            self.held = CodeHeld::Bounds;
        }
    }

    /// Its whole code: held, or decoded again (only escapes reaching a
    /// function without indirect jumps ask).
    fn whole_code<'p>(&'p self, binary: &Binary) -> std::borrow::Cow<'p, FunctionCode> {
        match self.held {
            CodeHeld::Whole => std::borrow::Cow::Borrowed(&self.code),
            _ => std::borrow::Cow::Owned(binary.function_code(&binary.functions()[self.function])),
        }
    }

    /// Instruction indices of every instrumented load (own probe or block
    /// check).
    fn probed_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.inserts.iter().map(|&(i, _)| i).chain(
            self.blocks
                .iter()
                .flat_map(|b| b.loads.iter().map(|&(i, _, _)| i)),
        )
    }
}

/// Instruments `binary` as `annotation` says.
pub fn instrument(
    binary: &Binary,
    annotation: Annotation,
    options: &InstrumentOptions,
) -> Result<Instrumented, InstrumentError> {
    let peak_held_down = PeakHeldDown::new();
    peak_held_down.unless_needed_for(binary);
    let mut executable = Vec::new();
    let (mut result, ()) = instrument_with_code(
        binary,
        annotation,
        options,
        &mut HashMap::new(),
        (
            &mut executable,
            |_: &AtomicBool| (),
            |_: &mut Annotation, ()| (),
        ),
    )?;
    result.executable = executable;
    Ok(result)
}

/// [`instrument`], reusing the control flow of functions already built
/// (by the classification), keyed by function start; the entries used are
/// taken out of `codes`. The executable is written to `out` (the result's
/// `executable` is empty). `read_lines` runs on another thread once the
/// copies are encoded (for a small input, on this thread at the end), given
/// a flag set once its result is needed (it may then hurry);
/// `finish_annotation` is given the finished annotation and what
/// `read_lines` gave on another thread while the input and the segment
/// are written (one core writes, the other is free for the annotation's
/// own last work; for a small input, on this thread before them); its
/// result is returned beside.
///
/// Phases, with plain data between them: select and plan the functions
/// (`Selection`, `Planned`), generate the runtime and encode the copies
/// ([`relocate::Copies`]), translate their unwind information
/// (`UnwindTail`), patch the original, lay the segment out, and update
/// the annotation and the report.
pub(crate) fn instrument_with_code<L: Send, R: Send>(
    binary: &Binary,
    mut annotation: Annotation,
    options: &InstrumentOptions,
    codes: &mut HashMap<u64, Box<FunctionCode>>,
    (out, read_lines, finish_annotation): (
        &mut dyn Output,
        impl FnOnce(&AtomicBool) -> L + Send,
        impl FnOnce(&mut Annotation, L) -> R + Send,
    ),
) -> Result<(Instrumented, R), InstrumentError> {
    let soft = options.mode == InstrumentationMode::Soft;
    let mut clock = std::time::Instant::now();
    let mut lap = |report: &mut Report, phase: &str| {
        report
            .timings
            .push((phase.to_string(), clock.elapsed().as_secs_f64()));
        clock = std::time::Instant::now();
    };
    let mut phase = crate::timings::phases("editor, original unwind, select");
    // Everything the editor rejects is a refusal of the file's layout.
    let bytes = binary.data();
    let mut editor = match options.library {
        None => ElfEditor::new(bytes, runtime::STATE_BYTES),
        Some(_) => ElfEditor::new_library(bytes, library::STATE_BYTES),
    }
    .map_err(InstrumentError::Refused)?;
    let mut report = Report {
        functions_selected: annotation.functions.len(),
        ..Report::default()
    };
    if soft && options.library.is_none() && !editor.can_hook_fini() {
        return Err(InstrumentError::NoExitHook);
    }
    let original = OriginalUnwind::load(binary, &editor, &mut report);
    let selection = select_functions(binary, &mut annotation, soft, &mut report);

    // ---- 1. plans
    phase.next("plan (CFG, liveness, superblocks)");
    let (mut plans, mut skipped_loads) = plan_functions(
        binary,
        &mut annotation,
        &selection,
        &original,
        options,
        codes,
        &mut report,
    );
    lap(&mut report, "plan (CFG, liveness, superblocks)");
    phase.next("escape jumps, runtime, tables");
    // A library's checks count in counters of its own (see `library`).
    let escape_sites = if soft && options.escape_checks {
        mark_escape_jumps(binary, &mut plans, &original)
    } else {
        0
    };

    // ---- 2. runtime and copies
    let runtime_va = editor.segment_va + 64;
    let (rt, process_end) = runtime_with_exit_stubs(
        binary,
        (&editor, runtime_va),
        &mut plans,
        &selection.hooks,
        (soft, escape_sites, options),
        &mut report,
    )?;
    let runtime_len = rt.as_ref().map_or(0, |r| r.code.len() as u64);
    let tables_va = align_up(runtime_va + runtime_len, 64);
    let tables = plan_tables(&mut plans, tables_va, editor.pie, &mut report);
    let copies_va = align_up(tables_va + tables.len, 64);
    let entries = copy_entries(
        binary,
        &plans,
        (rt.as_ref(), &process_end),
        (copies_va, editor.state_va),
        escape_sites,
        options,
    );
    free_in_plans(&mut plans, Planned::free_control_flow);
    phase.next("encode copies");
    let mut copies = encode_copies(
        binary,
        &mut plans,
        (copies_va, editor.file_offset(copies_va), out),
        &entries,
        &selection.loads_of,
        Skipped {
            annotation: &mut annotation,
            report: &mut report,
            loads: &mut skipped_loads,
        },
    )?;
    free_in_plans(&mut plans, Planned::free_instructions);
    phase.end();
    lap(&mut report, "encode copies");
    // The line table needs only the loads' addresses, known since the
    // classification: it is read on another thread while this one
    // translates the unwind information and patches the original, which
    // leave the other core idle, and while the outcome is recorded and the
    // plans freed (after the copies, whose peak it would add to).
    let apart = !binary.is_small();
    let needed = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<(Instrumented, R), InstrumentError> {
        // Needed however this ends, an error's return included: the scope
        // waits for the reading.
        let _needed_at_end = SetOnDrop(&needed);
        let lines = if apart {
            Lines::Reading(scope.spawn(|| read_lines(&needed)), &needed)
        } else {
            Lines::Later(read_lines, &needed)
        };

        // The executable's runtime skips the spatial checks of runs that take
        // no spatial samples; a library's copies keep theirs.
        let skips_va = align_up(copies_va + copies.len, 8);
        let skips = if soft && options.library.is_none() {
            spatial_skips(editor.segment_va, skips_va, &copies)
        } else {
            SpatialSkips::default()
        };

        // ---- 3. unwind information
        let tail_va = align_up(skips_va + skips.table.len() as u64, 8);
        let tail = build_unwind_tail(
            binary,
            &original,
            &plans,
            &copies,
            editor.pie,
            tail_va,
            &mut report,
        )?;
        lap(&mut report, "unwind information");

        // ---- 4. patches
        let mut patching = crate::timings::phases("tables, patch original");
        let table_bytes = fill_tables(binary, &plans, &tables, &copies, &mut report);
        // First, so that an entry or jump-table patch over a GOT call wins.
        process_end::patch(&mut editor, &process_end)?;
        let patched = patch_original(
            &mut editor,
            binary,
            &mut plans,
            &copies,
            &original,
            &tables.jumps,
            &mut report,
        )?;
        report.escaped_loads = escaped_loads(binary, &plans, &report.escapes, &patched);

        // ---- 5. the input and the rest of the segment, around the copies
        report.copies_start = copies_va;
        report.copies_end = copies_va + copies.len;
        let segment_len = tail.va - editor.segment_va + tail.bytes.len() as u64;
        report.segment_bytes = segment_len as usize;
        let (entry, fini) = match &rt {
            Some(rt) if options.library.is_none() => (Some(rt.entry), Some(rt.fini)),
            _ => (None, None),
        };
        let segment_va = editor.segment_va;
        let eh_frame_hdr = tail.eh_frame_hdr;
        let copies_len = copies.len;
        patching.next("name copies, free them");
        editor.name_copies(copies_va, copies_len, &copies.maps);
        let ptwrites = std::mem::take(&mut copies.ptwrites);
        drop(copies);
        patching.end();
        let write_executable = |out: &mut dyn Output| {
            editor.finish(
                out,
                segment_len,
                move |out, segment_offset| {
                    lay_out_segment(
                        (out, segment_offset),
                        segment_va,
                        rt.as_ref(),
                        (tables_va, &table_bytes),
                        (copies_va, copies_len),
                        (skips_va, &skips),
                        &tail,
                    )
                },
                (entry, fini),
                eh_frame_hdr,
                (binary.mapped_file(), |range| {
                    binary.release_resident_range(range)
                }),
            )
        };
        // ---- 6. the annotation and the report, beside the writer (the
        // executable's bytes are all made; only the plans say what became
        // of each load)
        let (annotation_ref, report_ref) = (&mut annotation, &mut report);
        let finish = move || {
            record_outcome(
                binary,
                (annotation_ref, report_ref),
                &plans,
                &patched,
                (ptwrites, skipped_loads),
                options,
            );
            // Not trimmed after: the loads' lines and the annotation's
            // encoding allocate in what the plans free (given back, those
            // pages were faulted in again: 9,000 faults on the own release
            // binary), and the process's peak lies earlier, in the copies.
            drop(plans);
            finish_annotation(annotation_ref, lines.get())
        };
        let (written, finished) = beside_the_writer(apart, write_executable, out, finish);
        written.map_err(RewriteError::from)?;
        lap(&mut report, "patches, report, ELF (+ annotation beside)");
        Ok((
            Instrumented {
                executable: Vec::new(),
                annotation,
                report,
            },
            finished,
        ))
    })
}

/// Records what became of each load and function in the annotation and
/// the report: [`update_annotation`], the escape sites (`patched`: the
/// original's patched addresses) and the counts.
fn record_outcome(
    binary: &Binary,
    (annotation, report): (&mut Annotation, &mut Report),
    plans: &[Planned],
    patched: &BTreeSet<u64>,
    (ptwrites, skipped_loads): (Vec<PtwriteSite>, Vec<(usize, String)>),
    options: &InstrumentOptions,
) {
    let _recording = crate::timings::phase("record outcome (beside)");
    update_annotation(annotation, plans, ptwrites, skipped_loads, options);
    annotation.escapes = escapes::sites(binary, plans, patched, annotation);
    count_escape_checks(report, annotation);
    count_into_report(report, annotation, plans);
}

/// The runtime (`generate_runtime`) and, for an executable's, the stubs
/// its process-ending calls go through (`append_process_end_stubs`).
fn runtime_with_exit_stubs(
    binary: &Binary,
    (editor, runtime_va): (&ElfEditor<'_>, u64),
    plans: &mut [Planned],
    hooks: &[(usize, Hook)],
    (soft, escape_sites, options): (bool, u32, &InstrumentOptions),
    report: &mut Report,
) -> Result<(Option<runtime::Runtime>, process_end::ProcessEndStubs), RewriteError> {
    let mut rt = generate_runtime(
        editor,
        runtime_va,
        plans,
        hooks,
        (soft, escape_sites, options),
        report,
    )?;
    let process_end = match rt.as_mut() {
        Some(rt) if options.library.is_none() => {
            append_process_end_stubs(binary, runtime_va, rt, report)?
        }
        _ => process_end::ProcessEndStubs::default(),
    };
    Ok((rt, process_end))
}

/// The runtime's entries the copies call or jump to, and what their probes
/// need of it: the spatial hash, the escape check (when `escape_sites`
/// were marked), the process-ending stubs' GOT slots.
fn copy_entries(
    binary: &Binary,
    plans: &[Planned],
    (rt, process_end): (Option<&runtime::Runtime>, &process_end::ProcessEndStubs),
    (copies_va, state_va): (u64, u64),
    escape_sites: u32,
    options: &InstrumentOptions,
) -> relocate::Entries {
    relocate::Entries {
        record: rt.map_or(0, |r| r.record),
        record_tracked: rt.map_or(0, |r| r.record_tracked),
        probe_append: rt.map_or([0; 2], |r| r.probe_appends()),
        spatial: rt.map_or(0, |r| r.spatial),
        spatial_append: match (rt, options.library) {
            (Some(r), None) => r.spatial_append,
            _ => 0,
        },
        spatial_hash: spatial_hash(options),
        spatial_rorx: options.spatial_rorx(),
        escape: (escape_sites > 0).then(|| escape_check(binary, plans, copies_va, (state_va, rt))),
        got_hooks: process_end.by_slot.clone(),
    }
}

/// The spatial checks' hash in the copies. The executable's runtime
/// patches another rate in (or skips the checks); ptwrite mode has no
/// runtime to receive one; a library's checks never branch (no spatial
/// samples in libraries).
fn spatial_hash(options: &InstrumentOptions) -> probe::SpatialHash {
    if options.library.is_some() {
        probe::SpatialHash {
            threshold: 0,
            ..probe::SpatialHash::default_rate()
        }
    } else {
        probe::SpatialHash::default_rate()
    }
}

/// What the copies' escape checks compare with: the span of the planned
/// functions in the original, the copies at `copies_va` and the runtime's
/// state at `state_va`; for a library, with the counters its runtime `rt`
/// registers (a library's runtime has a registration routine).
fn escape_check(
    binary: &Binary,
    plans: &[Planned],
    copies_va: u64,
    (state_va, rt): (u64, Option<&runtime::Runtime>),
) -> probe::EscapeCheck {
    let library_register = rt.map(|r| r.escape_register).filter(|&r| r != 0);
    let functions = || plans.iter().map(|p| &binary.functions()[p.function]);
    probe::EscapeCheck {
        original_start: functions().map(|f| f.start).min().unwrap_or(0),
        original_end: functions().map(|f| f.end()).max().unwrap_or(0),
        copies: copies_va,
        process: state_va + runtime::cfg::PROCESS as u64,
        enabled: state_va + runtime::cfg::ENABLED as u64,
        counters: runtime::process::ESCAPES,
        library: library_register.map(|register| library::counters(state_va, register)),
    }
}

/// The loads' source positions: being read on a thread of their own, or
/// (a small input) read when needed; with the flag that says they are
/// needed.
enum Lines<'s, 'n, L, F> {
    Reading(std::thread::ScopedJoinHandle<'s, L>, &'n AtomicBool),
    Later(F, &'n AtomicBool),
}

impl<L, F: FnOnce(&AtomicBool) -> L> Lines<'_, '_, L, F> {
    /// The positions, once read.
    fn get(self) -> L {
        let _waiting = crate::timings::phase("wait for line table (beside)");
        match self {
            Lines::Reading(reading, needed) => {
                needed.store(true, Ordering::Relaxed);
                reading
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            }
            Lines::Later(read, needed) => {
                needed.store(true, Ordering::Relaxed);
                read(needed)
            }
        }
    }
}

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs `write` on `out` on this thread while another runs `finish` (the
/// annotation's last work, which frees the plans: every function's decoded
/// code). Writing is mostly the kernel's copying into the page cache, on
/// one thread: the other core is free for the rest. The writer allocates
/// next to nothing, so the plans freed beside it are not resident under
/// `finish`'s later work. Unless `apart` (a small input), all on this
/// thread: a thread, its allocator arena and the pages given back and
/// faulted in again cost more than the little work there is to overlap.
fn beside_the_writer<W, R: Send>(
    apart: bool,
    write: impl FnOnce(&mut dyn Output) -> W,
    out: &mut dyn Output,
    finish: impl FnOnce() -> R + Send,
) -> (W, R) {
    if !apart {
        let finished = finish();
        return (write(out), finished);
    }
    std::thread::scope(|scope| {
        let finishing = scope.spawn(finish);
        let written = write(out);
        let finished = finishing
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (written, finished)
    })
}

/// Frees what `free` frees of each plan, and the allocator's free pages
/// ([`release_freed_memory`]).
fn free_in_plans(plans: &mut [Planned], free: fn(&mut Planned)) {
    let _freeing = crate::timings::phase("  free plans' parts");
    for plan in plans {
        free(plan);
    }
    release_freed_memory();
}

/// Whether a [`PeakHeldDown`] holds the peak down now: the stages give
/// freed memory back ([`release_freed_memory`]). Process-wide, as the
/// allocator's threshold it goes with is.
static PEAK_HELD_DOWN: AtomicBool = AtomicBool::new(false);

/// Gives the free pages of the allocator's heaps back to the system while
/// the peak is held down ([`PeakHeldDown`]): glibc keeps them after the
/// plans are freed, and the stages after would be resident on top of them
/// at the process's peak. Otherwise nothing: the pages given back would be
/// faulted in again by the next stage.
pub(crate) fn release_freed_memory() {
    if !PEAK_HELD_DOWN.load(Ordering::Relaxed) {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases memory the allocator holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// While it lives, the process's peak is held down: glibc maps every
/// allocation of 128 KiB or more apart and unmaps it when freed, and the
/// stages give the allocator's free pages back ([`release_freed_memory`]).
/// By default glibc raises that threshold as the first large blocks are
/// freed (up to 32 MiB), and the classification's and the encoder's large
/// vectors, freed a run at a time, then stay in the heaps as pages that
/// `malloc_trim` cannot return while a small block still lives beside
/// them: 20 MB of the peak on the own release binary. Dropped, it sets the
/// threshold where glibc's own raising ends, for the stages after
/// (recording, analysis) that reuse large buffers.
pub(crate) struct PeakHeldDown;

impl PeakHeldDown {
    /// glibc's default threshold, held fixed.
    const DURING: i32 = 128 << 10;
    /// glibc's highest dynamic threshold on 64-bit.
    const AFTER: i32 = 32 << 20;

    /// Holds the peak down until dropped.
    pub(crate) fn new() -> PeakHeldDown {
        set_mmap_threshold(PeakHeldDown::DURING);
        PEAK_HELD_DOWN.store(true, Ordering::Relaxed);
        PeakHeldDown
    }

    /// Stops holding the peak down unless `binary` asks for it
    /// ([`Binary::holds_peak_down`]): a smaller input's large blocks, mapped
    /// and unmapped as they are freed and made again, and its pages given
    /// back between stages, are faulted in afresh each time, and its peak
    /// is small either way.
    pub(crate) fn unless_needed_for(&self, binary: &Binary) {
        if !binary.holds_peak_down() {
            PeakHeldDown::release();
        }
    }

    fn release() {
        PEAK_HELD_DOWN.store(false, Ordering::Relaxed);
        set_mmap_threshold(PeakHeldDown::AFTER);
    }
}

impl Drop for PeakHeldDown {
    fn drop(&mut self) {
        PeakHeldDown::release();
    }
}

fn set_mmap_threshold(bytes: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only changes when the allocator maps blocks apart.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, bytes);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = bytes;
}

/// The original's unwind information, and what translating it reads.
struct OriginalUnwind<'b> {
    binary: &'b Binary,
    /// `.eh_frame`, when there is one with an `.eh_frame_hdr` and it parses.
    eh_frame: Option<unwind::EhFrame>,
    /// Start of every LSDA an FDE names.
    lsda_starts: BTreeSet<u64>,
    /// End of `.gcc_except_table` (`u64::MAX` without one).
    except_table_end: u64,
}

impl<'b> OriginalUnwind<'b> {
    /// Reads `binary`'s `.eh_frame`; one that cannot be parsed is a warning
    /// (functions with unwind entries are then left alone).
    fn load(binary: &'b Binary, editor: &ElfEditor<'_>, report: &mut Report) -> OriginalUnwind<'b> {
        let eh_frame = match binary.section(".eh_frame") {
            Some(section) if editor.has_eh_frame_hdr() => {
                let data = binary.section_data(section).unwrap_or_default();
                match unwind::EhFrame::parse(data, section.addr) {
                    Ok(frame) => Some(frame),
                    Err(e) => {
                        report.warnings.push(format!(
                            ".eh_frame could not be read ({e}): functions with unwind entries are not instrumented"
                        ));
                        None
                    }
                }
            }
            _ => None,
        };
        let except_table_end = binary
            .section(".gcc_except_table")
            .map(|s| s.addr + s.size)
            .unwrap_or(u64::MAX);
        let lsda_starts: BTreeSet<u64> = eh_frame
            .iter()
            .flat_map(|f| f.fdes.iter().filter_map(|fde| fde.lsda))
            .collect();
        OriginalUnwind {
            binary,
            eh_frame,
            lsda_starts,
            except_table_end,
        }
    }

    /// Where the LSDA at `lsda` ends at the latest: the next LSDA, or the
    /// end of `.gcc_except_table`.
    fn lsda_limit(&self, lsda: u64) -> u64 {
        self.lsda_starts
            .range(lsda + 1..)
            .next()
            .copied()
            .unwrap_or(self.except_table_end)
            .min(self.except_table_end)
    }

    /// `len` file-backed bytes of the original at `addr`.
    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        self.binary.bytes_at(addr, len).map(<[u8]>::to_vec)
    }
}

/// The functions to copy and the loads of each.
struct Selection {
    /// `(binary function, annotation function)`: the annotation's functions
    /// found in the binary, in order, then the region markers not among
    /// them.
    functions: Vec<(usize, Option<usize>)>,
    /// The functions whose entries open or close a measured region (soft
    /// mode): the harness's markers or a framework's measurement functions
    /// ([`hooks::find`]), with the hook each calls.
    hooks: Vec<(usize, Hook)>,
    /// Loads per annotation function.
    loads_of: LoadsOf,
}

/// The annotation's loads by function: the indices of each function's
/// loads, in annotation order, as one list cut at each function's first.
/// (A map of lists built one load at a time was most of the selection's
/// serial work.)
struct LoadsOf {
    /// Where each annotation function's loads start in `loads`, and, last,
    /// their end.
    first: Vec<usize>,
    loads: Vec<usize>,
}

impl LoadsOf {
    /// Groups `annotation`'s loads by function.
    fn new(annotation: &Annotation) -> LoadsOf {
        let owners = annotation.loads.iter().map(|load| load.function);
        LoadsOf::group(annotation.functions.len(), owners)
    }

    /// Groups loads by function, given each load's function (a counting
    /// sort). A load naming no function (`functions` or more) belongs to
    /// none.
    fn group(functions: usize, owners: impl Iterator<Item = u32> + Clone) -> LoadsOf {
        let mut first = vec![0usize; functions + 1];
        for f in owners.clone() {
            if let Some(count) = first.get_mut(f as usize + 1) {
                *count += 1;
            }
        }
        for f in 0..functions {
            first[f + 1] += first[f];
        }
        let mut next = first.clone();
        let mut loads = vec![0; first[functions]];
        for (li, f) in owners.enumerate() {
            let f = f as usize;
            if f < functions {
                loads[next[f]] = li;
                next[f] += 1;
            }
        }
        LoadsOf { first, loads }
    }

    /// The loads of annotation function `ai`, in annotation order.
    fn of(&self, ai: usize) -> &[usize] {
        match (self.first.get(ai), self.first.get(ai + 1)) {
            (Some(&start), Some(&end)) => &self.loads[start..end],
            _ => &[],
        }
    }
}

/// Selects the annotation's functions (marking those the binary does not
/// have as skipped) and, in soft mode, the region markers: they are always
/// copied so their hooks can run first and then continue in the copy.
fn select_functions(
    binary: &Binary,
    annotation: &mut Annotation,
    soft: bool,
    report: &mut Report,
) -> Selection {
    // The binary's functions are sorted by start and do not overlap.
    let functions = binary.functions();
    let function_starting_at =
        |start: u64| functions.binary_search_by_key(&start, |f| f.start).ok();
    let hooks: Vec<(usize, Hook)> = if soft {
        hooks::find(binary, &mut report.warnings).map_or_else(Vec::new, |(_, hooks)| hooks)
    } else {
        Vec::new()
    };

    let mut selected: Vec<(usize, Option<usize>)> = Vec::new();
    let mut seen = vec![false; functions.len()];
    for ai in 0..annotation.functions.len() {
        match function_starting_at(annotation.functions[ai].start) {
            Some(bi) => {
                seen[bi] = true;
                selected.push((bi, Some(ai)));
            }
            None => {
                annotation.functions[ai].skipped = Some("not a function of this binary".into());
            }
        }
    }
    for &(m, _) in &hooks {
        if !std::mem::replace(&mut seen[m], true) {
            selected.push((m, None));
        }
    }

    Selection {
        functions: selected,
        hooks,
        loads_of: LoadsOf::new(annotation),
    }
}

/// Plans every selected function (on all cores; the outcomes are applied in
/// order): the plans of those that can be copied, in selection order, and
/// the loads left without a probe. Functions that cannot be copied are
/// recorded as skipped.
fn plan_functions(
    binary: &Binary,
    annotation: &mut Annotation,
    selection: &Selection,
    original: &OriginalUnwind<'_>,
    options: &InstrumentOptions,
    codes: &mut HashMap<u64, Box<FunctionCode>>,
    report: &mut Report,
) -> (Vec<Planned>, Vec<(usize, String)>) {
    let soft = options.mode == InstrumentationMode::Soft;
    let id_base = options.library.map_or(0, |o| o << library::OBJECT_SHIFT);
    let work: Vec<(usize, Option<usize>, Option<Box<FunctionCode>>)> = selection
        .functions
        .iter()
        .map(|&(bi, ai)| (bi, ai, codes.remove(&binary.functions()[bi].start)))
        .collect();
    let outcomes: Vec<PlanOutcome> = {
        use rayon::prelude::*;
        let annotation = &*annotation;
        let planner = Planner {
            binary,
            annotation,
            selection,
            original,
            soft,
            id_base,
        };
        work.into_par_iter()
            .map(|(bi, ai, code)| planner.plan(bi, ai, code))
            .collect()
    };
    let mut plans: Vec<Planned> = Vec::with_capacity(outcomes.len());
    let mut skipped_loads: Vec<(usize, String)> = Vec::new();
    for outcome in outcomes {
        match outcome {
            PlanOutcome::Planned {
                plan,
                skipped_loads: skipped,
            } => {
                skipped_loads.extend(skipped);
                plans.push(*plan);
            }
            PlanOutcome::Skipped {
                function: bi,
                annotation_function: ai,
                reason,
            } => {
                let f = &binary.functions()[bi];
                let is_marker = selection.hooks.iter().any(|&(h, _)| h == bi);
                if let Some(ai) = ai {
                    let mut skipped = Skipped {
                        annotation: &mut *annotation,
                        report: &mut *report,
                        loads: &mut skipped_loads,
                    };
                    skipped.function(ai, f, &selection.loads_of, reason);
                } else if is_marker {
                    report.warnings.push(format!(
                        "region marker {} cannot be hooked: {reason}",
                        f.name
                    ));
                }
            }
        }
    }
    (plans, skipped_loads)
}

/// What planning one function reads.
struct Planner<'a, 'b> {
    binary: &'a Binary,
    annotation: &'a Annotation,
    selection: &'a Selection,
    original: &'a OriginalUnwind<'b>,
    soft: bool,
    /// The object's bits of every record id (0 for the executable).
    id_base: u32,
}

impl Planner<'_, '_> {
    /// Plans binary function `bi` (annotation function `ai`, `None` for a
    /// region marker; `code` when already built): checks it can be copied,
    /// then picks a probe per instrumented load and, in soft mode, groups
    /// them into superblocks.
    fn plan(&self, bi: usize, ai: Option<usize>, code: Option<Box<FunctionCode>>) -> PlanOutcome {
        let Planner {
            binary,
            annotation,
            selection,
            original,
            soft,
            id_base,
        } = *self;
        let f = &binary.functions()[bi];
        let code = code.map_or_else(|| binary.function_code(f), |code| *code);
        if let Err(reason) = check_function(
            binary,
            f,
            &code,
            original.eh_frame.as_ref(),
            &|lsda| original.lsda_limit(lsda),
            &|addr, len| original.read(addr, len),
        ) {
            return PlanOutcome::Skipped {
                function: bi,
                annotation_function: ai,
                reason,
            };
        }
        let mut skipped_loads = Vec::new();
        let mut untraced_loads = Vec::new();
        // At most one insert per probed load.
        let probed = ai.map_or(0, |ai| {
            (selection.loads_of.of(ai).iter())
                .filter(|&&li| annotation.loads[li].instrumented)
                .count()
        });
        let mut inserts = Vec::with_capacity(probed);
        let mut spatial = HashMap::new();
        let mut blocks = Vec::new();
        let mut register_loops = Vec::new();
        // Only the probes' choices read liveness: a function none of whose
        // loads carries a probe is not analysed.
        let live = if probed > 0 {
            liveness::live_before(&code)
        } else {
            Vec::new()
        };
        if let Some(ai) = ai {
            for &li in selection.loads_of.of(ai) {
                let load = &annotation.loads[li];
                if !load.instrumented {
                    continue;
                }
                let Some(index) = code.instruction_at(load.ip) else {
                    skipped_loads.push((li, "not an instruction boundary of its function".into()));
                    continue;
                };
                let insn = &code.instructions[index];
                if let Some(reads) = crate::classify::operands::string_reads(insn) {
                    if !soft {
                        skipped_loads.push((
                            li,
                            "string instruction (ptwrite carries no element count)".into(),
                        ));
                    } else {
                        string_insert(&mut inserts, index, reads, load, id_base);
                    }
                    continue;
                }
                if let Some(reason) = probe::unsupported_operand(insn) {
                    skipped_loads.push((li, reason.into()));
                    if soft {
                        untraced_loads.push(index);
                    }
                    continue;
                }
                if soft {
                    inserts.push((
                        index,
                        Insert::Soft {
                            id: load.id | id_base,
                            fast: choose_fast_path(live[index]),
                        },
                    ));
                    if load.class != LoadClass::Constant && probe::spatial_checkable(insn) {
                        spatial.insert(
                            index,
                            (load.id | id_base, choose_spatial_probe(insn, live[index])),
                        );
                    }
                } else if let Some(reason) = ptwrite_unsupported(insn) {
                    skipped_loads.push((li, reason.into()));
                } else {
                    inserts.push((index, Insert::Ptwrite { id: load.id }));
                    if load.class != LoadClass::Constant {
                        spatial.insert(index, (load.id, choose_spatial_probe(insn, live[index])));
                    }
                }
            }
        }
        inserts.sort_by_key(|&(i, _)| i);
        if soft && !inserts.is_empty() {
            blocks = form_superblocks(&code, &live, &mut inserts);
            register_loops = reg_countdown::plan(&code, &inserts, &blocks, &mut spatial);
        }
        PlanOutcome::Planned {
            plan: Box::new(Planned {
                function: bi,
                annotation_function: ai,
                code,
                inserts,
                blocks,
                register_loops,
                spatial,
                prologue_call: None,
                table_patches: Vec::new(),
                redirects: HashMap::new(),
                escape_jumps: Vec::new(),
                untraced_loads,
                escape_ids: Vec::new(),
                held: CodeHeld::Whole,
                probed_ips: Vec::new(),
            }),
            skipped_loads,
        }
    }
}

/// Adds string-instruction load `load` (at instruction `index`, reading
/// as `reads`) to the string probe of its instruction: the `rsi` read of a
/// `cmps` is its second source, any other read the first.
fn string_insert(
    inserts: &mut Vec<(usize, Insert)>,
    index: usize,
    reads: crate::classify::operands::StringReads,
    load: &crate::annotation::LoadSite,
    id_base: u32,
) {
    let id = load.id | id_base;
    let second = reads.sources().len() == 2 && load.base.as_deref() == Some("rsi");
    let at = inserts.iter().position(|&(i, _)| i == index);
    let (first, other) = match at.map(|k| inserts[k].1) {
        Some(Insert::String { id: f, second: o }) => (Some(f), o),
        _ => (None, None),
    };
    let insert = if second {
        Insert::String {
            id: first.unwrap_or(id),
            second: Some(id),
        }
    } else {
        Insert::String { id, second: other }
    };
    match at {
        Some(k) => inserts[k].1 = insert,
        None => inserts.push((index, insert)),
    }
}

/// The spatial rate the checks are emitted with (the recorders' default,
/// `--spatial-rate 1/128`; ptwrite mode's only one).
pub(crate) const DEFAULT_SPATIAL_RATE: f64 = 1.0 / 128.0;

/// Why a `ptwrite` of `insn`'s address registers cannot stand for its
/// address, if it cannot.
fn ptwrite_unsupported(insn: &iced_x86::Instruction) -> Option<&'static str> {
    if probe::bit_offset_register(insn).is_some() {
        Some("bit test at a register offset (ptwrite cannot carry the offset)")
    } else if insn.memory_segment() == Register::FS {
        Some("fs-relative load (ptwrite cannot carry the segment base)")
    } else if !insn.memory_base().is_gpr() && !insn.memory_index().is_gpr() {
        Some("no source register (static address): ptwrite cannot observe it")
    } else {
        None
    }
}

/// Generates the recorder runtime (soft mode) for `runtime_va`, and makes
/// the copies of the region markers call its region hooks when both
/// markers are copied; a library's runtime (see `library`) when
/// `options.library` names its object.
fn generate_runtime(
    editor: &ElfEditor<'_>,
    runtime_va: u64,
    plans: &mut [Planned],
    hooks: &[(usize, Hook)],
    (soft, escape_sites, options): (bool, u32, &InstrumentOptions),
    report: &mut Report,
) -> Result<Option<runtime::Runtime>, RewriteError> {
    if let (true, Some(object)) = (soft, options.library) {
        return library::generate(runtime_va, editor.state_va, object, escape_sites)
            .map(Some)
            .map_err(RewriteError::Runtime);
    }
    let spatial_rorx = options.spatial_rorx();
    // Regions need every delimiting hook's function rewritten; an extra
    // hook whose function was not is left out.
    let planned = |h: usize| plans.iter().any(|p| p.function == h);
    let has_regions = soft
        && hooks.iter().any(|&(_, hook)| hook.delimits())
        && hooks
            .iter()
            .all(|&(h, hook)| !hook.delimits() || planned(h));
    report.region_markers = has_regions;
    let rt = if soft {
        Some(
            runtime::generate(&runtime::RuntimeParams {
                code_va: runtime_va,
                header_va: editor.segment_va,
                state_va: editor.state_va,
                original_entry: editor.entry,
                original_fini: editor.fini(),
                has_regions,
                escape_sites,
                cpu_features: if spatial_rorx {
                    runtime::CPUID7_EBX_BMI2
                } else {
                    0
                },
            })
            .map_err(RewriteError::Runtime)?,
        )
    } else {
        None
    };
    if let Some(rt) = &rt
        && has_regions
    {
        for plan in plans.iter_mut() {
            if let Some(&(_, hook)) = hooks.iter().find(|&&(h, _)| h == plan.function) {
                plan.prologue_call = Some(rt.hook_entry(hook));
            }
        }
    }
    Ok(rt)
}

/// The report's counted sites: escape checks of jumps, and untraced loads
/// counting their executions.
fn count_escape_checks(report: &mut Report, annotation: &Annotation) {
    report.untraced_load_counts = annotation
        .escapes
        .iter()
        .filter(|e| e.untraced_load)
        .count();
    report.escape_checks = annotation.escapes.len() - report.untraced_load_counts;
}

/// Marks the indirect jumps of every plan that may land in original code
/// ([`escapes::candidates`]), on all cores (nothing else runs between the
/// planning and the copies); returns how many counters the runtime needs
/// (at most [`runtime::process::MAX_ESCAPE_SITES`]; jumps past that are
/// copied unchecked).
fn mark_escape_jumps(binary: &Binary, plans: &mut [Planned], original: &OriginalUnwind<'_>) -> u32 {
    use rayon::prelude::*;
    let total: usize = plans
        .par_iter_mut()
        .map(|plan| {
            plan.escape_jumps = escapes::candidates(binary, plan, original);
            // Untraced loads count with the same counters, in instruction
            // order.
            plan.untraced_loads.sort_unstable();
            plan.untraced_loads.dedup();
            plan.escape_jumps.extend(&plan.untraced_loads);
            plan.escape_jumps.sort_unstable();
            plan.escape_jumps.len()
        })
        .sum();
    total.min(runtime::process::MAX_ESCAPE_SITES as usize) as u32
}

/// Puts the process-end stubs ([`process_end`]) after the runtime's code
/// (16-aligned), so they travel with it into the segment; returns them for
/// the PLT and GOT-call patches and the copies' direct calls.
fn append_process_end_stubs(
    binary: &Binary,
    runtime_va: u64,
    rt: &mut runtime::Runtime,
    report: &mut Report,
) -> Result<process_end::ProcessEndStubs, RewriteError> {
    use crate::binary::imports;
    // Each reads the whole file on its own, between the planning and the
    // copies where nothing else runs: two at a time.
    let (imports, slots) = rayon::join(
        || imports::plt_imports(binary),
        || imports::got_slots_named(binary, process_end::ends_process),
    );
    let plt_jumps: HashSet<u64> = imports.iter().map(|i| i.jump).collect();
    let wanted: HashSet<u64> = slots.iter().map(|(g, _)| *g).collect();
    let (got_calls, got_imports) = rayon::join(
        || imports::got_calls(binary, &wanted),
        || imports::got_imports(binary),
    );
    let got_calls: Vec<_> = got_calls
        .into_iter()
        .filter(|c| !plt_jumps.contains(&c.at))
        .collect();
    let stubs_va = align_up(runtime_va + rt.code.len() as u64, 16);
    let stubs = process_end::assemble(&slots, &imports, &got_calls, stubs_va, rt)?;
    if !stubs.code.is_empty() {
        rt.code.resize((stubs_va - runtime_va) as usize, 0xcc);
        rt.code.extend_from_slice(&stubs.code);
    }
    report.process_end_hooks = stubs.hooked.clone();
    report.process_end_got_calls = stubs.got_calls;
    report.process_end_unhooked = got_imports
        .into_iter()
        .filter(|name| process_end::ends_process(name) && !stubs.hooked.contains(name))
        .collect();
    Ok(stubs)
}

/// Encodes the copies of `plans` at `copies_va`. Functions the encoder
/// refuses are taken out of `plans` and recorded as skipped, and the rest
/// encoded again.
fn encode_copies(
    binary: &Binary,
    plans: &mut Vec<Planned>,
    (copies_va, offset, out): (u64, u64, &mut dyn Output),
    entries: &relocate::Entries,
    loads_of: &LoadsOf,
    mut skipped: Skipped<'_>,
) -> Result<relocate::Copies, RewriteError> {
    for plan in plans.iter_mut() {
        plan.keep_probed_ips();
    }
    loop {
        // Escape sites are numbered over the plans that remain.
        let mut next_site = 0u32;
        let escape_ids: Vec<Vec<(usize, u32)>> = plans
            .iter()
            .map(|p| {
                p.escape_jumps
                    .iter()
                    .filter(|_| entries.escape.is_some())
                    .map_while(|&i| {
                        (next_site < runtime::process::MAX_ESCAPE_SITES).then(|| {
                            next_site += 1;
                            (i, next_site - 1)
                        })
                    })
                    .collect()
            })
            .collect();
        let mut copy_plans = lend_to_copies(plans, &escape_ids, true);
        let encoded = relocate::encode(&mut copy_plans, copies_va, entries, (&mut *out, offset));
        let lent = take_back(copy_plans);
        give_back(plans, lent);
        let combined = match encoded {
            Ok(copies) => {
                for (plan, ids) in plans.iter_mut().zip(escape_ids) {
                    plan.escape_ids = ids;
                }
                return Ok(copies);
            }
            Err(combined) => combined,
        };
        // Find the functions the encoder refuses, to leave them out: each
        // encoded alone, from its whole instructions.
        for plan in plans.iter_mut() {
            plan.decode_again(binary);
        }
        let mut copy_plans = lend_to_copies(plans, &escape_ids, false);
        let bad: Vec<usize> = (0..copy_plans.len())
            .filter(|&i| {
                let alone = std::slice::from_mut(&mut copy_plans[i]);
                relocate::encode(alone, copies_va, entries, (&mut output::Discard, 0)).is_err()
            })
            .collect();
        let lent = take_back(copy_plans);
        give_back(plans, lent);
        if bad.is_empty() {
            return Err(combined.into());
        }
        for &i in bad.iter().rev() {
            let plan = plans.remove(i);
            if let Some(ai) = plan.annotation_function {
                skipped.function(
                    ai,
                    &binary.functions()[plan.function],
                    loads_of,
                    "the encoder cannot relocate its instructions".into(),
                );
            }
        }
    }
}

/// What a plan lends a copy plan, given back after encoding.
struct Lent {
    /// Its code, when it was given rather than lent.
    code: Option<FunctionCode>,
    inserts: Vec<(usize, Insert)>,
    spatial: HashMap<usize, (u32, probe::SpatialProbe)>,
    blocks: Vec<relocate::Superblock>,
    redirects: HashMap<usize, relocate::TableRedirect>,
}

/// The copy plans of `plans`: their inserts, checks, superblocks and
/// redirects are lent (not copied: they are held at the peak), and their
/// code too, except that with `give_codes` the code of a plan whose
/// instructions no later stage reads is given, for the encoder to free.
fn lend_to_copies<'p>(
    plans: &'p mut [Planned],
    escape_ids: &[Vec<(usize, u32)>],
    give_codes: bool,
) -> Vec<CopyPlan<'p>> {
    plans
        .iter_mut()
        .zip(escape_ids)
        .map(|(p, ids)| CopyPlan {
            code: if give_codes && p.held == CodeHeld::Instructions {
                std::borrow::Cow::Owned(std::mem::take(&mut p.code))
            } else {
                std::borrow::Cow::Borrowed(&p.code)
            },
            inserts: std::mem::take(&mut p.inserts),
            spatial: std::mem::take(&mut p.spatial),
            superblocks: std::mem::take(&mut p.blocks),
            register_loops: p.register_loops.clone(),
            prologue_call: p.prologue_call,
            redirects: std::mem::take(&mut p.redirects),
            escapes: ids.clone(),
        })
        .collect()
}

/// What `copy_plans` were lent, in order.
fn take_back(copy_plans: Vec<CopyPlan<'_>>) -> Vec<Lent> {
    copy_plans
        .into_iter()
        .map(|c| Lent {
            code: match c.code {
                std::borrow::Cow::Owned(code) => Some(code),
                std::borrow::Cow::Borrowed(_) => None,
            },
            inserts: c.inserts,
            spatial: c.spatial,
            blocks: c.superblocks,
            redirects: c.redirects,
        })
        .collect()
}

/// Gives each plan back what it lent.
fn give_back(plans: &mut [Planned], lent: Vec<Lent>) {
    for (plan, lent) in plans.iter_mut().zip(lent) {
        if let Some(code) = lent.code {
            plan.code = code;
        }
        plan.inserts = lent.inserts;
        plan.spatial = lent.spatial;
        plan.blocks = lent.blocks;
        plan.redirects = lent.redirects;
    }
}

/// What follows the copies in the segment: the copies' LSDAs and FDEs, and
/// a new `.eh_frame_hdr` listing the original's FDEs and theirs.
struct UnwindTail {
    /// Where it is placed (after the copies, 8-aligned).
    va: u64,
    /// The bytes.
    bytes: Vec<u8>,
    /// Address and size of the new `.eh_frame_hdr`, if one was written.
    eh_frame_hdr: Option<(u64, u64)>,
}

/// Translates the unwind information (FDE, LSDA) of every copied function
/// to its copy, for placement at `tail_va`.
fn build_unwind_tail(
    binary: &Binary,
    original: &OriginalUnwind<'_>,
    plans: &[Planned],
    copies: &relocate::Copies,
    pie: bool,
    tail_va: u64,
    report: &mut Report,
) -> Result<UnwindTail, RewriteError> {
    let _unwinding = crate::timings::phase("unwind information");
    let mut tail: Vec<u8> = Vec::new(); // LSDAs, FDEs, header after the copies
    let mut new_fdes: Vec<(u64, u64)> = Vec::new();
    // The translated CFI of one FDE at a time.
    let mut cfi = Vec::new();
    let read = |addr: u64, len: usize| original.read(addr, len);
    if let Some(frame) = &original.eh_frame {
        for (plan, map) in plans.iter().zip(&copies.maps) {
            let f = &binary.functions()[plan.function];
            for fde in frame.fdes_within(f.start, f.end()) {
                let cie = &frame.cies[fde.cie];
                let near = std::cell::Cell::new(0);
                let mapper = |a: u64| map.map_near(a, &near);
                let lsda_va = match fde.lsda {
                    Some(lsda) => {
                        let at = tail_va + tail.len() as u64;
                        let new = unwind::translate_lsda(
                            &read,
                            lsda,
                            original.lsda_limit(lsda),
                            fde.pc_begin,
                            pie,
                            &mapper,
                            at,
                        )
                        .map_err(|source| RewriteError::Lsda {
                            function: f.name.clone(),
                            source,
                        })?;
                        tail.extend_from_slice(&new.bytes);
                        report.lsdas += 1;
                        Some(at)
                    }
                    None => None,
                };
                while !tail.len().is_multiple_of(8) {
                    tail.push(0);
                }
                unwind::translate_cfi(&fde.instructions, cie, fde.pc_begin, &mapper, &mut cfi)
                    .map_err(|source| RewriteError::Cfi {
                        function: f.name.clone(),
                        source,
                    })?;
                let begin = map.map(fde.pc_begin).expect("checked");
                let end = map.map(fde.pc_end).expect("checked");
                let at = tail_va + tail.len() as u64;
                unwind::build_fde(&mut tail, cie, at, begin, end - begin, lsda_va, &cfi).map_err(
                    |source| RewriteError::Fde {
                        function: f.name.clone(),
                        source,
                    },
                )?;
                new_fdes.push((begin, at));
                report.fdes += 1;
            }
        }
    }
    let mut eh_frame_hdr = None;
    if let Some(frame) = &original.eh_frame
        && !new_fdes.is_empty()
    {
        while !tail.len().is_multiple_of(4) {
            tail.push(0);
        }
        let at = tail_va + tail.len() as u64;
        let mut entries: Vec<(u64, u64)> =
            frame.fdes.iter().map(|f| (f.pc_begin, f.addr)).collect();
        entries.extend_from_slice(&new_fdes);
        let hdr = unwind::build_eh_frame_hdr(at, frame.addr, &mut entries)?;
        eh_frame_hdr = Some((at, hdr.len() as u64));
        tail.extend_from_slice(&hdr);
    }
    Ok(UnwindTail {
        va: tail_va,
        bytes: tail,
        eh_frame_hdr,
    })
}

/// `endbr64`: the landing pad CET-enabled compilers put at every function
/// whose address is taken.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Patches the entry of every copied function, then the jump-table targets
/// inside it that can take a patch, to jump into its copy; every way into
/// the original that stays unpatched is reported as an escape. Returns the
/// patched addresses. A function known only from a gap scan is copied (its
/// callers' copies branch to its copy), but its original bytes are written
/// only where there is evidence they are code: an `endbr64` landing pad at
/// its start, or its address stored as data (a function pointer, an
/// `.init_array` entry). A gap of `.text` may hold data that decodes as
/// code (OpenSSL's SHA-256 constants sit between its functions), and a
/// patch there changes what the program computes.
fn patch_original(
    editor: &mut ElfEditor<'_>,
    binary: &Binary,
    plans: &mut [Planned],
    copies: &relocate::Copies,
    original: &OriginalUnwind<'_>,
    redirected: &[u64],
    report: &mut Report,
) -> Result<BTreeSet<u64>, RewriteError> {
    let mut patched: BTreeSet<u64> = BTreeSet::new();
    // Only gap functions ask, and only stripped binaries have them.
    let mut gap_starts: Vec<u64> = (plans.iter())
        .map(|p| &binary.functions()[p.function])
        .filter(|f| f.source == FunctionSource::Gap)
        .map(|f| f.start)
        .collect();
    gap_starts.sort_unstable();
    let pointed_to = code_addresses_in_data(binary, &gap_starts);
    let unpatchable_gap = |f: &Function| {
        f.source == FunctionSource::Gap
            && !pointed_to.contains(&f.start)
            && binary.bytes_at(f.start, 4) != Some(&ENDBR64[..])
    };
    for (plan, map) in plans.iter().zip(&copies.maps) {
        let f = &binary.functions()[plan.function];
        if unpatchable_gap(f) {
            report.gap_entries_unpatched += 1;
            continue;
        }
        write_jump(editor, f.start, map.start)?;
        patched.insert(f.start);
        report.entry_patches += 1;
    }
    for (pi, plan) in plans.iter_mut().enumerate() {
        if plan.code.indirect_jumps.is_empty() {
            continue;
        }
        let map = &copies.maps[pi];
        let f = &binary.functions()[plan.function];
        let entry_points = entry_points(
            &plan.code,
            original.eh_frame.as_ref(),
            &|lsda| original.lsda_limit(lsda),
            &|addr, len| original.read(addr, len),
        );
        let mut taken: Vec<(u64, u64)> = vec![(f.start, f.start + PATCH)];
        let unresolved = plan
            .code
            .indirect_jumps
            .iter()
            .any(|j| j.kind == IndirectJumpKind::Unresolved);
        for j in &plan.code.indirect_jumps {
            let name = f.name.clone();
            match j.kind {
                IndirectJumpKind::JumpTable(t) => {
                    // A copy reading a translated table never lands on these
                    // patches; they serve only jumps in the original code.
                    let translated = redirected.binary_search(&j.ip).is_ok();
                    let table = &plan.code.jump_tables[t];
                    let mut targets: Vec<u64> = table.targets.clone();
                    targets.sort_unstable();
                    targets.dedup();
                    for target in targets {
                        if !f.contains(target) {
                            continue; // another function: its own entry patch
                        }
                        if patched.contains(&target) {
                            continue;
                        }
                        let why_not = if unpatchable_gap(f) {
                            Some(
                                "jump-table target in a function found only in a gap (its original bytes are never patched)",
                            )
                        } else if unresolved {
                            Some(
                                "an unresolved indirect jump in the function may land inside the patch",
                            )
                        } else if target + PATCH > f.end() {
                            Some(
                                "jump-table target too close to the function end for a 5-byte patch",
                            )
                        } else if entry_points
                            .range(target + 1..target + PATCH)
                            .next()
                            .is_some()
                        {
                            Some("jump-table target followed too closely by another entry point")
                        } else if taken.iter().any(|&(a, b)| target < b && a < target + PATCH) {
                            Some("jump-table target overlaps another patch")
                        } else {
                            None
                        };
                        match why_not {
                            None => {
                                let to = map.map(target).expect("target is an instruction");
                                write_jump(editor, target, to)?;
                                taken.push((target, target + PATCH));
                                patched.insert(target);
                                plan.table_patches.push(target);
                                report.table_target_patches += 1;
                            }
                            Some(_) if translated => {}
                            Some(reason) => report.escapes.push(Escape {
                                function: name.clone(),
                                at: j.ip,
                                target: Some(target),
                                reason: reason.into(),
                            }),
                        }
                    }
                }
                IndirectJumpKind::Unresolved => report.escapes.push(Escape {
                    function: name,
                    at: j.ip,
                    target: None,
                    reason: "unresolved indirect jump".into(),
                }),
                IndirectJumpKind::TailCall => {}
            }
        }
    }
    Ok(patched)
}

/// Plans the translated jump tables of every copy at `va` ([`tables`]) and
/// gives each plan its redirects.
fn plan_tables(plans: &mut [Planned], va: u64, pie: bool, report: &mut Report) -> tables::Tables {
    let codes: Vec<&FunctionCode> = plans.iter().map(|p| &p.code).collect();
    let (mut tables, redirects, untranslated) = tables::Tables::plan(&codes, va, pie);
    for (plan, own) in plans.iter_mut().zip(redirects) {
        plan.redirects = own;
    }
    tables.jumps.sort_unstable();
    report.table_jumps_translated = tables.jumps.len();
    report.table_jumps_untranslated = untranslated.len();
    tables
}

/// The translated tables' bytes; every target in no copy is reported as an
/// escape of each translated jump that reaches it.
fn fill_tables(
    binary: &Binary,
    plans: &[Planned],
    tables: &tables::Tables,
    copies: &relocate::Copies,
    report: &mut Report,
) -> Vec<u8> {
    let (bytes, unmapped) = tables.fill(&copies.maps);
    if unmapped.is_empty() {
        return bytes;
    }
    for plan in plans {
        let f = &binary.functions()[plan.function];
        for j in &plan.code.indirect_jumps {
            let IndirectJumpKind::JumpTable(t) = j.kind else {
                continue;
            };
            if tables.jumps.binary_search(&j.ip).is_err() {
                continue;
            }
            let mut targets = plan.code.jump_tables[t].targets.clone();
            targets.sort_unstable();
            targets.dedup();
            for target in targets {
                if unmapped.binary_search(&target).is_ok() {
                    report.escapes.push(Escape {
                        function: f.name.clone(),
                        at: j.ip,
                        target: Some(target),
                        reason: "jump-table target in code that is not instrumented".into(),
                    });
                }
            }
        }
    }
    bytes
}

/// Addresses of the instrumented loads reachable from `escapes` in the
/// original code (where execution runs without probes), up to the next
/// patched address.
fn escaped_loads(
    binary: &Binary,
    plans: &[Planned],
    escapes: &[Escape],
    patched: &BTreeSet<u64>,
) -> Vec<u64> {
    let mut escaped: BTreeSet<u64> = BTreeSet::new();
    // Indices of `escapes` by address: each plan reads only those in its
    // function's range (a scan of all of them per plan was quadratic).
    let mut by_address: Vec<usize> = (0..escapes.len()).collect();
    by_address.sort_by_key(|&i| escapes[i].at);
    for plan in plans {
        let f = &binary.functions()[plan.function];
        let first = by_address.partition_point(|&i| escapes[i].at < f.start);
        let mut in_range: Vec<usize> = by_address[first..]
            .iter()
            .copied()
            .take_while(|&i| f.contains(escapes[i].at))
            .collect();
        in_range.sort_unstable();
        let own: Vec<&Escape> = in_range
            .into_iter()
            .map(|i| &escapes[i])
            .filter(|e| e.function == f.name)
            .collect();
        if own.is_empty() {
            continue;
        }
        let code = plan.whole_code(binary);
        let starts: Vec<u64> = own
            .iter()
            .flat_map(|e| match e.target {
                Some(t) => vec![t],
                None => code.blocks.iter().map(|b| b.start).collect(),
            })
            .collect();
        if starts.is_empty() {
            continue;
        }
        let probed: HashSet<usize> = plan.probed_indices().collect();
        let mut stack: Vec<usize> = starts
            .iter()
            .filter_map(|&t| code.instruction_at(t).map(|i| code.block_of[i] as usize))
            .collect();
        let mut visited = HashSet::new();
        while let Some(b) = stack.pop() {
            if !visited.insert(b) {
                continue;
            }
            let block = &code.blocks[b];
            if patched.contains(&block.start) && !starts.contains(&block.start) {
                continue;
            }
            for i in block.instructions() {
                if probed.contains(&i) {
                    escaped.insert(code.instructions[i].ip());
                }
            }
            stack.extend(block.successors.iter().map(|&s| s as usize));
        }
    }
    escaped.into_iter().collect()
}

/// Writes the new segment, from `segment_va`, at `segment_offset` in
/// `out`: the signature, the runtime, the tables, the copies' place (they
/// are written already: `copies_len` bytes at `copies_va`), the spatial
/// skips and the unwind tail, each at its address, the gaps filled with
/// `int3`. Gives the offset past its end.
#[allow(
    clippy::too_many_arguments,
    reason = "the segment's parts, each placed"
)]
fn lay_out_segment(
    (out, segment_offset): (&mut dyn Output, u64),
    segment_va: u64,
    rt: Option<&runtime::Runtime>,
    (tables_va, tables): (u64, &[u8]),
    (copies_va, copies_len): (u64, u64),
    (skips_va, skips): (u64, &SpatialSkips),
    tail: &UnwindTail,
) -> u64 {
    let at = |va: u64| segment_offset + (va - segment_va);
    let mut head = [0u8; 64];
    head[..SIGNATURE.len()].copy_from_slice(SIGNATURE);
    head[runtime::header::SPATIAL_SKIPS..runtime::header::SPATIAL_SKIPS + 16]
        .copy_from_slice(&skips.header);
    if let Some(rt) = rt {
        head[runtime::header::CPU_FEATURES..runtime::header::CPU_FEATURES + 4]
            .copy_from_slice(&rt.cpu_features.to_le_bytes());
    }
    let mut end = segment_offset;
    write_after_int3(out, &mut end, at(segment_va), &head);
    if let Some(rt) = rt {
        write_after_int3(out, &mut end, at(segment_va + 64), &rt.code);
    }
    write_after_int3(out, &mut end, at(tables_va), tables);
    write_after_int3(out, &mut end, at(copies_va), &[]);
    end += copies_len;
    write_after_int3(out, &mut end, at(skips_va), &skips.table);
    write_after_int3(out, &mut end, at(tail.va), &tail.bytes);
    end
}

/// Writes `bytes` at `to` in `out`, `int3`s from `end` up to it, and moves
/// `end` past them.
fn write_after_int3(out: &mut dyn Output, end: &mut u64, to: u64, bytes: &[u8]) {
    assert!(to >= *end, "the segment's parts are in address order");
    out.write_at(*end, &vec![0xcc; (to - *end) as usize]);
    out.write_at(to, bytes);
    *end = to + bytes.len() as u64;
}

/// The spatial checks' replacements for runs without spatial samples, in
/// the layout [`runtime::header::SPATIAL_SKIPS`] describes.
#[derive(Default)]
struct SpatialSkips {
    /// The segment header's words: table offset, entries, offset and length
    /// of the copies (all `u32`, from the segment's start).
    header: [u8; 16],
    /// Per check: `u32` offset from the segment's start, `u32` length, `u8`
    /// offsets in it of the multiplier's and the threshold's immediates,
    /// the replacement bytes.
    table: Vec<u8>,
}

fn spatial_skips(segment_va: u64, table_va: u64, copies: &relocate::Copies) -> SpatialSkips {
    let _skipping = crate::timings::phase("spatial skips");
    let checks = &copies.spatial_checks;
    if checks.is_empty() {
        return SpatialSkips::default();
    }
    let offset = |va: u64| u32::try_from(va - segment_va).expect("segment below 4 GiB");
    let mut table = Vec::with_capacity(
        checks
            .iter()
            .map(|c| 4 + 4 + c.immediates.map_or(0, |i| i.len()) + c.len as usize)
            .sum(),
    );
    for check in checks {
        table.extend_from_slice(&offset(check.ip).to_le_bytes());
        table.extend_from_slice(&check.len.to_le_bytes());
        let immediates = check
            .immediates
            .expect("a spatial check has both immediates");
        table.extend(immediates);
        probe::append_spatial_skip(&mut table, check.len as usize, check.moves_rsp);
    }
    let first = checks.iter().map(|c| c.ip).min().unwrap_or(segment_va);
    let last = checks
        .iter()
        .map(|c| c.ip + u64::from(c.len))
        .max()
        .unwrap_or(segment_va);
    let mut header = [0u8; 16];
    header[0..4].copy_from_slice(&offset(table_va).to_le_bytes());
    header[4..8].copy_from_slice(&(checks.len() as u32).to_le_bytes());
    header[8..12].copy_from_slice(&offset(first).to_le_bytes());
    header[12..16].copy_from_slice(&((last - first) as u32).to_le_bytes());
    SpatialSkips { header, table }
}

/// Fills in what was instrumented: the mode, the `ptwrite` sites, the
/// functions copied, and why each load selected for a probe has none.
fn update_annotation(
    annotation: &mut Annotation,
    plans: &[Planned],
    ptwrites: Vec<PtwriteSite>,
    skipped_loads: Vec<(usize, String)>,
    options: &InstrumentOptions,
) {
    annotation.mode = Some(options.mode);
    if options.spatial_rorx() {
        annotation.cpu_features = vec!["bmi2".to_string()];
    }
    annotation.ptwrites = ptwrites;
    for plan in plans {
        if let Some(ai) = plan.annotation_function {
            annotation.functions[ai].instrumented = true;
            annotation.functions[ai].skipped = None;
        }
    }
    // Each plan's addresses sorted on their own (a few dozen at a time):
    // the plans come in the annotation's function order, by address, so
    // the set's sort finds the whole sorted (sorted whole, they cost a
    // third of this step).
    let mut probed_ips = Vec::with_capacity(plans.iter().map(|p| p.probed_ips.len()).sum());
    for plan in plans {
        let start = probed_ips.len();
        probed_ips.extend_from_slice(&plan.probed_ips);
        probed_ips[start..].sort_unstable();
    }
    let mut probed = AscendingSet::new(probed_ips);
    let mut skip_reason: HashMap<usize, String> = skipped_loads.into_iter().collect();
    // Many loads share a reason: one shared text each.
    let mut reasons = TextTable::default();
    for (li, load) in annotation.loads.iter_mut().enumerate() {
        if load.instrumented && !probed.contains(load.ip) {
            load.instrumented = false;
            load.skipped = Some(
                reasons.text(
                    skip_reason
                        .remove(&li)
                        .as_deref()
                        .unwrap_or("function not instrumented"),
                ),
            );
        }
    }
    // Implied loads whose proxy lost its probe are no longer covered.
    let mut instrumented = AscendingSet::new(
        annotation
            .loads
            .iter()
            .filter(|l| l.instrumented)
            .map(|l| l.ip)
            .collect(),
    );
    for load in annotation.loads.iter_mut() {
        if let Some(proxy) = load.proxy
            && !instrumented.contains(proxy.get())
        {
            load.proxy = None;
            load.skipped
                .get_or_insert_with(|| reasons.text("its proxy load is not instrumented"));
        }
    }
}

/// A set of hundreds of thousands of addresses, looked up mostly in
/// ascending order (the loads are sorted by address): each lookup gallops
/// on from where the last one ended, a step or a few where a hash set took
/// a cache miss, and building it is a sort that finds sorted input sorted
/// (a hash set's inserts were most of recording the outcome).
struct AscendingSet {
    /// Sorted, without duplicates.
    ips: Vec<u64>,
    /// Where the last lookup ended: every address before it is lower.
    at: usize,
}

impl AscendingSet {
    fn new(mut ips: Vec<u64>) -> AscendingSet {
        ips.sort_unstable();
        ips.dedup();
        AscendingSet { ips, at: 0 }
    }

    /// Whether `ip` is in the set (any order of lookups; ascending is
    /// fastest).
    fn contains(&mut self, ip: u64) -> bool {
        self.at = partition_point_from(&self.ips, self.at, |&x| x < ip);
        self.ips.get(self.at) == Some(&ip)
    }
}

/// Counts the loads, functions and probes of the finished annotation and
/// plans into the report.
fn count_into_report(report: &mut Report, annotation: &Annotation, plans: &[Planned]) {
    for load in &annotation.loads {
        if load.instrumented {
            report.loads_instrumented += 1;
        } else if load.proxy.is_some() {
            report.loads_implied += 1;
        } else {
            let reason = load.skipped.as_deref().unwrap_or("not selected");
            add_count(&mut report.loads_skipped, reason, 1);
        }
    }
    report.loads = annotation.loads.len();
    report.coverage = report.static_coverage();
    for function in &annotation.functions {
        report.string_loads += function.string_loads as usize;
        report.stack_loads += function.stack_loads as usize;
    }
    report.functions_instrumented = plans
        .iter()
        .filter(|p| p.annotation_function.is_some())
        .count();
    // Soft probes are counted by fast path first, in a short list of the
    // few paths (a map keyed by name compared strings for every probe):
    // their report names are made once per path, not once per probe.
    let mut soft_probes: Vec<(&'static str, usize)> = Vec::new();
    let kinds = &mut report.probe_kinds;
    for plan in plans {
        for &(_, insert) in &plan.inserts {
            match insert {
                Insert::Soft { fast, .. } => count_soft_probe(&mut soft_probes, fast),
                Insert::Ptwrite { .. } => add_count(kinds, "ptwrite", 1),
                Insert::String { .. } => add_count(kinds, "string probe", 1),
            }
        }
        for block in &plan.blocks {
            add_count(kinds, "superblock check", 1);
            add_count(
                kinds,
                "loads counted by superblock checks",
                block.loads.len(),
            );
            add_count(kinds, "superblock side exits", block.exits.len());
        }
    }
    for (fast, count) in soft_probes {
        add_count(kinds, &format!("{fast} probe"), count);
    }
}

/// Counts a soft probe with the fast path `fast` in `counts` (by path name).
fn count_soft_probe(counts: &mut Vec<(&'static str, usize)>, fast: FastPath) {
    let name = fast.name();
    match counts.iter_mut().find(|(path, _)| *path == name) {
        Some((_, count)) => *count += 1,
        None => counts.push((name, 1)),
    }
}

/// Adds `count` to `key`'s entry, making its `String` only the first time.
fn add_count(counts: &mut BTreeMap<String, usize>, key: &str, count: usize) {
    match counts.get_mut(key) {
        Some(total) => *total += count,
        None => {
            counts.insert(key.to_string(), count);
        }
    }
}

/// Groups the probes of `inserts` into superblocks (see [`probe`]): a
/// block with a flags-dead point before its first probe, extended through
/// the blocks it falls into over conditional branches while each has no
/// other predecessor and the flags are dead where the branch's taken edge
/// lands (its compensation adds to the countdown there). Superblocks with
/// at least two loads take those loads out of `inserts`. Loads that are
/// calls or jumps keep their own probe: the counting fragment stops before a
/// final call.
fn form_superblocks(
    code: &FunctionCode,
    live: &[RegSet],
    inserts: &mut Vec<(usize, Insert)>,
) -> Vec<relocate::Superblock> {
    SUPERBLOCK_BUFFERS.with_borrow_mut(|bufs| form_superblocks_in(code, live, inserts, bufs))
}

/// The lists [`form_superblocks`] fills and drops, kept per thread from one
/// function to the next (made anew, they were five allocations per
/// function with probes, the probes' list grown several times).
#[derive(Default)]
struct SuperblockBuffers {
    /// The soft probes of every block, sorted by block.
    probes: Vec<(u32, (usize, u32, FastPath))>,
    /// Per block, where its probes start in `probes` (one more at the end).
    first: Vec<usize>,
    /// Per block, whether a superblock holds it.
    used: Vec<bool>,
    /// The blocks of the superblock being formed.
    chain: Vec<usize>,
    /// The instructions of the loads the superblocks count, sorted.
    counted: Vec<usize>,
}

thread_local! {
    static SUPERBLOCK_BUFFERS: std::cell::RefCell<SuperblockBuffers> =
        std::cell::RefCell::default();
}

/// [`form_superblocks`] with the thread's buffers.
fn form_superblocks_in(
    code: &FunctionCode,
    live: &[RegSet],
    inserts: &mut Vec<(usize, Insert)>,
    bufs: &mut SuperblockBuffers,
) -> Vec<relocate::Superblock> {
    let is_control = |i: usize| {
        matches!(
            code.instructions[i].flow_control(),
            FlowControl::Call
                | FlowControl::IndirectCall
                | FlowControl::IndirectBranch
                | FlowControl::UnconditionalBranch
        )
    };
    // The soft probes of every block, in `inserts` order, in one list
    // sorted by block (a list per block was most of planning's allocations).
    let probes = &mut bufs.probes;
    probes.clear();
    probes.extend(inserts.iter().filter_map(|&(i, insert)| match insert {
        Insert::Soft { id, fast } if !is_control(i) => Some((code.block_of[i], (i, id, fast))),
        _ => None,
    }));
    probes.sort_by_key(|&(block, _)| block);
    let first = &mut bufs.first;
    first.clear();
    first.resize(code.blocks.len() + 1, 0);
    for &(block, _) in probes.iter() {
        first[block as usize + 1] += 1;
    }
    for b in 0..code.blocks.len() {
        first[b + 1] += first[b];
    }
    let probes_of = |b: usize| probes[first[b]..first[b + 1]].iter().map(|&(_, p)| p);
    // The block of the instruction at `addr`, a branch's end: looked for
    // first among the first instructions of the branch's block's
    // `successors` (where both ends of a branch inside the function are),
    // before a search of every instruction.
    let block_at = |addr: u64, successors: &[u32]| {
        let mut starting = (successors.iter()).map(|&s| code.blocks[s as usize].first as usize);
        (starting.find(|&i| code.instructions[i].ip() == addr))
            .or_else(|| code.instruction_at(addr))
            .map(|i| code.block_of[i] as usize)
    };
    let used = &mut bufs.used;
    used.clear();
    used.resize(code.blocks.len(), false);
    let mut superblocks = Vec::new();
    // The blocks of the superblock being formed (one buffer for all).
    let chain = &mut bufs.chain;
    for b in 0..code.blocks.len() {
        if used[b] {
            continue;
        }
        let Some((first_load, _, _)) = probes_of(b).next() else {
            continue;
        };
        let head = &code.blocks[b];
        let Some(at) = (head.first as usize..=first_load)
            .rev()
            .find(|&i| !live[i].has_flags())
        else {
            continue;
        };
        chain.clear();
        chain.push(b);
        loop {
            let current = &code.blocks[*chain.last().unwrap()];
            if current.terminator != crate::binary::Terminator::Conditional {
                break;
            }
            let branch = &code.instructions[current.last()];
            let Some(next) = block_at(branch.next_ip(), &current.successors) else {
                break;
            };
            let Some(taken) = block_at(branch.near_branch_target(), &current.successors) else {
                break;
            };
            let single_entry =
                code.blocks[next].predecessors[..] == [*chain.last().unwrap() as u32];
            if used[next] || chain.contains(&next) || !single_entry || taken == next {
                break;
            }
            if live[code.blocks[taken].first as usize].has_flags() {
                break;
            }
            chain.push(next);
        }
        // Trailing blocks without loads add nothing.
        while chain.len() > 1 && probes_of(*chain.last().unwrap()).next().is_none() {
            chain.pop();
        }
        // Counted before any list is made: most chains are dropped here.
        let load_count: usize = chain.iter().map(|&c| probes_of(c).len()).sum();
        if load_count < 2 || load_count > u16::MAX as usize {
            continue;
        }
        let mut loads = Vec::with_capacity(load_count);
        loads.extend(chain.iter().flat_map(|&c| probes_of(c)));
        let mut exits = Vec::with_capacity(chain.len() - 1);
        for (n, &c) in chain.iter().enumerate().take(chain.len() - 1) {
            let after: usize = chain[n + 1..].iter().map(|&x| probes_of(x).len()).sum();
            if after > 0 {
                exits.push((code.blocks[c].last(), after as u32));
            }
        }
        for &c in chain.iter() {
            used[c] = true;
        }
        superblocks.push(relocate::Superblock {
            at,
            last: code.blocks[*chain.last().unwrap()].last(),
            loads,
            exits,
        });
    }
    // `inserts` is sorted by instruction, and so is `counted`: one walk
    // along `counted` as `retain` goes along `inserts` (in order) finds
    // the counted loads, a search of it for every insert was most of
    // removing them.
    let counted = &mut bufs.counted;
    counted.clear();
    counted.extend(
        superblocks
            .iter()
            .flat_map(|b| b.loads.iter().map(|&(i, _, _)| i)),
    );
    counted.sort_unstable();
    debug_assert!(inserts.is_sorted_by_key(|&(i, _)| i));
    let mut next = 0;
    inserts.retain(|&(i, _)| {
        while counted.get(next).is_some_and(|&c| c < i) {
            next += 1;
        }
        counted.get(next) != Some(&i)
    });
    superblocks
}

/// The registers a probe may borrow, in the order it prefers them:
/// caller-saved first (RSP is never one).
const SCRATCH_CANDIDATES: [Register; 15] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
    Register::RBX,
    Register::RBP,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

/// How a spatial check before `load` keeps state, given what is live
/// before it: a dead register (never one of the load's operand registers,
/// which are live) and dead flags cost nothing to keep.
fn choose_spatial_probe(load: &iced_x86::Instruction, live: RegSet) -> probe::SpatialProbe {
    let save_flags = live.has_flags();
    let operand = [load.memory_base(), load.memory_index()].map(|r| {
        if r.is_gpr() {
            r.full_register()
        } else {
            Register::None
        }
    });
    let dead = SCRATCH_CANDIDATES
        .into_iter()
        .find(|&r| !live.has_gpr(r) && !operand.contains(&r));
    match dead {
        Some(scratch) => probe::SpatialProbe {
            scratch,
            save_scratch: false,
            save_flags,
        },
        None => probe::SpatialProbe {
            scratch: SCRATCH_CANDIDATES
                .into_iter()
                .find(|r| !operand.contains(r))
                .expect("a load names at most two registers"),
            save_scratch: true,
            save_flags,
        },
    }
}

/// The fast path for a load given what is live before it.
fn choose_fast_path(live: RegSet) -> FastPath {
    if !live.has_flags() {
        return FastPath::FlagsDead;
    }
    if !live.has_gpr(Register::RCX) {
        return FastPath::RcxDead;
    }
    for reg in SCRATCH_CANDIDATES {
        if reg != Register::RCX && !live.has_gpr(reg) {
            return FastPath::SaveIn(reg);
        }
    }
    FastPath::Stack
}

fn write_jump(editor: &mut ElfEditor<'_>, from: u64, to: u64) -> Result<(), RewriteError> {
    let rel = i32::try_from(to as i64 - (from as i64 + PATCH as i64))
        .map_err(|_| RewriteError::CopyOutOfReach { from, to })?;
    let mut patch = [0xe9, 0, 0, 0, 0];
    patch[1..].copy_from_slice(&rel.to_le_bytes());
    Ok(editor.patch(from, &patch)?)
}

/// Addresses where execution may enter the original body of a function:
/// branch and jump-table targets, return addresses, landing pads.
fn entry_points(
    code: &FunctionCode,
    eh_frame: Option<&unwind::EhFrame>,
    lsda_limit: &dyn Fn(u64) -> u64,
    read: &dyn Fn(u64, usize) -> Option<Vec<u8>>,
) -> BTreeSet<u64> {
    entry_points_in_any_order(code, eh_frame, lsda_limit, read).collect()
}

/// Whether execution may enter `code`'s original body within `range`
/// (one of its [`entry_points`]): the entry patch asks about its own few
/// bytes only, so the points are searched rather than collected, and the
/// landing pads read only when no branch or return lands there.
fn entered_within(
    code: &FunctionCode,
    eh_frame: Option<&unwind::EhFrame>,
    lsda_limit: &dyn Fn(u64) -> u64,
    read: &dyn Fn(u64, usize) -> Option<Vec<u8>>,
    range: std::ops::Range<u64>,
) -> bool {
    entry_points_in_any_order(code, eh_frame, lsda_limit, read).any(|point| range.contains(&point))
}

/// The [`entry_points`] as they are found, unsorted and possibly repeated;
/// an LSDA that cannot be read gives no landing pads.
fn entry_points_in_any_order<'a>(
    code: &'a FunctionCode,
    eh_frame: Option<&'a unwind::EhFrame>,
    lsda_limit: &'a dyn Fn(u64) -> u64,
    read: &'a dyn Fn(u64, usize) -> Option<Vec<u8>>,
) -> impl Iterator<Item = u64> + 'a {
    let landing_pads = eh_frame
        .into_iter()
        .flat_map(|frame| frame.fdes_within(code.start, code.end))
        .filter_map(move |fde| {
            let lsda = fde.lsda?;
            unwind::landing_pads(read, lsda, lsda_limit(lsda), fde.pc_begin).ok()
        })
        .flatten();
    (code.branch_targets.iter().copied())
        .chain(code.calls.iter().map(|call| call.return_address))
        .chain(landing_pads)
}

thread_local! {
    /// The worker thread's buffer for [`check_function`]'s trial
    /// translations of CFI, kept from one function to the next.
    static TRANSLATED_CFI: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether a function can be copied and patched; the reason if not.
fn check_function(
    binary: &Binary,
    f: &Function,
    code: &FunctionCode,
    eh_frame: Option<&unwind::EhFrame>,
    lsda_limit: &dyn Fn(u64) -> u64,
    read: &dyn Fn(u64, usize) -> Option<Vec<u8>>,
) -> std::result::Result<(), String> {
    if let Some(reason) = relocate::unrelocatable(code) {
        return Err(reason);
    }
    // The entry patch.
    if f.size < PATCH {
        let gap = binary
            .bytes_at(f.end(), (f.start + PATCH - f.end()) as usize)
            .ok_or("smaller than the 5-byte entry patch")?;
        let mut decoder = Decoder::with_ip(64, gap, f.end(), DecoderOptions::NONE);
        while decoder.can_decode() {
            let insn = decoder.decode();
            if !matches!(insn.mnemonic(), Mnemonic::Nop | Mnemonic::Int3) {
                return Err("smaller than the 5-byte entry patch".into());
            }
        }
        if (f.end()..f.start + PATCH).any(|a| binary.function_at(a).is_some()) {
            return Err("smaller than the 5-byte entry patch".into());
        }
    }
    if entered_within(
        code,
        eh_frame,
        lsda_limit,
        read,
        f.start + 1..f.start + PATCH,
    ) {
        return Err("a branch target lies within the first 5 bytes (entry patch)".into());
    }
    // Unwind information must translate (checked against an identity map
    // of the instruction boundaries, which the copy preserves). The
    // instructions are sorted by address: a search in them, not a set of
    // every function's boundaries built for a few lookups.
    if let Some(frame) = eh_frame {
        let identity = |a: u64| (a == code.end || code.instruction_at(a).is_some()).then_some(a);
        let first = frame
            .fdes_within(f.start, f.end())
            .next()
            .map(|fde| fde.pc_begin);
        if frame.covers(f.start) && first != Some(f.start) {
            return Err("an unwind entry spans this and other code".into());
        }
        for fde in frame.fdes_within(f.start, f.end()) {
            if fde.pc_end > f.end() {
                return Err("an unwind entry spans this and other code".into());
            }
            let cie = &frame.cies[fde.cie];
            TRANSLATED_CFI
                .with_borrow_mut(|cfi| {
                    unwind::translate_cfi(&fde.instructions, cie, fde.pc_begin, &identity, cfi)
                })
                .map_err(|e| format!("unwind information: {e}"))?;
            if let Some(lsda) = fde.lsda {
                unwind::translate_lsda(
                    read,
                    lsda,
                    lsda_limit(lsda),
                    fde.pc_begin,
                    binary.is_pie(),
                    &identity,
                    0x1000,
                )
                .map_err(|e| format!("exception table: {e}"))?;
            }
        }
        if first.is_some_and(|b| b != f.start) {
            return Err("unwind entries cover only part of the function".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::FlatMemory;

    #[test]
    fn loads_are_grouped_by_function_in_annotation_order() {
        let owners = [2u32, 0, 2, 7, 1, 0, u32::MAX, 2];
        let loads_of = LoadsOf::group(3, owners.into_iter());
        assert_eq!(loads_of.of(0), &[1, 5]);
        assert_eq!(loads_of.of(1), &[4]);
        assert_eq!(loads_of.of(2), &[0, 2, 7]);
        // Loads naming no function of the annotation belong to none.
        assert!(loads_of.of(3).is_empty());
        assert!(loads_of.of(7).is_empty());
    }

    /// [`AscendingSet`] answers as a hash set does, for lookups in
    /// ascending order, repeated, going back, and past either end.
    #[test]
    fn ascending_set_answers_as_a_hash_set() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || crate::binary::xorshift64(&mut state);
        let members: Vec<u64> = (0..2_000).map(|_| 100 + next() % 10_000).collect();
        let set: HashSet<u64> = members.iter().copied().collect();
        let mut ascending = AscendingSet::new(members);
        let mut lookups: Vec<u64> = (0..12_000).collect();
        // Then out of order, with repeats.
        lookups.extend((0..5_000).map(|_| next() % 10_200));
        lookups.extend([10_150, 10_150, 0, 99, 100, 10_099]);
        for ip in lookups {
            assert_eq!(ascending.contains(ip), set.contains(&ip), "{ip}");
        }
        assert!(!AscendingSet::new(Vec::new()).contains(5));
    }

    /// [`entered_within`] says what the collected [`entry_points`] say,
    /// for every window of a function whose branches and calls enter it
    /// at several places.
    #[test]
    fn entry_search_agrees_with_the_entry_points() {
        // 0: test edi, edi   2: je 9   4: call 9   9: jne 2   11: jmp 16
        // 13: nop nop nop   16: ret
        let bytes = [
            0x85, 0xff, 0x74, 0x05, 0xe8, 0x00, 0x00, 0x00, 0x00, 0x75, 0xf7, 0xeb, 0x03, 0x90,
            0x90, 0x90, 0xc3,
        ];
        let memory = FlatMemory {
            base: 0x1000,
            bytes: &bytes,
        };
        let code = FunctionCode::build(&bytes, 0x1000, &memory);
        let read = |_: u64, _: usize| None;
        let points = entry_points(&code, None, &|l| l, &read);
        assert!(points.len() >= 3, "{points:?}");
        for start in 0x1000..0x1000 + bytes.len() as u64 {
            for len in 1..=PATCH {
                let range = start..start + len;
                assert_eq!(
                    entered_within(&code, None, &|l| l, &read, range.clone()),
                    points.range(range.clone()).next().is_some(),
                    "{range:x?}"
                );
            }
        }
    }
}
