//! From PTW payloads to load-address records: the PT backend's trace.
//!
//! # The ptwrite convention (shared with the rewriter)
//!
//! In `--mode ptwrite` the rewriter inserts, before an instrumented load,
//! one `ptwrite r64` per source register of its memory operand: the base
//! register first, then the index register, always the full 64-bit
//! register. It lists every emitted `ptwrite` in
//! [`Annotation::ptwrites`] with its address in the instrumented binary,
//! the load and the operand. The collector sets `fup_on_ptw`, so each PTW
//! packet is followed by a FUP carrying the IP of its PTWRITE.
//!
//! The reconstruction maps that IP to a file address (subtracting the
//! load bias of the executable, from `PERF_RECORD_MMAP2`), looks up the
//! site, collects the operand values of one execution and computes
//!
//! ```text
//! address = base + index × scale + displacement      (wrapping, 64-bit)
//! ```
//!
//! masked to 32 bits when the operand uses 32-bit registers (address-size
//! override: the CPU wraps the address at 4 GiB; the payload is the full
//! 64-bit register, whose upper half the mask discards).
//!
//! Loads without a general-purpose source register (RIP-relative or
//! absolute operands, `fs:`/`gs:`-relative ones) have nothing to `ptwrite`:
//! the rewriter does not instrument them in ptwrite mode; a RIP-relative
//! Constant load is counted through its basic block's proxy (`implied`), as
//! in soft mode. An annotation that marks such a load instrumented is
//! rejected.
//!
//! # Spatial PTWs
//!
//! A Strided or Irregular load's spatial check (the block hash test of
//! docs/METRICS.md, "Whole-run locality") writes the load's whole address
//! with one more `ptwrite` in its stub, before the operand PTWs, when the
//! block is tracked; its site is marked [`PtwriteOperand::Address`]. Every
//! execution still writes its operands, so the time samples are exactly
//! what they are without the check. The spatial PTWs are counted
//! (`spatial_ptw`) and not recorded: an AUX sample keeps only the ring's
//! last bytes, so the spatial PTWs between samples are overwritten and the
//! ones inside a window would be a biased subset, and a full trace already
//! holds every address. Whole-run spatial records need a collection of the
//! spatial PTWs alone for the whole run (see ARCHITECTURE.md, Intel PT),
//! which is not written.
//!
//! # Samples and ρ
//!
//! Each AUX sample becomes one trace sample: the records decoded from its
//! first PSB on (the bytes before it are the torn head of the ring copy).
//! An overflow inside a sample cuts it: only the records after the last OVF
//! are a contiguous window; the ones before are dropped and counted. A
//! sample with no record is dropped and counted. `TraceTotals::executions`
//! holds the loads the sampling event counted, so the analysis computes
//! `ρ = executions / (A + A_const)` (docs/METRICS.md, PT backend).
//!
//! A full trace (no sampling event) is one sample: each CPU's stream is cut
//! at its PSBs and the pieces are merged in TSC order.

use super::collect::{Collection, Mapping};
use super::decode::{Decoder, Event};
use super::error::{AnnotationProblem, Context, PtError, Result};
use super::ring::Losses;
use memgaze_metadata::annotation::{Annotation, InstrumentationMode, PtwriteOperand};
use memgaze_trace::{
    Backend, Dropped, FunctionEntry, LoadEntry, ProgramExit, Sampling, TraceHeader, TraceTotals,
    TraceWriter,
};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// How one instrumented load's operand is rebuilt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Operand {
    has_base: bool,
    has_index: bool,
    scale: u64,
    displacement: i64,
    address_mask: u64,
}

impl Operand {
    fn address(&self, base: u64, index: u64) -> u64 {
        base.wrapping_add(index.wrapping_mul(self.scale))
            .wrapping_add(self.displacement as u64)
            & self.address_mask
    }
}

/// Whether a register name (iced-x86, lower case) is a 32-bit GPR.
fn is_32bit_gpr(name: &str) -> bool {
    matches!(
        name,
        "eax" | "ebx" | "ecx" | "edx" | "esi" | "edi" | "ebp" | "esp"
    ) || (name.starts_with('r')
        && name.ends_with('d')
        && name[1..name.len() - 1].parse::<u8>().is_ok())
}

