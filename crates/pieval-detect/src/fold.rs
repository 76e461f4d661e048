//! Text folding for matching: the usual evasions are undone before any detector looks
//! at text. NFKC (full-width, ligatures, compatibility forms), invisible format
//! characters dropped (zero-width, bidi controls, BOM), Unicode tag characters decoded
//! to the ASCII they smuggle, Cyrillic/Greek look-alikes mapped to Latin, typographic
//! quotes to ASCII, and lowercase.
//!
//! Folding writes into a caller's buffer so a detector walking a batch reuses one
//! allocation for every row.

use unicode_normalization::UnicodeNormalization;

/// Fold `s` into `out` (cleared first).
pub fn fold_into(s: &str, out: &mut String) {
    out.clear();
    if s.is_ascii() {
        // Fast path: nothing to normalise but case.
        out.push_str(s);
        out.make_ascii_lowercase();
        return;
    }
    // Most text is already NFKC: the (costly) normalisation runs only over the stretches
    // the quick check does not pass, the rest is mapped and lowercased as it is.
    for (piece, normalise) in nfkc_pieces(s) {
        if normalise {
            push_folded(piece.nfkc(), out);
        } else {
            push_folded_str(piece, out);
        }
    }
}

/// `s` cut into pieces, each with whether it needs NFKC: a run of non-ASCII characters
/// that Unicode's quick check does not pass, with the ASCII character before it (a
/// combining mark composes with it), needs it; the rest is already NFKC. A boundary
/// before an ASCII character is a normalisation boundary (it is a starter, allowed in
/// NFKC, and composes with nothing before it: UAX #15, "Detecting Normalization Forms"
/// and "Stable Code Points"), so the NFKC of the whole text is the pieces' NFKC end to
/// end (tested against the whole text's on random texts).
fn nfkc_pieces(s: &str) -> impl Iterator<Item = (&str, bool)> {
    use unicode_normalization::{IsNormalized, is_nfkc_quick};
    let b = s.as_bytes();
    // `done`: the end of what was given out; `pending`: a piece waiting behind the one
    // just cut
    let (mut done, mut pending) = (0usize, None::<(&str, bool)>);
    std::iter::from_fn(move || {
        if let Some(p) = pending.take() {
            return Some(p);
        }
        let mut i = done;
        loop {
            if done == s.len() {
                return None;
            }
            let Some(p) = first_non_ascii(&b[i..]) else {
                let rest = &s[done..];
                done = s.len();
                return Some((rest, false));
            };
            let start = i + p;
            let end = b[start..]
                .iter()
                .position(u8::is_ascii)
                .map_or(b.len(), |q| start + q);
            if is_nfkc_quick(s[start..end].chars()) == IsNormalized::Yes {
                i = end;
                continue;
            }
            // the ASCII character before the run goes with it
            let from = if start > done { start - 1 } else { start };
            let before = &s[done..from];
            done = end;
            let piece = (&s[from..end], true);
            if before.is_empty() {
                return Some(piece);
            }
            pending = Some(piece);
            return Some((before, false));
        }
    })
}

/// The index of the first byte of `b` that is not ASCII, eight bytes at a time.
#[inline]
fn first_non_ascii(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(word) = b.get(i..i + 8) {
        let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        if word & 0x8080_8080_8080_8080 != 0 {
            break;
        }
        i += 8;
    }
    b[i..].iter().position(|x| !x.is_ascii()).map(|p| i + p)
}

/// Whether Unicode's quick check says `s` is in NFKC ("yes", not "maybe"), asked of its
/// runs of other characters only, as folding asks it ([`nfkc_pieces`]: no piece needs
/// NFKC): an ASCII character is always allowed and a starter, so the check starts afresh
/// after one (UAX #15, "Detecting Normalization Forms"). The tests compare it with the
/// crate's whole-text check.
#[cfg(test)]
fn is_nfkc_quick(s: &str) -> bool {
    nfkc_pieces(s).all(|(_, normalise)| !normalise)
}

fn push_folded(chars: impl Iterator<Item = char>, out: &mut String) {
    for c in chars {
        push_folded_char(c, out);
    }
}

