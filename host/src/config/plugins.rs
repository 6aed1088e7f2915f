//! `[plugins]` (the WebAssembly policy runtime) and the stage sections of each plane
//! (`data_plane.plugins.<stage>`, `management_plane.plugins.<stage>`): which module runs a stage,
//! its configuration and its candidate.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{ConfigError, bearer_token, problem, resolve};
use crate::stage::{STAGES, Stage, Trial};

/// How plugin instances are used across calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InstanceReuse {
    /// Configured instances are kept per module and reused, one call at a time; an instance
    /// that fails is discarded.
    Pooled,
    /// Every call gets a new store and instance (configured anew).
    Fresh,
}

/// The WebAssembly policy runtime.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PluginRuntimeConfig {
    /// `pooled` (default, measured faster) or `fresh`.
    pub instance_reuse: InstanceReuse,
    /// Wall-clock deadline of one plugin call, in milliseconds.
    pub call_deadline_ms: u64,
    /// Linear memory cap of one plugin instance, in bytes.
    pub memory_limit_bytes: usize,
    /// Idle instances kept per loaded module (pooled mode).
    pub max_idle_instances: usize,
    /// Reload the plugin sections when the config file or a module file changes (SIGHUP always
    /// reloads).
    pub watch: bool,
    /// How often the config and module files are checked for changes, in milliseconds.
    pub watch_interval_ms: u64,
    /// A swapped-in module failing (trap, deadline, memory) on more than this share of its
    /// calls within `rollback_window_secs` is replaced by the previous modules.
    pub rollback_failure_ratio: f64,
    /// The window of `rollback_failure_ratio`, in seconds.
    pub rollback_window_secs: u64,
    /// Calls a window needs before the ratio is judged.
    pub rollback_min_calls: u64,
    /// Largest module a project may upload, in bytes.
    pub tenant_max_module_bytes: usize,
    /// Longest compile time of an uploaded module, in milliseconds.
    pub tenant_max_compile_ms: u64,
    /// How often every instance reloads the projects' modules from the control store, in
    /// seconds.
    pub tenant_refresh_secs: u64,
    /// Bearer token of `POST /v1/policies/reload` on the management plane; none: no such route.
    pub admin_token: Option<String>,
    /// Largest private memory (heap, anonymous maps, thread stacks) the process compiling an
    /// uploaded module may use, in bytes; past it the compilation is stopped and the module
    /// refused.
    pub tenant_max_compile_memory_bytes: u64,
    /// Uploaded modules compiled at once (each in a process of its own).
    pub tenant_compile_concurrency: usize,
    /// Module uploads in progress at once per instance; past it an upload is answered `503`.
    pub tenant_max_concurrent_uploads: usize,
    /// Of those, uploads one organization may have in progress at once (the others' share
    /// stays free); past it its upload is answered `503 uploads_busy`.
    pub tenant_max_concurrent_uploads_per_org: usize,
    /// Largest stage configuration accepted, in bytes of its JSON text: in a project's upload
    /// (`413 config_too_large`), in this file's `plugins.*.config`, and read back from the
    /// control store (a larger one is refused like a module that does not load). The policy
    /// history keeps each configuration once, bounded by it.
    pub max_config_bytes: usize,
    /// The executable run to compile uploaded modules (`<exe> compile-worker`). None: this
    /// executable.
    pub tenant_compile_worker: Option<String>,
    /// Memory kept for compiled modules (by digest), in bytes: a module installed again, or by
    /// several projects, is not compiled again.
    pub compiled_cache_bytes: u64,
    /// A folder where modules named in the configuration are kept compiled (by digest and engine
    /// settings), so that a restart or `check-config` loads them instead of compiling them
    /// again: seconds per module for a Python or JavaScript runtime. Relative to the config
    /// file; created with mode 0700; refused when another user owns it or it is writable by
    /// others (its files are native code). None: always compile.
    pub compile_cache_dir: Option<String>,
    /// How long a module refused when loaded is remembered (by digest and configuration) and
    /// refused again without being recompiled, in seconds.
    pub tenant_refused_retry_secs: u64,
    /// The memory every instance of projects' modules may hold together (linear memories,
    /// tables and an estimate of each instance's own state), in bytes. Instances are made when a
    /// project's module is called and kept while warm; past the budget the coldest idle ones are
    /// dropped (made again on the next call). Operator modules have their own instances and
    /// never count against it.
    pub tenant_instance_budget_bytes: usize,
    /// The memory the projects' compiled modules in use may hold together, in bytes: each
    /// digest once (its compiled image and what the runtime builds for it, estimated). Past it
    /// the modules of the projects called least recently are unloaded (loaded again, from the
    /// compile cache, on their next request); a project called in the last second is never
    /// unloaded.
    pub tenant_code_budget_bytes: usize,
    /// Threads running projects' module calls (off the request workers).
    pub tenant_threads: usize,
    /// Calls of one project's modules in progress at once (below `tenant_threads`).
    pub tenant_max_concurrent_calls: usize,
    /// The share of one core the calls of heavy projects (whose last call ran for a quarter of
    /// `call_deadline_ms` or more) may use together, on their threads of their own. Small by
    /// default: where the kernel lets a low-priority thread finish its time slice before a
    /// woken request worker runs, every millisecond of theirs shows in other projects' tail
    /// latency.
    pub tenant_heavy_cpu_share: f64,
    /// How long a tenant module call may wait for a place before its request fails closed
    /// (`503 policy_busy`), in milliseconds.
    pub tenant_queue_timeout_ms: u64,
    /// How often stored modules no project uses are collected, in seconds.
    pub module_gc_interval_secs: u64,
    /// A stored module is collected once no project references it and no instance has used it
    /// for this long, in seconds.
    pub module_gc_grace_secs: u64,
    /// The decisions kept for modules that declare their inputs (`aura:gateway@0.3.0` and later).
    pub decision_cache: DecisionCacheConfig,
}

