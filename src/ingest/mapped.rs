//! Generic sources: JSONL, CSV and Parquet files whose columns are mapped onto contract
//! fields. `--map FIELD=COLUMN` takes a field from a column (for JSONL a dotted path
//! reaches into nested objects); a column named like a contract field is taken as that
//! field without a map; `--set FIELD=VALUE` gives constants (applied last). Unmapped
//! fields default as docs/corpus.md says: `source_name` = `--source-name` or the file stem,
//! `source_type` = public_benchmark, `attack_surface` = user_prompt,
//! `success_criteria` = `{"type":"not_refused"}`, `attack_family` = unspecified, and
//! `case_id` = the source name and a hash of the case's text (stable across runs).
//! Files are streamed: rows are read one at a time (JSONL, CSV) or a batch at a time
//! (Parquet), so a multi-GB file is ingested in bounded memory.

use std::path::Path;

use datafusion::arrow::array::Array;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Map, Value, json};

use super::{Emit, Item, Options, SourceKind, short_hash, slug, upstream_version};
use crate::contract::case::AttackCase;
use crate::contract::criteria::SuccessCriteria;
use crate::contract::fields::{CASE_FIELDS, FieldKind};
use crate::error::{Error, Result};

/// One source row: column → value.
type Row = Map<String, Value>;

fn lookup<'a>(row: &'a Row, column: &str) -> Option<&'a Value> {
    if let Some(v) = row.get(column) {
        return Some(v);
    }
    // A dotted path into nested objects (JSONL).
    let mut parts = column.split('.');
    let mut cur = row.get(parts.next()?)?;
    for p in parts {
        cur = cur.get(p)?;
    }
    Some(cur)
}

/// A field's value from a source value: text stays text; JSON-valued fields accept
/// objects or JSON text.
fn coerce(kind: FieldKind, v: &Value) -> std::result::Result<Option<Value>, String> {
    Ok(match (kind, v) {
        (_, Value::Null) => None,
        (FieldKind::Criteria, Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(j @ Value::Object(_)) => Some(j),
            _ => Some(Value::String(s.clone())),
        },
        (FieldKind::Object | FieldKind::Environment, Value::String(s)) => {
            Some(serde_json::from_str::<Value>(s).map_err(|e| format!("not a JSON object: {e}"))?)
        }
        (FieldKind::Tags, Value::String(s)) => {
            Some(serde_json::from_str::<Value>(s).map_err(|e| format!("not a JSON array: {e}"))?)
        }
        (FieldKind::Probability, Value::String(s)) => Some(json!(
            s.trim()
                .parse::<f64>()
                .map_err(|_| format!("{s:?} is not a number"))?
        )),
        (
            FieldKind::Criteria
            | FieldKind::Object
            | FieldKind::Probability
            | FieldKind::Environment
            | FieldKind::Tags,
            other,
        ) => Some(other.clone()),
        (_, Value::String(s)) if s.is_empty() => None,
        (_, Value::String(s)) => Some(Value::String(s.clone())),
        (_, Value::Number(n)) => Some(Value::String(n.to_string())),
        (_, Value::Bool(b)) => Some(Value::String(b.to_string())),
        (_, other) => {
            return Err(format!(
                "expected text, found {}",
                crate::contract::criteria::json_kind(other)
            ));
        }
    })
}

struct Mapper<'a> {
    opts: &'a Options,
    file: &'a Path,
    source_name: String,
    version: String,
    adapter: &'static str,
}

