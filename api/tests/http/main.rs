//! End-to-end tests of the api tier against real Postgres and Redis (a fresh schema per
//! test, the server on a random port), with a scripted fake runner standing in for the
//! engine so that only the control plane is under test.

mod support;

mod admission;
mod auth;
mod caps;
mod chat;
mod completions;
mod embeddings;
mod errors;
mod harmony;
mod local_mode;
mod ops;
mod rate_limits;
mod responses;
mod runner_api;
mod runner_tokens;
mod streams;
mod tools;
