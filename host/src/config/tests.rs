//! Loading and validation, through the file and the environment.

use super::*;
use crate::plane::Plane;
use crate::stage::Stage;

#[expect(
    clippy::result_large_err,
    reason = "figment's Jail fixes the closure's error type"
)]
fn load(toml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, toml).expect("write");
    let vars: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    // figment's Jail serialises tests that touch the process environment.
    let mut result = None;
    figment::Jail::expect_with(|jail| {
        for (k, v) in &vars {
            jail.set_env(k, v);
        }
        result = Some(Config::load(Some(&path)));
        Ok(())
    });
    result.expect("jail ran")
}

#[test]
fn a_candidate_is_named_by_its_key_when_it_is_wrong() {
    let ok = load(
        "[data_plane.plugins.cors.candidate]\nmode = \"shadow\"\n\
         [management_plane.plugins.quota.candidate]\nmode = \"canary\"\npercent = 5\n",
        &[],
    )
    .expect("a shadow and a canary");
    let stages = ok.stages();
    let keys: Vec<&str> = stages.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        keys.contains(&"data_plane.plugins.cors.candidate"),
        "{keys:?}"
    );
    assert!(keys.contains(&"management_plane.plugins.quota.candidate"));
    for (toml, key) in [
        (
            "[data_plane.plugins.api_key.candidate]\nmode = \"shadow\"\n",
            "data_plane.plugins.api_key.candidate",
        ),
        (
            "[data_plane.plugins.cors.candidate]\nmode = \"canary\"\n",
            "data_plane.plugins.cors.candidate.percent",
        ),
        (
            "[data_plane.plugins.cors.candidate]\nmode = \"shadow\"\npercent = 3\n",
            "data_plane.plugins.cors.candidate.percent",
        ),
        (
            "[data_plane.plugins.quota.candidate]\nmode = \"enforce\"\n",
            "data_plane.plugins.quota.candidate.mode",
        ),
        (
            "[data_plane.plugins.quota.candidate]\nmodule = \"builtin\"\n",
            "data_plane.plugins.quota.candidate.mode",
        ),
        (
            "[data_plane.plugins.quota]\nmode = \"shadow\"\n",
            "data_plane.plugins.quota.mode",
        ),
        (
            "[data_plane.plugins.cors.candidate]\nmode = \"shadow\"\n\
             [data_plane.plugins.cors.candidate.candidate]\nmode = \"shadow\"\n",
            "data_plane.plugins.cors.candidate.candidate",
        ),
    ] {
        let e = load(toml, &[]).expect_err(toml);
        assert_eq!(e.key, key, "{toml}: {e}");
    }
}

#[test]
fn the_stages_follow_the_table_of_stages() {
    let mut config = Config::default();
    for plane in Plane::ALL {
        for stage in Stage::ALL {
            assert_eq!(
                config.stage(plane, stage).is_some(),
                stage.runs_on(plane),
                "{plane} {stage}"
            );
            assert_eq!(
                config.stage_mut(plane, stage).is_some(),
                stage.runs_on(plane)
            );
        }
    }
    config.data_plane.plugins.api_key.candidate = Some(Box::default());
    config.management_plane.plugins.quota.candidate = Some(Box::default());
    let keys: Vec<String> = config.stages().into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        [
            "data_plane.plugins.api_key",
            "data_plane.plugins.cors",
            "data_plane.plugins.quota",
            "data_plane.plugins.db_routing",
            "management_plane.plugins.cors",
            "management_plane.plugins.quota",
            "management_plane.plugins.db_routing",
            "data_plane.plugins.api_key.candidate",
            "management_plane.plugins.quota.candidate",
        ]
    );
    let e = config
        .validate(None)
        .expect_err("api_key takes no candidate");
    assert_eq!(e.key, "data_plane.plugins.api_key.candidate");
    assert_eq!(
        e.problem,
        "only the cors and quota stages take a candidate (one, not nested)"
    );
}

#[test]
fn defaults_match_the_contract() {
    let c = load("", &[]).expect("defaults");
    assert_eq!((c.port, c.management_port), (8000, 8001));
    assert_eq!(c.timeouts.default_ms, 30_000);
    assert_eq!(c.timeouts.functions_ms, 380_000);
    assert_eq!(c.nats.subject_prefix, "aura");
}

