//! Seeded, machine-independent case selection.
//!
//! The algorithm (documented in docs/config.md, "Selection algorithm"; `pieval replay` relies on it):
//!
//! 1. **Filter.** A case is kept when, for every `include` field, its value is one of the
//!    listed values, and for no `exclude` field its value is listed. A missing value
//!    (null) matches no list. When `case_ids` is given, only those cases are kept (each must
//!    exist in the corpus, or selection fails naming it).
//! 2. **Rank.** Every kept case gets the key `sha256("{seed}:{case_id}")`; sorting by it is
//!    a seeded shuffle that depends on nothing but the seed and the ids (no RNG, no
//!    platform, no corpus order).
//! 3. **Sample** `sample_size` cases (all when absent or larger than what is left). With
//!    `stratify_by`, cases are grouped by their values of those fields; when the sample is
//!    at least the number of groups every group gets one case first; the rest is shared in
//!    proportion to group sizes by largest remainder (ties to the group that sorts first),
//!    never more than a group holds. Each group gives its lowest-ranked cases.
//! 4. The selected ids are listed in `case_id` order.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::config::Selection;
use crate::contract::case::AttackCase;
use crate::error::{Error, Result};

/// A categorical field of a case by name (see `config::SELECTION_FIELDS`).
pub fn field<'a>(case: &'a AttackCase, name: &str) -> Option<&'a str> {
    match name {
        "source_name" => Some(&case.source_name),
        "source_type" => Some(case.source_type.as_str()),
        "attack_family" => Some(&case.attack_family),
        "attack_surface" => Some(case.attack_surface.as_str()),
        "attack_subtype" => case.attack_subtype.as_deref(),
        "attack_category" => case.attack_category.map(|v| v.as_str()),
        "label" => Some(case.label.map(|v| v.as_str()).unwrap_or("attack")),
        "severity" => case.severity.map(|v| v.as_str()),
        "severity_level" => case.severity_level.map(|v| v.as_str()),
        "benchmark_split" => case.benchmark_split.map(|v| v.as_str()),
        "language" => case.language.as_deref(),
        "evaluation_mode" => case.evaluation_mode.map(|v| v.as_str()),
        "success_definition_id" => case.success_definition_id.as_deref(),
        _ => None,
    }
}

