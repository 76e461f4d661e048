//! The tokenizer a GGUF's metadata describes (`tokenizer.ggml.*`), built with the
//! `tokenizers` crate as candle-core 0.11's `TokenizerFromGguf` builds it: a byte-level BPE
//! from the vocabulary and merges, the normalizer, pre-tokenizer, decoder and
//! post-processor its `pre` names, a BOS / EOS template where the file asks for one, and
//! the special tokens marked (token types 2–5 and the ids the file names). Only the
//! order in which the named ids are marked differs (candle's is a hash set's): here it is
//! by id. tests/it/local_model.rs checks the result against candle's on the embedded model.

use std::collections::BTreeSet;

use pieval_llama::gguf::{Gguf, Value};
use tokenizers::decoders::{DecoderWrapper, byte_level::ByteLevel as ByteLevelDecoder};
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{NormalizerWrapper, unicode::NFC};
use tokenizers::pre_tokenizers::{
    PreTokenizerWrapper,
    byte_level::ByteLevel as ByteLevelPre,
    sequence::Sequence,
    split::{Split, SplitPattern},
};
use tokenizers::processors::sequence::Sequence as ProcessorSequence;
use tokenizers::processors::{PostProcessorWrapper, byte_level::ByteLevel as ByteLevelProcessor};
use tokenizers::tokenizer::SplitDelimiterBehavior;
use tokenizers::{AddedToken, Tokenizer};

type Result<T> = std::result::Result<T, String>;

fn strings(g: &Gguf, key: &str) -> Result<Vec<String>> {
    let values = g
        .get(key)
        .and_then(|v| v.as_array())
        .map_err(|e| format!("{key}: {e}"))?;
    values
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .map_err(|e| format!("{key}: {e}"))
        })
        .collect()
}

fn id(v: &Value, key: &str) -> Result<u32> {
    v.to_u32().map_err(|e| format!("{key}: {e}"))
}

struct Pipeline {
    normalizer: Option<NormalizerWrapper>,
    pretokenizer: PreTokenizerWrapper,
    decoder: DecoderWrapper,
    post_processor: PostProcessorWrapper,
}

