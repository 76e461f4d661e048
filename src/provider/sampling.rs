//! Choosing the next token from the model's logits: the greatest (temperature 0), or a draw
//! from the softmax at a temperature, over every token or the smallest set whose
//! probability reaches `top_p` (nucleus sampling, Holtzman et al. 2020), seeded.
//!
//! The same arithmetic, and so the same tokens for a seed, as candle-transformers 0.11's
//! `generation::LogitsProcessor`, which pieval used before (Apache-2.0 / MIT): logits
//! multiplied by 1 / temperature, a softmax that subtracts the maximum, then `rand`'s
//! `WeightedIndex` over a `StdRng` seeded with the run's seed. Without it a default build
//! need not compile candle-transformers (docs/performance.md, "Build and run times").

use rand::SeedableRng;
use rand::distr::Distribution;

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub enum Sampling {
    ArgMax,
    All { temperature: f64 },
    TopP { p: f64, temperature: f64 },
}

pub struct Sampler {
    rng: rand::rngs::StdRng,
    sampling: Sampling,
}

impl Sampler {
    pub fn new(seed: u64, sampling: Sampling) -> Self {
        Self {
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            sampling,
        }
    }

    /// The next token, from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, String> {
        if logits.is_empty() {
            return Err("no logits".into());
        }
        match self.sampling.clone() {
            Sampling::ArgMax => Ok(argmax(logits)),
            Sampling::All { temperature } => self.multinomial(&softmax(logits, temperature)),
            Sampling::TopP { p, temperature } => {
                let mut prs = softmax(logits, temperature);
                if p <= 0.0 || p >= 1.0 {
                    self.multinomial(&prs)
                } else {
                    // the least likely tokens past the nucleus set to zero
                    let mut order: Vec<usize> = (0..prs.len()).collect();
                    order.sort_by(|&i, &j| prs[j].total_cmp(&prs[i]));
                    let top_p = p as f32;
                    let mut cumsum = 0.0f32;
                    for &i in &order {
                        if cumsum >= top_p {
                            prs[i] = 0.0;
                        } else {
                            cumsum += prs[i];
                        }
                    }
                    self.multinomial(&prs)
                }
            }
        }
    }

    fn multinomial(&mut self, prs: &[f32]) -> Result<u32, String> {
        let distr = rand::distr::weighted::WeightedIndex::new(prs).map_err(|e| e.to_string())?;
        Ok(distr.sample(&mut self.rng) as u32)
    }
}

/// The index of the greatest logit (the first of equals; NaN is never greatest).
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The softmax of `logits / temperature`, as candle computes it: times 1 / temperature
/// in f32, less the maximum, exp, divided by the sum (summed in candle's order: a sum in
/// another order could draw another token).
fn softmax(logits: &[f32], temperature: f64) -> Vec<f32> {
    let mul = (1.0 / temperature) as f32;
    let scaled: Vec<f32> = logits.iter().map(|&x| x * mul).collect();
    let max = scaled.iter().skip(1).fold(scaled[0], |m, &x| m.max(x));
    let mut out: Vec<f32> = scaled.iter().map(|&x| (x - max).exp()).collect();
    let sum = sum_as_candle(&out);
    for x in &mut out {
        *x /= sum;
    }
    out
}

/// The sum candle-core 0.11's `vec_sum` gives. On x86_64 with AVX2: four 8-lane
/// accumulators over each 32 values, folded pairwise (0+1, 2+3, then the two), each lane
/// added to the one four above, then two horizontal adds ((0+1)+(2+3)), then the remainder
/// one by one. On aarch64 (NEON): eight 4-lane accumulators folded the same way, then
/// `vaddvq` ((0+1)+(2+3)), then the remainder. Elsewhere left to right. Emulated lane by
/// lane: each addition is the same IEEE operation (tested against candle's on this
/// build's CPU by `sums_as_candle_does`).
pub(crate) fn sum_as_candle(xs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        return lanes_sum::<8, 4>(xs);
    }
    #[cfg(target_arch = "aarch64")]
    return lanes_sum::<4, 8>(xs);
    #[allow(unreachable_code)]
    xs.iter().fold(0.0, |s, &x| s + x)
}

