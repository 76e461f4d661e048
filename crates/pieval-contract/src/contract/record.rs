//! One attack-case record as read from a line of JSONL (or a Parquet row), with every
//! field kept raw, and the contract rules that check it.
//!
//! Parsing borrows from the line wherever it can (no per-field allocation for strings
//! without escapes); unknown and repeated keys are remembered so they can be reported.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::criteria::SuccessCriteria;
use super::fields::{CASE_FIELDS, FieldKind, FieldSpec, case_field_index};
use crate::text::did_you_mean;

/// The raw value of one field.
#[derive(Clone, Debug)]
pub enum FieldValue<'a> {
    Null,
    Bool(bool),
    Number(f64),
    Str(Cow<'a, str>),
    /// An object, kept as its JSON text.
    Object(Cow<'a, str>),
    /// An array of a list field ([`FieldKind::Tags`]), kept as its JSON text.
    List(Cow<'a, str>),
    Array,
}

impl FieldValue<'_> {
    pub fn kind_name(&self) -> &'static str {
        match self {
            FieldValue::Null => "null",
            FieldValue::Bool(_) => "a boolean",
            FieldValue::Number(_) => "a number",
            FieldValue::Str(_) => "a string",
            FieldValue::Object(_) => "an object",
            FieldValue::List(_) | FieldValue::Array => "an array",
        }
    }
}

/// A parsed record: the contract fields by index into [`CASE_FIELDS`], plus what does
/// not belong.
#[derive(Default, Debug)]
pub struct RawRecord<'a> {
    pub fields: [Option<FieldValue<'a>>; CASE_FIELDS.len()],
    pub unknown_keys: Vec<Cow<'a, str>>,
    pub repeated_keys: Vec<&'static str>,
}

impl<'a> RawRecord<'a> {
    /// Parse one JSON line; the error is serde_json's (with its column).
    pub fn parse(line: &'a str) -> Result<Self, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(line);
        let rec = de.deserialize_map(RecordVisitor)?;
        de.end()?;
        Ok(rec)
    }

    pub fn get(&self, name: &str) -> Option<&FieldValue<'a>> {
        case_field_index(name).and_then(|i| self.fields[i].as_ref())
    }

    /// The string value of a field, when it is one.
    pub fn str(&self, name: &str) -> Option<&str> {
        match self.get(name) {
            Some(FieldValue::Str(s)) => Some(s),
            _ => None,
        }
    }
}

struct RecordVisitor;

impl<'de> Visitor<'de> for RecordVisitor {
    type Value = RawRecord<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut rec = RawRecord::default();
        // Writers (ours included) emit keys in contract order: try the next field first.
        let mut hint = 0;
        while let Some(BorrowedStr(key)) = map.next_key()? {
            let index = match CASE_FIELDS.get(hint) {
                Some(f) if f.name == key => Some(hint),
                _ => case_field_index(&key),
            };
            match index {
                Some(i) => {
                    hint = i + 1;
                    if rec.fields[i].is_some() {
                        rec.repeated_keys.push(CASE_FIELDS[i].name);
                    }
                    let value = match CASE_FIELDS[i].kind {
                        // Objects are kept as their JSON text.
                        FieldKind::Object | FieldKind::Criteria | FieldKind::Environment => {
                            classify(map.next_value::<&'de RawValue>()?)
                                .map_err(de::Error::custom)?
                        }
                        // Lists are kept as their JSON text too.
                        FieldKind::Tags => {
                            let raw = map.next_value::<&'de RawValue>()?;
                            if raw.get().starts_with('[') {
                                FieldValue::List(Cow::Borrowed(raw.get()))
                            } else {
                                classify(raw).map_err(de::Error::custom)?
                            }
                        }
                        // Everything else is read in one pass, strings borrowed.
                        _ => map.next_value::<ScalarValue>()?.0,
                    };
                    rec.fields[i] = Some(value);
                }
                None => {
                    map.next_value::<de::IgnoredAny>()?;
                    rec.unknown_keys.push(key);
                }
            }
        }
        Ok(rec)
    }
}

/// A JSON object read flat, in one pass: each key with its scalar value (objects and
/// arrays keep only their kind). For record types other than attack cases
/// (predictions), whose checks name the field themselves.
#[derive(Debug, Default)]
pub struct FlatRecord<'a> {
    pub fields: Vec<(Cow<'a, str>, FieldValue<'a>)>,
}

