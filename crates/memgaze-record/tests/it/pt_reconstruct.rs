//! Address reconstruction end to end on synthetic ptwrite streams encoded by
//! libipt: simulated executions of instrumented loads (ground-truth
//! addresses first, register values derived from them) → PT packets
//! (PTW + FUP per `ptwrite`, PSB+ every few dozen executions, timing
//! packets, an overflow) → AUX samples cut from the stream like the kernel
//! copies them (the last N bytes) → `pt::reconstruct` → a trace file →
//! read back and compared with the executions each sample must contain.

use memgaze_metadata::annotation::{
    ANNOTATION_SCHEMA, Annotation, FunctionSite, InstrumentationMode, LoadSite, PtwriteOperand,
    PtwriteSite,
};
use memgaze_record::pt::reconstruct::{
    CodeMap, DecodedSample, PtRecord, PtwriteMap, Reconstructor, TraceFacts, pt_trace_header,
    write_trace,
};
use memgaze_record::pt::ring::Losses;
use memgaze_trace::{BinaryIdentity, LoadClass, Sampling, TraceReader};

use crate::libipt;
use libipt::{Rng, libipt_encode};

/// Where the instrumented PIE was loaded.
const BIAS: u64 = 0x5555_5555_0000;

fn load(
    id: u32,
    ip: u64,
    class: LoadClass,
    base: Option<&str>,
    index: Option<&str>,
    scale: u8,
    displacement: i64,
) -> LoadSite {
    LoadSite {
        id,
        ip,
        len: 4,
        class,
        instrumented: base.is_some_and(|b| b != "rip") || index.is_some(),
        implied: 0,
        proxy: None,
        base: base.map(Into::into),
        index: index.map(Into::into),
        scale,
        displacement,
        size: 8,
        function: 0,
        line: None,
        inline_chain: Default::default(),
        skipped: None,
        segment: None,
        gather: false,
        read_modify_write: false,
        control: false,
    }
}

/// Address of load `id`'s `ptwrite` of `operand` in the instrumented binary.
fn site_ip(id: u32, operand: PtwriteOperand) -> u64 {
    0x2_0000
        + u64::from(id) * 0x20
        + match operand {
            PtwriteOperand::Base => 0,
            PtwriteOperand::Index => 5,
            PtwriteOperand::Address => 10,
        }
}

fn annotation() -> Annotation {
    let mut loads = vec![
        // a[i]: mov rax, [rdi + rcx*8]
        load(
            0,
            0x1010,
            LoadClass::Strided,
            Some("rdi"),
            Some("rcx"),
            8,
            0,
        ),
        // p->next: mov rax, [rax + 16]
        load(1, 0x1020, LoadClass::Irregular, Some("rax"), None, 1, 16),
        // table[j]: mov eax, [rdx*4 + 0x600000]
        load(
            2,
            0x1030,
            LoadClass::Strided,
            None,
            Some("rdx"),
            4,
            0x60_0000,
        ),
        // a stack scalar standing for two more Constant loads: [rsp + 8]
        load(3, 0x1040, LoadClass::Constant, Some("rsp"), None, 1, 8),
        // 32-bit addressing: [esi + edi + 4]
        load(
            4,
            0x1050,
            LoadClass::Irregular,
            Some("esi"),
            Some("edi"),
            1,
            4,
        ),
        // RIP-relative Constant: no source register, implied by load 3.
        load(
            5,
            0x1060,
            LoadClass::Constant,
            Some("rip"),
            None,
            1,
            0x40_2000,
        ),
    ];
    loads[3].implied = 2;
    loads[5].proxy = std::num::NonZeroU64::new(0x1040);
    let mut ptwrites = Vec::new();
    for l in &loads {
        if !l.instrumented {
            continue;
        }
        if l.base.is_some() {
            ptwrites.push(PtwriteSite {
                ip: site_ip(l.id, PtwriteOperand::Base),
                load: l.id,
                operand: PtwriteOperand::Base,
            });
        }
        if l.index.is_some() {
            ptwrites.push(PtwriteSite {
                ip: site_ip(l.id, PtwriteOperand::Index),
                load: l.id,
                operand: PtwriteOperand::Index,
            });
        }
    }
    Annotation {
        schema: ANNOTATION_SCHEMA.to_string(),
        binary: BinaryIdentity {
            path: "kernel".into(),
            size: 0,
            sha256: String::new(),
            build_id: None,
        },
        mode: Some(InstrumentationMode::Ptwrite),
        functions: vec![FunctionSite {
            name: "kernel".into(),
            raw_name: None,
            start: 0x1000,
            size: 0x100,
            instrumented: true,
            skipped: None,
            stack_loads: 0,
            string_loads: 0,
        }],
        loads,
        ptwrites,
        shared_libraries: Vec::new(),
        escapes: Vec::new(),
        cpu_features: Vec::new(),
    }
}

