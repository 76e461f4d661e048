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

use ahash::AHashMap;
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
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_id: Option<[u8; 8]>,
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The attributes the mapping reads ([`read_attribute`]), values as JSON (a key-value
    /// list an object, an array an array, bytes base64 text).
    pub attributes: Attributes,
    /// Its resource's attributes (those the mapping reads).
    pub resource: Arc<Attributes>,
    /// Status ERROR: its message (or `error.type`), else None.
    pub error: Option<String>,
}

impl Span {
    /// The trace id as OTLP/JSON and `traceparent` write it: 32 lowercase hex digits.
    pub fn trace_hex(&self) -> String {
        hex::encode(self.trace_id)
    }
}

/// A span's attributes, in the order they came; a key given twice is its last value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attributes(Vec<(String, Value)>);

impl Attributes {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }
}

/// The attribute keys the mapping reads: the rest of a span's attributes (the model,
/// tokens, the server…) are skipped unread, and so not checked either.
pub fn read_attribute(key: &str) -> bool {
    matches!(
        key,
        "gen_ai.operation.name"
            | "gen_ai.tool.name"
            | "gen_ai.tool.call.id"
            | "gen_ai.tool.call.arguments"
            | "gen_ai.tool.call.result"
            | "gen_ai.output.messages"
            | "mcp.method.name"
            | "openinference.span.kind"
            | "tool.name"
            | "tool.id"
            | "input.value"
            | "output.value"
            | "error.type"
            | "pieval.attempt_id"
            | "pieval.case_id"
    ) || key
        .strip_prefix("llm.output_messages.")
        .is_some_and(|r| r.contains(".message.tool_calls."))
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

// The reader walks the wire format itself (the protobuf encoding guide's varints, tags
// and length-delimited fields), borrowing from the message: an attribute the mapping does
// not read is skipped without being decoded, and nothing is copied twice. The structs
// above are the same fields for writing (tests, benches, the OTLP/HTTP client of a test
// agent).

/// The most nested arrays and key-value lists an attribute value may hold.
const MAX_VALUE_DEPTH: usize = 64;

mod wire {
    pub const VARINT: u8 = 0;
    pub const I64: u8 = 1;
    pub const LEN: u8 = 2;
    pub const I32: u8 = 5;

    pub struct Reader<'a> {
        buf: &'a [u8],
        at: usize,
    }

    impl<'a> Reader<'a> {
        pub fn new(buf: &'a [u8]) -> Self {
            Reader { buf, at: 0 }
        }

        /// The next field's number and wire type, None at the end.
        pub fn next(&mut self) -> Result<Option<(u64, u8)>, String> {
            if self.at >= self.buf.len() {
                return Ok(None);
            }
            let key = self.varint()?;
            let tag = key >> 3;
            if tag == 0 {
                return Err("field number 0".into());
            }
            Ok(Some((tag, (key & 7) as u8)))
        }

        pub fn varint(&mut self) -> Result<u64, String> {
            let mut v = 0u64;
            for i in 0..10 {
                let b = *self.buf.get(self.at).ok_or("a varint cut short")?;
                self.at += 1;
                v |= u64::from(b & 0x7f) << (7 * i);
                if b < 0x80 {
                    return Ok(v);
                }
            }
            Err("a varint longer than 10 bytes".into())
        }

        fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
            let end = self
                .at
                .checked_add(n)
                .filter(|e| *e <= self.buf.len())
                .ok_or("a field cut short")?;
            let out = &self.buf[self.at..end];
            self.at = end;
            Ok(out)
        }

        pub fn fixed64(&mut self) -> Result<u64, String> {
            Ok(u64::from_le_bytes(
                self.take(8)?.try_into().expect("8 bytes"),
            ))
        }

        pub fn bytes(&mut self) -> Result<&'a [u8], String> {
            let n = usize::try_from(self.varint()?).map_err(|_| "a field too long")?;
            self.take(n)
        }

        pub fn skip(&mut self, wire: u8) -> Result<(), String> {
            match wire {
                VARINT => self.varint().map(drop),
                I64 => self.take(8).map(drop),
                LEN => self.bytes().map(drop),
                I32 => self.take(4).map(drop),
                w => Err(format!("wire type {w} (groups are not OTLP)")),
            }
        }
    }

    pub fn text(b: &[u8], what: &str) -> Result<String, String> {
        String::from_utf8(b.to_vec()).map_err(|_| format!("{what}: not UTF-8"))
    }
}

use wire::Reader;

/// A field of a known number with another wire type.
fn wire_type(what: &str, tag: u64, wire: u8) -> String {
    format!("{what} field {tag}: wire type {wire}")
}

