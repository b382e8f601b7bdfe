//! Which models this runner holds in memory, within its memory budget: the bookkeeping
//! behind loading on demand, least-recently-used eviction and `keep_alive`. Pure (time is
//! passed in, the caller says which models are busy or pinned), so every decision is
//! unit-tested here and the worker only carries them out.
//!
//! A model is resident from the moment its load starts (its memory is spoken for) until it
//! is unloaded. A model that is loading or has jobs is busy and never evicted; a pinned one
//! (the runner is needed for the model's minimum of warm replicas) is not evicted to make
//! room, nor does its keep-alive expire.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
struct Resident {
    bytes: u64,
    loading: bool,
    last_used: Instant,
}

#[derive(Debug, Clone)]
pub struct Residency {
    /// `None`: no budget, everything fits.
    budget: Option<u64>,
    resident: BTreeMap<String, Resident>,
}

impl Residency {
    pub fn new(budget: Option<u64>) -> Self {
        Residency {
            budget,
            resident: BTreeMap::new(),
        }
    }

    /// Bytes held by resident models (loading ones at their estimate).
    pub fn used(&self) -> u64 {
        self.resident.values().map(|r| r.bytes).sum()
    }

    pub fn is_resident(&self, model: &str) -> bool {
        self.resident.contains_key(model)
    }

    pub fn is_loading(&self, model: &str) -> bool {
        self.resident.get(model).is_some_and(|r| r.loading)
    }

    pub fn any_loading(&self) -> bool {
        self.resident.values().any(|r| r.loading)
    }

    /// Resident models (loaded or loading), sorted.
    pub fn models(&self) -> Vec<String> {
        self.resident.keys().cloned().collect()
    }

    /// Whether a model of `bytes` fits next to what is resident, without evicting.
    pub fn fits(&self, bytes: u64) -> bool {
        self.budget
            .is_none_or(|budget| self.used().saturating_add(bytes) <= budget)
    }

    /// The model's load started; `bytes` is its estimate.
    pub fn begin_load(&mut self, model: &str, bytes: u64, now: Instant) {
        self.resident.insert(
            model.to_string(),
            Resident {
                bytes,
                loading: true,
                last_used: now,
            },
        );
    }

    /// The model's load finished; `bytes` is what it really takes.
    pub fn finish_load(&mut self, model: &str, bytes: u64, now: Instant) {
        if let Some(r) = self.resident.get_mut(model) {
            r.bytes = bytes;
            r.loading = false;
            r.last_used = now;
        }
    }

    /// The model was unloaded (or its load failed).
    pub fn remove(&mut self, model: &str) {
        self.resident.remove(model);
    }

    /// The model was used (a job started or finished on it).
    pub fn touch(&mut self, model: &str, now: Instant) {
        if let Some(r) = self.resident.get_mut(model) {
            r.last_used = now;
        }
    }

    /// The evictions that make room for a model of `bytes`: idle, unpinned models, least
    /// recently used first, as few as needed. `None` when even evicting all of those would
    /// not make room (or the model alone exceeds the budget).
    pub fn room_for(
        &self,
        bytes: u64,
        busy: impl Fn(&str) -> bool,
        pinned: impl Fn(&str) -> bool,
    ) -> Option<Vec<String>> {
        let Some(budget) = self.budget else {
            return Some(Vec::new());
        };
        let mut used = self.used();
        let mut victims: Vec<(&String, &Resident)> = self
            .resident
            .iter()
            .filter(|(id, r)| !r.loading && !busy(id) && !pinned(id))
            .collect();
        victims.sort_by_key(|(id, r)| (r.last_used, *id));
        let mut evict = Vec::new();
        for (id, r) in victims {
            if used.saturating_add(bytes) <= budget {
                break;
            }
            used -= r.bytes;
            evict.push(id.clone());
        }
        (used.saturating_add(bytes) <= budget).then_some(evict)
    }

