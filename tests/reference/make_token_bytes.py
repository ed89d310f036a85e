"""Writes tests/data/bpe8192_token_bytes.hex: the bytes each token of the Needle 2 BPE-8192
vocabulary contributes to the text, one token id per line, hex-encoded. U+2581 becomes a
space, byte pieces <0xNN> their byte; control, unknown and marker pieces (ids 0-13) are
empty, because the grammar mask must never let a marker into the call JSON.
Used by tests/unit/test_grammar_walk.c (mask versus brute force, mask timing).
Run: python3 -m venv /tmp/spv && /tmp/spv/bin/pip install sentencepiece &&
     /tmp/spv/bin/python tests/reference/make_token_bytes.py [path/to/needle-bpe8192.model]"""
import os
import sys

import sentencepiece as spm

model = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/models/needle-bpe8192.model"
sp = spm.SentencePieceProcessor(model_file=model)
lines = []
for i in range(sp.get_piece_size()):
    piece = sp.id_to_piece(i)
    if sp.is_control(i) or sp.is_unknown(i) or 4 <= i <= 13:
        b = b""
    elif sp.is_byte(i):
        b = bytes([int(piece[3:5], 16)])
    else:
        b = piece.replace("\u2581", " ").encode("utf-8")
    lines.append(b.hex())
out = os.path.join(os.path.dirname(__file__), "..", "data", "bpe8192_token_bytes.hex")
with open(out, "w") as f:
    f.write("# token bytes of needle-bpe8192.model, one token id per line, hex; U+2581 -> space;\n"
            "# control, unknown and marker pieces (ids 0-13) are empty. "
            "Written by tests/reference/make_token_bytes.py\n")
    f.write("\n".join(lines) + "\n")
