//! Per-call cost of each default policy plugin, run through the real runtime on the built
//! components with typical inputs (a request with 12 headers), in both instance modes
//! (`pooled`: a configured instance reused; `fresh`: a new instance per call), next to the same
//! policy compiled natively (the price of the sandbox).
//!
//! `cargo bench --bench plugins` prints the figures (criterion's median and spread).

use std::hint::black_box;

use aura_gateway::actor::{Actor, Role};
use aura_gateway::config::{Config, InstanceReuse};
use aura_gateway::plane::Plane;
use aura_gateway::policy::stages::{
    ApiKey, Cors, CorsInput, DbEngine, DbInput, DbRouting, KeyHeaders, KeyInput, ProjectDb, Quota,
    QuotaInput, Topology,
};
use aura_gateway::policy::{Policies, PolicyEngine};
use aura_gateway::routes::{RouteGroup, Service};
use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderName, HeaderValue, Uri};

/// A typical SDK request: 12 headers, about 530 bytes.
fn typical_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in [
        ("host", "api.example.com"),
        (
            "user-agent",
            "aura-js/2.4.1 Mozilla/5.0 (X11; Linux x86_64) Chrome/126.0",
        ),
        ("accept", "application/json, text/plain, */*"),
        ("accept-encoding", "gzip, deflate, br"),
        ("accept-language", "en-GB,en;q=0.9"),
        ("content-type", "application/json"),
        ("origin", "https://app.example.com"),
        ("referer", "https://app.example.com/dashboard/projects"),
        ("apikey", "aura_pk_7Hq2v9XbN4mK8pR3sT6wY1zA5cE0fG2hJ"),
        (
            "authorization",
            "Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0In0.sig",
        ),
        ("x-client-info", "aura-js/2.4.1"),
        ("prefer", "return=representation"),
    ] {
        h.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    h
}

fn policies(reuse: InstanceReuse) -> Policies {
    let mut config = Config::default();
    config.plugins.instance_reuse = reuse;
    // The deadline is wall-clock time: on a busy machine a preempted iteration must not be
    // stopped as an overrun (this measures the cost of a call, not the deadline).
    config.plugins.call_deadline_ms = 1_000;
    let runtime = PolicyEngine::new(&config.plugins).expect("engine");
    Policies::load(&runtime, &config, None).expect("default plugins")
}

fn actor() -> Actor {
    let mut a = Actor::unauthenticated(Plane::Data);
    a.role = Role::Authenticated;
    a.project = Some("abcd1234".into());
    a.key_id = Some("5f0c8a0e-9a55-4c0f-9d55-6f3c2d1b7e11".into());
    a.user_id = Some("0b7e9f3a-2c1d-4e5f-8a9b-c0d1e2f3a4b5".into());
    a.plan = Some("free".into());
    a
}

fn bench_wasm(c: &mut Criterion) {
    let headers = typical_headers();
    let uri: Uri = "/v1/db/todos?select=*&order=id".parse().expect("uri");
    let actor = actor();
    for (label, reuse) in [
        ("pooled", InstanceReuse::Pooled),
        ("fresh", InstanceReuse::Fresh),
    ] {
        let p = policies(reuse);
        let api_key = p.data.module::<ApiKey>().expect("api-key stage");
        let cors = p.data.module::<Cors>().expect("cors stage");
        let quota = p.data.module::<Quota>().expect("quota stage");
        let db = p.data.module::<DbRouting>().expect("db-routing stage");
        let query_keys: Vec<String> = Vec::new();
        let key_input = KeyInput {
            method: "GET",
            path: uri.path(),
            query_keys: &query_keys,
            headers: KeyHeaders::Head(&headers),
            client: None,
        };
        let quota_input = QuotaInput {
            method: "GET",
            path: uri.path(),
            route_group: RouteGroup::Service(Service::Db),
            actor: &actor,
            headers: Some(&headers),
        };
        // A decision kept for the declared inputs: the cache's hit, no call.
        let mut group = c.benchmark_group(format!("cached-{label}"));
        group.bench_function("api_key", |b| {
            b.iter(|| black_box(api_key.decide(None, key_input).expect("hit")))
        });
        group.bench_function("quota", |b| {
            b.iter(|| black_box(quota.decide(None, quota_input).expect("hit")))
        });
        group.finish();
        let mut group = c.benchmark_group(format!("wasm-{label}"));
        group.bench_function("api_key", |b| {
            b.iter(|| black_box(api_key.decide_uncached(None, key_input).expect("call")))
        });
        group.bench_function("cors", |b| {
            b.iter(|| {
                black_box(
                    cors.decide_uncached(
                        None,
                        CorsInput {
                            method: "GET",
                            path: uri.path(),
                            origin: "https://app.example.com",
                            request_method: None,
                            request_headers: None,
                            client: None,
                        },
                    )
                    .expect("call"),
                )
            })
        });
        group.bench_function("quota", |b| {
            b.iter(|| black_box(quota.decide_uncached(None, quota_input).expect("call")))
        });
        group.bench_function("db_routing", |b| {
            b.iter(|| {
                let project = ProjectDb {
                    engine: DbEngine::Postgres,
                    topology: Topology::Dedicated,
                    postgrest_url: Some("http://pgrst-abcd1234.internal:3000".into()),
                    replicas: Vec::new(),
                };
                black_box(
                    db.decide_uncached(
                        None,
                        DbInput {
                            method: "GET",
                            path: uri.path(),
                            project: Some(&project),
                            client_region: None,
                            actor: None,
                        },
                    )
                    .expect("call"),
                )
            })
        });
        group.finish();
    }
}