/// Whether a register name is a general-purpose register `ptwrite` can write.
fn is_gpr(name: &str) -> bool {
    const GPR64: [&str; 16] = [
        "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12",
        "r13", "r14", "r15",
    ];
    GPR64.contains(&name) || is_32bit_gpr(name)
}

/// The `ptwrite` sites of an annotation, ready for lookups.
#[derive(Clone, Debug)]
pub struct PtwriteMap {
    sites: HashMap<u64, (u32, PtwriteOperand)>,
    operands: Vec<Option<Operand>>,
}

impl PtwriteMap {
    /// Checks the annotation's ptwrite sites against its loads.
    pub fn new(annotation: &Annotation) -> Result<PtwriteMap> {
        if annotation.mode != Some(InstrumentationMode::Ptwrite) {
            return Err(AnnotationProblem::NotPtwriteMode {
                mode: format!("{:?}", annotation.mode),
            }
            .into());
        }
        let mut operands = vec![None; annotation.loads.len()];
        for (index, load) in annotation.loads.iter().enumerate() {
            if load.id as usize != index {
                return Err(AnnotationProblem::IdNotPosition { index, id: load.id }.into());
            }
            if !load.instrumented {
                continue;
            }
            let base = load.base.as_deref().filter(|b| is_gpr(b));
            let index_reg = load.index.as_deref().filter(|i| is_gpr(i));
            if !(base.is_some() || index_reg.is_some()) {
                return Err(AnnotationProblem::NoSourceRegister {
                    id: load.id,
                    ip: load.ip,
                    base: format!("{:?}", load.base),
                    index: format!("{:?}", load.index),
                }
                .into());
            }
            if !(matches!(load.scale, 1 | 2 | 4 | 8) || index_reg.is_none()) {
                return Err(AnnotationProblem::BadScale {
                    id: load.id,
                    ip: load.ip,
                    scale: load.scale,
                }
                .into());
            }
            let addr32 = base.is_some_and(is_32bit_gpr) || index_reg.is_some_and(is_32bit_gpr);
            operands[index] = Some(Operand {
                has_base: base.is_some(),
                has_index: index_reg.is_some(),
                scale: u64::from(load.scale.max(1)),
                displacement: load.displacement,
                address_mask: if addr32 { 0xffff_ffff } else { u64::MAX },
            });
        }
        let mut sites = HashMap::with_capacity(annotation.ptwrites.len());
        let mut seen = vec![(false, false); annotation.loads.len()];
        for site in &annotation.ptwrites {
            let Some(Some(operand)) = operands.get(site.load as usize) else {
                return Err(AnnotationProblem::UnknownLoad {
                    ip: site.ip,
                    load: site.load,
                }
                .into());
            };
            let valid = match site.operand {
                PtwriteOperand::Base => operand.has_base,
                PtwriteOperand::Index => operand.has_index,
                PtwriteOperand::Address => true,
            };
            if !valid {
                return Err(AnnotationProblem::NoSuchOperand {
                    ip: site.ip,
                    operand: format!("{:?}", site.operand),
                    load: site.load,
                }
                .into());
            }
            let seen = &mut seen[site.load as usize];
            match site.operand {
                PtwriteOperand::Base => seen.0 = true,
                PtwriteOperand::Index => seen.1 = true,
                PtwriteOperand::Address => {}
            }
            if sites.insert(site.ip, (site.load, site.operand)).is_some() {
                return Err(AnnotationProblem::DuplicateSite { ip: site.ip }.into());
            }
        }
        for (index, operand) in operands.iter().enumerate() {
            if let Some(op) = operand
                && seen[index] != (op.has_base, op.has_index)
            {
                return Err(AnnotationProblem::MissingSite {
                    load: index,
                    ip: annotation.loads[index].ip,
                    operand: if op.has_base && !seen[index].0 {
                        "base"
                    } else {
                        "index"
                    },
                }
                .into());
            }
        }
        Ok(PtwriteMap { sites, operands })
    }
}

