//! Criterion benches for the corpus path: parse + contract check per record, the whole
//! streaming validate (with sha256), and the loader building Arrow batches.
//! `cargo bench --bench corpus_load`. The 1 GB side-by-side with DuckDB is
//! `benches/compare_validate_duckdb.py`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pieval::contract::record::{CriteriaCache, RawRecord, check_record};
use pieval::corpus::{CorpusReader, ReadOptions, validate_file};

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/data/normalized/attack_cases.jsonl"
);

fn bench(c: &mut Criterion) {
    let text = std::fs::read_to_string(CORPUS).unwrap();
    let mut g = c.benchmark_group("corpus");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.sample_size(20);
    g.bench_function("parse_and_check_records", |b| {
        b.iter(|| {
            let mut cache = CriteriaCache::default();
            let mut out = Vec::new();
            for (i, line) in text.lines().enumerate() {
                let rec = RawRecord::parse(line).unwrap();
                check_record(&rec, i as u64 + 1, &mut cache, &mut out);
            }
            assert!(out.is_empty());
        })
    });
    g.bench_function("validate_file", |b| {
        b.iter(|| {
            assert!(
                validate_file(CORPUS, ReadOptions::default())
                    .unwrap()
                    .is_valid()
            )
        })
    });
    g.bench_function("load_to_arrow", |b| {
        b.iter(|| {
            let mut r = CorpusReader::open(CORPUS, ReadOptions::default()).unwrap();
            let rows: usize = r.by_ref().map(|b| b.unwrap().num_rows()).sum();
            assert!(rows > 2000);
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
