//! Envelope over NATS request/reply, with the contract's delivery rules.
//!
//! - The whole call, including the wait for a send slot, runs inside the route's deadline.
//! - While the connection is down, requests fail fast (503) instead of being queued by the
//!   client and sent after the caller was already answered.
//! - A request is replayed only after a no-responders answer, the one proof that nobody got it;
//!   never after a timeout or any reply. Replays are bounded in number and by the deadline.

use std::sync::Arc;
use std::time::Duration;

use async_nats::connection::State as ConnState;
use async_nats::{Client, ConnectOptions, Event, RequestErrorKind, Subject};
use bytes::Bytes;
use tokio::time::Instant;

use super::envelope::{EnvelopeRequest, Reply, parse_reply};
use crate::config::NatsConfig;
use crate::error::GatewayError;
use crate::routes::Service;

/// Why a NATS request got no usable reply. What the service's breaker makes of it follows from
/// the kind ([`NatsError::counts_against_the_service`]), not from an error code.
#[derive(Debug)]
pub enum NatsError {
    /// The connection is down: nothing was sent.
    Disconnected,
    /// No responders after the replays: the service is not there.
    NoResponders,
    /// No reply within the budget: delivery unknown, the request may be running.
    Timeout,
    /// The request is too large for the server: the caller's fault.
    TooLarge(String),
    /// The reply is not an envelope of the contract's shape.
    BadReply(GatewayError),
    /// The request failed in the client in another way.
    Failed(String),
    /// The gateway's own fault (encoding, subject).
    Internal(String),
}

impl NatsError {
    /// Whether the failure is the service's (a breaker failure); `false` when it says nothing
    /// about the service — a timeout (delivery unknown), the caller's or the gateway's fault —
    /// and the breaker's probe goes back unconsumed.
    pub fn counts_against_the_service(&self) -> bool {
        match self {
            NatsError::Disconnected
            | NatsError::NoResponders
            | NatsError::BadReply(_)
            | NatsError::Failed(_) => true,
            NatsError::Timeout | NatsError::TooLarge(_) | NatsError::Internal(_) => false,
        }
    }

    /// The answer to the client.
    pub fn into_gateway_error(self, service: Service) -> GatewayError {
        let name = service.name();
        match self {
            NatsError::Disconnected => GatewayError::unavailable(
                "backend_unavailable",
                format!("the {name} service cannot be reached (NATS connection down)"),
            )
            .retry_after(Duration::from_secs(1)),
            NatsError::NoResponders => GatewayError::unavailable(
                "no_responders",
                format!("no {name} service instance is available"),
            )
            .retry_after(Duration::from_secs(1)),
            NatsError::Timeout => GatewayError::timeout(
                "upstream_timeout",
                format!("the {name} service did not answer within the route's budget"),
            ),
            NatsError::TooLarge(message) => GatewayError::payload_too_large(message),
            NatsError::BadReply(error) => error,
            NatsError::Failed(reason) => GatewayError::bad_gateway(
                "backend_error",
                format!("the request to the {name} service failed: {reason}"),
            ),
            NatsError::Internal(message) => GatewayError::internal(message),
        }
    }
}

