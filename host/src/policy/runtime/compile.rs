//! Compiling modules that projects upload, without trusting them.
//!
//! Compilation cannot be interrupted inside a process, and a crafted module can make the
//! compiler run long or allocate much. Uploaded modules are therefore compiled in a process of
//! their own (`<exe> compile-worker`), which limits its own private writable memory
//! (`plugins.tenant_max_compile_memory_bytes`, as `RLIMIT_DATA`) and CPU time before reading the module, and is
//! killed when it runs past `plugins.tenant_max_compile_ms` of wall time. Its time and peak
//! memory are measured and reported. At most `plugins.tenant_compile_concurrency` compile at
//! once. Before it reads the module the worker confines itself ([`super::confine`]): no network,
//! no file it could open, create or change, no program it could run, the privileges of `nobody`
//! when started as root. The artefact comes back over a pipe and is bound to the module it was
//! compiled from before the gateway loads it: the worker names the digest of what it read and of
//! what it wrote, both checked, and the loaded component must import and export exactly what the
//! uploaded module declares (read from its bytes, without compiling them); wasmtime then checks
//! that it was compiled with compatible settings.
//!
//! Results are kept by digest: a compiled component in a bounded cache
//! (`plugins.compiled_cache_bytes`), so that a module installed again or by several projects is
//! not compiled again; a refusal for `plugins.tenant_refused_retry_secs`, so that a bad module
//! is not recompiled on every refresh of every instance.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use wasmtime::Engine;
use wasmtime::component::Component;

use super::engine::{Owner, PolicyEngine, engine_config};
use crate::config::PluginRuntimeConfig;
use crate::metrics::Metrics;

/// The hidden subcommand that runs a compile worker.
pub const WORKER_COMMAND: &str = "compile-worker";

/// Why a module could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// Not a valid component.
    #[error("not a valid component: {0}")]
    Invalid(String),
    /// Stopped at `plugins.tenant_max_compile_ms`.
    #[error("compiling took longer than {0} ms (plugins.tenant_max_compile_ms); refused")]
    Timeout(u64),
    /// Stopped at `plugins.tenant_max_compile_memory_bytes`.
    #[error(
        "compiling needed more than {0} bytes of memory (plugins.tenant_max_compile_memory_bytes); refused"
    )]
    Memory(u64),
    /// The compiler died on this module (a crash is the module's fault until proven otherwise).
    #[error("compiling the module failed: {0}")]
    Crashed(String),
    /// The compile worker could not be run or answered nonsense (the gateway's side).
    #[error("the compile worker failed: {0}")]
    Worker(String),
}

impl CompileError {
    /// Label value of `aura_tenant_compiles_total`.
    pub fn label(&self) -> &'static str {
        match self {
            CompileError::Invalid(_) => "refused",
            CompileError::Timeout(_) => "timeout",
            CompileError::Memory(_) => "memory",
            CompileError::Crashed(_) => "crashed",
            CompileError::Worker(_) => "worker_failed",
        }
    }

    /// Whether the module is at fault (the refusal is remembered), rather than the gateway.
    pub fn is_the_modules(&self) -> bool {
        !matches!(self, CompileError::Worker(_))
    }
}

/// What a compilation cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompileReport {
    /// Wall time of the compilation in the worker, in milliseconds (0 when cached).
    pub compile_ms: u64,
    /// Peak resident memory of the worker, in bytes (0 when cached).
    pub peak_rss_bytes: u64,
    /// Whether the compiled component came from the cache.
    pub cached: bool,
}

/// The first line the worker writes, before the artefact.
#[derive(Debug, Default, Serialize, Deserialize)]
struct WorkerHeader {
    ok: bool,
    /// Why the module was refused (its fault).
    #[serde(default)]
    error: Option<String>,
    /// Why the worker could not compile at all (the gateway's side: not the module's fault).
    #[serde(default)]
    worker_error: Option<String>,
    #[serde(default)]
    compile_ms: u64,
    #[serde(default)]
    peak_rss_bytes: u64,
    #[serde(default)]
    artefact_bytes: u64,
    /// SHA-256 (hex) of the module the worker read.
    #[serde(default)]
    input_sha256: String,
    /// SHA-256 (hex) of the artefact it wrote.
    #[serde(default)]
    artefact_sha256: String,
}

