//! `pingora-peer ADDR UPSTREAM`: forwards every request to UPSTREAM (`host:port`, plain HTTP)
//! through Pingora's proxy, its upstream connections kept alive and pooled, on one service
//! thread (Pingora's default) — the same shape as `bench_peers proxy` for hyper.

use async_trait::async_trait;
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::Server;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::Result;
use pingora_proxy::{ProxyHttp, Session};

struct Forward {
    upstream: String,
}

#[async_trait]
impl ProxyHttp for Forward {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.upstream.as_str(),
            false,
            String::new(),
        )))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, upstream] = args.as_slice() else {
        eprintln!("usage: pingora-peer ADDR UPSTREAM");
        std::process::exit(2);
    };
    // SIGTERM ends it at once (Pingora waits five minutes by default), as bench/run expects of
    // every peer: callgrind writes its counts when the process exits.
    let conf = ServerConf {
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut proxy = pingora_proxy::http_proxy_service(
        &server.configuration,
        Forward {
            upstream: upstream.clone(),
        },
    );
    proxy.add_tcp(addr);
    server.add_service(proxy);
    server.run_forever();
}
