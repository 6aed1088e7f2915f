//! The WASI a plugin gets: enough for a language runtime (Python, JavaScript) to start, nothing
//! that reaches outside the host.
//!
//! Granted, through `wasmtime-wasi` (WASI 0.2):
//! - `wasi:cli`: empty environment and arguments, no working directory, stdin empty, stdout and
//!   stderr captured per call (up to [`CAPTURE_BYTES`] each) into the plugin log; `exit` traps
//!   the call;
//! - `wasi:clocks`: wall and monotonic clocks, read only;
//! - `wasi:random`: random bytes, at most [`MAX_RANDOM_BYTES`] per call to `get-random-bytes`;
//! - `wasi:filesystem`: the interfaces, with no preopened directory, so no descriptor can ever
//!   exist and no file can be opened;
//! - `wasi:io`: streams and pollables, with every blocking operation done without blocking: a
//!   pollable that is not ready at once (a sleep, a read of stdin) traps the call instead of
//!   waiting. Epoch deadlines do not interrupt host calls, so nothing in the host may wait.
//!
//! Not granted: `wasi:sockets` (TCP, UDP, name lookup) and everything else. Those imports are
//! defined as traps, so a component that imports them still loads and fails only if it calls
//! them.
//!
//! The sandbox of an instance is created on its first WASI call: a plugin that imports no WASI
//! (a Rust plugin written against `wit-bindgen` without `std` I/O) never pays for it.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream, WasiCli};
use wasmtime_wasi::clocks::WasiClocks;
use wasmtime_wasi::filesystem::WasiFilesystem;
use wasmtime_wasi::p2::bindings::sync::io::{poll, streams};
use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random};
use wasmtime_wasi::p2::{DynPollable, OutputStream, Pollable, StreamError, StreamResult};
use wasmtime_wasi::random::WasiRandom;
use wasmtime_wasi::{WasiCtx, WasiCtxView};

use super::limits::PluginLimiter;
use super::plugin_log::CallLog;

/// Per-store data of a plugin instance.
#[derive(Debug)]
pub struct PluginState {
    pub(crate) limiter: PluginLimiter,
    /// Lines written during the call in progress.
    pub(crate) log: CallLog,
    /// The WASI state, made on the instance's first WASI call.
    pub(crate) sandbox: Option<Box<Sandbox>>,
}

/// Bytes of stdout (and of stderr) kept per call; the rest is dropped and counted.
pub const CAPTURE_BYTES: usize = 16 * 1024;

/// The most random bytes one `get-random-bytes` call may ask for (the host allocates them).
pub const MAX_RANDOM_BYTES: u64 = 64 * 1024;

/// The WASI state of one plugin instance.
pub struct Sandbox {
    ctx: WasiCtx,
    table: ResourceTable,
    stdout: Capture,
    stderr: Capture,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").finish_non_exhaustive()
    }
}

impl Sandbox {
    /// A sandbox granting what the module documentation lists, and nothing else.
    pub fn new() -> Self {
        let (stdout, stderr) = (Capture::default(), Capture::default());
        let mut builder = WasiCtx::builder();
        builder
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .max_random_size(MAX_RANDOM_BYTES);
        Self {
            ctx: builder.build(),
            table: ResourceTable::new(),
            stdout,
            stderr,
        }
    }

    /// What the guest wrote to stdout and stderr since the last call, and how many bytes of it
    /// were dropped over [`CAPTURE_BYTES`].
    pub fn take_output(&self) -> Output {
        let (stdout, stdout_dropped) = self.stdout.take();
        let (stderr, stderr_dropped) = self.stderr.take();
        Output {
            stdout,
            stderr,
            dropped: stdout_dropped + stderr_dropped,
        }
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

/// stdout and stderr of one call.
#[derive(Debug, Default)]
pub struct Output {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes written beyond [`CAPTURE_BYTES`].
    pub dropped: usize,
}

impl wasmtime_wasi::WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let sandbox = self.sandbox.get_or_insert_with(|| Box::new(Sandbox::new()));
        WasiCtxView {
            ctx: &mut sandbox.ctx,
            table: &mut sandbox.table,
        }
    }
}

