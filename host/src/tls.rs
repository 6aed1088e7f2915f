//! TLS: the listeners' server side, and the trust settings of every hop the gateway dials.
//!
//! A plane with `tls` set serves HTTPS only: TLS 1.2 or 1.3, ALPN `h2` (when `server.http2` is
//! on) and `http/1.1`, the certificate chain and key read from PEM files. The files are read
//! again when they change (polled every `server.tls_watch_interval_ms`) and on SIGHUP: new
//! handshakes get the new certificate, open connections keep theirs. A replacement that does not
//! parse, or whose key does not match its certificate, is refused and the one in force stays
//! (logged, counted in `aura_tls_reloads_total{result="refused"}`). With `client_ca_file`, every
//! client must present a certificate issued by that CA (mTLS, meant for the management plane).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::config::ListenerTlsConfig;
use crate::files::{Stamp, stamp};
use crate::metrics::Metrics;
use crate::plane::Plane;

/// Installs the process's TLS crypto provider (ring). Idempotent; call before any TLS use.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A TLS problem, naming the configuration key it comes from.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct TlsError {
    /// Dotted key (`data_plane.tls.cert_file`).
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

fn tls_error(key: &str, problem: impl Into<String>) -> TlsError {
    TlsError {
        key: key.to_owned(),
        problem: problem.into(),
    }
}

/// Reads every certificate of a PEM file (a chain or a CA bundle).
pub fn read_certificates(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path)
        .map_err(|e| tls_error(key, format!("cannot read {}: {e}", path.display())))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            tls_error(
                key,
                format!("{}: not PEM certificates: {e}", path.display()),
            )
        })?;
    if certs.is_empty() {
        return Err(tls_error(
            key,
            format!("{}: holds no PEM certificate", path.display()),
        ));
    }
    Ok(certs)
}

/// Reads a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub fn read_private_key(key: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = std::fs::read(path)
        .map_err(|e| tls_error(key, format!("cannot read {}: {e}", path.display())))?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| tls_error(key, format!("{}: no PEM private key: {e}", path.display())))
}

/// A root store of the certificates in a PEM bundle.
pub fn root_store(key: &str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certificates(key, path)? {
        roots
            .add(cert)
            .map_err(|e| tls_error(key, format!("{}: unusable CA: {e}", path.display())))?;
    }
    Ok(roots)
}

/// The files of one listener, resolved against the config file's directory.
#[derive(Debug, Clone)]
struct Files {
    prefix: &'static str,
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

impl Files {
    fn new(plane: Plane, config: &ListenerTlsConfig, base: Option<&Path>) -> Self {
        let resolve = |p: &str| match base {
            Some(base) if Path::new(p).is_relative() => base.join(p),
            _ => PathBuf::from(p),
        };
        Self {
            prefix: match plane {
                Plane::Data => "data_plane.tls",
                Plane::Management => "management_plane.tls",
            },
            cert: resolve(&config.cert_file),
            key: resolve(&config.key_file),
            client_ca: config.client_ca_file.as_deref().map(resolve),
        }
    }

    fn key(&self, field: &str) -> String {
        format!("{}.{field}", self.prefix)
    }

    /// Modification time and length of each file: what the watcher compares.
    fn stamps(&self) -> Vec<Option<Stamp>> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| stamp(p))
            .collect()
    }

    /// Builds a server configuration from the files as they are now, resuming sessions with
    /// `resumption`.
    fn server_config(
        &self,
        http2: bool,
        resumption: &Resumption,
    ) -> Result<ServerConfig, TlsError> {
        let chain = read_certificates(&self.key("cert_file"), &self.cert)?;
        let private_key = read_private_key(&self.key("key_file"), &self.key)?;
        let versions = [&rustls::version::TLS13, &rustls::version::TLS12];
        let builder = ServerConfig::builder_with_protocol_versions(&versions);
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let key = self.key("client_ca_file");
                let roots = root_store(&key, path)?;
                let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .map_err(|e| tls_error(&key, format!("{}: {e}", path.display())))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        // Checks that the key matches the certificate.
        let mut config = builder.with_single_cert(chain, private_key).map_err(|e| {
            tls_error(
                &self.key("key_file"),
                format!("{} with {}: {e}", self.key.display(), self.cert.display()),
            )
        })?;
        config.ticketer = resumption.ticketer.clone();
        config.session_storage = resumption.sessions.clone();
        config.alpn_protocols = if http2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        Ok(config)
    }
}

/// TLS 1.2 sessions remembered per listener for resumption by id (TLS 1.3 and ticket-capable
/// TLS 1.2 clients resume from tickets and need none).
const REMEMBERED_SESSIONS: usize = 8192;

/// How a listener's clients resume their sessions (a short handshake, no signature): tickets
/// sealed with keys of the process's own, rotated every 6 hours, and a cache of TLS 1.2 session
/// ids. Kept across certificate reloads, so a reload does not cost every client a full
/// handshake.
#[derive(Debug, Clone)]
struct Resumption {
    ticketer: Arc<dyn rustls::server::ProducesTickets>,
    sessions: Arc<dyn rustls::server::StoresServerSessions>,
}