/// Maps runtime code addresses of the instrumented executable to its file
/// (link-time) addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CodeMap {
    /// `(runtime start, runtime end, runtime − file)`.
    ranges: Vec<(u64, u64, u64)>,
}

impl CodeMap {
    /// The whole executable was loaded `bias` bytes above its link address.
    pub fn with_bias(bias: u64) -> CodeMap {
        CodeMap {
            ranges: vec![(0, u64::MAX, bias)],
        }
    }

    /// From the executable mappings of `binary` in process `pid`
    /// (`PERF_RECORD_MMAP2`) and the binary's program headers.
    pub(crate) fn from_mappings(
        mappings: &[Mapping],
        pid: u32,
        binary: &Path,
        elf: &[u8],
    ) -> Result<CodeMap> {
        let parsed = goblin::elf::Elf::parse(elf)
            .with_context(|| format!("{}: not an ELF file", binary.display()))?;
        let canonical = std::fs::canonicalize(binary).unwrap_or_else(|_| binary.to_path_buf());
        let loads: Vec<_> = parsed
            .program_headers
            .iter()
            .filter(|p| p.p_type == goblin::elf::program_header::PT_LOAD)
            .collect();
        let mut ranges = Vec::new();
        for m in mappings {
            let same_file = Path::new(&m.filename) == canonical || Path::new(&m.filename) == binary;
            if m.pid != pid || !same_file || m.prot & libc::PROT_EXEC as u32 == 0 {
                continue;
            }
            for seg in &loads {
                // File offsets this mapping covers that belong to the segment.
                let lo = m.pgoff.max(seg.p_offset);
                let hi = (m.pgoff + m.len).min(seg.p_offset + seg.p_filesz);
                if lo >= hi {
                    continue;
                }
                let runtime = m.addr + (lo - m.pgoff);
                let file = seg.p_vaddr + (lo - seg.p_offset);
                ranges.push((runtime, runtime + (hi - lo), runtime.wrapping_sub(file)));
            }
        }
        if ranges.is_empty() {
            return Err(PtError::NoExecutableMapping {
                binary: binary.to_path_buf(),
                pid,
            });
        }
        ranges.sort_unstable();
        Ok(CodeMap { ranges })
    }

    /// The file address of runtime address `ip`, if it is in the executable.
    pub(crate) fn to_file(&self, ip: u64) -> Option<u64> {
        let i = self.ranges.partition_point(|r| r.0 <= ip);
        let &(start, end, bias) = self.ranges.get(i.checked_sub(1)?)?;
        (start <= ip && ip < end).then(|| ip.wrapping_sub(bias))
    }
}

/// One reconstructed load execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PtRecord {
    /// [`memgaze_metadata::annotation::LoadSite::id`] (= trace header load index).
    pub load: u32,
    /// Effective address.
    pub addr: u64,
}

/// What the reconstruction saw and could not use; every count ends up in
/// the trace's totals or labels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReconstructStats {
    /// PTW packets decoded.
    pub ptw: u64,
    /// Records produced.
    pub(crate) records: u64,
    /// PTWs without an IP (no FUP): unattributable.
    pub ptw_without_ip: u64,
    /// PTWs whose IP is not a ptwrite site of the instrumented binary.
    pub ptw_unknown_ip: u64,
    /// Executions missing one of their operands (e.g. the base PTW fell
    /// before the sample's first PSB).
    pub incomplete: u64,
    /// Records before an overflow in a sample, dropped.
    pub dropped_before_overflow: u64,
    /// OVF packets.
    pub(crate) overflows: u64,
    /// Decode errors.
    pub decode_errors: u64,
    /// Bytes skipped after decode errors.
    pub(crate) skipped_after_errors: u64,
    /// Bytes before the first PSB of each buffer (AUX samples start mid-stream).
    pub unsynced_head_bytes: u64,
    /// PTWs of spatial checks ([`PtwriteOperand::Address`]): counted, not
    /// recorded (see "Spatial PTWs" in the module documentation).
    pub spatial_ptw: u64,
}

