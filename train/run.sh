#!/usr/bin/env bash
# Reproduces the demo model's latest stage: data -> warm start from the previous model
# -> fine-tuning (resumable) -> export -> evaluation on the three held-out sets.
#
#   bash train/run.sh [MINUTES [FROM.cact]]
#
# MINUTES (default 55) is the wall-clock budget of the fine-tuning, CQ4 quantization-aware
# over its last 20%. FROM is the model to start from (default: models/needle-demo.cact as
# it was at commit 4316227, the 295-minute model trained from scratch, whose two stages
# are described in train/README.md). Its weights and tokenizer are imported
# (import_cact.py), so the vocabulary and embeddings carry over.
#
# Writes train/data/ (train.jsonl is not committed; test.jsonl, test2.jsonl, unseen.jsonl
# and tools.json are), train/work/ (the imported start, checkpoints, logs) and
# models/needle-demo.cact with its tool list. Rerunning resumes the fine-tuning from
# train/work/ft/checkpoint.pkl; delete train/work/ to start over. Needs PyPI the first
# time (the official package's venv). Training runs on one thread, niced, so a shared
# machine stays usable.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MINUTES="${1:-55}"
FROM="${2:-}"
PY="$(bash scripts/reference-venv.sh)"
export JAX_PLATFORMS=cpu NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

"$PY" train/gen_data.py --out train/data --train 40000 --test 600 --test2 600 --unseen 300
mkdir -p train/work
if [ -z "$FROM" ]; then
  FROM=train/work/start.cact
  [ -f "$FROM" ] || git show 4316227:models/needle-demo.cact > "$FROM"
fi
[ -f train/work/import/final.pkl ] || "$PY" train/import_cact.py "$FROM" --out train/work/import
nice -n 5 "$PY" train/train.py --data train/data/train.jsonl --val train/data/test2.jsonl \
  --tok train/work/import/tok.model --work train/work/ft --init train/work/import/final.pkl \
  --lr 5e-4 --minutes "$MINUTES"
"$PY" train/export.py --work train/work/ft --tok train/work/import/tok.model \
  --out models/needle-demo.cact
cp train/data/tools.json models/needle-demo.tools.json

[ -x build/needle ] || { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j; }
for split in test test2 unseen; do
  ./build/needle eval --weights models/needle-demo.cact "train/data/$split.jsonl"
done
# the end-to-end cases of tests/integration/test_demo.c: held-out queries this model answers exactly
"$PY" train/pick_heldout.py --needle build/needle --weights models/needle-demo.cact \
  --data train/data/test2.jsonl
