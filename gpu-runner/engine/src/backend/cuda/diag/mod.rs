//! Diagnostics that never change a result: per-launch GPU time ([`profile`]) and GPU versus
//! host time per step ([`step_clock`]).

pub mod profile;
pub mod step_clock;