/// Compiles uploaded modules.
pub struct Compiler {
    runtime: Arc<PolicyEngine>,
    worker: PathBuf,
    max_module_bytes: usize,
    max_time: Duration,
    max_memory: u64,
    gate: Semaphore,
    cache: moka::sync::Cache<String, Component>,
    refused: moka::sync::Cache<String, CompileError>,
    metrics: Metrics,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler")
            .field("worker", &self.worker)
            .field("max_time", &self.max_time)
            .field("max_memory", &self.max_memory)
            .finish_non_exhaustive()
    }
}

impl Compiler {
    /// A compiler for `runtime`'s engine with the limits of `settings`.
    pub fn new(
        runtime: Arc<PolicyEngine>,
        settings: &PluginRuntimeConfig,
        metrics: Metrics,
    ) -> Self {
        // This very executable by default: `/proc/self/exe` still runs it after the file was
        // replaced by an upgrade, where its path would then name the new version or nothing.
        let worker = settings
            .tenant_compile_worker
            .as_ref()
            .map(PathBuf::from)
            .or_else(|| {
                let proc_self = PathBuf::from("/proc/self/exe");
                proc_self.exists().then_some(proc_self)
            })
            .or_else(|| std::env::current_exe().ok())
            .unwrap_or_else(|| PathBuf::from("aura-gateway"));
        Self {
            runtime,
            worker,
            max_module_bytes: settings.tenant_max_module_bytes,
            max_time: Duration::from_millis(settings.tenant_max_compile_ms),
            max_memory: settings.tenant_max_compile_memory_bytes,
            gate: Semaphore::new(settings.tenant_compile_concurrency.max(1)),
            cache: moka::sync::Cache::builder()
                .max_capacity(settings.compiled_cache_bytes)
                .weigher(|_: &String, c: &Component| {
                    let range = c.image_range();
                    u32::try_from(range.end as usize - range.start as usize).unwrap_or(u32::MAX)
                })
                .time_to_idle(Duration::from_secs(3_600))
                .build(),
            refused: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(settings.tenant_refused_retry_secs))
                .build(),
            metrics,
        }
    }

    fn count(&self, result: &str) {
        self.metrics
            .tenant_compiles
            .with_label_values(&[result])
            .inc();
    }

    /// The compiled component of `digest` from the cache, counted as such.
    /// A digest a loaded project's module uses is shared with it; one recently used is in the
    /// cache (`plugins.compiled_cache_bytes`).
    pub fn cached(&self, digest: &str) -> Option<(Component, CompileReport)> {
        let component = self
            .runtime
            .compiled_in_use(digest)
            .or_else(|| self.cache.get(digest))?;
        self.count("cached");
        Some((
            component,
            CompileReport {
                compile_ms: 0,
                peak_rss_bytes: 0,
                cached: true,
            },
        ))
    }

    /// `digest` compiled before, by this instance or another sharing the compile cache
    /// folder, mapped from its file there (counted `disk`).
    fn on_disk(&self, digest: &str) -> Option<(Component, CompileReport)> {
        let engine = self.runtime.engine(Owner::Tenant);
        let component = self.runtime.tenant_disk()?.get(engine, digest)?;
        self.count("disk");
        self.cache.insert(digest.to_owned(), component.clone());
        let report = CompileReport {
            compile_ms: 0,
            peak_rss_bytes: 0,
            cached: true,
        };
        Some((component, report))
    }

    /// `digest` compiled, in memory or in the compile cache folder: a stored module loaded
    /// again needs neither its bytes from the control store nor a compilation.
    pub fn compiled(&self, digest: &str) -> Option<(Component, CompileReport)> {
        self.cached(digest).or_else(|| self.on_disk(digest))
    }

    /// The compiled component of `bytes` (whose SHA-256 is `digest`).
    pub async fn compile(
        &self,
        digest: &str,
        bytes: &[u8],
    ) -> Result<(Component, CompileReport), CompileError> {
        if let Some(hit) = self.cached(digest) {
            return Ok(hit);
        }
        if let Some(error) = self.refused.get(digest) {
            self.count("remembered");
            return Err(error);
        }
        if let Some(hit) = self.on_disk(digest) {
            return Ok(hit);
        }
        let engine = self.runtime.engine(Owner::Tenant);
        let _permit = self
            .gate
            .acquire()
            .await
            .map_err(|_| CompileError::Worker("the compiler is shutting down".into()))?;
        // Another caller may have compiled it while this one waited.
        if let Some(hit) = self.cached(digest) {
            return Ok(hit);
        }
        let started = Instant::now();
        let result = self.run_worker(bytes).await;
        self.metrics
            .tenant_compile_seconds
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok((component, report)) => {
                self.count("ok");
                self.metrics
                    .tenant_compile_peak_bytes
                    .observe(report.peak_rss_bytes as f64);
                // With a cache folder the module runs from its file, mapped: its code and its
                // memory image are pages of the file, read when used and given back to the
                // kernel when not, instead of a private copy of all of it per digest.
                let component = match self.runtime.tenant_disk() {
                    Some(disk) => {
                        disk.put(engine, digest, &component);
                        disk.get(engine, digest).unwrap_or(component)
                    }
                    None => component,
                };
                self.cache.insert(digest.to_owned(), component.clone());
                Ok((component, report))
            }
            Err(error) => {
                self.count(error.label());
                if error.is_the_modules() {
                    self.refused.insert(digest.to_owned(), error.clone());
                }
                Err(error)
            }
        }
    }

    async fn run_worker(&self, bytes: &[u8]) -> Result<(Component, CompileReport), CompileError> {
        let settings = self.runtime.settings();
        let cpu_secs = self.max_time.as_secs() + 1;
        let mut child = tokio::process::Command::new(&self.worker)
            .arg(WORKER_COMMAND)
            .arg("--memory-limit-bytes")
            .arg(settings.memory_limit_bytes.to_string())
            .arg("--max-module-bytes")
            .arg(self.max_module_bytes.to_string())
            .arg("--max-memory-bytes")
            .arg(self.max_memory.to_string())
            .arg("--cpu-secs")
            .arg(cpu_secs.to_string())
            .env_clear()
            // mimalloc reserves 1 GiB of address space up front by default: under the worker's
            // data limit a small reservation leaves the limit to what compiling really takes.
            .env("MIMALLOC_ARENA_RESERVE", "16MiB")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                CompileError::Worker(format!("cannot run {}: {e}", self.worker.display()))
            })?;
        let mut stdin = child.stdin.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
        let deadline = tokio::time::Instant::now() + self.max_time;
        let exchange = async {
            // A worker that dies early closes its stdin: the write error is then not the
            // module's fault, its exit status tells what happened.
            let _ = stdin.write_all(bytes).await;
            drop(stdin);
            let mut out = Vec::new();
            let limit = self.max_memory;
            let read = (&mut stdout).take(limit).read_to_end(&mut out).await;
            (read, out)
        };
        let (read, out) = match tokio::time::timeout_at(deadline, exchange).await {
            Ok(done) => done,
            Err(_) => {
                let _ = child.kill().await;
                return Err(CompileError::Timeout(self.max_time.as_millis() as u64));
            }
        };
        let status = match tokio::time::timeout_at(deadline, child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => return Err(CompileError::Worker(format!("wait: {e}"))),
            Err(_) => {
                let _ = child.kill().await;
                return Err(CompileError::Timeout(self.max_time.as_millis() as u64));
            }
        };
        read.map_err(|e| CompileError::Worker(format!("read: {e}")))?;
        let newline = out.iter().position(|&b| b == b'\n');
        let header: Option<WorkerHeader> =
            newline.and_then(|n| serde_json::from_slice(&out[..n]).ok());
        let Some(header) = header else {
            return Err(died(status, self.max_memory, self.max_time));
        };
        if let Some(reason) = header.worker_error {
            return Err(CompileError::Worker(reason));
        }
        if !header.ok {
            return Err(match header.error {
                Some(reason) => CompileError::Invalid(reason),
                None => died(status, self.max_memory, self.max_time),
            });
        }
        let artefact = &out[newline.unwrap_or(0) + 1..];
        if artefact.len() as u64 != header.artefact_bytes || !status.success() {
            return Err(died(status, self.max_memory, self.max_time));
        }
        // Bound to this module: the worker compiled what it was given and sent what it wrote.
        if header.input_sha256 != crate::policy::digest_of(bytes)
            || header.artefact_sha256 != crate::policy::digest_of(artefact)
        {
            return Err(CompileError::Worker(
                "the compiled module is not the one sent to the worker; not loaded".into(),
            ));
        }
        let component = load_artefact(self.runtime.engine(Owner::Tenant), artefact)?;
        let (declared, compiled) = (
            declared_interface(bytes).map_err(CompileError::Invalid)?,
            compiled_interface(self.runtime.engine(Owner::Tenant), &component),
        );
        if declared != compiled {
            return Err(CompileError::Worker(format!(
                "the compiled module's imports and exports ({compiled:?}) are not the uploaded module's ({declared:?}); not loaded"
            )));
        }
        Ok((
            component,
            CompileReport {
                compile_ms: header.compile_ms,
                peak_rss_bytes: header.peak_rss_bytes,
                cached: false,
            },
        ))
    }
}

