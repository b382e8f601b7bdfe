//! Fallow's runner.
//!
//! - [`engine`]: our inference engine — weights, architectures, tokenizer, chat templates,
//!   paged KV cache, continuous batching, sampling, backends. It knows nothing of jobs,
//!   HTTP or Postgres.
//! - [`worker`]: claims jobs from the queue, feeds them to the engine, relays events to
//!   Redis, completes them (fenced), heartbeats and honours cancellation.

pub mod engine;
pub mod worker;