impl ReconstructStats {
    /// PTW payloads that did not become records.
    pub fn lost_ptw(&self) -> u64 {
        self.ptw_without_ip + self.ptw_unknown_ip + self.incomplete + self.dropped_before_overflow
    }
}

/// Decodes PT buffers into records for one instrumented binary.
pub struct Reconstructor<'a> {
    map: &'a PtwriteMap,
    code: &'a CodeMap,
    /// Counts so far.
    pub stats: ReconstructStats,
}

/// The records between two sync points (PSB or OVF) of a buffer.
#[derive(Default)]
struct Piece {
    /// The TSC of its first PTW (orders full-trace pieces across CPUs).
    tsc: Option<u64>,
    /// It starts right after an overflow: nothing before it is contiguous.
    after_overflow: bool,
    records: Vec<PtRecord>,
}

impl<'a> Reconstructor<'a> {
    /// A reconstructor over `map` with IPs translated by `code`.
    pub fn new(map: &'a PtwriteMap, code: &'a CodeMap) -> Reconstructor<'a> {
        Reconstructor {
            map,
            code,
            stats: ReconstructStats::default(),
        }
    }

    /// Decodes `data` into pieces split at every PSB (and at overflows).
    fn pieces(&mut self, data: &[u8]) -> Vec<Piece> {
        let mut pieces: Vec<Piece> = Vec::new();
        let mut pending: Option<(u32, u64)> = None;
        let mut decoder = Decoder::new(data);
        let mut head_bytes: Option<u64> = None;
        let mut current = Piece::default();
        decoder.for_each_event(|event| {
            match event {
                Event::Sync { offset } => {
                    head_bytes.get_or_insert(offset as u64);
                    pieces.push(std::mem::take(&mut current));
                }
                Event::Overflow { .. } => {
                    self.stats.overflows += 1;
                    if pending.take().is_some() {
                        self.stats.incomplete += 1;
                    }
                    pieces.push(std::mem::take(&mut current));
                    current.after_overflow = true;
                }
                Event::Error(_) => {
                    self.stats.decode_errors += 1;
                    if pending.take().is_some() {
                        self.stats.incomplete += 1;
                    }
                }
                Event::Ptw(ptw) => {
                    self.stats.ptw += 1;
                    if current.tsc.is_none() {
                        current.tsc = ptw.tsc;
                    }
                    let Some(ip) = ptw.ip else {
                        self.stats.ptw_without_ip += 1;
                        return;
                    };
                    let site = self.code.to_file(ip).and_then(|f| self.map.sites.get(&f));
                    let Some(&(load, operand)) = site else {
                        self.stats.ptw_unknown_ip += 1;
                        return;
                    };
                    let Some(op) = self.map.operands[load as usize] else {
                        self.stats.ptw_unknown_ip += 1;
                        return;
                    };
                    match operand {
                        PtwriteOperand::Address => self.stats.spatial_ptw += 1,
                        PtwriteOperand::Base => {
                            if pending.take().is_some() {
                                self.stats.incomplete += 1;
                            }
                            if op.has_index {
                                pending = Some((load, ptw.payload));
                            } else {
                                current.records.push(PtRecord {
                                    load,
                                    addr: op.address(ptw.payload, 0),
                                });
                            }
                        }
                        PtwriteOperand::Index => match pending.take() {
                            Some((pending_load, base)) if pending_load == load => {
                                current.records.push(PtRecord {
                                    load,
                                    addr: op.address(base, ptw.payload),
                                });
                            }
                            other => {
                                if other.is_some() {
                                    self.stats.incomplete += 1;
                                }
                                if op.has_base {
                                    // Its base PTW is missing.
                                    self.stats.incomplete += 1;
                                } else {
                                    current.records.push(PtRecord {
                                        load,
                                        addr: op.address(0, ptw.payload),
                                    });
                                }
                            }
                        },
                    }
                }
            }
        });
        if pending.is_some() {
            self.stats.incomplete += 1;
        }
        // The decoder's skipped bytes include the head before the first PSB,
        // which is expected of an AUX sample rather than damage.
        let head = head_bytes.unwrap_or(data.len() as u64);
        self.stats.unsynced_head_bytes += head;
        self.stats.skipped_after_errors += decoder.stats().skipped_bytes.saturating_sub(head);
        pieces.push(current);
        pieces
    }

    /// The records of one AUX sample: everything after its last overflow.
    pub fn sample(&mut self, data: &[u8]) -> Vec<PtRecord> {
        let pieces = self.pieces(data);
        let cut = pieces.iter().rposition(|p| p.after_overflow).unwrap_or(0);
        let dropped: usize = pieces[..cut].iter().map(|p| p.records.len()).sum();
        self.stats.dropped_before_overflow += dropped as u64;
        let records: Vec<PtRecord> = pieces[cut..]
            .iter()
            .flat_map(|p| p.records.iter().copied())
            .collect();
        self.stats.records += records.len() as u64;
        records
    }

    /// The records of full per-CPU streams, merged in TSC order of their
    /// PSB-delimited pieces (overflows leave gaps but keep the rest).
    pub fn full(&mut self, streams: &[&[u8]]) -> Vec<PtRecord> {
        let mut pieces: Vec<Piece> = Vec::new();
        for stream in streams {
            pieces.extend(
                self.pieces(stream)
                    .into_iter()
                    .filter(|p| !p.records.is_empty()),
            );
        }
        // Stable: pieces without a TSC keep their stream order.
        pieces.sort_by_key(|p| p.tsc.unwrap_or(0));
        let records: Vec<PtRecord> = pieces.into_iter().flat_map(|p| p.records).collect();
        self.stats.records += records.len() as u64;
        records
    }
}