    /// Idle, unpinned models unused for longer than their keep-alive (`None`: forever).
    pub fn expired(
        &self,
        now: Instant,
        keep_alive: impl Fn(&str) -> Option<Duration>,
        busy: impl Fn(&str) -> bool,
        pinned: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        self.resident
            .iter()
            .filter(|(id, r)| {
                !r.loading
                    && !busy(id)
                    && !pinned(id)
                    && keep_alive(id).is_some_and(|k| now.duration_since(r.last_used) >= k)
            })
            .map(|(id, _)| id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    fn never(_: &str) -> bool {
        false
    }

    fn loaded(budget: Option<u64>, models: &[(&str, u64, u64)], t0: Instant) -> Residency {
        let mut r = Residency::new(budget);
        for &(id, bytes, used_at) in models {
            let at = t0 + Duration::from_secs(used_at);
            r.begin_load(id, bytes, at);
            r.finish_load(id, bytes, at);
        }
        r
    }

    #[test]
    fn without_a_budget_everything_fits_and_nothing_is_evicted() {
        let t0 = Instant::now();
        let r = loaded(None, &[("a", 900 * MB, 0)], t0);
        assert!(r.fits(u64::MAX / 2));
        assert_eq!(r.room_for(10_000 * MB, never, never), Some(vec![]));
    }

    #[test]
    fn making_room_evicts_the_least_recently_used_idle_models_first() {
        let t0 = Instant::now();
        let r = loaded(
            Some(1000 * MB),
            &[
                ("old", 300 * MB, 1),
                ("newer", 300 * MB, 5),
                ("newest", 300 * MB, 9),
            ],
            t0,
        );
        assert!(!r.fits(200 * MB));
        assert_eq!(r.room_for(200 * MB, never, never), Some(vec!["old".into()]));
        assert_eq!(
            r.room_for(650 * MB, never, never),
            Some(vec!["old".into(), "newer".into()])
        );
    }

    #[test]
    fn busy_loading_and_pinned_models_are_never_evicted() {
        let t0 = Instant::now();
        let mut r = loaded(
            Some(1000 * MB),
            &[
                ("busy", 300 * MB, 1),
                ("pinned", 300 * MB, 2),
                ("idle", 300 * MB, 9),
            ],
            t0,
        );
        let busy = |m: &str| m == "busy";
        let pinned = |m: &str| m == "pinned";
        assert_eq!(
            r.room_for(400 * MB, busy, pinned),
            Some(vec!["idle".into()])
        );
        assert_eq!(
            r.room_for(500 * MB, busy, pinned),
            None,
            "not enough idle memory"
        );

        r.remove("idle");
        r.begin_load("loading", 300 * MB, t0);
        assert_eq!(r.room_for(200 * MB, busy, pinned), None);
        assert!(r.is_loading("loading") && r.any_loading());
    }

    #[test]
    fn a_model_larger_than_the_budget_never_fits() {
        let r = Residency::new(Some(100 * MB));
        assert_eq!(r.room_for(101 * MB, never, never), None);
        assert_eq!(r.room_for(100 * MB, never, never), Some(vec![]));
    }

    #[test]
    fn a_finished_load_counts_its_real_size() {
        let t0 = Instant::now();
        let mut r = Residency::new(Some(1000 * MB));
        r.begin_load("a", 100 * MB, t0);
        assert_eq!(r.used(), 100 * MB);
        r.finish_load("a", 700 * MB, t0);
        assert_eq!(r.used(), 700 * MB);
        assert!(!r.fits(400 * MB));
        assert_eq!(r.models(), vec!["a".to_string()]);
    }

    #[test]
    fn keep_alive_expires_idle_models_only() {
        let t0 = Instant::now();
        let mut r = loaded(
            None,
            &[
                ("short", MB, 0),
                ("forever", MB, 0),
                ("busy", MB, 0),
                ("pinned", MB, 0),
            ],
            t0,
        );
        let keep = |m: &str| (m != "forever").then_some(Duration::from_secs(60));
        let busy = |m: &str| m == "busy";
        let pinned = |m: &str| m == "pinned";
        assert!(r
            .expired(t0 + Duration::from_secs(59), keep, busy, pinned)
            .is_empty());
        let later = t0 + Duration::from_secs(61);
        assert_eq!(
            r.expired(later, keep, busy, pinned),
            vec!["short".to_string()]
        );
        r.touch("short", later);
        assert!(
            r.expired(later, keep, busy, pinned).is_empty(),
            "used again"
        );
    }
}
