//! Log lines written straight into a reused buffer, for the lines every request writes: the same
//! text or JSON the `fmt` layer writes, without its per-event machinery — numbers without
//! allocation, strings escaped once, the date formatted once a second per thread.
//!
//! Whatever a value holds (a client's path, a tenant's issuer URL), it cannot end its line or
//! break out of its string: quotes, backslashes and control characters are escaped in both
//! formats, by the same JSON string writer as the NATS envelope's ([`crate::json_text`]).

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::LogFormat;

/// A line being written: [`Line::start`], its fields, [`Line::finish`].
#[derive(Debug)]
pub struct Line<'a> {
    buf: &'a mut Vec<u8>,
    format: LogFormat,
    target: &'static str,
}

/// The longest field name a [`Key`] holds, with its punctuation.
const KEY_BYTES: usize = 24;

/// A field's name as each format writes it before the value (`,"name":` and ` name=`), made
/// once by [`key!`]. Held in fixed arrays: writing one is a copy of a known size (a few moves,
/// no call), cut to its length.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    json: [u8; KEY_BYTES],
    json_len: usize,
    text: [u8; KEY_BYTES],
    text_len: usize,
}

impl Key {
    /// The name written `json` before a JSON value and `text` before a text one; use [`key!`].
    pub const fn new(json: &str, text: &str) -> Self {
        const fn held(name: &str) -> [u8; KEY_BYTES] {
            let bytes = name.as_bytes();
            assert!(
                bytes.len() <= KEY_BYTES,
                "a log field name too long for a Key"
            );
            let mut out = [0; KEY_BYTES];
            let mut i = 0;
            while i < bytes.len() {
                out[i] = bytes[i];
                i += 1;
            }
            out
        }
        Self {
            json: held(json),
            json_len: json.len(),
            text: held(text),
            text_len: text.len(),
        }
    }
}

/// The [`Key`] of a field name (a literal of letters, digits and `_`).
macro_rules! key {
    ($name:literal) => {
        $crate::telemetry::line::Key::new(concat!(",\"", $name, "\":"), concat!(" ", $name, "="))
    };
}
pub(crate) use key;

/// The date and time to the second of the last line a thread wrote, formatted.
struct Second {
    unix: u64,
    text: [u8; 19],
}

thread_local! {
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static SECOND: RefCell<Second> = const { RefCell::new(Second { unix: u64::MAX, text: [0; 19] }) };
}

/// Lines longer than this give their buffer's memory back afterwards.
const KEPT_BUFFER: usize = 16 * 1024;