/// The trace header of a PT recording of a ptwrite-instrumented binary.
pub fn pt_trace_header(
    annotation: &Annotation,
    sampling: Sampling,
    command: Vec<String>,
) -> TraceHeader {
    let functions = annotation
        .functions
        .iter()
        .map(|f| FunctionEntry {
            name: f.name.clone(),
            start: f.start,
            end: f.start + f.size,
        })
        .collect();
    let index_of_ip: HashMap<u64, u32> = annotation.loads.iter().map(|l| (l.ip, l.id)).collect();
    let loads = annotation
        .loads
        .iter()
        .map(|l| LoadEntry {
            ip: l.ip,
            class: l.class,
            implied: l.implied,
            function: Some(l.function),
            line: l.line.as_deref().map(str::to_string),
            proxy: l.proxy.and_then(|ip| index_of_ip.get(&ip.get()).copied()),
        })
        .collect();
    TraceHeader {
        backend: Backend::Pt,
        sampling,
        binary: Some(annotation.binary.clone()),
        command,
        functions,
        loads,
        labels: crate::shared_library_labels(annotation),
        spatial: None,
    }
}

/// One decoded sample, ready to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedSample {
    /// Trace thread id (small integer).
    pub thread: u32,
    /// Its records.
    pub records: Vec<PtRecord>,
}

/// What [`write_trace`] needs besides the samples.
#[derive(Clone, Debug)]
pub struct TraceFacts {
    /// Header (sampling `window` is filled in from the samples when sampled).
    pub header: TraceHeader,
    /// ρ's numerator: loads counted by the sampling event (ignored for a
    /// full trace, whose numerator is its record count).
    pub executions: u64,
    /// Kernel-reported losses.
    pub losses: Losses,
    /// Reconstruction counts.
    pub stats: ReconstructStats,
    /// Samples dropped before writing (no record in them).
    pub empty_samples: u64,
    /// How the program ended.
    pub exit: Option<ProgramExit>,
}

