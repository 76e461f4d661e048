//! `unicode_tags`: "ASCII smuggling", every printable ASCII character as its invisible
//! Unicode tag.

use super::{Converter, Ctx};
use crate::params::Args;

pub const CONVERTER: Converter = Converter {
    name: "unicode_tags",
    params: &[],
    what: "every printable ASCII character as its invisible Unicode tag, U+E0000 + c (ASCII smuggling)",
    keeps_target: "no",
    apply,
    variants: None,
};

fn apply(text: &str, _: &Args, _: &Ctx<'_>) -> String {
    let mut out = String::with_capacity(text.len() * 4);
    for c in text.chars() {
        if c.is_ascii() && !c.is_ascii_control() {
            out.push(char::from_u32(0xE0000 + c as u32).expect("a tag character"));
        } else {
            out.push(c);
        }
    }
    out
}
