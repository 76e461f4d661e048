//! Shared environment files: the `include` of a case's environment
//! (docs/contract.md#shared-environment-files), read relative to the corpus file that names
//! it, once per file per read, with the path checks a corpus from someone else needs: a
//! relative path inside the corpus file's folder, no `..`, no root, no symbolic link on the
//! way, a regular file of bounded size.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::files::{Links, read_text_bounded};

/// The largest shared environment file read.
pub const MAX_INCLUDE_BYTES: u64 = 64 << 20;

type Loaded = Result<Arc<Value>, String>;

/// The include files of one corpus read, each parsed once.
#[derive(Debug, Default)]
pub struct Includes {
    base: Option<PathBuf>,
    cache: Mutex<HashMap<String, Loaded>>,
    /// Each file read: its sha256 (what a run's manifest binds, beside the corpus file's).
    digests: Mutex<std::collections::BTreeMap<String, String>>,
}

impl Includes {
    /// Includes read relative to `base` (the corpus file's folder); `None`: none allowed.
    pub fn new(base: Option<PathBuf>) -> Self {
        Includes {
            base,
            cache: Mutex::default(),
            digests: Mutex::default(),
        }
    }

    /// One digest of every file read, or `None` when none was: sha256 over the lines
    /// `path<TAB>sha256` in path order. A run's manifest records it beside the corpus
    /// file's digest, so `--resume` and replay see a changed shared environment.
    pub fn digest(&self) -> Option<String> {
        let digests = self.digests.lock().unwrap_or_else(|p| p.into_inner());
        if digests.is_empty() {
            return None;
        }
        let text: String = digests
            .iter()
            .map(|(path, sha)| format!("{path}\t{sha}\n"))
            .collect();
        Some(crate::digest::sha256_hex(text.as_bytes()))
    }

    /// The JSON of the include file `rel`, or why it cannot be read.
    pub fn load(&self, rel: &str) -> Loaded {
        // One entry per file however it is written (`a.json`, `./a.json`): read once.
        let key: String = Path::new(rel)
            .components()
            .filter(|c| !matches!(c, Component::CurDir))
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hit) = cache.get(&key) {
            return hit.clone();
        }
        let loaded = self.read(rel).map(|(text, value)| {
            self.digests
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone(), crate::digest::sha256_hex(text.as_bytes()));
            value
        });
        cache.insert(key, loaded.clone());
        loaded
    }

    fn read(&self, rel: &str) -> Result<(String, Arc<Value>), String> {
        let base = self.base.as_deref().ok_or_else(|| {
            "an include is read relative to the corpus file, and this input is not a file"
                .to_owned()
        })?;
        let path = Path::new(rel);
        if rel.contains('\\') || rel.contains('\0') {
            return Err("a path with a backslash or NUL is refused".into());
        }
        let mut below = base.to_path_buf();
        for part in path.components() {
            match part {
                Component::Normal(p) => {
                    below.push(p);
                    let is_link = std::fs::symlink_metadata(&below)
                        .map(|m| m.file_type().is_symlink())
                        .unwrap_or(false);
                    if is_link {
                        return Err(format!(
                            "{} is a symbolic link: refused (the corpus may come from someone else)",
                            below.display()
                        ));
                    }
                }
                Component::CurDir => {}
                _ => {
                    return Err(
                        "an absolute path or `..` is refused: the file must be in the \
                                corpus file's folder or below it"
                            .into(),
                    );
                }
            }
        }
        let text = read_text_bounded(&below, Links::Refuse, MAX_INCLUDE_BYTES)
            .map_err(|e| e.to_string())?;
        let value = serde_json::from_str::<Value>(&text).map_err(|e| format!("not JSON: {e}"))?;
        Ok((text, Arc::new(value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_the_folder_and_links_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("envs")).unwrap();
        std::fs::write(dir.path().join("envs/a.json"), r#"{"tools": []}"#).unwrap();
        std::fs::write(dir.path().join("bad.json"), "{nope").unwrap();
        let inc = Includes::new(Some(dir.path().to_path_buf()));
        assert!(inc.load("envs/a.json").is_ok());
        assert!(inc.load("./envs/a.json").is_ok());
        for bad in [
            "../a.json",
            "/etc/passwd",
            "envs/../../x.json",
            "envs\\a.json",
        ] {
            assert!(inc.load(bad).is_err(), "{bad} was read");
        }
        assert!(
            inc.load("missing.json")
                .unwrap_err()
                .contains("missing.json")
        );
        assert!(inc.load("bad.json").unwrap_err().starts_with("not JSON"));
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.path().join("envs"), dir.path().join("linked")).unwrap();
            let e = inc.load("linked/a.json").unwrap_err();
            assert!(e.contains("symbolic link"), "{e}");
        }
        assert!(Includes::new(None).load("envs/a.json").is_err());
        // The files read are digested (a failed read is not).
        let d = inc.digest().unwrap();
        let fresh = Includes::new(Some(dir.path().to_path_buf()));
        assert_eq!(fresh.digest(), None);
        fresh.load("envs/a.json").unwrap();
        assert_eq!(fresh.digest().as_deref(), Some(d.as_str()));
        std::fs::write(dir.path().join("envs/a.json"), r#"{"tools": [1]}"#).unwrap();
        let changed = Includes::new(Some(dir.path().to_path_buf()));
        changed.load("envs/a.json").unwrap();
        assert_ne!(changed.digest(), Some(d));
    }
}
