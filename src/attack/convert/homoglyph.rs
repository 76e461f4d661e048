//! `homoglyph`: Latin letters replaced by Cyrillic look-alikes (the corpus generator's
//! map), the target kept.

use super::{Converter, Ctx, protected};
use crate::corpus::obfuscate::homoglyph_char;
use crate::params::Args;

pub const CONVERTER: Converter = Converter {
    name: "homoglyph",
    params: &[],
    what: "Latin letters with Cyrillic look-alikes (a, c, e, i, o, p, x, y, A, B, C, E, H, I, K, M, O, P, T, X; the corpus generator's map)",
    keeps_target: "yes",
    apply,
    variants: None,
};

fn apply(text: &str, _: &Args, ctx: &Ctx<'_>) -> String {
    protected(text, ctx.target, |s, out| {
        out.extend(s.chars().map(homoglyph_char))
    })
}
