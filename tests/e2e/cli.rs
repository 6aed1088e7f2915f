//! The gateway binary's commands and its configuration checks: `serve` with the example
//! configuration, `check-config` naming the key of what it refuses, `keys create` and `keys
//! revoke`, `migrate`, `dev`, the JSON schemas, `plugin check`, and `wit --out`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use aura_gateway::policy::stages::builtin::TESTING_PLUGIN_PATH;
use reqwest::StatusCode;

use crate::support::SECURITY_HEADERS;
use crate::support::call::{Call, IntoCall};
use crate::support::cli::{check_config, failed_saying, run, stderr, succeeded};
use crate::support::config::{binary, example, write_config};
use crate::support::gateway::Process;
use crate::support::poll::poll_tries;
use crate::support::responder::{Bus, reply};

fn example_config() -> PathBuf {
    example("configs/local.toml")
}

#[tokio::test]
async fn the_example_config_serves_health_on_both_planes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Process::serve(&example_config(), dir.path());
    for url in [gw.data_url("/health"), gw.mgmt_url("/health")] {
        let response = Call::get(&url).read().await;
        assert_eq!(response.status, StatusCode::OK, "{url}");
        for h in SECURITY_HEADERS {
            assert!(response.headers.contains_key(*h), "{url}: {h}");
        }
        assert!(response.headers.contains_key("x-request-id"));
    }
}

#[test]
fn check_config_accepts_the_example_and_names_the_key_of_a_bad_one() {
    succeeded(&check_config(&example_config()));
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = write_config(dir.path(), "[server]\nmax_body_byte = 10\n");
    failed_saying(&check_config(&bad), "max_body_byte");
    let bad = write_config(dir.path(), "[timeouts]\nfunctions_ms = 0\n");
    failed_saying(&check_config(&bad), "timeouts.functions_ms");
}

#[test]
fn a_wildcard_management_origin_fails_check_config_and_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let origins = "[\"https://studio.example\", \"*\"]";
    let toml = format!("[management_plane.plugins.cors.config]\nallow_origins = {origins}\n");
    let path = write_config(dir.path(), &toml);
    failed_saying(&check_config(&path), "management_plane.plugins.cors");
    let port = || crate::support::free_port().to_string();
    let mut serve = Command::new(binary());
    serve.args(["serve", "--config"]).arg(&path);
    serve
        .env("AURA_PORT", port())
        .env("AURA_MANAGEMENT_PORT", port());
    let serve = serve.output().expect("run serve");
    assert!(!serve.status.success(), "serve must refuse to start");
    assert!(stderr(&serve).contains("refused"));
}

#[tokio::test]
async fn keys_create_gives_a_working_key_and_revoke_stops_it() {
    let bus = Bus::shared();
    let dir = tempfile::tempdir().expect("tempdir");
    let control = dir.path().join("control.toml");
    let example_control = example("control/local.toml");
    std::fs::copy(example_control, &control).expect("copy the example control file");
    let (nats, prefix) = (&bus.url, &bus.prefix);
    let path = write_config(
        dir.path(),
        &format!(
            "[nats]\nurl = {nats:?}\nsubject_prefix = {prefix:?}\n[control]\nfile = \"control.toml\"\nreload_interval_ms = 100\n[auth]\nkey_cache_ttl_secs = 1\n[log]\nlevel = \"debug\"\n",
        ),
    );
    let create = run(
        &["keys", "create", "--project", "demo", "--role", "anon"],
        Some(&path),
    );
    succeeded(&create);
    let key = String::from_utf8(create.stdout.clone()).expect("utf8");
    let key = key.trim().to_owned();
    assert!(key.starts_with("aura_pk_"), "{key}");
    let stored = std::fs::read_to_string(&control).expect("read");
    assert!(!stored.contains(&key), "only the hash is stored");
    assert!(stored.contains(&aura_gateway::auth::keys::hash_key(&key)));
    let stderr = stderr(&create);
    let id = stderr
        .split_whitespace()
        .find_map(|w| uuid::Uuid::parse_str(w).ok());
    let id = id.expect("create names the key id");

    let gw = Process::serve(&path, dir.path());
    let mut envelopes = bus.record(&["auth"], |_| reply(200, &[], b"{}")).await;
    let client = reqwest::Client::new();
    let user = || client.get(gw.data_url("/v1/auth/user")).call();
    user().key(&key).expect(StatusCode::OK).await;
    let envelope = envelopes.next().await;
    assert_eq!(envelope["actor"]["role"], "anon");
    assert_eq!(envelope["actor"]["project"], "demo");
    assert_eq!(user().status().await, StatusCode::UNAUTHORIZED);

    succeeded(&run(
        &["keys", "revoke", "--id", &id.to_string()],
        Some(&path),
    ));
    let refused = poll_tries(40, Duration::from_millis(100), async || {
        let refused = user().key(&key).status().await == StatusCode::UNAUTHORIZED;
        refused.then_some(())
    });
    assert!(refused.await.is_some(), "the revoked key stopped working");
    let log = gw.log_text();
    assert!(!log.contains(&key), "the key never appears in the logs");
    assert!(!log.contains(&key[8..]), "not even without its prefix");
}

