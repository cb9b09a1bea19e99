//! PMU descriptions from sysfs: event types, `format/*` bit layouts, `caps/*`.
//!
//! The kernel describes every perf PMU under
//! `/sys/bus/event_source/devices/<pmu>/`: `type` (the `perf_event_attr.type`
//! to use), `format/<field>` (where a named field lives in
//! `config`/`config1`/`config2`/`config3`, e.g. `config:0-7,32-35`), and for
//! some PMUs `caps/<name>` (hexadecimal capability values) and `cpus`.
//! Nothing here hard-codes a bit position: every configuration is built from
//! these files, so a kernel that moves a field keeps working.
//!
//! All paths go through [`SystemRoot`], so tests can point the whole probe at
//! a saved sysfs/procfs tree instead of the live one.

use super::error::{Context, PtError, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Where `sys/` and `proc/` are read from: `/` on a live system, a directory
/// of saved files in tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SystemRoot {
    root: PathBuf,
}

impl SystemRoot {
    /// The live system (`/sys`, `/proc`).
    pub(crate) fn live() -> SystemRoot {
        SystemRoot {
            root: PathBuf::from("/"),
        }
    }

    #[cfg(test)]
    /// A saved tree holding `sys/…` and `proc/…` below `root`.
    pub(crate) fn at(root: impl Into<PathBuf>) -> SystemRoot {
        SystemRoot { root: root.into() }
    }

    /// Whether this is the live system, where syscalls agree with the files.
    pub(crate) fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    /// The path of `relative` (e.g. `sys/bus/event_source/devices`).
    pub(crate) fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    /// Reads a small text file, trimmed of surrounding whitespace.
    pub(crate) fn read_trimmed(&self, relative: &str) -> io::Result<String> {
        std::fs::read_to_string(self.path(relative)).map(|s| s.trim().to_string())
    }
}

/// The directory holding every perf PMU, relative to a [`SystemRoot`].
pub(crate) const EVENT_SOURCE_DEVICES: &str = "sys/bus/event_source/devices";

/// One of the configuration words of `perf_event_attr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ConfigWord {
    /// `config`.
    Config,
    /// `config1`.
    Config1,
    /// `config2`.
    Config2,
    /// `config3`.
    Config3,
}

impl ConfigWord {
    fn parse(s: &str) -> Option<ConfigWord> {
        match s {
            "config" => Some(ConfigWord::Config),
            "config1" => Some(ConfigWord::Config1),
            "config2" => Some(ConfigWord::Config2),
            "config3" => Some(ConfigWord::Config3),
            _ => None,
        }
    }

    /// The spelling used in format files.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ConfigWord::Config => "config",
            ConfigWord::Config1 => "config1",
            ConfigWord::Config2 => "config2",
            ConfigWord::Config3 => "config3",
        }
    }
}

/// The four configuration words of an event, filled field by field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct ConfigWords {
    /// `perf_event_attr.config`.
    pub(crate) config: u64,
    /// `perf_event_attr.config1`.
    pub(crate) config1: u64,
    /// `perf_event_attr.config2`.
    pub(crate) config2: u64,
    /// `perf_event_attr.config3`.
    pub(crate) config3: u64,
}

impl ConfigWords {
    fn word_mut(&mut self, word: ConfigWord) -> &mut u64 {
        match word {
            ConfigWord::Config => &mut self.config,
            ConfigWord::Config1 => &mut self.config1,
            ConfigWord::Config2 => &mut self.config2,
            ConfigWord::Config3 => &mut self.config3,
        }
    }

    #[cfg(test)]
    fn word(&self, word: ConfigWord) -> u64 {
        match word {
            ConfigWord::Config => self.config,
            ConfigWord::Config1 => self.config1,
            ConfigWord::Config2 => self.config2,
            ConfigWord::Config3 => self.config3,
        }
    }
}

/// Where a named field lives: a configuration word and one or more bit
/// ranges, filled from the value's low bits upwards in the order listed
/// (the semantics of perf's own format parser).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FormatSpec {
    /// The word holding the field.
    pub(crate) word: ConfigWord,
    /// Inclusive bit ranges `(low, high)`, in value-bit order.
    pub(crate) ranges: Vec<(u8, u8)>,
}

/// Why a format string could not be parsed or a value not encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The text is not `configN:lo[-hi][,lo[-hi]…]`.
    #[error("malformed format `{0}` (expected e.g. `config:0-7,32-35`)")]
    Malformed(String),
    /// The value has bits set beyond the field's width.
    #[error("value {value:#x} does not fit the {width}-bit field")]
    TooWide {
        /// The value.
        value: u64,
        /// The field's width in bits.
        width: u32,
    },
}

