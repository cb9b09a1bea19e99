//! A streaming decoder of Intel PT `ptwrite` traces.
//!
//! [`Decoder`] walks a byte slice (a raw PT stream, or one AUX sample) and
//! yields [`Event`]s: synchronisation points, PTW payloads with the IP of
//! their PTWRITE instruction (from the FUP that `fup_on_ptw` makes the CPU
//! emit) and the last TSC, buffer overflows, and decode errors with their
//! offsets. It holds no copy of the data and allocates nothing.
//!
//! Synchronisation follows the SDM: decoding starts at the first PSB (bytes
//! before it, e.g. the torn head of an AUX sample, are skipped and counted);
//! the PSB resets IP compression; after a bad packet the decoder reports the
//! error and skips forward to the next PSB. It never panics on any input.
//!
//! Events come out one at a time ([`Iterator`]) or, faster, all into a
//! closure ([`Decoder::for_each_event`]); both give the same events and
//! counts. The packets of a ptwrite trace's steady state (PTW+FUP pairs,
//! CYC, MTC, PAD) are decoded by a loop that keeps the decoder's state in
//! registers and checks bounds once per 32-byte window; every other packet,
//! and the last bytes of the data, go through `packet::parse`. Both paths
//! make the same state updates; the libipt comparison test and the
//! robustness proptests cover both.

use super::packet::{
    self, BlockContext, IpCompression, PSB_PATTERN, Packet, PacketErrorKind, PacketKind,
};

/// One PTWRITE operand as recorded in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PtwEvent {
    /// Offset of the PTW packet in the data.
    pub offset: usize,
    /// The operand, zero-extended.
    pub payload: u64,
    /// IP of the PTWRITE instruction, when the packet announced a FUP and
    /// the FUP followed with an IP.
    pub ip: Option<u64>,
    /// The last TSC value seen before the packet.
    pub tsc: Option<u64>,
    /// Operand size: 4 or 8 bytes.
    pub size: u8,
}

/// A decode error: where and what.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeError {
    /// Offset of the offending packet.
    pub offset: usize,
    /// What was wrong.
    pub kind: PacketErrorKind,
}

/// What the decoder reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// A PSB: the decoder is (re)synchronised here.
    Sync {
        /// Offset of the PSB.
        offset: usize,
    },
    /// A PTWRITE operand.
    Ptw(PtwEvent),
    /// OVF: the CPU dropped packets here.
    Overflow {
        /// Offset of the OVF packet.
        offset: usize,
    },
    /// Bad data; the decoder skips to the next PSB.
    Error(DecodeError),
}

/// Counts kept while decoding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecodeStats {
    /// Packets decoded, per [`PacketKind`] (index `kind as usize`).
    pub(crate) packets: [u64; PacketKind::COUNT],
    /// Decode errors.
    pub errors: u64,
    /// PSBs reached after an error (resynchronisations).
    pub resyncs: u64,
    /// Bytes not decoded: before the first PSB and between an error and
    /// the next PSB.
    pub skipped_bytes: u64,
    /// PTW packets whose IP bit announced a FUP that never came.
    pub ptw_without_fup: u64,
}

impl DecodeStats {
    /// Packets of one kind.
    pub fn count(&self, kind: PacketKind) -> u64 {
        self.packets[kind as usize]
    }

    /// Packets of every kind.
    pub fn total_packets(&self) -> u64 {
        self.packets.iter().sum()
    }
}

/// A PTW waiting for its FUP, kept as plain words: the hot loop writes and
/// reads them field by field, which keeps store-to-load forwarding cheap.
#[derive(Clone, Copy, Debug, Default)]
struct PendingPtw {
    waiting: bool,
    size: u8,
    has_tsc: bool,
    offset: usize,
    payload: u64,
    tsc: u64,
}

/// The streaming event decoder. See the module documentation.
#[derive(Clone, Debug)]
pub struct Decoder<'a> {
    data: &'a [u8],
    pos: usize,
    synced: bool,
    /// An error happened since the last PSB: the next PSB is a resync.
    after_error: bool,
    block: BlockContext,
    /// The last-IP register of IP compression (0 after a PSB).
    last_ip: u64,
    has_tsc: bool,
    tsc: u64,
    pending: PendingPtw,
    /// The second event of a packet that made two, for [`Iterator::next`].
    queued: Option<Event>,
    stats: DecodeStats,
}