/// Fold one character (dropped, mapped, lowercased) onto `out`.
#[inline]
fn push_folded_char(c: char, out: &mut String) {
    if c.is_ascii() {
        out.push(c.to_ascii_lowercase());
        return;
    }
    let Some(mapped) = fold_char(c) else { return };
    match mapped {
        m if m.is_ascii() => out.push(m.to_ascii_lowercase()),
        // Latin-1 letters (the accents of most European text) without the case
        // tables: capitals are 0x20 below their small letters, the rest is lowercase.
        'À'..='Ö' | 'Ø'..='Þ' => {
            out.push(char::from_u32(mapped as u32 + 0x20).unwrap_or(mapped))
        }
        '\u{DF}'..='\u{FF}' => out.push(mapped),
        m => out.extend(m.to_lowercase()),
    }
}

/// [`push_folded`] for text already in NFKC: runs of ASCII are copied and lowercased
/// in bulk, the other characters mapped one by one.
fn push_folded_str(s: &str, out: &mut String) {
    let mut rest = s;
    while !rest.is_empty() {
        let run = first_non_ascii(rest.as_bytes()).unwrap_or(rest.len());
        let start = out.len();
        out.push_str(&rest[..run]);
        out.as_mut_str()[start..].make_ascii_lowercase();
        rest = &rest[run..];
        let mut chars = rest.chars();
        if let Some(c) = chars.next() {
            push_folded_char(c, out);
            rest = chars.as_str();
        }
    }
}

/// Fold into a new string (tests, rule compilation).
pub fn fold(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    fold_into(s, &mut out);
    out
}

/// Fold char by char, recording for every byte of `out` the byte offset in `s` of the
/// character it came from (plus a final `s.len()`), so a match in the folded text maps
/// back to a span of the original. Per-char NFKC can differ from [`fold_into`] on
/// combining sequences; it is used for locating spans, not for deciding.
pub fn fold_with_offsets(s: &str, out: &mut String, offsets: &mut Vec<usize>) {
    out.clear();
    offsets.clear();
    if s.is_ascii() {
        out.push_str(s);
        out.make_ascii_lowercase();
        offsets.extend(0..=s.len());
        return;
    }
    // Text already in NFKC (most text, and the pieces of the rest that the quick check
    // passes): each character is its own NFKC, so runs of ASCII are copied in bulk and
    // only the other characters are mapped one by one; the result is what the
    // per-character path gives (tested), and equals fold_into. The pieces that need it
    // take the per-character path.
    let mut at = 0;
    for (piece, normalise) in nfkc_pieces(s) {
        if normalise {
            let mut buf = [0u8; 4];
            for (i, c) in piece.char_indices() {
                for n in c.encode_utf8(&mut buf).nfkc() {
                    let before = out.len();
                    push_folded_char(n, out);
                    offsets.extend(std::iter::repeat_n(at + i, out.len() - before));
                }
            }
        } else {
            fold_nfkc_with_offsets(piece, at, out, offsets);
        }
        at += piece.len();
    }
    offsets.push(s.len());
}

/// [`fold_with_offsets`] of a piece already in NFKC that starts at byte `at` of the text.
fn fold_nfkc_with_offsets(s: &str, at: usize, out: &mut String, offsets: &mut Vec<usize>) {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < s.len() {
        let run = first_non_ascii(&bytes[i..]).unwrap_or(s.len() - i);
        let start = out.len();
        out.push_str(&s[i..i + run]);
        out.as_mut_str()[start..].make_ascii_lowercase();
        offsets.extend(at + i..at + i + run);
        i += run;
        if let Some(c) = s[i..].chars().next() {
            let before = out.len();
            push_folded_char(c, out);
            offsets.extend(std::iter::repeat_n(at + i, out.len() - before));
            i += c.len_utf8();
        }
    }
}

/// [`fold_with_offsets`] one character's NFKC at a time over the whole text: the
/// oracle the tests hold the pieces to.
#[cfg(test)]
fn fold_with_offsets_per_char(s: &str, out: &mut String, offsets: &mut Vec<usize>) {
    let mut buf = [0u8; 4];
    for (i, c) in s.char_indices() {
        for n in c.encode_utf8(&mut buf).nfkc() {
            let before = out.len();
            push_folded_char(n, out);
            offsets.extend(std::iter::repeat_n(i, out.len() - before));
        }
    }
    offsets.push(s.len());
}

