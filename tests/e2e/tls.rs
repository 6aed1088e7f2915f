//! HTTPS on the listeners, through the real binary: both planes, HTTP/2 by ALPN, certificates
//! swapped on disk or on SIGHUP without a restart or a dropped connection, mTLS on the
//! management plane, and what a client that does not speak TLS gets.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::support::builder::{Gateway, Started};
use crate::support::call::{Call, IntoCall};
use crate::support::config::METRICS_TOKEN;
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::pki::Pki;
use crate::support::poll::{eventually, poll_every};

fn listener_tls(section: &str, pki: &Pki, client_ca: Option<&Path>) -> String {
    let mut out = format!(
        "[{section}.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        pki.server_cert.display(),
        pki.server_key.display()
    );
    if let Some(ca) = client_ca {
        out.push_str(&format!("client_ca_file = \"{}\"\n", ca.display()));
    }
    out.push('\n');
    out
}

/// A gateway binary with a PKI of its own (CA `gw`, in its folder) and the configuration
/// `toml` makes of it.
fn tls_gateway(toml: impl FnOnce(&Pki) -> String) -> (Process, Pki) {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(&dir.path().join("pki"), "gw");
    let Started { gw, .. } = Gateway::builder().toml(toml(&pki)).keep_dir(dir).binary();
    (gw, pki)
}

fn https(port: u16, path: &str) -> String {
    format!("https://localhost:{port}{path}")
}

async fn connect(port: u16, config: rustls::ClientConfig) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
}

/// A TLS connection to `port` offering `alpn`.
async fn handshake(port: u16, pki: &Pki, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
    let config = pki.rustls_client(alpn, false);
    connect(port, config).await.expect("handshake")
}

/// The certificate a new handshake is served, as DER.
async fn served_certificate(port: u16, pki: &Pki) -> Vec<u8> {
    let tls = handshake(port, pki, &[b"http/1.1"]).await;
    tls.get_ref().1.peer_certificates().expect("certificate")[0].to_vec()
}

fn der_of(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject as _;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("PEM")
        .to_vec()
}

/// `GET /health` over an open HTTP/1.1 TLS connection; the status line.
async fn get_health(tls: &mut TlsStream<TcpStream>) -> String {
    tls.write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .expect("write");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // The answer is small: read until the head and its Content-Length body are in.
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut chunk))
            .await
            .expect("answer in time")
            .expect("read");
        assert!(n > 0, "connection closed");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(head_end) = text.find("\r\n\r\n") {
            let length = text[..head_end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if buf.len() >= head_end + 4 + length {
                return text.lines().next().unwrap_or_default().to_owned();
            }
        }
    }
}

/// HTTP/2 `GET /health` over `tls`: the response, or `None` when it was not served.
async fn h2_health(tls: TlsStream<TcpStream>, port: u16) -> Option<http::Response<h2::RecvStream>> {
    let (mut h2, connection) = h2::client::handshake(tls).await.ok()?;
    tokio::spawn(connection);
    let request = http::Request::get(format!("https://localhost:{port}/health"));
    let (response, _) = h2.send_request(request.body(()).ok()?, true).ok()?;
    response.await.ok()
}

/// Replaces the listener's certificate and key files at once (rename), with a new pair.
fn rotate(pki: &Pki, cn: &str) -> String {
    let (cert, key) = pki.server_pair(cn);
    let tmp_cert = pki.dir.join("next.pem");
    let tmp_key = pki.dir.join("next.key");
    std::fs::write(&tmp_cert, &cert).expect("cert");
    std::fs::write(&tmp_key, &key).expect("key");
    std::fs::rename(&tmp_key, &pki.server_key).expect("rename key");
    std::fs::rename(&tmp_cert, &pki.server_cert).expect("rename cert");
    cert
}

async fn wait_for_certificate(port: u16, pki: &Pki, want: &[u8], within: Duration) -> bool {
    eventually(within, async || served_certificate(port, pki).await == want).await
}

async fn metrics_over_tls(gw: &Process, pki: &Pki) -> String {
    let metrics = pki.client().get(https(gw.port, "/metrics")).call();
    metrics.bearer(METRICS_TOKEN).read().await.text()
}

