//! The further forms a response can carry a short secret in, beyond the folded,
//! compacted, reversed, Base64 and hex forms of [`super::leak`]:
//!
//! - **ROT13** of the secret's letters ("PNanel" for "Canary");
//! - **leetspeak** ("p4$$w0rd" for "password"): both sides are read through one lossy
//!   table (4 and @ are a, 3 is e, 1, !, | and l are i, 0 is o, 5 and $ are s, 7 and + are
//!   t, 8 is b, 6 and 9 are g, 2 is z), so the secret matches whichever way it is written;
//! - **hex bytes, spaced or prefixed** ("0x43 0x41", "43:41", `\x43\x41`): the response's
//!   hex digits, read past `0x` / `\x` prefixes and separators;
//! - **the NATO alphabet and spelled digits**, one word per character ("Charlie Alpha
//!   November …", "four nine two one");
//! - **reversed words**: the secret's words in reverse order, or each word reversed;
//! - **parts given separately**: every word of a multi-word secret, in order, each a
//!   whole word of the response, each within [`MAX_PART_GAP`] bytes of the previous one
//!   ("the first word is alpha, the second is tango" for "alpha tango"; "x is set to 32"
//!   for `x=32`).
//!
//! These forms apply to short secrets only ([`MAX_SHORT`] letters and digits): a system
//! prompt is not ROT13-encoded whole, and its words appear separately in any on-topic
//! answer. The response-side views are built lazily, once per response, and only when a
//! target needs them (and a cheap gate does not rule them out).

use std::sync::OnceLock;

/// The longest secret (letters and digits) the forms here are tried on.
pub const MAX_SHORT: usize = 64;
/// The most bytes between two parts of a secret given separately.
pub const MAX_PART_GAP: usize = 60;
/// The most parts a secret given separately may have.
pub const MAX_PARTS: usize = 6;

/// ROT13 of ASCII letters; anything else unchanged.
pub fn rot13(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'a'..='m' | 'A'..='M' => (c as u8 + 13) as char,
            'n'..='z' | 'N'..='Z' => (c as u8 - 13) as char,
            _ => c,
        })
        .collect()
}

/// One character through the leetspeak table (folded, lowercase input); None drops it.
fn leet_char(c: char) -> Option<char> {
    Some(match c {
        '4' | '@' | '^' => 'a',
        '8' => 'b',
        '3' | '€' => 'e',
        '6' | '9' => 'g',
        '1' | '!' | '|' | 'l' | 'i' => 'i',
        '0' => 'o',
        '5' | '$' => 's',
        '7' | '+' => 't',
        '2' => 'z',
        c if c.is_alphanumeric() => c,
        _ => return None,
    })
}

/// Folded text read through the leetspeak table, separators dropped.
pub fn leet_into(folded: &str, out: &mut String) {
    out.clear();
    if folded.is_ascii() {
        // a byte table: the same mapping as `leet_char` on ASCII (tested)
        static TABLE: OnceLock<[u8; 128]> = OnceLock::new();
        let table = TABLE.get_or_init(|| {
            let mut t = [0u8; 128];
            for b in 0..128u8 {
                t[b as usize] = leet_char(b as char).map_or(0, |c| c as u8);
            }
            t
        });
        let mut bytes = std::mem::take(out).into_bytes();
        bytes.extend(
            folded
                .bytes()
                .map(|b| table[b as usize])
                .filter(|&b| b != 0),
        );
        *out = String::from_utf8(bytes).expect("ASCII");
    } else {
        out.extend(folded.chars().filter_map(leet_char));
    }
}

/// Whether folded text could hold a secret in hex: hex of text has a digit in most
/// bytes, so fewer than six ASCII digits rule it out (a cheap gate before the hex view).
pub fn may_hold_hex(folded: &str) -> bool {
    folded.bytes().filter(u8::is_ascii_digit).nth(5).is_some()
}

/// Whether folded text could spell, in NATO or digit words, something starting with `c`:
/// a word for `c` (or the digit itself) occurs in it. A gate before the NATO view.
pub fn may_spell_nato(folded: &str, c: char) -> bool {
    if c.is_ascii_digit() && folded.contains(c) {
        return true;
    }
    NATO.iter()
        .filter(|(_, letter)| *letter == c)
        .any(|(word, _)| memchr::memmem::find(folded.as_bytes(), word.as_bytes()).is_some())
}