/// How deep JSON may nest inside an object field. serde_json (which `enrich`, `run` and
/// `ingest` read cases with) stops at 128 levels; `validate` must not accept what they
/// then reject, so the same bound holds everywhere (with room for the record itself).
pub const MAX_OBJECT_DEPTH: usize = 100;

/// Reject an object field's JSON text nested deeper than [`MAX_OBJECT_DEPTH`].
fn check_depth(text: &str) -> Result<(), String> {
    let (mut depth, mut max, mut in_str, mut esc) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_str {
            match b {
                _ if esc => esc = false,
                b'\\' => esc = true,
                b'"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if max > MAX_OBJECT_DEPTH {
        Err(format!(
            "nested {max} levels deep; at most {MAX_OBJECT_DEPTH} are read"
        ))
    } else {
        Ok(())
    }
}

impl<'a> FlatRecord<'a> {
    pub fn parse(line: &'a str) -> Result<Self, serde_json::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FlatRecord<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut rec = FlatRecord::default();
                while let Some(BorrowedStr(key)) = map.next_key()? {
                    let ScalarValue(v) = map.next_value()?;
                    rec.fields.push((key, v));
                }
                Ok(rec)
            }
        }
        let mut de = serde_json::Deserializer::from_str(line);
        let rec = de.deserialize_map(V)?;
        de.end()?;
        Ok(rec)
    }

    /// The value of `key` (the last one when repeated).
    pub fn get(&self, key: &str) -> Option<&FieldValue<'a>> {
        self.fields
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

/// A value read in a single pass: strings (borrowed when unescaped), numbers, booleans
/// and null as themselves; objects and arrays skipped and only their kind kept.
struct ScalarValue<'a>(FieldValue<'a>);

impl<'de> serde::Deserialize<'de> for ScalarValue<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ScalarValue<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(ScalarValue(FieldValue::Str(Cow::Borrowed(v))))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(ScalarValue(FieldValue::Str(Cow::Owned(v.to_owned()))))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(ScalarValue(FieldValue::Str(Cow::Owned(v))))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
                Ok(ScalarValue(FieldValue::Bool(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(ScalarValue(FieldValue::Number(v as f64)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(ScalarValue(FieldValue::Number(v as f64)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
                Ok(ScalarValue(FieldValue::Number(v)))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(ScalarValue(FieldValue::Null))
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(ScalarValue(FieldValue::Null))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                while m.next_entry::<de::IgnoredAny, de::IgnoredAny>()?.is_some() {}
                Ok(ScalarValue(FieldValue::Object(Cow::Borrowed(""))))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
                while s.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(ScalarValue(FieldValue::Array))
            }
        }
        d.deserialize_any(V)
    }
}

/// Turn a raw JSON value into a [`FieldValue`] by its first byte (RawValue is already
/// whitespace-trimmed and syntactically valid).
fn classify(raw: &RawValue) -> Result<FieldValue<'_>, serde_json::Error> {
    let text = raw.get();
    Ok(match text.as_bytes().first() {
        Some(b'"') => FieldValue::Str(serde_json::from_str::<BorrowedStr>(text)?.0),
        Some(b'{') => FieldValue::Object(Cow::Borrowed(text)),
        Some(b'[') => FieldValue::Array,
        Some(b't') => FieldValue::Bool(true),
        Some(b'f') => FieldValue::Bool(false),
        Some(b'n') => FieldValue::Null,
        _ => FieldValue::Number(text.parse().unwrap_or(f64::NAN)),
    })
}

/// A string that borrows from the input when it has no escapes.
struct BorrowedStr<'a>(Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for BorrowedStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = BorrowedStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// How serious a violation is: errors make a corpus invalid, warnings do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Error,
    Warning,
}

/// One problem at one line (or row) and field. `field` is `None` for problems with the
/// line as a whole (invalid JSON, blank line, …).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Violation {
    pub line: u64,
    pub field: Option<String>,
    pub level: Level,
    pub problem: String,
}

impl Violation {
    pub fn error(line: u64, field: Option<&str>, problem: impl Into<String>) -> Self {
        Self {
            line,
            field: field.map(str::to_owned),
            level: Level::Error,
            problem: problem.into(),
        }
    }

    pub fn warning(line: u64, field: Option<&str>, problem: impl Into<String>) -> Self {
        Self {
            level: Level::Warning,
            ..Self::error(line, field, problem)
        }
    }
}

/// Compiles each distinct `success_criteria` text once: a corpus repeats the same
/// criteria many times, and a regex compile costs far more than a lookup.
#[derive(Default)]
pub struct CriteriaCache {
    seen: HashMap<Box<str>, Result<Box<str>, Box<str>>>,
    /// The verdict on the last text that did not fit in the bounded cache.
    overflow: Option<Result<Box<str>, Box<str>>>,
    /// Bytes held by `seen` (text and verdict, estimated).
    bytes: usize,
}

