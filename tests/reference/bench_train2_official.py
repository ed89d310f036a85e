#!/usr/bin/env python3
"""The official 2.0.15 training step's speed, for comparison with needle-train2-bench
(issue 32's benchmark; figures only): the LoRA step on the released Needle 2 geometry
(`needle-train2-bench --weights needle2-shape-random.cact --lora 16 --quant`), or with
--full the float full-parameter loss + gradient on the demo geometry (`needle-train2-bench`).

jax.jit of value_and_grad of finetune_local's loss (merge_lora, cq_ste_params at W4,
quant=True after configure_deploy(8, 8)) on random weights at the released shapes (d 512,
27 layers, 8/4 heads of 64, 4 lanes, engram sites 2 and 15 of 4 x 8192 x 128, vocab 8192),
LoRA rank R on the official targets, a batch of B x T random tokens. Prints the compile
time and the tokens per second of the compiled step (the mean of --steps runs).

Usage: bench_train2_official.py [--full] [--batch B] [--tokens T] [--rank R] [--steps S]
"""
import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("NEEDLE_TELEMETRY", "0")

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from needle.model import architecture as A  # noqa: E402
from needle.model import quantize as Q  # noqa: E402
from needle.model import finetune as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as V2  # noqa: E402

RELEASED = dict(vocab_size=8192, d_model=512, num_heads=8, num_kv_heads=4, num_layers=27,
                max_seq_len=2048, rope_theta=100000.0, mhc_lanes=4, engram_orders=(2, 3),
                engram_slots=8192, engram_layers=(2, 15))
# models/needle-demo.cact's geometry
DEMO = dict(vocab_size=4096, d_model=256, num_heads=4, num_kv_heads=2, num_layers=6,
            max_seq_len=1024, rope_theta=10000.0, mhc_lanes=4, engram_orders=(2, 3),
            engram_heads=1, engram_slots=4096, engram_layers=(1, 4))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--demo", action="store_true", help="the LoRA step on the demo geometry")
    a = ap.parse_args()
    geom = DEMO if a.full or a.demo else RELEASED
    cfg = A.TransformerConfig(dtype="float32", **geom)
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32),
                          V2.random_params(cfg, 7, emb_std=0.02, heads=False))
    rng = np.random.default_rng(7)
    from flax.traverse_util import flatten_dict
    fp = flatten_dict(params)
    lora = {}
    for path in F.lora_target_paths(params):
        w = fp[path]
        lead, din, dout = w.shape[:-2], w.shape[-2], w.shape[-1]
        lora[path] = {"A": jnp.asarray(rng.standard_normal(lead + (din, a.rank)) / a.rank, jnp.float32),
                      "B": jnp.asarray(1e-3 * rng.standard_normal(lead + (a.rank, dout)), jnp.float32)}
    ids = jnp.asarray(rng.integers(1, geom["vocab_size"], (a.batch, a.tokens)), jnp.int32)
    mask = jnp.ones((a.batch, a.tokens), jnp.float32)
    model = A.SimpleAttentionNetwork(cfg)
    Q.configure_deploy(act_bits=8, kv_bits=8)
    scale = 2.0

    def loss_fn(lo):
        merged = Q.cq_ste_params(F.merge_lora(params, lo, scale), 4)
        logits = model.apply({"params": merged}, ids, quant=True)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], ids[:, 1:])
        m = mask[:, 1:]
        return (ce * m).sum() / jnp.maximum(m.sum(), 1.0)

    def full_loss(p):
        logits = model.apply({"params": p}, ids, quant=False)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], ids[:, 1:])
        m = mask[:, 1:]
        return (ce * m).sum() / jnp.maximum(m.sum(), 1.0)

    step = jax.jit(jax.value_and_grad(full_loss if a.full else loss_fn))
    arg = params if a.full else lora
    t0 = time.time()
    loss, g = step(arg)
    jax.block_until_ready(g)
    compile_s = time.time() - t0
    times = []
    for _ in range(a.steps):
        t0 = time.time()
        loss, g = step(arg)
        jax.block_until_ready(g)
        times.append(time.time() - t0)
    sec = sum(times) / len(times)
    what = ("float full-parameter loss + gradient, demo geometry" if a.full else
            f"LoRA r={a.rank} step (CQ W4 STE + A8, loss + gradient), "
            f"{'demo' if a.demo else 'released Needle 2'} geometry")
    print(f"official 2.0.15 {what}, batch {a.batch}x{a.tokens}: compile {compile_s:.1f} s, "
          f"step {sec:.2f} s, {a.batch * a.tokens / sec:.1f} tok/s, loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
