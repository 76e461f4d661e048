//! Interval estimates used wherever pieval reports a rate: the Wilson score interval
//! (Wilson 1927, "Probable inference, the law of succession, and statistical
//! inference"), the same formula as `queries/summary.sql`, a seeded percentile
//! bootstrap for statistics that are not a single proportion (F1, Cohen's kappa), and
//! rates corrected for a detector's measured error ([`rogan_gladen`]).

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

/// A rate corrected for the detector's error: the Rogan–Gladen estimator (Rogan &
/// Gladen 1978, "Estimating prevalence from the results of a screening test"),
/// π = (p + Sp − 1) / (Se + Sp − 1), clipped to [0, 1], where p is the observed rate and
/// Se, Sp the detector's sensitivity and specificity measured on a labelled set.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Corrected {
    pub rate: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub sensitivity: f64,
    pub specificity: f64,
}

/// Draws of the interval of [`rogan_gladen`], and their seed.
pub const CORRECTION_DRAWS: usize = 20_000;
pub const CORRECTION_SEED: u64 = 1978;

/// [`Corrected`] for `k` hits in `n` and a detector's confusion on its labelled set.
///
/// The interval carries the uncertainty of both the run and the calibration: the three
/// proportions (the run's rate, the sensitivity from the labelled positives, the
/// specificity from the labelled negatives) are drawn from their Jeffreys posteriors,
/// Beta(k + ½, n − k + ½) (the Jeffreys interval of Brown, Cai & DasGupta 2001), each
/// draw is corrected, and the 2.5th and 97.5th percentiles of the corrected draws are the
/// interval (a Monte Carlo propagation; draws where Se + Sp ≤ 1 count as 0 or 1 by the
/// sign of the numerator, as the clipped estimator gives). Seeded: the same counts give
/// the same interval. `None` when n is 0, the labelled set lacks a class, or the measured
/// detector is no better than chance (Se + Sp ≤ 1).
pub fn rogan_gladen(k: u64, n: u64, calibration: &Confusion) -> Option<Corrected> {
    let (pos, neg) = (
        calibration.tp + calibration.fn_,
        calibration.tn + calibration.fp,
    );
    if n == 0 || pos == 0 || neg == 0 || k > n {
        return None;
    }
    let p = k as f64 / n as f64;
    let se = calibration.tp as f64 / pos as f64;
    let sp = calibration.tn as f64 / neg as f64;
    let correct = |p: f64, se: f64, sp: f64| -> f64 {
        let j = se + sp - 1.0;
        let num = p + sp - 1.0;
        if j <= 0.0 {
            return if num > 0.0 { 1.0 } else { 0.0 };
        }
        (num / j).clamp(0.0, 1.0)
    };
    if se + sp <= 1.0 {
        return None;
    }
    let mut rng = fastrand::Rng::with_seed(CORRECTION_SEED);
    let mut draws: Vec<f64> = (0..CORRECTION_DRAWS)
        .map(|_| {
            let p = beta(&mut rng, k as f64 + 0.5, (n - k) as f64 + 0.5);
            let se = beta(
                &mut rng,
                calibration.tp as f64 + 0.5,
                calibration.fn_ as f64 + 0.5,
            );
            let sp = beta(
                &mut rng,
                calibration.tn as f64 + 0.5,
                calibration.fp as f64 + 0.5,
            );
            correct(p, se, sp)
        })
        .collect();
    draws.sort_by(f64::total_cmp);
    let at = |q: f64| draws[((draws.len() - 1) as f64 * q).round() as usize];
    Some(Corrected {
        rate: correct(p, se, sp),
        ci_low: at(0.025),
        ci_high: at(0.975),
        sensitivity: se,
        specificity: sp,
    })
}

/// A Beta(a, b) variate, as X / (X + Y) of two Gamma variates.
fn beta(rng: &mut fastrand::Rng, a: f64, b: f64) -> f64 {
    let x = gamma(rng, a);
    let y = gamma(rng, b);
    if x + y == 0.0 { 0.5 } else { x / (x + y) }
}

