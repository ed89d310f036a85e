#!/usr/bin/env python3
"""The official JAX training step on needle-train-bench's geometry and batch (issue 32's
comparison): cactus-needle 3.2.8's network and losses, jax.jit of value_and_grad + the
optax update, CPU, random weights and tokens of the same shapes.

  --mode lora: the released Needle 3 geometry, LoRA rank R on the official targets
               (finetune.lora_target_paths / init_lora), the fine-tuning loss of
               finetune_local (cq_ste_params of the merged weights, quant=True after
               configure_deploy(act_bits=8, kv_bits=8)), clip 1.0 + adamw.
  --mode full: the train/init3.py geometry, every parameter trained, float (quant=False,
               no CQ), clip 1.0 + adamw: the step train/jax_throughput3.py times.

Prints one JSON line: compile seconds, per-step wall and CPU seconds (all threads), median
tokens per second and per CPU-second (the fairer figure on a shared machine).

    python bench/train/jax_step3.py --mode lora --batch 4 --tokens 256 --steps 3
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("NEEDLE_TELEMETRY", "0")
os.environ.setdefault("DO_NOT_TRACK", "1")

RELEASED = dict(vocab_size=8192, out_vocab=8192, d_model=768, num_heads=12, num_kv_heads=2,
                num_layers=20, qk_head_dim=48, v_head_dim=64, max_seq_len=8192,
                rope_theta=100000.0, sliding_window=1024, global_layers=(4, 9, 14, 19),
                qkv_conv_taps=3, mhc_lanes=4, engram_orders=(2, 3), engram_slots=18432,
                engram_layers=(3, 7, 11, 15, 19))
DEMO = dict(vocab_size=4096, out_vocab=4096, d_model=384, num_heads=6, num_kv_heads=2,
            num_layers=10, qk_head_dim=48, v_head_dim=64, max_seq_len=2048,
            rope_theta=100000.0, sliding_window=256, global_layers=(4, 9), qkv_conv_taps=3,
            mhc_lanes=4, engram_orders=(2, 3), engram_slots=4096, engram_layers=(3, 7))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("lora", "full"), default="lora")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--layers", type=int, default=0, help="fewer layers (a quick check of this script)")
    a = ap.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from needle.model import architecture as A
    from needle.model import finetune as F
    from needle.model import quantize as Q

    geom = dict(RELEASED if a.mode == "lora" else DEMO)
    if a.layers:
        geom.update(num_layers=a.layers, global_layers=(a.layers - 1,),
                    engram_layers=tuple(i for i in geom["engram_layers"] if i < a.layers) or (0,))
    cfg = A.TransformerConfig(dtype="float32", **geom)
    model = A.SimpleAttentionNetwork(cfg)
    B, T = a.batch, a.tokens
    rng = np.random.default_rng(7)
    ids = jnp.asarray(rng.integers(1, geom["out_vocab"], size=(B, T)).astype(np.int32))
    mask = jnp.ones((B, T), jnp.float32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids[:1, :8])["params"])
    # random weights (the speed does not depend on the values): stddev 0.02 everywhere
    leaves, tree = jax.tree_util.tree_flatten(shapes)
    params = jax.tree_util.tree_unflatten(
        tree, [jnp.asarray(0.02 * rng.standard_normal(s.shape), jnp.float32) for s in leaves])
    params = {k: v for k, v in params.items() if not k.endswith("_head")}
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-4))

    def ce(logits, ids, mask):
        logits, targets, mask = logits[:, :-1], ids[:, 1:], mask[:, 1:]
        c = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        return (c * mask).sum() / jnp.maximum(mask.sum(), 1.0)

    if a.mode == "lora":
        Q.configure_deploy(act_bits=8, kv_bits=8)
        lora = F.init_lora(params, F.lora_target_paths(params), a.rank, jax.random.PRNGKey(0))
        scale = 2.0

        def loss_fn(lo, ids, mask):
            merged = Q.cq_ste_params(F.merge_lora(params, lo, scale), Q.WEIGHT_BITS)
            return ce(model.apply({"params": merged}, ids, quant=True), ids, mask)
        trained = lora
    else:
        def loss_fn(p, ids, mask):
            return ce(model.apply({"params": p}, ids, quant=False), ids, mask)
        trained = params
    opt_state = optimizer.init(trained)

    @jax.jit
    def step(tr, st, ids, mask):
        loss, grads = jax.value_and_grad(loss_fn)(tr, ids, mask)
        updates, st = optimizer.update(grads, st, tr)
        return optax.apply_updates(tr, updates), st, loss

    t0 = time.time()
    trained, opt_state, loss = step(trained, opt_state, ids, mask)
    jax.block_until_ready(loss)
    compile_s = time.time() - t0
    secs, cpus = [], []
    for _ in range(a.steps):
        t0, c0 = time.time(), time.process_time()
        trained, opt_state, loss = step(trained, opt_state, ids, mask)
        jax.block_until_ready(loss)
        secs.append(time.time() - t0)
        cpus.append(time.process_time() - c0)  # every thread of the process
    med = sorted(secs)[len(secs) // 2]
    med_cpu = sorted(cpus)[len(cpus) // 2]
    print(json.dumps({"mode": a.mode, "batch": B, "tokens": T, "compile_and_first_step_s": round(compile_s, 2),
                      "step_s": [round(s, 3) for s in secs], "median_step_s": round(med, 3),
                      "tok_per_s": round(B * T / med, 2), "cpu_s": [round(c, 3) for c in cpus],
                      "tok_per_cpu_s": round(B * T / med_cpu, 2), "loss": float(loss)}))


if __name__ == "__main__":
    sys.exit(main())
