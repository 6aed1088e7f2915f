//! HTTP/1.1 message framing (RFC 9112 §6, §7), shared by both sides of the gateway's own codec:
//! a client's request bodies (`server/http1.rs`) and a backend's answers ([`super::client`]).
//!
//! A [`Decoder`] takes a body out of a read buffer as it fills, with no I/O of its own: the
//! side that owns the connection reads, the decoder says what the bytes are. Everything a peer
//! sends is bounded here — a chunk-size line of [`MAX_CHUNK_LINE`] bytes, chunk extensions and
//! trailers of [`MAX_CHUNK_EXTRAS`] bytes in all — and what is not well formed is refused
//! rather than guessed at: lines end at CRLF only, and a bare CR or LF (or a NUL) inside an
//! extension or a trailer is refused, since a peer that ends lines there would see the body
//! end elsewhere.
//!
//! An [`Encoder`] frames a body for the wire, with no I/O of its own either: both sides' writers
//! (an answer's body, `server/http1.rs`; a request's, [`super::client`]) hand it each data
//! frame and a write buffer, and it says which bytes the buffer holds and which the writer
//! writes on its own.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes, BytesMut};
use http::{HeaderMap, header};
use tokio::io::AsyncRead;

/// The longest chunk-size line (the size and its extensions).
pub const MAX_CHUNK_LINE: usize = 4 * 1024;
/// The most bytes of chunk extensions and trailers in one body, all counted.
pub const MAX_CHUNK_EXTRAS: usize = 16 * 1024;
/// How much room a read asks for at least.
pub const READ_CHUNK: usize = 8 * 1024;
/// A body read asks for this much room when the body is larger.
pub const BODY_READ_CHUNK: usize = 64 * 1024;

/// Body data up to this size is copied into the write buffer with what comes before it (a head,
/// a chunk-size line) and goes out in one write; larger data is written on its own, not copied.
/// The [`Encoder`] decides it for both sides' writers.
pub const COALESCE: usize = 16 * 1024;

/// Reads from `io` into `buf`, with room for at least `room` bytes (reserved when less than half
/// of it is free). Both sides read heads and bodies through it.
pub fn poll_fill<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
    room: usize,
) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < room / 2 {
        buf.reserve(room);
    }
    tokio_util::io::poll_read_buf(Pin::new(io), cx, buf)
}

/// How a message's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// This many bytes remain.
    Length(u64),
    /// Chunked coding, at this point of it.
    Chunked(Chunk),
    /// Everything until the peer closes the connection (answers only).
    UntilClose,
    /// The body has ended.
    Done,
}

impl Framing {
    /// A chunked body, before its first chunk.
    pub const CHUNKED: Self = Self::Chunked(Chunk::Size);
}

/// Where a chunked body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// This many bytes of the current chunk remain.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// The trailer section after the last chunk.
    Trailers,
}

/// What the buffered bytes are, to a [`Decoder`].
#[derive(Debug)]
pub enum Decoded {
    /// Body bytes (taken out of the buffer).
    Data(Bytes),
    /// The body has ended; the bytes after it stay in the buffer.
    End,
    /// More bytes are needed: read, with room for this many.
    More(usize),
    /// The bytes are not a body the gateway accepts; says why.
    Refused(&'static str),
}

/// A body being taken out of a read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoder {
    framing: Framing,
    /// Chunk extensions and trailer bytes read so far.
    extras: usize,
    /// How much of the buffer's front was searched for the line being waited for: bytes that
    /// trickle in are searched once, not once per read.
    scanned: usize,
}

impl Decoder {
    /// A body framed by `framing` (`Length(0)` is an ended body).
    pub fn new(framing: Framing) -> Self {
        let framing = if framing == Framing::Length(0) {
            Framing::Done
        } else {
            framing
        };
        Self {
            framing,
            extras: 0,
            scanned: 0,
        }
    }

