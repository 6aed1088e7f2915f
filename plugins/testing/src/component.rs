//! Component glue for the hostile test plugin.

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

use std::hint::black_box;

use crate::{Behaviour, behaviour};

wit_bindgen::generate!({ path: "../../wit", world: "cors-stage" });

use aura::gateway::log::{Level, log};
use aura::gateway::types::Plane;
use exports::aura::gateway::cors::{
    CorsAllow, CorsCache, CorsDecision, CorsInputs, CorsRequest, Guest,
};

struct Component;

static TRAP_ALWAYS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static ECHO_ALL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static SPIN_ALWAYS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static EXPOSE_PATH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The configuration's schema: the knobs below, typed (any other key is accepted).
const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "refuse": {"type": "boolean"},
    "trap_always": {"type": "boolean"},
    "spin_always": {"type": "boolean"},
    "echo_all": {"type": "boolean"},
    "expose_path": {"type": "boolean"},
    "spin_configure_after_ms": {"type": "integer", "minimum": 0},
    "declare": {"type": "array", "items": {"enum": ["method", "path", "origin", "request-method", "request-headers"]}},
    "max_age_ms": {"type": "integer", "minimum": 0, "maximum": 4294967295}
  }
}"#;

/// The inputs named by `declare`, when it is given.
fn declared(value: &serde_json::Value) -> Result<Option<CorsCache>, String> {
    let Some(names) = value.get("declare").and_then(serde_json::Value::as_array) else {
        return Ok(None);
    };
    let mut inputs = CorsInputs::empty();
    for name in names {
        inputs = inputs
            | match name.as_str() {
                Some("method") => CorsInputs::METHOD,
                Some("path") => CorsInputs::PATH,
                Some("origin") => CorsInputs::ORIGIN,
                Some("request-method") => CorsInputs::REQUEST_METHOD,
                Some("request-headers") => CorsInputs::REQUEST_HEADERS,
                _ => return Err(format!("declare: unknown input {name}")),
            };
    }
    let max_age_ms = value
        .get("max_age_ms")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(60_000) as u32;
    Ok(Some(CorsCache { inputs, max_age_ms }))
}

/// Loops until the host stops the call.
fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

fn recurse(depth: u64, pad: [u64; 32]) -> u64 {
    let mut next = black_box(pad);
    next[(depth % 32) as usize] = depth;
    recurse(depth + 1, next) + next[0]
}

impl Guest for Component {
    fn config_schema() -> Option<String> {
        Some(SCHEMA.to_owned())
    }

    fn configure(_plane: Plane, config: String) -> Result<Option<CorsCache>, String> {
        let value: serde_json::Value =
            serde_json::from_str(&config).map_err(|e| format!("invalid config: {e}"))?;
        if value.get("refuse") == Some(&serde_json::Value::Bool(true)) {
            return Err("refused as asked by the configuration".to_owned());
        }
        let trap = value.get("trap_always") == Some(&serde_json::Value::Bool(true));
        TRAP_ALWAYS.store(trap, std::sync::atomic::Ordering::Relaxed);
        let echo = value.get("echo_all") == Some(&serde_json::Value::Bool(true));
        ECHO_ALL.store(echo, std::sync::atomic::Ordering::Relaxed);
        let spin = value.get("spin_always") == Some(&serde_json::Value::Bool(true));
        SPIN_ALWAYS.store(spin, std::sync::atomic::Ordering::Relaxed);
        let expose = value.get("expose_path") == Some(&serde_json::Value::Bool(true));
        EXPOSE_PATH.store(expose, std::sync::atomic::Ordering::Relaxed);
        // Set up slowly from a moment on: every instance made after it spins in `configure`.
        if let Some(after) = value
            .get("spin_configure_after_ms")
            .and_then(serde_json::Value::as_u64)
        {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            if now >= after {
                let mut n: u64 = 0;
                loop {
                    n = black_box(n.wrapping_add(1));
                }
            }
        }
        declared(&value)
    }

