use super::*;

fn tokens(n: usize, offset: u32) -> Vec<u32> {
    (0..n as u32).map(|t| t + offset).collect()
}

/// Allocates, "computes" and commits a whole prompt, as the batcher would.
fn admit(manager: &mut BlockManager, prompt: &[u32]) -> (BlockTable, usize) {
    let mut table = BlockTable::new();
    let cached = manager.match_prefix(&mut table, prompt);
    manager.allocate_slots(&mut table, prompt.len()).unwrap();
    manager.commit_full_blocks(&mut table, prompt);
    (table, cached)
}

#[test]
fn a_second_prompt_with_the_same_prefix_shares_its_full_blocks() {
    let mut manager = BlockManager::new(16, 4, true);
    let prompt = tokens(10, 100);
    let (first, cached_first) = admit(&mut manager, &prompt);
    let (second, cached_second) = admit(&mut manager, &prompt);
    assert_eq!(cached_first, 0);
    assert_eq!(cached_second, 8, "two full blocks of 4 are shared");
    assert_eq!(first.blocks()[..2], second.blocks()[..2]);
    assert_ne!(
        first.blocks()[2],
        second.blocks()[2],
        "the partial tail is private"
    );
    manager.check_consistency([&first, &second]).unwrap();
}

#[test]
fn the_last_prompt_token_is_never_served_from_the_cache() {
    let mut manager = BlockManager::new(16, 4, true);
    let prompt = tokens(8, 0);
    let (mut first, _) = admit(&mut manager, &prompt);
    manager.free(&mut first);
    let (second, cached) = admit(&mut manager, &prompt);
    assert_eq!(
        cached, 4,
        "8 tokens = 2 full blocks, but the last token must run"
    );
    manager.check_consistency([&second]).unwrap();
}

#[test]
fn freed_cached_blocks_stay_reusable_until_evicted() {
    let mut manager = BlockManager::new(4, 4, true);
    let prompt = tokens(9, 0);
    let (mut first, _) = admit(&mut manager, &prompt);
    manager.free(&mut first);
    assert_eq!(manager.num_free_blocks(), 4);
    let (mut again, cached) = admit(&mut manager, &prompt);
    assert_eq!(cached, 8);
    manager.free(&mut again);
    // A different prompt needing all 4 blocks evicts the cached ones.
    let (mut other, cached) = admit(&mut manager, &tokens(16, 500));
    assert_eq!(cached, 0);
    manager.free(&mut other);
    let (third, cached) = admit(&mut manager, &prompt);
    assert_eq!(cached, 0, "evicted blocks no longer hit");
    manager.check_consistency([&third]).unwrap();
}

#[test]
fn uncached_blocks_are_reused_before_cached_ones_are_evicted() {
    let mut manager = BlockManager::new(4, 4, true);
    let (mut cached_one, _) = admit(&mut manager, &tokens(5, 0)); // 1 full + 1 partial
    manager.free(&mut cached_one);
    // Two blocks are needed: the partial (uncached) one and a never-used one go first.
    let (mut other, _) = admit(&mut manager, &tokens(6, 900));
    let (hit, cached) = admit(&mut manager, &tokens(5, 0));
    assert_eq!(cached, 4);
    manager.free(&mut other);
    manager.check_consistency([&hit]).unwrap();
}

#[test]
fn allocation_is_all_or_nothing() {
    let mut manager = BlockManager::new(3, 4, false);
    let mut table = BlockTable::new();
    let err = manager.allocate_slots(&mut table, 13).unwrap_err();
    assert_eq!(err, OutOfBlocks { needed: 4, free: 3 });
    assert!(table.is_empty());
    assert_eq!(manager.num_free_blocks(), 3);
}

#[test]
fn freeing_twice_is_harmless() {
    let mut manager = BlockManager::new(4, 4, true);
    let (mut table, _) = admit(&mut manager, &tokens(7, 0));
    manager.free(&mut table);
    manager.free(&mut table);
    assert_eq!(manager.num_free_blocks(), 4);
    manager.check_consistency([]).unwrap();
}

#[test]
fn with_the_prefix_cache_off_nothing_is_shared() {
    let mut manager = BlockManager::new(8, 4, false);
    let prompt = tokens(9, 0);
    let (first, _) = admit(&mut manager, &prompt);
    let (second, cached) = admit(&mut manager, &prompt);
    assert_eq!(cached, 0);
    assert!(first.blocks().iter().all(|b| !second.blocks().contains(b)));
}

#[test]
fn usage_counts_referenced_blocks() {
    let mut manager = BlockManager::new(4, 4, true);
    let (mut table, _) = admit(&mut manager, &tokens(8, 0));
    assert!((manager.usage() - 0.5).abs() < 1e-6);
    manager.free(&mut table);
    assert_eq!(manager.usage(), 0.0);
}
