"""Writes a Needle 2 parameter tree as the checkpoint `needle export` reads: a safetensors
file (every leaf float32, named by its tree path joined with "/") and the
TransformerConfig fields as JSON.

    python train/checkpoint_to_safetensors.py CHECKPOINT.pkl OUT_DIR

CHECKPOINT.pkl is a pickle holding {"params": tree, "config": TransformerConfig or dict}
(the official cactus-needle 2.x checkpoints, run.load_checkpoint's format, and this
repository's train/work/*/final.pkl, whose "config" is the geometry dict). Pickles run
code when loaded: convert only files you trust. Writes OUT_DIR/model.safetensors and
OUT_DIR/config.json. Needs only numpy (no safetensors package: the format is a length,
a JSON header and the raw little-endian data).
"""
import dataclasses
import json
import os
import pickle
import struct
import sys

import numpy as np

CONFIG_FIELDS = ("vocab_size", "d_model", "attn_dim", "num_heads", "num_kv_heads", "num_layers",
                 "max_seq_len", "rope_theta", "engram_orders", "engram_heads", "engram_slots",
                 "engram_layers", "mhc_lanes", "kv_window", "kv_bits", "weight_bits")


def flatten(tree, prefix=""):
    for k in sorted(tree):
        v = tree[k]
        name = f"{prefix}/{k}" if prefix else str(k)
        if hasattr(v, "items"):
            yield from flatten(dict(v), name)
        else:
            yield name, np.asarray(v)


def write_safetensors(path, params):
    header, blobs, off = {}, [], 0
    for name, arr in flatten(params):
        if arr.dtype.kind != "f":
            raise ValueError(f"{name}: dtype {arr.dtype} is not floating point")
        b = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def config_dict(config):
    if dataclasses.is_dataclass(config):
        config = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    out = {}
    for k in CONFIG_FIELDS:
        if k in config:
            v = config[k]
            out[k] = list(v) if isinstance(v, tuple) else v
    return out


def write_checkpoint(params, config, out_dir):
    """params: the flax tree; config: a TransformerConfig or a dict of its fields.
    Returns (safetensors path, config path)."""
    os.makedirs(out_dir, exist_ok=True)
    st = os.path.join(out_dir, "model.safetensors")
    cj = os.path.join(out_dir, "config.json")
    write_safetensors(st, params)
    with open(cj, "w") as f:
        json.dump(config_dict(config), f, indent=1, sort_keys=True)
        f.write("\n")
    return st, cj


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1], "rb") as f:
        ckpt = pickle.load(f)
    st, cj = write_checkpoint(ckpt["params"], ckpt.get("config", {}), sys.argv[2])
    print(f"wrote {st} and {cj}")


if __name__ == "__main__":
    main()