#[tokio::test]
async fn migrate_creates_the_control_schema() {
    let db = crate::support::postgres::TestDatabase::create().await;
    succeeded(&run(&["migrate", "--database-url", &db.url], None));
    // The tables are there with the contract's columns.
    db.execute(
        "INSERT INTO aura_control.organizations (id, name) VALUES ('00000000-0000-4000-8000-000000000001', 'o');
         INSERT INTO aura_control.projects (ref, organization_id, db_engine, topology)
           VALUES ('p', '00000000-0000-4000-8000-000000000001', 'postgres', 'shared');
         INSERT INTO aura_control.organization_members (organization_id, user_id, role)
           VALUES ('00000000-0000-4000-8000-000000000001', '00000000-0000-4000-8000-000000000002', 'owner');
         INSERT INTO aura_control.api_keys (id, project_ref, role, key_sha256, revoked_at)
           VALUES ('00000000-0000-4000-8000-000000000003', 'p', 'anon', 'h', NULL);",
    )
    .await;
    let again = run(&["migrate", "--database-url", &db.url], None);
    assert!(again.status.success(), "migrations are idempotent");
}

#[tokio::test]
async fn dev_prints_requests_that_work_exactly_as_printed() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let nats = crate::support::nats_server::shared().url();
    let path = write_config(
        dir.path(),
        &format!("[nats]\nurl = {nats:?}\n[log]\nlevel = \"warn\"\n"),
    );
    let (port, management_port) = (crate::support::free_port(), crate::support::free_port());
    let (port, management_port) = (port.to_string(), management_port.to_string());
    let mut child = Command::new(binary())
        .args([
            "dev",
            "--port",
            &port,
            "--management-port",
            &management_port,
            "--config",
        ])
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("dev");
    let stdout = child.stdout.take().expect("stdout");
    let lines = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("line");
            let done = line.starts_with("Ctrl-C");
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    });
    let lines = lines.await.expect("join");
    let commands: Vec<&str> = lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| l.starts_with("curl "))
        .collect();
    assert!(commands.len() >= 8, "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("anon key:") && l.contains("aura_pk_"))
    );
    assert!(lines.iter().any(|l| l.contains("console token:")));
    for command in commands {
        let streaming = command.starts_with("curl -N");
        let shell = if streaming {
            format!("{command} --max-time 2 2>/dev/null; true")
        } else {
            format!("{command} -s -o /dev/null -w '%{{http_code}}' --max-time 5")
        };
        let out = Command::new("bash")
            .args(["-c", &shell])
            .output()
            .expect("curl");
        let out = String::from_utf8_lossy(&out.stdout).to_string();
        if streaming {
            assert!(out.contains("event: tick"), "{command}: {out}");
        } else {
            assert_eq!(out, "200", "{command}");
        }
    }
    crate::support::gateway::terminate(&child);
    let status = tokio::task::spawn_blocking(move || child.wait());
    let status = status.await.expect("join").expect("wait");
    assert!(status.success(), "{status:?}");
}

#[test]
fn the_config_and_each_default_plugin_print_their_json_schema() {
    let schema = |args: &[&str]| {
        let out = run(args, None);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, text) = schema(&["config", "schema"]);
    assert!(ok);
    let config: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    for key in ["server", "nats", "plugins", "rate_limit", "admin"] {
        assert!(config["properties"].get(key).is_some(), "{key}");
    }
    let (ok, text) = schema(&["plugin", "schema", "--stage", "cors"]);
    assert!(ok);
    let cors: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert!(cors["properties"].get("allow_origins").is_some(), "{cors}");
    let (ok, _) = schema(&["plugin", "schema", "--stage", "teapot"]);
    assert!(!ok, "an unknown stage is refused");
}

