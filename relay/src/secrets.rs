//! The secrets key: seals the owners' workflow secrets before they reach
//! the database, so that a backup of the database alone reveals none.
//!
//! The key is 32 random bytes, kept as hex in a file of its own
//! (`webhooks.secrets_key_file`; by default `relay-secrets.key` beside an
//! SQLite database, or in the working directory), created on first start
//! with mode 0600. Every relay process of one database needs the same file;
//! back it up apart from the database. Sealing is XChaCha20-Poly1305 with a
//! random 24-byte nonce, bound (associated data) to the community, workflow
//! and name, so a sealed value copied to another row does not open.

use std::io::Write;
use std::path::{Path, PathBuf};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

use crate::keys::open_private;

const NONCE_BYTES: usize = 24;

/// Why the key could not be had, or a secret not opened.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("secrets key file {path}: {error}")]
    File { path: PathBuf, error: String },
    #[error("a stored secret does not open with this relay's secrets key (another key file?)")]
    Unsealable,
}

/// The key that seals workflow secrets.
#[derive(Clone)]
pub struct SecretsKey {
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsKey(..)")
    }
}

impl SecretsKey {
    /// Reads the key file, or creates it (0600) when it does not exist. Two
    /// processes starting at once agree: the file appears whole or not at
    /// all (written aside, then linked into place, which fails if it exists).
    pub fn load_or_create(path: &Path) -> Result<SecretsKey, SecretsError> {
        let err = |e: &dyn std::fmt::Display| SecretsError::File {
            path: path.to_path_buf(),
            error: e.to_string(),
        };
        if !path.exists() {
            create(path).map_err(|e| err(&e))?;
        }
        let text = std::fs::read_to_string(path).map_err(|e| err(&e))?;
        let mut key = [0u8; 32];
        hex::decode_to_slice(text.trim(), &mut key).map_err(|_| err(&"must hold 64 hex characters"))?;
        Ok(SecretsKey {
            cipher: XChaCha20Poly1305::new(&key.into()),
        })
    }

    /// Seals `value` for (community, workflow, name).
    pub fn seal(&self, value: &[u8], community: &str, workflow: &str, name: &str) -> Vec<u8> {
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let aad = associated(community, workflow, name);
        let sealed = self
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: value,
                    aad: &aad,
                },
            )
            .expect("XChaCha20-Poly1305 seals any length this relay accepts");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        out
    }

    /// Opens what [`SecretsKey::seal`] made for the same (community, workflow, name).
    pub fn open(
        &self,
        sealed: &[u8],
        community: &str,
        workflow: &str,
        name: &str,
    ) -> Result<Vec<u8>, SecretsError> {
        if sealed.len() < NONCE_BYTES {
            return Err(SecretsError::Unsealable);
        }
        let (nonce, body) = sealed.split_at(NONCE_BYTES);
        let aad = associated(community, workflow, name);
        self.cipher
            .decrypt(XNonce::from_slice(nonce), Payload { msg: body, aad: &aad })
            .map_err(|_| SecretsError::Unsealable)
    }
}

fn associated(community: &str, workflow: &str, name: &str) -> Vec<u8> {
    [community, workflow, name].join("\0").into_bytes()
}

fn create(path: &Path) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let aside = dir.join(format!(".{}.{}", std::process::id(), rand::random::<u64>()));
    let mut file = open_private(&aside)?;
    let key: [u8; 32] = rand::random();
    file.write_all(hex::encode(key).as_bytes())?;
    file.sync_all()?;
    let linked = std::fs::hard_link(&aside, path);
    let _ = std::fs::remove_file(&aside);
    match linked {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_and_opens_only_for_the_same_row_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = SecretsKey::load_or_create(&path).unwrap();
        let again = SecretsKey::load_or_create(&path).unwrap();
        let sealed = key.seal(b"hunter2", "c", "w", "n");
        assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(again.open(&sealed, "c", "w", "n").unwrap(), b"hunter2");
        assert!(key.open(&sealed, "c", "w", "other").is_err());
        assert!(key.open(&sealed, "c", "w2", "n").is_err());
        let other = SecretsKey::load_or_create(&dir.path().join("k2")).unwrap();
        assert!(other.open(&sealed, "c", "w", "n").is_err());
        assert_ne!(key.seal(b"x", "c", "w", "n"), key.seal(b"x", "c", "w", "n"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
