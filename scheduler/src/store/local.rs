//! The local-directory object store: one file per object under a root directory. Writes
//! are atomic (stage in `<root>/.staging`, then rename), so a reader never sees half a file.

use super::{ObjectReader, StoreError};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalStore { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(super) fn staging_dir(&self) -> PathBuf {
        self.root.join(".staging")
    }

    pub(super) async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        let target = self.root.join(key);
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        let size = tokio::fs::metadata(path).await?.len();
        if tokio::fs::rename(path, &target).await.is_err() {
            // Another filesystem: copy to a sibling, then rename, so the object appears whole.
            let part = target.with_extension("part");
            tokio::fs::copy(path, &part).await?;
            tokio::fs::rename(&part, &target).await?;
            let _ = tokio::fs::remove_file(path).await;
        }
        Ok(size)
    }

    pub(super) async fn get(&self, key: &str) -> Result<ObjectReader, StoreError> {
        match tokio::fs::File::open(self.root.join(key)).await {
            Ok(file) => Ok(Box::pin(file)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(StoreError::NotFound(key.to_owned()))
            }
            Err(e) => Err(e.into()),
        }
    }

    pub(super) async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match tokio::fs::remove_file(self.root.join(key)).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
