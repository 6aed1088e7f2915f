//! Hot swap of policy modules without a restart. On SIGHUP, or when the config file or a module
//! file changes, the plugin sections of the config file are read again; every module is
//! compiled, its exports checked, its configuration accepted and its stage's conformance vectors
//! run — only then are the new modules put in force, atomically. A request in flight finishes on
//! the modules it started with. A module that fails any check is refused with the reason and the
//! modules in force keep serving. Other sections of the config file need a restart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::registry::PolicyRegistry;
use super::stages::conformance::{self, ConformanceError, StageReport};
use super::{PluginError, Policies, StoredModuleError, fetch_stored_modules};
use crate::config::{self, Config, ConfigError};
use crate::error::GatewayError;
use crate::files::stamp;

/// Why a reload was refused; the modules in force keep serving.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// Nothing to reload from.
    #[error("the gateway was started without a config file")]
    NoConfigFile,
    /// The config file does not load.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A module named by digest is missing, or the store cannot be asked.
    #[error(transparent)]
    Stored(#[from] StoredModuleError),
    /// A module does not load (file, exports, configuration).
    #[error(transparent)]
    Module(#[from] PluginError),
    /// A module fails its stage's conformance vectors.
    #[error(transparent)]
    Conformance(#[from] ConformanceError),
    /// The reload task itself failed.
    #[error("reload task: {0}")]
    Task(String),
}

impl ReloadError {
    /// The answer of `POST /v1/policies/reload`: each kind its own status.
    pub fn into_gateway_error(self) -> GatewayError {
        let message = self.to_string();
        match self {
            ReloadError::NoConfigFile => GatewayError::conflict("no_config_file", message),
            ReloadError::Config(_) | ReloadError::Stored(StoredModuleError::Missing { .. }) => {
                GatewayError::bad_request("config_refused", message)
            }
            ReloadError::Stored(StoredModuleError::Store { .. }) => {
                GatewayError::unavailable("control_store_unavailable", message)
                    .retry_after(Duration::from_secs(1))
            }
            ReloadError::Module(_) | ReloadError::Conformance(_) => {
                GatewayError::bad_request("policy_refused", message)
            }
            ReloadError::Task(_) => GatewayError::internal(message),
        }
    }
}

/// Loads and checks the policy modules of `config` and swaps them in, or says why not.
fn reload(
    registry: &PolicyRegistry,
    path: &Path,
    running: &Config,
    config: Config,
    stored: &HashMap<String, Vec<u8>>,
) -> Result<Vec<StageReport>, ReloadError> {
    let policies = Policies::load_with(&registry.runtime, &config, path.parent(), stored)?;
    let reports = conformance::check(&policies)?;
    if !same_apart_from_plugins(running, &config) {
        tracing::warn!("only the plugin sections are reloaded; restart to apply the other changes");
    }
    registry.swap(policies);
    Ok(reports)
}

fn same_apart_from_plugins(a: &Config, b: &Config) -> bool {
    let strip = |c: &Config| {
        let mut c = c.clone();
        c.data_plane = Default::default();
        c.management_plane = Default::default();
        serde_json::to_value(c).unwrap_or_default()
    };
    strip(a) == strip(b)
}

impl PolicyRegistry {
    /// Reads the config file at `path` again and swaps in its policy modules (compiled off the
    /// async threads), logging and counting the result; `running` is the configuration the
    /// gateway started with (only the plugin sections are reloaded).
    pub async fn reload_from_file(
        self: &Arc<Self>,
        path: Option<&Path>,
        running: &Config,
        trigger: &str,
    ) -> Result<(), ReloadError> {
        let result = async {
            let path = path.ok_or(ReloadError::NoConfigFile)?.to_path_buf();
            let config = Config::load(Some(&path))?;
            let stored = fetch_stored_modules(&config, self.store().as_ref()).await?;
            let (registry, running) = (self.clone(), running.clone());
            tokio::task::spawn_blocking(move || reload(&registry, &path, &running, config, &stored))
                .await
                .map_err(|e| ReloadError::Task(e.to_string()))?
        }
        .await;
        let outcome = if result.is_ok() { "applied" } else { "refused" };
        self.metrics()
            .policy_reloads
            .with_label_values(&[outcome])
            .inc();
        match &result {
            Ok(reports) => {
                for r in reports {
                    tracing::info!(trigger, report = %r, "policy module in force");
                }
            }
            Err(reason) => {
                tracing::error!(trigger, reason = %reason, "policy reload refused; the modules in force keep serving");
            }
        }
        result.map(|_| ())
    }
}

/// The files whose change triggers a reload: the config file and every module file it names.
fn watched(path: &Path) -> Vec<PathBuf> {
    let mut files = vec![path.to_path_buf()];
    if let Ok(config) = Config::load(Some(path)) {
        files.extend(
            config
                .stages()
                .into_iter()
                .filter_map(|(_, s)| s.module_path().map(|m| config::resolve(path.parent(), m))),
        );
    }
    files
}

/// Reloads the config file at `path` on SIGHUP and, with `plugins.watch`, when a watched file
/// changes (`running`: the configuration the gateway started with).
pub fn spawn_triggers(registry: &Arc<PolicyRegistry>, path: Option<PathBuf>, running: &Config) {
    #[cfg(unix)]
    {
        let (registry, path, running) = (registry.clone(), path.clone(), running.clone());
        tokio::spawn(async move {
            let Ok(mut hup) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            else {
                return;
            };
            while hup.recv().await.is_some() {
                let _ = registry
                    .reload_from_file(path.as_deref(), &running, "SIGHUP")
                    .await;
            }
        });
    }
    let Some(path) = path else {
        return;
    };
    if !running.plugins.watch {
        return;
    }
    let (registry, running) = (registry.clone(), running.clone());
    let every = Duration::from_millis(running.plugins.watch_interval_ms);
    tokio::spawn(async move {
        let mut files = watched(&path);
        let mut stamps: Vec<_> = files.iter().map(|f| stamp(f)).collect();
        loop {
            tokio::time::sleep(every).await;
            let now: Vec<_> = files.iter().map(|f| stamp(f)).collect();
            if now == stamps {
                continue;
            }
            let _ = registry
                .reload_from_file(Some(&path), &running, "file change")
                .await;
            files = watched(&path);
            stamps = files.iter().map(|f| stamp(f)).collect();
        }
    });
}
