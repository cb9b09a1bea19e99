//! Draining perf ring buffers: the data ring (records) and the AUX area (raw
//! PT bytes), and parsing the records a ptwrite collection produces.
//!
//! The kernel shares each ring through the `perf_event_mmap_page` header:
//! it advances `data_head`/`aux_head`, the reader consumes up to the head and
//! then publishes `data_tail`/`aux_tail`. Positions are free-running 64-bit
//! byte counts; the area is a power of two and a position maps to
//! `pos & (size - 1)`, so a record or a run of bytes can wrap past the end.
//! Memory ordering follows `include/uapi/linux/perf_event.h`: load the head
//! with acquire semantics (the kernel's data is visible before its head),
//! read, then store the tail with release semantics (our reads complete
//! before the kernel may overwrite the space).
//!
//! Nothing here makes a syscall: `RingArea` and `RingPointers` can sit on
//! an mmapped ring or on plain memory, which is how the tests simulate a
//! kernel producer with wrap-around and loss.

use super::error::{PtError, Result, RingProblem};
use perf_event_open_sys::bindings as sys;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

/// A ring's data area: `size` bytes (a power of two) that another party
/// writes. Only the ranges the head says are complete are ever read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingArea<'a> {
    base: *const u8,
    size: usize,
    _memory: PhantomData<&'a [u8]>,
}

// SAFETY: the area is only read through `copy_out`, of ranges the producer
// has published and will not rewrite until the tail moves past them.
unsafe impl Send for RingArea<'_> {}

impl<'a> RingArea<'a> {
    #[cfg(test)]
    /// An area over memory the caller owns (tests, simulations).
    pub(crate) fn from_slice(area: &'a [u8]) -> Result<RingArea<'a>> {
        if !area.len().is_power_of_two() {
            return Err(RingProblem::NotPowerOfTwo { len: area.len() }.into());
        }
        Ok(RingArea {
            base: area.as_ptr(),
            size: area.len(),
            _memory: PhantomData,
        })
    }

    /// An area over a mapping.
    ///
    /// # Safety
    /// `base..base + size` must stay mapped and readable for `'a`, and
    /// `size` must be a power of two.
    pub(crate) unsafe fn from_raw(base: *const u8, size: usize) -> RingArea<'a> {
        debug_assert!(size.is_power_of_two());
        RingArea {
            base,
            size,
            _memory: PhantomData,
        }
    }

    /// Size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Appends the `len` bytes at free-running position `from` to `out`,
    /// wrapping at the end of the area.
    pub(crate) fn copy_out(&self, from: u64, len: usize, out: &mut Vec<u8>) {
        let len = len.min(self.size);
        let start = (from as usize) & (self.size - 1);
        let first = len.min(self.size - start);
        out.reserve(len);
        // SAFETY: both ranges lie inside the area (start < size, first <=
        // size - start, len - first <= start); `out` has room for `len`.
        unsafe {
            let dst = out.as_mut_ptr().add(out.len());
            std::ptr::copy_nonoverlapping(self.base.add(start), dst, first);
            std::ptr::copy_nonoverlapping(self.base, dst.add(first), len - first);
            out.set_len(out.len() + len);
        }
    }
}

/// The head and tail of one ring (`data_*` or `aux_*` of the header page).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingPointers<'a> {
    head: &'a AtomicU64,
    tail: &'a AtomicU64,
}

impl<'a> RingPointers<'a> {
    #[cfg(test)]
    /// Pointers held in ordinary atomics (tests, simulations).
    pub(crate) fn new(head: &'a AtomicU64, tail: &'a AtomicU64) -> RingPointers<'a> {
        RingPointers { head, tail }
    }

    /// The data ring pointers of a mapped header page.
    ///
    /// # Safety
    /// `page` must point to a mapped `perf_event_mmap_page` that outlives `'a`.
    pub(crate) unsafe fn data(page: *mut sys::perf_event_mmap_page) -> RingPointers<'a> {
        // SAFETY: the fields are naturally aligned u64s in the shared page;
        // AtomicU64 has the same layout.
        unsafe {
            RingPointers {
                head: AtomicU64::from_ptr(std::ptr::addr_of_mut!((*page).data_head)),
                tail: AtomicU64::from_ptr(std::ptr::addr_of_mut!((*page).data_tail)),
            }
        }
    }

    /// The AUX area pointers of a mapped header page.
    ///
    /// # Safety
    /// As for [`RingPointers::data`].
    pub(crate) unsafe fn aux(page: *mut sys::perf_event_mmap_page) -> RingPointers<'a> {
        // SAFETY: as in `data`.
        unsafe {
            RingPointers {
                head: AtomicU64::from_ptr(std::ptr::addr_of_mut!((*page).aux_head)),
                tail: AtomicU64::from_ptr(std::ptr::addr_of_mut!((*page).aux_tail)),
            }
        }
    }

    /// The producer's position; everything before it is complete.
    pub(crate) fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// The consumer's position.
    pub(crate) fn tail(&self) -> u64 {
        self.tail.load(Ordering::Relaxed)
    }

    /// Hands the space before `tail` back to the producer.
    pub(crate) fn release(&self, tail: u64) {
        self.tail.store(tail, Ordering::Release);
    }
}

