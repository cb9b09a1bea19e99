//! The perf events of an Intel PT `ptwrite` collection, built from sysfs.
//!
//! Two events per CPU, as MemGaze used them:
//!
//! - the **`intel_pt` event**, group leader: `pt=1,branch=0` (branch
//!   tracing off: `branch` is only honoured when `pt` is set), `ptw=1,
//!   fup_on_ptw=1` (PTWRITE packets with the IP of the instruction), `tsc`,
//!   optionally `mtc`/`cyc` timing, the shortest PSB period the CPU allows
//!   (AUX samples start mid-stream and are decodable from their first PSB),
//!   user space only;
//! - the **load-sampling event**, a member of that group: the `cpu` PMU's
//!   `event=0xd0,umask=0x81` (MEM_INST_RETIRED.ALL_LOADS), whose overflow
//!   every `period` loads writes a `PERF_RECORD_SAMPLE` carrying the last
//!   `aux_sample_size` bytes of PT data (`PERF_SAMPLE_AUX`). The kernel
//!   requires the AUX event to lead the group (`perf_get_aux_event`), so
//!   the sampling event is the member, not the leader.
//!
//! Every bit position comes from the PMU's `format/*` files; capabilities
//! are checked against `caps/*` the way the kernel's `pt_event_valid` does,
//! so a bad combination fails here with a clear message rather than as an
//! `EINVAL` from `perf_event_open`.

use super::error::{PtError, Result};
use super::sysfs::{ConfigWords, Pmu, SystemRoot};
use perf_event_open_sys::bindings as sys;

/// `event` and `umask` of MEM_INST_RETIRED.ALL_LOADS (MemGaze's sampling
/// event; MEM_UOPS_RETIRED.ALL_LOADS on Atom cores has the same encoding).
pub(crate) const LOAD_EVENT: (u64, u64) = (0xd0, 0x81);

/// The largest AUX sample the kernel can put in one record (the record
/// size field is 16 bits; perf itself caps samples at 60 KiB).
pub(crate) const MAX_AUX_SAMPLE_SIZE: u32 = 60 * 1024;

/// Tunables of the `intel_pt` event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtOptions {
    /// TSC packets (timestamps in PSB+ and after enables).
    pub(crate) tsc: bool,
    /// MTC packets with this period exponent (`mtc_period`), when the CPU
    /// has MTC; `None` leaves MTC off.
    pub(crate) mtc_period: Option<u8>,
    /// CYC (cycle-accurate) packets. Off by default: they inflate the trace.
    pub(crate) cyc: bool,
    /// PSB period exponent (a PSB every `2^(n+11)` bytes); `None` picks the
    /// shortest the CPU allows.
    pub(crate) psb_period: Option<u8>,
}

impl Default for PtOptions {
    fn default() -> PtOptions {
        PtOptions {
            tsc: true,
            mtc_period: Some(3),
            cyc: false,
            psb_period: None,
        }
    }
}

/// One perf event, described independently of the kernel ABI struct (so it
/// can be compared and printed in tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EventConfig {
    /// PMU name (`intel_pt`, `cpu`, `cpu_core`, …).
    pub(crate) pmu: String,
    /// `perf_event_attr.type`.
    pub(crate) event_type: u32,
    /// `config`, `config1`, `config2`, `config3`.
    pub(crate) words: ConfigWords,
    /// Overflow period (0: a non-sampling event).
    pub(crate) sample_period: u64,
    /// `PERF_SAMPLE_*` bits.
    pub(crate) sample_type: u64,
    /// `PERF_FORMAT_*` bits.
    pub(crate) read_format: u64,
    /// Bytes of AUX data each sample carries (`PERF_SAMPLE_AUX`).
    pub(crate) aux_sample_size: u32,
    /// Count user space only.
    pub(crate) exclude_kernel: bool,
    /// Exclude the hypervisor.
    pub(crate) exclude_hv: bool,
    /// Created disabled.
    pub(crate) disabled: bool,
    /// Enabled by the kernel when the target calls `execve`.
    pub(crate) enable_on_exec: bool,
    /// Follow threads and children.
    pub(crate) inherit: bool,
    /// Emit `PERF_RECORD_MMAP2`, `COMM`, `FORK`/`EXIT` side-band records.
    pub(crate) side_band: bool,
    /// Append the sample id (tid, time, cpu) to non-sample records.
    pub(crate) sample_id_all: bool,
    /// Wake the reader after this many bytes of ring data (0: every event).
    pub(crate) wakeup_watermark: u32,
    /// Wake the reader after this many bytes of AUX data (0: kernel default).
    pub(crate) aux_watermark: u32,
}

