//! The head rules both sides of the codec share: the framing headers of a head folded once
//! ([`FramingFields`], with a request's and an answer's rules as a parameter), and what a side
//! writes into a head beside the message's own headers ([`HeadEdits`]).

use http::{HeaderName, header};

pub use super::body::line;
use super::body::{content_length, tokens};

/// Whose head the framing headers are read for: the rules differ for `Transfer-Encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    /// A client's request: `chunked` alone and once, or the head is refused (the gateway frames
    /// the body again for its backend, so nothing else can be passed on).
    Request,
    /// A backend's answer: a coding other than `chunked` is refused (the gateway would hand the
    /// client coded bytes nothing marks as coded; nginx refuses it too); the fields' codings are
    /// one list and the last one decides (RFC 9110 §5.3, RFC 9112 §6.3).
    Answer,
}

/// The framing headers of a head (`Content-Length`, `Transfer-Encoding`, `Connection`), folded
/// as its fields are read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FramingFields {
    /// The length the `Content-Length`s state (they agree, or the head is refused).
    pub length: Option<u64>,
    /// Whether the length came as anything but one plain number (a list, or several fields):
    /// the head is passed on with the one number it means.
    pub restate_length: bool,
    /// `None` without a `Transfer-Encoding`; else whether the last coding is `chunked` (a
    /// request's is `Some(true)` once it names any coding).
    pub chunked: Option<bool>,
    /// A request's codings are not `chunked` alone and once: the head is refused for it.
    pub coded: bool,
    /// `Connection: close`.
    pub close: bool,
    /// `Connection: keep-alive`.
    pub keep_alive: bool,
}

impl FramingFields {
    /// Folds one field of the head (`raw`, its value) by `rules`; `Err` says why the head is
    /// refused.
    pub fn read(
        &mut self,
        name: &HeaderName,
        raw: &[u8],
        rules: Rules,
    ) -> Result<(), &'static str> {
        if name == header::CONTENT_LENGTH {
            self.restate_length |= self.length.is_some() || raw.contains(&b',');
            for part in raw.split(|b| *b == b',') {
                let n = content_length(part).ok_or("an invalid Content-Length")?;
                if self.length.is_some_and(|l| l != n) {
                    return Err("Content-Lengths that differ");
                }
                self.length = Some(n);
            }
        } else if name == header::TRANSFER_ENCODING {
            match rules {
                Rules::Request => {
                    for coding in tokens(raw) {
                        // `chunked` must be the one coding, once: anything else is refused.
                        if self.chunked.is_some() || !coding.eq_ignore_ascii_case(b"chunked") {
                            self.coded = true;
                        }
                        self.chunked = Some(true);
                    }
                    self.coded |= tokens(raw).next().is_none();
                }
                Rules::Answer => {
                    if tokens(raw).any(|c| !c.eq_ignore_ascii_case(b"chunked")) {
                        return Err("a transfer coding other than chunked");
                    }
                    // A field that names no coding changes nothing.
                    self.chunked = match tokens(raw).last() {
                        Some(coding) => Some(coding.eq_ignore_ascii_case(b"chunked")),
                        None => Some(self.chunked.unwrap_or(false)),
                    };
                }
            }
        } else if name == header::CONNECTION {
            for token in tokens(raw) {
                self.close |= token.eq_ignore_ascii_case(b"close");
                self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        }
        Ok(())
    }
}

/// Headers decided above the codec (an answer's stamps, a backend's view of a client's
/// request): which of the message's own headers are left out, and the lines written after them.
/// The codec asks and writes; it knows nothing of who decided.
pub trait HeadEdits: Sync + std::fmt::Debug {
    /// Whether the message's own header `name` (lower case) is left out.
    fn skips(&self, name: &str) -> bool;
    /// Writes the lines it adds (`name: value\r\n` each) into `out`.
    fn write_lines(&self, out: &mut Vec<u8>);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fold(fields: &[(&str, &str)], rules: Rules) -> Result<FramingFields, &'static str> {
        let mut folded = FramingFields::default();
        for (name, value) in fields {
            let name = HeaderName::from_bytes(name.as_bytes()).expect("a name");
            folded.read(&name, value.as_bytes(), rules)?;
        }
        Ok(folded)
    }

    #[test]
    fn lengths_fold_to_one_number_or_refuse_the_head_on_both_sides() {
        for rules in [Rules::Request, Rules::Answer] {
            let one = fold(&[("content-length", "5")], rules).expect("one");
            assert_eq!((one.length, one.restate_length), (Some(5), false));
            let listed = fold(
                &[("content-length", "5, 5"), ("content-length", "5")],
                rules,
            );
            let listed = listed.expect("the same length");
            assert_eq!((listed.length, listed.restate_length), (Some(5), true));
            assert_eq!(
                fold(&[("content-length", "5"), ("content-length", "6")], rules),
                Err("Content-Lengths that differ")
            );
            for bad in ["", "-1", "5 5", "0x5", "+5"] {
                assert_eq!(
                    fold(&[("content-length", bad)], rules),
                    Err("an invalid Content-Length"),
                    "{bad:?}"
                );
            }
            let connection = fold(&[("connection", "Keep-Alive, ,close")], rules).expect("ok");
            assert!(connection.close && connection.keep_alive);
        }
    }

    #[test]
    fn a_request_may_name_chunked_alone_and_once_an_answer_chunked_last() {
        let request = |fields: &[(&str, &str)]| fold(fields, Rules::Request).expect("folded");
        let alone = request(&[("transfer-encoding", "Chunked")]);
        assert_eq!((alone.chunked, alone.coded), (Some(true), false));
        for coded in [
            &[("transfer-encoding", "gzip, chunked")][..],
            &[("transfer-encoding", "chunked, chunked")],
            &[
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "chunked"),
            ],
            &[("transfer-encoding", "")],
            &[("transfer-encoding", "gzip")],
        ] {
            assert!(request(coded).coded, "{coded:?}");
        }

        let answer = |fields: &[(&str, &str)]| fold(fields, Rules::Answer);
        assert_eq!(
            answer(&[("transfer-encoding", "gzip, chunked")]),
            Err("a transfer coding other than chunked")
        );
        let last = |fields| answer(fields).expect("folded").chunked;
        assert_eq!(last(&[("transfer-encoding", "chunked")]), Some(true));
        assert_eq!(
            last(&[("transfer-encoding", "chunked"), ("transfer-encoding", "")]),
            Some(true),
            "a field naming no coding changes nothing"
        );
        assert_eq!(last(&[("transfer-encoding", " , ")]), Some(false));
        assert_eq!(last(&[("content-length", "3")]), None);
    }
}
