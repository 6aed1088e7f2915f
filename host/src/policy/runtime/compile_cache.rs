//! Compiled modules kept on disk (`plugins.compile_cache_dir`), so that a restart loads the
//! modules named in the configuration, and the projects' modules, instead of compiling them
//! again — seconds per module for a component carrying a Python or JavaScript runtime. A file
//! is mapped, not read: a digest no project calls costs disk, not memory.
//!
//! A file is named by the module's SHA-256 and a hash of the engine's compatibility settings;
//! wasmtime checks the compatibility again when loading it, and a file that does not load is
//! compiled again and replaced. The files are native code the gateway will run, so the folder
//! must belong to the gateway's user and be writable by no one else; it is created with mode
//! 0700 and refused otherwise.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use wasmtime::Engine;
use wasmtime::component::Component;

/// The cache folder, checked.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: PathBuf,
    /// A folder of this process's own, removed with the last copy of it.
    _own: Option<std::sync::Arc<OwnFolder>>,
}

/// Removes its folder when dropped.
#[derive(Debug)]
struct OwnFolder(PathBuf);

impl Drop for OwnFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The prefix of [`CompileCache::of_this_process`]'s folders: `<prefix><pid>-<nanoseconds>`.
const OWN_PREFIX: &str = "aura-gateway-compiled-";

/// Whether `meta` belongs to this process's user and is writable by no one else.
fn private(meta: &std::fs::Metadata) -> bool {
    meta.uid() == rustix::process::geteuid().as_raw() && meta.mode() & 0o022 == 0
}

impl CompileCache {
    /// Opens (creating it with mode 0700) the folder `dir`.
    pub fn open(dir: &Path) -> Result<Self, String> {
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if !meta.is_dir() {
            return Err(format!("{}: not a folder", dir.display()));
        }
        if !private(&meta) {
            return Err(format!(
                "{}: must belong to the gateway's user and be writable by no one else (its files are native code)",
                dir.display()
            ));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            _own: None,
        })
    }

    /// A folder of this process's own in `parent` (the system's temporary folder), removed when
    /// the last copy of the cache is dropped; the folders a process that is gone left there
    /// are removed first.
    pub fn of_this_process(parent: &Path) -> Result<Self, String> {
        remove_left_behind(parent);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = parent.join(format!("{OWN_PREFIX}{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut cache = Self::open(&dir)?;
        cache._own = Some(std::sync::Arc::new(OwnFolder(dir)));
        Ok(cache)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, engine: &Engine, digest: &str) -> PathBuf {
        self.dir
            .join(format!("{digest}-{}.cwasm", engine_name(engine)))
    }

    /// Removes the files of `digests` (compiled for any engine: their stored modules were
    /// collected), and files compiled for none of `engines` (by an earlier version of the
    /// gateway) and unchanged for `grace`; the count removed. A file a module runs from stays
    /// mapped until that module is dropped.
    pub fn collect(&self, digests: &[String], engines: &[Engine], grace: Duration) -> usize {
        let current: HashSet<String> = engines.iter().map(engine_name).collect();
        let collected: HashSet<&str> = digests.iter().map(String::as_str).collect();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some((digest, engine)) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".cwasm"))
                .and_then(|stem| stem.rsplit_once('-'))
            else {
                continue;
            };
            let stale = !current.contains(engine)
                && entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|at| at.elapsed().ok())
                    .is_some_and(|idle| idle >= grace);
            if (collected.contains(digest) || stale) && std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// The compiled module of `digest` for `engine`, when the folder has it.
    pub fn get(&self, engine: &Engine, digest: &str) -> Option<Component> {
        load(engine, &self.path(engine, digest))
    }

    /// Keeps `component` (compiled for `engine`, of `digest`) in the folder.
    pub fn put(&self, engine: &Engine, digest: &str, component: &Component) {
        let path = self.path(engine, digest);
        if let Err(e) = store(&path, component) {
            tracing::warn!(path = %path.display(), error = %e, "compiled module not kept in the compile cache");
        }
    }

    /// The compiled form of `bytes` (whose SHA-256 is `digest`): loaded from the folder, or
    /// compiled by `compile` and stored.
    pub fn get_or_compile(
        &self,
        engine: &Engine,
        digest: &str,
        bytes: &[u8],
        compile: impl FnOnce(&[u8]) -> Result<Component, String>,
    ) -> Result<Component, String> {
        let path = self.path(engine, digest);
        if let Some(component) = load(engine, &path) {
            return Ok(component);
        }
        let component = compile(bytes)?;
        self.put(engine, digest, &component);
        Ok(component)
    }
}

