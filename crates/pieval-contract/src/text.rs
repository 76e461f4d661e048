//! Small text helpers shared by the CLI, the contract and the config loaders.

/// The closest candidate to `word` by edit distance, if it is plausibly a typo.
pub fn did_you_mean<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1) + 1;
    candidates
        .iter()
        .map(|c| (edit_distance(word, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars (inputs here are short keys, so O(n·m) is fine).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// An error and its sources, `a: b: c`, each part once (HTTP clients repeat their
/// causes in their own messages).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = inner.source();
    }
    s
}

/// A short, single-line, escaped excerpt of hostile text for messages.
pub fn excerpt(s: &str, max_chars: usize) -> String {
    let mut out: String = s
        .chars()
        .take(max_chars)
        .collect::<String>()
        .escape_debug()
        .to_string();
    if s.chars().count() > max_chars {
        out.push('…');
    }
    out
}

/// Characters that must not reach a terminal raw: C0 controls (ESC, BEL, CR …), DEL, C1
/// controls, and the bidirectional overrides and isolates that reorder what is shown
/// (Trojan Source, CVE-2021-42574).
fn is_terminal_unsafe(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Text bound for a terminal, several lines allowed: every unsafe character except `\n`
/// and `\t` shown escaped (`\u{1b}`), so hostile text can neither move the cursor,
/// recolour, retitle nor reorder the screen. Everything else is unchanged.
pub fn terminal(s: &str) -> std::borrow::Cow<'_, str> {
    escape_where(s, |c| is_terminal_unsafe(c) && c != '\n' && c != '\t')
}

/// One line of text bound for a terminal (a table cell, a name): every unsafe character,
/// line breaks and tabs included, shown escaped.
pub fn escape_control(s: &str) -> std::borrow::Cow<'_, str> {
    escape_where(s, is_terminal_unsafe)
}

fn escape_where(s: &str, unsafe_char: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(&unsafe_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            match c {
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                _ => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            }
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The bidirectional overrides and isolates (Trojan Source) shown escaped (`\u{202e}`),
/// for HTML: its escaping leaves them, and they reorder what a reader sees.
pub fn escape_bidi(s: &str) -> std::borrow::Cow<'_, str> {
    escape_where(
        s,
        |c| matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'),
    )
}

/// The current UTC time as `YYYYMMDDTHHMMSSZ` (for default run ids).
pub fn utc_compact_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_compact(secs)
}

/// `YYYYMMDDTHHMMSSZ` for seconds since the Unix epoch.
pub fn utc_compact(secs: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(secs);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

/// RFC 3339 (`YYYY-MM-DDTHH:MM:SSZ`) for seconds since the Unix epoch.
pub fn utc_rfc3339(secs: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(secs);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// Now, RFC 3339 in UTC with microseconds (`2026-12-03T10:00:00.123456Z`): fixed width,
/// so the text orders as the time does (the latest of two verdicts in one second).
pub fn utc_rfc3339_millis() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (y, mo, day, h, mi, s) = civil(d.as_secs());
    format!(
        "{y:04}-{mo:02}-{day:02}T{h:02}:{mi:02}:{s:02}.{:06}Z",
        d.subsec_micros()
    )
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// (year, month, day, hour, minute, second) in UTC (civil-from-days, proleptic
/// Gregorian).
fn civil(secs: u64) -> (i64, i64, i64, u64, u64, u64) {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_keys_only() {
        assert_eq!(
            did_you_mean("atack_family", &["attack_family", "prompt"]),
            Some("attack_family")
        );
        assert_eq!(did_you_mean("zzzzzz", &["attack_family", "prompt"]), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn utc_timestamps() {
        assert_eq!(utc_compact(0), "19700101T000000Z");
        assert_eq!(utc_compact(1_796_032_496), "20261130T095456Z");
        assert_eq!(utc_compact(951_782_400), "20000229T000000Z");
    }

    #[test]
    fn excerpt_escapes_control_characters() {
        assert_eq!(excerpt("a\u{1b}[31mb\n", 10), "a\\u{1b}[31mb\\n");
        assert_eq!(excerpt("abcdef", 3), "abc…");
    }
}
