//! Which recording backend this machine supports, and why not.
//!
//! [`probe`] runs every check of `cargo memgaze doctor` and returns a
//! [`ProbeReport`]; [`choose_backend`] turns it and a `--backend` request
//! into the backend a recording command uses, with the reason. Every
//! recording command (`record`, `run`, `bench`) probes without the
//! self-test and calls [`choose_backend`].
//!
//! All files are read below a `SystemRoot` and every `perf_event_open`
//! goes through an `EventOpener`, so tests run the whole probe against a
//! saved sysfs tree with simulated syscall results.

use super::config::{self, EventConfig, INTEL_PT_PMU, PtOptions};
use super::error::{Context, PtError, Result};
use super::sysfs::{EVENT_SOURCE_DEVICES, Pmu, SystemRoot, online_cpus};
use memgaze_trace::Backend;
use serde::Serialize;
use std::fmt;
use std::io;

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    /// Satisfied.
    Pass,
    /// Usable, with a limitation the detail explains.
    Warn,
    /// Not satisfied: the backend is unusable.
    Fail,
    /// Not evaluated because a check it depends on failed.
    Skipped,
    /// Not evaluated by this command (too costly here; `doctor` runs it).
    Pending,
}

impl CheckStatus {
    /// A short label for tables.
    pub fn label(self) -> &'static str {
        match self {
            CheckStatus::Pass => "ok",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "FAIL",
            CheckStatus::Skipped => "skip",
            CheckStatus::Pending => "pending",
        }
    }
}

/// One check with its reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable identifier (JSON, tests).
    pub name: &'static str,
    /// Outcome.
    pub status: CheckStatus,
    /// Why: what was found, and what to do about a failure.
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, status: CheckStatus, detail: impl Into<String>) -> Check {
        Check {
            name,
            status,
            detail: detail.into(),
        }
    }
}

/// The checks of one backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendReport {
    /// Which backend.
    pub backend: Backend,
    /// Its checks, in the order they were made.
    pub checks: Vec<Check>,
}

impl BackendReport {
    /// Usable when no check failed or was skipped (warnings and pending
    /// checks do not block).
    pub fn usable(&self) -> bool {
        self.checks
            .iter()
            .all(|c| !matches!(c.status, CheckStatus::Fail | CheckStatus::Skipped))
    }

    /// The first failed check, the reason the backend is unusable.
    pub(crate) fn first_failure(&self) -> Option<&Check> {
        self.checks.iter().find(|c| c.status == CheckStatus::Fail)
    }

    #[cfg(test)]
    /// A check by name.
    pub(crate) fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }
}

/// Everything `doctor` found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProbeReport {
    /// The Intel PT backend.
    pub pt: BackendReport,
    /// The software recorder.
    pub soft: BackendReport,
}

/// Opens a group of perf events (the first is the leader) on the calling
/// process and closes them again: does the kernel accept this configuration?
pub(crate) trait EventOpener {
    /// `Ok` when every event opened.
    fn try_open(&self, group: &[EventConfig]) -> io::Result<()>;
}

/// The real `perf_event_open(2)`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LiveOpener;

impl EventOpener for LiveOpener {
    fn try_open(&self, group: &[EventConfig]) -> io::Result<()> {
        let mut fds: Vec<std::os::fd::OwnedFd> = Vec::new();
        for event in group {
            let mut attr = event.to_attr();
            // A probe on ourselves: no exec will come to enable it.
            attr.set_enable_on_exec(0);
            attr.set_disabled(1);
            let leader = fds.first().map_or(-1, |fd| {
                use std::os::fd::AsRawFd;
                fd.as_raw_fd()
            });
            // SAFETY: `attr` is a fully initialised perf_event_attr of the
            // size it declares; the result is checked before use.
            let fd = unsafe {
                perf_event_open_sys::perf_event_open(
                    &mut attr,
                    0,
                    -1,
                    leader,
                    perf_event_open_sys::bindings::PERF_FLAG_FD_CLOEXEC as _,
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a new descriptor we own.
            fds.push(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) });
        }
        Ok(())
    }
}

/// The software backend's self-test: instrument a tiny program, run it and
/// check its trace. `Ok` carries a one-line summary. The rewriter provides
/// it (see `ProbeOptions::soft_self_test`).
pub type SoftSelfTest<'a> =
    &'a dyn Fn() -> Result<String, Box<dyn std::error::Error + Send + Sync>>;

/// The AUX and ring buffers a collection maps per CPU (for the memlock
/// budget check and the collector).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferPlan {
    /// Data ring pages (a power of two), plus one header page.
    pub(crate) data_pages: usize,
    /// AUX area pages (a power of two).
    pub(crate) aux_pages: usize,
    /// Bytes of PT data per sample.
    pub(crate) aux_sample_size: u32,
}

