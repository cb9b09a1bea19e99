//! Spatial sampling end to end: a sampled recording's spatial records are
//! exactly the executions of Strided and Irregular loads on tracked blocks
//! that its windows did not record, checked against a full recording of the
//! same program; and the windows are those of a recording without spatial
//! sampling.

use memgaze_metadata::annotation::{Annotation, InstrumentationMode};
use memgaze_record::SinkResult;
use memgaze_record::{RecordSink, Recording, record_command_within};
use memgaze_trace::{LoadClass, Sampling, SpatialSampling};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every record in arrival order: `(thread, load, addr, spatial)`, and
/// the sample each window record belongs to.
#[derive(Default)]
struct Ordered {
    records: Vec<(u32, u32, u64, bool)>,
    samples: Vec<u64>,
    thread: u32,
    spatial: bool,
    sample: u64,
}

impl RecordSink for Ordered {
    fn begin_sample(&mut self, thread: u32) -> SinkResult {
        (self.thread, self.spatial) = (thread, false);
        self.sample += 1;
        Ok(())
    }
    fn switch_thread(&mut self, thread: u32) -> SinkResult {
        (self.thread, self.spatial) = (thread, false);
        Ok(())
    }
    fn begin_spatial(&mut self, thread: u32) -> SinkResult {
        (self.thread, self.spatial) = (thread, true);
        Ok(())
    }
    fn push(&mut self, load: u32, addr: u64) -> SinkResult {
        self.records.push((self.thread, load, addr, self.spatial));
        self.samples
            .push(if self.spatial { 0 } else { self.sample });
        Ok(())
    }
}

fn instrumented(dir: &Path, source: &str) -> (PathBuf, Annotation) {
    let fixture = memgaze_fixtures::fixtures().join("rewriter").join(source);
    let binary = dir.join("program");
    let status = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&binary)
        .arg(&fixture)
        .status()
        .unwrap();
    assert!(status.success());
    let instrumented = dir.join("program.mg");
    let result = memgaze_instrument::instrument_file(
        &binary,
        &instrumented,
        None,
        InstrumentationMode::Soft,
    )
    .unwrap();
    (instrumented, result.annotation)
}

fn record(
    program: &Path,
    args: &[&str],
    annotation: &Annotation,
    sampling: Sampling,
    spatial: Option<SpatialSampling>,
) -> (Ordered, Recording) {
    let mut sink = Ordered::default();
    let mut command = Command::new(program);
    command.args(args).stdout(std::process::Stdio::null());
    let recording = record_command_within(
        command,
        annotation,
        &sampling,
        spatial,
        &mut sink,
        &Default::default(),
    )
    .unwrap();
    assert_eq!(recording.exit_code(), 0);
    assert!(recording.totals.complete, "{recording:?}");
    (sink, recording)
}

/// Whether a record may be spatially sampled: a Strided or Irregular load
/// on data outside the stack (whose addresses move with the environment,
/// which differs between recordings).
fn comparable(annotation: &Annotation, load: u32, addr: u64) -> bool {
    addr < 0x7f00_0000_0000 && annotation.loads[load as usize].class != LoadClass::Constant
}

fn sampling(seed: u64) -> Sampling {
    Sampling {
        window: 100,
        period: 1000,
        seed: Some(seed),
    }
}

#[test]
fn spatial_records_are_the_tracked_accesses_outside_the_windows_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (program, annotation) = instrumented(dir.path(), "bench_kernels.c");
    let args = ["irr", "5000", "20"];
    let spatial = SpatialSampling::with_rate(0.25).unwrap();
    let (full, _) = record(&program, &args, &annotation, Sampling::full(), None);
    let (sampled, recording) = record(&program, &args, &annotation, sampling(7), Some(spatial));
    let (plain, _) = record(&program, &args, &annotation, sampling(7), None);

    // The windows are those of the recording without spatial samples.
    let windows = |o: &Ordered| -> Vec<(u32, u64, u64)> {
        o.records
            .iter()
            .zip(&o.samples)
            .filter(|(r, _)| !r.3 && comparable(&annotation, r.1, r.2))
            .map(|(r, &s)| (r.1, r.2, s))
            .collect()
    };
    assert_eq!(windows(&sampled), windows(&plain));
    assert_eq!(recording.totals.records, plain.records.len() as u64);

    // Walk the full trace: each of its records is the next record of the
    // sampled one (a window's, or a spatial one on a tracked block) or is
    // neither in a window nor tracked.
    let kept = |o: &Ordered| -> Vec<(u32, u64, bool)> {
        o.records
            .iter()
            .filter(|r| comparable(&annotation, r.1, r.2))
            .map(|r| (r.1, r.2, r.3))
            .collect()
    };
    let got = kept(&sampled);
    let mut next = got.iter().peekable();
    let (mut tracked, mut spatial_seen) = (0u64, 0u64);
    for &(load, addr, _) in &kept(&full) {
        let is_tracked = spatial.tracks(addr);
        tracked += u64::from(is_tracked);
        match next.peek() {
            Some(&&(l, a, s)) if (l, a) == (load, addr) && (!s || is_tracked) => {
                spatial_seen += u64::from(s);
                next.next();
            }
            _ => assert!(
                !is_tracked,
                "tracked access of load {load} at {addr:#x} is missing from the sampled trace"
            ),
        }
    }
    assert!(
        next.next().is_none(),
        "records the full trace does not have"
    );
    let spatial_total = got.iter().filter(|r| r.2).count() as u64;
    assert_eq!(spatial_seen, spatial_total);
    assert_eq!(
        recording.totals.spatial_records,
        sampled.records.iter().filter(|r| r.3).count() as u64
    );
    // About a quarter of the tracked accesses, less the windows' 10%.
    assert!(
        spatial_total > tracked * 8 / 10 && tracked > 40_000,
        "{spatial_total} of {tracked}"
    );
    // Every spatial record is tracked and of a Strided or Irregular load.
    for &(_, load, addr, s) in &sampled.records {
        if s {
            assert!(spatial.tracks(addr));
            assert_ne!(annotation.loads[load as usize].class, LoadClass::Constant);
        }
    }
}

