//! Projects' modules past the operator's instance pool, through the gateway binary: projects'
//! instances are made when their module is called, kept while warm and dropped coldest first
//! within one memory budget (`plugins.tenant_instance_budget_bytes`), so more projects than the
//! pool has slots all decide, each with its own configuration; and a project whose module grows
//! its memory to the cap cannot push the other projects' warm instances out. A start over many
//! projects' stored modules only lists them: each project's modules are loaded on its first
//! request.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::builder::{Builder, Gateway, Started};
use crate::support::call::{Answer, Call};
use crate::support::fixture::Fixture;
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::policy::{admin, b64, digest, testing_cors};
use crate::support::poll::{poll, poll_every};

/// Every project's instances together, in bytes: a few dozen testing CORS instances (their
/// guest stack is 64 KiB), far fewer than the projects.
const BUDGET: usize = 8 << 20;

/// `n` project refs, `scale000`, `scale001`, …
fn project_refs(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("scale{i:03}")).collect()
}

/// A gateway binary over the fixture's records and `refs` (more projects of organization A, so
/// the fixture's admin manages them), with `plugins` settings; a preflight names its project
/// by its host, `<ref>.api.test`.
fn gateway(refs: &[String], plugins: &str) -> Started {
    builder(refs, plugins).binary()
}

/// [`gateway`] before it starts, for a test to add to (its folder, more records).
fn builder(refs: &[String], plugins: &str) -> Builder<'static> {
    // Generous for a debug build on a loaded machine; deadlines have tests of their own.
    builder_with_deadline(refs, plugins, 2000)
}

/// [`builder`] with a call deadline of `deadline_ms`.
fn builder_with_deadline(refs: &[String], plugins: &str, deadline_ms: u64) -> Builder<'static> {
    let fx = Fixture::new();
    let toml = format!(
        "[plugins]\ncall_deadline_ms = {deadline_ms}\n{plugins}\n\n[data_plane]\nproject_host_suffix = \".api.test\"\n\n[admin]\ntoken = \"{ADMIN_TOKEN}\"\n"
    );
    Gateway::builder()
        .fixture(&fx)
        .records(fx.projects_of_a(refs))
        .toml(toml)
}

/// The bearer token of `/v1/admin/*`.
const ADMIN_TOKEN: &str = "scale-admin-token-0123456789abcdef";

/// Every project `GET /v1/admin/policies` reports, read `limit` at a time by following its
/// `next_after`; and how many pages it took.
async fn projects_reported(gw: &Process, limit: usize) -> (Vec<String>, usize) {
    let (mut projects, mut pages, mut after) = (Vec::new(), 0, None::<String>);
    loop {
        let mut path = format!("/v1/admin/policies?limit={limit}");
        if let Some(after) = &after {
            path.push_str(&format!("&after={after}"));
        }
        let answer = Call::get(gw.mgmt_url(&path))
            .bearer(ADMIN_TOKEN)
            .read()
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
        let body = answer.json();
        let page = body["projects"].as_object().expect("projects");
        assert!(
            page.len() <= limit,
            "a page of {} for a limit of {limit}",
            page.len()
        );
        let mut refs: Vec<String> = page.keys().cloned().collect();
        refs.sort();
        pages += 1;
        projects.extend(refs);
        match body["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return (projects, pages),
        }
    }
}

/// A preflight of `project` from `origin`.
async fn preflight(gw: &Process, project: &str, origin: &str) -> Answer {
    let url = gw.data_url("/v1/db/todos");
    let host = format!("{project}.api.test");
    Call::preflight(url, origin).host(host).read().await
}

/// Asserts that `answer` allows `origin` as the testing module does when it echoes it (the
/// plane's module answers `*`).
fn assert_echoed(answer: &Answer, project: &str, origin: &str) {
    assert_eq!(
        answer.status,
        StatusCode::NO_CONTENT,
        "{project}: {}",
        answer.text()
    );
    let allowed = answer.header("access-control-allow-origin");
    assert_eq!(allowed, origin, "{project}");
    let headers = answer.header("access-control-allow-headers");
    assert_eq!(headers, "x-testing", "{project}");
}

/// What `/metrics` says of the projects' instances.
#[derive(Debug, Clone, Copy)]
struct Instances {
    /// `aura_tenant_instances`: alive, idle or in a call.
    alive: f64,
    /// `aura_tenant_instance_bytes`.
    bytes: f64,
    /// `aura_tenant_instance_budget_bytes`.
    budget: f64,
    /// `aura_tenant_instance_evictions_total`.
    evictions: f64,
}

