//! `cargo memgaze classify`: the binary analysis alone.
//!
//! Lists the functions of an executable with their loads by class and the
//! proxy-compression ratio, and (with `--functions`) every load with the
//! reason for its class, so a user can see *why* a load counts as strided
//! or irregular.

use super::style::styled_eprintln;
use super::{Format, Global};
use globset::{Glob, GlobSet, GlobSetBuilder};
use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};
use memgaze_error::Exit;
use memgaze_instrument::binary::{Binary, Function};
use memgaze_instrument::classify::{self, BinaryLoads, ClassifiedLoad, FunctionLoads};
use memgaze_metadata::classify::{self as doc, CLASSIFY_SCHEMA};
use memgaze_trace::LoadClass;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

/// Arguments of `cargo memgaze classify`.
#[derive(clap::Args, Debug)]
#[command(
    long_about = "Show the functions of an x86-64 executable and the class of every load: \
Constant (stack or global scalars), Strided (addresses that follow a loop induction variable) \
or Irregular (everything else, e.g. addresses loaded from memory). Also shows which loads \
carry a probe after basic-block proxy compression and the resulting compression ratio \
(all loads / instrumented loads).\n\nWithout --functions the table lists one row per function; \
with --functions it also lists each load, the instruction, and why it got its class."
)]
pub struct Args {
    /// The executable (x86-64 ELF, PIE or not).
    #[arg(value_name = "ELF")]
    pub elf: PathBuf,
    /// Only functions whose name (demangled or raw) matches this glob,
    /// e.g. `'*matmul*'`. May be repeated.
    #[arg(long = "functions", value_name = "GLOB")]
    pub functions: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Builds the function filter from `--functions` globs.
pub fn function_filter(globs: &[String]) -> anyhow::Result<Option<GlobSet>> {
    if globs.is_empty() {
        return Ok(None);
    }
    let mut builder = GlobSetBuilder::new();
    for g in globs {
        builder.add(Glob::new(g).map_err(|e| {
            memgaze_error::usage::<anyhow::Error>(format!("--functions {g:?}: {e}"))
        })?);
    }
    Ok(Some(builder.build()?))
}

/// Whether a function passes the filter (its demangled or raw name).
pub fn selected(filter: Option<&GlobSet>, f: &Function) -> bool {
    filter.is_none_or(|set| {
        set.is_match(&f.name) || f.raw_name.as_deref().is_some_and(|r| set.is_match(r))
    })
}

/// Runs the command.
pub fn run(args: Args, global: &Global) -> anyhow::Result<Exit> {
    let filter = function_filter(&args.functions)?;
    let binary = Binary::open(&args.elf)?;
    if binary.is_instrumented() && !global.quiet {
        // Its functions begin with the jump to their copies: the classes
        // describe patched code, not the program.
        styled_eprintln!(
            "warning: {} is instrumented by cargo memgaze: its functions' entries jump to their copies, so classify the original binary",
            args.elf.display()
        );
    }
    let loads = classify::classify_binary(&binary, |f| selected(filter.as_ref(), f));
    if loads.functions.is_empty() && filter.is_some() {
        anyhow::bail!(
            "{}: no function matches --functions {} ({} functions in the file)",
            args.elf.display(),
            args.functions.join(" --functions "),
            binary.functions().len()
        );
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = match args.format {
        Format::Json => write_json(&binary, &loads, &mut out)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n")),
        Format::Table => out.write_all(table(&binary, &loads, filter.is_some(), global).as_bytes()),
    };
    match written.and_then(|()| out.flush()) {
        // A closed pipe (`| head`) is not an error worth reporting.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("cannot write the output"))
        }
        _ => Ok(Exit::Ok),
    }
}

fn hex(v: u64) -> String {
    format!("{v:#x}")
}

/// The load instruction at `ip`, as text, and why no probe can trace it
/// (as `instrument` reports it: a gather, a `gs:` source), if none can.
fn load_instruction(binary: &Binary, ip: u64, len: u8) -> (String, Option<&'static str>) {
    let Some(insn) = decode(binary, ip, len) else {
        return (String::new(), None);
    };
    let untraceable = memgaze_instrument::rewrite::probe::unsupported_operand(&insn);
    (instruction_text(&insn), untraceable)
}

fn decode(binary: &Binary, ip: u64, len: u8) -> Option<iced_x86::Instruction> {
    let bytes = binary.bytes_at(ip, len as usize)?;
    Some(Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE).decode())
}

/// The loads of `f` that carry a probe that traces them: the classifier's
/// instrumented loads less those no probe can trace (gathers, `gs:`
/// sources), which `instrument` leaves unprobed and the per-load rows list
/// as `probe no`. The `probes` and `kappa` columns count these.
fn probes(binary: &Binary, f: &FunctionLoads) -> usize {
    f.loads
        .iter()
        .filter(|l| {
            l.instrumented
                && decode(binary, l.operand.ip, l.operand.len).is_none_or(|insn| {
                    memgaze_instrument::rewrite::probe::unsupported_operand(&insn).is_none()
                })
        })
        .count()
}

