#!/bin/sh
# The README's worked example (train/finetune_example.sh) CI-sized, so its commands cannot
# rot: 16 composed examples for the six tools + 16 of the demo's mix, one epoch of LoRA
# steps of 4 rows on the demo model (the fine-tune builds and scores its held-out split),
# 4 eval lines per set; checks that every stage ran and wrote its report. About 40 s on 2
# shared cores.
# usage: sh tests/integration/finetune_example.sh PROJECT_ROOT   (NEEDLE_CLI: the CLI to run)
set -eu
root=$1
work=$(mktemp -d /tmp/needle_finetune_example_XXXXXX)
cli=${NEEDLE_CLI:-$root/build/needle}
case $cli in /*) ;; *) cli=$(pwd)/$cli ;; esac
out=$work/log.txt
if ! NEEDLE="$cli" EXAMPLES=16 MIX=16 BATCH=4 EPOCHS=1 EVAL_LIMIT=4 YOURS=6 THREADS=2 \
    sh "$root/train/finetune_example.sh" "$work/run" > "$out" 2>&1; then
    cat "$out"
    echo "FAIL: train/finetune_example.sh exited non-zero"
    exit 1
fi
fail=0
for want in "wrote 16 unseen-tool training examples" "data      32 examples" \
    "built     " "held-out examples" "fine-tune wall time:" "unseen  before  exact match" \
    "unseen  after   exact match" "test2   before  exact match" "test2   after   exact match" \
    "heldout before  exact match" "heldout after   exact match" \
    "yours   before  exact match" "yours   after   exact match"; do
    if ! grep -q "$want" "$out"; then
        echo "FAIL: no \"$want\" in the output"
        fail=1
    fi
done
# the composed data uses only the six unseen tools in its answers
if grep -o '"answers": \[{"name": "[a-z_]*"' "$work/run/unseen_train.jsonl" |
    grep -v -E 'book_flight|add_to_shopping_list|start_workout|log_expense|set_fan_speed|find_recipe' |
    grep -q .; then
    echo "FAIL: an answer calls a tool outside the six"
    fail=1
fi
[ -s "$work/run/unseen_lora.cact" ] || { echo "FAIL: no built .cact"; fail=1; }
[ "$(wc -l < "$work/run/yours.jsonl")" -eq 6 ] || { echo "FAIL: yours.jsonl is not 6 lines"; fail=1; }
[ "$(wc -l < "$work/run/mix.jsonl")" -eq 32 ] || { echo "FAIL: the mix is not 16 + 16 lines"; fail=1; }
if [ $fail -ne 0 ]; then
    cat "$out"
    exit 1
fi
rm -rf "$work"
echo "ok: the worked example ran CI-sized"
