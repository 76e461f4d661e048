//! Parameters of an extension point's entries, declared as data.
//!
//! A converter or a mitigation lists its parameters as [`Param`]s (a name, a kind with its
//! default and bounds, a line of documentation). [`check`] reads a config's parameter map
//! against that list: unknown keys (with a "did you mean"), wrong types and values out of
//! range are refused with one message each, and what passes comes back typed as [`Args`].
//! The same list writes the docs table's "parameters" column ([`Param::doc_cell`]), so the
//! messages, the defaults and the documentation cannot drift apart.

use serde_json::Value;

/// One parameter of an entry.
#[derive(Clone, Copy, Debug)]
pub struct Param {
    pub name: &'static str,
    pub kind: Kind,
    /// In the entry's label even when it has its default (`best_of_n(n=8)`).
    pub always_labelled: bool,
}

/// What a parameter holds, with its default and bounds.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// true or false.
    Flag { default: bool },
    /// An integer in `min..=max`.
    Count {
        default: usize,
        min: usize,
        max: usize,
    },
    /// A non-empty string; absent by default.
    Text,
    /// A language name (letters, spaces, hyphens; at most 40 characters); required.
    Language,
    /// A list of the shipped injection rules' ids; absent by default (all of them).
    RuleIds,
}

impl Param {
    pub const fn flag(name: &'static str, default: bool) -> Param {
        Param {
            name,
            kind: Kind::Flag { default },
            always_labelled: false,
        }
    }

    pub const fn count(name: &'static str, default: usize, min: usize, max: usize) -> Param {
        Param {
            name,
            kind: Kind::Count { default, min, max },
            always_labelled: false,
        }
    }

    pub const fn text(name: &'static str) -> Param {
        Param {
            name,
            kind: Kind::Text,
            always_labelled: false,
        }
    }

    pub const fn language(name: &'static str) -> Param {
        Param {
            name,
            kind: Kind::Language,
            always_labelled: true,
        }
    }

    pub const fn rule_ids(name: &'static str) -> Param {
        Param {
            name,
            kind: Kind::RuleIds,
            always_labelled: false,
        }
    }

    /// Named in the label even at its default.
    pub const fn labelled(mut self) -> Param {
        self.always_labelled = true;
        self
    }

    fn default_arg(&self) -> Option<Arg> {
        match self.kind {
            Kind::Flag { default } => Some(Arg::Flag(default)),
            Kind::Count { default, .. } => Some(Arg::Count(default)),
            Kind::Text | Kind::RuleIds => Some(Arg::Absent),
            Kind::Language => None,
        }
    }

    /// The docs table's cell: `` `name` (default, bounds) ``.
    pub fn doc_cell(&self) -> String {
        let n = self.name;
        match self.kind {
            Kind::Flag { default } => format!("`{n}` ({default})"),
            Kind::Count { default, min, max } => {
                format!("`{n}` ({}, {}–{})", group(default), group(min), group(max))
            }
            Kind::Text => format!("`{n}` (a string)"),
            Kind::Language => format!("`{n}` (required)"),
            Kind::RuleIds => format!("`{n}` (rule ids; all)"),
        }
    }
}

