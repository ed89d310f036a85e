#!/usr/bin/env python3
"""Fixtures for `needle build`, made by the official cactus-needle 3.2.8 build.

A small random Needle 3 checkpoint in the official checkpoint format (checkpoints.
write_checkpoint: format_version 2, the TransformerConfig in the safetensors metadata,
F16 leaves, the three probe heads and ladder_widths set so the build's changes to the
config show), an adapter in the official format (checkpoints.write_adapter) over every
LoRA target the official fine-tuner picks (finetune.lora_target_paths), with random A
and B (the fine-tuner starts B at zero, which would merge nothing), and the official
`needle build` (model.build.build_main, the CLI's code) run on them:

  build/ckpt.safetensors, build/lora.safetensors   the inputs (committed)
  build/finetuned.safetensors   an adapter the official `needle finetune` trained on the
      checkpoint (finetune.finetune_local: one epoch over tests/fixtures/finetune/data.jsonl,
      rank 4, --max-len 128, no held-out split; the tiny test tokenizer in place of the
      downloaded one), built as the case "finetuned"
  build/manifest.json   per case: the build's arguments and the output's size and SHA-256

The build fetches "the published base archive" for the tokenizer (and copies it when
there is nothing to merge or cut); here fetch.fetch_weights is pointed at the committed
tests/fixtures/v3/v3c.cact, the base the test passes to our build as --weights.

The safetensors writer orders the header's metadata differently from run to run, so a
rerun rewrites ckpt.safetensors and lora.safetensors with the same tensors and values
but other bytes; the digests of the builds do not change.

Usage: make_build_fixtures.sh   (in the pinned venv tests/reference/.venv3)
"""
import argparse
import hashlib
import json
import os
import shutil
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np  # noqa: E402
import jax  # noqa: E402
import ml_dtypes  # noqa: E402,F401

from needle.agent import fetch  # noqa: E402
from needle.model import architecture as A  # noqa: E402
from needle.model import build as B  # noqa: E402
from needle.model import checkpoints as C  # noqa: E402
from needle.model import finetune as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_export_fixtures_v3 as X  # noqa: E402  (param_shapes, random_params)

FIX = os.path.join(os.path.dirname(HERE), "fixtures")
OUT = os.path.join(FIX, "build")
BASE = os.path.join(FIX, "v3", "v3c.cact")
WORK = os.path.join(HERE, "work", "build-official")

# v3_a's geometry of the export fixtures without its kv_window cap and with a long
# max_seq_len, so the KV budget binds and its window differs between the full depth and
# a rung (the build recomputes it for the rung's layers)
GEOM = dict(vocab_size=512, out_vocab=500, d_model=96, num_heads=4, num_kv_heads=2, num_layers=4,
            qk_head_dim=16, v_head_dim=24, max_seq_len=131072, rope_theta=10000.0, mhc_lanes=2,
            engram_orders=(2, 3), engram_slots=64, engram_layers=(1, 3), global_layers=(1, 3),
            sliding_window=16, qkv_conv_taps=3, embedding_dim=32, ladder_widths=(2,),
            engram_seed_heads=3)
RANK, ALPHA = 4, 8.0

# jnp.matmul's float32 bits for A @ B on these (lead, in, rank, out): the fixture's LoRA
# shapes, the released geometry's (d 768; q 576, k 96, v 128, gate / out 768) at the
# default rank 16 and others, and widths of each summation class. A and B come from a
# formula the C test computes too (formula_matrix), so only digests are committed.
MATMUL_SHAPES = [
    (4, 96, 4, 64), (4, 96, 4, 32), (4, 96, 4, 48), (4, 96, 4, 96),
    (20, 768, 16, 576), (20, 768, 16, 96), (20, 768, 16, 128), (20, 768, 16, 768),
    (20, 768, 8, 96), (20, 768, 32, 576), (2, 96, 16, 48), (2, 96, 16, 80), (2, 96, 5, 96),
    (2, 96, 7, 64), (1, 64, 16, 24),
]


def formula_matrix(n, mult):
    """n float32 values in [-0.5, 0.5): exact 24-bit fractions of a multiplicative hash"""
    i = np.arange(n, dtype=np.uint64)
    h = (i * np.uint64(mult) + np.uint64(12345)) % np.uint64(1 << 32)
    return ((h >> np.uint64(8)).astype(np.float64) / float(1 << 24) - 0.5).astype(np.float32)


