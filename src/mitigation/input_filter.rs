//! `input_filter`: the injection rules (`data/rules/injection.toml`, or `rules: [ids]`) run
//! on the untrusted text; when one fires the request is not sent and the case is recorded
//! as blocked (`blocked_by: input_filter:<rule ids>`). With `model: true`, pieval's
//! injection model (crates/pieval-detect/src/model.rs) decides too: a text it scores at
//! or above its threshold, in its role (the user prompt, a document, a tool output), is
//! blocked as `input_filter:model`.

use super::{Defence, Entry, Mitigation, Request};
use crate::detect::fold::fold;
use crate::detect::rules::RulePack;
use crate::params::Param;

#[derive(Clone, Debug, PartialEq)]
pub struct InputFilter {
    /// The rules that block (default: all of them).
    pub rules: Option<Vec<String>>,
    /// An agent's tool output that fires a rule ends the attempt (`blocked_by`), rather
    /// than being withheld from the model while the agent goes on.
    pub stop_agent: bool,
    /// pieval's injection model decides besides the rules.
    pub model: bool,
}

pub const ENTRY: Entry = Entry {
    name: "input_filter",
    params: &[
        Param::rule_ids("rules"),
        Param::flag("stop_agent", false),
        Param::flag("model", false),
    ],
    what: "runs the injection rules on the untrusted text; when one fires the request is not sent (`blocked_by: input_filter:<rule ids>`). With `model`, pieval's injection model decides too (`input_filter:model`, docs/guardrails.md). On an agent's tool outputs it is a prompt-injection detector: an output that fires is withheld from the model, or with `stop_agent` ends the attempt",
    build: |a| {
        Mitigation::InputFilter(InputFilter {
            rules: a.ids("rules").map(<[String]>::to_vec),
            stop_agent: a.flag("stop_agent"),
            model: a.flag("model"),
        })
    },
};

impl Defence for InputFilter {
    fn apply(&self, r: &mut Request<'_>) -> Result<(), String> {
        let pack = RulePack::default_pack();
        let mut hits = Vec::new();
        let folded = fold(r.raw_untrusted);
        pack.hits(r.raw_untrusted, &folded, &mut hits);
        let mut fired: Vec<&str> = hits
            .iter()
            .map(|&i| pack.rules[i].id.as_str())
            .filter(|id| self.rules.as_ref().is_none_or(|o| o.iter().any(|r| r == id)))
            .collect();
        // the build ships a model (a test holds it so)
        if let (true, Some(model)) = (self.model, crate::detect::packs::injection_model()) {
            let role = match (r.indirect, r.label) {
                (false, _) => "user_prompt",
                (true, "Tool output") => "tool_output",
                (true, _) => "retrieved_document",
            };
            let role = crate::detect::model::role_index(Some(role));
            if model.score_folded(&folded, role, &hits) as f32 >= model.threshold {
                fired.push("model");
            }
        }
        if fired.is_empty() {
            Ok(())
        } else {
            Err(format!("input_filter:{}", fired.join(",")))
        }
    }
}
