//! Intel PT packets: a zero-copy, allocation-free parser of one packet at a
//! time.
//!
//! Encodings follow the Intel SDM Vol. 3C, chapter "Intel Processor Trace",
//! section "Packet Definitions" (cross-checked against libipt's
//! `pt_opcodes.h` and the Linux perf packet decoder). `parse` never
//! panics: every length is checked before bytes are read, and a packet that
//! runs past the end of the input is reported as [`PacketErrorKind::Truncated`].
//!
//! Block packets (BIP) are context dependent: their header byte is also a
//! valid TNT-8 header. `BlockContext` carries what the last BBP said, as the
//! caller's state (see `BlockContext::after`).

use std::fmt;

/// How a TIP/FUP/TIP.PGE/TIP.PGD packet compresses its IP (`IPBytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpCompression {
    /// No payload: the IP is out of context (suppressed).
    Suppressed,
    /// 2 bytes replace bits 15:0 of the last IP.
    Update16,
    /// 4 bytes replace bits 31:0 of the last IP.
    Update32,
    /// 6 bytes, sign-extended from bit 47.
    Sext48,
    /// 6 bytes replace bits 47:0 of the last IP.
    Update48,
    /// 8 bytes: the full IP.
    Full,
}

impl IpCompression {
    /// From the 3-bit `IPBytes` field; `None` for the reserved 5 and 7.
    pub(crate) fn from_bits(bits: u8) -> Option<IpCompression> {
        match bits {
            0 => Some(IpCompression::Suppressed),
            1 => Some(IpCompression::Update16),
            2 => Some(IpCompression::Update32),
            3 => Some(IpCompression::Sext48),
            4 => Some(IpCompression::Update48),
            6 => Some(IpCompression::Full),
            _ => None,
        }
    }

    /// The 3-bit `IPBytes` field.
    pub fn bits(self) -> u8 {
        match self {
            IpCompression::Suppressed => 0,
            IpCompression::Update16 => 1,
            IpCompression::Update32 => 2,
            IpCompression::Sext48 => 3,
            IpCompression::Update48 => 4,
            IpCompression::Full => 6,
        }
    }

    /// Payload bytes.
    pub fn payload_len(self) -> usize {
        match self {
            IpCompression::Suppressed => 0,
            IpCompression::Update16 => 2,
            IpCompression::Update32 => 4,
            IpCompression::Sext48 | IpCompression::Update48 => 6,
            IpCompression::Full => 8,
        }
    }

    /// Applies the compressed payload to the last IP (SDM "IP Compression"):
    /// the new full IP, or `None` when suppressed.
    pub fn apply(self, last_ip: u64, payload: u64) -> Option<u64> {
        match self {
            IpCompression::Suppressed => None,
            IpCompression::Update16 => Some((last_ip & !0xffff) | (payload & 0xffff)),
            IpCompression::Update32 => Some((last_ip & !0xffff_ffff) | (payload & 0xffff_ffff)),
            IpCompression::Sext48 => Some((((payload << 16) as i64) >> 16) as u64),
            IpCompression::Update48 => {
                Some((last_ip & !0xffff_ffff_ffff) | (payload & 0xffff_ffff_ffff))
            }
            IpCompression::Full => Some(payload),
        }
    }
}

/// A compressed IP as carried by a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpPayload {
    /// The compression form.
    pub compression: IpCompression,
    /// The payload bytes, little-endian, zero-extended.
    pub payload: u64,
}