    /// The framing left.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        self.framing == Framing::Done
    }

    /// The bytes left in the body, when its length is known.
    pub fn left(&self) -> Option<u64> {
        match self.framing {
            Framing::Length(n) => Some(n),
            Framing::Done => Some(0),
            _ => None,
        }
    }

    /// The connection ended with no more bytes: the end of a body that runs to it, else
    /// `false` (the body was cut).
    pub fn at_eof(&mut self) -> bool {
        match self.framing {
            Framing::UntilClose | Framing::Done => {
                self.framing = Framing::Done;
                true
            }
            _ => false,
        }
    }

    /// The body's next piece out of `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Decoded {
        loop {
            match self.framing {
                Framing::Done => return Decoded::End,
                Framing::Length(left) => {
                    if buf.is_empty() {
                        return Decoded::More(room_for(left));
                    }
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let left = left - take as u64;
                    self.framing = if left == 0 {
                        Framing::Done
                    } else {
                        Framing::Length(left)
                    };
                    return Decoded::Data(buf.split_to(take).freeze());
                }
                Framing::UntilClose => {
                    if buf.is_empty() {
                        return Decoded::More(BODY_READ_CHUNK);
                    }
                    return Decoded::Data(buf.split().freeze());
                }
                Framing::Chunked(chunk) => match self.step_chunked(chunk, buf) {
                    Step::Next(next) => self.framing = next,
                    Step::Data(data, next) => {
                        self.framing = next;
                        return Decoded::Data(data);
                    }
                    Step::More(room) => return Decoded::More(room),
                    Step::Refused(why) => return Decoded::Refused(why),
                },
            }
        }
    }

    /// One step of chunked decoding over what is buffered.
    fn step_chunked(&mut self, chunk: Chunk, buf: &mut BytesMut) -> Step {
        match chunk {
            Chunk::Size => {
                let Some(end) = self.find_line(buf, MAX_CHUNK_LINE) else {
                    return if buf.len() >= MAX_CHUNK_LINE {
                        Step::Refused("a chunk-size line over 4 KiB")
                    } else {
                        Step::More(READ_CHUNK)
                    };
                };
                let (size, extension) = match chunk_size(&buf[..end]) {
                    Ok(parsed) => parsed,
                    Err(why) => return Step::Refused(why),
                };
                self.extras += extension;
                if self.extras > MAX_CHUNK_EXTRAS {
                    return Step::Refused("chunk extensions and trailers over 16 KiB");
                }
                buf.advance(end + 2);
                Step::Next(if size == 0 {
                    Framing::Chunked(Chunk::Trailers)
                } else {
                    Framing::Chunked(Chunk::Data(size))
                })
            }
            Chunk::Data(left) => {
                if buf.is_empty() {
                    return Step::More(room_for(left));
                }
                let take = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                let left = left - take as u64;
                let next = if left == 0 {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(left)
                };
                Step::Data(buf.split_to(take).freeze(), Framing::Chunked(next))
            }
            Chunk::DataEnd => {
                if buf.len() < 2 {
                    return Step::More(READ_CHUNK);
                }
                if &buf[..2] != b"\r\n" {
                    return Step::Refused("a chunk's data not followed by CRLF");
                }
                buf.advance(2);
                Step::Next(Framing::Chunked(Chunk::Size))
            }
            Chunk::Trailers => {
                let room = MAX_CHUNK_EXTRAS.saturating_sub(self.extras);
                let Some(end) = self.find_line(buf, room + 2) else {
                    return if buf.len() >= room + 2 {
                        Step::Refused("chunk extensions and trailers over 16 KiB")
                    } else {
                        Step::More(READ_CHUNK)
                    };
                };
                // A bare CR or LF ends the line for a peer that reads a lone LF (or CR) as a
                // line end (RFC 9112 §2.2): the body would end at another place for it.
                if buf[..end].iter().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
                    return Step::Refused("a bare CR or LF, or a NUL, in a trailer");
                }
                buf.advance(end + 2);
                if end == 0 {
                    return Step::Next(Framing::Done);
                }
                // A trailer field: read and dropped (the gateway forwards none).
                self.extras += end + 2;
                if self.extras > MAX_CHUNK_EXTRAS {
                    return Step::Refused("chunk extensions and trailers over 16 KiB");
                }
                Step::Next(Framing::Chunked(Chunk::Trailers))
            }
        }
    }
}

