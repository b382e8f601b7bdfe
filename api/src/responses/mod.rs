//! The Responses API's own machinery; its endpoints are in `routes/responses*.rs`, its wire
//! types in [`crate::openai::responses`], its validation in [`crate::validate::responses`].
//! A response is one job, answered by the same runners and streams as a chat completion.
//!
//! - [`builder`]: a job's stream entries → the `response` object and its typed events, with
//!   sequence numbers that any api process reproduces from the job's stream (pure).
//! - [`answer`]: a job's row → its `response` (a poll, a batch line, a stored answer).
//! - [`sse`]: the events as server-sent events, from the start or after `starting_after`.
//! - [`store`]: stored responses in Postgres (`queries/`), per tenant.

pub mod answer;
pub mod builder;
pub mod sse;
pub mod store;
