//! `provider: local`: a llama-architecture GGUF run in process: GGUFs whose matrices are
//! Q4_1 / Q8_0 (the embedded SmolLM2) on pieval's own decoder (`crates/pieval-llama`, AVX2),
//! any other quantization on candle (`candle_transformers::models::quantized_llama`); the
//! tokenizer built from the GGUF's metadata, the ChatML template of SmolLM2, greedy decoding by default (temperature /
//! top-p with the experiment seed otherwise), stopping at end-of-turn or `max_tokens`.
//!
//! Hostile text cannot forge control tokens: message contents are tokenized with special
//! tokens encoded as plain text; only the template inserts `<|im_start|>` / `<|im_end|>`.
//!
//! Tokenizer fix: candle maps SmolLM2's `pre = "smollm"` to GPT-2 splitting; SmolLM2's own
//! pre-tokenizer is `Sequence[Digits(individual_digits), ByteLevel(add_prefix_space=false)]`,
//! which gives llama.cpp's ids exactly (tested against its `llama-tokenize` output).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
#[cfg(feature = "candle-models")]
use candle_core::quantized::gguf_file;
#[cfg(feature = "candle-models")]
use candle_core::{Device, Tensor};
#[cfg(feature = "candle-models")]
use candle_transformers::models::quantized_llama::ModelWeights;

use super::sampling::{Sampler, Sampling};
use tokenizers::Tokenizer;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;

use super::Message;
use super::{CallError, Completion, Provider};
use crate::error::{Error, Result};
use pieval_llama::Llama;
use pieval_llama::gguf::Gguf;

const DEFAULT_SYSTEM: &str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// Generation settings.
#[derive(Clone, Debug)]
pub struct GenerationConfig {
    pub max_tokens: u32,
    pub temperature: f64,
    pub top_p: Option<f64>,
    pub seed: u64,
}

/// Which implementation runs the weights.
enum Weights {
    /// pieval's decoder (Q4_1 / Q8_0 matrices).
    Pieval(Box<Llama>),
    /// candle's quantized llama (any other GGUF quantization; feature `candle-models`).
    #[cfg(feature = "candle-models")]
    Candle(Box<ModelWeights>),
}

pub struct LocalModel {
    model: Weights,
    tokenizer: Tokenizer,
    im_start: u32,
    im_end: u32,
    /// Other tokens that end generation (`<|endoftext|>`).
    stops: Vec<u32>,
    context: usize,
    pub path: PathBuf,
}

/// Token counts and times of one generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Generated {
    pub text: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_secs: f64,
    pub generation_secs: f64,
}

fn wrap(path: &Path, what: &str, e: impl std::fmt::Display) -> Error {
    Error::config(path, format!("{what}: {e}"))
}

