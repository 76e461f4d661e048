//! The repository keeps its own promises: every test file runs, every document a
//! comment cites exists.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// With `autotests = false` a test file that is not a module here would silently not run.
#[test]
fn every_test_file_is_a_module_of_this_binary() {
    let main = include_str!("main.rs");
    let dir = root().join("tests");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(dir.join("it")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if let Some(stem) = name.strip_suffix(".rs")
            && stem != "main"
            && !main.contains(&format!("\nmod {stem};\n"))
        {
            missing.push(name);
        }
    }
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".rs") {
            missing.push(format!("tests/{name} (outside tests/it)"));
        }
    }
    assert!(missing.is_empty(), "test files that never run: {missing:?}");
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Comments cite documents by path (`docs/cli.md`); each must be in the repository, and
/// none may cite a document by a bare name that is not (`CLI.md`, `ARCHITECTURE.md`).
#[test]
fn every_document_a_comment_cites_exists() {
    let cited = regex::Regex::new(r"\b((?:docs|data/[a-z_/]+)/[A-Za-z0-9_.-]+\.md)\b").unwrap();
    let bare = regex::Regex::new(r"\b[A-Z][A-Z_]+\.md\b").unwrap();
    let mut files = Vec::new();
    for dir in ["src", "benches", "tests", "crates"] {
        rust_files(&root().join(dir), &mut files);
    }
    let mut bad = Vec::new();
    // Not citations: the file a dataset copy may carry (ingest), and this test's own text.
    let not_cited = ["README.md", "SOURCE.md"];
    for file in files.iter().filter(|f| !f.ends_with("tests/it/layout.rs")) {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for m in cited.captures_iter(line) {
                let at = m.get(1).unwrap().start();
                // Part of a URL (`…/blob/master/docs/gguf.md`), not a path in this repository.
                if line[..at].ends_with('/') {
                    continue;
                }
                if !root().join(&m[1]).is_file() {
                    bad.push(format!("{}:{}: {}", file.display(), n + 1, &m[1]));
                }
            }
            for m in bare.find_iter(line) {
                if !not_cited.contains(&m.as_str()) && !root().join(m.as_str()).is_file() {
                    bad.push(format!("{}:{}: {}", file.display(), n + 1, m.as_str()));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "cited documents that do not exist: {bad:#?}"
    );
}

/// `cargo run` and `cargo test` share one build only if no dev-dependency changes the
/// features of a dependency the binary also uses (cargo unifies them in the test build,
/// and every crate above a changed one is compiled twice).
#[test]
fn dev_dependencies_do_not_change_the_features_of_the_build() {
    let tree = |edges: &str| {
        let out = std::process::Command::new(env!("CARGO"))
            .current_dir(root())
            .args([
                "tree",
                "--locked",
                "--offline",
                "-p",
                "pieval",
                "--prefix",
                "none",
            ])
            .args(["-e", edges, "-f", "{p} [{f}]"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut map = std::collections::BTreeMap::new();
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            let line = line.trim_end_matches(" (*)");
            if let Some((package, features)) = line.rsplit_once(" [") {
                map.insert(package.to_owned(), features.to_owned());
            }
        }
        map
    };
    let normal = tree("normal,build");
    let with_dev = tree("normal,build,dev");
    assert!(
        normal.len() > 100,
        "cargo tree printed too little: {normal:?}"
    );
    let changed: Vec<String> = normal
        .iter()
        .filter(|(p, f)| with_dev.get(*p).is_some_and(|g| g != *f))
        .map(|(p, f)| format!("{p}: [{f} → [{}", with_dev[p]))
        .collect();
    assert!(
        changed.is_empty(),
        "dev-dependencies change these features: {changed:#?}"
    );
}

/// Benches are not built by `cargo test`; a `#[path]` into a moved test helper would only
/// break `cargo bench`. Every `#[path]` must name an existing file.
#[test]
fn every_path_attribute_names_a_file() {
    let attr = regex::Regex::new(r#"#\[path = "([^"]+)"\]"#).unwrap();
    let mut files = Vec::new();
    for dir in ["src", "benches", "tests"] {
        rust_files(&root().join(dir), &mut files);
    }
    let mut bad = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for m in attr.captures_iter(&text) {
            if !file.parent().unwrap().join(&m[1]).is_file() {
                bad.push(format!("{}: {}", file.display(), &m[1]));
            }
        }
    }
    assert!(bad.is_empty(), "#[path] to missing files: {bad:#?}");
}

/// The layering of docs/architecture.md holds in the imports: a module uses only the
/// modules below it (tests inside a module are not counted).
#[test]
fn modules_import_only_downward() {
    const ORDER: &[&str] = &[
        "main",
        "cli",
        "review",
        "import",
        "runner",
        "report",
        "export",
        "evidence",
        "ops",
        "cluster",
        "scoring",
        "engine",
        "experiment",
        "guard",
        "attack",
        "agent",
        "judge",
        "mitigation",
        "params",
        "provider",
        "model",
        "ingest",
        "taxonomy",
        "detect",
        "corpus",
        "objstore",
        "rundir",
        "contract",
        "config_errors",
        "atomic",
        "digest",
        "secrets",
        "files",
        "stats",
        "interrupt",
        "text",
        "error",
    ];
    let rank = |m: &str| ORDER.iter().position(|o| *o == m);
    let uses = regex::Regex::new(r"crate::([a-z_]+)").unwrap();
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let mut bad = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(root().join("src")).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let module = first.trim_end_matches(".rs");
        if module == "lib" {
            continue;
        }
        let Some(own) = rank(module) else {
            bad.push(format!(
                "src/{first}: not in the layering of docs/architecture.md"
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        for m in uses.captures_iter(code) {
            let target = &m[1];
            if target != module && rank(target).is_some_and(|r| r <= own) {
                bad.push(format!("{}: {module} uses crate::{target}", rel.display()));
            }
        }
    }
    bad.sort();
    bad.dedup();
    assert!(bad.is_empty(), "imports against the layering: {bad:#?}");
}
