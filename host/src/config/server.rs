//! `[server]`: listener and HTTP settings, shared by both planes.

use serde::{Deserialize, Serialize};

use super::{ConfigError, problem};

/// Listener and HTTP settings, shared by both planes.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Largest request body accepted on the NATS routes, in bytes (413 above).
    pub max_body_bytes: usize,
    /// Time allowed to receive a request's headers, a new connection's first byte, and the next
    /// request on a keep-alive connection (slowloris and idle guard), in milliseconds.
    pub header_read_timeout_ms: u64,
    /// An HTTP/1.1 keep-alive connection with no request in progress for this long releases its
    /// HTTP state (hyper's read and write buffers, the room for a request) and waits for the
    /// client's next bytes with its socket alone; the next request starts a new HTTP/1.1
    /// connection on the same socket. In milliseconds; 0: never released. Plain-text
    /// listeners only (a TLS connection keeps its state). A released connection is still
    /// closed `header_read_timeout_ms` after its last answer.
    pub idle_release_ms: u64,
    /// An HTTP/1.1 client that reads none of its answer for this long is gone: its
    /// connection is closed (and the backend exchange the answer streams from with it), in
    /// milliseconds. On HTTP/2, a stream whose client makes no room for its answer's next
    /// frame for this long loses its backend exchange (the connection goes on). Counted per
    /// write or frame: a client reading slowly but steadily is not cut.
    pub send_timeout_ms: u64,
    /// Open connections accepted per listener; further connections wait in the backlog.
    pub max_connections: usize,
    /// Requests processed at once per listener (up to their response head); past it a request
    /// is answered `503 overloaded` with `Retry-After` at once instead of queueing.
    pub max_in_flight: usize,
    /// On SIGINT/SIGTERM, how long in-flight requests may take to finish, in seconds.
    pub shutdown_grace_secs: u64,
    /// On SIGTERM, how long the instance keeps serving while `/ready` answers `503`, before
    /// the listeners stop accepting (so that load balancers stop sending first), in seconds.
    /// SIGINT does not wait.
    pub drain_delay_secs: u64,
    /// Serve HTTP/2 with prior knowledge (h2c) on the plain-text listeners, besides HTTP/1.1
    /// (for internal hops: load balancers and meshes speaking h2c). Off: HTTP/1.1 only.
    pub http2: bool,
    /// HTTP/2 streams one connection may have open at once (advertised in SETTINGS; a stream
    /// past it is refused by the protocol). Every stream is a request and counts against
    /// `max_in_flight` too.
    pub http2_max_concurrent_streams: u32,
    /// Largest request head accepted, in bytes: the HTTP/1.1 request line and headers
    /// (`431` above), the decoded HTTP/2 header list (the stream is refused above).
    pub max_header_bytes: u32,
    /// How often the listeners' certificate files are checked for a change, in milliseconds
    /// (SIGHUP reloads them at once).
    pub tls_watch_interval_ms: u64,
    /// An HTTP/2 connection with no stream open for this long is closed (GOAWAY), in
    /// milliseconds. Frames without a stream (PING) do not keep it open. Its first stream must
    /// start within `header_read_timeout_ms` of the accept, like an HTTP/1.1 request.
    pub http2_idle_timeout_ms: u64,
    /// How often the gateway PINGs an HTTP/2 client, in milliseconds; a client that does not
    /// answer within `http2_keep_alive_timeout_ms` is gone and its connection (with its
    /// streams) is closed. 0: no PINGs.
    pub http2_keep_alive_interval_ms: u64,
    /// How long an HTTP/2 client has to answer a PING, in milliseconds.
    pub http2_keep_alive_timeout_ms: u64,
    /// Long-lived exchanges open at once per listener, whatever the protocol: streamed bodies
    /// to and from HTTP backends (storage, realtime SSE and REST, PostgREST) and WebSocket
    /// tunnels. Past it, such a request is answered `503 too_many_streams` with `Retry-After`
    /// before any backend connection is made (an HTTP/2 connection multiplexes up to
    /// `http2_max_concurrent_streams` of them). None: `max_connections`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_streams: Option<usize>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 10 * 1024 * 1024,
            header_read_timeout_ms: 10_000,
            idle_release_ms: 1_000,
            send_timeout_ms: 60_000,
            max_connections: 20_000,
            max_in_flight: 10_000,
            shutdown_grace_secs: 30,
            drain_delay_secs: 0,
            http2: true,
            http2_max_concurrent_streams: 100,
            max_header_bytes: 64 * 1024,
            tls_watch_interval_ms: 2_000,
            http2_idle_timeout_ms: 60_000,
            http2_keep_alive_interval_ms: 20_000,
            http2_keep_alive_timeout_ms: 10_000,
            max_streams: None,
        }
    }
}

impl ServerConfig {
    /// `max_streams`, or `max_connections` when unset.
    pub fn stream_budget(&self) -> usize {
        self.max_streams.unwrap_or(self.max_connections)
    }

    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        let within = |field, value, low, high| super::within(key, field, value, low, high);
        let at_least = |field, value, min| super::at_least(key, field, value, min);
        let at_most = |field, value, max| super::at_most(key, field, value, max);
        within(
            "tls_watch_interval_ms",
            self.tls_watch_interval_ms,
            100,
            3_600_000,
        )?;
        at_least("max_body_bytes", self.max_body_bytes as u64, 1)?;
        at_least("header_read_timeout_ms", self.header_read_timeout_ms, 1)?;
        at_most("idle_release_ms", self.idle_release_ms, 3_600_000)
            .map_err(super::noted("0: never release"))?;
        within("send_timeout_ms", self.send_timeout_ms, 1, 3_600_000)?;
        at_least("max_connections", self.max_connections as u64, 1)?;
        at_least("max_in_flight", self.max_in_flight as u64, 1)?;
        within(
            "http2_max_concurrent_streams",
            u64::from(self.http2_max_concurrent_streams),
            1,
            10_000,
        )?;
        within(
            "max_header_bytes",
            u64::from(self.max_header_bytes),
            8192,
            1 << 20,
        )?;
        at_least("http2_idle_timeout_ms", self.http2_idle_timeout_ms, 1)?;
        if self.http2_keep_alive_interval_ms > 0 && self.http2_keep_alive_timeout_ms == 0 {
            return Err(problem(
                &format!("{key}.http2_keep_alive_timeout_ms"),
                "must be at least 1 while http2_keep_alive_interval_ms is on",
            ));
        }
        if let Some(streams) = self.max_streams {
            at_least("max_streams", streams as u64, 1)?;
        }
        at_most("drain_delay_secs", self.drain_delay_secs, 3_600)
            .map_err(super::noted("an hour"))?;
        Ok(())
    }
}
