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
/// in f32, less the maximum, exp, divided by the sum (candle's own vectorised reductions:
/// a sum in another order could draw another token).
fn softmax(logits: &[f32], temperature: f64) -> Vec<f32> {
    use candle_core::cpu::kernels::VecOps;
    let mul = (1.0 / temperature) as f32;
    let scaled: Vec<f32> = logits.iter().map(|&x| x * mul).collect();
    let mut max = f32::NEG_INFINITY;
    // SAFETY: `scaled` holds `scaled.len()` values and `max` is one.
    unsafe { f32::vec_reduce_max(scaled.as_ptr(), &mut max, scaled.len()) };
    let mut out: Vec<f32> = scaled.iter().map(|&x| (x - max).exp()).collect();
    let mut sum = 0.0f32;
    // SAFETY: as above.
    unsafe { f32::vec_reduce_sum(out.as_ptr(), &mut sum, out.len()) };
    for x in &mut out {
        *x /= sum;
    }
    out
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

    #[test]
    fn empty_or_degenerate_logits_are_errors_not_panics() {
        let mut s = Sampler::new(1, Sampling::All { temperature: 1.0 });
        assert!(s.sample(&[]).is_err());
        assert!(s.sample(&[f32::NAN, f32::NAN]).is_err());
    }
}
