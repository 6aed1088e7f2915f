//! The log's writer: lines from every thread gathered in one buffer and written out in batches by
//! a thread of its own — one `write` for many lines, and no hand-over between threads per line.
//!
//! A line is copied into the shared buffer under a short lock. The writer thread is woken only
//! when the buffer stops being empty while it sleeps, or when the buffer passes [`BATCH_BYTES`];
//! once awake it waits up to the flush interval for more lines, then takes the whole buffer and
//! writes it. A slow or stalled output never makes the caller wait: at most `capacity` lines (and
//! [`MAX_PENDING_BYTES`]) wait, and a line that finds no room is dropped and counted.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Pending bytes past which the writer is woken before its flush interval ends.
pub const BATCH_BYTES: usize = 64 * 1024;

/// Pending bytes at most, whatever the line count: a few huge lines cannot hold a process's
/// memory.
pub const MAX_PENDING_BYTES: usize = 64 * 1024 * 1024;

/// A buffer that held more than this after a write gives its memory back down to
/// [`KEPT_BYTES`].
const SHRINK_ABOVE: usize = 4 * 1024 * 1024;
const KEPT_BYTES: usize = 1024 * 1024;

/// How long closing waits for the last lines to be written.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// The handle lines are pushed through; cheap to clone.
#[derive(Debug, Clone)]
pub struct Sink {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    dropped: AtomicU64,
    capacity: usize,
    flush: Duration,
}

#[derive(Debug, Default)]
struct Pending {
    bytes: Vec<u8>,
    lines: usize,
    /// The writer sleeps until a line comes.
    idle: bool,
    /// The writer was asked to write before its interval ends.
    hurried: bool,
    closed: bool,
}

/// Writes the last lines and stops the writer when dropped (keep it until the process ends).
#[derive(Debug)]
pub struct SinkGuard {
    sink: Sink,
    done: Option<std::sync::mpsc::Receiver<()>>,
}

impl Sink {
    /// Starts the writer thread writing to `out`: at most `capacity` lines wait, written at most
    /// `flush` after they came.
    pub fn start<W: Write + Send + 'static>(
        out: W,
        capacity: usize,
        flush: Duration,
    ) -> std::io::Result<(Sink, SinkGuard)> {
        let sink = Sink {
            shared: Arc::new(Shared {
                pending: Mutex::new(Pending::default()),
                wake: Condvar::new(),
                dropped: AtomicU64::new(0),
                capacity: capacity.max(1),
                flush,
            }),
        };
        let (done_tx, done) = std::sync::mpsc::sync_channel(1);
        let shared = sink.shared.clone();
        std::thread::Builder::new()
            .name("aura-log".to_owned())
            .spawn(move || {
                shared.run(out);
                let _ = done_tx.send(());
            })?;
        let guard = SinkGuard {
            sink: sink.clone(),
            done: Some(done),
        };
        Ok((sink, guard))
    }

    /// Queues one or more whole lines (ending in `\n`), or drops them and counts one line when
    /// the queue is full. Never waits for the output.
    pub fn push(&self, line: &[u8]) -> bool {
        let shared = &*self.shared;
        let mut pending = shared.lock();
        if pending.closed
            || pending.lines >= shared.capacity
            || pending.bytes.len() + line.len() > MAX_PENDING_BYTES
        {
            drop(pending);
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let was_empty = pending.bytes.is_empty();
        pending.bytes.extend_from_slice(line);
        pending.lines += 1;
        let wake =
            (was_empty && pending.idle) || (pending.bytes.len() >= BATCH_BYTES && !pending.hurried);
        if wake {
            pending.idle = false;
            pending.hurried |= pending.bytes.len() >= BATCH_BYTES;
        }
        drop(pending);
        if wake {
            shared.wake.notify_one();
        }
        true
    }

    /// Lines dropped so far.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic while holding the lock leaves a buffer of whole lines: keep using it.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The writer thread: sleeps while nothing is pending, gathers for the flush interval, writes
    /// the whole buffer at once.
    fn run<W: Write>(&self, mut out: W) {
        let mut batch = Vec::new();
        loop {
            let mut pending = self.lock();
            while pending.bytes.is_empty() && !pending.closed {
                pending.idle = true;
                pending = self.wake.wait(pending).unwrap_or_else(|e| e.into_inner());
            }
            pending.idle = false;
            if !pending.closed && !pending.hurried {
                pending = self
                    .wake
                    .wait_timeout_while(pending, self.flush, |p| !p.hurried && !p.closed)
                    .map(|(p, _)| p)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            std::mem::swap(&mut pending.bytes, &mut batch);
            let lines = std::mem::take(&mut pending.lines);
            pending.hurried = false;
            let closed = pending.closed;
            drop(pending);
            if !batch.is_empty() && out.write_all(&batch).and_then(|()| out.flush()).is_err() {
                self.dropped.fetch_add(lines as u64, Ordering::Relaxed);
            }
            batch.clear();
            if batch.capacity() > SHRINK_ABOVE {
                batch.shrink_to(KEPT_BYTES);
            }
            if closed && self.lock().bytes.is_empty() {
                return;
            }
        }
    }
}

impl Drop for SinkGuard {
    fn drop(&mut self) {
        let shared = &*self.sink.shared;
        shared.lock().closed = true;
        shared.wake.notify_one();
        // An output that does not take the last lines does not hold the process up for long.
        if let Some(done) = self.done.take() {
            let _ = done.recv_timeout(CLOSE_WAIT);
        }
    }
}

/// The `fmt` layer's writer: each event's text, written whole in one call, is one push.
#[derive(Debug)]
pub struct SinkWriter<'a>(&'a Sink);