/// Copies everything new in an AUX area (full-trace mode) to `out` and
/// releases it; returns the number of bytes.
pub(crate) fn drain_aux(
    area: &RingArea<'_>,
    pointers: &RingPointers<'_>,
    out: &mut Vec<u8>,
) -> Result<u64> {
    let head = pointers.head();
    let tail = pointers.tail();
    if head < tail {
        return Err(RingProblem::AuxHeadBehind { head, tail }.into());
    }
    let available = head - tail;
    if available > area.size() as u64 {
        return Err(RingProblem::AuxHeadAhead {
            head,
            tail,
            size: area.size(),
        }
        .into());
    }
    area.copy_out(tail, available as usize, out);
    pointers.release(head);
    Ok(available)
}

/// `struct perf_event_header`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    /// `PERF_RECORD_*`.
    pub(crate) kind: u32,
    /// `PERF_RECORD_MISC_*`.
    pub(crate) misc: u16,
    /// Record size including the header.
    pub(crate) size: u16,
}

/// Reads whole records from a data ring.
#[derive(Debug, Default)]
pub(crate) struct RecordReader {
    scratch: Vec<u8>,
}

impl RecordReader {
    /// Calls `on_record(header, body)` for every complete record between the
    /// tail and the head, then releases them. Records that wrap around the
    /// end of the area are reassembled. Returns the number of records.
    pub(crate) fn drain(
        &mut self,
        area: &RingArea<'_>,
        pointers: &RingPointers<'_>,
        mut on_record: impl FnMut(RecordHeader, &[u8]),
    ) -> Result<usize> {
        let head = pointers.head();
        let mut tail = pointers.tail();
        if head < tail {
            return Err(RingProblem::HeadBehind { head, tail }.into());
        }
        if head - tail > area.size() as u64 {
            return Err(RingProblem::HeadAhead {
                head,
                tail,
                size: area.size(),
            }
            .into());
        }
        let mut count = 0;
        while head - tail >= 8 {
            self.scratch.clear();
            area.copy_out(tail, 8, &mut self.scratch);
            let header = RecordHeader {
                kind: u32::from_ne_bytes(self.scratch[0..4].try_into().unwrap()),
                misc: u16::from_ne_bytes(self.scratch[4..6].try_into().unwrap()),
                size: u16::from_ne_bytes(self.scratch[6..8].try_into().unwrap()),
            };
            let size = u64::from(header.size);
            if size < 8 || size > head - tail {
                // A zero-size record would loop forever; one past the head
                // means the ring is corrupt. Either way the reader cannot
                // continue in step with the kernel.
                pointers.release(head);
                return Err(RingProblem::CorruptHeader {
                    position: tail,
                    size: header.size,
                    available: head - tail,
                }
                .into());
            }
            self.scratch.clear();
            area.copy_out(tail + 8, size as usize - 8, &mut self.scratch);
            on_record(header, &self.scratch);
            tail += size;
            count += 1;
        }
        pointers.release(tail);
        Ok(count)
    }
}

/// The sample id fields of records (`sample_id_all` trailer and samples),
/// for `sample_type = IDENTIFIER | TID | TIME | CPU`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleId {
    /// Process id.
    pub(crate) pid: u32,
    /// Thread id.
    pub(crate) tid: u32,
    /// Timestamp (perf clock).
    pub(crate) time: u64,
    /// CPU.
    pub(crate) cpu: u32,
    /// Event id.
    pub(crate) id: u64,
}

/// Size of the sample id trailer for [`config::SAMPLE_ID_BITS`](super::config::SAMPLE_ID_BITS).
pub(crate) const SAMPLE_ID_TRAILER: usize = 32;

