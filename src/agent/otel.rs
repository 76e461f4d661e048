//! OpenTelemetry traces of an agent (docs/import.md, "Traces"; docs/agents.md): OTLP as
//! the collector's `file` exporter writes it and as OTLP/HTTP carries it, read into spans,
//! and the spans of one attempt mapped into its tool calls — for `pieval import otel`
//! (its importer) and the trace receiver of a run (`super::traces`).
//!
//! **Files.** OTLP/JSON lines (`format: json`, one `TracesData` per line; the spec's file
//! format), one OTLP/JSON document, OTLP protobuf as the collector writes it (`format:
//! proto`: each `TracesData` after a 4-byte big-endian length), and either compressed with
//! zstd (the whole file, or each length-prefixed message: the collector's legacy
//! `compression: zstd`). The OTLP/JSON rules hold (the OTLP specification's "JSON Protobuf
//! Encoding", in opentelemetry-proto): ids are hex, 64-bit integers decimal strings or
//! numbers, enums integers, unknown fields ignored.
//!
//! **Mapping** (OpenTelemetry GenAI semantic conventions; OpenInference):
//! - an execute-tool span (`gen_ai.operation.name = execute_tool`): `gen_ai.tool.name`,
//!   `gen_ai.tool.call.id`, `gen_ai.tool.call.arguments` (structured, or a JSON string),
//!   `gen_ai.tool.call.result`; the span's status ERROR (or `error.type`) a failed call;
//! - an MCP client span (`mcp.method.name = tools/call`) the same way — one with an
//!   execute-tool span around or inside it for the same tool is that call, not another
//!   (the conventions let both be recorded);
//! - an OpenInference TOOL span (`openinference.span.kind = TOOL`): `tool.name`,
//!   `tool.id`, `input.value` (the arguments), `output.value`;
//! - chat spans that asked for calls: `gen_ai.output.messages` parts of type `tool_call`,
//!   OpenInference's `llm.output_messages.<i>.message.tool_calls.<j>.tool_call.*` — the
//!   calls of an attempt whose spans hold no execution span (an agent instrumented at
//!   the model only); with execution spans, those are the calls.
//!
//! **Joining.** A span belongs to the attempt its attribute `pieval.attempt_id` (or
//! `pieval.case_id`) names, on the span, an ancestor or its resource; else to the trace
//! whose id pieval sent as the attempt's W3C `traceparent` ([`trace_id`]).

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use prost::Message;
use serde_json::{Map, Value, json};

use crate::error::{Error, Result};

/// One tool call a trace records, with what the tool returned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Call {
    pub id: String,
    pub name: String,
    /// The arguments: a JSON value, or text that does not parse (kept as it was).
    pub arguments: Value,
    pub output: Option<String>,
    pub error: bool,
}

/// The largest file read (after decompression).
pub const MAX_FILE_BYTES: u64 = 1 << 30;
/// The largest OTLP message (a length-prefixed frame, a JSON line, a request body).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// One span as pieval reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    pub parent_id: Option<String>,
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Attribute values as JSON (a key-value list an object, an array an array, bytes
    /// base64 text).
    pub attributes: Map<String, Value>,
    /// Its resource's attributes.
    pub resource: Arc<Map<String, Value>>,
    /// Status ERROR: its message (or `error.type`), else None.
    pub error: Option<String>,
}

// ---------------------------------------------------------------------------------------
// OTLP protobuf (opentelemetry-proto's trace.proto, common.proto, resource.proto): the
// fields pieval reads; unknown fields are skipped by prost.