impl Instances {
    async fn of(gw: &Process) -> Self {
        let text = gw.metrics().await;
        let read = |name: &str| metric(&text, name, &[]);
        Self {
            alive: read("aura_tenant_instances"),
            bytes: read("aura_tenant_instance_bytes"),
            budget: read("aura_tenant_instance_budget_bytes"),
            evictions: read("aura_tenant_instance_evictions_total"),
        }
    }

    /// Once the last call's instance went back idle: within the budget, which must happen within
    /// a few seconds.
    async fn idle(gw: &Process) -> Self {
        let mut last = None;
        let idle = poll(Duration::from_secs(5), async || {
            let now = Self::of(gw).await;
            last = Some(now);
            (now.bytes <= now.budget).then_some(now)
        })
        .await;
        idle.unwrap_or_else(|| panic!("over the budget once idle: {last:?}"))
    }
}

/// The `q` quantile of `samples`.
fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let at = (sorted.len().saturating_sub(1) as f64 * q) as usize;
    sorted.get(at).copied().unwrap_or_default()
}

/// Whether project `i` echoes every origin (`echo_all`): by the parity of `i`'s one bits (the
/// Thue–Morse sequence), so that neighbours differ and no period repeats: an answer made by
/// another project's instance shows.
fn echoes_all(i: usize) -> bool {
    i.count_ones() % 2 == 1
}

/// Project `i`'s own configuration of the testing module: as [`echoes_all`] says, and naming
/// `project` (a key the module ignores), so that every project's configuration differs.
fn own_config(i: usize, project: &str) -> Value {
    json!({ "echo_all": echoes_all(i), "project": project })
}

/// Stores the testing CORS module as the `cors` module of each of `refs`, as installs through
/// other instances would have: its file once in `dir/modules` (next to the control file the
/// gateway's folder `dir` holds), and one `[[project_policies]]` record per project with its
/// [`own_config`]. Returns the records.
fn stored_modules(dir: &Path, refs: &[String]) -> String {
    let module = testing_cors();
    let module_digest = digest(&module);
    let modules = dir.join("modules");
    std::fs::create_dir_all(&modules).expect("modules folder");
    std::fs::write(modules.join(format!("{module_digest}.wasm")), &module).expect("module file");
    refs.iter()
        .enumerate()
        .map(|(i, project)| {
            // A literal string: the JSON text's quotes stay as they are.
            let config = own_config(i, project);
            format!(
                "[[project_policies]]\nproject_ref = \"{project}\"\nstage = \"cors\"\ndigest = \"{module_digest}\"\nconfig = '{config}'\n\n"
            )
        })
        .collect()
}

/// The testing module as a distinct module (digest) per `variant`: the same component with a
/// component-level custom section `aura-test` holding the variant's number.
fn variant_of(module: &[u8], variant: usize) -> Vec<u8> {
    let name = b"aura-test";
    let payload = variant.to_le_bytes();
    let size = 1 + name.len() + payload.len();
    let mut out = module.to_vec();
    // Section 0 (custom): its size (one LEB128 byte), the name's length and name, the payload.
    out.push(0);
    out.push(u8::try_from(size).expect("a short section"));
    out.push(u8::try_from(name.len()).expect("a short name"));
    out.extend_from_slice(name);
    out.extend_from_slice(&payload);
    out
}

/// Like [`stored_modules`], each project with a module of its own digest ([`variant_of`]).
fn stored_variants(dir: &Path, refs: &[String]) -> String {
    let module = testing_cors();
    let modules = dir.join("modules");
    std::fs::create_dir_all(&modules).expect("modules folder");
    refs.iter()
        .enumerate()
        .map(|(i, project)| {
            let variant = variant_of(&module, i);
            let variant_digest = digest(&variant);
            let file = modules.join(format!("{variant_digest}.wasm"));
            std::fs::write(file, &variant).expect("module file");
            let config = own_config(i, project);
            format!(
                "[[project_policies]]\nproject_ref = \"{project}\"\nstage = \"cors\"\ndigest = \"{variant_digest}\"\nconfig = '{config}'\n\n"
            )
        })
        .collect()
}

