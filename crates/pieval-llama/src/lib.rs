//! A llama decoder for GGUF files whose matrices are Q4_1 or Q8_0 (the embedded
//! SmolLM2 model): plain Rust over the GGUF's own block layout, with AVX2 dot products.
//!
//! Why not candle's `quantized_llama`: candle 0.11 has no SIMD kernel for Q4_1 (its
//! `vec_dot` is the scalar reference), and its decode step pays a tensor allocation per
//! operation, a copy of the whole KV cache per token (`Tensor::cat`) and another for
//! grouped-query heads (`repeat_kv`). Here: activations are quantized once per matrix
//! input (Q8, as ggml does), rows are dotted with AVX2 `maddubs`, the KV cache is one
//! preallocated buffer per layer, attention reads it in place, and embeddings are
//! dequantized one row at a time (the Q8_0 table is shared with the tied output head).
//! The GGUF is read by [`gguf`] (no candle in a default build); other GGUFs (K-quants,
//! F16 …) run on candle with the `candle-models` feature: see pieval's `local.rs`.
//!
//! Decoding one token streams every weight from memory once (about 96 MB for SmolLM2), so
//! the kernels are written for that stream: each block's f16 scales are converted with
//! F16C inside the kernel, weights are prefetched ahead of the block being read, and the
//! step is split between a team of threads (`team.rs`) that spin between the products
//! (each thread streams one contiguous part of each matrix; attention heads are taken
//! one at a time). The split changes no logit: every output is computed by one thread.
//! A prompt's tokens meet each weight row four at a time (one load and unpacking of the
//! row's blocks for the four), each token's sum computed as the one-token kernel does.
//!
//! The arithmetic is llama's: RMSNorm, interleaved RoPE (llama.cpp's NORM type), causal
//! grouped-query attention, SwiGLU, tied or separate output head. A test checks the
//! logits against candle's implementation.

use std::fs::File;

use half::f16;

pub mod gguf;
mod team;
use gguf::Gguf;
use team::{Out, Team, share};

const QK: usize = 32;

/// An error reading a GGUF or running its model: what went wrong, in words.
#[derive(Clone, Debug, PartialEq)]
pub struct Error(String);

impl Error {
    pub fn msg(m: impl Into<String>) -> Self {
        Self(m.into())
    }

    fn io(e: std::io::Error) -> Self {
        Self(e.to_string())
    }

    /// The same error under `what` ("what: error").
    fn context(self, what: &str) -> Self {
        Self(format!("{what}: {}", self.0))
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

macro_rules! bail {
    ($($t:tt)*) => {
        return Err($crate::Error::msg(format!($($t)*)))
    };
}
pub(crate) use bail;

/// A weight matrix in a GGUF block layout, `rows` × `cols`, row-major.
struct QMatrix {
    kind: Kind,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// 20-byte blocks: d (f16), m (f16), 16 bytes of nibbles; x = d·q + m.
    Q4_1,
    /// 34-byte blocks: d (f16), 32 i8; x = d·q.
    Q8_0,
}

impl Kind {
    fn block_bytes(self) -> usize {
        match self {
            Kind::Q4_1 => 20,
            Kind::Q8_0 => 34,
        }
    }
}

/// One block of quantized activations: 32 values as `d·q`, `s = d·Σq`.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct ActBlock {
    qs: [i8; QK],
    d: f32,
    s: f32,
}

/// Activations of `tokens` vectors of `cols` values, quantized per 32.
struct Acts {
    blocks: Vec<ActBlock>,
    per_token: usize,
}

impl Acts {
    /// `simd`: each block through [`avx2::quantize_block`] where it can take it (the
    /// same bits as [`quantize_block`]'s, tested); a step quantizes its activations
    /// four times a layer on one thread while the others wait.
    fn quantize(x: &[f32], cols: usize, simd: bool) -> Self {
        debug_assert_eq!(x.len() % cols, 0);
        let per_token = cols / QK;
        let mut blocks = Vec::with_capacity(x.len() / QK);
        for chunk in x.chunks_exact(QK) {
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: `simd` is set only where AVX2, FMA and F16C are.
                if let Some(b) = unsafe { avx2::quantize_block(chunk) } {
                    blocks.push(b);
                    continue;
                }
            }
            let _ = simd;
            blocks.push(quantize_block(chunk));
        }
        Self { blocks, per_token }
    }

    fn tokens(&self) -> usize {
        self.blocks.len() / self.per_token
    }

    fn token(&self, t: usize) -> &[ActBlock] {
        &self.blocks[t * self.per_token..(t + 1) * self.per_token]
    }
}

/// One block of 32 activations as Q8: a scale `d` (the largest magnitude over 127), the
/// values over `d` rounded half away from zero, and `d` times their sum.
fn quantize_block(chunk: &[f32]) -> ActBlock {
    let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    // `min`: a subnormal `d` (a block of values under 1e-37) would give an infinite
    // inverse.
    let inv = if d > 0.0 {
        (1.0 / d).min(f32::MAX)
    } else {
        0.0
    };
    let mut qs = [0i8; QK];
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(chunk) {
        let r = round_half_away(v * inv);
        *q = r as i8;
        sum = sum.wrapping_add(r);
    }
    ActBlock {
        qs,
        d,
        s: d * sum as f32,
    }
}