/// The `sample_type` of both events: `IDENTIFIER` first lets the reader
/// find the event of any record, `TID`/`TIME`/`CPU` place it.
pub(crate) const SAMPLE_ID_BITS: u64 = sys::PERF_SAMPLE_IDENTIFIER as u64
    | sys::PERF_SAMPLE_TID as u64
    | sys::PERF_SAMPLE_TIME as u64
    | sys::PERF_SAMPLE_CPU as u64;

impl EventConfig {
    /// The kernel ABI struct.
    pub(crate) fn to_attr(&self) -> sys::perf_event_attr {
        let mut attr = sys::perf_event_attr {
            type_: self.event_type,
            size: std::mem::size_of::<sys::perf_event_attr>() as u32,
            config: self.words.config,
            sample_type: self.sample_type,
            read_format: self.read_format,
            aux_sample_size: self.aux_sample_size,
            ..Default::default()
        };
        attr.__bindgen_anon_1.sample_period = self.sample_period;
        attr.__bindgen_anon_3.config1 = self.words.config1;
        attr.__bindgen_anon_4.config2 = self.words.config2;
        attr.config3 = self.words.config3;
        attr.set_disabled(u64::from(self.disabled));
        attr.set_inherit(u64::from(self.inherit));
        attr.set_exclude_kernel(u64::from(self.exclude_kernel));
        attr.set_exclude_hv(u64::from(self.exclude_hv));
        attr.set_enable_on_exec(u64::from(self.enable_on_exec));
        attr.set_sample_id_all(u64::from(self.sample_id_all));
        if self.side_band {
            attr.set_mmap(1);
            attr.set_mmap2(1);
            attr.set_comm(1);
            attr.set_comm_exec(1);
            attr.set_task(1);
        }
        if self.wakeup_watermark > 0 {
            attr.set_watermark(1);
            attr.__bindgen_anon_2.wakeup_watermark = self.wakeup_watermark;
        }
        attr.aux_watermark = self.aux_watermark;
        attr
    }
}

/// The `intel_pt` PMU's sysfs name.
pub(crate) const INTEL_PT_PMU: &str = "intel_pt";

/// The `intel_pt` group leader of a ptwrite collection.
pub(crate) fn intel_pt_event(pmu: &Pmu, options: &PtOptions) -> Result<EventConfig> {
    if pmu.cap("ptwrite") != Some(1) {
        return Err(PtError::NoPtwrite {
            caps: pmu
                .caps
                .get("ptwrite")
                .map_or("missing", String::as_str)
                .to_string(),
        });
    }
    let mut words = ConfigWords::default();
    // `branch` is only honoured with `pt` set; without it the kernel turns
    // branch tracing on (arch/x86/events/intel/pt.c, pt_config).
    pmu.set(&mut words, "pt", 1)?;
    pmu.set(&mut words, "branch", 0)?;
    pmu.set(&mut words, "ptw", 1)?;
    pmu.set(&mut words, "fup_on_ptw", 1)?;
    if options.tsc {
        pmu.set(&mut words, "tsc", 1)?;
    }
    let psb_cyc = pmu.cap("psb_cyc") == Some(1);
    if psb_cyc {
        let allowed = pmu.cap("psb_periods").unwrap_or(0);
        let period = match options.psb_period {
            Some(p) => p,
            None if allowed == 0 => 0,
            None => allowed.trailing_zeros() as u8,
        };
        if !(period == 0 || (period < 64 && allowed >> period & 1 == 1)) {
            return Err(PtError::PsbPeriodNotAllowed {
                period: u32::from(period),
                allowed,
            });
        }
        pmu.set(&mut words, "psb_period", u64::from(period))?;
    } else if options.psb_period.is_some() {
        return Err(PtError::FixedPsbPeriod);
    }
    if let Some(period) = options.mtc_period
        && pmu.cap("mtc") == Some(1)
    {
        let allowed = pmu.cap("mtc_periods").unwrap_or(0);
        // Fall back to the shortest allowed period when the requested one
        // is not offered.
        let period = if period < 64 && allowed >> period & 1 == 1 {
            period
        } else if allowed != 0 {
            allowed.trailing_zeros() as u8
        } else {
            return Err(PtError::NoMtcPeriod);
        };
        pmu.set(&mut words, "mtc", 1)?;
        pmu.set(&mut words, "mtc_period", u64::from(period))?;
    }
    if options.cyc {
        if !psb_cyc {
            return Err(PtError::NoCyc);
        }
        pmu.set(&mut words, "cyc", 1)?;
    }
    Ok(EventConfig {
        pmu: pmu.name.clone(),
        event_type: pmu.event_type,
        words,
        sample_period: 0,
        sample_type: SAMPLE_ID_BITS,
        read_format: 0,
        aux_sample_size: 0,
        exclude_kernel: true,
        exclude_hv: true,
        disabled: true,
        enable_on_exec: true,
        inherit: true,
        side_band: true,
        sample_id_all: true,
        wakeup_watermark: 0,
        aux_watermark: 0,
    })
}

