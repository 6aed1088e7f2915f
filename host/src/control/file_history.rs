//! The file store's policy history: one JSON-lines file per project (or the operator) and stage,
//! each kept to its newest [`HISTORY_KEPT`] events, and the configurations apart — one file per
//! distinct configuration of that stream — so that a listing never reads a configuration and a
//! rollback reads only the one it restores.
//!
//! ```text
//! policy-history/                       beside the control file
//!   operator/cors.jsonl                 the operator's cors events, oldest first
//!   operator/cors.configs/<sha256>.json
//!   p-<sha256 of the ref>/quota.jsonl   a project's quota events
//!   p-<sha256 of the ref>/quota.configs/<sha256>.json
//! ```
//!
//! A stream is cut to its newest events (and its unreferenced configurations removed) when it
//! passes [`HISTORY_KEPT`] by a quarter: one project's installs never remove another's history
//! or the operator's. Without a control file the history is kept in memory, with the same bound
//! per stream.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::{HISTORY_KEPT, PolicyEventRecord, StoreError};

/// The file of the single history written by earlier versions (every stream in one file);
/// moved into the streams when the store opens.
pub const LEGACY_FILE: &str = "policy-history.jsonl";

/// The folder of the streams, beside the control file.
pub const DIR: &str = "policy-history";

/// A stream is cut back to [`HISTORY_KEPT`] events once it holds this many.
const CUT_AT: usize = HISTORY_KEPT + HISTORY_KEPT / 4;

/// Whether `stage` can name a stream: a stage key (`cors`, `db_routing`), 1 to 32 of `a–z`,
/// `0–9`, `_`, `-`, starting with a letter. Anything else names no stream (and no file).
pub fn is_stage_name(stage: &str) -> bool {
    (1..=32).contains(&stage.len())
        && stage.as_bytes()[0].is_ascii_lowercase()
        && stage
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// One event as a line of a stream: the configuration is named by its digest.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    at: DateTime<Utc>,
    actor: String,
    #[serde(default)]
    project_ref: Option<String>,
    stage: String,
    plane: String,
    action: String,
    #[serde(default)]
    digest_before: Option<String>,
    #[serde(default)]
    digest_after: Option<String>,
    mode: String,
    #[serde(default)]
    reason: Option<String>,
    /// SHA-256 (hex) of the configuration, in the stream's `configs` folder.
    #[serde(default)]
    config_sha256: Option<String>,
}

impl Line {
    fn of(event: &PolicyEventRecord) -> Self {
        Self {
            at: event.at,
            actor: event.actor.clone(),
            project_ref: event.project_ref.clone(),
            stage: event.stage.clone(),
            plane: event.plane.clone(),
            action: event.action.clone(),
            digest_before: event.digest_before.clone(),
            digest_after: event.digest_after.clone(),
            mode: event.mode.clone(),
            reason: event.reason.clone(),
            config_sha256: event
                .config
                .as_deref()
                .map(|c| hex::encode(Sha256::digest(c.as_bytes()))),
        }
    }

    fn into_event(self, config: Option<String>) -> PolicyEventRecord {
        PolicyEventRecord {
            at: self.at,
            actor: self.actor,
            project_ref: self.project_ref,
            stage: self.stage,
            plane: self.plane,
            action: self.action,
            digest_before: self.digest_before,
            digest_after: self.digest_after,
            mode: self.mode,
            reason: self.reason,
            config,
        }
    }
}

/// Streams kept in memory: by project (none: the operator) and stage, oldest first.
pub type MemoryStreams = HashMap<(Option<String>, String), VecDeque<PolicyEventRecord>>;

/// The history of a file store: files beside the control file, or memory without one.
#[derive(Debug)]
pub enum PolicyHistory {
    /// Streams under a folder.
    Files(PathBuf),
    /// Streams in memory (no control file), newest last.
    Memory(std::sync::Mutex<MemoryStreams>),
}

fn io_error(path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Invalid(format!("{}: {e}", path.display()))
}

/// The folder of a project's streams (the operator's: `operator`).
fn scope_name(project: Option<&str>) -> String {
    match project {
        None => "operator".to_owned(),
        Some(project) => format!("p-{}", hex::encode(Sha256::digest(project.as_bytes()))),
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename (readers never see a part).
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| io_error(path, e))
}