/// Per load site, the multiset of addresses: spatial records = tracked
/// accesses of the full recording less the tracked window records.
fn check_per_site(source: &str, args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let (program, annotation) = instrumented(dir.path(), source);
    let spatial = SpatialSampling::with_rate(0.25).unwrap();
    let (full, _) = record(&program, args, &annotation, Sampling::full(), None);
    let (sampled, recording) = record(&program, args, &annotation, sampling(3), Some(spatial));
    let mut balance: HashMap<(u32, u64), i64> = HashMap::new();
    for &(_, load, addr, _) in &full.records {
        if comparable(&annotation, load, addr) && spatial.tracks(addr) {
            *balance.entry((load, addr)).or_default() += 1;
        }
    }
    let mut spatial_records = 0;
    for &(_, load, addr, s) in &sampled.records {
        if s {
            spatial_records += 1;
        }
        if comparable(&annotation, load, addr) && spatial.tracks(addr) {
            *balance.entry((load, addr)).or_default() -= 1;
        }
    }
    let off: Vec<_> = balance.iter().filter(|e| *e.1 != 0).take(5).collect();
    assert!(
        off.is_empty(),
        "{source}: accesses lost (> 0) or doubled (< 0): {off:?}"
    );
    assert!(spatial_records > 1000, "{source}: {spatial_records}");
    assert_eq!(recording.totals.spatial_records, spatial_records);
}

#[test]
fn threads_lose_and_double_no_spatial_record() {
    check_per_site("spatial_threads.c", &[]);
}

#[test]
fn forked_children_lose_and_double_no_spatial_record() {
    check_per_site("fork.c", &[]);
}

/// The time-window metrics of a sampled recording with spatial samples are
/// those without (same seed), whether streamed into the analysis or read
/// back from the trace file, which holds the spatial records.
#[test]
fn spatial_records_leave_the_time_window_metrics_alone() {
    use memgaze_analysis::{AnalysisOptions, analyze_trace};
    use memgaze_record::{AnalyzerSink, Tee, trace_header};
    use memgaze_trace::{TraceReader, TraceWriter};
    let dir = tempfile::tempdir().unwrap();
    let (program, annotation) = instrumented(dir.path(), "bench_kernels.c");
    let options = AnalysisOptions::default();
    let run = |spatial: Option<SpatialSampling>, name: &str| {
        let mut header = trace_header(&annotation, sampling(11), vec![]);
        header.spatial = spatial;
        let path = dir.path().join(name);
        let mut writer = TraceWriter::create(&path, &header).unwrap();
        let mut analyzer = AnalyzerSink::new(&header, &options).unwrap();
        let mut command = Command::new(&program);
        command
            .args(["str", "20000", "10"])
            .stdout(std::process::Stdio::null());
        let recording = record_command_within(
            command,
            &annotation,
            &sampling(11),
            spatial,
            &mut Tee(&mut writer, &mut analyzer),
            &Default::default(),
        )
        .unwrap();
        writer.finish(&recording.totals).unwrap().commit().unwrap();
        let streamed = analyzer.finish(&recording.totals);
        let read = analyze_trace(TraceReader::open(&path).unwrap(), &options).unwrap();
        assert_eq!(streamed, read);
        (streamed, recording.totals)
    };
    let (without, totals_without) = run(None, "plain.trace");
    let (with, totals_with) = run(SpatialSampling::with_rate(1.0 / 128.0), "spatial.trace");
    assert_eq!(totals_without.spatial_records, 0);
    assert!(totals_with.spatial_records > 100, "{totals_with:?}");
    assert_eq!(
        (
            totals_with.records,
            totals_with.samples,
            totals_with.executions
        ),
        (
            totals_without.records,
            totals_without.samples,
            totals_without.executions
        )
    );
    // The whole-run fields are what the spatial records are for; every
    // time-window field is unchanged.
    let mut time_only = with.summary.clone();
    time_only.whole_run = without.summary.whole_run.clone();
    time_only.misses_l1 = without.summary.misses_l1;
    time_only.misses_l2 = without.summary.misses_l2;
    time_only.misses_llc = without.summary.misses_llc;
    time_only.spatial_rate = without.summary.spatial_rate;
    time_only.tracked_accesses = without.summary.tracked_accesses;
    time_only.mrc_groups = without.summary.mrc_groups.clone();
    assert!(!with.summary.whole_run.mrc.is_empty() && with.summary.tracked_accesses.is_some());
    assert_eq!(time_only, without.summary);
    assert_eq!(with.trace_windows, without.trace_windows);
    let time_only_functions: Vec<_> = with
        .functions
        .iter()
        .map(|f| {
            let mut f = f.clone();
            f.whole_run = Default::default();
            f
        })
        .collect();
    assert_eq!(time_only_functions, without.functions);
    assert_eq!(with.loads, without.loads);
    assert_eq!(with.reuse, without.reuse);
    assert_eq!(with.intervals, without.intervals);
}