/// The names a component imports and exports at its top level, read from its bytes without
/// compiling them (nested modules and components are skipped).
fn declared_interface(bytes: &[u8]) -> Result<Interface, String> {
    use wasmparser::Payload;
    let mut interface = Interface::default();
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| format!("{e}"))? {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| format!("{e}"))?;
                    interface.imports.insert(import.name.name.to_owned());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    let export = export.map_err(|e| format!("{e}"))?;
                    interface.exports.insert(export.name.name.to_owned());
                }
            }
            _ => {}
        }
    }
    Ok(interface)
}

/// The names a compiled component imports and exports.
fn compiled_interface(engine: &Engine, component: &Component) -> Interface {
    let ty = component.component_type();
    Interface {
        imports: ty
            .imports(engine)
            .map(|(name, _)| name.to_owned())
            .collect(),
        exports: ty
            .exports(engine)
            .map(|(name, _)| name.to_owned())
            .collect(),
    }
}

/// A component's top-level import and export names.
#[derive(Debug, Default, PartialEq, Eq)]
struct Interface {
    imports: std::collections::BTreeSet<String>,
    exports: std::collections::BTreeSet<String>,
}

/// What a worker that answered nothing usable died of.
fn died(status: std::process::ExitStatus, max_memory: u64, max_time: Duration) -> CompileError {
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        // SIGABRT: an allocation failed under the address-space limit.
        Some(6) => CompileError::Memory(max_memory),
        // SIGXCPU / SIGKILL: the CPU-time limit.
        Some(24) | Some(9) => CompileError::Timeout(max_time.as_millis() as u64),
        Some(signal) => CompileError::Crashed(format!("the compiler died of signal {signal}")),
        None => CompileError::Crashed(format!("the compiler exited with {status}")),
    }
}