/// Bytes of criteria text and verdicts kept at most: a hostile corpus where every
/// criterion differs cannot grow the cache without bound (misses are then compiled each
/// time, still correct). The compiled regexes themselves are not kept here.
const CRITERIA_CACHE_BYTES: usize = 128 << 20;

impl CriteriaCache {
    /// The canonical JSON of the criterion, or the reason it is rejected. Borrowed from
    /// the cache: a hit allocates nothing.
    pub fn check(&mut self, raw: &FieldValue<'_>) -> Result<&str, &str> {
        let key = match raw {
            FieldValue::Object(t) => t.as_ref(),
            FieldValue::Str(s) => s.as_ref(),
            _ => return Err("expected an object (or a shorthand string)"),
        };
        if !self.seen.contains_key(key) {
            let verdict = Self::compile(raw);
            let weight = 64 + key.len() + as_refs(&verdict).map_or_else(str::len, str::len);
            if self.bytes + weight > CRITERIA_CACHE_BYTES {
                return as_refs(self.overflow.insert(verdict));
            }
            self.bytes += weight;
            self.seen.insert(key.into(), verdict);
        }
        as_refs(&self.seen[key])
    }

    fn compile(raw: &FieldValue<'_>) -> Result<Box<str>, Box<str>> {
        let parsed = match raw {
            FieldValue::Object(t) => serde_json::from_str(t)
                .map_err(|e| format!("invalid criterion JSON: {e}"))
                .and_then(|v| SuccessCriteria::from_json(&v).map_err(|e| e.to_string())),
            FieldValue::Str(s) => SuccessCriteria::from_shorthand(s).map_err(|e| e.to_string()),
            _ => Err("expected an object (or a shorthand string)".to_owned()),
        };
        parsed
            .and_then(|c| {
                c.compile()
                    .map(|_| c.to_canonical_json())
                    .map_err(|e| e.to_string())
            })
            .map(String::into_boxed_str)
            .map_err(String::into_boxed_str)
    }
}

fn as_refs(r: &Result<Box<str>, Box<str>>) -> Result<&str, &str> {
    match r {
        Ok(s) => Ok(s),
        Err(e) => Err(e),
    }
}

/// Check one record against the contract; push what is wrong onto `out`.
pub fn check_record(
    rec: &RawRecord<'_>,
    line: u64,
    criteria: &mut CriteriaCache,
    out: &mut Vec<Violation>,
) {
    for key in &rec.repeated_keys {
        out.push(Violation::error(
            line,
            Some(key),
            "appears more than once in the record",
        ));
    }
    for key in &rec.unknown_keys {
        let names: Vec<&str> = CASE_FIELDS.iter().map(|f| f.name).collect();
        let hint = did_you_mean(key, &names)
            .map(|s| format!(" (did you mean {s:?}?)"))
            .unwrap_or_default();
        out.push(Violation::warning(
            line,
            Some(key),
            format!("not a contract field{hint}; it is ignored"),
        ));
    }
    for (spec, value) in CASE_FIELDS.iter().zip(rec.fields.iter()) {
        match value {
            None if spec.required => out.push(Violation::error(
                line,
                Some(spec.name),
                "missing required field",
            )),
            None => {}
            Some(FieldValue::Null) if !spec.required => {}
            Some(v) => {
                if let Err(problem) = check_field(spec, v, criteria) {
                    out.push(Violation::error(line, Some(spec.name), problem));
                }
            }
        }
    }
}

