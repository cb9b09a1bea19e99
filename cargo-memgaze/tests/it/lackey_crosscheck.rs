//! The golden full traces checked against an independent oracle: Valgrind
//! Lackey on the *uninstrumented* bench executable.
//!
//! For every microbenchmark, at a reduced size (so Lackey's log stays
//! small; it is parsed as it streams, never stored): between the region
//! markers, the number of executions of every explicit load instruction
//! must equal the count our full trace (instrumented executable, software
//! recorder, analysis) gives for that load's original address, and the
//! footprint `F` and line footprint `F_lines` of the Strided and Irregular
//! loads must agree. In-region loads Lackey sees that we do not list must
//! be implicit stack traffic (`push`/`pop`/`call`/`ret`/`leave`), which the
//! load-level analysis leaves out by design.
//!
//! Lackey prints `I  addr,size` per executed instruction and ` L`/` M`
//! lines per load/modify right after it; Valgrind maps a position-
//! independent executable at `0x108000`.

use memgaze::cargo::{self, BenchOutcome, BenchSuite, BuildOptions, CargoArgs, HarnessArgs};
use memgaze::pipeline::{self, RunPlan};
use memgaze_analysis::AnalysisOptions;
use memgaze_trace::{LoadClass, Sampling};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where Valgrind (amd64) loads a PIE's first segment.
const VALGRIND_PIE_BASE: u64 = 0x108000;
/// Reduced size: elements and sweeps.
const ELEMENTS: &str = "2048";
const REPS: &str = "2";

fn suite() -> BenchSuite {
    let args = CargoArgs {
        manifest_path: Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml")),
        packages: vec!["microbenches".into()],
        target_dir: Some(Path::new(env!("CARGO_TARGET_TMPDIR")).join("memgaze-benches")),
        locked: true,
        ..CargoArgs::default()
    };
    let options = BuildOptions {
        quiet: true,
        ..BuildOptions::default()
    };
    cargo::discover(&args, &HarnessArgs::default(), &options).unwrap()
}

/// What Lackey saw between the markers.
#[derive(Default)]
struct LackeyCounts {
    /// Executions of each instruction (original address) that loaded.
    loads: HashMap<u64, u64>,
    /// Load/modify addresses per instruction address (for F, F_lines).
    addresses: HashMap<u64, HashSet<u64>>,
    /// In-region loads by code outside the executable (libc, ld.so).
    outside: u64,
    /// Times the region was entered.
    regions: u32,
}

fn hex(text: &str) -> u64 {
    u64::from_str_radix(text, 16).unwrap_or_else(|_| panic!("bad hex {text:?}"))
}

/// Runs the uninstrumented bench under Lackey and counts in-region loads
/// per instruction, streaming the log from a pipe.
fn lackey(
    exe: &cargo::BenchExecutable,
    case: &cargo::BenchCase,
    markers: cargo::RegionMarkers,
    text: (u64, u64),
) -> LackeyCounts {
    let program = exe.run_command(&exe.path, case, None);
    let mut command = Command::new("valgrind");
    command
        .args(["--tool=lackey", "--trace-mem=yes", "--log-fd=2", "-q"])
        .arg(program.get_program())
        .args(program.get_args())
        .current_dir(&exe.package_root)
        .env(cargo::RECORDING_ENV, "1")
        .env("MEMGAZE_MICRO_ELEMENTS", ELEMENTS)
        .env("MEMGAZE_MICRO_REPS", REPS)
        // One run of the routine, no warm-up: the same loads as ours.
        .env("MEMGAZE_ITERATIONS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .expect("valgrind is required (ci/test.sh installs it)");
    let log = BufReader::new(child.stderr.take().unwrap());
    let begin = markers.begin + VALGRIND_PIE_BASE;
    let end = markers.end + VALGRIND_PIE_BASE;
    let mut counts = LackeyCounts::default();
    let mut in_region = false;
    // The current instruction (original address) and whether it loaded.
    let mut current: Option<u64> = None;
    let mut current_loaded = false;
    let mut outside_current = false;
    for line in log.lines() {
        let line = line.unwrap();
        let bytes = line.as_bytes();
        if bytes.len() < 3 {
            continue;
        }
        match (bytes[0], bytes[1]) {
            (b'I', b' ') => {
                let addr = hex(line[3..].trim_start().split(',').next().unwrap());
                if addr == begin {
                    in_region = true;
                    counts.regions += 1;
                } else if addr == end {
                    in_region = false;
                }
                current_loaded = false;
                if in_region
                    && addr >= VALGRIND_PIE_BASE + text.0
                    && addr < VALGRIND_PIE_BASE + text.1
                {
                    current = Some(addr - VALGRIND_PIE_BASE);
                    outside_current = false;
                } else {
                    current = None;
                    outside_current = in_region;
                }
            }
            (b' ', b'L') | (b' ', b'M') => {
                let addr = hex(line[3..].split(',').next().unwrap());
                if let Some(ip) = current {
                    if !current_loaded {
                        *counts.loads.entry(ip).or_default() += 1;
                        current_loaded = true;
                    }
                    counts.addresses.entry(ip).or_default().insert(addr);
                } else if outside_current && !current_loaded {
                    counts.outside += 1;
                    current_loaded = true;
                }
            }
            _ => {}
        }
    }
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "valgrind on `{}` failed: {status}",
        case.name
    );
    counts
}

