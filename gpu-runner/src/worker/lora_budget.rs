//! Which LoRA adapters stay in memory: a byte budget, least recently used first out, and
//! never an adapter a running sequence holds. Pure bookkeeping; `adapters.rs` acts on it.

use std::collections::HashMap;

#[derive(Debug, Clone, Copy)]
struct Entry {
    bytes: u64,
    last_used: u64,
}

#[derive(Debug)]
pub struct LoraBudget {
    capacity: u64,
    used: u64,
    entries: HashMap<String, Entry>,
    /// A logical clock: each use is later than every earlier one, whatever the wall clock does.
    clock: u64,
}

impl LoraBudget {
    pub fn new(capacity: u64) -> Self {
        LoraBudget {
            capacity,
            used: 0,
            entries: HashMap::new(),
            clock: 0,
        }
    }

    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    fn used(&self) -> u64 {
        self.used
    }

    /// Marks `key` used now.
    pub fn touch(&mut self, key: &str) {
        self.clock += 1;
        if let Some(entry) = self.entries.get_mut(key) {
            entry.last_used = self.clock;
        }
    }

    /// Admits `key` (`bytes` large), naming the adapters to drop to make room, least
    /// recently used first and none that `in_use` holds; `None` (and nothing changes) when
    /// not even that makes room. An adapter already admitted is only touched.
    pub fn admit(
        &mut self,
        key: &str,
        bytes: u64,
        in_use: impl Fn(&str) -> bool,
    ) -> Option<Vec<String>> {
        if self.contains(key) {
            self.touch(key);
            return Some(Vec::new());
        }
        if bytes > self.capacity {
            return None;
        }
        let mut idle: Vec<(&String, &Entry)> =
            self.entries.iter().filter(|(k, _)| !in_use(k)).collect();
        idle.sort_by_key(|(_, e)| e.last_used);
        let mut victims = Vec::new();
        let mut free = self.capacity - self.used;
        for (k, e) in idle {
            if free >= bytes {
                break;
            }
            free += e.bytes;
            victims.push(k.clone());
        }
        if free < bytes {
            return None;
        }
        for victim in &victims {
            self.remove(victim);
        }
        self.clock += 1;
        self.entries.insert(
            key.to_string(),
            Entry {
                bytes,
                last_used: self.clock,
            },
        );
        self.used += bytes;
        Some(victims)
    }

    pub fn remove(&mut self, key: &str) {
        if let Some(entry) = self.entries.remove(key) {
            self.used -= entry.bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE_IN_USE: fn(&str) -> bool = |_| false;

    #[test]
    fn adapters_that_fit_are_all_kept() {
        let mut budget = LoraBudget::new(100);
        assert_eq!(budget.admit("a", 40, NONE_IN_USE), Some(vec![]));
        assert_eq!(budget.admit("b", 60, NONE_IN_USE), Some(vec![]));
        assert_eq!((budget.len(), budget.used()), (2, 100));
    }

    #[test]
    fn the_least_recently_used_adapter_makes_room_first() {
        let mut budget = LoraBudget::new(100);
        budget.admit("a", 40, NONE_IN_USE);
        budget.admit("b", 40, NONE_IN_USE);
        budget.touch("a");
        assert_eq!(budget.admit("c", 40, NONE_IN_USE), Some(vec!["b".into()]));
        assert!(budget.contains("a") && budget.contains("c") && !budget.contains("b"));
        assert_eq!(budget.used(), 80);
    }

    #[test]
    fn an_adapter_in_use_is_never_evicted() {
        let mut budget = LoraBudget::new(100);
        budget.admit("a", 50, NONE_IN_USE);
        budget.admit("b", 50, NONE_IN_USE);
        assert_eq!(
            budget.admit("c", 50, |k| k == "a"),
            Some(vec!["b".into()]),
            "a is older but in use"
        );
        assert_eq!(
            budget.admit("d", 60, |_| true),
            None,
            "everything is in use"
        );
        assert!(budget.contains("a") && budget.contains("c"));
        assert_eq!(budget.used(), 100, "a refusal changes nothing");
    }

    #[test]
    fn an_adapter_larger_than_the_budget_is_refused() {
        let mut budget = LoraBudget::new(100);
        budget.admit("a", 10, NONE_IN_USE);
        assert_eq!(budget.admit("huge", 101, NONE_IN_USE), None);
        assert!(budget.contains("a"));
    }

    #[test]
    fn admitting_an_adapter_twice_counts_it_once() {
        let mut budget = LoraBudget::new(100);
        budget.admit("a", 30, NONE_IN_USE);
        assert_eq!(budget.admit("a", 30, NONE_IN_USE), Some(vec![]));
        assert_eq!((budget.len(), budget.used()), (1, 30));
        budget.remove("a");
        assert_eq!((budget.len(), budget.used()), (0, 0));
    }
}