/// Loads an artefact produced by our own compile worker.
#[expect(
    unsafe_code,
    reason = "wasmtime requires `unsafe` to load precompiled code; see the safety comment"
)]
fn load_artefact(engine: &Engine, artefact: &[u8]) -> Result<Component, CompileError> {
    // SAFETY: the bytes are what `Engine::precompile_component` wrote in the compile worker, a
    // process this gateway started from its own executable, read from that process's stdout
    // pipe and never from a file or the network; wasmtime checks the artefact's format and its
    // compatibility with this engine's settings before using it.
    unsafe { Component::deserialize(engine, artefact) }
        .map_err(|e| CompileError::Worker(format!("the compiled module does not load: {e:#}")))
}

/// Arguments of the compile worker.
#[derive(Debug, Clone, Copy)]
pub struct WorkerArgs {
    /// `plugins.memory_limit_bytes` (it shapes the compiled code).
    pub memory_limit_bytes: usize,
    /// `plugins.tenant_max_module_bytes`.
    pub max_module_bytes: usize,
    /// Address-space limit of the worker.
    pub max_memory_bytes: u64,
    /// CPU-time limit of the worker.
    pub cpu_secs: u64,
    /// `--check-sandbox`: confine, try what the confinement forbids, print it, exit.
    pub check_sandbox: bool,
    /// `--target-pid`: the process the check's signals and process descriptors are aimed at
    /// (by default the one that started it).
    pub target_pid: Option<u32>,
}

