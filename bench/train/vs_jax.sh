#!/usr/bin/env bash
# The training step of needle's core against the official JAX step, same geometry and
# batch, one after the other in this run (issue 32): needle-train-bench, then
# bench/train/jax_step3.py in the pinned venv tests/reference/.venv3 (made by any
# tests/reference/make_*_v3 script; skipped with a note when absent), then the ratio of
# tokens per second. Both run on the same cores; CPU is shared, so run it on a quiet
# machine and take medians (--steps).
#
#   bench/train/vs_jax.sh [--full] [--batch B] [--tokens T] [--steps S] [--bench PATH]
#
# Default: LoRA r16 with the exact fine-tuning numerics on the released geometry, 4 x 256,
# 3 steps. --full: full-parameter float training on the train/init3.py geometry.
# The JAX side compiles first (~130 s for the LoRA step on 2 cores), not counted.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BENCH="$ROOT/build/needle-train-bench"
MODE=lora B=4 T=256 S=3
while [ $# -gt 0 ]; do
  case "$1" in
    --full) MODE=full ;;
    --batch) B="$2"; shift ;;
    --tokens) T="$2"; shift ;;
    --steps) S="$2"; shift ;;
    --bench) BENCH="$2"; shift ;;
    *) echo "usage: vs_jax.sh [--full] [--batch B] [--tokens T] [--steps S] [--bench PATH]" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$BENCH" ] || { echo "vs_jax.sh: no $BENCH (cmake --build build --target needle_train_bench)" >&2; exit 2; }
FLAG=(); [ "$MODE" = full ] && FLAG=(--full)
OURS="$("$BENCH" "${FLAG[@]}" --batch "$B" --tokens "$T" --steps "$S" --threads 2)"
echo "$OURS"
ours_tps="$(printf '%s\n' "$OURS" | sed -n 's/.*median [0-9.]* s (min.*), \([0-9.]*\) tok\/s/\1/p')"
ours_tpc="$(printf '%s\n' "$OURS" | sed -n 's/.* = \([0-9.]*\) tok per CPU-second/\1/p')"
PY="$ROOT/tests/reference/.venv3/bin/python"
if [ ! -x "$PY" ]; then
  echo "vs_jax.sh: no tests/reference/.venv3: the JAX step skipped (make it with tests/reference/make_grad_v3_fixtures.sh)"
  exit 0
fi
JAX="$("$PY" "$ROOT/bench/train/jax_step3.py" --mode "$MODE" --batch "$B" --tokens "$T" --steps "$S")"
echo "official JAX step: $JAX"
jax_tps="$(printf '%s\n' "$JAX" | sed -n 's/.*"tok_per_s": \([0-9.]*\).*/\1/p')"
jax_tpc="$(printf '%s\n' "$JAX" | sed -n 's/.*"tok_per_cpu_s": \([0-9.]*\).*/\1/p')"
awk -v o="$ours_tps" -v j="$jax_tps" -v oc="$ours_tpc" -v jc="$jax_tpc" 'BEGIN {
  printf "needle / JAX tokens per second: %.2f (%s vs %s tok/s)\n", o / j, o, j
  printf "needle / JAX tokens per CPU-second: %.2f (%s vs %s)\n", oc / jc, oc, jc }'