impl Default for BufferPlan {
    fn default() -> BufferPlan {
        BufferPlan {
            data_pages: 16,
            aux_pages: 32,
            aux_sample_size: 16 * 1024,
        }
    }
}

impl BufferPlan {
    /// Bytes locked per CPU.
    pub(crate) fn bytes_per_cpu(&self) -> u64 {
        ((self.data_pages + 1 + self.aux_pages) * page_size()) as u64
    }
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as usize } else { 4096 }
}

/// What to probe and how.
pub struct ProbeOptions<'a> {
    /// Where `sys/` and `proc/` are read.
    pub(crate) root: SystemRoot,
    /// How `perf_event_open` is tried.
    pub(crate) opener: &'a dyn EventOpener,
    /// The software backend's self-test, when wired in.
    pub(crate) soft_self_test: Option<SoftSelfTest<'a>>,
    /// The buffers a collection will map.
    pub(crate) buffers: BufferPlan,
    /// The `intel_pt` event options a collection will use.
    pub pt: PtOptions,
    /// The sampling period used for the test open of the load event.
    pub(crate) load_period: u64,
}

impl<'a> ProbeOptions<'a> {
    /// The live system with real syscalls and default buffers.
    pub fn live(soft_self_test: Option<SoftSelfTest<'a>>) -> ProbeOptions<'a> {
        ProbeOptions {
            root: SystemRoot::live(),
            opener: &LiveOpener,
            soft_self_test,
            buffers: BufferPlan::default(),
            pt: PtOptions::default(),
            load_period: 1_000_000,
        }
    }
}

/// The minimum kernel for AUX sampling (`aux_sample_size`, Linux 5.5).
pub(crate) const MIN_KERNEL_AUX_SAMPLING: (u32, u32) = (5, 5);

/// Runs every check.
pub fn probe(options: &ProbeOptions<'_>) -> ProbeReport {
    let facts = Facts::read(&options.root);
    ProbeReport {
        pt: probe_pt(options, &facts),
        soft: probe_soft(options, &facts),
    }
}

/// What the probe reads once and several checks use.
struct Facts {
    vendor: Option<String>,
    kernel: Option<String>,
    ostype: Option<String>,
    arch: Option<String>,
    effective_caps: Option<u64>,
}

/// Capability bits (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;

impl Facts {
    fn read(root: &SystemRoot) -> Facts {
        let cpuinfo = std::fs::read_to_string(root.path("proc/cpuinfo")).unwrap_or_default();
        let vendor = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("vendor_id"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string());
        let status = std::fs::read_to_string(root.path("proc/self/status")).unwrap_or_default();
        let effective_caps = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
        let arch = root
            .read_trimmed("proc/sys/kernel/arch")
            .ok()
            .or_else(|| root.is_live().then(|| std::env::consts::ARCH.to_string()));
        Facts {
            vendor,
            kernel: root.read_trimmed("proc/sys/kernel/osrelease").ok(),
            ostype: root.read_trimmed("proc/sys/kernel/ostype").ok(),
            arch,
            effective_caps,
        }
    }

    fn has_cap(&self, cap: u32) -> bool {
        self.effective_caps.is_some_and(|c| c >> cap & 1 == 1)
    }

