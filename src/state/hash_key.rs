//! The key of the hashes of sensitive values ([`HashKey`]): how a value is hashed under it, and
//! where the key is kept: with the state where the backend keeps it (PostgreSQL's `keys`
//! table, so every checkout of a shared state plans with one key), else in `sparkform.key`
//! beside the local state.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{crypt, io_err, parent_dir, StateError, StateStore};

/// The prefix of a keyed hash of a sensitive value.
pub const KEYED_PREFIX: &str = "hmac-sha256:";
/// The prefix of the unkeyed hashes that sparkform wrote before its hashes were keyed.
pub const LEGACY_PREFIX: &str = "sha256:";
/// What a sensitive value is recorded as when no key is at hand: it matches no recorded hash,
/// so the value plans as changed, and it confirms no guess.
pub const UNKEYED: &str = "hmac-sha256:(no key)";

/// The per-deployment key of the hashes of sensitive values. Kept with the state's backend
/// (PostgreSQL's `keys` table, sealed under the state key when one is set) or in a file beside
/// a local state, never in the state document, so a state or plan file alone cannot confirm a
/// guessed secret by hashing it.
#[derive(Clone, PartialEq, Eq)]
pub struct HashKey([u8; 32]);

impl std::fmt::Debug for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HashKey(..)")
    }
}

impl HashKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        HashKey(bytes)
    }

    /// A new random key from the operating system's generator.
    pub fn generate() -> io::Result<Self> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(HashKey(bytes))
    }

    fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        if text.len() != 64 {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(HashKey(bytes))
    }

    fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Replaces a sensitive value by `"hmac-sha256:<hex>"`, the HMAC of its canonical JSON under
/// the deployment's key (serde_json sorts object keys, so `to_vec` is canonical); without a
/// key, by [`UNKEYED`].
pub fn hash_sensitive(key: Option<&HashKey>, value: &serde_json::Value) -> serde_json::Value {
    use hmac::{KeyInit, Mac};
    let Some(key) = key else {
        return serde_json::Value::String(UNKEYED.to_string());
    };
    // Serialising a `Value` cannot fail (all keys are strings).
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let mut mac = match hmac::Hmac::<Sha256>::new_from_slice(&key.0) {
        Ok(m) => m,
        // HMAC takes keys of any length: unreachable, but never a clear value.
        Err(_) => return serde_json::Value::String(UNKEYED.to_string()),
    };
    mac.update(&bytes);
    let tag = mac.finalize().into_bytes();
    serde_json::Value::String(format!("{KEYED_PREFIX}{}", hex(&tag)))
}

/// Whether a recorded string is a hash of a sensitive value (keyed, legacy or unkeyed).
pub fn is_sensitive_hash(s: &str) -> bool {
    s == UNKEYED
        || (s.starts_with(KEYED_PREFIX) && s.len() == KEYED_PREFIX.len() + 64)
        || (s.starts_with(LEGACY_PREFIX) && s.len() == LEGACY_PREFIX.len() + 64)
}

/// The file beside the state that holds the [`HashKey`].
pub const KEY_FILE: &str = "sparkform.key";

/// Add `name` to `dir/.gitignore` unless a line already names it.
fn ignore_in_git(dir: &Path, name: &str) -> Result<(), StateError> {
    let path = dir.join(".gitignore");
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_err(&path, e)),
    };
    if text
        .lines()
        .any(|l| l.trim() == name || l.trim() == format!("/{name}"))
    {
        return Ok(());
    }
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .map_err(|e| io_err(&path, e))?;
    let sep = if text.is_empty() || text.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    f.write_all(format!("{sep}{name}\n").as_bytes())
        .map_err(|e| io_err(&path, e))
}

impl StateStore {
    /// `sparkform.key` in the state's folder: the key of the hashes of sensitive values.
    pub fn key_path(&self) -> PathBuf {
        parent_dir(&self.path).join(KEY_FILE)
    }

    /// The key of the hashes of sensitive values; `Ok(None)` if there is none yet. A backend
    /// that keeps it with the state (PostgreSQL) is asked first, so every checkout of a shared
    /// state plans with the same key; until it keeps one, a `sparkform.key` beside this
    /// checkout's path is the key (the next apply stores it there, [`StateStore::key_or_create`]).
    /// A file that differs from the kept key is an error naming both.
    pub fn read_key(&self) -> Result<Option<HashKey>, StateError> {
        let file = self.read_key_file()?;
        if !self.backend.keeps_hash_key() {
            return Ok(file);
        }
        match self.read_kept_key()? {
            Some(kept) => self.one_key(kept, file.as_ref()).map(Some),
            None => Ok(file),
        }
    }