/// An `AnyValue` as JSON.
fn pb_any(b: &[u8], depth: usize) -> std::result::Result<Value, String> {
    use wire::{I64, LEN, VARINT};
    if depth > MAX_VALUE_DEPTH {
        return Err(format!(
            "an attribute value nested more than {MAX_VALUE_DEPTH} deep"
        ));
    }
    let mut r = Reader::new(b);
    let mut out = Value::Null;
    while let Some((tag, w)) = r.next()? {
        out = match (tag, w) {
            (1, LEN) => Value::String(wire::text(r.bytes()?, "stringValue")?),
            (2, VARINT) => Value::Bool(r.varint()? != 0),
            (3, VARINT) => json!(r.varint()? as i64),
            (4, I64) => json!(f64::from_bits(r.fixed64()?)),
            (5, LEN) => {
                let mut a = Reader::new(r.bytes()?);
                let mut values = Vec::new();
                while let Some((t, w)) = a.next()? {
                    match (t, w) {
                        (1, LEN) => values.push(pb_any(a.bytes()?, depth + 1)?),
                        (1, _) => return Err(wire_type("ArrayValue", t, w)),
                        _ => a.skip(w)?,
                    }
                }
                Value::Array(values)
            }
            (6, LEN) => {
                let mut l = Reader::new(r.bytes()?);
                let mut map = Map::new();
                while let Some((t, w)) = l.next()? {
                    match (t, w) {
                        (1, LEN) => {
                            if let Some((k, v)) = pb_key_value(l.bytes()?, false, depth + 1)? {
                                map.insert(k, v);
                            }
                        }
                        (1, _) => return Err(wire_type("KeyValueList", t, w)),
                        _ => l.skip(w)?,
                    }
                }
                Value::Object(map)
            }
            (7, LEN) => {
                use base64::Engine;
                Value::String(base64::engine::general_purpose::STANDARD.encode(r.bytes()?))
            }
            (1..=7, _) => return Err(wire_type("AnyValue", tag, w)),
            _ => {
                r.skip(w)?;
                continue;
            }
        };
    }
    Ok(out)
}

/// A `KeyValue`; with `only_read`, None for a key the mapping does not read (its value
/// skipped).
fn pb_key_value(
    b: &[u8],
    only_read: bool,
    depth: usize,
) -> std::result::Result<Option<(String, Value)>, String> {
    let mut r = Reader::new(b);
    let (mut key, mut value): (&[u8], Option<&[u8]>) = (&[], None);
    while let Some((tag, w)) = r.next()? {
        match (tag, w) {
            (1, wire::LEN) => key = r.bytes()?,
            (2, wire::LEN) => value = Some(r.bytes()?),
            (1 | 2, _) => return Err(wire_type("KeyValue", tag, w)),
            _ => r.skip(w)?,
        }
    }
    let key = std::str::from_utf8(key).map_err(|_| "an attribute key: not UTF-8".to_owned())?;
    if only_read && !read_attribute(key) {
        return Ok(None);
    }
    let value = match value {
        Some(v) => pb_any(v, depth)?,
        None => Value::Null,
    };
    Ok(Some((key.to_owned(), value)))
}

/// The attributes of a `Resource` (the mapping's).
fn pb_resource(b: &[u8]) -> std::result::Result<Attributes, String> {
    let mut r = Reader::new(b);
    let mut out = Attributes::default();
    while let Some((tag, w)) = r.next()? {
        match (tag, w) {
            (1, wire::LEN) => out.0.extend(pb_key_value(r.bytes()?, true, 0)?),
            (1, _) => return Err(wire_type("Resource", tag, w)),
            _ => r.skip(w)?,
        }
    }
    Ok(out)
}

fn pb_span(b: &[u8], resource: &Arc<Attributes>) -> std::result::Result<Span, String> {
    use wire::{I64, LEN, VARINT};
    let mut r = Reader::new(b);
    let (mut trace, mut span, mut parent, mut name): (&[u8], &[u8], &[u8], &[u8]) =
        (&[], &[], &[], &[]);
    let (mut start, mut end) = (0, 0);
    let mut attributes = Attributes::default();
    let (mut code, mut message) = (0i64, &[][..]);
    while let Some((tag, w)) = r.next()? {
        match (tag, w) {
            (1, LEN) => trace = r.bytes()?,
            (2, LEN) => span = r.bytes()?,
            (4, LEN) => parent = r.bytes()?,
            (5, LEN) => name = r.bytes()?,
            (7, I64) => start = r.fixed64()?,
            (8, I64) => end = r.fixed64()?,
            (9, LEN) => attributes.0.extend(pb_key_value(r.bytes()?, true, 0)?),
            (15, LEN) => {
                let mut st = Reader::new(r.bytes()?);
                while let Some((t, w)) = st.next()? {
                    match (t, w) {
                        (2, LEN) => message = st.bytes()?,
                        // an int32 enum: negative values are 10-byte varints
                        (3, VARINT) => code = i64::from(st.varint()? as i32),
                        (2 | 3, _) => return Err(wire_type("Status", t, w)),
                        _ => st.skip(w)?,
                    }
                }
            }
            (1 | 2 | 4 | 5 | 7 | 8 | 9 | 15, _) => return Err(wire_type("Span", tag, w)),
            _ => r.skip(w)?,
        }
    }
    let message = std::str::from_utf8(message).map_err(|_| "status message: not UTF-8")?;
    let error = status_error(Some(code), Some(message), &attributes);
    Ok(Span {
        trace_id: id_of_bytes(trace, "traceId")?,
        span_id: id_of_bytes(span, "spanId")?,
        parent_id: (!parent.is_empty())
            .then(|| id_of_bytes(parent, "parentSpanId"))
            .transpose()?,
        name: wire::text(name, "span name")?,
        start_ns: start,
        end_ns: end,
        attributes,
        resource: Arc::clone(resource),
        error,
    })
}