#[derive(Clone, PartialEq, Message)]
pub struct TracesData {
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ScopeSpans {
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<PbSpan>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PbSpan {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub name: String,
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Status {
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(int32, tag = "3")]
    pub code: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 2, 3, 4, 5, 6, 7")]
    pub value: Option<any_value::Value>,
}

pub mod any_value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        StringValue(String),
        #[prost(bool, tag = "2")]
        BoolValue(bool),
        #[prost(int64, tag = "3")]
        IntValue(i64),
        #[prost(double, tag = "4")]
        DoubleValue(f64),
        #[prost(message, tag = "5")]
        ArrayValue(super::ArrayValue),
        #[prost(message, tag = "6")]
        KvlistValue(super::KeyValueList),
        #[prost(bytes, tag = "7")]
        BytesValue(Vec<u8>),
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct ArrayValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<AnyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValueList {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<KeyValue>,
}

/// Status code ERROR (trace.proto `Status.StatusCode`).
const STATUS_ERROR: i64 = 2;

fn pb_value(v: &AnyValue) -> Value {
    use any_value::Value as V;
    match &v.value {
        None => Value::Null,
        Some(V::StringValue(s)) => Value::String(s.clone()),
        Some(V::BoolValue(b)) => Value::Bool(*b),
        Some(V::IntValue(i)) => json!(i),
        Some(V::DoubleValue(d)) => json!(d),
        Some(V::ArrayValue(a)) => Value::Array(a.values.iter().map(pb_value).collect()),
        Some(V::KvlistValue(l)) => Value::Object(pb_attributes(&l.values)),
        Some(V::BytesValue(b)) => {
            use base64::Engine;
            Value::String(base64::engine::general_purpose::STANDARD.encode(b))
        }
    }
}

fn pb_attributes(kvs: &[KeyValue]) -> Map<String, Value> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map_or(Value::Null, pb_value),
            )
        })
        .collect()
}

/// The spans of an OTLP protobuf message (`TracesData`, or an
/// `ExportTraceServiceRequest`: the same field 1).
pub fn decode_proto(bytes: &[u8]) -> std::result::Result<Vec<Span>, String> {
    let data = TracesData::decode(bytes).map_err(|e| format!("not OTLP protobuf: {e}"))?;
    let mut out = Vec::new();
    for rs in data.resource_spans {
        let resource = Arc::new(
            rs.resource
                .as_ref()
                .map(|r| pb_attributes(&r.attributes))
                .unwrap_or_default(),
        );
        for ss in rs.scope_spans {
            for s in ss.spans {
                let attributes = pb_attributes(&s.attributes);
                let error = status_error(
                    s.status.as_ref().map(|st| i64::from(st.code)),
                    s.status.as_ref().map(|st| st.message.as_str()),
                    &attributes,
                );
                out.push(Span {
                    trace_id: id_of_bytes(&s.trace_id, 16, "traceId")?,
                    span_id: id_of_bytes(&s.span_id, 8, "spanId")?,
                    parent_id: (!s.parent_span_id.is_empty())
                        .then(|| id_of_bytes(&s.parent_span_id, 8, "parentSpanId"))
                        .transpose()?,
                    name: s.name,
                    start_ns: s.start_time_unix_nano,
                    end_ns: s.end_time_unix_nano,
                    attributes,
                    resource: Arc::clone(&resource),
                    error,
                });
            }
        }
    }
    Ok(out)
}

fn id_of_bytes(b: &[u8], len: usize, what: &str) -> std::result::Result<String, String> {
    if b.len() != len {
        return Err(format!("{what}: {} bytes (expected {len})", b.len()));
    }
    Ok(hex::encode(b))
}

fn status_error(
    code: Option<i64>,
    message: Option<&str>,
    attributes: &Map<String, Value>,
) -> Option<String> {
    let typed = attributes
        .get("error.type")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if code == Some(STATUS_ERROR) {
        return Some(
            message
                .filter(|m| !m.is_empty())
                .map(str::to_owned)
                .or(typed)
                .unwrap_or_else(|| "error".into()),
        );
    }
    typed
}

// ---------------------------------------------------------------------------------------
// OTLP/JSON.