    fn decide(request: CorsRequest) -> CorsDecision {
        if TRAP_ALWAYS.load(std::sync::atomic::Ordering::Relaxed) {
            std::process::abort();
        }
        if SPIN_ALWAYS.load(std::sync::atomic::Ordering::Relaxed) {
            spin();
        }
        if EXPOSE_PATH.load(std::sync::atomic::Ordering::Relaxed) {
            let mut decision = echo(request.origin);
            if let CorsDecision::Allow(a) = &mut decision {
                a.expose_headers
                    .push(format!("x-path{}", request.path.replace('/', "-")));
            }
            return decision;
        }
        if ECHO_ALL.load(std::sync::atomic::Ordering::Relaxed) {
            return echo(request.origin);
        }
        match behaviour(&request.origin) {
            Behaviour::Trap => std::process::abort(),
            Behaviour::Loop => spin(),
            Behaviour::Grow => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    black_box(&hoard);
                }
            }
            Behaviour::Recurse => {
                let depth = recurse(0, [0; 32]);
                black_box(depth);
                CorsDecision::Deny
            }
            Behaviour::Log => {
                log(Level::Warn, "testing plugin saw log.test\nforged line");
                println!("to stdout");
                eprintln!("to stderr");
                echo(request.origin)
            }
            Behaviour::Flood => {
                let big = "x".repeat(1 << 20);
                for _ in 0..1000 {
                    log(Level::Error, &big);
                }
                use std::io::Write;
                let _ = std::io::stdout().write_all(big.as_bytes());
                let _ = std::io::stdout().flush();
                echo(request.origin)
            }
            Behaviour::Sleep => {
                std::thread::sleep(std::time::Duration::from_secs(10));
                echo(request.origin)
            }
            Behaviour::File => {
                let mut could = Vec::new();
                if std::fs::read("/etc/passwd").is_ok() {
                    could.push("file".to_owned());
                }
                if std::env::vars().next().is_some() {
                    could.push("env".to_owned());
                }
                if could.is_empty() {
                    return CorsDecision::Deny;
                }
                CorsDecision::Allow(CorsAllow {
                    allow_origin: request.origin,
                    allow_methods: Vec::new(),
                    allow_headers: could,
                    expose_headers: Vec::new(),
                    max_age: None,
                })
            }
            Behaviour::Random => {
                let bytes = random_bytes(1 << 20);
                black_box(&bytes);
                echo(request.origin)
            }
            Behaviour::Socket => {
                if std::net::TcpStream::connect("127.0.0.1:4222").is_ok() {
                    echo(request.origin)
                } else {
                    CorsDecision::Deny
                }
            }
            Behaviour::Echo => echo(request.origin),
        }
    }
}

fn echo(origin: String) -> CorsDecision {
    CorsDecision::Allow(CorsAllow {
        allow_origin: origin,
        allow_methods: vec!["GET".to_owned()],
        allow_headers: vec!["x-testing".to_owned()],
        expose_headers: vec!["x-testing-plugin".to_owned()],
        max_age: Some(1),
    })
}

#[link(wasm_import_module = "wasi:random/random@0.2.0")]
unsafe extern "C" {
    /// `get-random-bytes: func(len: u64) -> list<u8>`, called directly (the standard library
    /// never asks for more than a few bytes): the list comes back as (pointer, length).
    #[link_name = "get-random-bytes"]
    fn get_random_bytes(len: u64, ret: *mut usize);
}

/// `len` random bytes from the host; the host traps a request over its bound.
fn random_bytes(len: u64) -> Vec<u8> {
    let mut ret = [0usize; 2];
    unsafe { get_random_bytes(len, ret.as_mut_ptr()) };
    let (ptr, n) = (ret[0] as *mut u8, ret[1]);
    if ptr.is_null() {
        return Vec::new();
    }
    // Allocated by the guest's `cabi_realloc`, which is the global allocator.
    unsafe { Vec::from_raw_parts(ptr, n, n) }
}

export!(Component);