/// The lines of a stream file, oldest first; a line cut by a crash or edited into nonsense is
/// skipped. A missing file is an empty stream.
fn read_lines(path: &Path) -> Result<Vec<Line>, StoreError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_error(path, e)),
    }
}

impl PolicyHistory {
    /// The history of a store whose control file is in `dir` (none: in memory). History left by
    /// an earlier version in one file there is moved into the streams.
    pub fn open(dir: Option<&Path>) -> Self {
        let Some(dir) = dir else {
            return Self::Memory(std::sync::Mutex::new(HashMap::new()));
        };
        let history = Self::Files(dir.join(DIR));
        let legacy = dir.join(LEGACY_FILE);
        if legacy.is_file() {
            match history.migrate(&legacy) {
                Ok(moved) => {
                    tracing::info!(file = %legacy.display(), events = moved, "policy history moved into one file per project and stage");
                }
                Err(e) => {
                    tracing::error!(file = %legacy.display(), error = %e, "policy history not moved; the old file stays");
                }
            }
        }
        history
    }

    fn migrate(&self, legacy: &Path) -> Result<usize, StoreError> {
        let text = std::fs::read_to_string(legacy).map_err(|e| io_error(legacy, e))?;
        let mut moved = 0;
        for event in text
            .lines()
            .filter_map(|l| serde_json::from_str::<PolicyEventRecord>(l).ok())
        {
            if self.append(&event).is_ok() {
                moved += 1;
            }
        }
        let done = legacy.with_extension("jsonl.migrated");
        std::fs::rename(legacy, &done).map_err(|e| io_error(legacy, e))?;
        Ok(moved)
    }

    /// The stream file and configuration folder of `project`'s `stage`, or `None` when `stage`
    /// cannot name one.
    fn stream(root: &Path, project: Option<&str>, stage: &str) -> Option<(PathBuf, PathBuf)> {
        if !is_stage_name(stage) {
            return None;
        }
        let scope = root.join(scope_name(project));
        Some((
            scope.join(format!("{stage}.jsonl")),
            scope.join(format!("{stage}.configs")),
        ))
    }