/// An OTLP/JSON `AnyValue`.
fn json_value(v: &Value, path: &str) -> std::result::Result<Value, String> {
    let Some(m) = v.as_object() else {
        return Err(format!("{path}: expected an AnyValue object"));
    };
    let Some((k, x)) = m.iter().next() else {
        return Ok(Value::Null);
    };
    Ok(match k.as_str() {
        "stringValue" => Value::String(
            x.as_str()
                .ok_or_else(|| format!("{path}.stringValue: expected a string"))?
                .to_owned(),
        ),
        "boolValue" => Value::Bool(
            x.as_bool()
                .ok_or_else(|| format!("{path}.boolValue: expected true or false"))?,
        ),
        "intValue" => json!(int(x).ok_or_else(|| format!(
            "{path}.intValue: expected an integer (a decimal string or a number)"
        ))?),
        "doubleValue" => match x {
            Value::Number(n) => json!(n.as_f64()),
            // NaN and the infinities are strings in proto3 JSON
            Value::String(s) => Value::String(s.clone()),
            _ => return Err(format!("{path}.doubleValue: expected a number")),
        },
        "arrayValue" => Value::Array(
            x.get("values")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .enumerate()
                .map(|(i, e)| json_value(e, &format!("{path}.arrayValue.values[{i}]")))
                .collect::<std::result::Result<_, _>>()?,
        ),
        "kvlistValue" => Value::Object(json_attributes(
            x.get("values").unwrap_or(&Value::Null),
            &format!("{path}.kvlistValue.values"),
        )?),
        "bytesValue" => Value::String(x.as_str().unwrap_or_default().to_owned()),
        // a value kind of a newer OTLP (profiles' string index): not a value here
        _ => Value::Null,
    })
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn uint(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn json_attributes(v: &Value, path: &str) -> std::result::Result<Map<String, Value>, String> {
    let mut out = Map::new();
    let list = match v {
        Value::Null => return Ok(out),
        Value::Array(a) => a,
        _ => return Err(format!("{path}: expected a list of {{key, value}}")),
    };
    for (i, kv) in list.iter().enumerate() {
        let key = kv
            .get("key")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{path}[{i}].key: expected a string"))?;
        let value = match kv.get("value") {
            Some(v) => json_value(v, &format!("{path}[{i}].value"))?,
            None => Value::Null,
        };
        out.insert(key.to_owned(), value);
    }
    Ok(out)
}

fn json_id(
    v: Option<&Value>,
    len: usize,
    path: &str,
) -> std::result::Result<Option<String>, String> {
    let Some(s) = v.and_then(Value::as_str) else {
        return match v {
            None | Some(Value::Null) => Ok(None),
            _ => Err(format!("{path}: expected a hex string")),
        };
    };
    if s.is_empty() {
        return Ok(None);
    }
    if s.len() != len * 2 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "{path}: {:?} is not {} hex digits (OTLP/JSON ids are hex, not base64)",
            crate::text::excerpt(s, 40),
            len * 2
        ));
    }
    Ok(Some(s.to_ascii_lowercase()))
}

/// The spans of an OTLP/JSON `TracesData` (or `ExportTraceServiceRequest`).
pub fn decode_json(v: &Value) -> std::result::Result<Vec<Span>, String> {
    let Some(list) = v.get("resourceSpans") else {
        return Err("no resourceSpans: not OTLP/JSON traces".into());
    };
    let list = list.as_array().ok_or("resourceSpans: expected a list")?;
    let mut out = Vec::new();
    for (r, rs) in list.iter().enumerate() {
        let rpath = format!("resourceSpans[{r}]");
        let resource = Arc::new(json_attributes(
            rs.pointer("/resource/attributes").unwrap_or(&Value::Null),
            &format!("{rpath}.resource.attributes"),
        )?);
        let scopes = rs.get("scopeSpans").and_then(Value::as_array);
        for (s, ss) in scopes.into_iter().flatten().enumerate() {
            let spans = ss.get("spans").and_then(Value::as_array);
            for (k, sp) in spans.into_iter().flatten().enumerate() {
                let path = format!("{rpath}.scopeSpans[{s}].spans[{k}]");
                let attributes = json_attributes(
                    sp.get("attributes").unwrap_or(&Value::Null),
                    &format!("{path}.attributes"),
                )?;
                let status = sp.get("status");
                let error = status_error(
                    status.and_then(|s| s.get("code")).and_then(int),
                    status
                        .and_then(|s| s.get("message"))
                        .and_then(Value::as_str),
                    &attributes,
                );
                out.push(Span {
                    trace_id: json_id(sp.get("traceId"), 16, &format!("{path}.traceId"))?
                        .ok_or_else(|| format!("{path}.traceId: missing"))?,
                    span_id: json_id(sp.get("spanId"), 8, &format!("{path}.spanId"))?
                        .ok_or_else(|| format!("{path}.spanId: missing"))?,
                    parent_id: json_id(sp.get("parentSpanId"), 8, &format!("{path}.parentSpanId"))?,
                    name: sp
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    start_ns: uint(sp.get("startTimeUnixNano")).unwrap_or(0),
                    end_ns: uint(sp.get("endTimeUnixNano")).unwrap_or(0),
                    attributes,
                    resource: Arc::clone(&resource),
                    error,
                });
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Files.

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

fn unzstd(bytes: &[u8], what: &str) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    zstd::stream::read::Decoder::new(bytes)
        .map_err(|e| format!("{what}: zstd: {e}"))?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("{what}: zstd (truncated or corrupt?): {e}"))?;
    if out.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{what}: more than {} MiB once decompressed",
            MAX_FILE_BYTES >> 20
        ));
    }
    Ok(out)
}