impl<'a> Decoder<'a> {
    /// A decoder at the start of `data`; it synchronises at the first PSB.
    pub fn new(data: &'a [u8]) -> Decoder<'a> {
        Decoder {
            data,
            pos: 0,
            synced: false,
            after_error: false,
            block: BlockContext::None,
            last_ip: 0,
            has_tsc: false,
            tsc: 0,
            pending: PendingPtw::default(),
            queued: None,
            stats: DecodeStats::default(),
        }
    }

    /// The counts so far.
    pub fn stats(&self) -> &DecodeStats {
        &self.stats
    }

    #[inline(always)]
    fn current_tsc(&self) -> Option<u64> {
        if self.has_tsc { Some(self.tsc) } else { None }
    }

    /// The pending PTW completed with `ip` (consumes it).
    #[inline(always)]
    fn complete_pending(&mut self, ip: Option<u64>) -> Event {
        self.pending.waiting = false;
        Event::Ptw(PtwEvent {
            offset: self.pending.offset,
            payload: self.pending.payload,
            ip,
            tsc: if self.pending.has_tsc {
                Some(self.pending.tsc)
            } else {
                None
            },
            size: self.pending.size,
        })
    }

    /// The pending PTW, given up on its FUP.
    #[inline(always)]
    fn flush_pending(&mut self) -> Option<Event> {
        if self.pending.waiting {
            self.stats.ptw_without_fup += 1;
            Some(self.complete_pending(None))
        } else {
            None
        }
    }

    /// A PTW packet: emitted now, or held until its FUP.
    #[inline(always)]
    fn on_ptw<S: Sink>(&mut self, sink: &mut S, offset: usize, payload: u64, size: u8, ip: bool) {
        self.flush_pending_to(sink);
        if ip {
            self.pending = PendingPtw {
                waiting: true,
                size,
                has_tsc: self.has_tsc,
                offset,
                payload,
                tsc: self.tsc,
            };
        } else {
            sink.event(Event::Ptw(PtwEvent {
                offset,
                payload,
                ip: None,
                tsc: self.current_tsc(),
                size,
            }));
        }
    }

    /// Gives up on the pending PTW's FUP, emitting the PTW without an IP.
    #[inline(always)]
    fn flush_pending_to<S: Sink>(&mut self, sink: &mut S) {
        if let Some(event) = self.flush_pending() {
            sink.event(event);
        }
    }

    /// A FUP packet: updates the last IP and completes a pending PTW.
    #[inline(always)]
    fn on_fup(&mut self, compression: IpCompression, payload: u64) -> Option<Event> {
        let new_ip = compression.apply(self.last_ip, payload);
        if let Some(ip) = new_ip {
            self.last_ip = ip;
        }
        if self.pending.waiting {
            Some(self.complete_pending(new_ip))
        } else {
            None
        }
    }

    /// Skips to the next PSB at or after `from`; false at the end of data.
    fn seek_psb(&mut self, from: usize) -> bool {
        let from = from.min(self.data.len());
        match find_psb(&self.data[from..]) {
            Some(p) => {
                self.stats.skipped_bytes += p as u64;
                self.pos = from + p;
                self.synced = true;
                true
            }
            None => {
                self.stats.skipped_bytes += (self.data.len() - from) as u64;
                self.pos = self.data.len();
                false
            }
        }
    }
}

/// Offset of the first PSB pattern in `data`.
pub fn find_psb(data: &[u8]) -> Option<usize> {
    let mut start = 0;
    while start + PSB_PATTERN.len() <= data.len() {
        // Each PSB starts with 0x02 0x82; look for the pair, then the rest.
        let rest = &data[start..data.len() - PSB_PATTERN.len() + 2];
        let hit = rest.windows(2).position(|w| w == [0x02, 0x82])?;
        let at = start + hit;
        if data[at..at + PSB_PATTERN.len()] == PSB_PATTERN {
            return Some(at);
        }
        start = at + 1;
    }
    None
}

/// Where the decoding loop delivers events: a caller's closure, or the
/// one-packet buffer behind [`Iterator::next`].
trait Sink {
    /// Takes one event.
    fn event(&mut self, event: Event);
    /// The loop returns after the packet that filled the sink (a packet
    /// may still add a second event).
    fn full(&self) -> bool;
}

/// A closure that takes every event.
struct Visit<F>(F);

impl<F: FnMut(Event)> Sink for Visit<F> {
    #[inline(always)]
    fn event(&mut self, event: Event) {
        (self.0)(event)
    }

