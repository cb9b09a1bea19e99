//! The instrumentation report: what was instrumented, what was not and why,
//! and every place execution can escape into uninstrumented original code.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

/// A way execution can reach original (uninstrumented) code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Escape {
    /// Function it happens in.
    pub function: String,
    /// Address of the jump.
    pub at: u64,
    /// Where it lands, when known.
    pub target: Option<u64>,
    /// Why it cannot be redirected.
    pub reason: String,
}

/// Counts and lists of one `instrument` run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Functions selected for instrumentation.
    pub functions_selected: usize,
    /// Functions relocated with their probes.
    pub functions_instrumented: usize,
    /// `reason → count` of selected functions left alone.
    pub(crate) functions_skipped: BTreeMap<String, usize>,
    /// The skipped functions: `(name, start, reason)`.
    pub skipped: Vec<(String, u64, String)>,
    /// Explicit loads in the selected functions.
    pub loads: usize,
    /// Loads carrying a probe.
    pub loads_instrumented: usize,
    /// Constant loads implied by a probe (proxy compression).
    pub loads_implied: usize,
    /// Share of `loads` instrumented or implied, in `[0, 1]` (1 when there
    /// are none): the static coverage.
    pub coverage: f64,
    /// `reason → count` of loads neither instrumented nor implied.
    pub(crate) loads_skipped: BTreeMap<String, usize>,
    /// Implicit string reads in the selected functions that have no string
    /// probe (`outs`, 32-bit address size, `fs:`/`gs:` sources): not traced.
    /// Not part of `loads` or `coverage`.
    pub string_loads: usize,
    /// Implicit stack reads (`pop`, `ret`, `leave`) in the selected
    /// functions: not traced, by design. Not part of `loads` or `coverage`.
    pub stack_loads: usize,
    /// `fast-path variant → count` of software probes.
    pub(crate) probe_kinds: BTreeMap<String, usize>,
    /// Entry patches written into original functions.
    pub(crate) entry_patches: usize,
    /// Copied functions known only from a gap scan (no symbol, no unwind
    /// entry), whose original bytes are left unpatched: they may be data
    /// (a constant table in `.text`); entered from outside their copy, they
    /// run uninstrumented.
    pub(crate) gap_entries_unpatched: usize,
    /// Jump-table targets patched to jump into the copy.
    pub(crate) table_target_patches: usize,
    /// Indirect jumps whose copies read a translated jump table.
    pub(crate) table_jumps_translated: usize,
    /// Jump-table jumps whose copies read the original table (landing on
    /// target patches where those fit).
    pub(crate) table_jumps_untranslated: usize,
    /// Every escape into original code.
    pub(crate) escapes: Vec<Escape>,
    /// Instrumented loads reachable through an escape (their counts can fall
    /// short of the truth).
    pub escaped_loads: Vec<u64>,
    /// Indirect jumps of the copies that may land in original code and
    /// count, at run time, each time they do (annotation `escapes`).
    pub escape_checks: usize,
    /// Explicit loads no probe can trace (gathers, `gs:` sources) that
    /// count their executions at run time (annotation `escapes` with
    /// `untraced_load`).
    pub untraced_load_counts: usize,
    /// FDEs written for copies.
    pub(crate) fdes: usize,
    /// LSDAs written for copies.
    pub lsdas: usize,
    /// Whether the region markers were found and hooked.
    pub region_markers: bool,
    /// Imports through which a process ends without `DT_FINI` (`_exit`,
    /// the `exec` family) or is forked, whose PLT entries or direct GOT
    /// calls now go through the recorder first.
    pub process_end_hooks: Vec<String>,
    /// `call`/`jmp [rip → GOT slot]` of such imports (no PLT: `-fno-plt`,
    /// Rust) sent through the hooks.
    pub process_end_got_calls: usize,
    /// Such imports the binary binds to a GOT slot but never calls
    /// through it directly (only through a register, or not at all): not
    /// hooked. Listed, not warned about.
    pub process_end_unhooked: Vec<String>,
    /// Bytes of the new segment.
    pub segment_bytes: usize,
    /// Address range of the relocated functions (with their stubs).
    pub copies_start: u64,
    /// See `copies_start`.
    pub copies_end: u64,
    /// Warnings for the user.
    pub warnings: Vec<String>,
    /// Seconds spent per phase, in order (printed with `-v`).
    pub timings: Vec<(String, f64)>,
}

