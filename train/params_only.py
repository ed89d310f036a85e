#!/usr/bin/env python3
"""Copy a training checkpoint without its optimizer state.

    python3 train/params_only.py IN.safetensors OUT.safetensors

`needle finetune --full` saves the AdamW moments with the parameters (tensors under
`optim/` and the `optim` metadata, src/train/checkpoint.h): three times the parameters'
bytes. What the next cycle of train/run3.sh starts from is the parameters alone (every
cycle starts its optimizer afresh), so this copy, a third of the size, is what a session
commits to hand a finished cycle over (train/cycles3/). Everything else is kept as it
is: the parameters' bytes, their order, and the metadata (`run` marks the file as
`needle finetune --full`'s, so `needle build` exports it). Standard library only.
"""
import json
import os
import struct
import sys

OPTIM_PREFIX = "optim/"


def params_only(src, dst):
    with open(src, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%s: too short for a safetensors file" % src)
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("%s: header runs past the end of the file" % src)
    header = json.loads(data[8:8 + n])
    base = 8 + n
    meta = header.pop("__metadata__", None) or {}
    meta.pop("optim", None)
    kept = [(k, v) for k, v in header.items() if not k.startswith(OPTIM_PREFIX)]
    kept.sort(key=lambda kv: kv[1]["data_offsets"][0])
    out_header, blobs, off = {}, [], 0
    if meta:
        out_header["__metadata__"] = meta
    for name, info in kept:
        a, b = info["data_offsets"]
        if not 0 <= a <= b <= len(data) - base:
            raise ValueError("%s: tensor %s lies outside the data" % (src, name))
        blobs.append(data[base + a:base + b])
        out_header[name] = {"dtype": info["dtype"], "shape": info["shape"],
                            "data_offsets": [off, off + (b - a)]}
        off += b - a
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, dst)
    return len(kept), len(header) - len(kept)


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    try:
        kept, dropped = params_only(argv[1], argv[2])
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.stderr.write("params_only.py: %s\n" % e)
        return 1
    print("%s: %d parameter tensors kept, %d optimizer tensors dropped" % (argv[2], kept, dropped))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
