//! The object store, local and S3 (a real moto server): streamed round trips of a file far
//! larger than any buffer, deletes, and missing objects.

mod batch_support;

use fallow_scheduler::store::{LocalStore, ObjectStore, StoreError};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Writes a ~24 MB staged file in 64 KiB pieces; returns its path, size and hash.
async fn staged_file(store: &ObjectStore) -> (std::path::PathBuf, u64, Vec<u8>) {
    let path = store.staging_path().await.unwrap();
    let mut file = tokio::fs::File::create(&path).await.unwrap();
    let mut hash = Sha256::new();
    let mut size = 0u64;
    for i in 0..384u32 {
        let chunk: Vec<u8> = (0..65_536u32)
            .map(|j| (i.wrapping_mul(31) ^ j) as u8)
            .collect();
        hash.update(&chunk);
        file.write_all(&chunk).await.unwrap();
        size += chunk.len() as u64;
    }
    file.sync_all().await.unwrap();
    (path, size, hash.finalize().to_vec())
}

/// Reads the object back in 64 KiB reads, hashing as it goes.
async fn read_back(store: &ObjectStore, key: &str) -> (u64, Vec<u8>) {
    let mut reader = store.get(key).await.unwrap();
    let mut buf = vec![0u8; 65_536];
    let (mut hash, mut size) = (Sha256::new(), 0u64);
    loop {
        let n = reader.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        size += n as u64;
    }
    (size, hash.finalize().to_vec())
}

async fn round_trip(store: ObjectStore) {
    let (path, size, hash) = staged_file(&store).await;
    let stored = store.put_file("files/big", &path).await.unwrap();
    assert_eq!(stored, size);
    assert_eq!(read_back(&store, "files/big").await, (size, hash));
    store.delete("files/big").await.unwrap();
    assert!(matches!(
        store.get("files/big").await,
        Err(StoreError::NotFound(_))
    ));
    // Deleting again is not an error: deletes are retried after crashes.
    store.delete("files/big").await.unwrap();
}

#[tokio::test]
async fn a_large_file_round_trips_through_the_local_store_as_a_stream() {
    let dir = tempfile::tempdir().unwrap();
    round_trip(ObjectStore::Local(LocalStore::new(dir.path()))).await;
}

#[tokio::test]
async fn a_large_file_round_trips_through_s3_as_a_stream() {
    let Some(moto) = batch_support::start_moto() else {
        return;
    };
    let store = batch_support::s3_store(&moto).await;
    round_trip(ObjectStore::S3(store)).await;
}

#[tokio::test]
async fn a_missing_object_is_reported_as_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let store = ObjectStore::Local(LocalStore::new(dir.path()));
    assert!(matches!(
        store.get("files/nope").await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.get("../etc/passwd").await,
        Err(StoreError::InvalidKey(_))
    ));
}
