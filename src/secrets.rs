//! Secrets: the API keys and credentials pieval was given, kept out of every text that
//! reaches an artifact or a terminal — in whatever spelling the text holds them.
//!
//! An endpoint can echo a key back in many spellings: as it is, in JSON `\u` escapes
//! (`\u0073k-…`, or only some characters escaped: `sk-li\u0076e…`), percent-encoded, in
//! HTML character references, with zero-width characters between its letters, escaped
//! twice (a tool call's JSON `arguments` inside the JSON body), base64 or hex encoded
//! (alone, or inside a larger base64 text such as an `Authorization: Basic` header).
//! Redaction works on what a text means, not how it is spelled: the text is decoded
//! (JSON escapes, `\xHH`, percent-encoding, HTML numeric references; zero-width
//! characters dropped) layer by layer, up to four layers, each byte of a layer knowing
//! the range of the original text it came from; the key and its base64 and hex forms
//! are looked for in the text and in every layer; whatever range of the original text
//! spells one is replaced by `[REDACTED]`. A base64 form is the key's run of characters
//! at each of the three alignments, widened by one character on each side (those carry
//! some of the key's bits too).
//!
//! The keys are registered when a client is built from them (`provider::openai`, the
//! object store's credentials) and every client redacts them all: one endpoint's answer
//! never carries another's key into a file either. A placeholder (`none`, `test`,
//! `sk-xxx…`) or a key under 8 characters is not a secret: redacting it would rewrite
//! ordinary words in answers.

use std::borrow::Cow;
use std::sync::RwLock;

use aho_corasick::AhoCorasick;
use base64::Engine;

/// What a secret is replaced by.
pub const REDACTED: &str = "[REDACTED]";

/// Layers of encoding undone at most (a tool call's arguments inside a JSON body are two;
/// a percent-encoded value inside them three).
const MAX_LAYERS: usize = 4;

/// The registered secrets and the automaton over all their spellings.
struct Registry {
    keys: Vec<String>,
    /// Every key and its encoded forms; a match of pattern `i` is one spelling.
    forms: Option<AhoCorasick>,
    /// For each pattern of `forms`: whether it is a base64 run (widened by a character
    /// on each side when found).
    widen: Vec<bool>,
}

static REGISTRY: RwLock<Registry> = RwLock::new(Registry {
    keys: Vec::new(),
    forms: None,
    widen: Vec::new(),
});

/// Whether `key` is a secret to redact: not a placeholder local servers accept, and at
/// least 8 characters.
pub fn is_secret(key: &str) -> bool {
    const PLACEHOLDERS: [&str; 12] = [
        "none",
        "null",
        "test",
        "dummy",
        "empty",
        "not-needed",
        "no-key",
        "placeholder",
        "changeme",
        "ollama",
        "lm-studio",
        "sk-no-key-required",
    ];
    let placeholder = PLACEHOLDERS.iter().any(|p| key.eq_ignore_ascii_case(p))
        || key
            .trim_start_matches("sk-")
            .chars()
            .all(|c| c == 'x' || c == 'X');
    key.chars().count() >= 8 && !placeholder
}

/// Register `key`: from now on every [`redact`] removes it in any spelling. A key that is
/// no secret ([`is_secret`]) is not registered.
pub fn register(key: &str) {
    if !is_secret(key) {
        return;
    }
    let mut r = REGISTRY.write().unwrap_or_else(|p| p.into_inner());
    if r.keys.iter().any(|k| k == key) {
        return;
    }
    r.keys.push(key.to_owned());
    rebuild(&mut r);
}

/// Forget `key` (a credential that opens nothing any more: a served world's token once
/// its world has ended), so the registry stays as large as the credentials alive.
pub fn unregister(key: &str) {
    let mut r = REGISTRY.write().unwrap_or_else(|p| p.into_inner());
    let before = r.keys.len();
    r.keys.retain(|k| k != key);
    if r.keys.len() == before {
        return;
    }
    rebuild(&mut r);
}

fn rebuild(r: &mut Registry) {
    let mut patterns: Vec<String> = Vec::new();
    let mut widen = Vec::new();
    for k in &r.keys {
        for (p, w) in spellings(k) {
            patterns.push(p);
            widen.push(w);
        }
    }
    r.forms = (!patterns.is_empty())
        .then(|| AhoCorasick::new(&patterns).ok())
        .flatten();
    r.widen = widen;
}