/// One simulated execution: the truth, and where its packets landed.
struct Execution {
    record: PtRecord,
    /// Index in the spec of its first packet and of the FUP completing it.
    packets: (usize, usize),
}

struct Program {
    spec: Vec<String>,
    executions: Vec<Execution>,
    /// Packet indices of PSBs and OVFs.
    psbs: Vec<usize>,
    overflows: Vec<usize>,
    last_ip: u64,
    /// The time-stamp counter: increases, as on a real CPU.
    tsc: u64,
}

impl Program {
    fn fup(&mut self, rng: &mut Rng, ip: u64) {
        // A compression valid against the last IP, chosen at random.
        let mut forms = vec![(6u8, ip)];
        if ip >> 16 == self.last_ip >> 16 {
            forms.push((1, ip & 0xffff));
        }
        if ip >> 32 == self.last_ip >> 32 {
            forms.push((2, ip & 0xffff_ffff));
        }
        if ip >> 48 == self.last_ip >> 48 {
            forms.push((4, ip & 0xffff_ffff_ffff));
        }
        let (ipc, payload) = forms[rng.below(forms.len() as u64) as usize];
        self.spec.push(format!("fup {ipc} {payload:#x}"));
        self.last_ip = ip;
    }

    fn psb(&mut self, rng: &mut Rng) {
        self.psbs.push(self.spec.len());
        self.spec.push("psb".into());
        self.tick(rng);
        self.spec.push("exec 1 0".into());
        self.last_ip = 0;
        self.fup(rng, BIAS + 0x1000);
        self.spec.push("psbend".into());
    }

    fn tick(&mut self, rng: &mut Rng) {
        self.tsc += 1 + rng.below(10_000);
        self.spec.push(format!("tsc {:#x}", self.tsc));
    }

    /// A `ptwrite` and its FUP; returns the FUP's packet index.
    fn ptwrite(&mut self, rng: &mut Rng, id: u32, operand: PtwriteOperand, value: u64) -> usize {
        self.spec.push(format!("ptw 1 1 {value:#x}"));
        if rng.chance(20) {
            self.spec.push(format!("cyc {}", rng.below(300)));
        }
        self.fup(rng, BIAS + site_ip(id, operand));
        let fup = self.spec.len() - 1;
        if rng.chance(10) {
            self.spec.push(format!("mtc {}", rng.below(256)));
        }
        fup
    }
}

fn simulate(seed: u64, executions: usize) -> Program {
    let mut rng = Rng::new(seed);
    let mut p = Program {
        spec: Vec::new(),
        executions: Vec::new(),
        psbs: Vec::new(),
        overflows: Vec::new(),
        last_ip: 0,
        tsc: 1 << 40,
    };
    p.psb(&mut rng);
    let array = 0x7f12_3400_0000u64;
    let mut i = 0u64;
    let mut rsp = 0x7ffd_0000_8000u64;
    for n in 0..executions {
        if n > 0 && rng.chance(3) {
            p.psb(&mut rng);
        }
        if n > 0 && n % 997 == 0 {
            // An overflow between executions; the CPU resumes with a FUP.
            p.overflows.push(p.spec.len());
            p.spec.push("ovf".into());
            let resume = BIAS + 0x1000 + rng.below(0x100);
            p.fup(&mut rng, resume);
        }
        let first = p.spec.len();
        let (record, last_fup) = match rng.below(5) {
            0 => {
                i += 1;
                p.ptwrite(&mut rng, 0, PtwriteOperand::Base, array);
                let fup = p.ptwrite(&mut rng, 0, PtwriteOperand::Index, i);
                (
                    PtRecord {
                        load: 0,
                        addr: array + 8 * i,
                    },
                    fup,
                )
            }
            1 => {
                let node = 0x5600_0000_0000 + rng.bits(32) * 64;
                let fup = p.ptwrite(&mut rng, 1, PtwriteOperand::Base, node);
                (
                    PtRecord {
                        load: 1,
                        addr: node + 16,
                    },
                    fup,
                )
            }
            2 => {
                let j = rng.below(1 << 20);
                let fup = p.ptwrite(&mut rng, 2, PtwriteOperand::Index, j);
                (
                    PtRecord {
                        load: 2,
                        addr: 0x60_0000 + 4 * j,
                    },
                    fup,
                )
            }
            3 => {
                rsp = rsp
                    .wrapping_sub(16 * rng.below(3))
                    .wrapping_add(16 * rng.below(3));
                let fup = p.ptwrite(&mut rng, 3, PtwriteOperand::Base, rsp);
                (
                    PtRecord {
                        load: 3,
                        addr: rsp + 8,
                    },
                    fup,
                )
            }
            _ => {
                // The full registers carry garbage in their upper halves.
                let target = rng.bits(32);
                let edi = rng.below(4096);
                let esi = target.wrapping_sub(edi + 4) & 0xffff_ffff;
                let (rsi, rdi) = (rng.next() << 32 | esi, rng.next() << 32 | edi);
                p.ptwrite(&mut rng, 4, PtwriteOperand::Base, rsi);
                let fup = p.ptwrite(&mut rng, 4, PtwriteOperand::Index, rdi);
                (
                    PtRecord {
                        load: 4,
                        addr: target,
                    },
                    fup,
                )
            }
        };
        p.executions.push(Execution {
            record,
            packets: (first, last_fup),
        });
        if rng.chance(15) {
            p.tick(&mut rng);
        }
    }
    p
}