/// Check a single present value; `Ok` carries nothing, the caller re-reads the value.
pub fn check_field(
    spec: &FieldSpec,
    value: &FieldValue<'_>,
    criteria: &mut CriteriaCache,
) -> Result<(), String> {
    let expected = match spec.kind {
        FieldKind::Object | FieldKind::Environment => "an object",
        FieldKind::Criteria => "an object (or a shorthand string)",
        FieldKind::Probability => "a number in [0, 1]",
        FieldKind::Tags => "an array of strings",
        _ => "a string",
    };
    match (spec.kind, value) {
        (FieldKind::Criteria, FieldValue::Object(_) | FieldValue::Str(_)) => {
            if let FieldValue::Str(s) = value
                && s.trim().is_empty()
            {
                return Err("empty".into());
            }
            criteria.check(value).map(|_| ()).map_err(str::to_owned)
        }
        (FieldKind::Object, FieldValue::Object(text)) => check_depth(text),
        (FieldKind::Environment, FieldValue::Object(text)) => {
            check_depth(text)?;
            let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
            super::environment::Environment::from_json(&v)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        (FieldKind::Probability, FieldValue::Number(x)) => {
            if (0.0..=1.0).contains(x) {
                Ok(())
            } else {
                Err(format!("{x} is outside [0, 1]"))
            }
        }
        (FieldKind::Tags, FieldValue::List(text)) => check_tags(text),
        (
            FieldKind::Object
            | FieldKind::Criteria
            | FieldKind::Probability
            | FieldKind::Environment
            | FieldKind::Tags,
            v,
        ) => Err(format!("expected {expected}, found {}", v.kind_name())),
        (kind, FieldValue::Str(s)) => check_string(kind, s),
        (_, v) => Err(format!("expected {expected}, found {}", v.kind_name())),
    }
}

/// Check a text value of a vocabulary field (`label`, `attack_surface` …) against the
/// contract's vocabulary; a field without one passes.
pub fn check_vocabulary(field: &str, s: &str) -> Result<(), String> {
    match super::fields::CASE_FIELDS.iter().find(|f| f.name == field) {
        Some(spec) if matches!(spec.kind, FieldKind::Enum(_)) => check_string(spec.kind, s),
        _ => Ok(()),
    }
}

/// Whether `s` is an id the contract accepts (`case_id`: letters, digits, '.', '_', ':',
/// '-'; a letter or digit first; at most 128 bytes), or why not.
pub fn check_id(s: &str) -> Result<(), String> {
    check_string(FieldKind::Id, s)
}

fn check_string(kind: FieldKind, s: &str) -> Result<(), String> {
    if s.trim().is_empty() {
        return Err("empty".into());
    }
    match kind {
        FieldKind::Id => {
            let ok = s.len() <= 128
                && s.as_bytes()[0].is_ascii_alphanumeric()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "{:?} is not a valid id (letters, digits, '.', '_', ':', '-'; starts with a letter or digit; at most 128 bytes)",
                    crate::text::excerpt(s, 60)
                ))
            }
        }
        FieldKind::Name => {
            let ok = s.len() <= 64
                && s.as_bytes()[0].is_ascii_lowercase()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "{:?} is not a snake_case name (a-z, 0-9, '_'; starts with a letter)",
                    crate::text::excerpt(s, 60)
                ))
            }
        }
        FieldKind::Enum(values) => {
            if values.contains(&s) {
                Ok(())
            } else {
                let hint = did_you_mean(s, values)
                    .map(|v| format!(" (did you mean {v:?}?)"))
                    .unwrap_or_default();
                Err(format!(
                    "unknown value {:?}{hint}; expected one of {}",
                    crate::text::excerpt(s, 60),
                    values.join(", ")
                ))
            }
        }
        FieldKind::Language => {
            if is_bcp47(s) {
                Ok(())
            } else {
                Err(format!(
                    "{:?} is not a BCP-47 language tag (like en, de, pt-BR)",
                    crate::text::excerpt(s, 60)
                ))
            }
        }
        FieldKind::Timestamp => {
            if is_rfc3339(s) {
                Ok(())
            } else {
                Err(format!(
                    "{:?} is not an RFC 3339 timestamp (like 2026-11-30T00:00:00Z)",
                    crate::text::excerpt(s, 60)
                ))
            }
        }
        FieldKind::Text => Ok(()),
        FieldKind::Object
        | FieldKind::Criteria
        | FieldKind::Probability
        | FieldKind::Environment
        | FieldKind::Tags => unreachable!(),
    }
}

/// The longest framework tag accepted (NIST AI 600-1's longest risk name is 47 bytes).
pub const MAX_TAG_BYTES: usize = 128;

/// The strings of a tag list's JSON text, checked: each non-empty, without control
/// characters, at most [`MAX_TAG_BYTES`], none twice.
pub fn parse_tags(text: &str) -> Result<Vec<String>, String> {
    let tags: Vec<String> =
        serde_json::from_str(text).map_err(|_| "expected an array of strings".to_string())?;
    for (i, t) in tags.iter().enumerate() {
        if t.trim().is_empty() {
            return Err(format!("tag {} is empty", i + 1));
        }
        if t.len() > MAX_TAG_BYTES || t.chars().any(char::is_control) {
            return Err(format!(
                "tag {} ({:?}) is longer than {MAX_TAG_BYTES} bytes or holds a control character",
                i + 1,
                crate::text::excerpt(t, 60)
            ));
        }
        if tags[..i].contains(t) {
            return Err(format!("tag {t:?} appears twice"));
        }
    }
    Ok(tags)
}

