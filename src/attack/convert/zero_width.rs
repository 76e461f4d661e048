//! `zero_width`: U+200B between the characters of every word, the target kept.

use super::{Converter, Ctx, interleave, protected};
use crate::params::Args;

pub const CONVERTER: Converter = Converter {
    name: "zero_width",
    params: &[],
    what: "U+200B between the characters of every word",
    keeps_target: "yes",
    apply,
    variants: None,
};

fn apply(text: &str, _: &Args, ctx: &Ctx<'_>) -> String {
    protected(text, ctx.target, |s, out| interleave(s, '\u{200B}', out))
}
