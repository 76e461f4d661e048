//! DSSE envelopes (<https://github.com/secure-systems-lab/dsse>) carrying in-toto
//! Statements, signed with Ed25519 over the DSSE pre-authentication encoding, and the
//! key files behind them (PKCS#8 / SPKI PEM, the formats openssl and cosign read).

use std::io::Write;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The payload type of an in-toto Statement inside DSSE.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// DSSE's pre-authentication encoding: what is signed, so that the payload type is
/// authenticated with the payload.
/// `"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`, lengths in ASCII decimal.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + payload_type.len() + 32);
    out.extend_from_slice(b"DSSEv1 ");
    out.extend_from_slice(payload_type.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload_type.as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload);
    out
}

/// One signature of an envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub keyid: String,
    /// Base64 of the Ed25519 signature over [`pae`].
    pub sig: String,
}

/// A DSSE envelope, serialized with the spec's field names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// Base64 of the payload bytes.
    pub payload: String,
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub signatures: Vec<Signature>,
}

/// What checking an envelope's signatures found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureCheck {
    /// A signature verifies with the key (its key id).
    Valid(String),
    /// The envelope carries no signature.
    Unsigned,
    /// Signatures are present and none verifies with the key.
    Invalid,
}

/// Base64 as DSSE allows it: standard or URL-safe alphabet, padded or not.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let lenient =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    GeneralPurpose::new(&base64::alphabet::STANDARD, lenient)
        .decode(text)
        .or_else(|_| GeneralPurpose::new(&base64::alphabet::URL_SAFE, lenient).decode(text))
        .ok()
}

impl Envelope {
    /// Wrap `payload`, signing it when a key is given (`"signatures": []` otherwise).
    pub fn seal(payload_type: &str, payload: &[u8], key: Option<&SigningKey>) -> Self {
        let signatures = key
            .map(|k| {
                vec![Signature {
                    keyid: key_id(&k.verifying_key()),
                    sig: STANDARD.encode(k.sign(&pae(payload_type, payload)).to_bytes()),
                }]
            })
            .unwrap_or_default();
        Self {
            payload: STANDARD.encode(payload),
            payload_type: payload_type.to_owned(),
            signatures,
        }
    }

    /// Read an envelope file; a clear error naming the file when it is not one.
    pub fn read(path: &Path) -> Result<Self> {
        // Envelopes come from anyone: a regular file, no link, bounded.
        let text = crate::files::read_bounded(
            path,
            crate::files::Links::Refuse,
            crate::files::bounds::ENVELOPE,
        )?;
        serde_json::from_slice(&text)
            .map_err(|e| Error::config(path, format!("not a DSSE envelope: {e}")))
    }

    /// The decoded payload.
    pub fn payload_bytes(&self) -> Result<Vec<u8>> {
        decode_base64(&self.payload)
            .ok_or_else(|| Error::Crypto("the envelope's payload is not valid base64".into()))
    }

    /// Check the signatures against `key`: valid when any one verifies over the PAE of
    /// this envelope's payload type and payload.
    pub fn check_signatures(&self, key: &VerifyingKey) -> Result<SignatureCheck> {
        if self.signatures.is_empty() {
            return Ok(SignatureCheck::Unsigned);
        }
        let message = pae(&self.payload_type, &self.payload_bytes()?);
        for s in &self.signatures {
            let Some(bytes) = decode_base64(&s.sig) else {
                continue;
            };
            let Ok(sig) = ed25519_dalek::Signature::from_slice(&bytes) else {
                continue;
            };
            if key.verify(&message, &sig).is_ok() {
                return Ok(SignatureCheck::Valid(key_id(key)));
            }
        }
        Ok(SignatureCheck::Invalid)
    }
}

/// A key's id: the sha256 of its 32 public key bytes, in hex.
pub fn key_id(key: &VerifyingKey) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A fresh Ed25519 key from the operating system's random source.
pub fn generate_key() -> Result<SigningKey> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed)
        .map_err(|e| Error::Crypto(format!("no random source for a key: {e}")))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// The public key file next to a private key: `KEY.pub`.
pub fn public_key_path(private: &Path) -> std::path::PathBuf {
    let mut name = private.as_os_str().to_owned();
    name.push(".pub");
    name.into()
}

/// Write `key` as PKCS#8 PEM to `path` (mode 0600, never over an existing file) and its
/// public key as SPKI PEM to `path.pub`.
pub fn write_key_pair(path: &Path, key: &SigningKey) -> Result<()> {
    let public = public_key_path(path);
    for p in [path, public.as_path()] {
        if p.exists() {
            return Err(Error::Crypto(format!(
                "{}: already exists; pieval keygen never overwrites a key (choose another --output or remove it)",
                p.display()
            )));
        }
    }
    // PKCS#8 v1 (RFC 8410's form, the seed alone): OpenSSL 3.0 refuses the v2 form with
    // the public key attached ("unsupported"), which is ed25519-dalek's default.
    let pem = ed25519_dalek::pkcs8::KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    }
    .to_pkcs8_pem(Default::default())
    .map_err(|e| Error::Crypto(format!("cannot encode the key: {e}")))?;
    let pub_pem = key
        .verifying_key()
        .to_public_key_pem(Default::default())
        .map_err(|e| Error::Crypto(format!("cannot encode the public key: {e}")))?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options
        .open(path)
        .map_err(|e| Error::io(path, "cannot create the key file", e))?;
    f.write_all(pem.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io(path, "cannot write", e))?;
    crate::atomic::write_with(&public, |push| push(pub_pem.trim_end()))
}