/// How a file's name tells the engine it was compiled for: a hash of the engine's settings that
/// change compiled code.
fn engine_name(engine: &Engine) -> String {
    let mut hasher = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Removes the folders [`CompileCache::of_this_process`] made in `parent` for processes that
/// are gone (killed before they could remove them).
fn remove_left_behind(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(OWN_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let mine = entry.metadata().is_ok_and(|meta| private(&meta));
        if mine && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn store(path: &Path, component: &Component) -> Result<(), String> {
    let artefact = component.serialize().map_err(|e| format!("{e:#}"))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| e.to_string())?;
        file.write_all(&artefact).map_err(|e| e.to_string())?;
    }
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}

/// Loads a file of the cache, or `None` when it is missing, not private, or does not load.
#[expect(
    unsafe_code,
    reason = "wasmtime requires `unsafe` to load precompiled code; see the safety comment"
)]
fn load(engine: &Engine, path: &Path) -> Option<Component> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || !private(&meta) {
        return None;
    }
    // SAFETY: the file is a regular file (not a link) owned by this process's user and writable
    // by no one else, in a folder with the same property, and only this gateway writes there
    // (`store`, from `Component::serialize`). wasmtime checks the artefact's format and its
    // compatibility with this engine before using it.
    match unsafe { Component::deserialize_file(engine, path) } {
        Ok(component) => Some(component),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %format!("{e:#}"), "a compile cache file does not load; compiling again");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_of_the_process_own_is_removed_with_it_and_one_left_behind_at_the_next_start() {
        let parent = tempfile::tempdir().expect("tempdir");
        let cache = CompileCache::of_this_process(parent.path()).expect("made");
        let dir = cache.dir().to_path_buf();
        assert!(dir.is_dir());
        let meta = std::fs::metadata(&dir).expect("meta");
        assert_eq!(meta.mode() & 0o777, 0o700);
        let copy = cache.clone();
        drop(cache);
        assert!(dir.is_dir(), "a copy still uses it");
        drop(copy);
        assert!(!dir.exists(), "removed with its last copy");
        // A process that is gone (no such pid) left its folder; this process's other one stays.
        let gone = parent.path().join(format!("{OWN_PREFIX}4294967295-1"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&gone)
            .expect("made");
        let kept = CompileCache::of_this_process(parent.path()).expect("made");
        let ours = parent
            .path()
            .join(format!("{OWN_PREFIX}{}-1", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&ours)
            .expect("made");
        let again = CompileCache::of_this_process(parent.path()).expect("made");
        assert!(!gone.exists(), "a gone process's folder is removed");
        assert!(ours.exists(), "a live process's folder stays");
        drop((kept, again));
    }

    #[test]
    fn a_folder_others_may_write_to_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("cache");
        CompileCache::open(&cache).expect("created private");
        let mode = std::fs::metadata(&cache).expect("meta").mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = CompileCache::open(&cache).expect_err("refused");
        assert!(err.contains("writable by no one else"), "{err}");
    }

    #[test]
    fn collecting_removes_the_collected_digests_files_and_an_earlier_engines_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = CompileCache::open(&dir.path().join("cache")).expect("opens");
        let engine = Engine::default();
        let this = engine_name(&engine);
        let (gone, kept) = ("a".repeat(64), "b".repeat(64));
        let file =
            |digest: &str, engine: &str| cache.dir().join(format!("{digest}-{engine}.cwasm"));
        for path in [
            file(&gone, &this),
            file(&gone, "00000000000000ff"),
            file(&kept, &this),
            file(&kept, "00000000000000ff"),
        ] {
            std::fs::write(&path, b"compiled").expect("written");
        }
        let other = cache.dir().join("notes.txt");
        std::fs::write(&other, b"not ours").expect("written");

        // Within the grace, an earlier engine's file of a digest still stored stays.
        let hour = Duration::from_secs(3_600);
        let removed = cache.collect(
            std::slice::from_ref(&gone),
            std::slice::from_ref(&engine),
            hour,
        );
        assert_eq!(removed, 2, "both files of the collected digest");
        assert!(!file(&gone, &this).exists() && !file(&gone, "00000000000000ff").exists());
        assert!(file(&kept, &this).exists() && file(&kept, "00000000000000ff").exists());

        // Past it, that file goes; this engine's file of a digest in use never does.
        let removed = cache.collect(&[], std::slice::from_ref(&engine), Duration::ZERO);
        assert_eq!(removed, 1);
        assert!(file(&kept, &this).exists());
        assert!(!file(&kept, "00000000000000ff").exists());
        assert!(other.exists(), "a file not of the cache is left alone");
    }
}
