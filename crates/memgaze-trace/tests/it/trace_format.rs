//! Property tests of the trace file format: arbitrary traces round-trip;
//! arbitrary truncation and byte damage give an error, never a panic and
//! never silently different data.

use memgaze_trace::{
    Backend, LoadClass, LoadEntry, Sampling, TraceError, TraceEvent, TraceHeader, TraceReader,
    TraceTotals, TraceWriter,
};
use proptest::prelude::*;

fn header(loads: usize) -> TraceHeader {
    TraceHeader {
        backend: Backend::Soft,
        sampling: Sampling {
            window: 16,
            period: 64,
            seed: None,
        },
        binary: None,
        command: vec![],
        functions: vec![],
        loads: (0..loads)
            .map(|i| LoadEntry {
                ip: 0x1000 + 4 * i as u64,
                class: LoadClass::ALL[i % 3],
                implied: (i % 4) as u32,
                function: None,
                line: None,
                proxy: None,
            })
            .collect(),
        labels: vec![],
        spatial: None,
    }
}

/// One event of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// A sample of this thread begins.
    Sample(u32),
    /// Spatial records of this thread follow.
    Spatial(u32),
    /// A record `(load, addr)`.
    Record(u32, u64),
}

/// A trace as events.
type Events = Vec<Event>;

fn events(loads: u32) -> impl Strategy<Value = Events> {
    let addr = prop_oneof![any::<u64>(), 0u64..256, Just(u64::MAX)];
    let event = prop_oneof![
        1 => (0u32..4).prop_map(Event::Sample),
        1 => (0u32..4).prop_map(Event::Spatial),
        8 => (0..loads, addr).prop_map(|(l, a)| Event::Record(l, a)),
    ];
    // Spatial records may come before the first sample.
    (
        prop_oneof![
            (0u32..4).prop_map(Event::Sample),
            (0u32..4).prop_map(Event::Spatial)
        ],
        prop::collection::vec(event, 0..300),
    )
        .prop_map(|(first, mut v)| {
            v.insert(0, first);
            v
        })
}

/// The totals of what `w` wrote.
fn totals_of<W: std::io::Write>(w: &TraceWriter<W>) -> TraceTotals {
    TraceTotals {
        spatial_records: w.spatial_records(),
        ..TraceTotals::clean(w.records() * 3, w.records(), w.samples())
    }
}

fn write(loads: usize, events: &Events) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &header(loads)).unwrap();
    for e in events {
        match *e {
            Event::Sample(thread) => w.begin_sample(thread).unwrap(),
            Event::Spatial(thread) => w.begin_spatial(thread).unwrap(),
            Event::Record(load, addr) => w.push(load, addr).unwrap(),
        }
    }
    let totals = totals_of(&w);
    w.finish(&totals).unwrap()
}

fn read(bytes: &[u8]) -> Result<Events, TraceError> {
    let mut r = TraceReader::new(bytes)?;
    let mut out = Vec::new();
    let (mut spatial, mut thread) = (false, 0);
    while let Some(e) = r.next_event()? {
        match e {
            TraceEvent::Sample { thread: t, .. } => {
                (spatial, thread) = (false, t);
                out.push(Event::Sample(t))
            }
            TraceEvent::Spatial { thread: t } => {
                (spatial, thread) = (true, t);
                out.push(Event::Spatial(t))
            }
            TraceEvent::Thread { .. } => unreachable!("no thread switches written"),
            TraceEvent::Record(rec) => {
                assert_eq!((rec.spatial, rec.thread), (spatial, thread));
                out.push(Event::Record(rec.load, rec.addr))
            }
        }
    }
    assert!(r.totals().is_some());
    Ok(out)
}

/// Every record as `(load, addr, sample, thread, spatial)`.
type Flat = Vec<(u32, u64, u64, u32, bool)>;

