//! PostgreSQL and Redis servers of the test's own that require TLS (plain connections are
//! refused), with certificates from a [`Pki`](super::pki::Pki). Stopped when dropped.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::free_port;
use super::pki::Pki;

/// The directory of PostgreSQL's server programs (`initdb`, `pg_ctl`).
fn postgres_bin() -> PathBuf {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return dir.into();
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect(
            "PostgreSQL server programs under /usr/lib/postgresql (the test command installs them)",
        )
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().expect("an initdb")
}

/// `program` of `bin` run as the `postgres` user on the data directory `data` (`-D data`).
fn as_postgres(bin: &Path, program: &str, data: &Path) -> Command {
    let mut command = Command::new("runuser");
    command
        .args(["-u", "postgres", "--"])
        .arg(bin.join(program));
    command.arg("-D").arg(data).current_dir("/");
    command
}

fn run(command: &mut Command, what: &str) {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A PostgreSQL server accepting only TLS connections on 127.0.0.1 (`hostnossl … reject`).
pub struct TlsPostgres {
    pub port: u16,
    data: PathBuf,
    _dir: tempfile::TempDir,
}

impl TlsPostgres {
    /// initdb, certificates, `ssl = on`, start. The server runs as the `postgres` user
    /// (initdb refuses root).
    pub fn start(pki: &Pki) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        // The server user must reach its data directory inside ours.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        let root = dir.path().join("pg");
        let data = root.join("data");
        run(
            Command::new("install")
                .args(["-d", "-o", "postgres", "-g", "postgres", "-m", "0700"])
                .arg(&root),
            "create the data directory",
        );
        let bin = postgres_bin();
        let mut initdb = as_postgres(&bin, "initdb", &data);
        initdb.args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"]);
        run(&mut initdb, "initdb");
        for (from, to, mode) in [
            (&pki.server_key, "server.key", "0600"),
            (&pki.server_cert, "server.crt", "0644"),
            (&pki.ca, "root.crt", "0644"),
        ] {
            run(
                Command::new("install")
                    .args(["-o", "postgres", "-g", "postgres", "-m", mode])
                    .arg(from)
                    .arg(data.join(to)),
                "install a certificate",
            );
        }
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 0.0.0.0/0 reject\n",
        )
        .expect("pg_hba");
        let port = free_port();
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .expect("postgresql.conf");
        use std::io::Write as _;
        write!(
            conf,
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
             ssl_ca_file = 'root.crt'\nfsync = off\n",
            root.display()
        )
        .expect("write conf");
        let mut start = as_postgres(&bin, "pg_ctl", &data);
        start.arg("-l").arg(root.join("server.log"));
        run(start.args(["-w", "-t", "30", "start"]), "pg_ctl start");
        Self {
            port,
            data,
            _dir: dir,
        }
    }

    /// `postgres://postgres@localhost:{port}/{db}` with the URL's own TLS settings `params`.
    pub fn url(&self, db: &str, params: &str) -> String {
        format!("postgres://postgres@localhost:{}/{db}{params}", self.port)
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let mut stop = as_postgres(&postgres_bin(), "pg_ctl", &self.data);
        stop.args(["-m", "immediate", "-w", "stop"]);
        let _ = stop.stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

/// A Redis server on a TLS port only, asking clients for a certificate and a password.
pub struct TlsRedis {
    child: Child,
    pub port: u16,
    pub password: &'static str,
}

impl TlsRedis {
    /// Starts one (`--port 0 --tls-port …`, `--tls-auth-clients yes`, `--requirepass`).
    pub fn start(pki: &Pki) -> Self {
        let port = free_port();
        let password = "redis-tls-password";
        let path = |p: &Path| p.display().to_string();
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--requirepass",
                password,
            ])
            .args(["--tls-cert-file", &path(&pki.server_cert)])
            .args(["--tls-key-file", &path(&pki.server_key)])
            .args(["--tls-ca-cert-file", &path(&pki.ca)])
            .args(["--tls-auth-clients", "yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the test command installs it)");
        let what = "redis-server (TLS) did not start";
        super::wait_for_port(port, Duration::from_secs(10), what);
        Self {
            child,
            port,
            password,
        }
    }

    /// `rediss://:{password}@localhost:{port}/`.
    pub fn url(&self) -> String {
        format!("rediss://:{}@localhost:{}/", self.password, self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `tls { … verify: true }` block for a NATS server configuration: TLS required, and a
/// client certificate from `pki`'s CA.
pub fn nats_tls_block(pki: &Pki) -> String {
    format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n}}\n",
        pki.server_cert.display(),
        pki.server_key.display(),
        pki.ca.display()
    )
}