#[test]
fn environment_overrides_the_file() {
    let c = load(
        "port = 9000\n[nats]\nurl = \"nats://a:1\"\n",
        &[
            ("AURA_PORT", "9100"),
            ("AURA_MANAGEMENT_PORT", "9101"),
            ("AURA_NATS__URL", "nats://b:2"),
        ],
    )
    .expect("loads");
    assert_eq!((c.port, c.management_port), (9100, 9101));
    assert_eq!(c.nats.url, "nats://b:2");
}

#[test]
fn unknown_keys_are_rejected_with_their_name() {
    let e = load("[nats]\nurll = \"x\"\n", &[]).expect_err("unknown key");
    assert!(e.to_string().contains("nats"), "{e}");
    assert!(e.to_string().contains("urll"), "{e}");
    let e = load("", &[("AURA_PROT", "1")]).expect_err("unknown env key");
    assert!(e.to_string().contains("prot"), "{e}");
}

#[test]
fn validation_names_the_key() {
    let e = load("port = 7000\nmanagement_port = 7000\n", &[]).expect_err("same ports");
    assert_eq!(e.key, "management_port");
    let e = load("[nats]\nurl = \"http://x\"\n", &[]).expect_err("bad url");
    assert_eq!(e.key, "nats.url");
    let e = load("[data_plane.plugins.cors]\nmodule = \"nope.wasm\"\n", &[])
        .expect_err("missing module");
    assert_eq!(e.key, "data_plane.plugins.cors.module");
    let e = load("port = \"abc\"\n", &[]).expect_err("bad type");
    assert_eq!(e.key, "port");
    let e = load("[management_plane.plugins.api_key]\n", &[]).expect_err("no api keys there");
    assert!(e.to_string().contains("api_key"), "{e}");
    let e = load("[server]\nidle_release_ms = 3600001\n", &[]).expect_err("over an hour");
    assert_eq!(e.key, "server.idle_release_ms");
    let c = load("[server]\nidle_release_ms = 0\n", &[]).expect("0: never released");
    assert_eq!(c.server.idle_release_ms, 0);
    for bad in ["0", "3600001"] {
        let e = load(&format!("[server]\nsend_timeout_ms = {bad}\n"), &[]).expect_err(bad);
        assert_eq!(e.key, "server.send_timeout_ms", "{bad}");
    }
    assert_eq!(
        load("", &[]).expect("defaults").server.send_timeout_ms,
        60_000
    );
    for bad in ["0", "10001"] {
        let e = load(&format!("[log]\nflush_ms = {bad}\n"), &[]).expect_err(bad);
        assert_eq!(e.key, "log.flush_ms", "{bad}");
        assert!(e.problem.contains("between 1 and 10000"), "{e}");
    }
    assert_eq!(load("", &[]).expect("defaults").log.flush_ms, 10);
    let e = load("[metrics]\ntoken = \"a token with spaces!\"\n", &[]).expect_err("not a bearer");
    assert_eq!(e.key, "metrics.token");
    let e = load(
        "[upstreams]\npostgrest_allowed_targets = [\"10.0.0.0/33\"]\n",
        &[],
    )
    .expect_err("bad target");
    assert_eq!(e.key, "upstreams.postgrest_allowed_targets");
    assert!(e.problem.contains("10.0.0.0/33"), "{e}");
    let e = load(
        "[plugins]\ntenant_threads = 2\ntenant_max_concurrent_calls = 2\n",
        &[],
    )
    .expect_err("one project could take every thread");
    assert_eq!(e.key, "plugins.tenant_max_concurrent_calls");
    let e = load("[rate_limit.tenant_rules]\nmax_burst = 0\n", &[]).expect_err("zero");
    assert_eq!(e.key, "rate_limit.tenant_rules.max_burst");
    let c = load("[rate_limit.operator_rules]\nmax_cost = 5\n", &[]).expect("partial table");
    assert_eq!(c.rate_limit.operator_rules.max_cost, 5);
    assert_eq!(
        c.rate_limit.operator_rules.max_burst,
        RuleCeilings::operator().max_burst,
        "the other fields keep the operator's defaults"
    );
    let e = load("[server]\nmax_in_flight = 0\n", &[]).expect_err("no capacity");
    assert_eq!(e.key, "server.max_in_flight");
    // Answering keys from memory past 30 s would break the revocation bound.
    let e = load("[auth]\nstale_if_error_secs = 31\n", &[]).expect_err("past 30 s");
    assert_eq!(e.key, "auth.stale_if_error_secs");
    assert!(load("[auth]\nstale_if_error_secs = 30\n", &[]).is_ok());
}

