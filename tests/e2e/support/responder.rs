//! Test backends on NATS: answer envelopes with a closure, counting deliveries.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

/// A running responder.
pub struct Responder {
    pub deliveries: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Responder {
    /// Subscribes to `subject` on `url`; each delivery is answered with `reply(envelope)`
    /// after `delay`. Returns once the subscription is active on the server.
    pub async fn start(
        url: &str,
        subject: &str,
        delay: Duration,
        reply: impl Fn(serde_json::Value) -> Bytes + Send + Sync + 'static,
    ) -> Self {
        let client = async_nats::connect(url).await.expect("responder connects");
        Self::start_with(client, subject, delay, reply).await
    }

    /// Like [`Responder::start`] on a client the test connected itself.
    pub async fn start_with(
        client: async_nats::Client,
        subject: &str,
        delay: Duration,
        reply: impl Fn(serde_json::Value) -> Bytes + Send + Sync + 'static,
    ) -> Self {
        let mut sub = client
            .subscribe(subject.to_owned())
            .await
            .expect("subscribe");
        client.flush().await.expect("flush");
        let deliveries = Arc::new(AtomicUsize::new(0));
        let count = deliveries.clone();
        let reply = Arc::new(reply);
        let task = tokio::spawn(async move {
            while let Some(message) = sub.next().await {
                count.fetch_add(1, Ordering::SeqCst);
                let client = client.clone();
                let reply = reply.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let envelope: serde_json::Value =
                        serde_json::from_slice(&message.payload).expect("envelope is JSON");
                    if let Some(to) = message.reply {
                        let _ = client.publish(to, reply(envelope)).await;
                        let _ = client.flush().await;
                    }
                });
            }
        });
        Self { deliveries, task }
    }

    /// Deliveries seen so far.
    pub fn count(&self) -> usize {
        self.deliveries.load(Ordering::SeqCst)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where a gateway's NATS backends subscribe: its server and its subject prefix.
#[derive(Debug, Clone, Default)]
pub struct Bus {
    pub url: String,
    pub prefix: String,
}

impl Bus {
    pub fn new(url: &str, prefix: &str) -> Self {
        Self {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
        }
    }

    /// The shared NATS server under a prefix no other test uses.
    pub fn shared() -> Self {
        Self::new(&super::nats_server::shared().url(), &super::unique_prefix())
    }

    /// The subject of `service` (`{prefix}.{service}.http`).
    pub fn subject(&self, service: &str) -> String {
        format!("{}.{service}.http", self.prefix)
    }

    /// A responder for `service` answering at once.
    pub async fn respond(
        &self,
        service: &str,
        reply: impl Fn(serde_json::Value) -> Bytes + Send + Sync + 'static,
    ) -> Responder {
        self.respond_after(service, Duration::ZERO, reply).await
    }

    /// A responder for `service` answering after `delay`.
    pub async fn respond_after(
        &self,
        service: &str,
        delay: Duration,
        reply: impl Fn(serde_json::Value) -> Bytes + Send + Sync + 'static,
    ) -> Responder {
        Responder::start(&self.url, &self.subject(service), delay, reply).await
    }

    /// Responders for `services` answering `reply` at once and keeping every envelope.
    pub async fn record(
        &self,
        services: &[&str],
        reply: impl Fn(&serde_json::Value) -> Bytes + Clone + Send + Sync + 'static,
    ) -> Envelopes {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let seen: Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Arc::default();
        let mut responders = Vec::new();
        for service in services {
            let (tx, seen, reply) = (tx.clone(), seen.clone(), reply.clone());
            let responder = self.respond(service, move |e| {
                let answer = reply(&e);
                seen.lock().expect("lock").push(e.clone());
                let _ = tx.send(e);
                answer
            });
            responders.push(responder.await);
        }
        Envelopes {
            rx,
            seen,
            responders,
        }
    }
}

/// The envelopes recording responders received.
pub struct Envelopes {
    rx: tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
    seen: Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    pub responders: Vec<Responder>,
}

impl Envelopes {
    /// The next envelope, in the order they came (waits for it).
    pub async fn next(&mut self) -> serde_json::Value {
        self.rx.recv().await.expect("envelope")
    }

    /// Every envelope received so far.
    pub fn seen(&self) -> Vec<serde_json::Value> {
        self.seen.lock().expect("lock").clone()
    }

    /// The last envelope received.
    pub fn last(&self) -> serde_json::Value {
        self.seen().pop().expect("envelope")
    }
}

/// `reply(200, &[("content-type", "application/json")], b"{}")`, for any envelope.
pub fn json_ok(_: &serde_json::Value) -> Bytes {
    reply(200, &[("content-type", "application/json")], b"{}")
}

/// The header names of a request envelope, in order (it must have its headers).
pub fn header_names(envelope: &serde_json::Value) -> Vec<String> {
    envelope["headers"]
        .as_array()
        .expect("headers")
        .iter()
        .map(|p| p[0].as_str().expect("name").to_owned())
        .collect()
}

/// The value of header `name` in a request envelope (empty when absent).
pub fn envelope_header(envelope: &serde_json::Value, name: &str) -> String {
    envelope["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|pair| pair[0] == name)
        .and_then(|pair| pair[1].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// A reply envelope.
pub fn reply(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Bytes {
    use base64::Engine as _;
    let headers: Vec<[&str; 2]> = headers.iter().map(|(n, v)| [*n, *v]).collect();
    Bytes::from(
        serde_json::json!({
            "status": status,
            "headers": headers,
            "body": base64::engine::general_purpose::STANDARD.encode(body),
        })
        .to_string(),
    )
}