/// The executable's code range (file addresses of `.text`).
fn text_range(path: &Path) -> (u64, u64) {
    let bytes = std::fs::read(path).unwrap();
    let elf = goblin::elf::Elf::parse(&bytes).unwrap();
    let text = elf
        .section_headers
        .iter()
        .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(".text"))
        .expect(".text");
    (text.sh_addr, text.sh_addr + text.sh_size)
}

/// Whether the instruction at `ip` reads the stack only implicitly.
fn is_implicit_stack_read(path: &Path, ip: u64) -> bool {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind};
    let bytes = std::fs::read(path).unwrap();
    let elf = goblin::elf::Elf::parse(&bytes).unwrap();
    let segment = elf
        .program_headers
        .iter()
        .find(|p| {
            p.p_type == goblin::elf::program_header::PT_LOAD
                && p.vm_range().contains(&(ip as usize))
        })
        .expect("ip in a segment");
    let offset = (ip - segment.p_vaddr + segment.p_offset) as usize;
    let mut decoder = Decoder::with_ip(64, &bytes[offset..offset + 16], ip, DecoderOptions::NONE);
    let insn = decoder.decode();
    let explicit = (0..insn.op_count()).any(|i| insn.op_kind(i) == OpKind::Memory);
    !explicit
        && matches!(
            insn.mnemonic(),
            Mnemonic::Push | Mnemonic::Pop | Mnemonic::Call | Mnemonic::Ret | Mnemonic::Leave
        )
}

#[test]
fn full_traces_count_every_load_like_lackey() {
    let suite = suite();
    let target = &suite.targets[0];
    let exe = &target.executable;
    let root: PathBuf = suite.workspace.results_layout().root().to_path_buf();
    let instrumented = pipeline::instrumented(&exe.path, &root).unwrap();
    let text = text_range(&exe.path);
    let explicit: HashMap<u64, LoadClass> = instrumented
        .annotation
        .loads
        .iter()
        .map(|l| (l.ip, l.class))
        .collect();
    assert_eq!(target.cases.len(), 8);
    let mut failures = Vec::new();
    for case in &target.cases {
        let plan = RunPlan {
            sampling: Sampling::full(),
            spatial: None,
            analysis: AnalysisOptions::default(),
            trace_file: None,
            per_sample: false,
            env: vec![
                ("MEMGAZE_MICRO_ELEMENTS".into(), ELEMENTS.into()),
                ("MEMGAZE_MICRO_REPS".into(), REPS.into()),
                pipeline::one_iteration(),
            ],
            limits: Default::default(),
        };
        let ours = pipeline::record_bench(
            target,
            case,
            (&instrumented, &pipeline::libs::Libraries::default()),
            &plan,
        )
        .unwrap();
        assert!(
            matches!(ours.outcome, BenchOutcome::Measured { .. }),
            "{}: {:?}",
            case.name,
            ours.outcome
        );
        assert!(ours.totals.complete && ours.totals.dropped.records == 0);
        let theirs = lackey(exe, case, target.markers, text);
        assert_eq!(
            theirs.regions, 1,
            "{}: region entered {} times",
            case.name, theirs.regions
        );

        // Per-load counts.
        let mut our_counts: HashMap<u64, u64> = HashMap::new();
        for load in &ours.analysis.loads {
            *our_counts.entry(load.ip).or_default() += load.count;
        }
        let mut compared = 0u64;
        for (&ip, &count) in &theirs.loads {
            match (explicit.get(&ip), our_counts.get(&ip)) {
                (Some(_), Some(&ours)) if ours == count => compared += count,
                (Some(class), ours) => failures.push(format!(
                    "{}: load {ip:#x} ({class:?}) executed {count} times under Lackey, {} in our trace",
                    case.name,
                    ours.copied().unwrap_or(0)
                )),
                (None, _) if is_implicit_stack_read(&exe.path, ip) => {}
                (None, _) => failures.push(format!(
                    "{}: {ip:#x} loads {count} times under Lackey but is not an explicit load of the annotation",
                    case.name
                )),
            }
        }
        for (&ip, &count) in &our_counts {
            if !theirs.loads.contains_key(&ip) {
                failures.push(format!(
                    "{}: our trace counts {count} executions of {ip:#x}, Lackey none",
                    case.name
                ));
            }
        }

        // Footprints of the Strided and Irregular loads.
        let mut addresses: HashSet<u64> = HashSet::new();
        for (ip, set) in &theirs.addresses {
            if explicit.get(ip).is_some_and(|c| c.is_access()) {
                addresses.extend(set);
            }
        }
        let lines: HashSet<u64> = addresses.iter().map(|a| a >> 6).collect();
        let summary = &ours.analysis.summary;
        if (summary.f, summary.f_lines) != (addresses.len() as u64, lines.len() as u64) {
            failures.push(format!(
                "{}: F / F_lines are {} / {} in our trace, {} / {} under Lackey",
                case.name,
                summary.f,
                summary.f_lines,
                addresses.len(),
                lines.len()
            ));
        }
        eprintln!(
            "{}: {compared} loads at {} instructions agree with Lackey; F = {}, F_lines = {}; {} in-region loads outside the executable",
            case.name,
            theirs.loads.len(),
            summary.f,
            summary.f_lines,
            theirs.outside
        );
        assert!(compared > 0, "{}: nothing compared", case.name);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
