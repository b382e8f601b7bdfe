//! Fallow's runner: claims jobs from the queue, feeds them to the engine
//! (`fallow_engine`), relays events to Redis, completes them (fenced), heartbeats and honours
//! cancellation, the owner's return and the operator's orders.
//!
//! - [`control_plane`]: every call a runner makes, as one trait, and its transports.
//! - [`worker`]: the runner's loop and everything it keeps (held jobs, resident models,
//!   the owner probe, lending windows, pool turns).

pub mod control_plane;
pub mod worker;