impl FormatSpec {
    /// Parses a `format/*` file's content, e.g. `config:0-7,32-35`.
    pub(crate) fn parse(text: &str) -> Result<FormatSpec, FormatError> {
        let malformed = || FormatError::Malformed(text.trim().to_string());
        let (word, bits) = text.trim().split_once(':').ok_or_else(malformed)?;
        let word = ConfigWord::parse(word.trim()).ok_or_else(malformed)?;
        let mut ranges = Vec::new();
        let mut width = 0u32;
        for part in bits.split(',') {
            let part = part.trim();
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo, hi),
                None => (part, part),
            };
            let lo: u8 = lo.trim().parse().map_err(|_| malformed())?;
            let hi: u8 = hi.trim().parse().map_err(|_| malformed())?;
            if lo > hi || hi > 63 {
                return Err(malformed());
            }
            width += u32::from(hi - lo) + 1;
            ranges.push((lo, hi));
        }
        if ranges.is_empty() || width > 64 {
            return Err(malformed());
        }
        Ok(FormatSpec { word, ranges })
    }

    /// The field's width in bits.
    pub(crate) fn width(&self) -> u32 {
        self.ranges
            .iter()
            .map(|&(lo, hi)| u32::from(hi - lo) + 1)
            .sum()
    }

    /// Writes `value` into the field (clearing what was there).
    pub(crate) fn apply(&self, words: &mut ConfigWords, value: u64) -> Result<(), FormatError> {
        let width = self.width();
        if width < 64 && value >> width != 0 {
            return Err(FormatError::TooWide { value, width });
        }
        let word = words.word_mut(self.word);
        let mut rest = value;
        for &(lo, hi) in &self.ranges {
            let len = u32::from(hi - lo) + 1;
            let mask = low_mask(len);
            *word = (*word & !(mask << lo)) | ((rest & mask) << lo);
            rest = if len == 64 { 0 } else { rest >> len };
        }
        Ok(())
    }

    #[cfg(test)]
    /// Reads the field back out of `words`.
    pub(crate) fn extract(&self, words: &ConfigWords) -> u64 {
        let word = words.word(self.word);
        let mut value = 0u64;
        let mut shift = 0u32;
        for &(lo, hi) in &self.ranges {
            let len = u32::from(hi - lo) + 1;
            let part = (word >> lo) & low_mask(len);
            if shift < 64 {
                value |= part << shift;
            }
            shift += len;
        }
        value
    }
}

impl fmt::Display for FormatSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.word.as_str())?;
        for (i, &(lo, hi)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

fn low_mask(len: u32) -> u64 {
    if len >= 64 {
        u64::MAX
    } else {
        (1u64 << len) - 1
    }
}

/// A perf PMU as sysfs describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pmu {
    /// Directory name, e.g. `intel_pt`, `cpu`, `cpu_core`.
    pub(crate) name: String,
    /// The `perf_event_attr.type` value.
    pub(crate) event_type: u32,
    /// `format/*`: named fields.
    pub(crate) formats: BTreeMap<String, FormatSpec>,
    /// `caps/*`: raw capability strings (usually hexadecimal numbers).
    pub(crate) caps: BTreeMap<String, String>,
    /// `cpus`, when the PMU covers only some CPUs (hybrid CPUs).
    pub(crate) cpus: Option<Vec<u32>>,
}

impl Pmu {
    /// Whether a PMU directory of this name exists.
    pub(crate) fn exists(root: &SystemRoot, name: &str) -> bool {
        root.path(&format!("{EVENT_SOURCE_DEVICES}/{name}"))
            .is_dir()
    }

    /// Reads a PMU's `type`, `format/*`, `caps/*` and `cpus`.
    pub(crate) fn load(root: &SystemRoot, name: &str) -> Result<Pmu> {
        let dir = format!("{EVENT_SOURCE_DEVICES}/{name}");
        let type_path = format!("{dir}/type");
        let type_text = root
            .read_trimmed(&type_path)
            .with_context(|| format!("{}", root.path(&type_path).display()))?;
        let event_type: u32 = type_text.parse().with_context(|| {
            format!(
                "{}: `{type_text}` is not a PMU type number",
                root.path(&type_path).display()
            )
        })?;
        let formats = read_dir_files(root, &format!("{dir}/format"))?
            .into_iter()
            .map(|(field, text)| {
                FormatSpec::parse(&text)
                    .map(|spec| (field.clone(), spec))
                    .with_context(|| {
                        format!("{}", root.path(&format!("{dir}/format/{field}")).display())
                    })
            })
            .collect::<Result<BTreeMap<_, _>>>()?;
        let caps = read_dir_files(root, &format!("{dir}/caps"))?
            .into_iter()
            .collect();
        let cpus = match root.read_trimmed(&format!("{dir}/cpus")) {
            Ok(text) => Some(
                parse_cpu_list(&text)
                    .with_context(|| format!("{}", root.path(&format!("{dir}/cpus")).display()))?,
            ),
            Err(_) => None,
        };
        Ok(Pmu {
            name: name.to_string(),
            event_type,
            formats,
            caps,
            cpus,
        })
    }