    /// The key, created on first use. Kept with the state where the backend keeps it (sealed
    /// under the state key when one is set): the first use adopts the `sparkform.key` of an
    /// earlier sparkform beside this checkout, if there is one, else creates a key; of two
    /// first uses at once, both get the one stored first. The local backend's is the file
    /// [`StateStore::key_path`].
    pub fn key_or_create(&self) -> Result<HashKey, StateError> {
        if !self.backend.keeps_hash_key() {
            return self.key_file_or_create();
        }
        let file = self.read_key_file()?;
        if let Some(kept) = self.read_kept_key()? {
            return self.one_key(kept, file.as_ref());
        }
        let candidate = match &file {
            Some(k) => k.clone(),
            None => HashKey::generate().map_err(|e| io_err(&self.backend.place(), e))?,
        };
        let stored = self.seal_hash_key(&candidate)?;
        let kept = self.backend.create_hash_key(&stored)?;
        let kept = self.open_kept_key(kept)?;
        self.one_key(kept, file.as_ref())
    }

    /// The key the backend keeps, opened with the state key.
    fn read_kept_key(&self) -> Result<Option<HashKey>, StateError> {
        match self.backend.read_hash_key()? {
            Some(stored) => self.open_kept_key(stored).map(Some),
            None => Ok(None),
        }
    }

    fn open_kept_key(&self, stored: Vec<u8>) -> Result<HashKey, StateError> {
        let plain = crypt::open(stored, self.key.as_ref()).map_err(|p| self.crypt_error(p))?;
        std::str::from_utf8(&plain)
            .ok()
            .and_then(HashKey::parse)
            .ok_or_else(|| StateError::DamagedHashKey {
                place: self.describe(),
                why: "not 64 hexadecimal digits".into(),
            })
    }

    /// `kept`, unless this checkout's key file holds another key.
    fn one_key(&self, kept: HashKey, file: Option<&HashKey>) -> Result<HashKey, StateError> {
        match file {
            Some(f) if *f != kept => Err(StateError::TwoHashKeys {
                place: self.describe(),
                file: self.key_path(),
            }),
            _ => Ok(kept),
        }
    }

    /// The key file beside the path; `Ok(None)` if there is none yet (or it is
    /// not a key: a damaged key is treated as missing, so every sensitive value plans as
    /// changed rather than the plan failing).
    fn read_key_file(&self) -> Result<Option<HashKey>, StateError> {
        let path = self.key_path();
        match fs::read_to_string(&path) {
            Ok(t) => Ok(HashKey::parse(&t)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path, e)),
        }
    }

    /// The key file, created on first use: readable only by its owner, and listed in the state
    /// folder's `.gitignore` so it is not committed with the definitions.
    fn key_file_or_create(&self) -> Result<HashKey, StateError> {
        if let Some(k) = self.read_key_file()? {
            return Ok(k);
        }
        let key = HashKey::generate().map_err(|e| io_err(&self.key_path(), e))?;
        self.write_key_file(&key)?;
        Ok(key)
    }

    /// Takes `key` as this store's key of the hashes where it has none (a migration carries the
    /// source's); returns the key it has now, which the caller compares with `key`.
    pub(crate) fn adopt_key(&self, key: &HashKey) -> Result<HashKey, StateError> {
        if self.backend.keeps_hash_key() {
            if let Some(kept) = self.read_kept_key()? {
                return Ok(kept);
            }
            let stored = self.seal_hash_key(key)?;
            return self.open_kept_key(self.backend.create_hash_key(&stored)?);
        }
        match self.read_key_file()? {
            Some(k) => Ok(k),
            None => self.write_key_file(key).map(|()| key.clone()),
        }
    }

    /// `key` as the backend keeps it: hex, sealed under the state key when one is set.
    fn seal_hash_key(&self, key: &HashKey) -> Result<Vec<u8>, StateError> {
        let text = format!("{}\n", key.to_hex());
        match &self.key {
            Some(k) => k
                .seal(text.as_bytes())
                .map_err(|why| StateError::DamagedHashKey {
                    place: self.describe(),
                    why,
                }),
            None => Ok(text.into_bytes()),
        }
    }

    /// Writes `key` to [`StateStore::key_path`]: readable only by its owner, and listed in the
    /// state folder's `.gitignore`.
    fn write_key_file(&self, key: &HashKey) -> Result<(), StateError> {
        let path = self.key_path();
        let dir = parent_dir(&self.path);
        fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        let mut opts = OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&path).map_err(|e| io_err(&path, e))?;
        #[cfg(unix)]
        {
            // A damaged key file that existed keeps its mode with `open`: tighten it.
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
                .map_err(|e| io_err(&path, e))?;
        }
        f.write_all(format!("{}\n", key.to_hex()).as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(|e| io_err(&path, e))?;
        ignore_in_git(&dir, KEY_FILE)
    }
}
