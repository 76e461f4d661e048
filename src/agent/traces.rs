//! An OTLP/HTTP trace receiver for a run (`model.traces`, docs/agents.md): an agent whose
//! tools are real exports its spans here while pieval drives it, and each attempt's
//! calls are read from the spans of the trace pieval started for it (its W3C
//! `traceparent`, [`super::otel`]) — mapped and judged as `pieval import otel`
//! does. Every message received is also kept in the run folder (`traces.otlp`, as the
//! collector's `file` exporter writes protobuf), for audit and for importing again.
//!
//! OTLP/HTTP (the OTLP specification, in opentelemetry-proto): `POST /v1/traces`, a body of
//! `application/x-protobuf` or `application/json`, `Content-Encoding` gzip or deflate
//! (zlib), at most 64 MiB decompressed (413 past it); 200 with an empty
//! `ExportTraceServiceResponse`, 400 for a body that does not decode, 415 for another
//! content type. It binds a loopback address and answers only to a loopback `Host` with no
//! foreign `Origin` (a browser's page cannot post to it); spans of a trace no attempt of
//! the run started are counted and dropped.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::agent::otel::{MAX_MESSAGE_BYTES, Span, decode_json_bytes, decode_proto};
use crate::error::{Error, Result};

/// The spans received, by trace, for the traces attempts started.
struct Store {
    /// Trace id → the span id pieval gave as the parent (the agent's root span's parent)
    /// and the spans received so far.
    traces: HashMap<[u8; 16], ([u8; 8], Vec<Span>)>,
    /// Spans of traces no attempt started.
    dropped: u64,
}

struct Shared {
    host_port: String,
    store: Mutex<Store>,
    arrived: tokio::sync::Notify,
    /// `traces.otlp` in the run folder: each message received, protobuf, after a 4-byte
    /// big-endian length.
    file: Mutex<std::io::BufWriter<std::fs::File>>,
}

/// The receiver of a run.
pub struct Receiver {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: tokio_util::sync::CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The run folder's file of received messages.
pub const TRACES_FILE: &str = "traces.otlp";

impl Receiver {
    /// Listens on `listen`; messages are kept in `dir`/traces.otlp (appended: a resumed
    /// run keeps what came before).
    pub async fn start(listen: SocketAddr, dir: &Path) -> Result<Receiver> {
        let path = dir.join(TRACES_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(&path, "cannot open", e))?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| Error::State(format!("trace receiver: cannot listen on {listen}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::State(format!("trace receiver: {e}")))?;
        let shared = Arc::new(Shared {
            host_port: addr.port().to_string(),
            store: Mutex::new(Store {
                traces: HashMap::new(),
                dropped: 0,
            }),
            arrived: tokio::sync::Notify::new(),
            file: Mutex::new(std::io::BufWriter::new(file)),
        });
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .fallback(|| async { (StatusCode::NOT_FOUND, "POST /v1/traces\n") })
            // the limit is on the decompressed body too (below)
            .layer(axum::extract::DefaultBodyLimit::max(MAX_MESSAGE_BYTES))
            .with_state(Arc::clone(&shared));
        let stop = tokio_util::sync::CancellationToken::new();
        let shutdown = stop.clone();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await;
        });
        Ok(Receiver {
            shared,
            addr,
            stop,
            task: Mutex::new(Some(task)),
        })
    }

