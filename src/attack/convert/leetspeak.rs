//! `leetspeak`: a→4 e→3 i→1 o→0 s→5 t→7, the target kept.

use super::{Converter, Ctx, protected};
use crate::corpus::obfuscate::leet_char;
use crate::params::Args;

pub const CONVERTER: Converter = Converter {
    name: "leetspeak",
    params: &[],
    what: "a→4 e→3 i→1 o→0 s→5 t→7, either case",
    keeps_target: "yes",
    apply,
    variants: None,
};

fn apply(text: &str, _: &Args, ctx: &Ctx<'_>) -> String {
    protected(text, ctx.target, leetspeak)
}

fn leetspeak(s: &str, out: &mut String) {
    if s.is_ascii() {
        // Byte by byte: ASCII maps to ASCII.
        let bytes: Vec<u8> = s.bytes().map(|b| leet_char(b as char) as u8).collect();
        out.push_str(std::str::from_utf8(&bytes).expect("ASCII in, ASCII out"));
    } else {
        out.extend(s.chars().map(leet_char));
    }
}
