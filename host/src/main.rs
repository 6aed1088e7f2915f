//! `aura-gateway`: the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use aura_gateway::config::Config;
use aura_gateway::policy::{Policies, PolicyEngine};
use aura_gateway::state::AppState;
use aura_gateway::{server, telemetry};
use clap::{Parser, Subcommand};

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    let result = match cli.command {
        Command::Serve { config } => runtime.block_on(serve(config)),
        Command::CheckConfig { config } => check_config(config),
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

async fn serve(path: Option<PathBuf>) -> anyhow::Result<()> {
    let config = load(path.as_ref())?;
    telemetry::init(&config.log);
    let base = path.as_deref().and_then(|p| p.parent());
    let state = AppState::build(config.clone(), base).await?;
    let (data, management) = server::bind(&config).await?;
    server::serve(state, data, management, server::shutdown_signal()).await
}

fn check_config(path: Option<PathBuf>) -> anyhow::Result<()> {
    let config = load(path.as_ref())?;
    let runtime = PolicyEngine::new(&config.plugins)?;
    let base = path.as_deref().and_then(|p| p.parent());
    Policies::load(&runtime, &config, base)?;
    println!("configuration OK");
    Ok(())
}
