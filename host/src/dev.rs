//! `aura-gateway dev`: a working local gateway in one command, with a demo project, keys, a
//! console token, demo backends (NATS responders and HTTP upstreams) and example requests.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Request, State};
use axum::response::IntoResponse;
use axum::routing::get;
use base64::Engine as _;
use futures::StreamExt;
use http::StatusCode;

use crate::auth::keys::{generate_key, hash_key};
use crate::config::Config;
use crate::control::KeyRole;
use crate::routes::{SERVICES, Transport};
use crate::server;
use crate::state::AppState;

/// The demo organization.
pub const DEMO_ORG: &str = "00000000-0000-4000-8000-00000000d000";
/// The demo console user (owner of the demo organization).
pub const DEMO_USER: &str = "00000000-0000-4000-8000-00000000d0aa";
/// The demo project.
pub const DEMO_PROJECT: &str = "demo";

/// A nats-server started for the session, stopped with it.
struct OwnedNats(Child);

impl Drop for OwnedNats {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn find_nats_server() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("nats-server"))
                .collect()
        })
        .unwrap_or_default();
    candidates.push("/usr/sbin/nats-server".into());
    candidates.into_iter().find(|p| p.is_file())
}

fn reachable(url: &str) -> bool {
    let host_port = url
        .split(',')
        .next()
        .unwrap_or_default()
        .trim()
        .trim_start_matches("nats://");
    host_port.parse::<SocketAddr>().ok().is_some_and(|addr| {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
    })
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Uses the configured NATS when it answers, else starts `nats-server` when installed.
fn ensure_nats(config: &mut Config) -> anyhow::Result<Option<OwnedNats>> {
    if reachable(&config.nats.url) {
        println!("  NATS:              using {}", config.nats.url);
        return Ok(None);
    }
    let Some(binary) = find_nats_server() else {
        println!(
            "  NATS:              none at {} and no nats-server installed; NATS routes answer 503.\n                     Install it (apt-get install nats-server) or start one, then run `dev` again.",
            config.nats.url
        );
        return Ok(None);
    };
    let port = free_port()?;
    let child = Command::new(&binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let owned = OwnedNats(child);
    config.nats.url = format!("nats://127.0.0.1:{port}");
    for _ in 0..100 {
        if reachable(&config.nats.url) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "  NATS:              started {} at {}",
        binary.display(),
        config.nats.url
    );
    Ok(Some(owned))
}

/// Demo backends on NATS: every service echoes what it received.
async fn start_responders(config: &Config) -> anyhow::Result<()> {
    let client = async_nats::connect(config.nats.url.as_str()).await?;
    for row in SERVICES
        .iter()
        .filter(|row| row.transport != Transport::Http)
    {
        let service = row.service;
        let subject = crate::proxy::nats::subject(&config.nats.subject_prefix, service);
        let mut sub = client.subscribe(subject).await?;
        let client = client.clone();
        tokio::spawn(async move {
            while let Some(message) = sub.next().await {
                let Some(reply_to) = message.reply.clone() else {
                    continue;
                };
                let envelope: serde_json::Value =
                    serde_json::from_slice(&message.payload).unwrap_or_default();
                let body = serde_json::json!({
                    "service": service.name(),
                    "method": envelope["method"],
                    "path": envelope["path"],
                    "query": envelope["query"],
                    "actor": envelope["actor"],
                    "request_id": envelope["id"],
                });
                let reply = serde_json::json!({
                    "status": 200,
                    "headers": [["content-type", "application/json"]],
                    "body": base64::engine::general_purpose::STANDARD.encode(body.to_string()),
                });
                let _ = client.publish(reply_to, reply.to_string().into()).await;
            }
        });
    }
    client.flush().await?;
    Ok(())
}

type Objects = Arc<Mutex<HashMap<String, Bytes>>>;

async fn put_object(
    State(objects): State<Objects>,
    UrlPath(path): UrlPath<String>,
    body: Bytes,
) -> impl IntoResponse {
    let size = body.len();
    objects
        .lock()
        .map(|mut o| o.insert(path.clone(), body))
        .ok();
    axum::Json(serde_json::json!({ "stored": path, "bytes": size }))
}

async fn get_object(
    State(objects): State<Objects>,
    UrlPath(path): UrlPath<String>,
) -> axum::response::Response {
    match objects.lock().ok().and_then(|o| o.get(&path).cloned()) {
        Some(bytes) => bytes.into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({ "error": "no such object" })),
        )
            .into_response(),
    }
}

async fn serve_demo(app: Router) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}"))
}

/// Demo HTTP backends: an in-memory object store (storage) and realtime (SSE ticks, REST echo).
async fn start_http_backends(config: &mut Config) -> anyhow::Result<()> {
    let objects: Objects = Arc::default();
    let storage = Router::new()
        .route(
            "/object/{*path}",
            get(get_object).put(put_object).post(put_object),
        )
        .with_state(objects);
    config.upstreams.storage_url = Some(serve_demo(storage).await?);
    let realtime = Router::new()
        .route(
            "/sse",
            get(|| async {
                let ticks = tokio_stream_ticks();
                (
                    [("content-type", "text/event-stream")],
                    axum::body::Body::from_stream(ticks),
                )
            }),
        )
        .fallback(|request: Request| async move {
            axum::Json(serde_json::json!({
                "service": "realtime",
                "path": request.uri().path(),
                "role": request.headers().get("x-aura-role").and_then(|v| v.to_str().ok()),
            }))
        });
    config.upstreams.realtime_url = Some(serve_demo(realtime).await?);
    Ok(())
}