impl Mapper<'_> {
    /// Build the case of one row, or say which field is wrong.
    fn case(
        &self,
        row: &Row,
        reference: &str,
    ) -> std::result::Result<Map<String, Value>, (Option<String>, String)> {
        let mut obj = Map::new();
        for spec in CASE_FIELDS {
            let column = self
                .opts
                .maps
                .iter()
                .find(|(f, _)| f == spec.name)
                .map(|(_, c)| c.as_str());
            let value = match column {
                Some(c) => match lookup(row, c) {
                    Some(v) => Some(v),
                    None => {
                        return Err((
                            Some(spec.name.to_owned()),
                            format!("the mapped column {c:?} is not in the record"),
                        ));
                    }
                },
                None => row.get(spec.name),
            };
            if let Some(v) = value {
                match coerce(spec.kind, v) {
                    Ok(Some(v)) => {
                        obj.insert(spec.name.to_owned(), v);
                    }
                    Ok(None) => {}
                    Err(m) => return Err((Some(spec.name.to_owned()), m)),
                }
            }
        }
        let prompt = obj.get("prompt").and_then(Value::as_str).map(str::to_owned);
        let Some(prompt) = prompt else {
            return Err((
                Some("prompt".into()),
                "missing: map a column to it with --map prompt=COLUMN".into(),
            ));
        };
        let source_name = obj
            .get("source_name")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| self.source_name.clone());
        let criteria = match obj.remove("success_criteria") {
            None => SuccessCriteria::NotRefused,
            Some(v) => SuccessCriteria::from_json(&v)
                .map_err(|e| (Some("success_criteria".into()), e.to_string()))?,
        };
        let text = |k: &str| obj.get(k).and_then(Value::as_str).map(str::to_owned);
        let case_id = text("case_id").unwrap_or_else(|| {
            format!(
                "{}-{}",
                slug(&source_name).replace('_', "-"),
                short_hash(&[
                    &prompt,
                    text("context").as_deref().unwrap_or(""),
                    text("task_input").as_deref().unwrap_or(""),
                    &criteria.to_canonical_json(),
                ])
            )
        });
        let reference = text("source_reference").unwrap_or_else(|| reference.to_owned());
        let version = text("source_version").unwrap_or_else(|| self.version.clone());
        let source_type = text("source_type").unwrap_or_else(|| "public_benchmark".into());
        let mut provenance = json!({
            "source_name": source_name,
            "source_type": source_type,
            "source_reference": reference,
            "source_version": version,
            "license": "unspecified (set it with --set license=...)",
            "adapter": self.adapter,
        });
        if let Some(Value::Object(p)) = obj.remove("provenance") {
            provenance.as_object_mut().expect("an object").extend(p);
        }
        // Names (`attack_family`, …) as published (`Jailbreak`, `Prompt Injection`) become
        // snake_case (`jailbreak`, `prompt_injection`); the original is kept in
        // provenance.original_values.
        let mut originals = serde_json::Map::new();
        for spec in CASE_FIELDS.iter().filter(|s| s.kind == FieldKind::Name) {
            if let Some(Value::String(v)) = obj.get(spec.name) {
                let normal = slug(v);
                if &normal != v && !v.trim().is_empty() {
                    originals.insert(spec.name.to_owned(), json!(v));
                    obj.insert(spec.name.to_owned(), json!(normal));
                }
            }
        }
        if !originals.is_empty() {
            provenance["original_values"] = Value::Object(originals);
        }
        obj.insert("case_id".into(), json!(case_id));
        obj.insert("source_name".into(), json!(source_name));
        obj.insert("source_type".into(), json!(source_type));
        obj.entry("attack_family").or_insert(json!("unspecified"));
        obj.entry("attack_surface").or_insert(json!("user_prompt"));
        obj.insert(
            "success_criteria".into(),
            serde_json::to_value(&criteria).expect("criteria serialise"),
        );
        obj.insert("source_reference".into(), json!(reference));
        obj.insert("source_version".into(), json!(version));
        obj.insert("provenance".into(), provenance);
        // The shape is the case's (a wrongly typed value is the row's problem here); a
        // value outside a vocabulary is left for `--set` to replace and the contract check
        // to name, after the sets (so the shape is checked with such values stood in for).
        let mut shape = obj.clone();
        for (field, value) in shape.iter_mut() {
            if let Value::String(s) = value
                && crate::contract::record::check_vocabulary(field, s).is_err()
                && let Some(FieldKind::Enum(values)) =
                    CASE_FIELDS.iter().find(|f| f.name == field).map(|f| f.kind)
            {
                *value = json!(values[0]);
            }
        }
        serde_json::from_value::<AttackCase>(Value::Object(shape))
            .map_err(|e| (None, e.to_string()))?;
        Ok(obj)
    }

    fn emit_row(&self, row: &Row, record: u64, unit: &str, emit: &mut Emit<'_>) -> Result<()> {
        let reference = format!("{}#{unit}={record}", self.file.display());
        match self.case(row, &reference) {
            Ok(record) => emit(Item::Record(Box::new(record))),
            Err((field, reason)) => emit(Item::Invalid {
                file: self.file.to_path_buf(),
                record,
                field,
                reason,
            }),
        }
    }
}