/// One OTLP message (a frame's bytes): JSON or protobuf, by its first byte.
fn message(bytes: &[u8]) -> std::result::Result<Vec<Span>, String> {
    let bytes = if bytes.starts_with(&ZSTD_MAGIC) {
        std::borrow::Cow::Owned(unzstd(bytes, "the message")?)
    } else {
        std::borrow::Cow::Borrowed(bytes)
    };
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {
            let v: Value =
                serde_json::from_slice(&bytes).map_err(|e| format!("not OTLP/JSON: {e}"))?;
            decode_json(&v)
        }
        _ => decode_proto(&bytes),
    }
}

/// Every span of an OTLP file (its format found from its bytes); an error names the file
/// and the line (JSON lines) or the byte offset of the message (length-prefixed).
pub fn read_file(path: &Path) -> Result<Vec<Span>> {
    let raw = crate::files::read_bounded(path, crate::files::Links::Refuse, MAX_FILE_BYTES)?;
    let bad = |line: u64, m: String| Error::input(path, line, None, m);
    let bytes = if raw.starts_with(&ZSTD_MAGIC) {
        unzstd(&raw, "the file").map_err(|m| bad(0, m))?
    } else {
        raw
    };
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    let mut spans = Vec::new();
    match first {
        None => {}
        Some(b'{') => {
            // one document (pretty-printed), or JSON lines
            if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                spans = decode_json(&v).map_err(|m| bad(1, m))?;
            } else {
                for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
                    let n = i as u64 + 1;
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    if line.len() > MAX_MESSAGE_BYTES {
                        return Err(bad(
                            n,
                            format!(
                                "a line of {} bytes (at most {MAX_MESSAGE_BYTES})",
                                line.len()
                            ),
                        ));
                    }
                    let v: Value = serde_json::from_slice(line).map_err(|e| {
                        bad(
                            n,
                            format!("not OTLP/JSON (a line cut short by a collector still writing?): {e}"),
                        )
                    })?;
                    spans.extend(decode_json(&v).map_err(|m| bad(n, m))?);
                }
            }
        }
        Some(_) => {
            // the collector's length-prefixed messages: a 4-byte big-endian length, then
            // the message (protobuf or JSON, each maybe zstd)
            let mut at = 0usize;
            while at < bytes.len() {
                let Some(head) = bytes.get(at..at + 4) else {
                    return Err(bad(
                        0,
                        format!("byte {at}: a length prefix cut short (a truncated file?)"),
                    ));
                };
                let len = u32::from_be_bytes(head.try_into().expect("4 bytes")) as usize;
                if len > MAX_MESSAGE_BYTES {
                    return Err(bad(
                        0,
                        format!(
                            "byte {at}: a message of {len} bytes (at most {MAX_MESSAGE_BYTES}): not the collector's length-prefixed OTLP"
                        ),
                    ));
                }
                let Some(body) = bytes.get(at + 4..at + 4 + len) else {
                    return Err(bad(
                        0,
                        format!(
                            "byte {at}: a message of {len} bytes, {} left in the file (a truncated file?)",
                            bytes.len() - at - 4
                        ),
                    ));
                };
                spans.extend(message(body).map_err(|m| bad(0, format!("byte {at}: {m}")))?);
                at += 4 + len;
            }
        }
    }
    Ok(spans)
}

