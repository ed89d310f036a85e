#!/usr/bin/env python3
"""Fixtures for the training-data encoder (src/train/finetune_data.c, `needle encode-data`):
what the official fine-tuner of cactus-needle 3.2.8 makes of tests/fixtures/finetune/
data.jsonl (query/answers lines with reasoning, system, unicode, multi-call, empty answers,
tools and answers given as strings, odd number spellings; single-turn chat-format lines;
lines it skips), with the tiny Needle 3 test tokenizer (tests/fixtures/v3/
tiny_v3_bpe384.model, the tokenizer inside tests/fixtures/v3/v3c.cact):

  finetune/expected.json   per --max-len cap: the fitted sequence length
      (finetune.fit_max_len) and, per example read (finetune.read_examples), the rendered
      prompt and target (finetune.render_example) and the ids and loss mask of
      finetune._encode, without the trailing padding (n = the unpadded length)

Usage: make_finetune_data_fixtures.sh   (in the pinned venv tests/reference/.venv3)
"""
import json
import os

from needle.model import finetune as F
from needle.model import tokenizer as T

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(os.path.dirname(HERE), "fixtures")
DATA = os.path.join(FIX, "finetune", "data.jsonl")
CAPS = (1024, 128)


def main():
    tok = T.SANTokenizer(os.path.join(FIX, "v3", "tiny_v3_bpe384.model"))
    out = {"package": "cactus-needle==3.2.8", "data": "data.jsonl", "tokenizer": "v3/tiny_v3_bpe384.model",
           "caps": {}}
    for cap in CAPS:
        max_len = F.fit_max_len(DATA, tok, cap)
        rows = []
        for example in F.read_examples(DATA):
            prompt, target = F.render_example(example)
            ids, mask = F._encode(tok, example, max_len)
            n = min(2 + len(tok.encode(prompt)) + len(tok.encode(target)), max_len)
            assert all(i == T.PAD_ID for i in ids[n:]) and not any(mask[n:])
            rows.append({"prompt": prompt, "target": target, "n": n, "ids": ids[:n],
                         "mask": [int(m) for m in mask[:n]]})
        out["caps"][str(cap)] = {"max_len": max_len, "examples": rows}
        print(f"cap {cap}: {len(rows)} examples, max_len {max_len}", flush=True)
    with open(os.path.join(FIX, "finetune", "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