#[test]
fn tls_settings_are_checked_and_name_their_key() {
    let exists = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let cases = [
        (format!("[nats.tls]\ncert_file = {exists:?}\n"), "nats.tls"),
        (
            "[control.tls]\nca_file = \"missing-ca.pem\"\n".to_owned(),
            "control.tls.ca_file",
        ),
        (
            format!(
                "[rate_limit]\nredis_url = \"redis://cache:6379\"\n[rate_limit.redis_tls]\nca_file = {exists:?}\n"
            ),
            "rate_limit.redis_tls",
        ),
        (
            "[data_plane.tls]\ncert_file = \"missing.pem\"\nkey_file = \"missing.key\"\n"
                .to_owned(),
            "data_plane.tls.cert_file",
        ),
        (
            "[nats]\nuser = \"gw\"\npassword = \"pw\"\ntoken = \"t\"\n".to_owned(),
            "nats",
        ),
        ("[nats]\npassword = \"pw\"\n".to_owned(), "nats.password"),
        (
            "[nats]\nnkey_seed = \"not-a-seed\"\n".to_owned(),
            "nats.nkey_seed",
        ),
        (
            "[server]\ntls_watch_interval_ms = 10\n".to_owned(),
            "server.tls_watch_interval_ms",
        ),
    ];
    for (toml, key) in cases {
        let e = load(&toml, &[]).expect_err(&toml);
        assert_eq!(e.key, key, "{toml}: {e}");
    }
    // Relative paths are resolved against the config file's directory.
    let e = load("[control.tls]\nca_file = \"missing-ca.pem\"\n", &[]).expect_err("missing");
    assert!(e.problem.starts_with('/'), "{e}");
    assert!(
        load(
            &format!("[upstreams.tls]\nca_file = {exists:?}\ncert_file = {exists:?}\nkey_file = {exists:?}\n"),
            &[]
        )
        .is_ok()
    );
}

#[test]
fn secrets_are_redacted_wherever_they_are() {
    let mut config = Config::default();
    config.metrics.token = Some("metrics-token-0123456789".into());
    config.admin.token = Some("admin-token-0123456789".into());
    config.auth.user_jwt.hs256_secret = Some("user-secret-0123456789abcdef0123456789".into());
    config.control.database_url = Some("postgres://aura:pg-password@db:5432/aura".into());
    config.rate_limit.redis_url = Some("redis://:redis-password@cache:6379/0".into());
    config.nats.url = "nats://a:4222, nats://user:nats-password@b:4222".into();
    config.nats.password = Some("nats-field-password".into());
    config.nats.token = Some("nats-field-token".into());
    config.nats.nkey_seed = Some("SUAFIELDSEED".into());
    config.data_plane.plugins.cors.config =
        serde_json::json!({ "allow": ["*"], "upstream_token": "plugin-token" });
    let text = serde_json::to_string(&config.redacted()).expect("json");
    for secret in [
        "metrics-token-0123456789",
        "admin-token-0123456789",
        "user-secret-0123456789",
        "pg-password",
        "redis-password",
        "nats-password",
        "nats-field-password",
        "nats-field-token",
        "SUAFIELDSEED",
        "plugin-token",
    ] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    let value = config.redacted();
    assert_eq!(
        value["control"]["database_url"],
        "postgres://aura:[redacted]@db:5432/aura"
    );
    assert_eq!(
        value["rate_limit"]["redis_url"],
        "redis://:[redacted]@cache:6379/0"
    );
    assert_eq!(
        value["nats"]["url"],
        "nats://a:4222,nats://user:[redacted]@b:4222"
    );
    assert_eq!(
        value["data_plane"]["plugins"]["cors"]["config"]["allow"][0],
        "*"
    );
    // Not secrets: names that merely contain a secret word.
    assert_eq!(value["auth"]["key_cache_ttl_secs"], 30);
    assert!(value["nats"]["fleet_secret"].is_null());
    assert_eq!(value["metrics"]["token"], REDACTED);
    // Unset secrets stay null.
    assert!(value["plugins"]["admin_token"].is_null());
    assert_eq!(config.digest(), Config { ..config.clone() }.digest());
    let mut other = config.clone();
    other.port += 1;
    assert_ne!(config.digest(), other.digest());
}

