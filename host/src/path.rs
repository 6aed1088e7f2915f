//! Request path normalisation, done once before routing: routing, public-path matching, the
//! policy stages and the proxies all see the same path, and no backend ever receives a path that
//! means something else to it than it meant to the gateway.
//!
//! In order:
//! 1. refused (`400 invalid_path`): a path that does not start with `/`, holds a malformed
//!    percent-escape, an encoded `/` (`%2F`), an encoded or literal `\` (`%5C`), an encoded
//!    NUL or other control character, or an encoded dot segment (`%2e`, `.%2E`, `%2e%2e`, …);
//! 2. percent-encoded unreserved characters (`A–Z a–z 0–9 - . _ ~`) are decoded and the other
//!    escapes written in upper case (RFC 3986 §6.2.2.1–2);
//! 3. empty segments are merged (`//` → `/`; a trailing `/` is kept);
//! 4. dot segments are removed (RFC 3986 §5.2.4); a `..` that would climb into the first two
//!    segments (`/v1/{service}`, the prefix that picks the backend) or above the root is
//!    refused, and so is a dot segment with parameters (`..;x`, `.;`, `..%3B`), which backends
//!    that strip path parameters read as `..`.
//!
//! The result never holds `.` or `..` segments, `//`, `%2F`, `%5C` or an encoded dot; normalising
//! it again gives it back unchanged.

use std::borrow::Cow;

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Not an origin-form path (`/…`).
    #[error("the path must start with /")]
    NotAbsolute,
    /// `%` not followed by two hex digits.
    #[error("the path holds a malformed percent-escape")]
    BadEscape,
    /// `%2F`: a slash the router and the backend would read differently.
    #[error("the path holds an encoded /")]
    EncodedSlash,
    /// `\` or `%5C`: a separator on some backends.
    #[error("the path holds a backslash")]
    Backslash,
    /// An escaped control character (`%00`–`%1F`, `%7F`).
    #[error("the path holds an encoded control character")]
    EncodedControl,
    /// A dot segment written with escapes (`%2e%2e`).
    #[error("the path holds an encoded dot segment")]
    EncodedDotSegment,
    /// `..` climbing into the service prefix or above the root.
    #[error("the path climbs above its service prefix")]
    Climbs,
    /// A dot segment with parameters (`..;x`, `.;`, `..%3B`): a `..` to backends that strip
    /// path parameters (Tomcat, Jetty, Spring), a name to the gateway.
    #[error("the path holds a dot segment with parameters (..;)")]
    DotSegmentParameters,
}

/// Segments that a `..` may never pop: `/v1/{service}` decides the backend.
const FIXED_SEGMENTS: usize = 2;

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Decodes the escapes of one segment that stand for unreserved characters, upper-cases the
/// others, and checks what must be refused.
fn segment(raw: &str, out: &mut String) -> Result<(), PathError> {
    let bytes = raw.as_bytes();
    let mut i = 0;
    let mut escaped_dot = false;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let (Some(h), Some(l)) = (
                    bytes.get(i + 1).copied().and_then(hex),
                    bytes.get(i + 2).copied().and_then(hex),
                ) else {
                    return Err(PathError::BadEscape);
                };
                let b = h << 4 | l;
                match b {
                    b'/' => return Err(PathError::EncodedSlash),
                    b'\\' => return Err(PathError::Backslash),
                    0..=0x1f | 0x7f => return Err(PathError::EncodedControl),
                    b'.' => {
                        escaped_dot = true;
                        out.push('.');
                    }
                    b if is_unreserved(b) => out.push(char::from(b)),
                    b => {
                        const HEX: &[u8; 16] = b"0123456789ABCDEF";
                        out.push('%');
                        out.push(char::from(HEX[usize::from(b >> 4)]));
                        out.push(char::from(HEX[usize::from(b & 0xf)]));
                    }
                }
                i += 3;
            }
            b'\\' => return Err(PathError::Backslash),
            _ => {
                // Copy the run up to the next escape or backslash as is.
                let end = bytes[i..]
                    .iter()
                    .position(|&b| b == b'%' || b == b'\\')
                    .map_or(bytes.len(), |p| i + p);
                out.push_str(&raw[i..end]);
                i = end;
            }
        }
    }
    if escaped_dot {
        let written = out.rsplit('/').next().unwrap_or_default();
        if written == "." || written == ".." {
            return Err(PathError::EncodedDotSegment);
        }
    }
    Ok(())
}