fn split_then_bytes(regex: &str, byte_level: ByteLevelPre) -> Result<PreTokenizerWrapper> {
    let split = Split::new(
        SplitPattern::Regex(regex.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| e.to_string())?;
    Ok(Sequence::new(vec![split.into(), byte_level.into()]).into())
}

/// The pipeline of `tokenizer.ggml.pre` (Qwen2's, Llama 3's, else GPT-2's).
fn pipeline(pre: &str) -> Result<Pipeline> {
    const REGEX_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const REGEX_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    Ok(match pre {
        "qwen2" => Pipeline {
            normalizer: Some(NFC.into()),
            pretokenizer: split_then_bytes(REGEX_QWEN2, ByteLevelPre::new(false, false, false))?,
            decoder: ByteLevelDecoder::new(false, false, false).into(),
            post_processor: ByteLevelProcessor::new(false, false, false).into(),
        },
        "smaug-bpe" | "lfm2" | "llama3" => Pipeline {
            normalizer: None,
            pretokenizer: split_then_bytes(REGEX_LLAMA3, ByteLevelPre::new(false, true, false))?,
            decoder: ByteLevelDecoder::new(true, true, true).into(),
            post_processor: ByteLevelProcessor::new(true, false, true).into(),
        },
        _ => Pipeline {
            normalizer: None,
            pretokenizer: ByteLevelPre::default().into(),
            decoder: ByteLevelDecoder::default().into(),
            post_processor: ByteLevelProcessor::default().into(),
        },
    })
}

/// `bos $0 eos` (and the pair's form) where the file asks for BOS or EOS to be added.
fn template(
    tokens: &[String],
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
) -> Option<PostProcessorWrapper> {
    if (!add_bos && !add_eos) || tokens.is_empty() {
        return None;
    }
    let named = |id: Option<u32>| id.and_then(|i| Some((tokens.get(i as usize)?.clone(), i)));
    let bos = if add_bos { Some(named(bos)?) } else { None };
    let eos = if add_eos { Some(named(eos)?) } else { None };
    let specials: Vec<(String, u32)> = bos.iter().chain(eos.iter()).cloned().collect();
    let (b, e) = (bos.map(|t| t.0), eos.map(|t| t.0));
    let mut single: Vec<String> = b.iter().cloned().collect();
    single.push("$0".into());
    single.extend(e.iter().cloned());
    let mut pair = Vec::new();
    for (seq, label) in [("$A", 0), ("$B", 1)] {
        pair.extend(b.iter().map(|t| format!("{t}:{label}")));
        pair.push(format!("{seq}:{label}"));
        pair.extend(e.iter().map(|t| format!("{t}:{label}")));
    }
    let proc = tokenizers::processors::template::TemplateProcessing::builder()
        .try_single(single)
        .ok()?
        .try_pair(pair)
        .ok()?
        .special_tokens(specials)
        .build()
        .ok()?;
    Some(PostProcessorWrapper::Template(proc))
}

/// The tokenizer of a GGUF (`tokenizer.ggml.model` must be `gpt2`: byte-level BPE).
pub fn tokenizer_from_gguf(g: &Gguf) -> Result<Tokenizer> {
    let model = g
        .get("tokenizer.ggml.model")
        .and_then(|v| v.as_str().map(str::to_lowercase))
        .map_err(|e| e.to_string())?;
    if model != "gpt2" {
        return Err(format!("unsupported tokenizer model `{model}`"));
    }
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges = strings(g, "tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| match m.split_once(' ') {
            Some((a, b)) => Ok((a.to_string(), b.to_string())),
            None => Err(format!("invalid merge entry `{m}`")),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut builder = BPE::builder().vocab_and_merges(vocab, merges);
    let opt = |key: &str| g.metadata.get(key);
    if let Some(v) = opt("tokenizer.ggml.unk_token_id")
        && let Some(t) = tokens.get(id(v, "tokenizer.ggml.unk_token_id")? as usize)
    {
        builder = builder.unk_token(t.clone());
    }
    let flag = |key: &str| -> Result<Option<bool>> {
        opt(key)
            .map(|v| v.to_bool().map_err(|e| format!("{key}: {e}")))
            .transpose()
    };
    if let Some(b) = flag("tokenizer.ggml.byte_fallback")? {
        builder = builder.byte_fallback(b);
    }
    if let Some(b) = flag("tokenizer.ggml.ignore_merges")? {
        builder = builder.ignore_merges(b);
    }
    let bpe = builder.build().map_err(|e| e.to_string())?;
    let mut tokenizer = Tokenizer::new(bpe);
    let pre = opt("tokenizer.ggml.pre")
        .and_then(|v| v.as_str().ok())
        .unwrap_or("gpt2");
    let p = pipeline(pre)?;
    if let Some(n) = p.normalizer {
        tokenizer
            .with_normalizer(Some(n))
            .map_err(|e| e.to_string())?;
    }
    tokenizer.with_pre_tokenizer(Some(p.pretokenizer));
    tokenizer.with_decoder(Some(p.decoder));
    // Lenient where candle is: an unreadable flag or id is taken as absent.
    let lenient_flag = |key: &str| opt(key).and_then(|v| v.to_bool().ok()).unwrap_or(false);
    let lenient_id = |key: &str| opt(key).and_then(|v| v.to_u32().ok());
    let post = match template(
        &tokens,
        lenient_id("tokenizer.ggml.bos_token_id"),
        lenient_id("tokenizer.ggml.eos_token_id"),
        lenient_flag("tokenizer.ggml.add_bos_token"),
        lenient_flag("tokenizer.ggml.add_eos_token"),
    ) {
        Some(t) => ProcessorSequence::new(vec![p.post_processor, t]).into(),
        None => p.post_processor,
    };
    tokenizer.with_post_processor(Some(post));
    // Special tokens, so that decoding with skip_special_tokens drops them: llama's
    // token types other than normal (1) and byte (6), then the ids the file names.
    if let Some(Value::Array(types)) = opt("tokenizer.ggml.token_type") {
        let mut specials = Vec::new();
        for (i, v) in types.iter().enumerate() {
            if matches!(id(v, "tokenizer.ggml.token_type")?, 2..=5)
                && let Some(t) = tokens.get(i)
            {
                specials.push(AddedToken::from(t.clone(), true));
            }
        }
        if !specials.is_empty() {
            tokenizer
                .add_special_tokens(specials)
                .map_err(|e| e.to_string())?;
        }
    }
    let mut named = BTreeSet::new();
    for key in [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.pad_token_id",
        "tokenizer.ggml.sep_token_id",
        "tokenizer.ggml.unk_token_id",
    ] {
        if let Some(v) = opt(key) {
            named.insert(id(v, key)?);
        }
    }
    let specials: Vec<AddedToken> = named
        .into_iter()
        .filter_map(|i| tokens.get(i as usize))
        .map(|t| AddedToken::from(t.clone(), true))
        .collect();
    if !specials.is_empty() {
        tokenizer
            .add_special_tokens(specials)
            .map_err(|e| e.to_string())?;
    }
    Ok(tokenizer)
}