#[test]
fn aux_samples_reconstruct_to_the_executed_addresses() {
    let annotation = annotation();
    let map = PtwriteMap::new(&annotation).unwrap();
    let code = CodeMap::with_bias(BIAS);
    for seed in 1..=3 {
        let program = simulate(seed, 6000);
        let (stream, layout) = libipt_encode(&(program.spec.join("\n") + "\n"));
        let end_of = |packet: usize| layout[packet].0 + layout[packet].1;

        // AUX samples: the last 2–6 KiB at random packet boundaries.
        let mut rng = Rng::new(seed * 77);
        let mut rebuild = Reconstructor::new(&map, &code);
        let mut samples = Vec::new();
        let mut expected_samples = Vec::new();
        let mut packet = 40;
        let mut taken = 0;
        while packet < layout.len() {
            taken += 1;
            let end = end_of(packet);
            let start = end.saturating_sub(2048 + rng.below(4096) as usize);
            let records = rebuild.sample(&stream[start..end]);

            // What the sample must hold: executions entirely inside it, from
            // its first PSB on, after its last overflow.
            let first_psb = program.psbs.iter().copied().find(|&p| layout[p].0 >= start);
            let expected: Vec<PtRecord> = match first_psb {
                None => Vec::new(),
                Some(psb) => {
                    let after = program
                        .overflows
                        .iter()
                        .copied()
                        .filter(|&o| o > psb && o <= packet)
                        .max()
                        .unwrap_or(psb);
                    program
                        .executions
                        .iter()
                        .filter(|e| e.packets.0 > after && e.packets.1 <= packet)
                        .map(|e| e.record)
                        .collect()
                }
            };
            assert_eq!(
                records, expected,
                "seed {seed}, sample ending at byte {end}"
            );
            if !records.is_empty() {
                samples.push(DecodedSample { thread: 0, records });
                expected_samples.push(expected);
            }
            packet += 150 + rng.below(400) as usize;
        }
        let stats = rebuild.stats;
        assert_eq!((stats.ptw_unknown_ip, stats.decode_errors), (0, 0));
        // A sample may end between a PTW and its FUP: at most one per sample.
        assert!(stats.ptw_without_ip <= taken, "{stats:?}");
        assert!(
            stats.dropped_before_overflow > 0,
            "the overflow policy was exercised"
        );
        assert!(
            stats.incomplete > 0,
            "samples that end between base and index were exercised"
        );

        // Write the trace and read it back.
        let executions = 1_234_567;
        let header = pt_trace_header(
            &annotation,
            Sampling {
                window: 1,
                period: 100_000,
                seed: None,
            },
            vec!["kernel".into()],
        );
        let (bytes, totals) = write_trace(
            Vec::new(),
            &samples,
            TraceFacts {
                header,
                executions,
                losses: Losses::default(),
                stats,
                empty_samples: 0,
                exit: None,
            },
        )
        .unwrap();
        let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
        let mut got: Vec<Vec<(u64, u64, LoadClass)>> = Vec::new();
        while let Some(r) = reader.next_record().unwrap() {
            if got.len() <= r.sample as usize {
                got.resize(r.sample as usize + 1, Vec::new());
            }
            got[r.sample as usize].push((r.ip, r.addr, r.class));
        }
        let want: Vec<Vec<(u64, u64, LoadClass)>> = expected_samples
            .iter()
            .map(|s| {
                s.iter()
                    .map(|r| {
                        let l = &annotation.loads[r.load as usize];
                        (l.ip, r.addr, l.class)
                    })
                    .collect()
            })
            .collect();
        assert_eq!(got, want, "seed {seed}: trace records");
        let read_totals = reader.totals().unwrap().clone();
        assert_eq!(read_totals, totals);
        assert_eq!(
            totals.executions, executions,
            "ρ's numerator is the load count"
        );
        assert_eq!(totals.samples, samples.len() as u64);
        assert_eq!(totals.dropped.records, stats.lost_ptw());
        let header = reader.header();
        assert_eq!(header.backend, memgaze_trace::Backend::Pt);
        // The RIP-relative Constant load is implied by its proxy.
        assert_eq!(header.loads[5].proxy, Some(3));
        assert_eq!(header.loads[3].implied, 2);
        let mut lengths: Vec<usize> = samples.iter().map(|s| s.records.len()).collect();
        lengths.sort_unstable();
        assert_eq!(header.sampling.window, lengths[lengths.len() / 2] as u64);
    }
}

