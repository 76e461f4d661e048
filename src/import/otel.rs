//! `pieval import otel`: an agent's OpenTelemetry traces (docs/import.md, "Traces"),
//! read and mapped by [`crate::agent::otel`], joined to the cases of `--cases` they answer
//! and decided over the calls they hold. `--trace-run RUN_ID` joins spans that carry the
//! `traceparent` pieval sent with that run's attempts.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde_json::json;

use super::{At, Importer, Row, Sink};
use crate::agent::otel::{by_attempt, calls_of, read_file, trace_id};
use crate::error::{Error, Result};
use crate::rundir::checkpoint::PredictionRecord;

pub const IMPORTER: Importer = Importer {
    name: "otel",
    reads: "OpenTelemetry traces (OTLP/JSON lines or protobuf, as the collector's `file` exporter writes them, zstd or not), of an agent run against `--cases`",
    verdict: "none: pieval decides each case of `--cases` over the tool calls its spans hold",
    import,
};

// ---------------------------------------------------------------------------------------
// The importer.

fn import(path: &Path, sink: &mut Sink) -> Result<()> {
    let files: Vec<_> = super::files_under(path)?;
    if files.is_empty() {
        return Err(Error::Usage(format!(
            "{}: no trace file in it",
            path.display()
        )));
    }
    let mut spans = Vec::new();
    for f in &files {
        spans.extend(read_file(f)?);
    }
    // a span exported twice (a retried export) is one span
    let mut seen = HashSet::new();
    spans.retain(|s| seen.insert((s.trace_id, s.span_id)));
    let traces: HashMap<[u8; 16], String> = match sink.trace_run() {
        Some(run) => sink
            .known_case_ids()
            .into_iter()
            .map(|k| (trace_id(&run, &k), k))
            .collect(),
        None => HashMap::new(),
    };
    let (groups, unmatched) = by_attempt(&spans, &traces);
    sink.setup("otel:spans", json!(spans.len()));
    sink.setup("otel:spans_of_no_case", json!(unmatched));
    if groups.is_empty() {
        return Err(Error::Usage(format!(
            "{}: {} spans, none of them an attempt's: set the attribute pieval.case_id (or pieval.attempt_id) on the agent's spans or resource, or give --trace-run RUN_ID for traces that carry the traceparent pieval sent",
            path.display(),
            spans.len()
        )));
    }
    let at0 = At::line(path, 0);
    for (key, group) in groups {
        let Some(case) = sink.known_case(&key) else {
            return Err(at0.error(
                None,
                format!(
                    "spans of attempt {key:?}: no such case in --cases (the corpus the agent ran)"
                ),
            ));
        };
        let calls = calls_of(&group);
        let first = group.iter().map(|s| s.start_ns).min().unwrap_or(0);
        let last = group.iter().map(|s| s.end_ns).max().unwrap_or(first);
        let trace = group[0].trace_hex();
        let prompt = case.prompt.clone();
        let payload = case.task_input.clone().filter(|_| !case.is_benign());
        // delivered when a result the agent received held the payload (results are
        // opt-in in the conventions: without any, undecided)
        let any_output = calls.iter().any(|c| c.output.is_some());
        let delivered = payload.as_deref().filter(|_| any_output).map(|p| {
            calls.iter().any(|c| {
                c.output
                    .as_deref()
                    .is_some_and(|o| crate::agent::run::holds(o, p))
            })
        });
        let cid = sink.case(&at0, &case)?;
        let mut p = PredictionRecord {
            case_id: cid,
            provider: "otel".into(),
            request_prompt: Some(prompt.clone()),
            latency_ms: Some(last.saturating_sub(first) as f64 / 1e6),
            injection_delivered: delivered,
            source_id: Some(trace),
            ..PredictionRecord::default()
        };
        let answers = calls
            .into_iter()
            .map(|c| super::Answer {
                text: None,
                calls: vec![c],
            })
            .collect();
        super::agent_attempt(&mut p, &prompt, answers, "answer");
        // the calls' store is not in the spans: the criteria over the calls decide
        p.final_state = None;
        sink.row(
            &at0,
            Row {
                prediction: p,
                scores: Vec::new(),
            },
        )?;
    }
    Ok(())
}