/// Adds the granted WASI interfaces to a plugin linker (see the module documentation).
pub fn add_to_linker(linker: &mut Linker<PluginState>) -> wasmtime::Result<()> {
    use wasmtime_wasi::cli::WasiCliView;
    use wasmtime_wasi::clocks::WasiClocksView;
    use wasmtime_wasi::filesystem::WasiFilesystemView;
    use wasmtime_wasi::random::WasiRandomView;
    type T = PluginState;
    let l = linker;
    wasmtime_wasi_io_error::add_to_linker(l)?;
    poll::add_to_linker::<T, NoWait>(l, |t| NoWait(&mut t.sandbox_mut().table))?;
    streams::add_to_linker::<T, NoWait>(l, |t| NoWait(&mut t.sandbox_mut().table))?;
    clocks::wall_clock::add_to_linker::<T, WasiClocks>(l, T::clocks)?;
    clocks::monotonic_clock::add_to_linker::<T, WasiClocks>(l, T::clocks)?;
    random::random::add_to_linker::<T, WasiRandom>(l, T::random)?;
    random::insecure::add_to_linker::<T, WasiRandom>(l, T::random)?;
    random::insecure_seed::add_to_linker::<T, WasiRandom>(l, T::random)?;
    cli::exit::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::environment::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::stdin::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::stdout::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::stderr::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_input::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_output::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_stdin::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_stdout::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_stderr::add_to_linker::<T, WasiCli>(l, T::cli)?;
    // With no preopened directory these can never be handed a descriptor; they are linked so
    // that runtimes importing them (every libc-based one) instantiate.
    filesystem::preopens::add_to_linker::<T, WasiFilesystem>(l, T::filesystem)?;
    wasmtime_wasi::p2::bindings::sync::filesystem::types::add_to_linker::<T, WasiFilesystem>(
        l,
        T::filesystem,
    )?;
    Ok(())
}

/// The interfaces [`add_to_linker`] and the `log` import define, in any `0.2.x` version.
const GRANTED: &[&str] = &[
    "aura:gateway/log",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:cli/exit",
    "wasi:cli/environment",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:filesystem/preopens",
    "wasi:filesystem/types",
];

/// Whether an import name (`wasi:cli/environment@0.2.9`) is one the host defines: wasmtime
/// links any `0.2.x` import to the `0.2` version it implements; `aura:gateway/log` is defined in
/// `0.2.x` to `0.5.x` (the same function).
pub fn is_granted(import: &str) -> bool {
    import.split_once('@').is_some_and(|(name, version)| {
        GRANTED.contains(&name)
            && (version.starts_with("0.2.")
                || (name == "aura:gateway/log"
                    && ["0.3.", "0.4.", "0.5."]
                        .iter()
                        .any(|minor| version.starts_with(minor))))
    })
}

/// Defines every import of `component` that is not granted (sockets, name lookup, HTTP, any
/// other interface) as functions that trap when called, so that a component which imports them
/// loads and fails only if it uses them.
///
/// (wasmtime's `define_unknown_imports_as_traps` cannot be used: it defines an import under its
/// exact version, which would hide the granted interface of a compatible `0.2.x` version.)
pub fn stub_the_rest(
    linker: &mut Linker<PluginState>,
    engine: &wasmtime::Engine,
    component: &wasmtime::component::Component,
) -> wasmtime::Result<()> {
    use wasmtime::component::types::ComponentItem;
    use wasmtime::component::{LinkerInstance, ResourceType};

    fn stub(
        linker: &mut LinkerInstance<'_, PluginState>,
        engine: &wasmtime::Engine,
        granted: &[ResourceType],
        name: &str,
        item: &ComponentItem,
        qualified: &str,
    ) -> wasmtime::Result<()> {
        match item {
            ComponentItem::ComponentFunc(_) => {
                let what = qualified.to_owned();
                linker.func_new(name, move |_, _, _, _| {
                    wasmtime::bail!("`{what}` is not granted to plugins")
                })
            }
            ComponentItem::ComponentInstance(instance) => {
                let mut inner = linker.instance(name)?;
                for (export, item) in instance.exports(engine) {
                    let qualified = format!("{name}#{export}");
                    stub(&mut inner, engine, granted, export, &item.ty, &qualified)?;
                }
                Ok(())
            }
            // A resource of a granted interface used here (a socket's `pollable`) is that
            // interface's own type, already defined; only the others are stubbed.
            ComponentItem::Resource(ty) if granted.contains(ty) => Ok(()),
            ComponentItem::Resource(_) => {
                linker.resource(name, ResourceType::host::<()>(), |_, _| Ok(()))
            }
            _ => Ok(()),
        }
    }

    let ty = component.component_type();
    let imports: Vec<_> = ty.imports(engine).collect();
    let mut granted = Vec::new();
    for (name, item) in &imports {
        if let (true, ComponentItem::ComponentInstance(instance)) = (is_granted(name), &item.ty) {
            for (_, export) in instance.exports(engine) {
                if let ComponentItem::Resource(ty) = export.ty {
                    granted.push(ty);
                }
            }
        }
    }
    let mut root = linker.root();
    for (name, item) in &imports {
        if !is_granted(name) {
            stub(&mut root, engine, &granted, name, &item.ty, name)?;
        }
    }
    Ok(())
}