/// Writes the trace; returns its totals.
pub fn write_trace<W: Write>(
    out: W,
    samples: &[DecodedSample],
    facts: TraceFacts,
) -> Result<(W, TraceTotals)> {
    let mut header = facts.header;
    let full = header.sampling.is_full();
    if !full {
        // `w`: the median records per sample (AUX samples vary in length).
        let mut lengths: Vec<u64> = samples.iter().map(|s| s.records.len() as u64).collect();
        lengths.sort_unstable();
        let median = lengths.get(lengths.len() / 2).copied().unwrap_or(0).max(1);
        // Strictly below the period: `window == period` means a full trace.
        header.sampling.window = median.min(header.sampling.period.saturating_sub(1)).max(1);
    }
    let s = &facts.stats;
    let l = &facts.losses;
    for (key, value) in [
        ("pt.ptw", s.ptw),
        ("pt.ptw_without_ip", s.ptw_without_ip),
        ("pt.ptw_unknown_ip", s.ptw_unknown_ip),
        ("pt.incomplete_executions", s.incomplete),
        (
            "pt.records_dropped_before_overflow",
            s.dropped_before_overflow,
        ),
        ("pt.overflows", s.overflows),
        ("pt.decode_errors", s.decode_errors),
        ("pt.unsynced_head_bytes", s.unsynced_head_bytes),
        ("pt.empty_samples", facts.empty_samples),
        ("perf.lost_records", l.lost_records),
        ("perf.lost_samples", l.lost_samples),
        ("perf.aux_truncated", l.aux_truncated),
        ("perf.aux_overwrite", l.aux_overwrite),
        ("perf.aux_partial", l.aux_partial),
        ("perf.aux_collision", l.aux_collision),
    ] {
        header.labels.push((key.to_string(), value.to_string()));
    }
    let mut writer = TraceWriter::new(out, &header)?;
    for sample in samples {
        writer.begin_sample(sample.thread)?;
        for r in &sample.records {
            writer.push(r.load, r.addr)?;
        }
    }
    let records = writer.records();
    let gaps = if full { l.full_trace_gaps() } else { 0 };
    let totals = TraceTotals {
        spatial_records: 0,
        executions: if full {
            // ρ = 1 for a full trace: the numerator is its own size.
            records
                + samples
                    .iter()
                    .flat_map(|s| &s.records)
                    .map(|r| u64::from(header.loads[r.load as usize].implied))
                    .sum::<u64>()
        } else {
            facts.executions
        },
        records,
        samples: writer.samples(),
        dropped: Dropped {
            records: s.lost_ptw(),
            samples: l.lost_records + l.lost_samples + facts.empty_samples + gaps,
            bytes: s.skipped_after_errors,
        },
        exit: facts.exit,
        complete: true,
        interrupted: None,
        escapes: Vec::new(),
        escape_counts_missing: 0,
        execs_untraced: 0,
        execs_untraced_micros: 0,
    };
    let out = writer.finish(&totals)?;
    Ok((out, totals))
}

/// Sampled or full, as the trace will say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TraceKind {
    /// AUX samples every `period` loads.
    Sampled {
        /// The load event's period.
        period: u64,
        /// The sampling jitter seed, if any.
        seed: Option<u64>,
    },
    /// The whole stream.
    Full,
}