impl Write for SinkWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = SinkWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        SinkWriter(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output that records every write, and can be held shut.
    #[derive(Clone, Default)]
    struct Recorder {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        gate: Arc<Mutex<()>>,
    }

    impl Write for Recorder {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _open = self.gate.lock().expect("the test's own value");
            self.writes
                .lock()
                .expect("the test's own value")
                .push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn text(recorder: &Recorder) -> String {
        let writes = recorder.writes.lock().expect("the test's own value");
        String::from_utf8(writes.concat()).expect("the test's own value")
    }

    #[test]
    fn lines_pushed_together_are_written_in_one_batch_in_order() {
        let out = Recorder::default();
        let (sink, guard) = Sink::start(out.clone(), 1000, Duration::from_millis(50))
            .expect("the test's own value");
        for i in 0..100 {
            assert!(sink.push(format!("line {i}\n").as_bytes()));
        }
        drop(guard);
        let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text(&out), expected);
        let writes = out.writes.lock().expect("the test's own value").len();
        assert!(writes <= 2, "100 lines in {writes} writes");
        assert_eq!(sink.dropped(), 0);
    }

    #[test]
    fn a_line_is_written_within_the_flush_interval_without_more_traffic() {
        let out = Recorder::default();
        let (sink, _guard) = Sink::start(out.clone(), 1000, Duration::from_millis(20))
            .expect("the test's own value");
        sink.push(b"alone\n");
        let started = std::time::Instant::now();
        while text(&out).is_empty() {
            assert!(started.elapsed() < Duration::from_secs(5), "never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(text(&out), "alone\n");
    }

    #[test]
    fn a_stalled_output_drops_and_counts_lines_past_the_capacity_without_waiting() {
        let out = Recorder::default();
        let shut = out.gate.lock().expect("the test's own value");
        let (sink, guard) =
            Sink::start(out.clone(), 10, Duration::from_millis(1)).expect("the test's own value");
        // The writer takes the first line and blocks writing it.
        sink.push(b"first\n");
        let started = std::time::Instant::now();
        while sink.shared.lock().lines != 0 {
            assert!(started.elapsed() < Duration::from_secs(5), "never taken");
            std::thread::sleep(Duration::from_millis(1));
        }
        let started = std::time::Instant::now();
        let kept = (0..100).filter(|_| sink.push(b"more\n")).count();
        assert!(started.elapsed() < Duration::from_secs(1), "a push waited");
        assert_eq!(kept, 10);
        assert_eq!(sink.dropped(), 90);
        drop(shut);
        drop(guard);
        assert_eq!(text(&out), format!("first\n{}", "more\n".repeat(10)));
    }

    #[test]
    fn lines_over_the_byte_ceiling_are_dropped() {
        let out = Recorder::default();
        let (sink, _guard) =
            Sink::start(out, 10, Duration::from_millis(1)).expect("the test's own value");
        assert!(!sink.push(&vec![b'x'; MAX_PENDING_BYTES + 1]));
        assert_eq!(sink.dropped(), 1);
    }
}