/// The spans of an OTLP protobuf message (`TracesData`, or an
/// `ExportTraceServiceRequest`: the same field 1).
pub fn decode_proto(bytes: &[u8]) -> std::result::Result<Vec<Span>, String> {
    spans_of_proto(bytes).map_err(|e| format!("not OTLP protobuf: {e}"))
}

fn spans_of_proto(bytes: &[u8]) -> std::result::Result<Vec<Span>, String> {
    let mut out = Vec::new();
    let mut top = Reader::new(bytes);
    while let Some((tag, w)) = top.next()? {
        match (tag, w) {
            (1, wire::LEN) => {
                // the resource may come after its spans: find both first
                let mut rs = Reader::new(top.bytes()?);
                let mut resource = Attributes::default();
                let mut scopes = Vec::new();
                while let Some((t, w)) = rs.next()? {
                    match (t, w) {
                        (1, wire::LEN) => resource = pb_resource(rs.bytes()?)?,
                        (2, wire::LEN) => scopes.push(rs.bytes()?),
                        (1 | 2, _) => return Err(wire_type("ResourceSpans", t, w)),
                        _ => rs.skip(w)?,
                    }
                }
                let resource = Arc::new(resource);
                for scope in scopes {
                    let mut ss = Reader::new(scope);
                    while let Some((t, w)) = ss.next()? {
                        match (t, w) {
                            (2, wire::LEN) => out.push(pb_span(ss.bytes()?, &resource)?),
                            (2, _) => return Err(wire_type("ScopeSpans", t, w)),
                            _ => ss.skip(w)?,
                        }
                    }
                }
            }
            (1, _) => return Err(wire_type("TracesData", tag, w)),
            _ => top.skip(w)?,
        }
    }
    Ok(out)
}

fn id_of_bytes<const N: usize>(b: &[u8], what: &str) -> std::result::Result<[u8; N], String> {
    b.try_into()
        .map_err(|_| format!("{what}: {} bytes (expected {N})", b.len()))
}

fn status_error(
    code: Option<i64>,
    message: Option<&str>,
    attributes: &Attributes,
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

/// A list of `{key, value}`: each pair the mapping reads (with `only_read`), or all.
fn json_pairs(
    v: &Value,
    path: &str,
    only_read: bool,
) -> std::result::Result<Vec<(String, Value)>, String> {
    let mut out = Vec::new();
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
        if only_read && !read_attribute(key) {
            continue;
        }
        let value = match kv.get("value") {
            Some(v) => json_value(v, &format!("{path}[{i}].value"))?,
            None => Value::Null,
        };
        out.push((key.to_owned(), value));
    }
    Ok(out)
}

fn json_attributes(v: &Value, path: &str) -> std::result::Result<Map<String, Value>, String> {
    Ok(json_pairs(v, path, false)?.into_iter().collect())
}

fn json_read_attributes(v: &Value, path: &str) -> std::result::Result<Attributes, String> {
    json_pairs(v, path, true).map(Attributes)
}

/// An OTLP/JSON id: hex (either case), empty or absent None.
fn hex_id<const N: usize>(s: &str, path: &str) -> std::result::Result<Option<[u8; N]>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let mut out = [0u8; N];
    match hex::decode_to_slice(s, &mut out) {
        Ok(()) => Ok(Some(out)),
        Err(_) => Err(format!(
            "{path}: {:?} is not {} hex digits (OTLP/JSON ids are hex, not base64)",
            crate::text::excerpt(s, 40),
            N * 2
        )),
    }
}

