//! Conformance vectors: typical and edge inputs every module of a stage must answer — without a
//! trap, within its deadline and memory, and with a decision the host can enforce. Run before a
//! module is put in force (start, reload) and by `aura-gateway plugin check`.

use std::time::{Duration, Instant};

use super::stages::{
    CorsDecision, CorsInput, DbEngine, DbRoute, KeyDecision, KeyRequest, KeyRole, KeySource,
    ProjectDb, QuotaDecision, Topology,
};
use super::{CorsStage, PlanePolicies, PluginError, Policies, QuotaStage, Stage};
use crate::actor::{Actor, Role};
use crate::plane::Plane;

/// What the vectors measured for one stage module.
#[derive(Debug, Clone)]
pub struct StageReport {
    pub plane: Plane,
    pub stage: Stage,
    pub module: String,
    pub digest: String,
    pub calls: usize,
    pub median: Duration,
    pub max: Duration,
    pub peak_memory: usize,
}

impl std::fmt::Display for StageReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}_plane.plugins.{}: {} ({}…): {} calls, median {:.2} µs, max {:.2} µs, memory {} KiB",
            self.plane,
            self.stage,
            self.module,
            &self.digest[..12.min(self.digest.len())],
            self.calls,
            self.median.as_secs_f64() * 1e6,
            self.max.as_secs_f64() * 1e6,
            self.peak_memory / 1024
        )
    }
}

/// A failed vector.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{plane}_plane.plugins.{stage}: conformance vector {vector:?} failed: {reason}")]
pub struct ConformanceError {
    pub plane: Plane,
    pub stage: Stage,
    pub vector: String,
    pub reason: String,
}

struct Run {
    plane: Plane,
    stage: Stage,
    times: Vec<Duration>,
}

impl Run {
    fn new(plane: Plane, stage: Stage) -> Self {
        Self {
            plane,
            stage,
            times: Vec::new(),
        }
    }

    fn fail(&self, vector: &str, reason: impl Into<String>) -> ConformanceError {
        ConformanceError {
            plane: self.plane,
            stage: self.stage,
            vector: vector.to_owned(),
            reason: reason.into(),
        }
    }

    fn call<T>(
        &mut self,
        vector: &str,
        f: impl FnOnce() -> Result<T, PluginError>,
    ) -> Result<T, ConformanceError> {
        let started = Instant::now();
        let out = f().map_err(|e| self.fail(vector, e.to_string()));
        self.times.push(started.elapsed());
        out
    }

    fn report(mut self, module: &str, digest: &str, peak_memory: usize) -> StageReport {
        self.times.sort();
        StageReport {
            plane: self.plane,
            stage: self.stage,
            module: module.to_owned(),
            digest: digest.to_owned(),
            calls: self.times.len(),
            median: self
                .times
                .get(self.times.len() / 2)
                .copied()
                .unwrap_or_default(),
            max: self.times.last().copied().unwrap_or_default(),
            peak_memory,
        }
    }
}