/// One Intel PT packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Packet {
    /// PAD: one zero byte.
    Pad,
    /// PSB: the 16-byte synchronisation pattern.
    Psb,
    /// PSBEND: end of the PSB+ status packets.
    PsbEnd,
    /// TSC: the low 56 bits of the time-stamp counter.
    Tsc(u64),
    /// MTC: bits of the crystal clock counter (CTC).
    Mtc(u8),
    /// TMA: CTC and fast-counter values at the last TSC.
    Tma {
        /// CTC bits 15:0.
        ctc: u16,
        /// Fast counter (9 bits).
        fast_counter: u16,
    },
    /// CBR: core:bus ratio.
    Cbr(u8),
    /// CYC: core cycles since the last CYC (variable length).
    Cyc(u64),
    /// MODE.Exec: CS.L, CS.D and (newer CPUs) IF.
    ModeExec {
        /// CS.L (64-bit mode).
        csl: bool,
        /// CS.D.
        csd: bool,
        /// RFLAGS.IF (reported by CPUs with event tracing).
        interrupt_flag: bool,
    },
    /// MODE.TSX: transaction state.
    ModeTsx {
        /// In a transaction.
        in_transaction: bool,
        /// Transaction aborted.
        aborted: bool,
    },
    /// FUP: the source IP of an asynchronous event, of PSB+, or of a PTWRITE.
    Fup(IpPayload),
    /// TIP: an indirect branch target.
    Tip(IpPayload),
    /// TIP.PGE: tracing (packet generation) enabled at this IP.
    TipPge(IpPayload),
    /// TIP.PGD: tracing disabled.
    TipPgd(IpPayload),
    /// PTW: the operand of a PTWRITE instruction.
    Ptw {
        /// The operand, zero-extended.
        payload: u64,
        /// 4 or 8 bytes.
        size: u8,
        /// A FUP follows with the IP of the PTWRITE instruction.
        ip: bool,
    },
    /// OVF: internal buffer overflow; packets were lost.
    Ovf,
    /// TNT (1-byte form): up to 6 conditional-branch outcomes.
    TntShort {
        /// Outcomes, oldest in the highest bit.
        bits: u8,
        /// Number of outcomes.
        count: u8,
    },
    /// TNT (8-byte form): up to 47 outcomes.
    TntLong {
        /// Outcomes, oldest in the highest bit.
        bits: u64,
        /// Number of outcomes.
        count: u8,
    },
    /// PIP: CR3 (paging structure base) change.
    Pip {
        /// CR3 bits 51:5.
        cr3: u64,
        /// Non-root (VMX guest) bit.
        non_root: bool,
    },
    /// VMCS: VMCS base address.
    Vmcs(u64),
    /// MNT: maintenance payload.
    Mnt(u64),
    /// TraceStop.
    Stop,
    /// EXSTOP: execution stopped.
    Exstop {
        /// A FUP follows.
        ip: bool,
    },
    /// MWAIT hints and extensions.
    Mwait {
        /// EAX hints.
        hints: u32,
        /// ECX extensions.
        extensions: u32,
    },
    /// PWRE: power entry.
    Pwre(u16),
    /// PWRX: power exit (40-bit payload).
    Pwrx(u64),
    /// BBP: block begin (PEBS via PT).
    Bbp {
        /// Item size: true for 4-byte items, false for 8-byte items.
        four_byte_items: bool,
        /// Block type.
        block_type: u8,
    },
    /// BIP: block item (only inside a BBP block).
    Bip {
        /// Item id.
        id: u8,
        /// Item value.
        value: u64,
    },
    /// BEP: block end.
    Bep {
        /// A FUP follows.
        ip: bool,
    },
    /// CFE: control-flow event.
    Cfe {
        /// Event type.
        event_type: u8,
        /// Vector.
        vector: u8,
        /// A FUP follows.
        ip: bool,
    },
    /// EVD: event data.
    Evd {
        /// Data type.
        data_type: u8,
        /// Payload.
        payload: u64,
    },
    /// TRIG: trigger (trace-trigger events).
    Trig {
        /// Raw first payload byte (TRBV, IP, ICNTV, MULT bits).
        flags: u8,
        /// Trigger bits.
        bits: u8,
        /// Instruction count, when present.
        icount: Option<u16>,
    },
}

/// Packet kinds, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum PacketKind {
    /// [`Packet::Pad`]
    Pad,
    /// [`Packet::Psb`]
    Psb,
    /// [`Packet::PsbEnd`]
    PsbEnd,
    /// [`Packet::Tsc`]
    Tsc,
    /// [`Packet::Mtc`]
    Mtc,
    /// [`Packet::Tma`]
    Tma,
    /// [`Packet::Cbr`]
    Cbr,
    /// [`Packet::Cyc`]
    Cyc,
    /// [`Packet::ModeExec`]
    ModeExec,
    /// [`Packet::ModeTsx`]
    ModeTsx,
    /// [`Packet::Fup`]
    Fup,
    /// [`Packet::Tip`]
    Tip,
    /// [`Packet::TipPge`]
    TipPge,
    /// [`Packet::TipPgd`]
    TipPgd,
    /// [`Packet::Ptw`]
    Ptw,
    /// [`Packet::Ovf`]
    Ovf,
    /// [`Packet::TntShort`]
    TntShort,
    /// [`Packet::TntLong`]
    TntLong,
    /// [`Packet::Pip`]
    Pip,
    /// [`Packet::Vmcs`]
    Vmcs,
    /// [`Packet::Mnt`]
    Mnt,
    /// [`Packet::Stop`]
    Stop,
    /// [`Packet::Exstop`]
    Exstop,
    /// [`Packet::Mwait`]
    Mwait,
    /// [`Packet::Pwre`]
    Pwre,
    /// [`Packet::Pwrx`]
    Pwrx,
    /// [`Packet::Bbp`]
    Bbp,
    /// [`Packet::Bip`]
    Bip,
    /// [`Packet::Bep`]
    Bep,
    /// [`Packet::Cfe`]
    Cfe,
    /// [`Packet::Evd`]
    Evd,
    /// [`Packet::Trig`]
    Trig,
}

