//! The per-record views the analysis does not keep: a time × address
//! heatmap and per-address access counts and inter-access distances,
//! computed in two streaming passes over a trace file.
//!
//! Pass 1 finds the touched pages (one set entry per 4 KiB page) and
//! whether there are few enough distinct addresses for one bar each; the
//! axes follow from them. Pass 2 bins every access into the fixed grids
//! and measures inter-access distances with a map of the current sample
//! only (cleared at each sample: small and cache-resident for sampled
//! traces). Memory is bounded by the touched pages and the largest sample,
//! never by the trace length, and no per-record lookup touches a large
//! table: a full trace of 100 M records streams through like a 1 % sample.
//!
//! Only observed accesses (Strided and Irregular records) are counted, as
//! everywhere in docs/METRICS.md; Constant loads touch the stack and
//! scalars and would only add noise here.

use anyhow::{Context, Result};
use memgaze_trace::{TraceError, TraceEvent, TraceReader};
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// Page granularity at which touched memory is found (the x86-64 page).
const PAGE_SHIFT: u32 = 12;

/// Grid sizes and the address-axis compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileOptions {
    /// Heatmap columns (time bins).
    pub columns: usize,
    /// Heatmap rows (address bins over the touched ranges).
    pub rows: usize,
    /// Most bars of the per-address chart: up to this many distinct
    /// addresses get one bar each; more are pooled into this many ranges.
    pub address_bins: usize,
    /// Most separate address ranges shown; beyond it the closest ranges
    /// are joined.
    pub max_ranges: usize,
    /// Untouched gaps at least this large (bytes) split the address axis.
    pub split_gap: u64,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            columns: 240,
            rows: 120,
            address_bins: 200,
            max_ranges: 8,
            split_gap: 1 << 20,
        }
    }
}

/// A touched address range and the slots (heatmap rows or chart bins) it
/// occupies on a compressed axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressRange {
    /// First byte (page aligned).
    pub start: u64,
    /// One past the last byte (page aligned).
    pub end: u64,
    /// First slot.
    pub first: usize,
    /// Slots it occupies (≥ 1).
    pub slots: usize,
}

/// An address axis with the untouched gaps between ranges cut out: heap,
/// stack and globals lie terabytes apart, and a linear axis would show
/// three lines. Within a range the mapping is linear.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct AddressAxis {
    /// Ranges in address order, slots in the same order.
    pub ranges: Vec<AddressRange>,
    /// Total slots.
    pub slots: usize,
}

impl AddressAxis {
    /// Builds an axis of `slots` slots over the touched `pages` (page
    /// numbers, sorted, distinct).
    fn from_pages(pages: &[u64], slots: usize, options: &ProfileOptions) -> AddressAxis {
        let mut spans = touched_spans(pages, options.split_gap >> PAGE_SHIFT);
        join_closest(&mut spans, options.max_ranges.max(1));
        if spans.is_empty() {
            return AddressAxis::default();
        }
        let slots = slots.max(spans.len());
        let sizes = allocate(&spans, slots);
        let mut first = 0;
        let ranges = spans
            .iter()
            .zip(sizes)
            .map(|(&(lo, hi), n)| {
                let range = AddressRange {
                    start: lo << PAGE_SHIFT,
                    end: (hi + 1).saturating_mul(1 << PAGE_SHIFT),
                    first,
                    slots: n,
                };
                first += n;
                range
            })
            .collect();
        AddressAxis { ranges, slots }
    }

    /// The slot of `address`, `None` outside every range.
    pub fn slot_of(&self, address: u64) -> Option<usize> {
        let i = self.ranges.partition_point(|r| r.start <= address);
        let range = self.ranges.get(i.checked_sub(1)?)?;
        if address >= range.end {
            return None;
        }
        let offset = (address - range.start) as u128;
        let span = (range.end - range.start) as u128;
        Some(range.first + (offset * range.slots as u128 / span) as usize)
    }

    /// The address range `[start, end)` a slot covers.
    pub fn slot_span(&self, slot: usize) -> Option<(u64, u64)> {
        let range = self
            .ranges
            .iter()
            .find(|r| slot >= r.first && slot < r.first + r.slots)?;
        let span = (range.end - range.start) as u128;
        let at = |i: usize| range.start + (span * i as u128 / range.slots as u128) as u64;
        Some((at(slot - range.first), at(slot - range.first + 1)))
    }
}

/// Maximal runs of pages whose gaps are smaller than `gap` pages.
fn touched_spans(pages: &[u64], gap: u64) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for &page in pages {
        match spans.last_mut() {
            Some((_, hi)) if page - *hi <= gap.max(1) => *hi = page,
            _ => spans.push((page, page)),
        }
    }
    spans
}

