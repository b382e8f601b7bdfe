//! The vocabulary every tier of Fallow shares, and nothing else.
//!
//! - [`adapter`]: the LoRA adapter a request runs with, and the queue its job waits in.
//! - [`job`]: the validated request, event and result types: what the api makes of an
//!   OpenAI request, what a runner streams back, and what a finished job holds.
//! - [`progress`]: how far a generation job got, for another runner to continue it, and
//!   how that is rebuilt from the job's stream.
//! - [`position`]: where each choice stands in a job's stream, so readers find holes.
//! - [`grammar`]: a [`job::Constraint`] as an llguidance grammar, and a model-free check that
//!   it compiles.
//! - [`testing`]: for tests, the test services' addresses and the one rule for a missing
//!   prerequisite: a skip here, a failure in CI.
//!
//! **Architecture Invariant**: this crate depends on serde and llguidance only, so the engine
//! can speak it without pulling in a database, a queue or a cloud client.

pub mod adapter;
pub mod grammar;
pub mod job;
pub mod position;
pub mod progress;
pub mod testing;