fn tokio_stream_ticks() -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::unfold(0u64, |n| async move {
        if n > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Some((
            Ok(Bytes::from(format!("event: tick\ndata: {n}\n\n"))),
            n + 1,
        ))
    })
}

fn random_secret() -> String {
    generate_key(KeyRole::ServiceRole).replace("aura_sk_", "dev-secret-")
}

fn sign(secret: &str, claims: serde_json::Value) -> anyhow::Result<String> {
    let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes())?;
    Ok(jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &key,
    )?)
}

fn write_control_file(dir: &Path, anon: &str, service: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join("control.toml");
    std::fs::write(
        &path,
        format!(
            "# Demo records of `aura-gateway dev` (regenerated at every start).\n\
             [[organizations]]\nid = \"{DEMO_ORG}\"\nname = \"Demo\"\n\n\
             [[projects]]\nref = \"{DEMO_PROJECT}\"\norganization_id = \"{DEMO_ORG}\"\ndb_engine = \"postgres\"\ntopology = \"shared\"\n\n\
             [[organization_members]]\norganization_id = \"{DEMO_ORG}\"\nuser_id = \"{DEMO_USER}\"\nrole = \"owner\"\n\n\
             [[api_keys]]\nid = \"{}\"\nproject_ref = \"{DEMO_PROJECT}\"\nrole = \"anon\"\nkey_sha256 = \"{}\"\n\n\
             [[api_keys]]\nid = \"{}\"\nproject_ref = \"{DEMO_PROJECT}\"\nrole = \"service_role\"\nkey_sha256 = \"{}\"\n",
            uuid::Uuid::new_v4(),
            hash_key(anon),
            uuid::Uuid::new_v4(),
            hash_key(service),
        ),
    )?;
    Ok(path)
}

/// Runs the dev gateway until SIGINT/SIGTERM.
pub async fn run(mut config: Config) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("aura-gateway-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let anon = generate_key(KeyRole::Anon);
    let service = generate_key(KeyRole::ServiceRole);
    let control = write_control_file(&dir, &anon, &service)?;
    config.control.store = crate::config::StoreKind::File;
    config.control.file = Some(control.display().to_string());
    let user_secret = random_secret();
    let console_secret = random_secret();
    let metrics_token = random_secret();
    config.auth.user_jwt.hs256_secret = Some(user_secret.clone());
    config.auth.console_jwt.hs256_secret = Some(console_secret.clone());
    config.metrics.token = Some(metrics_token.clone());
    // One instance: its change events are its own, signed with a secret of its own.
    if config.nats.fleet_secret.is_none() {
        config.nats.fleet_secret = Some(random_secret());
    }
    config.validate(None)?;

    println!("Aura gateway (dev)");
    let nats = ensure_nats(&mut config)?;
    if reachable(&config.nats.url) {
        start_responders(&config).await?;
    }
    start_http_backends(&mut config).await?;

    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let console_token = sign(
        &console_secret,
        serde_json::json!({ "sub": DEMO_USER, "aud": "aurabase-control", "exp": now + 12 * 3600 }),
    )?;
    let user_id = uuid::Uuid::new_v4().to_string();
    let user_token = sign(
        &user_secret,
        serde_json::json!({ "sub": user_id, "aud": "authenticated", "ref": DEMO_PROJECT, "exp": now + 12 * 3600 }),
    )?;

    let state = AppState::build(config.clone(), None).await?;
    let (data, management) = server::bind(&config).await?;
    let data_url = format!("http://{}", data.local_addr()?);
    let mgmt_url = format!("http://{}", management.local_addr()?);
    println!("  data plane:        {data_url}");
    println!("  management plane:  {mgmt_url}");
    println!(
        "  project:           {DEMO_PROJECT} (control file {})",
        control.display()
    );
    println!("  anon key:          {anon}");
    println!("  service_role key:  {service}");
    println!("  user token:        {user_token}");
    println!("  console token:     {console_token}");
    println!("  metrics token:     {metrics_token}");
    println!();
    println!("Try:");
    println!("  curl -i {data_url}/health");
    println!("  curl -i -H 'apikey: {anon}' {data_url}/v1/functions/hello");
    println!(
        "  curl -i -H 'apikey: {anon}' -H 'Authorization: Bearer {user_token}' {data_url}/v1/auth/user"
    );
    println!(
        "  curl -i -H 'apikey: {anon}' -X PUT --data-binary 'hello' {data_url}/v1/storage/object/notes/hello.txt"
    );
    println!("  curl -i -H 'apikey: {anon}' {data_url}/v1/storage/object/notes/hello.txt");
    println!("  curl -i -H 'apikey: {anon}' {data_url}/v1/realtime/channels");
    println!(
        "  curl -i -H 'Authorization: Bearer {console_token}' {mgmt_url}/v1/projects/{DEMO_PROJECT}"
    );
    println!("  curl -i {mgmt_url}/ready");
    println!("  curl -s -H 'Authorization: Bearer {metrics_token}' {data_url}/metrics");
    println!("  curl -N -H 'apikey: {anon}' {data_url}/v1/realtime/sse");
    println!();
    println!("Ctrl-C stops the gateway and what it started.");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let drain = server::drain_on_signal(state.clone());
    let result = server::serve(state, data, management, drain).await;
    drop(nats);
    let _ = std::fs::remove_dir_all(&dir);
    result
}