impl PacketKind {
    /// Number of kinds.
    pub(crate) const COUNT: usize = PacketKind::Trig as usize + 1;

    /// Every kind, in declaration order.
    pub const ALL: [PacketKind; PacketKind::COUNT] = [
        PacketKind::Pad,
        PacketKind::Psb,
        PacketKind::PsbEnd,
        PacketKind::Tsc,
        PacketKind::Mtc,
        PacketKind::Tma,
        PacketKind::Cbr,
        PacketKind::Cyc,
        PacketKind::ModeExec,
        PacketKind::ModeTsx,
        PacketKind::Fup,
        PacketKind::Tip,
        PacketKind::TipPge,
        PacketKind::TipPgd,
        PacketKind::Ptw,
        PacketKind::Ovf,
        PacketKind::TntShort,
        PacketKind::TntLong,
        PacketKind::Pip,
        PacketKind::Vmcs,
        PacketKind::Mnt,
        PacketKind::Stop,
        PacketKind::Exstop,
        PacketKind::Mwait,
        PacketKind::Pwre,
        PacketKind::Pwrx,
        PacketKind::Bbp,
        PacketKind::Bip,
        PacketKind::Bep,
        PacketKind::Cfe,
        PacketKind::Evd,
        PacketKind::Trig,
    ];

    /// The SDM's name for the packet.
    pub fn name(self) -> &'static str {
        match self {
            PacketKind::Pad => "PAD",
            PacketKind::Psb => "PSB",
            PacketKind::PsbEnd => "PSBEND",
            PacketKind::Tsc => "TSC",
            PacketKind::Mtc => "MTC",
            PacketKind::Tma => "TMA",
            PacketKind::Cbr => "CBR",
            PacketKind::Cyc => "CYC",
            PacketKind::ModeExec => "MODE.Exec",
            PacketKind::ModeTsx => "MODE.TSX",
            PacketKind::Fup => "FUP",
            PacketKind::Tip => "TIP",
            PacketKind::TipPge => "TIP.PGE",
            PacketKind::TipPgd => "TIP.PGD",
            PacketKind::Ptw => "PTW",
            PacketKind::Ovf => "OVF",
            PacketKind::TntShort => "TNT.8",
            PacketKind::TntLong => "TNT.64",
            PacketKind::Pip => "PIP",
            PacketKind::Vmcs => "VMCS",
            PacketKind::Mnt => "MNT",
            PacketKind::Stop => "TraceStop",
            PacketKind::Exstop => "EXSTOP",
            PacketKind::Mwait => "MWAIT",
            PacketKind::Pwre => "PWRE",
            PacketKind::Pwrx => "PWRX",
            PacketKind::Bbp => "BBP",
            PacketKind::Bip => "BIP",
            PacketKind::Bep => "BEP",
            PacketKind::Cfe => "CFE",
            PacketKind::Evd => "EVD",
            PacketKind::Trig => "TRIG",
        }
    }
}