/// A Gamma(shape, 1) variate (Marsaglia & Tsang 2000, "A simple method for generating
/// gamma variables"; shapes below 1 boosted by U^(1/shape)).
fn gamma(rng: &mut fastrand::Rng, shape: f64) -> f64 {
    if shape < 1.0 {
        let u = rng.f64().max(f64::MIN_POSITIVE);
        return gamma(rng, shape + 1.0) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u = rng.f64();
        if u < 1.0 - 0.0331 * x.powi(4)
            || u.max(f64::MIN_POSITIVE).ln() < 0.5 * x * x + d * (1.0 - v + v.ln())
        {
            return d * v;
        }
    }
}

/// A standard normal variate (Box–Muller).
fn normal(rng: &mut fastrand::Rng) -> f64 {
    let u1 = rng.f64().max(f64::MIN_POSITIVE);
    let u2 = rng.f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rogan_gladen_corrects_and_carries_both_uncertainties() {
        // A perfect detector changes nothing but the interval's width.
        let perfect = Confusion {
            tp: 200,
            fp: 0,
            tn: 200,
            fn_: 0,
        };
        let c = rogan_gladen(10, 100, &perfect).unwrap();
        assert!((c.rate - 0.1).abs() < 1e-12);
        assert!(c.ci_low < 0.1 && c.ci_high > 0.1);
        // Se 0.9, Sp 0.95: (0.2 + 0.95 − 1) / 0.85 = 0.17647…
        let cal = Confusion {
            tp: 90,
            fn_: 10,
            tn: 95,
            fp: 5,
        };
        let c = rogan_gladen(200, 1000, &cal).unwrap();
        assert!((c.rate - 0.15 / 0.85).abs() < 1e-12, "{c:?}");
        assert!((c.sensitivity - 0.9).abs() < 1e-12 && (c.specificity - 0.95).abs() < 1e-12);
        assert!(c.ci_low < c.rate && c.rate < c.ci_high, "{c:?}");
        // The calibration's uncertainty widens the interval beyond the run's own.
        let (lo, hi) = wilson(200, 1000).unwrap();
        assert!(c.ci_high - c.ci_low > hi - lo, "{c:?}");
        // A bigger labelled set narrows it.
        let big = Confusion {
            tp: 9000,
            fn_: 1000,
            tn: 9500,
            fp: 500,
        };
        let b = rogan_gladen(200, 1000, &big).unwrap();
        assert!(b.ci_high - b.ci_low < c.ci_high - c.ci_low);
        // Seeded.
        assert_eq!(c, rogan_gladen(200, 1000, &cal).unwrap());
        // Below the false-positive floor: clipped at 0.
        assert_eq!(rogan_gladen(1, 1000, &cal).unwrap().rate, 0.0);
        // Undefined: no run, a class missing, a detector no better than chance.
        assert!(rogan_gladen(0, 0, &cal).is_none());
        assert!(
            rogan_gladen(
                1,
                10,
                &Confusion {
                    tp: 5,
                    fn_: 5,
                    ..Default::default()
                }
            )
            .is_none()
        );
        assert!(
            rogan_gladen(
                1,
                10,
                &Confusion {
                    tp: 5,
                    fn_: 5,
                    tn: 5,
                    fp: 5
                }
            )
            .is_none()
        );
    }

    #[test]
    fn the_beta_draws_have_the_right_mean() {
        let mut rng = fastrand::Rng::with_seed(3);
        for (a, b) in [(0.5, 0.5), (2.5, 7.5), (90.5, 10.5)] {
            let m: f64 = (0..20_000).map(|_| beta(&mut rng, a, b)).sum::<f64>() / 20_000.0;
            assert!((m - a / (a + b)).abs() < 0.01, "{a} {b} {m}");
        }
    }

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
