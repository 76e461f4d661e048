//! pieval on an Apache DataFusion Ballista cluster (docs/cluster.md).
//!
//! Ballista runs DataFusion plans across a scheduler and executors. A plan travels as
//! protobuf, and a scalar function travels **by name**: the client plans a query with
//! pieval's UDFs, the scheduler decodes and splits it, each executor decodes its part
//! and looks every function up in its own registry. So the three must hold identical
//! functions, configured from identical rule packs. Each pieval cluster process
//! registers every pieval function, and the scheduler serves what it holds (pieval's
//! version, the rule-pack digest, the function names, the executors it sees) at
//! [`INFO_PATH`] on its own port. An executor whose rule packs differ from the
//! scheduler's refuses to start; a client whose packs differ refuses to submit.
//!
//! What is here without the `distributed` feature: the URL and the description types,
//! so the CLI can say clearly that the feature is missing.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub mod score;

#[cfg(feature = "distributed")]
mod client;
#[cfg(feature = "distributed")]
mod codec;
#[cfg(feature = "distributed")]
mod process;

#[cfg(feature = "distributed")]
pub use client::{ClusterSession, connect};
#[cfg(feature = "distributed")]
pub use process::{ExecutorOptions, SchedulerOptions, fetch_info, run_executor, run_scheduler};

/// Where the scheduler describes itself (HTTP GET, JSON [`ClusterInfo`]), beside its
/// gRPC service on the same port.
pub const INFO_PATH: &str = "/pieval/v1/cluster";

/// Ballista's default scheduler port.
pub const DEFAULT_PORT: u16 = 50050;

/// What a pieval process holds, as the scheduler serves it and each side checks it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterInfo {
    pub pieval_version: String,
    /// The commit this pieval was built from (empty outside a checkout).
    #[serde(default)]
    pub build: String,
    /// [`crate::detect::packs::digest`].
    pub rulepack_digest: String,
    /// pieval's functions (sorted): what travels by name.
    pub functions: Vec<String>,
    /// Executors registered with the scheduler (0 in a client's own description).
    pub executors: usize,
    /// Their task slots in all.
    pub task_slots: usize,
    /// Executors registered under another rule-pack digest, or not pieval's (an
    /// executor's id names its digest: [`executor_id`]). Ballista takes back an executor
    /// that heartbeats to a restarted scheduler without asking it again, so the
    /// scheduler counts them and a client refuses to submit while there are any.
    #[serde(default)]
    pub foreign_executors: usize,
}

/// The prefix of the id of an executor that runs with the rule packs of `digest`.
pub fn executor_id_prefix(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    format!("pieval-{}-", &hex[..hex.len().min(16)])
}

/// A new executor's id: [`executor_id_prefix`] of this process's packs, then a random
/// part.
pub fn executor_id() -> String {
    format!(
        "{}{:016x}",
        executor_id_prefix(&crate::detect::packs::digest()),
        fastrand::u64(..)
    )
}

impl ClusterInfo {
    /// This process's description.
    pub fn local() -> Self {
        Self {
            pieval_version: env!("CARGO_PKG_VERSION").to_owned(),
            build: crate::GIT_COMMIT.to_owned(),
            rulepack_digest: crate::detect::packs::digest(),
            functions: crate::engine::function_names(),
            executors: 0,
            task_slots: 0,
            foreign_executors: 0,
        }
    }

    /// Why `other` (a scheduler's description) cannot run this process's plans, or
    /// `None` when it can. `role` names this process in the message.
    pub fn mismatch(&self, other: &ClusterInfo, role: &str) -> Option<String> {
        if self.rulepack_digest != other.rulepack_digest {
            return Some(format!(
                "the scheduler's rule packs differ from this {role}'s: scheduler {}, {role} {} \
                 (start every pieval process with the same --rules folder, or none)",
                other.rulepack_digest, self.rulepack_digest
            ));
        }
        let build = |i: &ClusterInfo| format!("{} {}", i.pieval_version, i.build);
        if self.pieval_version != other.pieval_version
            || (!self.build.is_empty() && !other.build.is_empty() && self.build != other.build)
        {
            return Some(format!(
                "the scheduler runs another pieval build than this {role}: scheduler {}, \
                 {role} {} (run one pieval build everywhere)",
                build(other).trim(),
                build(self).trim()
            ));
        }
        if self.functions != other.functions {
            let missing: Vec<&str> = self
                .functions
                .iter()
                .filter(|f| !other.functions.contains(f))
                .map(String::as_str)
                .collect();
            let extra: Vec<&str> = other
                .functions
                .iter()
                .filter(|f| !self.functions.contains(f))
                .map(String::as_str)
                .collect();
            return Some(format!(
                "the scheduler's pieval functions differ from this {role}'s (scheduler pieval {}, \
                 {role} pieval {}; the scheduler lacks {missing:?}, has besides {extra:?}): run \
                 one pieval build everywhere",
                other.pieval_version, self.pieval_version
            ));
        }
        None
    }
}