    fn kernel_version(&self) -> Option<(u32, u32)> {
        let k = self.kernel.as_deref()?;
        let mut parts = k.split(|c: char| !c.is_ascii_digit());
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    }
}

fn probe_pt(options: &ProbeOptions<'_>, facts: &Facts) -> BackendReport {
    let root = &options.root;
    let mut checks = Vec::new();
    use CheckStatus::*;

    // 1. The intel_pt PMU.
    let pmu_dir = root.path(&format!("{EVENT_SOURCE_DEVICES}/{INTEL_PT_PMU}"));
    let pmu = if Pmu::exists(root, INTEL_PT_PMU) {
        match Pmu::load(root, INTEL_PT_PMU) {
            Ok(pmu) => {
                checks.push(Check::new(
                    "intel_pt_pmu",
                    Pass,
                    format!("{} (perf type {})", pmu_dir.display(), pmu.event_type),
                ));
                Some(pmu)
            }
            Err(e) => {
                checks.push(Check::new(
                    "intel_pt_pmu",
                    Fail,
                    format!("{}: {}", pmu_dir.display(), memgaze_error::one_line_of(&e)),
                ));
                None
            }
        }
    } else {
        let why = match facts.vendor.as_deref() {
            Some("GenuineIntel") => {
                "this Intel CPU or its hypervisor does not expose Intel PT (not supported by the \
                 model, disabled in firmware, or hidden from the virtual machine)"
                    .to_string()
            }
            Some(vendor) => format!("the CPU is {vendor}: Intel PT exists only on Intel CPUs"),
            None => "the CPU vendor is unknown".to_string(),
        };
        checks.push(Check::new(
            "intel_pt_pmu",
            Fail,
            format!("no {} directory: {why}", pmu_dir.display()),
        ));
        None
    };
    let needs_pmu = "needs the intel_pt PMU";

    // 2. PTWRITE.
    checks.push(match &pmu {
        None => Check::new("ptwrite", Skipped, needs_pmu),
        Some(pmu) => match pmu.cap("ptwrite") {
            Some(1) => Check::new("ptwrite", Pass, "caps/ptwrite = 1"),
            other => Check::new(
                "ptwrite",
                Fail,
                format!(
                    "caps/ptwrite = {}: this CPU has no PTWRITE instruction (it arrived with \
                     Goldmont Plus, Alder Lake and Sapphire Rapids); the instrumented binary \
                     would fault with #UD",
                    other.map_or("missing".to_string(), |v| v.to_string())
                ),
            ),
        },
    });

    // 3. The event configuration from the format files and caps.
    let pt_event = pmu
        .as_ref()
        .map(|pmu| config::intel_pt_event(pmu, &options.pt));
    checks.push(match &pt_event {
        None => Check::new("pt_config", Skipped, needs_pmu),
        Some(Ok(event)) => Check::new(
            "pt_config",
            Pass,
            format!(
                "intel_pt/pt=1,branch=0,ptw=1,fup_on_ptw=1…/u from format/*: config={:#x}",
                event.words.config
            ),
        ),
        Some(Err(e)) => Check::new("pt_config", Fail, memgaze_error::one_line_of(e)),
    });

    // 4. PSB period and timing packets.
    checks.push(match &pmu {
        None => Check::new("psb_cyc", Skipped, needs_pmu),
        Some(pmu) if pmu.cap("psb_cyc") == Some(1) => {
            let periods = pmu.cap("psb_periods").unwrap_or(0);
            let shortest = if periods == 0 { 0 } else { periods.trailing_zeros() };
            Check::new(
                "psb_cyc",
                Pass,
                format!(
                    "caps/psb_cyc = 1: a PSB every {} bytes (psb_periods {periods:#x}); CYC available",
                    2u64 << (shortest + 10)
                ),
            )
        }
        Some(_) => Check::new(
            "psb_cyc",
            Warn,
            "caps/psb_cyc = 0: the CPU fixes the PSB period and has no CYC; AUX samples \
             decode from their first PSB, so fewer sync points mean shorter samples",
        ),
    });
    checks.push(match &pmu {
        None => Check::new("mtc", Skipped, needs_pmu),
        Some(pmu) if pmu.cap("mtc") == Some(1) => Check::new(
            "mtc",
            Pass,
            format!(
                "caps/mtc = 1 (mtc_periods {:#x})",
                pmu.cap("mtc_periods").unwrap_or(0)
            ),
        ),
        Some(_) => Check::new(
            "mtc",
            Warn,
            "caps/mtc = 0: timestamps come only from TSC packets in PSB+",
        ),
    });

    // 5. Kernel: AUX sampling.
    checks.push(match facts.kernel_version() {
        Some(v) if v >= MIN_KERNEL_AUX_SAMPLING => Check::new(
            "kernel",
            Pass,
            format!(
                "Linux {} supports AUX sampling (since {}.{})",
                facts.kernel.as_deref().unwrap_or("?"),
                MIN_KERNEL_AUX_SAMPLING.0,
                MIN_KERNEL_AUX_SAMPLING.1
            ),
        ),
        Some(_) => Check::new(
            "kernel",
            Fail,
            format!(
                "Linux {} is older than {}.{}, which added AUX sampling (perf_event_attr.aux_sample_size)",
                facts.kernel.as_deref().unwrap_or("?"),
                MIN_KERNEL_AUX_SAMPLING.0,
                MIN_KERNEL_AUX_SAMPLING.1
            ),
        ),
        None => Check::new(
            "kernel",
            Fail,
            format!(
                "cannot read the kernel version from {}",
                root.path("proc/sys/kernel/osrelease").display()
            ),
        ),
    });

    // 6. Permission.
    checks.push(paranoid_check(root, facts));

    // 7. Locked memory for the AUX and ring buffers.
    checks.push(mlock_check(root, facts, &options.buffers));

    // 8. The load-retired sampling event.
    let (load_event, load_check, load_ok) = load_event_check(options);
    checks.push(load_check);

    // 9. The whole group: PT leader + load member with PERF_SAMPLE_AUX.
    checks.push(match (&pt_event, &load_event) {
        (Some(Ok(pt)), Ok(load)) if load_ok => {
            match options.opener.try_open(&[pt.clone(), load.clone()]) {
                Ok(()) => Check::new(
                    "aux_sampling",
                    Pass,
                    format!(
                        "an intel_pt group with a load-sampling member taking {} KiB AUX samples opens",
                        options.buffers.aux_sample_size / 1024
                    ),
                ),
                Err(e) => Check::new(
                    "aux_sampling",
                    Fail,
                    format!(
                        "perf_event_open(intel_pt group with PERF_SAMPLE_AUX): {}",
                        explain_errno(&e)
                    ),
                ),
            }
        }
        _ => Check::new(
            "aux_sampling",
            Skipped,
            "needs a valid intel_pt configuration and the load event",
        ),
    });

    BackendReport {
        backend: Backend::Pt,
        checks,
    }
}

/// Step 8 of [`probe_pt`]: the load-retired sampling event, its check, and
/// whether it opens as a counting event.
fn load_event_check(options: &ProbeOptions<'_>) -> (Result<EventConfig>, Check, bool) {
    use CheckStatus::*;
    let load_pmus = config::load_pmus(&options.root);
    let load_event = load_pmus
        .as_ref()
        .map_err(|e| PtError::NoLoadEvent { why: e.to_string() })
        .and_then(|pmus| {
            config::load_sampling_event(
                &pmus[0],
                options.load_period,
                options.buffers.aux_sample_size,
            )
        });
    let (check, ok) = match &load_event {
        Err(e) => (
            Check::new("load_event", Fail, memgaze_error::one_line_of(e)),
            false,
        ),
        Ok(event) => {
            let names: Vec<&str> = load_pmus
                .as_ref()
                .map(|p| p.iter().map(|p| p.name.as_str()).collect())
                .unwrap_or_default();
            let mut counting = event.clone();
            counting.sample_type = config::SAMPLE_ID_BITS;
            counting.aux_sample_size = 0;
            match options.opener.try_open(std::slice::from_ref(&counting)) {
                Ok(()) => (
                    Check::new(
                        "load_event",
                        Pass,
                        format!(
                            "{}/event=0xd0,umask=0x81/u (MEM_INST_RETIRED.ALL_LOADS) opens as a \
                             sampling event (config={:#x})",
                            names.join("+"),
                            event.words.config
                        ),
                    ),
                    true,
                ),
                Err(e) => (
                    Check::new(
                        "load_event",
                        Fail,
                        format!(
                            "perf_event_open({}/event=0xd0,umask=0x81/u, sampling): {}",
                            names.join("+"),
                            explain_errno(&e)
                        ),
                    ),
                    false,
                ),
            }
        }
    };
    (load_event, check, ok)
}

fn paranoid_check(root: &SystemRoot, facts: &Facts) -> Check {
    let path = root.path("proc/sys/kernel/perf_event_paranoid");
    let privileged = if facts.has_cap(CAP_PERFMON) {
        Some("CAP_PERFMON")
    } else if facts.has_cap(CAP_SYS_ADMIN) {
        Some("CAP_SYS_ADMIN")
    } else {
        None
    };
    let level = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    match (level, privileged) {
        (_, Some(cap)) => Check::new(
            "perf_permissions",
            CheckStatus::Pass,
            format!("the process has {cap}"),
        ),
        (Some(level), None) if level <= 2 => Check::new(
            "perf_permissions",
            CheckStatus::Pass,
            format!(
                "perf_event_paranoid = {level}: user-space tracing of one's own processes is allowed"
            ),
        ),
        (Some(level), None) => Check::new(
            "perf_permissions",
            CheckStatus::Fail,
            format!(
                "perf_event_paranoid = {level} forbids perf_event_open without CAP_PERFMON: run \
                 `sudo sysctl kernel.perf_event_paranoid=2`, or grant the capability with \
                 `sudo setcap cap_perfmon+ep $(command -v cargo-memgaze)`"
            ),
        ),
        (None, None) => Check::new(
            "perf_permissions",
            CheckStatus::Fail,
            format!("cannot read {}", path.display()),
        ),
    }
}

/// `RLIMIT_MEMLOCK` soft limit from `proc/self/limits` (`None`: unlimited).
fn memlock_limit(root: &SystemRoot) -> Result<Option<u64>> {
    let path = root.path("proc/self/limits");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let line = text
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .ok_or_else(|| PtError::NoMemlockLine { path: path.clone() })?;
    let soft = line["Max locked memory".len()..]
        .split_whitespace()
        .next()
        .unwrap_or("");
    if soft == "unlimited" {
        return Ok(None);
    }
    soft.parse()
        .map(Some)
        .with_context(|| format!("{}: bad limit `{soft}`", path.display()))
}

fn mlock_check(root: &SystemRoot, facts: &Facts, plan: &BufferPlan) -> Check {
    let cpus = match online_cpus(root) {
        Ok(cpus) => cpus.len() as u64,
        Err(e) => return Check::new("mlock", CheckStatus::Fail, memgaze_error::one_line_of(&e)),
    };
    let needed = plan.bytes_per_cpu() * cpus;
    let describe = |budget: &str| {
        format!(
            "{cpus} CPUs × ({} ring + {} AUX pages + 1) = {} KiB needed; {budget}",
            plan.data_pages,
            plan.aux_pages,
            needed / 1024
        )
    };
    if facts.has_cap(CAP_IPC_LOCK) {
        return Check::new(
            "mlock",
            CheckStatus::Pass,
            describe("CAP_IPC_LOCK lifts the limit"),
        );
    }
    let mlock_kb = match root
        .read_trimmed("proc/sys/kernel/perf_event_mlock_kb")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        Some(kb) => kb,
        None => {
            return Check::new(
                "mlock",
                CheckStatus::Fail,
                format!(
                    "cannot read {}",
                    root.path("proc/sys/kernel/perf_event_mlock_kb").display()
                ),
            );
        }
    };
    let rlimit = match memlock_limit(root) {
        Ok(limit) => limit,
        Err(e) => return Check::new("mlock", CheckStatus::Fail, memgaze_error::one_line_of(&e)),
    };
    // The kernel lets each user lock perf_event_mlock_kb per online CPU for
    // perf buffers, and charges the excess to RLIMIT_MEMLOCK
    // (kernel/events/core.c, perf_mmap).
    let Some(rlimit) = rlimit else {
        return Check::new(
            "mlock",
            CheckStatus::Pass,
            describe("RLIMIT_MEMLOCK is unlimited"),
        );
    };
    let budget = mlock_kb * 1024 * cpus + rlimit;
    let text = describe(&format!(
        "perf_event_mlock_kb {mlock_kb} × {cpus} CPUs + RLIMIT_MEMLOCK {} KiB = {} KiB available \
         (minus what other perf sessions of this user hold)",
        rlimit / 1024,
        budget / 1024
    ));
    if needed <= budget {
        Check::new("mlock", CheckStatus::Pass, text)
    } else {
        Check::new(
            "mlock",
            CheckStatus::Fail,
            format!(
                "{text}; raise it with `sudo sysctl kernel.perf_event_mlock_kb={}` or `ulimit -l`",
                needed.div_ceil(cpus * 1024)
            ),
        )
    }
}

