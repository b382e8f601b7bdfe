//! The object store holding file contents (batch inputs, outputs and error files): a local
//! directory by default, S3 (or any S3-compatible server) for deployments. Bytes always move
//! as streams — uploads come from a staged file on disk, downloads are `AsyncRead`s — so a
//! 200 MB file is never held whole in memory.
//!
//! Keys are plain relative paths (`files/<uuid>`); the store never interprets them beyond
//! refusing `..` and absolute paths.

mod local;
mod s3;

pub use local::LocalStore;
pub use s3::{S3Config, S3Store};

use std::path::{Path, PathBuf};
use std::pin::Pin;
use tokio::io::AsyncRead;

/// A download: the object's bytes as a stream.
pub type ObjectReader = Pin<Box<dyn AsyncRead + Send>>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("object `{0}` not found")]
    NotFound(String),
    #[error("invalid object key `{0}`")]
    InvalidKey(String),
    #[error("object store I/O failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("S3 request failed: {0}")]
    S3(String),
}

/// Where file contents live.
#[derive(Clone, Debug)]
pub enum ObjectStore {
    Local(LocalStore),
    S3(S3Store),
}

impl ObjectStore {
    /// Stores the staged file at `path` under `key` (moving or streaming it); returns its size.
    pub async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        check_key(key)?;
        match self {
            ObjectStore::Local(s) => s.put_file(key, path).await,
            ObjectStore::S3(s) => s.put_file(key, path).await,
        }
    }

    /// The object's bytes as a stream.
    pub async fn get(&self, key: &str) -> Result<ObjectReader, StoreError> {
        check_key(key)?;
        match self {
            ObjectStore::Local(s) => s.get(key).await,
            ObjectStore::S3(s) => s.get(key).await,
        }
    }

    /// Removes the object; removing a missing object is not an error (deletes are retried).
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        check_key(key)?;
        match self {
            ObjectStore::Local(s) => s.delete(key).await,
            ObjectStore::S3(s) => s.delete(key).await,
        }
    }

    /// A directory for staging files before `put_file`. For the local store it is inside
    /// the store's root, so that `put_file` is a rename rather than a copy; for S3 it is the
    /// store's private directory (mode 0700).
    pub fn staging_dir(&self) -> PathBuf {
        match self {
            ObjectStore::Local(s) => s.staging_dir(),
            ObjectStore::S3(s) => s.staging_dir(),
        }
    }

    /// A fresh staged-file path (its directory created).
    pub async fn staging_path(&self) -> Result<PathBuf, StoreError> {
        let dir = self.staging_dir();
        tokio::fs::create_dir_all(&dir).await?;
        Ok(dir.join(format!("{}.part", uuid::Uuid::new_v4().simple())))
    }
}

/// A staged file that is deleted when dropped unless it was moved away.
pub struct StagedFile {
    pub path: PathBuf,
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        // Best effort: after a successful local `put_file` the file is gone already.
        let _ = std::fs::remove_file(&self.path);
    }
}

fn check_key(key: &str) -> Result<(), StoreError> {
    let bad = key.is_empty()
        || key.starts_with('/')
        || key.contains('\\')
        || key
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..");
    if bad {
        return Err(StoreError::InvalidKey(key.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_could_escape_the_store_are_refused() {
        for key in ["", "/etc/passwd", "a/../b", "a//b", "./a", "a\\b"] {
            assert!(check_key(key).is_err(), "{key:?} should be refused");
        }
        assert!(check_key("files/0123").is_ok());
    }
}