fn instruction_text(insn: &iced_x86::Instruction) -> String {
    let mut text = String::new();
    let mut formatter = IntelFormatter::new();
    formatter
        .options_mut()
        .set_space_after_operand_separator(true);
    formatter.format(insn, &mut text);
    text
}

fn counts(f: &FunctionLoads) -> doc::LoadCounts {
    doc::LoadCounts {
        constant: f.count(LoadClass::Constant),
        irregular: f.count(LoadClass::Irregular),
        strided: f.count(LoadClass::Strided),
        total: f.loads.len(),
    }
}

fn reg_name(r: iced_x86::Register) -> Option<String> {
    (r != iced_x86::Register::None).then(|| format!("{r:?}").to_lowercase())
}

fn load_row(binary: &Binary, function: &Function, l: &ClassifiedLoad) -> doc::LoadRow {
    let op = &l.operand;
    let (instruction, untraceable) = load_instruction(binary, op.ip, op.len);
    let mut reason = l.reason.to_string();
    if let Some(why) = untraceable {
        reason.push_str(&format!("; not traced: {why}"));
    }
    doc::LoadRow {
        base: reg_name(op.base),
        class: l.class,
        displacement: op.displacement as i64,
        function: function.name.clone(),
        gather: op.gather,
        implied: !l.instrumented,
        implies: l.implied,
        index: reg_name(op.index),
        instruction,
        instrumented: l.instrumented && untraceable.is_none(),
        ip: op.ip,
        line: binary.location(op.ip).map(|s| s.to_string()),
        loop_depth: l.loop_depth,
        proxy: l.proxy,
        read_modify_write: op.read_modify_write,
        reason,
        scale: op.scale,
        segment: reg_name(op.segment),
        size: op.size,
    }
}

/// Loads per reason kind, e.g. how many Irregular loads are outside loops.
fn reasons(loads: &BinaryLoads) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for (_, f) in &loads.functions {
        for l in &f.loads {
            *out.entry(l.reason.kind().to_string()).or_insert(0) += 1;
        }
    }
    out
}

fn function_row(binary: &Binary, function: &Function, f: &FunctionLoads) -> doc::FunctionRow {
    let probes = probes(binary, f);
    doc::FunctionRow {
        blocks: f.blocks,
        compression_ratio: classify::ratio(f.loads.len(), probes),
        instrumented: probes,
        jump_tables: f.jump_tables,
        loads: counts(f),
        loops: f.loops,
        name: function.name.clone(),
        raw_name: function.raw_name.clone(),
        size: function.size,
        source: function.source.as_str().to_string(),
        stack_loads: f.stack_loads,
        start: function.start,
        string_loads: f.string_loads,
        unresolved_indirect_jumps: f.unresolved_indirect_jumps,
    }
}

/// The JSON document (`memgaze.classify.v1`), serialised as it is written:
/// `functions` and `loads` are produced element by element, so a large
/// binary's millions of loads never sit in memory as one tree.
struct Document<'a> {
    binary: &'a Binary,
    loads: &'a BinaryLoads,
}

struct Functions<'a>(&'a Document<'a>);
struct Loads<'a>(&'a Document<'a>);

impl serde::Serialize for Functions<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let d = self.0;
        s.collect_seq(
            d.loads
                .functions
                .iter()
                .map(|(i, f)| function_row(d.binary, &d.binary.functions()[*i], f)),
        )
    }
}

impl serde::Serialize for Loads<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let d = self.0;
        s.collect_seq(d.loads.functions.iter().flat_map(|(i, f)| {
            let function = &d.binary.functions()[*i];
            f.loads.iter().map(move |l| load_row(d.binary, function, l))
        }))
    }
}

impl serde::Serialize for Document<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let totals = self.loads.totals();
        let probes = total_probes(self.binary, self.loads);
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("schema", CLASSIFY_SCHEMA)?;
        m.serialize_entry("binary", self.binary.identity())?;
        m.serialize_entry("kind", &self.binary.kind())?;
        m.serialize_entry("discovery", self.binary.discovery())?;
        m.serialize_entry("has_lines", &self.binary.has_lines())?;
        m.serialize_entry(
            "summary",
            &doc::Summary {
                constant: totals.constant,
                irregular: totals.irregular,
                strided: totals.strided,
                compression_ratio: classify::ratio(totals.loads, probes),
                functions: totals.functions,
                instrumented: probes,
                jump_tables: totals.jump_tables,
                loads: totals.loads,
                reasons: reasons(self.loads),
                stack_loads: totals.stack_loads,
                string_loads: totals.string_loads,
                tls: totals.tls,
                unresolved_indirect_jumps: totals.unresolved_indirect_jumps,
            },
        )?;
        m.serialize_entry("functions", &Functions(self))?;
        m.serialize_entry("loads", &Loads(self))?;
        m.end()
    }
}

/// [`probes`] over every function.
fn total_probes(binary: &Binary, loads: &BinaryLoads) -> usize {
    loads.functions.iter().map(|(_, f)| probes(binary, f)).sum()
}