/// `wasi:io/error`, whose host implementation is synchronous.
mod wasmtime_wasi_io_error {
    use wasmtime::component::{HasData, Linker, ResourceTable};

    use super::PluginState;

    struct Table;

    impl HasData for Table {
        type Data<'a> = &'a mut ResourceTable;
    }

    pub fn add_to_linker(linker: &mut Linker<PluginState>) -> wasmtime::Result<()> {
        wasmtime_wasi_io::bindings::wasi::io::error::add_to_linker::<PluginState, Table>(
            linker,
            |t| &mut t.sandbox_mut().table,
        )
    }
}

impl PluginState {
    fn sandbox_mut(&mut self) -> &mut Sandbox {
        self.sandbox.get_or_insert_with(|| Box::new(Sandbox::new()))
    }
}

/// `wasi:io` over the instance's resource table, where every blocking operation completes at
/// once or traps. The streams a plugin can reach (captured stdout/stderr, an empty stdin) are
/// always ready, so only a guest that waits on purpose (a sleep) ever sees the trap.
struct NoWait<'a>(&'a mut ResourceTable);

impl wasmtime::component::HasData for NoWait<'static> {
    type Data<'a> = NoWait<'a>;
}

/// Runs `future` to completion if it completes without waiting.
fn at_once<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

const WOULD_WAIT: &str = "a plugin may not wait: the operation was not ready at once";

fn wait_refused() -> wasmtime::Error {
    wasmtime::format_err!(WOULD_WAIT)
}

fn at_once_stream<T>(future: impl Future<Output = StreamResult<T>>) -> StreamResult<T> {
    at_once(future).unwrap_or_else(|| Err(StreamError::Trap(wait_refused())))
}

mod io_impls {
    use wasmtime_wasi::p2::bindings::sync::io::streams::{InputStream, OutputStream};
    use wasmtime_wasi_io::bindings::wasi::io::poll as async_poll;
    use wasmtime_wasi_io::bindings::wasi::io::streams::{
        HostInputStream as AsyncIn, HostOutputStream as AsyncOut,
    };

    use super::*;

    impl poll::Host for NoWait<'_> {
        fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
            at_once(async_poll::Host::poll(self.0, pollables))
                .unwrap_or_else(|| Err(wait_refused()))
        }
    }

    impl poll::HostPollable for NoWait<'_> {
        fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
            // Asking is not waiting: a pollable that is not ready yet answers `false`.
            Ok(at_once(async_poll::HostPollable::ready(self.0, pollable))
                .transpose()?
                .unwrap_or(false))
        }

        fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
            at_once(async_poll::HostPollable::block(self.0, pollable))
                .unwrap_or_else(|| Err(wait_refused()))
        }

        fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
            async_poll::HostPollable::drop(self.0, pollable)
        }
    }

    impl streams::Host for NoWait<'_> {
        fn convert_stream_error(
            &mut self,
            err: StreamError,
        ) -> wasmtime::Result<streams::StreamError> {
            streams::Host::convert_stream_error(&mut *self.0, err)
        }
    }

    impl streams::HostOutputStream for NoWait<'_> {
        fn drop(&mut self, stream: Resource<OutputStream>) -> wasmtime::Result<()> {
            at_once(AsyncOut::drop(self.0, stream)).unwrap_or_else(|| Err(wait_refused()))
        }

        fn check_write(&mut self, stream: Resource<OutputStream>) -> StreamResult<u64> {
            AsyncOut::check_write(self.0, stream)
        }

        fn write(&mut self, stream: Resource<OutputStream>, bytes: Vec<u8>) -> StreamResult<()> {
            AsyncOut::write(self.0, stream, bytes)
        }

        fn blocking_write_and_flush(
            &mut self,
            stream: Resource<OutputStream>,
            bytes: Vec<u8>,
        ) -> StreamResult<()> {
            at_once_stream(AsyncOut::blocking_write_and_flush(self.0, stream, bytes))
        }

        fn blocking_write_zeroes_and_flush(
            &mut self,
            stream: Resource<OutputStream>,
            len: u64,
        ) -> StreamResult<()> {
            at_once_stream(AsyncOut::blocking_write_zeroes_and_flush(
                self.0, stream, len,
            ))
        }

        fn subscribe(
            &mut self,
            stream: Resource<OutputStream>,
        ) -> wasmtime::Result<Resource<DynPollable>> {
            AsyncOut::subscribe(self.0, stream)
        }

        fn write_zeroes(&mut self, stream: Resource<OutputStream>, len: u64) -> StreamResult<()> {
            AsyncOut::write_zeroes(self.0, stream, len)
        }

        fn flush(&mut self, stream: Resource<OutputStream>) -> StreamResult<()> {
            AsyncOut::flush(self.0, stream)
        }

        fn blocking_flush(&mut self, stream: Resource<OutputStream>) -> StreamResult<()> {
            at_once_stream(AsyncOut::blocking_flush(self.0, stream))
        }

        fn splice(
            &mut self,
            dst: Resource<OutputStream>,
            src: Resource<InputStream>,
            len: u64,
        ) -> StreamResult<u64> {
            AsyncOut::splice(self.0, dst, src, len)
        }

        fn blocking_splice(
            &mut self,
            dst: Resource<OutputStream>,
            src: Resource<InputStream>,
            len: u64,
        ) -> StreamResult<u64> {
            at_once_stream(AsyncOut::blocking_splice(self.0, dst, src, len))
        }
    }

    impl streams::HostInputStream for NoWait<'_> {
        fn drop(&mut self, stream: Resource<InputStream>) -> wasmtime::Result<()> {
            at_once(AsyncIn::drop(self.0, stream)).unwrap_or_else(|| Err(wait_refused()))
        }

        fn read(&mut self, stream: Resource<InputStream>, len: u64) -> StreamResult<Vec<u8>> {
            AsyncIn::read(self.0, stream, len)
        }

        fn blocking_read(
            &mut self,
            stream: Resource<InputStream>,
            len: u64,
        ) -> StreamResult<Vec<u8>> {
            at_once_stream(AsyncIn::blocking_read(self.0, stream, len))
        }

        fn skip(&mut self, stream: Resource<InputStream>, len: u64) -> StreamResult<u64> {
            AsyncIn::skip(self.0, stream, len)
        }

        fn blocking_skip(&mut self, stream: Resource<InputStream>, len: u64) -> StreamResult<u64> {
            at_once_stream(AsyncIn::blocking_skip(self.0, stream, len))
        }

        fn subscribe(
            &mut self,
            stream: Resource<InputStream>,
        ) -> wasmtime::Result<Resource<DynPollable>> {
            AsyncIn::subscribe(self.0, stream)
        }
    }
}

