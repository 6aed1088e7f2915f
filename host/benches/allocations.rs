//! Heap allocations per request through the gateway, on the HTTP route (`/v1/storage/…`, to an
//! upstream) and the NATS route (`/v1/functions/…`, to a responder), with the 12-header SDK
//! request of `bench/run`.
//!
//! The gateway runs on this thread (a current-thread runtime, real sockets, the full data-plane
//! chain); the client, the upstream and the NATS responder run on threads of their own, and only
//! this thread's allocations are counted. Not a test: it prints figures.
//!
//! `cargo bench -p aura-gateway --bench allocations` (the NATS route needs `nats-server` on the
//! PATH or in /usr/sbin; without one it is skipped). With `AURA_ALLOC_SAMPLE=N` it also samples
//! every Nth counted allocation's call stack and prints the most frequent sites, each named by
//! its first `AURA_ALLOC_DEPTH` frames (2 by default).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aura_gateway::config::Config;
use aura_gateway::server;
use aura_gateway::state::AppState;

/// Counts the allocations of the threads that enabled counting.
struct Counting;

thread_local! {
    static COUNTED: Cell<bool> = const { Cell::new(false) };
    static SAMPLING: Cell<bool> = const { Cell::new(false) };
}
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
/// Sample every Nth allocation (0: off).
static SAMPLE_EVERY: AtomicU64 = AtomicU64::new(0);
static SAMPLES: std::sync::Mutex<Option<std::collections::HashMap<String, u64>>> =
    std::sync::Mutex::new(None);

fn count(size: usize) {
    if COUNTED.with(Cell::get) && !SAMPLING.with(Cell::get) {
        let n = ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size as u64, Ordering::Relaxed);
        let every = SAMPLE_EVERY.load(Ordering::Relaxed);
        if every > 0 && n.is_multiple_of(every) {
            sample();
        }
    }
}

/// How many frames name a sampled site: `AURA_ALLOC_DEPTH`, 2 by default.
fn sample_depth() -> usize {
    std::env::var("AURA_ALLOC_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(2)
}

/// Records the call site of the current allocation (its first frames outside the allocator and
/// the standard library).
fn sample() {
    SAMPLING.with(|s| s.set(true));
    let trace = std::backtrace::Backtrace::force_capture().to_string();
    // Frames read `  12: function` then `at file:line`: the site is the first line outside the
    // standard library and this file, shortened to the crate's folder.
    let frames: Vec<String> = trace
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("at "))
        .filter(|at| !at.contains("/rustc/") && !at.contains("benches/allocations.rs"))
        .map(|at| {
            at.split_once("index.crates.io-")
                .and_then(|(_, rest)| rest.split_once('/').map(|(_, r)| r.to_owned()))
                .unwrap_or_else(|| at.to_owned())
        })
        .take(sample_depth())
        .collect();
    if std::env::var_os("AURA_ALLOC_RAW").is_some() {
        eprintln!("{trace}");
    }
    let key = frames.join(" <- ");
    if let Ok(mut samples) = SAMPLES.lock() {
        *samples
            .get_or_insert_with(Default::default)
            .entry(key)
            .or_default() += 1;
    }
    SAMPLING.with(|s| s.set(false));
}

#[expect(
    unsafe_code,
    reason = "a global allocator is an unsafe trait; this one only counts and delegates"
)]
// SAFETY: every call is forwarded unchanged to the gateway's allocator, which upholds the
// trait's contract.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { aura_gateway::allocator::Allocator.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { aura_gateway::allocator::Allocator.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { aura_gateway::allocator::Allocator.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { aura_gateway::allocator::Allocator.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const API_KEY: &str = "aura_pk_bench_0123456789abcdefghijklmnopqrstuvwxyz";
const WARM_UP: usize = 2_000;
const REQUESTS: usize = 20_000;

