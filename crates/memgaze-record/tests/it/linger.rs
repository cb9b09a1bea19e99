//! The recorder's linger after the program exits counts only while the
//! collector waits on an empty socket: a sink slower than the linger (a
//! full trace analysed on a loaded machine) never cuts the trace.

use memgaze_instrument::instrument_file;
use memgaze_metadata::annotation::InstrumentationMode;
use memgaze_record::{RecordSink, SinkResult, record_command_within};
use memgaze_trace::Sampling;
use std::process::Command;
use std::time::Duration;

/// Counts records; the first one takes longer than the linger (2 s).
#[derive(Default)]
struct SlowSink {
    records: u64,
}

impl RecordSink for SlowSink {
    fn begin_sample(&mut self, _thread: u32) -> SinkResult {
        Ok(())
    }
    fn switch_thread(&mut self, _thread: u32) -> SinkResult {
        Ok(())
    }
    fn begin_spatial(&mut self, _thread: u32) -> SinkResult {
        Ok(())
    }
    fn push(&mut self, _load: u32, _addr: u64) -> SinkResult {
        if self.records == 0 {
            std::thread::sleep(Duration::from_millis(2_600));
        }
        self.records += 1;
        Ok(())
    }
}

#[test]
fn a_sink_slower_than_the_linger_does_not_cut_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = memgaze_fixtures::fixtures()
        .join("rewriter")
        .join("bench_kernels.c");
    let binary = dir.path().join("program");
    let status = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&binary)
        .arg(&fixture)
        .status()
        .unwrap();
    assert!(status.success());
    let program = dir.path().join("program.mg");
    let annotation = instrument_file(&binary, &program, None, InstrumentationMode::Soft)
        .unwrap()
        .annotation;
    // A short run: it exits while the sink still sleeps on its first
    // record, with the rest of its messages queued on the socket.
    let mut command = Command::new(&program);
    command
        .args(["irr", "5000", "20"])
        .stdout(std::process::Stdio::null());
    let sampling = Sampling {
        window: 100,
        period: 1000,
        seed: Some(3),
    };
    let mut sink = SlowSink::default();
    let started = std::time::Instant::now();
    let recording = record_command_within(
        command,
        &annotation,
        &sampling,
        None,
        &mut sink,
        &Default::default(),
    )
    .unwrap();
    assert!(started.elapsed() > Duration::from_millis(2_600));
    assert_eq!(recording.exit_code(), 0);
    assert!(
        !recording.notes.iter().any(|n| n.contains("cut off")),
        "{:?}",
        recording.notes
    );
    assert!(recording.totals.complete, "{recording:?}");
    assert_eq!(sink.records, recording.totals.records);
    assert!(sink.records > 1_000, "{} records", sink.records);
}
