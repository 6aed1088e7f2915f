//! `aura-gateway`: the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use aura_gateway::auth::keys::{generate_key, hash_key};
use aura_gateway::config::Config;
use aura_gateway::control::postgres::PostgresStore;
use aura_gateway::control::{self, KeyRole};
use aura_gateway::policy::{Policies, PolicyEngine, runtime::compile, stages::authoring};
use aura_gateway::state::AppState;
use aura_gateway::{server, telemetry};
use clap::{Parser, Subcommand};

/// mimalloc: the gateway allocates small, short-lived buffers on every request; measured with
/// `bench/run`, glibc's malloc was a fifth of the CPU time of a proxied request. Built without
/// transparent huge pages (`no_thp`): with them the idle gateway held twice the memory it uses.
/// Called without an alignment where its blocks have it already (`allocator`).
#[global_allocator]
static GLOBAL: aura_gateway::allocator::Allocator = aura_gateway::allocator::Allocator;

/// How often the allocator gives the memory freed since back to the system
/// (`allocator::trim_every`).
const ALLOCATOR_TRIM: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug, Parser)]
#[command(
    name = "aura-gateway",
    version,
    about = "Dual-plane API gateway with WebAssembly policy stages"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve both planes.
    Serve {
        /// TOML configuration file (defaults apply to every key it leaves out).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Validate a configuration, including loading every policy module; exit 0 when valid.
    CheckConfig {
        /// TOML configuration file.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Start a local gateway with a demo project, keys, tokens and demo backends, and print
    /// example requests.
    Dev {
        /// TOML configuration file (optional; the demo replaces the control store and secrets).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Data-plane port.
        #[arg(long, default_value_t = 8000)]
        port: u16,
        /// Management-plane port.
        #[arg(long, default_value_t = 8001)]
        management_port: u16,
    },
    /// The configuration file's JSON Schema.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Tools for plugin authors.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Print the plugin API: the WIT package `aura:gateway` of a version the gateway accepts.
    Wit {
        /// 0.5.0 (the current one), 0.4.0, 0.3.0, 0.2.0 or 0.1.0.
        #[arg(long, default_value = "0.5.0", value_parser = ["0.5.0", "0.4.0", "0.3.0", "0.2.0", "0.1.0"])]
        version: String,
        /// Write it to DIR/gateway.wit instead (DIR is created), ready for a bindings generator.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Probe a running gateway's `/health` (exit 0 when it answers 200): the container
    /// image's health check, which has no shell or curl.
    Health {
        /// The URL to probe; by default the data plane on loopback (`AURA_PORT` or 8000).
        /// An `https://` URL on loopback is probed without verifying the certificate.
        #[arg(long)]
        url: Option<String>,
    },
    /// Apply the control-store migrations (schema aura_control) to a PostgreSQL database.
    Migrate {
        /// postgres://user@host/db
        #[arg(long)]
        database_url: String,
    },
    /// Manage API keys in the configured control store (file or postgres).
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
        /// TOML configuration file naming the control store.
        #[arg(long, short, global = true)]
        config: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Print the JSON Schema of the configuration (every key, its type, default and meaning).
    Schema,
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Print the JSON Schema of a default plugin's `config` table.
    Schema {
        /// The stage (its key in the table of stages).
        #[arg(long, value_parser = stage_keys())]
        stage: String,
    },
    /// Load a component as a stage's module — exports, configuration, conformance vectors —
    /// and print per-call time and memory. Exit 0 when it passes.
    Check {
        /// The component (.wasm).
        file: PathBuf,
        /// The stage (its key in the table of stages).
        #[arg(long, value_parser = stage_keys())]
        stage: String,
        /// data or management.
        #[arg(long, default_value = "data", value_parser = ["data", "management"])]
        plane: String,
        /// The stage's configuration, as a TOML or JSON file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Your own test cases (TOML: input and expected decision per case); each is run and
        /// reported, and any failure makes the check fail.
        #[arg(long)]
        vectors: Option<PathBuf>,
        /// The linear memory a call may use, in MiB (the gateway's `plugins.memory_limit_bytes`).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
        memory_limit_mib: Option<u64>,
        /// A call's deadline in milliseconds (the gateway's `plugins.call_deadline_ms`).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10000))]
        call_deadline_ms: Option<u64>,
        /// Keep the compiled module in this folder, as a gateway with
        /// `plugins.compile_cache_dir` does (it then loads it without compiling it again).
        #[arg(long, value_name = "DIR")]
        compile_cache_dir: Option<PathBuf>,
    },
    /// Start a new plugin in DIR: the example of the stage in the language, the WIT, a
    /// configuration and test vectors, and a README with the build and check commands.
    New {
        /// The stage (its key in the table of stages).
        #[arg(long, value_parser = stage_keys())]
        stage: String,
        /// rust, python or js.
        #[arg(long, value_parser = ["rust", "python", "js"])]
        lang: String,
        /// The new plugin's folder (must not exist, or be empty).
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Create a key; prints it once (only its SHA-256 is stored).
    Create {
        /// Project reference.
        #[arg(long)]
        project: String,
        /// anon or service_role.
        #[arg(long, value_parser = ["anon", "service_role"])]
        role: String,
    },
    /// Revoke a key by id; it stops working within the key cache lifetime (30 s at most).
    Revoke {
        /// The key's id (printed by create).
        #[arg(long)]
        id: uuid::Uuid,
    },
}

/// The `--stage` values: the keys of the table of stages.
fn stage_keys() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(aura_gateway::stage::STAGES.iter().map(|s| s.key))
}

fn main() -> ExitCode {
    // Not a user command: the gateway runs itself this way to compile uploaded modules in a
    // process of their own (aura_gateway::policy::runtime::compile).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(compile::WORKER_COMMAND) {
        return match compile::WorkerArgs::parse(&args[2..]) {
            Ok(worker) => compile::worker_main(worker),
            Err(e) => {
                eprintln!("compile-worker: {e}");
                ExitCode::from(2)
            }
        };
    }
    let cli = Cli::parse();
    aura_gateway::tls::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.spawn(aura_gateway::allocator::trim_every(ALLOCATOR_TRIM));
    let result = match cli.command {
        Command::Serve { config } => load(config.as_ref()).and_then(|loaded| {
            // Outside the async runtime: the trace exporter's HTTP client must be created and
            // dropped there.
            let _telemetry = telemetry::init(&loaded.log, &loaded.tracing)?;
            runtime.block_on(serve(config, loaded))
        }),
        Command::CheckConfig { config } => runtime.block_on(check_config(config)),
        Command::Dev {
            config,
            port,
            management_port,
        } => dev_config(config, port, management_port).and_then(|loaded| {
            let _telemetry = telemetry::init(&loaded.log, &loaded.tracing)?;
            runtime.block_on(aura_gateway::dev::run(loaded))
        }),
        Command::Plugin {
            command:
                PluginCommand::Check {
                    file,
                    stage,
                    plane,
                    config,
                    vectors,
                    memory_limit_mib,
                    call_deadline_ms,
                    compile_cache_dir,
                },
        } => plugin_check(
            &file,
            &stage,
            &plane,
            config.as_deref(),
            vectors.as_deref(),
            (memory_limit_mib, call_deadline_ms, compile_cache_dir),
        ),
        Command::Plugin {
            command: PluginCommand::New { stage, lang, dir },
        } => plugin_new(&stage, &lang, &dir),
        Command::Wit { version, out } => print_wit(&version, out.as_deref()),
        Command::Config {
            command: ConfigCommand::Schema,
        } => print_json(&aura_gateway::schema::config_schema()),
        Command::Plugin {
            command: PluginCommand::Schema { stage },
        } => aura_gateway::policy::Stage::parse(&stage)
            .ok_or_else(|| anyhow::anyhow!("unknown stage {stage}"))
            .and_then(|stage| print_json(&aura_gateway::schema::plugin_config_schema(stage))),
        Command::Health { url } => runtime.block_on(health(url)),
        Command::Migrate { database_url } => runtime.block_on(migrate(database_url)),
        Command::Keys { command, config } => runtime.block_on(keys(command, config)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    Ok(Config::load(path.map(PathBuf::as_path))?)
}

async fn serve(path: Option<PathBuf>, config: Config) -> anyhow::Result<()> {
    let base = path.as_deref().and_then(|p| p.parent());
    let state = AppState::build(config.clone(), base).await?;
    if let Some(path) = &path {
        let _ = state
            .config_path
            .set(std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()));
    }
    for warning in config.plaintext_warnings() {
        tracing::warn!("{warning}");
    }
    aura_gateway::policy::reload::spawn_triggers(
        &state.policies,
        state.config_path.get().cloned(),
        &state.config,
    );
    let (data, management) = server::bind(&config).await?;
    let drain = server::drain_on_signal(state.clone());
    server::serve(state, data, management, drain).await
}

fn dev_config(path: Option<PathBuf>, port: u16, management_port: u16) -> anyhow::Result<Config> {
    let mut config = load(path.as_ref())?;
    config.host = "127.0.0.1".into();
    config.port = port;
    config.management_port = management_port;
    if path.is_none() {
        config.log.level = "warn".into();
    }
    Ok(config)
}

fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

async fn health(url: Option<String>) -> anyhow::Result<()> {
    let url = url.unwrap_or_else(|| {
        let port = std::env::var("AURA_PORT").unwrap_or_else(|_| "8000".to_owned());
        format!("http://127.0.0.1:{port}/health")
    });
    let parsed = reqwest::Url::parse(&url).map_err(|e| anyhow::anyhow!("--url {url}: {e}"))?;
    let host = parsed
        .host_str()
        .unwrap_or_default()
        .trim_matches(['[', ']']);
    let loopback = aura_gateway::config::is_loopback_host(host);
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(3))
        .danger_accept_invalid_certs(loopback)
        .build()?;
    let status = client.get(parsed).send().await?.status();
    anyhow::ensure!(status.is_success(), "{url} answered {status}");
    println!("{url}: {status}");
    Ok(())
}

async fn migrate(database_url: String) -> anyhow::Result<()> {
    let config = aura_gateway::config::ControlConfig::default();
    let store = PostgresStore::connect(&database_url, &config).await?;
    store.migrate().await?;
    println!("migrations applied");
    Ok(())
}

async fn keys(command: KeysCommand, path: Option<PathBuf>) -> anyhow::Result<()> {
    let config = load(path.as_ref())?;
    let base = path.as_deref().and_then(|p| p.parent());
    let store = control::open(&config.control, base).await?;
    match command {
        KeysCommand::Create { project, role } => {
            let role =
                KeyRole::parse(&role).ok_or_else(|| anyhow::anyhow!("unknown role {role}"))?;
            let key = generate_key(role);
            let record = store
                .create_api_key(&project, role, &hash_key(&key))
                .await?;
            println!("{key}");
            eprintln!(
                "created {} key {} for project {} in the {} store; the key is shown only once",
                role.as_str(),
                record.id,
                record.project_ref,
                store.kind()
            );
        }
        KeysCommand::Revoke { id } => {
            if store.revoke_api_key(id).await? {
                println!("revoked {id}");
            } else {
                println!("{id} was already revoked");
            }
        }
    }
    Ok(())
}

fn print_wit(version: &str, out: Option<&std::path::Path>) -> anyhow::Result<()> {
    let text = authoring::wit(version).ok_or_else(|| {
        anyhow::anyhow!("--version: {version} is not 0.5.0, 0.4.0, 0.3.0, 0.2.0 or 0.1.0")
    })?;
    match out {
        None => print!("{text}"),
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
            let path = dir.join("gateway.wit");
            // A link planted at the path is replaced, never written through.
            authoring::replace_file(&path, text.as_bytes())
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn plugin_new(stage: &str, lang: &str, dir: &std::path::Path) -> anyhow::Result<()> {
    let stage = aura_gateway::policy::Stage::parse(stage)
        .ok_or_else(|| anyhow::anyhow!("--stage: unknown stage {stage}"))?;
    let lang = authoring::Lang::parse(lang)
        .ok_or_else(|| anyhow::anyhow!("--lang: {lang} is not rust, python or js"))?;
    let files = authoring::scaffold(stage, lang, dir).map_err(anyhow::Error::msg)?;
    for file in &files {
        println!("wrote {}", file.display());
    }
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("plugin");
    println!("\nbuild it (in {}):", dir.display());
    for command in authoring::build_commands(stage, lang, name) {
        println!("  {command}");
    }
    println!(
        "then: aura-gateway plugin check {key}.wasm --stage {key} --config config.toml --vectors vectors.toml",
        key = stage.key()
    );
    Ok(())
}

fn plugin_check(
    file: &std::path::Path,
    stage: &str,
    plane: &str,
    stage_config: Option<&std::path::Path>,
    vectors_file: Option<&std::path::Path>,
    (memory_limit_mib, call_deadline_ms, compile_cache_dir): (
        Option<u64>,
        Option<u64>,
        Option<PathBuf>,
    ),
) -> anyhow::Result<()> {
    let vectors = match vectors_file {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Some(
                aura_gateway::policy::stages::vectors::Vectors::parse(
                    &text,
                    &path.display().to_string(),
                )
                .map_err(anyhow::Error::msg)?,
            )
        }
    };
    let config_value: serde_json::Value = match stage_config {
        None => serde_json::json!({}),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            if path.extension().is_some_and(|e| e == "json") {
                serde_json::from_str(&text)?
            } else {
                serde_json::to_value(toml::from_str::<toml::Value>(&text)?)?
            }
        }
    };
    let mut config = Config::default();
    if let Some(mib) = memory_limit_mib {
        config.plugins.memory_limit_bytes = (mib as usize) << 20;
    }
    if let Some(ms) = call_deadline_ms {
        config.plugins.call_deadline_ms = ms;
    }
    config.plugins.compile_cache_dir = compile_cache_dir.map(|d| d.display().to_string());
    let module = std::fs::canonicalize(file)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?
        .display()
        .to_string();
    // The module goes on `plane`, and on every plane the author's cases run on.
    let mut planes = vec![plane.to_owned()];
    if let Some(v) = &vectors {
        for p in v.planes().map_err(anyhow::Error::msg)? {
            if !planes.iter().any(|q| q == p.as_str()) {
                planes.push(p.as_str().to_owned());
            }
        }
    }
    for plane in &planes {
        let target = aura_gateway::plane::Plane::parse(plane)
            .zip(aura_gateway::policy::Stage::parse(stage))
            .and_then(|(p, s)| config.stage_mut(p, s))
            .ok_or_else(|| anyhow::anyhow!("the {plane} plane has no {stage} stage"))?;
        target.module = module.clone();
        target.config = config_value.clone();
    }
    let runtime = PolicyEngine::new(&config.plugins)?;
    let policies = Policies::load(&runtime, &config, None)?;
    let reports = aura_gateway::policy::stages::conformance::check(&policies)?;
    for report in reports
        .iter()
        .filter(|r| r.stage.key() == stage && planes.iter().any(|p| p == r.plane.as_str()))
    {
        println!("{report}");
    }
    let stage = aura_gateway::policy::Stage::parse(stage)
        .ok_or_else(|| anyhow::anyhow!("--stage: unknown stage {stage}"))?;
    println!(
        "written against aura:gateway@{}",
        aura_gateway::plane::Plane::parse(plane)
            .and_then(|p| policies.wit_version(p, stage))
            .unwrap_or("?")
    );
    let module = aura_gateway::plane::Plane::parse(plane)
        .and_then(|p| policies.plane(p).any_slot(stage))
        .and_then(|slot| slot.module());
    if let Some(module) = module {
        match (module.declared_inputs(), module.report().cache) {
            (Some(inputs), cache) => println!(
                "declared inputs: {} ({})",
                if inputs.is_empty() {
                    "none".to_owned()
                } else {
                    inputs.join(", ")
                },
                cache.map_or_else(
                    || "decisions not kept".to_owned(),
                    |c| format!("decisions kept up to {} ms", c.max_age_ms)
                )
            ),
            (None, _) => println!("declared inputs: not declared (called on every request)"),
        }
        match module.schema() {
            Some(schema) => println!(
                "configuration schema:\n{}",
                serde_json::from_str::<serde_json::Value>(schema)
                    .and_then(|v| serde_json::to_string_pretty(&v))
                    .unwrap_or_else(|_| schema.to_owned())
            ),
            None => println!("configuration schema: none exported"),
        }
    }
    if let (Some(v), Some(path)) = (&vectors, vectors_file) {
        let outcomes = v.run(stage, &policies);
        let (table, all_passed) = aura_gateway::policy::stages::vectors::table(&outcomes);
        println!("\nauthor vectors ({}):\n{table}", path.display());
        if !all_passed {
            let failed: Vec<&str> = outcomes
                .iter()
                .filter(|o| o.failure.is_some())
                .map(|o| o.name.as_str())
                .collect();
            anyhow::bail!(
                "plugin check failed: author vectors failed: {}",
                failed.join(", ")
            );
        }
    }
    println!("plugin check passed");
    Ok(())
}

async fn check_config(path: Option<PathBuf>) -> anyhow::Result<()> {
    let config = load(path.as_ref())?;
    let runtime = PolicyEngine::new(&config.plugins)?;
    let base = path.as_deref().and_then(|p| p.parent());
    // Modules named by digest come from the control store.
    let stored = if config
        .stages()
        .iter()
        .any(|(_, s)| s.module_digest().is_some())
    {
        let store = control::open(&config.control, base).await?;
        aura_gateway::policy::fetch_stored_modules(&config, store.as_ref()).await?
    } else {
        Default::default()
    };
    let policies = Policies::load_with(&runtime, &config, base, &stored)?;
    for report in aura_gateway::policy::stages::conformance::check(&policies)? {
        println!("{report}");
    }
    // The listeners' certificates and every client TLS section, read as the gateway would.
    for (plane, tls) in [
        (aura_gateway::plane::Plane::Data, &config.data_plane.tls),
        (
            aura_gateway::plane::Plane::Management,
            &config.management_plane.tls,
        ),
    ] {
        if let Some(tls) = tls {
            aura_gateway::tls::ListenerTls::load(plane, tls, base, config.server.http2)?;
        }
    }
    for (key, tls) in config.client_tls_sections() {
        aura_gateway::tls::client_config(key, Some(tls), true)?;
    }
    for warning in config.plaintext_warnings() {
        println!("warning: {warning}");
    }
    if config.nats.fleet_secret.is_none() {
        println!(
            "warning: nats.fleet_secret is not set: instances neither publish nor accept change events on NATS (each sees another's change within its cache lifetimes and plugins.tenant_refresh_secs)"
        );
    }
    println!("configuration OK");
    Ok(())
}
