//! Prompt and generation tokens/s of the embedded local model (SmolLM2-135M-Instruct Q4_1,
//! candle), greedy, on real requests: the first cases of the quickstart selection, each
//! assembled as the runner sends it (no mitigation).
//!
//! Usage: cargo bench --bench local_model [-- --cases 8 --max-tokens 64 --models 1]
//!        [--prompt-ids FILE]
//!
//! `--prompt-ids FILE` also writes each request's prompt as token ids (one JSON object a
//! line: `gguf`, `prompt_ids`) for a peer to run the same tokens
//! (`benches/compare_local_model_llamacpp.py`).
//!
//! `--models N` runs N single-threaded models side by side (the local provider's pool at
//! `concurrency: N`), the cases split between them, and reports the aggregate tokens/s of
//! the process over wall time.
//! Reference: llama.cpp on the same tokens, run beside this bench by
//! `benches/compare_local_model_llamacpp.py` (docs/performance.md, "Embedded local model").

use std::path::Path;

use pieval::mitigation::Mitigation;
use pieval::provider::local::{GenerationConfig, LocalModel};

#[path = "support/args.rs"]
mod args;
use args::{arg, text_arg};

fn main() {
    let (n, max_tokens, models) = (
        arg("--cases", 8),
        arg("--max-tokens", 64),
        arg("--models", 1),
    );
    if models > 1 {
        // As the provider's pool does: one single-threaded model per core.
        // SAFETY: set before any thread or model exists.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", "1") };
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = pieval::model::ensure(pieval::model::DEFAULT_MODEL, &mut |l| eprintln!("{l}"))
        .expect("pull the model");
    let t = std::time::Instant::now();
    let loaded: Vec<LocalModel> = (0..models)
        .map(|_| LocalModel::load(&path).expect("load"))
        .collect();
    let load = t.elapsed().as_secs_f64() / models as f64;
    let backend = loaded[0].backend();
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
    let plans: Vec<_> = selected
        .indexes
        .iter()
        .map(|&i| pieval::mitigation::plan(&corpus.cases[i], &Mitigation::none(), 7))
        .collect();
    if let Some(out) = text_arg("--prompt-ids") {
        let lines: Vec<String> = plans
            .iter()
            .map(|plan| {
                let ids = loaded[0].chat_prompt(&plan.messages).expect("prompt");
                serde_json::json!({ "gguf": path, "prompt_ids": ids }).to_string() + "\n"
            })
            .collect();
        std::fs::write(&out, lines.concat()).expect("write --prompt-ids");
    }
    let wall = std::time::Instant::now();
    let results: Vec<(usize, f64, usize, f64)> = std::thread::scope(|s| {
        let handles: Vec<_> = loaded
            .into_iter()
            .enumerate()
            .map(|(w, mut model)| {
                let (plans, cfg) = (&plans, &cfg);
                s.spawn(move || {
                    let (mut pt, mut ps, mut gt, mut gs) = (0usize, 0f64, 0usize, 0f64);
                    for plan in plans.iter().skip(w).step_by(models) {
                        let g = model.generate(&plan.messages, cfg).expect("generate");
                        pt += g.prompt_tokens;
                        ps += g.prompt_secs;
                        gt += g.completion_tokens;
                        gs += g.generation_secs;
                    }
                    (pt, ps, gt, gs)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let wall = wall.elapsed().as_secs_f64();
    let (pt, ps, gt, gs) = results.iter().fold((0, 0.0, 0, 0.0), |a, r| {
        (a.0 + r.0, a.1 + r.1, a.2 + r.2, a.3 + r.3)
    });
    println!(
        "local model ({backend} backend, {} cases, {models} model(s), greedy, max_tokens {max_tokens}): load {load:.2} s; prompt {pt} tokens at {:.0} tok/s per model; generation {gt} tokens at {:.0} tok/s per model; {:.1} s per case; wall {wall:.1} s",
        plans.len(),
        pt as f64 / ps,
        gt as f64 / gs,
        (ps + gs) / plans.len() as f64
    );
    if models > 1 {
        // Each model's share of the wall time, summed: the process's aggregate rate.
        println!(
            "aggregate over {models} models: prompt {:.0} tok/s, generation {:.0} tok/s",
            pt as f64 / ps * models as f64,
            gt as f64 / gs * models as f64
        );
    }
}