/// `aura_tenant_module_loads_total` of the modules loaded on their project's first request.
async fn first_call_loads(gw: &Process) -> f64 {
    let text = gw.metrics().await;
    let labels = ["reason=\"first_call\"", "result=\"loaded\""];
    metric(&text, "aura_tenant_module_loads_total", &labels)
}

/// The testing module denies a preflight from here unless it echoes every origin: it tries to
/// read a file and the environment, and its sandbox has neither.
const FILE_ORIGIN: &str = "https://file.test";

/// Asserts that `answer` is project `i`'s own module's, configured as [`echoes_all`] says.
fn assert_own(answer: &Answer, i: usize, project: &str) {
    if echoes_all(i) {
        assert_echoed(answer, project, FILE_ORIGIN);
    } else {
        let (status, code) = answer.status_and_code();
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{project}: {}",
            answer.text()
        );
        assert_eq!(code, "cors_origin_denied", "{project}");
        let allowed = answer.headers.contains_key("access-control-allow-origin");
        assert!(!allowed, "{project}: {:?}", answer.headers);
    }
}

/// The operator's instances used to come from one pool of 16 × (`max_idle_instances` + 8) slots
/// (144 here), which projects' modules shared: the 377th project's module was refused with
/// "maximum concurrent limit of 384 for component instances reached". Projects' instances are
/// now made on demand and kept within the budget, coldest out first.
#[tokio::test]
async fn more_projects_with_modules_than_the_operator_pool_has_slots_all_decide_and_the_coldest_instances_are_evicted()
 {
    const PROJECTS: usize = 200;
    /// The projects asked again once every project was.
    const FIRST: usize = 20;
    let refs = project_refs(PROJECTS);
    // No room in the compiled-module cache: the digest's code is shared through the modules
    // that use it, never compiled again for another project.
    let plugins = format!(
        "max_idle_instances = 1\ntenant_instance_budget_bytes = {BUDGET}\ncompiled_cache_bytes = 1\n"
    );
    let Started { gw, fx, dir: _dir } = gateway(&refs, &plugins);
    let admin = admin(gw.mgmt_url(""), &fx);

    // One module (one digest) for every project, each configured its own way: the configurations
    // differ by project (`project` is a key the module ignores) and by what they answer.
    let module = b64(&testing_cors());
    let mut installs = Vec::with_capacity(PROJECTS);
    for (i, project) in refs.iter().enumerate() {
        let body = json!({ "module": module, "config": own_config(i, project) });
        let started = Instant::now();
        let r = admin.of(project).put("cors", body).await;
        installs.push(started.elapsed());
        assert_eq!(r.status, StatusCode::OK, "{project}: {}", r.text());
    }
    eprintln!(
        "{PROJECTS} modules installed: the first in {:?}, p50 {:?}, p99 {:?}",
        installs[0],
        quantile(&installs, 0.5),
        quantile(&installs, 0.99)
    );

    // Every project decides, with its own configuration.
    for (i, project) in refs.iter().enumerate() {
        assert_own(&preflight(&gw, project, FILE_ORIGIN).await, i, project);
    }
    // The instance's report of the projects' modules, a page at a time: each once, in order.
    let (reported, pages) = projects_reported(&gw, 64).await;
    let mut scaled = reported;
    scaled.retain(|p| p.starts_with("scale"));
    assert_eq!(
        scaled, refs,
        "every project's module reported once, in order"
    );
    assert!(pages >= PROJECTS.div_ceil(64), "{pages} pages");
    let once = Instances::idle(&gw).await;
    eprintln!(
        "after one preflight of each of {PROJECTS} projects: {} instances, {} bytes \
         ({:.0} bytes each), budget {}, {} evicted",
        once.alive,
        once.bytes,
        once.bytes / once.alive.max(1.0),
        once.budget,
        once.evictions
    );
    assert_eq!(once.budget, BUDGET as f64, "{once:?}");
    let text = gw.metrics().await;
    // Compiled, or mapped from the run's compile cache folder: once.
    let compiled = |result: &str| {
        let label = format!("result=\"{result}\"");
        metric(&text, "aura_tenant_compiles_total", &[&label])
    };
    let once_in_all = compiled("ok") + compiled("disk");
    assert_eq!(
        once_in_all, 1.0,
        "one digest, compiled once for {PROJECTS} projects"
    );
    assert!(once.evictions > 0.0, "nothing was evicted: {once:?}");
    // Memory follows traffic: the warmest are kept, far fewer than the projects.
    assert!(once.alive >= 1.0, "{once:?}");
    assert!(once.alive < PROJECTS as f64, "{once:?}");

    // The first projects are the coldest: their instances went first. They decide again, each
    // with its own configuration, on instances made again (which push colder ones out).
    for (i, project) in refs.iter().enumerate().take(FIRST) {
        assert_own(&preflight(&gw, project, FILE_ORIGIN).await, i, project);
    }
    let again = Instances::idle(&gw).await;
    eprintln!(
        "after the first {FIRST} projects again: {} instances, {} bytes, {} evicted",
        again.alive, again.bytes, again.evictions
    );
    assert!(
        again.evictions > once.evictions,
        "the first projects' instances were made again: {once:?} → {again:?}"
    );
    assert!(again.alive < PROJECTS as f64, "{again:?}");
}