/// The records of a ptwrite collection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PerfRecord<'a> {
    /// A load-event overflow with the last bytes of PT data.
    Sample {
        /// Where and when.
        id: SampleId,
        /// The AUX data (zero-padded to 8 bytes by the kernel; PAD packets).
        aux: &'a [u8],
    },
    /// New data in the AUX area, with `PERF_AUX_FLAG_*`.
    Aux {
        /// Position of the data in the AUX area.
        offset: u64,
        /// Bytes.
        size: u64,
        /// `PERF_AUX_FLAG_*`.
        flags: u64,
    },
    /// The kernel dropped this many records (ring full).
    Lost {
        /// Records lost.
        lost: u64,
    },
    /// The PMU dropped this many samples.
    LostSamples {
        /// Samples lost.
        lost: u64,
    },
    /// A mapping (`PERF_RECORD_MMAP2`): where a file landed in memory.
    Mmap {
        /// Process id.
        pid: u32,
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
        /// File offset of `addr`.
        pgoff: u64,
        /// `PROT_*`.
        prot: u32,
        /// The file.
        filename: &'a str,
    },
    /// A thread was created.
    Fork {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
    },
    /// A thread exited.
    Exit {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
    },
    /// Anything else (COMM, ITRACE_START, THROTTLE…).
    Other(u32),
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Parses a record body (after the 8-byte header).
pub(crate) fn parse_record(header: RecordHeader, body: &[u8]) -> Result<PerfRecord<'_>> {
    let bad = || PtError::from(RingProblem::Truncated { kind: header.kind });
    Ok(match header.kind {
        sys::PERF_RECORD_SAMPLE => {
            // IDENTIFIER, TID, TIME, CPU, AUX.
            let id = SampleId {
                id: u64_at(body, 0).ok_or_else(bad)?,
                pid: u32_at(body, 8).ok_or_else(bad)?,
                tid: u32_at(body, 12).ok_or_else(bad)?,
                time: u64_at(body, 16).ok_or_else(bad)?,
                cpu: u32_at(body, 24).ok_or_else(bad)?,
            };
            let size = u64_at(body, 32).ok_or_else(bad)? as usize;
            let aux = body.get(40..40 + size).ok_or_else(bad)?;
            PerfRecord::Sample { id, aux }
        }
        sys::PERF_RECORD_AUX => PerfRecord::Aux {
            offset: u64_at(body, 0).ok_or_else(bad)?,
            size: u64_at(body, 8).ok_or_else(bad)?,
            flags: u64_at(body, 16).ok_or_else(bad)?,
        },
        sys::PERF_RECORD_LOST => PerfRecord::Lost {
            lost: u64_at(body, 8).ok_or_else(bad)?,
        },
        sys::PERF_RECORD_LOST_SAMPLES => PerfRecord::LostSamples {
            lost: u64_at(body, 0).ok_or_else(bad)?,
        },
        sys::PERF_RECORD_MMAP2 => {
            // pid, tid, addr, len, pgoff, (maj, min, ino, ino_generation |
            // build id: 24 bytes), prot, flags, filename, sample id.
            let end = body.len().checked_sub(SAMPLE_ID_TRAILER).ok_or_else(bad)?;
            let name = body.get(64..end).ok_or_else(bad)?;
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            PerfRecord::Mmap {
                pid: u32_at(body, 0).ok_or_else(bad)?,
                addr: u64_at(body, 8).ok_or_else(bad)?,
                len: u64_at(body, 16).ok_or_else(bad)?,
                pgoff: u64_at(body, 24).ok_or_else(bad)?,
                prot: u32_at(body, 56).ok_or_else(bad)?,
                filename: std::str::from_utf8(name).unwrap_or("<non-UTF-8 path>"),
            }
        }
        sys::PERF_RECORD_FORK => PerfRecord::Fork {
            pid: u32_at(body, 0).ok_or_else(bad)?,
            tid: u32_at(body, 8).ok_or_else(bad)?,
        },
        sys::PERF_RECORD_EXIT => PerfRecord::Exit {
            pid: u32_at(body, 0).ok_or_else(bad)?,
            tid: u32_at(body, 8).ok_or_else(bad)?,
        },
        other => PerfRecord::Other(other),
    })
}

