//! `none`: the request as assembled.

use super::{Defence, Entry, Mitigation, Request};

#[derive(Clone, Debug, PartialEq)]
pub struct Nothing;

pub const ENTRY: Entry = Entry {
    name: "none",
    params: &[],
    what: "the request as assembled",
    build: |_| Mitigation::None(Nothing),
};

impl Defence for Nothing {
    fn apply(&self, _: &mut Request<'_>) -> Result<(), String> {
        Ok(())
    }
}