/// The testing module grows its memory without bound on `https://grow.test`, up to the
/// instance's memory cap (`plugins.memory_limit_bytes`, twice the budget here), where the call
/// traps. The grown instance is dropped with its charge: it never pushes the other projects'
/// warm instances out, and they keep deciding.
#[tokio::test]
async fn a_project_whose_module_grows_its_memory_cannot_keep_other_projects_instances_out() {
    const VICTIMS: usize = 4;
    const ROUNDS: usize = 10;
    const GROW: &str = "https://grow.test";
    let refs = project_refs(VICTIMS + 1);
    let (hog, victims) = refs.split_first().expect("projects");
    let plugins = format!(
        "max_idle_instances = 1\ntenant_instance_budget_bytes = {BUDGET}\nmemory_limit_bytes = {}\n",
        2 * BUDGET
    );
    let Started { gw, fx, dir: _dir } = gateway(&refs, &plugins);
    let admin = admin(gw.mgmt_url(""), &fx);
    let cors = testing_cors();
    // The hog's module grows on `grow.test`; the others echo every origin, that one too.
    admin.of(hog).install_ok("cors", &cors, json!({})).await;
    for project in victims {
        let echo_all = json!({ "echo_all": true });
        admin.of(project).install_ok("cors", &cors, echo_all).await;
    }
    for project in victims {
        assert_echoed(&preflight(&gw, project, GROW).await, project, GROW);
    }
    let warm = Instances::idle(&gw).await;

    for _ in 0..ROUNDS {
        let r = preflight(&gw, hog, GROW).await;
        let (status, code) = r.status_and_code();
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
        assert_eq!(code, "policy_failed");
        for project in victims {
            assert_echoed(&preflight(&gw, project, GROW).await, project, GROW);
        }
    }
    let after = Instances::idle(&gw).await;
    let text = gw.metrics().await;
    let labels = ["stage=\"cors\"", "kind=\"memory\""];
    let capped = metric(&text, "aura_plugin_failures_total", &labels);
    eprintln!(
        "{ROUNDS} calls growing to the memory cap ({capped} stopped by it): instances \
         {warm:?} → {after:?}"
    );
    assert!(capped >= 1.0, "the hog's module reached its memory cap");
    assert_eq!(
        after.evictions, warm.evictions,
        "the other projects' warm instances were pushed out: {warm:?} → {after:?}"
    );
    assert!(after.bytes <= after.budget, "{after:?}");
}

