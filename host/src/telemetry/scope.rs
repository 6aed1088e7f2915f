//! Which request a log line belongs to: the request id of the work a thread is doing, set while
//! a request's future is polled ([`InRequest`]) and written into every line logged meanwhile
//! ([`RequestScoped`]).
//!
//! This takes the place of a tracing span per request for the log: a span costs every request
//! its allocation in the registry and its fields formatted by the `fmt` layer (in JSON, parsed
//! and written again when a field is recorded), whether or not a line is ever logged inside it.
//! Here a request pays a thread-local write per poll, and only a line logged inside it pays for
//! its id. The `request` span is still made when spans are exported (`tracing.otlp_endpoint`).

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// A request id: 32 lower-case hex digits.
pub type Id = [u8; 32];

thread_local! {
    static CURRENT: Cell<Option<Id>> = const { Cell::new(None) };
}

/// The id of the request this thread is working for, if any.
pub fn current() -> Option<Id> {
    CURRENT.with(Cell::get)
}

pin_project_lite::pin_project! {
    /// `inner`, with `id` as the thread's current request while it is polled.
    pub struct InRequest<F> {
        id: Id,
        #[pin]
        inner: F,
    }
}

impl<F> InRequest<F> {
    /// Runs `inner` as the work of request `id`.
    pub fn new(id: Id, inner: F) -> Self {
        Self { id, inner }
    }
}

/// Puts the thread's previous request back, also when a poll unwinds.
struct Restore(Option<Id>);

impl Drop for Restore {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

impl<F: Future> Future for InRequest<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _restore = Restore(CURRENT.with(|c| c.replace(Some(*this.id))));
        this.inner.poll(cx)
    }
}

/// An event format that adds `request_id` to a line logged inside a request: the first field
/// of a JSON object, the last of a text line.
#[derive(Debug)]
pub struct RequestScoped<F> {
    inner: F,
    json: bool,
}

impl<F> RequestScoped<F> {
    /// `inner`, writing JSON objects (`json`) or text lines.
    pub fn new(inner: F, json: bool) -> Self {
        Self { inner, json }
    }
}

impl<S, N, F> FormatEvent<S, N> for RequestScoped<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        // A line that names its request itself (a plugin's) keeps its own field.
        let named = event.metadata().fields().field("request_id").is_some();
        let Some(id) = current().filter(|_| !named) else {
            return self.inner.format_event(ctx, writer, event);
        };
        // Hex digits: nothing to escape.
        let id = std::str::from_utf8(&id).unwrap_or_default();
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        if self.json
            && let Some(rest) = line.strip_prefix('{')
        {
            write!(writer, "{{\"request_id\":\"{id}\",{rest}")
        } else {
            let (text, end) = match line.strip_suffix('\n') {
                Some(text) => (text, "\n"),
                None => (line.as_str(), ""),
            };
            write!(writer, "{text} request_id={id}{end}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_request_is_set_while_polled_and_restored_after() {
        let id = *b"0123456789abcdef0123456789abcdef";
        let outer = *b"ffffffffffffffffffffffffffffffff";
        let mut seen = None;
        let inner = InRequest::new(
            id,
            std::future::poll_fn(|_| {
                seen = current();
                Poll::Ready(())
            }),
        );
        let nested = InRequest::new(outer, async {
            inner.await;
            current()
        });
        let waker = std::task::Waker::noop();
        let mut nested = std::pin::pin!(nested);
        let after = nested.as_mut().poll(&mut Context::from_waker(waker));
        assert_eq!(after, Poll::Ready(Some(outer)));
        assert_eq!(seen, Some(id));
        assert_eq!(current(), None);
    }

    #[test]
    fn a_panicking_poll_leaves_no_request_behind() {
        let id = *b"0123456789abcdef0123456789abcdef";
        let caught = std::panic::catch_unwind(|| {
            let future = InRequest::new(
                id,
                std::future::poll_fn(|_| -> Poll<()> { panic!("inside a request") }),
            );
            let mut future = std::pin::pin!(future);
            let _ = future
                .as_mut()
                .poll(&mut Context::from_waker(std::task::Waker::noop()));
        });
        assert!(caught.is_err());
        assert_eq!(current(), None);
    }

    /// Lines logged through a subscriber with [`RequestScoped`], inside and outside a request.
    fn logged(json: bool) -> String {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Out(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Out {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .expect("the test's own value")
                    .extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let out = Out::default();
        let writer = out.clone();
        let make = move || writer.clone();
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(make);
        let dispatch = if json {
            let format = tracing_subscriber::fmt::format().json().flatten_event(true);
            let subscriber = subscriber
                .json()
                .event_format(RequestScoped::new(format, true));
            tracing::Dispatch::new(subscriber.finish())
        } else {
            let format = tracing_subscriber::fmt::format();
            let subscriber = subscriber.event_format(RequestScoped::new(format, false));
            tracing::Dispatch::new(subscriber.finish())
        };
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::warn!(stage = "cors", "outside");
            let id = *b"0123456789abcdef0123456789abcdef";
            let mut inside = std::pin::pin!(InRequest::new(id, async {
                tracing::warn!(stage = "cors", "inside");
                tracing::warn!(request_id = "its-own", "named");
            }));
            let _ = inside
                .as_mut()
                .poll(&mut Context::from_waker(std::task::Waker::noop()));
        });
        String::from_utf8(out.0.lock().expect("the test's own value").clone())
            .expect("the test's own value")
    }

    #[test]
    fn a_json_line_inside_a_request_names_it() {
        let text = logged(true);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("the test's own value"))
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0]["message"], "outside");
        assert!(lines[0].get("request_id").is_none(), "{text}");
        assert_eq!(lines[1]["message"], "inside");
        assert_eq!(lines[1]["stage"], "cors");
        assert_eq!(lines[1]["request_id"], "0123456789abcdef0123456789abcdef");
        // Its own field, once.
        assert_eq!(lines[2]["request_id"], "its-own");
        assert_eq!(
            text.lines()
                .nth(2)
                .expect("the test's own value")
                .matches("request_id")
                .count(),
            1
        );
    }

    #[test]
    fn a_text_line_inside_a_request_names_it_last() {
        let text = logged(false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(!lines[0].contains("request_id"), "{text}");
        assert!(
            lines[1].ends_with("inside stage=\"cors\" request_id=0123456789abcdef0123456789abcdef"),
            "{text}"
        );
    }
}
