//! The one parser of the `Authorization` header, used by both planes, the `/metrics` guard and
//! the admin routes.
//!
//! A credential is either parsed and then verified, or the request is refused: the gateway never
//! forwards an `Authorization` value it did not understand. Accepted: exactly one header, the
//! scheme `Bearer` in any case, one or more spaces or tabs, a token68 (RFC 9110 §11.2), optional
//! trailing whitespace. Anything else — two headers, another scheme, an empty or malformed token,
//! bytes that are not visible ASCII — is [`Malformed`].

use http::HeaderMap;
use http::header::AUTHORIZATION;

/// Why an `Authorization` header was refused. The message never contains the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// More than one `Authorization` header.
    #[error("more than one Authorization header")]
    Duplicate,
    /// A scheme other than `Bearer`.
    #[error("only the Bearer authorization scheme is accepted")]
    Scheme,
    /// No token, or a token that is not a token68.
    #[error("malformed bearer token")]
    Token,
}

fn is_token68(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/')
}

/// Parses one header value: `Some(token)` for a well-formed bearer credential.
fn parse(value: &[u8]) -> Result<&str, Malformed> {
    let scheme_end = value
        .iter()
        .position(|&b| b == b' ' || b == b'\t')
        .unwrap_or(value.len());
    if !value[..scheme_end].eq_ignore_ascii_case(b"bearer") {
        return Err(Malformed::Scheme);
    }
    let rest = &value[scheme_end..];
    let start = rest
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(rest.len());
    if start == 0 && !rest.is_empty() {
        return Err(Malformed::Scheme);
    }
    let token = rest[start..].trim_ascii_end();
    let body_len = token.iter().take_while(|&&b| is_token68(b)).count();
    let padding = &token[body_len..];
    if body_len == 0 || padding.iter().any(|&b| b != b'=') {
        return Err(Malformed::Token);
    }
    // token68 is ASCII: the slice is valid UTF-8.
    std::str::from_utf8(token).map_err(|_| Malformed::Token)
}

/// The bearer token of a request: `Ok(None)` without an `Authorization` header, the token when
/// it is well formed, [`Malformed`] otherwise.
pub fn bearer(headers: &HeaderMap) -> Result<Option<&str>, Malformed> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Malformed::Duplicate);
    }
    parse(value.as_bytes()).map(Some)
}

#[cfg(test)]
mod tests {
    use super::{Malformed, bearer};
    use http::{HeaderMap, HeaderValue};

    fn of(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                "authorization",
                HeaderValue::from_bytes(v).expect("header value"),
            );
        }
        h
    }

    #[test]
    fn well_formed_bearers_are_read_whatever_the_case_and_whitespace() {
        for (value, token) in [
            (&b"Bearer abc.def-ghi_jkl"[..], "abc.def-ghi_jkl"),
            (b"bearer abc", "abc"),
            (b"BEARER abc", "abc"),
            (b"Bearer\tabc", "abc"),
            (b"Bearer  \t abc  ", "abc"),
            (b"Bearer abc+/==", "abc+/=="),
        ] {
            assert_eq!(bearer(&of(&[value])), Ok(Some(token)), "{value:?}");
        }
        assert_eq!(bearer(&HeaderMap::new()), Ok(None));
    }

    #[test]
    fn anything_else_is_refused() {
        for (value, error) in [
            (&b"Basic dXNlcjpwYXNz"[..], Malformed::Scheme),
            (b"Token abc", Malformed::Scheme),
            (b"Bearerabc", Malformed::Scheme),
            (b"Bearer", Malformed::Token),
            (b"Bearer ", Malformed::Token),
            (b"Bearer a b", Malformed::Token),
            (b"Bearer a,b", Malformed::Token),
            (b"Bearer =abc", Malformed::Token),
            (b"Bearer abc=d", Malformed::Token),
            (b"Bearer \xc3\xa9", Malformed::Token),
            (b"", Malformed::Scheme),
        ] {
            assert_eq!(bearer(&of(&[value])), Err(error), "{value:?}");
        }
        assert_eq!(
            bearer(&of(&[b"Bearer a", b"Bearer a"])),
            Err(Malformed::Duplicate)
        );
    }
}
