//! Phase 8, the per-IP rate limit, before authentication, on every route of the plane (public
//! ones too): a flood is refused before any credential or plugin work. CORS preflights, answered
//! in phase 1, take their token here too.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::extract::{ConnectInfo, Request};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue};

use super::Phase;
use super::context::RequestContext;
use crate::error::GatewayError;
use crate::plane::Plane;
use crate::ratelimit::Decision;
use crate::ratelimit::client_ip::client_ip;
use crate::state::AppState;

use super::stamps::{RATELIMIT_LIMIT, RATELIMIT_REMAINING, RATELIMIT_RESET, RateLimitNumbers};

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

/// Sets `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`.
pub fn rate_limit_headers(headers: &mut HeaderMap, decision: &Decision) {
    rate_limit_numbers(headers, &RateLimitNumbers::of(decision));
}

/// Sets the `RateLimit-*` headers to `numbers`.
pub fn rate_limit_numbers(headers: &mut HeaderMap, numbers: &RateLimitNumbers) {
    headers.insert(RATELIMIT_LIMIT.clone(), number(numbers.limit, Which::Limit));
    headers.insert(
        RATELIMIT_REMAINING.clone(),
        number(numbers.remaining, Which::Remaining),
    );
    headers.insert(RATELIMIT_RESET.clone(), number(numbers.reset, Which::Reset));
}

/// Counts a decision in `aura_ratelimit_decisions_total`.
pub fn count(state: &AppState, plane: Plane, limiter: Limiter, decision: &Decision) {
    state
        .metrics
        .ratelimit_decision(plane, limiter == Limiter::Actor, decision.allowed)
        .inc();
}

/// Which limit decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limiter {
    /// Per client IP (this phase).
    Ip,
    /// Per actor (phase 10).
    Actor,
}

/// The 429 answer of a denied decision.
pub fn too_many(decision: &Decision) -> Response {
    let mut response = GatewayError::rate_limited(decision.reset).into_response();
    rate_limit_headers(response.headers_mut(), decision);
    response
}

/// The TCP peer of a request that reached the plane's service without its listener: the
/// address a caller put in its `ConnectInfo` extension (the tests of the chain do), else
/// unspecified. The listener hands the peer to the service directly.
pub fn peer_of(request: &Request) -> IpAddr {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// Whether the TCP peer `peer` is in `rate_limit.trusted_proxies` (its forwarding and trace
/// headers are then believed).
pub fn is_trusted_peer(state: &AppState, peer: IpAddr) -> bool {
    let trusted = &state.config.rate_limit.trusted_proxies;
    if trusted.is_empty() {
        return false;
    }
    let peer = crate::ratelimit::client_ip::canonical(peer);
    trusted.iter().any(|net| net.contains(&peer))
}

/// Phase 8: takes one token of the per-IP limit for `request` and records the client IP in
/// `cx`; the `429` when denied (`cx.ip_limited` is then set).
pub fn check(state: &AppState, cx: &mut RequestContext, request: &Request) -> Phase<()> {
    let ip = client_ip(
        cx.peer,
        request.headers(),
        &state.config.rate_limit.trusted_proxies,
    );
    cx.client_ip = Some(ip);
    if let Some(decision) = state.ip_limiter(cx.plane).check(ip) {
        count(state, cx.plane, Limiter::Ip, &decision);
        if !decision.allowed {
            cx.ip_limited = true;
            return Err(too_many(&decision));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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

    #[test]
    fn the_three_headers_carry_the_decision() {
        let mut headers = HeaderMap::new();
        let decision = Decision {
            allowed: true,
            limit: 1000,
            remaining: 5_000_000,
            reset: Duration::from_millis(1_500),
        };
        rate_limit_headers(&mut headers, &decision);
        let get = |name: &http::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
        assert_eq!(get(&RATELIMIT_LIMIT), Some("1000"));
        assert_eq!(get(&RATELIMIT_REMAINING), Some("5000000"));
        assert_eq!(get(&RATELIMIT_RESET), Some("2"));
    }
}
