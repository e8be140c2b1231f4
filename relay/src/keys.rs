//! Where each community's signing key lives: in the database (the
//! zero-config default), or in a key file outside it, so that a backup of
//! the database alone holds no secret key.
//!
//! With `keys_dir` set, a community's key is the file
//! `<keys_dir>/<community id>.key` (the secret key in hex or `nsec`, one
//! line, created with mode 0600), and the database keeps only the marker
//! `file:<public key hex>`, which the file's key must match. A community
//! whose key cannot be loaded is not served: `relay serve` refuses to
//! start, naming the community and the file.

use std::io::Write;
use std::path::{Path, PathBuf};

use nostr::prelude::{Keys, SecretKey};

use crate::store::CommunityRecord;

/// The stored value's prefix for a key kept in a file.
const FILE_MARKER: &str = "file:";

/// Why a community's key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("community {id}: its key is kept in a file, but keys_dir is not configured")]
    NoKeysDir { id: String },
    #[error("community {id}: cannot read its key file {path}: {source}")]
    Read {
        id: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("community {id}: the key in {path} is not a secret key (hex or nsec)")]
    Malformed { id: String, path: PathBuf },
    #[error("community {id}: the key in {path} is not the community's (its public key is {expected})")]
    Mismatch {
        id: String,
        path: PathBuf,
        expected: String,
    },
    #[error("community {id}: the stored key is not valid: {why}")]
    Stored { id: String, why: String },
    #[error("community {id}: cannot write its key file {path}: {source}")]
    Write {
        id: String,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The key file of community `id` under `dir`.
pub fn key_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.key"))
}

/// Whether the record's key is kept outside the database.
pub fn is_external(record: &CommunityRecord) -> bool {
    record.secret_key_hex.starts_with(FILE_MARKER)
}

/// The community's public key as stored (without reading a key file).
pub fn public_key_hex(record: &CommunityRecord) -> Result<String, KeyError> {
    match record.secret_key_hex.strip_prefix(FILE_MARKER) {
        Some(pk) => Ok(pk.to_string()),
        None => Ok(load(record, None)?.public_key().to_hex()),
    }
}

/// The signing keys of a community as stored (`keys_dir`: where key
/// files are).
pub fn load(record: &CommunityRecord, keys_dir: Option<&Path>) -> Result<Keys, KeyError> {
    let id = record.id.clone();
    let Some(expected) = record.secret_key_hex.strip_prefix(FILE_MARKER) else {
        let sk = SecretKey::from_hex(&record.secret_key_hex).map_err(|e| KeyError::Stored {
            id,
            why: e.to_string(),
        })?;
        return Ok(Keys::new(sk));
    };
    let dir = keys_dir.ok_or_else(|| KeyError::NoKeysDir { id: id.clone() })?;
    let path = key_path(dir, &record.id);
    let text = std::fs::read_to_string(&path).map_err(|source| KeyError::Read {
        id: id.clone(),
        path: path.clone(),
        source,
    })?;
    let keys = Keys::parse(text.trim()).map_err(|_| KeyError::Malformed {
        id: id.clone(),
        path: path.clone(),
    })?;
    if keys.public_key().to_hex() != expected {
        return Err(KeyError::Mismatch {
            id,
            path,
            expected: expected.to_string(),
        });
    }
    Ok(keys)
}

/// Moves a record's key (held in the record) into its key file under
/// `dir` and leaves the marker in its place. A file already there with
/// the same key is kept (running this twice is harmless); one with
/// another key is an error, never overwritten.
pub fn move_out(record: &mut CommunityRecord, dir: &Path) -> Result<(), KeyError> {
    if is_external(record) {
        return Ok(());
    }
    let keys = load(record, None)?;
    let path = key_path(dir, &record.id);
    let write_err = |source| KeyError::Write {
        id: record.id.clone(),
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(existing) => {
            if Keys::parse(existing.trim()).ok().map(|k| k.public_key()) != Some(keys.public_key()) {
                return Err(KeyError::Mismatch {
                    id: record.id.clone(),
                    path,
                    expected: keys.public_key().to_hex(),
                });
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            write_new(&path, &keys.secret_key().to_secret_hex()).map_err(write_err)?;
        }
        Err(e) => return Err(write_err(e)),
    }
    record.secret_key_hex = format!("{FILE_MARKER}{}", keys.public_key().to_hex());
    Ok(())
}

/// Creates `path`, readable by its owner only (0600 on Unix), refusing
/// one already there: the relay's one way to write a secret to disk.
pub(crate) fn open_private(path: &Path) -> std::io::Result<std::fs::File> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts.open(path)
}

/// Creates `path` readable by its owner only, with `secret` and a newline,
/// synced to disk (the file and its directory entry) before the database is
/// told the key is there. A missing keys directory is created, readable by
/// its owner only (0700 on Unix): a packaged relay's first start makes it.
fn write_new(path: &Path, secret: &str) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        builder.create(dir)?;
    }
    let mut f = open_private(path)?;
    f.write_all(secret.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    #[cfg(unix)]
    if let Some(dir) = dir {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> CommunityRecord {
        CommunityRecord {
            id: id.into(),
            relay_url: "ws://x".into(),
            secret_key_hex: Keys::generate().secret_key().to_secret_hex(),
            hosts: vec!["x".into()],
        }
    }

    #[test]
    fn keys_move_out_and_load_back_only_when_they_match() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = record("c1");
        let before = load(&r, None).unwrap().public_key();
        move_out(&mut r, dir.path()).unwrap();
        assert!(is_external(&r));
        assert_eq!(load(&r, Some(dir.path())).unwrap().public_key(), before);
        // Again: harmless.
        move_out(&mut r, dir.path()).unwrap();
        // Without the directory, or with another key in the file: refused.
        assert!(matches!(load(&r, None), Err(KeyError::NoKeysDir { .. })));
        std::fs::write(
            key_path(dir.path(), "c1"),
            Keys::generate().secret_key().to_secret_hex(),
        )
        .unwrap();
        assert!(matches!(
            load(&r, Some(dir.path())),
            Err(KeyError::Mismatch { .. })
        ));
        // A file with another key is never overwritten.
        let mut other = record("c1");
        assert!(matches!(
            move_out(&mut other, dir.path()),
            Err(KeyError::Mismatch { .. })
        ));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mut r2 = record("c2");
            move_out(&mut r2, dir.path()).unwrap();
            let mode = std::fs::metadata(key_path(dir.path(), "c2"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_missing_keys_dir_is_made_for_its_owner_only() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("state").join("keys");
        let mut r = record("c1");
        let before = load(&r, None).unwrap().public_key();
        move_out(&mut r, &dir).unwrap();
        assert_eq!(load(&r, Some(&dir)).unwrap().public_key(), before);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
    }
}
