//! The templates of application targets: text with `{{name}}` placeholders, parsed once
//! when the config is loaded and filled in **one pass** — a value is put in as data and
//! never read as a template again, so attack text holding `{{secret.token}}` stays that
//! text.
//!
//! Filling in is context-aware ([`Escape`]): a value put into a JSON string is
//! JSON-escaped, into a URL percent-encoded, into a header refused if it holds a line
//! break (header injection). A JSON body given as a structure is filled leaf by leaf: a
//! leaf that is one placeholder alone becomes the value itself (`messages` a JSON array,
//! `seed` a number), any other leaf a string — serialization escapes it.
//!
//! Names: `prompt` (the last user message as sent), `context` (the system message as
//! sent), `payload` (the case's injection, planted by setup steps), `task` (the case's
//! user task), `messages` (the conversation as JSON, OpenAI form), `tools` (an agentic
//! case's tools as JSON, OpenAI form; `[]` otherwise), `case_id`,
//! `attempt_id`, `seed`, `turn`, `vars.<name>` (what a step extracted), `secret.<name>`
//! (an environment variable the target's `secrets` names), `world.mcp_url`,
//! `world.http_url`, `world.token` (where the attempt's world is served, `model.world`).

use serde_json::Value;

/// A placeholder's name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Name {
    Prompt,
    Context,
    Payload,
    Task,
    Messages,
    Tools,
    CaseId,
    AttemptId,
    /// A guardrail run's text role (`user_prompt`, `retrieved_document`, `tool_output`).
    Role,
    Seed,
    Turn,
    Var(String),
    Secret(String),
    /// Where the attempt's world is served (`world.mcp_url`, `world.http_url`,
    /// `world.token`; `model.world`).
    World(crate::provider::WorldField),
}

/// Every name a template may use, for error messages.
pub const NAMES: &str = "prompt, context, payload, task, messages, tools, case_id, role, attempt_id, seed, turn, vars.<name>, secret.<name>, world.mcp_url, world.http_url, world.token";

impl Name {
    fn parse(s: &str) -> Result<Self, String> {
        let ident = |t: &str| {
            !t.is_empty()
                && t.len() <= 64
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        };
        Ok(match s {
            "prompt" => Name::Prompt,
            "context" => Name::Context,
            "payload" => Name::Payload,
            "task" => Name::Task,
            "messages" => Name::Messages,
            "tools" => Name::Tools,
            "case_id" => Name::CaseId,
            "role" => Name::Role,
            "attempt_id" => Name::AttemptId,
            "seed" => Name::Seed,
            "turn" => Name::Turn,
            _ => match s.split_once('.') {
                Some(("vars", v)) if ident(v) => Name::Var(v.to_owned()),
                Some(("secret", v)) if ident(v) => Name::Secret(v.to_owned()),
                Some(("world", f))
                    if let Some(w) = crate::provider::WorldField::ALL
                        .into_iter()
                        .find(|w| w.as_str() == f) =>
                {
                    Name::World(w)
                }
                _ => {
                    let known: Vec<&str> = NAMES.split(", ").collect();
                    let hint = crate::text::did_you_mean(s, &known)
                        .map(|k| format!(" (did you mean `{k}`?)"))
                        .unwrap_or_default();
                    return Err(format!(
                        "unknown placeholder {{{{{s}}}}}{hint}; the names are {NAMES}"
                    ));
                }
            },
        })
    }

    /// `{{name}}`, as written.
    pub fn spelled(&self) -> String {
        let s = match self {
            Name::Prompt => "prompt",
            Name::Context => "context",
            Name::Payload => "payload",
            Name::Task => "task",
            Name::Messages => "messages",
            Name::Tools => "tools",
            Name::CaseId => "case_id",
            Name::Role => "role",
            Name::AttemptId => "attempt_id",
            Name::Seed => "seed",
            Name::Turn => "turn",
            Name::Var(v) => return format!("{{{{vars.{v}}}}}"),
            Name::Secret(v) => return format!("{{{{secret.{v}}}}}"),
            Name::World(w) => return format!("{{{{world.{}}}}}", w.as_str()),
        };
        format!("{{{{{s}}}}}")
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Seg {
    Lit(String),
    Var(Name),
}

/// A parsed template.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    segs: Vec<Seg>,
}

/// How a value is written where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escape {
    /// As it is (a text body).
    Plain,
    /// Inside a JSON string: escaped, without the quotes.
    JsonString,
    /// A URL's path or query: percent-encoded (all but RFC 3986's unreserved characters).
    Url,
    /// `application/x-www-form-urlencoded`: percent-encoded, a space as `+`.
    Form,
    /// A header value: a value holding CR, LF or NUL is refused.
    Header,
}