impl Decoder {
    /// The end of the line at the buffer's front (its CRLF's position) within its first
    /// `within` bytes; the bytes searched are not searched again while the line is waited for.
    fn find_line(&mut self, buf: &[u8], within: usize) -> Option<usize> {
        let window = &buf[..buf.len().min(within)];
        let from = self.scanned.saturating_sub(1).min(window.len());
        match window[from..].windows(2).position(|w| w == b"\r\n") {
            Some(at) => {
                self.scanned = 0;
                Some(from + at)
            }
            None => {
                self.scanned = window.len();
                None
            }
        }
    }
}

enum Step {
    /// Go on with this framing.
    Next(Framing),
    /// Body bytes, and the framing after them.
    Data(Bytes, Framing),
    /// More bytes are needed; room to ask for.
    More(usize),
    Refused(&'static str),
}

/// The room a read asks for when `left` bytes of data remain.
fn room_for(left: u64) -> usize {
    usize::try_from(left)
        .unwrap_or(usize::MAX)
        .clamp(READ_CHUNK, BODY_READ_CHUNK)
}

/// A chunk-size line (without its CRLF): the size and the extension's length.
fn chunk_size(line: &[u8]) -> Result<(u64, usize), &'static str> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err("a chunk-size line without a size");
    }
    if digits > 16 {
        return Err("a chunk size over 64 bits");
    }
    let mut size = 0u64;
    for &b in &line[..digits] {
        let value = (b as char).to_digit(16).map_or(0, u64::from);
        size = size << 4 | value;
    }
    let rest = &line[digits..];
    // Whitespace may come before an extension (`BWS ";"`); nothing else may follow the size.
    let after_space = rest
        .iter()
        .position(|b| *b != b' ' && *b != b'\t')
        .unwrap_or(rest.len());
    match rest.get(after_space) {
        None if after_space == 0 => Ok((size, 0)),
        None => Err("whitespace after a chunk size"),
        Some(b';') => {
            if rest.iter().any(|b| *b == b'\r' || *b == b'\n' || *b == 0) {
                return Err("a control character in a chunk extension");
            }
            Ok((size, rest.len()))
        }
        Some(_) => Err("a chunk size followed by something other than an extension"),
    }
}

/// A `Content-Length` value: digits only (after optional whitespace), at most 19 of them.
pub fn content_length(value: &[u8]) -> Option<u64> {
    let value = value.trim_ascii();
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// Appends a chunk-size line for `len` bytes of data (hex digits and CRLF), with no allocation.
fn put_chunk_size(out: &mut Vec<u8>, len: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    let mut n = len;
    loop {
        at -= 1;
        digits[at] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

/// How an [`Encoder`] frames a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frames {
    /// A `Content-Length` body: this many bytes remain.
    Length(u64),
    /// Chunked coding.
    Chunked,
    /// The data as it is: the body ends with the connection.
    UntilClose,
}

/// A body being framed into a write buffer, frame by frame: both sides' writers drive it. Data
/// up to [`COALESCE`] bytes is copied into the buffer with its framing; larger data is left to
/// the writer, which writes the buffer, then the data, then what [`Encoded::apart`] gives. A
/// writer that writes each frame as it comes ([`Encoder::at_once`]) has a frame copied only to
/// join its chunk framing: a frame with none is left to it whatever its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoder {
    frames: Frames,
    at_once: bool,
}

/// What [`Encoder::data`] did with a data frame.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    /// `None`: the data and its framing are in the buffer. `Some(after)`: the data is over
    /// [`COALESCE`] bytes (or has no framing, for a writer [`Encoder::at_once`]) and was not
    /// copied; the buffer holds what goes before it (its
    /// chunk-size line), and the writer writes the buffer, the data, then `after` (the chunk's
    /// CRLF, or nothing).
    pub apart: Option<&'static [u8]>,
    /// The data was more than the body's length left: it was cut to that (what fits is framed
    /// as above), and the body is over its length.
    pub over: bool,
}

