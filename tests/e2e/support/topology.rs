//! The fleet topology of the scale-out tests: a three-node NATS cluster (real `nats-server`
//! processes with cluster routes on free ports) that a test can take members out of.

use std::time::{Duration, Instant};

use super::free_port;
use super::nats_server::NatsServer;

/// One member of the cluster.
pub struct Member {
    server: Option<NatsServer>,
    pub client_port: u16,
    monitor_port: u16,
}

/// A three-node NATS cluster.
pub struct NatsCluster {
    pub members: Vec<Member>,
}

async fn monitor(port: u16, path: &str) -> serde_json::Value {
    reqwest::get(format!("http://127.0.0.1:{port}{path}"))
        .await
        .expect("monitoring")
        .json()
        .await
        .expect("json")
}

impl NatsCluster {
    /// Three servers routed to each other; returns once the cluster is formed.
    pub async fn start() -> Self {
        // Ports picked free can be taken by another test before a member binds them: the
        // whole cluster is started again on new ones (up to five times).
        let members = (0..5)
            .find_map(|_| Self::members())
            .expect("the cluster's servers did not start on five sets of free ports");
        let started = Instant::now();
        for m in &members {
            while monitor(m.monitor_port, "/routez").await["num_routes"].as_u64() != Some(2) {
                assert!(
                    started.elapsed() < Duration::from_secs(15),
                    "the cluster did not form"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Self { members }
    }

    /// Three members on fresh ports, or `None` when one of them could not bind its port.
    fn members() -> Option<Vec<Member>> {
        let ports: Vec<(u16, u16, u16)> = (0..3)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        (0..3)
            .map(|i| {
                let (client_port, route_port, monitor_port) = ports[i];
                let routes: Vec<String> = (0..3)
                    .filter(|j| *j != i)
                    .map(|j| format!("nats-route://127.0.0.1:{}", ports[j].1))
                    .collect();
                let config = format!(
                    "server_name: n{i}\nhttp: 127.0.0.1:{monitor_port}\n\
                     cluster {{\n  name: aura\n  listen: 127.0.0.1:{route_port}\n  routes: [{}]\n}}\n",
                    routes.join(", ")
                );
                Some(Member {
                    server: Some(NatsServer::try_start_on(client_port, &config)?),
                    client_port,
                    monitor_port,
                })
            })
            .collect()
    }

    /// The three seed URLs, comma-separated (`nats.url`).
    pub fn seeds(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("nats://127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The URL of member `i`.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Kills member `i` (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self, i: usize) {
        self.members[i].server = None;
    }

    /// The live members that have a client connection named `name`.
    pub async fn members_with(&self, name: &str) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if m.server.is_none() {
                continue;
            }
            let connz = monitor(m.monitor_port, "/connz?limit=1024").await;
            if connz["connections"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["name"] == name)
            {
                out.push(i);
            }
        }
        out
    }

    /// The member a connection named `name` is on (waits for it).
    pub async fn member_with(&self, name: &str) -> usize {
        let started = Instant::now();
        loop {
            if let Some(i) = self.members_with(name).await.first() {
                return *i;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{name} not connected"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