impl LocalModel {
    /// Load a GGUF; a missing, truncated or foreign file is a clear error.
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_as(path, false)
    }

    /// [`LocalModel::load`] on candle's quantized llama even where pieval's decoder reads
    /// the weights: how the `candle-models` feature's path is tested on the quickstart's
    /// model (no other GGUF is at hand offline).
    #[cfg(feature = "candle-models")]
    pub fn load_on_candle(path: &Path) -> Result<Self> {
        Self::load_as(path, true)
    }

    fn load_as(path: &Path, on_candle: bool) -> Result<Self> {
        let mut file = crate::files::open_input(path, "cannot open model")?;
        // pieval-llama's reader trusts nothing in the header (counts within the file,
        // known value types, a usable alignment): a hostile file is an error.
        let gguf = Gguf::read(&mut file).map_err(|e| wrap(path, "not a readable GGUF file", e))?;
        let arch = gguf
            .metadata
            .get("general.architecture")
            .and_then(|v| v.as_str().ok())
            .unwrap_or_default()
            .to_string();
        if arch != "llama" {
            return Err(wrap(
                path,
                "unsupported model",
                format!("architecture {arch:?}; provider local runs llama-architecture GGUFs"),
            ));
        }
        let context = gguf
            .metadata
            .get("llama.context_length")
            .and_then(|v| v.to_u32().ok())
            .unwrap_or(2048) as usize;
        let mut tokenizer = super::gguf_tokenizer::tokenizer_from_gguf(&gguf)
            .map_err(|e| wrap(path, "cannot build the tokenizer from the GGUF metadata", e))?;
        tokenizer.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        ]))));
        tokenizer.set_encode_special_tokens(true);
        let id = |t: &str| {
            tokenizer.token_to_id(t).ok_or_else(|| {
                wrap(
                    path,
                    "tokenizer",
                    format!("no {t} token: not a ChatML model"),
                )
            })
        };
        let (im_start, im_end) = (id("<|im_start|>")?, id("<|im_end|>")?);
        let stops = tokenizer.token_to_id("<|endoftext|>").into_iter().collect();
        let corrupt = |e| {
            wrap(
                path,
                "cannot load the model weights (truncated or corrupt GGUF?)",
                e,
            )
        };
        let model = if Llama::supports(&gguf) && !on_candle {
            Weights::Pieval(Box::new(
                Llama::from_gguf(&gguf, &mut file).map_err(corrupt)?,
            ))
        } else {
            Self::other_weights(path, &mut file)?
        };
        Ok(Self {
            model,
            tokenizer,
            im_start,
            im_end,
            stops,
            context,
            path: path.to_path_buf(),
        })
    }

    /// Token ids of text, special-token strings encoded as plain text.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| wrap(&self.path, "tokenize", e))
    }

    /// The ChatML prompt of SmolLM2's template (a default system message when none).
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let turn = |role: &str, content: &str, ids: &mut Vec<u32>| -> Result<()> {
            ids.push(self.im_start);
            ids.extend(self.encode(&format!("{role}\n{content}"))?);
            ids.push(self.im_end);
            ids.extend(self.encode("\n")?);
            Ok(())
        };
        if messages.first().is_none_or(|m| m.role != "system") {
            turn("system", DEFAULT_SYSTEM, &mut ids)?;
        }
        for m in messages {
            turn(m.role, &m.content, &mut ids)?;
        }
        ids.push(self.im_start);
        ids.extend(self.encode("assistant\n")?);
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| wrap(&self.path, "detokenize", e))
    }

    /// Which decoder runs the weights: `pieval` (Q4_1 / Q8_0) or `candle`.
    pub fn backend(&self) -> &'static str {
        match self.model {
            Weights::Pieval(_) => "pieval",
            #[cfg(feature = "candle-models")]
            Weights::Candle(_) => "candle",
        }
    }

    /// Weights pieval's decoder does not read (not Q4_1 / Q8_0), on candle's quantized
    /// llama: in a build with the `candle-models` feature.
    #[cfg(feature = "candle-models")]
    fn other_weights(path: &Path, file: &mut std::fs::File) -> Result<Weights> {
        // candle's reader reads the header again, after pieval-llama's checked it.
        use std::io::{Seek, SeekFrom};
        file.seek(SeekFrom::Start(0))
            .map_err(|e| wrap(path, "cannot read model", e))?;
        let content = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            gguf_file::Content::read(file)
        }))
        .map_err(|_| {
            wrap(
                path,
                "not a readable GGUF file",
                "candle's GGUF reader failed on it",
            )
        })?
        .map_err(|e| wrap(path, "not a readable GGUF file", e))?;
        let model = ModelWeights::from_gguf(content, file, &Device::Cpu).map_err(|e| {
            wrap(
                path,
                "cannot load the model weights (truncated or corrupt GGUF?)",
                e,
            )
        })?;
        Ok(Weights::Candle(Box::new(model)))
    }

    #[cfg(not(feature = "candle-models"))]
    fn other_weights(path: &Path, _file: &mut std::fs::File) -> Result<Weights> {
        Err(wrap(
            path,
            "model",
            "its quantization is not Q4_1 or Q8_0, which pieval's own decoder reads; other \
             GGUFs run on candle, in a build with it: cargo build --features candle-models",
        ))
    }

    /// Run `tokens` at position `pos` (0 starts a fresh sequence) and sample the next.
    fn step(&mut self, tokens: &[u32], pos: usize, sampler: &mut Sampler) -> Result<u32> {
        let err = |e: &dyn std::fmt::Display| wrap(&self.path, "generation failed", e);
        let logits: Vec<f32> = match &mut self.model {
            Weights::Pieval(m) => m.forward(tokens, pos).map_err(|e| err(&e))?,
            #[cfg(feature = "candle-models")]
            Weights::Candle(m) => {
                let input = Tensor::new(tokens, &Device::Cpu)
                    .and_then(|t| t.unsqueeze(0))
                    .map_err(|e| err(&e))?;
                m.forward(&input, pos)
                    .and_then(|l| l.squeeze(0))
                    .and_then(|l| l.to_dtype(candle_core::DType::F32))
                    .and_then(|l| l.to_vec1::<f32>())
                    .map_err(|e| err(&e))?
            }
        };
        sampler
            .sample(&logits)
            .map_err(|e| wrap(&self.path, "generation failed", e))
    }

    /// Generate an answer to chat messages.
    pub fn generate(&mut self, messages: &[Message], cfg: &GenerationConfig) -> Result<Generated> {
        let prompt = self.chat_prompt(messages)?;
        let max_new = cfg.max_tokens as usize;
        if prompt.len() + max_new > self.context {
            return Err(Error::Model(format!(
                "the prompt is {} tokens; with max_tokens {max_new} it exceeds the model's context of {}",
                prompt.len(),
                self.context
            )));
        }
        let sampling = if cfg.temperature <= 0.0 {
            Sampling::ArgMax
        } else {
            match cfg.top_p {
                Some(p) => Sampling::TopP {
                    p,
                    temperature: cfg.temperature,
                },
                None => Sampling::All {
                    temperature: cfg.temperature,
                },
            }
        };
        let mut logits_processor = Sampler::new(cfg.seed, sampling);
        let start = Instant::now();
        #[allow(irrefutable_let_patterns)] // one variant without `candle-models`
        if let Weights::Pieval(m) = &mut self.model {
            m.reset(prompt.len() + max_new);
        }
        let mut next = self.step(&prompt, 0, &mut logits_processor)?;
        let prompt_secs = start.elapsed().as_secs_f64();
        let gen_start = Instant::now();
        let mut out = Vec::new();
        while out.len() < max_new {
            if next == self.im_end || self.stops.contains(&next) {
                break;
            }
            out.push(next);
            if out.len() == max_new {
                break;
            }
            next = self.step(&[next], prompt.len() + out.len() - 1, &mut logits_processor)?;
        }
        let mut text = self.decode(&out)?;
        if out.len() == max_new {
            // Cut at max_tokens inside a multi-byte character: drop the partial character.
            let kept = text.trim_end_matches('\u{FFFD}').len();
            text.truncate(kept);
        }
        Ok(Generated {
            text,
            prompt_tokens: prompt.len(),
            completion_tokens: out.len(),
            prompt_secs,
            generation_secs: gen_start.elapsed().as_secs_f64(),
        })
    }
}