    /// `http://<addr>/v1/traces`, for the agent's OTLP exporter.
    pub fn url(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    /// An attempt's trace is expected: its spans are kept from now on.
    pub fn expect(&self, traceparent: &str) {
        if let Some((trace, parent)) = ids(traceparent) {
            lock(&self.shared.store)
                .traces
                .entry(trace)
                .or_insert_with(|| (parent, Vec::new()));
        }
    }

    /// The spans of `traceparent`'s trace, once the agent's root span (the one whose
    /// parent is pieval's) has arrived — it ends last — or `wait` has passed: the spans,
    /// and whether the root came. The trace is forgotten.
    pub async fn take(&self, traceparent: &str, wait: Duration) -> (Vec<Span>, bool) {
        let Some((trace, parent)) = ids(traceparent) else {
            return (Vec::new(), false);
        };
        let root_came = || {
            lock(&self.shared.store)
                .traces
                .get(&trace)
                .is_some_and(|(_, spans)| spans.iter().any(|s| s.parent_id == Some(parent)))
        };
        let deadline = tokio::time::Instant::now() + wait;
        let came = loop {
            // registered before the check: an arrival between the two is not missed
            let notified = self.shared.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if root_came() {
                break true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break root_came();
            }
        };
        let spans = lock(&self.shared.store)
            .traces
            .remove(&trace)
            .map(|(_, s)| s)
            .unwrap_or_default();
        (spans, came)
    }

    /// Spans received for traces no attempt started.
    pub fn dropped(&self) -> u64 {
        lock(&self.shared.store).dropped
    }

    pub async fn stop(&self) {
        self.stop.cancel();
        let task = lock(&self.task).take();
        if let Some(t) = task {
            let abort = t.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), t)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        let _ = lock(&self.shared.file).flush();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// (trace id, parent span id) of a `traceparent`.
fn ids(traceparent: &str) -> Option<([u8; 16], [u8; 8])> {
    let mut p = traceparent.split('-');
    let (_, t, s) = (p.next()?, p.next()?, p.next()?);
    let (mut trace, mut span) = ([0; 16], [0; 8]);
    hex::decode_to_slice(t, &mut trace).ok()?;
    hex::decode_to_slice(s, &mut span).ok()?;
    Some((trace, span))
}

/// A failure as OTLP/HTTP answers it: a `google.rpc.Status` in the request's encoding.
fn failure(status: StatusCode, json: bool, message: String) -> Response {
    if json {
        let body = serde_json::json!({"code": 3, "message": message}).to_string();
        return (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct RpcStatus {
        #[prost(int32, tag = "1")]
        code: i32,
        #[prost(string, tag = "2")]
        message: String,
    }
    let body = prost::Message::encode_to_vec(&RpcStatus { code: 3, message });
    (
        status,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        body,
    )
        .into_response()
}

/// The body, decompressed (gzip, deflate as zlib), within the limit.
fn decompressed(
    headers: &HeaderMap,
    body: Bytes,
) -> std::result::Result<Vec<u8>, (StatusCode, String)> {
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .trim()
        .to_ascii_lowercase();
    let mut out = Vec::new();
    let limit = MAX_MESSAGE_BYTES as u64 + 1;
    let read = match encoding.as_str() {
        "" | "identity" => return Ok(body.to_vec()),
        "gzip" => flate2::read::GzDecoder::new(&body[..])
            .take(limit)
            .read_to_end(&mut out),
        "deflate" => flate2::read::ZlibDecoder::new(&body[..])
            .take(limit)
            .read_to_end(&mut out),
        other => {
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("Content-Encoding {other:?}: gzip or deflate"),
            ));
        }
    };
    read.map_err(|e| (StatusCode::BAD_REQUEST, format!("{encoding}: {e}")))?;
    if out.len() > MAX_MESSAGE_BYTES {
        return Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("more than {} MiB decompressed", MAX_MESSAGE_BYTES >> 20),
        ));
    }
    Ok(out)
}

async fn receive(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let port = &shared.host_port;
    let local = [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ];
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let json = content_type == "application/json";
    if !local.iter().any(|h| h == host) {
        return failure(
            StatusCode::FORBIDDEN,
            json,
            "Host is not this receiver's".into(),
        );
    }
    if headers.contains_key(header::ORIGIN) {
        return failure(
            StatusCode::FORBIDDEN,
            json,
            "a browser's request (Origin): refused".into(),
        );
    }
    if !json && content_type != "application/x-protobuf" {
        return failure(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            false,
            format!("Content-Type {content_type:?}: application/x-protobuf or application/json"),
        );
    }
    let bytes = match decompressed(&headers, body) {
        Ok(b) => b,
        Err((status, m)) => return failure(status, json, m),
    };
    let spans = if json {
        decode_json_bytes(&bytes)
    } else {
        decode_proto(&bytes)
    };
    let spans = match spans {
        Ok(s) => s,
        Err(m) => return failure(StatusCode::BAD_REQUEST, json, m),
    };
    // kept as received (protobuf: a JSON message is kept as it came, the importer reads
    // both)
    {
        let mut f = lock(&shared.file);
        let _ = f
            .write_all(&(bytes.len() as u32).to_be_bytes())
            .and_then(|()| f.write_all(&bytes))
            .and_then(|()| f.flush());
    }
    {
        let mut store = lock(&shared.store);
        for s in spans {
            match store.traces.get_mut(&s.trace_id) {
                Some((_, list)) => list.push(s),
                None => store.dropped += 1,
            }
        }
    }
    shared.arrived.notify_waiters();
    if json {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            "{}",
        )
            .into_response()
    } else {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            Vec::<u8>::new(),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn otlp(trace: &str, span: &str, parent: &str) -> String {
        json!({"resourceSpans": [{"scopeSpans": [{"spans": [{
            "traceId": trace, "spanId": span, "parentSpanId": parent, "name": "execute_tool x",
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}}]
        }]}]}]})
        .to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_receiver_takes_otlp_keeps_it_and_refuses_what_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let r = Receiver::start("127.0.0.1:0".parse().unwrap(), dir.path())
            .await
            .unwrap();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let tp = crate::agent::otel::traceparent("run", "case");
        let (trace, parent) = ids(&tp).unwrap();
        let (trace, parent) = (hex::encode(trace), hex::encode(parent));
        r.expect(&tp);
        let post = |body: Vec<u8>, ct: &str, extra: Vec<(&'static str, String)>| {
            let mut req = http
                .post(r.url())
                .header("content-type", ct.to_owned())
                .body(body);
            for (k, v) in extra {
                req = req.header(k, v);
            }
            async move {
                let resp = req.send().await.unwrap();
                (
                    resp.status().as_u16(),
                    resp.text().await.unwrap_or_default(),
                )
            }
        };
        // a child span, then the root (whose parent is pieval's span)
        let child = otlp(&trace, "00000000000000c1", "00000000000000a1");
        assert_eq!(
            post(child.into_bytes(), "application/json", vec![]).await.0,
            200
        );
        let root = otlp(&trace, "00000000000000a1", &parent);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(root.as_bytes()).unwrap();
        let gz = gz.finish().unwrap();
        let (status, body) = post(
            gz,
            "application/json; charset=utf-8",
            vec![("content-encoding", "gzip".into())],
        )
        .await;
        assert_eq!((status, body.as_str()), (200, "{}"));
        let (spans, ended) = r.take(&tp, Duration::from_secs(5)).await;
        assert!(ended);
        assert_eq!(spans.len(), 2);
        // another trace's spans are dropped, counted
        let other = otlp(&"ab".repeat(16), "00000000000000c2", "00000000000000a2");
        assert_eq!(
            post(other.into_bytes(), "application/json", vec![]).await.0,
            200
        );
        assert_eq!(r.dropped(), 1);
        // refused: not OTLP, another type, another Host, a browser, a bomb
        assert_eq!(
            post(b"\xff\xff\xff".to_vec(), "application/x-protobuf", vec![])
                .await
                .0,
            400
        );
        assert_eq!(post(b"{}".to_vec(), "text/plain", vec![]).await.0, 415);
        let host = vec![("host", "evil.example:80".to_owned())];
        assert_eq!(post(b"{}".to_vec(), "application/json", host).await.0, 403);
        let origin = vec![("origin", "http://evil.example".to_owned())];
        assert_eq!(
            post(b"{}".to_vec(), "application/json", origin).await.0,
            403
        );
        let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        bomb.write_all(&vec![b' '; MAX_MESSAGE_BYTES + 10]).unwrap();
        let bomb = bomb.finish().unwrap();
        assert_eq!(
            post(
                bomb,
                "application/json",
                vec![("content-encoding", "gzip".into())]
            )
            .await
            .0,
            413
        );
        // an attempt whose agent never ends its trace: the wait is bounded
        let tp2 = crate::agent::otel::traceparent("run", "other");
        r.expect(&tp2);
        let (spans, ended) = r.take(&tp2, Duration::from_millis(200)).await;
        assert!(!ended && spans.is_empty());
        r.stop().await;
        // kept: what was received, readable by the importer
        let kept = crate::agent::otel::read_file(&dir.path().join(TRACES_FILE)).unwrap();
        assert_eq!(kept.len(), 3);
    }
}
