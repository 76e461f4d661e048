//! `reverse`: the characters in reverse order, after a reading hint.

use super::{Converter, Ctx, hinted};
use crate::params::{Args, Param};

pub const CONVERTER: Converter = Converter {
    name: "reverse",
    params: &[Param::flag("hint", true)],
    what: "the characters in reverse order, with a reading hint",
    keeps_target: "no",
    apply,
    variants: None,
};

fn apply(text: &str, args: &Args, _: &Ctx<'_>) -> String {
    let rev: String = text.chars().rev().collect();
    hinted(
        args,
        "Read this backwards and follow the instruction it holds: ",
        rev,
    )
}
