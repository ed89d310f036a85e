"""Training examples as token ids for the C trainer: the batch format of `needle grad
--batch` (issue 32), one JSON line {"ids": [...], "mask": [...]} per example, every line
padded with <pad> (mask 0) to one length: the longest example, capped by --max-len.
Ids and mask are render3.encode's (BOS, prompt, target, EOS; the loss on target and EOS),
with the SentencePiece model given (the venv's sentencepiece).

    python train/encode3.py --data train/data/train3.jsonl --tok train/data/needle3-tok4096.model \\
        --out train/work3/batch.jsonl [--limit 64] [--max-len 1024]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render3 as R  # noqa: E402


def batch_lines(rows, encode_text, max_len):
    """The padded {"ids", "mask"} records of `rows` (examples), as JSON texts."""
    encoded = [R.encode(encode_text, ex, max_len) for ex in rows]
    width = max((len(ids) for ids, _ in encoded), default=0)
    out = []
    for ids, mask in encoded:
        pad = width - len(ids)
        out.append(json.dumps({"ids": ids + [R.PAD_ID] * pad, "mask": mask + [0] * pad},
                              separators=(",", ":")))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--tok", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=1024)
    a = ap.parse_args()
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor()
    sp.Load(a.tok)
    with open(a.data, encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(a.limit), f)]
    lines = batch_lines(rows, sp.encode, a.max_len)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.writelines(line + "\n" for line in lines)
    print(f"wrote {len(lines)} examples to {a.out}")


if __name__ == "__main__":
    main()
