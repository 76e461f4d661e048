//! `pieval validate` end to end on hostile files: every kind of violation is reported
//! as `file:line: field: problem` (golden), exit codes follow docs/cli.md, nothing panics.

use crate::common;

use std::io::Write;
use std::sync::Arc;

use common::{pieval, run, scrub};
use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use pieval::corpus::{ReadOptions, validate_file};

const OK: &str = r#"{"case_id":"c-1","source_name":"t","source_type":"synthetic","attack_family":"naive","attack_surface":"email","prompt":"p","success_criteria":{"type":"contains","value":"X"}}"#;

fn ok_with(id: &str, from: &str, to: &str) -> String {
    OK.replace("\"c-1\"", &format!("\"{id}\""))
        .replace(from, to)
}

/// One file with every kind of problem, one per line.
fn hostile_corpus() -> Vec<u8> {
    let mut f = Vec::new();
    let mut line = |bytes: &[u8]| {
        f.extend_from_slice(bytes);
        f.push(b'\n');
    };
    let bom = format!("\u{feff}{}", ok_with("c-bom", "", ""));
    line(bom.as_bytes()); // 1: BOM
    line(OK.as_bytes()); // 2: valid
    line(ok_with("c-3", r#""prompt":"p","#, "").as_bytes()); // 3: missing required
    line(ok_with("c-4", r#""prompt":"p""#, r#""prompt":"   ""#).as_bytes()); // 4: empty
    line(ok_with("c-5", r#""prompt":"p""#, r#""prompt":["p"]"#).as_bytes()); // 5: wrong type
    line(ok_with("c-6", "\"email\"", "\"emial\"").as_bytes()); // 6: unknown enum
    line(OK.as_bytes()); // 7: duplicate case_id
    line(br#"{"case_id":"c-8","prompt":"unterminated"#); // 8: invalid JSON
    let mut bad_utf8 = ok_with("c-9", "\"p\"", "\"p\u{1}\"").into_bytes();
    let at = bad_utf8.iter().position(|b| *b == 1).unwrap();
    bad_utf8[at] = 0xFF;
    line(&bad_utf8); // 9: invalid UTF-8
    line(b""); // 10: blank
    line(ok_with("c-11", "\"p\"", &format!("\"{}\"", "A".repeat(3000))).as_bytes()); // 11: too long
    line(
        ok_with(
            "c-12",
            r#"{"type":"contains","value":"X"}"#,
            r#"{"type":"regex","value":"(?P<x"}"#,
        )
        .as_bytes(),
    ); // 12
    line(
        ok_with(
            "c-13",
            r#"{"type":"contains","value":"X"}"#,
            r#"{"type":"contians","value":"X"}"#,
        )
        .as_bytes(),
    ); // 13
    line(
        ok_with(
            "c-14",
            r#"{"type":"contains","value":"X"}"#,
            r#"{"type":"canary","value":""}"#,
        )
        .as_bytes(),
    ); // 14
    line(b"[1,2,3]"); // 15: not an object
    line(
        ok_with(
            "c-16",
            r#""prompt":"p""#,
            r#""prompt":"p","atack_family":"x""#,
        )
        .as_bytes(),
    ); // 16: unknown key (warning)
    line(ok_with("c-17", r#""prompt":"p""#, r#""prompt":"p","prompt":"q""#).as_bytes()); // 17: repeated key
    line(ok_with("../../etc/passwd", "", "").as_bytes()); // 18: path trick in id
    line(
        ok_with(
            "c-19",
            r#""prompt":"p""#,
            r#""prompt":"p","label":"attack","severity_level":"catastrophic","language":"EN""#,
        )
        .as_bytes(),
    ); // 19
    f
}

/// The hostile corpus written to a fresh temp folder.
fn hostile_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cases.jsonl");
    std::fs::write(&path, hostile_corpus()).unwrap();
    (dir, path)
}

#[test]
fn reports_every_violation_with_file_line_field() {
    let (dir, path) = hostile_file();
    let out = run(pieval()
        .arg("validate")
        .arg(&path)
        .args(["--max-line-bytes", "2000"]));
    assert_eq!(
        out.code, 1,
        "invalid corpus exits 1; stderr: {}",
        out.stderr
    );
    insta::assert_snapshot!("hostile_corpus_text", scrub(&out.stdout, dir.path()));
}

#[test]
fn json_report_is_one_document() {
    let (_dir, path) = hostile_file();
    let out = run(pieval()
        .arg("validate")
        .arg(&path)
        .args(["--json", "--max-errors", "3"]));
    assert_eq!(out.code, 1);
    let mut doc: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    doc[0]["path"] = "<tmp>/cases.jsonl".into();
    insta::assert_json_snapshot!("hostile_corpus_json", doc);
}

#[test]
fn the_list_is_capped_but_every_violation_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cases.jsonl");
    let mut f = std::fs::File::create(&path).unwrap();
    for i in 0..500 {
        writeln!(
            f,
            "{}",
            ok_with(&format!("c{i}"), "\"email\"", "\"nowhere\"")
        )
        .unwrap();
    }
    drop(f);
    let out = run(pieval()
        .arg("validate")
        .arg(&path)
        .args(["--max-errors", "2"]));
    assert_eq!(out.code, 1);
    assert_eq!(
        out.stdout
            .lines()
            .filter(|l| l.contains("attack_surface: unknown value"))
            .count(),
        2
    );
    assert!(
        out.stdout
            .contains("… 498 more violation(s) not listed (--max-errors)"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("INVALID: 500 record(s), 0 valid, 500 error(s)"),
        "{}",
        out.stdout
    );
}

#[test]
fn exit_codes_follow_the_cli_contract() {
    let out = run(pieval().arg("validate"));
    assert_eq!(
        out.code, 0,
        "the committed corpus is valid: {}{}",
        out.stdout, out.stderr
    );
    assert!(out.stdout.contains("valid: 2"), "{}", out.stdout);
    let out = run(pieval().args(["validate", "no/such/file.jsonl"]));
    assert_eq!(out.code, 2);
    assert!(
        out.stderr
            .starts_with("error: no/such/file.jsonl: cannot open corpus:"),
        "{}",
        out.stderr
    );
    let out = run(pieval().args(["validate", "--max-errors", "lots"]));
    assert_eq!(out.code, 2);
    let out = run(pieval().args(["--help"]));
    assert_eq!(out.code, 0);
    assert!(out.stdout.contains("validate"));
}

#[test]
fn a_huge_line_is_skipped_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.jsonl");
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(f, "{OK}").unwrap();
    let chunk = vec![b'x'; 1 << 20];
    f.write_all(b"{\"prompt\":\"").unwrap();
    for _ in 0..64 {
        f.write_all(&chunk).unwrap();
    }
    f.write_all(b"\"}\n").unwrap();
    writeln!(f, "{}", ok_with("c-2", "", "")).unwrap();
    drop(f);
    let report = validate_file(&path, ReadOptions::default()).unwrap();
    assert_eq!(report.records, 3);
    assert_eq!(report.valid_records, 2);
    assert_eq!(report.errors, 1);
    assert!(
        report.violations[0]
            .problem
            .starts_with("line is 67108877 bytes, over the limit of 1048576")
    );
    assert_eq!(report.violations[0].line, 2);
}

#[test]
fn random_bytes_never_panic() {
    // A small deterministic xorshift generator: reproducible hostile input.
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let dir = tempfile::tempdir().unwrap();
    let pieces: [&[u8]; 12] = [
        b"{",
        b"}",
        b"\"",
        b":",
        b",",
        b"case_id",
        b"success_criteria",
        b"{\"type\":\"regex\",\"value\":\"",
        b"\n",
        b"\xff\xfe",
        b"[",
        b"\\u0000",
    ];
    for round in 0..40 {
        let mut data = OK.as_bytes().to_vec();
        for _ in 0..200 {
            let r = next();
            if r % 3 == 0 {
                let p = pieces[(r >> 8) as usize % pieces.len()];
                let at = (r >> 20) as usize % (data.len() + 1);
                data.splice(at..at, p.iter().copied());
            } else {
                let at = (r >> 20) as usize % data.len().max(1);
                if !data.is_empty() {
                    data[at] = (r >> 40) as u8;
                }
            }
        }
        let path = dir.path().join(format!("fuzz{round}.jsonl"));
        std::fs::write(&path, &data).unwrap();
        let report = validate_file(&path, ReadOptions::default()).unwrap();
        assert!(report.records >= 1);
    }
}

#[test]
fn parquet_corpora_are_checked_row_by_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cases.parquet");
    let s = |v: &[Option<&str>]| Arc::new(StringArray::from(v.to_vec())) as ArrayRef;
    let schema = Arc::new(Schema::new(vec![
        Field::new("case_id", DataType::Utf8, true),
        Field::new("source_name", DataType::Utf8, true),
        Field::new("source_type", DataType::Utf8, true),
        Field::new("attack_family", DataType::Utf8, true),
        Field::new("attack_surface", DataType::Utf8, true),
        Field::new("prompt", DataType::Utf8, true),
        Field::new("success_criteria", DataType::Utf8, true),
        Field::new("priority", DataType::Int64, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            s(&[Some("p-1"), Some("p-2"), Some("p-1")]),
            s(&[Some("t"), Some("t"), Some("t")]),
            s(&[Some("synthetic"), Some("synthetic"), Some("synthetic")]),
            s(&[Some("naive"), Some("naive"), Some("naive")]),
            s(&[Some("email"), Some("mail"), Some("email")]),
            s(&[Some("p"), None, Some("p")]),
            s(&[
                Some(r#"{"type":"canary","value":"C-1"}"#),
                Some("contains:PWNED"),
                Some("regex:("),
            ]),
            Arc::new(Int64Array::from(vec![1, 2, 3])),
        ],
    )
    .unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let out = run(pieval().arg("validate").arg(&path));
    assert_eq!(out.code, 1);
    insta::assert_snapshot!("parquet_rows", scrub(&out.stdout, dir.path()));
}
