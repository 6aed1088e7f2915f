//! HTTP backends on one pooled client: storage (streamed both ways), realtime (REST, SSE and
//! WebSocket upgrades) and dedicated PostgREST targets.
//!
//! Bodies stream in both directions without buffering. Hop-by-hop headers are removed both ways
//! (except the upgrade handshake of a WebSocket). The backend receives the actor as
//! `x-aura-role`, `x-aura-project`, `x-aura-user-id`, `x-aura-org-role`, the request id as
//! `x-request-id`, and the original `Authorization`.
//!
//! Breaker outcomes: a connection failure, a broken exchange, or a `502`, `503` or `504` from the
//! backend count as failures; any other answer (including `500`, which is the backend answering)
//! is a success; a call cut by the route's budget, by the client going away, or by the client's
//! own body failing (broken framing, over its limit, idle, a length that differs from its
//! `Content-Length`) counts as neither: the probe is given back, and the client is answered
//! `400`/`408`/`413`. Only what the backend did counts against a breaker every tenant shares.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::headers::{HOP_BY_HOP, connection_named, is_hop_by_hop};
use super::idle::{IdleBody, pump};
use super::pool::{Backend, Pools};
use crate::actor::Actor;
use crate::breaker::CircuitBreaker;
use crate::config::UpstreamsConfig;
use crate::error::GatewayError;
use crate::routes::{SERVICES, Service, Transport};

/// Whether the request asks for a WebSocket upgrade.
pub fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|c| c.trim().eq_ignore_ascii_case("upgrade"));
    let upgrade_ws = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    connection_upgrade && upgrade_ws
}

/// Whether `headers` ask for a WebSocket upgrade the route takes (`websocket`); refused
/// (`400`) when they ask for any upgrade elsewhere, or for one with a request body: a
/// connection is turned into a tunnel only on the realtime WebSocket route, from a handshake
/// that carries nothing after its head.
fn upgrade_of(headers: &HeaderMap, websocket: bool) -> Result<bool, GatewayError> {
    if !headers.contains_key(header::UPGRADE) {
        return Ok(false);
    }
    let asks = is_websocket_upgrade(headers);
    if !asks {
        // An `Upgrade` the request does not ask for in `Connection` (or not to WebSocket) is
        // the hop's own header, dropped like the others: the request goes as a plain one.
        return Ok(false);
    }
    if !websocket {
        return Err(GatewayError::bad_request(
            "upgrade_refused",
            format!(
                "a WebSocket upgrade is taken only on {}",
                crate::routes::WEBSOCKET_PATH
            ),
        ));
    }
    let declares_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .any(|v| v.as_bytes() != b"0");
    if declares_body {
        return Err(GatewayError::bad_request(
            "upgrade_refused",
            "a WebSocket handshake carries no body",
        ));
    }
    Ok(true)
}

/// Removes the hop-by-hop headers of a backend's response.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named = connection_named(headers);
    // Most answers carry none: one pass over the names finds that without removing anything.
    if named.is_empty() && !headers.keys().any(|n| is_hop_by_hop(n.as_str())) {
        return;
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    for name in &named {
        headers.remove(name.as_str());
    }
}

/// The answer to a request whose body failed on its way to the backend: `413` past its limit,
/// `408` when the client stopped sending, `400` otherwise (broken framing, a length that
/// differs from its `Content-Length`, a client gone — who then reads no answer).
fn client_body_error(error: &super::pool::UpstreamError) -> GatewayError {
    if super::is_body_limit(error) {
        return GatewayError::payload_too_large("the request body is over the limit");
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    // The innermost error says what was wrong with the body (its framing, its length).
    let mut innermost: &(dyn std::error::Error + 'static) = error;
    while let Some(err) = source {
        if err.is::<super::idle::IdleTimeout>() {
            return GatewayError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                "the request body stopped arriving",
                crate::error::Side::Client,
            );
        }
        innermost = err;
        source = err.source();
    }
    GatewayError::bad_request("invalid_body", innermost.to_string())
}

/// Whether an answer of the backend counts as a breaker failure.
pub fn is_failure_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 502..=504)
}

