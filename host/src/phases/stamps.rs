//! The headers the phases set on every answer on their way out — the security headers (phase 2),
//! the request id (phase 7) and the `RateLimit-*` headers of the quota decision (phase 10) —
//! kept beside the answer instead of in its header map.
//!
//! Each of them replaces whatever a backend sent under its name. Put into the answer's map, that
//! is nine inserts a request, each a hash and a probe of the map (about 2,400 instructions in
//! all). The HTTP/1 writer instead writes them after the answer's own headers and skips a
//! backend's copies of their names as it goes ([`Stamps::write`], [`Stamps::covers`]); every
//! other consumer of an answer (HTTP/2, the plane as a `tower::Service`) gets them in the map
//! ([`Stamps::apply`]). Both give a client the same headers.

use axum::response::Response;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::request_id::RequestId;
use super::security_headers;
use crate::ratelimit::Decision;

/// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`.
pub static RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
pub static RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
pub static RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// The numbers of the `RateLimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitNumbers {
    pub limit: u64,
    pub remaining: u64,
    /// Whole seconds, rounded up.
    pub reset: u64,
}

impl RateLimitNumbers {
    /// The numbers of `decision`.
    pub fn of(decision: &Decision) -> Self {
        let reset = decision.reset;
        Self {
            limit: decision.limit.into(),
            remaining: decision.remaining.into(),
            reset: reset.as_secs() + u64::from(reset.subsec_nanos() > 0),
        }
    }

    /// Sets the `RateLimit-*` headers of `headers` to these numbers.
    pub fn write(&self, headers: &mut HeaderMap) {
        headers.insert(RATELIMIT_LIMIT.clone(), number(self.limit, Which::Limit));
        headers.insert(
            RATELIMIT_REMAINING.clone(),
            number(self.remaining, Which::Remaining),
        );
        headers.insert(RATELIMIT_RESET.clone(), number(self.reset, Which::Reset));
    }
}

/// Numbers below this have a prebuilt header value: the three `RateLimit-*` values of the
/// default limits (a burst of 1000) cost no allocation.
const PREBUILT_NUMBERS: u64 = 1024;

/// The header value of `n`: a copy of a prebuilt one below [`PREBUILT_NUMBERS`] (its bytes are
/// static, so the copy takes neither an allocation nor a reference count); above, the value
/// this thread made last for the same header when it was the same number (a limit is the same
/// on every answer, and a large bucket's remaining count seldom moves), else a new one written
/// on the stack and copied once into a reference-counted block (`HeaderValue::from(u64)` takes
/// two allocations: its buffer, then the buffer's shared header when it is frozen).
fn number(n: u64, which: Which) -> HeaderValue {
    static PREBUILT: std::sync::OnceLock<Vec<HeaderValue>> = std::sync::OnceLock::new();
    thread_local! {
        /// The last large number of each header, and its value.
        static LAST: std::cell::RefCell<[Option<(u64, HeaderValue)>; 3]> =
            const { std::cell::RefCell::new([None, None, None]) };
    }
    let prebuilt = PREBUILT.get_or_init(|| {
        let mut digits = String::new();
        let mut ends = Vec::new();
        for n in 0..PREBUILT_NUMBERS {
            digits.push_str(itoa::Buffer::new().format(n));
            ends.push(digits.len());
        }
        // Made once for the process's lifetime (about 3 KB).
        let digits: &'static str = Box::leak(digits.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let value = HeaderValue::from_static(&digits[start..end]);
                start = end;
                value
            })
            .collect()
    });
    if let Some(value) = usize::try_from(n).ok().and_then(|i| prebuilt.get(i)) {
        return value.clone();
    }
    LAST.with_borrow_mut(|last| {
        let slot = &mut last[which as usize];
        if let Some((m, value)) = slot
            && *m == n
        {
            return value.clone();
        }
        let mut digits = itoa::Buffer::new();
        // Twenty digits at most (`u64::MAX`): always a value.
        let value = crate::headers::shared_value::<20>(digits.format(n).as_bytes())
            .unwrap_or_else(|| HeaderValue::from(n));
        *slot = Some((n, value.clone()));
        value
    })
}

/// Which `RateLimit-*` header a number is for.
#[derive(Debug, Clone, Copy)]
enum Which {
    Limit = 0,
    Remaining = 1,
    Reset = 2,
}