fn key_request(path: &str, query: &[&str], headers: &[(&str, &str)]) -> KeyRequest {
    KeyRequest {
        method: "GET".into(),
        path: path.into(),
        query_keys: query.iter().map(|s| (*s).to_owned()).collect(),
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

fn check_api_key(p: &PlanePolicies) -> Result<Option<StageReport>, ConformanceError> {
    let Some(stage) = &p.api_key else {
        return Ok(None);
    };
    let mut run = Run::new(p.plane, Stage::ApiKey);
    let long = "k".repeat(4096);
    let vectors: Vec<(&str, KeyRequest)> = vec![
        ("no credential", key_request("/v1/db/todos", &[], &[])),
        (
            "apikey header",
            key_request("/v1/db/todos", &[], &[("apikey", "aura_pk_vector")]),
        ),
        (
            "x-api-key header",
            key_request("/v1/db/todos", &[], &[("x-api-key", "aura_sk_vector")]),
        ),
        (
            "query on websocket",
            key_request("/v1/realtime/websocket", &["aura_pk_vector"], &[]),
        ),
        (
            "query on a REST route",
            key_request("/v1/db/todos", &["aura_pk_vector"], &[]),
        ),
        (
            "two different keys",
            key_request("/x", &[], &[("apikey", "a"), ("x-api-key", "b")]),
        ),
        (
            "long key",
            key_request("/x", &[], &[("apikey", long.as_str())]),
        ),
        (
            "non-ASCII value",
            key_request("/x", &[], &[("apikey", "clé\u{FFFD}")]),
        ),
    ];
    for _round in 0..8 {
        for (name, request) in &vectors {
            let decision = run.call(name, || stage.extract(None, request.clone()))?;
            if let KeyDecision::Present(c) = &decision {
                if c.key.is_empty() || c.allowed_roles.is_empty() {
                    return Err(
                        run.fail(name, "a present credential needs a key and allowed roles")
                    );
                }
                if c.source == KeySource::Query && c.allowed_roles.contains(&KeyRole::ServiceRole) {
                    return Err(run.fail(name, "a key in the URL may never be a service_role key"));
                }
            }
        }
    }
    Ok(Some(run.report(
        stage.module_name(),
        stage.digest(),
        stage.peak_memory(),
    )))
}

fn check_cors(p: &PlanePolicies) -> Result<StageReport, ConformanceError> {
    check_cors_stage(p.plane, &p.cors)
}

/// The vectors of the `cors` stage, for one module.
pub fn check_cors_stage(plane: Plane, stage: &CorsStage) -> Result<StageReport, ConformanceError> {
    let mut run = Run::new(plane, Stage::Cors);
    let origins = [
        "https://app.example.com",
        "http://localhost:3000",
        "null",
        "https://a-very-long-subdomain.of.an.example.org:8443",
    ];
    for _round in 0..4 {
        for origin in origins {
            for preflight in [true, false] {
                let name = format!("{origin} preflight={preflight}");
                let decision = run.call(&name, || {
                    stage.decide(
                        None,
                        plane,
                        CorsInput {
                            method: if preflight { "OPTIONS" } else { "GET" },
                            path: "/v1/db/todos",
                            origin,
                            request_method: preflight.then_some("POST"),
                            request_headers: preflight.then_some("content-type, apikey"),
                        },
                    )
                })?;
                if let CorsDecision::Allow(a) = decision {
                    if a.allow_origin != "*" && a.allow_origin != origin {
                        return Err(
                            run.fail(&name, "allow-origin must be \"*\" or the request's origin")
                        );
                    }
                    if plane == Plane::Management && a.allow_origin == "*" {
                        return Err(run.fail(&name, "the management plane may never allow \"*\""));
                    }
                }
            }
        }
    }
    Ok(run.report(stage.module_name(), stage.digest(), stage.peak_memory()))
}

fn check_quota(p: &PlanePolicies) -> Result<StageReport, ConformanceError> {
    check_quota_stage(p.plane, &p.quota)
}

/// The vectors of the `quota` stage, for one module.
pub fn check_quota_stage(
    plane: Plane,
    stage: &QuotaStage,
) -> Result<StageReport, ConformanceError> {
    let mut run = Run::new(plane, Stage::Quota);
    let mut actors = Vec::new();
    for role in [
        Role::Anon,
        Role::Authenticated,
        Role::ServiceRole,
        Role::Console,
    ] {
        let mut a = Actor::unauthenticated(plane);
        a.role = role;
        a.project = Some("vector".into());
        a.key_id = Some("00000000-0000-4000-8000-000000000001".into());
        a.user_id = (role != Role::Anon).then(|| "00000000-0000-4000-8000-000000000002".into());
        a.plan = Some("free".into());
        actors.push(a);
    }
    actors.push(Actor::unauthenticated(plane));
    for _round in 0..4 {
        for actor in &actors {
            for group in ["db", "functions", "storage", "gateway"] {
                let name = format!("{:?} on {group}", actor.role);
                let decision =
                    run.call(&name, || stage.decide(None, "GET", "/v1/x", group, actor))?;
                if let QuotaDecision::Limit(r) = decision
                    && (r.bucket.is_empty()
                        || r.rate_per_second == 0
                        || r.burst == 0
                        || r.cost == 0
                        || r.cost > r.burst)
                {
                    return Err(run.fail(
                        &name,
                        "a rule needs a bucket, rate ≥ 1, burst ≥ 1 and 1 ≤ cost ≤ burst",
                    ));
                }
            }
        }
    }
    Ok(run.report(stage.module_name(), stage.digest(), stage.peak_memory()))
}

fn check_db_routing(p: &PlanePolicies) -> Result<StageReport, ConformanceError> {
    let stage = &p.db_routing;
    let mut run = Run::new(p.plane, Stage::DbRouting);
    let project = |engine, topology, url: Option<&str>| {
        Some(ProjectDb {
            engine,
            topology,
            postgrest_url: url.map(str::to_owned),
        })
    };
    let vectors = [
        (
            "GET",
            "/v1/db/schema",
            project(
                DbEngine::Postgres,
                Topology::Dedicated,
                Some("http://pg:3000"),
            ),
        ),
        (
            "PUT",
            "/v1/db/todos",
            project(
                DbEngine::Postgres,
                Topology::Dedicated,
                Some("http://pg:3000"),
            ),
        ),
        (
            "GET",
            "/v1/db/todos",
            project(DbEngine::Mongodb, Topology::Shared, None),
        ),
        (
            "GET",
            "/v1/db/todos",
            project(DbEngine::Postgres, Topology::Shared, None),
        ),
        (
            "GET",
            "/v1/db/todos",
            project(
                DbEngine::Postgres,
                Topology::Dedicated,
                Some("http://pg:3000"),
            ),
        ),
        (
            "GET",
            "/v1/db/todos",
            project(DbEngine::Postgres, Topology::Dedicated, None),
        ),
        ("GET", "/v1/db/todos", None),
    ];
    for _round in 0..4 {
        for (method, path, project) in &vectors {
            let name = format!("{method} {path} {project:?}");
            let route = run.call(&name, || {
                stage.decide(None, p.plane, method, path, project.clone())
            })?;
            if let DbRoute::Postgrest(url) = route
                && url
                    .parse::<http::Uri>()
                    .ok()
                    .and_then(|u| u.host().map(str::to_owned))
                    .is_none()
            {
                return Err(run.fail(&name, "a PostgREST route needs an absolute URL"));
            }
        }
    }
    Ok(run.report(stage.module_name(), stage.digest(), stage.peak_memory()))
}

/// Runs every stage's vectors on both planes.
pub fn check(policies: &Policies) -> Result<Vec<StageReport>, ConformanceError> {
    let mut reports = Vec::new();
    for plane in [&policies.data, &policies.management] {
        if let Some(r) = check_api_key(plane)? {
            reports.push(r);
        }
        reports.push(check_cors(plane)?);
        reports.push(check_quota(plane)?);
        reports.push(check_db_routing(plane)?);
        // A candidate passes the same vectors before it is tried.
        if let Some(c) = &plane.cors_candidate {
            reports.push(check_cors_stage(plane.plane, &c.stage)?);
        }
        if let Some(c) = &plane.quota_candidate {
            reports.push(check_quota_stage(plane.plane, &c.stage)?);
        }
    }
    Ok(reports)
}