/// An independent decoder written from the module documentation, one byte
/// at a time with no shortcuts: what the file says, for comparison with the
/// reader's batched decoding.
fn reference_decode(bytes: &[u8]) -> Flat {
    let mut out = Vec::new();
    assert_eq!(&bytes[..8], &memgaze_trace::format::MAGIC);
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
    assert!(version == 2 || version == 3);
    let (mut sample, mut thread, mut spatial) = (None::<u64>, 0u32, false);
    let mut samples = 0u64;
    let mut at = 12;
    let number = |data: &[u8], len: usize| -> u64 {
        (0..len).fold(0u64, |v, i| v | (u64::from(data[i]) << (8 * i)))
    };
    while at < bytes.len() {
        let kind = bytes[at];
        let stored = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        let chunk = &bytes[at + 16..at + 16 + stored];
        at += 16 + stored;
        if kind != b'R' {
            continue;
        }
        let raw = zstd::decode_all(chunk).unwrap();
        let events = u32::from_le_bytes(raw[8..12].try_into().unwrap()) as usize;
        let (head, mut data) = (&raw[12..12 + events], &raw[12 + events..]);
        let mut last: std::collections::HashMap<u64, (u64, u64)> = Default::default();
        for &byte in head {
            let (k, n) = (usize::from(byte & 15), usize::from(byte >> 4));
            match k {
                0..=8 => {
                    let load = if n < 12 {
                        n as u64
                    } else {
                        let v = 12 + number(data, n - 11);
                        data = &data[n - 11..];
                        v
                    };
                    let (addr, stride) = last.get(&load).copied().unwrap_or((0, 0));
                    let delta = if k == 0 {
                        stride
                    } else {
                        let z = number(data, k);
                        data = &data[k..];
                        (((z >> 1) as i64) ^ -((z & 1) as i64)) as u64
                    };
                    let addr = addr.wrapping_add(delta);
                    last.insert(load, (addr, delta));
                    assert!(spatial || sample.is_some());
                    out.push((load as u32, addr, sample.unwrap_or(0), thread, spatial));
                }
                9..=11 if k < 11 || version >= 3 => {
                    thread = number(data, n) as u32;
                    data = &data[n..];
                    spatial = k == 11;
                    if k == 9 {
                        sample = Some(samples);
                        samples += 1;
                    }
                }
                _ => panic!("invalid head byte {byte:#x}"),
            }
        }
        assert!(data.is_empty());
    }
    out
}

/// Records as `next_raw`, `for_each_raw` (after `skip` records read one by
/// one) and `next_event` see them.
fn three_ways(bytes: &[u8], skip: usize) -> [Flat; 3] {
    let flat = |r: memgaze_trace::RawRecord| (r.load, r.addr, r.sample, r.thread, r.spatial);
    let mut reader = TraceReader::new(bytes).unwrap();
    let mut by_raw = Vec::new();
    while let Some(r) = reader.next_raw().unwrap() {
        by_raw.push(flat(r));
    }
    let mut reader = TraceReader::new(bytes).unwrap();
    let mut by_visit = Vec::new();
    for _ in 0..skip {
        match reader.next_raw().unwrap() {
            Some(r) => by_visit.push(flat(r)),
            None => break,
        }
    }
    reader.for_each_raw(|r| by_visit.push(flat(r))).unwrap();
    assert!(reader.totals().is_some());
    let mut reader = TraceReader::new(bytes).unwrap();
    let mut by_event = Vec::new();
    while let Some(e) = reader.next_event().unwrap() {
        if let TraceEvent::Record(r) = e {
            by_event.push(flat(r));
        }
    }
    [by_raw, by_visit, by_event]
}

/// A trace with thread switches and load sites of every encoded width.
fn wide_events() -> impl Strategy<Value = Vec<(u8, u32, u64)>> {
    let load = prop_oneof![0u32..12, 12u32..300, 0u32..70_000];
    let addr = prop_oneof![
        any::<u64>(),
        0u64..256,
        Just(u64::MAX),
        (0u64..64).prop_map(|i| 0x7f00_0000 + 8 * i)
    ];
    prop::collection::vec((0u8..20, load, addr), 0..400)
}

