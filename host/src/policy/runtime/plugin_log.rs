//! What a plugin writes for the gateway's log: lines from the `aura:gateway/log` import and the
//! captured stdout and stderr of its WASI sandbox.
//!
//! A plugin is hostile like any tenant input: a line is cut to [`MAX_LINE_BYTES`] with its
//! control characters replaced, a call keeps at most [`MAX_LINES_PER_CALL`] lines, and a module
//! writes at most [`LINES_PER_SECOND`] lines per second; everything beyond is dropped and counted
//! (`aura_plugin_log_dropped_total`). Lines are written after the call, on the request's task,
//! with the plane, the stage, the module and the request id (`-` outside a request), under the
//! log target `aura::plugin`.

use std::sync::Mutex;
use std::time::Instant;

use crate::plane::Plane;
use crate::policy::Stage;

/// Bytes of one line kept (on a character boundary).
pub const MAX_LINE_BYTES: usize = 1024;
/// Lines one call may write, `log` and stdout/stderr together.
pub const MAX_LINES_PER_CALL: usize = 16;
/// Lines one module may write per second (and at once, after a quiet second).
pub const LINES_PER_SECOND: f64 = 100.0;
/// The gateway's own lines about one module's failed calls, per second; the failures past it
/// are counted (`aura_plugin_log_dropped_total{reason="failures"}`) and the next line written
/// says how many were left out. Every failure is counted in `aura_plugin_failures_total`.
pub const FAILURE_LINES_PER_SECOND: f64 = 1.0;
/// ... and at once, after a quiet spell.
pub const FAILURE_LINES_BURST: f64 = 5.0;

/// How much a line matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    fn tracing(self) -> tracing::Level {
        match self {
            Level::Debug => tracing::Level::DEBUG,
            Level::Info => tracing::Level::INFO,
            Level::Warn => tracing::Level::WARN,
            Level::Error => tracing::Level::ERROR,
        }
    }
}

/// Where a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The `log` import.
    Log,
    /// WASI stdout (written at `info`).
    Stdout,
    /// WASI stderr (written at `warn`).
    Stderr,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Log => "log",
            Source::Stdout => "stdout",
            Source::Stderr => "stderr",
        }
    }
}

/// One kept line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub level: Level,
    pub source: Source,
    pub text: String,
}

/// The lines of the call in progress (part of the instance's store).
#[derive(Debug, Default)]
pub struct CallLog {
    lines: Vec<Line>,
    /// Lines refused because the call had written [`MAX_LINES_PER_CALL`].
    dropped: u64,
    /// Output bytes dropped over the capture size.
    dropped_bytes: u64,
}

impl CallLog {
    /// Keeps one line of the current call, cleaned, or counts it as dropped.
    pub fn push(&mut self, level: Level, source: Source, message: &str) {
        if self.lines.len() >= MAX_LINES_PER_CALL {
            self.dropped += 1;
            return;
        }
        self.lines.push(Line {
            level,
            source,
            text: clean(message),
        });
    }

    /// Splits captured output into lines (invalid UTF-8 replaced) and keeps them.
    pub fn push_output(&mut self, source: Source, bytes: &[u8], dropped_bytes: usize) {
        self.dropped_bytes += dropped_bytes as u64;
        let level = if source == Source::Stderr {
            Level::Warn
        } else {
            Level::Info
        };
        for line in bytes.split(|b| *b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            self.push(level, source, &String::from_utf8_lossy(line));
        }
    }

    /// Whether the call has written all the lines it may keep.
    pub fn is_full(&self) -> bool {
        self.lines.len() >= MAX_LINES_PER_CALL
    }

    /// Whether there is nothing to write or count.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty() && self.dropped == 0 && self.dropped_bytes == 0
    }

    fn take(&mut self) -> CallLog {
        std::mem::take(self)
    }
}