/// The backends' connection pools and their settings.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    pools: Arc<Pools>,
    /// The backend of each service reached over HTTP whose `upstreams.{name}_url` is set,
    /// indexed by [`Service::index`].
    backends: Box<[Option<Backend>]>,
    idle: Duration,
    /// Dedicated PostgREST targets allowed (`upstreams.postgrest_allowed_targets`).
    pub postgrest_targets: Arc<super::targets::TargetAllowList>,
    /// Open WebSocket tunnels.
    pub tunnels: super::tunnels::Tunnels,
    /// Each listener's budget of long-lived exchanges (`server.max_streams`): data, management.
    streams: [StreamBudget; 2],
    /// The timers of the calls' deadlines, moved from call to call.
    deadlines: Arc<crate::deadline::Timers>,
}

/// One listener's budget of long-lived exchanges: a request to an HTTP backend holds a place
/// from before its backend connection is made until its answer's body (or its tunnel) ends, so
/// that an HTTP/2 connection multiplexing streams cannot hold more backend connections than
/// the budget whatever `server.max_connections` says.
#[derive(Debug, Clone)]
struct StreamBudget {
    places: Arc<tokio::sync::Semaphore>,
    size: usize,
    refused: prometheus::IntCounter,
}

impl StreamBudget {
    fn new(size: usize, plane: crate::plane::Plane, metrics: &crate::metrics::Metrics) -> Self {
        Self {
            places: Arc::new(tokio::sync::Semaphore::new(size)),
            size,
            refused: metrics.streams_refused.with_label_values(&[plane.as_str()]),
        }
    }

    fn take(&self) -> Result<tokio::sync::OwnedSemaphorePermit, GatewayError> {
        self.places.clone().try_acquire_owned().map_err(|_| {
            self.refused.inc();
            GatewayError::unavailable(
                "too_many_streams",
                "this listener has its most long-lived exchanges open (server.max_streams); retry shortly",
            )
            .retry_after(Duration::from_secs(1))
        })
    }
}

impl HttpTransport {
    /// The backend of `service`, when it is reached over HTTP and its URL is configured.
    pub fn backend(&self, service: Service) -> Option<&Backend> {
        self.backends.get(service.index())?.as_ref()
    }

    /// The pools of the configured backends, dialing `http://` and `https://` (the public roots
    /// plus `upstreams.tls`), their names resolved by `resolver` (never on a blocking thread);
    /// `opened` counts the connections they open, by backend.
    pub fn new(
        config: &UpstreamsConfig,
        max_streams: usize,
        metrics: &crate::metrics::Metrics,
        resolver: &crate::dns::Resolver,
    ) -> Result<Self, crate::tls::TlsError> {
        let opened = metrics.upstream_connections_opened.clone();
        let mut connector = HttpConnector::new_with_resolver(resolver.for_backends());
        connector.set_connect_timeout(Some(Duration::from_millis(config.connect_timeout_ms)));
        connector.set_nodelay(true);
        connector.enforce_http(false);
        let tls = crate::tls::client_config("upstreams.tls", config.tls.as_ref(), true)?;
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let pools = Pools::new(connector, config.pool_max_idle_per_host, opened);
        pools.spawn_sweeper();
        Ok(Self {
            // Validated with the configuration.
            backends: SERVICES
                .iter()
                .map(|row| {
                    let base = config
                        .url_of(row.name)
                        .filter(|_| row.transport == Transport::Http);
                    base.and_then(|base| pools.configured(row.name, base))
                })
                .collect(),
            pools,
            idle: Duration::from_secs(config.stream_idle_timeout_secs),
            postgrest_targets: Arc::new(
                super::targets::TargetAllowList::parse(&config.postgrest_allowed_targets)
                    .unwrap_or_default(),
            ),
            tunnels: super::tunnels::Tunnels::default(),
            streams: [
                StreamBudget::new(max_streams, crate::plane::Plane::Data, metrics),
                StreamBudget::new(max_streams, crate::plane::Plane::Management, metrics),
            ],
            deadlines: Arc::default(),
        })
    }

    /// Long-lived exchanges open now on `plane`'s listener.
    pub fn streams_open(&self, plane: crate::plane::Plane) -> usize {
        let budget = &self.streams[usize::from(plane == crate::plane::Plane::Management)];
        budget.size - budget.places.available_permits()
    }

    /// The backend of a dedicated PostgREST target (checked against the allow-list first).
    pub fn postgrest(&self, base: &str) -> Result<Backend, GatewayError> {
        self.pools.named("postgrest", base)
    }