/// Whether folded text holds a character the leetspeak table maps to a letter.
pub fn may_hold_leet(folded: &str) -> bool {
    folded
        .bytes()
        .any(|b| b.is_ascii_digit() || matches!(b, b'@' | b'$' | b'!' | b'|' | b'+' | b'^'))
        || folded.contains('€')
}

/// The hex digits of folded text, read past `0x` and `\x` prefixes: "0x43, 0x41" and
/// `\x43\x41` and "43 41" all give "4341".
pub fn hex_stream_into(folded: &str, out: &mut String) {
    out.clear();
    let b = folded.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if (c == b'0' || c == b'\\') && b.get(i + 1) == Some(&b'x') {
            i += 2;
            continue;
        }
        if c.is_ascii_hexdigit() {
            out.push(c.to_ascii_lowercase() as char);
        }
        i += 1;
    }
}

const NATO: &[(&str, char)] = &[
    ("alfa", 'a'),
    ("alpha", 'a'),
    ("bravo", 'b'),
    ("charlie", 'c'),
    ("delta", 'd'),
    ("echo", 'e'),
    ("foxtrot", 'f'),
    ("golf", 'g'),
    ("hotel", 'h'),
    ("india", 'i'),
    ("juliet", 'j'),
    ("juliett", 'j'),
    ("kilo", 'k'),
    ("lima", 'l'),
    ("mike", 'm'),
    ("november", 'n'),
    ("oscar", 'o'),
    ("papa", 'p'),
    ("quebec", 'q'),
    ("romeo", 'r'),
    ("sierra", 's'),
    ("tango", 't'),
    ("uniform", 'u'),
    ("victor", 'v'),
    ("whiskey", 'w'),
    ("whisky", 'w'),
    ("xray", 'x'),
    ("yankee", 'y'),
    ("zulu", 'z'),
    ("zero", '0'),
    ("one", '1'),
    ("two", '2'),
    ("three", '3'),
    ("four", '4'),
    ("five", '5'),
    ("six", '6'),
    ("seven", '7'),
    ("eight", '8'),
    ("nine", '9'),
    ("niner", '9'),
];

/// The character a NATO or digit word spells (by its first letter, then the table).
fn nato_letter(word: &str) -> Option<char> {
    let first = *word.as_bytes().first()?;
    NATO.iter()
        .filter(|(name, _)| name.as_bytes()[0] == first)
        .find(|(name, _)| *name == word)
        .map(|(_, c)| *c)
}

/// The characters spelled by runs of NATO words and digit words (and bare digits) in
/// folded text; any other word ends a run (a `|` in the output).
pub fn nato_into(folded: &str, out: &mut String) {
    out.clear();
    for word in folded
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| !w.is_empty())
    {
        let w = word.trim_matches('-');
        // "x-ray" is xray; other words carry no hyphen (no allocation for them)
        let joined;
        let key = if w.contains('-') {
            joined = w.replace('-', "");
            joined.as_str()
        } else {
            w
        };
        if let Some(c) = (3..=8)
            .contains(&key.len())
            .then(|| nato_letter(key))
            .flatten()
        {
            out.push(c);
        } else if !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(key);
        } else if !out.ends_with('|') {
            out.push('|');
        }
    }
}

/// Everyday words: a text made of them is no secret to be given away word by word.
pub fn is_common_word(w: &str) -> bool {
    const COMMON: &[&str] = &[
        "a",
        "an",
        "the",
        "is",
        "are",
        "am",
        "be",
        "was",
        "you",
        "your",
        "i",
        "me",
        "my",
        "we",
        "our",
        "he",
        "she",
        "it",
        "they",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "and",
        "or",
        "not",
        "no",
        "do",
        "don",
        "t",
        "this",
        "that",
        "with",
        "as",
        "by",
        "from",
        "never",
        "always",
        "only",
        "any",
        "all",
        "what",
        "who",
        "helpful",
        "assistant",
    ];
    COMMON.contains(&w)
}

