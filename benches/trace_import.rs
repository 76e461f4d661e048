//! Trace import's speed (issue 54): `pieval import otel` over the spans of A agent
//! attempts (10 spans each: the agent's `invoke_agent` span naming its case, 3 chat spans
//! asking for calls, 3 `execute_tool` spans each with its MCP client span inside), written
//! as the OpenTelemetry collector's file exporter writes them — protobuf (length-prefixed)
//! and OTLP/JSON lines, in batches of 512 spans — against a corpus of A cases. Two
//! figures per format: the reading stage in this process (decode, group by attempt, map
//! to calls: `pieval::agent::otel`), and the whole `pieval import otel` process (also
//! writing the run folder and scoring it), with its peak RSS. Goal: ≥ 500,000 spans/s.
//!
//! Beside it, in the same run, a peer on the same protobuf file: the OpenTelemetry Python
//! SDK's generated protobuf classes (`opentelemetry-proto`) decoding it and grouping the
//! tool spans per case, a loop of the kind a team writes today
//! (benches/support/otel_python_read.py); the ratio printed.
//!
//! Usage: cargo bench --bench trace_import [-- --attempts 20000] [--keep DIR]
//! (`--keep DIR` writes the corpus, span files and run folders into DIR and leaves them,
//! to profile `pieval import otel` on them afterwards.)
//! The peer: PIEVAL_AGENTS_PYTHON (set by .ci/run) or python3 with opentelemetry-proto.

use std::io::Write;

use pieval::agent::otel::{
    AnyValue, KeyValue, PbSpan, Resource, ResourceSpans, ScopeSpans, Status, TracesData, any_value,
};
use prost::Message;

#[path = "support/args.rs"]
mod args;
#[path = "support/child.rs"]
mod child;
#[path = "support/corpus.rs"]
mod corpus;
use args::{arg, text_arg};

fn s(key: &str, v: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
    }
}

/// The spans of attempt `i` (10).
fn attempt(i: usize) -> Vec<PbSpan> {
    let trace: Vec<u8> = (0..16)
        .map(|k| ((i >> (k % 4 * 8)) as u8) ^ k as u8)
        .collect();
    let id = |n: usize| -> Vec<u8> {
        let mut b = (i as u64).to_be_bytes().to_vec();
        b[0] = n as u8 + 1;
        b
    };
    let t0 = 1_700_000_000_000_000_000u64 + i as u64 * 1_000_000;
    let mut out = vec![PbSpan {
        trace_id: trace.clone(),
        span_id: id(0),
        name: "invoke_agent bench".into(),
        start_time_unix_nano: t0,
        end_time_unix_nano: t0 + 900,
        attributes: vec![
            s("gen_ai.operation.name", "invoke_agent"),
            s("pieval.case_id", &format!("agent-steal-{i}")),
        ],
        ..Default::default()
    }];
    let tools = [
        ("read_inbox", "{}".to_owned()),
        ("get_balance", "{}".to_owned()),
        (
            "send_money",
            format!(
                r#"{{"recipient": "{}", "amount": 500}}"#,
                if i % 3 == 0 { "EVIL-IBAN-666" } else { "alice" }
            ),
        ),
    ];
    for (k, (name, args)) in tools.iter().enumerate() {
        let t = t0 + 10 + k as u64 * 100;
        out.push(PbSpan {
            trace_id: trace.clone(),
            span_id: id(1 + 3 * k),
            parent_span_id: id(0),
            name: "chat model".into(),
            start_time_unix_nano: t,
            end_time_unix_nano: t + 20,
            attributes: vec![
                s("gen_ai.operation.name", "chat"),
                s(
                    "gen_ai.output.messages",
                    &format!(
                        r#"[{{"role":"assistant","parts":[{{"type":"tool_call","id":"c{k}","name":"{name}","arguments":{args}}}]}}]"#
                    ),
                ),
            ],
            ..Default::default()
        });
        out.push(PbSpan {
            trace_id: trace.clone(),
            span_id: id(2 + 3 * k),
            parent_span_id: id(0),
            name: format!("execute_tool {name}"),
            start_time_unix_nano: t + 30,
            end_time_unix_nano: t + 60,
            attributes: vec![
                s("gen_ai.operation.name", "execute_tool"),
                s("gen_ai.tool.name", name),
                s("gen_ai.tool.call.id", &format!("c{k}")),
                s("gen_ai.tool.call.arguments", args),
            ],
            status: Some(Status::default()),
            ..Default::default()
        });
        out.push(PbSpan {
            trace_id: trace.clone(),
            span_id: id(3 + 3 * k),
            parent_span_id: id(2 + 3 * k),
            name: format!("tools/call {name}"),
            start_time_unix_nano: t + 35,
            end_time_unix_nano: t + 55,
            attributes: vec![
                s("mcp.method.name", "tools/call"),
                s("gen_ai.tool.name", name),
                s("gen_ai.tool.call.result", "Lunch on Friday? ok"),
            ],
            ..Default::default()
        });
    }
    out
}

