//! The PT decoder against an independent encoder: libipt's `pt_enc_next`.
//!
//! The test builds `crates/memgaze-fixtures/fixtures/pt_encode.c` against Debian's
//! `libipt-dev`, generates long random packet sequences covering every
//! packet kind libipt 2.0 can encode, has the C program encode them, and
//! checks that (a) every packet decodes to exactly what was asked for at the
//! offset libipt wrote it, and (b) the event decoder's PTW events — payload,
//! size, the PTWRITE IP from the following FUP (IP compression resolved
//! against a ground-truth IP the generator tracks) and the last TSC — equal
//! what the generator expects.
//!
//! Missing `libipt-dev` is a test FAILURE with install instructions, never
//! a skip.

use memgaze_record::pt::decode::{Decoder, Event, PtwEvent};
use memgaze_record::pt::packet::{IpCompression, IpPayload, Packet, Packets};
use std::fmt::Write as _;

use crate::libipt;
use libipt::{Rng, libipt_encode};

/// The generator's view of the stream: what it asked libipt to write, and
/// what a correct decoder must report.
#[derive(Default)]
struct Stream {
    spec: String,
    packets: Vec<Packet>,
    ptws: Vec<PtwEvent>,
    /// Index in `packets` of each PTW, to fill in its offset later.
    ptw_packet_index: Vec<usize>,
    /// Ground truth of the decoder's last-IP register.
    last_ip: u64,
    tsc: Option<u64>,
}

impl Stream {
    fn push(&mut self, spec_line: String, packet: Packet) {
        self.spec.push_str(&spec_line);
        self.spec.push('\n');
        self.packets.push(packet);
    }

    /// An IP packet that makes the decoder arrive at `ip` (or suppressed),
    /// with a random compression among those valid for the current last IP.
    fn ip_packet(&mut self, rng: &mut Rng, name: &str, ip: Option<u64>) -> Option<u64> {
        let (compression, payload) = match ip {
            None => (IpCompression::Suppressed, 0),
            Some(ip) => {
                let mut forms = vec![IpCompression::Full];
                if IpCompression::Sext48.apply(0, ip & 0xffff_ffff_ffff) == Some(ip) {
                    forms.push(IpCompression::Sext48);
                }
                if ip >> 48 == self.last_ip >> 48 {
                    forms.push(IpCompression::Update48);
                }
                if ip >> 32 == self.last_ip >> 32 {
                    forms.push(IpCompression::Update32);
                }
                if ip >> 16 == self.last_ip >> 16 {
                    forms.push(IpCompression::Update16);
                }
                let form = forms[rng.below(forms.len() as u64) as usize];
                let n = form.payload_len() as u32 * 8;
                let payload = if n == 64 { ip } else { ip & ((1 << n) - 1) };
                self.last_ip = ip;
                (form, payload)
            }
        };
        let p = IpPayload {
            compression,
            payload,
        };
        let packet = match name {
            "fup" => Packet::Fup(p),
            "tip" => Packet::Tip(p),
            "pge" => Packet::TipPge(p),
            _ => Packet::TipPgd(p),
        };
        self.push(
            format!("{name} {} {payload:#x}", compression.bits()),
            packet,
        );
        ip
    }

    fn timing(&mut self, rng: &mut Rng) {
        match rng.below(6) {
            0 => {
                let tsc = rng.bits(56);
                self.tsc = Some(tsc);
                self.push(format!("tsc {tsc:#x}"), Packet::Tsc(tsc));
            }
            1 => {
                let ctc = rng.bits(8) as u8;
                self.push(format!("mtc {ctc}"), Packet::Mtc(ctc));
            }
            2 => {
                // Values from 5 bits up to 48 bits: 1 to 8 bytes.
                let width = 5 + rng.below(44) as u32;
                let value = rng.bits(width);
                self.push(format!("cyc {value:#x}"), Packet::Cyc(value));
            }
            3 => {
                let (ctc, fc) = (rng.bits(16) as u16, rng.bits(9) as u16);
                self.push(
                    format!("tma {ctc} {fc}"),
                    Packet::Tma {
                        ctc,
                        fast_counter: fc,
                    },
                );
            }
            4 => {
                let ratio = rng.bits(8) as u8;
                self.push(format!("cbr {ratio}"), Packet::Cbr(ratio));
            }
            _ => self.push("pad".into(), Packet::Pad),
        }
    }

    fn psb_plus(&mut self, rng: &mut Rng, code_ip: u64) {
        self.push("psb".into(), Packet::Psb);
        self.last_ip = 0;
        let tsc = rng.bits(56);
        self.tsc = Some(tsc);
        self.push(format!("tsc {tsc:#x}"), Packet::Tsc(tsc));
        if rng.chance(50) {
            self.timing(rng);
        }
        self.push(
            "exec 1 0".into(),
            Packet::ModeExec {
                csl: true,
                csd: false,
                interrupt_flag: false,
            },
        );
        let ip = if rng.chance(90) { Some(code_ip) } else { None };
        self.ip_packet(rng, "fup", ip);
        self.push("psbend".into(), Packet::PsbEnd);
    }
}

