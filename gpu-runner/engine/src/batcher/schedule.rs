//! One scheduling decision: decodes, then running prefill chunks, then admissions, all
//! under one token budget, preempting by recompute when blocks run out.

use super::sequence::SeqKey;
use super::{Batcher, ScheduledSeq, ScheduledStep, SeqId};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Decodes,
    Prefills,
}

impl Batcher {
    /// Decides what runs this step and allocates the blocks it needs.
    pub fn schedule(&mut self) -> ScheduledStep {
        let mut step = ScheduledStep::default();
        let mut budget = self.config.max_batched_tokens;
        let mut order = std::mem::take(&mut self.scratch);
        order.clear();
        order.extend(self.running.iter().copied());
        for pass in [Pass::Decodes, Pass::Prefills] {
            for &key in &order {
                if budget == 0 {
                    break;
                }
                self.schedule_running(key, pass, &mut budget, &mut step);
            }
        }
        self.scratch = order;
        self.admit_waiting(&mut budget, &mut step);
        step
    }

    fn schedule_running(
        &mut self,
        key: SeqKey,
        pass: Pass,
        budget: &mut usize,
        step: &mut ScheduledStep,
    ) {
        loop {
            if !self.running.contains(&key) {
                return; // preempted earlier in this step
            }
            let Some(seq) = self.seqs.get(&key.id) else {
                return;
            };
            let remaining = seq.remaining();
            if remaining == 0 || (pass == Pass::Decodes) != (remaining == 1) {
                return;
            }
            let count = remaining.min(*budget);
            let target = seq.num_computed + count;
            if self.try_schedule(key.id, count, target, step) {
                *budget -= count;
                return;
            }
            // Out of blocks: the least important running sequence makes room (maybe this one).
            let Some(&victim) = self.running.last() else {
                return;
            };
            *budget += self.preempt(victim, step);
            if victim == key {
                return;
            }
        }
    }

    /// Allocates blocks for `target` positions and records the entry; false if out of blocks.
    fn try_schedule(
        &mut self,
        id: SeqId,
        count: usize,
        target: usize,
        step: &mut ScheduledStep,
    ) -> bool {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return false;
        };
        if self.blocks.allocate_slots(&mut seq.table, target).is_err() {
            return false;
        }
        step.seqs.push(ScheduledSeq {
            seq_id: id,
            start: seq.num_computed,
            end: seq.num_computed + count,
            wants_logits: target == seq.tokens.len(),
        });
        true
    }

    /// Sends a running sequence back to waiting without its blocks; returns the budget its
    /// entry in `step` (if any) had taken.
    fn preempt(&mut self, key: SeqKey, step: &mut ScheduledStep) -> usize {
        self.running.remove(&key);
        self.waiting.insert(key);
        if let Some(seq) = self.seqs.get_mut(&key.id) {
            self.blocks.free(&mut seq.table);
            seq.num_computed = 0;
            seq.num_preemptions += 1;
        }
        step.preempted.push(key.id);
        self.total_preemptions += 1;
        let mut returned = 0;
        step.seqs.retain(|entry| {
            let keep = entry.seq_id != key.id;
            if !keep {
                returned += entry.num_tokens();
            }
            keep
        });
        returned
    }

    /// Admits waiting sequences best first while the budget, `max_num_seqs` and the free
    /// blocks allow. Stops at the first that does not fit, so a big prompt is not starved
    /// by smaller ones behind it.
    fn admit_waiting(&mut self, budget: &mut usize, step: &mut ScheduledStep) {
        while *budget > 0 {
            let Some(&key) = self.waiting.first() else {
                return;
            };
            if self.running.len() >= self.config.max_num_seqs || !self.fits(key) {
                if !self.preempt_for(key, step, budget) {
                    return;
                }
                continue;
            }
            let Some(seq) = self.seqs.get_mut(&key.id) else {
                return;
            };
            let count = seq.remaining().min(*budget);
            let target = seq.num_computed + count;
            if !self.try_schedule(key.id, count, target, step) {
                self.release_prefix(key.id);
                return;
            }
            if let Some(seq) = self.seqs.get_mut(&key.id) {
                seq.cached_prompt_tokens.get_or_insert(target - count);
            }
            self.waiting.remove(&key);
            self.running.insert(key);
            *budget -= count;
        }
    }

    /// Claims the sequence's cached prefix (once per admission attempt) and says whether the
    /// rest of its tokens fit in the free blocks. Requiring the whole remainder, not just
    /// this step's chunk, keeps a long prompt from being admitted only to be preempted.
    fn fits(&mut self, key: SeqKey) -> bool {
        let Some(seq) = self.seqs.get_mut(&key.id) else {
            return false;
        };
        if seq.table.is_empty() {
            seq.num_computed = self.blocks.match_prefix(&mut seq.table, &seq.tokens);
        }
        let fits = self.blocks.can_allocate(&seq.table, seq.tokens.len());
        if !fits {
            self.release_prefix(key.id);
        }
        fits
    }

    fn release_prefix(&mut self, id: SeqId) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            self.blocks.free(&mut seq.table);
            seq.num_computed = 0;
        }
    }

    /// Preempts the least important running sequence if `waiting` outranks it by priority
    /// (not merely by age, which would thrash). Returns whether room was made.
    fn preempt_for(
        &mut self,
        waiting: SeqKey,
        step: &mut ScheduledStep,
        budget: &mut usize,
    ) -> bool {
        match self.running.last() {
            Some(&victim) if victim.priority > waiting.priority => {
                *budget += self.preempt(victim, step);
                true
            }
            _ => false,
        }
    }
}
