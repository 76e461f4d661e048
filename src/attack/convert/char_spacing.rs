//! `char_spacing`: a space between the characters of every word, the target kept.

use super::{Converter, Ctx, interleave, protected};
use crate::params::Args;

pub const CONVERTER: Converter = Converter {
    name: "char_spacing",
    params: &[],
    what: "a space between the characters of every word",
    keeps_target: "yes",
    apply,
    variants: None,
};

fn apply(text: &str, _: &Args, ctx: &Ctx<'_>) -> String {
    protected(text, ctx.target, |s, out| interleave(s, ' ', out))
}