/// OTLP/JSON of a batch (hex ids, integers as strings).
fn json_of(data: &TracesData) -> String {
    let kv = |k: &KeyValue| {
        let v = match k.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::StringValue(s)) => serde_json::json!({"stringValue": s}),
            _ => serde_json::json!({}),
        };
        serde_json::json!({"key": k.key, "value": v})
    };
    let spans: Vec<serde_json::Value> = data.resource_spans[0].scope_spans[0]
        .spans
        .iter()
        .map(|sp| {
            serde_json::json!({
                "traceId": hex::encode(&sp.trace_id), "spanId": hex::encode(&sp.span_id),
                "parentSpanId": hex::encode(&sp.parent_span_id), "name": sp.name, "kind": 1,
                "startTimeUnixNano": sp.start_time_unix_nano.to_string(),
                "endTimeUnixNano": sp.end_time_unix_nano.to_string(),
                "attributes": sp.attributes.iter().map(kv).collect::<Vec<_>>(), "status": {}})
        })
        .collect();
    serde_json::json!({"resourceSpans": [{"resource": {"attributes": []},
        "scopeSpans": [{"scope": {"name": "bench"}, "spans": spans}]}]})
    .to_string()
}

fn main() {
    let attempts = arg("--attempts", 20_000);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let kept = text_arg("--keep").map(std::path::PathBuf::from);
    if let Some(k) = &kept {
        std::fs::create_dir_all(k).unwrap();
    }
    let dir = kept.as_deref().unwrap_or(tmp.path());
    // the corpus: the fixture's agent-steal case, once per attempt
    let corpus = dir.join("cases.jsonl");
    corpus::agent_cases(root, &corpus, "agent-steal", attempts);
    let proto = dir.join("spans.bin");
    let json = dir.join("spans.jsonl");
    let mut pf = std::io::BufWriter::new(std::fs::File::create(&proto).unwrap());
    let mut jf = std::io::BufWriter::new(std::fs::File::create(&json).unwrap());
    let mut spans = 0;
    let mut batch = Vec::new();
    let flush = |batch: &mut Vec<PbSpan>,
                 pf: &mut std::io::BufWriter<std::fs::File>,
                 jf: &mut std::io::BufWriter<std::fs::File>| {
        if batch.is_empty() {
            return;
        }
        let data = TracesData {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![s("service.name", "bench-agent")],
                }),
                scope_spans: vec![ScopeSpans {
                    spans: std::mem::take(batch),
                }],
            }],
        };
        let b = data.encode_to_vec();
        pf.write_all(&(b.len() as u32).to_be_bytes()).unwrap();
        pf.write_all(&b).unwrap();
        jf.write_all(json_of(&data).as_bytes()).unwrap();
        jf.write_all(b"\n").unwrap();
    };
    for i in 0..attempts {
        for sp in attempt(i) {
            batch.push(sp);
            spans += 1;
            if batch.len() == 512 {
                flush(&mut batch, &mut pf, &mut jf);
            }
        }
    }
    flush(&mut batch, &mut pf, &mut jf);
    drop((pf, jf));
    let mb = |p: &std::path::Path| std::fs::metadata(p).unwrap().len() as f64 / (1 << 20) as f64;
    // the reading stage alone, in this process: decode, group by attempt, map to calls
    let mut stage = 0.0;
    for (what, file) in [("protobuf", &proto), ("OTLP/JSON", &json)] {
        let start = std::time::Instant::now();
        let read = pieval::agent::otel::read_file(file).unwrap();
        let (groups, unmatched) =
            pieval::agent::otel::by_attempt(&read, &std::collections::HashMap::new());
        let calls: usize = groups
            .values()
            .map(|g| pieval::agent::otel::calls_of(g).len())
            .sum();
        let wall = start.elapsed().as_secs_f64();
        assert_eq!(
            (read.len(), groups.len(), unmatched, calls),
            (spans, attempts, 0, 3 * attempts)
        );
        let rate = spans as f64 / wall;
        if what == "protobuf" {
            stage = rate;
        }
        println!(
            "reading {what} (decode, group by attempt, map to calls): {spans} spans in {wall:.2} s: {rate:.0} spans/s (goal >= 500,000)"
        );
    }
    let mut ours = 0.0;
    for (what, file) in [("protobuf", &proto), ("OTLP/JSON", &json)] {
        let out = dir.join(format!("run-{}", what.replace('/', "-")));
        let (wall, rss) = child::pieval(
            root,
            &[
                "import",
                "otel",
                file.to_str().unwrap(),
                "--cases",
                corpus.to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
                "--json",
            ],
        );
        let rate = spans as f64 / wall;
        if what == "protobuf" {
            ours = rate;
        }
        println!(
            "pieval import otel, {what} ({:.0} MiB): {spans} spans of {attempts} attempts into a scored run folder in {wall:.2} s: {rate:.0} spans/s (goal >= 500,000), peak RSS {rss:.0} MiB",
            mb(file)
        );
    }
    let python = std::env::var("PIEVAL_AGENTS_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = root.join("benches/support/otel_python_read.py");
    let start = std::time::Instant::now();
    let out = std::process::Command::new(&python)
        .arg(&script)
        .arg(&proto)
        .output()
        .expect("python starts");
    let wall = start.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = spans as f64 / wall;
    println!(
        "Python (opentelemetry-proto's classes, a decode-and-group loop, no scoring): {wall:.2} s, {theirs:.0} spans/s — {}",
        String::from_utf8_lossy(&out.stdout).trim()
    );
    println!(
        "ratio: pieval's reading stage {:.2}x the Python loop; the whole import (also written and scored) {:.2}x",
        stage / theirs,
        ours / theirs
    );
}