/// The provider: a pool of models, one request per model at a time. On a small machine
/// one single-threaded model per core gives the most tokens per second together (measured
/// on 2 cores: two 1-thread models about 215 generated tokens/s together, one 2-thread
/// model 156–199: docs/performance.md, "Embedded local model"); one model uses every
/// core for the shortest time per answer.
pub struct LocalProvider {
    models: Vec<Arc<Mutex<LocalModel>>>,
    next: std::sync::atomic::AtomicUsize,
    cfg: GenerationConfig,
}

impl LocalProvider {
    pub fn new(models: Vec<LocalModel>, cfg: GenerationConfig) -> Self {
        assert!(!models.is_empty(), "at least one model");
        Self {
            models: models
                .into_iter()
                .map(|m| Arc::new(Mutex::new(m)))
                .collect(),
            next: std::sync::atomic::AtomicUsize::new(0),
            cfg,
        }
    }

    /// How many models to load for `concurrency` on this machine.
    pub fn pool_size(concurrency: usize) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        concurrency.min(cores).max(1)
    }
}

#[async_trait]
impl Provider for LocalProvider {
    fn instances(&self) -> usize {
        self.models.len()
    }

    fn backend(&self) -> Option<String> {
        let model = self.models.first()?.lock().ok()?;
        Some(match model.backend() {
            "pieval" => "pieval-llama (Q4_1/Q8_0 decoder)".to_owned(),
            other => format!("{other} quantized_llama"),
        })
    }

    fn name(&self) -> &str {
        "local"
    }

    async fn complete(
        &self,
        _case_id: &str,
        messages: &[Message],
    ) -> Result<Completion, CallError> {
        let start = Instant::now();
        let first = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (models, cfg, messages) = (self.models.clone(), self.cfg.clone(), messages.to_vec());
        let result = tokio::task::spawn_blocking(move || {
            // A free model if there is one, else wait for this request's turn.
            let n = models.len();
            let mut guard = (0..n)
                .find_map(|k| models[(first + k) % n].try_lock().ok())
                .unwrap_or_else(|| models[first % n].lock().unwrap_or_else(|p| p.into_inner()));
            guard.generate(&messages, &cfg)
        })
        .await
        .unwrap_or_else(|e| Err(Error::Internal(format!("the model thread failed: {e}"))));
        let latency_ms = start.elapsed().as_secs_f64() * 1e3;
        match result {
            Ok(g) => Ok(Completion {
                text: g.text,
                latency_ms,
                attempts: 1,
                prompt_tokens: Some(g.prompt_tokens as u64),
                completion_tokens: Some(g.completion_tokens as u64),
                prompt_secs: Some(g.prompt_secs),
                generation_secs: Some(g.generation_secs),
                redacted: false,
                truncated: false,
            }),
            Err(e) => Err(CallError {
                message: e.to_string(),
                latency_ms,
                attempts: 1,
            }),
        }
    }
}
