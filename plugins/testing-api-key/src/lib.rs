//! An `api-key` stage plugin written against `aura:gateway@0.3.0`, for the gateway's tests that
//! a module of that version still loads, its declaration read with the four flags `0.3.0` had.
//! Not shipped in the binary.
//!
//! It reads the `apikey` header, declares `path`, `query-keys` and `headers` (a decision kept
//! per path), and answers: the header's key as `present` for both roles; a key in the query
//! alone as `present` for `anon` on `/v1/realtime/websocket` and refused on any other path;
//! `absent` otherwise. Each call writes one `log` line (the `0.3.0` import).

#[cfg(target_arch = "wasm32")]
mod component;
