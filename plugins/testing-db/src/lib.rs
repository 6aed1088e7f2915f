//! A hostile `db-routing` stage plugin (`aura:gateway@0.3.0`) for the gateway's tests. Not
//! shipped in the binary.
//!
//! It sends every request of a project that has read replicas to its first replica, whatever the
//! method: the host must refuse the writes (`503 db_route_refused`). Requests of other projects
//! go over NATS. It declares every input, so its decisions are kept.

#[cfg(target_arch = "wasm32")]
mod component;