    #[inline(always)]
    fn full(&self) -> bool {
        false
    }
}

/// The events of one packet (at most two: a flushed PTW and the packet's own).
#[derive(Default)]
struct OnePacket {
    first: Option<Event>,
    second: Option<Event>,
}

impl Sink for OnePacket {
    #[inline(always)]
    fn event(&mut self, event: Event) {
        if self.first.is_none() {
            self.first = Some(event);
        } else {
            self.second = Some(event);
        }
    }

    #[inline(always)]
    fn full(&self) -> bool {
        self.first.is_some()
    }
}

/// Bytes the fast loop reads at once: a PTW (10), its FUP (9) and a CYC
/// (10) fit, so the loop checks bounds once per step, not per byte.
const WINDOW: usize = 32;

/// The FUP at `at` (at most 10) in `w`: its length and the IP it makes of
/// `last_ip` (`None` when suppressed), or `None` for a reserved FUP.
#[inline(always)]
fn fup_in_window(w: &[u8; WINDOW], at: usize, last_ip: u64) -> Option<(usize, Option<u64>)> {
    let at = at.min(10);
    let raw = u64::from_le_bytes(w[at + 1..at + 9].try_into().unwrap());
    Some(match w[at] >> 5 {
        1 => (3, Some((last_ip & !0xffff) | (raw & 0xffff))),
        2 => (5, Some((last_ip & !0xffff_ffff) | (raw & 0xffff_ffff))),
        3 => (7, Some((((raw << 16) as i64) >> 16) as u64)),
        4 => (
            7,
            Some((last_ip & !0xffff_ffff_ffff) | (raw & 0xffff_ffff_ffff)),
        ),
        6 => (9, Some(raw)),
        0 => (1, None),
        _ => return None,
    })
}

/// The length of the packet starting with `b0` if it is a CYC, MTC or PAD
/// (0 otherwise, and for a CYC with more than 8 extension bytes), computed
/// without branches; `next` holds the 8 bytes after `b0`.
#[inline(always)]
fn timing_len(b0: u8, next: u64) -> usize {
    // A CYC's extension bytes end at the first with bit 0 clear.
    let ends = !next & 0x0101_0101_0101_0101;
    let extended = if ends == 0 {
        0
    } else {
        ends.trailing_zeros() as usize / 8 + 2
    };
    let cyc = if b0 & 0x04 == 0 { 1 } else { extended };
    let mtc_or_pad = usize::from(b0 == 0x59) * 2 + usize::from(b0 == 0x00);
    if b0 & 3 == 3 { cyc } else { mtc_or_pad }
}

impl<'a> Decoder<'a> {
    /// Decodes the rest of the data, handing each event to `f` in order.
    ///
    /// The events and [`stats`](Self::stats) are exactly those of iterating
    /// the decoder; this is the faster way to consume a whole buffer, as the
    /// decoding loop runs with `f` inlined and without a call per event.
    pub fn for_each_event(&mut self, f: impl FnMut(Event)) {
        let mut sink = Visit(f);
        self.drive(&mut sink);
    }

    /// Decodes until the end of data or until `sink` is full.
    #[inline(always)]
    fn drive<S: Sink>(&mut self, sink: &mut S) {
        loop {
            if self.synced && self.block == BlockContext::None && !self.pending.waiting {
                self.fast_run(sink);
                if sink.full() {
                    return;
                }
            }
            if self.step(sink) || sink.full() {
                return;
            }
        }
    }