def matmul_digests():
    import jax.numpy as jnp
    out = []
    for lead, din, rank, dout in MATMUL_SHAPES:
        a = formula_matrix(lead * din * rank, 2654435761).reshape(lead, din, rank)
        b = formula_matrix(lead * rank * dout, 2246822519).reshape(lead, rank, dout)
        prod = np.asarray(jnp.matmul(jnp.asarray(a), jnp.asarray(b)), np.float32)
        out.append({"lead": lead, "in": din, "rank": rank, "out": dout,
                    "sha256": hashlib.sha256(prod.astype("<f4").tobytes()).hexdigest()})
    return out

CASES = {
    "lora": dict(lora=True, layers=None),
    "layers2": dict(lora=False, layers=2),
    "lora_layers2": dict(lora=True, layers=2),
    # the base archive has 3 layers: asking for its depth without an adapter copies it
    "layers3": dict(lora=False, layers=3),
    "copy": dict(lora=False, layers=None),
    "finetuned": dict(lora="finetuned.safetensors", layers=None),
}


def sha(path):
    with open(path, "rb") as f:
        data = f.read()
    return len(data), hashlib.sha256(data).hexdigest()


def main():
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(WORK, exist_ok=True)
    cfg = A.TransformerConfig(dtype="float32", **GEOM)
    params = X.random_params(cfg, 900, "F16")
    params = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float32).astype(np.float16), params)
    params = {k: (dict(v) if hasattr(v, "items") else v) for k, v in params.items()}
    ckpt = os.path.join(OUT, "ckpt.safetensors")
    saved = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.__dict__.items()}
    C.write_checkpoint(ckpt, {"format_version": 2, "params": params, "config": saved, "step": 7, "run": {}})

    paths = sorted(F.lora_target_paths(jax.tree_util.tree_map(np.asarray, params)))
    flat = dict(C.flatten(params))
    r = np.random.default_rng(901)
    lora = {}
    for path in paths:
        w = flat["/".join(path)]
        lead, din, dout = w.shape[:-2], w.shape[-2], w.shape[-1]
        lora["/".join(path)] = {"A": (r.standard_normal(lead + (din, RANK)) / RANK).astype(np.float32),
                                "B": (0.05 * r.standard_normal(lead + (RANK, dout))).astype(np.float32)}
    adapter = os.path.join(OUT, "lora.safetensors")
    C.write_adapter(adapter, {"lora": lora, "scale": ALPHA / RANK, "base": "ckpt.safetensors",
                              "rank": RANK, "seed": 0})

    # the merged kernels as the official build holds them before export (stored dtype)
    merged = F.merge_lora(params, {tuple(k.split("/")): v for k, v in lora.items()}, ALPHA / RANK)
    mflat = C.flatten(merged)
    merged_digests = {k: hashlib.sha256(np.asarray(mflat[k]).astype("<f2").tobytes()).hexdigest()
                      for k in sorted(lora)}

    finetuned = os.path.join(OUT, "finetuned.safetensors")
    if not os.path.exists(finetuned):
        from needle.model import tokenizer as T
        tok = T.SANTokenizer(os.path.join(FIX, "v3", "tiny_v3_bpe384.model"))
        F.get_tokenizer = lambda vocab_size=None: tok
        F.finetune_local(argparse.Namespace(
            jsonl_path=os.path.join(FIX, "finetune", "data.jsonl"), checkpoint=ckpt, epochs=1, batch_size=16,
            lr=1e-3, lora_rank=4, lora_alpha=8.0, max_len=128, val_split=0.0, seed=0, generate=0, score=False,
            checkpoint_dir=WORK, out=finetuned))

    fetch.fetch_weights = lambda generation=2, dest_dir=None, force=False: BASE
    manifest = {"package": "cactus-needle==3.2.8", "base": "v3/v3c.cact", "checkpoint": "ckpt.safetensors",
                "adapter": "lora.safetensors", "lora_targets": len(paths), "cases": {},
                "merged": merged_digests, "matmul": matmul_digests()}
    for name, case in CASES.items():
        out = os.path.join(WORK, name + ".cact")
        lora_path = os.path.join(OUT, case["lora"]) if isinstance(case["lora"], str) else adapter
        args = argparse.Namespace(checkpoint=ckpt, lora=lora_path if case["lora"] else None, out=out,
                                  upload=False, layers=case["layers"], platform=None)
        B.build_main(args)
        size, digest = sha(out)
        manifest["cases"][name] = {"lora": case["lora"], "layers": case["layers"], "bytes": size,
                                   "sha256": digest}
        print(f"{name}: {size} bytes {digest}", flush=True)
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