/// Losses a collection counts; none is ever silent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Losses {
    /// Records the kernel could not write to a full data ring
    /// (`PERF_RECORD_LOST`): mostly samples.
    pub(crate) lost_records: u64,
    /// Samples the PMU dropped (`PERF_RECORD_LOST_SAMPLES`).
    pub lost_samples: u64,
    /// AUX records whose data was cut because the AUX area was full
    /// (`PERF_AUX_FLAG_TRUNCATED`).
    pub aux_truncated: u64,
    /// AUX records whose data overwrote older data
    /// (`PERF_AUX_FLAG_OVERWRITE`; expected in sampling mode).
    pub(crate) aux_overwrite: u64,
    /// AUX records holding partial data (`PERF_AUX_FLAG_PARTIAL`, e.g.
    /// around VMX transitions).
    pub(crate) aux_partial: u64,
    /// AUX records that collided with another writer
    /// (`PERF_AUX_FLAG_COLLISION`).
    pub(crate) aux_collision: u64,
}

impl Losses {
    /// Accounts one record.
    pub fn count(&mut self, record: &PerfRecord<'_>) {
        match *record {
            PerfRecord::Lost { lost } => self.lost_records += lost,
            PerfRecord::LostSamples { lost } => self.lost_samples += lost,
            PerfRecord::Aux { flags, .. } => {
                let flag = |f: u32| u64::from(flags & u64::from(f) != 0);
                self.aux_truncated += flag(sys::PERF_AUX_FLAG_TRUNCATED);
                self.aux_overwrite += flag(sys::PERF_AUX_FLAG_OVERWRITE);
                self.aux_partial += flag(sys::PERF_AUX_FLAG_PARTIAL);
                self.aux_collision += flag(sys::PERF_AUX_FLAG_COLLISION);
            }
            _ => {}
        }
    }

    /// Whether AUX data of a full trace was lost (overwrite counts: in
    /// full mode nothing may be overwritten).
    pub(crate) fn full_trace_gaps(&self) -> u64 {
        self.aux_truncated + self.aux_overwrite + self.aux_partial + self.aux_collision
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use memgaze_trace::rng::SplitMix64;

    /// A simulated kernel producer of a data ring: writes records at the
    /// head, wrapping; when the reader has not freed enough space it drops
    /// the record and later reports the count in a `PERF_RECORD_LOST`, as
    /// `perf_output_begin` does.
    pub(crate) struct SimRing {
        pub(crate) area: Vec<u8>,
        pub(crate) head: AtomicU64,
        pub(crate) tail: AtomicU64,
        pending_lost: u64,
    }

    impl SimRing {
        pub(crate) fn new(size: usize) -> SimRing {
            SimRing {
                area: vec![0; size],
                head: AtomicU64::new(0),
                tail: AtomicU64::new(0),
                pending_lost: 0,
            }
        }

        fn put(&mut self, bytes: &[u8]) -> bool {
            let head = self.head.load(Ordering::Relaxed);
            let free = self.area.len() as u64 - (head - self.tail.load(Ordering::Acquire));
            if (bytes.len() as u64) > free {
                return false;
            }
            let size = self.area.len();
            for (i, &b) in bytes.iter().enumerate() {
                self.area[(head as usize + i) & (size - 1)] = b;
            }
            self.head
                .store(head + bytes.len() as u64, Ordering::Release);
            true
        }

        /// Writes a record; false when it was lost.
        pub(crate) fn write(&mut self, kind: u32, body: &[u8]) -> bool {
            assert_eq!(body.len() % 8, 0);
            if self.pending_lost > 0 {
                let mut lost = Vec::new();
                lost.extend_from_slice(&7u64.to_ne_bytes()); // id
                lost.extend_from_slice(&self.pending_lost.to_ne_bytes());
                lost.extend_from_slice(&[0; SAMPLE_ID_TRAILER]);
                if self.put(&record(sys::PERF_RECORD_LOST, &lost)) {
                    self.pending_lost = 0;
                } else {
                    self.pending_lost += 1;
                    return false;
                }
            }
            if self.put(&record(kind, body)) {
                true
            } else {
                self.pending_lost += 1;
                false
            }
        }

        pub(crate) fn pointers(&self) -> RingPointers<'_> {
            RingPointers::new(&self.head, &self.tail)
        }
    }

