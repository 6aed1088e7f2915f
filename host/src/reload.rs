//! Hot swap of policy modules without a restart. On SIGHUP, or when the config file or a module
//! file changes, the plugin sections of the config file are read again; every module is
//! compiled, its exports checked, its configuration accepted and its stage's conformance vectors
//! run — only then are the new modules put in force, atomically. A request in flight finishes on
//! the modules it started with. A module that fails any check is refused with the reason and the
//! modules in force keep serving. Other sections of the config file need a restart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{self, Config, ConfigError};
use crate::error::GatewayError;
use crate::files::stamp;
use crate::policy::conformance::{self, ConformanceError, StageReport};
use crate::policy::{PluginError, Policies, StoredModuleError, fetch_stored_modules};
use crate::state::AppState;

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
    state: &AppState,
    path: &Path,
    config: Config,
    stored: &HashMap<String, Vec<u8>>,
) -> Result<Vec<StageReport>, ReloadError> {
    let policies = Policies::load_with(&state.policies.runtime, &config, path.parent(), stored)?;
    let reports = conformance::check(&policies)?;
    if !same_apart_from_plugins(&state.config, &config) {
        tracing::warn!("only the plugin sections are reloaded; restart to apply the other changes");
    }
    state.policies.swap(policies);
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

/// Reads the config file again and swaps in its policy modules (compiled off the async
/// threads), logging and counting the result.
pub async fn reload_and_log(state: &AppState, trigger: &str) -> Result<(), ReloadError> {
    let result = async {
        let path = state
            .config_path
            .get()
            .cloned()
            .ok_or(ReloadError::NoConfigFile)?;
        let config = Config::load(Some(&path))?;
        let stored = fetch_stored_modules(&config, state.auth.store.as_ref()).await?;
        let worker = state.clone();
        tokio::task::spawn_blocking(move || reload(&worker, &path, config, &stored))
            .await
            .map_err(|e| ReloadError::Task(e.to_string()))?
    }
    .await;
    match &result {
        Ok(reports) => {
            state
                .metrics
                .policy_reloads
                .with_label_values(&["applied"])
                .inc();
            for r in reports {
                tracing::info!(trigger, report = %r, "policy module in force");
            }
        }
        Err(reason) => {
            state
                .metrics
                .policy_reloads
                .with_label_values(&["refused"])
                .inc();
            tracing::error!(trigger, reason = %reason, "policy reload refused; the modules in force keep serving");
        }
    }
    result.map(|_| ())
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

/// Reloads on SIGHUP and, with `plugins.watch`, when a watched file changes.
pub fn spawn_triggers(state: &AppState) {
    #[cfg(unix)]
    {
        let state = state.clone();
        tokio::spawn(async move {
            let Ok(mut hup) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            else {
                return;
            };
            while hup.recv().await.is_some() {
                let _ = reload_and_log(&state, "SIGHUP").await;
            }
        });
    }
    let Some(path) = state.config_path.get().cloned() else {
        return;
    };
    if !state.config.plugins.watch {
        return;
    }
    let state = state.clone();
    let every = Duration::from_millis(state.config.plugins.watch_interval_ms);
    tokio::spawn(async move {
        let mut files = watched(&path);
        let mut stamps: Vec<_> = files.iter().map(|f| stamp(f)).collect();
        loop {
            tokio::time::sleep(every).await;
            let now: Vec<_> = files.iter().map(|f| stamp(f)).collect();
            if now == stamps {
                continue;
            }
            let _ = reload_and_log(&state, "file change").await;
            files = watched(&path);
            stamps = files.iter().map(|f| stamp(f)).collect();
        }
    });
}
