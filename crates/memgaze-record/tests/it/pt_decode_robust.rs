//! Robustness of the PT decoder: arbitrary bytes, truncated streams and
//! bit-flipped valid streams never panic, every error is followed by a
//! resynchronisation at the next PSB, and decoding after that PSB is exactly
//! what it was in the intact stream.

use memgaze_record::pt::decode::{Decoder, Event, PtwEvent, find_psb};
use memgaze_record::pt::encode::{IpEncoder, encode};
use memgaze_record::pt::packet::{Packet, Packets};
use proptest::prelude::*;

/// Decodes and checks the resynchronisation contract on the way.
fn decode_checked(data: &[u8]) -> Vec<Event> {
    let mut iterated = Decoder::new(data);
    let events: Vec<Event> = iterated.by_ref().collect();
    // The visitor API and the iterator are one decoder: same events, same
    // counts, on every input.
    let mut visited = Decoder::new(data);
    let mut visited_events = Vec::new();
    visited.for_each_event(|e| visited_events.push(e));
    assert_eq!(visited_events, events, "for_each_event differs from next()");
    assert_eq!(visited.stats(), iterated.stats());
    for (i, event) in events.iter().enumerate() {
        let offset = match event {
            Event::Sync { offset } | Event::Overflow { offset } => *offset,
            Event::Ptw(p) => p.offset,
            Event::Error(e) => e.offset,
        };
        assert!(offset < data.len(), "event {event:?} beyond the data");
        if let Event::Error(e) = event {
            // Nothing but the next PSB may follow an error.
            let expected = find_psb(&data[e.offset + 1..]).map(|p| e.offset + 1 + p);
            match (events.get(i + 1), expected) {
                (None, None) => {}
                (Some(Event::Sync { offset }), Some(want)) => assert_eq!(*offset, want),
                (next, want) => panic!("after {e:?}: {next:?}, expected a sync at {want:?}"),
            }
        }
    }
    events
}

fn ptws(events: &[Event]) -> Vec<PtwEvent> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Ptw(p) => Some(*p),
            _ => None,
        })
        .collect()
}

/// A valid ptwrite-style stream from arbitrary choices: PSB+ first, PSB+
/// every ~64 packets, PTW+FUP pairs, timing packets, branches, overflows.
fn valid_stream(choices: &[(u8, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut ips = IpEncoder::default();
    let mut ip = 0x5555_5555_0000u64;
    for (i, &(what, value)) in choices.iter().enumerate() {
        if i % 64 == 0 {
            ips.reset();
            encode(&Packet::Psb, &mut out);
            encode(&Packet::Tsc(value >> 8), &mut out);
            encode(&Packet::Fup(ips.compress(ip)), &mut out);
            encode(&Packet::PsbEnd, &mut out);
        }
        ip = (ip & !0xffff) | (value & 0xffff);
        match what % 10 {
            0..=4 => {
                let size = if what & 0x80 != 0 { 4 } else { 8 };
                let payload = if size == 4 {
                    value & 0xffff_ffff
                } else {
                    value
                };
                encode(
                    &Packet::Ptw {
                        payload,
                        size,
                        ip: true,
                    },
                    &mut out,
                );
                encode(&Packet::Fup(ips.compress(ip)), &mut out);
            }
            5 => encode(&Packet::Cyc(value & 0xffff), &mut out),
            6 => encode(&Packet::Mtc(value as u8), &mut out),
            7 => encode(&Packet::Tip(ips.compress(value)), &mut out),
            8 => encode(
                &Packet::Ptw {
                    payload: value,
                    size: 8,
                    ip: false,
                },
                &mut out,
            ),
            _ => {
                encode(&Packet::Ovf, &mut out);
                encode(&Packet::Fup(ips.compress(ip)), &mut out);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..4096)) {
        decode_checked(&data);
        // The raw packet iterator stops at the first error, also without panics.
        for (offset, _) in Packets::new(&data).flatten() {
            prop_assert!(offset < data.len());
        }
    }

    #[test]
    fn arbitrary_bytes_with_planted_psbs_resync(
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..8)
    ) {
        let mut data = Vec::new();
        for chunk in &chunks {
            data.extend_from_slice(chunk);
            encode(&Packet::Psb, &mut data);
        }
        let events = decode_checked(&data);
        let synced = events.iter().any(|e| matches!(e, Event::Sync { .. }));
        prop_assert!(synced, "no sync point found");
    }

    #[test]
    fn truncated_streams_decode_a_prefix(
        choices in prop::collection::vec((any::<u8>(), any::<u64>()), 1..300),
        cut in any::<prop::sample::Index>(),
    ) {
        let full = valid_stream(&choices);
        let cut = cut.index(full.len() + 1);
        let whole = ptws(&decode_checked(&full));
        let part = ptws(&decode_checked(&full[..cut]));
        // Every PTW of the prefix is the intact one, except that the FUP
        // completing the last one may have been cut off.
        prop_assert!(part.len() <= whole.len());
        for (i, (p, w)) in part.iter().zip(&whole).enumerate() {
            if i + 1 == part.len() && p.ip.is_none() {
                prop_assert_eq!((p.offset, p.payload), (w.offset, w.payload));
            } else {
                prop_assert_eq!(p, w);
            }
        }
        // And nothing complete was lost: PTWs whose FUP ends before the cut
        // are all there (a PTW+FUP pair is at most 10 + 9 bytes).
        let complete = whole.iter().filter(|w| w.offset + 19 <= cut).count();
        prop_assert!(part.len() >= complete);
    }

    #[test]
    fn bit_flips_resync_and_recover_after_the_next_psb(
        choices in prop::collection::vec((any::<u8>(), any::<u64>()), 64..400),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..6),
    ) {
        let original = valid_stream(&choices);
        let mut flipped = original.clone();
        let mut last_flip = 0;
        for (index, bit) in &flips {
            let at = index.index(flipped.len());
            flipped[at] ^= 1 << bit;
            last_flip = last_flip.max(at);
        }
        let intact = decode_checked(&original);
        let damaged = decode_checked(&flipped);
        // The first sync the damaged decode reaches past the last flip is a
        // PSB of the intact stream; from there on both decodes agree.
        let resync = damaged.iter().find_map(|e| match e {
            Event::Sync { offset } if *offset > last_flip => Some(*offset),
            _ => None,
        });
        if let Some(resync) = resync {
            let intact_sync = Event::Sync { offset: resync };
            prop_assert!(intact.contains(&intact_sync), "{:?} is not a PSB of the intact stream", intact_sync);
            let after = |events: &[Event]| -> Vec<Event> {
                events
                    .iter()
                    .copied()
                    .skip_while(|e| *e != Event::Sync { offset: resync })
                    .collect()
            };
            prop_assert_eq!(after(&damaged), after(&intact));
        }
    }
}