/// Joins neighbouring spans across the smallest gaps until at most `max`
/// remain, the smallest gap first and, among equal gaps, the leftmost.
///
/// Joining two spans leaves every other gap as it was (the joined span
/// starts where the left one did and ends where the right one did), so
/// this is the same as removing the `len - max` smallest gaps by (size,
/// position) at once: a selection, O(n log n) at worst, where joining one
/// pair at a time was quadratic (8.9 s for 100 K spans).
fn join_closest(spans: &mut Vec<(u64, u64)>, max: usize) {
    if spans.len() <= max {
        return;
    }
    let mut gaps: Vec<(u64, usize)> = spans
        .windows(2)
        .enumerate()
        .map(|(i, pair)| (pair[1].0 - pair[0].1, i))
        .collect();
    let joins = spans.len() - max;
    gaps.select_nth_unstable(joins - 1);
    let mut joined = vec![false; spans.len()];
    for &(_, i) in &gaps[..joins] {
        // The gap after span `i` goes: span `i + 1` continues span `i`.
        joined[i + 1] = true;
    }
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(max);
    for (span, continues) in spans.iter().zip(joined) {
        match out.last_mut() {
            Some(last) if continues => last.1 = span.1,
            _ => out.push(*span),
        }
    }
    *spans = out;
}

/// Slots per span: a few for every span (a small stack range must stay
/// visible), the rest in proportion to the span's size.
fn allocate(spans: &[(u64, u64)], slots: usize) -> Vec<usize> {
    if spans.is_empty() {
        return Vec::new();
    }
    let floor = (slots / (3 * spans.len())).clamp(1, 6);
    let rest = slots - floor * spans.len();
    let sizes: Vec<f64> = spans.iter().map(|(lo, hi)| (hi - lo + 1) as f64).collect();
    let total: f64 = sizes.iter().sum();
    let exact: Vec<f64> = sizes.iter().map(|s| rest as f64 * s / total).collect();
    let mut out: Vec<usize> = exact.iter().map(|e| floor + e.floor() as usize).collect();
    // Largest remainders take the slots rounding left over.
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    let mut left = slots - out.iter().sum::<usize>();
    for i in order.into_iter().cycle() {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

/// Accesses binned by time (columns) and compressed address (rows).
#[derive(Clone, Debug, PartialEq)]
pub struct Heatmap {
    /// Time bins.
    pub columns: usize,
    /// Address bins.
    pub rows: usize,
    /// `cells[row * columns + column]`; row 0 holds the lowest addresses.
    pub cells: Vec<u32>,
    /// The rows' address ranges.
    pub axis: AddressAxis,
    /// Observed accesses along the time axis (the x extent).
    pub accesses: u64,
}

impl Heatmap {
    /// Accesses in one cell.
    pub fn cell(&self, row: usize, column: usize) -> u32 {
        self.cells[row * self.columns + column]
    }
}

/// Accesses and inter-access distances of one address or address range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AddressBin {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Accesses to it.
    pub accesses: u64,
    /// Inter-access distances observed (repeat accesses within a sample).
    pub intervals: u64,
    /// Mean inter-access distance, in accesses.
    pub interval_mean: Option<f64>,
    /// Standard deviation of the inter-access distance.
    pub interval_std: Option<f64>,
}

/// The classic access-pattern views: accesses and mean ± std of the
/// inter-access distance, per address (or per address range when there
/// are more distinct addresses than bars).
#[derive(Clone, Debug, PartialEq)]
pub struct AddressProfile {
    /// Whether each bin is one address (else a range of the axis).
    pub per_address: bool,
    /// Bins in address order.
    pub bins: Vec<AddressBin>,
    /// The bins' ranges on a compressed axis (slots are bin indices).
    pub axis: AddressAxis,
    /// Distinct addresses accessed, when counted (per-address view only).
    pub distinct: Option<u64>,
}

/// Everything the two passes found.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceProfile {
    /// The time × address heatmap.
    pub heatmap: Heatmap,
    /// Accesses and inter-access distances per address.
    pub addresses: AddressProfile,
    /// Observed accesses (Strided + Irregular records).
    pub accesses: u64,
    /// Records of any class.
    pub records: u64,
    /// Samples in the trace.
    pub samples: u64,
    /// Whether the trace is a full trace (one sample of every record).
    pub full: bool,
}

/// Distances and counts pooled over one bin.
#[derive(Clone, Copy, Default)]
struct BinStat {
    accesses: u64,
    intervals: u64,
    sum: f64,
    sum_squares: f64,
}