    /// A capability as a number (`caps/*` files are printed with `%x`).
    pub(crate) fn cap(&self, name: &str) -> Option<u64> {
        let text = self.caps.get(name)?;
        u64::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
    }

    /// The layout of a named field.
    pub(crate) fn format(&self, field: &str) -> Result<&FormatSpec> {
        self.formats
            .get(field)
            .ok_or_else(|| PtError::MissingFormatField {
                pmu: self.name.clone(),
                field: field.to_string(),
            })
    }

    /// Sets a named field in `words`.
    pub(crate) fn set(&self, words: &mut ConfigWords, field: &str, value: u64) -> Result<()> {
        self.format(field)?
            .apply(words, value)
            .with_context(|| format!("{}/{field}", self.name))
    }

    /// Whether this PMU counts on `cpu` (true when it covers every CPU).
    pub(crate) fn covers_cpu(&self, cpu: u32) -> bool {
        self.cpus.as_ref().is_none_or(|cpus| cpus.contains(&cpu))
    }
}

/// Reads every regular file of a directory as `(name, trimmed content)`;
/// a missing directory reads as empty.
fn read_dir_files(root: &SystemRoot, relative: &str) -> Result<Vec<(String, String)>> {
    let dir = root.path(relative);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("{}", dir.display())),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("{}", dir.display()))?;
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // Some files (e.g. on hardened kernels) exist but are unreadable:
        // report what can be read and let the checks say what is missing.
        if let Ok(text) = std::fs::read_to_string(&path) {
            files.push((name.to_string(), text.trim().to_string()));
        }
    }
    files.sort();
    Ok(files)
}

/// Parses a kernel CPU list such as `0-3,8,10-11`.
pub(crate) fn parse_cpu_list(text: &str) -> Result<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.trim().is_empty()) {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<u32>()?, hi.parse::<u32>()?),
            None => {
                let cpu = part.parse::<u32>()?;
                (cpu, cpu)
            }
        };
        if lo > hi || hi - lo > 1 << 16 {
            return Err(PtError::BadCpuRange {
                part: part.to_string(),
            });
        }
        cpus.extend(lo..=hi);
    }
    Ok(cpus)
}

/// The online CPUs (`sys/devices/system/cpu/online`).
pub(crate) fn online_cpus(root: &SystemRoot) -> Result<Vec<u32>> {
    let rel = "sys/devices/system/cpu/online";
    let text = root
        .read_trimmed(rel)
        .with_context(|| format!("{}", root.path(rel).display()))?;
    parse_cpu_list(&text).with_context(|| format!("{}", root.path(rel).display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_bits_ranges_and_multi_range_specs() {
        let s = FormatSpec::parse("config:10\n").unwrap();
        assert_eq!(
            (s.word, s.ranges.clone(), s.width()),
            (ConfigWord::Config, vec![(10, 10)], 1)
        );
        let s = FormatSpec::parse("config:14-17").unwrap();
        assert_eq!(s.ranges, vec![(14, 17)]);
        let s = FormatSpec::parse("config:0-7,32-35").unwrap();
        assert_eq!(
            (s.width(), s.to_string()),
            (12, "config:0-7,32-35".to_string())
        );
        let s = FormatSpec::parse("config1:0-63").unwrap();
        assert_eq!((s.word, s.width()), (ConfigWord::Config1, 64));
        for bad in [
            "",
            "config",
            "config:",
            "config:7-3",
            "config:0-64",
            "conf:1",
            "config:a",
        ] {
            assert!(FormatSpec::parse(bad).is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn multi_range_values_spread_low_bits_first() {
        let s = FormatSpec::parse("config:0-7,32-35").unwrap();
        let mut w = ConfigWords::default();
        s.apply(&mut w, 0xabc).unwrap();
        assert_eq!(w.config, 0xbc | (0xa << 32));
        assert_eq!(s.extract(&w), 0xabc);
        assert!(s.apply(&mut w, 0x1000).is_err());
        // Re-applying clears the previous value.
        s.apply(&mut w, 0x001).unwrap();
        assert_eq!(w.config, 1);
    }

    #[test]
    fn full_width_fields_accept_every_value() {
        let s = FormatSpec::parse("config2:0-63").unwrap();
        let mut w = ConfigWords::default();
        s.apply(&mut w, u64::MAX).unwrap();
        assert_eq!((w.config2, s.extract(&w)), (u64::MAX, u64::MAX));
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n").unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert!(parse_cpu_list("3-1").is_err());
    }
}