/// `ARR` accumulators of `LANES` lanes over each `LANES * ARR` (= 32) values, folded as
/// candle's `vec_reduce` folds them.
#[allow(dead_code)] // one of the two instantiations per architecture
fn lanes_sum<const LANES: usize, const ARR: usize>(xs: &[f32]) -> f32 {
    let step = LANES * ARR;
    let mut acc = [[0f32; LANES]; ARR];
    let whole = xs.len() / step * step;
    for chunk in xs[..whole].chunks_exact(step) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, v) in a.iter_mut().enumerate() {
                *v += chunk[LANES * j + l];
            }
        }
    }
    // 0+1, 2+3, …; then 0+2, 4+6; then 0+4.
    let mut width = 1;
    while width < ARR {
        for i in (0..ARR).step_by(2 * width) {
            let other = acc[i + width];
            for (v, o) in acc[i].iter_mut().zip(other) {
                *v += o;
            }
        }
        width *= 2;
    }
    let x = acc[0];
    let t: [f32; 4] = match LANES {
        8 => std::array::from_fn(|l| x[l] + x[l + 4]),
        _ => std::array::from_fn(|l| x[l]),
    };
    let mut sum = (t[0] + t[1]) + (t[2] + t[3]);
    for &v in &xs[whole..] {
        sum += v;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_transformers::generation::{LogitsProcessor, Sampling as Theirs};

    /// The same tokens as candle-transformers' `LogitsProcessor` for the same seed, logits
    /// and sampling, draw after draw (its arithmetic, its generator).
    #[test]
    fn draws_as_candle_did() {
        let mut rng = fastrand::Rng::with_seed(11);
        let logits: Vec<f32> = (0..49_152).map(|_| rng.f32() * 30.0 - 15.0).collect();
        let tensor =
            candle_core::Tensor::new(logits.as_slice(), &candle_core::Device::Cpu).unwrap();
        let cases = [
            (Sampling::ArgMax, Theirs::ArgMax),
            (
                Sampling::All { temperature: 0.7 },
                Theirs::All { temperature: 0.7 },
            ),
            (
                Sampling::TopP {
                    p: 0.9,
                    temperature: 1.3,
                },
                Theirs::TopP {
                    p: 0.9,
                    temperature: 1.3,
                },
            ),
            (
                Sampling::TopP {
                    p: 1.0,
                    temperature: 0.2,
                },
                Theirs::TopP {
                    p: 1.0,
                    temperature: 0.2,
                },
            ),
        ];
        for (ours, theirs) in cases {
            for seed in [0, 7, 299_792_458] {
                let mut a = Sampler::new(seed, ours.clone());
                let mut b = LogitsProcessor::from_sampling(seed, theirs.clone());
                for draw in 0..50 {
                    assert_eq!(
                        a.sample(&logits).unwrap(),
                        b.sample(&tensor).unwrap(),
                        "{ours:?} seed {seed} draw {draw}"
                    );
                }
            }
        }
    }

    /// The sum of the softmax, bit for bit candle-core's (its vectorised kernel on this
    /// CPU) over lengths around its 32-value steps and a vocabulary's.
    #[test]
    fn sums_as_candle_does() {
        use candle_core::cpu::kernels::VecOps;
        let mut rng = fastrand::Rng::with_seed(3);
        for len in (0..100).chain([255, 256, 257, 49_152, 49_153]) {
            let xs: Vec<f32> = (0..len).map(|_| (rng.f32() - 0.3) * 1e3).collect();
            let mut theirs = 0f32;
            // SAFETY: `xs` holds `len` values and `theirs` is one.
            unsafe { f32::vec_reduce_sum(xs.as_ptr(), &mut theirs, len) };
            assert_eq!(
                sum_as_candle(&xs).to_bits(),
                theirs.to_bits(),
                "length {len}"
            );
        }
    }

    #[test]
    fn empty_or_degenerate_logits_are_errors_not_panics() {
        let mut s = Sampler::new(1, Sampling::All { temperature: 1.0 });
        assert!(s.sample(&[]).is_err());
        assert!(s.sample(&[f32::NAN, f32::NAN]).is_err());
    }
}