impl fmt::Display for PacketKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Packet {
    /// The packet's kind.
    pub fn kind(&self) -> PacketKind {
        match self {
            Packet::Pad => PacketKind::Pad,
            Packet::Psb => PacketKind::Psb,
            Packet::PsbEnd => PacketKind::PsbEnd,
            Packet::Tsc(_) => PacketKind::Tsc,
            Packet::Mtc(_) => PacketKind::Mtc,
            Packet::Tma { .. } => PacketKind::Tma,
            Packet::Cbr(_) => PacketKind::Cbr,
            Packet::Cyc(_) => PacketKind::Cyc,
            Packet::ModeExec { .. } => PacketKind::ModeExec,
            Packet::ModeTsx { .. } => PacketKind::ModeTsx,
            Packet::Fup(_) => PacketKind::Fup,
            Packet::Tip(_) => PacketKind::Tip,
            Packet::TipPge(_) => PacketKind::TipPge,
            Packet::TipPgd(_) => PacketKind::TipPgd,
            Packet::Ptw { .. } => PacketKind::Ptw,
            Packet::Ovf => PacketKind::Ovf,
            Packet::TntShort { .. } => PacketKind::TntShort,
            Packet::TntLong { .. } => PacketKind::TntLong,
            Packet::Pip { .. } => PacketKind::Pip,
            Packet::Vmcs(_) => PacketKind::Vmcs,
            Packet::Mnt(_) => PacketKind::Mnt,
            Packet::Stop => PacketKind::Stop,
            Packet::Exstop { .. } => PacketKind::Exstop,
            Packet::Mwait { .. } => PacketKind::Mwait,
            Packet::Pwre(_) => PacketKind::Pwre,
            Packet::Pwrx(_) => PacketKind::Pwrx,
            Packet::Bbp { .. } => PacketKind::Bbp,
            Packet::Bip { .. } => PacketKind::Bip,
            Packet::Bep { .. } => PacketKind::Bep,
            Packet::Cfe { .. } => PacketKind::Cfe,
            Packet::Evd { .. } => PacketKind::Evd,
            Packet::Trig { .. } => PacketKind::Trig,
        }
    }
}

/// Why bytes did not parse as a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PacketErrorKind {
    /// The packet runs past the end of the input.
    Truncated,
    /// No packet starts with this byte.
    UnknownOpcode(u8),
    /// No extended packet (`0x02 xx`) has this second byte.
    UnknownExtendedOpcode(u8),
    /// A known header with an invalid payload (reserved encodings, a broken
    /// PSB pattern, an over-long CYC).
    BadPayload(&'static str),
}

impl fmt::Display for PacketErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PacketErrorKind::Truncated => f.write_str("packet truncated by the end of the data"),
            PacketErrorKind::UnknownOpcode(b) => write!(f, "unknown opcode {b:#04x}"),
            PacketErrorKind::UnknownExtendedOpcode(b) => {
                write!(f, "unknown extended opcode 0x02 {b:#04x}")
            }
            PacketErrorKind::BadPayload(what) => write!(f, "bad packet: {what}"),
        }
    }
}

/// The state BIP decoding depends on: inside a BBP block, and with which
/// item size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) enum BlockContext {
    /// Outside a block.
    #[default]
    None,
    /// Inside a block of 4-byte items.
    Items4,
    /// Inside a block of 8-byte items.
    Items8,
}

impl BlockContext {
    /// The context after `packet` (the rule of the Linux perf decoder: BBP
    /// opens a block; BIP, FUP and timing/power packets keep it; everything
    /// else closes it).
    pub(crate) fn after(self, packet: &Packet) -> BlockContext {
        match packet {
            Packet::Bbp {
                four_byte_items, ..
            } => {
                if *four_byte_items {
                    BlockContext::Items4
                } else {
                    BlockContext::Items8
                }
            }
            Packet::Pad
            | Packet::Tsc(_)
            | Packet::Tma { .. }
            | Packet::Mtc(_)
            | Packet::Fup(_)
            | Packet::Cyc(_)
            | Packet::Cbr(_)
            | Packet::Mnt(_)
            | Packet::Exstop { .. }
            | Packet::Pwre(_)
            | Packet::Pwrx(_)
            | Packet::Bip { .. } => self,
            _ => BlockContext::None,
        }
    }
}

/// The 16-byte PSB pattern.
pub(crate) const PSB_PATTERN: [u8; 16] = [
    0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
];

/// Little-endian integer from up to 8 bytes.
///
/// Fixed-size reads compile to single loads; this is the decoder's hot path
/// (a generic copy into a buffer costs a `memcpy` call per packet).
#[inline(always)]
fn le(bytes: &[u8]) -> u64 {
    match *bytes {
        [] => 0,
        [a, b] => u64::from(u16::from_le_bytes([a, b])),
        [a, b, c, d] => u64::from(u32::from_le_bytes([a, b, c, d])),
        [a, b, c, d, e, f] => u64::from_le_bytes([a, b, c, d, e, f, 0, 0]),
        [a, b, c, d, e, f, g, h] => u64::from_le_bytes([a, b, c, d, e, f, g, h]),
        _ => {
            let mut buf = [0u8; 8];
            let n = bytes.len().min(8);
            buf[..n].copy_from_slice(&bytes[..n]);
            u64::from_le_bytes(buf)
        }
    }
}

/// Returns `bytes[start..start + len]` or a truncation error.
#[inline(always)]
fn take(bytes: &[u8], len: usize) -> Result<&[u8], PacketErrorKind> {
    bytes.get(..len).ok_or(PacketErrorKind::Truncated)
}

