#!/usr/bin/env bash
# The recipe of the Needle 3 default model (issue 35), resumable: every stage whose output
# exists is skipped, so a session reruns it and picks up where the last one stopped.
#
#   bash train/run3.sh [MINUTES]         # MINUTES: the trainer's wall-clock budget (default 60)
#
#   1. tokenizer  train/data/needle3-tok4096.model (committed; RETRAIN_TOKENIZER=1 trains it
#                 again with train_tokenizer3.py on a fresh draw: a new tokenizer
#                 invalidates every checkpoint made with the old one); its coverage of the
#                 held-out sets is measured
#   2. init       train/work3/s8x256/init/{init.safetensors,config.json}: init3.py (its
#                 GEOMETRY: 8 layers x 256, 5.59 M parameters, the reasons in its
#                 docstring), the official 3.2.8 init, seeded, in the official checkpoint
#                 format
#   3. smoke      the init through `needle export --v3` and `needle run` (answers
#                 meaningless), once: the chain works before compute is spent on it
#   4. cycles     training in cycles of TRAIN3_CYCLE_EXAMPLES (36,000) fresh examples,
#                 one epoch each, warm-up and cosine decay within the cycle (a restart
#                 per cycle: each ends annealed, so each can be scored and shipped).
#                 Cycle k (train/work3/s8x256/cK/): its data drawn by compose3.py with seed
#                 6 + k (every draw is on the training side of the held-out hash). The
#                 mix: cycle 1 22% refusals; cycle 2 --refusal-boost 0.15 (34%, test2's
#                 share: cycle 1 refused too rarely); from cycle 3 on --refusal-boost
#                 TRAIN3_REFUSAL_BOOST (0.10) and --unrelated TRAIN3_UNRELATED (0.10):
#                 requests for undeclared tools among unrelated demo tools, the refusals
#                 of unseen.jsonl, which cycle 2 answered with the nearest demo tool. Its
#                 start the init (k = 1) or cycle k-1's checkpoint, `needle finetune
#                 --full` (the C trainer, float) until MINUTES run out, then SIGINT: the
#                 state is saved and the next run resumes the cycle bit for bit. A cycle
#                 that finishes builds cK/model.cact (needle build's code, CQ4, the
#                 init's tokenizer) and is calibrated and scored (stages 5, 6); the
#                 next cycle starts while minutes remain, up to TRAIN3_CYCLES (6).
#   5. calibrate  per cycle, the confidence head trained on the engine's answers to
#                 TRAIN3_CAL_EXAMPLES (3,000) fresh examples (seed 1000 + k, none of the
#                 cycle's queries; `needle calibrate`, 30 epochs, a fifth held out):
#                 cK/calibrated.safetensors, cK/model-cal.cact, cK/calibrate.txt
#   6. eval       per cycle, `needle eval --json` on test2.jsonl and unseen.jsonl
#                 (cK/eval-test2.json, cK/eval-unseen.json: by category, confidence
#                 calibration, latency) and the six official environments
#                 (tests/official_client/dropin.sh with the cycle's model, cK/envs.txt)
#
# Flags: TRAIN3_LR (1e-3), TRAIN3_BATCH (16), TRAIN3_MAX_LEN (512), TRAIN3_THREADS (1),
# TRAIN3_WORK (the folder, train/work3/s8x256), TRAIN3_HANDOVER (train/cycles3),
# TRAIN3_SCORE (1; 0 trains and builds without stages 5 and 6).
# Hand-over: a finished cycle's parameters (no optimizer state: train/params_only.py,
# ~22 MB) go to TRAIN3_HANDOVER/cK.safetensors, to be committed; a run on a machine
# without train/work3/ (a new machine) takes cycle K from there instead of training it
# again, so the session that trains cycle K + 1 starts where the last one ended.
# Shipping is a decision, not a stage: a cycle's model replaces models/needle-demo.cact only
# when it beats it on every held-out set (train/README.md keeps the table).
# Exit status: 0 when TRAIN3_CYCLES cycles are done, 4 when the minutes ran out first
# (rerun to go on), else the failing stage's. Needs PyPI the first time (the 3.2.8 venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MINUTES="${1:-60}"
DEADLINE=$(( $(date +%s) + MINUTES * 60 ))
PER_CYCLE="${TRAIN3_CYCLE_EXAMPLES:-36000}"
CYCLES="${TRAIN3_CYCLES:-6}"
WORK="${TRAIN3_WORK:-train/work3/s8x256}"
HANDOVER="${TRAIN3_HANDOVER:-train/cycles3}" # finished cycles' parameters, committed
TOK=train/data/needle3-tok4096.model
NEEDLE=./build/needle
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

