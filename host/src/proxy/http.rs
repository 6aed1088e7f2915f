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
//! is a success; a call cut by the route's budget or by the client going away counts as neither
//! (the probe is given back).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::time::Instant;

use super::envelope::query_without_apikey;
use super::headers::{HOP_BY_HOP, connection_named};
use super::idle::{IdleBody, pump};
use crate::actor::Actor;
use crate::breaker::CircuitBreaker;
use crate::config::UpstreamsConfig;
use crate::error::GatewayError;

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

/// Removes the hop-by-hop headers of a backend's response.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named = connection_named(headers);
    // Most answers carry none: one pass over the names finds that without removing anything.
    if named.is_empty() && !headers.keys().any(|n| HOP_BY_HOP.contains(n)) {
        return;
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    for name in &named {
        headers.remove(name.as_str());
    }
}

/// Whether an answer of the backend counts as a breaker failure.
pub fn is_failure_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 502..=504)
}

/// The pooled HTTP client and its settings.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    idle: Duration,
    /// Dedicated PostgREST targets allowed (`upstreams.postgrest_allowed_targets`).
    pub postgrest_targets: Arc<super::targets::TargetAllowList>,
    /// Open WebSocket tunnels.
    pub tunnels: super::tunnels::Tunnels,
}

/// The backend URL of a request: `base` + `rest` + the query without `apikey`.
pub fn upstream_uri(base: &str, rest: &str, query: Option<&str>) -> Result<Uri, GatewayError> {
    let mut url = String::with_capacity(base.len() + rest.len() + 16);
    url.push_str(base.trim_end_matches('/'));
    if !rest.is_empty() && !rest.starts_with('/') {
        url.push('/');
    }
    url.push_str(rest);
    if let Some(q) = query_without_apikey(query) {
        url.push('?');
        url.push_str(&q);
    }
    url.parse().map_err(|_| {
        GatewayError::bad_request("invalid_path", "the request path cannot be forwarded")
    })
}

impl HttpTransport {
    /// Builds the pooled client: `http://` and `https://` backends (the public roots plus
    /// `upstreams.tls`).
    pub fn new(config: &UpstreamsConfig) -> Result<Self, crate::tls::TlsError> {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_millis(config.connect_timeout_ms)));
        connector.set_nodelay(true);
        connector.enforce_http(false);
        let tls = crate::tls::client_config("upstreams.tls", config.tls.as_ref(), true)?;
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(config.pool_max_idle_per_host)
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Ok(Self {
            client,
            idle: Duration::from_secs(config.stream_idle_timeout_secs),
            // Validated with the configuration.
            postgrest_targets: Arc::new(
                super::targets::TargetAllowList::parse(&config.postgrest_allowed_targets)
                    .unwrap_or_default(),
            ),
            tunnels: super::tunnels::Tunnels::default(),
        })
    }

    /// Forwards `request` to `uri` through `breaker`, until `deadline` for the response head.
    pub async fn forward(
        &self,
        breaker: &Arc<CircuitBreaker>,
        uri: Uri,
        mut request: Request,
        actor: &Actor,
        deadline: Instant,
    ) -> Result<Response, GatewayError> {
        let probe = breaker.try_acquire_probe().map_err(|r| {
            GatewayError::unavailable(
                "circuit_open",
                format!("the {} backend is failing; try again later", breaker.name()),
            )
            .retry_after(r.retry_after)
        })?;
        let upgrade = is_websocket_upgrade(request.headers());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
        let slot = request
            .extensions()
            .get::<super::tunnels::ConnectionSlot>()
            .cloned();
        let (parts, body) = request.into_parts();
        let mut headers = parts.headers;
        let upgrade_headers = upgrade.then(|| {
            (
                headers.get(header::UPGRADE).cloned(),
                HeaderValue::from_static("upgrade"),
            )
        });
        super::headers::for_http_backend(&mut headers, actor);
        if let Some((Some(upgrade_value), connection)) = upgrade_headers {
            headers.insert(header::UPGRADE, upgrade_value);
            headers.insert(header::CONNECTION, connection);
        }
        let mut upstream = http::Request::builder()
            .method(parts.method)
            .uri(uri)
            .body(if upgrade || http_body::Body::is_end_stream(&body) {
                // Nothing to send (or, for an upgrade, the bytes go through the tunnel).
                Body::empty()
            } else {
                Body::new(IdleBody::new(body, self.idle))
            })
            .map_err(|e| GatewayError::internal(format!("upstream request: {e}")))?;
        *upstream.headers_mut() = headers;

        let sent = tokio::time::timeout_at(deadline, self.client.request(upstream)).await;
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
            // The client's body went past its limit while streaming: the client's fault, not
            // the backend's; the probe goes back unconsumed.
            Ok(Err(e)) if super::is_body_limit(&e) => {
                drop(probe);
                return Err(GatewayError::payload_too_large(
                    "the request body is over the limit",
                ));
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
            let idle = self.idle;
            // The tunnel keeps its client connection's slot and ends within the shutdown grace.
            self.tunnels.spawn(slot, async move {
                match tokio::try_join!(client_upgrade, upstream_upgrade) {
                    Ok((client, upstream)) => {
                        pump(TokioIo::new(client), TokioIo::new(upstream), idle).await;
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

        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Ok(Response::from_parts(
            parts,
            Body::new(IdleBody::new(body, self.idle)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_join_base_and_rest_and_drop_the_key() {
        assert_eq!(
            upstream_uri("http://s:5000", "/object/a.png", Some("x=1&apikey=k")).expect("uri"),
            "http://s:5000/object/a.png?x=1"
        );
        assert_eq!(
            upstream_uri("http://s:5000/storage/v1/", "/object", None).expect("uri"),
            "http://s:5000/storage/v1/object"
        );
        assert_eq!(
            upstream_uri("http://pg:3000", "/todos", Some("select=*")).expect("uri"),
            "http://pg:3000/todos?select=*"
        );
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
