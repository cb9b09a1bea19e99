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
//! The packets of a ptwrite trace's steady state (PTW, FUP, CYC, MTC, PAD)
//! are decoded straight from the bytes on a fast path; every other packet
//! goes through [`packet::parse`]. Both paths share the same state updates,
//! and the libipt comparison test covers both.

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
    pub packets: [u64; PacketKind::COUNT],
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

    /// Offset of the next byte to decode.
    pub fn offset(&self) -> usize {
        self.pos
    }

    /// Emits `first` now and `second` next time.
    #[inline]
    fn two(&mut self, first: Option<Event>, second: Event) -> Option<Event> {
        match first {
            Some(first) => {
                self.queued = Some(second);
                Some(first)
            }
            None => Some(second),
        }
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
    fn on_ptw(&mut self, offset: usize, payload: u64, size: u8, ip: bool) -> Option<Event> {
        let flushed = self.flush_pending();
        if ip {
            self.pending = PendingPtw {
                waiting: true,
                size,
                has_tsc: self.has_tsc,
                offset,
                payload,
                tsc: self.tsc,
            };
            flushed
        } else {
            let event = Event::Ptw(PtwEvent {
                offset,
                payload,
                ip: None,
                tsc: self.current_tsc(),
                size,
            });
            self.two(flushed, event)
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

/// Reads `N` bytes at `at`, if there are that many.
#[inline(always)]
fn array<const N: usize>(data: &[u8], at: usize) -> Option<[u8; N]> {
    data.get(at..at + N)?.try_into().ok()
}

/// The FUP at `at`: its length and the IP it makes of `last_ip` (`None`
/// when suppressed), or `None` for a truncated or reserved FUP (left to the
/// general path to report).
#[inline(always)]
fn fup_at(data: &[u8], at: usize, last_ip: u64) -> Option<(usize, Option<u64>)> {
    let b0 = *data.get(at)?;
    Some(match b0 >> 5 {
        1 => {
            let b = array::<2>(data, at + 1)?;
            (
                3,
                Some((last_ip & !0xffff) | u64::from(u16::from_le_bytes(b))),
            )
        }
        2 => {
            let b = array::<4>(data, at + 1)?;
            (
                5,
                Some((last_ip & !0xffff_ffff) | u64::from(u32::from_le_bytes(b))),
            )
        }
        form @ (3 | 4) => {
            let [a, b, c, d, e, f] = array::<6>(data, at + 1)?;
            let low = u64::from_le_bytes([a, b, c, d, e, f, 0, 0]);
            let ip = if form == 3 {
                (((low << 16) as i64) >> 16) as u64
            } else {
                (last_ip & !0xffff_ffff_ffff) | low
            };
            (7, Some(ip))
        }
        6 => (9, Some(u64::from_le_bytes(array::<8>(data, at + 1)?))),
        0 => (1, None),
        _ => return None,
    })
}

impl Iterator for Decoder<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        if let Some(event) = self.queued.take() {
            return Some(event);
        }
        'packets: loop {
            if !self.synced && !self.seek_psb(self.pos) {
                return self.flush_pending();
            }
            let data = self.data;
            let offset = self.pos;
            let Some(&b0) = data.get(offset) else {
                return self.flush_pending();
            };

            // Fast path: the steady-state packets of a ptwrite trace. Any
            // irregularity (truncation, reserved encodings, block context)
            // breaks out to the general path below.
            'fast: {
                if self.block != BlockContext::None {
                    break 'fast;
                }
                if b0 == 0x02 {
                    let Some(&b1) = data.get(offset + 1) else {
                        break 'fast;
                    };
                    if b1 & 0x1f != 0x12 {
                        break 'fast;
                    }
                    let (payload, size) = match (b1 >> 5) & 3 {
                        1 => match array::<8>(data, offset + 2) {
                            Some(b) => (u64::from_le_bytes(b), 8u8),
                            None => break 'fast,
                        },
                        0 => match array::<4>(data, offset + 2) {
                            Some(b) => (u64::from(u32::from_le_bytes(b)), 4u8),
                            None => break 'fast,
                        },
                        _ => break 'fast,
                    };
                    let end = offset + 2 + usize::from(size);
                    self.stats.packets[PacketKind::Ptw as usize] += 1;
                    // fup_on_ptw: the FUP almost always follows at once;
                    // pair them here without parking the PTW.
                    if b1 & 0x80 != 0
                        && !self.pending.waiting
                        && let Some(&next) = data.get(end)
                        && next & 0x1f == 0x1d
                        && let Some((len, ip)) = fup_at(data, end, self.last_ip)
                    {
                        if let Some(ip) = ip {
                            self.last_ip = ip;
                        }
                        self.pos = end + len;
                        self.stats.packets[PacketKind::Fup as usize] += 1;
                        return Some(Event::Ptw(PtwEvent {
                            offset,
                            payload,
                            ip,
                            tsc: self.current_tsc(),
                            size,
                        }));
                    }
                    self.pos = end;
                    match self.on_ptw(offset, payload, size, b1 & 0x80 != 0) {
                        Some(event) => return Some(event),
                        None => continue 'packets,
                    }
                } else if b0 & 0x1f == 0x1d {
                    let Some((len, ip)) = fup_at(data, offset, self.last_ip) else {
                        break 'fast;
                    };
                    if let Some(ip) = ip {
                        self.last_ip = ip;
                    }
                    self.pos = offset + len;
                    self.stats.packets[PacketKind::Fup as usize] += 1;
                    if self.pending.waiting {
                        return Some(self.complete_pending(ip));
                    }
                    continue 'packets;
                } else if b0 == 0x00 {
                    self.pos = offset + 1;
                    self.stats.packets[PacketKind::Pad as usize] += 1;
                    continue 'packets;
                } else if b0 == 0x59 {
                    if offset + 2 > data.len() {
                        break 'fast;
                    }
                    self.pos = offset + 2;
                    self.stats.packets[PacketKind::Mtc as usize] += 1;
                    continue 'packets;
                } else if b0 & 3 == 3 {
                    // CYC: 5 payload bits, then 7 per extension byte.
                    let mut len = 1;
                    let mut more = b0 & 0x04 != 0;
                    while more {
                        match data.get(offset + len) {
                            Some(&b) if len < 10 => {
                                more = b & 1 != 0;
                                len += 1;
                            }
                            _ => break 'fast,
                        }
                    }
                    self.pos = offset + len;
                    self.stats.packets[PacketKind::Cyc as usize] += 1;
                    continue 'packets;
                }
            }

            let (packet, len) = match packet::parse(&data[offset..], self.block) {
                Ok(parsed) => parsed,
                Err(kind) => {
                    self.stats.errors += 1;
                    // The offending byte is skipped too; the PSB search
                    // starts after it.
                    self.stats.skipped_bytes += 1;
                    self.synced = false;
                    self.after_error = true;
                    self.block = BlockContext::None;
                    self.pos = offset + 1;
                    let pending = self.flush_pending();
                    return self.two(pending, Event::Error(DecodeError { offset, kind }));
                }
            };
            self.pos = offset + len;
            self.stats.packets[packet.kind() as usize] += 1;
            self.block = self.block.after(&packet);
            match packet {
                Packet::Ptw { payload, size, ip } => {
                    if let Some(event) = self.on_ptw(offset, payload, size, ip) {
                        return Some(event);
                    }
                }
                Packet::Fup(ip) => {
                    if let Some(event) = self.on_fup(ip.compression, ip.payload) {
                        return Some(event);
                    }
                }
                Packet::Tip(ip) | Packet::TipPge(ip) | Packet::TipPgd(ip) => {
                    if let Some(new_ip) = ip.compression.apply(self.last_ip, ip.payload) {
                        self.last_ip = new_ip;
                    }
                    if let Some(event) = self.flush_pending() {
                        return Some(event);
                    }
                }
                Packet::Tsc(tsc) => {
                    self.tsc = tsc;
                    self.has_tsc = true;
                }
                Packet::Psb => {
                    self.last_ip = 0;
                    let pending = self.flush_pending();
                    if self.after_error {
                        self.stats.resyncs += 1;
                        self.after_error = false;
                    }
                    return self.two(pending, Event::Sync { offset });
                }
                Packet::Ovf => {
                    let pending = self.flush_pending();
                    return self.two(pending, Event::Overflow { offset });
                }
                // Packets that announce a FUP of their own, or end tracing:
                // the FUP a pending PTW waits for can no longer come.
                Packet::Exstop { ip: true }
                | Packet::Bep { ip: true }
                | Packet::Cfe { ip: true, .. }
                | Packet::Stop => {
                    if let Some(event) = self.flush_pending() {
                        return Some(event);
                    }
                }
                // Timing, padding, mode and other packets carry nothing the
                // address trace needs; they may sit between PTW and its FUP.
                _ => {}
            }
        }
    }
}

/// Decodes a whole buffer: its events and the final counts.
pub fn decode_all(data: &[u8]) -> (Vec<Event>, DecodeStats) {
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