/// `y.round() as i32`, for every `y` (here at most 127 in size), without a call to libm's
/// `roundf` (the default x86-64 target has no rounding instruction): truncate, then step
/// away from zero when the fraction, which is exact below 2^23 (and zero from there up to
/// 2^31), is a half or more; beyond `i32`'s range both saturate.
#[inline(always)]
fn round_half_away(y: f32) -> i32 {
    let t = y as i32;
    let f = y - t as f32;
    t.saturating_add(i32::from(f >= 0.5))
        .saturating_sub(i32::from(f <= -0.5))
}

fn half(bytes: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[0], bytes[1]])).to_f32()
}

/// Dot product of one weight row with one activation vector, scalar reference.
fn dot_scalar(kind: Kind, row: &[u8], acts: &[ActBlock]) -> f32 {
    let mut sum = 0f32;
    match kind {
        Kind::Q4_1 => {
            for (b, a) in row.chunks_exact(20).zip(acts) {
                let (d, m) = (half(&b[0..2]), half(&b[2..4]));
                let mut s = 0i32;
                for j in 0..16 {
                    let q = b[4 + j];
                    s += (q & 0x0F) as i32 * a.qs[j] as i32 + (q >> 4) as i32 * a.qs[j + 16] as i32;
                }
                sum += d * a.d * s as f32 + m * a.s;
            }
        }
        Kind::Q8_0 => {
            for (b, a) in row.chunks_exact(34).zip(acts) {
                let d = half(&b[0..2]);
                let mut s = 0i32;
                for j in 0..QK {
                    s += b[2 + j] as i8 as i32 * a.qs[j] as i32;
                }
                sum += d * a.d * s as f32;
            }
        }
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::ActBlock;
    use std::arch::x86_64::*;

    /// How far ahead of the block being read the weights are prefetched.
    const PREFETCH: usize = 512;

    /// The f16 at `p` and the one after it, as f32 (F16C: `half`'s portable conversion,
    /// not inlined into these loops, was a fifth of a decode step).
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (f32, f32) {
        unsafe {
            let v = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
            (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
        }
    }

    /// A Q4_1 block at `b`: its scale `d`, its minimum `m`, and its 32 nibbles as bytes
    /// (the low nibbles first, as the block stores values 0..16 and 16..32).
    #[inline(always)]
    unsafe fn q4_1_block(b: *const u8) -> (f32, f32, __m256i) {
        unsafe {
            let mask = _mm_set1_epi8(0x0F);
            let (d, m) = halves(b);
            let qs = _mm_loadu_si128(b.add(4) as *const __m128i);
            let lo = _mm_and_si128(qs, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
            (d, m, _mm256_set_m128i(hi, lo))
        }
    }

    /// Add one block's `d·(x · a.q)` to `acc` and `m·a.s` to `mins`: the one order both
    /// Q4_1 kernels sum in.
    #[inline(always)]
    unsafe fn q4_1_add(
        (d, m, x): (f32, f32, __m256i),
        a: &ActBlock,
        acc: &mut __m256,
        mins: &mut f32,
    ) {
        unsafe {
            let y = _mm256_load_si256(a.qs.as_ptr() as *const __m256i);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1));
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), _mm256_cvtepi32_ps(p), *acc);
            *mins += m * a.s;
        }
    }

    /// [`super::quantize_block`] of 32 values, eight at a time, with the same operations
    /// in the same order (so the same bits): the largest magnitude, `d = amax / 127`, its
    /// inverse, `v · inv` truncated, then a step away from zero when the fraction is a
    /// half or more. `None` (the scalar way, with its saturation) for a block holding a
    /// NaN or an infinity, or whose scale is subnormal.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_block(x: &[f32]) -> Option<ActBlock> {
        assert_eq!(x.len(), super::QK);
        unsafe {
            let p = x.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let sign = _mm256_set1_ps(-0.0);
            let inf = _mm256_set1_ps(f32::INFINITY);
            let mut amax = _mm256_setzero_ps();
            let mut odd = 0;
            for &a in &v {
                let abs = _mm256_andnot_ps(sign, a);
                // NaN (unordered) or infinite: not for this path.
                odd |= _mm256_movemask_ps(_mm256_cmp_ps(abs, inf, _CMP_NLT_UQ));
                amax = _mm256_max_ps(amax, abs);
            }
            if odd != 0 {
                return None;
            }
            let m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
            let d = amax / 127.0;
            if d > 0.0 && d < f32::MIN_POSITIVE {
                return None;
            }
            let inv = if d > 0.0 {
                (1.0 / d).min(f32::MAX)
            } else {
                0.0
            };
            let (vinv, one) = (_mm256_set1_ps(inv), _mm256_set1_ps(1.0));
            let (half, neg_half) = (_mm256_set1_ps(0.5), _mm256_set1_ps(-0.5));
            let round = |a: __m256| {
                let y = _mm256_mul_ps(a, vinv);
                let t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                let f = _mm256_sub_ps(y, t);
                let up = _mm256_and_ps(_mm256_cmp_ps(f, half, _CMP_GE_OQ), one);
                let down = _mm256_and_ps(_mm256_cmp_ps(f, neg_half, _CMP_LE_OQ), one);
                _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(t, up), down))
            };
            let r = [round(v[0]), round(v[1]), round(v[2]), round(v[3])];
            let total =
                _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
            let t4 = _mm_add_epi32(
                _mm256_castsi256_si128(total),
                _mm256_extracti128_si256(total, 1),
            );
            let t2 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0b01_00_11_10));
            let sum = _mm_cvtsi128_si32(_mm_add_epi32(t2, _mm_shuffle_epi32(t2, 0b10_11_00_01)));
            // Packing works within 128-bit lanes: the permute puts the 32 bytes back in
            // order.
            let bytes = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(
                    _mm256_packs_epi32(r[0], r[1]),
                    _mm256_packs_epi32(r[2], r[3]),
                ),
                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7),
            );
            let mut qs = [0i8; super::QK];
            _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, bytes);
            Some(ActBlock {
                qs,
                d,
                s: d * sum as f32,
            })
        }
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        unsafe {
            let lo = _mm256_castps256_ps128(v);
            let hi = _mm256_extractf128_ps(v, 1);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// Q4_1 row · Q8 activations.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_1(row: &[u8], acts: &[ActBlock]) -> f32 {
        unsafe {
            let mut acc = _mm256_setzero_ps();
            let mut mins = 0f32;
            for (b, a) in row.chunks_exact(20).zip(acts) {
                _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().wrapping_add(PREFETCH) as *const i8);
                q4_1_add(q4_1_block(b.as_ptr()), a, &mut acc, &mut mins);
            }
            hsum(acc) + mins
        }
    }

    /// One Q4_1 row · four tokens' activations: each weight block is loaded and its
    /// nibbles spread once for the four (the prompt, where the same row meets every
    /// token). Each token's sum is computed exactly as [`dot_q4_1`] computes it.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_1_x4(row: &[u8], acts: [&[ActBlock]; 4]) -> [f32; 4] {
        let blocks = row.len() / 20;
        assert!(acts.iter().all(|a| a.len() == blocks));
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut mins = [0f32; 4];
            for (i, b) in row.chunks_exact(20).enumerate() {
                let block = q4_1_block(b.as_ptr());
                for (t, a) in acts.iter().enumerate() {
                    q4_1_add(block, a.get_unchecked(i), &mut acc[t], &mut mins[t]);
                }
            }
            std::array::from_fn(|t| hsum(acc[t]) + mins[t])
        }
    }

    /// Q8_0 row · Q8 activations.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q8_0(row: &[u8], acts: &[ActBlock]) -> f32 {
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let mut acc = _mm256_setzero_ps();
            for (b, a) in row.chunks_exact(34).zip(acts) {
                _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().wrapping_add(PREFETCH) as *const i8);
                let (d, _) = halves(b.as_ptr());
                let x = _mm256_loadu_si256(b.as_ptr().add(2) as *const __m256i);
                let y = _mm256_load_si256(a.qs.as_ptr() as *const __m256i);
                let ax = _mm256_sign_epi8(x, x);
                let sy = _mm256_sign_epi8(y, x);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), _mm256_cvtepi32_ps(p), acc);
            }
            hsum(acc)
        }
    }
}