/// Writes the JSON document (`memgaze.classify.v1`) to `out`.
pub fn write_json(
    binary: &Binary,
    loads: &BinaryLoads,
    out: impl std::io::Write,
) -> serde_json::Result<()> {
    serde_json::to_writer_pretty(out, &Document { binary, loads })
}

/// Shortens a source path for a table: relative to the current directory
/// when under it.
fn short_path(line: &str) -> String {
    if let Ok(cwd) = std::env::current_dir() {
        let prefix = format!("{}/", cwd.display());
        if let Some(rest) = line.strip_prefix(&prefix) {
            return rest.to_string();
        }
    }
    line.to_string()
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

fn table(binary: &Binary, loads: &BinaryLoads, per_load: bool, global: &Global) -> String {
    let totals = loads.totals();
    let d = binary.discovery();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}: {}, {} functions ({}), DWARF lines: {}",
        binary.path().display(),
        match binary.kind() {
            memgaze_instrument::binary::ExecutableKind::Pie => "PIE executable",
            memgaze_instrument::binary::ExecutableKind::Fixed => "executable",
            memgaze_instrument::binary::ExecutableKind::SharedObject => "shared object",
        },
        binary.functions().len(),
        if d.has_symtab {
            ".symtab".to_string()
        } else {
            format!(
                "stripped: {} from .eh_frame, {} from gaps",
                d.from_eh_frame, d.from_gaps
            )
        },
        if binary.has_lines() { "yes" } else { "no" },
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<40} {:>10} {:>7} {:>6} {:>8} {:>9} {:>8} {:>7} {:>6}",
        "function", "start", "size", "loads", "Strided", "Irregular", "Constant", "probes", "kappa"
    );
    let mut all_probes = 0;
    for (index, f) in &loads.functions {
        let function = &binary.functions()[*index];
        let probes = probes(binary, f);
        all_probes += probes;
        let _ = writeln!(
            s,
            "{:<40} {:>10} {:>7} {:>6} {:>8} {:>9} {:>8} {:>7} {:>6.2}",
            truncate(&function.name, 40),
            hex(function.start),
            function.size,
            f.loads.len(),
            f.count(LoadClass::Strided),
            f.count(LoadClass::Irregular),
            f.count(LoadClass::Constant),
            probes,
            classify::ratio(f.loads.len(), probes)
        );
    }
    let _ = writeln!(
        s,
        "{:<40} {:>10} {:>7} {:>6} {:>8} {:>9} {:>8} {:>7} {:>6.2}",
        format!("total ({} functions)", totals.functions),
        "",
        "",
        totals.loads,
        totals.strided,
        totals.irregular,
        totals.constant,
        all_probes,
        classify::ratio(totals.loads, all_probes)
    );
    let _ = writeln!(
        s,
        "\nkappa = loads / probes (basic-block proxy compression; loads no probe can trace, gathers and gs: sources, have no probe). Not counted as loads: {} implicit stack reads (pop/ret/leave), {} string-instruction reads (outs, 32-bit addresses, fs:/gs: sources; movs/lods/cmps/scas are loads). {} TLS loads. Jump tables: {} resolved, {} indirect jumps unresolved.",
        totals.stack_loads,
        totals.string_loads,
        totals.tls,
        totals.jump_tables,
        totals.unresolved_indirect_jumps
    );
    let why: Vec<String> = reasons(loads)
        .into_iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let _ = writeln!(s, "Loads by reason: {}.", why.join(", "));
    if !per_load {
        if !global.quiet {
            let _ = writeln!(
                s,
                "Use --functions <GLOB> to list each load and why it has its class."
            );
        }
        return s;
    }
    for (index, f) in &loads.functions {
        if f.loads.is_empty() {
            continue;
        }
        let function = &binary.functions()[*index];
        let _ = writeln!(s, "\n{} ({}):", function.name, hex(function.start));
        let _ = writeln!(
            s,
            "  {:<10} {:<9} {:<14} {:<38} {:<60} line",
            "ip", "class", "probe", "instruction", "why"
        );
        for l in &f.loads {
            let (instruction, untraceable) = load_instruction(binary, l.operand.ip, l.operand.len);
            let probe = match (l.instrumented, l.proxy) {
                (true, _) if untraceable.is_some() => "no".to_string(),
                (true, _) if l.implied > 0 => format!("yes (+{})", l.implied),
                (true, _) => "yes".to_string(),
                (false, Some(p)) => format!("via {}", hex(p)),
                (false, None) => "no".to_string(),
            };
            let mut why = l.reason.to_string();
            if l.operand.is_tls() {
                why.push_str(", TLS");
            }
            if let Some(untraceable) = untraceable {
                why.push_str(&format!("; not traced: {untraceable}"));
            }
            let line = binary
                .location(l.operand.ip)
                .map(|loc| short_path(&loc.to_string()))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "  {:<10} {:<9} {:<14} {:<38} {:<60} {}",
                hex(l.operand.ip),
                l.class.as_str(),
                probe,
                truncate(&instruction, 38),
                why,
                line
            );
        }
    }
    s
}
