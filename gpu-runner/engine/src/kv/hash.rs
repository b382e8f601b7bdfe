//! Chained hashes naming full KV blocks: a block's hash covers its own token ids and its
//! parent's hash, so equal hashes mean (up to a 64-bit collision) equal whole prefixes.

use std::hash::{Hash, Hasher};

/// The hash of a full block and, through its parent, of everything before it.
pub type BlockHash = u64;

/// Hashes one full block given its parent's hash (`None` for the first block).
///
/// `DefaultHasher::new()` uses fixed keys, so hashes are stable within a process, which is
/// all the prefix cache needs (nothing is persisted).
pub fn block_hash(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut hasher = std::hash::DefaultHasher::new();
    parent.hash(&mut hasher);
    tokens.hash(&mut hasher);
    hasher.finish()
}

/// The root of a namespace's chain (a LoRA adapter's, by its id): its blocks hash apart
/// from the base model's and every other namespace's.
pub fn namespace_root(id: u64) -> BlockHash {
    let mut hasher = std::hash::DefaultHasher::new();
    "fallow-kv-namespace".hash(&mut hasher);
    id.hash(&mut hasher);
    hasher.finish()
}

/// The root of a namespace no other sequence shares: for a sequence that must run every
/// one of its own tokens (`return_routed_experts` records what each token did).
pub fn private_namespace(seq: u64) -> BlockHash {
    let mut hasher = std::hash::DefaultHasher::new();
    "fallow-kv-private".hash(&mut hasher);
    seq.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_blocks_with_equal_parents_hash_equal() {
        assert_eq!(
            block_hash(Some(7), &[1, 2, 3]),
            block_hash(Some(7), &[1, 2, 3])
        );
    }

    #[test]
    fn a_namespace_changes_every_block_hash() {
        let (a, b) = (namespace_root(1), namespace_root(2));
        assert_ne!(a, b);
        assert_ne!(block_hash(None, &[1, 2]), block_hash(Some(a), &[1, 2]));
        assert_ne!(block_hash(Some(a), &[1, 2]), block_hash(Some(b), &[1, 2]));
    }

    #[test]
    fn the_parent_changes_the_hash() {
        assert_ne!(
            block_hash(Some(7), &[1, 2, 3]),
            block_hash(Some(8), &[1, 2, 3])
        );
        assert_ne!(
            block_hash(None, &[1, 2, 3]),
            block_hash(Some(0), &[1, 2, 3])
        );
    }
}