/// The decoder's threads: rayon's thread count (`RAYON_NUM_THREADS`, else one per core),
/// the knob the local provider's pool sets to 1 (one single-threaded model per core); never
/// more than the cores, since the team's threads spin while they wait.
fn threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .map_or(cores, |n| n.min(cores))
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Work below this many multiply-adds runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 16;
/// A thread's part of a product's rows is a multiple of this (64 bytes of outputs).
const ROW_CHUNK: usize = 16;

impl QMatrix {
    /// Matrix `name` of a GGUF: Q4_1 or Q8_0, two dimensions.
    fn read(gguf: &Gguf, file: &mut File, name: &str) -> Result<Self> {
        let (info, data) = gguf.tensor_bytes(file, name)?;
        let (rows, cols) = match info.dims[..] {
            [c, r] => (r as usize, c as usize),
            _ => bail!("{name}: expected a matrix, found shape {:?}", info.dims),
        };
        let kind = match info.ggml_type {
            gguf::Q4_1 => Kind::Q4_1,
            gguf::Q8_0 => Kind::Q8_0,
            other => bail!("{name}: {} weights", gguf::type_name(other)),
        };
        debug_assert_eq!(data.len(), rows * cols / QK * kind.block_bytes());
        Ok(Self {
            kind,
            rows,
            cols,
            data,
        })
    }

    fn row(&self, r: usize) -> &[u8] {
        let bytes = self.cols / QK * self.kind.block_bytes();
        &self.data[r * bytes..(r + 1) * bytes]
    }