/// `plugins.decision_cache`: the bounds of each module's decision cache, and of all of them.
///
/// A module that declares the inputs its decisions depend on is called once per distinct
/// declared inputs within its maximum age; its decisions are kept per loaded module and per
/// partition (the caller's project, or address before authentication), and every module's
/// decisions share one ceiling of bytes per instance (`total_bytes`).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DecisionCacheConfig {
    /// Keep decisions at all (`false`: every module is called on every request).
    pub enabled: bool,
    /// Decisions kept per module (a stage's module in force, a candidate, a project's module).
    pub entries: usize,
    /// Bytes kept per module (keys and decisions, estimated).
    pub bytes: usize,
    /// Decisions kept per partition of a module: one project's (or address's) unique inputs
    /// evict only its own decisions past this.
    pub partition_entries: usize,
    /// Bytes kept per partition of a module.
    pub partition_bytes: usize,
    /// The longest a decision is kept, in milliseconds, whatever a module declares.
    pub max_age_ms: u64,
    /// Bytes kept by every module's cache of the instance together (keys and decisions,
    /// estimated). When an insert finds no room, the caches furthest over their fair share (the
    /// ceiling over the caches that keep entries) give back entries first.
    pub total_bytes: usize,
    /// A shard of a module's cache that no request looked up for this long (or for the
    /// module's maximum age, when shorter) gives its entries back, in seconds.
    pub idle_secs: u64,
}

impl Default for DecisionCacheConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            entries: 16_384,
            bytes: 8 << 20,
            partition_entries: 1_024,
            partition_bytes: 512 << 10,
            max_age_ms: 300_000,
            total_bytes: 64 << 20,
            idle_secs: 300,
        }
    }
}

impl DecisionCacheConfig {
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        for (field, value, max) in [
            ("entries", self.entries, 1 << 24),
            ("bytes", self.bytes, 1 << 32),
            ("partition_entries", self.partition_entries, 1 << 24),
            ("partition_bytes", self.partition_bytes, 1 << 32),
        ] {
            super::within(key, field, value as u64, 1, max)?;
        }
        if self.partition_entries > self.entries || self.partition_bytes > self.bytes {
            return Err(problem(
                key,
                "partition_entries and partition_bytes must not exceed entries and bytes",
            ));
        }
        super::at_most(key, "max_age_ms", self.max_age_ms, 86_400_000)
            .map_err(super::noted("a day"))?;
        if !(1 << 16..=1 << 40).contains(&self.total_bytes) {
            return Err(problem(
                &format!("{key}.total_bytes"),
                "must be between 65536 (64 KiB) and 1099511627776 (1 TiB)",
            ));
        }
        if self.bytes > self.total_bytes {
            return Err(problem(
                &format!("{key}.total_bytes"),
                format!(
                    "must be at least {key}.bytes ({}): one module's cache is bounded within every module's",
                    self.bytes
                ),
            ));
        }
        super::within(key, "idle_secs", self.idle_secs, 1, 86_400).map_err(super::noted("a day"))
    }
}

