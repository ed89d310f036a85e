#!/usr/bin/env python3
"""Fixtures of the training core's file formats and optimizer, made by the official code
(cactus-needle 3.2.8, safetensors, optax; see make_train_fixtures.sh), written to
tests/fixtures/train/ (or OUT_DIR). Every random choice is seeded; a rerun gives the same
files.

  st_official.safetensors   safetensors.numpy.save_file: F32 / F16 / BF16 tensors, a
                            scalar, an empty tensor, metadata with quotes and non-ASCII
  ckpt_official.safetensors needle.model.checkpoints.write_checkpoint of a tiny Needle 3
                            parameter tree (the official module's tree, random values),
                            format_version 2, its TransformerConfig, step and run
  adapter_official.safetensors  checkpoints.write_adapter as finetune_local calls it: LoRA
                            A and B (both non-zero) on finetune.lora_target_paths of that
                            tree, scale, base, rank, seed
  optim_official.json       optax: chain(clip_by_global_norm(1.0), adamw(schedule)) with
                            schedule = warmup_cosine_decay_schedule as finetune_local
                            builds it, over random params and gradients for 12 steps
                            (gradients scaled so clipping acts on some steps only): the
                            lr, the global norm, params, mu and nu after every step

  released (only on request, into a work folder; ~484 MB, not committed): a checkpoint
                            of the released Needle 3 geometry with random values, for
                            bench/train/train_io.c

Usage: make_train_fixtures.py [OUT_DIR] [--only st,ckpt,adapter,optim,released]
"""
import argparse
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(HERE), "fixtures", "train")

# A tiny Needle 3 geometry: every kind of parameter the module has (engram, mHC lanes,
# conv taps, local and global layers, out_vocab < vocab), a few KB of weights.
GEOM = dict(vocab_size=64, out_vocab=48, d_model=32, num_heads=2, num_kv_heads=1,
            num_layers=2, qk_head_dim=8, v_head_dim=16, max_seq_len=32,
            rope_theta=10000.0, sliding_window=4, global_layers=(1,), qkv_conv_taps=2,
            mhc_lanes=2, engram_orders=(2,), engram_slots=7, engram_layers=(0,),
            embedding_dim=8, embedding_probes=1, embedding_queries=1, confidence_probes=1,
            confidence_queries=1, router_probes=1, router_queries=1)


def make_st(out):
    from safetensors.numpy import save_file
    import ml_dtypes
    tensors = {
        "a/b/kernel": (np.arange(12, dtype=np.float32) * 0.375 - 2).reshape(3, 4),
        "half": np.array([0, 1.5, -2.25, 65504, 2.0 ** -24], np.float16),
        "brain": np.array([[1, -0.5], [3.140625, 2.0 ** 100]], ml_dtypes.bfloat16),
        "scalar": np.array(7.25, np.float32),
        "empty": np.zeros((0, 3), np.float32),
    }
    meta = {"format_version": "2", "config": json.dumps({"q": 'say "hi"\n', "u": "żółć 😊"}),
            "blank": ""}
    save_file(tensors, os.path.join(out, "st_official.safetensors"), metadata=meta)


# the released needle3 geometry (docs/spec/NEEDLE3.md §0)
RELEASED = dict(vocab_size=8192, out_vocab=8192, d_model=768, num_heads=12, num_kv_heads=2,
                num_layers=20, qk_head_dim=48, v_head_dim=64, max_seq_len=8192,
                rope_theta=100000.0, sliding_window=1024, global_layers=(4, 9, 14, 19),
                qkv_conv_taps=3, mhc_lanes=4, engram_orders=(2, 3), engram_slots=18432,
                engram_layers=(3, 7, 11, 15, 19))


def tiny_tree(geom=GEOM):
    import jax
    import jax.numpy as jnp
    from needle.model import architecture as A
    cfg = A.TransformerConfig(dtype="float32", remat=False, **geom)
    model = A.SimpleAttentionNetwork(cfg)
    shapes = jax.eval_shape(lambda k: model.init(k, jnp.ones((1, 8), jnp.int32)),
                            jax.random.PRNGKey(0))["params"]
    rng = np.random.default_rng(315)
    params = jax.tree.map(lambda s: (0.5 * rng.standard_normal(s.shape)).astype(np.float32), shapes)
    config = {name: getattr(cfg, name) for name in cfg.__dataclass_fields__}
    return params, config