/// The words (letter and digit runs) of folded text.
pub fn words(folded: &str) -> Vec<&str> {
    folded
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect()
}

/// The (start, end) byte spans of the words (letter and digit runs) of folded text.
pub fn word_spans(folded: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut start = None;
    for (i, c) in folded.char_indices() {
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                spans.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        spans.push((s, folded.len()));
    }
    spans
}

/// Whether every part appears as a whole word of `folded` (whose [`word_spans`] are
/// `spans`), in order, each starting at most [`MAX_PART_GAP`] bytes after the previous one
/// ended.
pub fn parts_in_order(folded: &str, spans: &[(usize, usize)], parts: &[String]) -> bool {
    if parts.len() < 2 {
        return false;
    }
    let word = |&(s, e): &(usize, usize)| &folded[s..e];
    'first: for (i, span) in spans.iter().enumerate() {
        if word(span) != parts[0] {
            continue;
        }
        let mut end = span.1;
        let mut j = i + 1;
        for part in &parts[1..] {
            loop {
                let Some(next) = spans.get(j) else {
                    continue 'first;
                };
                if next.0 > end + MAX_PART_GAP {
                    continue 'first;
                }
                j += 1;
                if word(next) == part {
                    end = next.1;
                    break;
                }
            }
        }
        return true;
    }
    false
}

/// Whether `words` appear consecutively, as whole words, in `folded` (spans as above).
pub fn words_in(folded: &str, spans: &[(usize, usize)], words: &[String]) -> bool {
    !words.is_empty()
        && spans.windows(words.len()).any(|w| {
            w.iter()
                .zip(words)
                .all(|(&(s, e), word)| &folded[s..e] == word.as_str())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::fold;

    #[test]
    fn the_views_read_what_they_should() {
        assert_eq!(rot13("Canary-42"), "Pnanel-42");
        let mut out = String::new();
        leet_into(&fold("P4$$w0rd!"), &mut out);
        let mut plain = String::new();
        leet_into(&fold("password"), &mut plain);
        assert_eq!(out, format!("{plain}i"));
        hex_stream_into(&fold("bytes: 0x43 0x41, \\x4e:41"), &mut out);
        assert!(out.ends_with("43414e41"), "{out}");
        nato_into(
            &fold("It is Charlie Alpha November, then four two."),
            &mut out,
        );
        assert!(out.contains("can|42"), "{out}");
        assert_eq!(words("x = 32, ok"), vec!["x", "32", "ok"]);
    }

    #[test]
    fn the_leetspeak_table_equals_the_per_character_mapping() {
        let mut fast = String::new();
        for b in 0..128u8 {
            let text = format!("a{}b", b as char);
            leet_into(&text, &mut fast);
            let slow: String = text.chars().filter_map(leet_char).collect();
            assert_eq!(fast, slow, "{b}");
        }
        assert!(may_hold_hex("43 41 4e 41 52 59"));
        assert!(!may_hold_hex("no digits here at all"));
        assert!(may_spell_nato("charlie alpha tango", 'c'));
        assert!(!may_spell_nato("the cat sat", 'c'));
        assert!(may_spell_nato("four nine", '4'));
        assert!(may_hold_leet("p4ss") && !may_hold_leet("plain words"));
    }

    #[test]
    fn parts_must_come_in_order_and_close_together() {
        let parts = |s: &str| words(s).into_iter().map(String::from).collect::<Vec<_>>();
        let parts_in_order =
            |text: &str, p: &[String]| super::parts_in_order(text, &word_spans(text), p);
        let at = parts("alpha tango");
        assert!(parts_in_order(
            &fold("The first word is alpha and the second is tango."),
            &at
        ));
        assert!(!parts_in_order(&fold("tango came before alpha"), &at));
        let far = format!("alpha {} tango", "word ".repeat(20));
        assert!(!parts_in_order(&far, &at));
        assert!(
            !parts_in_order("alphabet and tangos", &at),
            "whole words only"
        );
        assert!(parts_in_order(
            &fold("The variable x is set to 32."),
            &parts("x=32")
        ));
        assert!(!parts_in_order(&fold("x marks the spot"), &parts("x=32")));
    }
}
