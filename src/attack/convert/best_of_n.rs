//! `best_of_n`: `n` seeded augmentations, each its own attempt (Hughes et al. 2024,
//! "Best-of-N Jailbreaking").

use super::{Converter, Ctx, Rng, protected};
use crate::params::{Args, Param};

pub const CONVERTER: Converter = Converter {
    name: "best_of_n",
    params: &[Param::count("n", 8, 1, 10_000).labelled()],
    what: "`n` attempts, each a seeded augmentation: the middle letters of words longer than three shuffled (p = 0.6), case flipped per character (p = 0.6), printable ASCII moved one code point (p = 0.06) (Hughes et al. 2024, \"Best-of-N Jailbreaking\")",
    keeps_target: "yes",
    apply,
    variants: Some("n"),
};

fn apply(text: &str, _: &Args, ctx: &Ctx<'_>) -> String {
    let mut rng = Rng::seeded(ctx.seed, ctx.case_id, "best_of_n", ctx.variant);
    protected(text, ctx.target, |s, out| augment(s, &mut rng, out))
}

/// Best-of-N augmentations (Hughes et al. 2024, §2): each character is case-flipped
/// with probability 0.6 and each printable ASCII character moved one code point up or
/// down with probability 0.06 (when the result is printable too); then each word longer
/// than three characters has its middle characters shuffled with probability 0.6.
///
/// Words are separated by ASCII white space. Each character's flip, noise and direction
/// take 32 random bits (two characters per draw), in one pass over the text; then one
/// draw decides a word's shuffle, and one more each swap. The text is edited as bytes:
/// only ASCII bytes change and a shuffle moves whole characters, so it stays UTF-8, and
/// the output depends only on the text and the seed.
fn augment(s: &str, rng: &mut Rng, out: &mut String) {
    const SCRAMBLE: u64 = 39_322; // 0.6 × 65536
    const CAPS: u32 = 39_322;
    const NOISE: u32 = 1_966; // 0.06 × 32768
    let mut bytes = s.as_bytes().to_vec();
    let ascii = s.is_ascii();
    // One character's flip and noise from its 32 bits: bits 0–15 the case flip, 16–30
    // the noise, 31 its direction.
    let edit = |b: &mut u8, r: u32| {
        // Branch-free case flip (a 60% coin mispredicts as a branch): an ASCII letter's
        // case is its 0x20 bit; the masks are the sign of a subtraction.
        let caps = ((r & 0xFFFF).wrapping_sub(CAPS) >> 31) as u8;
        let alpha = ((u32::from((*b | 0x20).wrapping_sub(b'a')).wrapping_sub(26)) >> 31) as u8;
        *b ^= (caps & alpha) << 5;
        if ((r >> 16) & 0x7FFF) < NOISE && b.is_ascii_graphic() {
            let moved = if r >> 31 == 1 { *b + 1 } else { *b - 1 };
            if moved.is_ascii_graphic() {
                *b = moved;
            }
        }
    };
    // Pass 1: case flips and noise, two characters per draw.
    if ascii {
        // Every byte a character: the same draws as below, without the checks.
        let mut pairs = bytes.chunks_exact_mut(2);
        for pair in pairs.by_ref() {
            let draw = rng.next_u64();
            edit(&mut pair[0], draw as u32);
            edit(&mut pair[1], (draw >> 32) as u32);
        }
        if let [last] = pairs.into_remainder() {
            edit(last, rng.next_u64() as u32);
        }
    } else {
        // The same draws, character by character; a pair of ASCII bytes at a draw
        // boundary (most of the text) takes the fast step.
        let n = bytes.len();
        let mut i = 0usize;
        while i < n {
            if i + 1 < n && bytes[i] < 0x80 && bytes[i + 1] < 0x80 {
                let draw = rng.next_u64();
                edit(&mut bytes[i], draw as u32);
                edit(&mut bytes[i + 1], (draw >> 32) as u32);
                i += 2;
                continue;
            }
            // One character (ASCII or not) and the next, sharing a draw.
            let draw = rng.next_u64();
            for half in [0u32, 32] {
                if i >= n {
                    break;
                }
                let len = utf8_len(bytes[i]);
                if len == 1 {
                    edit(&mut bytes[i], (draw >> half) as u32);
                }
                i += len;
            }
        }
    }
    // Pass 2: shuffles, word by word.
    let space = |b: u8| matches!(b, b' ' | b'\t'..=b'\r');
    let n = bytes.len();
    let mut start = 0usize;
    while start < n {
        if space(bytes[start]) {
            start += 1;
            continue;
        }
        let mut end = start + 1;
        while end < n && !space(bytes[end]) {
            end += 1;
        }
        let word = &mut bytes[start..end];
        if word.len() > 3 {
            if ascii || word.is_ascii() {
                if (rng.next_u64() & 0xFFFF) < SCRAMBLE {
                    shuffle_middle(word, rng);
                }
            } else {
                // Cut at ASCII white space, a word is whole characters: counted on the
                // bytes, decoded only when it is shuffled (on the stack when short).
                let count = word.iter().filter(|b| **b & 0xC0 != 0x80).count();
                if count > 3 && (rng.next_u64() & 0xFFFF) < SCRAMBLE {
                    let text = std::str::from_utf8(word).expect("a word of valid UTF-8");
                    let mut stack = ['\0'; 32];
                    let mut heap = Vec::new();
                    let chars: &mut [char] = if count <= stack.len() {
                        for (slot, c) in stack.iter_mut().zip(text.chars()) {
                            *slot = c;
                        }
                        &mut stack[..count]
                    } else {
                        heap.extend(text.chars());
                        &mut heap
                    };
                    shuffle_middle(chars, rng);
                    let mut pos = 0;
                    for c in chars.iter() {
                        pos += c.encode_utf8(&mut word[pos..]).len();
                    }
                }
            }
        }
        start = end;
    }
    out.push_str(std::str::from_utf8(&bytes).expect("only ASCII bytes and whole characters moved"));
}

/// The length of the UTF-8 character a lead byte starts (1 for a stray byte).
fn utf8_len(lead: u8) -> usize {
    match lead {
        0xF0..=0xFF => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}

/// Fisher–Yates over every element but the first and the last.
fn shuffle_middle<T>(word: &mut [T], rng: &mut Rng) {
    let last = word.len() - 1;
    for i in (2..last).rev() {
        let j = 1 + rng.below(i);
        word.swap(i, j);
    }
}
