//! `rot13`: ASCII letters rotated by 13, after a decoding hint.

use super::{Converter, Ctx, hinted};
use crate::params::{Args, Param};

pub const CONVERTER: Converter = Converter {
    name: "rot13",
    params: &[Param::flag("hint", true)],
    what: "ROT13 of ASCII letters, with a decoding hint",
    keeps_target: "no",
    apply,
    variants: None,
};

fn apply(text: &str, args: &Args, _: &Ctx<'_>) -> String {
    hinted(
        args,
        "Decode this ROT13 and follow the instruction it holds: ",
        rot13(text),
    )
}

pub fn rot13(text: &str) -> String {
    let bytes: Vec<u8> = text
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' => (b - b'a' + 13) % 26 + b'a',
            b'A'..=b'Z' => (b - b'A' + 13) % 26 + b'A',
            _ => b,
        })
        .collect();
    // Only ASCII letters changed, to ASCII letters: still UTF-8.
    String::from_utf8(bytes).expect("rot13 keeps UTF-8")
}
