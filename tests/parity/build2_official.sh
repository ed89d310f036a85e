#!/bin/sh
# `needle build` of a Needle 2 base + adapter against the official 2.0.15 merge_lora +
# write_export (tests/reference/check_build2.py, in the pinned venv tests/reference/.venv
# that scripts/reference-venv.sh makes): a 4-step LoRA fine-tune of the tiny Needle 2
# archive (tests/fixtures/tiny_cq4.cact), then both builds must be the same bytes. Skipped
# (77) without the venv. About 20 s (jax import and tracing).
# usage: sh tests/parity/build2_official.sh PROJECT_ROOT   (NEEDLE_CLI: the CLI to run)
set -eu
root=$1
py=$root/tests/reference/.venv/bin/python
if [ ! -x "$py" ] || ! "$py" -c "import needle.model.export" 2>/dev/null; then
    echo "skipped: no 2.0.15 reference venv at tests/reference/.venv"
    exit 77
fi
cli=${NEEDLE_CLI:-$root/build/needle}
work=$(mktemp -d /tmp/needle_build2_official_XXXXXX)
base=$root/tests/fixtures/tiny_cq4.cact
for i in 1 2 3 4; do
    echo '{"query": "timer 5", "tools": [{"name": "timer", "parameters": {"type": "object", "properties": {"m": {"type": "integer"}}}}], "answers": [{"name": "timer", "arguments": {"m": 5}}]}'
    echo '{"query": "call mom", "tools": [{"name": "call", "parameters": {"type": "object", "properties": {"who": {"type": "string"}}}}], "answers": [{"name": "call", "arguments": {"who": "mom"}}]}'
done > "$work/data.jsonl"
"$cli" finetune "$work/data.jsonl" -w "$base" --max-len 128 -t 2 --batch-size 2 --epochs 1 \
    --lr 5e-2 --val-split 0 --no-score -o "$work/a.safetensors" > "$work/log.txt" 2>&1 ||
    { cat "$work/log.txt"; exit 1; }
"$cli" build "$work/a.base.safetensors" --lora "$work/a.safetensors" -w "$base" -o "$work/a2.cact" -q
cmp "$work/a.cact" "$work/a2.cact"
JAX_PLATFORMS=cpu NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1 \
    "$py" "$root/tests/reference/check_build2.py" "$work/a.base.safetensors" "$work/a.safetensors" \
    "$base" "$work/a.cact"
rm -rf "$work"