/// A random instruction pointer: mostly near the previous one (so the
/// short compressions apply), sometimes far, kernel-half or non-canonical.
fn next_ip(rng: &mut Rng, ip: u64) -> u64 {
    match rng.below(10) {
        0..=4 => (ip & !0xffff) | rng.bits(16),
        5..=6 => (ip & !0xffff_ffff) | rng.bits(32),
        7 => 0x5555_0000_0000 | rng.bits(32),
        8 => 0xffff_8000_0000_0000 | rng.bits(47),
        _ => rng.next(),
    }
}

fn generate(seed: u64, packets: usize) -> Stream {
    let mut rng = Rng::new(seed);
    let mut s = Stream::default();
    let mut code_ip = 0x5555_5555_4000u64;
    s.psb_plus(&mut rng, code_ip);
    while s.packets.len() < packets {
        code_ip = next_ip(&mut rng, code_ip);
        match rng.below(100) {
            // PTW with a FUP giving its IP (timing packets may intervene).
            0..=34 => {
                let plc = rng.below(2);
                let payload = if plc == 0 { rng.bits(32) } else { rng.next() };
                s.ptw_packet_index.push(s.packets.len());
                s.push(
                    format!("ptw {plc} 1 {payload:#x}"),
                    Packet::Ptw {
                        payload,
                        size: if plc == 0 { 4 } else { 8 },
                        ip: true,
                    },
                );
                let tsc = s.tsc;
                for _ in 0..rng.below(3) {
                    s.timing(&mut rng);
                }
                let ip = if rng.chance(95) { Some(code_ip) } else { None };
                let ip = s.ip_packet(&mut rng, "fup", ip);
                s.ptws.push(PtwEvent {
                    offset: 0,
                    payload,
                    size: if plc == 0 { 4 } else { 8 },
                    ip,
                    tsc,
                });
            }
            // PTW without the IP bit.
            35..=44 => {
                let plc = rng.below(2);
                let payload = if plc == 0 { rng.bits(32) } else { rng.next() };
                s.ptw_packet_index.push(s.packets.len());
                s.push(
                    format!("ptw {plc} 0 {payload:#x}"),
                    Packet::Ptw {
                        payload,
                        size: if plc == 0 { 4 } else { 8 },
                        ip: false,
                    },
                );
                s.ptws.push(PtwEvent {
                    offset: 0,
                    payload,
                    size: if plc == 0 { 4 } else { 8 },
                    ip: None,
                    tsc: s.tsc,
                });
            }
            45..=64 => s.timing(&mut rng),
            65..=68 => {
                let name = ["tip", "pge", "pgd", "fup"][rng.below(4) as usize];
                let ip = if rng.chance(85) { Some(code_ip) } else { None };
                s.ip_packet(&mut rng, name, ip);
            }
            69 => {
                let count = 1 + rng.below(6) as u8;
                let bits = rng.bits(u32::from(count)) as u8;
                s.push(
                    format!("tnt8 {count} {bits}"),
                    Packet::TntShort { bits, count },
                );
            }
            70 => {
                let count = rng.below(48) as u8;
                let bits = rng.bits(u32::from(count));
                s.push(
                    format!("tnt64 {count} {bits:#x}"),
                    Packet::TntLong { bits, count },
                );
            }
            71 => {
                let (csl, csd) = (rng.chance(50), rng.chance(50));
                s.push(
                    format!("exec {} {}", u8::from(csl), u8::from(csd)),
                    Packet::ModeExec {
                        csl,
                        csd,
                        interrupt_flag: false,
                    },
                );
            }
            72 => {
                let (intx, abrt) = (rng.chance(50), rng.chance(50));
                s.push(
                    format!("tsx {} {}", u8::from(intx), u8::from(abrt)),
                    Packet::ModeTsx {
                        in_transaction: intx,
                        aborted: abrt,
                    },
                );
            }
            73 => {
                let (cr3, nr) = (rng.bits(47) << 5, rng.chance(50));
                s.push(
                    format!("pip {cr3:#x} {}", u8::from(nr)),
                    Packet::Pip { cr3, non_root: nr },
                );
            }
            74 => {
                let base = rng.bits(40) << 12;
                s.push(format!("vmcs {base:#x}"), Packet::Vmcs(base));
            }
            75 => {
                let payload = rng.next();
                s.push(format!("mnt {payload:#x}"), Packet::Mnt(payload));
            }
            76 => {
                // EXSTOP.IP binds the next FUP.
                s.push("exstop 1".into(), Packet::Exstop { ip: true });
                s.ip_packet(&mut rng, "fup", Some(code_ip));
            }
            77 => s.push("exstop 0".into(), Packet::Exstop { ip: false }),
            78 => {
                let (hints, ext) = (rng.bits(32) as u32, rng.bits(32) as u32);
                s.push(
                    format!("mwait {hints} {ext}"),
                    Packet::Mwait {
                        hints,
                        extensions: ext,
                    },
                );
            }
            79 => {
                let (state, sub, hw) = (rng.bits(4), rng.bits(4), rng.chance(50));
                s.push(
                    format!("pwre {state} {sub} {}", u8::from(hw)),
                    Packet::Pwre((state << 12 | sub << 8 | u64::from(hw) << 3) as u16),
                );
            }
            80 => {
                let (last, deepest) = (rng.bits(4), rng.bits(4));
                let (int, store, auto) = (rng.chance(50), rng.chance(50), rng.chance(50));
                s.push(
                    format!(
                        "pwrx {last} {deepest} {} {} {}",
                        u8::from(int),
                        u8::from(store),
                        u8::from(auto)
                    ),
                    Packet::Pwrx(
                        last << 4
                            | deepest
                            | u64::from(int) << 8
                            | u64::from(store) << 10
                            | u64::from(auto) << 11,
                    ),
                );
            }
            81 => s.push("stop".into(), Packet::Stop),
            82..=83 => {
                // Overflow, then the FUP with the IP where tracing resumed.
                s.push("ovf".into(), Packet::Ovf);
                s.ip_packet(&mut rng, "fup", Some(code_ip));
            }
            84..=87 => s.psb_plus(&mut rng, code_ip),
            _ => s.push("pad".into(), Packet::Pad),
        }
    }
    s
}

