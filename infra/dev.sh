#!/usr/bin/env bash
# Runs Fallow on a fresh Debian/Ubuntu machine with Rust and Python 3: starts (installing if
# needed) PostgreSQL and Redis, fetches the default model, builds in release, migrates and
# serves `fallow dev` on 127.0.0.1:8000. Extra arguments go to `fallow dev`.
set -euo pipefail
cd "$(dirname "$0")/.."
infra/services.sh
scripts/fetch-models.sh
cargo build --release --bin fallow
target/release/fallow migrate
exec target/release/fallow dev --listen 127.0.0.1:8000 \
  --model models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
