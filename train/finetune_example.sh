#!/bin/sh
# The README's worked example "Fine-tune the demo model for your tools", end to end:
#
#   1. training data for the six tools of train/data/unseen.jsonl that the demo model was
#      never trained on (book_flight, add_to_shopping_list, start_workout, log_expense,
#      set_fan_speed, find_recipe), composed by train/gen_data.py --unseen-train from
#      schema templates and phrasing parts of its own (no LLM; none of unseen.jsonl's
#      templates, value lists or queries, so the held-out set stays held out);
#   2. `needle eval` of the shipped demo (before) on unseen.jsonl, test2.jsonl (the demo's
#      own tools) and WORK/yours.jsonl (YOURS requests for the six tools drawn like the
#      training data: the same composer with another seed, none of its queries);
#   3. `needle finetune` (LoRA r16, the official 2.0.15 numerics) from the demo .cact,
#      which builds the fine-tuned .cact and scores its own held-out split;
#   4. `needle eval` of the built .cact on the same three sets (after), and of both models
#      on the fine-tune's own held-out split (WORK/unseen_lora.heldout.jsonl).
#
# usage: sh train/finetune_example.sh [WORK_DIR]      (default train/work/finetune_example)
# Knobs (environment): EXAMPLES (400), MIX (400: examples of the demo's own 27 tools, its
# second-generation training mix with its ~24% refusals, shuffled in so that learning six
# tools does not unlearn the others or refusing), REFUSALS (0.5: the refusal share of the
# six tools' data; 0.12 was the first recipe and collapsed refusal accuracy), NEAR_MISS
# (0.4: of those refusals, the share declaring other new tools as distractors), CHATTER
# (0.2: the share that are off-topic chatter with new tools declared), EPOCHS (3), BATCH
# (8), LR (3e-3), RANK (16) and ALPHA (32) of the LoRA, THREADS (0: all cores), MAX_STEPS
# (0: the whole schedule), EVAL_LIMIT (0: every line), YOURS (300), NEEDLE (the CLI,
# default build/needle). The README's numbers come from the defaults (train/README.md has the
# variants tried); the ctest `finetune_example` runs it CI-sized (a few examples, a
# short schedule, a few eval lines).
set -eu
cd "$(dirname "$0")/.."
NEEDLE=${NEEDLE:-build/needle}
WORK=${1:-train/work/finetune_example}
EXAMPLES=${EXAMPLES:-400}
MIX=${MIX:-400}
EPOCHS=${EPOCHS:-3}
BATCH=${BATCH:-8}
LR=${LR:-3e-3}
THREADS=${THREADS:-0}
MAX_STEPS=${MAX_STEPS:-0}
REFUSALS=${REFUSALS:-0.5}
NEAR_MISS=${NEAR_MISS:-0.4}
CHATTER=${CHATTER:-0.2}
RANK=${RANK:-16}
ALPHA=${ALPHA:-32}
EVAL_LIMIT=${EVAL_LIMIT:-0}
YOURS=${YOURS:-300}
DEMO=models/needle-demo.cact
mkdir -p "$WORK"

limit=""
[ "$EVAL_LIMIT" -gt 0 ] && limit="--limit $EVAL_LIMIT"
steps=""
[ "$MAX_STEPS" -gt 0 ] && steps="--max-steps $MAX_STEPS"

python3 train/gen_data.py --unseen-train "$EXAMPLES" --unseen-refusals "$REFUSALS" \
    --unseen-near-miss "$NEAR_MISS" --unseen-chatter "$CHATTER" --out "$WORK"
data=$WORK/unseen_train.jsonl
if [ "$MIX" -gt 0 ]; then
    python3 train/gen_data.py --out "$WORK/old" --train "$MIX" --test 0 --test2 0 --unseen 0 >/dev/null
    # one file, the two kinds shuffled together (a fixed seed: the same file every run)
    cat "$WORK/unseen_train.jsonl" "$WORK/old/train.jsonl" | python3 -c '
import random, sys
lines = sys.stdin.readlines()
random.Random(0).shuffle(lines)
sys.stdout.write("".join(lines))' > "$WORK/mix.jsonl"
    data=$WORK/mix.jsonl
fi

# "yours": requests for the six tools drawn like the training data (the same composer,
# another seed, no query of the training data), what a user who composed data for their
# tools would test on; unseen.jsonl's phrasings and values are the composer's held-out side
python3 train/gen_data.py --unseen-train "$(((YOURS * 4 + 2) / 3))" --seed 99 \
    --unseen-refusals 0.3 --unseen-near-miss "$NEAR_MISS" --unseen-chatter "$CHATTER" \
    --out "$WORK/yours" >/dev/null
python3 -c '
import json, sys
train = {json.loads(l)["query"] for l in open(sys.argv[1], encoding="utf-8")}
rows = [l for l in open(sys.argv[2], encoding="utf-8") if json.loads(l)["query"] not in train]
sys.stdout.write("".join(rows[:int(sys.argv[3])]))' "$data" "$WORK/yours/unseen_train.jsonl" "$YOURS" \
    > "$WORK/yours.jsonl"

# score MODEL NAME DATA WHEN: `needle eval` of MODEL on DATA into WORK/WHEN_NAME.txt
score() {
    # shellcheck disable=SC2086
    "$NEEDLE" eval -w "$1" $limit "$3" > "$WORK/$4_$2.txt"
}
score "$DEMO" unseen train/data/unseen.jsonl before
score "$DEMO" test2 train/data/test2.jsonl before
score "$DEMO" yours "$WORK/yours.jsonl" before

start=$(date +%s)
# shellcheck disable=SC2086
"$NEEDLE" finetune "$data" -w "$DEMO" --epochs "$EPOCHS" \
    --batch-size "$BATCH" --lr "$LR" --lora-rank "$RANK" --lora-alpha "$ALPHA" \
    -t "$THREADS" $steps \
    -o "$WORK/unseen_lora.safetensors" | tee "$WORK/finetune.txt"
end=$(date +%s)

if [ ! -f "$WORK/unseen_lora.cact" ]; then
    # a --max-steps run stops before the end of the schedule: build what it trained
    "$NEEDLE" build "$WORK/unseen_lora.base.safetensors" --lora "$WORK/unseen_lora.safetensors" \
        -w "$DEMO" -o "$WORK/unseen_lora.cact" -q
fi
tuned=$WORK/unseen_lora.cact
score "$tuned" unseen train/data/unseen.jsonl after
score "$tuned" test2 train/data/test2.jsonl after
score "$tuned" yours "$WORK/yours.jsonl" after
# the fine-tune's own held-out split (written when the whole schedule ran): lines of the
# training file it never trained on, half of them the demo's own mix
heldout=$WORK/unseen_lora.heldout.jsonl
if [ -s "$heldout" ]; then
    score "$DEMO" heldout "$heldout" before
    score "$tuned" heldout "$heldout" after
fi

echo
echo "fine-tune wall time: $((end - start)) s (load: $(uptime | sed 's/.*load average: //'))"
for set in yours unseen test2 heldout; do
    [ -f "$WORK/before_$set.txt" ] || continue
    printf '%-7s before  %s\n' "$set" "$(grep '^exact match' "$WORK/before_$set.txt")"
    printf '%-7s after   %s\n' "$set" "$(grep '^exact match' "$WORK/after_$set.txt")"
done
