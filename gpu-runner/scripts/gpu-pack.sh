#!/usr/bin/env bash
# Builds what gpu-check.sh needs on the GPU machine and packs it for the device tool, whose
# calls carry at most 64 MiB each (see README.md in this directory):
#   .gpu/fallow.gz                      the release binary, stripped and gzipped
#   .gpu/tests/cuda_conformance-*.gz    the CUDA conformance test executable, likewise
#   .gpu/tests/fallow_engine-*.gz        the engine's unit tests (gpu-check runs its kernel
#                                        tests through the driver: each kernel on the GPU)
#   .gpu/models/<model>.part-aa         the default model's first 36 MiB part
#   .gpu-b/<model>.part-a[b-z]          the other parts (second call, machine still warm)
#   .gpu/models.sha256, .gpu-b/models.sha256
# Then: run with carry [".gpu"] `bash gpu-runner/scripts/gpu-check.sh`, and right after with
# carry [".gpu-b"] `GPU_CHECK_ONLY=model bash gpu-runner/scripts/gpu-check.sh`.
#
#   bash gpu-runner/scripts/gpu-pack.sh      (from anywhere; builds in the repo root)
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
LIMIT=$((64 * 1024 * 1024))

if [ ! -f "$MODEL" ]; then scripts/fetch-models.sh; fi
# With the engine's `emulator` feature, as the test build below turns it on: one release
# build of the engine serves both (the emulated driver is only loaded by tests, and only
# where no NVIDIA driver is).
cargo build --release -p fallow --features fallow-engine/emulator
# The test executable: the last compiler-artifact line naming it.
test_exe=$(cargo test --release -p fallow-engine --test cuda_conformance --no-run \
  --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*cuda_conformance[^"]*\)".*/\1/p' | tail -n 1)
if [ -z "$test_exe" ] || [ ! -f "$test_exe" ]; then
  echo "gpu-pack: could not find the cuda_conformance test executable" >&2
  exit 1
fi

# The engine's unit-test executable (the only executable of a `--lib` test build).
lib_exe=$(cargo test --release -p fallow-engine --lib --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*fallow_engine-[^"]*\)".*/\1/p' | tail -n 1)
if [ -z "$lib_exe" ] || [ ! -f "$lib_exe" ]; then
  echo "gpu-pack: could not find the fallow-engine unit-test executable" >&2
  exit 1
fi

rm -rf .gpu .gpu-b
mkdir -p .gpu/tests .gpu/models .gpu-b
strip -o .gpu/fallow target/release/fallow
for exe in "$test_exe" "$lib_exe"; do
  strip -o ".gpu/tests/$(basename "$exe")" "$exe"
  gzip -9 ".gpu/tests/$(basename "$exe")"
done
gzip -9 .gpu/fallow

name=$(basename "$MODEL")
split -b 36M "$MODEL" ".gpu-b/$name.part-"
mv ".gpu-b/$name.part-aa" .gpu/models/
sum=$(sha256sum "$MODEL" | cut -d' ' -f1)
echo "$sum  $name" >.gpu/models.sha256
echo "$sum  $name" >.gpu-b/models.sha256

for dir in .gpu .gpu-b; do
  bytes=$(du -sb "$dir" | cut -f1)
  printf '%s: %d bytes (%d MiB)\n' "$dir" "$bytes" $((bytes / 1024 / 1024))
  if ((bytes > LIMIT)); then
    echo "gpu-pack: $dir is over the 64 MiB a call carries" >&2
    exit 1
  fi
done
find .gpu .gpu-b -type f | sort
