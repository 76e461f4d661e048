//! The rule packs in effect: the ones compiled into the binary (`data/rules/`), or the
//! ones of a folder given with `--rules DIR` (`PIEVAL_RULES`) before any detector ran.
//! Their digest names the detectors' behaviour: a cluster's client, scheduler and every
//! executor must hold the same one (src/cluster/mod.rs), since UDFs travel by name.

use std::path::Path;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use pieval_contract::error::{Error, Result};

/// The shipped injection-rule pack, and where it lives in the repository.
pub const INJECTION_PACK: &str = include_str!("../../../data/rules/injection.toml");
pub(crate) const INJECTION_PACK_PATH: &str = "data/rules/injection.toml";
/// The shipped injection model (`crate::model`; an empty file: none), and where it lives.
pub const INJECTION_MODEL: &[u8] = include_bytes!("../../../data/rules/injection-model.bin");
pub(crate) const INJECTION_MODEL_PATH: &str = "data/rules/injection-model.bin";

/// The injection model in effect: the shipped one (`None` when the build ships none).
pub fn injection_model() -> Option<&'static crate::model::Model> {
    static MODEL: OnceLock<Option<crate::model::Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            crate::model::Model::from_bytes(INJECTION_MODEL, INJECTION_MODEL_PATH)
                .expect("the shipped model reads (a test checks it)")
        })
        .as_ref()
}

/// The shipped refusal pack, and where it lives in the repository.
pub const REFUSAL_PACK: &str = include_str!("../../../data/rules/refusal.toml");
pub(crate) const REFUSAL_PACK_PATH: &str = "data/rules/refusal.toml";

/// A pack's text and where it came from (named in errors).
#[derive(Clone, Debug)]
pub struct PackText {
    pub text: String,
    pub origin: String,
}

#[derive(Debug)]
struct Packs {
    injection: PackText,
    refusal: PackText,
}

static INSTALLED: OnceLock<Packs> = OnceLock::new();

fn packs() -> &'static Packs {
    INSTALLED.get_or_init(|| Packs {
        injection: PackText {
            text: INJECTION_PACK.to_owned(),
            origin: INJECTION_PACK_PATH.to_owned(),
        },
        refusal: PackText {
            text: REFUSAL_PACK.to_owned(),
            origin: REFUSAL_PACK_PATH.to_owned(),
        },
    })
}

/// The injection pack in effect.
pub fn injection() -> &'static PackText {
    &packs().injection
}

/// The refusal pack in effect.
pub fn refusal() -> &'static PackText {
    &packs().refusal
}

/// The packs of `dir` (`injection.toml`, `refusal.toml`; a file it lacks stays the
/// shipped one): (injection, refusal), read and bounded, not yet compiled
/// (`detect::install_rules` compiles them, then [`install`]s them).
pub fn read_dir(dir: &Path) -> Result<(PackText, PackText)> {
    // Without a trailing separator, which would follow a symbolic link.
    let dir: std::path::PathBuf = dir.components().collect();
    let dir = dir.as_path();
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| Error::io(dir, "cannot open the rules folder", e))?;
    if !meta.is_dir() {
        return Err(Error::Usage(format!(
            "--rules {}: not a folder (a symbolic link is not followed)",
            dir.display()
        )));
    }
    let read = |name: &str, shipped: &str, default_origin: &str| -> Result<PackText> {
        let path = dir.join(name);
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(PackText {
                text: shipped.to_owned(),
                origin: default_origin.to_owned(),
            }),
            Err(e) => Err(Error::io(&path, "cannot open rule pack", e)),
            Ok(m) if !m.is_file() => Err(Error::Usage(format!(
                "{}: not a regular file (a symbolic link is not followed)",
                path.display()
            ))),
            Ok(_) => {
                use std::io::Read;
                const MAX: u64 = 16 << 20;
                let mut bytes = Vec::new();
                std::fs::File::open(&path)
                    .and_then(|f| f.take(MAX + 1).read_to_end(&mut bytes))
                    .map_err(|e| Error::io(&path, "cannot read rule pack", e))?;
                if bytes.len() as u64 > MAX {
                    return Err(Error::config(
                        &path,
                        format!("larger than {} MiB", MAX >> 20),
                    ));
                }
                let text = String::from_utf8(bytes).map_err(|e| {
                    Error::config(
                        &path,
                        format!("not UTF-8 (byte {})", e.utf8_error().valid_up_to()),
                    )
                })?;
                Ok(PackText {
                    text,
                    origin: path.display().to_string(),
                })
            }
        }
    };
    let injection = read("injection.toml", INJECTION_PACK, INJECTION_PACK_PATH)?;
    let refusal = read("refusal.toml", REFUSAL_PACK, REFUSAL_PACK_PATH)?;
    Ok((injection, refusal))
}

/// Use these packs for the rest of the process (already checked by the caller); an
/// error once a detector has run.
pub fn install(injection: PackText, refusal: PackText) -> Result<()> {
    INSTALLED.set(Packs { injection, refusal }).map_err(|_| {
        Error::Internal("the rule packs were already in use when --rules was read".into())
    })
}

/// sha256 over the packs in effect (their texts, not their file names): equal digests,
/// equal detectors. `sha256:<hex>`.
pub fn digest() -> String {
    let p = packs();
    let mut h = Sha256::new();
    for (name, pack) in [("injection", &p.injection), ("refusal", &p.refusal)] {
        h.update(name.as_bytes());
        h.update([0]);
        h.update((pack.text.len() as u64).to_le_bytes());
        h.update(pack.text.as_bytes());
    }
    // the injection model's weights (pi_injection_score)
    h.update(b"injection-model\0");
    h.update((INJECTION_MODEL.len() as u64).to_le_bytes());
    h.update(INJECTION_MODEL);
    format!("sha256:{}", hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_of_the_shipped_packs_by_default() {
        let d = digest();
        assert!(d.starts_with("sha256:") && d.len() == 71, "{d}");
        assert_eq!(d, digest());
        assert_eq!(injection().text, INJECTION_PACK);
    }

    #[test]
    fn the_shipped_model_reads() {
        // empty (no model) or a model file that reads
        let m = crate::model::Model::from_bytes(INJECTION_MODEL, INJECTION_MODEL_PATH).unwrap();
        assert_eq!(m.is_none(), INJECTION_MODEL.is_empty());
    }
}