// ---------------------------------------------------------------------------------------
// Mapping.

/// The trace id pieval sends as attempt `key`'s W3C `traceparent` in run `run_id`: the
/// first 16 bytes of SHA-256 over both (reproducible: an importer finds the attempt from
/// the run's id).
pub fn trace_id(run_id: &str, key: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("pieval-trace\0{run_id}\0{key}").as_bytes());
    hex::encode(&d[..16])
}

/// The `traceparent` header of attempt `key` of run `run_id` (sampled).
pub fn traceparent(run_id: &str, key: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("pieval-span\0{run_id}\0{key}").as_bytes());
    format!("00-{}-{}-01", trace_id(run_id, key), hex::encode(&d[..8]))
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Arguments as recorded: a JSON string parsed when it parses, structured kept.
fn arguments(v: Option<&Value>) -> Value {
    match v {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::String(s)) => {
            serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
        }
        Some(other) => other.clone(),
    }
}

/// What kind of call a span records.
fn execution(s: &Span) -> Option<Call> {
    let a = &s.attributes;
    let get = |k: &str| a.get(k);
    let op = get("gen_ai.operation.name").and_then(Value::as_str);
    let mcp = get("mcp.method.name").and_then(Value::as_str) == Some("tools/call");
    let oi_tool = get("openinference.span.kind").and_then(Value::as_str) == Some("TOOL");
    let (name, id, args, out) = if op == Some("execute_tool") || mcp {
        (
            text(get("gen_ai.tool.name")).or_else(|| {
                // `tools/call <name>`, `execute_tool <name>`
                s.name.split_once(' ').map(|(_, n)| n.to_owned())
            })?,
            text(get("gen_ai.tool.call.id")),
            arguments(get("gen_ai.tool.call.arguments")),
            text(get("gen_ai.tool.call.result")),
        )
    } else if oi_tool {
        (
            text(get("tool.name")).unwrap_or_else(|| s.name.clone()),
            text(get("tool.id")),
            arguments(get("input.value")),
            text(get("output.value")),
        )
    } else {
        return None;
    };
    Some(Call {
        id: id.map(|i| i.trim().to_owned()).unwrap_or_default(),
        name,
        arguments: args,
        error: s.error.is_some(),
        output: out.or_else(|| s.error.clone()),
    })
}