/// A `Content-Length` body that ended before its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Short;

impl Encoder {
    /// A body of `n` bytes, sent after a `Content-Length: n`.
    pub fn length(n: u64) -> Self {
        Self {
            frames: Frames::Length(n),
            at_once: false,
        }
    }

    /// A chunked body, sent after a `Transfer-Encoding: chunked`.
    pub fn chunked() -> Self {
        Self {
            frames: Frames::Chunked,
            at_once: false,
        }
    }

    /// A body sent as it is, ended by closing the connection.
    pub fn until_close() -> Self {
        Self {
            frames: Frames::UntilClose,
            at_once: false,
        }
    }

    /// For a writer that writes each frame at once, the buffer holding nothing else: a frame
    /// without framing (a length-framed body's) is never copied, only written.
    pub fn at_once(self) -> Self {
        Self {
            at_once: true,
            ..self
        }
    }

    /// Frames `data` after what `out` holds: its chunk-size line when chunked, then the data and
    /// the chunk's CRLF when it is [`COALESCE`] bytes or fewer; else the data is left to the
    /// writer ([`Encoded::apart`]). Data over the length left is cut to it ([`Encoded::over`]).
    /// Empty data adds nothing (an empty chunk would end the body).
    pub fn data(&mut self, out: &mut Vec<u8>, data: &mut Bytes) -> Encoded {
        let mut over = false;
        if let Frames::Length(left) = &mut self.frames {
            if data.len() as u64 > *left {
                // More than its length says: what fits is framed, the rest is not the body's.
                data.truncate(*left as usize);
                over = true;
            }
            *left -= data.len() as u64;
        }
        if data.is_empty() {
            return Encoded { apart: None, over };
        }
        let after: &'static [u8] = if self.frames == Frames::Chunked {
            put_chunk_size(out, data.len());
            &b"\r\n"[..]
        } else {
            &b""[..]
        };
        if data.len() > COALESCE || (self.at_once && after.is_empty()) {
            return Encoded {
                apart: Some(after),
                over,
            };
        }
        out.extend_from_slice(data);
        out.extend_from_slice(after);
        Encoded { apart: None, over }
    }

    /// Ends the body after what `out` holds: a chunked body's last chunk and `trailers` (their
    /// lines as a head's), nothing otherwise (the trailers of a body not chunked are dropped).
    /// `Err` when a `Content-Length` body is short of its length; nothing is added then.
    pub fn end(self, out: &mut Vec<u8>, trailers: Option<&HeaderMap>) -> Result<(), Short> {
        match self.frames {
            Frames::Length(0) | Frames::UntilClose => Ok(()),
            Frames::Length(_) => Err(Short),
            Frames::Chunked => {
                out.extend_from_slice(b"0\r\n");
                for (name, value) in trailers.into_iter().flatten() {
                    line(out, name.as_str().as_bytes(), value.as_bytes());
                }
                out.extend_from_slice(b"\r\n");
                Ok(())
            }
        }
    }
}