    /// The steady state of a ptwrite trace — PTW+FUP pairs, lone FUPs, CYC,
    /// MTC and PAD, outside any block and with no PTW waiting for its FUP —
    /// decoded with the decoder's state in registers and one bounds check
    /// per step. It stops at anything else, leaving it to [`Self::step`]:
    /// other packets, reserved encodings, a PTW whose FUP does not follow
    /// at once, and the last [`WINDOW`] bytes.
    #[inline(always)]
    fn fast_run<S: Sink>(&mut self, sink: &mut S) {
        let data = self.data;
        let mut pos = self.pos;
        let mut last_ip = self.last_ip;
        let tsc = self.current_tsc();
        let (mut ptws, mut fups, mut cycs, mut mtcs, mut pads) = (0u64, 0u64, 0u64, 0u64, 0u64);
        'steps: while let Some(w) = data.get(pos..pos.saturating_add(WINDOW)) {
            let w: &[u8; WINDOW] = w.try_into().unwrap();
            let b0 = w[0];
            if b0 == 0x02 {
                let b1 = w[1];
                if b1 & 0x1f != 0x12 {
                    break;
                }
                let (payload, size, ptw_len) = match b1 & 0x60 {
                    0x20 => (u64::from_le_bytes(w[2..10].try_into().unwrap()), 8u8, 10),
                    0x00 => (
                        u64::from(u32::from_le_bytes(w[2..6].try_into().unwrap())),
                        4u8,
                        6,
                    ),
                    _ => break,
                };
                let (len, ip) = if b1 & 0x80 != 0 {
                    // fup_on_ptw: the FUP almost always follows at once.
                    if w[ptw_len] & 0x1f != 0x1d {
                        break;
                    }
                    let Some((fup_len, ip)) = fup_in_window(w, ptw_len, last_ip) else {
                        break;
                    };
                    if let Some(ip) = ip {
                        last_ip = ip;
                    }
                    fups += 1;
                    (ptw_len + fup_len, ip)
                } else {
                    (ptw_len, None)
                };
                ptws += 1;
                sink.event(Event::Ptw(PtwEvent {
                    offset: pos,
                    payload,
                    ip,
                    tsc,
                    size,
                }));
                if sink.full() {
                    pos += len;
                    break;
                }
                // The CPU puts at most a few timing packets between pairs,
                // in no predictable order: skip one without branching on
                // its kind (a mispredicted branch costs more than this).
                let at = len.min(19);
                let skip = timing_len(
                    w[at],
                    u64::from_le_bytes(w[at + 1..at + 9].try_into().unwrap()),
                );
                cycs += u64::from((w[at] & 3 == 3) & (skip != 0));
                mtcs += u64::from(w[at] == 0x59);
                pads += u64::from(w[at] == 0x00);
                pos += len + skip;
            } else if b0 & 0x1f == 0x1d {
                let Some((len, ip)) = fup_in_window(w, 0, last_ip) else {
                    break;
                };
                if let Some(ip) = ip {
                    last_ip = ip;
                }
                fups += 1;
                pos += len;
            } else if b0 & 3 == 3 {
                // CYC: 5 payload bits, then 7 per extension byte; more than
                // 9 extension bytes is an error the general path reports.
                let mut len = 1;
                let mut more = b0 & 0x04 != 0;
                while more {
                    if len >= 10 {
                        break 'steps;
                    }
                    more = w[len] & 1 != 0;
                    len += 1;
                }
                cycs += 1;
                pos += len;
            } else if b0 == 0x59 {
                mtcs += 1;
                pos += 2;
            } else if b0 == 0x00 {
                pads += 1;
                pos += 1;
            } else {
                break;
            }
        }
        self.pos = pos;
        self.last_ip = last_ip;
        let packets = &mut self.stats.packets;
        packets[PacketKind::Ptw as usize] += ptws;
        packets[PacketKind::Fup as usize] += fups;
        packets[PacketKind::Cyc as usize] += cycs;
        packets[PacketKind::Mtc as usize] += mtcs;
        packets[PacketKind::Pad as usize] += pads;
    }

