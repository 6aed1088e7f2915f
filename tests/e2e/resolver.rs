//! Name resolution under attack, through the binary: an organization's owner adding issuers
//! whose names a name server never answers (a name server of the test's own on loopback) pins
//! no thread and slows no other tenant's backend connection; and one organization's issuer
//! checks never take the key fetches another organization's first token waits for.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

use crate::support::builder::Gateway;
use crate::support::call::{Answer, Call};
use crate::support::gateway::Process;
use crate::support::issuer::{Mode, TestIssuer, TestKey};
use crate::support::metrics::metric;
use crate::support::pki::Pki;
use crate::support::responder::json_ok;
use crate::support::upstream::Recorder;

/// A name server on loopback that reads every query and never answers; counts them.
struct SilentNameServer {
    addr: std::net::SocketAddr,
    queries: Arc<AtomicUsize>,
}

impl SilentNameServer {
    fn start() -> Self {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let addr = socket.local_addr().expect("addr");
        let queries = Arc::new(AtomicUsize::new(0));
        let seen = queries.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while socket.recv_from(&mut buf).is_ok() {
                seen.fetch_add(1, Ordering::Relaxed);
            }
        });
        Self { addr, queries }
    }

    fn queries(&self) -> usize {
        self.queries.load(Ordering::Relaxed)
    }
}

/// The gateway's threads (`/proc/PID/status`).
fn threads(gw: &Process) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{}/status", gw.child.id()))
        .expect("the gateway's status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a thread count")
}

/// One storage request of `key`; its status and how long it took.
async fn storage(gw: &Process, key: &str) -> (StatusCode, Duration) {
    let asked = Instant::now();
    let status = Call::get(gw.data_url("/v1/storage/object/a.png"))
        .key(key)
        .timeout(Duration::from_secs(60))
        .status()
        .await;
    (status, asked.elapsed())
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// 75 issuer `POST`s a second for 12 s from one organization's owner, each naming a host the
/// only name server never answers for: every one is answered within the lookup's deadline with
/// an error naming its host; another organization's storage requests, each on a new backend
/// connection to a name (`localhost`), stay as fast as before; the gateway's threads do not
/// climb (a lookup on the runtime's blocking pool held a thread ~10 s each: 512 threads, and
/// the victim's connection waited behind them).
#[tokio::test]
async fn issuer_lookups_at_a_silent_name_server_pin_no_thread_and_backends_stay_fast() {
    let dns = SilentNameServer::start();
    let storage_backend = Recorder::start().await;
    let by_name = storage_backend.url.replace("127.0.0.1", "localhost");
    let toml = format!(
        "[upstreams]\nstorage_url = \"{by_name}\"\npool_max_idle_per_host = 0\n\n\
         [dns]\nnameservers = [\"{}\"]\ntimeout_ms = 2000\nmax_in_flight = 1024\n\n\
         [auth.issuers]\nmax_concurrent_probes = 256\nmax_probes_per_organization = 256\n",
        dns.addr
    );
    let started = Gateway::builder().toml(toml).binary();
    let (gw, fx) = (&started.gw, &started.fx);

    // Before: the victim's requests, each on a new connection to `localhost`.
    let mut before = Vec::new();
    for _ in 0..10 {
        let (status, took) = storage(gw, &fx.other_project_key).await;
        assert_eq!(status, StatusCode::OK);
        before.push(took);
    }
    let threads_before = threads(gw);

    // The flood: one organization's owner, 75 POSTs a second, each naming a new host.
    let flood = {
        let (url, owner) = (gw.mgmt_url("/v1/projects/alpha/issuers"), fx.owner);
        tokio::spawn(async move {
            let mut answers = tokio::task::JoinSet::new();
            let mut tick = tokio::time::interval(Duration::from_micros(13_333));
            for i in 0..900 {
                tick.tick().await;
                let host = format!("idp-{i}.never-answers.example");
                let call = Call::post(&url)
                .console(owner)
                .json(&json!({ "issuer": format!("https://{host}"), "audience": { "accepted": [] } }))
                .timeout(Duration::from_secs(60));
                answers.spawn(async move {
                    let asked = Instant::now();
                    let answer: Answer = call.read().await;
                    (host, answer, asked.elapsed())
                });
            }
            answers.join_all().await
        })
    };

    // Meanwhile: the victim's requests, and the gateway's threads.
    let mut during = Vec::new();
    let mut late = Vec::new();
    let mut threads_peak = threads_before;
    let flood_started = Instant::now();
    while flood_started.elapsed() < Duration::from_secs(14) {
        let at = flood_started.elapsed();
        let (status, took) = storage(gw, &fx.other_project_key).await;
        assert_eq!(status, StatusCode::OK, "after {at:?}");
        during.push(took);
        // Past 7 s, system lookups holding a thread 10 s each would hold every blocking thread.
        if at > Duration::from_secs(7) {
            late.push(took);
        }
        threads_peak = threads_peak.max(threads(gw));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let answers = flood.await.expect("flood");

    let worst = |v: &[Duration]| v.iter().copied().max().unwrap_or_default();
    let median = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        v[v.len() / 2]
    };
    let slowest_answer = answers.iter().map(|a| a.2).max().unwrap_or_default();
    println!(
        "victim storage request on a new connection: before p50 {:.1} ms, max {:.1} ms; \
         during the flood ({} requests) p50 {:.1} ms, max {:.1} ms, p50 past 7 s {:.1} ms; \
         gateway threads {} -> peak {}; \
         {} issuer POSTs, slowest answer {:.0} ms; {} queries reached the silent name server",
        millis(median(&before)),
        millis(worst(&before)),
        during.len(),
        millis(median(&during)),
        millis(worst(&during)),
        millis(median(&late)),
        threads_before,
        threads_peak,
        answers.len(),
        millis(slowest_answer),
        dns.queries(),
    );

    // Every POST is answered, within the lookup's deadline, naming the host that did not resolve.
    for (host, answer, took) in &answers {
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{host}: {}",
            answer.text()
        );
        assert_eq!(answer.code(), "issuer_unreachable", "{host}");
        let message = answer.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            message.contains(&format!("{host} did not resolve in time")),
            "{host}: {message}"
        );
        assert!(*took < Duration::from_secs(10), "{host}: {took:?}");
    }
    assert_eq!(answers.len(), 900);
    assert!(
        dns.queries() >= 900,
        "the lookups reached the test's name server: {}",
        dns.queries()
    );
    // No thread is pinned, and the victim stays fast (the median: a machine this small running
    // other tests meanwhile delays a request now and then, whatever the resolver).
    assert!(
        median(&late) < Duration::from_millis(300),
        "the victim's requests took {:?} (median) late in the flood",
        median(&late)
    );
    assert!(
        threads_peak < threads_before + 16,
        "threads climbed from {threads_before} to {threads_peak}"
    );
    let metrics = gw.metrics().await;
    let timeouts = metric(
        &metrics,
        "aura_dns_lookups_total",
        &["purpose=\"issuer\"", "outcome=\"timeout\""],
    );
    assert!(timeouts >= 900.0, "{timeouts}");
    let backend_ok = metric(
        &metrics,
        "aura_dns_lookups_total",
        &["purpose=\"backend\"", "outcome=\"ok\""],
    );
    assert!(
        backend_ok >= (before.len() + during.len()) as f64,
        "{backend_ok}"
    );
}

