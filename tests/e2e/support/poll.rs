//! Waiting for something the gateway does in the background: one polling loop for every test.

use std::time::{Duration, Instant};

/// Runs `check` every `every` until it gives a value, and returns it; `None` once `within` has
/// passed without one (`check` runs at least once, and never again after the deadline).
pub async fn poll_every<T>(
    within: Duration,
    every: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    let started = Instant::now();
    loop {
        if let Some(done) = check().await {
            return Some(done);
        }
        if started.elapsed() >= within {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// Runs `check` up to `tries` times, `every` apart, until it gives a value; `None` when it never
/// did.
pub async fn poll_tries<T>(
    tries: u32,
    every: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    for _ in 0..tries {
        if let Some(done) = check().await {
            return Some(done);
        }
        tokio::time::sleep(every).await;
    }
    None
}

/// [`poll_every`] 50 ms.
pub async fn poll<T>(within: Duration, check: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    poll_every(within, Duration::from_millis(50), check).await
}

/// Whether `check` held within `within` (checked every 50 ms).
pub async fn eventually(within: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    poll(within, async || check().await.then_some(()))
        .await
        .is_some()
}

/// Waits until `check` holds; fails the test naming `what` when it does not within `within`.
pub async fn wait_until(what: &str, within: Duration, check: impl AsyncFnMut() -> bool) {
    assert!(
        eventually(within, check).await,
        "{what}: not within {within:?}"
    );
}
