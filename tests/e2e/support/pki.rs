//! Certificates made by the test: a CA, server certificates for `localhost` and `127.0.0.1`
//! signed by it, and a client certificate, written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA and the certificates it issued, as files in one directory.
pub struct Pki {
    pub dir: PathBuf,
    pub ca_pem: String,
    /// The CA certificate.
    pub ca: PathBuf,
    /// The server certificate and key (`localhost`, `127.0.0.1`).
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// A client certificate and key (CN `aura-client`).
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write PEM");
    // Servers refuse keys that others can read.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
}

impl Pki {
    /// A new CA in `dir` (named `{name}-ca`), with a server and a client certificate.
    pub fn new(dir: &Path, name: &str) -> Self {
        std::fs::create_dir_all(dir).expect("pki dir");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca, ca_key);
        let ca_path = dir.join(format!("{name}-ca.pem"));
        write(&ca_path, &ca_cert.pem());
        let mut pki = Self {
            dir: dir.to_path_buf(),
            ca_pem: ca_cert.pem(),
            ca: ca_path,
            server_cert: dir.join(format!("{name}-server.pem")),
            server_key: dir.join(format!("{name}-server.key")),
            client_cert: dir.join(format!("{name}-client.pem")),
            client_key: dir.join(format!("{name}-client.key")),
            issuer,
        };
        let (cert, key) = pki.server_pair("localhost");
        write(&pki.server_cert, &cert);
        write(&pki.server_key, &key);
        let (cert, key) = pki.issue(
            Vec::new(),
            "aura-client",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        write(&pki.client_cert, &cert);
        write(&pki.client_key, &key);
        pki.dir = dir.to_path_buf();
        pki
    }

    /// A new server certificate (PEM) and key (PEM) with common name `cn`.
    pub fn server_pair(&self, cn: &str) -> (String, String) {
        self.issue(
            vec!["localhost".into(), "127.0.0.1".into()],
            cn,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    fn issue(
        &self,
        names: Vec<String>,
        cn: &str,
        usage: ExtendedKeyUsagePurpose,
    ) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        (cert.pem(), key.serialize_pem())
    }

    /// The client certificate and key in one PEM buffer (what `reqwest::Identity` reads).
    pub fn client_identity(&self) -> reqwest::Identity {
        let mut pem = std::fs::read(&self.client_cert).expect("client cert");
        pem.push(b'\n');
        pem.extend(std::fs::read(&self.client_key).expect("client key"));
        reqwest::Identity::from_pem(&pem).expect("identity")
    }

    /// A reqwest client trusting only this CA.
    pub fn client(&self) -> reqwest::Client {
        self.client_builder().build().expect("client")
    }

    /// A reqwest client builder trusting only this CA.
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        aura_gateway::tls::install_crypto_provider();
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(
                reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).expect("CA"),
            )
            .timeout(std::time::Duration::from_secs(10))
    }

    /// Root certificates holding only this CA.
    pub fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        let ca = rustls::pki_types::CertificateDer::from_pem_slice(self.ca_pem.as_bytes());
        roots.add(ca.expect("CA")).expect("root");
        roots
    }

    /// A rustls client configuration trusting only this CA, offering `alpn`.
    pub fn rustls_client(&self, alpn: &[&[u8]], client_cert: bool) -> rustls::ClientConfig {
        aura_gateway::tls::install_crypto_provider();
        let builder = rustls::ClientConfig::builder().with_root_certificates(self.roots());
        let mut config = if client_cert {
            let chain = rustls::pki_types::CertificateDer::pem_file_iter(&self.client_cert)
                .expect("cert")
                .collect::<Result<Vec<_>, _>>()
                .expect("cert");
            let key =
                rustls::pki_types::PrivateKeyDer::from_pem_file(&self.client_key).expect("key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client auth")
        } else {
            builder.with_no_client_auth()
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }
}

use rustls::pki_types::pem::PemObject as _;

impl Pki {
    /// A rustls server configuration with the server certificate; with `client_auth`, clients
    /// must present a certificate from this CA.
    pub fn rustls_server(&self, client_auth: bool) -> std::sync::Arc<rustls::ServerConfig> {
        aura_gateway::tls::install_crypto_provider();
        let chain = rustls::pki_types::CertificateDer::pem_file_iter(&self.server_cert)
            .expect("cert")
            .collect::<Result<Vec<_>, _>>()
            .expect("cert");
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&self.server_key).expect("key");
        let builder = rustls::ServerConfig::builder();
        let builder = if client_auth {
            builder.with_client_cert_verifier(
                rustls::server::WebPkiClientVerifier::builder(std::sync::Arc::new(self.roots()))
                    .build()
                    .expect("verifier"),
            )
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_single_cert(chain, key).expect("server config");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        std::sync::Arc::new(config)
    }
}