    /// Forwards `request` to `uri` (origin form) of `backend` through `breaker`, until
    /// `deadline` for the response head. `websocket`: the route takes a WebSocket upgrade
    /// (anywhere else one is refused).
    #[expect(
        clippy::too_many_arguments,
        reason = "one call site, each a distinct input"
    )]
    pub async fn forward(
        &self,
        breaker: &Arc<CircuitBreaker>,
        backend: &Backend,
        uri: Uri,
        mut request: Request,
        actor: &Actor,
        deadline: Instant,
        websocket: bool,
    ) -> Result<Response, GatewayError> {
        let upgrade = upgrade_of(request.headers(), websocket)?;
        // Before the breaker and the backend: a request over the budget costs neither.
        let place =
            self.streams[usize::from(actor.plane == crate::plane::Plane::Management)].take()?;
        let probe = breaker.try_acquire_probe().map_err(|r| {
            GatewayError::unavailable(
                "circuit_open",
                format!("the {} backend is failing; try again later", breaker.name()),
            )
            .retry_after(r.retry_after)
        })?;
        let client_upgrade = upgrade.then(|| super::tunnels::ClientUpgrade::of(&mut request));
        let slot = request
            .extensions()
            .get::<super::tunnels::ConnectionSlot>()
            .cloned();
        let (parts, body) = request.into_parts();
        let mut headers = parts.headers;
        // A handshake goes through hyper's client, which sends the map: it is rewritten. Any
        // other request's map stays as the client sent it, and its head is written as the
        // backend receives it.
        let backend_headers = if upgrade {
            let upgrade_value = headers.get(header::UPGRADE).cloned();
            super::headers::for_http_backend(&mut headers, actor);
            // A handshake has no body (refused above when it declares one): a length kept
            // here would have the backend read the tunnel's first bytes as the body.
            headers.remove(header::CONTENT_LENGTH);
            if let Some(upgrade_value) = upgrade_value {
                headers.insert(header::UPGRADE, upgrade_value);
                headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            }
            None
        } else {
            Some(super::headers::HttpBackendHeaders::new(&headers, actor))
        };
        // Made from its parts, not with `http::request::Builder`, whose checks the method, the
        // target and the headers already passed.
        let mut upstream =
            http::Request::new(if upgrade || http_body::Body::is_end_stream(&body) {
                // Nothing to send (or, for an upgrade, the bytes go through the tunnel).
                Body::empty()
            } else {
                Body::new(IdleBody::new(body, self.idle))
            });
        *upstream.method_mut() = parts.method;
        *upstream.uri_mut() = uri;
        *upstream.headers_mut() = headers;

        // The answer's body streams (from its pooled connection) under the idle limit.
        let idle = self.idle;
        // The place goes with the answer's body (held until it is done or dropped), or with
        // the tunnel of an upgrade.
        let mut place = Some(place);
        let sent = if upgrade {
            // Boxed: a rare case whose state would make every request's future larger.
            self.deadlines
                .run_until(deadline, Box::pin(backend.pool.send_upgrade(upstream)))
                .await
                .map(|r| r.map(|response| response.map(|b| Body::new(IdleBody::new(b, idle)))))
        } else {
            let place = place.take();
            self.deadlines
                .run_until(
                    deadline,
                    backend.pool.send(upstream, backend_headers.as_ref()),
                )
                .await
                .map(|r| {
                    r.map(|response| {
                        response.map(|b| Body::new(IdleBody::new(b, idle).holding(place)))
                    })
                })
        };
        let mut response = match sent {
            // The budget ran out: delivery unknown, the probe goes back unconsumed.
            Err(_) => {
                drop(probe);
                return Err(GatewayError::timeout(
                    "upstream_timeout",
                    format!(
                        "the {} backend did not answer within the route's budget",
                        breaker.name()
                    ),
                ));
            }
            // The client's body failed (over its limit, broken framing, idle, cut): the
            // client's fault, not the backend's. The probe goes back unconsumed, so no client
            // can open a breaker that every tenant shares by sending broken bodies.
            Ok(Err(e)) if e.is_client() => {
                drop(probe);
                return Err(client_body_error(&e));
            }
            Ok(Err(e)) => {
                probe.record_failure();
                let code = if e.is_connect() {
                    "upstream_unreachable"
                } else {
                    "upstream_error"
                };
                tracing::warn!(backend = breaker.name(), error = %e, "HTTP backend failed");
                return Err(GatewayError::bad_gateway(
                    code,
                    format!("the {} backend could not be reached", breaker.name()),
                ));
            }
            Ok(Ok(response)) => response,
        };
        if is_failure_status(response.status()) {
            probe.record_failure();
        } else {
            probe.record_success();
        }

        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            let Some(client_upgrade) = client_upgrade else {
                return Err(GatewayError::bad_gateway(
                    "upstream_error",
                    "the backend switched protocols unasked",
                ));
            };
            let upstream_upgrade = hyper::upgrade::on(&mut response);
            // The tunnel keeps its client connection's slot and ends within the shutdown grace.
            self.tunnels.spawn(slot, place.take(), async move {
                let upstream_upgrade = async { upstream_upgrade.await.map_err(|e| e.to_string()) };
                match tokio::try_join!(client_upgrade, upstream_upgrade) {
                    Ok((client, upstream)) => {
                        pump(client, TokioIo::new(upstream), idle).await;
                    }
                    Err(e) => tracing::debug!(error = %e, "WebSocket upgrade did not complete"),
                }
            });
            let (parts, _) = response.into_parts();
            let mut out = Response::from_parts(parts, Body::empty());
            // The handshake's own Connection/Upgrade headers are kept for the client.
            out.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            return Ok(out);
        }

        if let Some(place) = place {
            // An upgrade the backend refused: its answer's body holds the place.
            response = response.map(|body| Body::new(super::Holding::new(body, place)));
        }
        strip_hop_by_hop(response.headers_mut());
        // Room for the phases' headers at once, instead of the map growing twice on their way.
        response
            .headers_mut()
            .reserve(crate::headers::ANSWER_HEADERS);
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_service_reached_over_http_has_a_url_key_and_only_those_get_a_backend() {
        let config = UpstreamsConfig {
            storage_url: Some("http://127.0.0.1:9/storage/v1".into()),
            realtime_url: Some("http://127.0.0.1:9".into()),
            ..UpstreamsConfig::default()
        };
        for row in &SERVICES {
            if row.transport == Transport::Http {
                assert!(config.has_url_for(row.name), "upstreams.{}_url", row.name);
            }
        }
        let metrics = crate::metrics::Metrics::new();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _entered = runtime.enter();
        let transport = HttpTransport::new(&config, 8, &metrics, &crate::dns::Resolver::system())
            .expect("transport");
        for service in Service::all() {
            assert_eq!(
                transport.backend(service).is_some(),
                service.row().transport == Transport::Http,
                "{service:?}"
            );
        }
    }

    #[test]
    fn hop_by_hop_headers_of_an_answer_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        let untouched = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, untouched);
        h.insert(header::CONNECTION, HeaderValue::from_static("x-hop, close"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        strip_hop_by_hop(&mut h);
        assert_eq!(h, untouched);
        h.insert(header::TRAILER, HeaderValue::from_static("x-sum"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h, untouched);
    }

    #[tokio::test]
    async fn a_failed_client_body_is_answered_by_what_failed_and_always_as_the_clients() {
        use super::super::pool::UpstreamError;
        use crate::http1::client::WireError;
        use http_body_util::BodyExt as _;
        let body = |e: Box<dyn std::error::Error + Send + Sync>| {
            client_body_error(&UpstreamError::Client(WireError::Body(e)))
        };
        let idle = body(Box::new(super::super::idle::IdleTimeout(
            Duration::from_secs(300),
        )));
        assert_eq!((idle.status.as_u16(), idle.code), (408, "body_timeout"));
        let over = http_body_util::Limited::new(
            http_body_util::Full::new(bytes::Bytes::from_static(b"abc")),
            1,
        );
        let limit = body(over.collect().await.expect_err("over its limit"));
        assert_eq!(
            (limit.status.as_u16(), limit.code),
            (413, "payload_too_large")
        );
        let framing = body(Box::new(std::io::Error::other(
            "a chunk-size line without a size",
        )));
        assert_eq!(
            (framing.status.as_u16(), framing.code),
            (400, "invalid_body")
        );
        assert!(
            framing.message.contains("chunk-size"),
            "{}",
            framing.message
        );
        let length = client_body_error(&UpstreamError::Client(WireError::BodyLength));
        assert_eq!((length.status.as_u16(), length.code), (400, "invalid_body"));
        for e in [idle, limit, framing, length] {
            assert_eq!(e.side, crate::error::Side::Client, "{e}");
        }
    }

    #[test]
    fn upgrades_are_recognised() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(is_websocket_upgrade(&h));
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        assert!(!is_websocket_upgrade(&h));
    }
}
