//! Logging and trace export: text or JSON lines on stderr, filtered by `log.level`, and, with
//! `tracing.otlp_endpoint`, every span (the `request` span carries the request id) exported over
//! OTLP/HTTP.
//!
//! Log lines never block a request: they go into a bounded buffer (`log.buffer_lines`) that a
//! writer thread writes to stderr in batches ([`sink`]); when stderr cannot keep up (a slow
//! collector, a full pipe) the lines that do not fit are dropped and counted
//! (`aura_log_lines_dropped_total`). The lines every request writes (the access log) skip the
//! `fmt` layer and are written straight into a reused buffer ([`line`]).

pub mod line;
pub mod scope;
pub mod sink;

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogConfig, LogFormat, TracingConfig};

/// Flushes exported spans and queued log lines when dropped (keep it until the process ends).
#[derive(Debug, Default)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
    _writer: Option<sink::SinkGuard>,
}

/// The log's writer and format, once [`init`] ran.
static OUTPUT: OnceLock<(sink::Sink, LogFormat)> = OnceLock::new();

/// Spans are exported (`tracing.otlp_endpoint`).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Access lines are written: what the filter in force says of `aura::access` at `info`, asked
/// when the log starts and when the filter changes (a filter's answer per request costs more
/// than the line's other work).
static ACCESS: AtomicBool = AtomicBool::new(false);

/// Whether access lines are written.
pub fn access_enabled() -> bool {
    ACCESS.load(Ordering::Relaxed)
}

/// The access log's target, for `log.level` filters.
pub const ACCESS_TARGET: &str = "aura::access";

/// Asks the filter in force again whether access lines are written.
fn refresh_access() {
    let enabled = tracing::enabled!(target: ACCESS_TARGET, tracing::Level::INFO);
    ACCESS.store(enabled, Ordering::Relaxed);
}

/// Whether spans are exported: the request span is made only then (the log names a line's
/// request without it, see [`scope`]).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The filter in force, replaceable at run time (`PUT /v1/admin/log-level`).
static FILTER: std::sync::OnceLock<
    tracing_subscriber::reload::Handle<EnvFilter, tracing_subscriber::Registry>,
> = std::sync::OnceLock::new();

/// Replaces the log filter (`log.level` syntax) until the process ends.
pub fn set_level(level: &str) -> Result<(), String> {
    let filter = EnvFilter::builder()
        .parse(level)
        .map_err(|e| format!("not a valid filter: {e}"))?;
    let handle = FILTER
        .get()
        .ok_or_else(|| "this process has no log filter to change".to_owned())?;
    handle
        .reload(filter)
        .map_err(|e| format!("the filter could not be changed: {e}"))?;
    refresh_access();
    Ok(())
}

/// How many log lines were dropped so far.
pub fn dropped_log_lines() -> u64 {
    OUTPUT.get().map_or(0, |(sink, _)| sink.dropped())
}

/// Writes an `INFO` line of `target` straight to the log, in the log's format, with the fields
/// `fields` adds (see [`line`]). Before [`init`], nothing. The caller checks that `target` is
/// enabled at `INFO` (`tracing::enabled!`), so the log's filter still decides.
pub fn info_line(
    target: &'static str,
    message: &'static str,
    fields: impl FnOnce(&mut line::Line<'_>),
) {
    if let Some((sink, format)) = OUTPUT.get() {
        line::write_info(
            *format,
            target,
            message,
            SystemTime::now(),
            fields,
            |bytes| {
                sink.push(bytes);
            },
        );
    }
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

/// The exporter's HTTP client: `http://` or `https://` with `tracing.otlp_tls`.
#[derive(Debug)]
struct OtlpClient(reqwest::blocking::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OtlpClient {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<
        opentelemetry_http::Response<opentelemetry_http::Bytes>,
        opentelemetry_http::HttpError,
    > {
        // Runs on the batch exporter's own thread: blocking here holds up no request.
        let request = reqwest::blocking::Request::try_from(request)?;
        let response = self.0.execute(request)?;
        let status = response.status();
        let headers = response.headers().clone();
        let mut out = opentelemetry_http::Response::builder()
            .status(status)
            .body(response.bytes()?)?;
        *out.headers_mut() = headers;
        Ok(out)
    }
}

fn otlp(config: &TracingConfig) -> anyhow::Result<Option<SdkTracerProvider>> {
    let Some(endpoint) = &config.otlp_endpoint else {
        return Ok(None);
    };
    let tls = crate::tls::client_config("tracing.otlp_tls", config.otlp_tls.as_ref(), true)?;
    let client = reqwest::blocking::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(std::time::Duration::from_secs(10))
        .build()?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(OtlpClient(client))
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
    let (writer, writer_guard) = sink::Sink::start(
        std::io::stderr(),
        log.buffer_lines,
        Duration::from_millis(log.flush_ms),
    )?;
    let _ = OUTPUT.set((writer.clone(), log.format));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let _ = FILTER.set(handle);
    EXPORTING.store(otel.is_some(), Ordering::Relaxed);
    // A line inside a request names it by its id (`scope`): the request span is made only for
    // export, and no line prints a span.
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    let _ = match log.format {
        LogFormat::Text => {
            let format = tracing_subscriber::fmt::format().with_ansi(ansi);
            registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_writer(writer)
                        .with_ansi(ansi)
                        .event_format(scope::RequestScoped::new(format, false)),
                )
                .try_init()
        }
        LogFormat::Json => {
            let format = tracing_subscriber::fmt::format()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false);
            registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .json()
                        .with_writer(writer)
                        .event_format(scope::RequestScoped::new(format, true)),
                )
                .try_init()
        }
    };
    refresh_access();
    install_panic_hook();
    Ok(TelemetryGuard {
        provider,
        _writer: Some(writer_guard),
    })
}

/// The longest panic message logged, in bytes.
const MAX_PANIC_BYTES: usize = 1024;

/// Routes panics through the log: one `error` line with the thread, the location and the
/// message (control characters replaced, cut at [`MAX_PANIC_BYTES`]), under the log's own
/// limits, instead of the default hook's unbounded text on stderr. A panic the host catches
/// (a policy call's) is still logged once here.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let (message, truncated) = panic_text(info.payload(), MAX_PANIC_BYTES);
        let thread = std::thread::current();
        tracing::error!(
            thread = thread.name().unwrap_or("-"),
            location = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line())),
            message,
            truncated,
            "panic"
        );
    }));
}

/// A panic's message (`"a panic"` when it is not text), control characters replaced by spaces,
/// cut to at most `max` bytes at a character boundary; and whether it was cut.
pub fn panic_text(payload: &(dyn std::any::Any + Send), max: usize) -> (String, bool) {
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic");
    let mut end = message.len().min(max);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let text = message[..end]
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    (text, end < message.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panics_text_is_cleaned_and_bounded() {
        let long: Box<dyn std::any::Any + Send> =
            Box::new(format!("line\nforged {}", "é".repeat(2000)));
        let (text, truncated) = panic_text(long.as_ref(), MAX_PANIC_BYTES);
        assert!(truncated);
        assert!(text.len() <= MAX_PANIC_BYTES, "{} bytes", text.len());
        assert!(text.starts_with("line forged "), "{text:?}");
        let short: Box<dyn std::any::Any + Send> = Box::new("boom");
        assert_eq!(panic_text(short.as_ref(), 16), ("boom".to_owned(), false));
        let other: Box<dyn std::any::Any + Send> = Box::new(7u8);
        assert_eq!(
            panic_text(other.as_ref(), 16),
            ("a panic".to_owned(), false)
        );
    }
}