fn request(path: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: bench\r\n\
         User-Agent: aura-js/2.4.1 Mozilla/5.0 (X11; Linux x86_64) Chrome/126.0\r\n\
         Accept: application/json, text/plain, */*\r\n\
         Accept-Encoding: gzip, deflate, br\r\n\
         Accept-Language: en-GB,en;q=0.9\r\n\
         Content-Type: application/json\r\n\
         Origin: https://app.example.com\r\n\
         Referer: https://app.example.com/dashboard/projects\r\n\
         apikey: {API_KEY}\r\n\
         X-Client-Info: aura-js/2.4.1\r\n\
         Prefer: return=representation\r\n\
         Cache-Control: no-cache\r\n\r\n"
    )
    .into_bytes()
}

/// Reads one response (head and a `content-length` body) from `stream`; returns its status.
fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> u16 {
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).expect("ascii head");
            let status: u16 = head[9..12].parse().expect("status");
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + length {
                let n = stream.read(&mut chunk).expect("read");
                assert!(n > 0, "connection closed");
                buf.extend_from_slice(&chunk[..n]);
            }
            return status;
        }
        let n = stream.read(&mut chunk).expect("read");
        assert!(n > 0, "connection closed");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Sends `count` requests one after another on one keep-alive connection, from another thread.
fn drive(addr: SocketAddr, path: &str, count: usize) -> std::thread::JoinHandle<()> {
    let raw = request(path);
    std::thread::spawn(move || {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let mut buf = Vec::with_capacity(16 * 1024);
        for _ in 0..count {
            stream.write_all(&raw).expect("write");
            let status = read_response(&mut stream, &mut buf);
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&buf));
        }
    })
}

/// The upstream: `200` with 13 bytes to everything, on a thread of its own.
fn upstream() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            loop {
                let (stream, _) = listener.accept().await.expect("accept");
                let _ = stream.set_nodelay(true);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from_static(b"hello, aura!\n")),
                        ))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    });
    addr
}

/// A `nats-server` on a free port and a responder on `{prefix}.functions.http`, or `None`.
fn nats(prefix: &str) -> Option<(std::process::Child, String)> {
    let binary = [
        "nats-server",
        "/usr/sbin/nats-server",
        "/usr/bin/nats-server",
    ]
    .into_iter()
    .find(|b| {
        std::process::Command::new(b)
            .arg("--version")
            .output()
            .is_ok()
    })?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .ok()?
        .port();
    let child = std::process::Command::new(binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let url = format!("nats://127.0.0.1:{port}");
    for _ in 0..100 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let subject = format!("{prefix}.functions.http");
    let responder_url = url.clone();
    std::thread::spawn(move || {
        use base64::Engine as _;
        use futures::StreamExt;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let client = async_nats::connect(responder_url).await.expect("nats");
            let mut sub = client.subscribe(subject).await.expect("subscribe");
            let reply = bytes::Bytes::from(
                serde_json::json!({
                    "status": 200,
                    "headers": [["content-type", "text/plain"]],
                    "body": base64::engine::general_purpose::STANDARD.encode(b"hello, aura!\n"),
                })
                .to_string(),
            );
            while let Some(message) = sub.next().await {
                if let Some(to) = message.reply {
                    let _ = client.publish(to, reply.clone()).await;
                }
            }
        });
    });
    std::thread::sleep(Duration::from_millis(200));
    Some((child, url))
}

fn config(dir: &std::path::Path, storage: SocketAddr, nats_url: &str) -> Config {
    let control = dir.join("control.toml");
    std::fs::write(
        &control,
        format!(
            "[[organizations]]\nid = \"00000000-0000-4000-8000-000000000001\"\nname = \"bench\"\n\n\
             [[projects]]\nref = \"bench\"\norganization_id = \"00000000-0000-4000-8000-000000000001\"\n\
             db_engine = \"postgres\"\ntopology = \"shared\"\n\n\
             [[api_keys]]\nid = \"00000000-0000-4000-8000-0000000000b1\"\nproject_ref = \"bench\"\n\
             role = \"anon\"\nkey_sha256 = \"{}\"\n",
            aura_gateway::auth::keys::hash_key(API_KEY)
        ),
    )
    .expect("control file");
    let mut c = Config {
        host: "127.0.0.1".into(),
        port: 0,
        management_port: 0,
        ..Config::default()
    };
    c.log.level = "warn".into();
    c.nats.url = nats_url.to_owned();
    c.nats.subject_prefix = "bench".into();
    c.control.file = Some(control.display().to_string());
    c.upstreams.storage_url = Some(format!("http://{storage}"));
    c.rate_limit.data_plane_per_ip.rate_per_second = 1_000_000_000;
    c.rate_limit.data_plane_per_ip.burst = 1_000_000_000;
    c.data_plane.plugins.quota.config =
        serde_json::json!({ "rate_per_second": 1_000_000, "burst": 10_000_000 });
    c.plugins.tenant_refresh_secs = 3_600;
    c.plugins.module_gc_interval_secs = 3_600;
    c
}

/// Allocations and bytes per request on this thread while `count` requests to `path` run.
async fn measure(addr: SocketAddr, path: &str) -> (f64, f64) {
    finish(drive(addr, path, WARM_UP), "warm-up").await;
    let (a0, b0) = counts();
    finish(drive(addr, path, REQUESTS), "run").await;
    let (a1, b1) = counts();
    (
        (a1 - a0) as f64 / REQUESTS as f64,
        (b1 - b0) as f64 / REQUESTS as f64,
    )
}

/// Allocations and bytes so far.
fn counts() -> (u64, u64) {
    (
        ALLOCATIONS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    )
}

/// Waits for the client thread `run` without blocking this thread's runtime.
async fn finish(run: std::thread::JoinHandle<()>, what: &str) {
    while !run.is_finished() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    run.join().expect(what);
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let storage = upstream();
    let nats = nats("bench");
    let has_nats = nats.is_some();
    let nats_url = nats
        .as_ref()
        .map_or("nats://127.0.0.1:1".to_owned(), |(_, url)| url.clone());
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path(), storage, &nats_url);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let state = AppState::build(config.clone(), None).await.expect("state");
        let (data, management) = server::bind(&config).await.expect("bind");
        let addr = data.local_addr().expect("addr");
        let (_stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(server::serve(state, data, management, async move {
            let _ = stop_rx.await;
        }));
        if let Some(every) = std::env::var("AURA_ALLOC_SAMPLE")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            SAMPLE_EVERY.store(every, Ordering::Relaxed);
        }
        COUNTED.with(|c| c.set(true));
        println!(
            "allocations per request, gateway thread only ({REQUESTS} requests after {WARM_UP}, 12-header SDK request, one keep-alive connection):"
        );
        let (allocs, bytes) = measure(addr, "/v1/storage/object/bench/a.json").await;
        println!("  HTTP route /v1/storage/…   {allocs:7.1} allocations  {bytes:9.0} bytes");
        if has_nats {
            let (allocs, bytes) = measure(addr, "/v1/functions/hello").await;
            println!("  NATS route /v1/functions/… {allocs:7.1} allocations  {bytes:9.0} bytes");
        } else {
            println!("  NATS route skipped: no nats-server found");
        }
        COUNTED.with(|c| c.set(false));
    });
    if let Ok(samples) = SAMPLES.lock()
        && let Some(samples) = samples.as_ref()
    {
        let total: u64 = samples.values().sum();
        let mut sites: Vec<_> = samples.iter().collect();
        sites.sort_by(|a, b| b.1.cmp(a.1));
        println!("\nallocation sites, {total} samples (both routes, warm-up included):");
        for (site, n) in sites.into_iter().take(40) {
            println!("{:5.1}%  {site}", *n as f64 * 100.0 / total as f64);
        }
    }
    if let Some((mut child, _)) = nats {
        let _ = child.kill();
        let _ = child.wait();
    }
}
