"""The Needle 2 build of `needle build` / `needle finetune` against the official 2.0.15
build_main path: merge_lora in jax (float32) then write_export at W4 with the
KV-budget window, on our checkpoint and adapter files. Our file must be the same bytes.

usage (in the pinned 2.0.15 venv, tests/reference/.venv):
    python check_build2.py BASE.safetensors ADAPTER.safetensors BASE.cact OURS.cact

BASE.safetensors: a Needle 2 checkpoint with its config in the `config` metadata (what
`needle finetune -w demo.cact` writes beside the adapter). The official build embeds the
tokenizer get_tokenizer(vocab_size) finds; ours carries the base .cact's, so the official
exporter is given the base's RAW tokenizer blob (its _tokenizer_blob replaced): every
other byte is the official code's. Exit 0 when identical, 1 otherwise."""
import json
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack_from("<Q", raw, 0)[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = raw[8 + n:]
    dtypes = {"F32": np.float32, "F16": np.float16}
    tensors = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        tensors[name] = np.frombuffer(body[a:b], dtypes[t["dtype"]]).reshape(t["shape"]).astype(np.float32)
    return tensors, meta


def nest(flat):
    tree = {}
    for path, v in flat.items():
        node = tree
        parts = path.split("/")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return tree


def main():
    base_path, adapter_path, base_cact, ours = sys.argv[1:5]
    import jax.numpy as jnp
    from needle.model import export as E
    from needle.model.architecture import TransformerConfig, effective_kv_window
    from needle.model.finetune import merge_lora

    flat, meta = read_safetensors(base_path)
    config = TransformerConfig(**json.loads(meta["config"]))
    params = nest({k: jnp.asarray(v) for k, v in flat.items()})
    ad, ad_meta = read_safetensors(adapter_path)
    lora = {}
    for name, v in ad.items():
        if not name.startswith("lora/"):
            continue
        path, which = name[len("lora/"):].rsplit("/", 1)
        lora.setdefault(tuple(path.split("/")), {})[which] = jnp.asarray(v)
    merged = merge_lora(params, lora, float(json.loads(ad_meta["scale"])))

    info, records = E.read_export(base_cact)
    blob = records[-1]
    assert isinstance(blob, bytes), "the base .cact has no tokenizer record last"

    class Tok:
        vocab_size = config.vocab_size

    E._tokenizer_blob = lambda tok: blob
    official = E.build_export(merged, config, bits=4, tokenizer=Tok(),
                              kv_window=effective_kv_window(config))
    with open(ours, "rb") as f:
        mine = f.read()
    if mine == official:
        print(f"identical: {len(mine)} bytes, {len(lora)} merged groups")
        return 0
    diff = next(i for i in range(min(len(mine), len(official))) if mine[i] != official[i]) \
        if len(mine) == len(official) else -1
    print(f"DIFFERENT: ours {len(mine)} bytes, official {len(official)}; first differing byte {diff}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
