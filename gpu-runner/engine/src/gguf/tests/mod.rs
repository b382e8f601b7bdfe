//! Tests of the GGUF reader.

mod hand_built;
mod real_models;
