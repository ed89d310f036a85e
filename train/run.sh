#!/usr/bin/env bash
# Reproduces the demo model: data -> tokenizer -> training -> export -> evaluation.
#
#   bash train/run.sh [MINUTES [STAGE2]]   (defaults 215 and 80: wall-clock minutes)
#
# Training has two stages: MINUTES from scratch (train/work/run1), then STAGE2 more from
# those weights with a fresh, lower schedule (train/work/run2); STAGE2=0 skips it.
#
# Writes train/data/ (train.jsonl is not committed; test.jsonl and tools.json are),
# train/work/ (tokenizer, checkpoints, logs) and models/needle-demo.cact with its tool
# list. Rerunning resumes training from the stage's checkpoint.pkl; delete
# train/work/ to start over. Needs PyPI the first time (the official package's venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MINUTES="${1:-215}"
STAGE2="${2:-80}"
PY="$(bash scripts/reference-venv.sh)"
export JAX_PLATFORMS=cpu NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1

"$PY" train/gen_data.py --out train/data --train 60000 --test 600
[ -f train/work/tok.model ] ||
  "$PY" train/train_tokenizer.py --data train/data/train.jsonl --out train/work/tok --vocab 4096
"$PY" train/train.py --data train/data/train.jsonl --val train/data/test.jsonl \
  --tok train/work/tok.model --work train/work/run1 --minutes "$MINUTES"
RUN=train/work/run1
if [ "$STAGE2" != 0 ]; then
  "$PY" train/train.py --data train/data/train.jsonl --val train/data/test.jsonl \
    --tok train/work/tok.model --work train/work/run2 --init train/work/run1/final.pkl \
    --minutes "$STAGE2" --lr 6e-4
  RUN=train/work/run2
fi
"$PY" train/export.py --work "$RUN" --tok train/work/tok.model \
  --out models/needle-demo.cact
cp train/data/tools.json models/needle-demo.tools.json

[ -x build/needle ] || { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j; }
./build/needle eval --weights models/needle-demo.cact train/data/test.jsonl
# the end-to-end cases of tests/test_demo.c: held-out queries this model answers exactly
"$PY" train/pick_heldout.py --needle build/needle --weights models/needle-demo.cact