impl Default for PluginRuntimeConfig {
    fn default() -> Self {
        Self {
            instance_reuse: InstanceReuse::Pooled,
            call_deadline_ms: 20,
            memory_limit_bytes: 16 * 1024 * 1024,
            max_idle_instances: 16,
            watch: true,
            watch_interval_ms: 1_000,
            rollback_failure_ratio: 0.5,
            rollback_window_secs: 10,
            rollback_min_calls: 20,
            tenant_max_module_bytes: 4 * 1024 * 1024,
            tenant_max_compile_ms: 10_000,
            tenant_refresh_secs: 5,
            admin_token: None,
            tenant_max_compile_memory_bytes: 512 << 20,
            tenant_compile_concurrency: 1,
            tenant_max_concurrent_uploads: 2,
            tenant_max_concurrent_uploads_per_org: 1,
            max_config_bytes: 64 * 1024,
            tenant_compile_worker: None,
            compiled_cache_bytes: 128 * 1024 * 1024,
            compile_cache_dir: None,
            tenant_refused_retry_secs: 3_600,
            tenant_instance_budget_bytes: 256 << 20,
            tenant_code_budget_bytes: 256 << 20,
            tenant_threads: 4,
            tenant_max_concurrent_calls: 2,
            tenant_heavy_cpu_share: 0.05,
            tenant_queue_timeout_ms: 100,
            module_gc_interval_secs: 3_600,
            module_gc_grace_secs: 7 * 24 * 3_600,
            decision_cache: DecisionCacheConfig::default(),
        }
    }
}

impl PluginRuntimeConfig {
    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        let within = |field, value, low, high| super::within(key, field, value, low, high);
        let at_least = |field, value, min| super::at_least(key, field, value, min);
        within("call_deadline_ms", self.call_deadline_ms, 1, 10_000)?;
        if !(1 << 20..=1 << 30).contains(&self.memory_limit_bytes) {
            return Err(problem(
                &format!("{key}.memory_limit_bytes"),
                "must be between 1 MiB (1048576) and 1 GiB (1073741824)",
            ));
        }
        if !(self.rollback_failure_ratio > 0.0 && self.rollback_failure_ratio <= 1.0) {
            return Err(problem(
                &format!("{key}.rollback_failure_ratio"),
                "must be in (0, 1]",
            ));
        }
        if self.rollback_window_secs == 0
            || self.rollback_min_calls == 0
            || self.watch_interval_ms == 0
        {
            return Err(problem(
                key,
                "rollback_window_secs, rollback_min_calls and watch_interval_ms must be at least 1",
            ));
        }
        if let Some(token) = &self.admin_token {
            bearer_token(&format!("{key}.admin_token"), token)?;
        }
        at_least("max_idle_instances", self.max_idle_instances as u64, 1)?;
        at_least(
            "tenant_instance_budget_bytes",
            self.tenant_instance_budget_bytes as u64,
            1 << 20,
        )
        .map_err(super::noted("1 MiB"))?;
        if !(0.01..=64.0).contains(&self.tenant_heavy_cpu_share) {
            return Err(problem(
                &format!("{key}.tenant_heavy_cpu_share"),
                "must be between 0.01 and 64 (a share of one core)",
            ));
        }
        at_least(
            "tenant_code_budget_bytes",
            self.tenant_code_budget_bytes as u64,
            1 << 20,
        )
        .map_err(super::noted("1 MiB"))?;
        if self.tenant_max_compile_memory_bytes < 256 << 20 {
            return Err(problem(
                &format!("{key}.tenant_max_compile_memory_bytes"),
                "must be at least 256 MiB (268435456): the compiler's own threads need about 100",
            ));
        }
        for (field, value) in [
            (
                "tenant_compile_concurrency",
                self.tenant_compile_concurrency,
            ),
            (
                "tenant_max_concurrent_uploads",
                self.tenant_max_concurrent_uploads,
            ),
            ("tenant_threads", self.tenant_threads),
            (
                "tenant_max_concurrent_calls",
                self.tenant_max_concurrent_calls,
            ),
        ] {
            at_least(field, value as u64, 1)?;
        }
        if self.tenant_max_concurrent_uploads_per_org == 0
            || self.tenant_max_concurrent_uploads_per_org > self.tenant_max_concurrent_uploads
        {
            return Err(problem(
                &format!("{key}.tenant_max_concurrent_uploads_per_org"),
                format!(
                    "must be between 1 and {key}.tenant_max_concurrent_uploads ({})",
                    self.tenant_max_concurrent_uploads
                ),
            ));
        }
        within("max_config_bytes", self.max_config_bytes as u64, 2, 1 << 20)
            .map_err(super::noted("1 MiB"))?;
        if self.tenant_threads > 1 && self.tenant_max_concurrent_calls >= self.tenant_threads {
            return Err(problem(
                &format!("{key}.tenant_max_concurrent_calls"),
                format!(
                    "must be below {key}.tenant_threads ({}), so that one project can never take every tenant thread",
                    self.tenant_threads
                ),
            ));
        }
        if let Some(worker) = &self.tenant_compile_worker
            && !Path::new(worker).is_file()
        {
            return Err(problem(
                &format!("{key}.tenant_compile_worker"),
                format!("{worker} is not a file"),
            ));
        }
        if self.module_gc_interval_secs == 0 || self.tenant_refused_retry_secs == 0 {
            return Err(problem(
                key,
                "module_gc_interval_secs and tenant_refused_retry_secs must be at least 1",
            ));
        }
        self.decision_cache
            .validate(&format!("{key}.decision_cache"))?;
        Ok(())
    }
}