/// Thousands with a comma (`10,000`), as the docs write them.
fn group(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A checked parameter value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Arg {
    Flag(bool),
    Count(usize),
    Text(String),
    Ids(Vec<String>),
    /// An optional parameter left out.
    Absent,
}

/// An entry's parameters, checked and typed, in the order the entry declares them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Args(Vec<(&'static str, Arg)>);

impl Args {
    fn get(&self, name: &str) -> &Arg {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| a)
            .unwrap_or_else(|| panic!("{name} is not a declared parameter"))
    }

    /// A `Flag` parameter's value.
    pub fn flag(&self, name: &str) -> bool {
        match self.get(name) {
            Arg::Flag(b) => *b,
            other => panic!("{name} is {other:?}, not a flag"),
        }
    }

    /// A `Count` parameter's value.
    pub fn count(&self, name: &str) -> usize {
        match self.get(name) {
            Arg::Count(n) => *n,
            other => panic!("{name} is {other:?}, not a count"),
        }
    }

    /// A `Text` or `Language` parameter's value (`None` when left out).
    pub fn text(&self, name: &str) -> Option<&str> {
        match self.get(name) {
            Arg::Text(s) => Some(s),
            Arg::Absent => None,
            other => panic!("{name} is {other:?}, not a text"),
        }
    }

    /// A `RuleIds` parameter's value (`None` when left out).
    pub fn ids(&self, name: &str) -> Option<&[String]> {
        match self.get(name) {
            Arg::Ids(v) => Some(v),
            Arg::Absent => None,
            other => panic!("{name} is {other:?}, not a list of ids"),
        }
    }

    /// `k=v` for each parameter that is not its default (or is always labelled), joined
    /// by `,`: the part of an entry's label in parentheses.
    pub fn label(&self, params: &[Param]) -> String {
        let mut parts = Vec::new();
        for p in params {
            let arg = self.get(p.name);
            if !p.always_labelled && p.default_arg().as_ref() == Some(arg) {
                continue;
            }
            let v = match arg {
                Arg::Flag(b) => b.to_string(),
                Arg::Count(n) => n.to_string(),
                Arg::Text(s) => s.clone(),
                Arg::Ids(v) => v.join("|"),
                Arg::Absent => continue,
            };
            parts.push(format!("{}={v}", p.name));
        }
        parts.join(",")
    }
}

/// How an extension point's messages read, as each has always written them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Converters: a value is named `entry.key` (`best_of_n.n`); every unknown key is
    /// reported before any value is checked.
    Converter,
    /// Mitigations: a value is named by its key (`length`); the keys are checked one by
    /// one in order, an unknown one with a "did you mean".
    Mitigation,
}

/// Read `given` (a YAML/JSON map, or null for none) against `params`. `Err` is one
/// message naming the parameter.
pub fn check(
    entry: &str,
    params: &[Param],
    given: &serde_json::Map<String, Value>,
    style: Style,
) -> Result<Args, String> {
    let names: Vec<&str> = params.iter().map(|p| p.name).collect();
    let unknown = |key: &str| {
        let hint = match style {
            Style::Mitigation => crate::text::did_you_mean(key, &names)
                .map(|s| format!(" (did you mean {s:?}?)"))
                .unwrap_or_default(),
            Style::Converter => String::new(),
        };
        format!(
            "{key:?} is not a parameter of {entry}{hint}; it takes: {}",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        )
    };
    let find = |key: &str| params.iter().find(|p| p.name == key);
    match style {
        Style::Converter => {
            if let Some(key) = given.keys().find(|k| find(k).is_none()) {
                return Err(unknown(key));
            }
        }
        Style::Mitigation => {
            for (key, v) in given {
                match find(key) {
                    None => return Err(unknown(key)),
                    Some(p) => {
                        value(entry, p, Some(v), style)?;
                    }
                }
            }
        }
    }
    let mut args = Vec::with_capacity(params.len());
    for p in params {
        args.push((p.name, value(entry, p, given.get(p.name), style)?));
    }
    Ok(Args(args))
}

