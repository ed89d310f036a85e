"""Writes tests/fixtures/train3/tok4096.cases: texts and the ids SentencePiece gives them
with train/data/needle3-tok4096.model, for tests/parity/test_tokenizer3_data.c (needle's C
tokenizer must give the same ids). One JSON array [text, [ids...]] a line. The texts:
rendered prompts and targets of composed training examples and of the held-out sets,
every non-ASCII answer value of test2/unseen, the tokenizer's alphabet lines and a few
edge cases. Run with the reference venv's python (it has sentencepiece):

    tests/reference/.venv3/bin/python tests/reference/make_tok3_cases.py
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "train"))
import compose3 as C3  # noqa: E402
import render3 as R  # noqa: E402
import train_tokenizer3 as T  # noqa: E402
import sentencepiece as spm  # noqa: E402

sp = spm.SentencePieceProcessor()
sp.Load(os.path.join(ROOT, "train", "data", "needle3-tok4096.model"))
texts = []
for ex in C3.make_split3(30, 7):
    texts += R.render(ex)
for name in ("test2", "unseen"):
    with open(os.path.join(ROOT, "train", "data", name + ".jsonl"), encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < 20:
                texts += R.render(json.loads(line))
heldout = [os.path.join(ROOT, "train", "data", n + ".jsonl") for n in ("test2", "unseen")]
texts += sorted(set(T.non_ascii_values(heldout)))
texts += list(T.alphabet_lines())
texts += ["", " ", "  two  spaces ", "12345 and 6.75", "tab\there\nnew line", "健北太 🎉 ✈️",
          "<tool_call>[]</tool_call><|im_end|>", "<schema>{}</schema><context>x</context>"]
out = os.path.join(ROOT, "tests", "fixtures", "train3", "tok4096.cases")
with open(out, "w", encoding="utf-8") as f:
    for t in texts:
        f.write(json.dumps([t, sp.encode(t)], ensure_ascii=False, separators=(",", ":")) + "\n")
print(f"wrote {len(texts)} cases to {out}")
