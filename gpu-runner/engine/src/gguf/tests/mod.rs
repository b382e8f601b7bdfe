//! Tests of the GGUF reader.

mod hand_built;
mod hostile;
mod real_models;
