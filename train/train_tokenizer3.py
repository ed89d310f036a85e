"""SentencePiece BPE for a Needle 3 default model, trained on the rendered third-generation
data (compose3.py rendered by render3.py, prompt and target as separate texts, as the
model sees them).

The special pieces sit where the official 3.x tokenizer has them (cactus-needle 3.2.8,
needle/model/tokenizer.py): <pad> </s> <s> <unk> at 0-3, the 16 chat markers in the
package's CHAT_MARKERS order at 4-19 (user-defined symbols, never split: <|im_start|> 4,
<|im_end|> 5, ... <tool_call> 10, </tool_call> 11, ... </schema> 19), then the 256 byte
pieces at 20-275 (byte fallback: any UTF-8 encodes). Digits are split one per piece;
identity normalization, a dummy prefix, whitespace kept as written (the settings
needle's C tokenizer reproduces).

    python train/train_tokenizer3.py --data train/data/train3.jsonl --out train/work3/tok --vocab 6144
    python train/train_tokenizer3.py --measure train/work3/tok.model [--heldout train/data/test2.jsonl ...]

--measure prints pieces per example and how the non-ASCII answer values of the held-out
files are covered: the share of their non-ASCII characters spelled by non-byte pieces
and the share of values spelled with no byte piece at all.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render3 as R  # noqa: E402

FIRST_BYTE_ID = 4 + len(R.MARKERS)      # 20

# Letters of the scripts people's names, places and messages come in, each added to the
# corpus once so that every one is a piece of its own (character_coverage 1.0 keeps
# every character of the corpus): a value in one of these scripts is then spelled with
# pieces the model has embeddings for, never with 2-4 byte pieces, even when its letters
# never occur in the training data (held-out names do). Latin-1 and Latin Extended-A/B
# and Additional (Vietnamese), Greek, Cyrillic, kana, and a few dozen emoji and symbols
# people type. CJK ideographs are far too many for a 4-8k vocabulary: only those of the
# data get pieces.
ALPHABET_RANGES = [(0x00A1, 0x00FF), (0x0100, 0x024F), (0x1E00, 0x1EFF), (0x0370, 0x03FF),
                   (0x0400, 0x04FF), (0x3041, 0x3096), (0x30A1, 0x30FA), (0x1F600, 0x1F64F),
                   (0x1F389, 0x1F38A), (0x2600, 0x2606), (0x2705, 0x2705), (0x2708, 0x2709),
                   (0x2713, 0x2714), (0x2764, 0x2764), (0x1F44D, 0x1F44E), (0x1F525, 0x1F525),
                   (0x1F680, 0x1F697), (0x20AC, 0x20AC), (0x2022, 0x2026), (0xFE0F, 0xFE0F)]


def alphabet_lines():
    import unicodedata
    for lo, hi in ALPHABET_RANGES:
        chars = [chr(c) for c in range(lo, hi + 1)
                 if unicodedata.category(chr(c))[0] in "LSP" or c == 0xFE0F]
        yield " ".join(chars)


def rendered_texts(path, limit):
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= limit:
                break
            yield from R.render(json.loads(line))


def train(data, out, vocab, examples):
    import sentencepiece as spm
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    corpus = out + ".corpus.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        for text in rendered_texts(data, examples):
            # a newline in a rendered text only splits it into two corpus lines: the
            # encoder spells "\n" with its byte piece either way
            f.write(text + "\n")
        for line in alphabet_lines():
            f.write(line + "\n")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=out, model_type="bpe", vocab_size=vocab,
        character_coverage=1.0, byte_fallback=True, normalization_rule_name="identity",
        add_dummy_prefix=True, remove_extra_whitespaces=False, split_digits=True,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="</s>",
        bos_piece="<s>", unk_piece="<unk>", user_defined_symbols=list(R.MARKERS),
        num_threads=2, input_sentence_size=0, shuffle_input_sentence=False,
        max_sentence_length=65536, minloglevel=2)
    os.remove(corpus)
    sp = spm.SentencePieceProcessor()
    sp.Load(out + ".model")
    check_layout(sp)
    print(f"wrote {out}.model ({sp.GetPieceSize()} pieces)")


def check_layout(sp):
    want = ["<pad>", "</s>", "<s>", "<unk>"] + list(R.MARKERS)
    got = [sp.IdToPiece(i) for i in range(len(want))]
    assert got == want, f"special pieces {got}"
    for b in range(256):
        assert sp.IdToPiece(FIRST_BYTE_ID + b) == "<0x%02X>" % b, f"byte piece {b}"
    assert all(sp.IdToPiece(sp.PieceToId(str(d))) == str(d) for d in range(10))


def non_ascii_values(paths):
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                for call in json.loads(line)["answers"]:
                    for v in call["arguments"].values():
                        if isinstance(v, str) and any(ord(c) > 127 for c in v):
                            out.append(v)
    return out


def measure(model, data, heldout, examples):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor()
    sp.Load(model)
    check_layout(sp)
    is_byte = lambda i: FIRST_BYTE_ID <= i < FIRST_BYTE_ID + 256     # noqa: E731
    stats = {"model": os.path.basename(model), "pieces": sp.GetPieceSize()}
    for name, path in [("train", data)] + [(os.path.basename(p), p) for p in heldout]:
        if not path:
            continue
        n, total = 0, 0
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if i >= examples:
                    break
                ids, _ = R.encode(sp.encode, json.loads(line))
                n, total = n + 1, total + len(ids)
        stats[f"pieces/example {name}"] = round(total / max(n, 1), 1)
    values = non_ascii_values(heldout)
    chars = whole = 0
    nchars = 0
    for v in values:
        # a value is copied inside a JSON string after a quote: no dummy prefix there
        ids = sp.encode(v)
        pieces = [sp.IdToPiece(i) for i in ids]
        whole += not any(is_byte(i) for i in ids)
        for i, pc in zip(ids, pieces):
            if not is_byte(i):
                chars += sum(ord(c) > 127 and c != "\u2581" for c in pc)
        nchars += sum(ord(c) > 127 for c in v)
    stats["non-ASCII values"] = len(values)
    stats["their non-ASCII chars in non-byte pieces"] = f"{100 * chars / max(nchars, 1):.1f}%"
    stats["values with no byte piece"] = f"{100 * whole / max(len(values), 1):.1f}%"
    print(json.dumps(stats, ensure_ascii=False))
    return stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="training JSONL (compose3.py's train3.jsonl)")
    ap.add_argument("--out", help="output prefix (writes PREFIX.model)")
    ap.add_argument("--vocab", type=int, default=6144)
    ap.add_argument("--examples", type=int, default=20000)
    ap.add_argument("--measure", metavar="MODEL")
    ap.add_argument("--heldout", nargs="*", default=[])
    a = ap.parse_args()
    if a.measure:
        measure(a.measure, a.data, a.heldout, a.examples)
    elif a.data and a.out:
        train(a.data, a.out, a.vocab, a.examples)
    else:
        ap.error("give --data and --out to train, or --measure MODEL")


if __name__ == "__main__":
    main()