echo "== 1. tokenizer"
if [ "${RETRAIN_TOKENIZER:-0}" = 1 ]; then
  python3 train/compose3.py --out "$WORK/tok" --train 20000 --seed 7
  "$(venv3)" train/train_tokenizer3.py --data "$WORK/tok/train3.jsonl" --out "${TOK%.model}" \
    --vocab 4096 --examples 20000
fi
if [ ! -s "$WORK/tokenizer.txt" ]; then
  python3 train/compose3.py --out "$WORK/tok" --train 2000 --seed 7 > /dev/null
  "$(venv3)" train/train_tokenizer3.py --measure "$TOK" --data "$WORK/tok/train3.jsonl" \
    --examples 2000 --heldout train/data/test2.jsonl train/data/unseen.jsonl | tee "$WORK/tokenizer.txt"
fi

echo "== 2. init"
[ -s "$WORK/init/init.safetensors" ] || nice -n 5 "$(venv3)" train/init3.py --out "$WORK/init" --seed 35

echo "== 3. smoke"
if [ ! -s "$WORK/init.cact" ]; then
  "$NEEDLE" export "$WORK/init/init.safetensors" --config "$WORK/init/config.json" --v3 \
    -t "$TOK" -o "$WORK/init.cact" -q
  "$NEEDLE" run -w "$WORK/init.cact" --tools train/data/tools.json -n 16 \
    "set a timer for 10 minutes" > /dev/null
  echo "the untrained init exports and runs ($WORK/init.cact)"
fi

calibrate() {  # the cycle's confidence head: cK/model-cal.cact (needle calibrate)
  local dir=$1 k=$2
  [ -s "$dir/model-cal.cact" ] && return 0
  # a fresh draw (seed 1000 + k) without the queries the cycle trained on
  python3 train/compose3.py --out "$dir/caldraw" --train $(( ${TRAIN3_CAL_EXAMPLES:-3000} * 11 / 10 )) \
    --seed $((1000 + k)) --refusal-boost 0.15 > /dev/null
  python3 - "$dir" "${TRAIN3_CAL_EXAMPLES:-3000}" <<'EOF'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
seen = {json.loads(l)["query"] for l in open(f"{d}/data.jsonl")}
rows = [l for l in open(f"{d}/caldraw/train3.jsonl") if json.loads(l)["query"] not in seen][:n]
open(f"{d}/cal.jsonl", "w").writelines(rows)
EOF
  rm -rf "$dir/caldraw"
  nice -n 5 "$NEEDLE" calibrate "$dir/ckpt.safetensors" "$dir/cal.jsonl" -w "$WORK/init.cact" \
    -o "$dir/calibrated.safetensors" --build-out "$dir/model-cal.cact.tmp" --epochs 30 \
    -t "${TRAIN3_THREADS:-1}" > "$dir/calibrate.txt"
  mv "$dir/model-cal.cact.tmp" "$dir/model-cal.cact"
}

