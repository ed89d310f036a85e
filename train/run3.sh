#!/usr/bin/env bash
# The recipe of the Needle 3 default model (issue 35), resumable: every stage whose output
# exists is skipped, so a session reruns it and picks up where the last one stopped.
#
#   bash train/run3.sh [MINUTES]         # MINUTES: the trainer's wall-clock budget (default 60)
#
#   1. data       train/data/train3.jsonl: compose3.py, TRAIN3_EXAMPLES (default 200,000)
#                 examples, seed 7 (the held-out test2/unseen files are committed, never
#                 rewritten here)
#   2. tokenizer  train/data/needle3-tok4096.model (committed; RETRAIN_TOKENIZER=1 trains it
#                 again with train_tokenizer3.py on this data: a new tokenizer invalidates
#                 every checkpoint made with the old one)
#   3. init       train/work3/init/{init.safetensors,config.json}: init3.py, the official
#                 3.2.8 init, seeded, in the official checkpoint format
#   4. smoke      the init through `needle export --v3` and `needle run` (answers
#                 meaningless), once: the chain works before compute is spent on it
#   5. train      `needle finetune --full` (the C trainer) from the init for MINUTES, then
#                 SIGINT: the state is saved in train/work3/ft and the script exits 4; the
#                 next run resumes it. Flags: NEEDLE_FINETUNE_ARGS (default below;
#                 TRAIN3_EPOCHS, TRAIN3_BATCH, TRAIN3_LR, TRAIN3_MAX_LEN)
#   6. build      models/needle3-default.cact: built by needle finetune when training ends
#                 (needle build's code: CQ4, the init's tokenizer)
#   7. eval       `needle eval` on test2.jsonl and unseen.jsonl (scores by category) and
#                 the six official environments (tests/official_client/dropin.sh with
#                 this model)
#
# Needs PyPI the first time (the 3.2.8 venv for stage 3). Training runs niced.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MINUTES="${1:-60}"
EXAMPLES="${TRAIN3_EXAMPLES:-200000}"
WORK=train/work3
TOK=train/data/needle3-tok4096.model
NEEDLE=./build/needle
OUT=models/needle3-default.cact
export JAX_PLATFORMS=cpu NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
mkdir -p "$WORK"

venv3() {  # the pinned 3.2.8 venv of tests/reference (same pins as make_v3_fixtures.sh)
  local venv=tests/reference/.venv3
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c \
      'import importlib.metadata as m, sys; sys.exit(m.version("cactus-needle") != "3.2.8")' 2>/dev/null; then
    flock /tmp/venv3.lock bash -c "
      [ -x '$venv/bin/python' ] || python3 -m venv '$venv'
      '$venv/bin/pip' install -q 'cactus-needle[train]==3.2.8' 'jax==0.10.2' 'jaxlib==0.10.2' \
        'flax==0.12.8' 'optax==0.2.8' 'numpy==2.4.6' 'sentencepiece==0.2.3' 'ml_dtypes==0.7.0'" >&2
  fi
  echo "$ROOT/$venv/bin/python"
}

[ -x "$NEEDLE" ] || { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j; }

echo "== 1. data"
if [ ! -s train/data/train3.jsonl ] || [ "$(wc -l < train/data/train3.jsonl)" -ne "$EXAMPLES" ]; then
  python3 train/compose3.py --out train/data --train "$EXAMPLES" --seed 7
fi

echo "== 2. tokenizer"
if [ "${RETRAIN_TOKENIZER:-0}" = 1 ]; then
  "$(venv3)" train/train_tokenizer3.py --data train/data/train3.jsonl --out "${TOK%.model}" \
    --vocab 4096 --examples 20000
fi
"$(venv3)" train/train_tokenizer3.py --measure "$TOK" --data train/data/train3.jsonl \
  --examples 2000 --heldout train/data/test2.jsonl train/data/unseen.jsonl

echo "== 3. init"
[ -s "$WORK/init/init.safetensors" ] || nice -n 5 "$(venv3)" train/init3.py --out "$WORK/init" --seed 35

echo "== 4. smoke"
if [ ! -s "$WORK/init.cact" ]; then
  "$NEEDLE" export "$WORK/init/init.safetensors" --config "$WORK/init/config.json" --v3 \
    -t "$TOK" -o "$WORK/init.cact" -q
  "$NEEDLE" run -w "$WORK/init.cact" --tools train/data/tools.json -n 16 \
    "set a timer for 10 minutes" > /dev/null
  echo "the untrained init exports and runs ($WORK/init.cact)"
fi

echo "== 5. train"
if ! "$NEEDLE" help finetune 2>/dev/null | grep -q -- "--full"; then
  echo "run3.sh: this needle has no 'finetune --full' yet (the C trainer, issues 32/33)."
  echo "  Ready for it: data train/data/train3.jsonl, tokenizer $TOK,"
  echo "  initial checkpoint $WORK/init/init.safetensors (+ config.json)."
  echo "  Rerun this script once 'needle help finetune' lists --full."
  exit 3
fi
# From scratch: every parameter (--full), float; the data's own 1% held out for the
# validation loss (the held-out sets of stage 7 are never trained on). The run is bounded
# by MINUTES: `timeout` sends SIGINT, on which needle finetune saves its state and exits
# 130; the next run of this script resumes it bit for bit (--resume).
FT_OUT="$WORK/ft/needle3-full.safetensors"
mkdir -p "$WORK/ft"
RESUME=()
[ -s "$FT_OUT" ] && RESUME=(--resume)
read -r -a FT_ARGS <<< "${NEEDLE_FINETUNE_ARGS:-train/data/train3.jsonl --full \
--checkpoint $WORK/init/init.safetensors -w $WORK/init.cact --epochs ${TRAIN3_EPOCHS:-3} \
--batch-size ${TRAIN3_BATCH:-16} --lr ${TRAIN3_LR:-1e-3} --max-len ${TRAIN3_MAX_LEN:-512} \
--val-split 0.01 --seed 35 --save-every 10 --no-score -o $FT_OUT --build-out $OUT}"
set +e
timeout -s INT "${MINUTES}m" nice -n 5 "$NEEDLE" finetune "${FT_ARGS[@]}" "${RESUME[@]}"
rc=$?
set -e
if [ "$rc" -eq 124 ] || [ "$rc" -eq 130 ]; then
  echo "run3.sh: stopped after $MINUTES minutes with the state saved in $FT_OUT; rerun to resume"
  exit 4
fi
[ "$rc" -eq 0 ] || exit "$rc"

echo "== 6. build"
# needle finetune built the trained checkpoint into $OUT with needle build's code (CQ4, the
# init's tokenizer)
"$NEEDLE" inspect "$OUT" | head -3

echo "== 7. eval"
for split in test2 unseen; do
  "$NEEDLE" eval --weights "$OUT" "train/data/$split.jsonl"
done
NEEDLE_DROPIN_MODEL="$ROOT/$OUT" bash tests/official_client/dropin.sh build