    #[inline]
    fn dot(&self, r: usize, acts: &[ActBlock], simd: bool) -> f32 {
        let row = self.row(r);
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: `simd` is true only when AVX2, FMA and F16C were detected at run time.
            return unsafe {
                match self.kind {
                    Kind::Q4_1 => avx2::dot_q4_1(row, acts),
                    Kind::Q8_0 => avx2::dot_q8_0(row, acts),
                }
            };
        }
        let _ = simd;
        dot_scalar(self.kind, row, acts)
    }

    /// Row `r` · tokens `t..t + 4` of `acts`: the same four values as four [`Self::dot`]s.
    fn dot_x4(&self, r: usize, acts: &Acts, t: usize, simd: bool) -> [f32; 4] {
        #[cfg(target_arch = "x86_64")]
        if simd && self.kind == Kind::Q4_1 {
            let tokens = [
                acts.token(t),
                acts.token(t + 1),
                acts.token(t + 2),
                acts.token(t + 3),
            ];
            // SAFETY: as in `dot`.
            return unsafe { avx2::dot_q4_1_x4(self.row(r), tokens) };
        }
        std::array::from_fn(|i| self.dot(r, acts.token(t + i), simd))
    }

    /// `out[t][r] = row r · x[t]` in f32 with the dequantized weights: the reference the
    /// quantized path is checked against (slow).
    fn matmul_exact(&self, x: &[f32], out: &mut [f32]) {
        let tokens = x.len() / self.cols;
        let mut row = vec![0f32; self.cols];
        for r in 0..self.rows {
            dequantize_row(self, r, &mut row);
            for t in 0..tokens {
                let xt = &x[t * self.cols..(t + 1) * self.cols];
                out[t * self.rows + r] = row.iter().zip(xt).map(|(a, b)| a * b).sum();
            }
        }
    }

    /// `out[t][r] = row r · x[t]`: activations quantized to Q8 per 32 (as ggml does),
    /// or exactly in f32 when `exact`.
    fn apply(&self, x: &[f32], out: &mut [f32], simd: bool, exact: bool, team: &Team) {
        if exact {
            self.matmul_exact(x, out);
        } else {
            self.matmul(&Acts::quantize(x, self.cols, simd), out, simd, team);
        }
    }

    /// `out[t][r] = row r · token t`, for every token of `acts`.
    fn matmul(&self, acts: &Acts, out: &mut [f32], simd: bool, team: &Team) {
        matmuls(&mut [(self, out)], acts, simd, team);
    }
}

/// `out[t][r] = row r · token t` for each matrix and its output, all of the same width:
/// one piece of work for the team, each thread taking its share of every matrix's rows.
/// Each weight row is read once and dotted with every token.
fn matmuls(products: &mut [(&QMatrix, &mut [f32])], acts: &Acts, simd: bool, team: &Team) {
    let tokens = acts.tokens();
    let mut work = 0;
    for (m, out) in products.iter() {
        assert_eq!(acts.per_token * QK, m.cols);
        assert_eq!(out.len(), tokens * m.rows);
        work += m.rows * m.cols * tokens;
    }
    let outs: Vec<(&QMatrix, Out)> = products
        .iter_mut()
        .map(|(m, out)| (*m, Out::new(out)))
        .collect();
    let part = |index: usize, size: usize| {
        for &(m, out) in &outs {
            let (start, end) = share(m.rows, index, size, ROW_CHUNK);
            if tokens == 1 {
                let a = acts.token(0);
                // SAFETY: rows [start, end) are this thread's alone (`share`).
                let o = unsafe { out.part(start, end) };
                for (o, r) in o.iter_mut().zip(start..end) {
                    *o = m.dot(r, a, simd);
                }
            } else {
                for r in start..end {
                    let mut t = 0;
                    while t + 4 <= tokens {
                        let four = m.dot_x4(r, acts, t, simd);
                        for (i, v) in four.into_iter().enumerate() {
                            // SAFETY: as above: row r of every token is this thread's.
                            unsafe { out.set((t + i) * m.rows + r, v) };
                        }
                        t += 4;
                    }
                    for t in t..tokens {
                        // SAFETY: as above.
                        unsafe { out.set(t * m.rows + r, m.dot(r, acts.token(t), simd)) };
                    }
                }
            }
        }
    };
    if team.size() > 1 && work >= PARALLEL_MIN_WORK {
        team.run(&part);
    } else {
        part(0, 1);
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: QMatrix,
    wk: QMatrix,
    wv: QMatrix,
    wo: QMatrix,
    ffn_norm: Vec<f32>,
    gate: QMatrix,
    up: QMatrix,
    down: QMatrix,
    /// `[kv_head][position][head_dim]`, sized for the current sequence.
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
}

/// The decoder.
pub struct Llama {
    embed: QMatrix,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// None: tied to `embed`.
    output: Option<QMatrix>,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    eps: f32,
    /// The rotary frequencies, one per pair of a head's dimensions.
    theta: Vec<f32>,
    /// `[position][head_dim / 2]` cos and sin of the rotary angles.
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    /// Positions the caches hold room for.
    capacity: usize,
    simd: bool,
    /// f32 matrix products on dequantized weights (a reference for tests; slow).
    exact: bool,
    /// The threads a step's products and attention heads are split between.
    team: Team,
}

fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(weight.len()) {
        let mean = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v *= scale * w;
        }
    }
}

impl Llama {
    /// Whether this decoder runs the GGUF's weights (every matrix Q4_1 or Q8_0, every
    /// vector F32 or F16).
    pub fn supports(gguf: &Gguf) -> bool {
        gguf.tensors
            .iter()
            .all(|(name, info)| match info.dims.len() {
                1 => matches!(info.ggml_type, gguf::F32 | gguf::F16),
                _ => {
                    matches!(info.ggml_type, gguf::Q4_1 | gguf::Q8_0) || !name.ends_with(".weight")
                }
            })
    }

