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
    fn excerpt_escapes_control_characters() {
        assert_eq!(excerpt("a\u{1b}[31mb\n", 10), "a\\u{1b}[31mb\\n");
        assert_eq!(excerpt("abcdef", 3), "abc…");
    }
}