#[test]
fn secrets_in_url_queries_are_redacted() {
    let mut config = Config::default();
    config.control.database_url = Some(
        "postgres://db:5432/aura?user=aura&password=pg-query-password&sslmode=verify-full".into(),
    );
    config.rate_limit.redis_url = Some("rediss://cache:6380/0?pwd=redis-query#x".into());
    config.nats.fleet_secret = Some("fleet-secret-0123456789abcdef0123456789".into());
    config.tracing.otlp_endpoint = Some("https://otlp:4318?api_key=otlp-key".into());
    let text = serde_json::to_string(&config.redacted()).expect("json");
    for secret in [
        "pg-query-password",
        "redis-query",
        "fleet-secret-0123456789",
        "otlp-key",
    ] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    let value = config.redacted();
    assert_eq!(
        value["control"]["database_url"],
        "postgres://db:5432/aura?user=aura&password=[redacted]&sslmode=verify-full"
    );
    assert_eq!(
        value["rate_limit"]["redis_url"],
        "rediss://cache:6380/0?pwd=[redacted]#x"
    );
    assert_eq!(
        value["nats"]["url"], "nats://127.0.0.1:4222",
        "a URL with nothing secret is kept as it is"
    );
}

#[test]
fn the_hardening_keys_are_validated_naming_the_key() {
    let refused = |edit: &dyn Fn(&mut Config), key: &str| {
        let mut config = Config::default();
        edit(&mut config);
        let err = config.validate(None).expect_err(key);
        assert_eq!(err.key, key, "{}", err.problem);
    };
    refused(
        &|c| c.nats.fleet_secret = Some("short".into()),
        "nats.fleet_secret",
    );
    refused(
        &|c| c.control.change_min_interval_ms = 0,
        "control.change_min_interval_ms",
    );
    refused(&|c| c.server.max_streams = Some(0), "server.max_streams");
    refused(
        &|c| c.server.http2_idle_timeout_ms = 0,
        "server.http2_idle_timeout_ms",
    );
    refused(
        &|c| c.server.http2_keep_alive_timeout_ms = 0,
        "server.http2_keep_alive_timeout_ms",
    );
    refused(
        &|c| c.plugins.max_config_bytes = 1,
        "plugins.max_config_bytes",
    );
    refused(
        &|c| c.plugins.tenant_max_concurrent_uploads_per_org = 3,
        "plugins.tenant_max_concurrent_uploads_per_org",
    );
    refused(
        &|c| {
            c.data_plane.plugins.cors.config = serde_json::json!({ "pad": "x".repeat(70_000) });
        },
        "data_plane.plugins.cors.config",
    );
    let mut config = Config::default();
    config.nats.fleet_secret = Some("0123456789abcdef0123456789abcdef".into());
    assert!(config.validate(None).is_ok());
    assert_eq!(config.server.stream_budget(), config.server.max_connections);
}

#[test]
fn a_redis_url_turning_off_certificate_checks_is_refused() {
    let mut config = Config::default();
    config.rate_limit.redis_url = Some("rediss://cache:6380/#insecure".into());
    let err = config.validate(None).expect_err("refused");
    assert_eq!(err.key, "rate_limit.redis_url");
    assert!(err.problem.contains("#insecure"), "{}", err.problem);
    config.rate_limit.redis_url = Some("rediss://cache:6380/".into());
    assert!(config.validate(None).is_ok());
}