/// The calls a chat span's answer asked for (GenAI `gen_ai.output.messages`,
/// OpenInference `llm.output_messages.*`).
fn requested(s: &Span) -> Vec<Call> {
    let a = &s.attributes;
    let mut out = Vec::new();
    let messages = match a.get("gen_ai.output.messages") {
        Some(Value::String(t)) => serde_json::from_str(t).unwrap_or(Value::Null),
        Some(v) => v.clone(),
        None => Value::Null,
    };
    for m in messages.as_array().into_iter().flatten() {
        for p in m
            .get("parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if p.get("type").and_then(Value::as_str) == Some("tool_call")
                && let Some(name) = p.get("name").and_then(Value::as_str)
            {
                out.push(Call {
                    id: text(p.get("id")).unwrap_or_default().trim().to_owned(),
                    name: name.to_owned(),
                    arguments: arguments(p.get("arguments")),
                    output: None,
                    error: false,
                });
            }
        }
    }
    // OpenInference's flattened form, in index order: (name, id, arguments) by
    // (message, call)
    type Parts = (Option<String>, Option<String>, Option<Value>);
    let mut flat: BTreeMap<(usize, usize), Parts> = BTreeMap::new();
    for (k, v) in a {
        let Some(rest) = k.strip_prefix("llm.output_messages.") else {
            continue;
        };
        let mut parts = rest.splitn(2, '.');
        let (Some(i), Some(tail)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Some(tail) = tail.strip_prefix("message.tool_calls.") else {
            continue;
        };
        let mut parts = tail.splitn(2, '.');
        let (Some(j), Some(field)) = (parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(i), Ok(j)) = (i.parse::<usize>(), j.parse::<usize>()) else {
            continue;
        };
        let e = flat.entry((i, j)).or_default();
        match field {
            "tool_call.function.name" => e.0 = text(Some(v)),
            "tool_call.id" => e.1 = text(Some(v)),
            "tool_call.function.arguments" => e.2 = Some(arguments(Some(v))),
            _ => {}
        }
    }
    for (_, (name, id, args)) in flat {
        if let Some(name) = name {
            out.push(Call {
                id: id.unwrap_or_default(),
                name,
                arguments: args.unwrap_or_else(|| Value::Object(Map::new())),
                output: None,
                error: false,
            });
        }
    }
    out
}

/// The calls one attempt's spans record, in the order they started: its execution spans
/// (an MCP client span inside or around an execute-tool span of the same tool being one
/// call), or, without any, the calls its chat spans asked for.
pub fn calls_of(spans: &[&Span]) -> Vec<Call> {
    let mut sorted: Vec<&Span> = spans.to_vec();
    sorted.sort_by(|a, b| (a.start_ns, &a.span_id).cmp(&(b.start_ns, &b.span_id)));
    let by_id: HashMap<&str, &Span> = sorted.iter().map(|s| (s.span_id.as_str(), *s)).collect();
    let executed: Vec<(&Span, Call)> = sorted
        .iter()
        .filter_map(|s| execution(s).map(|c| (*s, c)))
        .collect();
    let names: HashMap<&str, &str> = executed
        .iter()
        .map(|(s, c)| (s.span_id.as_str(), c.name.as_str()))
        .collect();
    let mut out = Vec::new();
    for (s, c) in &executed {
        // the same call recorded twice (execute_tool and its MCP client span): the
        // outer one is kept, with what the inner one knows
        let mut p = s.parent_id.as_deref();
        let mut nested = false;
        let mut depth = 0;
        while let Some(id) = p {
            if names.get(id) == Some(&c.name.as_str()) {
                nested = true;
                break;
            }
            depth += 1;
            if depth > 256 {
                break;
            }
            p = by_id.get(id).and_then(|x| x.parent_id.as_deref());
        }
        if !nested {
            out.push((s.span_id.clone(), c.clone()));
        }
    }
    // what an inner span knows and the outer does not (the result, the id)
    for (s, c) in &executed {
        if let Some(parent) = s.parent_id.as_deref()
            && let Some((_, outer)) = out
                .iter_mut()
                .find(|(id, o)| id == parent && o.name == c.name)
        {
            if outer.output.is_none() {
                outer.output = c.output.clone();
            }
            if outer.id.is_empty() {
                outer.id = c.id.clone();
            }
            if outer.arguments == Value::Object(Map::new()) {
                outer.arguments = c.arguments.clone();
            }
            outer.error |= c.error;
        }
    }
    if !out.is_empty() {
        return out.into_iter().map(|(_, c)| c).collect();
    }
    sorted.iter().flat_map(|s| requested(s)).collect()
}

/// The attempt a span names: `pieval.attempt_id` (else `pieval.case_id`) on it, an
/// ancestor or its resource.
fn named(s: &Span, by_id: &HashMap<&str, &Span>) -> Option<String> {
    let find = |m: &Map<String, Value>| {
        ["pieval.attempt_id", "pieval.case_id"]
            .iter()
            .find_map(|k| m.get(*k).and_then(Value::as_str).map(str::to_owned))
    };
    let mut cur = Some(s);
    let mut depth = 0;
    while let Some(x) = cur {
        if let Some(k) = find(&x.attributes) {
            return Some(k);
        }
        depth += 1;
        if depth > 256 {
            break;
        }
        cur = x.parent_id.as_deref().and_then(|p| by_id.get(p).copied());
    }
    find(&s.resource)
}

/// Spans grouped by attempt key: the key they name, else the attempt whose trace id
/// (`traces`: trace id → key) is theirs. Spans of neither are counted, not kept.
pub fn by_attempt<'s>(
    spans: &'s [Span],
    traces: &HashMap<String, String>,
) -> (BTreeMap<String, Vec<&'s Span>>, u64) {
    let by_id: HashMap<&str, &Span> = spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    // a trace named by one of its spans is that attempt's, all of it
    let mut trace_key: HashMap<&str, String> = HashMap::new();
    for s in spans {
        if let Some(k) = named(s, &by_id) {
            trace_key.entry(s.trace_id.as_str()).or_insert(k);
        }
    }
    let mut out: BTreeMap<String, Vec<&Span>> = BTreeMap::new();
    let mut unmatched = 0;
    for s in spans {
        let key = named(s, &by_id)
            .or_else(|| trace_key.get(s.trace_id.as_str()).cloned())
            .or_else(|| traces.get(&s.trace_id).cloned());
        match key {
            Some(k) => out.entry(k).or_default().push(s),
            None => unmatched += 1,
        }
    }
    (out, unmatched)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: Value) -> Value {
        let v = match value {
            Value::String(s) => json!({"stringValue": s}),
            Value::Number(n) => json!({"intValue": n.to_string()}),
            Value::Bool(b) => json!({"boolValue": b}),
            other => json!({"stringValue": other.to_string()}),
        };
        json!({"key": key, "value": v})
    }

    fn span(id: &str, parent: Option<&str>, start: u64, attrs: Vec<Value>) -> Value {
        let mut s = json!({"traceId": "5B8EFFF798038103D269B633813FC60C", "spanId": id,
            "name": "s", "kind": 1, "startTimeUnixNano": start.to_string(),
            "endTimeUnixNano": (start + 5).to_string(), "attributes": attrs, "status": {}});
        if let Some(p) = parent {
            s["parentSpanId"] = json!(p);
        }
        s
    }

    fn doc(spans: Vec<Value>) -> Value {
        json!({"resourceSpans": [{"resource": {"attributes": [kv("pieval.case_id", json!("c1"))]},
            "scopeSpans": [{"scope": {}, "spans": spans}]}]})
    }

    #[test]
    fn execute_tool_and_its_mcp_span_are_one_call_openinference_and_chat_spans_map() {
        let d = doc(vec![
            span(
                "0000000000000001",
                None,
                1,
                vec![kv("gen_ai.operation.name", json!("invoke_agent"))],
            ),
            span(
                "0000000000000002",
                Some("0000000000000001"),
                10,
                vec![
                    kv("gen_ai.operation.name", json!("execute_tool")),
                    kv("gen_ai.tool.name", json!("send_money")),
                    kv("gen_ai.tool.call.arguments", json!("{\"to\": \"X\"}")),
                ],
            ),
            span(
                "0000000000000003",
                Some("0000000000000002"),
                11,
                vec![
                    kv("mcp.method.name", json!("tools/call")),
                    kv("gen_ai.tool.name", json!("send_money")),
                    kv("gen_ai.tool.call.id", json!(" call_7")),
                    kv("gen_ai.tool.call.result", json!("Sent.")),
                ],
            ),
            span(
                "0000000000000004",
                Some("0000000000000001"),
                20,
                vec![
                    kv("openinference.span.kind", json!("TOOL")),
                    kv("tool.name", json!("read_inbox")),
                    kv("input.value", json!("{}")),
                    kv("output.value", json!("mail")),
                ],
            ),
        ]);
        let spans = decode_json(&d).unwrap();
        assert_eq!(spans[0].trace_id, "5b8efff798038103d269b633813fc60c");
        let refs: Vec<&Span> = spans.iter().collect();
        let calls = calls_of(&refs);
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(calls[0].name, "send_money");
        assert_eq!(calls[0].arguments, json!({"to": "X"}));
        assert_eq!(
            calls[0].output.as_deref(),
            Some("Sent."),
            "the inner span's result"
        );
        assert_eq!(calls[0].id, "call_7");
        assert_eq!(calls[1].name, "read_inbox");
        let (groups, unmatched) = by_attempt(&spans, &HashMap::new());
        assert_eq!((groups.len(), unmatched), (1, 0));
        assert_eq!(groups["c1"].len(), 4);
        // an agent instrumented at the model only: the calls its answers asked for
        let chat = doc(vec![span(
            "0000000000000009",
            None,
            1,
            vec![
                kv(
                    "gen_ai.output.messages",
                    json!(
                        json!([{"role": "assistant", "parts": [
                {"type": "tool_call", "id": "a", "name": "get_balance", "arguments": {}}]}])
                        .to_string()
                    ),
                ),
                kv(
                    "llm.output_messages.0.message.tool_calls.0.tool_call.function.name",
                    json!("get_rate"),
                ),
                kv(
                    "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments",
                    json!("{\"currency\": \"USD\"}"),
                ),
            ],
        )]);
        let spans = decode_json(&chat).unwrap();
        let calls = calls_of(&spans.iter().collect::<Vec<_>>());
        let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["get_balance", "get_rate"]);
        assert_eq!(calls[1].arguments, json!({"currency": "USD"}));
    }

    #[test]
    fn bad_otlp_is_named_and_the_collectors_formats_are_read() {
        // base64 ids (protobuf's JSON, not OTLP's) are refused with the field named
        let mut d = doc(vec![span("0000000000000001", None, 1, vec![])]);
        d["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] =
            json!("W47/95gDgQPSabYzgT/GDA==");
        let e = decode_json(&d).unwrap_err();
        assert!(e.contains("traceId") && e.contains("hex"), "{e}");
        assert!(
            decode_json(&json!({"foo": 1}))
                .unwrap_err()
                .contains("resourceSpans")
        );
        // protobuf, length-prefixed, each message zstd: as the collector writes it
        let pb = TracesData {
            resource_spans: vec![ResourceSpans {
                resource: None,
                scope_spans: vec![ScopeSpans {
                    spans: vec![PbSpan {
                        trace_id: vec![1; 16],
                        span_id: vec![2; 8],
                        name: "execute_tool get_balance".into(),
                        attributes: vec![KeyValue {
                            key: "gen_ai.operation.name".into(),
                            value: Some(AnyValue {
                                value: Some(any_value::Value::StringValue("execute_tool".into())),
                            }),
                        }],
                        status: Some(Status {
                            message: "boom".into(),
                            code: 2,
                        }),
                        ..Default::default()
                    }],
                }],
            }],
        }
        .encode_to_vec();
        let dir = tempfile::tempdir().unwrap();
        let mut file = Vec::new();
        for body in [pb.clone(), zstd::encode_all(&pb[..], 3).unwrap()] {
            file.extend((body.len() as u32).to_be_bytes());
            file.extend(body);
        }
        let path = dir.path().join("spans.bin");
        std::fs::write(&path, &file).unwrap();
        let spans = read_file(&path).unwrap();
        assert_eq!(spans.len(), 2);
        let calls = calls_of(&spans.iter().take(1).collect::<Vec<_>>());
        assert_eq!(calls[0].name, "get_balance", "from the span's name");
        assert!(calls[0].error && calls[0].output.as_deref() == Some("boom"));
        // the whole file zstd-compressed
        std::fs::write(&path, zstd::encode_all(&file[..], 3).unwrap()).unwrap();
        assert_eq!(read_file(&path).unwrap().len(), 2);
        // cut short
        std::fs::write(&path, &file[..file.len() - 1]).unwrap();
        let e = read_file(&path).unwrap_err().to_string();
        assert!(e.contains("spans.bin") && e.contains("truncated"), "{e}");
        // a JSON line cut short names its line
        let line = doc(vec![span("0000000000000001", None, 1, vec![])]).to_string();
        std::fs::write(&path, format!("{line}\n{}\n", &line[..line.len() / 2])).unwrap();
        let e = read_file(&path).unwrap_err().to_string();
        assert!(e.contains(":2"), "{e}");
    }

    #[test]
    fn traceparents_are_w3c_and_reproducible() {
        let t = traceparent("run-1", "case-a");
        let parts: Vec<&str> = t.split('-').collect();
        assert_eq!(parts.len(), 4);
        assert_eq!(
            (parts[0], parts[1].len(), parts[2].len(), parts[3]),
            ("00", 32, 16, "01")
        );
        assert_eq!(parts[1], trace_id("run-1", "case-a"));
        assert_ne!(trace_id("run-1", "case-a"), trace_id("run-2", "case-a"));
        assert_eq!(t, traceparent("run-1", "case-a"));
    }
}
