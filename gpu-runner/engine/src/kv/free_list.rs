//! The ordered set of blocks nobody references: allocation takes from the front, so
//! uncached blocks (pushed to the front) go first and cached ones (pushed to the back) are
//! evicted least recently freed first.

use std::collections::BTreeMap;

/// Free blocks in eviction order. Keys are stamps: the front counter counts down and the
/// back counter up, so `BTreeMap` order is eviction order and removal of a block that gets
/// reused from the cache is O(log n).
#[derive(Debug)]
pub(super) struct FreeList {
    order: BTreeMap<i64, u32>,
    /// `stamp[block]` = its key in `order` while free.
    stamp: Vec<Option<i64>>,
    next_front: i64,
    next_back: i64,
}

impl FreeList {
    /// All `num_blocks` blocks free, in id order.
    pub(super) fn full(num_blocks: usize) -> Self {
        let mut list = FreeList {
            order: BTreeMap::new(),
            stamp: vec![None; num_blocks],
            next_front: -1,
            next_back: 0,
        };
        for id in 0..num_blocks {
            list.push_back(id as u32);
        }
        list
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    pub(super) fn contains(&self, block: u32) -> bool {
        self.stamp.get(block as usize).is_some_and(|s| s.is_some())
    }

    pub(super) fn push_front(&mut self, block: u32) {
        let key = self.next_front;
        self.next_front -= 1;
        self.insert(block, key);
    }

    pub(super) fn push_back(&mut self, block: u32) {
        let key = self.next_back;
        self.next_back += 1;
        self.insert(block, key);
    }

    fn insert(&mut self, block: u32, key: i64) {
        debug_assert!(!self.contains(block), "block {block} freed twice");
        self.order.insert(key, block);
        self.stamp[block as usize] = Some(key);
    }

    pub(super) fn pop_front(&mut self) -> Option<u32> {
        let (_, block) = self.order.pop_first()?;
        self.stamp[block as usize] = None;
        Some(block)
    }

    /// Takes a specific block out (a cache hit on a block nobody referenced).
    pub(super) fn remove(&mut self, block: u32) -> bool {
        match self.stamp.get_mut(block as usize).and_then(Option::take) {
            Some(key) => self.order.remove(&key).is_some(),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_pushes_are_taken_before_back_pushes() {
        let mut list = FreeList::full(0);
        list.stamp = vec![None; 3];
        list.push_back(0);
        list.push_front(1);
        list.push_back(2);
        assert_eq!(list.pop_front(), Some(1));
        assert_eq!(list.pop_front(), Some(0));
        assert!(list.remove(2));
        assert_eq!(list.pop_front(), None);
    }
}
