//! One way to start a gateway for a test: `Gateway::builder()`, its options, then `.start()`
//! (in this process) or `.binary()` (the real binary).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use aura_gateway::config::Config;
use aura_gateway::control::ControlStore;

use super::config::{binary_config, test_config};
use super::fixture::Fixture;
use super::gateway::{InProcess, Process};
use super::records::e2e_store;
use super::responder::Bus;

/// The gateway under test.
#[derive(Debug)]
pub struct Gateway;

impl Gateway {
    /// A gateway on the shared NATS server under a fresh subject prefix, with the test
    /// configuration; see [`Builder`] for the rest.
    pub fn builder<'a>() -> Builder<'a> {
        Builder::default()
    }

    /// `Gateway::builder().with(edit)`.
    pub fn with<'a>(edit: impl FnOnce(&mut Config) + 'a) -> Builder<'a> {
        Self::builder().with(edit)
    }

    /// `Gateway::builder().with(edit).start()`.
    pub async fn start_with(edit: impl FnOnce(&mut Config)) -> InProcess {
        Self::builder().with(edit).start().await
    }

    /// `Gateway::builder().start()`: in process, with the test configuration.
    pub async fn start() -> InProcess {
        Self::builder().start().await
    }
}

/// A change a test makes to the in-process gateway's configuration.
type Edit<'a> = Box<dyn FnOnce(&mut Config) + 'a>;

/// What a test asks of its gateway.
///
/// Records: in process, the standard e2e records ([`super::records`]) unless the test gives a
/// [`Fixture`], a store, or a control file of its own (`config.control.file`); the binary always
/// runs over a fixture's records (a new one unless given) in a control file.
#[derive(Default)]
pub struct Builder<'a> {
    nats: Option<String>,
    prefix: Option<String>,
    toml: String,
    records: String,
    fixture: Option<Fixture>,
    dir: Option<PathBuf>,
    kept_dir: Option<tempfile::TempDir>,
    store: Option<Arc<dyn ControlStore>>,
    edits: Vec<Edit<'a>>,
}

impl<'a> Builder<'a> {
    /// NATS at `url` (default: the shared server).
    pub fn nats(mut self, url: impl Into<String>) -> Self {
        self.nats = Some(url.into());
        self
    }

    /// The subject prefix (default: one no other test uses).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// NATS server and prefix of `bus`.
    pub fn bus(self, bus: &Bus) -> Self {
        self.nats(&bus.url).prefix(&bus.prefix)
    }

    /// The binary's configuration: `toml` appended (tables of its own; a `[control]` table
    /// replaces the control file).
    pub fn toml(mut self, toml: impl AsRef<str>) -> Self {
        self.toml.push_str(toml.as_ref());
        self
    }

    /// Control records appended to the fixture's.
    pub fn records(mut self, records: impl AsRef<str>) -> Self {
        self.records.push_str(records.as_ref());
        self
    }

    /// `fx`'s records.
    pub fn fixture(mut self, fx: &Fixture) -> Self {
        self.fixture = Some(fx.clone());
        self
    }

    /// The gateway's files (control file, configuration, log) in `dir` (default: a new folder
    /// the handle keeps).
    pub fn dir(mut self, dir: &Path) -> Self {
        self.dir = Some(dir.to_path_buf());
        self
    }

    /// The gateway's files in `dir`, which the handle keeps.
    pub fn keep_dir(mut self, dir: tempfile::TempDir) -> Self {
        self.dir = Some(dir.path().to_path_buf());
        self.kept_dir = Some(dir);
        self
    }

    /// In process, over `store`.
    pub fn store(mut self, store: Arc<dyn ControlStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// In process, `edit` applied to the test configuration.
    pub fn with(mut self, edit: impl FnOnce(&mut Config) + 'a) -> Self {
        self.edits.push(Box::new(edit));
        self
    }

    fn bus_of(&self) -> Bus {
        let nats = self
            .nats
            .clone()
            .unwrap_or_else(|| super::nats_server::shared().url());
        let prefix = self.prefix.clone().unwrap_or_else(super::unique_prefix);
        Bus::new(&nats, &prefix)
    }

    /// The folder: the test's, or a new one (returned to be kept).
    fn folder(&mut self) -> (PathBuf, Option<tempfile::TempDir>) {
        match &self.dir {
            Some(dir) => (dir.clone(), self.kept_dir.take()),
            None => {
                let tmp = tempfile::tempdir().expect("tempdir");
                (tmp.path().to_path_buf(), Some(tmp))
            }
        }
    }

    /// Starts the gateway in this process.
    pub async fn start(mut self) -> InProcess {
        assert!(self.toml.is_empty(), "`toml` configures the binary");
        let bus = self.bus_of();
        let mut config = test_config(&bus.url, &bus.prefix);
        for edit in std::mem::take(&mut self.edits) {
            edit(&mut config);
        }
        let mut kept = None;
        let store: Arc<dyn ControlStore> = if let Some(store) = self.store.take() {
            store
        } else if let Some(fx) = self.fixture.clone() {
            let (dir, tmp) = self.folder();
            kept = tmp;
            let path = dir.join("control.toml");
            let records = format!("{}{}", fx.control_file(), self.records);
            std::fs::write(&path, records).expect("write control file");
            let store = aura_gateway::control::file::FileStore::open(&path);
            Arc::new(store.expect("valid control file"))
        } else if config.control.file.is_some() {
            aura_gateway::control::open(&config.control, None)
                .await
                .expect("control store")
        } else {
            Arc::new(e2e_store())
        };
        InProcess::start_with_store(config, store, kept).await
    }

    /// Starts the gateway binary.
    pub fn binary(mut self) -> Started {
        assert!(
            self.edits.is_empty(),
            "`with` configures the in-process gateway"
        );
        let bus = self.bus_of();
        let (path, tmp) = self.folder();
        let fx = self.fixture.unwrap_or_default();
        let config = binary_config(&path, &fx, &self.records, &bus.url, &bus.prefix, &self.toml);
        let mut gw = Process::serve(&config, &path);
        (gw.bus, gw.folder) = (bus, tmp);
        Started {
            gw,
            fx,
            dir: Dir { path },
        }
    }
}

/// A gateway binary, the records it runs over, and its folder.
pub struct Started {
    pub gw: Process,
    pub fx: Fixture,
    pub dir: Dir,
}

/// A gateway's folder (removed with the gateway's handle when the builder made it).
#[derive(Debug, Clone)]
pub struct Dir {
    path: PathBuf,
}

impl Dir {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A gateway binary off NATS (subject prefix `prefix`) with `toml`.
pub(crate) fn offline(prefix: &str, toml: &str) -> Started {
    let gw = Gateway::builder().nats("nats://127.0.0.1:1").prefix(prefix);
    gw.toml(toml).binary()
}