/// A start over 300 projects' stored modules only lists them: nothing is loaded and no instance
/// made until a project's first request, which waits for its project's modules and is then
/// answered by them, each with its own configuration; its next requests find them loaded (one
/// load per project, however many requests). A project with no stored module keeps the plane's
/// module and loads nothing. The start, the cold first requests and the warm ones are timed
/// (printed, not asserted).
#[tokio::test]
async fn a_start_with_stored_modules_lists_them_and_loads_each_project_on_its_first_request() {
    const PROJECTS: usize = 300;
    /// The project asked first, twice.
    const PROBE: usize = 7;
    /// The projects asked again once every project was.
    const WARM: usize = 50;
    let refs = project_refs(PROJECTS);
    let dir = tempfile::tempdir().expect("tempdir");
    let records = stored_modules(dir.path(), &refs);
    // The run's compile cache is filled before the clock starts (the first gateway of a run
    // fills it).
    crate::support::config::compile_cache();
    let spawned = Instant::now();
    let Started { gw, .. } = builder(&refs, "").keep_dir(dir).records(records).binary();
    let healthy = poll_every(
        Duration::from_secs(30),
        Duration::from_millis(5),
        async || {
            let health = Call::get(gw.data_url("/health")).status().await;
            (health == StatusCode::OK).then_some(spawned.elapsed())
        },
    )
    .await;
    let healthy = healthy.unwrap_or_else(|| panic!("no /health; log:\n{}", gw.log_text()));
    eprintln!(
        "{PROJECTS} projects with stored modules: /health answered {healthy:?} after spawning"
    );

    // Listed, not loaded: no module loaded, no instance.
    assert_eq!(first_call_loads(&gw).await, 0.0, "loaded at start");
    let at_start = Instances::of(&gw).await;
    assert_eq!(at_start.alive, 0.0, "{at_start:?}");

    // The first request of a project loads its module, once.
    let probe = &refs[PROBE];
    let started = Instant::now();
    let r = preflight(&gw, probe, FILE_ORIGIN).await;
    let cold = started.elapsed();
    assert_own(&r, PROBE, probe);
    assert_eq!(first_call_loads(&gw).await, 1.0, "{probe}'s module loaded");
    let started = Instant::now();
    let r = preflight(&gw, probe, FILE_ORIGIN).await;
    let warm = started.elapsed();
    assert_own(&r, PROBE, probe);
    let loads = first_call_loads(&gw).await;
    assert_eq!(loads, 1.0, "{probe}'s module loaded once");
    eprintln!("{probe}: first preflight {cold:?}, second {warm:?}");

    // Every project's first request loads its own module (the probe's is loaded already).
    let mut firsts = Vec::with_capacity(PROJECTS);
    for (i, project) in refs.iter().enumerate() {
        let started = Instant::now();
        let r = preflight(&gw, project, FILE_ORIGIN).await;
        if i != PROBE {
            firsts.push(started.elapsed());
        }
        assert_own(&r, i, project);
    }
    let loads = first_call_loads(&gw).await;
    assert_eq!(loads, PROJECTS as f64, "one load per project");
    let mut again = Vec::with_capacity(WARM);
    for (i, project) in refs.iter().enumerate().take(WARM) {
        let started = Instant::now();
        let r = preflight(&gw, project, FILE_ORIGIN).await;
        again.push(started.elapsed());
        assert_own(&r, i, project);
    }
    eprintln!(
        "first preflights of {} projects: p50 {:?}, p99 {:?}; again, the first {WARM}: p50 {:?}, \
         p99 {:?}",
        firsts.len(),
        quantile(&firsts, 0.5),
        quantile(&firsts, 0.99),
        quantile(&again, 0.5),
        quantile(&again, 0.99)
    );

    // A project with no stored module: the plane's module answers (`*`), nothing is loaded.
    let before = first_call_loads(&gw).await;
    let r = preflight(&gw, "nosuch", FILE_ORIGIN).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let allowed = r.header("access-control-allow-origin");
    assert_eq!(allowed, "*", "the plane's module");
    let after = first_call_loads(&gw).await;
    assert_eq!(
        after, before,
        "nothing loaded for a project without modules"
    );
}

/// A gateway over `refs`, each with a module of a digest of its own (stored in `dir`), whose
/// `plugins.tenant_code_budget_bytes` (its least, 1 MiB) is less than one digest of the testing
/// module, and which keeps no compiled module in memory beyond those in use: an unloaded digest
/// is found in the compile cache folder or nowhere.
fn past_a_small_code_budget(refs: &[String], dir: tempfile::TempDir) -> Started {
    let records = stored_variants(dir.path(), refs);
    let plugins = format!(
        "tenant_code_budget_bytes = {}\ncompiled_cache_bytes = 1\n",
        1 << 20
    );
    builder(refs, &plugins)
        .keep_dir(dir)
        .records(records)
        .binary()
}