/// The forms of `key` looked for as they are: the key, its hex (both cases), and its
/// base64 runs (standard and URL-safe alphabets) at each alignment (`true`: widen).
fn spellings(key: &str) -> Vec<(String, bool)> {
    let bytes = key.as_bytes();
    let mut out = vec![(key.to_owned(), false)];
    out.push((hex::encode(bytes), false));
    out.push((hex::encode_upper(bytes), false));
    for engine in [
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for a in 0..3usize {
            // The characters whose six bits all come from the key: from bit 8a to bit
            // 8a + 8n of a text that starts a bytes before the key.
            let mut padded = vec![0u8; a];
            padded.extend_from_slice(bytes);
            padded.extend_from_slice(&[0, 0]);
            let text = engine.encode(&padded);
            let first = (8 * a).div_ceil(6);
            let last = (8 * a + 8 * bytes.len()) / 6;
            if last > first + 4 {
                out.push((text[first..last].to_owned(), true));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Short-lived credentials pieval made itself (a served world's token, alive while its
/// world is): random hex, spelled the same in JSON, URLs and HTML, redacted as they are
/// — they come and go with every attempt, and the automaton of [`register`] is not
/// rebuilt for each.
static EPHEMERAL: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Register a short-lived credential of pieval's own (see [`EPHEMERAL`]).
pub fn register_ephemeral(token: &str) {
    if is_secret(token) {
        EPHEMERAL
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(token.to_owned());
    }
}

/// Forget a short-lived credential: it opens nothing any more.
pub fn unregister_ephemeral(token: &str) {
    EPHEMERAL
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|t| t != token);
}

/// `text` with every registered secret, in any spelling, and every short-lived
/// credential alive replaced by [`REDACTED`]; and whether anything was.
pub fn redact(text: &str) -> (Cow<'_, str>, bool) {
    let alive = EPHEMERAL.read().unwrap_or_else(|p| p.into_inner());
    if !alive.iter().any(|t| text.contains(t.as_str())) {
        drop(alive);
        return redact_registered(text);
    }
    let mut owned = text.to_owned();
    for t in alive.iter() {
        if owned.contains(t.as_str()) {
            owned = owned.replace(t.as_str(), REDACTED);
        }
    }
    drop(alive);
    let out = redact_registered(&owned).0.into_owned();
    (Cow::Owned(out), true)
}

fn redact_registered(text: &str) -> (Cow<'_, str>, bool) {
    // A lock poisoned by a panic elsewhere still holds the keys: redaction never stops.
    let r = REGISTRY.read().unwrap_or_else(|p| p.into_inner());
    let Some(forms) = &r.forms else {
        return (Cow::Borrowed(text), false);
    };
    let mut spans: Vec<(usize, usize)> = Vec::new();
    // In the text as it is, a match that begins or ends inside an escape (`\n`, `\u00e9`,
    // `%2F`) takes the whole escape: replacing half of one would break the JSON or URL
    // the text is (the decoded layers below are whole characters already).
    let raw = text.as_bytes();
    find(
        forms,
        &r.widen,
        raw,
        &|i| escape_at(raw, i).map_or(i, |(s, _)| s),
        &|i| escape_at(raw, i).map_or(i + 1, |(_, e)| e),
        &mut spans,
    );
    // Texts past 4 GiB are searched as they are only (a layer maps its bytes with u32).
    if text.len() > u32::MAX as usize {
        return finish(text, spans);
    }
    // The layers of decoding, each mapped back to the original text.
    let mut layer: Option<(String, Vec<u32>)> = None;
    for _ in 0..MAX_LAYERS {
        let current = layer.as_ref().map_or(text, |(t, _)| t.as_str());
        let Some((decoded, starts)) = decode(current) else {
            break;
        };
        // Where each byte of the new layer starts in the original text.
        let starts: Vec<u32> = match &layer {
            None => starts,
            Some((_, prev)) => starts.iter().map(|&s| prev[s as usize]).collect(),
        };
        {
            let end_of =
                |i: usize| -> usize { starts.get(i + 1).map_or(text.len(), |&s| s as usize) };
            let start_of = |i: usize| starts[i] as usize;
            find(
                forms,
                &r.widen,
                decoded.as_bytes(),
                &start_of,
                &end_of,
                &mut spans,
            );
        }
        layer = Some((decoded, starts));
    }
    finish(text, spans)
}

/// The escape sequence of the text holding its byte `i`, if one does: a JSON escape
/// (`\n`, `\uXXXX`), `\xHH`, or a percent-escape (`%HH`); its range.
fn escape_at(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let hex = |k: usize| b.get(k).is_some_and(u8::is_ascii_hexdigit);
    for j in i.saturating_sub(5)..=i {
        let len = match b.get(j) {
            Some(b'\\') => {
                // Not itself escaped: an even run of backslashes before it.
                let run = b[..j].iter().rev().take_while(|&&c| c == b'\\').count();
                if run % 2 == 1 {
                    continue;
                }
                match b.get(j + 1) {
                    Some(b'u') if (2..6).all(|k| hex(j + k)) => 6,
                    Some(b'x') if (2..4).all(|k| hex(j + k)) => 4,
                    Some(_) => 2,
                    None => continue,
                }
            }
            Some(b'%') if hex(j + 1) && hex(j + 2) => 3,
            _ => continue,
        };
        if j < i && i < j + len {
            return Some((j, j + len));
        }
        if j == i {
            // `i` starts an escape: the escape is whole from here.
            return None;
        }
    }
    None
}

/// `text` with `spans` (ranges of it) replaced by [`REDACTED`].
fn finish(text: &str, mut spans: Vec<(usize, usize)>) -> (Cow<'_, str>, bool) {
    if spans.is_empty() {
        return (Cow::Borrowed(text), false);
    }
    spans.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0usize;
    for (s, e) in spans {
        if e <= at {
            continue;
        }
        let s = s.max(at);
        // The ranges follow whole characters of the original text.
        out.push_str(&text[at..s]);
        if !out.ends_with(REDACTED) {
            out.push_str(REDACTED);
        }
        at = e;
    }
    out.push_str(&text[at..]);
    (Cow::Owned(out), true)
}

/// Matches of `forms` in `hay` (the text, or a decoded layer of it), as ranges of the
/// original text (`start_of` / `end_of` a byte of `hay`).
fn find(
    forms: &AhoCorasick,
    widen: &[bool],
    hay: &[u8],
    start_of: &dyn Fn(usize) -> usize,
    end_of: &dyn Fn(usize) -> usize,
    spans: &mut Vec<(usize, usize)>,
) {
    for m in forms.find_overlapping_iter(hay) {
        let (s, e) = widened(hay, m.start(), m.end(), widen[m.pattern().as_usize()]);
        spans.push((start_of(s), end_of(e - 1)));
    }
}

/// A base64 run's range widened by a base64 character on each side.
fn widened(hay: &[u8], s: usize, e: usize, widen: bool) -> (usize, usize) {
    if !widen {
        return (s, e);
    }
    let b64 = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_');
    let s = if s > 0 && b64(hay[s - 1]) { s - 1 } else { s };
    let e = if e < hay.len() && b64(hay[e]) {
        e + 1
    } else {
        e
    };
    (s, e)
}

/// One layer of decoding of `text`: JSON string escapes (`\uXXXX` with surrogate pairs,
/// `\n`, `\/`, …), `\xHH`, percent-encoding of ASCII (`%73`), HTML numeric references
/// (`&#115;`, `&#x73;`); zero-width characters and soft hyphens dropped. The decoded text
/// and, for each of its bytes, where in `text` the character it belongs to starts; `None`
/// when nothing would change.
fn decode(text: &str) -> Option<(String, Vec<u32>)> {
    let b = text.as_bytes();
    let interesting = b
        .iter()
        .any(|&c| matches!(c, b'\\' | b'%' | b'&') || c >= 0xc2);
    if !interesting {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut starts: Vec<u32> = Vec::with_capacity(text.len());
    let mut changed = false;
    let hex = |s: &[u8]| -> Option<u32> {
        if s.is_empty() || !s.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        u32::from_str_radix(std::str::from_utf8(s).ok()?, 16).ok()
    };
    let mut i = 0usize;
    while i < b.len() {
        let at = i as u32;
        let (decoded, used): (Option<char>, usize) = match b[i] {
            b'\\' if i + 1 < b.len() => match b[i + 1] {
                b'u' => match b.get(i + 2..i + 6).and_then(hex) {
                    Some(hi @ 0xd800..=0xdbff) => {
                        // A surrogate pair: `\uD83D\uDE00`.
                        let lo = (b.get(i + 6..i + 8) == Some(b"\\u"))
                            .then(|| b.get(i + 8..i + 12).and_then(hex))
                            .flatten()
                            .filter(|lo| (0xdc00..=0xdfff).contains(lo));
                        match lo {
                            Some(lo) => (
                                char::from_u32(0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)),
                                12,
                            ),
                            None => (Some('\u{fffd}'), 6),
                        }
                    }
                    Some(c) => (char::from_u32(c).or(Some('\u{fffd}')), 6),
                    None => (None, 1),
                },
                b'x' => match b.get(i + 2..i + 4).and_then(hex) {
                    Some(c) => (char::from_u32(c), 4),
                    None => (None, 1),
                },
                b'n' => (Some('\n'), 2),
                b't' => (Some('\t'), 2),
                b'r' => (Some('\r'), 2),
                b'b' => (Some('\u{8}'), 2),
                b'f' => (Some('\u{c}'), 2),
                b'/' => (Some('/'), 2),
                b'\\' => (Some('\\'), 2),
                b'"' => (Some('"'), 2),
                b'\'' => (Some('\''), 2),
                _ => (None, 1),
            },
            b'%' => match b.get(i + 1..i + 3).and_then(hex) {
                Some(c) if c < 0x80 => (char::from_u32(c), 3),
                _ => (None, 1),
            },
            b'&' if b.get(i + 1) == Some(&b'#') => {
                let (radix, skip) = match b.get(i + 2) {
                    Some(b'x' | b'X') => (16, 3),
                    _ => (10, 2),
                };
                let end = b[i + skip..]
                    .iter()
                    .take(8)
                    .position(|&c| c == b';')
                    .map(|p| i + skip + p);
                match end {
                    Some(end) if end > i + skip => {
                        let n = std::str::from_utf8(&b[i + skip..end])
                            .ok()
                            .and_then(|s| u32::from_str_radix(s, radix).ok());
                        match n.and_then(char::from_u32) {
                            Some(c) => (Some(c), end + 1 - i),
                            None => (None, 1),
                        }
                    }
                    _ => (None, 1),
                }
            }
            _ => (None, 1),
        };
        match decoded {
            Some(c) => {
                changed = true;
                push(&mut out, &mut starts, c, at);
                i += used;
            }
            None => {
                // A character as it is (whole: `i` is on a character boundary).
                let c = text[i..].chars().next().unwrap_or('\u{fffd}');
                let len = c.len_utf8();
                if matches!(
                    c,
                    '\u{200b}' | '\u{200c}' | '\u{200d}' | '\u{2060}' | '\u{feff}' | '\u{ad}'
                ) {
                    changed = true;
                } else {
                    push(&mut out, &mut starts, c, at);
                }
                i += len;
            }
        }
    }
    changed.then_some((out, starts))
}

fn push(out: &mut String, starts: &mut Vec<u32>, c: char, at: u32) {
    out.push(c);
    starts.extend(std::iter::repeat_n(at, c.len_utf8()));
}

/// Every key registered so far (for a test that checks none is left anywhere).
pub fn registered() -> Vec<String> {
    REGISTRY.read().map(|r| r.keys.clone()).unwrap_or_default()
}

/// A random hex string of `bytes` bytes (a token for a local server).
pub fn random_hex(bytes: usize) -> crate::error::Result<String> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b)
        .map_err(|e| crate::error::Error::Internal(format!("no randomness: {e}")))?;
    Ok(hex::encode(b))
}

/// Equal tokens, compared in time independent of where they differ.
pub fn same_token(given: Option<&str>, want: &str) -> bool {
    let Some(g) = given else { return false };
    g.len() == want.len()
        && g.bytes()
            .zip(want.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-live-9fQ2xZ7pLm4KtR8wVb3N";

    /// Every spelling of the key a hostile endpoint might echo, inside other text.
    fn spellings_of(key: &str) -> Vec<(&'static str, String)> {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let b64url = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let json_all: String = key
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect();
        let json_some: String = key
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if i % 3 == 1 {
                    format!("\\u{:04X}", c as u32)
                } else {
                    c.to_string()
                }
            })
            .collect();
        let pct_all: String = key.bytes().map(|c| format!("%{c:02X}")).collect();
        let pct_some: String = key
            .bytes()
            .enumerate()
            .map(|(i, c)| {
                if i % 2 == 0 {
                    format!("%{c:02x}")
                } else {
                    (c as char).to_string()
                }
            })
            .collect();
        let html: String = key.bytes().map(|c| format!("&#{c};")).collect();
        let html_hex: String = key.bytes().map(|c| format!("&#x{c:x};")).collect();
        let zero_width: String = key.chars().flat_map(|c| [c, '\u{200b}']).collect();
        let double_json: String = key
            .chars()
            .map(|c| format!("\\\\u{:04x}", c as u32))
            .collect();
        let pct_in_json: String = key.bytes().map(|c| format!("\\u0025{c:02x}")).collect();
        let double_pct: String = key.bytes().map(|c| format!("%25{c:02X}")).collect();
        vec![
            ("plain", key.to_owned()),
            ("json \\u, every character", json_all),
            ("json \\u, some characters (split)", json_some),
            ("percent-encoded", pct_all),
            ("percent-encoded, some", pct_some),
            ("percent-encoded twice", double_pct),
            ("html references", html),
            ("html hex references", html_hex),
            ("zero-width characters between", zero_width),
            ("json escaped twice (a tool call's arguments)", double_json),
            ("percent inside json", pct_in_json),
            ("base64", b64(key)),
            ("base64 url-safe", b64url(key)),
            ("base64 after 1 byte", b64(&format!("x{key}"))),
            ("base64 after 2 bytes", b64(&format!("xy{key}"))),
            ("basic auth", b64(&format!("user:{key}"))),
            ("hex", hex::encode(key)),
            ("HEX", hex::encode_upper(key)),
            (
                "\\x escapes",
                key.bytes().map(|c| format!("\\x{c:02x}")).collect(),
            ),
        ]
    }

    /// Whether `text` still holds the key in a spelling a reader could undo: decoded
    /// every way the test knows (independently of the redactor: serde's JSON unescape,
    /// a percent decoder, base64 of every run of its alphabet at every offset, hex).
    fn still_holds(text: &str, key: &str) -> bool {
        // Each way of reading the text, applied to every view, three times over.
        let unescape = regex::Regex::new(r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})|&#x([0-9a-fA-F]+);|&#([0-9]+);|%([0-9a-fA-F]{2})").unwrap();
        let mut views = vec![text.to_owned()];
        for _ in 0..3 {
            let mut next = Vec::new();
            for v in &views {
                let decoded = unescape.replace_all(v, |c: &regex::Captures| {
                    let (hex, radix) =
                        match (c.get(1).or(c.get(2)).or(c.get(3)).or(c.get(5)), c.get(4)) {
                            (Some(h), _) => (h.as_str(), 16),
                            (None, Some(d)) => (d.as_str(), 10),
                            _ => unreachable!(),
                        };
                    u32::from_str_radix(hex, radix)
                        .ok()
                        .and_then(char::from_u32)
                        .map(String::from)
                        .unwrap_or_default()
                });
                next.push(decoded.replace("\\\\", "\\").replace('\u{200b}', ""));
                next.push(v.replace("\\\\", "\\"));
            }
            views.extend(next);
        }
        use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
        let lenient = GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true);
        let engines = [
            GeneralPurpose::new(&base64::alphabet::STANDARD, lenient),
            GeneralPurpose::new(&base64::alphabet::URL_SAFE, lenient),
        ];
        for v in &views {
            if v.contains(key)
                || v.contains(&hex::encode(key))
                || v.contains(&hex::encode_upper(key))
            {
                return true;
            }
            for run in v.split(|c: char| !(c.is_ascii_alphanumeric() || "+/-_".contains(c))) {
                for off in 0..4.min(run.len()) {
                    let r = &run[off..];
                    let r = if r.len() % 4 == 1 {
                        &r[..r.len() - 1]
                    } else {
                        r
                    };
                    for e in &engines {
                        if let Ok(d) = e.decode(r)
                            && d.windows(key.len()).any(|w| w == key.as_bytes())
                        {
                            return true;
                        }
                    }
                }
            }
        }
        false
    }

    #[test]
    fn a_short_lived_token_is_redacted_while_alive() {
        let t = "0123456789abcdef0123456789abcdef";
        register_ephemeral(t);
        let text = format!("{{\"token\":\"{t}\"}}");
        let (r, hit) = redact(&text);
        assert!(hit && !r.contains(t), "{r}");
        unregister_ephemeral(t);
        assert!(!redact(t).1);
    }

    #[test]
    fn an_unregistered_key_is_no_longer_redacted_and_the_registry_stays_small() {
        let key = "world-token-4f1c9e2b7a6d";
        register(key);
        assert!(redact(&format!("x {key} y")).1);
        let n = registered().len();
        unregister(key);
        assert_eq!(registered().len(), n - 1);
        assert!(!registered().iter().any(|k| k == key));
        unregister(key); // twice: nothing
        assert_eq!(registered().len(), n - 1);
    }

    #[test]
    fn a_key_in_any_spelling_is_redacted_and_the_rest_is_kept() {
        register(KEY);
        for (what, spelled) in spellings_of(KEY) {
            let text = format!("{{\"content\": \"before {spelled} after\"}}");
            assert!(
                still_holds(&text, KEY),
                "{what}: the test's decoder misses it"
            );
            let (out, changed) = redact(&text);
            assert!(changed, "{what}: {text}");
            assert!(!still_holds(&out, KEY), "{what}: {text} -> {out}");
            assert!(
                out.contains("before ") && out.contains(" after"),
                "{what}: {out}"
            );
            assert!(out.contains(REDACTED), "{what}: {out}");
        }
        // A tool call's arguments: JSON inside a JSON string, the key escaped in it.
        let body = serde_json::json!({"tool_calls": [{"function": {"name": "send",
            "arguments": serde_json::json!({"token": KEY}).to_string()
                .replace("sk-", "\\u0073\\u006b-")}}]})
        .to_string();
        let (out, changed) = redact(&body);
        assert!(changed && !still_holds(&out, KEY), "{out}");
        serde_json::from_str::<serde_json::Value>(&out).expect("still JSON");
        // Whatever comes before or after it — an escape, a multi-byte character — the
        // text stays the JSON it was.
        for (what, spelled) in spellings_of(KEY) {
            for (before, after) in [
                ("\\n", "\\n"),
                ("\\u00e9", "\\/"),
                ("%2F", "é"),
                ("\\\\", "\\t"),
            ] {
                let body = format!("{{\"content\": \"x{before}{spelled}{after}y\"}}");
                if serde_json::from_str::<serde_json::Value>(&body).is_err() {
                    continue;
                }
                let (out, _) = redact(&body);
                serde_json::from_str::<serde_json::Value>(&out)
                    .unwrap_or_else(|e| panic!("{what} after {before:?}: {body} -> {out}: {e}"));
                assert!(!still_holds(&out, KEY), "{what} after {before:?}: {out}");
            }
        }
        // Text without the key is returned as it is.
        let clean = "Nothing to see: \\u0041 %41 &#65; here.";
        assert_eq!(redact(clean), (Cow::Borrowed(clean), false));
    }

    #[test]
    fn placeholders_and_short_keys_are_no_secrets() {
        for k in ["test", "sk-xxxx", "none", "short", "sk-no-key-required"] {
            assert!(!is_secret(k), "{k}");
        }
        assert!(is_secret(KEY));
        register("test");
        assert_eq!(redact("This is a test answer").1, false);
    }

    #[test]
    fn decoding_keeps_where_each_byte_came_from() {
        let (d, starts) = decode("a\\u0062c%64\u{200b}e&#102;").unwrap();
        assert_eq!(d, "abcdef");
        assert_eq!(starts, vec![0, 1, 7, 8, 14, 15]);
        assert!(decode("plain text").is_none());
    }
}

/// The secret held by environment variable `var`, registered for redaction (in every
/// text of every client from then on); an error naming `key` (the config key that names
/// the variable) when it is not set. Read by every target that is given credentials.
pub fn from_env(key: &str, var: &str) -> crate::error::Result<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => {
            let v = v.trim().to_owned();
            register(&v);
            Ok(v)
        }
        _ => Err(crate::error::Error::State(format!(
            "{key} names {var}, but that environment variable is not set: export {var}=… (it is never written to any artifact)"
        ))),
    }
}