/// Cuts `message` to [`MAX_LINE_BYTES`] and replaces control characters (newlines included, so
/// that one call cannot forge log lines of its own) by spaces.
pub fn clean(message: &str) -> String {
    let mut end = message.len().min(MAX_LINE_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let mut text: String = message[..end]
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if end < message.len() {
        text.push('…');
    }
    text
}

/// A module's line budget: a token bucket of [`LINES_PER_SECOND`] by default.
#[derive(Debug)]
pub struct LogRate {
    bucket: Mutex<(Instant, f64)>,
    per_second: f64,
    burst: f64,
}

impl Default for LogRate {
    fn default() -> Self {
        Self::new(LINES_PER_SECOND, LINES_PER_SECOND)
    }
}

impl LogRate {
    /// `per_second` lines a second, `burst` at once; full at first.
    pub fn new(per_second: f64, burst: f64) -> Self {
        Self {
            bucket: Mutex::new((Instant::now(), burst)),
            per_second,
            burst,
        }
    }

    /// How many of `wanted` lines may be written at `now`.
    pub fn admit(&self, wanted: usize, now: Instant) -> usize {
        let Ok(mut bucket) = self.bucket.lock() else {
            return 0;
        };
        let (last, tokens) = *bucket;
        let tokens = (tokens + now.saturating_duration_since(last).as_secs_f64() * self.per_second)
            .min(self.burst);
        let admitted = (tokens.floor() as usize).min(wanted);
        *bucket = (now, tokens - admitted as f64);
        admitted
    }
}

/// The budget of the gateway's lines about one module's failed calls: a module failing on every
/// call (a tenant's, spinning or trapping on purpose) writes at most
/// [`FAILURE_LINES_PER_SECOND`] of them, not one per request.
#[derive(Debug)]
pub struct FailureLog {
    rate: LogRate,
    /// Failures not written since the last line written.
    left_out: std::sync::atomic::AtomicU64,
}

impl Default for FailureLog {
    fn default() -> Self {
        Self {
            rate: LogRate::new(FAILURE_LINES_PER_SECOND, FAILURE_LINES_BURST),
            left_out: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl FailureLog {
    /// Whether a failure at `now` is written: `Some(n)`, `n` the failures left out since the
    /// last line written (the line says so), or `None` (this one is left out and counted).
    pub fn admit(&self, now: Instant) -> Option<u64> {
        use std::sync::atomic::Ordering;
        if self.rate.admit(1, now) == 1 {
            Some(self.left_out.swap(0, Ordering::Relaxed))
        } else {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Who wrote the lines: the fields every line carries.
#[derive(Debug, Clone, Copy)]
pub struct Writer<'a> {
    pub plane: Plane,
    pub stage: Stage,
    pub module: &'a str,
    pub digest: &'a str,
    pub request_id: Option<&'a str>,
}

/// Writes the lines of one call (those the module's rate admits) and counts what was dropped.
pub fn write(
    log: &mut CallLog,
    writer: Writer<'_>,
    rate: &LogRate,
    metrics: Option<&crate::metrics::Metrics>,
) {
    let CallLog {
        lines,
        dropped,
        dropped_bytes,
    } = log.take();
    let admitted = rate.admit(lines.len(), Instant::now());
    let over_rate = lines.len() - admitted;
    for line in &lines[..admitted] {
        emit(line, &writer);
    }
    if let Some(m) = metrics {
        let (plane, stage) = (writer.plane.as_str(), writer.stage.key());
        for (reason, count) in [
            ("per_call", dropped),
            ("rate", over_rate as u64),
            ("bytes", u64::from(dropped_bytes > 0)),
        ] {
            if count > 0 {
                m.plugin_log_dropped
                    .with_label_values(&[plane, stage, reason])
                    .inc_by(count);
            }
        }
    }
}

fn emit(line: &Line, w: &Writer<'_>) {
    // The call's own request id, else the request whose work this is (a stage decided for a
    // request that did not name it to the call), else none.
    let scoped = crate::telemetry::scope::current();
    let request_id = w
        .request_id
        .or_else(|| scoped.as_ref().and_then(|id| std::str::from_utf8(id).ok()))
        .unwrap_or("-");
    macro_rules! event {
        ($level:expr) => {
            tracing::event!(
                target: "aura::plugin",
                $level,
                plane = w.plane.as_str(),
                stage = w.stage.key(),
                module = w.module,
                digest = w.digest,
                request_id,
                source = line.source.as_str(),
                "{}",
                line.text
            )
        };
    }
    match line.level.tracing() {
        tracing::Level::DEBUG => event!(tracing::Level::DEBUG),
        tracing::Level::INFO => event!(tracing::Level::INFO),
        tracing::Level::WARN => event!(tracing::Level::WARN),
        _ => event!(tracing::Level::ERROR),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn lines_are_cut_and_cannot_forge_other_lines() {
        assert_eq!(clean("a\nb\r\u{1b}[31mc"), "a b  [31mc");
        let long = "é".repeat(MAX_LINE_BYTES);
        let cut = clean(&long);
        assert!(cut.len() <= MAX_LINE_BYTES + '…'.len_utf8());
        assert!(cut.ends_with('…'));
        assert_eq!(clean("plain"), "plain");
    }

    #[test]
    fn failures_past_the_rate_are_left_out_and_the_next_line_says_how_many() {
        let log = FailureLog::default();
        let t0 = Instant::now();
        let burst = FAILURE_LINES_BURST as usize;
        for i in 0..burst {
            assert_eq!(
                log.admit(t0),
                Some(0),
                "failure {i} of the burst is written"
            );
        }
        for _ in 0..1_000 {
            assert_eq!(log.admit(t0), None, "a failure past the burst is left out");
        }
        // A second later one line may be written again; it counts the thousand left out.
        assert_eq!(log.admit(t0 + Duration::from_secs(1)), Some(1_000));
        assert_eq!(log.admit(t0 + Duration::from_secs(1)), None);
        assert_eq!(log.admit(t0 + Duration::from_secs(2)), Some(1));
    }

    #[test]
    fn a_call_keeps_at_most_its_share_of_lines() {
        let mut log = CallLog::default();
        for i in 0..MAX_LINES_PER_CALL + 5 {
            log.push(Level::Info, Source::Log, &format!("line {i}"));
        }
        assert_eq!(log.lines.len(), MAX_LINES_PER_CALL);
        assert_eq!(log.dropped, 5);
    }

    #[test]
    fn output_is_split_into_lines() {
        let mut log = CallLog::default();
        log.push_output(Source::Stderr, b"one\r\n\ntwo\xff\n", 3);
        assert_eq!(
            log.lines,
            vec![
                Line {
                    level: Level::Warn,
                    source: Source::Stderr,
                    text: "one".into()
                },
                Line {
                    level: Level::Warn,
                    source: Source::Stderr,
                    text: "two\u{fffd}".into()
                },
            ]
        );
        assert_eq!(log.dropped_bytes, 3);
    }

    #[test]
    fn a_module_writes_at_most_its_rate() {
        let rate = LogRate::default();
        let start = Instant::now();
        assert_eq!(rate.admit(60, start), 60);
        assert_eq!(rate.admit(60, start), 40, "the burst is one second's worth");
        assert_eq!(rate.admit(10, start), 0);
        assert_eq!(rate.admit(100, start + Duration::from_millis(100)), 10);
        assert_eq!(rate.admit(500, start + Duration::from_secs(60)), 100);
    }
}
