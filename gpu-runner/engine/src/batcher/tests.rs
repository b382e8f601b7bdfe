use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

fn batcher(num_blocks: usize, block_size: usize, max_seqs: usize, budget: usize) -> Batcher {
    Batcher::new(
        BatcherConfig {
            max_num_seqs: max_seqs,
            max_batched_tokens: budget,
        },
        BlockManager::new(num_blocks, block_size, true),
    )
}

fn prompt(len: usize, offset: u32) -> Vec<u32> {
    (0..len as u32).map(|t| t + offset).collect()
}

/// Runs one step as the engine would: every sequence that gets logits gains a token.
fn run_step(b: &mut Batcher) -> ScheduledStep {
    let step = b.schedule();
    b.complete_step(&step);
    for entry in step.seqs.iter().filter(|e| e.wants_logits) {
        b.append_token(entry.seq_id, 7).unwrap();
    }
    b.check_consistency().unwrap();
    step
}

fn entry(step: &ScheduledStep, id: SeqId) -> Option<ScheduledSeq> {
    step.seqs.iter().copied().find(|e| e.seq_id == id)
}

#[test]
fn a_long_prompt_is_chunked_while_running_decodes_continue() {
    let mut b = batcher(64, 4, 8, 8);
    b.add(1, prompt(3, 0), 40, 0, 0).unwrap();
    run_step(&mut b);
    b.add(2, prompt(20, 100), 40, 0, 1).unwrap();
    let mut chunks = Vec::new();
    for _ in 0..3 {
        let step = run_step(&mut b);
        let decode = entry(&step, 1).unwrap();
        assert_eq!(decode.num_tokens(), 1, "the decode runs every step");
        assert_eq!(step.seqs[0].seq_id, 1, "decodes are scheduled first");
        assert!(step.num_tokens() <= 8);
        chunks.push(entry(&step, 2).unwrap());
    }
    assert_eq!(
        chunks
            .iter()
            .map(|c| (c.start, c.end, c.wants_logits))
            .collect::<Vec<_>>(),
        vec![(0, 7, false), (7, 14, false), (14, 20, true)]
    );
}

#[test]
fn a_shared_prompt_prefix_is_served_from_the_cache() {
    let mut b = batcher(64, 4, 8, 64);
    b.add(1, prompt(16, 0), 40, 0, 0).unwrap();
    run_step(&mut b);
    let mut longer = prompt(16, 0);
    longer.extend([90, 91, 92, 93]);
    b.add(2, longer, 40, 0, 1).unwrap();
    let step = run_step(&mut b);
    assert_eq!(b.cached_prompt_tokens(2), Some(16));
    let second = entry(&step, 2).unwrap();
    assert_eq!((second.start, second.end), (16, 20));
    assert_eq!(
        b.block_table(1).unwrap()[..4],
        b.block_table(2).unwrap()[..4]
    );
}

#[test]
fn a_prefix_is_shared_only_within_its_namespace() {
    use crate::kv::hash::namespace_root;
    let mut b = batcher(64, 4, 8, 64);
    let (first, second) = (Some(namespace_root(1)), Some(namespace_root(2)));
    b.add(1, prompt(17, 0), 40, 0, 0).unwrap();
    b.add_in(2, prompt(17, 0), 40, 0, 1, first).unwrap();
    run_step(&mut b);
    b.add(3, prompt(17, 0), 40, 0, 2).unwrap();
    b.add_in(4, prompt(17, 0), 40, 0, 3, first).unwrap();
    b.add_in(5, prompt(17, 0), 40, 0, 4, second).unwrap();
    run_step(&mut b);
    assert_eq!(
        b.cached_prompt_tokens(2),
        Some(0),
        "not from the base's blocks"
    );
    assert_eq!(
        b.cached_prompt_tokens(3),
        Some(16),
        "the base from the base"
    );
    assert_eq!(
        b.cached_prompt_tokens(4),
        Some(16),
        "an adapter from its own"
    );
    assert_eq!(
        b.cached_prompt_tokens(5),
        Some(0),
        "not from another adapter's"
    );
    assert_eq!(
        b.block_table(2).unwrap()[..4],
        b.block_table(4).unwrap()[..4]
    );
    b.check_consistency().unwrap();
}

#[test]
fn running_out_of_blocks_preempts_the_youngest_which_later_recovers() {
    // 6 blocks of 4: two sequences of 8 tokens fill 3 blocks each at 12 tokens; the next
    // block either needs goes to the older one.
    let mut b = batcher(6, 4, 8, 64);
    b.add(1, prompt(8, 0), 24, 0, 0).unwrap();
    b.add(2, prompt(8, 50), 24, 0, 1).unwrap();
    run_step(&mut b);
    let mut preempted = false;
    for _ in 0..16 {
        let step = run_step(&mut b);
        preempted |= step.preempted.contains(&2);
        assert!(
            !step.preempted.contains(&1),
            "the older sequence is never the victim"
        );
        if b.tokens(1).is_some_and(|t| t.len() >= 20) {
            b.finish(1);
        }
    }
    assert!(preempted);
    assert_eq!(b.num_preemptions(2), Some(1));
    let tokens = b.tokens(2).unwrap();
    assert_eq!(
        tokens[..8],
        prompt(8, 50)[..],
        "the prompt survives preemption"
    );
    assert!(
        tokens.len() > 12,
        "the preempted sequence kept generating after recompute"
    );
}