/// The value of `module` naming the embedded default plugin.
pub const BUILTIN: &str = "builtin";

/// The prefix of `module` naming a module of the control store by digest.
pub const STORE_PREFIX: &str = "sha256:";

/// Whether `s` is a SHA-256 digest in lower-case hex.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Which module runs a stage, and its configuration.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StageConfig {
    /// `builtin` for the default plugin embedded in the binary, a path to a `.wasm` component,
    /// or `sha256:<digest>` for a module of the control store's module store.
    pub module: String,
    /// The stage's own configuration, passed to the plugin's `configure` as JSON.
    pub config: serde_json::Value,
    /// A module tried next to this one on live traffic (the `cors` and `quota` stages only): its
    /// own `module` and `config`, with `mode` = `shadow` (run and compared, never deciding) or
    /// `canary` with `percent` (deciding for that share of actors).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidate: Option<Box<StageConfig>>,
    /// In a candidate: `shadow` or `canary`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// In a canary: the share of actors it decides for, 1–100.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent: Option<u8>,
}

impl Default for StageConfig {
    fn default() -> Self {
        Self {
            module: BUILTIN.to_owned(),
            config: serde_json::Value::Object(serde_json::Map::new()),
            candidate: None,
            mode: None,
            percent: None,
        }
    }
}

impl StageConfig {
    /// The module file, or `None` for the built-in plugin or a module of the store.
    pub fn module_path(&self) -> Option<&Path> {
        (self.module != BUILTIN && self.module_digest().is_none()).then(|| Path::new(&self.module))
    }

    /// The digest of a module in the control store's module store (`module = "sha256:<hex>"`).
    pub fn module_digest(&self) -> Option<&str> {
        self.module.strip_prefix(STORE_PREFIX)
    }

    /// How the candidate is tried (`None` for a stage's module in force, or a mode that
    /// validation refuses).
    pub fn trial(&self) -> Option<Trial> {
        Trial::parse(self.mode.as_deref()?, self.percent)
            .ok()
            .flatten()
    }