    pub fn from_gguf(gguf: &Gguf, file: &mut File) -> Result<Self> {
        let md = |key: &str| gguf.get(key);
        let n_head = md("llama.attention.head_count")?.to_u32()? as usize;
        let n_kv_head = md("llama.attention.head_count_kv")?.to_u32()? as usize;
        let n_layer = md("llama.block_count")?.to_u32()? as usize;
        let n_embd = md("llama.embedding_length")?.to_u32()? as usize;
        let eps = md("llama.attention.layer_norm_rms_epsilon")?.to_f32()?;
        let rope_base = md("llama.rope.freq_base")
            .and_then(|v| v.to_f32())
            .unwrap_or(10_000.0);
        if n_head == 0
            || n_kv_head == 0
            || !n_head.is_multiple_of(n_kv_head)
            || !n_embd.is_multiple_of(n_head)
        {
            bail!("inconsistent heads: {n_head} heads, {n_kv_head} KV heads, embedding {n_embd}");
        }
        let head_dim = n_embd / n_head;
        let embed = QMatrix::read(gguf, file, "token_embd.weight")?;
        let norm = gguf.vector(file, "output_norm.weight")?;
        let output = match gguf.tensors.contains_key("output.weight") {
            true => Some(QMatrix::read(gguf, file, "output.weight")?),
            false => None,
        };
        // Nine tensors a block: a count the file cannot hold is refused before anything
        // is reserved for it.
        if n_layer.saturating_mul(9) > gguf.tensors.len() {
            bail!(
                "llama.block_count is {n_layer}, but the file has {} tensors",
                gguf.tensors.len()
            );
        }
        let mut layers = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let mut m =
                |suffix: &str| QMatrix::read(gguf, file, &format!("blk.{i}.{suffix}.weight"));
            let (wq, wk, wv, wo) = (m("attn_q")?, m("attn_k")?, m("attn_v")?, m("attn_output")?);
            let (gate, up, down) = (m("ffn_gate")?, m("ffn_up")?, m("ffn_down")?);
            let attn_norm = gguf.vector(file, &format!("blk.{i}.attn_norm.weight"))?;
            let ffn_norm = gguf.vector(file, &format!("blk.{i}.ffn_norm.weight"))?;
            let kv = n_kv_head * head_dim;
            let shapes_ok = wq.rows == n_embd
                && wq.cols == n_embd
                && wk.rows == kv
                && wv.rows == kv
                && wk.cols == n_embd
                && wv.cols == n_embd
                && wo.rows == n_embd
                && wo.cols == n_embd
                && gate.cols == n_embd
                && up.cols == n_embd
                && gate.rows == up.rows
                && down.cols == gate.rows
                && down.rows == n_embd
                && attn_norm.len() == n_embd
                && ffn_norm.len() == n_embd;
            if !shapes_ok {
                bail!("blk.{i}: tensor shapes do not fit a llama block of width {n_embd}");
            }
            layers.push(Layer {
                attn_norm,
                wq,
                wk,
                wv,
                wo,
                ffn_norm,
                gate,
                up,
                down,
                k_cache: Vec::new(),
                v_cache: Vec::new(),
            });
        }
        if embed.cols != n_embd || norm.len() != n_embd {
            bail!("token_embd / output_norm do not have width {n_embd}");
        }
        let half_dim = head_dim / 2;
        let theta: Vec<f32> = (0..half_dim)
            .map(|i| 1.0 / rope_base.powf(2.0 * i as f32 / head_dim as f32))
            .collect();
        Ok(Self {
            embed,
            layers,
            norm,
            output,
            n_head,
            n_kv_head,
            head_dim,
            eps,
            theta,
            rope_cos: Vec::new(),
            rope_sin: Vec::new(),
            capacity: 0,
            simd: has_avx2(),
            exact: false,
            team: Team::new(threads()),
        })
    }

    /// Split each step between `threads` threads (this one and `threads - 1` helpers;
    /// default: `RAYON_NUM_THREADS` up to the cores, else one per core). The logits are
    /// the same, bit for bit, whatever the count: every output is computed by one thread,
    /// in one order.
    pub fn set_threads(&mut self, threads: usize) {
        self.team = Team::new(threads);
    }

    /// The threads each step is split between.
    pub fn threads(&self) -> usize {
        self.team.size()
    }

    /// Compute matrix products in f32 on dequantized weights instead of quantizing the
    /// activations: a numerical reference for tests (many times slower).
    pub fn set_exact(&mut self, exact: bool) {
        self.exact = exact;
    }

    pub fn vocab(&self) -> usize {
        self.output.as_ref().unwrap_or(&self.embed).rows
    }

    /// Start a sequence of at most `len` positions: caches sized, rotary tables built.
    pub fn reset(&mut self, len: usize) {
        let kv = self.n_kv_head * len * self.head_dim;
        for l in &mut self.layers {
            l.k_cache.clear();
            l.k_cache.resize(kv, 0.0);
            l.v_cache.clear();
            l.v_cache.resize(kv, 0.0);
        }
        let half_dim = self.theta.len();
        if self.rope_cos.len() < len * half_dim {
            self.rope_cos = Vec::with_capacity(len * half_dim);
            self.rope_sin = Vec::with_capacity(len * half_dim);
            for p in 0..len {
                for t in &self.theta {
                    let angle = p as f32 * t;
                    self.rope_cos.push(angle.cos());
                    self.rope_sin.push(angle.sin());
                }
            }
        }
        self.capacity = len;
    }

    /// Interleaved rotary embedding of one head vector at `pos`.
    fn rope(&self, x: &mut [f32], pos: usize) {
        let half_dim = self.head_dim / 2;
        let (cos, sin) = (
            &self.rope_cos[pos * half_dim..(pos + 1) * half_dim],
            &self.rope_sin[pos * half_dim..(pos + 1) * half_dim],
        );
        for i in 0..half_dim {
            let (x0, x1) = (x[2 * i], x[2 * i + 1]);
            x[2 * i] = x0 * cos[i] - x1 * sin[i];
            x[2 * i + 1] = x0 * sin[i] + x1 * cos[i];
        }
    }

    /// Run `tokens` at positions `pos..`; the logits of the last one.
    pub fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>> {
        let n = tokens.len();
        if n == 0 || pos + n > self.capacity {
            bail!(
                "positions {pos}..{} outside the sequence of {}",
                pos + n,
                self.capacity
            );
        }
        let (simd, exact) = (self.simd, self.exact);
        let (d, hd) = (self.embed.cols, self.head_dim);
        let kv_dim = self.n_kv_head * hd;
        let group = self.n_head / self.n_kv_head;
        // Embeddings: dequantize the rows.
        let mut x = vec![0f32; n * d];
        for (t, &tok) in tokens.iter().enumerate() {
            let tok = tok as usize;
            if tok >= self.embed.rows {
                bail!(
                    "token id {tok} outside the vocabulary of {}",
                    self.embed.rows
                );
            }
            dequantize_row(&self.embed, tok, &mut x[t * d..(t + 1) * d]);
        }
        let mut h = vec![0f32; n * d];
        let mut q = vec![0f32; n * d];
        let mut k = vec![0f32; n * kv_dim];
        let mut v = vec![0f32; n * kv_dim];
        let mut attn = vec![0f32; n * d];
        let mut o = vec![0f32; n * d];
        let ffn = self.layers.first().map_or(0, |l| l.gate.rows);
        let (mut g, mut u) = (vec![0f32; n * ffn], vec![0f32; n * ffn]);
        let scale = 1.0 / (hd as f32).sqrt();
        let cap = self.capacity;
        let team = &self.team;
        for li in 0..self.layers.len() {
            let layer = &self.layers[li];
            h.copy_from_slice(&x);
            rms_norm(&mut h, &layer.attn_norm, self.eps);
            if exact {
                layer.wq.matmul_exact(&h, &mut q);
                layer.wk.matmul_exact(&h, &mut k);
                layer.wv.matmul_exact(&h, &mut v);
            } else {
                let acts = Acts::quantize(&h, d, simd);
                let mut qkv = [
                    (&layer.wq, &mut q[..]),
                    (&layer.wk, &mut k[..]),
                    (&layer.wv, &mut v[..]),
                ];
                matmuls(&mut qkv, &acts, simd, team);
            }
            for t in 0..n {
                for hq in q[t * d..(t + 1) * d].chunks_exact_mut(hd) {
                    self.rope(hq, pos + t);
                }
                for hk in k[t * kv_dim..(t + 1) * kv_dim].chunks_exact_mut(hd) {
                    self.rope(hk, pos + t);
                }
            }
            let layer = &mut self.layers[li];
            for t in 0..n {
                for kvh in 0..self.n_kv_head {
                    let at = (kvh * cap + pos + t) * hd;
                    let from = t * kv_dim + kvh * hd;
                    layer.k_cache[at..at + hd].copy_from_slice(&k[from..from + hd]);
                    layer.v_cache[at..at + hd].copy_from_slice(&v[from..from + hd]);
                }
            }
            // Causal grouped-query attention, reading the cache in place; the heads are
            // split between the team's threads.
            let layer = &self.layers[li];
            let n_head = self.n_head;
            let out = Out::new(&mut attn);
            // (token, head) pairs, taken one at a time: the prompt's tokens and a step's
            // heads.
            let pair = |item: usize| {
                let (t, head) = (item / n_head, item % n_head);
                let len = pos + t + 1;
                let kvh = head / group;
                let at = t * d + head * hd;
                let mut scores = vec![0f32; len];
                // SAFETY: this head's part of token t is written by this pair's thread alone.
                let o = unsafe { out.part(at, at + hd) };
                let head = Head {
                    q: &q[at..at + hd],
                    keys: &layer.k_cache[kvh * cap * hd..(kvh * cap + len) * hd],
                    values: &layer.v_cache[kvh * cap * hd..(kvh * cap + len) * hd],
                    scale,
                };
                attend(&head, &mut scores, o, simd);
            };
            let work = n_head * (pos + n) * hd * n;
            team.for_each(n * n_head, work >= PARALLEL_MIN_WORK / 4, &pair);
            let layer = &self.layers[li];
            layer.wo.apply(&attn, &mut o, simd, exact, team);
            for (xv, ov) in x.iter_mut().zip(&o) {
                *xv += ov;
            }
            // SwiGLU feed-forward.
            h.copy_from_slice(&x);
            rms_norm(&mut h, &layer.ffn_norm, self.eps);
            if exact {
                layer.gate.matmul_exact(&h, &mut g);
                layer.up.matmul_exact(&h, &mut u);
            } else {
                let acts = Acts::quantize(&h, d, simd);
                matmuls(
                    &mut [(&layer.gate, &mut g[..]), (&layer.up, &mut u[..])],
                    &acts,
                    simd,
                    team,
                );
            }
            for (gv, uv) in g.iter_mut().zip(&u) {
                *gv = *gv / (1.0 + (-*gv).exp()) * uv;
            }
            layer.down.apply(&g, &mut o, simd, exact, team);
            for (xv, ov) in x.iter_mut().zip(&o) {
                *xv += ov;
            }
        }
        let mut last = x[(n - 1) * d..].to_vec();
        rms_norm(&mut last, &self.norm, self.eps);
        let head = self.output.as_ref().unwrap_or(&self.embed);
        let mut logits = vec![0f32; head.rows];
        head.apply(&last, &mut logits, simd, exact, team);
        Ok(logits)
    }
}