#[test]
fn plugin_check_passes_a_good_module_and_names_what_is_wrong_with_a_bad_one() {
    let check = ["plugin", "check", TESTING_PLUGIN_PATH, "--stage", "cors"];
    let ok = run(&check, None);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    succeeded(&ok);
    assert!(stdout.contains("data_plane.plugins.cors"), "{stdout}");
    let measured = stdout.contains("median") && stdout.contains("memory");
    assert!(measured, "per-call time and memory: {stdout}");
    // What the module declares and the schema it exports are printed.
    assert!(
        stdout.contains("declared inputs: not declared (called on every request)"),
        "{stdout}"
    );
    assert!(stdout.contains("configuration schema:\n{"), "{stdout}");
    assert!(
        stdout.contains("\"max_age_ms\""),
        "the testing plugin's schema: {stdout}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let refusing = dir.path().join("refuse.toml");
    std::fs::write(&refusing, "refuse = true\n").expect("write");
    failed_saying(&run(&check, Some(&refusing)), "refused as asked");

    let quota = dir.path().join("quota.wasm");
    std::fs::write(&quota, aura_gateway::policy::stages::builtin::QUOTA).expect("write");
    let quota = quota.display().to_string();
    let out = run(&["plugin", "check", &quota, "--stage", "quota"], None);
    succeeded(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let declared = "declared inputs: route-group, role, plan, has-key, has-user (decisions kept";
    assert!(stdout.contains(declared), "{stdout}");
    // A configuration the schema refuses is named by its key.
    let wrong = dir.path().join("wrong.toml");
    std::fs::write(&wrong, "burst = \"lots\"\n").expect("write");
    failed_saying(
        &run(
            &["plugin", "check", &quota, "--stage", "quota"],
            Some(&wrong),
        ),
        "/burst",
    );
    let out = run(&["plugin", "check", &quota, "--stage", "cors"], None);
    failed_saying(&out, "does not export the cors stage world");
    // The api-key stage: the default module's `0.5.0` declaration, and a `0.3.0` module's four
    // flags read as they were.
    use aura_gateway::policy::PolicyStage;
    let api_key = dir.path().join("api-key.wasm");
    let builtin = aura_gateway::policy::stages::ApiKey::BUILTIN;
    std::fs::write(&api_key, builtin).expect("write");
    let api_key = api_key.display().to_string();
    let older = aura_gateway::policy::stages::builtin::TESTING_API_KEY_PLUGIN_PATH;
    for (module, version, declared) in [
        (
            api_key.as_str(),
            "0.5.0",
            "query-keys, headers, path-with-query-keys",
        ),
        (older, "0.3.0", "path, query-keys, headers"),
    ] {
        let out = run(&["plugin", "check", module, "--stage", "api_key"], None);
        succeeded(&out);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let written = format!("written against aura:gateway@{version}");
        assert!(stdout.contains(&written), "{stdout}");
        let declared = format!("declared inputs: {declared} (decisions kept");
        assert!(stdout.contains(&declared), "{stdout}");
    }
}

/// `wit --out DIR` used to write through a link planted at `DIR/gateway.wit`.
#[test]
fn wit_out_replaces_a_planted_link_and_never_writes_through_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (victim, out) = (dir.path().join("victim"), dir.path().join("wit"));
    std::fs::write(&victim, "precious").expect("write");
    std::fs::create_dir_all(&out).expect("dir");
    std::os::unix::fs::symlink(&victim, out.join("gateway.wit")).expect("link");
    succeeded(&run(&["wit", "--out", &out.display().to_string()], None));
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");
    let written = out.join("gateway.wit");
    assert!(
        !std::fs::symlink_metadata(&written)
            .expect("meta")
            .is_symlink()
    );
    let wit = std::fs::read_to_string(&written).expect("read");
    assert!(wit.contains("package aura:gateway"));
}

/// `rediss://…#insecure` turned off certificate checks silently; it is refused, naming the key.
#[test]
fn a_redis_url_turning_off_certificate_checks_is_refused_by_check_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = "[rate_limit]\nredis_url = \"rediss://cache.internal:6380/0#insecure\"\n";
    let out = check_config(&write_config(dir.path(), redis));
    failed_saying(&out, "rate_limit.redis_url");
    failed_saying(&out, "#insecure");
}