/// The load-sampling group member: every `period` loads, a sample with the
/// last `aux_sample_size` bytes of PT data.
pub(crate) fn load_sampling_event(
    pmu: &Pmu,
    period: u64,
    aux_sample_size: u32,
) -> Result<EventConfig> {
    if period == 0 {
        return Err(PtError::ZeroLoadPeriod);
    }
    if !(1..=MAX_AUX_SAMPLE_SIZE).contains(&aux_sample_size) {
        return Err(PtError::AuxSampleSize {
            size: aux_sample_size,
            max: MAX_AUX_SAMPLE_SIZE,
        });
    }
    let mut words = ConfigWords::default();
    pmu.set(&mut words, "event", LOAD_EVENT.0)?;
    pmu.set(&mut words, "umask", LOAD_EVENT.1)?;
    Ok(EventConfig {
        pmu: pmu.name.clone(),
        event_type: pmu.event_type,
        words,
        sample_period: period,
        sample_type: SAMPLE_ID_BITS | sys::PERF_SAMPLE_AUX as u64,
        read_format: sys::PERF_FORMAT_TOTAL_TIME_ENABLED as u64
            | sys::PERF_FORMAT_TOTAL_TIME_RUNNING as u64,
        aux_sample_size,
        exclude_kernel: true,
        exclude_hv: true,
        // Members follow their leader: enabled with it at exec.
        disabled: false,
        enable_on_exec: false,
        inherit: true,
        side_band: false,
        sample_id_all: true,
        wakeup_watermark: 0,
        aux_watermark: 0,
    })
}

