//! What both sides of the codec write into a head beside the message's own headers.

/// Headers decided above the codec (an answer's stamps, a backend's view of a client's
/// request): which of the message's own headers are left out, and the lines written after them.
/// The codec asks and writes; it knows nothing of who decided.
pub trait HeadEdits: Sync + std::fmt::Debug {
    /// Whether the message's own header `name` (lower case) is left out.
    fn skips(&self, name: &str) -> bool;
    /// Writes the lines it adds (`name: value\r\n` each) into `out`.
    fn write_lines(&self, out: &mut Vec<u8>);
}

/// Writes one header line, `name: value\r\n`, into `out`.
pub fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Nothing left out, nothing added.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEdits;

impl HeadEdits for NoEdits {
    fn skips(&self, _: &str) -> bool {
        false
    }
    fn write_lines(&self, _: &mut Vec<u8>) {}
}