impl Resumption {
    fn new(files: &Files) -> Result<Self, TlsError> {
        let ticketer = rustls::crypto::ring::Ticketer::new().map_err(|e| {
            tls_error(
                files.prefix,
                format!("no ticket keys for session resumption: {e}"),
            )
        })?;
        Ok(Self {
            ticketer,
            sessions: rustls::server::ServerSessionMemoryCache::new(REMEMBERED_SESSIONS),
        })
    }
}

/// One listener's TLS settings in force, swapped whole on reload.
#[derive(Debug)]
pub struct ListenerTls {
    plane: Plane,
    files: Files,
    http2: bool,
    resumption: Resumption,
    current: ArcSwap<ServerConfig>,
    stamps: Mutex<Vec<Option<Stamp>>>,
}

impl ListenerTls {
    /// Reads the files named in `config` (relative paths against `base`).
    pub fn load(
        plane: Plane,
        config: &ListenerTlsConfig,
        base: Option<&Path>,
        http2: bool,
    ) -> Result<Arc<Self>, TlsError> {
        install_crypto_provider();
        let files = Files::new(plane, config, base);
        let stamps = files.stamps();
        let resumption = Resumption::new(&files)?;
        let server = files.server_config(http2, &resumption)?;
        Ok(Arc::new(Self {
            plane,
            files,
            http2,
            resumption,
            current: ArcSwap::from_pointee(server),
            stamps: Mutex::new(stamps),
        }))
    }

    /// The acceptor for the next handshake (the certificate in force now).
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.load_full())
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_certificate(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// Reads the files again and swaps them in; on error the settings in force stay.
    pub fn reload(&self, metrics: &Metrics, why: &str) -> Result<(), TlsError> {
        let stamps = self.files.stamps();
        let result = self.files.server_config(self.http2, &self.resumption);
        // Remember what was seen either way: a refused file is not retried until it changes.
        if let Ok(mut seen) = self.stamps.lock() {
            *seen = stamps;
        }
        let plane = self.plane.as_str();
        match result {
            Ok(server) => {
                self.current.store(Arc::new(server));
                metrics.tls_reloads.with_label_values(&[plane, "ok"]).inc();
                tracing::info!(plane, trigger = why, "TLS certificate reloaded");
                Ok(())
            }
            Err(e) => {
                metrics
                    .tls_reloads
                    .with_label_values(&[plane, "refused"])
                    .inc();
                tracing::error!(plane, trigger = why, error = %e, "TLS reload refused; the certificate in force stays");
                Err(e)
            }
        }
    }

    fn changed(&self) -> bool {
        let now = self.files.stamps();
        self.stamps.lock().map_or(true, |seen| *seen != now)
    }
}

/// Reloads the listeners' certificates on SIGHUP and when their files change.
pub fn spawn_reloader(listeners: Vec<Arc<ListenerTls>>, every: Duration, metrics: Metrics) {
    if listeners.is_empty() {
        return;
    }
    // Registered before returning: a SIGHUP sent once the listeners serve is never missed.
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    tokio::spawn(async move {
        loop {
            #[cfg(unix)]
            let signalled = match hup.as_mut() {
                Some(hup) => tokio::select! {
                    _ = hup.recv() => true,
                    _ = tokio::time::sleep(every) => false,
                },
                None => {
                    tokio::time::sleep(every).await;
                    false
                }
            };
            #[cfg(not(unix))]
            let signalled = {
                tokio::time::sleep(every).await;
                false
            };
            for listener in &listeners {
                if signalled {
                    let _ = listener.reload(&metrics, "SIGHUP");
                } else if listener.changed() {
                    let _ = listener.reload(&metrics, "file change");
                }
            }
        }
    });
}

/// The client side of a hop: the public roots (`public_roots`) plus the CA bundle of `tls`, and
/// its client certificate when it names one. `key` names the section in errors.
pub fn client_config(
    key: &str,
    tls: Option<&crate::config::ClientTlsConfig>,
    public_roots: bool,
) -> Result<rustls::ClientConfig, TlsError> {
    install_crypto_provider();
    let mut roots = match tls.and_then(|t| t.ca_file.as_deref()) {
        Some(ca) => root_store(&format!("{key}.ca_file"), Path::new(ca))?,
        None => RootCertStore::empty(),
    };
    if public_roots {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    let versions = [&rustls::version::TLS13, &rustls::version::TLS12];
    let builder = rustls::ClientConfig::builder_with_protocol_versions(&versions)
        .with_root_certificates(roots);
    match tls.and_then(|t| t.cert_file.as_deref().zip(t.key_file.as_deref())) {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, private_key)) => {
            let chain = read_certificates(&format!("{key}.cert_file"), Path::new(cert))?;
            let private_key = read_private_key(&format!("{key}.key_file"), Path::new(private_key))?;
            builder
                .with_client_auth_cert(chain, private_key)
                .map_err(|e| tls_error(&format!("{key}.key_file"), e.to_string()))
        }
    }
}