impl BinStat {
    fn into_bin(self, start: u64, end: u64) -> AddressBin {
        let (interval_mean, interval_std) = if self.intervals == 0 {
            (None, None)
        } else {
            let n = self.intervals as f64;
            let mean = self.sum / n;
            let variance = (self.sum_squares / n - mean * mean).max(0.0);
            (Some(mean), Some(variance.sqrt()))
        };
        AddressBin {
            start,
            end,
            accesses: self.accesses,
            intervals: self.intervals,
            interval_mean,
            interval_std,
        }
    }
}

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Profiles the trace file at `path`.
pub fn profile_trace(path: &Path, options: &ProfileOptions) -> Result<TraceProfile> {
    profile(|| TraceReader::open(path), options).with_context(|| path.display().to_string())
}

/// Profiles a trace that `open` reads from the start (it is called twice).
pub fn profile<R: Read>(
    mut open: impl FnMut() -> Result<TraceReader<R>, TraceError>,
    options: &ProfileOptions,
) -> Result<TraceProfile> {
    // Pass 1: touched pages, accesses, and the distinct addresses while
    // there are few enough for one bar each.
    let mut reader = open()?;
    let header = reader.header().clone();
    let is_access: Vec<bool> = header.loads.iter().map(|l| l.class.is_access()).collect();
    let mut pages: FastMap<u64, ()> = FastMap::default();
    let mut few: Option<Vec<u64>> = Some(Vec::new());
    let (mut accesses, mut records, mut last_page) = (0u64, 0u64, u64::MAX);
    while let Some(raw) = reader.next_raw()? {
        // The profile shows the time samples; spatial records are not in them.
        if raw.spatial {
            continue;
        }
        records += 1;
        if !is_access[raw.load as usize] {
            continue;
        }
        accesses += 1;
        let page = raw.addr >> PAGE_SHIFT;
        if page != last_page {
            pages.insert(page, ());
            last_page = page;
        }
        if let Some(list) = &mut few
            && let Err(at) = list.binary_search(&raw.addr)
        {
            if list.len() == options.address_bins {
                few = None;
            } else {
                list.insert(at, raw.addr);
            }
        }
    }
    let samples = reader.samples_read();
    let mut pages: Vec<u64> = pages.into_keys().collect();
    pages.sort_unstable();

    let heatmap_axis = AddressAxis::from_pages(&pages, options.rows, options);
    let (address_axis, per_address) = match &few {
        Some(list) => (
            by_rank(AddressAxis::from_pages(&pages, 0, options), list),
            true,
        ),
        None => (
            AddressAxis::from_pages(&pages, options.address_bins, options),
            false,
        ),
    };
    let address_slot = |addr: u64| match &few {
        Some(list) => list.binary_search(&addr).ok(),
        None => address_axis.slot_of(addr),
    };

    // Pass 2: the grids, and inter-access distances within each run of
    // one sample and one thread (across samples the gap is unknown).
    let columns = options.columns.max(1);
    let rows = heatmap_axis.slots;
    let mut cells = vec![0u32; rows * columns];
    let mut bins = vec![BinStat::default(); address_axis.slots];
    let mut last_seen: FastMap<u64, u64> = FastMap::default();
    let mut reader = open()?;
    let mut index = 0u64;
    while let Some(event) = reader.next_event()? {
        let raw = match event {
            TraceEvent::Sample { .. } | TraceEvent::Thread { .. } | TraceEvent::Spatial { .. } => {
                last_seen.clear();
                continue;
            }
            TraceEvent::Record(raw) if raw.spatial => continue,
            TraceEvent::Record(raw) => raw,
        };
        if !is_access.get(raw.load as usize).copied().unwrap_or(false) {
            continue;
        }
        if index >= accesses {
            anyhow::bail!("trace changed between the two passes of the report");
        }
        let column = (index as u128 * columns as u128 / accesses as u128) as usize;
        if let Some(row) = heatmap_axis.slot_of(raw.addr) {
            let cell = &mut cells[row * columns + column];
            *cell = cell.saturating_add(1);
        }
        if let Some(slot) = address_slot(raw.addr) {
            let bin = &mut bins[slot];
            bin.accesses += 1;
            if let Some(previous) = last_seen.insert(raw.addr, index) {
                let d = (index - previous) as f64;
                bin.intervals += 1;
                bin.sum += d;
                bin.sum_squares += d * d;
            }
        }
        index += 1;
    }
    let address_bins = bins
        .into_iter()
        .enumerate()
        .map(|(slot, stat)| match &few {
            Some(list) => stat.into_bin(list[slot], list[slot] + 1),
            None => {
                let (start, end) = address_axis.slot_span(slot).unwrap_or((0, 0));
                stat.into_bin(start, end)
            }
        })
        .collect();
    Ok(TraceProfile {
        heatmap: Heatmap {
            columns,
            rows,
            cells,
            axis: heatmap_axis,
            accesses,
        },
        addresses: AddressProfile {
            per_address,
            bins: address_bins,
            axis: address_axis,
            distinct: few.map(|list| list.len() as u64),
        },
        accesses,
        records,
        samples,
        full: header.sampling.is_full(),
    })
}