impl Report {
    /// Share of explicit loads instrumented or implied.
    pub(crate) fn static_coverage(&self) -> f64 {
        if self.loads == 0 {
            1.0
        } else {
            (self.loads_instrumented + self.loads_implied) as f64 / self.loads as f64
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "functions: {} selected, {} instrumented, {} skipped",
            self.functions_selected,
            self.functions_instrumented,
            self.functions_selected - self.functions_instrumented
        )?;
        for (reason, count) in &self.functions_skipped {
            writeln!(f, "  skipped {count:>6}  {reason}")?;
        }
        writeln!(
            f,
            "loads: {} explicit, {} instrumented, {} implied by a proxy, {} not covered ({:.1}% covered)",
            self.loads,
            self.loads_instrumented,
            self.loads_implied,
            self.loads - self.loads_instrumented - self.loads_implied,
            100.0 * self.static_coverage()
        )?;
        for (reason, count) in &self.loads_skipped {
            writeln!(f, "  not covered {count:>6}  {reason}")?;
        }
        writeln!(
            f,
            "implicit loads not traced (by design): {} string instructions (outs, 32-bit addresses, fs:/gs: sources), {} stack reads (pop, ret, leave)",
            self.string_loads, self.stack_loads
        )?;
        if !self.probe_kinds.is_empty() {
            let kinds: Vec<String> = self
                .probe_kinds
                .iter()
                .map(|(k, n)| format!("{n} {k}"))
                .collect();
            writeln!(f, "probes: {}", kinds.join(", "))?;
        }
        writeln!(
            f,
            "patches: {} function entries ({} found only in gaps left unpatched), {} jump-table targets; unwind: {} FDEs, {} LSDAs",
            self.entry_patches,
            self.gap_entries_unpatched,
            self.table_target_patches,
            self.fdes,
            self.lsdas
        )?;
        let unresolved = self.escapes.iter().filter(|e| e.target.is_none()).count();
        writeln!(
            f,
            "indirect jumps: {} through translated jump tables, {} through original tables, {unresolved} unresolved",
            self.table_jumps_translated, self.table_jumps_untranslated
        )?;
        writeln!(
            f,
            "escapes into original code: {} ({} instrumented loads reachable through them)",
            self.escapes.len(),
            self.escaped_loads.len()
        )?;
        let mut by_reason: BTreeMap<&str, usize> = BTreeMap::new();
        for e in &self.escapes {
            *by_reason.entry(e.reason.as_str()).or_default() += 1;
        }
        for (reason, count) in by_reason {
            writeln!(f, "  escape {count:>6}  {reason}")?;
        }
        writeln!(
            f,
            "escape checks: {} indirect jumps count at run time how often they land in original code (dynamic coverage)",
            self.escape_checks
        )?;
        if self.untraced_load_counts > 0 {
            writeln!(
                f,
                "untraced load counts: {} loads no probe can trace count their executions at run time (dynamic coverage)",
                self.untraced_load_counts
            )?;
        }
        writeln!(
            f,
            "region markers: {}",
            if self.region_markers {
                "hooked (recording only between memgaze_region_begin and memgaze_region_end)"
            } else {
                "none (recording from start to exit)"
            }
        )?;
        if !self.process_end_hooks.is_empty() {
            writeln!(
                f,
                "process ends hooked (buffers flushed before them): {} ({} direct GOT calls)",
                self.process_end_hooks.join(", "),
                self.process_end_got_calls
            )?;
        }
        if !self.process_end_unhooked.is_empty() {
            writeln!(
                f,
                "process ends not hooked (no PLT entry, no direct GOT call): {}",
                self.process_end_unhooked.join(", ")
            )?;
        }
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        Ok(())
    }
}