/// Writes one `INFO` line of `target` with `message` and the fields `fields` adds, at `now`, in
/// `format`, and hands it to `out`. The buffer is the calling thread's, reused.
pub fn write_info(
    format: LogFormat,
    target: &'static str,
    message: &'static str,
    now: SystemTime,
    fields: impl FnOnce(&mut Line<'_>),
    out: impl FnOnce(&[u8]),
) {
    BUFFER.with(|cell| {
        // A line written while another is (a `Display` that logs) uses a buffer of its own.
        let mut own = Vec::new();
        let mut borrowed = cell.try_borrow_mut();
        let buf = match borrowed.as_deref_mut() {
            Ok(buf) => buf,
            Err(_) => &mut own,
        };
        buf.clear();
        // One line's worth: the writes below do not grow the buffer one by one.
        buf.reserve(512);
        let mut line = Line::start(buf, format, target, message, now);
        fields(&mut line);
        line.finish();
        out(buf);
        if buf.capacity() > KEPT_BUFFER {
            buf.clear();
            buf.shrink_to(KEPT_BUFFER);
        }
    });
}

impl<'a> Line<'a> {
    fn start(
        buf: &'a mut Vec<u8>,
        format: LogFormat,
        target: &'static str,
        message: &'static str,
        now: SystemTime,
    ) -> Self {
        match format {
            LogFormat::Json => {
                buf.extend_from_slice(b"{\"timestamp\":\"");
                timestamp(buf, now);
                buf.extend_from_slice(b"\",\"level\":\"INFO\",\"message\":\"");
                crate::json_text::string_body(buf, message);
                buf.push(b'"');
            }
            LogFormat::Text => {
                timestamp(buf, now);
                buf.extend_from_slice(b"  INFO ");
                buf.extend_from_slice(target.as_bytes());
                buf.extend_from_slice(b": ");
                crate::json_text::string_body(buf, message);
            }
        }
        Line {
            buf,
            format,
            target,
        }
    }

    fn key(&mut self, key: Key) {
        let (name, len) = match self.format {
            LogFormat::Json => (&key.json, key.json_len),
            LogFormat::Text => (&key.text, key.text_len),
        };
        let at = self.buf.len();
        self.buf.extend_from_slice(name);
        self.buf.truncate(at + len);
    }

    /// A string field: quoted in both formats.
    pub fn str(&mut self, key: Key, value: &str) -> &mut Self {
        self.key(key);
        self.buf.push(b'"');
        crate::json_text::string_body(self.buf, value);
        self.buf.push(b'"');
        self
    }

    /// A string field of the gateway's own (a plane, a route group, an error code, a role):
    /// text compiled into the gateway, which nothing a client or a tenant sends can change,
    /// written without looking for bytes to escape (debug builds check that there are none).
    pub fn name(&mut self, key: Key, value: &'static str) -> &mut Self {
        debug_assert!(
            !crate::json_text::any_needs_escape(value.as_bytes()),
            "{value:?}"
        );
        self.key(key);
        self.buf.push(b'"');
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(b'"');
        self
    }

    /// A field of 32 lower-case hex digits the gateway made (a request id): quoted, nothing to
    /// escape.
    pub fn hex(&mut self, key: Key, value: &[u8; 32]) -> &mut Self {
        debug_assert!(value.iter().all(u8::is_ascii_hexdigit));
        self.key(key);
        self.buf.push(b'"');
        self.buf.extend_from_slice(value);
        self.buf.push(b'"');
        self
    }

    /// A string field the text format writes bare (as the `fmt` layer writes a `%value`): a
    /// method, a path. Still escaped.
    pub fn bare(&mut self, key: Key, value: &str) -> &mut Self {
        match self.format {
            LogFormat::Json => self.str(key, value),
            LogFormat::Text => {
                self.key(key);
                crate::json_text::string_body(self.buf, value);
                self
            }
        }
    }

    /// A number field.
    pub fn u64(&mut self, key: Key, value: u64) -> &mut Self {
        self.key(key);
        self.buf
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
        self
    }

    fn finish(self) {
        if self.format == LogFormat::Json {
            self.buf.extend_from_slice(b",\"target\":\"");
            crate::json_text::string_body(self.buf, self.target);
            self.buf.extend_from_slice(b"\"}");
        }
        self.buf.push(b'\n');
    }
}

/// `now` as RFC 3339 in UTC with microseconds, `2026-12-07T23:43:45.123456Z` (the `fmt` layer's
/// form); the part to the second formatted once a second per thread.
fn timestamp(buf: &mut Vec<u8>, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let unix = since.as_secs();
    SECOND.with(|cell| {
        let mut second = cell.borrow_mut();
        if second.unix != unix {
            second.text = date_time(unix);
            second.unix = unix;
        }
        buf.extend_from_slice(&second.text);
    });
    let micros = since.subsec_micros();
    let mut frac = [b'.', b'0', b'0', b'0', b'0', b'0', b'0', b'Z'];
    let mut n = micros;
    for digit in frac[1..7].iter_mut().rev() {
        *digit = b'0' + (n % 10) as u8;
        n /= 10;
    }
    buf.extend_from_slice(&frac);
}

/// `YYYY-MM-DDTHH:MM:SS` of a Unix time in seconds (proleptic Gregorian, UTC).
fn date_time(unix: u64) -> [u8; 19] {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Days to civil date (H. Hinnant's algorithm), from 1970-01-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut text = *b"0000-00-00T00:00:00";
    let mut put = |at: usize, width: usize, mut value: u64| {
        for i in (at..at + width).rev() {
            text[i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, 4, year.clamp(0, 9999) as u64);
    put(5, 2, month as u64);
    put(8, 2, day as u64);
    put(11, 2, secs / 3600);
    put(14, 2, secs / 60 % 60);
    put(17, 2, secs % 60);
    text
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(unix: u64, micros: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(unix, micros * 1000)
    }

    fn line(format: LogFormat, now: SystemTime, fields: impl FnOnce(&mut Line<'_>)) -> String {
        let mut out = String::new();
        write_info(format, "aura::access", "access", now, fields, |bytes| {
            out = String::from_utf8(bytes.to_vec()).expect("the test's own value");
        });
        out
    }

    #[test]
    fn dates_are_formatted_as_rfc_3339_in_utc() {
        let cases = [
            (0, 0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400, 7, "2000-02-29T00:00:00.000007Z"),
            (1_709_251_199, 999_999, "2024-02-29T23:59:59.999999Z"),
            (1_796_687_025, 123_456, "2026-12-07T23:43:45.123456Z"),
            (4_102_444_800, 0, "2100-01-01T00:00:00.000000Z"),
        ];
        for (unix, micros, expected) in cases {
            let mut buf = Vec::new();
            timestamp(&mut buf, at(unix, micros));
            assert_eq!(
                String::from_utf8(buf).expect("the test's own value"),
                expected,
                "{unix}"
            );
        }
    }

    #[test]
    fn a_json_line_is_one_object_whatever_its_values_hold() {
        let hostile = "/v1/a\"b\\c\nd\re\u{1}f\u{7f}é";
        let text = line(LogFormat::Json, at(1_796_687_025, 5), |l| {
            l.hex(key!("request_id"), b"0123456789abcdef0123456789abcdef")
                .name(key!("plane"), "data")
                .bare(key!("path"), hostile)
                .u64(key!("status"), 200)
                .u64(key!("latency_us"), u64::MAX);
        });
        assert!(
            text.ends_with('\n') && text.matches('\n').count() == 1,
            "{text}"
        );
        let value: serde_json::Value = serde_json::from_str(&text).expect("the test's own value");
        assert_eq!(value["timestamp"], "2026-12-07T23:43:45.000005Z");
        assert_eq!(value["level"], "INFO");
        assert_eq!(value["message"], "access");
        assert_eq!(value["target"], "aura::access");
        assert_eq!(value["request_id"], "0123456789abcdef0123456789abcdef");
        assert_eq!(value["plane"], "data");
        assert_eq!(value["path"], hostile);
        assert_eq!(value["status"], 200);
        assert_eq!(value["latency_us"], u64::MAX);
    }

    #[test]
    fn every_byte_is_escaped_as_serde_json_escapes_it_wherever_it_falls() {
        for b in 0u8..=0x7f {
            for at in 0..17 {
                let mut value = "x".repeat(at);
                value.push(char::from(b));
                value.push_str("tail-of-the-value");
                let mut buf = Vec::new();
                crate::json_text::string_body(&mut buf, &value);
                let quoted = format!(
                    "\"{}\"",
                    String::from_utf8(buf).expect("the test's own value")
                );
                let back: String = serde_json::from_str(&quoted).expect("the test's own value");
                assert_eq!(back, value, "byte {b:#x} at {at}");
                let clean = !(b < 0x20 || b == b'"' || b == b'\\');
                assert_eq!(
                    quoted.len() == value.len() + 2,
                    clean,
                    "byte {b:#x} at {at}"
                );
            }
        }
    }

    #[test]
    fn a_text_line_reads_as_the_fmt_layers_and_cannot_be_split() {
        let text = line(LogFormat::Text, at(1_796_687_025, 0), |l| {
            l.str(key!("issuer"), "https://x\n2026 forged")
                .bare(key!("path"), "/v1/x\ny");
            l.u64(key!("status"), 404);
        });
        assert_eq!(
            text,
            "2026-12-07T23:43:45.000000Z  INFO aura::access: access \
             issuer=\"https://x\\n2026 forged\" path=/v1/x\\ny status=404\n"
        );
    }

    #[test]
    fn a_line_written_inside_another_does_not_disturb_it() {
        let mut inner = String::new();
        let outer = line(LogFormat::Text, at(0, 0), |l| {
            l.u64(key!("a"), 1);
            inner = line(LogFormat::Text, at(0, 0), |m| {
                m.u64(key!("b"), 2);
            });
            l.u64(key!("c"), 3);
        });
        assert!(outer.ends_with("access a=1 c=3\n"), "{outer}");
        assert!(inner.ends_with("access b=2\n"), "{inner}");
    }
}
