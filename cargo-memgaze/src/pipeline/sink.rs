//! [`StreamingSink`]: the collector's records fanned out, as they arrive,
//! to the analysis engine ([`AnalyzerSink`]), an optional trace file and an
//! optional per-sample breakdown.

use crate::golden::SampleBreakdown;
use memgaze_analysis::{Analysis, AnalysisOptions};
use memgaze_output::AtomicFile;
use memgaze_record::{AnalyzerSink, JoinedProgram, RecordSink, SinkResult};
use memgaze_trace::{TraceHeader, TraceTotals, TraceWriter};

/// The trace file writer `TraceWriter::create` gives.
pub(crate) type FileWriter = TraceWriter<AtomicFile>;

/// Feeds every record to the consumers.
pub(crate) struct StreamingSink {
    analyzer: AnalyzerSink,
    writer: Option<FileWriter>,
    breakdown: Option<SampleBreakdown>,
    started: bool,
    /// The records pushed now are spatial.
    spatial: bool,
    thread: u32,
}

impl StreamingSink {
    pub(crate) fn new(
        header: &TraceHeader,
        options: &AnalysisOptions,
        writer: Option<FileWriter>,
        per_sample: bool,
    ) -> anyhow::Result<Self> {
        Ok(StreamingSink {
            analyzer: AnalyzerSink::new(header, options)?,
            writer,
            breakdown: per_sample.then(|| SampleBreakdown::new(header, options)),
            started: false,
            spatial: false,
            thread: 0,
        })
    }

    /// The analysis, and the writer and breakdown to finish.
    /// See [`memgaze_analysis::Analyzer::add_untraced_libraries`].
    pub(crate) fn add_untraced_libraries(&mut self, libraries: &[String]) {
        self.analyzer.add_untraced_libraries(libraries);
    }

    pub(crate) fn finish(
        self,
        totals: &TraceTotals,
    ) -> anyhow::Result<(Analysis, Option<FileWriter>, Option<SampleBreakdown>)> {
        Ok((self.analyzer.finish(totals), self.writer, self.breakdown))
    }
}

impl RecordSink for StreamingSink {
    fn begin_sample(&mut self, thread: u32) -> SinkResult {
        self.started = true;
        self.spatial = false;
        self.thread = thread;
        self.analyzer.begin_sample(thread)?;
        if let Some(writer) = &mut self.writer {
            writer.begin_sample(thread)?;
        }
        if let Some(breakdown) = &mut self.breakdown {
            breakdown.begin_sample()?;
        }
        Ok(())
    }

    fn begin_spatial(&mut self, thread: u32) -> SinkResult {
        // Only the trace file keeps them: the analysis and the breakdown
        // are of the time samples.
        self.spatial = true;
        self.analyzer.begin_spatial(thread)?;
        if let Some(writer) = &mut self.writer {
            writer.begin_spatial(thread)?;
        }
        Ok(())
    }

    fn switch_thread(&mut self, thread: u32) -> SinkResult {
        self.spatial = false;
        self.thread = thread;
        self.analyzer.switch_thread(thread)?;
        if let Some(writer) = &mut self.writer {
            writer.switch_thread(thread)?;
        }
        Ok(())
    }

    fn join_program(&mut self, program: &JoinedProgram) -> bool {
        // Both analyses list the program's loads from its first on, or
        // neither does (its records are then counted as dropped).
        let breakdown_at_base = self
            .breakdown
            .as_ref()
            .is_none_or(|b| b.loads() == program.load_base as usize);
        if !breakdown_at_base || !self.analyzer.join_program(program) {
            return false;
        }
        if let Some(breakdown) = &mut self.breakdown {
            breakdown.join_program(program);
        }
        if let Some(writer) = &mut self.writer {
            writer.extend_loads(program.load_end());
        }
        true
    }

    #[inline]
    fn push(&mut self, load: u32, addr: u64) -> SinkResult {
        if !self.started && !self.spatial {
            return Err("the recorder sent a record before any sample".into());
        }
        self.analyzer.push(load, addr)?;
        if let Some(writer) = &mut self.writer {
            writer.push(load, addr)?;
        }
        if self.spatial {
            return Ok(());
        }
        if let Some(breakdown) = &mut self.breakdown {
            breakdown.push(load, addr, self.thread);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgaze_analysis::analyze_trace;
    use memgaze_trace::TraceReader;

    /// Streaming into the analyzer gives what analysing the written trace
    /// file gives, and the file is a valid trace.
    #[test]
    fn streamed_analysis_equals_the_analysis_of_the_written_file() {
        let header = crate::golden::samples::tests::header(1000, 100_000);
        let options = AnalysisOptions::default();
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("t.mgz");
        let mut sink = StreamingSink::new(
            &header,
            &options,
            Some(TraceWriter::create(&path, &header).unwrap()),
            true,
        )
        .unwrap();
        assert!(sink.push(0, 1).is_err());
        let samples = crate::golden::samples::tests::records(12, 1000, 5);
        for (s, sample) in samples.iter().enumerate() {
            sink.begin_sample(s as u32 % 2).unwrap();
            for &(load, addr) in sample {
                sink.push(load, addr).unwrap();
            }
        }
        // Spatial records reach the file, not the analysis.
        sink.begin_spatial(1).unwrap();
        sink.push(0, 0x40).unwrap();
        sink.push(0, 0x80).unwrap();
        sink.begin_sample(0).unwrap(); // an empty last sample
        let totals = TraceTotals {
            spatial_records: 2,
            ..TraceTotals::clean(1_300_000, 12_000, 13)
        };
        let (streamed, writer, breakdown) = sink.finish(&totals).unwrap();
        writer.unwrap().finish(&totals).unwrap().commit().unwrap();
        let from_file = analyze_trace(TraceReader::open(&path).unwrap(), &options).unwrap();
        assert_eq!(streamed, from_file);
        assert_eq!(streamed.summary.samples, 13);
        assert_eq!(streamed.summary.records, 12_000);
        assert_eq!(breakdown.unwrap().finish().unwrap().samples.len(), 13);
    }
}