/// An answer and the headers still to be added to it.
#[derive(Debug)]
pub struct Stamped {
    pub response: Response,
    pub stamps: Stamps,
}

impl Stamped {
    /// An answer whose map holds all of its headers.
    pub fn whole(response: Response) -> Self {
        Self {
            response,
            stamps: Stamps::none(),
        }
    }

    /// The answer with the stamps put into its map.
    pub fn into_response(self) -> Response {
        let Self {
            mut response,
            stamps,
        } = self;
        stamps.apply(response.headers_mut());
        response
    }
}

/// The headers an answer is to carry beyond its own, and which of a backend's they replace.
#[derive(Debug, Default)]
pub struct Stamps {
    security: bool,
    request_id: Option<RequestId>,
    rate_limit: Option<RateLimitNumbers>,
}

impl Stamps {
    /// Nothing to add: the answer's map holds all of its headers.
    pub fn none() -> Self {
        Self::default()
    }

    /// The security headers (CONTRACT §7).
    pub fn security(&mut self) {
        self.security = true;
    }

    /// `x-request-id: id`.
    pub fn request_id(&mut self, id: &RequestId) {
        self.request_id = Some(id.clone());
    }

    /// The `RateLimit-*` headers of `decision`.
    pub fn rate_limit(&mut self, decision: &Decision) {
        self.rate_limit = Some(RateLimitNumbers::of(decision));
    }

    /// The stamps of combination `bits` (1: security, 2: `id`, 4: `decision`'s numbers), for
    /// tests that go through every combination.
    #[cfg(test)]
    pub fn of_bits(bits: u8, id: &RequestId, decision: &Decision) -> Self {
        Self {
            security: bits & 1 != 0,
            request_id: (bits & 2 != 0).then(|| id.clone()),
            rate_limit: (bits & 4 != 0).then(|| RateLimitNumbers::of(decision)),
        }
    }

    /// Puts the headers into `headers`, replacing what is there under their names.
    pub fn apply(&self, headers: &mut HeaderMap) {
        if let Some(numbers) = &self.rate_limit {
            numbers.write(headers);
        }
        if let Some(id) = &self.request_id {
            super::request_id::stamp(id, headers);
        }
        if self.security {
            security_headers::stamp(headers);
        }
    }
}

/// The answer's HTTP/1 head is written through them: an answer's own copies of their names left
/// out, their lines written after the rest.
impl crate::http1::head::HeadEdits for Stamps {
    /// Whether an answer's header named `name` (lower case, as `HeaderName::as_str` gives it)
    /// is replaced by one of these: the writer leaves it out.
    fn skips(&self, name: &str) -> bool {
        let security = self.security;
        let limits = self.rate_limit.is_some();
        match name.len() {
            12 => self.request_id.is_some() && name == "x-request-id",
            15 => {
                (security && (name == "referrer-policy" || name == "x-frame-options"))
                    || (limits && (name == "ratelimit-limit" || name == "ratelimit-reset"))
            }
            19 => limits && name == "ratelimit-remaining",
            22 => security && name == "x-content-type-options",
            23 => security && name == "content-security-policy",
            25 => security && name == "strict-transport-security",
            _ => false,
        }
    }