impl WorkerArgs {
    /// Parses `--name value` pairs.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut out = Self {
            memory_limit_bytes: 16 << 20,
            max_module_bytes: 4 << 20,
            max_memory_bytes: 1 << 30,
            cpu_secs: 11,
            check_sandbox: false,
            target_pid: None,
        };
        let mut it = args.iter();
        while let Some(name) = it.next() {
            if name == "--check-sandbox" {
                out.check_sandbox = true;
                continue;
            }
            let value = it
                .next()
                .ok_or_else(|| format!("{name}: a value is missing"))?;
            let number = |v: &str| v.parse::<u64>().map_err(|e| format!("{name}: {e}"));
            match name.as_str() {
                "--memory-limit-bytes" => out.memory_limit_bytes = number(value)? as usize,
                "--max-module-bytes" => out.max_module_bytes = number(value)? as usize,
                "--max-memory-bytes" => out.max_memory_bytes = number(value)?,
                "--cpu-secs" => out.cpu_secs = number(value)?,
                "--target-pid" => {
                    let pid = u32::try_from(number(value)?).map_err(|e| format!("{name}: {e}"))?;
                    out.target_pid = Some(pid);
                }
                other => return Err(format!("unknown argument {other}")),
            }
        }
        Ok(out)
    }
}

/// The peak resident memory, read from `status` (`/proc/self/status`, opened before the
/// confinement forbids opening files).
fn peak_rss_bytes(status: Option<&mut std::fs::File>) -> u64 {
    use std::io::Seek as _;
    let mut text = String::new();
    let read = status
        .is_some_and(|f| f.rewind().is_ok() && std::io::Read::read_to_string(f, &mut text).is_ok());
    Some(text)
        .filter(|_| read)
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The compile worker: limits and confines itself ([`super::confine`]), reads a module on
/// stdin, writes a header line and the compiled artefact on stdout.
pub fn worker_main(args: WorkerArgs) -> ExitCode {
    use rustix::process::{Resource, Rlimit, setrlimit};
    if args.check_sandbox {
        let report = super::confine::check(args.target_pid);
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    let limit = |resource, value| {
        setrlimit(
            resource,
            Rlimit {
                current: Some(value),
                maximum: Some(value),
            },
        )
    };
    let failed = |reason: String| {
        answer(
            &WorkerHeader {
                worker_error: Some(reason),
                ..WorkerHeader::default()
            },
            &[],
        )
    };
    // RLIMIT_DATA counts the private writable memory (heap, anonymous maps, thread stacks): what
    // compiling allocates, not the executable's mapped code.
    if let Err(e) = limit(Resource::Data, args.max_memory_bytes)
        .and_then(|()| limit(Resource::Cpu, args.cpu_secs))
    {
        return failed(format!("cannot limit the worker: {e}"));
    }
    // What needs a file or the system's description comes before the confinement.
    let mut status = std::fs::File::open("/proc/self/status").ok();
    let settings = PluginRuntimeConfig {
        memory_limit_bytes: args.memory_limit_bytes,
        ..PluginRuntimeConfig::default()
    };
    let engine = match Engine::new(&engine_config(&settings, false)) {
        Ok(engine) => engine,
        Err(e) => return failed(format!("engine: {e}")),
    };
    if let Err(e) = super::confine::confine() {
        return failed(format!("cannot confine the worker: {e}"));
    }
    let mut bytes = Vec::new();
    let read = std::io::stdin()
        .lock()
        .take(args.max_module_bytes as u64 + 1)
        .read_to_end(&mut bytes);
    if read.is_err() || bytes.len() > args.max_module_bytes {
        return answer(
            &refusal(
                "the module could not be read or is too large",
                status.as_mut(),
            ),
            &[],
        );
    }
    let started = Instant::now();
    match engine.precompile_component(&bytes) {
        Ok(artefact) => answer(
            &WorkerHeader {
                ok: true,
                compile_ms: started.elapsed().as_millis() as u64,
                peak_rss_bytes: peak_rss_bytes(status.as_mut()),
                artefact_bytes: artefact.len() as u64,
                input_sha256: crate::policy::digest_of(&bytes),
                artefact_sha256: crate::policy::digest_of(&artefact),
                ..WorkerHeader::default()
            },
            &artefact,
        ),
        Err(e) => answer(&refusal(&format!("{e:#}"), status.as_mut()), &[]),
    }
}

fn refusal(reason: &str, status: Option<&mut std::fs::File>) -> WorkerHeader {
    WorkerHeader {
        error: Some(reason.to_owned()),
        peak_rss_bytes: peak_rss_bytes(status),
        ..WorkerHeader::default()
    }
}

fn answer(header: &WorkerHeader, artefact: &[u8]) -> ExitCode {
    let mut out = std::io::stdout().lock();
    let line = serde_json::to_vec(header).unwrap_or_default();
    let written = out
        .write_all(&line)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.write_all(artefact))
        .and_then(|()| out.flush());
    if written.is_ok() && header.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}