/// Past `plugins.tenant_code_budget_bytes` (its least, 1 MiB: less than one digest of the
/// testing module here) the modules of the projects called least recently are unloaded, their
/// digests' compiled modules with them, and a project's next request loads its modules again,
/// which then decide with the project's own configuration. A project called all along is never
/// unloaded (no load of its own past its first), even while the others' first loads compile.
#[tokio::test]
async fn past_the_code_budget_the_least_recently_called_projects_are_unloaded_and_load_again_on_their_next_request()
 {
    const PROJECTS: usize = 12;
    /// The project called all along.
    const HOT: usize = 0;
    let refs = project_refs(PROJECTS);
    let dir = tempfile::tempdir().expect("tempdir");
    let stored = dir.path().join("modules");
    let Started { gw, .. } = past_a_small_code_budget(&refs, dir);
    let read = async |name: &str| metric(&gw.metrics().await, name, &[]);

    // The hot project is called every 20 ms all along (each of the others' first loads compiles
    // a digest of its own, far longer than the 100 ms a project must stay uncalled to be
    // unloaded); every other project is called once.
    let hot = &refs[HOT];
    assert_own(&preflight(&gw, hot, FILE_ORIGIN).await, HOT, hot);
    let calling = Arc::new(AtomicBool::new(true));
    let caller = {
        let (url, host, calling) = (
            gw.data_url("/v1/db/todos"),
            format!("{hot}.api.test"),
            calling.clone(),
        );
        let hot = hot.clone();
        tokio::spawn(async move {
            while calling.load(Ordering::Relaxed) {
                let answer = Call::preflight(url.clone(), FILE_ORIGIN)
                    .host(host.clone())
                    .read()
                    .await;
                assert_own(&answer, HOT, &hot);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    for (i, project) in refs.iter().enumerate() {
        assert_own(&preflight(&gw, project, FILE_ORIGIN).await, i, project);
    }
    assert_eq!(first_call_loads(&gw).await, PROJECTS as f64);
    let budget = read("aura_tenant_code_budget_bytes").await;
    assert_eq!(budget, f64::from(1 << 20));

    // Every project but the hot one is unloaded within a few sweeps.
    let unloaded = poll_every(
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || {
            let unloaded = read("aura_tenant_projects_unloaded_total").await;
            (unloaded >= (PROJECTS - 1) as f64).then_some(unloaded)
        },
    )
    .await;
    let unloaded = unloaded.unwrap_or_else(|| panic!("not unloaded; log:\n{}", gw.log_text()));
    assert_eq!(unloaded, (PROJECTS - 1) as f64, "the hot project stays");
    let answer = Call::get(gw.mgmt_url("/v1/admin/policies"))
        .bearer(ADMIN_TOKEN)
        .read()
        .await;
    let body = answer.json();
    assert_eq!(body["projects_loaded"], 1, "{body}");
    assert!(body["projects"].get(hot.as_str()).is_some(), "{body}");
    let charged = read("aura_tenant_code_bytes").await;
    eprintln!("one digest in use is charged {charged} bytes");
    assert!(charged > 0.0);
    assert_eq!(
        first_call_loads(&gw).await,
        PROJECTS as f64,
        "the hot project was never loaded again"
    );
    calling.store(false, Ordering::Relaxed);
    caller
        .await
        .expect("the hot project answered by its module all along");

    // Each unloaded project's next request loads its own module again, which decides as it did:
    // by its digest, from the compile cache folder, without the module's bytes from the store
    // (removed here).
    for entry in std::fs::read_dir(&stored)
        .expect("modules folder")
        .flatten()
    {
        std::fs::remove_file(entry.path()).expect("stored module removed");
    }
    for (i, project) in refs.iter().enumerate().filter(|(i, _)| *i != HOT) {
        assert_own(&preflight(&gw, project, FILE_ORIGIN).await, i, project);
    }
    assert_eq!(
        first_call_loads(&gw).await,
        (2 * PROJECTS - 1) as f64,
        "each unloaded project loaded once more"
    );
}

/// A load that takes the projects' compiled modules over `plugins.tenant_code_budget_bytes`
/// asks for a sweep at once, which unloads the projects not called for a tick (100 ms): projects
/// called one after another, each 250 ms after the last (within the second that keeps a project
/// from the sweep every second), leave one project loaded, not the last four or five. Each is
/// answered by its own module all along, the one just loaded too (a request whose project is
/// unloaded between its load and the look-up after it loads it again).
#[tokio::test]
async fn a_load_over_the_code_budget_unloads_the_projects_idle_for_a_tick_at_once() {
    const PROJECTS: usize = 8;
    let refs = project_refs(PROJECTS);
    let dir = tempfile::tempdir().expect("tempdir");
    let Started { gw, .. } = past_a_small_code_budget(&refs, dir);
    let unloaded = async |reason: &str| {
        let label = format!("reason=\"{reason}\"");
        metric(
            &gw.metrics().await,
            "aura_tenant_projects_unloaded_total",
            &[&label],
        )
    };
    let loaded = async || {
        let answer = Call::get(gw.mgmt_url("/v1/admin/policies"))
            .bearer(ADMIN_TOKEN)
            .read()
            .await;
        answer.json()["projects_loaded"]
            .as_u64()
            .expect("projects_loaded")
    };

    for (i, project) in refs.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_own(&preflight(&gw, project, FILE_ORIGIN).await, i, project);
        let alone = poll_every(
            Duration::from_secs(2),
            Duration::from_millis(20),
            async || (loaded().await == 1).then_some(()),
        )
        .await;
        assert!(
            alone.is_some(),
            "{project}: {} projects loaded; log:\n{}",
            loaded().await,
            gw.log_text()
        );
    }
    let (pressure, idle) = (unloaded("pressure").await, unloaded("idle").await);
    eprintln!("unloaded under pressure: {pressure}, idle: {idle}");
    assert!(pressure + idle >= (PROJECTS - 1) as f64);
    assert!(
        pressure >= ((PROJECTS - 1) / 2) as f64,
        "most were unloaded by the loads' sweeps: {pressure} (idle {idle})"
    );
    assert_eq!(
        first_call_loads(&gw).await,
        PROJECTS as f64,
        "each project loaded once"
    );
}

/// Projects whose modules spin to their deadline on every call run on threads of their own once
/// a call of theirs took a quarter of the deadline: with every tenant thread a spinning call
/// could take, a project whose module is quick keeps its threads and is answered by it every
/// time, never `503 policy_busy` (sharing the threads, its call would wait for a spinning call
/// to end, far past the queue timeout).
#[tokio::test]
async fn projects_spinning_at_their_deadline_never_take_the_threads_of_a_quick_project() {
    const SPINNERS: usize = 6;
    const QUIET: &str = "quiet";
    const LOOP: &str = "https://loop.test";
    let mut refs = project_refs(SPINNERS);
    refs.push(QUIET.to_owned());
    let dir = tempfile::tempdir().expect("tempdir");
    let module = testing_cors();
    let module_digest = digest(&module);
    let modules = dir.path().join("modules");
    std::fs::create_dir_all(&modules).expect("modules folder");
    std::fs::write(modules.join(format!("{module_digest}.wasm")), &module).expect("module");
    // The spinners' modules loop on `loop.test`; the quiet one echoes every origin at once.
    let records: String = refs
        .iter()
        .map(|project| {
            let config = if project == QUIET { r#"{"echo_all":true}"# } else { "{}" };
            format!(
                "[[project_policies]]\nproject_ref = \"{project}\"\nstage = \"cors\"\ndigest = \"{module_digest}\"\nconfig = '{config}'\n\n"
            )
        })
        .collect();
    let plugins = "tenant_threads = 2\ntenant_max_concurrent_calls = 1\n";
    let builder = builder_with_deadline(&refs, plugins, 400);
    let Started { gw, .. } = builder.keep_dir(dir).records(records).binary();

    // Each spinner's first call spins to the deadline: its project is heavy from then on.
    for project in &refs[..SPINNERS] {
        let r = preflight(&gw, project, LOOP).await;
        let (status, code) = r.status_and_code();
        assert_eq!(
            status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{project}: {}",
            r.text()
        );
        assert_eq!(code, "policy_failed", "{project}");
    }
    // Two clients per spinner keep its place (and every thread it could take) busy.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for project in refs[..SPINNERS].iter().chain(&refs[..SPINNERS]) {
        let (stop, url) = (stop.clone(), gw.data_url("/v1/db/todos"));
        let host = format!("{project}.api.test");
        load.push(tokio::spawn(async move {
            let mut spun = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = Call::preflight(url.clone(), LOOP)
                    .host(host.clone())
                    .read()
                    .await;
                spun += usize::from(r.status == StatusCode::INTERNAL_SERVER_ERROR);
            }
            spun
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut times = Vec::new();
    for _ in 0..30 {
        let started = Instant::now();
        let r = preflight(&gw, QUIET, FILE_ORIGIN).await;
        times.push(started.elapsed());
        assert_echoed(&r, QUIET, FILE_ORIGIN);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut spun = 0;
    for client in load {
        spun += client.await.expect("client");
    }
    eprintln!(
        "quick project under {SPINNERS} spinning projects: p50 {:?}, max {:?}; {spun} calls spun to the deadline meanwhile",
        quantile(&times, 0.5),
        quantile(&times, 1.0)
    );
    assert!(spun >= 2, "the spinners' calls ran meanwhile ({spun})");
}