/// Writes one header line, `name: value\r\n`, into `out` (a head's, or a chunked body's
/// trailer).
pub fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The comma-separated tokens of a header value, trimmed, empty ones left out.
pub fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Whether a `Connection` header of `headers` has `token`.
pub fn has_token(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| tokens(v.as_bytes()).any(|t| t.eq_ignore_ascii_case(token.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes all of `wire` fed `step` bytes at a time: the body, or why it was refused.
    fn decode_all(framing: Framing, wire: &[u8], step: usize) -> Result<(Vec<u8>, usize), String> {
        let mut decoder = Decoder::new(framing);
        let mut buf = BytesMut::new();
        let mut fed = 0;
        let mut body = Vec::new();
        loop {
            match decoder.decode(&mut buf) {
                Decoded::Data(d) => body.extend_from_slice(&d),
                Decoded::End => return Ok((body, buf.len() + wire.len() - fed)),
                Decoded::More(room) => {
                    assert!(room >= READ_CHUNK, "room {room}");
                    if fed == wire.len() {
                        return if decoder.at_eof() {
                            Ok((body, 0))
                        } else {
                            Err("cut".into())
                        };
                    }
                    let n = step.min(wire.len() - fed);
                    buf.extend_from_slice(&wire[fed..fed + n]);
                    fed += n;
                }
                Decoded::Refused(why) => return Err(why.into()),
            }
        }
    }

    #[test]
    fn bodies_are_decoded_whatever_the_bytes_arrive_in() {
        let chunked = b"5;ext=1\r\nhello\r\n1 ; x\r\n!\r\n0\r\ntrailer: t\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, 64] {
            let (body, rest) = decode_all(Framing::CHUNKED, chunked, step).expect("chunked");
            assert_eq!(body, b"hello!", "step {step}");
            assert_eq!(rest, 4, "the next message's bytes stay, step {step}");
            let (body, rest) = decode_all(Framing::Length(5), b"helloNEXT", step).expect("length");
            assert_eq!((body.as_slice(), rest), (b"hello".as_slice(), 4));
            let (body, _) = decode_all(Framing::UntilClose, b"to the end", step).expect("close");
            assert_eq!(body, b"to the end");
        }
        assert_eq!(
            decode_all(Framing::Length(0), b"x", 1).expect("empty").0,
            b""
        );
    }

    #[test]
    fn malformed_or_oversized_chunking_is_refused_and_a_cut_body_is_seen() {
        let cases: [(&[u8], &str); 6] = [
            (b"zz\r\n", "a chunk-size line without a size"),
            (b"11111111111111111\r\n", "a chunk size over 64 bits"),
            (
                b"5 x\r\nhello\r\n0\r\n\r\n",
                "a chunk size followed by something other than an extension",
            ),
            (b"5 \r\nhello\r\n0\r\n\r\n", "whitespace after a chunk size"),
            (
                b"5\r\nhelloXX0\r\n\r\n",
                "a chunk's data not followed by CRLF",
            ),
            (
                b"5;a\nb\r\nhello\r\n0\r\n\r\n",
                "a control character in a chunk extension",
            ),
        ];
        for (wire, why) in cases {
            assert_eq!(decode_all(Framing::CHUNKED, wire, 3), Err(why.to_string()));
        }
        // A trailer line with a lone LF or CR: a peer that ends lines there sees the body end
        // at the empty line after it, and the next request in what follows.
        for wire in [
            &b"0\r\nX: a\n\r\nGET /admin HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"0\r\n\nGET /admin HTTP/1.1\r\nHost: a\r\n\r\n",
            b"0\r\nX: a\rb\r\n\r\n",
            b"0\r\nX: a\x00\r\n\r\n",
        ] {
            for step in [1, 4, wire.len()] {
                assert_eq!(
                    decode_all(Framing::CHUNKED, wire, step),
                    Err("a bare CR or LF, or a NUL, in a trailer".into()),
                    "{wire:?}, {step} bytes at a time"
                );
            }
        }
        let long_line = [b"1;".as_slice(), &[b'x'; MAX_CHUNK_LINE]].concat();
        assert_eq!(
            decode_all(Framing::CHUNKED, &long_line, 512),
            Err("a chunk-size line over 4 KiB".into())
        );
        let mut trailers = b"0\r\n".to_vec();
        for _ in 0..1000 {
            trailers.extend_from_slice(b"x-trailer: 0123456789\r\n");
        }
        assert_eq!(
            decode_all(Framing::CHUNKED, &trailers, 4096),
            Err("chunk extensions and trailers over 16 KiB".into())
        );
        assert_eq!(
            decode_all(Framing::Length(10), b"short", 2),
            Err("cut".into())
        );
        assert_eq!(
            decode_all(Framing::CHUNKED, b"5\r\nhel", 2),
            Err("cut".into())
        );
    }

    #[test]
    fn chunk_size_lines_are_hex_and_decode_back() {
        for len in [
            0usize,
            1,
            9,
            10,
            15,
            16,
            255,
            4096,
            65_535,
            1 << 20,
            usize::MAX,
        ] {
            let mut out = Vec::new();
            put_chunk_size(&mut out, len);
            assert_eq!(out, format!("{len:x}\r\n").into_bytes(), "{len}");
            assert_eq!(chunk_size(&out[..out.len() - 2]), Ok((len as u64, 0)));
        }
    }

    /// Writes `frames` through `encoder` as both sides' writers do, then its end: the bytes on
    /// the wire, whether a frame was over the length (writing stops there), and the end.
    fn encode_all(
        mut encoder: Encoder,
        frames: &[&[u8]],
        trailers: Option<&HeaderMap>,
    ) -> (Vec<u8>, bool, Result<(), Short>) {
        let mut out = Vec::new();
        let mut wire = Vec::new();
        for frame in frames {
            let mut data = Bytes::copy_from_slice(frame);
            let encoded = encoder.data(&mut out, &mut data);
            if let Some(after) = encoded.apart {
                assert!(data.len() > COALESCE, "{} bytes left apart", data.len());
                wire.append(&mut out);
                wire.extend_from_slice(&data);
                out.extend_from_slice(after);
            }
            if encoded.over {
                wire.append(&mut out);
                return (wire, true, Ok(()));
            }
        }
        let end = encoder.end(&mut out, trailers);
        wire.append(&mut out);
        (wire, false, end)
    }

    #[test]
    fn chunked_bodies_are_framed_small_frames_in_the_buffer_large_ones_apart() {
        let large = vec![b'L'; COALESCE + 1];
        let full = vec![b'F'; COALESCE];
        let frames: [&[u8]; 5] = [b"hello ", b"", &large, &full, b"world"];
        let (wire, over, end) = encode_all(Encoder::chunked(), &frames, None);
        assert!(!over);
        assert_eq!(end, Ok(()));
        let mut expected = b"6\r\nhello \r\n4001\r\n".to_vec();
        expected.extend_from_slice(&large);
        expected.extend_from_slice(b"\r\n4000\r\n");
        expected.extend_from_slice(&full);
        expected.extend_from_slice(b"\r\n5\r\nworld\r\n0\r\n\r\n");
        assert_eq!(wire, expected);
        let (body, rest) = decode_all(Framing::CHUNKED, &wire, 4096).expect("decodes back");
        assert_eq!(body, frames.concat());
        assert_eq!(rest, 0);

        // A large frame: its size line joins what the buffer holds, its CRLF is the caller's.
        let mut encoder = Encoder::chunked();
        let mut out = b"HEAD".to_vec();
        let mut data = Bytes::from(large);
        let encoded = encoder.data(&mut out, &mut data);
        assert_eq!(
            encoded,
            Encoded {
                apart: Some(&b"\r\n"[..]),
                over: false
            }
        );
        assert_eq!(out, b"HEAD4001\r\n");
        assert_eq!(data.len(), COALESCE + 1, "not cut");
        // Trailers follow the last chunk as header lines.
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", http::HeaderValue::from_static("abc"));
        let (wire, _, end) = encode_all(Encoder::chunked(), &[b"x"], Some(&trailers));
        assert_eq!(end, Ok(()));
        assert_eq!(wire, b"1\r\nx\r\n0\r\nx-checksum: abc\r\n\r\n");
    }

    #[test]
    fn length_bodies_are_sent_as_they_are_and_checked_against_their_length() {
        let large = vec![b'L'; COALESCE + 1];
        let exact = encode_all(Encoder::length(5), &[b"he", b"", b"llo"], None);
        assert_eq!(exact, (b"hello".to_vec(), false, Ok(())));
        let (wire, over, _) = encode_all(Encoder::length(large.len() as u64), &[&large], None);
        assert_eq!((wire, over), (large.clone(), false));
        // Over: what fits is framed, the frame says the body is over.
        let over = encode_all(Encoder::length(5), &[b"hel", b"lo!!"], None);
        assert_eq!(over, (b"hello".to_vec(), true, Ok(())));
        let over = encode_all(Encoder::length(2), &[b"ab", b"c"], None);
        assert_eq!(over, (b"ab".to_vec(), true, Ok(())));
        let mut encoder = Encoder::length(COALESCE as u64 + 1);
        let mut out = Vec::new();
        let mut data = Bytes::from([large.as_slice(), b"more"].concat());
        let encoded = encoder.data(&mut out, &mut data);
        assert_eq!(
            encoded,
            Encoded {
                apart: Some(&b""[..]),
                over: true
            }
        );
        assert!(out.is_empty());
        assert_eq!(data, large, "cut to the length");
        // Short: the end says so and adds nothing; trailers of a body not chunked are dropped.
        let mut trailers = HeaderMap::new();
        trailers.insert("x-t", http::HeaderValue::from_static("1"));
        let short = encode_all(Encoder::length(5), &[b"abc"], Some(&trailers));
        assert_eq!(short, (b"abc".to_vec(), false, Err(Short)));
        let exact = encode_all(Encoder::length(3), &[b"abc"], Some(&trailers));
        assert_eq!(exact, (b"abc".to_vec(), false, Ok(())));
        let until_close = encode_all(Encoder::until_close(), &[b"abc", &large], Some(&trailers));
        assert_eq!(
            until_close,
            ([b"abc".as_slice(), &large].concat(), false, Ok(()))
        );
    }

    #[test]
    fn a_writer_at_once_has_a_frame_copied_only_to_join_its_chunk_framing() {
        let mut out = Vec::new();
        let mut length = Encoder::length(5).at_once();
        let mut data = Bytes::from_static(b"hello");
        let encoded = length.data(&mut out, &mut data);
        assert_eq!((encoded.apart, encoded.over), (Some(&b""[..]), false));
        assert!(
            out.is_empty(),
            "nothing copied: the writer writes the data itself"
        );
        assert_eq!(&data[..], b"hello");
        assert_eq!(length.end(&mut out, None), Ok(()));

        let mut chunked = Encoder::chunked().at_once();
        let mut data = Bytes::from_static(b"hello");
        let encoded = chunked.data(&mut out, &mut data);
        assert_eq!(encoded.apart, None);
        assert_eq!(out, b"5\r\nhello\r\n", "joined with its size line and CRLF");
    }

    #[test]
    fn an_empty_body_is_its_end_alone() {
        assert_eq!(
            encode_all(Encoder::chunked(), &[b""], None),
            (b"0\r\n\r\n".to_vec(), false, Ok(()))
        );
        assert_eq!(
            encode_all(Encoder::length(0), &[b""], None),
            (Vec::new(), false, Ok(()))
        );
        assert_eq!(
            encode_all(Encoder::length(0), &[b"x"], None),
            (Vec::new(), true, Ok(()))
        );
        assert_eq!(
            encode_all(Encoder::until_close(), &[], None),
            (Vec::new(), false, Ok(()))
        );
    }

    #[test]
    fn lengths_are_digits_only_and_tokens_are_trimmed() {
        assert_eq!(content_length(b" 42 "), Some(42));
        for bad in [
            &b""[..],
            b"-1",
            b"+1",
            b"1 2",
            b"0x10",
            b"99999999999999999999",
        ] {
            assert_eq!(content_length(bad), None, "{bad:?}");
        }
        let found: Vec<&[u8]> = tokens(b" keep-alive ,, Upgrade").collect();
        assert_eq!(found, [b"keep-alive".as_slice(), b"Upgrade"]);
    }
}
