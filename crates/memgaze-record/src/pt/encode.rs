//! A packet encoder: the inverse of `packet::parse`.
//!
//! It builds synthetic PT streams for tests, benchmarks and `pt-decode`
//! demonstrations. The decoder is checked against an independent encoder
//! (libipt's `pt_enc_next`, see `tests/it/pt_libipt.rs`); this one only has to
//! agree with it.

use super::packet::{IpCompression, IpPayload, PSB_PATTERN, Packet};

/// Appends the encoding of `packet` to `out`.
///
/// Fields wider than their encoding are truncated to it (e.g. TSC keeps 56
/// bits); [`Packet::Bip`] is written with an 8-byte item when `value` does
/// not fit in 4 bytes — the caller keeps it consistent with its BBP.
pub fn encode(packet: &Packet, out: &mut Vec<u8>) {
    match *packet {
        Packet::Pad => out.push(0x00),
        Packet::Psb => out.extend_from_slice(&PSB_PATTERN),
        Packet::PsbEnd => out.extend_from_slice(&[0x02, 0x23]),
        Packet::Tsc(tsc) => {
            out.push(0x19);
            out.extend_from_slice(&tsc.to_le_bytes()[..7]);
        }
        Packet::Mtc(ctc) => out.extend_from_slice(&[0x59, ctc]),
        Packet::Tma { ctc, fast_counter } => {
            let [c0, c1] = ctc.to_le_bytes();
            let [f0, f1] = (fast_counter & 0x1ff).to_le_bytes();
            out.extend_from_slice(&[0x02, 0x73, c0, c1, 0, f0, f1]);
        }
        Packet::Cbr(ratio) => out.extend_from_slice(&[0x02, 0x03, ratio, 0]),
        Packet::Cyc(value) => {
            let mut rest = value >> 5;
            out.push(0x03 | (((value & 0x1f) as u8) << 3) | if rest != 0 { 0x04 } else { 0 });
            while rest != 0 {
                let byte = ((rest & 0x7f) as u8) << 1;
                rest >>= 7;
                out.push(byte | u8::from(rest != 0));
            }
        }
        Packet::ModeExec {
            csl,
            csd,
            interrupt_flag,
        } => out.extend_from_slice(&[
            0x99,
            u8::from(csl) | u8::from(csd) << 1 | u8::from(interrupt_flag) << 2,
        ]),
        Packet::ModeTsx {
            in_transaction,
            aborted,
        } => out.extend_from_slice(&[
            0x99,
            0x20 | u8::from(in_transaction) | u8::from(aborted) << 1,
        ]),
        Packet::Fup(ip) => encode_ip(0x1d, ip, out),
        Packet::Tip(ip) => encode_ip(0x0d, ip, out),
        Packet::TipPge(ip) => encode_ip(0x11, ip, out),
        Packet::TipPgd(ip) => encode_ip(0x01, ip, out),
        Packet::Ptw { payload, size, ip } => {
            let ip_bit = if ip { 0x80 } else { 0 };
            if size == 4 {
                out.extend_from_slice(&[0x02, 0x12 | ip_bit]);
                out.extend_from_slice(&(payload as u32).to_le_bytes());
            } else {
                out.extend_from_slice(&[0x02, 0x32 | ip_bit]);
                out.extend_from_slice(&payload.to_le_bytes());
            }
        }
        Packet::Ovf => out.extend_from_slice(&[0x02, 0xf3]),
        Packet::TntShort { bits, count } => {
            let count = count.clamp(1, 6);
            out.push(((bits & ((1 << count) - 1)) << 1) | (1 << (count + 1)));
        }
        Packet::TntLong { bits, count } => {
            let count = count.min(47);
            let raw = (bits & ((1u64 << count) - 1)) | (1u64 << count);
            out.extend_from_slice(&[0x02, 0xa3]);
            out.extend_from_slice(&raw.to_le_bytes()[..6]);
        }
        Packet::Pip { cr3, non_root } => {
            let raw = ((cr3 >> 5) << 1) | u64::from(non_root);
            out.extend_from_slice(&[0x02, 0x43]);
            out.extend_from_slice(&raw.to_le_bytes()[..6]);
        }
        Packet::Vmcs(base) => {
            out.extend_from_slice(&[0x02, 0xc8]);
            out.extend_from_slice(&(base >> 12).to_le_bytes()[..5]);
        }
        Packet::Mnt(payload) => {
            out.extend_from_slice(&[0x02, 0xc3, 0x88]);
            out.extend_from_slice(&payload.to_le_bytes());
        }
        Packet::Stop => out.extend_from_slice(&[0x02, 0x83]),
        Packet::Exstop { ip } => out.extend_from_slice(&[0x02, if ip { 0xe2 } else { 0x62 }]),
        Packet::Mwait { hints, extensions } => {
            out.extend_from_slice(&[0x02, 0xc2]);
            out.extend_from_slice(&hints.to_le_bytes());
            out.extend_from_slice(&extensions.to_le_bytes());
        }
        Packet::Pwre(payload) => {
            out.extend_from_slice(&[0x02, 0x22]);
            out.extend_from_slice(&payload.to_le_bytes());
        }
        Packet::Pwrx(payload) => {
            out.extend_from_slice(&[0x02, 0xa2]);
            out.extend_from_slice(&payload.to_le_bytes()[..5]);
        }
        Packet::Bbp {
            four_byte_items,
            block_type,
        } => out.extend_from_slice(&[
            0x02,
            0x63,
            (block_type & 0x1f) | if four_byte_items { 0x80 } else { 0 },
        ]),
        Packet::Bip { id, value } => {
            out.push((id << 3) | 0x04);
            if value >> 32 == 0 {
                out.extend_from_slice(&(value as u32).to_le_bytes());
            } else {
                out.extend_from_slice(&value.to_le_bytes());
            }
        }
        Packet::Bep { ip } => out.extend_from_slice(&[0x02, if ip { 0xb3 } else { 0x33 }]),
        Packet::Cfe {
            event_type,
            vector,
            ip,
        } => out.extend_from_slice(&[
            0x02,
            0x13,
            (event_type & 0x1f) | if ip { 0x80 } else { 0 },
            vector,
        ]),
        Packet::Evd { data_type, payload } => {
            out.extend_from_slice(&[0x02, 0x53, data_type & 0x1f]);
            out.extend_from_slice(&payload.to_le_bytes());
        }
        Packet::Trig {
            flags,
            bits,
            icount,
        } => match icount {
            Some(icount) => {
                out.extend_from_slice(&[0xd9, flags | 0x40, bits]);
                out.extend_from_slice(&icount.to_le_bytes());
            }
            None => out.extend_from_slice(&[0xd9, flags & !0x40, bits]),
        },
    }
}