/// What was selected, and the numbers the manifest records.
#[derive(Clone, Debug, Serialize)]
pub struct Selected {
    /// Indexes into the corpus slice, in case_id order.
    #[serde(skip)]
    pub indexes: Vec<usize>,
    pub selected_case_ids: Vec<String>,
    pub total_available_cases: usize,
    pub total_filtered_cases: usize,
    /// Cases per stratum (key: the stratify_by values joined with '|'), when stratified.
    pub strata: BTreeMap<String, StratumCount>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct StratumCount {
    pub available: usize,
    pub selected: usize,
}

/// The ranking key of a case under a seed.
pub fn rank_key(seed: u64, case_id: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(format!("{seed}:{case_id}").as_bytes()).into()
}

pub fn select(
    cases: &[AttackCase],
    sel: &Selection,
    seed: u64,
    sample_size: Option<usize>,
) -> Result<Selected> {
    let wanted: Option<BTreeSet<&str>> =
        (!sel.case_ids.is_empty()).then(|| sel.case_ids.iter().map(String::as_str).collect());
    if let Some(w) = &wanted {
        let known: BTreeSet<&str> = cases.iter().map(|c| c.case_id.as_str()).collect();
        let missing: Vec<&&str> = w.iter().filter(|id| !known.contains(**id)).collect();
        if !missing.is_empty() {
            return Err(Error::State(format!(
                "selection.case_ids: {} id(s) are not in the corpus, e.g. {:?}",
                missing.len(),
                missing
                    .iter()
                    .take(5)
                    .map(|s| crate::text::excerpt(s, 60))
                    .collect::<Vec<_>>()
            )));
        }
    }
    let keep = |c: &AttackCase| {
        sel.include
            .iter()
            .all(|(f, vals)| field(c, f).is_some_and(|v| vals.iter().any(|x| x == v)))
            && !sel
                .exclude
                .iter()
                .any(|(f, vals)| field(c, f).is_some_and(|v| vals.iter().any(|x| x == v)))
            && wanted
                .as_ref()
                .is_none_or(|w| w.contains(c.case_id.as_str()))
    };
    let filtered: Vec<usize> = (0..cases.len()).filter(|&i| keep(&cases[i])).collect();
    // Strata in key order, each ranked.
    let mut strata: BTreeMap<String, Vec<([u8; 32], usize)>> = BTreeMap::new();
    for &i in &filtered {
        let key = sel
            .stratify_by
            .iter()
            .map(|f| field(&cases[i], f).unwrap_or("∅"))
            .collect::<Vec<_>>()
            .join("|");
        strata
            .entry(key)
            .or_default()
            .push((rank_key(seed, &cases[i].case_id), i));
    }
    for group in strata.values_mut() {
        group.sort();
    }
    let n = sample_size.unwrap_or(usize::MAX).min(filtered.len());
    let sizes: Vec<usize> = strata.values().map(Vec::len).collect();
    let quota = allocate(n, &sizes);
    let mut indexes = Vec::with_capacity(n);
    let mut counts = BTreeMap::new();
    for ((key, group), q) in strata.iter().zip(&quota) {
        indexes.extend(group.iter().take(*q).map(|(_, i)| *i));
        if !sel.stratify_by.is_empty() {
            counts.insert(
                key.clone(),
                StratumCount {
                    available: group.len(),
                    selected: *q,
                },
            );
        }
    }
    indexes.sort_by(|a, b| cases[*a].case_id.cmp(&cases[*b].case_id));
    Ok(Selected {
        selected_case_ids: indexes.iter().map(|&i| cases[i].case_id.clone()).collect(),
        indexes,
        total_available_cases: cases.len(),
        total_filtered_cases: filtered.len(),
        strata: counts,
    })
}

/// Share `n` among groups of `sizes` (see the module docs).
fn allocate(n: usize, sizes: &[usize]) -> Vec<usize> {
    let total: usize = sizes.iter().sum();
    if n >= total {
        return sizes.to_vec();
    }
    let mut quota = vec![0usize; sizes.len()];
    let mut left = n;
    if n >= sizes.len() {
        for (q, s) in quota.iter_mut().zip(sizes) {
            *q = (*s).min(1);
            left -= *q;
        }
    }
    while left > 0 {
        let room: Vec<usize> = sizes.iter().zip(&quota).map(|(s, q)| s - q).collect();
        let room_total: usize = room.iter().sum();
        // Proportional share of what is left, by remaining room; floors first.
        let mut given = 0;
        let mut remainders: Vec<(u128, usize)> = Vec::new();
        for (i, r) in room.iter().enumerate() {
            let exact = left as u128 * *r as u128;
            let floor = (exact / room_total as u128) as usize;
            quota[i] += floor;
            given += floor;
            remainders.push((exact % room_total as u128, i));
        }
        left -= given;
        // Largest remainder first; ties to the earlier group.
        remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, i) in remainders {
            if left == 0 {
                break;
            }
            if quota[i] < sizes[i] {
                quota[i] += 1;
                left -= 1;
            }
        }
    }
    quota
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_proportional_and_covers_every_group() {
        assert_eq!(allocate(10, &[50, 30, 20]), vec![5, 3, 2]);
        assert_eq!(allocate(3, &[100, 1, 1]), vec![1, 1, 1]);
        assert_eq!(allocate(2, &[5, 5, 5]), vec![1, 1, 0]);
        assert_eq!(allocate(100, &[5, 5]), vec![5, 5]);
        let q = allocate(47, &[300, 40, 12, 3, 1]);
        assert_eq!(q.iter().sum::<usize>(), 47);
        assert!(q.iter().all(|&x| x >= 1));
        assert!(q[0] > q[1] && q[1] > q[2]);
    }

    #[test]
    fn rank_keys_are_fixed_values() {
        // The shuffle must not change across machines or versions: pin one key.
        assert_eq!(
            hex::encode(rank_key(7, "pi-0001")),
            crate::digest::sha256_hex(b"7:pi-0001")
        );
    }
}