    /// Appends `event` to its stream and cuts the stream back when it passed its bound. The
    /// caller serialises writers.
    pub fn append(&self, event: &PolicyEventRecord) -> Result<(), StoreError> {
        let root = match self {
            Self::Memory(streams) => {
                let mut streams = streams.lock().unwrap_or_else(|p| p.into_inner());
                let stream = streams
                    .entry((event.project_ref.clone(), event.stage.clone()))
                    .or_default();
                stream.push_back(event.clone());
                while stream.len() > HISTORY_KEPT {
                    stream.pop_front();
                }
                return Ok(());
            }
            Self::Files(root) => root,
        };
        let (file, configs) = Self::stream(root, event.project_ref.as_deref(), &event.stage)
            .ok_or_else(|| {
                StoreError::Invalid(format!(
                    "policy event: {:?} is not a stage name",
                    event.stage
                ))
            })?;
        let line = Line::of(event);
        if let (Some(config), Some(digest)) = (&event.config, &line.config_sha256) {
            std::fs::create_dir_all(&configs).map_err(|e| io_error(&configs, e))?;
            let path = configs.join(format!("{digest}.json"));
            if !path.is_file() {
                write_atomically(&path, config.as_bytes())?;
            }
        }
        let text = serde_json::to_string(&line)
            .map_err(|e| StoreError::Invalid(format!("policy event: {e}")))?;
        if let Some(scope) = file.parent() {
            std::fs::create_dir_all(scope).map_err(|e| io_error(scope, e))?;
        }
        {
            let mut out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&file)
                .map_err(|e| io_error(&file, e))?;
            writeln!(out, "{text}").map_err(|e| io_error(&file, e))?;
        }
        let lines = read_lines(&file)?;
        if lines.len() >= CUT_AT {
            Self::cut(&file, &configs, lines)?;
        }
        Ok(())
    }

    /// Keeps the newest [`HISTORY_KEPT`] lines of a stream and the configurations they name.
    fn cut(file: &Path, configs: &Path, lines: Vec<Line>) -> Result<(), StoreError> {
        let kept = &lines[lines.len().saturating_sub(HISTORY_KEPT)..];
        let mut text = String::new();
        for line in kept {
            if let Ok(l) = serde_json::to_string(line) {
                text.push_str(&l);
                text.push('\n');
            }
        }
        write_atomically(file, text.as_bytes())?;
        let named: HashSet<&str> = kept
            .iter()
            .filter_map(|l| l.config_sha256.as_deref())
            .collect();
        if let Ok(entries) = std::fs::read_dir(configs) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let digest = name.strip_suffix(".json").unwrap_or(&name);
                if !named.contains(digest) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Ok(())
    }

    /// The newest events of `project`'s `stage` (none: every stage), newest first, at most
    /// `limit`, without configurations.
    pub fn list(
        &self,
        project: Option<&str>,
        stage: Option<&str>,
        limit: usize,
    ) -> Result<Vec<PolicyEventRecord>, StoreError> {
        let root = match self {
            Self::Memory(streams) => {
                let streams = streams.lock().unwrap_or_else(|p| p.into_inner());
                let mut out: Vec<PolicyEventRecord> = streams
                    .iter()
                    .filter(|((p, s), _)| {
                        p.as_deref() == project && stage.is_none_or(|stage| s == stage)
                    })
                    .flat_map(|(_, events)| events.iter())
                    .map(|e| PolicyEventRecord {
                        config: None,
                        ..e.clone()
                    })
                    .collect();
                out.sort_by_key(|e| std::cmp::Reverse(e.at));
                out.truncate(limit);
                return Ok(out);
            }
            Self::Files(root) => root,
        };
        let files: Vec<PathBuf> = match stage {
            Some(stage) => Self::stream(root, project, stage)
                .map(|(file, _)| vec![file])
                .unwrap_or_default(),
            None => {
                let scope = root.join(scope_name(project));
                match std::fs::read_dir(&scope) {
                    Ok(entries) => entries
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                        .collect(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                    Err(e) => return Err(io_error(&scope, e)),
                }
            }
        };
        let mut out = Vec::new();
        for file in files {
            for line in read_lines(&file)?.into_iter().rev() {
                // The scope's file name is a digest of the ref: the ref itself is compared too.
                if line.project_ref.as_deref() == project {
                    out.push(line.into_event(None));
                }
            }
        }
        // Each stream is newest first already; merged by time (stable for equal times).
        out.sort_by_key(|e| std::cmp::Reverse(e.at));
        out.truncate(limit);
        Ok(out)
    }

    /// The newest `enforce` event of `project`'s `stage` that put `digest` in force, with the
    /// configuration it recorded.
    pub fn event_of(
        &self,
        project: Option<&str>,
        stage: &str,
        digest: &str,
    ) -> Result<Option<PolicyEventRecord>, StoreError> {
        let root = match self {
            Self::Memory(streams) => {
                let streams = streams.lock().unwrap_or_else(|p| p.into_inner());
                return Ok(streams
                    .get(&(project.map(str::to_owned), stage.to_owned()))
                    .and_then(|events| {
                        events.iter().rev().find(|e| {
                            e.mode == "enforce" && e.digest_after.as_deref() == Some(digest)
                        })
                    })
                    .cloned());
            }
            Self::Files(root) => root,
        };
        let Some((file, configs)) = Self::stream(root, project, stage) else {
            return Ok(None);
        };
        let found = read_lines(&file)?.into_iter().rev().find(|l| {
            l.project_ref.as_deref() == project
                && l.mode == "enforce"
                && l.digest_after.as_deref() == Some(digest)
        });
        let Some(line) = found else {
            return Ok(None);
        };
        let config = match line.config_sha256.as_deref() {
            Some(sha) if crate::config::is_sha256_hex(sha) => {
                let path = configs.join(format!("{sha}.json"));
                Some(std::fs::read_to_string(&path).map_err(|e| io_error(&path, e))?)
            }
            _ => None,
        };
        Ok(Some(line.into_event(config)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(
        project: Option<&str>,
        stage: &str,
        i: usize,
        config: Option<&str>,
    ) -> PolicyEventRecord {
        PolicyEventRecord {
            at: Utc::now(),
            actor: "a".into(),
            project_ref: project.map(str::to_owned),
            stage: stage.into(),
            plane: "data".into(),
            action: "install".into(),
            digest_before: None,
            digest_after: Some(format!("{i:064}")),
            mode: "enforce".into(),
            reason: None,
            config: config.map(str::to_owned),
        }
    }

    #[test]
    fn stage_names_are_plain_keys() {
        for good in ["cors", "db_routing", "api-key", "q2"] {
            assert!(is_stage_name(good), "{good}");
        }
        for bad in ["", "../x", "Cors", "2q", "a/b", "a.b", &"x".repeat(33)] {
            assert!(!is_stage_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_stream_is_cut_alone_and_listings_carry_no_configuration() {
        let dir = tempfile::tempdir().expect("tempdir");
        let history = PolicyHistory::open(Some(dir.path()));
        history
            .append(&event(None, "cors", 0, Some("{\"operator\":1}")))
            .expect("append");
        history
            .append(&event(Some("beta"), "cors", 0, Some("{\"beta\":1}")))
            .expect("append");
        for i in 0..CUT_AT + 10 {
            let config = format!("{{\"n\":{i}}}");
            history
                .append(&event(Some("alpha"), "cors", i, Some(&config)))
                .expect("append");
        }
        let alpha = history
            .list(Some("alpha"), Some("cors"), 10_000)
            .expect("list");
        assert!(
            alpha.len() <= CUT_AT && alpha.len() >= HISTORY_KEPT,
            "{}",
            alpha.len()
        );
        assert!(
            alpha.iter().all(|e| e.config.is_none()),
            "no configuration listed"
        );
        // The other streams are untouched by alpha's cut.
        assert_eq!(history.list(None, None, 10).expect("list").len(), 1);
        assert_eq!(
            history
                .list(Some("beta"), Some("cors"), 10)
                .expect("list")
                .len(),
            1
        );
        let newest = format!("{:064}", CUT_AT + 9);
        let restored = history
            .event_of(Some("alpha"), "cors", &newest)
            .expect("read")
            .expect("kept");
        assert_eq!(
            restored.config.as_deref(),
            Some(format!("{{\"n\":{}}}", CUT_AT + 9).as_str())
        );
        // The configurations of cut events are gone with them.
        let oldest = format!("{:064}", 0);
        assert!(
            history
                .event_of(Some("alpha"), "cors", &oldest)
                .expect("read")
                .is_none()
        );
        let scope = dir.path().join(DIR).join(scope_name(Some("alpha")));
        let configs = std::fs::read_dir(scope.join("cors.configs"))
            .expect("dir")
            .count();
        assert!(configs <= CUT_AT, "{configs} configuration files");
        let beta = history
            .event_of(Some("beta"), "cors", &format!("{:064}", 0))
            .expect("read")
            .expect("kept");
        assert_eq!(beta.config.as_deref(), Some("{\"beta\":1}"));
    }

    #[test]
    fn a_stage_that_names_no_stream_is_refused_and_lists_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let history = PolicyHistory::open(Some(dir.path()));
        assert!(history.append(&event(None, "../../etc", 0, None)).is_err());
        assert!(
            history
                .list(None, Some("../../etc"), 10)
                .expect("list")
                .is_empty()
        );
        assert!(history.event_of(None, "../x", "y").expect("read").is_none());
    }

    #[test]
    fn the_history_of_an_earlier_version_is_moved_into_streams() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lines = [
            event(None, "cors", 1, None),
            event(Some("alpha"), "quota", 2, Some("{}")),
        ]
        .iter()
        .map(|e| serde_json::to_string(e).expect("json"))
        .collect::<Vec<_>>()
        .join("\n");
        std::fs::write(dir.path().join(LEGACY_FILE), lines).expect("write");
        let history = PolicyHistory::open(Some(dir.path()));
        assert!(!dir.path().join(LEGACY_FILE).exists());
        assert_eq!(history.list(None, Some("cors"), 10).expect("list").len(), 1);
        let alpha = history
            .event_of(Some("alpha"), "quota", &format!("{:064}", 2))
            .expect("read")
            .expect("moved");
        assert_eq!(alpha.config.as_deref(), Some("{}"));
    }

    #[test]
    fn the_memory_history_is_bounded_per_stream() {
        let history = PolicyHistory::open(None);
        for i in 0..HISTORY_KEPT + 5 {
            history
                .append(&event(Some("a"), "cors", i, Some("{}")))
                .expect("append");
        }
        history
            .append(&event(None, "cors", 0, None))
            .expect("append");
        assert_eq!(
            history
                .list(Some("a"), None, usize::MAX)
                .expect("list")
                .len(),
            HISTORY_KEPT
        );
        assert_eq!(history.list(None, None, usize::MAX).expect("list").len(), 1);
    }
}