/// A bounded in-memory stdout or stderr: writes always succeed at once; bytes over
/// [`CAPTURE_BYTES`] are dropped and counted.
#[derive(Debug, Clone, Default)]
struct Capture(Arc<Mutex<CaptureBuffer>>);

#[derive(Debug, Default)]
struct CaptureBuffer {
    bytes: Vec<u8>,
    dropped: usize,
}

impl Capture {
    fn append(&self, data: &[u8]) {
        if let Ok(mut buffer) = self.0.lock() {
            let room = CAPTURE_BYTES.saturating_sub(buffer.bytes.len());
            let kept = data.len().min(room);
            buffer.bytes.extend_from_slice(&data[..kept]);
            buffer.dropped += data.len() - kept;
        }
    }

    fn take(&self) -> (Vec<u8>, usize) {
        self.0
            .lock()
            .map(|mut buffer| {
                let dropped = std::mem::take(&mut buffer.dropped);
                (std::mem::take(&mut buffer.bytes), dropped)
            })
            .unwrap_or_default()
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl OutputStream for Capture {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Always room: what does not fit is dropped, never waited for.
        Ok(4096)
    }
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.append(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_the_first_bytes_and_counts_the_rest() {
        let capture = Capture::default();
        capture.append(&vec![b'a'; CAPTURE_BYTES - 2]);
        capture.append(b"bcde");
        let (bytes, dropped) = capture.take();
        assert_eq!(bytes.len(), CAPTURE_BYTES);
        assert!(bytes.ends_with(b"abc"));
        assert_eq!(dropped, 2);
        assert_eq!(capture.take(), (Vec::new(), 0), "taken once");
    }

    #[test]
    fn granted_interfaces_match_any_compatible_version_only() {
        assert!(is_granted("wasi:cli/environment@0.2.9"));
        assert!(is_granted("wasi:io/streams@0.2.0"));
        assert!(is_granted("aura:gateway/log@0.2.0"));
        assert!(is_granted("aura:gateway/log@0.3.0"));
        assert!(is_granted("aura:gateway/log@0.4.0"));
        assert!(is_granted("aura:gateway/log@0.5.0"));
        assert!(!is_granted("aura:gateway/log@0.6.0"));
        assert!(!is_granted("wasi:cli/environment@0.3.0"));
        assert!(!is_granted("wasi:sockets/tcp@0.2.9"));
        assert!(!is_granted("wasi:http/outgoing-handler@0.2.9"));
        assert!(!is_granted("wasi:cli/environment"));
    }

    #[test]
    fn a_future_that_would_wait_is_not_run_to_completion() {
        assert_eq!(at_once(async { 7 }), Some(7));
        assert_eq!(at_once(std::future::pending::<()>()), None);
    }
}