fn bench_native(c: &mut Criterion) {
    use aura_plugin_quota::policy as quota;
    let headers = typical_headers();
    let uri: Uri = "/v1/db/todos?select=*&order=id".parse().expect("uri");
    let api_key = aura_plugin_api_key::policy::Policy::configure("{}").expect("config");
    let cors =
        aura_plugin_cors::policy::Policy::configure(aura_plugin_cors::policy::Plane::Data, "{}")
            .expect("config");
    let quota_policy = quota::Policy::configure("{}").expect("config");
    let db = aura_plugin_db_routing::policy::Policy::configure("{}").expect("config");
    let mut group = c.benchmark_group("native");
    group.bench_function("api_key", |b| {
        b.iter(|| {
            let wanted = api_key.headers();
            // As the host picks them: borrowed from the request's header map.
            let picked: Vec<(&str, &str)> = headers
                .iter()
                .filter(|(n, _)| wanted.iter().any(|w| w == n.as_str()))
                .filter_map(|(n, v)| Some((n.as_str(), v.to_str().ok()?)))
                .collect();
            black_box(api_key.extract(uri.path(), &[], &picked))
        })
    });
    group.bench_function("cors", |b| {
        b.iter(|| black_box(cors.decide("https://app.example.com", false)))
    });
    group.bench_function("quota", |b| {
        b.iter(|| {
            black_box(quota_policy.decide(
                "db",
                quota::Actor {
                    role: quota::Role::Authenticated,
                    has_key: true,
                    has_user: true,
                    plan: Some("free"),
                },
                None,
                &[],
            ))
        })
    });
    group.bench_function("db_routing", |b| {
        b.iter(|| {
            black_box(db.decide(
                "GET",
                uri.path(),
                Some(aura_plugin_db_routing::policy::Project {
                    engine: aura_plugin_db_routing::policy::Engine::Postgres,
                    topology: aura_plugin_db_routing::policy::Topology::Dedicated,
                    postgrest_url: Some("http://pgrst-abcd1234.internal:3000"),
                    replicas: &[],
                }),
                None,
            ))
        })
    });
    group.finish();
}

/// What a project's candidate adds to a request's own path: choosing the canary side, and
/// handing a shadow run to the tenant pool (the run itself happens there, off the path).
fn bench_rollout(c: &mut Criterion) {
    use aura_gateway::policy::Stage;
    use aura_gateway::policy::rollout::{Compared, Comparison, on_canary};
    use aura_gateway::policy::runtime::isolation::TenantPool;
    use aura_gateway::policy::stages::{CorsDecision, CorsQuery, PolicyStage};
    let mut group = c.benchmark_group("rollout");
    group.bench_function("canary_side", |b| {
        b.iter(|| {
            on_canary(
                black_box("abcd1234efgh5678"),
                Stage::Quota,
                black_box("3f0e7a52-9c1b-4d8e-a7f3-2b6c9d0e1f42"),
                10,
            )
        })
    });
    let policies = policies(InstanceReuse::Pooled);
    let input = CorsInput {
        method: "GET",
        path: "/v1/db/rest/v1/todos",
        origin: "https://app.example.com",
        request_method: None,
        request_headers: None,
        client: None,
    };
    let enforced: CorsDecision = policies
        .data
        .module::<Cors>()
        .expect("cors stage")
        .decide(None, input)
        .map(std::sync::Arc::unwrap_or_clone)
        .expect("decision");
    let pool = TenantPool::new(2, 2, std::time::Duration::from_millis(100));
    let gate = pool.project_gate();
    let comparison = Comparison::new(None);
    group.bench_function("shadow_handoff", |b| {
        b.iter(|| {
            let compared =
                Compared::new(Some("4bf92f3577b34da6a3ce929d0e0e4736"), "GET", input.path);
            let enforced = Cors::describe(black_box(&enforced));
            let query = CorsQuery::from(input);
            if pool
                .try_spawn(Some(&gate), move || {
                    drop(black_box((compared, enforced, query)))
                })
                .is_err()
            {
                comparison.skipped();
            }
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = bench_wasm, bench_native, bench_rollout
}
criterion_main!(benches);
