//! Interval estimates used wherever pieval reports a rate: the Wilson score interval
//! (Wilson 1927, "Probable inference, the law of succession, and statistical
//! inference"), the same formula as `queries/summary.sql`, and a seeded percentile
//! bootstrap for statistics that are not a single proportion (F1, Cohen's kappa).

/// 1.96², the 95% two-sided normal quantile squared.
pub const Z2_95: f64 = 3.8416;

/// The Wilson score interval (95%) of k successes in n: exact at the edges (0 when
/// k = 0, 1 when k = n) and clamped to [0, 1]; `None` when n = 0.
pub fn wilson(k: u64, n: u64) -> Option<(f64, f64)> {
    if n == 0 {
        return None;
    }
    let (kf, nf) = (k as f64, n as f64);
    let p = kf / nf;
    let z2 = Z2_95;
    let centre = p + z2 / (2.0 * nf);
    let spread = z2.sqrt() * (p * (1.0 - p) / nf + z2 / (4.0 * nf * nf)).sqrt();
    let denom = 1.0 + z2 / nf;
    let low = if k == 0 {
        0.0
    } else {
        ((centre - spread) / denom).max(0.0)
    };
    let high = if k == n {
        1.0
    } else {
        ((centre + spread) / denom).min(1.0)
    };
    Some((low, high))
}

/// A binary confusion matrix: the truth (label) against a detector's decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Confusion {
    pub tp: u64,
    pub fp: u64,
    pub tn: u64,
    #[serde(rename = "fn")]
    pub fn_: u64,
}

impl Confusion {
    pub fn add(&mut self, label: bool, decided: bool) {
        match (label, decided) {
            (true, true) => self.tp += 1,
            (false, true) => self.fp += 1,
            (false, false) => self.tn += 1,
            (true, false) => self.fn_ += 1,
        }
    }

    pub fn n(&self) -> u64 {
        self.tp + self.fp + self.tn + self.fn_
    }

    pub fn accuracy(&self) -> Option<f64> {
        ratio(self.tp + self.tn, self.n())
    }

    pub fn precision(&self) -> Option<f64> {
        ratio(self.tp, self.tp + self.fp)
    }

    pub fn recall(&self) -> Option<f64> {
        ratio(self.tp, self.tp + self.fn_)
    }

    /// 2·TP / (2·TP + FP + FN); `None` when there is no positive anywhere.
    pub fn f1(&self) -> Option<f64> {
        ratio(2 * self.tp, 2 * self.tp + self.fp + self.fn_)
    }

    /// Cohen's kappa (Cohen 1960): agreement beyond chance, (pₒ − pₑ) / (1 − pₑ);
    /// `None` when chance agreement is total (pₑ = 1).
    pub fn kappa(&self) -> Option<f64> {
        let n = self.n() as f64;
        if n == 0.0 {
            return None;
        }
        let po = (self.tp + self.tn) as f64 / n;
        let yes = ((self.tp + self.fp) as f64 / n) * ((self.tp + self.fn_) as f64 / n);
        let no = ((self.tn + self.fn_) as f64 / n) * ((self.tn + self.fp) as f64 / n);
        let pe = yes + no;
        ((1.0 - pe).abs() > 1e-12).then(|| (po - pe) / (1.0 - pe))
    }
}

fn ratio(k: u64, n: u64) -> Option<f64> {
    (n > 0).then(|| k as f64 / n as f64)
}

/// A 95% percentile bootstrap interval of `stat` over (label, decision) pairs:
/// `resamples` resamples with replacement drawn from a generator seeded with `seed`, so
/// the same pairs give the same interval. Resamples where the statistic is undefined are
/// skipped; `None` when none is defined.
pub fn bootstrap(
    pairs: &[(bool, bool)],
    stat: impl Fn(&Confusion) -> Option<f64>,
    resamples: usize,
    seed: u64,
) -> Option<(f64, f64)> {
    if pairs.is_empty() {
        return None;
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut values: Vec<f64> = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        let mut c = Confusion::default();
        for _ in 0..pairs.len() {
            let (label, decided) = pairs[rng.usize(..pairs.len())];
            c.add(label, decided);
        }
        if let Some(v) = stat(&c) {
            values.push(v);
        }
    }
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    Some((at(0.025), at(0.975)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_matches_known_values() {
        // 0 of 13 and 0 of 44 (the quickstart's upper bounds), 5 of 10 ≈ [0.2366, 0.7634]
        // (R's binom.confint, method wilson).
        let (lo, hi) = wilson(0, 13).unwrap();
        assert_eq!(lo, 0.0);
        assert!((hi - 0.2281).abs() < 1e-4, "{hi}");
        assert!((wilson(0, 44).unwrap().1 - 0.080298).abs() < 1e-5);
        let (lo, hi) = wilson(5, 10).unwrap();
        assert!((lo - 0.236593).abs() < 1e-5 && (hi - 0.763407).abs() < 1e-5);
        assert_eq!(wilson(7, 7).unwrap().1, 1.0);
        assert!(wilson(0, 0).is_none());
    }

    #[test]
    fn confusion_metrics() {
        let c = Confusion {
            tp: 40,
            fp: 10,
            tn: 45,
            fn_: 5,
        };
        assert_eq!(c.accuracy(), Some(0.85));
        assert_eq!(c.precision(), Some(0.8));
        assert!((c.recall().unwrap() - 40.0 / 45.0).abs() < 1e-12);
        assert!((c.f1().unwrap() - 80.0 / 95.0).abs() < 1e-12);
        // po = 0.85, pe = 0.5·0.45 + 0.5·0.55 = 0.5 → kappa 0.7
        assert!((c.kappa().unwrap() - 0.7).abs() < 1e-12);
        let all_yes = Confusion {
            tp: 3,
            ..Confusion::default()
        };
        assert_eq!(
            all_yes.kappa(),
            None,
            "no chance-corrected agreement without variety"
        );
    }

    #[test]
    fn bootstrap_is_seeded_and_brackets_the_estimate() {
        let pairs: Vec<(bool, bool)> = (0..200).map(|i| (i % 2 == 0, i % 5 != 0)).collect();
        let a = bootstrap(&pairs, Confusion::f1, 500, 7).unwrap();
        assert_eq!(a, bootstrap(&pairs, Confusion::f1, 500, 7).unwrap());
        let mut c = Confusion::default();
        for (l, d) in &pairs {
            c.add(*l, *d);
        }
        let f1 = c.f1().unwrap();
        assert!(a.0 <= f1 && f1 <= a.1, "{a:?} {f1}");
    }
}