/// Where the values come from.
pub trait Values {
    /// The value of `name`, or why there is none.
    fn value(&self, name: &Name) -> Result<Value, String>;
}

impl Template {
    /// Parse `{{name}}` placeholders (spaces inside the braces allowed).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut segs = Vec::new();
        let mut rest = text;
        while let Some(i) = rest.find("{{") {
            if i > 0 {
                segs.push(Seg::Lit(rest[..i].to_owned()));
            }
            let after = &rest[i + 2..];
            let Some(j) = after.find("}}") else {
                return Err(format!(
                    "`{{{{` at byte {} is never closed by `}}}}`",
                    text.len() - rest.len() + i
                ));
            };
            segs.push(Seg::Var(Name::parse(after[..j].trim())?));
            rest = &after[j + 2..];
        }
        if !rest.is_empty() {
            segs.push(Seg::Lit(rest.to_owned()));
        }
        Ok(Self { segs })
    }

    /// The names it uses.
    pub fn names(&self) -> impl Iterator<Item = &Name> {
        self.segs.iter().filter_map(|s| match s {
            Seg::Var(n) => Some(n),
            Seg::Lit(_) => None,
        })
    }

    /// The text before the first placeholder.
    pub fn literal_prefix(&self) -> &str {
        match self.segs.first() {
            Some(Seg::Lit(s)) => s,
            _ => "",
        }
    }

    /// The one name, when the template is a placeholder alone.
    pub fn alone(&self) -> Option<&Name> {
        match self.segs.as_slice() {
            [Seg::Var(n)] => Some(n),
            _ => None,
        }
    }

    /// Fill it in, each value written as `escape` says.
    pub fn render(&self, values: &dyn Values, escape: Escape) -> Result<String, String> {
        let mut out = String::new();
        for s in &self.segs {
            match s {
                Seg::Lit(l) => out.push_str(l),
                Seg::Var(n) => {
                    let v = values.value(n)?;
                    let text = match &v {
                        Value::String(s) => std::borrow::Cow::Borrowed(s.as_str()),
                        // a variable a later turn sets (a conversation id): empty before
                        Value::Null => std::borrow::Cow::Borrowed(""),
                        other => std::borrow::Cow::Owned(other.to_string()),
                    };
                    write_escaped(&mut out, &text, escape)
                        .map_err(|why| format!("{}: {why}", n.spelled()))?;
                }
            }
        }
        Ok(out)
    }
}

fn write_escaped(out: &mut String, text: &str, escape: Escape) -> Result<(), String> {
    match escape {
        Escape::Plain => out.push_str(text),
        Escape::JsonString => {
            let quoted = serde_json::to_string(text).expect("a string serializes");
            out.push_str(&quoted[1..quoted.len() - 1]);
        }
        Escape::Url | Escape::Form => {
            for b in text.bytes() {
                // `.` escaped too: a value of `..` is no dot-segment of the path
                if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~') {
                    out.push(b as char);
                } else if b == b' ' && escape == Escape::Form {
                    out.push('+');
                } else {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
        }
        Escape::Header => {
            if text.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
                return Err(
                    "the value holds a line break or NUL, which cannot go into a header (it would start another header)".into(),
                );
            }
            out.push_str(text);
        }
    }
    Ok(())
}

/// A JSON body given as a structure: its string leaves are templates (and its keys
/// plain text).
#[derive(Clone, Debug, PartialEq)]
pub enum JsonTemplate {
    Leaf(Template),
    Other(Value),
    Array(Vec<JsonTemplate>),
    Object(Vec<(String, JsonTemplate)>),
}

