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
