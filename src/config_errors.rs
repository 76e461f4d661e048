//! How a YAML config's errors are told (experiment configs, judge files): serde's
//! message with a "did you mean" for a misspelt key or value, and the line of a key for
//! checks made after parsing.

/// The line where `a.b.c` appears (best effort, for checks after parsing): each key is
/// looked for from the line of the key before it, so `evaluation.judge.name` is not
/// mistaken for `model.name`; 0 when not found.
pub(crate) fn line_of_key(text: &str, key: &str) -> u64 {
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0usize;
    let mut found = None;
    for part in key.split('.') {
        let hit = lines.iter().enumerate().skip(from).find(|(_, l)| {
            let t = l.trim_start().trim_start_matches("- ");
            t.starts_with(&format!("{part}:"))
                || t.contains(&format!(" {part}:"))
                || t.contains(&format!("{{{part}:"))
        });
        match hit {
            Some((i, _)) => {
                from = i;
                found = Some(i);
            }
            None => break,
        }
    }
    found.map_or(0, |i| i as u64 + 1)
}

/// serde's message, with a "did you mean" for an unknown key or value.
pub(crate) fn explain(message: &str) -> String {
    // "unknown field `sede`, expected one of `name`, `seed` at line 2 column 3"
    let message = match message.find(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
    // serde_yaml_ng prefixes the key path ("experiment: unknown field …"); the error
    // already names the key, so drop it.
    let message = match message.split_once(": ") {
        Some((path, rest)) if !path.contains(' ') && !path.is_empty() => rest,
        _ => message,
    };
    let quoted: Vec<&str> = message.split('`').skip(1).step_by(2).collect();
    let unknown = message.starts_with("unknown field") || message.starts_with("unknown variant");
    if unknown
        && quoted.len() >= 2
        && let Some(s) = crate::text::did_you_mean(quoted[0], &quoted[1..])
    {
        return format!("{message} (did you mean `{s}`?)");
    }
    message.to_owned()
}
