//! `summary.json`'s `aggregate_metrics`, typed: scoring writes the file from
//! [`AggregateMetrics`], and the run's headline rates (the manifest, the run table) and
//! `runs diff` read it back into the same type. (`pieval runs show --json` and the `runs`
//! SQL table pass the whole document on as it is.)
//!
//! The key order of the file is the order of these fields (serde_json keeps insertion
//! order), and the headline rates keep the order `queries/summary.sql` gives them.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Rate;

/// Keys with their values, in the order they were written (a JSON object).
#[derive(Clone, Debug, PartialEq)]
pub struct Ordered<V>(pub Vec<(String, V)>);

impl<V> Default for Ordered<V> {
    fn default() -> Self {
        Ordered(Vec::new())
    }
}

impl<V> Ordered<V> {
    pub fn get(&self, key: &str) -> Option<&V> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The value under `key`, added (at the end) when missing.
    pub fn entry(&mut self, key: &str) -> &mut V
    where
        V: Default,
    {
        let i = match self.0.iter().position(|(k, _)| k == key) {
            Some(i) => i,
            None => {
                self.0.push((key.to_owned(), V::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[i].1
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }
}

impl<V: Serialize> Serialize for Ordered<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Ordered<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V2<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for V2<V> {
            type Value = Ordered<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = a.next_entry::<String, V>()? {
                    out.push((k, v));
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_map(V2(PhantomData))
    }
}

/// `summary.json`'s `aggregate_metrics`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AggregateMetrics {
    #[serde(deserialize_with = "count")]
    pub total: u64,
    #[serde(deserialize_with = "count")]
    pub attack_cases: u64,
    #[serde(deserialize_with = "count")]
    pub benign_cases: u64,
    #[serde(deserialize_with = "count")]
    pub errors: u64,
    #[serde(deserialize_with = "count")]
    pub manual_review: u64,
    #[serde(deserialize_with = "count")]
    pub judged: u64,
    #[serde(deserialize_with = "count")]
    pub judge_errors: u64,
    #[serde(deserialize_with = "count")]
    pub echoes: u64,
    #[serde(deserialize_with = "count")]
    pub decided_by_human: u64,
    #[serde(deserialize_with = "count")]
    pub decided_by_judge: u64,
    #[serde(deserialize_with = "count")]
    pub decided_by_rules: u64,
    /// The headline rates corrected for detector error (`src/scoring/corrected.rs`).
    #[serde(deserialize_with = "or_default")]
    pub corrected: Corrected,
    /// The headline rates over every row, then the rates by dimension.
    #[serde(flatten)]
    pub rates: Rates,
    #[serde(deserialize_with = "or_default")]
    pub latency_ms: Latency,
}

// Reading is lenient, as the readers of other runs' summaries always were (`runs diff`
// of a folder written by another version): a figure of the wrong shape reads as missing.

/// A count: a non-negative integer, else 0.
fn count<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(serde_json::Value::deserialize(d)?.as_u64().unwrap_or(0))
}

/// A part of the wrong shape reads as its default.
fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned + Default,
{
    Ok(serde_json::from_value(serde_json::Value::deserialize(d)?).unwrap_or_default())
}

impl AggregateMetrics {
    /// A headline rate over every row (`attack_success_rate`, `leakage_rate` …).
    pub fn rate(&self, metric: &str) -> Option<&Rate> {
        self.rates.overall.get(metric)
    }

    /// A rate within a group: `group("adaptive", "any_attempt", "attack_success_rate")`.
    pub fn group(&self, dimension: &str, value: &str, metric: &str) -> Option<&Rate> {
        self.rates
            .by
            .get(&format!("by_{dimension}"))
            .and_then(|g| g.get(value))
            .and_then(|m| m.get(metric))
    }
}

/// The rates of `queries/summary.sql`: over every row (`metric → rate`), and by
/// dimension (`by_<dimension> → value → metric → rate`), written side by side in the file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rates {
    pub overall: Ordered<Rate>,
    pub by: Ordered<Ordered<Ordered<Rate>>>,
}

impl Serialize for Rates {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        for (k, v) in &self.overall.0 {
            m.serialize_entry(k, v)?;
        }
        for (k, v) in &self.by.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for Rates {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Rates;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("rates by metric and by dimension")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Rates, A::Error> {
                let mut out = Rates::default();
                // A key of another shape (added by another version) is passed over.
                while let Some(k) = a.next_key::<String>()? {
                    let v: serde_json::Value = a.next_value()?;
                    if k.starts_with("by_") {
                        if let Ok(group) = serde_json::from_value(v) {
                            out.by.0.push((k, group));
                        }
                    } else if let Ok(rate) = serde_json::from_value(v) {
                        out.overall.0.push((k, rate));
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}

/// Latency percentiles over the answered calls, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Latency {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub max: Option<f64>,
}

/// `aggregate_metrics.corrected`: how, and each headline rate corrected.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Corrected {
    pub method: String,
    pub rates: Ordered<CorrectedRate>,
}

/// One headline rate, raw and corrected for detector error (or why not).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CorrectedRate {
    pub raw: Option<f64>,
    pub n: u64,
    pub k: u64,
    /// Absent without figures for the detector; null when they do not allow a correction.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub corrected: Option<Option<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ci_low: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ci_high: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sensitivity: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub specificity: Option<f64>,
    /// Why the rate is not corrected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The detector's figures and the labelled sets behind them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub figures: Option<serde_json::Value>,
}

/// A key that is present (its value may be null).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<f64>>, D::Error> {
    Option::<f64>::deserialize(d).map(Some)
}

/// The `aggregate_metrics` of a summary.json's text (`Err`: not JSON). Missing or
/// misshapen figures read as missing, as every reader of other runs' summaries did.
pub fn metrics_of(text: &[u8]) -> serde_json::Result<AggregateMetrics> {
    let doc: serde_json::Value = serde_json::from_slice(text)?;
    Ok(doc
        .get("aggregate_metrics")
        .filter(|m| m.is_object())
        .and_then(|m| serde_json::from_value(m.clone()).ok())
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_reads_back_into_the_same_bytes() {
        let text = r#"{
  "total": 3,
  "attack_cases": 2,
  "benign_cases": 1,
  "errors": 0,
  "manual_review": 1,
  "judged": 0,
  "judge_errors": 0,
  "echoes": 1,
  "decided_by_human": 0,
  "decided_by_judge": 0,
  "decided_by_rules": 2,
  "corrected": {
    "method": "m",
    "rates": {
      "attack_success_rate": {
        "raw": 0.5,
        "n": 2,
        "k": 1,
        "corrected": null,
        "note": "no decided rows",
        "figures": {
          "tp": 1
        }
      },
      "leakage_rate": {
        "raw": null,
        "n": 0,
        "k": 0,
        "note": "no recorded figures for this detector"
      }
    }
  },
  "attack_success_rate": {
    "n": 2,
    "k": 1,
    "rate": 0.5,
    "ci_low": 0.09,
    "ci_high": 0.91
  },
  "by_adaptive": {
    "any_attempt": {
      "attack_success_rate": {
        "n": 2,
        "k": 1,
        "rate": 0.5,
        "ci_low": 0.09,
        "ci_high": 0.91
      }
    }
  },
  "latency_ms": {
    "p50": 1.5,
    "p95": null,
    "max": 2.0
  }
}"#;
        let m: AggregateMetrics = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::to_string_pretty(&m).unwrap(), text);
        assert_eq!(m.rate("attack_success_rate").unwrap().k, 1);
        assert_eq!(
            m.group("adaptive", "any_attempt", "attack_success_rate")
                .unwrap()
                .n,
            2
        );
        assert_eq!(
            m.corrected
                .rates
                .get("attack_success_rate")
                .unwrap()
                .corrected,
            Some(None)
        );
        assert_eq!(
            m.corrected.rates.get("leakage_rate").unwrap().corrected,
            None
        );
    }
}
