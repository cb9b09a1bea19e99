//! Property tests of the trace file format: arbitrary traces round-trip;
//! arbitrary truncation and byte damage give an error, never a panic and
//! never silently different data.

use memgaze::trace::{
    Backend, Dropped, LoadClass, LoadEntry, Sampling, TraceEvent, TraceHeader, TraceReader,
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
    }
}

/// A trace as events: `Err(thread)` begins a sample, `Ok((load, addr))` is a record.
type Events = Vec<Result<(u32, u64), u32>>;

fn events(loads: u32) -> impl Strategy<Value = Events> {
    let addr = prop_oneof![any::<u64>(), 0u64..256, Just(u64::MAX)];
    let event = prop_oneof![
        1 => (0u32..4).prop_map(Err),
        8 => (0..loads, addr).prop_map(Ok),
    ];
    (0u32..4, prop::collection::vec(event, 0..300)).prop_map(|(first, mut v)| {
        v.insert(0, Err(first));
        v
    })
}

fn write(loads: usize, events: &Events) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &header(loads)).unwrap();
    for e in events {
        match *e {
            Err(thread) => w.begin_sample(thread).unwrap(),
            Ok((load, addr)) => w.push(load, addr).unwrap(),
        }
    }
    let totals = TraceTotals {
        executions: w.records() * 3,
        records: w.records(),
        samples: w.samples(),
        dropped: Dropped::default(),
        exit: None,
        complete: true,
    };
    w.finish(&totals).unwrap()
}

fn read(bytes: &[u8]) -> anyhow::Result<Events> {
    let mut r = TraceReader::new(bytes)?;
    let mut out = Vec::new();
    while let Some(e) = r.next_event()? {
        match e {
            TraceEvent::Sample { thread, .. } => out.push(Err(thread)),
            TraceEvent::Thread { .. } => unreachable!("no thread switches written"),
            TraceEvent::Record(rec) => out.push(Ok((rec.load, rec.addr))),
        }
    }
    assert!(r.totals().is_some());
    Ok(out)
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
        let message = format!("{:#}", read(&bytes[..cut]).unwrap_err());
        prop_assert!(
            message.contains("truncated") || message.contains("not a memgaze trace")
                || message.contains("empty file"),
            "{}", message
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
    fn random_bytes_after_magic_never_panic(tail in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut bytes = memgaze::trace::format::MAGIC.to_vec();
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&tail);
        prop_assert!(read(&bytes).is_err());
    }
}