/// One head's query and the cached keys and values it attends over.
struct Head<'a> {
    q: &'a [f32],
    keys: &'a [f32],
    values: &'a [f32],
    /// `1 / √d`.
    scale: f32,
}

/// One head's attention over the `scores.len()` cached positions:
/// `out = softmax(q · keys / √d) · values`.
fn attend(head: &Head, scores: &mut [f32], out: &mut [f32], simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is true only when AVX2 and FMA were detected at run time.
        return unsafe { attend_avx2(head, scores, out) };
    }
    let _ = simd;
    attend_body(head, scores, out);
}

/// [`attend`] compiled for AVX2 and FMA: its loops vectorize eight lanes wide (the
/// default x86-64 target gives SSE2's four).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(head: &Head, scores: &mut [f32], out: &mut [f32]) {
    attend_body(head, scores, out);
}

#[inline(always)]
fn attend_body(head: &Head, scores: &mut [f32], out: &mut [f32]) {
    let &Head {
        q,
        keys,
        values,
        scale,
    } = head;
    let hd = q.len();
    let mut max = f32::NEG_INFINITY;
    for (s, key) in scores.iter_mut().zip(keys.chunks_exact(hd)) {
        *s = dot_f32(q, key) * scale;
        max = max.max(*s);
    }
    let mut total = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        total += *s;
    }
    out.fill(0.0);
    for (s, val) in scores.iter().zip(values.chunks_exact(hd)) {
        let w = s / total;
        for (o, v) in out.iter_mut().zip(val) {
            *o += w * v;
        }
    }
}