fn json_id<const N: usize>(
    v: Option<&Value>,
    path: &str,
) -> std::result::Result<Option<[u8; N]>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => hex_id(s, path),
        _ => Err(format!("{path}: expected a hex string")),
    }
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
        let resource = Arc::new(json_read_attributes(
            rs.pointer("/resource/attributes").unwrap_or(&Value::Null),
            &format!("{rpath}.resource.attributes"),
        )?);
        let scopes = rs.get("scopeSpans").and_then(Value::as_array);
        for (s, ss) in scopes.into_iter().flatten().enumerate() {
            let spans = ss.get("spans").and_then(Value::as_array);
            for (k, sp) in spans.into_iter().flatten().enumerate() {
                let path = format!("{rpath}.scopeSpans[{s}].spans[{k}]");
                let attributes = json_read_attributes(
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
                    trace_id: json_id(sp.get("traceId"), &format!("{path}.traceId"))?
                        .ok_or_else(|| format!("{path}.traceId: missing"))?,
                    span_id: json_id(sp.get("spanId"), &format!("{path}.spanId"))?
                        .ok_or_else(|| format!("{path}.spanId: missing"))?,
                    parent_id: json_id(sp.get("parentSpanId"), &format!("{path}.parentSpanId"))?,
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

/// The spans of an OTLP/JSON message's bytes. It is read straight into spans (borrowing
/// its text, skipping attributes the mapping does not read); a message that reading
/// refuses is read again as a JSON value by [`decode_json`], whose error names the field —
/// or whose leniency (a `name` that is not text, say) it keeps: the two give the same
/// spans whenever the first succeeds.
pub fn decode_json_bytes(bytes: &[u8]) -> std::result::Result<Vec<Span>, String> {
    if let Ok(spans) = typed::decode(bytes) {
        return Ok(spans);
    }
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not OTLP/JSON: {e}"))?;
    decode_json(&v)
}

/// OTLP/JSON read straight into spans.
mod typed {
    use std::borrow::Cow;
    use std::fmt;
    use std::sync::Arc;

    use serde::Deserialize;
    use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Value};

    use super::{Attributes, Span, hex_id, read_attribute, status_error};

    #[derive(Deserialize)]
    struct Data<'a> {
        #[serde(rename = "resourceSpans", borrow)]
        resource_spans: Vec<ResourceSpans<'a>>,
    }

    #[derive(Deserialize)]
    struct ResourceSpans<'a> {
        #[serde(default)]
        resource: Option<Resource>,
        #[serde(rename = "scopeSpans", borrow, default)]
        scope_spans: Option<Vec<ScopeSpans<'a>>>,
    }

    #[derive(Deserialize)]
    struct Resource {
        #[serde(default)]
        attributes: Option<Pairs<true>>,
    }

    #[derive(Deserialize)]
    struct ScopeSpans<'a> {
        #[serde(borrow, default)]
        spans: Option<Vec<JSpan<'a>>>,
    }

    #[derive(Deserialize)]
    struct JSpan<'a> {
        #[serde(rename = "traceId", borrow, default)]
        trace_id: Option<Text<'a>>,
        #[serde(rename = "spanId", borrow, default)]
        span_id: Option<Text<'a>>,
        #[serde(rename = "parentSpanId", borrow, default)]
        parent_span_id: Option<Text<'a>>,
        #[serde(borrow, default)]
        name: Option<Text<'a>>,
        #[serde(rename = "startTimeUnixNano", default)]
        start: Nanos,
        #[serde(rename = "endTimeUnixNano", default)]
        end: Nanos,
        #[serde(default)]
        attributes: Option<Pairs<true>>,
        #[serde(borrow, default)]
        status: Option<Status<'a>>,
    }

    #[derive(Deserialize)]
    struct Status<'a> {
        #[serde(default)]
        code: Int,
        #[serde(borrow, default)]
        message: Option<Text<'a>>,
    }

    /// A 64-bit unsigned integer as OTLP/JSON writes it (a decimal string or a number);
    /// anything else none (as `super::uint`).
    #[derive(Default)]
    struct Nanos(Option<u64>);

    impl<'de> Deserialize<'de> for Nanos {
        fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Nanos;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("an integer")
                }
                fn visit_u64<E>(self, v: u64) -> Result<Nanos, E> {
                    Ok(Nanos(Some(v)))
                }
                fn visit_i64<E>(self, v: i64) -> Result<Nanos, E> {
                    Ok(Nanos(u64::try_from(v).ok()))
                }
                fn visit_f64<E>(self, _: f64) -> Result<Nanos, E> {
                    Ok(Nanos(None))
                }
                fn visit_bool<E>(self, _: bool) -> Result<Nanos, E> {
                    Ok(Nanos(None))
                }
                fn visit_unit<E>(self) -> Result<Nanos, E> {
                    Ok(Nanos(None))
                }
                fn visit_str<E>(self, v: &str) -> Result<Nanos, E> {
                    Ok(Nanos(v.parse().ok()))
                }
            }
            d.deserialize_any(V)
        }
    }

    /// A 64-bit signed integer (a decimal string or a number); anything else none (as
    /// `super::int`).
    #[derive(Default)]
    struct Int(Option<i64>);

    impl<'de> Deserialize<'de> for Int {
        fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Int;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("an integer")
                }
                fn visit_u64<E>(self, v: u64) -> Result<Int, E> {
                    Ok(Int(i64::try_from(v).ok()))
                }
                fn visit_i64<E>(self, v: i64) -> Result<Int, E> {
                    Ok(Int(Some(v)))
                }
                fn visit_f64<E>(self, _: f64) -> Result<Int, E> {
                    Ok(Int(None))
                }
                fn visit_bool<E>(self, _: bool) -> Result<Int, E> {
                    Ok(Int(None))
                }
                fn visit_unit<E>(self) -> Result<Int, E> {
                    Ok(Int(None))
                }
                fn visit_str<E>(self, v: &str) -> Result<Int, E> {
                    Ok(Int(v.parse().ok()))
                }
            }
            d.deserialize_any(V)
        }
    }

    /// A list of `{key, value}`: with `ONLY_READ`, the pairs the mapping reads.
    struct Pairs<const ONLY_READ: bool>(Vec<(String, Value)>);

    impl<'de, const ONLY_READ: bool> Deserialize<'de> for Pairs<ONLY_READ> {
        fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<const R: bool>;
            impl<'de, const R: bool> Visitor<'de> for V<R> {
                type Value = Pairs<R>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a list of {key, value}")
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Pairs<R>, A::Error> {
                    let mut out = Vec::new();
                    while let Some(p) = seq.next_element_seed(Pair { only_read: R })? {
                        out.extend(p);
                    }
                    Ok(Pairs(out))
                }
            }
            d.deserialize_seq(V::<ONLY_READ>)
        }
    }

    struct Pair {
        only_read: bool,
    }

    impl<'de> DeserializeSeed<'de> for Pair {
        type Value = Option<(String, Value)>;
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for Pair {
        type Value = Option<(String, Value)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("{key, value}")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut key: Option<Cow<'de, str>> = None;
            // the value: read, or skipped (its key known and not read)
            let mut value: Option<Option<Value>> = None;
            while let Some(k) = m.next_key::<Text<'de>>()?.map(|t| t.0) {
                match &*k {
                    "key" if key.is_none() => {
                        key = Some(m.next_value::<Text<'de>>()?.0);
                    }
                    "value" if value.is_none() => {
                        let skip =
                            self.only_read && key.as_deref().is_some_and(|k| !read_attribute(k));
                        value = Some(if skip {
                            m.next_value::<IgnoredAny>()?;
                            None
                        } else {
                            Some(m.next_value_seed(Any)?)
                        });
                    }
                    // a field twice: the slow reading decides
                    "key" | "value" => return Err(de::Error::custom("a field twice")),
                    _ => {
                        m.next_value::<IgnoredAny>()?;
                    }
                }
            }
            let key = key.ok_or_else(|| de::Error::missing_field("key"))?;
            if self.only_read && !read_attribute(&key) {
                return Ok(None);
            }
            Ok(Some((
                key.into_owned(),
                value.flatten().unwrap_or(Value::Null),
            )))
        }
    }

    /// An `AnyValue` as JSON (as `super::json_value`).
    struct Any;

    impl<'de> DeserializeSeed<'de> for Any {
        type Value = Value;
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for Any {
        type Value = Value;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an AnyValue object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Value, A::Error> {
            let Some(kind) = m.next_key::<Text<'de>>()?.map(|t| t.0) else {
                return Ok(Value::Null);
            };
            let out = match &*kind {
                "stringValue" => Value::String(m.next_value::<Text<'de>>()?.0.into_owned()),
                "boolValue" => Value::Bool(m.next_value()?),
                "intValue" => match m.next_value::<Int>()?.0 {
                    Some(i) => Value::from(i),
                    None => return Err(de::Error::custom("intValue: not an integer")),
                },
                "doubleValue" => m.next_value::<Double>()?.0,
                "arrayValue" => Value::Array(m.next_value::<Values<Array>>()?.0.0),
                "kvlistValue" => Value::Object(m.next_value::<Values<KvList>>()?.0.0),
                "bytesValue" => Value::String(m.next_value::<Text<'de>>()?.0.into_owned()),
                _ => {
                    m.next_value::<IgnoredAny>()?;
                    Value::Null
                }
            };
            // the first field decides (as a JSON value's first key); one given twice,
            // the slow reading decides
            while let Some(k) = m.next_key::<Text<'de>>()?.map(|t| t.0) {
                if k == kind {
                    return Err(de::Error::custom("a field twice"));
                }
                m.next_value::<IgnoredAny>()?;
            }
            Ok(out)
        }
    }

    /// `doubleValue`: a number, or the text of NaN and the infinities.
    struct Double(Value);

    impl<'de> Deserialize<'de> for Double {
        fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Double;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a number")
                }
                fn visit_u64<E>(self, v: u64) -> Result<Double, E> {
                    Ok(Double(Value::from(v as f64)))
                }
                fn visit_i64<E>(self, v: i64) -> Result<Double, E> {
                    Ok(Double(Value::from(v as f64)))
                }
                fn visit_f64<E>(self, v: f64) -> Result<Double, E> {
                    Ok(Double(Value::from(v)))
                }
                fn visit_str<E>(self, v: &str) -> Result<Double, E> {
                    Ok(Double(Value::String(v.to_owned())))
                }
            }
            d.deserialize_any(V)
        }
    }

    /// `{"values": [...]}` of an array or a key-value list; other fields ignored.
    struct Values<T>(T);
    #[derive(Default)]
    struct Array(Vec<Value>);
    #[derive(Default)]
    struct KvList(Map<String, Value>);

    impl<'de> Deserialize<'de> for Array {
        fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Array;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a list of AnyValue")
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Array, A::Error> {
                    let mut out = Vec::new();
                    while let Some(v) = seq.next_element_seed(Any)? {
                        out.push(v);
                    }
                    Ok(Array(out))
                }
            }
            d.deserialize_seq(V)
        }
    }

    impl<'de> Deserialize<'de> for KvList {
        fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            Ok(KvList(
                Pairs::<false>::deserialize(d)?.0.into_iter().collect(),
            ))
        }
    }

    impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Values<T> {
        fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<T>(std::marker::PhantomData<T>);
            impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for V<T> {
                type Value = Values<T>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("{values}")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Values<T>, A::Error> {
                    let mut values = None;
                    while let Some(k) = m.next_key::<Text<'de>>()?.map(|t| t.0) {
                        if k == "values" {
                            if values.is_some() {
                                return Err(de::Error::custom("a field twice"));
                            }
                            values = Some(m.next_value::<Option<T>>()?.unwrap_or_default());
                        } else {
                            m.next_value::<IgnoredAny>()?;
                        }
                    }
                    Ok(Values(values.unwrap_or_default()))
                }
            }
            d.deserialize_map(V(std::marker::PhantomData))
        }
    }

    /// A string, borrowed from the message unless it holds escapes.
    struct Text<'a>(Cow<'a, str>);

    impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
        fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<'a>(std::marker::PhantomData<&'a ()>);
            impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
                type Value = Text<'a>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a string")
                }
                fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'a>, E> {
                    Ok(Text(Cow::Borrowed(v)))
                }
                fn visit_str<E>(self, v: &str) -> Result<Text<'a>, E> {
                    Ok(Text(Cow::Owned(v.to_owned())))
                }
                fn visit_string<E>(self, v: String) -> Result<Text<'a>, E> {
                    Ok(Text(Cow::Owned(v)))
                }
            }
            d.deserialize_str(V(std::marker::PhantomData))
        }
    }

    fn id<const N: usize>(v: Option<&str>) -> Result<Option<[u8; N]>, String> {
        v.map_or(Ok(None), |s| hex_id(s, ""))
    }

    /// The spans of a message; an error only says that the slow reading should decide.
    pub fn decode(bytes: &[u8]) -> Result<Vec<Span>, String> {
        let data: Data = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for rs in data.resource_spans {
            let resource = Arc::new(Attributes(
                rs.resource
                    .and_then(|r| r.attributes)
                    .map(|p| p.0)
                    .unwrap_or_default(),
            ));
            for ss in rs.scope_spans.into_iter().flatten() {
                for sp in ss.spans.into_iter().flatten() {
                    let attributes = Attributes(sp.attributes.map(|p| p.0).unwrap_or_default());
                    let error = status_error(
                        sp.status.as_ref().and_then(|s| s.code.0),
                        sp.status
                            .as_ref()
                            .and_then(|s| s.message.as_ref().map(|t| &*t.0)),
                        &attributes,
                    );
                    out.push(Span {
                        trace_id: id(sp.trace_id.as_ref().map(|t| &*t.0))?
                            .ok_or("traceId: missing")?,
                        span_id: id(sp.span_id.as_ref().map(|t| &*t.0))?
                            .ok_or("spanId: missing")?,
                        parent_id: id(sp.parent_span_id.as_ref().map(|t| &*t.0))?,
                        name: sp.name.map(|t| t.0.into_owned()).unwrap_or_default(),
                        start_ns: sp.start.0.unwrap_or(0),
                        end_ns: sp.end.0.unwrap_or(0),
                        attributes,
                        resource: Arc::clone(&resource),
                        error,
                    });
                }
            }
        }
        Ok(out)
    }
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
        Some(b'{') => decode_json_bytes(&bytes),
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
            // one document (pretty-printed), or JSON lines (the first line's value is
            // followed by more)
            if serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok() {
                spans = decode_json_bytes(&bytes).map_err(|m| bad(1, m))?;
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
                    match decode_json_bytes(line) {
                        Ok(s) => spans.extend(s),
                        Err(m) => {
                            // not JSON at all (looked at only on failure): most likely cut
                            // short
                            let m = match serde_json::from_slice::<serde::de::IgnoredAny>(line) {
                                Err(e) => format!(
                                    "not OTLP/JSON (a line cut short by a collector still writing?): {e}"
                                ),
                                Ok(_) => m,
                            };
                            return Err(bad(n, m));
                        }
                    }
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
pub fn trace_id(run_id: &str, key: &str) -> [u8; 16] {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("pieval-trace\0{run_id}\0{key}").as_bytes());
    d[..16].try_into().expect("16 bytes")
}