proptest! {
    // Few cases: each writes a header of 70 000 load sites (for load site
    // numbers of three bytes).
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn batched_readers_agree_with_a_reference_decoder(
        events in wide_events(),
        skip in 0usize..50,
    ) {
        // Event kinds: 0 begins a sample, 1 switches thread (back to the
        // sample), 2 begins spatial records, else a record (strided runs
        // come from the small-address choices).
        let loads = 70_000;
        let header = header(loads);
        let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
        w.begin_sample(7).unwrap();
        for &(kind, load, addr) in &events {
            match kind {
                0 => w.begin_sample(load.wrapping_mul(65_537)).unwrap(),
                1 => w.switch_thread(load).unwrap(),
                2 => w.begin_spatial(load).unwrap(),
                _ => w.push(load, addr).unwrap(),
            }
        }
        let totals = totals_of(&w);
        let bytes = w.finish(&totals).unwrap();
        let expected = reference_decode(&bytes);
        prop_assert_eq!(expected.len(), events.iter().filter(|e| e.0 >= 3).count());
        prop_assert_eq!(
            expected.iter().filter(|r| r.4).count() as u64,
            totals.spatial_records
        );
        for got in three_ways(&bytes, skip) {
            prop_assert_eq!(&got, &expected);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn round_trip(events in events(5)) {
        let bytes = write(5, &events);
        prop_assert_eq!(read(&bytes).unwrap(), events);
    }

    #[test]
    fn truncation_is_an_error(events in events(5), cut in any::<prop::sample::Index>()) {
        let bytes = write(5, &events);
        let cut = cut.index(bytes.len());
        let error = read(&bytes[..cut]).unwrap_err();
        prop_assert!(
            matches!(error, TraceError::Truncated { .. } | TraceError::NotATrace { .. }),
            "{}", error
        );
    }

    #[test]
    fn damage_is_detected(
        events in events(5),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
    ) {
        let bytes = write(5, &events);
        let mut damaged = bytes.clone();
        for (at, mask) in &flips {
            damaged[at.index(bytes.len())] ^= mask;
        }
        // Errors are fine (and expected); a panic fails the test. A flip that
        // is not detected must not change what is read.
        if let Ok(got) = read(&damaged) {
            prop_assert_eq!(got, events);
        }
    }

    #[test]
    fn random_payloads_never_panic(
        head in prop::collection::vec(any::<u8>(), 0..64),
        data in prop::collection::vec(any::<u8>(), 0..64),
        records in 0u32..70,
    ) {
        // A well-formed chunk around arbitrary events: errors, never a panic.
        let good = write(5, &vec![Event::Sample(0), Event::Record(0, 1)]);
        let mut raw = Vec::new();
        raw.extend_from_slice(&records.to_le_bytes());
        raw.extend_from_slice(&1u32.to_le_bytes());
        raw.extend_from_slice(&(head.len() as u32).to_le_bytes());
        raw.extend_from_slice(&head);
        raw.extend_from_slice(&data);
        let stored = zstd::encode_all(&raw[..], 1).unwrap();
        let mut chunk = vec![b'R', 0, 0, 0];
        chunk.extend_from_slice(&(stored.len() as u32).to_le_bytes());
        chunk.extend_from_slice(&(raw.len() as u32).to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&chunk);
        crc.update(&stored);
        chunk.extend_from_slice(&crc.finalize().to_le_bytes());
        chunk.extend_from_slice(&stored);
        // Magic, version, header chunk, then this chunk instead of the rest.
        let header_len = 16 + u32::from_le_bytes(good[16..20].try_into().unwrap()) as usize;
        let mut bytes = good[..12 + header_len].to_vec();
        bytes.extend_from_slice(&chunk);
        let mut reader = TraceReader::new(&bytes[..]).unwrap();
        let result = loop {
            match reader.next_event() {
                Ok(Some(_)) => continue,
                other => break other,
            }
        };
        prop_assert!(result.is_err(), "no totals chunk: must fail");
    }

    #[test]
    fn random_bytes_after_magic_never_panic(tail in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut bytes = memgaze_trace::format::MAGIC.to_vec();
        bytes.extend_from_slice(&memgaze_trace::format::VERSION.to_le_bytes());
        bytes.extend_from_slice(&tail);
        prop_assert!(read(&bytes).is_err());
    }

    #[test]
    fn version_2_reads_as_before_and_has_no_spatial_event(events in events(5)) {
        // A version 3 file without spatial events is a version 2 file but
        // for its version number (which no checksum covers).
        let v2: Events = events.iter().copied().filter(|e| !matches!(e, Event::Spatial(_))).collect();
        let v2: Events = std::iter::once(Event::Sample(0)).chain(v2).collect();
        let mut bytes = write(5, &v2);
        bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
        prop_assert_eq!(read(&bytes).unwrap(), v2);
        let mut with_spatial = write(5, &events);
        with_spatial[8..12].copy_from_slice(&2u32.to_le_bytes());
        let spatial = events.iter().any(|e| matches!(e, Event::Spatial(_)));
        prop_assert_eq!(read(&with_spatial).is_err(), spatial);
    }
}