/// One organization's owner adds issuers in a loop, each check held by an issuer that accepts
/// and never answers; meanwhile another organization's user presents the first token of its
/// project's issuer: it is verified (its keys are fetched with the fetches' own permits, which
/// the checks never take), and the flooding organization is held to its share of the checks.
#[tokio::test]
async fn one_organizations_issuer_checks_never_delay_anothers_first_token() {
    let dir = tempfile::tempdir().expect("dir");
    let pki = Pki::new(dir.path(), "idp");
    let key = TestKey::ec("victim-1");
    let victim = TestIssuer::start(&pki, std::slice::from_ref(&key)).await;
    let hanging = TestIssuer::start(&pki, &[]).await;
    hanging.set_mode(Mode::Hang);
    let records = format!(
        "[[project_issuers]]\nid = \"{}\"\nproject_ref = \"other\"\nissuer = \"{}\"\naudiences = [\"my-api\"]\n",
        Uuid::new_v4(),
        victim.url
    );
    let toml = format!(
        "[auth.issuers]\nallowed_targets = [\"127.0.0.1\"]\nfetch_timeout_ms = 10000\n\
         unknown_kid_wait_ms = 3000\n\n[auth.issuers.tls]\nca_file = \"{}\"\n",
        pki.ca.display()
    );
    let started = Gateway::builder().records(records).toml(toml).binary();
    let (gw, fx) = (&started.gw, &started.fx);
    let _envelopes = gw.bus.record(&["auth"], json_ok).await;

    // Forty loops of the owner of the other organization, adding the hanging issuer.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let statuses = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let call = {
            let (stop, statuses) = (stop.clone(), statuses.clone());
            let url = gw.mgmt_url("/v1/projects/alpha/issuers");
            let (owner, issuer) = (fx.owner, hanging.url.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let answer = Call::post(&url)
                        .console(owner)
                        .json(&json!({ "issuer": issuer, "audience": { "accepted": [] } }))
                        .timeout(Duration::from_secs(30))
                        .read()
                        .await;
                    let refused = answer.status == StatusCode::TOO_MANY_REQUESTS;
                    statuses
                        .lock()
                        .expect("statuses")
                        .push((answer.status, answer.code()));
                    if refused {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                }
            }
        };
        loops.spawn(call);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The victim's first token, while the checks hang.
    let token = victim.token(&key, json!({}));
    let asked = Instant::now();
    let answer = Call::get(gw.data_url("/v1/auth/user"))
        .key(&fx.other_project_key)
        .bearer(&token)
        .read()
        .await;
    let took = asked.elapsed();
    stop.store(true, Ordering::Relaxed);
    loops.join_all().await;
    let statuses = statuses.lock().expect("statuses").clone();
    let count = |status: StatusCode| statuses.iter().filter(|s| s.0 == status).count();
    println!(
        "victim's first token: {} in {:.0} ms; the flooding organization's checks: {} answered \
         400, {} refused 429",
        answer.status,
        millis(took),
        count(StatusCode::BAD_REQUEST),
        count(StatusCode::TOO_MANY_REQUESTS),
    );
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert!(victim.jwks_fetches() >= 1);
    // The flooding organization held at most its share: the rest refused at once, counted.
    assert!(count(StatusCode::TOO_MANY_REQUESTS) > 0, "{statuses:?}");
    for (status, code) in &statuses {
        match status.as_u16() {
            400 => assert_eq!(code, "issuer_unreachable"),
            429 => assert_eq!(code, "too_many_issuer_checks"),
            other => panic!("{other} {code}"),
        }
    }
    let metrics = gw.metrics().await;
    assert!(
        metric(
            &metrics,
            "aura_issuer_checks_refused_total",
            &["scope=\"organization\""]
        ) >= 1.0
    );
}