/// `None` for characters that are dropped.
fn fold_char(c: char) -> Option<char> {
    let mapped = match c {
        // Invisible: zero-width, joiners, word joiner, invisible operators, BOM, bidi.
        '\u{00AD}'
        | '\u{034F}'
        | '\u{061C}'
        | '\u{180E}'
        | '\u{200B}'..='\u{200F}'
        | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}'
        | '\u{FEFF}' => return None,
        // Tag characters spell hidden ASCII; other tags (language tag, cancel) vanish.
        '\u{E0020}'..='\u{E007E}' => char::from_u32(c as u32 - 0xE0000)?,
        '\u{E0000}'..='\u{E007F}' => return None,
        // Typographic quotes and dashes.
        '\u{2018}' | '\u{2019}' | '\u{201B}' | '\u{2032}' | '\u{02BC}' => '\'',
        '\u{201C}' | '\u{201D}' | '\u{201F}' | '\u{2033}' => '"',
        '\u{2010}'..='\u{2015}' | '\u{2212}' => '-',
        // Cyrillic look-alikes.
        'а' | 'А' => 'a',
        'в' | 'В' => 'b',
        'с' | 'С' => 'c',
        'ԁ' => 'd',
        'е' | 'Е' | 'ё' | 'Ё' => 'e',
        'һ' | 'Н' => 'h',
        'і' | 'І' | 'ї' => 'i',
        'ј' | 'Ј' => 'j',
        'к' | 'К' => 'k',
        'м' | 'М' => 'm',
        'о' | 'О' => 'o',
        'р' | 'Р' => 'p',
        'ԛ' => 'q',
        'ѕ' | 'Ѕ' => 's',
        'т' | 'Т' => 't',
        'у' | 'У' => 'y',
        'х' | 'Х' => 'x',
        'ԝ' => 'w',
        // Greek look-alikes.
        'α' | 'Α' => 'a',
        'β' | 'Β' => 'b',
        'ε' | 'Ε' => 'e',
        'η' | 'Η' => 'h',
        'ι' | 'Ι' => 'i',
        'κ' | 'Κ' => 'k',
        'Μ' => 'm',
        'ν' | 'Ν' => 'n',
        'ο' | 'Ο' => 'o',
        'ρ' | 'Ρ' => 'p',
        'τ' | 'Τ' => 't',
        'υ' | 'Υ' => 'u',
        'χ' | 'Χ' => 'x',
        'Ζ' => 'z',
        other => other,
    };
    Some(mapped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undoes_the_usual_evasions() {
        assert_eq!(fold("PWNED"), "pwned");
        assert_eq!(fold("P\u{200B}W\u{2060}N\u{200D}E\u{FEFF}D"), "pwned");
        assert_eq!(fold("ＰＷＮＥＤ"), "pwned", "full-width via NFKC");
        assert_eq!(fold("РWNЕD"), "pwned", "Cyrillic Р and Е");
        assert_eq!(fold("Іgnоrе"), "ignore");
        assert_eq!(fold("don\u{2019}t"), "don't");
        assert_eq!(fold("\u{202E}abc\u{202C}"), "abc");
        let tags: String = "say hi"
            .chars()
            .map(|c| char::from_u32(0xE0000 + c as u32).unwrap())
            .collect();
        assert_eq!(fold(&format!("ok{tags}")), "oksay hi");
        assert_eq!(fold("ﬁne"), "fine", "ligature");
    }

    #[test]
    fn offsets_map_folded_bytes_back() {
        let (mut out, mut offsets) = (String::new(), Vec::new());
        let s = "a\u{200B}ＢÉ";
        fold_with_offsets(s, &mut out, &mut offsets);
        assert_eq!(out, "abé");
        assert_eq!(offsets, [0, 4, 7, 7, s.len()]);
    }

    #[test]
    fn the_nfkc_fast_path_gives_what_each_character_gives() {
        // Characters already in NFKC, and some that are not (compatibility forms, a
        // combining accent).
        let nfkc: Vec<char> = "aZ ÀÉéÖØÞßÿ\u{D7}ĀΣσςЖжРе的\u{200B}\u{E0041}\u{2019}İ\u{1E9E}"
            .chars()
            .collect();
        let all: Vec<char> = nfkc.iter().copied().chain("ǅŉﬁＷ\u{301}".chars()).collect();
        let mut rng = fastrand::Rng::with_seed(17);
        let (mut fast, mut offsets) = (String::new(), Vec::new());
        let (mut slow, mut slow_offsets) = (String::new(), Vec::new());
        let mut nfkc_texts = 0;
        for _ in 0..5_000 {
            let alphabet = if rng.bool() { &nfkc } else { &all };
            let s: String = (0..rng.usize(0..40))
                .map(|_| alphabet[rng.usize(..alphabet.len())])
                .collect();
            fold_with_offsets(&s, &mut fast, &mut offsets);
            slow.clear();
            slow_offsets.clear();
            fold_with_offsets_per_char(&s, &mut slow, &mut slow_offsets);
            assert_eq!((&fast, &offsets), (&slow, &slow_offsets), "{s:?}");
            let whole = unicode_normalization::is_nfkc_quick(s.chars())
                == unicode_normalization::IsNormalized::Yes;
            assert_eq!(is_nfkc_quick(&s), whole, "the quick check by runs: {s:?}");
            if whole {
                nfkc_texts += 1;
                assert_eq!(fast, fold(&s), "{s:?}");
            }
        }
        assert!(nfkc_texts > 2_000, "{nfkc_texts}");
    }

    /// The quick check asked of the runs of other characters answers as the whole text's
    /// does, around every way a run can start and end: combining marks after ASCII, out
    /// of order, at either end; compatibility characters; texts longer than a word.
    #[test]
    fn the_quick_check_by_runs_is_the_whole_texts() {
        let parts = [
            "a",
            "Z",
            " ",
            "ab cd ef gh",
            "é",
            "e\u{301}",
            "\u{301}",
            "\u{301}\u{327}",
            "\u{327}\u{301}",
            "ﬁ",
            "Ｐ",
            "\u{200B}",
            "한",
            "\u{1100}\u{1161}",
            "ß",
            "Ω",
            "\u{2126}",
            "x\u{308}\u{304}",
            "12345678",
            "\u{1F600}",
        ];
        let mut rng = fastrand::Rng::with_seed(5);
        let mut seen = [0usize; 2];
        for _ in 0..20_000 {
            let s: String = (0..rng.usize(0..12))
                .map(|_| parts[rng.usize(..parts.len())])
                .collect();
            let whole = unicode_normalization::is_nfkc_quick(s.chars())
                == unicode_normalization::IsNormalized::Yes;
            assert_eq!(is_nfkc_quick(&s), whole, "{s:?}");
            seen[usize::from(whole)] += 1;
        }
        assert!(seen[0] > 1_000 && seen[1] > 1_000, "{seen:?}");
        // Folding normalises only the pieces the quick check does not pass, and gives
        // what normalising the whole text gives; the offsets variant, what the
        // per-character path gives over the whole text.
        let mut rng = fastrand::Rng::with_seed(11);
        let (mut out, mut offsets) = (String::new(), Vec::new());
        let (mut slow, mut slow_offsets) = (String::new(), Vec::new());
        for _ in 0..20_000 {
            let s: String = (0..rng.usize(0..12))
                .map(|_| parts[rng.usize(..parts.len())])
                .collect();
            fold_into(&s, &mut out);
            let mut whole = String::new();
            push_folded(s.nfkc(), &mut whole);
            assert_eq!(out, whole, "{s:?}");
            fold_with_offsets(&s, &mut out, &mut offsets);
            slow.clear();
            slow_offsets.clear();
            fold_with_offsets_per_char(&s, &mut slow, &mut slow_offsets);
            assert_eq!((&out, &offsets), (&slow, &slow_offsets), "{s:?}");
            let pieces: String = nfkc_pieces(&s).map(|(p, _)| p).collect();
            assert_eq!(pieces, s);
        }
        for (i, b) in [b"abcdefgh".as_slice(), b"abcdefghij\xc3", b"\xc3", b""]
            .iter()
            .enumerate()
        {
            let want = b.iter().position(|x| !x.is_ascii());
            assert_eq!(first_non_ascii(b), want, "{i}");
        }
    }

    #[test]
    fn latin1_letters_lowercase_as_the_case_tables_say() {
        for c in '\u{80}'..='\u{FF}' {
            let mut out = String::new();
            push_folded_char(c, &mut out);
            let expected: String = fold_char(c)
                .map(|m| m.to_lowercase().collect())
                .unwrap_or_default();
            assert_eq!(out, expected, "{c:?}");
        }
    }

    #[test]
    fn the_buffer_is_reused() {
        let mut buf = String::with_capacity(64);
        fold_into("ÄBC", &mut buf);
        assert_eq!(buf, "äbc");
        fold_into("x", &mut buf);
        assert_eq!(buf, "x");
        assert!(buf.capacity() >= 64);
    }
}