    /// Writes the headers as lines of an HTTP/1 head (`name: value\r\n`) into `out`.
    fn write_lines(&self, out: &mut Vec<u8>) {
        if self.security {
            out.extend_from_slice(security_headers::lines());
        }
        if let Some(id) = &self.request_id {
            out.extend_from_slice(b"x-request-id: ");
            out.extend_from_slice(id.as_str().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if let Some(numbers) = &self.rate_limit {
            let mut digits = itoa::Buffer::new();
            out.extend_from_slice(b"ratelimit-limit: ");
            out.extend_from_slice(digits.format(numbers.limit).as_bytes());
            out.extend_from_slice(b"\r\nratelimit-remaining: ");
            out.extend_from_slice(digits.format(numbers.remaining).as_bytes());
            out.extend_from_slice(b"\r\nratelimit-reset: ");
            out.extend_from_slice(digits.format(numbers.reset).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::http1::head::HeadEdits as _;

    /// Every combination of stamps.
    fn every_stamps() -> Vec<Stamps> {
        let id = RequestId::mint();
        let decision = Decision::allowed(1000, 5_000_000, Duration::from_millis(1_500));
        (0..8u8)
            .map(|bits| Stamps::of_bits(bits, &id, &decision))
            .collect()
    }

    fn lines_of(headers: &HeaderMap) -> Vec<(String, String)> {
        let mut lines: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        lines.sort();
        lines
    }

    fn written(stamps: &Stamps) -> Vec<(String, String)> {
        let mut out = Vec::new();
        stamps.write_lines(&mut out);
        let text = String::from_utf8(out).unwrap_or_default();
        let mut lines: Vec<(String, String)> = text
            .split_terminator("\r\n")
            .map(|line| {
                let (name, value) = line.split_once(": ").unwrap_or((line, ""));
                (name.to_owned(), value.to_owned())
            })
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn written_lines_are_the_headers_apply_puts_in_a_map() {
        for stamps in every_stamps() {
            let mut map = HeaderMap::new();
            stamps.apply(&mut map);
            assert_eq!(written(&stamps), lines_of(&map), "{stamps:?}");
        }
    }

    #[test]
    fn covers_exactly_the_names_it_puts_in_a_map() {
        let names = [
            "x-request-id",
            "referrer-policy",
            "x-frame-options",
            "ratelimit-limit",
            "ratelimit-reset",
            "ratelimit-remaining",
            "x-content-type-options",
            "content-security-policy",
            "strict-transport-security",
            // Near misses, of the same lengths.
            "x-request-ie",
            "referrer-polica",
            "ratelimit-limiu",
            "ratelimit-remaininh",
            "x-content-type-optionz",
            "content-security-policz",
            "strict-transport-securitz",
            "content-type",
            "",
        ];
        for stamps in every_stamps() {
            let mut map = HeaderMap::new();
            stamps.apply(&mut map);
            for name in names {
                assert_eq!(
                    stamps.skips(name),
                    map.contains_key(name),
                    "{name} with {stamps:?}"
                );
            }
        }
    }

    #[test]
    fn rate_limit_reset_is_rounded_up_to_whole_seconds() {
        let at = |ms| RateLimitNumbers::of(&Decision::allowed(10, 3, Duration::from_millis(ms)));
        assert_eq!(at(0).reset, 0);
        assert_eq!(at(1).reset, 1);
        assert_eq!(at(1000).reset, 1);
        assert_eq!(at(1001).reset, 2);
        assert_eq!((at(5).limit, at(5).remaining), (10, 3));
    }

    #[test]
    fn numbers_read_the_same_prebuilt_or_not() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            999,
            1000,
            1023,
            1024,
            1025,
            4_294_967_295,
            u64::MAX,
        ] {
            for which in [Which::Limit, Which::Remaining, Which::Reset] {
                // Twice: made, then the one kept for the header.
                assert_eq!(number(n, which), HeaderValue::from(n), "{n}");
                assert_eq!(number(n, which), HeaderValue::from(n), "{n} again");
            }
        }
        let all: Vec<HeaderValue> = (0..PREBUILT_NUMBERS)
            .map(|n| number(n, Which::Remaining))
            .collect();
        for (n, value) in all.iter().enumerate() {
            assert_eq!(value.to_str().ok(), Some(n.to_string().as_str()));
        }
    }

    #[test]
    fn a_prebuilt_or_repeated_number_is_shared_not_made_again() {
        // The same bytes each time below the bound (no allocation).
        let at = |n: u64, which| number(n, which).as_bytes().as_ptr();
        let same = |n: u64| at(n, Which::Limit) == at(n, Which::Limit);
        assert!(same(0) && same(1000) && same(PREBUILT_NUMBERS - 1));
        // Above it, a header's value is made again only when its number changes; each header
        // keeps its own.
        let big = PREBUILT_NUMBERS + 7;
        let first = at(big, Which::Remaining);
        assert_eq!(at(big, Which::Remaining), first, "the same number: kept");
        let other = at(big, Which::Limit);
        assert_ne!(other, first, "another header: its own value");
        assert_eq!(
            at(big, Which::Remaining),
            first,
            "not displaced by another header"
        );
        let moved = at(big + 1, Which::Remaining);
        assert_ne!(moved, first, "a new number: a new value");
        assert_eq!(
            number(big + 1, Which::Remaining),
            HeaderValue::from(big + 1)
        );
    }
}
