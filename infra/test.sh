#!/usr/bin/env bash
# Runs the whole test suite: starts what the tests need (PostgreSQL, Redis), fetches the
# test models, installs the OpenAI Python SDK and moto (an S3-compatible server) into a venv,
# then runs the Rust tests and the end-to-end tests against a real `fallow` stack.
set -euo pipefail
cd "$(dirname "$0")/.."
infra/services.sh
scripts/fetch-models.sh --gemma
# The dashboard test drives Debian's headless Chromium.
if ! command -v chromium >/dev/null 2>&1; then
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq chromium >/dev/null
fi
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/pip install -q --disable-pip-version-check -r tests/e2e/requirements.txt
cargo build --bin fallow
# The S3 store tests run against a real S3-compatible server (moto, from requirements.txt);
# here its absence is a failure rather than a skip.
FALLOW_REQUIRE_S3=1 cargo test --workspace --no-fail-fast
FALLOW_BIN="$PWD/target/debug/fallow" .venv/bin/python -m pytest -q tests/e2e
