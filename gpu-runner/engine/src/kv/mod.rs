//! The paged KV block manager with prefix caching — pure bookkeeping, no tensors.
//!
//! A backend owns a pool of `num_blocks` KV blocks of `block_size` positions each. This
//! module decides which physical block holds which positions of which sequence:
//!
//! - [`BlockManager`] keeps the free list, reference counts and the prefix cache: every FULL
//!   block is named by a chained hash (parent block's hash + its token ids), so sequences
//!   that share a prompt prefix share its blocks. A cached block whose last user went away
//!   stays reusable until it is evicted, least recently used first.
//! - [`BlockTable`] is one sequence's list of physical blocks, in position order.
//! - [`hash`] computes the chained block hashes.
//!
//! **Invariant:** a block is either referenced by ≥ 1 table (ref count > 0) or sits in the
//! free list (ref count 0), never both and never neither; the property test in
//! `block_manager` checks it after thousands of random operations.

mod block_manager;
mod block_table;
mod free_list;
pub mod hash;

pub use block_manager::{BlockManager, OutOfBlocks};
pub use block_table::BlockTable;
pub use hash::BlockHash;

/// How many blocks of `block_size` positions cover `num_tokens` positions.
pub fn blocks_needed(num_tokens: usize, block_size: usize) -> usize {
    num_tokens.div_ceil(block_size.max(1))
}