    /// Checks the section of `stage` named `key` (a candidate when `candidate`): a mode only
    /// in a candidate, a candidate only where the stage takes one, a configuration of at most
    /// `max_config_bytes`, a module that exists (`base` resolves a relative path).
    pub(super) fn validate(
        &self,
        key: &str,
        stage: Stage,
        candidate: bool,
        max_config_bytes: usize,
        base: Option<&Path>,
    ) -> Result<(), ConfigError> {
        if !candidate && (self.mode.is_some() || self.percent.is_some()) {
            return Err(problem(
                &format!("{key}.mode"),
                "only a candidate has a mode and a percent",
            ));
        }
        if self.candidate.is_some() && (candidate || !stage.info().trials) {
            let trials: Vec<&str> = STAGES.iter().filter(|s| s.trials).map(|s| s.key).collect();
            return Err(problem(
                &format!("{key}.candidate"),
                format!(
                    "only the {} stages take a candidate (one, not nested)",
                    trials.join(" and ")
                ),
            ));
        }
        if candidate {
            let Some(mode) = self.mode.as_deref() else {
                return Err(problem(&format!("{key}.mode"), "shadow or canary"));
            };
            match Trial::parse(mode, self.percent) {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(problem(
                        &format!("{key}.mode"),
                        "a candidate is tried as shadow or canary",
                    ));
                }
                Err(e) => {
                    let (field, reason) = e.split_once(": ").unwrap_or(("mode", &e));
                    return Err(problem(&format!("{key}.{field}"), reason));
                }
            }
        }
        if !self.config.is_object() {
            return Err(problem(&format!("{key}.config"), "must be a table"));
        }
        let size = self.config.to_string().len();
        if size > max_config_bytes {
            return Err(problem(
                &format!("{key}.config"),
                format!(
                    "is {size} bytes as JSON; at most plugins.max_config_bytes ({max_config_bytes}) are accepted"
                ),
            ));
        }
        if let Some(digest) = self.module_digest()
            && !is_sha256_hex(digest)
        {
            return Err(problem(
                &format!("{key}.module"),
                "sha256: must be followed by 64 lower-case hex digits",
            ));
        }
        if let Some(path) = self.module_path() {
            let resolved = resolve(base, path);
            if !resolved.is_file() {
                return Err(problem(
                    &format!("{key}.module"),
                    format!(
                        "{} is not a file (use \"builtin\" or a path to a .wasm component)",
                        resolved.display()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Data-plane stage modules.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DataPlaneStages {
    pub api_key: StageConfig,
    pub cors: StageConfig,
    pub quota: StageConfig,
    pub db_routing: StageConfig,
}

impl DataPlaneStages {
    /// The section of `stage`.
    pub fn get(&self, stage: Stage) -> Option<&StageConfig> {
        Some(match stage {
            Stage::ApiKey => &self.api_key,
            Stage::Cors => &self.cors,
            Stage::Quota => &self.quota,
            Stage::DbRouting => &self.db_routing,
        })
    }

    /// The section of `stage`, to change it.
    pub fn get_mut(&mut self, stage: Stage) -> Option<&mut StageConfig> {
        Some(match stage {
            Stage::ApiKey => &mut self.api_key,
            Stage::Cors => &mut self.cors,
            Stage::Quota => &mut self.quota,
            Stage::DbRouting => &mut self.db_routing,
        })
    }
}

/// Management-plane stage modules (there are no API keys on this plane).
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ManagementPlaneStages {
    pub cors: StageConfig,
    pub quota: StageConfig,
    pub db_routing: StageConfig,
}

impl ManagementPlaneStages {
    /// The section of `stage`; `None` for a stage that does not run on this plane.
    pub fn get(&self, stage: Stage) -> Option<&StageConfig> {
        match stage {
            Stage::ApiKey => None,
            Stage::Cors => Some(&self.cors),
            Stage::Quota => Some(&self.quota),
            Stage::DbRouting => Some(&self.db_routing),
        }
    }

    /// The section of `stage`, to change it; `None` for a stage that does not run on this
    /// plane.
    pub fn get_mut(&mut self, stage: Stage) -> Option<&mut StageConfig> {
        match stage {
            Stage::ApiKey => None,
            Stage::Cors => Some(&mut self.cors),
            Stage::Quota => Some(&mut self.quota),
            Stage::DbRouting => Some(&mut self.db_routing),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decision_caches_ceiling_and_idle_time_are_validated_naming_the_key() {
        let refused = |edit: &dyn Fn(&mut DecisionCacheConfig), field: &str| {
            let mut config = PluginRuntimeConfig::default();
            edit(&mut config.decision_cache);
            let err = config.validate("plugins").expect_err(field);
            assert_eq!(err.key, format!("plugins.decision_cache.{field}"), "{err}");
            err.problem
        };
        refused(&|c| c.total_bytes = 1024, "total_bytes");
        refused(&|c| c.total_bytes = (1 << 40) + 1, "total_bytes");
        let problem = refused(&|c| c.total_bytes = 4 << 20, "total_bytes");
        assert!(
            problem.contains("plugins.decision_cache.bytes (8388608)"),
            "{problem}"
        );
        refused(&|c| c.idle_secs = 0, "idle_secs");
        refused(&|c| c.idle_secs = 86_401, "idle_secs");
        let mut config = PluginRuntimeConfig::default();
        assert_eq!(config.decision_cache.total_bytes, 64 << 20);
        config.decision_cache.bytes = 1 << 20;
        config.decision_cache.partition_bytes = 64 << 10;
        config.decision_cache.total_bytes = 1 << 20;
        assert!(config.validate("plugins").is_ok());
    }
}