/// Turns a [`Collection`] of a ptwrite-instrumented program into a trace:
/// the entry point `record --backend pt` uses after [`super::collect::collect`].
pub(crate) fn trace_from_collection<W: Write>(
    out: W,
    annotation: &Annotation,
    instrumented: &Path,
    collection: &Collection,
    kind: TraceKind,
    command: Vec<String>,
) -> Result<(W, TraceTotals, ReconstructStats)> {
    let map = PtwriteMap::new(annotation)?;
    let elf = std::fs::read(instrumented).with_context(|| format!("{}", instrumented.display()))?;
    let code = CodeMap::from_mappings(&collection.mappings, collection.pid, instrumented, &elf)?;
    let mut rebuild = Reconstructor::new(&map, &code);
    let (sampling, samples, empty) = match kind {
        TraceKind::Full => {
            let streams: Vec<&[u8]> = collection
                .streams
                .iter()
                .map(|s| s.data.as_slice())
                .collect();
            let records = rebuild.full(&streams);
            (
                Sampling::full(),
                vec![DecodedSample { thread: 0, records }],
                0,
            )
        }
        TraceKind::Sampled { period, seed } => {
            let mut ordered: Vec<&super::collect::AuxSample> = collection.samples.iter().collect();
            ordered.sort_by_key(|s| s.time);
            let mut threads: HashMap<u32, u32> = HashMap::new();
            let mut samples = Vec::with_capacity(ordered.len());
            let mut empty = 0;
            for aux in ordered {
                let records = rebuild.sample(&aux.data);
                if records.is_empty() {
                    empty += 1;
                    continue;
                }
                let next = threads.len() as u32;
                let thread = *threads.entry(aux.tid).or_insert(next);
                samples.push(DecodedSample { thread, records });
            }
            let sampling = Sampling {
                window: 1,
                period,
                seed,
            };
            (sampling, samples, empty)
        }
    };
    let executions = collection.loads.map_or(0, |l| l.estimate());
    let stats = rebuild.stats;
    let mut header = pt_trace_header(annotation, sampling, command);
    if let Some(loads) = collection.loads {
        header
            .labels
            .push(("perf.loads_counted".into(), loads.value.to_string()));
        header.labels.push((
            "perf.loads_time_enabled_ns".into(),
            loads.time_enabled.to_string(),
        ));
        header.labels.push((
            "perf.loads_time_running_ns".into(),
            loads.time_running.to_string(),
        ));
    }
    let (out, totals) = write_trace(
        out,
        &samples,
        TraceFacts {
            header,
            executions,
            losses: collection.losses,
            stats,
            empty_samples: empty,
            exit: collection.exit,
        },
    )?;
    Ok((out, totals, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_widths() {
        assert!(is_32bit_gpr("eax") && is_32bit_gpr("r10d") && is_32bit_gpr("esp"));
        assert!(!is_32bit_gpr("rax") && !is_32bit_gpr("r10") && !is_32bit_gpr("rd"));
        assert!(is_gpr("r15") && is_gpr("r8d") && !is_gpr("rip") && !is_gpr("xmm0"));
    }

    #[test]
    fn operand_arithmetic_wraps_and_masks() {
        let op = Operand {
            has_base: true,
            has_index: true,
            scale: 8,
            displacement: -16,
            address_mask: u64::MAX,
        };
        assert_eq!(op.address(0x1000, 3), 0x1000 + 24 - 16);
        let op32 = Operand {
            address_mask: 0xffff_ffff,
            ..op
        };
        // The payload is the full register: its upper half must not leak.
        assert_eq!(op32.address(0xdead_0000_ffff_fff0, 4), 0);
        assert_eq!(op32.address(0xdead_0000_0000_1000, 4), 0x1010);
    }

    #[test]
    fn code_map_from_the_mappings_of_a_real_elf() {
        let exe = std::env::current_exe().unwrap();
        let elf_bytes = std::fs::read(&exe).unwrap();
        let elf = goblin::elf::Elf::parse(&elf_bytes).unwrap();
        let text = elf
            .program_headers
            .iter()
            .find(|p| p.p_type == goblin::elf::program_header::PT_LOAD && p.is_executable())
            .unwrap();
        // What the kernel reports for a PIE loaded at 0x5555_5555_0000: the
        // page-aligned file range of the segment at its page-aligned vaddr.
        let bias = 0x5555_5555_0000u64;
        let page_off = text.p_offset & !0xfff;
        let mapping = Mapping {
            pid: 7,
            addr: bias + (text.p_vaddr & !0xfff),
            len: (text.p_offset + text.p_filesz - page_off + 0xfff) & !0xfff,
            pgoff: page_off,
            prot: (libc::PROT_READ | libc::PROT_EXEC) as u32,
            filename: exe.display().to_string(),
        };
        let data = Mapping {
            prot: libc::PROT_READ as u32,
            ..mapping.clone()
        };
        let map = CodeMap::from_mappings(&[data, mapping.clone()], 7, &exe, &elf_bytes).unwrap();
        let ip = text.p_vaddr + text.p_filesz / 2;
        assert_eq!(map.to_file(bias + ip), Some(ip));
        assert_eq!(map.to_file(0x10), None);
        // Another process's mappings do not count.
        assert!(CodeMap::from_mappings(&[mapping], 8, &exe, &elf_bytes).is_err());
    }
}
