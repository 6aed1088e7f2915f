//! JSON text as serde_json writes it: strings escaped (`\"`, `\\`, the short forms of
//! `\b \f \n \r \t`, `\u00xx` for the other control characters; everything else as it is,
//! UTF-8 included), looked at eight bytes at a time so that a string with nothing to escape, the
//! usual one, is copied whole. Used by the NATS envelope and the access log.

/// Whether a JSON string must escape `b`: a control character, `"` or `\\`.
pub fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Whether any byte of `bytes` needs escaping, eight bytes at a time ([`escape_lanes`]).
pub fn any_needs_escape(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let v = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        if escape_lanes(v) != 0 {
            return true;
        }
    }
    chunks.remainder().iter().any(|&b| needs_escape(b))
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Not zero when a byte of the eight in `v` is below 0x20, `"` or `\\`: such a byte sets
/// the high bit of its lane (the usual "has a byte less than n" test; a lane above a set
/// one may be set too, which does not change the answer).
fn escape_lanes(v: u64) -> u64 {
    let below = |v: u64, n: u64| v.wrapping_sub(ONES * n) & !v & HIGH;
    below(v, 0x20)
        | below(v ^ (ONES * u64::from(b'"')), 1)
        | below(v ^ (ONES * u64::from(b'\\')), 1)
}

/// Whether any byte of `bytes` needs escaping or is beyond ASCII (its high bit set), eight
/// bytes at a time as in [`any_needs_escape`].
pub fn any_needs_escape_or_is_not_ascii(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let v = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        if escape_lanes(v) | (v & HIGH) != 0 {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| needs_escape(b) || !b.is_ascii())
}

/// `s` as a JSON string: copied whole when no byte needs escaping, else escaped the way
/// serde_json escapes (`\"`, `\\`, the short forms of `\b \f \n \r \t`, `\u00xx` for the
/// other control characters; everything else as it is, UTF-8 included).
pub fn string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    string_body(out, s);
    out.push(b'"');
}

/// `s`'s characters as a JSON string holds them, without the quotes: copied whole when no byte
/// needs escaping.
pub fn string_body(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    if any_needs_escape(bytes) {
        escaped(out, bytes);
    } else {
        out.extend_from_slice(bytes);
    }
}

/// `bytes` with every byte [`needs_escape`] names escaped.
fn escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !needs_escape(b) {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]),
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eight_byte_escape_scan_agrees_with_the_byte_test_everywhere() {
        for b in 0..=255u8 {
            for at in 0..17 {
                // Around it: bytes that never need escaping, high ones included.
                for filler in [b'a', 0x7f, 0x80, 0xff, b'!', b'#', b'[', b']'] {
                    let mut bytes = [filler; 17];
                    bytes[at] = b;
                    assert_eq!(
                        any_needs_escape(&bytes),
                        needs_escape(b),
                        "byte {b:#04x} at {at} among {filler:#04x}"
                    );
                }
            }
        }
        assert!(!any_needs_escape(b""));
        // The header values' scan: the same, and any byte beyond ASCII, among ASCII fillers.
        for b in 0..=255u8 {
            for at in 0..17 {
                for filler in [b'a', 0x7f, b'!', b'#', b'[', b']', b' ', b'~'] {
                    let mut bytes = [filler; 17];
                    bytes[at] = b;
                    assert_eq!(
                        any_needs_escape_or_is_not_ascii(&bytes),
                        needs_escape(b) || !b.is_ascii(),
                        "byte {b:#04x} at {at} among {filler:#04x}"
                    );
                }
            }
        }
        assert!(!any_needs_escape_or_is_not_ascii(b""));
    }
}