/// Explains a `perf_event_open` failure.
pub(crate) fn explain_errno(e: &io::Error) -> String {
    let why = match e.raw_os_error() {
        Some(libc::ENOENT) => "the kernel does not know this event on this CPU",
        Some(libc::EACCES) | Some(libc::EPERM) => {
            "permission denied (perf_event_paranoid or missing CAP_PERFMON)"
        }
        Some(libc::EOPNOTSUPP) => {
            "the PMU cannot sample (no overflow interrupt; common in virtual machines)"
        }
        Some(libc::EINVAL) => "invalid configuration for this kernel or CPU",
        Some(libc::EBUSY) => "the PMU is in use (another tracer or a VM host holds it)",
        Some(libc::E2BIG) => "the kernel does not accept this perf_event_attr size",
        Some(libc::ENODEV) => "no such PMU on this CPU",
        _ => "perf_event_open failed",
    };
    format!("{why} ({e})")
}

fn probe_soft(options: &ProbeOptions<'_>, facts: &Facts) -> BackendReport {
    use CheckStatus::*;
    let mut checks = Vec::new();
    checks.push(match facts.arch.as_deref() {
        Some("x86_64") => Check::new(
            "architecture",
            Pass,
            "x86_64: the rewriter and its recording stub are x86-64 code",
        ),
        Some(other) => Check::new(
            "architecture",
            Fail,
            format!(
                "{other}: the rewriter instruments x86-64 executables and they run only on x86-64"
            ),
        ),
        None => Check::new(
            "architecture",
            Fail,
            format!(
                "cannot read {}",
                options.root.path("proc/sys/kernel/arch").display()
            ),
        ),
    });
    checks.push(match (facts.ostype.as_deref(), facts.kernel.as_deref()) {
        (Some("Linux"), Some(release)) => Check::new(
            "kernel",
            Pass,
            format!("Linux {release}: instrumented programs need no ptrace or perf permissions"),
        ),
        (Some(other), _) => Check::new(
            "kernel",
            Fail,
            format!("{other}: the instrumented executables are Linux ELF programs"),
        ),
        (None, _) => Check::new(
            "kernel",
            Fail,
            format!(
                "cannot read {}",
                options.root.path("proc/sys/kernel/ostype").display()
            ),
        ),
    });
    checks.push(match options.soft_self_test {
        None => Check::new(
            "self_test",
            Pending,
            "test instrumentation of a tiny program: not run by recording commands (`cargo memgaze doctor` runs it)",
        ),
        Some(test) => match test() {
            Ok(summary) => Check::new("self_test", Pass, summary),
            Err(e) => Check::new("self_test", Fail, memgaze_error::one_line_of(&*e)),
        },
    });
    BackendReport {
        backend: Backend::Soft,
        checks,
    }
}