/// Parses the packet at the start of `bytes`: the packet and its length.
#[inline(always)]
pub(crate) fn parse(bytes: &[u8], block: BlockContext) -> Result<(Packet, usize), PacketErrorKind> {
    let Some(&b0) = bytes.first() else {
        return Err(PacketErrorKind::Truncated);
    };
    if block != BlockContext::None && b0 & 0x07 == 0x04 {
        let len = if block == BlockContext::Items4 { 5 } else { 9 };
        let p = take(bytes, len)?;
        return Ok((
            Packet::Bip {
                id: b0 >> 3,
                value: le(&p[1..]),
            },
            len,
        ));
    }
    if b0 & 1 == 0 {
        return match b0 {
            0x00 => Ok((Packet::Pad, 1)),
            0x02 => parse_extended(bytes),
            _ => {
                // TNT-8: the highest set bit is the stop bit; the bits below
                // it, except bit 0, are outcomes.
                let stop = 7 - b0.leading_zeros() as u8;
                let count = stop - 1;
                let bits = (b0 >> 1) & ((1u8 << count) - 1);
                Ok((Packet::TntShort { bits, count }, 1))
            }
        };
    }
    if b0 & 2 != 0 {
        return parse_cyc(bytes, b0);
    }
    match b0 & 0x1f {
        0x0d => parse_ip(bytes, b0).map(|(ip, n)| (Packet::Tip(ip), n)),
        0x11 => parse_ip(bytes, b0).map(|(ip, n)| (Packet::TipPge(ip), n)),
        0x01 => parse_ip(bytes, b0).map(|(ip, n)| (Packet::TipPgd(ip), n)),
        0x1d => parse_ip(bytes, b0).map(|(ip, n)| (Packet::Fup(ip), n)),
        0x19 => match b0 {
            0x19 => {
                let p = take(bytes, 8)?;
                Ok((Packet::Tsc(le(&p[1..8])), 8))
            }
            0x59 => {
                let p = take(bytes, 2)?;
                Ok((Packet::Mtc(p[1]), 2))
            }
            0x99 => {
                let p = take(bytes, 2)?;
                parse_mode(p[1]).map(|m| (m, 2))
            }
            0xd9 => parse_trig(bytes),
            _ => Err(PacketErrorKind::UnknownOpcode(b0)),
        },
        _ => Err(PacketErrorKind::UnknownOpcode(b0)),
    }
}

#[inline(always)]
fn parse_ip(bytes: &[u8], b0: u8) -> Result<(IpPayload, usize), PacketErrorKind> {
    let compression = IpCompression::from_bits(b0 >> 5)
        .ok_or(PacketErrorKind::BadPayload("reserved IP compression"))?;
    let n = compression.payload_len();
    let p = take(bytes, 1 + n)?;
    Ok((
        IpPayload {
            compression,
            payload: le(&p[1..]),
        },
        1 + n,
    ))
}

fn parse_cyc(bytes: &[u8], b0: u8) -> Result<(Packet, usize), PacketErrorKind> {
    let mut value = u64::from(b0 >> 3);
    let mut more = b0 & 0x04 != 0;
    let mut len = 1usize;
    let mut shift = 5u32;
    while more {
        let &b = bytes.get(len).ok_or(PacketErrorKind::Truncated)?;
        len += 1;
        if shift >= 64 || len > 15 {
            return Err(PacketErrorKind::BadPayload(
                "CYC payload wider than 64 bits",
            ));
        }
        value |= u64::from(b >> 1) << shift;
        shift += 7;
        more = b & 1 != 0;
    }
    Ok((Packet::Cyc(value), len))
}

fn parse_mode(b1: u8) -> Result<Packet, PacketErrorKind> {
    match b1 >> 5 {
        0 => Ok(Packet::ModeExec {
            csl: b1 & 1 != 0,
            csd: b1 & 2 != 0,
            interrupt_flag: b1 & 4 != 0,
        }),
        1 => Ok(Packet::ModeTsx {
            in_transaction: b1 & 1 != 0,
            aborted: b1 & 2 != 0,
        }),
        _ => Err(PacketErrorKind::BadPayload("reserved MODE leaf")),
    }
}

fn parse_trig(bytes: &[u8]) -> Result<(Packet, usize), PacketErrorKind> {
    let p = take(bytes, 3)?;
    let flags = p[1];
    if flags & 0x40 != 0 {
        let p = take(bytes, 5)?;
        Ok((
            Packet::Trig {
                flags,
                bits: p[2],
                icount: Some(u16::from_le_bytes([p[3], p[4]])),
            },
            5,
        ))
    } else {
        Ok((
            Packet::Trig {
                flags,
                bits: p[2],
                icount: None,
            },
            3,
        ))
    }
}

