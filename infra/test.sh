#!/usr/bin/env bash
# Runs the whole test suite: starts what the tests need (PostgreSQL, Redis), fetches the
# test models, installs the OpenAI Python SDK and moto (an S3-compatible server) into a venv,
# then runs the Rust tests and the end-to-end tests against a real `fallow` stack.
#
#   ./infra/test.sh          the whole suite (what CI runs: .ci/run sets CI=true)
#   ./infra/test.sh --fast   the unit tests of protocol, api, scheduler, engine and runner:
#                            no services, no models, no CUDA emulator (docs/testing.md)
#
# With CI=true a missing prerequisite (NVRTC, a test model, the emulator, moto, Chromium) is a
# failure, not a skip: every test that would skip for want of one fails instead.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --fast ]; then
  # The emulated CUDA kernels (`cuda::emu`) compile the kernel sources with g++ and take
  # minutes: they belong to the whole suite. Tests that want a model skip without one.
  exec cargo test --no-fail-fast -p fallow-protocol -p fallow-api -p fallow-scheduler \
    -p fallow-engine -p fallow-runner --lib -- --skip cuda::emu
elif [ $# -gt 0 ]; then
  echo "usage: $0 [--fast]" >&2
  exit 2
fi

ci=0
case "${CI:-}" in true | 1) ci=1 ;; esac

infra/services.sh
# The dependency policy in deny.toml: licenses, banned crates and sources are checked from
# Cargo.lock alone; advisories need RustSec's database from GitHub, so where GitHub cannot be
# reached they are reported as not checked (never as passed).
if ! command -v cargo-deny >/dev/null 2>&1; then
  cargo install --locked cargo-deny@0.20.2
fi
cargo deny --log-level error check bans licenses sources
if timeout 120 cargo deny --log-level error fetch db >/dev/null 2>&1; then
  cargo deny --log-level error check --disable-fetch advisories
  echo "cargo-deny: advisories checked"
else
  echo "cargo-deny: advisories NOT CHECKED: RustSec's database (github.com) is unreachable here" >&2
fi
scripts/fetch-models.sh --gemma --minilm
# The dashboard test drives Debian's headless Chromium.
if ! command -v chromium >/dev/null 2>&1; then
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq chromium >/dev/null
fi
# The Node SDK test drives npm's `openai` with Debian's Node.js.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq nodejs npm >/dev/null
fi
npm install --prefix tests/e2e/node --no-audit --no-fund --silent
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/pip install -q --disable-pip-version-check -r tests/e2e/requirements.txt
# NVRTC (CUDA 13's runtime compiler, from NVIDIA's PyPI wheel) lets a Rust test compile the
# CUDA backend's kernels to PTX on this GPU-less machine. Pinned to 13.0, the CUDA version of
# the GPU machines' driver (a newer NVRTC emits PTX that driver cannot load). With it the
# CUDA conformance suite also runs here, on the emulated driver (the kernels on the CPU, see
# gpu-runner/engine/src/backend/cuda/emu/mod.rs). Without it those tests skip, and in CI
# the install's failure stops the run.
NVRTC_WHEEL="${FALLOW_NVRTC_WHEEL:-nvidia-cuda-nvrtc==13.0.88}"
if .venv/bin/pip install -q --disable-pip-version-check "$NVRTC_WHEEL"; then
  nvrtc_dir="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu13/lib"
  # cudarc opens libnvrtc.so.13 by that name; should a wheel ship only libnvrtc.so.13.x,
  # a link in the git-ignored .cache/ provides it.
  if [ ! -e "$nvrtc_dir/libnvrtc.so.13" ]; then
    versioned="$(find "$nvrtc_dir" -maxdepth 1 -name 'libnvrtc.so.13.*' 2>/dev/null | head -n 1 || true)"
    if [ -n "$versioned" ]; then
      mkdir -p .cache/nvrtc
      ln -sf "$versioned" .cache/nvrtc/libnvrtc.so.13
      nvrtc_dir="$PWD/.cache/nvrtc:$nvrtc_dir"
    fi
  fi
  export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "NVRTC: ${nvrtc_dir%%:*}"
elif ((ci)); then
  echo "NVRTC: could not install $NVRTC_WHEEL; CI=true needs it (the CUDA tests)" >&2
  exit 1
else
  echo "NVRTC: could not install $NVRTC_WHEEL (no network?); the CUDA tests will skip" >&2
fi
# With the engine's CUDA emulator compiled in, as `cargo test` builds the engine (its tests
# turn the feature on), so the workspace's test build reuses this one.
cargo build --bin fallow --features fallow-engine/emulator
# The S3 store tests run against a real S3-compatible server (moto, from requirements.txt);
# here its absence is a failure rather than a skip.
FALLOW_REQUIRE_S3=1 cargo test --workspace --no-fail-fast
# The CUDA kernel tests again, launched through the CUDA driver API as gpu-check.sh runs them
# on a GPU (here on the emulated driver, which takes the driver's name: a process of their
# own). The same targets as above, so the same build (`--lib` alone would resolve features
# differently and rebuild the engine); the filter leaves the other executables nothing to run.
FALLOW_KERNEL_TESTS=driver cargo test --workspace --no-fail-fast cuda::emu::kernel_tests
FALLOW_BIN="$PWD/target/debug/fallow" .venv/bin/python -m pytest -q tests/e2e
