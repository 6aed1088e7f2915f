//! The gateway's own HTTP/1.1 codec, both sides, over `httparse`: what a head and a body are on
//! the wire, and nothing of what the gateway does with them.
//!
//! - [`head`]: the rules both sides share: the framing headers folded once, a request's or an
//!   answer's rules as a parameter ([`head::FramingFields`]), what a side writes beside a
//!   message's own headers ([`head::HeadEdits`]), and how a header line is written;
//! - [`body`]: message framing (RFC 9112 §6, §7): the body decoder and the body encoder both
//!   sides drive, chunk sizes, the framing headers read;
//! - [`server`]: a client's request head parsed, an answer head encoded (the listener and the
//!   connection driver are `server/`'s);
//! - [`client`]: one connection to a backend: a request written, its answer read (the pool is
//!   `proxy/pool.rs`'s).
//!
//! Nothing here imports the phases, the planes or the proxy: what the gateway adds to a head is
//! given to the codec as a [`head::HeadEdits`].

pub mod body;
pub mod client;
pub mod head;
pub mod server;