def make_ckpt(out):
    from needle.model.checkpoints import write_checkpoint
    params, config = tiny_tree()
    write_checkpoint(os.path.join(out, "ckpt_official.safetensors"), {
        "format_version": 2, "params": params, "config": config, "step": 120,
        "run": {"lr": 0.001, "epochs": 3, "data": "train.jsonl", "note": "żółć"}})


def make_adapter(out):
    import jax
    from needle.model.checkpoints import write_adapter
    from needle.model.finetune import init_lora, lora_target_paths
    params, _ = tiny_tree()
    paths = lora_target_paths(params)
    rank = 3
    lora = init_lora(params, paths, rank, jax.random.PRNGKey(7))
    rng = np.random.default_rng(316)
    # B non-zero (as after training) so a reader that mixes up A and B is caught
    lora = {p: {"A": np.asarray(v["A"]),
                "B": (0.1 * rng.standard_normal(v["B"].shape)).astype(np.float32)}
            for p, v in lora.items()}
    write_adapter(os.path.join(out, "adapter_official.safetensors"), {
        "lora": {"/".join(p): v for p, v in lora.items()},
        "scale": 7.5 / rank, "base": "checkpoints/needle3 żółć.safetensors",
        "rank": rank, "seed": 7})


def make_optim(out):
    import jax
    import jax.numpy as jnp
    import optax
    total, lr = 12, 3e-3
    # finetune_local's schedule and chain, verbatim in meaning
    warmup = min(max(1, total // 20), total - 1)
    schedule = optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=lr,
                                                  warmup_steps=warmup, decay_steps=total)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule))
    rng = np.random.default_rng(317)
    params = {"w": (rng.standard_normal((5, 7))).astype(np.float32),
              "b": (rng.standard_normal((7,))).astype(np.float32),
              "s": (rng.standard_normal((1,))).astype(np.float32)}
    state = optimizer.init(params)
    update = jax.jit(optimizer.update)
    steps = []
    # gradient scales: global norms above and below the clip threshold of 1.0
    scales = [0.05, 0.9, 0.02, 0.3, 0.01, 0.6, 0.03, 0.08, 0.4, 0.02, 0.15, 0.05]
    init = {k: v.tolist() for k, v in params.items()}
    for i in range(total):
        grads = {k: (scales[i] * rng.standard_normal(v.shape)).astype(np.float32)
                 for k, v in params.items()}
        norm = float(optax.global_norm(grads))
        updates, state = update(grads, state, params)
        params = jax.tree.map(lambda p, u: np.asarray(p + u), params, updates)
        adam = state[1][0]  # chain -> adamw's chain -> ScaleByAdamState
        steps.append({"lr": float(schedule(i)), "global_norm": norm,
                      "grads": {k: v.tolist() for k, v in grads.items()},
                      "params": {k: np.asarray(v).tolist() for k, v in params.items()},
                      "mu": {k: np.asarray(v).tolist() for k, v in adam.mu.items()},
                      "nu": {k: np.asarray(v).tolist() for k, v in adam.nu.items()},
                      "count": int(adam.count)})
    with open(os.path.join(out, "optim_official.json"), "w") as f:
        json.dump({"total_steps": total, "peak_lr": lr, "warmup": warmup, "clip": 1.0,
                   "b1": 0.9, "b2": 0.999, "eps": 1e-8, "weight_decay": 1e-4,
                   "init": init, "steps": steps}, f)
        f.write("\n")


def make_released(out):
    from needle.model.checkpoints import write_checkpoint
    params, config = tiny_tree(RELEASED)
    write_checkpoint(os.path.join(out, "needle3_released_random.safetensors"), {
        "format_version": 2, "params": params, "config": config, "step": 0, "run": {}})


PARTS = {"st": make_st, "ckpt": make_ckpt, "adapter": make_adapter, "optim": make_optim,
         "released": make_released}
DEFAULT = ("st", "ckpt", "adapter", "optim")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=OUT)
    ap.add_argument("--only", default=",".join(DEFAULT))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for part in a.only.split(","):
        PARTS[part](a.out)
        print("made", part)


if __name__ == "__main__":
    main()
