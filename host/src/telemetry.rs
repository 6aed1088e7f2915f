//! Logging and trace export: text or JSON lines on stderr, filtered by `log.level`, and, with
//! `tracing.otlp_endpoint`, every span (the `request` span carries the request id) exported over
//! OTLP/HTTP.

use std::io::IsTerminal;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogConfig, LogFormat, TracingConfig};

/// Flushes exported spans when dropped (keep it until the process ends).
#[derive(Debug, Default)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("trace export shutdown: {e}");
        }
    }
}

fn otlp(config: &TracingConfig) -> anyhow::Result<Option<SdkTracerProvider>> {
    let Some(endpoint) = &config.otlp_endpoint else {
        return Ok(None);
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
        .build()?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(config.service_name.clone())
        .build();
    Ok(Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build(),
    ))
}

/// Installs the global subscriber. Call once per process.
pub fn init(log: &LogConfig, tracing_config: &TracingConfig) -> anyhow::Result<TelemetryGuard> {
    let filter = EnvFilter::builder()
        .parse(&log.level)
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let provider = otlp(tracing_config)?;
    let otel = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("aura-gateway")));
    let ansi = std::io::stderr().is_terminal();
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    let _ = match log.format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(ansi),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    Ok(TelemetryGuard { provider })
}
