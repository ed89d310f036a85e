#!/usr/bin/env python3
"""Writes the model of fuzz_chat: the first layer of the tiny Needle 2 checkpoint
(tests/fixtures/export/tiny.safetensors, random weights, 4 layers) as a 1-layer checkpoint,
exported by our exporter with the tiny tokenizer (tests/fixtures/tiny_bpe512.model).

    tests/fuzz/make_chat_model.py NEEDLE_BINARY OUT.cact

One layer instead of four makes each fuzz execution (a tools prompt prefilled, 24 tokens
decoded) about four times cheaper; what the target exercises (set_tools, the grammar,
the decode loop, the envelope) does not depend on the depth. Standard library only."""
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FIX = os.path.join(ROOT, "tests", "fixtures")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def first_layer(header, data, layers):
    """Tensors of the layer stack (leading dimension `layers`) cut to their first slice."""
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        raw = data[lo:hi]
        shape = list(info["shape"])
        if name.startswith("stack/") and name != "stack/final_norm/scale" and shape and shape[0] == layers:
            step = len(raw) // layers
            raw = raw[:step]
            shape[0] = 1
        out[name] = (info["dtype"], shape, raw)
    return out


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    needle, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(FIX, "export", "tiny.config.json")) as f:
        cfg = json.load(f)
    header, data = read_safetensors(os.path.join(FIX, "export", "tiny.safetensors"))
    tensors = first_layer(header, data, cfg["num_layers"])
    cfg["num_layers"] = 1
    # the engram of the 4-layer model sits on layer 1; the 1-layer model keeps it on 0
    cfg["engram_layers"] = [0]
    tensors = {k.replace("engrams_1/", "engrams_0/"): v for k, v in tensors.items()}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, cfg_path = os.path.join(tmp, "c.safetensors"), os.path.join(tmp, "c.json")
        write_safetensors(ckpt, tensors)
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        subprocess.run([needle, "export", ckpt, "--config", cfg_path, "-t",
                        os.path.join(FIX, "tiny_bpe512.model"), "-b", "4", "-q", "-o", out],
                       check=True)


if __name__ == "__main__":
    main()
