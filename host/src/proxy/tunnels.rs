//! Upgraded connections (WebSocket tunnels) after the handshake.
//!
//! A tunnel outlives the HTTP exchange that opened it, so it is accounted for on its own: it
//! keeps the connection slot of its client connection (`server.max_connections`) and its place
//! in the listener's stream budget (`server.max_streams`) until it ends,
//! and it is tracked so that shutdown waits for tunnels at most the rest of
//! `server.shutdown_grace_secs`, then closes those still open.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The listener's slot of one client connection (request extension): held by the connection
/// and by any tunnel it opened; released when both are done.
#[derive(Debug, Clone)]
pub struct ConnectionSlot(pub Arc<OwnedSemaphorePermit>);

/// A client connection taken over by a tunnel: its socket, with the bytes the client sent past
/// the handshake put back in front.
pub trait ClientIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> ClientIo for T {}

/// Where an HTTP/1.1 connection hands its socket to the tunnel once the `101` is written
/// (request extension, put by the listener on a request asking for an upgrade).
#[derive(Clone)]
pub struct ClientUpgrade(Arc<std::sync::Mutex<Option<ClientSide>>>);

/// Where the client's side of a tunnel arrives.
type ClientSide = oneshot::Receiver<Box<dyn ClientIo>>;

impl std::fmt::Debug for ClientUpgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientUpgrade")
    }
}

impl ClientUpgrade {
    /// A handle for the request, and the sender its connection hands the socket to.
    pub fn new() -> (Self, oneshot::Sender<Box<dyn ClientIo>>) {
        let (tx, rx) = oneshot::channel();
        (Self(Arc::new(std::sync::Mutex::new(Some(rx)))), tx)
    }

    /// The client's side of the tunnel of `request`, once its connection hands it over: from
    /// the listener's handle when the request has one, else from hyper's own upgrade.
    pub fn of(
        request: &mut http::Request<axum::body::Body>,
    ) -> impl Future<Output = Result<Box<dyn ClientIo>, String>> + Send + 'static {
        let handle = request
            .extensions_mut()
            .remove::<ClientUpgrade>()
            .and_then(|h| h.0.lock().ok().and_then(|mut rx| rx.take()));
        let hyper_side = handle.is_none().then(|| hyper::upgrade::on(request));
        async move {
            match (handle, hyper_side) {
                (Some(rx), _) => rx
                    .await
                    .map_err(|_| "the client connection ended before the upgrade".to_string()),
                (None, Some(on)) => on
                    .await
                    .map(|upgraded| {
                        Box::new(hyper_util::rt::TokioIo::new(upgraded)) as Box<dyn ClientIo>
                    })
                    .map_err(|e| e.to_string()),
                (None, None) => Err("no upgrade".to_string()),
            }
        }
    }
}

/// The open tunnels.
#[derive(Debug, Clone, Default)]
pub struct Tunnels {
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl Tunnels {
    /// Runs `pump` as a tunnel holding `slot` and its place in the listener's stream budget,
    /// until it ends or shutdown closes it.
    pub fn spawn(
        &self,
        slot: Option<ConnectionSlot>,
        place: Option<OwnedSemaphorePermit>,
        pump: impl Future<Output = ()> + Send + 'static,
    ) {
        let cancel = self.cancel.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                () = pump => {}
                () = cancel.cancelled() => {
                    tracing::debug!("tunnel closed by shutdown");
                }
            }
            drop((slot, place));
        });
    }

    /// Tunnels open now.
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether no tunnel is open.
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Waits for the open tunnels to end, at most `grace`, then closes the rest.
    pub async fn shut_down(&self, grace: Duration) {
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.tracker.len(),
                "grace period over; closing the remaining tunnels"
            );
            self.cancel.cancel();
            self.tracker.wait().await;
        }
    }
}
