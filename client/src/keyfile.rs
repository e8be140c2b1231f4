//! Secret key files: a key is read from an environment variable when it
//! is set, else from a file (hex or `nsec`, surrounding whitespace
//! ignored); a new key file is created 0600 and never over an existing
//! file.

use std::io::Write;
use std::path::Path;

use nostr::prelude::Keys;

/// Why no key could be read or written.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Neither the variable nor a file was given.
    #[error("no key: give a key file or set {0}")]
    Missing(String),
    #[error("reading the key file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("the key is neither 64 hex characters nor an nsec")]
    Malformed,
    #[error("creating {path} (it must not exist yet): {source}")]
    Create { path: String, source: std::io::Error },
}

/// The key in `env_var` when it is set and not blank, else the one in
/// `file`.
pub fn load(env_var: &str, file: Option<&Path>) -> Result<Keys, KeyError> {
    let text = match std::env::var(env_var) {
        Ok(k) if !k.trim().is_empty() => k,
        _ => {
            let path = file.ok_or_else(|| KeyError::Missing(env_var.to_string()))?;
            std::fs::read_to_string(path).map_err(|source| KeyError::Read {
                path: path.display().to_string(),
                source,
            })?
        }
    };
    Keys::parse(text.trim()).map_err(|_| KeyError::Malformed)
}

/// A new key written to `path` (hex, one line), readable by its owner
/// only; refuses to replace a file that exists.
pub fn create(path: &Path) -> Result<Keys, KeyError> {
    let keys = Keys::generate();
    write_new(path, &format!("{}\n", keys.secret_key().to_secret_hex())).map_err(|source| {
        KeyError::Create {
            path: path.display().to_string(),
            source,
        }
    })?;
    Ok(keys)
}

/// Writes `text` to a file that must not exist yet, mode 0600 on Unix.
pub fn write_new(path: &Path, text: &str) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_file_is_private_and_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.key");
        let keys = create(&path).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(matches!(create(&path), Err(KeyError::Create { .. })));
        let read = load("CLIENT_TEST_KEY_UNSET", Some(&path)).unwrap();
        assert_eq!(read.public_key(), keys.public_key());
    }

    #[test]
    fn a_key_is_required_and_must_parse() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            load("CLIENT_TEST_KEY_UNSET", None),
            Err(KeyError::Missing(_))
        ));
        let bad = dir.path().join("bad.key");
        std::fs::write(&bad, "not a key").unwrap();
        assert!(matches!(
            load("CLIENT_TEST_KEY_UNSET", Some(&bad)),
            Err(KeyError::Malformed)
        ));
    }
}