#[test]
fn a_full_stream_reconstructs_every_execution() {
    let annotation = annotation();
    let map = PtwriteMap::new(&annotation).unwrap();
    let code = CodeMap::with_bias(BIAS);
    let program = simulate(42, 3000);
    let (stream, _) = libipt_encode(&(program.spec.join("\n") + "\n"));
    let mut rebuild = Reconstructor::new(&map, &code);
    let records = rebuild.full(&[&stream]);
    let want: Vec<PtRecord> = program.executions.iter().map(|e| e.record).collect();
    assert_eq!(records, want);
    assert_eq!(rebuild.stats.lost_ptw(), 0);
    assert_eq!(rebuild.stats.unsynced_head_bytes, 0);
}

#[test]
fn spatial_address_ptws_are_counted_and_leave_the_records_alone() {
    // Load 1 (base only) with a spatial check: its stub's `Address` PTW
    // comes before the operand PTW of the same execution.
    let mut annotation = annotation();
    annotation.ptwrites.push(PtwriteSite {
        ip: site_ip(1, PtwriteOperand::Address),
        load: 1,
        operand: PtwriteOperand::Address,
    });
    let map = PtwriteMap::new(&annotation).unwrap();
    let code = CodeMap::with_bias(BIAS);
    let mut rng = Rng::new(5);
    let mut p = Program {
        spec: Vec::new(),
        executions: Vec::new(),
        psbs: Vec::new(),
        overflows: Vec::new(),
        last_ip: 0,
        tsc: 1 << 40,
    };
    p.psb(&mut rng);
    let mut want = Vec::new();
    for k in 0..50u64 {
        let node = 0x5600_0000_0000 + k * 64;
        if k % 3 == 0 {
            p.ptwrite(&mut rng, 1, PtwriteOperand::Address, node + 16);
        }
        p.ptwrite(&mut rng, 1, PtwriteOperand::Base, node);
        want.push(PtRecord {
            load: 1,
            addr: node + 16,
        });
    }
    let (stream, _) = libipt_encode(&(p.spec.join("\n") + "\n"));
    let mut rebuild = Reconstructor::new(&map, &code);
    assert_eq!(rebuild.full(&[&stream]), want);
    assert_eq!(rebuild.stats.spatial_ptw, 17);
    assert_eq!(rebuild.stats.lost_ptw(), 0);
}

#[test]
fn annotations_that_cannot_be_reconstructed_are_refused() {
    let mut a = annotation();
    a.mode = Some(InstrumentationMode::Soft);
    assert!(
        PtwriteMap::new(&a)
            .unwrap_err()
            .to_string()
            .contains("--mode ptwrite")
    );

    let mut a = annotation();
    a.loads[5].instrumented = true; // RIP-relative: nothing to ptwrite
    let e = PtwriteMap::new(&a).unwrap_err().to_string();
    assert!(e.contains("no general-purpose source register"), "{e}");

    let mut a = annotation();
    a.ptwrites
        .retain(|s| !(s.load == 0 && s.operand == PtwriteOperand::Index));
    assert!(
        PtwriteMap::new(&a)
            .unwrap_err()
            .to_string()
            .contains("lacks a ptwrite site")
    );

    let mut a = annotation();
    a.ptwrites.push(PtwriteSite {
        ip: 0x9999,
        load: 1,
        operand: PtwriteOperand::Index,
    });
    assert!(PtwriteMap::new(&a).is_err());
}
