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

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The listener's slot of one client connection (request extension): held by the connection
/// and by any tunnel it opened; released when both are done.
#[derive(Debug, Clone)]
pub struct ConnectionSlot(pub Arc<OwnedSemaphorePermit>);

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
