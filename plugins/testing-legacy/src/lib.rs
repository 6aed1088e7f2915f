//! A `cors` stage plugin written against `aura:gateway@0.2.0`, for the gateway's tests that
//! plugins of every accepted version load and answer. Not shipped in the binary.
//!
//! It allows every origin by echoing it, exposes `x-testing-legacy`, and writes one `log` line
//! per call (the `0.2.0` import).

#[cfg(target_arch = "wasm32")]
mod component;