/// One parameter's value: checked, typed, or its default when absent.
fn value(entry: &str, p: &Param, v: Option<&Value>, style: Style) -> Result<Arg, String> {
    let who = match style {
        Style::Converter => format!("{entry}.{}", p.name),
        Style::Mitigation => p.name.to_owned(),
    };
    Ok(match (p.kind, v) {
        (Kind::Language, v) => match v.and_then(Value::as_str) {
            Some(l)
                if !l.trim().is_empty()
                    && l.chars().count() <= 40
                    && l.chars().all(|c| c.is_alphabetic() || c == ' ' || c == '-') =>
            {
                // Letters, spaces and hyphens: the language is part of a label and of
                // attempt ids, which must not collide (`x)+base64`).
                Arg::Text(l.trim().to_owned())
            }
            _ => {
                return Err(format!(
                    "{entry} needs {}: a language name (letters, spaces, hyphens), like French",
                    p.name
                ));
            }
        },
        (_, None) => p.default_arg().expect("only a language is required"),
        (Kind::Flag { .. }, Some(Value::Bool(b))) => Arg::Flag(*b),
        (Kind::Flag { .. }, Some(v)) => {
            return Err(format!("{who} must be true or false, not {}", kind(v)));
        }
        (Kind::Count { min, max, .. }, Some(v)) => v
            .as_u64()
            .map(|n| n as usize)
            .filter(|n| (min..=max).contains(n))
            .map(Arg::Count)
            .ok_or_else(|| format!("{who} must be an integer from {min} to {max}"))?,
        (Kind::Text, Some(v)) => match v.as_str() {
            Some(s) if !s.is_empty() => Arg::Text(s.to_owned()),
            _ => return Err(format!("{who} must be a non-empty string")),
        },
        (Kind::RuleIds, Some(v)) => {
            let pack = crate::detect::rules::RulePack::default_pack();
            let ids = v.as_array().and_then(|a| {
                a.iter()
                    .map(|v| {
                        v.as_str()
                            .filter(|id| pack.rules.iter().any(|r| r.id == *id))
                            .map(str::to_owned)
                    })
                    .collect::<Option<Vec<String>>>()
            });
            match ids {
                Some(ids) => Arg::Ids(ids),
                None => {
                    return Err(format!(
                        "{who} must be a list of rule ids from data/rules/injection.toml"
                    ));
                }
            }
        }
    })
}

/// The JSON kind of a value, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

/// A markdown table, header and rows, cells as given.
pub fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!(
        "| {} |\n|{}\n",
        header.join(" | "),
        "---|".repeat(header.len())
    );
    for r in rows {
        out.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARAMS: &[Param] = &[Param::flag("hint", true), Param::count("parts", 3, 2, 25)];

    fn map(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn checks_keys_types_and_bounds_and_labels_what_is_not_default() {
        let a = check("x", PARAMS, &map(serde_json::json!({})), Style::Converter).unwrap();
        assert!(a.flag("hint"));
        assert_eq!(a.count("parts"), 3);
        assert_eq!(a.label(PARAMS), "");
        let a = check(
            "x",
            PARAMS,
            &map(serde_json::json!({"hint": false, "parts": 4})),
            Style::Converter,
        )
        .unwrap();
        assert_eq!(a.label(PARAMS), "hint=false,parts=4");
        let e = check(
            "x",
            PARAMS,
            &map(serde_json::json!({"part": 4})),
            Style::Mitigation,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "\"part\" is not a parameter of x (did you mean \"parts\"?); it takes: hint, parts"
        );
        let e = check(
            "x",
            PARAMS,
            &map(serde_json::json!({"parts": 26})),
            Style::Mitigation,
        )
        .unwrap_err();
        assert_eq!(e, "parts must be an integer from 2 to 25");
        // converters: unknown keys first, without a hint; mitigations: key by key
        let two = map(serde_json::json!({"parts": 26, "zzz": 1}));
        let e = check("x", PARAMS, &two, Style::Converter).unwrap_err();
        assert_eq!(e, "\"zzz\" is not a parameter of x; it takes: hint, parts");
        let e = check("x", PARAMS, &two, Style::Mitigation).unwrap_err();
        assert_eq!(e, "parts must be an integer from 2 to 25");
        let e = check(
            "x",
            PARAMS,
            &map(serde_json::json!({"hint": 1})),
            Style::Converter,
        )
        .unwrap_err();
        assert_eq!(e, "x.hint must be true or false, not a number");
        assert_eq!(group(10_000), "10,000");
        assert_eq!(group(256), "256");
    }
}