    pub fn record(kind: u32, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&kind.to_ne_bytes());
        r.extend_from_slice(&0u16.to_ne_bytes());
        r.extend_from_slice(&((body.len() + 8) as u16).to_ne_bytes());
        r.extend_from_slice(body);
        r
    }

    /// A PERF_RECORD_SAMPLE body with an AUX payload (padded to 8 bytes).
    pub(crate) fn sample_body(tid: u32, cpu: u32, time: u64, aux: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&42u64.to_ne_bytes());
        b.extend_from_slice(&100u32.to_ne_bytes());
        b.extend_from_slice(&tid.to_ne_bytes());
        b.extend_from_slice(&time.to_ne_bytes());
        b.extend_from_slice(&cpu.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        let padded = aux.len().div_ceil(8) * 8;
        b.extend_from_slice(&(padded as u64).to_ne_bytes());
        b.extend_from_slice(aux);
        b.resize(b.len() + padded - aux.len(), 0);
        b
    }

    #[test]
    fn data_ring_records_survive_wrap_around_and_loss_is_counted() {
        let mut ring = SimRing::new(4096);
        let mut reader = RecordReader::default();
        let mut rng = SplitMix64::new(0x1234_5678);
        let (mut written, mut received) = (Vec::new(), Vec::new());
        let mut losses = Losses::default();
        let mut dropped = 0u64;
        for round in 0..2000 {
            // A burst of samples of random size (some larger than what is
            // free, some straddling the end of the area).
            for _ in 0..rng.next_u64() % 6 {
                let len = (rng.next_u64() % 600) as usize;
                let aux: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
                let body = sample_body(round as u32, 3, round, &aux);
                if ring.write(sys::PERF_RECORD_SAMPLE, &body) {
                    written.push(aux);
                } else {
                    dropped += 1;
                }
            }
            // The reader keeps up only some of the time.
            if !rng.next_u64().is_multiple_of(3) {
                let area = RingArea::from_slice(&ring.area).unwrap();
                reader
                    .drain(&area, &ring.pointers(), |h, body| {
                        let r = parse_record(h, body).unwrap();
                        losses.count(&r);
                        if let PerfRecord::Sample { aux, id } = r {
                            assert_eq!(id.cpu, 3);
                            received.push(aux.to_vec());
                        }
                    })
                    .unwrap();
            }
        }
        // Drain, then one more record: the kernel reports pending losses in
        // a PERF_RECORD_LOST ahead of the next record it can write.
        let area = RingArea::from_slice(&ring.area).unwrap();
        reader
            .drain(&area, &ring.pointers(), |h, body| {
                let r = parse_record(h, body).unwrap();
                losses.count(&r);
                if let PerfRecord::Sample { aux, .. } = r {
                    received.push(aux.to_vec());
                }
            })
            .unwrap();
        assert!(ring.write(sys::PERF_RECORD_SAMPLE, &sample_body(0, 3, 0, &[])));
        written.push(Vec::new());
        let area = RingArea::from_slice(&ring.area).unwrap();
        reader
            .drain(&area, &ring.pointers(), |h, body| {
                let r = parse_record(h, body).unwrap();
                losses.count(&r);
                if let PerfRecord::Sample { aux, .. } = r {
                    received.push(aux.to_vec());
                }
            })
            .unwrap();
        assert!(dropped > 0, "the simulation must overflow the ring");
        assert!(
            ring.head.load(Ordering::Relaxed) > 20 * 4096,
            "and wrap many times"
        );
        assert_eq!(losses.lost_records, dropped);
        // Received samples are exactly the written ones, in order (padding
        // to 8 bytes aside).
        assert_eq!(received.len(), written.len());
        for (r, w) in received.iter().zip(&written) {
            assert_eq!(&r[..w.len()], &w[..]);
            assert!(r[w.len()..].iter().all(|&b| b == 0));
        }
        assert_eq!(
            ring.tail.load(Ordering::Relaxed),
            ring.head.load(Ordering::Relaxed)
        );
    }

    #[test]
    fn aux_area_drains_across_the_wrap_and_truncation_is_counted() {
        // A simulated AUX producer in full-trace mode: it writes as much PT
        // data as fits, and when the reader lags it stops (the kernel's
        // TRUNCATED case) and says so in a PERF_RECORD_AUX.
        let size = 1 << 12;
        let mut area = vec![0u8; size];
        let (head, tail) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut rng = SplitMix64::new(99);
        let mut produced = Vec::new();
        let mut drained = Vec::new();
        let mut losses = Losses::default();
        let mut truncations = 0;
        let mut next = 0u8;
        for _ in 0..3000 {
            let want = (rng.next_u64() % 1500) as usize;
            let h = head.load(Ordering::Relaxed);
            let free = size - (h - tail.load(Ordering::Acquire)) as usize;
            let n = want.min(free);
            for i in 0..n {
                area[(h as usize + i) & (size - 1)] = next;
                produced.push(next);
                next = next.wrapping_add(1);
            }
            head.store(h + n as u64, Ordering::Release);
            let flags = if n < want {
                truncations += 1;
                // The kernel skips what it could not write.
                next = next.wrapping_add((want - n) as u8);
                u64::from(sys::PERF_AUX_FLAG_TRUNCATED)
            } else {
                0
            };
            losses.count(&PerfRecord::Aux {
                offset: h,
                size: n as u64,
                flags,
            });
            if rng.next_u64().is_multiple_of(4) {
                let ring = RingArea::from_slice(&area).unwrap();
                drain_aux(&ring, &RingPointers::new(&head, &tail), &mut drained).unwrap();
            }
        }
        let ring = RingArea::from_slice(&area).unwrap();
        drain_aux(&ring, &RingPointers::new(&head, &tail), &mut drained).unwrap();
        assert!(truncations > 0);
        assert_eq!(losses.aux_truncated, truncations);
        assert_eq!(losses.full_trace_gaps(), truncations);
        assert_eq!(drained, produced);
        assert!(head.load(Ordering::Relaxed) > 50 * size as u64);
    }

    #[test]
    fn corrupt_rings_are_errors_not_hangs() {
        let mut ring = SimRing::new(256);
        // A zero-size header.
        ring.area[..8].copy_from_slice(&[9, 0, 0, 0, 0, 0, 0, 0]);
        ring.head.store(16, Ordering::Release);
        let area = RingArea::from_slice(&ring.area).unwrap();
        let e = RecordReader::default()
            .drain(&area, &ring.pointers(), |_, _| {})
            .unwrap_err();
        assert!(
            matches!(
                e,
                PtError::Ring(RingProblem::CorruptHeader {
                    position: 0,
                    available: 16,
                    ..
                })
            ),
            "{e}"
        );
        // A head too far ahead.
        ring.head.store(10_000, Ordering::Release);
        ring.tail.store(0, Ordering::Release);
        assert!(
            RecordReader::default()
                .drain(&area, &ring.pointers(), |_, _| {})
                .is_err()
        );
        assert!(RingArea::from_slice(&[0u8; 100]).is_err());
    }

    #[test]
    fn records_parse() {
        let mut mmap = Vec::new();
        mmap.extend_from_slice(&77u32.to_ne_bytes());
        mmap.extend_from_slice(&77u32.to_ne_bytes());
        mmap.extend_from_slice(&0x5555_5555_4000u64.to_ne_bytes());
        mmap.extend_from_slice(&0x2000u64.to_ne_bytes());
        mmap.extend_from_slice(&0x1000u64.to_ne_bytes());
        mmap.extend_from_slice(&[0; 24]);
        mmap.extend_from_slice(&5u32.to_ne_bytes()); // PROT_READ|PROT_EXEC
        mmap.extend_from_slice(&2u32.to_ne_bytes());
        mmap.extend_from_slice(b"/tmp/prog.memgaze\0\0\0\0\0\0\0");
        mmap.extend_from_slice(&[0; SAMPLE_ID_TRAILER]);
        let header = RecordHeader {
            kind: sys::PERF_RECORD_MMAP2,
            misc: 0,
            size: (mmap.len() + 8) as u16,
        };
        assert_eq!(
            parse_record(header, &mmap).unwrap(),
            PerfRecord::Mmap {
                pid: 77,
                addr: 0x5555_5555_4000,
                len: 0x2000,
                pgoff: 0x1000,
                prot: 5,
                filename: "/tmp/prog.memgaze",
            }
        );
        let header = RecordHeader {
            kind: sys::PERF_RECORD_SAMPLE,
            misc: 0,
            size: 0,
        };
        assert!(parse_record(header, &[0; 20]).is_err());
        let body = sample_body(9, 1, 5, &[1, 2, 3]);
        match parse_record(header, &body).unwrap() {
            PerfRecord::Sample { id, aux } => {
                assert_eq!((id.tid, id.cpu, id.time), (9, 1, 5));
                assert_eq!(aux, &[1, 2, 3, 0, 0, 0, 0, 0]);
            }
            other => panic!("{other:?}"),
        }
    }
}