#[inline(always)]
fn parse_extended(bytes: &[u8]) -> Result<(Packet, usize), PacketErrorKind> {
    let p = take(bytes, 2)?;
    let b1 = p[1];
    if b1 & 0x1f == 0x12 {
        return parse_ptw(bytes, b1);
    }
    parse_extended_other(bytes, b1)
}

#[inline(always)]
fn parse_ptw(bytes: &[u8], b1: u8) -> Result<(Packet, usize), PacketErrorKind> {
    let ip = b1 & 0x80 != 0;
    match (b1 >> 5) & 3 {
        0 => {
            let p = take(bytes, 6)?;
            Ok((
                Packet::Ptw {
                    payload: le(&p[2..6]),
                    size: 4,
                    ip,
                },
                6,
            ))
        }
        1 => {
            let p = take(bytes, 10)?;
            Ok((
                Packet::Ptw {
                    payload: le(&p[2..10]),
                    size: 8,
                    ip,
                },
                10,
            ))
        }
        _ => Err(PacketErrorKind::BadPayload("reserved PTW payload size")),
    }
}

#[inline(never)]
fn parse_extended_other(bytes: &[u8], b1: u8) -> Result<(Packet, usize), PacketErrorKind> {
    match b1 {
        0x82 => {
            let p = take(bytes, 16)?;
            if p == PSB_PATTERN {
                Ok((Packet::Psb, 16))
            } else {
                Err(PacketErrorKind::BadPayload("broken PSB pattern"))
            }
        }
        0x23 => Ok((Packet::PsbEnd, 2)),
        0xf3 => Ok((Packet::Ovf, 2)),
        0x83 => Ok((Packet::Stop, 2)),
        0x03 => {
            let p = take(bytes, 4)?;
            Ok((Packet::Cbr(p[2]), 4))
        }
        0x73 => {
            let p = take(bytes, 7)?;
            Ok((
                Packet::Tma {
                    ctc: u16::from_le_bytes([p[2], p[3]]),
                    fast_counter: u16::from_le_bytes([p[5], p[6]]) & 0x1ff,
                },
                7,
            ))
        }
        0xa3 => {
            let p = take(bytes, 8)?;
            let raw = le(&p[2..8]);
            if raw == 0 {
                return Err(PacketErrorKind::BadPayload("TNT.64 without stop bit"));
            }
            let stop = 63 - raw.leading_zeros();
            Ok((
                Packet::TntLong {
                    bits: raw & ((1u64 << stop) - 1),
                    count: stop as u8,
                },
                8,
            ))
        }
        0x43 => {
            let p = take(bytes, 8)?;
            let raw = le(&p[2..8]);
            Ok((
                Packet::Pip {
                    cr3: (raw >> 1) << 5,
                    non_root: raw & 1 != 0,
                },
                8,
            ))
        }
        0xc8 => {
            let p = take(bytes, 7)?;
            Ok((Packet::Vmcs(le(&p[2..7]) << 12), 7))
        }
        0xc3 => {
            let p = take(bytes, 3)?;
            if p[2] != 0x88 {
                return Err(PacketErrorKind::BadPayload("unknown 0x02 0xc3 packet"));
            }
            let p = take(bytes, 11)?;
            Ok((Packet::Mnt(le(&p[3..11])), 11))
        }
        0x62 => Ok((Packet::Exstop { ip: false }, 2)),
        0xe2 => Ok((Packet::Exstop { ip: true }, 2)),
        0xc2 => {
            let p = take(bytes, 10)?;
            Ok((
                Packet::Mwait {
                    hints: le(&p[2..6]) as u32,
                    extensions: le(&p[6..10]) as u32,
                },
                10,
            ))
        }
        0x22 => {
            let p = take(bytes, 4)?;
            Ok((Packet::Pwre(u16::from_le_bytes([p[2], p[3]])), 4))
        }
        0xa2 => {
            let p = take(bytes, 7)?;
            Ok((Packet::Pwrx(le(&p[2..7])), 7))
        }
        0x63 => {
            let p = take(bytes, 3)?;
            Ok((
                Packet::Bbp {
                    four_byte_items: p[2] & 0x80 != 0,
                    block_type: p[2] & 0x1f,
                },
                3,
            ))
        }
        0x33 => Ok((Packet::Bep { ip: false }, 2)),
        0xb3 => Ok((Packet::Bep { ip: true }, 2)),
        0x13 => {
            let p = take(bytes, 4)?;
            Ok((
                Packet::Cfe {
                    event_type: p[2] & 0x1f,
                    vector: p[3],
                    ip: p[2] & 0x80 != 0,
                },
                4,
            ))
        }
        0x53 => {
            let p = take(bytes, 11)?;
            Ok((
                Packet::Evd {
                    data_type: p[2] & 0x1f,
                    payload: le(&p[3..11]),
                },
                11,
            ))
        }
        _ => Err(PacketErrorKind::UnknownExtendedOpcode(b1)),
    }
}

