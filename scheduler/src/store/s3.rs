//! The S3 object store (AWS or any S3-compatible server: MinIO, Ceph, moto …) through
//! `aws-sdk-s3`, the field's standard client. Credentials come from the usual AWS chain
//! (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, profiles, instance roles); endpoint, region
//! and path-style addressing are configurable for non-AWS servers. Uploads stream from the
//! staged file (`ByteStream::from_path`), downloads stream the response body.
//!
//! Uploads are staged in a directory of this process's own, mode 0700, never in a shared
//! `/tmp` path: another local user could otherwise read tenants' files or plant a link.

use super::{ObjectReader, StoreError};
use crate::error::describe;
use aws_config::BehaviorVersion;
use aws_sdk_s3::primitives::ByteStream;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the bucket is and how to address it.
#[derive(Clone, Debug, Default)]
pub struct S3Config {
    pub bucket: String,
    /// Prepended to every key (e.g. `fallow/`); may be empty.
    pub prefix: String,
    /// A non-AWS endpoint such as `http://127.0.0.1:9000`.
    pub endpoint: Option<String>,
    /// Falls back to the AWS chain (`AWS_REGION`), then `us-east-1`.
    pub region: Option<String>,
    /// `http://host/bucket/key` instead of `http://bucket.host/key` (MinIO and most
    /// S3-compatible servers need it).
    pub force_path_style: bool,
}

#[derive(Clone, Debug)]
pub struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
    staging: Arc<PrivateDir>,
}

impl S3Store {
    /// Builds the client from the AWS environment plus `config`, and creates the private
    /// staging directory. Makes no request.
    pub async fn connect(config: S3Config) -> Result<Self, StoreError> {
        let staging = Arc::new(PrivateDir::create()?);
        // rustls with ring: no C toolchain beyond ring's, and no second TLS stack.
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(http);
        if let Some(region) = config.region.clone() {
            loader = loader.region(aws_config::Region::new(region));
        }
        let shared = loader.load().await;
        let mut builder =
            aws_sdk_s3::config::Builder::from(&shared).force_path_style(config.force_path_style);
        if shared.region().is_none() {
            builder = builder.region(aws_config::Region::new("us-east-1"));
        }
        if let Some(endpoint) = &config.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        Ok(S3Store {
            client: aws_sdk_s3::Client::from_conf(builder.build()),
            bucket: config.bucket,
            prefix: config.prefix,
            staging,
        })
    }

    /// Where uploads are staged before they are streamed to the bucket.
    pub(super) fn staging_dir(&self) -> PathBuf {
        self.staging.0.clone()
    }

    /// Creates the bucket unless it exists (local set-ups and tests; deployments usually
    /// provision buckets themselves).
    pub async fn ensure_bucket(&self) -> Result<(), StoreError> {
        if self
            .client
            .head_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .is_ok()
        {
            return Ok(());
        }
        self.client
            .create_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .map_err(|e| StoreError::S3(describe(&e)))?;
        Ok(())
    }

    fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub(super) async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        let size = tokio::fs::metadata(path).await?.len();
        let body = ByteStream::from_path(path)
            .await
            .map_err(|e| StoreError::S3(format!("reading {}: {e}", path.display())))?;
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .content_length(i64::try_from(size).unwrap_or(i64::MAX))
            .body(body)
            .send()
            .await
            .map_err(|e| StoreError::S3(describe(&e)))?;
        let _ = tokio::fs::remove_file(path).await;
        Ok(size)
    }

    pub(super) async fn get(&self, key: &str) -> Result<ObjectReader, StoreError> {
        let result = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .send()
            .await;
        match result {
            Ok(out) => Ok(Box::pin(out.body.into_async_read())),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => {
                Err(StoreError::NotFound(key.to_owned()))
            }
            Err(e) => Err(StoreError::S3(describe(&e))),
        }
    }

    pub(super) async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .send()
            .await
            .map_err(|e| StoreError::S3(describe(&e)))?;
        Ok(())
    }
}

/// A directory only this user may enter, removed when the last clone of the store goes.
#[derive(Debug)]
struct PrivateDir(PathBuf);

impl PrivateDir {
    /// `<tmp>/fallow-staging-<pid>-<random>`, created with mode 0700. Creation fails rather
    /// than reuse a path that exists, so nobody can plant the directory (or a link) first.
    fn create() -> Result<Self, StoreError> {
        let path = std::env::temp_dir().join(format!(
            "fallow-staging-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(&path)?;
        Ok(PrivateDir(path))
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        // Best effort: staged files are removed as they are uploaded.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_are_staged_in_a_private_directory_removed_with_the_store() {
        let dir = PrivateDir::create().expect("created");
        let path = dir.0.clone();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path)
                .expect("exists")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700);
        }
        assert_ne!(
            path,
            PrivateDir::create().expect("another").0,
            "one per store"
        );
        drop(dir);
        assert!(!path.exists());
    }
}