/// The core PMUs that count loads: `cpu`, or on hybrid CPUs `cpu_core` and
/// `cpu_atom` (each with its `cpus` list).
pub(crate) fn load_pmus(root: &SystemRoot) -> Result<Vec<Pmu>> {
    if Pmu::exists(root, "cpu") {
        return Ok(vec![Pmu::load(root, "cpu")?]);
    }
    let hybrid: Vec<Pmu> = ["cpu_core", "cpu_atom"]
        .into_iter()
        .filter(|name| Pmu::exists(root, name))
        .map(|name| Pmu::load(root, name))
        .collect::<Result<_>>()?;
    if hybrid.is_empty() {
        return Err(PtError::NoCorePmu {
            devices: root.path(super::sysfs::EVENT_SOURCE_DEVICES),
        });
    }
    Ok(hybrid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_root() -> SystemRoot {
        SystemRoot::at(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/intel_pt_sysfs"
        ))
    }

    #[test]
    fn intel_pt_attr_from_real_format_strings() {
        let pmu = Pmu::load(&test_root(), INTEL_PT_PMU).unwrap();
        let event = intel_pt_event(&pmu, &PtOptions::default()).unwrap();
        // Bits from Linux arch/x86/events/intel/pt.c: pt config:0,
        // fup_on_ptw config:5, mtc config:9, tsc config:10, ptw config:12,
        // branch config:13 (clear), mtc_period config:14-17 (3),
        // psb_period config:24-27 (0: the shortest, 2 KiB).
        let want = 1 << 0 | 1 << 5 | 1 << 9 | 1 << 10 | 1 << 12 | 3 << 14;
        assert_eq!(
            event.words.config, want,
            "{:#x} vs {want:#x}",
            event.words.config
        );
        assert_eq!((event.words.config1, event.words.config2), (0, 0));
        let attr = event.to_attr();
        assert_eq!(attr.type_, pmu.event_type);
        assert_eq!(attr.config, want);
        assert_eq!(attr.exclude_kernel(), 1);
        assert_eq!(attr.exclude_hv(), 1);
        assert_eq!(attr.disabled(), 1);
        assert_eq!(attr.enable_on_exec(), 1);
        assert_eq!(attr.inherit(), 1);
        assert_eq!(
            (attr.mmap(), attr.mmap2(), attr.comm(), attr.task()),
            (1, 1, 1, 1)
        );
        assert_eq!(unsafe { attr.__bindgen_anon_1.sample_period }, 0);
        assert_eq!(
            attr.size as usize,
            std::mem::size_of::<sys::perf_event_attr>()
        );
    }

    #[test]
    fn pt_options_are_checked_against_caps() {
        let mut pmu = Pmu::load(&test_root(), INTEL_PT_PMU).unwrap();
        let cyc = intel_pt_event(
            &pmu,
            &PtOptions {
                cyc: true,
                psb_period: Some(2),
                ..PtOptions::default()
            },
        )
        .unwrap();
        assert_eq!(cyc.words.config >> 1 & 1, 1, "cyc is config:1");
        assert_eq!(
            cyc.words.config >> 24 & 0xf,
            2,
            "psb_period is config:24-27"
        );
        // A period the CPU does not list.
        assert!(
            intel_pt_event(
                &pmu,
                &PtOptions {
                    psb_period: Some(9),
                    ..PtOptions::default()
                }
            )
            .is_err()
        );
        // No PTWRITE: refused with the reason.
        pmu.caps.insert("ptwrite".into(), "0".into());
        let e = intel_pt_event(&pmu, &PtOptions::default()).unwrap_err();
        assert!(
            matches!(&e, PtError::NoPtwrite { caps } if caps == "0"),
            "{e}"
        );
    }

    #[test]
    fn format_fields_move_with_the_kernel() {
        // Nothing is hard-coded: a PMU whose `ptw` lives elsewhere gets it
        // there.
        let mut pmu = Pmu::load(&test_root(), INTEL_PT_PMU).unwrap();
        pmu.formats.insert(
            "ptw".into(),
            super::super::sysfs::FormatSpec::parse("config1:7").unwrap(),
        );
        let event = intel_pt_event(&pmu, &PtOptions::default()).unwrap();
        assert_eq!(event.words.config >> 12 & 1, 0);
        assert_eq!(event.words.config1, 1 << 7);
        pmu.formats.remove("fup_on_ptw");
        assert!(intel_pt_event(&pmu, &PtOptions::default()).is_err());
    }

    #[test]
    fn load_event_attr() {
        let pmus = load_pmus(&test_root()).unwrap();
        assert_eq!(pmus.len(), 1);
        let event = load_sampling_event(&pmus[0], 1_000_003, 16 * 1024).unwrap();
        assert_eq!(
            event.words.config, 0x81d0,
            "event=0xd0 (config:0-7), umask=0x81 (config:8-15)"
        );
        let attr = event.to_attr();
        assert_eq!(attr.type_, 4);
        assert_eq!(unsafe { attr.__bindgen_anon_1.sample_period }, 1_000_003);
        assert_eq!(attr.aux_sample_size, 16 * 1024);
        assert_ne!(attr.sample_type & sys::PERF_SAMPLE_AUX as u64, 0);
        assert_eq!(
            (attr.disabled(), attr.enable_on_exec(), attr.inherit()),
            (0, 0, 1)
        );
        assert!(load_sampling_event(&pmus[0], 0, 16 * 1024).is_err());
        assert!(load_sampling_event(&pmus[0], 1000, 128 * 1024).is_err());
    }

    #[test]
    fn multi_range_formats_as_on_amd_pmus() {
        // AMD's `cpu` PMU spreads `event` over config:0-7,32-35.
        let mut pmu = load_pmus(&test_root()).unwrap().remove(0);
        pmu.formats.insert(
            "event".into(),
            super::super::sysfs::FormatSpec::parse("config:0-7,32-35").unwrap(),
        );
        let mut words = ConfigWords::default();
        pmu.set(&mut words, "event", 0x1d0).unwrap();
        assert_eq!(words.config, 0xd0 | 1 << 32);
    }
}
