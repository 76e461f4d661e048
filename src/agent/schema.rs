//! A tool call's arguments checked against the tool's JSON Schema (the `parameters` of
//! its OpenAI function schema), as a function-calling API would: the subset of JSON
//! Schema tool definitions use — `type` (one or a list), `required`, `properties`,
//! `additionalProperties: false`, `enum`, `const`, `items`, `minimum` / `maximum`,
//! `anyOf` / `oneOf` (one branch must pass). Other keywords are not checked. The message
//! names the argument (`to[0]: expected a string, found a number`): the model sees it as
//! the tool's error.

use serde_json::Value;

use crate::contract::criteria::json_kind;

/// Check `args` against `schema`.
pub fn check_arguments(schema: &Value, args: &Value) -> Result<(), String> {
    check(schema, args, "", 0)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn at(path: &str, m: String) -> String {
    if path.is_empty() {
        m
    } else {
        format!("{path}: {m}")
    }
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => {
            v.as_i64().is_some()
                || v.as_u64().is_some()
                || v.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "null" => v.is_null(),
        _ => true,
    }
}

fn article(t: &str) -> String {
    match t {
        "integer" | "array" | "object" => format!("an {t}"),
        "null" => "null".to_owned(),
        _ => format!("a {t}"),
    }
}

fn check(schema: &Value, v: &Value, path: &str, depth: usize) -> Result<(), String> {
    let Some(s) = schema.as_object() else {
        return Ok(());
    };
    if depth > 32 {
        return Ok(());
    }
    match s.get("type") {
        Some(Value::String(t)) if !type_matches(t, v) => {
            return Err(at(
                path,
                format!("expected {}, found {}", article(t), json_kind(v)),
            ));
        }
        Some(Value::Array(ts))
            if !ts
                .iter()
                .filter_map(Value::as_str)
                .any(|t| type_matches(t, v)) =>
        {
            let names: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
            return Err(at(
                path,
                format!(
                    "expected one of {}, found {}",
                    names.join(", "),
                    json_kind(v)
                ),
            ));
        }
        _ => {}
    }
    if let Some(Value::Array(options)) = s.get("enum")
        && !options.iter().any(|o| o == v)
    {
        let shown: Vec<String> = options.iter().take(10).map(Value::to_string).collect();
        let given = match v {
            Value::String(s) => format!("\"{}\"", crate::text::excerpt(s, 60)),
            other => crate::text::excerpt(&other.to_string(), 60),
        };
        return Err(at(
            path,
            format!("{given} is not one of {}", shown.join(", ")),
        ));
    }
    if let Some(c) = s.get("const")
        && c != v
    {
        return Err(at(path, format!("expected {c}")));
    }
    if let Some(x) = v.as_f64() {
        if let Some(min) = s.get("minimum").and_then(Value::as_f64)
            && x < min
        {
            return Err(at(path, format!("{x} is below the minimum {min}")));
        }
        if let Some(max) = s.get("maximum").and_then(Value::as_f64)
            && x > max
        {
            return Err(at(path, format!("{x} is above the maximum {max}")));
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = s.get(key)
            && !branches.is_empty()
            && !branches
                .iter()
                .any(|b| check(b, v, path, depth + 1).is_ok())
        {
            return Err(at(path, "matches none of the allowed forms".to_owned()));
        }
    }
    if let Value::Object(m) = v {
        if let Some(Value::Array(req)) = s.get("required") {
            for r in req.iter().filter_map(Value::as_str) {
                if !m.contains_key(r) {
                    let what = if path.is_empty() {
                        format!("missing required argument {r:?}")
                    } else {
                        format!("{path}: missing required field {r:?}")
                    };
                    return Err(what);
                }
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (k, x) in m {
            match props.and_then(|p| p.get(k)) {
                Some(p) => check(p, x, &join(path, k), depth + 1)?,
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        let what = if path.is_empty() {
                            "not an argument of this tool"
                        } else {
                            "not a field of this argument"
                        };
                        return Err(format!("{}: {what}", join(path, k)));
                    }
                    Some(extra @ Value::Object(_)) => check(extra, x, &join(path, k), depth + 1)?,
                    _ => {}
                },
            }
        }
    }
    if let (Value::Array(items), Some(schema)) = (v, s.get("items")) {
        for (i, x) in items.iter().enumerate() {
            check(schema, x, &format!("{path}[{i}]"), depth + 1)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_subset_tool_definitions_use() {
        let s = json!({"type": "object", "properties": {
            "to": {"type": "array", "items": {"type": "string"}},
            "n": {"type": "integer", "minimum": 1},
            "mode": {"enum": ["a", "b"]},
            "when": {"type": ["string", "null"]},
            "opt": {"anyOf": [{"type": "string"}, {"type": "number"}]}
        }, "required": ["to"], "additionalProperties": false});
        assert!(
            check_arguments(
                &s,
                &json!({"to": ["x"], "n": 2, "mode": "a", "when": null, "opt": 1})
            )
            .is_ok()
        );
        for (args, want) in [
            (json!({}), "missing required argument \"to\""),
            (
                json!({"to": [1]}),
                "to[0]: expected a string, found a number",
            ),
            (json!({"to": [], "n": 0}), "n: 0 is below the minimum 1"),
            (
                json!({"to": [], "n": 1.5}),
                "n: expected an integer, found a number",
            ),
            (
                json!({"to": [], "mode": "c"}),
                "mode: \"c\" is not one of \"a\", \"b\"",
            ),
            (
                json!({"to": [], "when": 3}),
                "when: expected one of string, null, found a number",
            ),
            (
                json!({"to": [], "opt": true}),
                "opt: matches none of the allowed forms",
            ),
            (json!({"to": [], "x": 1}), "x: not an argument of this tool"),
        ] {
            assert_eq!(check_arguments(&s, &args).unwrap_err(), want, "{args}");
        }
    }
}