    /// Decodes one packet on the general path; true at the end of data.
    fn step<S: Sink>(&mut self, sink: &mut S) -> bool {
        if !self.synced && !self.seek_psb(self.pos) {
            self.flush_pending_to(sink);
            return true;
        }
        let offset = self.pos;
        if offset >= self.data.len() {
            self.flush_pending_to(sink);
            return true;
        }
        let (packet, len) = match packet::parse(&self.data[offset..], self.block) {
            Ok(parsed) => parsed,
            Err(kind) => {
                self.stats.errors += 1;
                // The offending byte is skipped too; the PSB search starts
                // after it.
                self.stats.skipped_bytes += 1;
                self.synced = false;
                self.after_error = true;
                self.block = BlockContext::None;
                self.pos = offset + 1;
                self.flush_pending_to(sink);
                sink.event(Event::Error(DecodeError { offset, kind }));
                return false;
            }
        };
        self.pos = offset + len;
        self.stats.packets[packet.kind() as usize] += 1;
        self.block = self.block.after(&packet);
        match packet {
            Packet::Ptw { payload, size, ip } => self.on_ptw(sink, offset, payload, size, ip),
            Packet::Fup(ip) => {
                if let Some(event) = self.on_fup(ip.compression, ip.payload) {
                    sink.event(event);
                }
            }
            Packet::Tip(ip) | Packet::TipPge(ip) | Packet::TipPgd(ip) => {
                if let Some(new_ip) = ip.compression.apply(self.last_ip, ip.payload) {
                    self.last_ip = new_ip;
                }
                self.flush_pending_to(sink);
            }
            Packet::Tsc(tsc) => {
                self.tsc = tsc;
                self.has_tsc = true;
            }
            Packet::Psb => {
                self.last_ip = 0;
                self.flush_pending_to(sink);
                if self.after_error {
                    self.stats.resyncs += 1;
                    self.after_error = false;
                }
                sink.event(Event::Sync { offset });
            }
            Packet::Ovf => {
                self.flush_pending_to(sink);
                sink.event(Event::Overflow { offset });
            }
            // Packets that announce a FUP of their own, or end tracing: the
            // FUP a pending PTW waits for can no longer come.
            Packet::Exstop { ip: true }
            | Packet::Bep { ip: true }
            | Packet::Cfe { ip: true, .. }
            | Packet::Stop => self.flush_pending_to(sink),
            // Timing, padding, mode and other packets carry nothing the
            // address trace needs; they may sit between PTW and its FUP.
            _ => {}
        }
        false
    }
}

impl Iterator for Decoder<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        if let Some(event) = self.queued.take() {
            return Some(event);
        }
        let mut one = OnePacket::default();
        self.drive(&mut one);
        self.queued = one.second;
        one.first
    }
}

