"""SentencePiece BPE for the demo model, trained on the rendered training split.

Needle's special pieces sit at their fixed ids (spec §6.1): <pad> </s> <s> <unk> at 0-3,
the ten chat markers at 4-13 (user-defined symbols, never split), the 256 byte pieces
at 14-269 (byte fallback, so any UTF-8 text encodes). The trainer settings match the
ones the engine's tokenizer reproduces: identity normalization, a dummy prefix, and
whitespace kept as written.

    python train/train_tokenizer.py --data train/data/train.jsonl --out train/work/tok --vocab 4096
"""
import argparse
import json
import os

import sentencepiece as spm
from needle.model import finetune as F
from needle.model import tokenizer as T


def rendered_lines(path, limit):
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= limit:
                break
            prompt, target = F.render_example(json.loads(line))
            # prompt and target are encoded separately in training; so are they here
            yield prompt
            yield target


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True, help="output prefix (writes PREFIX.model)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--examples", type=int, default=20000)
    a = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    corpus = a.out + ".corpus.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        for text in rendered_lines(a.data, a.examples):
            # a newline inside a rendered text only splits it into two corpus lines: the
            # encoder spells "\n" with its byte piece either way
            f.write(text + "\n")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=a.out, model_type="bpe", vocab_size=a.vocab,
        character_coverage=1.0, byte_fallback=True, normalization_rule_name="identity",
        add_dummy_prefix=True, remove_extra_whitespaces=False, split_digits=True,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="</s>",
        bos_piece="<s>", unk_piece="<unk>", user_defined_symbols=list(T.CHAT_MARKERS),
        num_threads=2, input_sentence_size=0, shuffle_input_sentence=False,
        max_sentence_length=65536, minloglevel=2)
    os.remove(corpus)
    sp = spm.SentencePieceProcessor()
    sp.Load(a.out + ".model")
    want = ["<pad>", "</s>", "<s>", "<unk>"] + list(T.CHAT_MARKERS)
    assert [sp.IdToPiece(i) for i in range(14)] == want
    assert all(sp.IdToPiece(14 + b) == "<0x%02X>" % b for b in range(256))
    print(f"wrote {a.out}.model ({sp.GetPieceSize()} pieces)")


if __name__ == "__main__":
    main()
