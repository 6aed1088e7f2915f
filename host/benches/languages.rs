//! What a plugin costs by the language it is written in: the example plugins of
//! `examples/plugins` (the same policy per stage in Rust, Python and JavaScript), loaded through
//! the real runtime, called with the same inputs in both instance modes.
//!
//! `cargo bench -p aura-gateway --bench languages` builds the examples when missing (cargo for
//! Rust, `examples/plugins/build` for Python and JavaScript) and prints, per module: its size,
//! the time to load it (compile, instantiate, `configure`), the median and p99 time of a call on
//! a reused instance (`pooled`) and on a new one (`fresh`: instantiation and `configure` in every
//! call), and the linear memory an instance holds.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use aura_gateway::actor::{Actor, Role};
use aura_gateway::config::{Config, InstanceReuse, StageConfig};
use aura_gateway::plane::Plane;
use aura_gateway::policy::stages::{
    ApiKey, Cors, CorsInput, DbEngine, DbInput, DbRouting, KeyHeaders, KeyInput, ProjectDb, Quota,
    QuotaInput, Topology,
};
use aura_gateway::policy::{Policies, PolicyEngine, Stage};
use aura_gateway::routes::{RouteGroup, Service};

const STAGES: [(&str, Stage); 4] = [
    ("api-key", Stage::ApiKey),
    ("cors", Stage::Cors),
    ("quota", Stage::Quota),
    ("db-routing", Stage::DbRouting),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn module(lang: &str, stage: &str) -> PathBuf {
    let out = root().join("target/examples");
    if lang == "rust" {
        let path = out.join(format!(
            "wasm32-wasip2/release/aura_example_{}.wasm",
            stage.replace('-', "_")
        ));
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(root().join("examples/plugins/rust").join(stage))
            .args([
                "build",
                "--quiet",
                "--target",
                "wasm32-wasip2",
                "--release",
                "--target-dir",
            ])
            .arg(&out)
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .status()
            .expect("cargo");
        assert!(status.success(), "building rust/{stage}");
        return path;
    }
    let path = out.join(format!("plugins/{lang}-{stage}.wasm"));
    if !path.exists() {
        let status = Command::new(root().join("examples/plugins/build"))
            .args(["--lang", lang, "--out"])
            .arg(out.join("plugins"))
            .status()
            .expect("examples/plugins/build");
        assert!(status.success(), "examples/plugins/build --lang {lang}");
    }
    path
}

fn stage_config(stage: &str) -> serde_json::Value {
    let path = root()
        .join("examples/plugins/vectors")
        .join(stage)
        .join("config.toml");
    let text = std::fs::read_to_string(&path).expect("config.toml");
    serde_json::to_value(toml::from_str::<toml::Value>(&text).expect("TOML")).expect("JSON")
}

fn load(stage: Stage, dir: &str, module: &Path, reuse: InstanceReuse) -> Policies {
    let mut config = Config::default();
    config.plugins.instance_reuse = reuse;
    // Wall-clock deadline: a preempted call must not be stopped (this measures cost).
    config.plugins.call_deadline_ms = 5_000;
    let target: &mut StageConfig = match stage {
        Stage::ApiKey => &mut config.data_plane.plugins.api_key,
        Stage::Cors => &mut config.data_plane.plugins.cors,
        Stage::Quota => &mut config.data_plane.plugins.quota,
        Stage::DbRouting => &mut config.data_plane.plugins.db_routing,
    };
    target.module = module.display().to_string();
    target.config = stage_config(dir);
    let runtime = PolicyEngine::new(&config.plugins).expect("engine");
    Policies::load(&runtime, &config, None).expect("the example loads")
}

/// One call of `stage` with a typical input.
fn call(stage: Stage, p: &Policies) {
    let data = p.plane(Plane::Data);
    match stage {
        Stage::ApiKey => {
            let headers = [(
                "apikey".to_owned(),
                "aura_pk_7Hq2v9XbN4mK8pR3sT6wY1zA5cE0fG2hJ".to_owned(),
            )];
            let input = KeyInput {
                method: "GET",
                path: "/v1/db/todos",
                query_keys: &[],
                headers: KeyHeaders::Listed(&headers),
                client: None,
            };
            data.module::<ApiKey>()
                .expect("stage")
                .decide_uncached(None, input)
                .expect("call");
        }
        Stage::Cors => {
            data.module::<Cors>()
                .expect("stage")
                .decide_uncached(
                    None,
                    CorsInput {
                        method: "GET",
                        path: "/v1/db/todos",
                        origin: "https://app.example.com",
                        request_method: None,
                        request_headers: None,
                        client: None,
                    },
                )
                .expect("call");
        }
        Stage::Quota => {
            let mut actor = Actor::unauthenticated(Plane::Data);
            actor.role = Role::Authenticated;
            actor.project = Some("abcd1234".into());
            actor.user_id = Some("0b7e9f3a-2c1d-4e5f-8a9b-c0d1e2f3a4b5".into());
            actor.plan = Some("pro".into());
            data.module::<Quota>()
                .expect("stage")
                .decide_uncached(
                    None,
                    QuotaInput {
                        method: "GET",
                        path: "/v1/db/todos",
                        route_group: RouteGroup::Service(Service::Db),
                        actor: &actor,
                        headers: None,
                    },
                )
                .expect("call");
        }
        Stage::DbRouting => {
            let project = ProjectDb {
                engine: DbEngine::Postgres,
                topology: Topology::Dedicated,
                postgrest_url: Some("http://pgrst-abcd1234.internal:3000".into()),
                replicas: Vec::new(),
            };
            data.module::<DbRouting>()
                .expect("stage")
                .decide_uncached(
                    None,
                    DbInput {
                        method: "GET",
                        path: "/v1/db/todos",
                        project: Some(&project),
                        client_region: None,
                        actor: None,
                    },
                )
                .expect("call");
        }
    }
}

fn peak_memory(stage: Stage, p: &Policies) -> usize {
    p.plane(Plane::Data)
        .any_slot(stage)
        .and_then(|slot| slot.module())
        .map_or(0, |module| module.peak_memory())
}

/// (median, p99) of `calls` timed calls after `warm` untimed ones.
fn time_calls(stage: Stage, p: &Policies, warm: usize, calls: usize) -> (Duration, Duration) {
    for _ in 0..warm {
        call(stage, p);
    }
    let mut times: Vec<Duration> = (0..calls)
        .map(|_| {
            let started = Instant::now();
            call(stage, p);
            started.elapsed()
        })
        .collect();
    times.sort();
    (times[calls / 2], times[(calls * 99 / 100).min(calls - 1)])
}

fn us(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument picks languages (`python`, `js`, `rust`).
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    println!(
        "| language | stage | module MiB | load ms | pooled p50 µs | pooled p99 µs | fresh p50 µs | fresh p99 µs | instance memory MiB |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for lang in ["rust", "python", "js"] {
        if !filter.is_empty() && !filter.iter().any(|f| f == lang) {
            continue;
        }
        for (dir, stage) in STAGES {
            let module = module(lang, dir);
            let size = std::fs::metadata(&module).expect("module").len() as f64 / (1 << 20) as f64;
            let started = Instant::now();
            let pooled = load(stage, dir, &module, InstanceReuse::Pooled);
            let load_ms = started.elapsed().as_secs_f64() * 1e3;
            let (pooled_p50, pooled_p99) = time_calls(stage, &pooled, 200, 2_000);
            let memory = peak_memory(stage, &pooled) as f64 / (1 << 20) as f64;
            drop(pooled);
            let fresh = load(stage, dir, &module, InstanceReuse::Fresh);
            let (fresh_p50, fresh_p99) = time_calls(stage, &fresh, 5, 100);
            println!(
                "| {lang} | {dir} | {size:.2} | {load_ms:.0} | {} | {} | {} | {} | {memory:.1} |",
                us(pooled_p50),
                us(pooled_p99),
                us(fresh_p50),
                us(fresh_p99),
            );
        }
    }
}