/// A scheduler address: `df://HOST:PORT` (the port defaults to 50050). Returns the
/// host and port.
pub fn parse_url(url: &str) -> Result<(String, u16)> {
    let bad = |why: &str| {
        Error::Usage(format!(
            "--cluster {:?}: {why}; expected df://HOST:PORT",
            crate::text::excerpt(url, 200)
        ))
    };
    let rest = url
        .strip_prefix("df://")
        .ok_or_else(|| bad("not a df:// address"))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty()
        || rest.contains(['/', '?', '#', '@'])
        || rest.chars().any(char::is_whitespace)
    {
        return Err(bad("give only a host and a port"));
    }
    if rest.starts_with('[') {
        // Ballista builds its addresses as HOST:PORT, which an IPv6 address breaks.
        return Err(bad(
            "IPv6 addresses are not supported; give a host name or IPv4 address",
        ));
    }
    let (host, port) = match rest.split_once(':') {
        Some((h, p)) => (h.to_owned(), Some(p)),
        None => (rest.to_owned(), None),
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?,
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok((host, port))
}

/// What `pieval score --cluster URL` (and `replay --rescore --cluster`) hands scoring:
/// a connection to the scheduler at `url`, made when scoring opens its session (the
/// address is checked here).
pub fn scoring(url: &str) -> Result<crate::cluster::score::ClusterConnect> {
    parse_url(url)?;
    #[cfg(feature = "distributed")]
    {
        use crate::scoring::ScoringEngine;
        let url = url.to_owned();
        Ok(std::sync::Arc::new(move |config| {
            let url = url.clone();
            Box::pin(async move {
                let s = connect(&url, config).await?;
                let engine = ScoringEngine {
                    engine: "ballista".into(),
                    scheduler: Some(s.url.clone()),
                    executors: Some(s.info.executors),
                    task_slots: Some(s.info.task_slots),
                    ..ScoringEngine::local()
                };
                let submit = client::submitter(&s);
                Ok(crate::cluster::score::ClusterScoring {
                    ctx: s.ctx,
                    engine,
                    submit,
                })
            })
        }))
    }
    #[cfg(not(feature = "distributed"))]
    Err(not_built())
}

/// Without the `distributed` feature: the error `--cluster` gives.
pub fn not_built() -> Error {
    Error::Usage(
        "this pieval was built without cluster support: build it with \
         `cargo build --release --features distributed` (docs/cluster.md)"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_host_and_a_port() {
        assert_eq!(
            parse_url("df://127.0.0.1:50050").unwrap(),
            ("127.0.0.1".into(), 50050)
        );
        assert_eq!(parse_url("df://sched").unwrap(), ("sched".into(), 50050));
        assert_eq!(parse_url("df://sched:7/").unwrap(), ("sched".into(), 7));
        for bad in [
            "http://a:1",
            "df://",
            "df://a:0",
            "df://a:99999",
            "df://a:1/x",
            "df://u@a:1",
            "df://a b:1",
            "df://:1",
            "df://[::1]:9",
            "df://a:1:2",
        ] {
            let e = parse_url(bad).unwrap_err().to_string();
            assert!(e.contains("df://HOST:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_different_rule_pack_is_named_with_both_digests() {
        let me = ClusterInfo::local();
        let mut other = me.clone();
        assert_eq!(me.mismatch(&other, "executor"), None);
        other.rulepack_digest = "sha256:00".into();
        let why = me.mismatch(&other, "executor").unwrap();
        assert!(
            why.contains("sha256:00") && why.contains(&me.rulepack_digest),
            "{why}"
        );
        let mut other = me.clone();
        other.functions.pop();
        assert!(
            me.mismatch(&other, "client")
                .unwrap()
                .contains("functions differ")
        );
    }
}
