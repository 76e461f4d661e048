//! Prompt and generation tokens/s of the embedded local model (SmolLM2-135M-Instruct Q4_1,
//! candle), greedy, on real requests: the first cases of the quickstart selection, each
//! assembled as the runner sends it (no mitigation).
//!
//! Usage: cargo bench --bench local_model [-- --cases 8 --max-tokens 64]
//! Reference on this 2-core machine (ARCHITECTURE.md): llama.cpp ≈ 457 tok/s prompt,
//! ≈ 190 tok/s generation.

use std::collections::BTreeMap;
use std::path::Path;

use pieval::experiment::config::MitigationName;
use pieval::provider::local::{GenerationConfig, LocalModel};

#[path = "support/args.rs"]
mod args;
use args::arg;

fn main() {
    let (n, max_tokens) = (arg("--cases", 8), arg("--max-tokens", 64));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = pieval::model::ensure(pieval::model::DEFAULT_MODEL, &mut |l| eprintln!("{l}"))
        .expect("pull the model");
    let t = std::time::Instant::now();
    let mut model = LocalModel::load(&path).expect("load");
    let load = t.elapsed().as_secs_f64();
    let corpus =
        pieval::runner::load_cases(&root.join("data/normalized/attack_cases.enriched.jsonl"))
            .unwrap();
    let sel = pieval::experiment::config::Selection {
        stratify_by: vec!["attack_surface".into()],
        ..Default::default()
    };
    let selected = pieval::experiment::selection::select(&corpus.cases, &sel, 7, Some(n)).unwrap();
    let cfg = GenerationConfig {
        max_tokens: max_tokens as u32,
        temperature: 0.0,
        top_p: None,
        seed: 7,
    };
    let (mut pt, mut ps, mut gt, mut gs) = (0usize, 0f64, 0usize, 0f64);
    for &i in &selected.indexes {
        let plan =
            pieval::mitigation::plan(&corpus.cases[i], MitigationName::None, &BTreeMap::new(), 7);
        let g = model.generate(&plan.messages, &cfg).expect("generate");
        pt += g.prompt_tokens;
        ps += g.prompt_secs;
        gt += g.completion_tokens;
        gs += g.generation_secs;
    }
    println!(
        "local model ({} cases, greedy, max_tokens {max_tokens}): load {load:.2} s; prompt {pt} tokens at {:.0} tok/s; generation {gt} tokens at {:.0} tok/s; {:.1} s per case",
        selected.indexes.len(),
        pt as f64 / ps,
        gt as f64 / gs,
        (ps + gs) / selected.indexes.len() as f64
    );
}