fn encode_ip(opcode: u8, ip: IpPayload, out: &mut Vec<u8>) {
    out.push(opcode | (ip.compression.bits() << 5));
    let n = ip.compression.payload_len();
    out.extend_from_slice(&ip.payload.to_le_bytes()[..n]);
}

/// Tracks the last IP like a CPU does and picks the shortest compression
/// that reproduces `ip`: the way synthetic streams encode IPs.
#[derive(Clone, Copy, Debug, Default)]
pub struct IpEncoder {
    last: u64,
}

impl IpEncoder {
    /// Forgets the last IP (what a PSB does).
    pub fn reset(&mut self) {
        self.last = 0;
    }

    /// The payload that makes a decoder arrive at `ip`, and updates the state.
    pub fn compress(&mut self, ip: u64) -> IpPayload {
        let last = self.last;
        self.last = ip;
        let (compression, payload) = if ip >> 16 == last >> 16 {
            (IpCompression::Update16, ip & 0xffff)
        } else if ip >> 32 == last >> 32 {
            (IpCompression::Update32, ip & 0xffff_ffff)
        } else if ip >> 48 == last >> 48 {
            (IpCompression::Update48, ip & 0xffff_ffff_ffff)
        } else if IpCompression::Sext48.apply(0, ip & 0xffff_ffff_ffff) == Some(ip) {
            (IpCompression::Sext48, ip & 0xffff_ffff_ffff)
        } else {
            (IpCompression::Full, ip)
        };
        IpPayload {
            compression,
            payload,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::packet::{BlockContext, parse};
    use super::*;

    #[test]
    fn cyc_round_trips_across_extension_bytes() {
        for value in [0u64, 1, 31, 32, 0xfff, 1 << 40, (1 << 61) - 1] {
            let mut out = Vec::new();
            encode(&Packet::Cyc(value), &mut out);
            assert_eq!(
                parse(&out, BlockContext::None),
                Ok((Packet::Cyc(value), out.len()))
            );
        }
    }

    #[test]
    fn ip_encoder_picks_compressions_a_decoder_undoes() {
        let mut enc = IpEncoder::default();
        let mut last = 0u64;
        for ip in [
            0x401000u64,
            0x401010,
            0x7fff_0000_1000,
            0xffff_8000_0000_0000,
            0x1234_5678_9abc_def0,
            0x1234_5678_9abc_0000,
        ] {
            let p = enc.compress(ip);
            let decoded = p.compression.apply(last, p.payload).unwrap();
            assert_eq!(decoded, ip, "{p:?}");
            last = decoded;
        }
    }
}