/// `a · b` in eight lanes, so that the compiler can keep them in one vector register (a
/// plain `sum` adds in order, one latency per element).
#[inline(always)]
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// Row `r` of a Q8_0 or Q4_1 matrix as f32.
fn dequantize_row(m: &QMatrix, r: usize, out: &mut [f32]) {
    let row = m.row(r);
    match m.kind {
        Kind::Q8_0 => {
            for (b, o) in row.chunks_exact(34).zip(out.chunks_exact_mut(QK)) {
                let d = half(&b[0..2]);
                for (v, q) in o.iter_mut().zip(&b[2..]) {
                    *v = d * (*q as i8) as f32;
                }
            }
        }
        Kind::Q4_1 => {
            for (b, o) in row.chunks_exact(20).zip(out.chunks_exact_mut(QK)) {
                let (d, mn) = (half(&b[0..2]), half(&b[2..4]));
                for j in 0..16 {
                    o[j] = d * (b[4 + j] & 0x0F) as f32 + mn;
                    o[j + 16] = d * (b[4 + j] >> 4) as f32 + mn;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q4_1_block(values: &[f32; 32]) -> Vec<u8> {
        let min = values.iter().cloned().fold(f32::INFINITY, f32::min);
        let max = values.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let mut out = Vec::new();
        out.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        out.extend_from_slice(&f16::from_f32(min).to_bits().to_le_bytes());
        let q = |v: f32| (((v - min) / d).round() as u8).min(15);
        for j in 0..16 {
            out.push(q(values[j]) | (q(values[j + 16]) << 4));
        }
        out
    }

    #[test]
    fn rounding_is_rusts_round() {
        let mut rng = fastrand::Rng::with_seed(5);
        let mut values = vec![
            0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -127.0, 127.0,
        ];
        values.extend((0..100_000).map(|_| (rng.f32() - 0.5) * 256.0));
        values.extend((0..1000).map(|i| i as f32 * 0.25 - 125.0));
        values.extend([
            0.49999997,
            -0.49999997,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        values.extend([
            8388607.5,
            -8388607.5,
            1e9,
            -1e9,
            2147483520.0,
            3e9,
            -3e9,
            f32::MAX,
        ]);
        for y in values {
            assert_eq!(round_half_away(y), y.round() as i32, "{y}");
        }
    }

    #[test]
    fn a_row_dotted_with_four_tokens_at_once_gives_each_dot_bit_for_bit() {
        let mut rng = fastrand::Rng::with_seed(11);
        let (rows, cols, tokens) = (3, 128, 6);
        let mut data = Vec::new();
        for _ in 0..rows * cols / 32 {
            let vals: [f32; 32] = std::array::from_fn(|_| rng.f32() * 2.0 - 1.0);
            data.extend(q4_1_block(&vals));
        }
        let m = QMatrix {
            kind: Kind::Q4_1,
            rows,
            cols,
            data,
        };
        let x: Vec<f32> = (0..tokens * cols).map(|_| rng.f32() * 4.0 - 2.0).collect();
        let acts = Acts::quantize(&x, cols, false);
        for simd in [false, has_avx2()] {
            for r in 0..rows {
                for t in 0..=tokens - 4 {
                    let four = m.dot_x4(r, &acts, t, simd);
                    for (i, v) in four.iter().enumerate() {
                        let one = m.dot(r, acts.token(t + i), simd);
                        assert_eq!(v.to_bits(), one.to_bits(), "row {r} token {}", t + i);
                    }
                }
            }
        }
    }

    /// The AVX2 quantizing gives the scalar one's bits for every block, or hands the
    /// block back to it: random blocks at every scale, values that land on a half once
    /// scaled, zeros, signed zeros, tiny, huge, infinite and NaN values.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_quantizing_is_the_scalar_quantizing_bit_for_bit() {
        if !has_avx2() {
            eprintln!("no AVX2 here: the scalar quantizing is the only one");
            return;
        }
        let mut rng = fastrand::Rng::with_seed(11);
        let mut blocks: Vec<[f32; QK]> = Vec::new();
        for scale in [1e-30f32, 1e-6, 0.01, 1.0, 3.0, 1e6, 1e30, 3e38] {
            for _ in 0..2000 {
                blocks.push(std::array::from_fn(|_| (rng.f32() * 2.0 - 1.0) * scale));
            }
        }
        // Halves once scaled: amax 127 makes d = 1, so k + 0.5 is a tie.
        for k in -127..127 {
            let mut b = [0f32; QK];
            b[0] = 127.0;
            b[1] = k as f32 + 0.5;
            b[2] = -(k as f32) - 0.5;
            b[3] = f32::from_bits((k as f32 + 0.5).to_bits() - 1);
            blocks.push(b);
        }
        let edges = [
            0.0,
            -0.0,
            1e-45,
            -1e-38,
            1e-37,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NAN,
        ];
        for (i, &e) in edges.iter().enumerate() {
            let mut b = [0f32; QK];
            b[i] = e;
            blocks.push(b);
            blocks.push([e; QK]);
            let mut mixed: [f32; QK] = std::array::from_fn(|_| rng.f32() - 0.5);
            mixed[31 - i] = e;
            blocks.push(mixed);
        }
        let mut taken = 0;
        for b in &blocks {
            let scalar = quantize_block(b);
            // SAFETY: AVX2, FMA and F16C are here (checked above).
            if let Some(simd) = unsafe { avx2::quantize_block(b) } {
                taken += 1;
                assert_eq!(simd.qs, scalar.qs, "{b:?}");
                assert_eq!(simd.d.to_bits(), scalar.d.to_bits(), "{b:?}");
                assert_eq!(simd.s.to_bits(), scalar.s.to_bits(), "{b:?}");
            }
        }
        assert!(taken > blocks.len() * 9 / 10, "{taken} of {}", blocks.len());
        // What the scalar code saturates is handed back to it.
        let mut subnormal = [0f32; QK];
        subnormal[5] = -1e-38;
        for b in [[f32::NAN; QK], [f32::INFINITY; QK], subnormal] {
            // SAFETY: as above.
            assert!(unsafe { avx2::quantize_block(&b) }.is_none(), "{b:?}");
        }
    }

    #[test]
    fn tiny_blocks_quantize_to_finite_values() {
        for v in [1e-38f32, -3e-39, 1e-45] {
            let mut x = vec![0f32; 64];
            x[..32].fill(v);
            x[40] = v;
            for b in [false, has_avx2()]
                .into_iter()
                .flat_map(|simd| Acts::quantize(&x, 64, simd).blocks)
            {
                assert!(b.d.is_finite() && b.s.is_finite(), "{v}");
                assert!(
                    b.qs.iter().all(|q| (-127..=127).contains(q)),
                    "{v}: {:?}",
                    b.qs
                );
            }
        }
    }

    #[test]
    fn simd_and_scalar_dots_agree() {
        let mut rng = fastrand::Rng::with_seed(3);
        let cols = 256;
        let x: Vec<f32> = (0..cols).map(|_| rng.f32() * 2.0 - 1.0).collect();
        let acts = Acts::quantize(&x, cols, false);
        let mut q4 = Vec::new();
        let mut q8 = Vec::new();
        let mut w = vec![0f32; cols];
        for chunk in w.chunks_exact_mut(32) {
            let mut vals = [0f32; 32];
            for v in vals.iter_mut() {
                *v = rng.f32() - 0.3;
            }
            chunk.copy_from_slice(&vals);
            q4.extend(q4_1_block(&vals));
            let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            q8.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
            q8.extend(vals.iter().map(|v| (v / d).round() as i8 as u8));
        }
        let exact: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
        for (kind, data) in [(Kind::Q4_1, q4), (Kind::Q8_0, q8)] {
            let m = QMatrix {
                kind,
                rows: 1,
                cols,
                data,
            };
            let scalar = m.dot(0, acts.token(0), false);
            assert!(
                (scalar - exact).abs() < 0.1,
                "{kind:?}: {scalar} vs {exact}"
            );
            if has_avx2() {
                let simd = m.dot(0, acts.token(0), true);
                assert!((simd - scalar).abs() < 1e-3, "{kind:?}: {simd} vs {scalar}");
            }
            let mut row = vec![0f32; cols];
            dequantize_row(&m, 0, &mut row);
            let deq: f32 = row.iter().zip(&x).map(|(a, b)| a * b).sum();
            assert!((deq - exact).abs() < 0.1, "{kind:?}: {deq} vs {exact}");
        }
    }
}
