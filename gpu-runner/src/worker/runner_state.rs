//! What this runner may do right now, from three sources: the registry row's `state` (the
//! operator's cordon/drain/resume, learnt on every heartbeat and at once through a
//! `NOTIFY`, see `runners::state_hints`), the owner probe, and its pool's turn (at most a
//! share of a pool is lent at once, see `runners::pool_turn`). The machine is lent while
//! the owner is idle and it is the runner's turn. The claim loop only looks at the gate this
//! publishes: claiming is allowed only while the row says `active` and the machine is lent.
//!
//! The runner also reports the states it owns back to the registry ([`Reconcile`]): `yielded`
//! while not lent, `active` again afterwards, and `drained` once a drain has no work left.
//! Those writes are conditional (`runners::report_state`), so an operator's decision always
//! wins.

// The registry's state is `Registry` here: `RunnerState` is this file's own, wider view.
use fallow_scheduler::runners::RunnerState as Registry;
use tokio::sync::watch;

/// A state change the runner should report: from one of `from` to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconcile {
    pub from: &'static [Registry],
    pub to: Registry,
}

pub struct RunnerState {
    /// The registry row's state as last read.
    registry: Registry,
    owner_active: bool,
    /// False while the pool has its share of runners lent without this one.
    pool_turn: bool,
    gate: watch::Sender<bool>,
}

impl RunnerState {
    /// A freshly registered runner is `active`; returns the gate's receiver for the claim
    /// loop.
    pub fn new() -> (Self, watch::Receiver<bool>) {
        let (gate, rx) = watch::channel(false);
        let state = RunnerState {
            registry: Registry::Active,
            owner_active: false,
            pool_turn: true,
            gate,
        };
        state.publish();
        (state, rx)
    }

    pub fn registry(&self) -> Registry {
        self.registry
    }

    pub fn owner_active(&self) -> bool {
        self.owner_active
    }

    pub fn set_registry(&mut self, state: Registry) {
        if state != self.registry {
            tracing::info!(from = %self.registry, to = %state, "runner state changed");
            self.registry = state;
            self.publish();
        }
    }

    pub fn set_owner_active(&mut self, active: bool) {
        self.owner_active = active;
        self.publish();
    }

    pub fn set_pool_turn(&mut self, turn: bool) {
        if turn != self.pool_turn {
            tracing::info!(turn, "the runner's turn in its pool changed");
        }
        self.pool_turn = turn;
        self.publish();
    }

    /// Whether the machine is lent: its owner is idle and it is this runner's turn.
    pub fn lent(&self) -> bool {
        !self.owner_active && self.pool_turn
    }

    /// Whether new jobs may be claimed.
    pub fn may_claim(&self) -> bool {
        self.registry == Registry::Active && self.lent()
    }

    /// The report the registry needs, given the jobs held now.
    pub fn reconcile(&self, in_flight: usize) -> Option<Reconcile> {
        match self.registry {
            Registry::Active if !self.lent() => Some(Reconcile {
                from: &[Registry::Active],
                to: Registry::Yielded,
            }),
            Registry::Yielded if self.lent() => Some(Reconcile {
                from: &[Registry::Yielded],
                to: Registry::Active,
            }),
            Registry::Draining if in_flight == 0 => Some(Reconcile {
                from: &[Registry::Draining],
                to: Registry::Drained,
            }),
            _ => None,
        }
    }

    fn publish(&self) {
        let open = self.may_claim();
        self.gate.send_if_modified(|current| {
            let changed = *current != open;
            *current = open;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_allowed_only_while_active_and_the_owner_is_idle() {
        let (mut state, gate) = RunnerState::new();
        assert!(*gate.borrow());
        state.set_owner_active(true);
        assert!(!*gate.borrow());
        state.set_owner_active(false);
        assert!(*gate.borrow());
        for closed in [
            Registry::Cordoned,
            Registry::Draining,
            Registry::Drained,
            Registry::Yielded,
            Registry::Dead,
        ] {
            state.set_registry(closed);
            assert!(!*gate.borrow(), "{closed} claims nothing");
        }
        state.set_registry(Registry::Active);
        assert!(*gate.borrow(), "resume claims again");
    }

    #[test]
    fn the_runner_reports_yielded_returned_and_drained() {
        let (mut state, _gate) = RunnerState::new();
        assert_eq!(state.reconcile(0), None);
        state.set_owner_active(true);
        assert_eq!(state.reconcile(0).map(|r| r.to), Some(Registry::Yielded));
        state.set_registry(Registry::Yielded);
        assert_eq!(state.reconcile(0), None);
        state.set_owner_active(false);
        assert_eq!(state.reconcile(0).map(|r| r.to), Some(Registry::Active));

        state.set_registry(Registry::Draining);
        assert_eq!(state.reconcile(2), None, "still finishing in-flight work");
        assert_eq!(state.reconcile(0).map(|r| r.to), Some(Registry::Drained));
        state.set_registry(Registry::Cordoned);
        state.set_owner_active(true);
        assert_eq!(state.reconcile(0), None, "the operator's cordon stands");
    }

    #[test]
    fn a_runner_out_of_its_pools_turn_yields_like_one_whose_owner_is_back() {
        let (mut state, gate) = RunnerState::new();
        state.set_pool_turn(false);
        assert!(!*gate.borrow() && !state.lent());
        assert_eq!(state.reconcile(0).map(|r| r.to), Some(Registry::Yielded));
        state.set_registry(Registry::Yielded);
        state.set_pool_turn(true);
        assert!(state.lent());
        assert_eq!(state.reconcile(0).map(|r| r.to), Some(Registry::Active));
        state.set_owner_active(true);
        assert!(!state.lent(), "its turn does not overrule the owner");
    }
}