#[cfg(test)]
/// Decodes a whole buffer: its events and the final counts.
pub(crate) fn decode_all(data: &[u8]) -> (Vec<Event>, DecodeStats) {
    let mut decoder = Decoder::new(data);
    let events = decoder.by_ref().collect();
    (events, decoder.stats().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn psb_plus(out: &mut Vec<u8>, tsc: u64, ip: u64) {
        out.extend_from_slice(&PSB_PATTERN);
        out.push(0x19);
        out.extend_from_slice(&tsc.to_le_bytes()[..7]);
        out.extend_from_slice(&[0x99, 0x01]); // MODE.Exec 64-bit
        out.push(0xdd); // FUP full
        out.extend_from_slice(&ip.to_le_bytes());
        out.extend_from_slice(&[0x02, 0x23]);
    }

    fn ptw8(out: &mut Vec<u8>, payload: u64, ip_bit: bool) {
        out.extend_from_slice(&[0x02, if ip_bit { 0xb2 } else { 0x32 }]);
        out.extend_from_slice(&payload.to_le_bytes());
    }

    fn fup16(out: &mut Vec<u8>, low: u16) {
        out.push(0x3d);
        out.extend_from_slice(&low.to_le_bytes());
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

    #[test]
    fn ptw_takes_its_ip_from_the_following_fup_and_the_last_tsc() {
        let mut s = vec![0xaa, 0x55, 0x17]; // torn head: skipped
        psb_plus(&mut s, 0x1234, 0x5555_0000_4000);
        ptw8(&mut s, 0xdead, true);
        s.extend_from_slice(&[0x59, 0x01]); // MTC between PTW and FUP
        fup16(&mut s, 0x4010);
        ptw8(&mut s, 0xbeef, false);
        let (events, stats) = decode_all(&s);
        assert_eq!(events[0], Event::Sync { offset: 3 });
        let p = ptws(&events);
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[0].payload, p[0].ip, p[0].tsc),
            (0xdead, Some(0x5555_0000_4010), Some(0x1234))
        );
        assert_eq!((p[1].payload, p[1].ip), (0xbeef, None));
        assert_eq!(stats.skipped_bytes, 3);
        assert_eq!(stats.count(PacketKind::Ptw), 2);
        assert_eq!(stats.count(PacketKind::Fup), 2);
        assert_eq!(stats.ptw_without_fup, 0);
    }

    #[test]
    fn psb_resets_ip_compression() {
        let mut s = Vec::new();
        psb_plus(&mut s, 1, 0x7fff_1234_0000);
        s.extend_from_slice(&PSB_PATTERN);
        s.extend_from_slice(&[0x02, 0x23]);
        ptw8(&mut s, 1, true);
        fup16(&mut s, 0x0042); // last IP is 0 after the PSB
        let (events, _) = decode_all(&s);
        assert_eq!(ptws(&events)[0].ip, Some(0x42));
    }

    #[test]
    fn errors_resync_at_the_next_psb() {
        let mut s = Vec::new();
        psb_plus(&mut s, 1, 0x1000);
        ptw8(&mut s, 7, false);
        let bad = s.len();
        s.extend_from_slice(&[0xc9, 0x00, 0x02]); // 0xc9: no such opcode
        let next_psb = s.len();
        psb_plus(&mut s, 2, 0x2000);
        ptw8(&mut s, 8, false);
        let (events, stats) = decode_all(&s);
        assert!(events.contains(&Event::Error(DecodeError {
            offset: bad,
            kind: PacketErrorKind::UnknownOpcode(0xc9)
        })));
        assert!(events.contains(&Event::Sync { offset: next_psb }));
        assert_eq!(
            ptws(&events).iter().map(|p| p.payload).collect::<Vec<_>>(),
            vec![7, 8]
        );
        assert_eq!((stats.errors, stats.resyncs), (1, 1));
    }

    #[test]
    fn ptw_whose_fup_never_comes_is_reported_without_ip() {
        let mut s = Vec::new();
        psb_plus(&mut s, 1, 0x1000);
        ptw8(&mut s, 1, true);
        ptw8(&mut s, 2, true);
        s.extend_from_slice(&[0x02, 0xf3]); // OVF
        let (events, stats) = decode_all(&s);
        let p = ptws(&events);
        assert_eq!((p[0].ip, p[1].ip), (None, None));
        assert_eq!(stats.ptw_without_fup, 2);
        assert!(matches!(events.last(), Some(Event::Overflow { .. })));
        // The PTW comes out before the overflow that cut it off.
        assert!(matches!(
            events[events.len() - 2],
            Event::Ptw(PtwEvent { payload: 2, .. })
        ));
    }

    #[test]
    fn fast_and_general_paths_agree_on_over_long_cyc() {
        // 9 extension bytes are the most a 64-bit CYC value needs; a 10th
        // is an error on both paths (the block context forces the general
        // path).
        for (extensions, ok) in [(9usize, true), (10, false)] {
            let mut cyc = vec![0x07];
            cyc.extend(std::iter::repeat_n(0x03, extensions - 1));
            cyc.push(0x02);
            let mut s = PSB_PATTERN.to_vec();
            s.extend_from_slice(&cyc);
            let (_, fast) = decode_all(&s);
            assert_eq!(
                fast.errors == 0,
                ok,
                "fast path, {extensions} extension bytes"
            );
            assert_eq!(
                packet::parse(&cyc, BlockContext::Items8).is_ok(),
                ok,
                "general path, {extensions} extension bytes"
            );
        }
    }

    #[test]
    fn timing_packets_after_a_pair_are_skipped_and_counted_exactly() {
        // (packet after the first PTW+FUP pair, kind, valid)
        let long_cyc = |extensions: usize| {
            let mut cyc = vec![0x07];
            cyc.extend(std::iter::repeat_n(0x03, extensions - 1));
            cyc.push(0x02);
            cyc
        };
        let cases = [
            (vec![0x03], Some(PacketKind::Cyc), true),
            (vec![0x0f, 0x02], Some(PacketKind::Cyc), true),
            (long_cyc(8), Some(PacketKind::Cyc), true),
            (long_cyc(9), Some(PacketKind::Cyc), true),
            (long_cyc(10), Some(PacketKind::Cyc), false),
            (vec![0x59, 0x07], Some(PacketKind::Mtc), true),
            (vec![0x00], Some(PacketKind::Pad), true),
            (vec![0x99, 0x01], Some(PacketKind::ModeExec), true),
            (vec![], None, true),
        ];
        for (timing, kind, ok) in cases {
            let mut s = Vec::new();
            psb_plus(&mut s, 1, 0x7000_0000);
            ptw8(&mut s, 5, true);
            fup16(&mut s, 0x10);
            s.extend_from_slice(&timing);
            ptw8(&mut s, 6, true);
            fup16(&mut s, 0x20);
            // Enough bytes behind both pairs for the windowed fast loop.
            s.extend_from_slice(&[0; 40]);
            let mut decoder = Decoder::new(&s);
            let mut events = Vec::new();
            decoder.for_each_event(|e| events.push(e));
            let (iterated, iterated_stats) = decode_all(&s);
            assert_eq!(events, iterated, "{timing:02x?}");
            let stats = decoder.stats();
            assert_eq!(stats, &iterated_stats, "{timing:02x?}");
            assert_eq!(stats.errors == 0, ok, "{timing:02x?}");
            if !ok {
                continue;
            }
            let ips: Vec<_> = ptws(&events).iter().map(|p| p.ip).collect();
            assert_eq!(ips, [Some(0x7000_0010), Some(0x7000_0020)]);
            let pads = 40 + u64::from(kind == Some(PacketKind::Pad));
            assert_eq!(stats.count(PacketKind::Pad), pads, "{timing:02x?}");
            for k in [PacketKind::Cyc, PacketKind::Mtc, PacketKind::ModeExec] {
                let psb_plus_mode = u64::from(k == PacketKind::ModeExec);
                let want = u64::from(kind == Some(k)) + psb_plus_mode;
                assert_eq!(stats.count(k), want, "{k:?} after {timing:02x?}");
            }
        }
    }

    #[test]
    fn timing_len_matches_the_packet_lengths() {
        let next = |bytes: &[u8]| {
            let mut b = [0u8; 8];
            b[..bytes.len()].copy_from_slice(bytes);
            u64::from_le_bytes(b)
        };
        assert_eq!(timing_len(0x03, next(&[0xff])), 1);
        assert_eq!(timing_len(0x07, next(&[0x02])), 2);
        assert_eq!(timing_len(0x07, next(&[0x03, 0x03, 0x00])), 4);
        assert_eq!(timing_len(0x07, next(&[0x01; 7])), 9);
        // 8 extension bytes that all continue: left to the careful path.
        assert_eq!(timing_len(0x07, next(&[0x01; 8])), 0);
        assert_eq!(timing_len(0x59, 0), 2);
        assert_eq!(timing_len(0x00, 0), 1);
        for other in [0x02, 0x19, 0x99, 0x1d, 0x3d, 0x0d, 0x04] {
            assert_eq!(timing_len(other, 0), 0, "{other:#04x}");
        }
    }

    #[test]
    fn find_psb_handles_near_misses() {
        let mut s = vec![0x02, 0x82, 0x02, 0x82, 0x00];
        let at = s.len();
        s.extend_from_slice(&PSB_PATTERN);
        assert_eq!(find_psb(&s), Some(at));
        assert_eq!(find_psb(&PSB_PATTERN[..15]), None);
        assert_eq!(find_psb(&[]), None);
        // A PSB that is a suffix of a longer 02 82 run is found at its start.
        let mut run = vec![0x02, 0x82];
        run.extend_from_slice(&PSB_PATTERN);
        assert_eq!(find_psb(&run), Some(0));
    }
}
