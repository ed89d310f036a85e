#!/usr/bin/env python3
"""Times `needle build` against the official build (cactus-needle 3.2.8) on the released
Needle 3 geometry (TransformerConfig defaults): a random float32 checkpoint in the
official format and a rank-16 adapter over the official LoRA targets (written with the
official write_checkpoint / write_adapter into tests/reference/work/bench-build/), built
by both with --lora (and --layers 10), outputs compared byte for byte.

Usage: bench_build.sh NEEDLE_CLI BASE.cact   (BASE: a Needle 3 .cact whose tokenizer the
build embeds, e.g. /work/shared/models/needle3-shape-random.cact)"""
import dataclasses
import hashlib
import os
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np  # noqa: E402
import jax  # noqa: E402

from needle.model import architecture as A  # noqa: E402
from needle.model import checkpoints as C  # noqa: E402
from needle.model import finetune as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_export_fixtures_v3 as X  # noqa: E402

WORK = os.path.join(HERE, "work", "bench-build")


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main(cli, base):
    os.makedirs(WORK, exist_ok=True)
    ckpt, adapter = os.path.join(WORK, "ckpt.safetensors"), os.path.join(WORK, "lora.safetensors")
    if not os.path.exists(adapter):
        cfg = A.TransformerConfig(dtype="float32")
        params = X.random_params(cfg, 1234, "F16")
        params = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float32), params)
        params = {k: (dict(v) if hasattr(v, "items") else v) for k, v in params.items()}
        # every field (the instance __dict__ holds only what __init__ set)
        saved = {f.name: (list(getattr(cfg, f.name)) if isinstance(getattr(cfg, f.name), tuple)
                          else getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
        C.write_checkpoint(ckpt, {"format_version": 2, "params": params, "config": saved, "step": 0, "run": {}})
        flat = C.flatten(params)
        r = np.random.default_rng(5)
        lora = {}
        for path in sorted(F.lora_target_paths(jax.tree_util.tree_map(np.asarray, params))):
            w = flat["/".join(path)]
            lead, din, dout = w.shape[:-2], w.shape[-2], w.shape[-1]
            lora["/".join(path)] = {"A": (r.standard_normal(lead + (din, 16)) / 16).astype(np.float32),
                                    "B": (0.02 * r.standard_normal(lead + (16, dout))).astype(np.float32)}
        C.write_adapter(adapter, {"lora": lora, "scale": 2.0, "base": ckpt, "rank": 16, "seed": 0})
    print(f"checkpoint {os.path.getsize(ckpt) / 1e6:.1f} MB, adapter {os.path.getsize(adapter) / 1e6:.1f} MB",
          flush=True)
    for layers in (None, 10):
        extra = [] if layers is None else ["--layers", str(layers)]
        ours, official = os.path.join(WORK, f"ours{layers}.cact"), os.path.join(WORK, f"official{layers}.cact")
        t = time.time()
        subprocess.run([cli, "build", ckpt, "--lora", adapter, "-w", base, "-o", ours, "-q", *extra], check=True)
        t_ours = time.time() - t
        t = time.time()
        subprocess.run([sys.executable, os.path.join(HERE, "official_build.py"), ckpt, adapter, base, official,
                        *([str(layers)] if layers else [])], check=True, stdout=subprocess.DEVNULL)
        t_official = time.time() - t
        same = sha(ours) == sha(official)
        print(f"layers {layers or 'all'}: ours {t_ours:.1f} s, official {t_official:.1f} s, "
              f"{os.path.getsize(ours) / 1e6:.1f} MB, identical: {same}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