#[test]
fn decoder_matches_libipt_encoder_on_long_random_streams() {
    let mut kinds_seen = std::collections::BTreeSet::new();
    for seed in 1..=6u64 {
        let mut stream = generate(seed, 20_000);
        let (bytes, layout) = libipt_encode(&stream.spec);
        assert_eq!(layout.len(), stream.packets.len(), "seed {seed}");

        // (a) Packet level: every packet, at libipt's offset.
        let decoded: Vec<(usize, Packet)> = Packets::new(&bytes)
            .map(|r| r.unwrap_or_else(|(o, e)| panic!("seed {seed}: error at {o}: {e}")))
            .collect();
        assert_eq!(decoded.len(), stream.packets.len(), "seed {seed}");
        for (i, ((offset, packet), (want_offset, _))) in decoded.iter().zip(&layout).enumerate() {
            assert_eq!(
                (*offset, packet),
                (*want_offset, &stream.packets[i]),
                "seed {seed}, packet {i}, spec line `{}`",
                stream.spec.lines().nth(i).unwrap()
            );
            kinds_seen.insert(packet.kind());
        }

        // (b) Event level: PTW payloads, IPs and timestamps.
        for (ptw, &index) in stream.ptws.iter_mut().zip(&stream.ptw_packet_index) {
            ptw.offset = layout[index].0;
        }
        let mut decoder = Decoder::new(&bytes);
        let got: Vec<PtwEvent> = decoder
            .by_ref()
            .filter_map(|e| match e {
                Event::Ptw(p) => Some(p),
                Event::Error(e) => panic!("seed {seed}: decode error {e:?}"),
                _ => None,
            })
            .collect();
        assert_eq!(got.len(), stream.ptws.len(), "seed {seed}");
        for (i, (g, want)) in got.iter().zip(&stream.ptws).enumerate() {
            assert_eq!(g, want, "seed {seed}, PTW #{i}");
        }
        let stats = decoder.stats();
        assert_eq!(
            (stats.errors, stats.skipped_bytes, stats.ptw_without_fup),
            (0, 0, 0)
        );
        assert_eq!(stats.total_packets(), stream.packets.len() as u64);

        // (c) The visitor API decodes exactly what the iterator does.
        let mut visited = Decoder::new(&bytes);
        let mut events = Vec::new();
        visited.for_each_event(|e| events.push(e));
        assert_eq!(
            events,
            Decoder::new(&bytes).collect::<Vec<_>>(),
            "seed {seed}"
        );
        assert_eq!(visited.stats(), decoder.stats(), "seed {seed}");
    }
    // Every kind libipt 2.0 can encode appeared.
    let mut missing = String::new();
    for kind in memgaze_record::pt::packet::PacketKind::ALL {
        use memgaze_record::pt::packet::PacketKind::*;
        let encodable = !matches!(kind, Bbp | Bip | Bep | Cfe | Evd | Trig);
        if encodable && !kinds_seen.contains(&kind) {
            write!(missing, "{kind} ").unwrap();
        }
    }
    assert!(
        missing.is_empty(),
        "packet kinds never generated: {missing}"
    );
}