fn check_tags(text: &str) -> Result<(), String> {
    parse_tags(text).map(|_| ())
}

/// BCP-47 shape: a 2–3 letter primary language, then subtags of 1–8 alphanumerics.
pub fn is_bcp47(s: &str) -> bool {
    let mut parts = s.split('-');
    let primary = parts.next().unwrap_or("");
    (2..=3).contains(&primary.len())
        && primary.bytes().all(|b| b.is_ascii_lowercase())
        && parts.all(|p| (1..=8).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// RFC 3339 date-time: `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` with plausible ranges.
pub fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        b.get(r.clone())
            .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
    };
    let num = |r: std::ops::Range<usize>| s[r].parse::<u32>().unwrap_or(99);
    if b.len() < 20
        || !(digits(0..4) && b[4] == b'-' && digits(5..7) && b[7] == b'-' && digits(8..10))
        || !matches!(b[10], b'T' | b't')
        || !(digits(11..13) && b[13] == b':' && digits(14..16) && b[16] == b':' && digits(17..19))
    {
        return false;
    }
    if !((1..=12).contains(&num(5..7))
        && (1..=31).contains(&num(8..10))
        && num(11..13) < 24
        && num(14..16) < 60
        && num(17..19) < 61)
    {
        return false;
    }
    let mut i = 19;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    match &b[i..] {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn violations(line: &str) -> Vec<String> {
        let rec = RawRecord::parse(line).unwrap();
        let mut out = Vec::new();
        check_record(&rec, 1, &mut CriteriaCache::default(), &mut out);
        out.iter()
            .map(|v| format!("{}: {}", v.field.as_deref().unwrap_or("record"), v.problem))
            .collect()
    }

    const OK: &str = r#"{"case_id":"c-1","source_name":"t","source_type":"synthetic","attack_family":"naive","attack_surface":"email","prompt":"p","success_criteria":{"type":"contains","value":"X"}}"#;

    #[test]
    fn a_minimal_case_is_valid() {
        assert!(violations(OK).is_empty());
    }

    #[test]
    fn strings_without_escapes_are_borrowed() {
        let rec = RawRecord::parse(r#"{"case_id":"abc","prompt":"a\nb"}"#).unwrap();
        assert!(matches!(
            rec.get("case_id"),
            Some(FieldValue::Str(Cow::Borrowed("abc")))
        ));
        assert!(matches!(
            rec.get("prompt"),
            Some(FieldValue::Str(Cow::Owned(_)))
        ));
    }

    #[test]
    fn reports_each_problem_with_its_field() {
        let line = OK
            .replace(
                r#""source_type":"synthetic""#,
                r#""source_type":"synthetik""#,
            )
            .replace(r#""prompt":"p""#, r#""prompt":"  ""#)
            .replace(r#""case_id":"c-1""#, r#""case_id":7"#)
            .replace(
                r#""attack_surface":"email","#,
                r#""language":"english","atack_family":"x","#,
            );
        assert_eq!(
            violations(&line),
            [
                "atack_family: not a contract field (did you mean \"attack_family\"?); it is ignored",
                "case_id: expected a string, found a number",
                "source_type: unknown value \"synthetik\" (did you mean \"synthetic\"?); expected one of public_benchmark, synthetic, handwritten, red_team, in_the_wild",
                "attack_surface: missing required field",
                "prompt: empty",
                "language: \"english\" is not a BCP-47 language tag (like en, de, pt-BR)",
            ]
        );
    }

    #[test]
    fn optional_null_is_absent_but_required_null_is_not() {
        let line = OK.replace(r#""prompt":"p""#, r#""prompt":null,"notes":null"#);
        assert_eq!(violations(&line), ["prompt: expected a string, found null"]);
    }

    #[test]
    fn timestamps_and_tags() {
        assert!(is_rfc3339("2026-11-30T00:00:00Z"));
        assert!(is_rfc3339("2026-11-30T10:20:30.123+01:00"));
        assert!(!is_rfc3339("2026-13-30T00:00:00Z"));
        assert!(!is_rfc3339("2026-11-30 00:00:00"));
        assert!(!is_rfc3339("2026-11-30T00:00:00Zjunk"));
        assert!(is_bcp47("pt-BR") && is_bcp47("en") && !is_bcp47("EN") && !is_bcp47("e"));
    }
}
