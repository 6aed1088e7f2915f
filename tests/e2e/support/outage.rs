//! A TCP relay in front of a shared service that a test can cut and restore: the service, seen
//! from the gateway, stops (connections reset, new ones refused) and comes back on the same
//! address, while the machine's own server keeps running for every other test.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A relay from a local port to `target`.
pub struct Relay {
    pub addr: SocketAddr,
    target: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    /// Starts relaying on a free local port.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let relay = Self {
            addr: listener.local_addr().expect("addr"),
            target,
            tasks: Arc::new(Mutex::new(Vec::new())),
        };
        relay.serve(listener);
        relay
    }

    fn serve(&self, listener: TcpListener) {
        let target = self.target;
        let tasks = self.tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let pipe = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                tasks.lock().expect("lock").push(pipe);
            }
        });
        self.tasks.lock().expect("lock").push(accept);
    }

    /// The service goes away: every relayed connection is dropped and the port refuses.
    pub fn cut(&self) {
        for task in self.tasks.lock().expect("lock").drain(..) {
            task.abort();
        }
    }

    /// The service comes back on the same address.
    pub async fn restore(&self) {
        let listener = TcpListener::bind(self.addr)
            .await
            .expect("rebind the relay port");
        self.serve(listener);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}
