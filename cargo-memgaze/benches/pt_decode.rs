//! Decoder throughput on a realistic `ptwrite` stream.
//!
//! `cargo bench -p cargo-memgaze --bench pt_decode [-- --runs N --mib M]`
//!
//! The stream looks like what `intel_pt/ptw=1,fup_on_ptw=1,branch=0,tsc,mtc`
//! produces for instrumented loads: a PSB+ (PSB, TSC, TMA, CBR, MODE.Exec,
//! FUP, PSBEND) every 4 KiB, MTC and CYC timing packets between PTW+FUP pairs
//! (8-byte operands; FUPs mostly 2-byte IP updates, some 4-byte), and an
//! occasional PAD. The bench decodes it on one thread with the full event
//! decoder (sync, last-IP tracking, PTW/FUP pairing), consuming the events
//! through `Decoder::for_each_event` as `pt-decode` and the reconstructor
//! do, and reports the median
//! throughput and its spread over the runs. Target: >= 500 MB/s.

use memgaze_record::pt::decode::{Decoder, Event};
use memgaze_record::pt::encode::{IpEncoder, encode};
use memgaze_record::pt::packet::Packet;
use std::hint::black_box;
use std::time::Instant;

/// CPU time of this thread: unlike wall time, it does not count the time
/// the scheduler gives to other processes on a shared machine.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn stream(bytes: usize) -> (Vec<u8>, u64) {
    let mut out = Vec::with_capacity(bytes + 4096);
    let mut ips = IpEncoder::default();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut ptws = 0u64;
    let mut next_psb = 0usize;
    let mut tsc = 1u64 << 40;
    let functions = [0x5555_5555_4000u64, 0x5555_5555_9000, 0x5555_5560_1000];
    let mut address = 0x7f00_0000_0000u64;
    while out.len() < bytes {
        if out.len() >= next_psb {
            ips.reset();
            tsc += 10_000;
            encode(&Packet::Psb, &mut out);
            encode(&Packet::Tsc(tsc), &mut out);
            encode(
                &Packet::Tma {
                    ctc: tsc as u16,
                    fast_counter: 3,
                },
                &mut out,
            );
            encode(&Packet::Cbr(0x20), &mut out);
            encode(
                &Packet::ModeExec {
                    csl: true,
                    csd: false,
                    interrupt_flag: false,
                },
                &mut out,
            );
            encode(&Packet::Fup(ips.compress(functions[0])), &mut out);
            encode(&Packet::PsbEnd, &mut out);
            next_psb = out.len() + 4096;
        }
        let r = rand();
        let function = functions[(r % 16 / 14) as usize + (r % 61 == 0) as usize];
        let ip = function + (r >> 20) % 0x800;
        address = address.wrapping_add(8 + (r >> 40) % 64 * 8 * u64::from(r % 5 == 0));
        encode(
            &Packet::Ptw {
                payload: address,
                size: 8,
                ip: true,
            },
            &mut out,
        );
        encode(&Packet::Fup(ips.compress(ip)), &mut out);
        ptws += 1;
        match r % 16 {
            0..=3 => encode(&Packet::Cyc((r >> 8) % 200), &mut out),
            4 => encode(&Packet::Mtc((r >> 8) as u8), &mut out),
            5 => encode(&Packet::Pad, &mut out),
            _ => {}
        }
    }
    (out, ptws)
}

fn main() {
    let mut runs = 21usize;
    let mut mib = 64usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).unwrap_or(runs),
            "--mib" => mib = args.next().and_then(|v| v.parse().ok()).unwrap_or(mib),
            // `cargo bench` passes `--bench`; ignore libtest flags.
            _ => {}
        }
    }
    let (data, expected_ptws) = stream(mib << 20);
    let mut seconds = Vec::with_capacity(runs);
    let mut cpu_seconds = Vec::with_capacity(runs);
    for run in 0..=runs {
        let start = Instant::now();
        let cpu_start = thread_cpu_seconds();
        let mut decoder = Decoder::new(black_box(&data));
        let (mut ptws, mut with_ip, mut checksum) = (0u64, 0u64, 0u64);
        decoder.for_each_event(|event| {
            if let Event::Ptw(p) = event {
                ptws += 1;
                with_ip += u64::from(p.ip.is_some());
                checksum = checksum.wrapping_add(p.payload ^ p.ip.unwrap_or(0));
            }
        });
        let elapsed = start.elapsed().as_secs_f64();
        let cpu = thread_cpu_seconds() - cpu_start;
        black_box(checksum);
        assert_eq!(
            (ptws, with_ip),
            (expected_ptws, expected_ptws),
            "decoder lost events"
        );
        assert_eq!(decoder.stats().errors, 0);
        if run > 0 {
            // Run 0 warms caches and page tables.
            seconds.push(elapsed);
            cpu_seconds.push(cpu);
        }
    }
    let mb = data.len() as f64 / 1e6;
    println!(
        "pt_decode/ptwrite_stream: {:.1} MiB, {} PTW+FUP pairs, {} runs",
        data.len() as f64 / (1 << 20) as f64,
        expected_ptws,
        seconds.len()
    );
    let wall = summary(&mut seconds, mb);
    let cpu = summary(&mut cpu_seconds, mb);
    println!("  wall clock: {wall}");
    println!("  thread CPU: {cpu}");
    println!(
        "  {:.1} ns per PTW+FUP pair (median wall)",
        median(&seconds) * 1e9 / expected_ptws as f64
    );
    let target = 500.0;
    let achieved = mb / median(&seconds);
    println!(
        "  target >= {target:.0} MB/s (median wall): {}",
        if achieved >= target { "met" } else { "NOT met" }
    );
}

fn median(sorted: &[f64]) -> f64 {
    sorted[sorted.len() / 2]
}

/// Median throughput with its interquartile range and extremes.
fn summary(seconds: &mut [f64], mb: f64) -> String {
    seconds.sort_by(f64::total_cmp);
    let rate = |s: f64| mb / s;
    let n = seconds.len();
    format!(
        "median {:.0} MB/s (interquartile {:.0}..{:.0}, min {:.0}, max {:.0})",
        rate(median(seconds)),
        rate(seconds[n * 3 / 4]),
        rate(seconds[n / 4]),
        rate(seconds[n - 1]),
        rate(seconds[0]),
    )
}