impl JsonTemplate {
    /// Parse every string leaf; an error names the leaf's path (`body.messages[0]`).
    pub fn parse(v: &Value, path: &str) -> Result<Self, (String, String)> {
        Ok(match v {
            Value::String(s) => {
                JsonTemplate::Leaf(Template::parse(s).map_err(|m| (path.to_owned(), m))?)
            }
            Value::Array(items) => JsonTemplate::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, x)| Self::parse(x, &format!("{path}[{i}]")))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(map) => JsonTemplate::Object(
                map.iter()
                    .map(|(k, x)| Ok((k.clone(), Self::parse(x, &format!("{path}.{k}"))?)))
                    .collect::<Result<_, (String, String)>>()?,
            ),
            other => JsonTemplate::Other(other.clone()),
        })
    }

    pub fn names(&self) -> Vec<&Name> {
        match self {
            JsonTemplate::Leaf(t) => t.names().collect(),
            JsonTemplate::Other(_) => Vec::new(),
            JsonTemplate::Array(v) => v.iter().flat_map(|x| x.names()).collect(),
            JsonTemplate::Object(v) => v.iter().flat_map(|(_, x)| x.names()).collect(),
        }
    }

    /// The JSON value, filled in.
    pub fn render(&self, values: &dyn Values) -> Result<Value, String> {
        Ok(match self {
            JsonTemplate::Leaf(t) => match t.alone() {
                Some(n) => values.value(n)?,
                None => Value::String(t.render(values, Escape::Plain)?),
            },
            JsonTemplate::Other(v) => v.clone(),
            JsonTemplate::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|x| x.render(values))
                    .collect::<Result<_, _>>()?,
            ),
            JsonTemplate::Object(items) => Value::Object(
                items
                    .iter()
                    .map(|(k, x)| Ok((k.clone(), x.render(values)?)))
                    .collect::<Result<_, String>>()?,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct V;
    impl Values for V {
        fn value(&self, name: &Name) -> Result<Value, String> {
            Ok(match name {
                Name::Prompt => json!("say \"hi\"\n{{secret.token}} & a/b?c=d"),
                Name::Seed => json!(7),
                Name::Messages => json!([{"role": "user", "content": "x"}]),
                Name::Var(v) if v == "id" => json!("doc 1/2"),
                Name::Secret(_) => json!("s3cr3t-value"),
                other => return Err(format!("no value for {}", other.spelled())),
            })
        }
    }

    #[test]
    fn one_pass_context_aware_filling() {
        let t = Template::parse("{\"q\": \"{{ prompt }}\"}").unwrap();
        let body = t.render(&V, Escape::JsonString).unwrap();
        let parsed: Value = serde_json::from_str(&body).unwrap();
        // filled once: the placeholder inside the attack text stays text
        assert_eq!(parsed["q"], "say \"hi\"\n{{secret.token}} & a/b?c=d");
        let u = Template::parse("/docs/{{vars.id}}?q={{prompt}}").unwrap();
        assert_eq!(
            u.render(&V, Escape::Url).unwrap(),
            "/docs/doc%201%2F2?q=say%20%22hi%22%0A%7B%7Bsecret%2Etoken%7D%7D%20%26%20a%2Fb%3Fc%3Dd"
        );
        let f = Template::parse("q={{prompt}}").unwrap();
        assert!(
            f.render(&V, Escape::Form)
                .unwrap()
                .starts_with("q=say+%22hi%22%0A")
        );
        let h = Template::parse("Bearer {{prompt}}").unwrap();
        assert!(
            h.render(&V, Escape::Header)
                .unwrap_err()
                .contains("line break")
        );
    }

    #[test]
    fn json_structures_keep_types() {
        let t = JsonTemplate::parse(
            &json!({"messages": "{{messages}}", "seed": "{{seed}}", "text": "q: {{prompt}}", "n": 3}),
            "body",
        )
        .unwrap();
        let v = t.render(&V).unwrap();
        assert_eq!(v["messages"][0]["role"], "user");
        assert_eq!(v["seed"], 7);
        assert_eq!(v["n"], 3);
        assert_eq!(v["text"], "q: say \"hi\"\n{{secret.token}} & a/b?c=d");
    }

    #[test]
    fn bad_templates_are_said() {
        assert!(
            Template::parse("{{promt}}")
                .unwrap_err()
                .contains("did you mean `prompt`")
        );
        assert!(
            Template::parse("a {{prompt")
                .unwrap_err()
                .contains("never closed")
        );
        assert!(Template::parse("{{vars.}}").is_err());
        let e = JsonTemplate::parse(&json!({"a": ["{{nope}}"]}), "body").unwrap_err();
        assert_eq!(e.0, "body.a[0]");
        let t = Template::parse("{{vars.missing}}").unwrap();
        assert!(
            t.render(&V, Escape::Plain)
                .unwrap_err()
                .contains("vars.missing")
        );
    }
}