/// Re-expresses an axis in address ranks: slot `i` is the `i`-th distinct
/// address, so that per-address bars keep their range labels.
fn by_rank(axis: AddressAxis, addresses: &[u64]) -> AddressAxis {
    let ranges = axis
        .ranges
        .iter()
        .map(|r| {
            let first = addresses.partition_point(|a| *a < r.start);
            let last = addresses.partition_point(|a| *a < r.end);
            AddressRange {
                first,
                slots: last - first,
                ..*r
            }
        })
        .collect();
    AddressAxis {
        ranges,
        slots: addresses.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The quadratic original: one join at a time, across the smallest
    /// gap, the leftmost among equals.
    fn join_closest_reference(spans: &mut Vec<(u64, u64)>, max: usize) {
        while spans.len() > max {
            let i = (0..spans.len() - 1)
                .min_by_key(|&i| spans[i + 1].0 - spans[i].1)
                .expect("at least two spans");
            spans[i].1 = spans[i + 1].1;
            spans.remove(i + 1);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 2000,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]
        /// The same joins as the reference, ties (frequent: gaps drawn
        /// from a few sizes) included.
        #[test]
        fn join_closest_matches_the_reference(
            steps in proptest::collection::vec((0u64..4, 0u64..3), 0..60),
            max in 1usize..10,
        ) {
            let mut spans = Vec::new();
            let mut at = 0u64;
            for (gap, len) in steps {
                let lo = at + 1 + gap * 3;
                spans.push((lo, lo + len));
                at = lo + len;
            }
            let mut fast = spans.clone();
            join_closest(&mut fast, max);
            join_closest_reference(&mut spans, max);
            prop_assert_eq!(fast, spans);
        }
    }

    /// 100 K separate spans: was 8.9 s; prints the time (not asserted
    /// tightly: shared CI machines vary), fails only past 5 s.
    #[test]
    fn join_closest_of_100k_spans_is_fast() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut at = 0u64;
        let mut spans = Vec::with_capacity(100_000);
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            at += 2 + x % 1000;
            spans.push((at, at));
        }
        let started = std::time::Instant::now();
        join_closest(&mut spans, 8);
        let elapsed = started.elapsed();
        eprintln!("join_closest: 100 000 spans → 8 in {elapsed:?}");
        assert_eq!(spans.len(), 8);
        assert!(elapsed.as_secs_f64() < 5.0, "{elapsed:?}");
    }
    use memgaze_trace::{
        Backend, LoadClass, LoadEntry, Sampling, TraceHeader, TraceTotals, TraceWriter,
    };

    fn trace(sampling: Sampling, samples: &[Vec<(u32, u64)>]) -> Vec<u8> {
        let header = TraceHeader {
            backend: Backend::Soft,
            sampling,
            binary: None,
            command: vec![],
            functions: vec![],
            loads: [
                LoadClass::Strided,
                LoadClass::Irregular,
                LoadClass::Constant,
            ]
            .iter()
            .enumerate()
            .map(|(i, class)| LoadEntry {
                ip: 0x1000 + i as u64,
                class: *class,
                implied: 0,
                function: None,
                line: None,
                proxy: None,
            })
            .collect(),
            labels: vec![],
            spatial: None,
        };
        let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
        for sample in samples {
            w.begin_sample(0).unwrap();
            for (load, addr) in sample {
                w.push(*load, *addr).unwrap();
            }
        }
        let totals = TraceTotals::clean(w.records(), w.records(), w.samples());
        w.finish(&totals).unwrap()
    }

    fn run(bytes: &[u8], options: &ProfileOptions) -> TraceProfile {
        profile(|| TraceReader::new(bytes), options).unwrap()
    }

    #[test]
    fn inter_access_distances_stay_within_samples() {
        // Address 0x100 every 4th access in sample 0, once in sample 1.
        let s0: Vec<(u32, u64)> = (0..12)
            .map(|i| (0, if i % 4 == 0 { 0x100 } else { 0x200 + i }))
            .collect();
        let s1 = vec![(0, 0x100), (2, 0x100), (1, 0x300)];
        let bytes = trace(
            Sampling {
                window: 12,
                period: 100,
                seed: None,
            },
            &[s0, s1],
        );
        let p = run(&bytes, &ProfileOptions::default());
        assert_eq!(p.accesses, 14, "Constant records are not accesses");
        assert_eq!(p.records, 15);
        assert!(p.addresses.per_address);
        let bin = p.addresses.bins.iter().find(|b| b.start == 0x100).unwrap();
        assert_eq!(bin.accesses, 4);
        assert_eq!(
            bin.intervals, 2,
            "the access in sample 1 has no earlier access in its sample"
        );
        assert_eq!(bin.interval_mean, Some(4.0));
        assert_eq!(bin.interval_std, Some(0.0));
        let once = p.addresses.bins.iter().find(|b| b.start == 0x300).unwrap();
        assert_eq!(
            (once.accesses, once.intervals, once.interval_mean),
            (1, 0, None)
        );
    }

    #[test]
    fn gaps_between_heap_and_stack_are_cut_out() {
        let heap = 0x5555_0000_0000u64;
        let stack = 0x7ffd_0000_0000u64;
        let mut sample = Vec::new();
        for i in 0..4096u64 {
            sample.push((0, heap + 8 * i));
        }
        for i in 0..64u64 {
            sample.push((1, stack + 8 * (i % 8)));
        }
        let bytes = trace(Sampling::full(), &[sample]);
        let options = ProfileOptions {
            rows: 40,
            columns: 10,
            address_bins: 50,
            ..Default::default()
        };
        let p = run(&bytes, &options);
        let axis = &p.heatmap.axis;
        assert_eq!(axis.ranges.len(), 2);
        assert_eq!(axis.ranges[0].start, heap);
        assert_eq!(axis.ranges[0].end, heap + 32 * 1024);
        assert_eq!(axis.ranges[1].start, stack);
        assert_eq!(axis.slots, 40);
        assert!(
            axis.ranges[1].slots >= 1,
            "the small range keeps rows of its own"
        );
        assert_eq!(axis.slot_of(heap), Some(0));
        assert_eq!(axis.slot_of(stack - 1), None);
        assert_eq!(axis.slot_of(stack), Some(axis.ranges[1].first));
        // Every access lands in the grid, in time order.
        let total: u64 = p.heatmap.cells.iter().map(|c| *c as u64).sum();
        assert_eq!(total, 4096 + 64);
        let last_column: u64 = (0..p.heatmap.rows)
            .map(|r| p.heatmap.cell(r, 9) as u64)
            .sum();
        let stack_rows = axis.ranges[1].first..axis.slots;
        let stack_last: u64 = stack_rows.map(|r| p.heatmap.cell(r, 9) as u64).sum();
        assert_eq!(stack_last, 64, "the stack accesses come last");
        assert!(last_column >= 64);
        // More distinct addresses than bars: ranges are pooled.
        assert!(!p.addresses.per_address);
        assert_eq!(p.addresses.bins.len(), 50);
        let pooled: u64 = p.addresses.bins.iter().map(|b| b.accesses).sum();
        assert_eq!(pooled, 4096 + 64);
        assert_eq!(p.addresses.distinct, None, "not counted when pooled");
    }

    #[test]
    fn many_ranges_are_joined_across_the_smallest_gaps() {
        let mut sample = Vec::new();
        for r in 0..12u64 {
            sample.push((1, (r + 1) << 32));
        }
        sample.push((1, (1 << 32) + (2 << 20)));
        let bytes = trace(Sampling::full(), &[sample]);
        let options = ProfileOptions {
            max_ranges: 4,
            rows: 20,
            ..Default::default()
        };
        let p = run(&bytes, &options);
        assert_eq!(p.heatmap.axis.ranges.len(), 4);
        let sizes: usize = p.heatmap.axis.ranges.iter().map(|r| r.slots).sum();
        assert_eq!(sizes, 20);
        for a in (1..=12u64).map(|r| r << 32) {
            assert!(p.heatmap.axis.slot_of(a).is_some(), "{a:#x} is on the axis");
        }
    }

    #[test]
    fn an_empty_trace_profiles_to_empty_grids() {
        let bytes = trace(Sampling::full(), &[vec![(2, 0x10)]]);
        let p = run(&bytes, &ProfileOptions::default());
        assert_eq!(p.accesses, 0);
        assert!(p.addresses.bins.is_empty());
        assert!(p.heatmap.cells.iter().all(|c| *c == 0));
    }
}
