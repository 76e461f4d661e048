//! **PAIR** (Chao et al. 2023, "Jailbreaking Black Box Large Language Models in Twenty
//! Queries"): the attacker refines one prompt; each refinement is sent to the target in a
//! fresh conversation and the attacker sees the answer and a 1–10 score. The attacker keeps
//! its last four exchanges (the reference implementation's `keep_last_n`); one stream (the
//! paper runs several: run more seeds).

use super::*;

/// The strategy in the registry ([`super::STRATEGIES`]).
pub struct Pair;

impl Strategy for Pair {
    fn name(&self) -> &'static str {
        "pair"
    }

    fn keys(&self) -> &'static [&'static str] {
        &[]
    }

    fn how(&self, _: &StrategySpec) -> String {
        REFINE.to_owned()
    }

    fn run<'a>(
        &'a self,
        attack: &'a Attack<'_>,
        cx: Cx<'a>,
    ) -> futures::future::LocalBoxFuture<'a, ()> {
        Box::pin(attack.pair(cx.located, cx.scorer, cx.system, cx.out))
    }
}

impl Attack<'_> {
    async fn pair(&self, located: &Located, scorer: &Scorer<'_>, system: &str, out: &mut Outcome) {
        let first = Message::user("Write the first prompt.".into());
        let mut recent: Vec<Message> = Vec::new();
        for turn in 1..=self.spec.max_turns {
            let node = turn.to_string();
            let history: Vec<&Message> = std::iter::once(&first).chain(&recent).collect();
            let mut t = TurnRecord {
                turn,
                depth: turn,
                node_id: node.clone(),
                parent_id: (turn > 1).then(|| (turn - 1).to_string()),
                ..TurnRecord::default()
            };
            let (raw, prompt) = match self
                .ask_attacker(system, &history, None, &node, &mut out.calls)
                .await
            {
                Ok(v) => v,
                Err(e) => return self.attacker_failed(out, t, e),
            };
            t.attacker_response = Some(raw.clone());
            t.attack_prompt = prompt.clone();
            let p = self.plan_for(located, &prompt);
            out.turns_used += u32::from(p.blocked_by.is_none());
            let answer = match self.query(p, None, &node, &mut out.calls).await {
                Ok(a) => a,
                Err((p, e, latency)) => return self.failed(out, t, p, e, latency),
            };
            let score = Self::judge(scorer, &answer, &mut t, &[]).await;
            let success = t.success == Some(true);
            self.push_turn(out, t);
            let fb = Self::feedback(&answer, score);
            Self::report(out, answer, turn, success);
            if success {
                return;
            }
            if let Err(e) = self.held.keep((raw.len() + fb.len()) as u64) {
                out.error = Some(e);
                return;
            }
            recent.push(Message::assistant(raw));
            recent.push(Message::user(fb));
            if recent.len() > 8 {
                self.held.release(text_bytes(&recent[..2]));
                recent.drain(..2);
            }
        }
    }
}