evaluate() {  # the cycle's model on the held-out sets and the official environments
  local dir=$1 split
  for split in test2 unseen; do
    [ -s "$dir/eval-$split.json" ] && continue
    "$NEEDLE" eval --weights "$dir/model.cact" --json "train/data/$split.jsonl" > "$dir/eval-$split.tmp"
    mv "$dir/eval-$split.tmp" "$dir/eval-$split.json"
  done
  # with the calibrated head: the same answers (confidence decides nothing here), its own
  # confidence table
  for split in test2 unseen; do
    [ -s "$dir/model-cal.cact" ] && [ ! -s "$dir/cal-eval-$split.json" ] || continue
    "$NEEDLE" eval --weights "$dir/model-cal.cact" --json "train/data/$split.jsonl" > "$dir/cal-eval-$split.tmp"
    mv "$dir/cal-eval-$split.tmp" "$dir/cal-eval-$split.json"
  done
  if [ ! -s "$dir/envs.txt" ]; then
    NEEDLE_DROPIN_MODEL="$(realpath "$dir/model.cact")" bash tests/official_client/dropin.sh build \
      > "$dir/envs.tmp" 2>&1 || true   # the drop-in checks' verdict is not the model's score
    mv "$dir/envs.tmp" "$dir/envs.txt"
  fi
  python3 - "$dir" <<'EOF'
import json, re, sys
d = sys.argv[1]
# the curve: the mean training loss over each tenth of the cycle, and the validation loss
steps = [(int(m.group(1)), int(m.group(2)), float(m.group(3))) for m in
         re.finditer(r"step +(\d+)/(\d+) +loss ([0-9.]+)", open(f"{d}/log.txt").read())]
if steps:
    total, by = steps[-1][1], {}
    for step, _, loss in steps:
        by.setdefault(min(9, (step - 1) * 10 // total), []).append(loss)
    print("  loss by tenth: " + " ".join(f"{sum(v) / len(v):.3f}" for _, v in sorted(by.items())))
val = re.findall(r"epoch +\d+/\d+ +loss [0-9.]+ +val ([0-9.]+)", open(f"{d}/log.txt").read())
if val:
    print(f"  validation loss {val[-1]}")
for split in ("test2", "unseen"):
    j = json.load(open(f"{d}/eval-{split}.json"))
    c, cal = j["categories"], j["calibration"]
    print(f"  {split:7s} exact {j['exact_match']:.3f}  refusal {j['refusal_accuracy']:.3f}  "
          f"non-ASCII copied {j['non_ascii_copy_rate']}  single {c['single']['exact_match']}  "
          f"multi {c['multi']['exact_match']}  confidence error ratio {cal['error_ratio']}  "
          f"p50 {j['latency_ms']['p50']:.1f} ms")
    try:
        cj = json.load(open(f"{d}/cal-eval-{split}.json"))
        print(f"  {split:7s} with the calibrated head: confidence error ratio "
              f"{cj['calibration']['error_ratio']}")
    except OSError:
        pass
EOF
  grep -E 'pass|environment' "$dir/envs.txt" | tail -8 || true
}

echo "== 4. cycles"
for k in $(seq 1 "$CYCLES"); do
  dir="$WORK/c$k"
  mkdir -p "$dir"
  if [ ! -s "$dir/model.cact" ] && [ -s "$HANDOVER/c$k.safetensors" ]; then
    # finished in an earlier session, on another machine: its parameters were handed over
    # (committed); the next cycle starts from them. Scored when it was trained (the table
    # in train/README.md), so not scored again.
    cp "$HANDOVER/c$k.safetensors" "$dir/ckpt.safetensors"
    "$NEEDLE" build "$dir/ckpt.safetensors" --weights "$WORK/init.cact" --out "$dir/model.cact.tmp"
    mv "$dir/model.cact.tmp" "$dir/model.cact"
    touch "$dir/handed-over"
    echo "-- cycle $k: from the handed-over parameters $HANDOVER/c$k.safetensors"
  fi
  if [ -s "$dir/model.cact" ]; then
    if [ -e "$dir/handed-over" ] || [ "${TRAIN3_SCORE:-1}" = 0 ]; then continue; fi
    calibrate "$dir" "$k"
    evaluate "$dir"
    continue
  fi
  if [ ! -s "$dir/data.jsonl" ]; then
    boost=0 unrelated=0
    [ "$k" -eq 2 ] && boost=0.15
    [ "$k" -ge 3 ] && boost="${TRAIN3_REFUSAL_BOOST:-0.10}" unrelated="${TRAIN3_UNRELATED:-0.10}"
    python3 train/compose3.py --out "$dir/draw" --train "$PER_CYCLE" --seed $((6 + k)) \
      --refusal-boost "$boost" --unrelated "$unrelated" > /dev/null
    mv "$dir/draw/train3.jsonl" "$dir/data.jsonl"
    rmdir "$dir/draw"
  fi
  if [ "$k" = 1 ]; then start="$WORK/init/init.safetensors"; else start="$WORK/c$((k - 1))/ckpt.safetensors"; fi
  left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -le 60 ]; then
    echo "run3.sh: the minutes ran out before cycle $k; rerun to go on"
    exit 4
  fi
  RESUME=()
  [ -s "$dir/ckpt.safetensors" ] && RESUME=(--resume)
  echo "-- cycle $k from $start (${left} s left)"
  set +e
  timeout -s INT "$left" nice -n 5 "$NEEDLE" finetune "$dir/data.jsonl" --full \
    --checkpoint "$start" -w "$WORK/init.cact" --epochs 1 --batch-size "${TRAIN3_BATCH:-16}" \
    --lr "${TRAIN3_LR:-1e-3}" --max-len "${TRAIN3_MAX_LEN:-512}" --val-split 0.01 --seed 35 \
    --save-every 10 -t "${TRAIN3_THREADS:-1}" -o "$dir/ckpt.safetensors" \
    --build-out "$dir/model.cact" "${RESUME[@]}" 2>&1 | grep -v ': warning: ' | tee -a "$dir/log.txt"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 130 ]; then
    echo "run3.sh: stopped in cycle $k with the state saved in $dir; rerun to resume"
    exit 4
  fi
  [ "$rc" -eq 0 ] || exit "$rc"
  # the hand-over: the parameters without the optimizer state (a third of the checkpoint),
  # for a session to commit so that a machine lost with train/work3/ loses no cycle
  mkdir -p "$HANDOVER"
  python3 train/params_only.py "$dir/ckpt.safetensors" "$HANDOVER/c$k.safetensors"
  echo "run3.sh: cycle $k finished; commit $HANDOVER/c$k.safetensors ($(du -m "$HANDOVER/c$k.safetensors" | cut -f1) MB) to hand it over"
  if [ "${TRAIN3_SCORE:-1}" = 0 ]; then continue; fi
  calibrate "$dir" "$k"
  evaluate "$dir"
done