/// The seed URLs of `nats.url` (comma-separated): the client tries them in turn and learns
/// the rest of the cluster from the servers.
pub fn servers(url: &str) -> Vec<String> {
    url.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

/// TLS and credentials of the NATS connection.
async fn connect_options(config: &NatsConfig) -> anyhow::Result<ConnectOptions> {
    crate::tls::install_crypto_provider();
    let mut options = ConnectOptions::new();
    if let Some(tls) = &config.tls {
        options = options.require_tls(true);
        if let Some(ca) = &tls.ca_file {
            options = options.add_root_certificates(ca.into());
        }
        if let Some((cert, key)) = tls.cert_file.as_ref().zip(tls.key_file.as_ref()) {
            options = options.add_client_certificate(cert.into(), key.into());
        }
    }
    if let Some(user) = &config.user {
        options =
            options.user_and_password(user.clone(), config.password.clone().unwrap_or_default());
    }
    if let Some(token) = &config.token {
        options = options.token(token.clone());
    }
    if let Some(seed) = &config.nkey_seed {
        options = options.nkey(seed.clone());
    }
    if let Some(path) = &config.credentials_file {
        options = options
            .credentials_file(path)
            .await
            .map_err(|e| anyhow::anyhow!("nats.credentials_file: {path}: {e}"))?;
    }
    Ok(options)
}

/// The subject of `service`'s requests: `{prefix}.{service}.http` (CONTRACT §4).
pub fn subject(prefix: &str, service: Service) -> String {
    format!("{prefix}.{}.http", service.name())
}

/// The NATS transport shared by every NATS route.
#[derive(Debug, Clone)]
pub struct NatsTransport {
    client: Client,
    /// Each service's subject, indexed by [`Service::index`]: made once, shared per request
    /// (a `Subject` is reference-counted bytes).
    subjects: Arc<[Subject]>,
    retries: u32,
    backoff: Duration,
    /// The timers of the calls' deadlines, moved from call to call.
    deadlines: Arc<crate::deadline::Timers>,
}

impl NatsTransport {
    /// Starts connecting and waits at most `connect_timeout_ms` for the first connection; past
    /// that the connection is (re)established in the background and requests fail fast while
    /// it is down.
    pub async fn connect(config: &NatsConfig) -> anyhow::Result<Self> {
        let client = connect_options(config)
            .await?
            .name("aura-gateway")
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_millis(config.connect_timeout_ms))
            .event_callback(|event| async move {
                match event {
                    Event::Connected => tracing::info!("nats connected"),
                    Event::Disconnected => tracing::warn!("nats disconnected"),
                    Event::ClientError(e) => tracing::warn!(error = %e, "nats client error"),
                    Event::ServerError(e) => tracing::warn!(error = %e, "nats server error"),
                    other => tracing::debug!(event = %other, "nats event"),
                }
            })
            .connect(servers(&config.url))
            .await
            .map_err(|e| anyhow::anyhow!("nats.url: {e}"))?;
        // Give the first connection a chance before serving, so that a gateway started next to
        // a healthy NATS does not answer its first requests with 503.
        let waited = tokio::time::Instant::now();
        let patience = Duration::from_millis(config.connect_timeout_ms);
        while client.connection_state() != ConnState::Connected && waited.elapsed() < patience {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if client.connection_state() != ConnState::Connected {
            tracing::warn!(url = %config.url, "NATS not reachable yet; NATS routes answer 503 until it is");
        }
        Ok(Self {
            client,
            subjects: Service::all()
                .map(|service| Subject::from(subject(&config.subject_prefix, service)))
                .collect(),
            retries: config.no_responder_retries,
            backoff: Duration::from_millis(config.retry_backoff_ms),
            deadlines: Arc::default(),
        })
    }

    /// Whether the connection is up now.
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == ConnState::Connected
    }

    /// The subject of a service.
    pub fn subject(&self, service: Service) -> Subject {
        self.subjects[service.index()].clone()
    }

    /// Publishes `payload` on `subject` (fire and forget).
    pub async fn publish(
        &self,
        subject: String,
        payload: bytes::Bytes,
    ) -> Result<(), async_nats::PublishError> {
        self.client.publish(subject, payload).await
    }

    /// Publishes `payload` with `headers` on `subject` (fire and forget).
    pub async fn publish_with_headers(
        &self,
        subject: String,
        headers: async_nats::HeaderMap,
        payload: bytes::Bytes,
    ) -> Result<(), async_nats::PublishError> {
        self.client
            .publish_with_headers(subject, headers, payload)
            .await
    }

    /// Subscribes to `subject`; the client resubscribes after a reconnection.
    pub async fn subscribe(
        &self,
        subject: String,
    ) -> Result<async_nats::Subscriber, async_nats::SubscribeError> {
        self.client.subscribe(subject).await
    }

    /// Sends `envelope` to `service` and waits for its reply, until `deadline`.
    pub async fn request(
        &self,
        service: Service,
        envelope: &mut EnvelopeRequest<'_>,
        deadline: Instant,
    ) -> Result<Reply, NatsError> {
        if !self.is_connected() {
            return Err(NatsError::Disconnected);
        }
        let subject = self.subject(service);
        // The negotiated limit, read from an atomic (`server_info` would clone the server's
        // whole `INFO`, a dozen strings, on every request).
        let max_payload = self.client.max_payload();
        let mut attempt = 0u32;
        loop {
            let now = Instant::now();
            let Some(left) = deadline
                .checked_duration_since(now)
                .filter(|d| !d.is_zero())
            else {
                return Err(NatsError::Timeout);
            };
            envelope.deadline_ms = left.as_millis() as u64;
            let payload = Bytes::from(envelope.to_json());
            if max_payload > 0 && payload.len() > max_payload {
                return Err(NatsError::TooLarge(format!(
                    "the request is too large for the {} service ({} bytes encoded, at most {max_payload})",
                    service.name(),
                    payload.len()
                )));
            }
            // No timeout of the client's own: the deadline below bounds the call, and a second
            // timer per request would only duplicate it.
            let request = async_nats::client::Request::new()
                .payload(payload)
                .timeout(None);
            let sent = self
                .deadlines
                .run_until(deadline, self.client.send_request(subject.clone(), request))
                .await;
            match sent {
                Err(_) => return Err(NatsError::Timeout),
                Ok(Ok(message)) => {
                    return parse_reply(&message.payload).map_err(NatsError::BadReply);
                }
                Ok(Err(e)) => match e.kind() {
                    RequestErrorKind::NoResponders => {
                        if attempt >= self.retries {
                            return Err(NatsError::NoResponders);
                        }
                        // Proof of non-delivery: safe to replay, after a backoff that stays
                        // inside the deadline.
                        let wait = self.backoff.saturating_mul(1 << attempt.min(16));
                        attempt += 1;
                        tracing::debug!(
                            service = service.name(),
                            attempt,
                            "no responders; replaying"
                        );
                        if Instant::now() + wait >= deadline {
                            return Err(NatsError::Timeout);
                        }
                        tokio::time::sleep(wait).await;
                    }
                    // Delivery unknown: the request may be running; never replay.
                    RequestErrorKind::TimedOut => return Err(NatsError::Timeout),
                    RequestErrorKind::MaxPayloadExceeded => {
                        return Err(NatsError::TooLarge(format!(
                            "the request is too large for the {} service",
                            service.name()
                        )));
                    }
                    RequestErrorKind::InvalidSubject => {
                        return Err(NatsError::Internal(format!("invalid subject {subject}")));
                    }
                    RequestErrorKind::Other => return Err(NatsError::Failed(e.to_string())),
                },
            }
        }
    }
}