#[test]
fn lower_priority_values_are_admitted_first() {
    let mut b = batcher(64, 4, 1, 64);
    b.add(1, prompt(4, 0), 8, 5, 0).unwrap();
    b.add(2, prompt(4, 10), 8, 1, 1).unwrap();
    b.add(3, prompt(4, 20), 8, 1, 2).unwrap();
    let order: Vec<SeqId> = (0..3)
        .map(|_| {
            let step = run_step(&mut b);
            let id = step.seqs[0].seq_id;
            b.finish(id);
            id
        })
        .collect();
    assert_eq!(order, vec![2, 3, 1], "priority first, then arrival");
}

#[test]
fn a_more_urgent_request_preempts_a_less_urgent_running_one() {
    let mut b = batcher(64, 4, 1, 64);
    b.add(1, prompt(4, 0), 16, 5, 0).unwrap();
    run_step(&mut b);
    b.add(2, prompt(4, 10), 16, 0, 1).unwrap();
    let step = run_step(&mut b);
    assert_eq!(step.preempted, vec![1]);
    assert_eq!(
        step.seqs.iter().map(|e| e.seq_id).collect::<Vec<_>>(),
        vec![2]
    );
    // Equal priority does not preempt: a later arrival waits.
    b.add(3, prompt(4, 20), 16, 0, 2).unwrap();
    let step = run_step(&mut b);
    assert!(step.preempted.is_empty());
    assert!(entry(&step, 3).is_none());
}

#[test]
fn aborting_frees_blocks_at_once() {
    let mut b = batcher(8, 4, 8, 64);
    b.add(1, prompt(10, 0), 16, 0, 0).unwrap();
    run_step(&mut b);
    assert_eq!(b.block_manager().num_free_blocks(), 5);
    assert!(b.abort(1));
    assert!(!b.abort(1), "a second abort is a no-op");
    assert_eq!(b.block_manager().num_free_blocks(), 8);
    assert!(!b.has_work());
}

#[test]
fn a_sequence_that_could_outgrow_the_pool_is_rejected() {
    let mut b = batcher(4, 4, 8, 64);
    let err = b.add(1, prompt(10, 0), 17, 0, 0).unwrap_err();
    assert!(matches!(
        err,
        BatcherError::TooLong {
            needed: 5,
            total: 4,
            ..
        }
    ));
    assert_eq!(b.add(2, vec![], 4, 0, 0), Err(BatcherError::Empty(2)));
}

#[test]
fn max_num_seqs_bounds_the_running_set() {
    let mut b = batcher(64, 4, 2, 64);
    for id in 0..5 {
        b.add(id, prompt(3, id as u32 * 10), 8, 0, id).unwrap();
    }
    let step = run_step(&mut b);
    assert_eq!(step.seqs.len(), 2);
    assert_eq!(b.num_running(), 2);
    assert_eq!(b.num_waiting(), 3);
}

/// 10,000 random admissions, steps, aborts and finishes: no block ever leaks, no step
/// exceeds its budget or the sequence limit, and everything drains at the end.
#[test]
fn random_operations_never_leak_blocks_or_exceed_the_budget() {
    let mut rng = StdRng::seed_from_u64(0xfa110);
    let (num_blocks, block_size, max_seqs, budget) = (48, 4, 6, 24);
    let mut b = batcher(num_blocks, block_size, max_seqs, budget);
    let mut limits: HashMap<SeqId, usize> = HashMap::new();
    let mut next_id = 0u64;
    for _ in 0..10_000 {
        match rng.gen_range(0..10) {
            0..=2 => {
                // Few distinct prefixes so the cache gets hit.
                let base = rng.gen_range(0..3u32) * 1000;
                let len = rng.gen_range(1..60usize);
                let tokens: Vec<u32> = (0..len as u32).map(|t| base + t).collect();
                let max_len = (len + rng.gen_range(1..40)).min(num_blocks * block_size);
                if b.add(next_id, tokens, max_len, rng.gen_range(0..3), next_id)
                    .is_ok()
                {
                    limits.insert(next_id, max_len);
                }
                next_id += 1;
            }
            3 if next_id > 0 => {
                let id = rng.gen_range(0..next_id);
                b.abort(id);
                limits.remove(&id);
            }
            _ => {
                let step = b.schedule();
                assert!(step.num_tokens() <= budget);
                assert!(b.num_running() <= max_seqs);
                b.complete_step(&step);
                for e in step.seqs.iter().filter(|e| e.wants_logits) {
                    let len = b.tokens(e.seq_id).unwrap().len();
                    if len + 1 >= limits[&e.seq_id] || rng.gen_bool(0.05) {
                        b.finish(e.seq_id);
                        limits.remove(&e.seq_id);
                    } else {
                        b.append_token(e.seq_id, rng.gen_range(0..5000)).unwrap();
                    }
                }
            }
        }
        b.check_consistency().unwrap();
    }
    // Drain: everything left must finish without aborts (progress is guaranteed).
    for _ in 0..100_000 {
        if !b.has_work() {
            break;
        }
        let step = b.schedule();
        assert!(!step.is_empty(), "work remains but nothing was scheduled");
        b.complete_step(&step);
        for e in step.seqs.iter().filter(|e| e.wants_logits) {
            if b.tokens(e.seq_id).unwrap().len() + 1 >= limits[&e.seq_id] {
                b.finish(e.seq_id);
            } else {
                b.append_token(e.seq_id, 1).unwrap();
            }
        }
        b.check_consistency().unwrap();
    }
    assert!(!b.has_work());
    assert_eq!(b.block_manager().num_free_blocks(), num_blocks);
}
