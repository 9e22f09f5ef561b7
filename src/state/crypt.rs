//! Encryption of the state document at rest, for every backend: AES-256-GCM over the whole
//! document with a random 96-bit nonce, in an envelope that says it is encrypted. The key is
//! the operator's (`SPARKFORM_STATE_KEY`, base64 of 32 bytes, or a file named by
//! `SPARKFORM_STATE_KEY_FILE`), never stored by sparkform; it is not the key of the hashes of
//! sensitive values (`HashKey`), which stays beside the state.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The envelope's marker and version.
pub const ENVELOPE: &str = "sparkform-encrypted-state";
const ALGORITHM: &str = "AES-256-GCM";
/// Bound into every tag: a ciphertext of something else does not open as a state.
const AAD: &[u8] = b"sparkform state v1";

pub const KEY_ENV: &str = "SPARKFORM_STATE_KEY";
pub const KEY_FILE_ENV: &str = "SPARKFORM_STATE_KEY_FILE";

/// The key of the state's encryption. Its bytes are never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct StateKey([u8; 32]);

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey(..)")
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Envelope {
    format: String,
    algorithm: String,
    nonce: String,
    ciphertext: String,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

impl StateKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        StateKey(bytes)
    }

    /// A key from base64 text (32 bytes once decoded); the error says what is wrong, never
    /// what the text was.
    pub fn from_base64(text: &str) -> Result<Self, String> {
        let bytes = b64()
            .decode(text.trim())
            .map_err(|_| "is not base64".to_string())?;
        let n = bytes.len();
        let bytes: [u8; 32] = bytes
            .try_into()
            .map_err(|_| format!("is {n} bytes once decoded, not 32"))?;
        Ok(StateKey(bytes))
    }

    /// The key the environment gives: `SPARKFORM_STATE_KEY`, else the file
    /// `SPARKFORM_STATE_KEY_FILE` names (base64 text, or the 32 bytes themselves); `None`
    /// when neither is set (the state is stored as plain JSON).
    pub fn from_env() -> Result<Option<Self>, String> {
        let hint = "generate one with `head -c 32 /dev/urandom | base64`";
        if let Some(text) = std::env::var_os(KEY_ENV) {
            let text = text
                .into_string()
                .map_err(|_| format!("{KEY_ENV} is not text; {hint}"))?;
            return StateKey::from_base64(&text)
                .map(Some)
                .map_err(|why| format!("{KEY_ENV} {why}; {hint}"));
        }
        let Some(path) = std::env::var_os(KEY_FILE_ENV) else {
            return Ok(None);
        };
        let shown = std::path::Path::new(&path).display().to_string();
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("cannot read the key file {shown} ({KEY_FILE_ENV}): {e}"))?;
        if let Ok(raw) = <[u8; 32]>::try_from(bytes.as_slice()) {
            return Ok(Some(StateKey(raw)));
        }
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("the key file {shown} is neither 32 bytes nor base64 text"))?;
        StateKey::from_base64(&text)
            .map(Some)
            .map_err(|why| format!("the key in {shown} ({KEY_FILE_ENV}) {why}; {hint}"))
    }

    /// The envelope of `plain`: a JSON document, ending with a newline.
    pub fn seal(&self, plain: &[u8]) -> Result<Vec<u8>, String> {
        let cipher = Aes256Gcm::new_from_slice(&self.0).map_err(|e| e.to_string())?;
        let mut nonce = [0u8; 12];
        getrandom::fill(&mut nonce).map_err(|e| format!("no random nonce: {e}"))?;
        let ciphertext = cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: AAD,
                },
            )
            .map_err(|_| "encryption failed".to_string())?;
        let envelope = Envelope {
            format: ENVELOPE.to_string(),
            algorithm: ALGORITHM.to_string(),
            nonce: b64().encode(nonce),
            ciphertext: b64().encode(ciphertext),
        };
        let mut out = serde_json::to_vec_pretty(&envelope).map_err(|e| e.to_string())?;
        out.push(b'\n');
        Ok(out)
    }

    fn open(&self, envelope: &Envelope) -> Result<Vec<u8>, OpenFailure> {
        if envelope.algorithm != ALGORITHM {
            return Err(OpenFailure::Damaged(format!(
                "it names the algorithm {:?}, not {ALGORITHM}",
                envelope.algorithm
            )));
        }
        let nonce = b64()
            .decode(&envelope.nonce)
            .ok()
            .filter(|n| n.len() == 12)
            .ok_or_else(|| OpenFailure::Damaged("its nonce is not 12 bytes of base64".into()))?;
        let ciphertext = b64()
            .decode(&envelope.ciphertext)
            .map_err(|_| OpenFailure::Damaged("its ciphertext is not base64".into()))?;
        let cipher =
            Aes256Gcm::new_from_slice(&self.0).map_err(|e| OpenFailure::Damaged(e.to_string()))?;
        cipher
            .decrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &ciphertext,
                    aad: AAD,
                },
            )
            .map_err(|_| OpenFailure::WrongKey)
    }
}

/// Why a stored document could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenFailure {
    /// It is encrypted and no key is set.
    NoKey,
    /// The key does not open it (another key, or the document was altered).
    WrongKey,
    /// The envelope itself is not as sparkform writes it.
    Damaged(String),
}

/// Whether `doc` is an encrypted envelope.
pub fn is_sealed(doc: &[u8]) -> bool {
    // Cheap test first: a plain state never names the marker in its first bytes.
    let head = &doc[..doc.len().min(200)];
    String::from_utf8_lossy(head).contains(ENVELOPE)
        && serde_json::from_slice::<Envelope>(doc).is_ok_and(|e| e.format == ENVELOPE)
}

/// The plain document: `doc` itself when it is not an envelope, else opened with `key`.
pub fn open(doc: Vec<u8>, key: Option<&StateKey>) -> Result<Vec<u8>, OpenFailure> {
    if !is_sealed(&doc) {
        return Ok(doc);
    }
    let envelope: Envelope =
        serde_json::from_slice(&doc).map_err(|e| OpenFailure::Damaged(e.to_string()))?;
    match key {
        None => Err(OpenFailure::NoKey),
        Some(k) => k.open(&envelope),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_document_opens_with_its_key_only() {
        let key = StateKey::from_bytes([7; 32]);
        let sealed = key.seal(b"{\"serial\": 3}\n").unwrap();
        assert!(is_sealed(&sealed));
        assert!(!String::from_utf8_lossy(&sealed).contains("serial"));
        assert_eq!(
            open(sealed.clone(), Some(&key)).unwrap(),
            b"{\"serial\": 3}\n"
        );
        let other = StateKey::from_bytes([8; 32]);
        assert_eq!(
            open(sealed.clone(), Some(&other)),
            Err(OpenFailure::WrongKey)
        );
        assert_eq!(open(sealed, None), Err(OpenFailure::NoKey));
        // Two seals of one document differ (a fresh nonce each).
        assert_ne!(key.seal(b"x").unwrap(), key.seal(b"x").unwrap());
    }

    #[test]
    fn a_plain_document_passes_and_a_bad_key_text_is_explained() {
        assert_eq!(open(b"{}".to_vec(), None).unwrap(), b"{}");
        assert!(StateKey::from_base64("nope!").is_err());
        let short = base64::engine::general_purpose::STANDARD.encode([1u8; 16]);
        let why = StateKey::from_base64(&short).unwrap_err();
        assert!(why.contains("16 bytes"), "{why}");
    }
}
