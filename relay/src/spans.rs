//! The spans of runs' traces (`protocol::trace`), exported over OTLP/HTTP
//! (JSON) when `telemetry.otlp_endpoint` is set; nothing otherwise.
//!
//! A span is emitted once, after the commit that ended what it covers (a
//! step, a run, a webhook call, a claim, a finish), with ids derived from
//! its run (so a span emitted by another process, or after a restart,
//! joins the same trace) and times from the store. The queue between the
//! emitters and the exporter is bounded: when the collector is slow or
//! gone, spans are dropped and counted (`relay_trace_spans_dropped_total`),
//! never waited for.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
use protocol::trace::TraceParent;
use tokio::sync::mpsc;

/// Spans waiting for the exporter, at most.
const QUEUE_SPANS: usize = 4096;
/// Spans in one export, at most.
const BATCH_SPANS: usize = 256;
/// How long a batch waits for more spans.
const BATCH_WAIT: Duration = Duration::from_millis(500);
/// One export's deadline.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest answer read from the collector (bytes).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// One span of a run's trace.
#[derive(Debug, Clone)]
pub struct RunSpan {
    pub name: String,
    /// Its trace and its own span id.
    pub ids: TraceParent,
    /// Its parent's span id (none for a run, the trace's root).
    pub parent: Option<[u8; 8]>,
    /// Unix seconds (the store's clock).
    pub start: i64,
    pub end: i64,
    /// A call out of the relay (a webhook call) rather than work inside it.
    pub client: bool,
    /// What it ended with: `None` done, `Some(code)` failed with it.
    pub error: Option<String>,
    pub attributes: Vec<(&'static str, String)>,
}

impl RunSpan {
    /// A span `name` at `ids` under `parent`, from `start` to `end`.
    pub fn new(
        name: impl Into<String>,
        ids: TraceParent,
        parent: Option<TraceParent>,
        start: i64,
        end: i64,
    ) -> Self {
        RunSpan {
            name: name.into(),
            ids,
            parent: parent.map(|p| p.span_id),
            start,
            end: end.max(start),
            client: false,
            error: None,
            attributes: Vec::new(),
        }
    }

    pub fn with(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.attributes.push((key, value.into()));
        self
    }

    fn data(self, scope: &InstrumentationScope) -> SpanData {
        let at = |secs: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0));
        let context = SpanContext::new(
            TraceId::from_bytes(self.ids.trace_id),
            SpanId::from_bytes(self.ids.span_id),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let status = match &self.error {
            None => Status::Ok,
            Some(code) => Status::error(code.clone()),
        };
        SpanData {
            span_context: context,
            parent_span_id: self.parent.map_or(SpanId::INVALID, SpanId::from_bytes),
            parent_span_is_remote: false,
            span_kind: if self.client {
                SpanKind::Client
            } else {
                SpanKind::Internal
            },
            name: Cow::Owned(self.name),
            start_time: at(self.start),
            end_time: at(self.end),
            attributes: self
                .attributes
                .into_iter()
                .map(|(k, v)| KeyValue::new(k, v))
                .collect(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: scope.clone(),
        }
    }
}

/// Where spans go: the exporter's queue, or nowhere.
#[derive(Clone, Default)]
pub struct Spans {
    queue: Option<mpsc::Sender<RunSpan>>,
}

impl Spans {
    /// Exports to `endpoint` (the collector's traces URL, e.g.
    /// `http://127.0.0.1:4318/v1/traces`) from a task of its own; `None`:
    /// spans are not made at all.
    pub fn start(endpoint: Option<&str>, service: &str) -> anyhow::Result<Spans> {
        let Some(endpoint) = endpoint else {
            return Ok(Spans::default());
        };
        let client = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| anyhow::anyhow!("telemetry.otlp_endpoint: {e}"))?;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .with_http_client(Client(client))
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| anyhow::anyhow!("telemetry.otlp_endpoint {endpoint}: {e}"))?;
        exporter.set_resource(
            &opentelemetry_sdk::Resource::builder()
                .with_service_name(service.to_string())
                .build(),
        );
        let (tx, rx) = mpsc::channel(QUEUE_SPANS);
        tokio::spawn(export_loop(exporter, rx));
        Ok(Spans { queue: Some(tx) })
    }

    /// Whether spans are exported (callers may skip making them).
    pub fn on(&self) -> bool {
        self.queue.is_some()
    }

    /// Queues spans for export; a full queue drops them (counted).
    pub fn emit(&self, spans: impl IntoIterator<Item = RunSpan>) {
        let Some(queue) = &self.queue else { return };
        for span in spans {
            if queue.try_send(span).is_err() {
                metrics::counter!(crate::telemetry::TRACE_SPANS_DROPPED).increment(1);
            }
        }
    }
}

/// Sends what is queued, a batch at a time (up to [`BATCH_SPANS`], or what
/// came within [`BATCH_WAIT`] of the first).
async fn export_loop(exporter: opentelemetry_otlp::SpanExporter, mut rx: mpsc::Receiver<RunSpan>) {
    let scope = InstrumentationScope::builder("relay")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first.data(&scope)];
        let deadline = tokio::time::Instant::now() + BATCH_WAIT;
        while batch.len() < BATCH_SPANS {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(span)) => batch.push(span.data(&scope)),
                Ok(None) | Err(_) => break,
            }
        }
        let n = batch.len();
        if let Err(e) = exporter.export(batch).await {
            metrics::counter!(crate::telemetry::TRACE_SPANS_DROPPED).increment(n as u64);
            tracing::warn!(error = %e, spans = n, "trace export failed");
        }
    }
}

/// The exporter's HTTP client: the relay's own reqwest.
#[derive(Debug)]
struct Client(reqwest::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Client {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let answer = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .send()
            .await?;
        let status = answer.status();
        let mut bytes = answer.bytes().await?;
        bytes.truncate(MAX_ANSWER_BYTES);
        Ok(http::Response::builder().status(status).body(bytes)?)
    }
}