/// The `traceparent` header of attempt `key` of run `run_id` (sampled).
pub fn traceparent(run_id: &str, key: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("pieval-span\0{run_id}\0{key}").as_bytes());
    format!(
        "00-{}-{}-01",
        hex::encode(trace_id(run_id, key)),
        hex::encode(&d[..8])
    )
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
    for (k, v) in a.iter() {
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
    let by_id: AHashMap<[u8; 8], &Span> = sorted.iter().map(|s| (s.span_id, *s)).collect();
    let executed: Vec<(&Span, Call)> = sorted
        .iter()
        .filter_map(|s| execution(s).map(|c| (*s, c)))
        .collect();
    let names: AHashMap<[u8; 8], &str> = executed
        .iter()
        .map(|(s, c)| (s.span_id, c.name.as_str()))
        .collect();
    let mut out = Vec::new();
    for (s, c) in &executed {
        // the same call recorded twice (execute_tool and its MCP client span): the
        // outer one is kept, with what the inner one knows
        let mut p = s.parent_id;
        let mut nested = false;
        let mut depth = 0;
        while let Some(id) = p {
            if names.get(&id) == Some(&c.name.as_str()) {
                nested = true;
                break;
            }
            depth += 1;
            if depth > 256 {
                break;
            }
            p = by_id.get(&id).and_then(|x| x.parent_id);
        }
        if !nested {
            out.push((s.span_id, c.clone()));
        }
    }
    // what an inner span knows and the outer does not (the result, the id)
    for (s, c) in &executed {
        if let Some(parent) = s.parent_id
            && let Some((_, outer)) = out
                .iter_mut()
                .find(|(id, o)| *id == parent && o.name == c.name)
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
fn named<'s>(s: &'s Span, by_id: &AHashMap<[u8; 8], &'s Span>) -> Option<&'s str> {
    let find = |m: &'s Attributes| {
        ["pieval.attempt_id", "pieval.case_id"]
            .iter()
            .find_map(|k| m.get(k).and_then(Value::as_str))
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
        cur = x.parent_id.and_then(|p| by_id.get(&p).copied());
    }
    find(&s.resource)
}

/// Spans grouped by attempt key: the key they name, else the attempt whose trace id
/// (`traces`: trace id → key) is theirs. Spans of neither are counted, not kept.
pub fn by_attempt<'s>(
    spans: &'s [Span],
    traces: &HashMap<[u8; 16], String>,
) -> (BTreeMap<String, Vec<&'s Span>>, u64) {
    let by_id: AHashMap<[u8; 8], &Span> = spans.iter().map(|s| (s.span_id, s)).collect();
    let keys: Vec<Option<&str>> = spans.iter().map(|s| named(s, &by_id)).collect();
    // a trace named by one of its spans is that attempt's, all of it
    let mut trace_key: AHashMap<[u8; 16], &str> = AHashMap::new();
    for (s, k) in spans.iter().zip(&keys) {
        if let Some(k) = k {
            trace_key.entry(s.trace_id).or_insert(k);
        }
    }
    let mut groups: AHashMap<&str, Vec<&Span>> = AHashMap::new();
    let mut unmatched = 0;
    for (s, k) in spans.iter().zip(keys) {
        let key = k
            .or_else(|| trace_key.get(&s.trace_id).copied())
            .or_else(|| traces.get(&s.trace_id).map(String::as_str));
        match key {
            Some(k) => groups.entry(k).or_default().push(s),
            None => unmatched += 1,
        }
    }
    let out = groups.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
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
        assert_eq!(spans[0].trace_hex(), "5b8efff798038103d269b633813fc60c");
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
    fn the_direct_readings_give_the_value_readings_spans() {
        // OTLP/JSON read straight equals it read as a value, whatever the message holds
        let attrs = vec![
            kv("gen_ai.operation.name", json!("execute_tool")),
            json!({"key": "gen_ai.tool.name", "value": {"stringValue": "send_money \"x\""}}),
            json!({"value": {"intValue": 7}, "key": "gen_ai.tool.call.id"}),
            json!({"key": "gen_ai.tool.call.arguments", "value": {"kvlistValue": {"values": [
                {"key": "to", "value": {"arrayValue": {"values": [{"doubleValue": 2}, {"doubleValue": "NaN"},
                    {"boolValue": true}, {"bytesValue": "AAE="}, {}]}}},
                {"key": "n", "value": {"intValue": "-3"}}]}}}),
            json!({"key": "gen_ai.usage.input_tokens", "value": {"intValue": "12"}}),
            // not read, so not checked
            json!({"key": "server.address", "value": {"nonsense": [1, 2]}}),
            json!({"key": "error.type", "value": {"stringValue": "Timeout"}}),
            json!({"key": "llm.output_messages.0.message.tool_calls.0.tool_call.function.name", "value": {"stringValue": "f"}}),
        ];
        let mut sp = span("00000000000000AB", Some("00000000000000ac"), 5, attrs);
        sp["status"] = json!({"code": "2", "message": "denied"});
        sp["startTimeUnixNano"] = json!(5);
        sp["events"] = json!([{"name": "e"}]);
        let mut lenient = span("0000000000000002", None, 1, vec![]);
        lenient["name"] = json!(17);
        lenient["endTimeUnixNano"] = json!(-1);
        for d in [
            doc(vec![sp.clone()]),
            doc(vec![lenient]),
            json!({"resourceSpans": [{"scopeSpans": [{"spans": [sp.clone()]}], "resource": null}]}),
            json!({"resourceSpans": [{"scopeSpans": "none"}]}),
        ] {
            let bytes = d.to_string().into_bytes();
            let slow = decode_json(&d).unwrap();
            assert_eq!(decode_json_bytes(&bytes).unwrap(), slow, "{d}");
        }
        // and the direct reading is the one that read the well-formed message
        let spans = decode_json(&doc(vec![sp.clone()])).unwrap();
        assert_eq!(
            typed::decode(doc(vec![sp]).to_string().as_bytes()).unwrap(),
            spans
        );
        let a = &spans[0].attributes;
        assert_eq!(a.get("gen_ai.tool.name"), Some(&json!("send_money \"x\"")));
        assert_eq!(a.get("gen_ai.tool.call.id"), Some(&json!(7)));
        assert_eq!(
            a.get("gen_ai.tool.call.arguments"),
            Some(&json!({"to": [2.0, "NaN", true, "AAE=", null], "n": -3}))
        );
        assert!(a.get("gen_ai.usage.input_tokens").is_none() && a.get("server.address").is_none());
        assert_eq!(spans[0].error.as_deref(), Some("denied"));
        assert_eq!(spans[0].parent_id, Some([0, 0, 0, 0, 0, 0, 0, 0xac]));
        // refused the same way: the field named
        for bad in [
            json!({"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "0000000000000001"}]}]}]}),
            doc(vec![span(
                "0000000000000001",
                None,
                1,
                vec![json!({"key": "tool.name", "value": {"intValue": "x"}})],
            )]),
        ] {
            let e = decode_json_bytes(bad.to_string().as_bytes()).unwrap_err();
            assert_eq!(e, decode_json(&bad).unwrap_err());
            assert!(e.contains("spans[0]"), "{e}");
        }

        // protobuf: every value kind, the resource after its spans, an attribute not read
        let sv = |v: &str| AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        };
        let pair = |k: &str, v: AnyValue| KeyValue {
            key: k.into(),
            value: Some(v),
        };
        let nested = AnyValue {
            value: Some(any_value::Value::KvlistValue(KeyValueList {
                values: vec![
                    pair(
                        "i",
                        AnyValue {
                            value: Some(any_value::Value::IntValue(-4)),
                        },
                    ),
                    pair(
                        "d",
                        AnyValue {
                            value: Some(any_value::Value::DoubleValue(0.5)),
                        },
                    ),
                    pair(
                        "b",
                        AnyValue {
                            value: Some(any_value::Value::BoolValue(true)),
                        },
                    ),
                    pair(
                        "x",
                        AnyValue {
                            value: Some(any_value::Value::BytesValue(vec![0, 1])),
                        },
                    ),
                    pair(
                        "a",
                        AnyValue {
                            value: Some(any_value::Value::ArrayValue(ArrayValue {
                                values: vec![sv("u"), AnyValue { value: None }],
                            })),
                        },
                    ),
                ],
            })),
        };
        let span = PbSpan {
            trace_id: vec![7; 16],
            span_id: vec![8; 8],
            parent_span_id: vec![9; 8],
            name: "execute_tool t".into(),
            start_time_unix_nano: 3,
            end_time_unix_nano: 4,
            attributes: vec![
                pair("gen_ai.tool.call.arguments", nested),
                pair("gen_ai.system", sv("openai")),
                pair("gen_ai.operation.name", sv("execute_tool")),
            ],
            status: Some(Status {
                message: "m".into(),
                code: 2,
            }),
        };
        let mut bytes = ResourceSpans {
            resource: None,
            scope_spans: vec![ScopeSpans { spans: vec![span] }],
        }
        .encode_to_vec();
        bytes.extend(
            ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![pair("pieval.case_id", sv("c9"))],
                }),
                scope_spans: vec![],
            }
            .encode_to_vec(),
        );
        // one ResourceSpans given in two parts merges (protobuf's rule for a message
        // field given twice): here the same field 1 twice is two ResourceSpans, so
        // wrap them into one
        let mut msg = Vec::new();
        msg.push(0x0a);
        prost::encoding::encode_varint(bytes.len() as u64, &mut msg);
        msg.extend(&bytes);
        let spans = decode_proto(&msg).unwrap();
        assert_eq!(spans.len(), 1);
        let sp = &spans[0];
        assert_eq!(
            (sp.trace_id, sp.span_id, sp.parent_id),
            ([7; 16], [8; 8], Some([9; 8]))
        );
        assert_eq!(sp.resource.get("pieval.case_id"), Some(&json!("c9")));
        assert_eq!(
            sp.attributes.get("gen_ai.tool.call.arguments"),
            Some(&json!({"i": -4, "d": 0.5, "b": true, "x": "AAE=", "a": ["u", null]}))
        );
        assert!(sp.attributes.get("gen_ai.system").is_none());
        assert_eq!(sp.error.as_deref(), Some("m"));
        // hostile: cut short, nested past the limit, a known field's wrong wire type
        assert!(
            decode_proto(&msg[..msg.len() - 3])
                .unwrap_err()
                .contains("cut short")
        );
        let mut deep = sv("x");
        for _ in 0..100 {
            deep = AnyValue {
                value: Some(any_value::Value::ArrayValue(ArrayValue {
                    values: vec![deep],
                })),
            };
        }
        let deep = TracesData {
            resource_spans: vec![ResourceSpans {
                resource: None,
                scope_spans: vec![ScopeSpans {
                    spans: vec![PbSpan {
                        trace_id: vec![1; 16],
                        span_id: vec![1; 8],
                        attributes: vec![pair("input.value", deep)],
                        ..Default::default()
                    }],
                }],
            }],
        };
        let e = decode_proto(&deep.encode_to_vec()).unwrap_err();
        assert!(e.contains("nested"), "{e}");
        assert!(
            decode_proto(&[0x08, 0x01])
                .unwrap_err()
                .contains("wire type")
        );
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
        assert_eq!(parts[1], hex::encode(trace_id("run-1", "case-a")));
        assert_ne!(trace_id("run-1", "case-a"), trace_id("run-2", "case-a"));
        assert_eq!(t, traceparent("run-1", "case-a"));
    }
}