/// `--backend` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendRequest {
    /// Intel PT when every PT check passes (`cargo memgaze doctor`), else
    /// the software recorder.
    #[default]
    Auto,
    /// The software recorder (works on any x86-64 Linux machine).
    Soft,
    /// Intel PT `ptwrite` (needs a CPU with PTWRITE and perf access).
    Pt,
}

impl fmt::Display for BackendRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendRequest::Auto => "auto",
            BackendRequest::Soft => "soft",
            BackendRequest::Pt => "pt",
        })
    }
}

/// The `--backend` flag, for `#[command(flatten)]` in recording commands.
#[derive(clap::Args, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BackendArgs {
    /// Recording backend: `auto` uses Intel PT where `cargo memgaze doctor`
    /// finds it usable and the software recorder otherwise, and says which.
    #[arg(long, value_enum, default_value_t = BackendRequest::Auto)]
    pub(crate) backend: BackendRequest,
}

/// The backend a recording command uses, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendChoice {
    /// The backend.
    pub backend: Backend,
    /// One line for the user: what was chosen and why.
    pub reason: String,
}

/// Resolves a `--backend` request against a probe report.
///
/// `auto` picks PT only when every PT check passes (warnings allowed);
/// an explicit backend that is unusable is an error of one line naming the
/// failing check (exit code 1).
pub fn choose_backend(request: BackendRequest, report: &ProbeReport) -> Result<BackendChoice> {
    let why_not = |r: &BackendReport| {
        r.first_failure()
            .map(|c| format!("{}: {}", c.name, c.detail))
            .unwrap_or_else(|| "a check was skipped".to_string())
    };
    match request {
        BackendRequest::Pt if report.pt.usable() => Ok(BackendChoice {
            backend: Backend::Pt,
            reason: "Intel PT (requested with --backend pt; every check passed)".to_string(),
        }),
        BackendRequest::Pt => Err(PtError::PtUnusable {
            why: why_not(&report.pt),
        }),
        BackendRequest::Soft if report.soft.usable() => Ok(BackendChoice {
            backend: Backend::Soft,
            reason: "software recorder (requested with --backend soft)".to_string(),
        }),
        BackendRequest::Soft => Err(PtError::SoftUnusable {
            why: why_not(&report.soft),
        }),
        BackendRequest::Auto if report.pt.usable() => Ok(BackendChoice {
            backend: Backend::Pt,
            reason: format!("auto: Intel PT ({} checks passed)", report.pt.checks.len()),
        }),
        BackendRequest::Auto if report.soft.usable() => Ok(BackendChoice {
            backend: Backend::Soft,
            reason: format!(
                "auto: software recorder, because Intel PT is unusable ({})",
                why_not(&report.pt)
            ),
        }),
        BackendRequest::Auto => Err(PtError::NoBackend {
            pt: why_not(&report.pt),
            soft: why_not(&report.soft),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Simulated `perf_event_open`: records what it was asked to open and
    /// answers with a fixed result.
    struct FakeOpener {
        result: Option<i32>,
        opened: RefCell<Vec<Vec<EventConfig>>>,
    }

    impl FakeOpener {
        fn ok() -> FakeOpener {
            FakeOpener {
                result: None,
                opened: RefCell::new(Vec::new()),
            }
        }
        fn failing(errno: i32) -> FakeOpener {
            FakeOpener {
                result: Some(errno),
                opened: RefCell::new(Vec::new()),
            }
        }
    }

    impl EventOpener for FakeOpener {
        fn try_open(&self, group: &[EventConfig]) -> io::Result<()> {
            self.opened.borrow_mut().push(group.to_vec());
            match self.result {
                None => Ok(()),
                Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            }
        }
    }

    const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/intel_pt_sysfs");

    fn options(root: SystemRoot, opener: &dyn EventOpener) -> ProbeOptions<'_> {
        ProbeOptions {
            root,
            opener,
            soft_self_test: None,
            buffers: BufferPlan::default(),
            pt: PtOptions::default(),
            load_period: 1_000_000,
        }
    }

    /// A writable copy of the saved tree.
    fn copy_tree() -> tempfile::TempDir {
        fn copy(from: &std::path::Path, to: &std::path::Path) {
            std::fs::create_dir_all(to).unwrap();
            for entry in std::fs::read_dir(from).unwrap() {
                let entry = entry.unwrap();
                let target = to.join(entry.file_name());
                if entry.path().is_dir() {
                    copy(&entry.path(), &target);
                } else {
                    std::fs::copy(entry.path(), target).unwrap();
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        copy(std::path::Path::new(DATA), dir.path());
        dir
    }

    fn status(report: &BackendReport, name: &str) -> CheckStatus {
        report
            .check(name)
            .unwrap_or_else(|| panic!("no check {name}"))
            .status
    }

    #[test]
    fn ptwrite_machine_with_working_perf_picks_pt() {
        let opener = FakeOpener::ok();
        let report = probe(&options(SystemRoot::at(DATA), &opener));
        assert!(report.pt.usable(), "{:#?}", report.pt);
        for c in &report.pt.checks {
            assert_eq!(c.status, CheckStatus::Pass, "{c:?}");
        }
        let choice = choose_backend(BackendRequest::Auto, &report).unwrap();
        assert_eq!(choice.backend, Backend::Pt);
        assert!(choice.reason.starts_with("auto: Intel PT"));
        // The group the probe tried: PT leader (config from the format
        // files), load member with PERF_SAMPLE_AUX.
        let opened = opener.opened.borrow();
        let group = opened.last().unwrap();
        assert_eq!(group.len(), 2);
        assert_eq!(
            (group[0].pmu.as_str(), group[0].event_type),
            ("intel_pt", 8)
        );
        assert_eq!(
            group[0].words.config & (1 << 12 | 1 << 5 | 1 << 13),
            1 << 12 | 1 << 5
        );
        assert_eq!(
            (group[1].pmu.as_str(), group[1].words.config),
            ("cpu", 0x81d0)
        );
        assert_eq!(group[1].aux_sample_size, 16 * 1024);
        // The soft backend's self-test is reported as pending, not faked.
        assert_eq!(status(&report.soft, "self_test"), CheckStatus::Pending);
        assert!(report.soft.usable());
    }

    #[test]
    fn syscall_failures_are_explained() {
        let opener = FakeOpener::failing(libc::EOPNOTSUPP);
        let report = probe(&options(SystemRoot::at(DATA), &opener));
        let check = report.pt.check("load_event").unwrap();
        assert_eq!(check.status, CheckStatus::Fail);
        assert!(check.detail.contains("cannot sample"), "{}", check.detail);
        assert_eq!(status(&report.pt, "aux_sampling"), CheckStatus::Skipped);
        let choice = choose_backend(BackendRequest::Auto, &report).unwrap();
        assert_eq!(choice.backend, Backend::Soft);
        assert!(choice.reason.contains("load_event"), "{}", choice.reason);
    }

    #[test]
    fn no_intel_pt_pmu_means_soft_and_explicit_pt_fails_in_one_line() {
        let tree = copy_tree();
        std::fs::remove_dir_all(tree.path().join("sys/bus/event_source/devices/intel_pt")).unwrap();
        std::fs::write(
            tree.path().join("proc/cpuinfo"),
            "vendor_id\t: AuthenticAMD\n",
        )
        .unwrap();
        let opener = FakeOpener::ok();
        let report = probe(&options(SystemRoot::at(tree.path()), &opener));
        let pmu = report.pt.check("intel_pt_pmu").unwrap();
        assert_eq!(pmu.status, CheckStatus::Fail);
        assert!(pmu.detail.contains("AuthenticAMD"), "{}", pmu.detail);
        assert_eq!(status(&report.pt, "ptwrite"), CheckStatus::Skipped);
        let auto = choose_backend(BackendRequest::Auto, &report).unwrap();
        assert_eq!(auto.backend, Backend::Soft);
        let err = choose_backend(BackendRequest::Pt, &report).unwrap_err();
        let line = memgaze_error::one_line_of(&err);
        assert!(!line.contains('\n'));
        assert!(
            line.starts_with("--backend pt: Intel PT is unusable"),
            "{line}"
        );
        assert!(line.contains("intel_pt_pmu"), "{line}");
        assert_eq!(memgaze_error::exit_for_of(&err), memgaze_error::Exit::Error);
    }

    #[test]
    fn permissions_and_memlock() {
        let tree = copy_tree();
        let root = SystemRoot::at(tree.path());
        std::fs::write(
            tree.path().join("proc/sys/kernel/perf_event_paranoid"),
            "3\n",
        )
        .unwrap();
        let opener = FakeOpener::ok();
        let report = probe(&options(root.clone(), &opener));
        let check = report.pt.check("perf_permissions").unwrap();
        assert_eq!(check.status, CheckStatus::Fail);
        assert!(check.detail.contains("sysctl kernel.perf_event_paranoid=2"));
        // CAP_PERFMON (bit 38) overrides the paranoid level.
        let status_file = tree.path().join("proc/self/status");
        let text = std::fs::read_to_string(&status_file)
            .unwrap()
            .replace("CapEff:\t0000000000000000", "CapEff:\t0000004000000000");
        std::fs::write(&status_file, text).unwrap();
        let report = probe(&options(root.clone(), &opener));
        assert_eq!(status(&report.pt, "perf_permissions"), CheckStatus::Pass);

        // 16 CPUs × (16 + 32 + 1) pages = 3136 KiB fits in 516 KiB × 16 +
        // 8 MiB; 1024 AUX pages per CPU (64 MiB) do not.
        let mut big = options(root.clone(), &opener);
        assert_eq!(status(&probe(&big).pt, "mlock"), CheckStatus::Pass);
        big.buffers.aux_pages = 1024;
        let check = probe(&big).pt.check("mlock").unwrap().clone();
        assert_eq!(check.status, CheckStatus::Fail, "{}", check.detail);
        assert!(
            check.detail.contains("perf_event_mlock_kb="),
            "{}",
            check.detail
        );
    }

    #[test]
    fn old_kernel_and_no_ptwrite() {
        let tree = copy_tree();
        std::fs::write(
            tree.path().join("proc/sys/kernel/osrelease"),
            "5.4.0-150-generic\n",
        )
        .unwrap();
        std::fs::write(
            tree.path()
                .join("sys/bus/event_source/devices/intel_pt/caps/ptwrite"),
            "0\n",
        )
        .unwrap();
        let opener = FakeOpener::ok();
        let report = probe(&options(SystemRoot::at(tree.path()), &opener));
        assert_eq!(status(&report.pt, "kernel"), CheckStatus::Fail);
        assert_eq!(status(&report.pt, "ptwrite"), CheckStatus::Fail);
        assert_eq!(status(&report.pt, "pt_config"), CheckStatus::Fail);
        assert!(!report.pt.usable());
        assert_eq!(report.pt.first_failure().unwrap().name, "ptwrite");
    }

    #[test]
    fn soft_self_test_hook_is_used_when_wired() {
        let opener = FakeOpener::ok();
        let passing = || Ok("traced 12 loads of a 3-line program".to_string());
        let mut o = options(SystemRoot::at(DATA), &opener);
        o.soft_self_test = Some(&passing);
        assert_eq!(status(&probe(&o).soft, "self_test"), CheckStatus::Pass);
        let failing = || Err("the instrumented program crashed with SIGSEGV".into());
        o.soft_self_test = Some(&failing);
        let report = probe(&o);
        assert_eq!(status(&report.soft, "self_test"), CheckStatus::Fail);
        assert!(!report.soft.usable());
        // With PT usable, auto still works; explicit soft fails in one line.
        assert!(choose_backend(BackendRequest::Soft, &report).is_err());
    }

    #[test]
    fn explicit_soft_and_unusable_everything() {
        let tree = copy_tree();
        std::fs::remove_dir_all(tree.path().join("sys/bus/event_source/devices/intel_pt")).unwrap();
        std::fs::write(tree.path().join("proc/sys/kernel/arch"), "aarch64\n").unwrap();
        let opener = FakeOpener::ok();
        let report = probe(&options(SystemRoot::at(tree.path()), &opener));
        let err = choose_backend(BackendRequest::Auto, &report).unwrap_err();
        assert!(matches!(err, PtError::NoBackend { .. }), "{err}");
    }

    #[test]
    fn this_machine_probe_runs() {
        // Whatever this machine is, the live probe completes and the choice
        // is consistent with the report.
        let report = probe(&ProbeOptions::live(None));
        let choice = choose_backend(BackendRequest::Auto, &report);
        if report.pt.usable() {
            assert_eq!(choice.unwrap().backend, Backend::Pt);
        } else {
            assert!(choose_backend(BackendRequest::Pt, &report).is_err());
        }
    }
}