/// Iterates the packets of a buffer from its start, with no
/// synchronisation logic: it stops at the first error (yielding it once).
/// [`Decoder`](super::decode::Decoder) is the robust, resynchronising reader.
#[derive(Clone, Debug)]
pub struct Packets<'a> {
    data: &'a [u8],
    pos: usize,
    block: BlockContext,
    failed: bool,
}

impl<'a> Packets<'a> {
    /// Packets of `data`, starting at offset 0 (which must be a packet
    /// boundary).
    pub fn new(data: &'a [u8]) -> Packets<'a> {
        Packets {
            data,
            pos: 0,
            block: BlockContext::None,
            failed: false,
        }
    }
}

impl Iterator for Packets<'_> {
    /// `(offset, packet)`, or `(offset, error)` once at the end.
    type Item = Result<(usize, Packet), (usize, PacketErrorKind)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.data.len() {
            return None;
        }
        let offset = self.pos;
        match parse(&self.data[offset..], self.block) {
            Ok((packet, len)) => {
                self.pos += len;
                self.block = self.block.after(&packet);
                Some(Ok((offset, packet)))
            }
            Err(kind) => {
                self.failed = true;
                Some(Err((offset, kind)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(bytes: &[u8]) -> Packet {
        let (p, n) = parse(bytes, BlockContext::None).unwrap();
        assert_eq!(n, bytes.len(), "length of {p:?}");
        p
    }

    #[test]
    fn hand_encoded_packets_from_the_sdm_tables() {
        assert_eq!(one(&[0x00]), Packet::Pad);
        assert_eq!(one(&PSB_PATTERN), Packet::Psb);
        assert_eq!(one(&[0x02, 0x23]), Packet::PsbEnd);
        assert_eq!(one(&[0x02, 0xf3]), Packet::Ovf);
        assert_eq!(
            one(&[0x19, 1, 2, 3, 4, 5, 6, 7]),
            Packet::Tsc(0x07060504030201)
        );
        assert_eq!(one(&[0x59, 0xab]), Packet::Mtc(0xab));
        assert_eq!(
            one(&[0x02, 0x73, 0x34, 0x12, 0, 0xff, 0x03]),
            Packet::Tma {
                ctc: 0x1234,
                fast_counter: 0x1ff
            }
        );
        assert_eq!(one(&[0x02, 0x03, 0x2a, 0]), Packet::Cbr(0x2a));
        // CYC: 5 bits in the header, then 7 bits per extension byte.
        assert_eq!(one(&[0x03 | (0x1f << 3)]), Packet::Cyc(0x1f));
        assert_eq!(
            one(&[0x07 | (0x01 << 3), 0x02 << 1]),
            Packet::Cyc(1 | (2 << 5))
        );
        assert_eq!(
            one(&[0x99, 0x01]),
            Packet::ModeExec {
                csl: true,
                csd: false,
                interrupt_flag: false
            }
        );
        assert_eq!(
            one(&[0x99, 0x22]),
            Packet::ModeTsx {
                in_transaction: false,
                aborted: true
            }
        );
        assert!(parse(&[0x99, 0x40], BlockContext::None).is_err());
        // FUP with each IPBytes form.
        assert_eq!(
            one(&[0x1d]),
            Packet::Fup(IpPayload {
                compression: IpCompression::Suppressed,
                payload: 0
            })
        );
        assert_eq!(
            one(&[0x3d, 0x34, 0x12]),
            Packet::Fup(IpPayload {
                compression: IpCompression::Update16,
                payload: 0x1234
            })
        );
        assert_eq!(
            one(&[0xdd, 1, 2, 3, 4, 5, 6, 7, 8]),
            Packet::Fup(IpPayload {
                compression: IpCompression::Full,
                payload: 0x0807060504030201
            })
        );
        assert!(parse(&[0xbd, 0, 0, 0, 0, 0, 0, 0, 0], BlockContext::None).is_err());
        // PTW 4 and 8 bytes, with and without the IP bit.
        assert_eq!(
            one(&[0x02, 0x12, 0xef, 0xbe, 0xad, 0xde]),
            Packet::Ptw {
                payload: 0xdeadbeef,
                size: 4,
                ip: false
            }
        );
        assert_eq!(
            one(&[0x02, 0xb2, 1, 2, 3, 4, 5, 6, 7, 8]),
            Packet::Ptw {
                payload: 0x0807060504030201,
                size: 8,
                ip: true
            }
        );
        assert!(parse(&[0x02, 0x52, 0, 0, 0, 0], BlockContext::None).is_err());
        // TNT: 0b0000_1110 = stop bit at 3, outcomes 1,1.
        assert_eq!(
            one(&[0x0e]),
            Packet::TntShort {
                bits: 0b11,
                count: 2
            }
        );
        assert_eq!(one(&[0x04]), Packet::TntShort { bits: 0, count: 1 });
        assert_eq!(
            one(&[0x02, 0xa3, 0b101, 0, 0, 0, 0, 0]),
            Packet::TntLong { bits: 1, count: 2 }
        );
        assert_eq!(
            one(&[0x02, 0xc3, 0x88, 1, 0, 0, 0, 0, 0, 0, 0]),
            Packet::Mnt(1)
        );
        assert_eq!(
            one(&[0x02, 0x63, 0x80 | 0x05]),
            Packet::Bbp {
                four_byte_items: true,
                block_type: 5
            }
        );
        assert_eq!(one(&[0x02, 0xb3]), Packet::Bep { ip: true });
        assert_eq!(
            one(&[0x02, 0x13, 0x81, 0x0e]),
            Packet::Cfe {
                event_type: 1,
                vector: 0x0e,
                ip: true
            }
        );
        assert_eq!(
            one(&[0x02, 0x53, 0x02, 8, 7, 6, 5, 4, 3, 2, 1]),
            Packet::Evd {
                data_type: 2,
                payload: 0x0102030405060708
            }
        );
        assert_eq!(
            one(&[0xd9, 0x40, 0x03, 0x10, 0x00]),
            Packet::Trig {
                flags: 0x40,
                bits: 3,
                icount: Some(0x10)
            }
        );
    }

    #[test]
    fn bip_only_inside_a_block() {
        // 0x0c is a TNT-8 outside a block and a BIP (id 1) inside one.
        let bytes = [0x0c, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(
            parse(&bytes, BlockContext::None).unwrap(),
            (
                Packet::TntShort {
                    bits: 0b10,
                    count: 2
                },
                1
            )
        );
        assert_eq!(
            parse(&bytes, BlockContext::Items4).unwrap(),
            (
                Packet::Bip {
                    id: 1,
                    value: 0x04030201
                },
                5
            )
        );
        assert_eq!(parse(&bytes, BlockContext::Items8).unwrap().1, 9);
    }

    #[test]
    fn ip_compression_rules() {
        let last = 0xffff_8000_1234_5678;
        assert_eq!(
            IpCompression::Update16.apply(last, 0xabcd),
            Some(0xffff_8000_1234_abcd)
        );
        assert_eq!(
            IpCompression::Update32.apply(last, 0xdead_beef),
            Some(0xffff_8000_dead_beef)
        );
        assert_eq!(
            IpCompression::Update48.apply(last, 0x1111_2222_3333),
            Some(0xffff_1111_2222_3333)
        );
        assert_eq!(
            IpCompression::Sext48.apply(0, 0x8000_0000_0000),
            Some(0xffff_8000_0000_0000)
        );
        assert_eq!(
            IpCompression::Sext48.apply(last, 0x7fff_0000_0001),
            Some(0x7fff_0000_0001)
        );
        assert_eq!(IpCompression::Full.apply(last, 42), Some(42));
        assert_eq!(IpCompression::Suppressed.apply(last, 0), None);
    }

    #[test]
    fn truncation_is_an_error_not_a_panic() {
        for bytes in [
            &[0x02][..],
            &[0x19, 1, 2],
            &[0x02, 0x82, 0x02],
            &[0xdd, 1],
            &[0x07],
            &[0x02, 0xb2, 1, 2, 3],
            &[0x02, 0xc3],
        ] {
            assert_eq!(
                parse(bytes, BlockContext::None),
                Err(PacketErrorKind::Truncated),
                "{bytes:x?}"
            );
        }
    }
}