pub fn ingest(kind: SourceKind, path: &Path, opts: &Options, emit: &mut Emit<'_>) -> Result<()> {
    for (field, _) in &opts.maps {
        if !CASE_FIELDS.iter().any(|s| s.name == field) {
            let names: Vec<&str> = CASE_FIELDS.iter().map(|s| s.name).collect();
            let hint = crate::text::did_you_mean(field, &names)
                .map(|s| format!(" (did you mean {s:?}?)"))
                .unwrap_or_default();
            return Err(Error::Usage(format!(
                "--map {field}=…: {field:?} is not a contract field{hint}"
            )));
        }
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mapper = Mapper {
        opts,
        file: path,
        source_name: opts.source_name.clone().unwrap_or(stem),
        version: upstream_version(path).unwrap_or_else(|| "unspecified".into()),
        adapter: match kind {
            SourceKind::Csv => "pieval ingest csv",
            SourceKind::Parquet => "pieval ingest parquet",
            _ => "pieval ingest jsonl",
        },
    };
    match kind {
        SourceKind::Csv => csv_rows(path, &mapper, emit),
        SourceKind::Parquet => parquet_rows(path, &mapper, emit),
        _ => super::for_each_jsonl(path, opts.max_line_bytes, &mut |line, v| match v {
            Ok(Value::Object(row)) => mapper.emit_row(&row, line, "line", emit),
            Ok(_) => Ok(()),
            Err(reason) => emit(Item::Invalid {
                file: path.to_path_buf(),
                record: line,
                field: None,
                reason,
            }),
        }),
    }
}

fn csv_rows(path: &Path, mapper: &Mapper<'_>, emit: &mut Emit<'_>) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
    let mut reader = csv::ReaderBuilder::new()
        .flexible(false)
        .from_reader(std::io::BufReader::new(file));
    let headers: Vec<String> = reader
        .headers()
        .map_err(|e| Error::input(path, 1, None, format!("no CSV header: {e}")))?
        .iter()
        .map(str::to_owned)
        .collect();
    let mut record = csv::ByteRecord::new();
    let max = mapper.opts.max_line_bytes;
    loop {
        let line = reader.position().line() + 1;
        match reader.read_byte_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                let line = e.position().map_or(line, |p| p.line());
                let reason = format!("not a valid CSV record: {e}");
                // A record that cannot be parsed cannot be resynchronised reliably.
                emit(Item::Invalid {
                    file: path.to_path_buf(),
                    record: line,
                    field: None,
                    reason,
                })?;
                if matches!(e.kind(), csv::ErrorKind::UnequalLengths { .. }) {
                    continue;
                }
                break;
            }
        }
        let line = record.position().map_or(line, |p| p.line());
        if record.as_slice().len() > max {
            emit(Item::Invalid {
                file: path.to_path_buf(),
                record: line,
                field: None,
                reason: format!(
                    "record of {} bytes is over the limit of {max}",
                    record.as_slice().len()
                ),
            })?;
            continue;
        }
        let mut row = Row::new();
        let mut bad = None;
        for (h, cell) in headers.iter().zip(record.iter()) {
            match std::str::from_utf8(cell) {
                Ok(s) => {
                    row.insert(h.clone(), Value::String(s.to_owned()));
                }
                Err(e) => bad = Some((h.clone(), format!("not UTF-8: {e}"))),
            }
        }
        match bad {
            Some((field, reason)) => emit(Item::Invalid {
                file: path.to_path_buf(),
                record: line,
                field: Some(field),
                reason,
            })?,
            None => mapper.emit_row(&row, line, "line", emit)?,
        }
    }
    Ok(())
}

fn parquet_rows(path: &Path, mapper: &Mapper<'_>, emit: &mut Emit<'_>) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.with_batch_size(4096).build())
        .map_err(|e| Error::config(path, format!("not a readable Parquet file: {e}")))?;
    let mut row_no = 0u64;
    let options = FormatOptions::default();
    for batch in reader {
        let batch = batch.map_err(|e| Error::config(path, format!("cannot read Parquet: {e}")))?;
        let schema = batch.schema();
        let columns: Vec<(String, ArrayFormatter<'_>, &dyn Array)> = schema
            .fields()
            .iter()
            .zip(batch.columns())
            .map(|(f, c)| {
                Ok((
                    f.name().clone(),
                    ArrayFormatter::try_new(c.as_ref(), &options)?,
                    c.as_ref(),
                ))
            })
            .collect::<std::result::Result<_, datafusion::arrow::error::ArrowError>>()?;
        for r in 0..batch.num_rows() {
            row_no += 1;
            let mut row = Row::new();
            for (name, f, array) in &columns {
                if array.is_null(r) {
                    row.insert(name.clone(), Value::Null);
                } else {
                    row.insert(name.clone(), Value::String(f.value(r).to_string()));
                }
            }
            mapper.emit_row(&row, row_no, "row", emit)?;
        }
    }
    Ok(())
}