/// Whether `path` is already in normal form (the common case: nothing to allocate): absolute,
/// with no escape, no backslash, no empty segment inside (`//`) and no `.` or `..` segment.
/// One pass over the bytes.
fn is_normal(path: &str) -> bool {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return false;
    }
    let is_dots = |segment: &[u8]| {
        segment == b"."
            || segment == b".."
            || segment.starts_with(b".;")
            || segment.starts_with(b"..;")
    };
    // Where the segment being read starts.
    let mut start = 1;
    for (i, &b) in bytes.iter().enumerate().skip(1) {
        match b {
            b'%' | b'\\' => return false,
            b'/' => {
                if i == start || is_dots(&bytes[start..i]) {
                    return false;
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    !is_dots(&bytes[start..])
}

/// Whether a (decoded) segment is `.` or `..` followed by path parameters (`;…`, `%3B…`).
fn is_dot_with_parameters(segment: &str) -> bool {
    let rest = segment
        .strip_prefix("..")
        .or_else(|| segment.strip_prefix('.'))
        .unwrap_or(segment);
    rest.len() < segment.len() && (rest.starts_with(';') || rest.starts_with("%3B"))
}

/// The normal form of a request path (without its query), or why it is refused.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    if is_normal(path) {
        return Ok(Cow::Borrowed(path));
    }
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let trailing_slash = path.len() > 1 && path.ends_with('/');
    // Segments written so far, as ranges of `out` (after the leading `/`).
    let mut out = String::with_capacity(path.len());
    let mut kept: Vec<usize> = Vec::new();
    let mut last_was_dot = false;
    for raw in path[1..].split('/') {
        if raw.is_empty() {
            // `//` merged; a trailing empty segment is restored below.
            continue;
        }
        let start = out.len();
        out.push('/');
        segment(raw, &mut out)?;
        let written = &out[start + 1..];
        last_was_dot = false;
        if is_dot_with_parameters(written) {
            return Err(PathError::DotSegmentParameters);
        }
        if written == "." {
            out.truncate(start);
            last_was_dot = true;
        } else if written == ".." {
            out.truncate(start);
            last_was_dot = true;
            if kept.len() <= FIXED_SEGMENTS {
                return Err(PathError::Climbs);
            }
            let popped = kept.pop().unwrap_or(0);
            out.truncate(popped);
        } else {
            kept.push(start);
        }
    }
    // `/a/b/.` and `/a/b/..` name a folder: they end with a slash (RFC 3986 §5.2.4).
    if (trailing_slash || last_was_dot) || out.is_empty() {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::{PathError, normalize};

    fn ok(path: &str) -> String {
        normalize(path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .into_owned()
    }

    #[test]
    fn normal_paths_are_kept_without_copying() {
        for p in [
            "/",
            "/health",
            "/v1/db/todos",
            "/v1/storage/object/a.png",
            "/v1/db/x/",
        ] {
            assert!(
                matches!(normalize(p), Ok(std::borrow::Cow::Borrowed(_))),
                "{p}"
            );
        }
    }

    /// [`super::is_normal`] said plainly: what its one pass must agree with.
    fn normal_by_definition(path: &str) -> bool {
        path.starts_with('/')
            && !path.contains(['%', '\\'])
            && !path.contains("//")
            && !path
                .split('/')
                .skip(1)
                .any(|s| s == "." || s == ".." || s.starts_with(".;") || s.starts_with("..;"))
    }

    #[test]
    fn dot_segments_with_parameters_are_refused() {
        for p in [
            "/v1/storage/..;/x",
            "/v1/storage/object/..;jsessionid=1/secret",
            "/v1/db/.;/todos",
            "/v1/db/a/..%3b/b",
            "/v1/db/a/%2e%2e;/b",
        ] {
            assert!(normalize(p).is_err(), "{p}");
        }
        assert_eq!(
            normalize("/v1/storage/..;/x"),
            Err(PathError::DotSegmentParameters)
        );
        // Parameters elsewhere, and dots that are names, are kept.
        assert_eq!(ok("/v1/db/a;b/c"), "/v1/db/a;b/c");
        assert_eq!(ok("/v1/db/...;x"), "/v1/db/...;x");
        assert_eq!(ok("/v1/db/.x;y"), "/v1/db/.x;y");
    }

    #[test]
    fn the_one_pass_normal_form_test_agrees_with_its_definition_on_every_short_path() {
        let alphabet = ['/', '.', 'a', '%', '\\'];
        let mut paths = vec![String::new()];
        let mut normal = 0;
        for _ in 0..7 {
            paths = paths
                .iter()
                .flat_map(|p| alphabet.iter().map(move |c| format!("{p}{c}")))
                .collect();
            for path in &paths {
                let expected = normal_by_definition(path);
                assert_eq!(super::is_normal(path), expected, "{path:?}");
                normal += usize::from(expected);
            }
        }
        assert!(normal > 300, "{normal} normal paths tried");
    }

    #[test]
    fn slashes_are_merged_and_dot_segments_removed() {
        assert_eq!(ok("/v1/db//sql"), "/v1/db/sql");
        assert_eq!(ok("//v1//db///sql"), "/v1/db/sql");
        assert_eq!(ok("/v1/db/./sql"), "/v1/db/sql");
        assert_eq!(ok("/v1/./db/sql"), "/v1/db/sql");
        assert_eq!(ok("/v1/storage/object/a/../b"), "/v1/storage/object/b");
        assert_eq!(ok("/v1/storage/object/./../x"), "/v1/storage/x");
        assert_eq!(ok("/v1/db/todos/"), "/v1/db/todos/");
        assert_eq!(ok("/v1/db/todos/."), "/v1/db/todos/");
        assert_eq!(ok("/v1/db/a/b/.."), "/v1/db/a/");
    }

    #[test]
    fn unreserved_escapes_are_decoded_and_others_upper_cased() {
        assert_eq!(ok("/v1/db/%73ql"), "/v1/db/sql");
        assert_eq!(ok("/v1/db/%7e%2D%5f"), "/v1/db/~-_");
        assert_eq!(ok("/v1/storage/a%20b%3a"), "/v1/storage/a%20b%3A");
        assert_eq!(ok("/v1/storage/%C3%A9"), "/v1/storage/%C3%A9");
        assert_eq!(ok("/v1/storage/a%2eb"), "/v1/storage/a.b");
    }

    #[test]
    fn attacks_are_refused() {
        for (path, error) in [
            ("/v1/db/../tenant-victim/todos", PathError::Climbs),
            ("/v1/db/..", PathError::Climbs),
            ("/v1/../health", PathError::Climbs),
            ("/..", PathError::Climbs),
            (
                "/v1/storage/object/%2e%2e/secret",
                PathError::EncodedDotSegment,
            ),
            (
                "/v1/storage/object/.%2E/secret",
                PathError::EncodedDotSegment,
            ),
            (
                "/v1/storage/object/%2e/secret",
                PathError::EncodedDotSegment,
            ),
            ("/v1/storage/object/..%2fsecret", PathError::EncodedSlash),
            ("/v1/storage/object/a%2Fb", PathError::EncodedSlash),
            ("/v1/storage/object/a%5cb", PathError::Backslash),
            ("/v1/storage/object/a\\b", PathError::Backslash),
            ("/v1/storage/object/a%00", PathError::EncodedControl),
            ("/v1/storage/%zz", PathError::BadEscape),
            ("/v1/storage/%4", PathError::BadEscape),
            ("v1/db", PathError::NotAbsolute),
            ("*", PathError::NotAbsolute),
        ] {
            assert_eq!(normalize(path), Err(error), "{path}");
        }
    }

    #[test]
    fn normalising_twice_changes_nothing() {
        for p in [
            "/v1/db//sql",
            "/v1/storage/a/./b/../c/",
            "/v1/storage/a%20b%3a",
            "/v1/db/%73ql/..",
        ] {
            let once = ok(p);
            assert_eq!(ok(&once), once, "{p}");
        }
    }
}