#[tokio::test]
async fn both_planes_serve_https_and_http2_is_negotiated_by_alpn() {
    let (gw, pki) = tls_gateway(|pki| {
        let data = listener_tls("data_plane", pki, None);
        data + &listener_tls("management_plane", pki, None)
    });
    let client = pki.client();
    for port in [gw.port, gw.management_port] {
        let r = client
            .get(https(port, "/health"))
            .call()
            .expect(StatusCode::OK)
            .await;
        assert_eq!(r.version, reqwest::Version::HTTP_11);
    }
    // The whole chain runs behind TLS: a key-less request gets the contract's 401.
    let todos = client.get(https(gw.port, "/v1/db/rest/v1/todos")).call();
    let body = todos.expect(StatusCode::UNAUTHORIZED).await.json();
    let contract = body["error"].is_object() || body["code"].is_string();
    assert!(contract, "{body}");

    // ALPN: a client offering h2 gets HTTP/2 on both planes.
    for port in [gw.port, gw.management_port] {
        let tls = handshake(port, &pki, &[b"h2", b"http/1.1"]).await;
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let response = h2_health(tls, port).await.expect("HTTP/2 response");
        assert_eq!(response.status(), http::StatusCode::OK);
        assert!(response.headers().contains_key("x-request-id"));
    }
    // A client offering only HTTP/1.1 gets it; TLS 1.2 is accepted, 1.3 preferred.
    let tls = handshake(gw.port, &pki, &[b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let version = tls.get_ref().1.protocol_version();
    assert_eq!(version, Some(rustls::ProtocolVersion::TLSv1_3));
    let mut tls12 = pki.rustls_client(&[b"http/1.1"], false);
    tls12 = {
        let versions =
            rustls::ClientConfig::builder_with_protocol_versions(&[&rustls::version::TLS12]);
        let mut c = versions
            .with_root_certificates(pki.roots())
            .with_no_client_auth();
        c.alpn_protocols = tls12.alpn_protocols.clone();
        c
    };
    let mut tls = connect(gw.port, tls12).await.expect("TLS 1.2 handshake");
    let version = tls.get_ref().1.protocol_version();
    assert_eq!(version, Some(rustls::ProtocolVersion::TLSv1_2));
    assert_eq!(get_health(&mut tls).await, "HTTP/1.1 200 OK");

    // Plain HTTP to a TLS listener is not served, and it is counted.
    let plain = Call::get(gw.data_url("/health")).timeout(Duration::from_secs(5));
    let plain = plain.try_send().await;
    let served = plain.as_ref().is_ok_and(|r| r.status() == StatusCode::OK);
    assert!(!served, "plain HTTP was served over a TLS listener");
    let text = metrics_over_tls(&gw, &pki).await;
    let failures = metric(
        &text,
        "aura_tls_handshake_failures_total",
        &["plane=\"data\""],
    );
    assert!(failures >= 1.0, "{text}");
}

#[tokio::test]
async fn a_certificate_changed_on_disk_is_served_to_the_next_handshake_without_dropping_connections()
 {
    let (gw, pki) = tls_gateway(|pki| {
        let data = listener_tls("data_plane", pki, None);
        format!("[server]\ntls_watch_interval_ms = 200\n\n{data}")
    });
    let original = der_of(&std::fs::read_to_string(&pki.server_cert).expect("cert"));
    assert_eq!(served_certificate(gw.port, &pki).await, original);
    // A keep-alive connection opened under the first certificate.
    let mut open = handshake(gw.port, &pki, &[b"http/1.1"]).await;
    assert_eq!(get_health(&mut open).await, "HTTP/1.1 200 OK");

    let rotated = der_of(&rotate(&pki, "rotated"));
    let served = wait_for_certificate(gw.port, &pki, &rotated, Duration::from_secs(10)).await;
    assert!(
        served,
        "the new certificate was not served; log:\n{}",
        gw.log_text()
    );
    // The connection opened before is still served.
    assert_eq!(get_health(&mut open).await, "HTTP/1.1 200 OK");

    // A broken replacement is refused: the certificate in force stays, and it is counted.
    std::fs::write(&pki.server_cert, "not a certificate").expect("write");
    let labels = ["plane=\"data\"", "result=\"refused\""];
    let refused = poll_every(
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let text = metrics_over_tls(&gw, &pki).await;
            (metric(&text, "aura_tls_reloads_total", &labels) >= 1.0).then_some(())
        },
    );
    assert!(
        refused.await.is_some(),
        "the broken certificate was not refused"
    );
    assert_eq!(served_certificate(gw.port, &pki).await, rotated);
    assert!(gw.log_text().contains("TLS reload refused"));
    assert_eq!(get_health(&mut open).await, "HTTP/1.1 200 OK");
}

#[tokio::test]
async fn sighup_reloads_the_certificate_at_once() {
    // The files are not polled within this test: only the signal can reload them.
    let (gw, pki) = tls_gateway(|pki| {
        let management = listener_tls("management_plane", pki, None);
        format!("[server]\ntls_watch_interval_ms = 3600000\n\n{management}")
    });
    let original = der_of(&std::fs::read_to_string(&pki.server_cert).expect("cert"));
    // The listener has read its files (the port may accept before it has).
    assert_eq!(served_certificate(gw.management_port, &pki).await, original);
    let rotated = der_of(&rotate(&pki, "after-sighup"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(served_certificate(gw.management_port, &pki).await, original);
    gw.signal("-HUP");
    let within = Duration::from_secs(5);
    let reloaded = wait_for_certificate(gw.management_port, &pki, &rotated, within).await;
    assert!(reloaded, "SIGHUP did not reload; log:\n{}", gw.log_text());
    // The plain-text data plane is untouched.
    Call::get(gw.data_url("/health"))
        .expect(StatusCode::OK)
        .await;
}

#[tokio::test]
async fn the_management_plane_can_require_client_certificates() {
    let (gw, pki) = tls_gateway(|pki| {
        let data = listener_tls("data_plane", pki, None);
        data + &listener_tls("management_plane", pki, Some(&pki.ca))
    });
    let stranger = Pki::new(&pki.dir.join("other"), "stranger");
    let health = https(gw.management_port, "/health");
    // Without a client certificate: no handshake.
    let bare = pki.client().get(&health).send().await;
    assert!(bare.is_err(), "served without a client certificate");
    // A certificate from another CA: refused too.
    let with = |identity| {
        pki.client_builder()
            .identity(identity)
            .build()
            .expect("client")
    };
    let foreign = with(stranger.client_identity()).get(&health).send().await;
    assert!(foreign.is_err(), "served a certificate from an unknown CA");
    // The console's backend, with its certificate.
    let console = with(pki.client_identity()).get(&health).call();
    console.expect(StatusCode::OK).await;
    // The data plane asks for none.
    let data = pki.client().get(https(gw.port, "/health")).call();
    data.expect(StatusCode::OK).await;
    let logged = poll_every(
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || {
            gw.log_text()
                .contains("client_certificates=true")
                .then_some(())
        },
    );
    assert!(logged.await.is_some(), "{}", gw.log_text());
}

#[tokio::test]
async fn with_http2_off_a_tls_listener_speaks_http11_only() {
    let (gw, pki) = tls_gateway(|pki| {
        let data = listener_tls("data_plane", pki, None);
        format!("[server]\nhttp2 = false\n\n{data}")
    });
    // ALPN: h2 is not offered back.
    let mut tls = handshake(gw.port, &pki, &[b"h2", b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(get_health(&mut tls).await, "HTTP/1.1 200 OK");
    // The HTTP/2 preface sent anyway is not served.
    let tls = handshake(gw.port, &pki, &[b"http/1.1"]).await;
    let served = tokio::time::timeout(Duration::from_secs(5), h2_health(tls, gw.port));
    let served = served.await.ok().flatten();
    assert!(served.is_none(), "HTTP/2 was served with server.http2 off");
}

/// A client of TLS 1.2 only, offering `alpn`.
fn tls12_client(pki: &Pki, alpn: &[&[u8]]) -> rustls::ClientConfig {
    aura_gateway::tls::install_crypto_provider();
    let versions = rustls::ClientConfig::builder_with_protocol_versions(&[&rustls::version::TLS12]);
    let mut config = versions
        .with_root_certificates(pki.roots())
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// A returning client resumes its session (a short handshake: no certificate, no signature),
/// on TLS 1.3 and 1.2, however many clients came in between and across a certificate reload:
/// the tickets are sealed with keys the listener keeps, not remembered per session.
#[tokio::test]
async fn a_returning_client_resumes_its_session_after_many_others_and_a_reload() {
    use rustls::HandshakeKind;

    let (gw, pki) = tls_gateway(|pki| {
        let data = listener_tls("data_plane", pki, None);
        format!("[server]\ntls_watch_interval_ms = 3600000\n\n{data}")
    });
    // Each config keeps its sessions, shared by its clones.
    let returning = [
        ("TLS 1.3", pki.rustls_client(&[b"http/1.1"], false)),
        ("TLS 1.2", tls12_client(&pki, &[b"http/1.1"])),
    ];
    for (name, config) in &returning {
        let mut first = connect(gw.port, config.clone()).await.expect("handshake");
        let kind = first.get_ref().1.handshake_kind();
        assert_eq!(kind, Some(HandshakeKind::Full), "{name}");
        // The answer read, the session's tickets are in.
        assert_eq!(get_health(&mut first).await, "HTTP/1.1 200 OK");
    }
    // More clients than rustls remembers sessions by default (256).
    for _ in 0..300 {
        let mut other = handshake(gw.port, &pki, &[b"http/1.1"]).await;
        assert_eq!(get_health(&mut other).await, "HTTP/1.1 200 OK");
    }
    let rotated = der_of(&rotate(&pki, "while-resuming"));
    gw.signal("-HUP");
    let within = Duration::from_secs(5);
    let reloaded = wait_for_certificate(gw.port, &pki, &rotated, within).await;
    assert!(reloaded, "SIGHUP did not reload; log:\n{}", gw.log_text());
    for (name, config) in &returning {
        let mut again = connect(gw.port, config.clone()).await.expect("handshake");
        let kind = again.get_ref().1.handshake_kind();
        assert_eq!(kind, Some(HandshakeKind::Resumed), "{name}");
        assert_eq!(get_health(&mut again).await, "HTTP/1.1 200 OK");
    }
}