/// Read a PKCS#8 PEM private key.
pub fn read_signing_key(path: &Path) -> Result<SigningKey> {
    let text = crate::files::read_text_bounded(
        path,
        crate::files::Links::Follow,
        crate::files::bounds::SMALL_TEXT,
    )?;
    SigningKey::from_pkcs8_pem(&text).map_err(|e| {
        Error::config(
            path,
            format!("not an Ed25519 private key in PKCS#8 PEM (make one with pieval keygen): {e}"),
        )
    })
}

/// Read a public key: SPKI PEM (`KEY.pub`), or the public half of a private key file.
pub fn read_verifying_key(path: &Path) -> Result<VerifyingKey> {
    let text = crate::files::read_text_bounded(
        path,
        crate::files::Links::Follow,
        crate::files::bounds::SMALL_TEXT,
    )?;
    if let Ok(key) = VerifyingKey::from_public_key_pem(&text) {
        return Ok(key);
    }
    SigningKey::from_pkcs8_pem(&text)
        .map(|k| k.verifying_key())
        .map_err(|_| {
            Error::config(
                path,
                "not an Ed25519 public key (SPKI PEM) nor a private key (PKCS#8 PEM)",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_matches_the_spec_byte_layout() {
        // The DSSE protocol document's example.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ".to_vec());
        // Lengths are bytes, not characters.
        assert_eq!(
            pae("t", "é".as_bytes()),
            "DSSEv1 1 t 2 é".as_bytes().to_vec()
        );
    }

    #[test]
    fn seal_and_check_round_trip_and_tamper() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let other = SigningKey::from_bytes(&[8u8; 32]);
        let env = Envelope::seal(PAYLOAD_TYPE, b"{\"a\":1}", Some(&key));
        let json = serde_json::to_string(&env).unwrap();
        assert!(json.starts_with("{\"payload\":"), "{json}");
        let back: Envelope = serde_json::from_str(&json).unwrap();
        assert_eq!(back.payload_bytes().unwrap(), b"{\"a\":1}");
        let vk = key.verifying_key();
        assert_eq!(
            back.check_signatures(&vk).unwrap(),
            SignatureCheck::Valid(key_id(&vk))
        );
        assert_eq!(
            back.check_signatures(&other.verifying_key()).unwrap(),
            SignatureCheck::Invalid
        );
        // A changed payload, payload type or signature fails.
        let mut t = back.clone();
        t.payload = STANDARD.encode(b"{\"a\":2}");
        assert_eq!(t.check_signatures(&vk).unwrap(), SignatureCheck::Invalid);
        let mut t = back.clone();
        t.payload_type = "application/json".into();
        assert_eq!(t.check_signatures(&vk).unwrap(), SignatureCheck::Invalid);
        let mut t = back.clone();
        let mut sig = STANDARD.decode(&t.signatures[0].sig).unwrap();
        sig[3] ^= 1;
        t.signatures[0].sig = STANDARD.encode(sig);
        assert_eq!(t.check_signatures(&vk).unwrap(), SignatureCheck::Invalid);
        // Unsigned.
        let u = Envelope::seal(PAYLOAD_TYPE, b"x", None);
        assert!(u.signatures.is_empty());
        assert_eq!(u.check_signatures(&vk).unwrap(), SignatureCheck::Unsigned);
    }

    #[test]
    fn url_safe_unpadded_base64_is_accepted() {
        assert_eq!(decode_base64("_-8").unwrap(), vec![0xff, 0xef]);
        assert_eq!(decode_base64("aGk").unwrap(), b"hi");
        assert_eq!(decode_base64("aGk=").unwrap(), b"hi");
        assert!(decode_base64("!!").is_none());
    }

    #[test]
    fn key_files_round_trip_and_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = generate_key().unwrap();
        write_key_pair(&path, &key).unwrap();
        let read = read_signing_key(&path).unwrap();
        assert_eq!(read.to_bytes(), key.to_bytes());
        let public = read_verifying_key(&public_key_path(&path)).unwrap();
        assert_eq!(public, key.verifying_key());
        assert_eq!(read_verifying_key(&path).unwrap(), key.verifying_key());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let again = write_key_pair(&path, &key).unwrap_err().to_string();
        assert!(again.contains("never overwrites"), "{again}");
        std::fs::write(dir.path().join("bad"), "hello").unwrap();
        let e = read_signing_key(&dir.path().join("bad"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("PKCS#8"), "{e}");
    }
}
