#!/usr/bin/env python3
"""Needle 2 gradient parity fixtures for needle's training core, made with the official
cactus-needle 2.0.15 (issue 32, the Needle 2 half).

Every number comes from the official package: the parameter tree is that of the official
flax module (names and shapes from jax.eval_shape of its init, every leaf filled with seeded
random values by make_fixtures.random_params, so no leaf is zero); the losses are the
official fine-tuning loss of 2.0.15 `needle.model.finetune.finetune_local` rebuilt from the
package's own pieces (`lora_target_paths`, `merge_lora`, `cq_ste_params` at the qat_bits
that "auto" picks for a config without weight_bits (4), `configure_deploy(act_bits=8,
kv_bits=8)` -- which in 2.0.15 turns K/V quantization off (kv_bits >= 8) and leaves A8 --,
`SimpleAttentionNetwork.apply` with no mask (causal), optax's integer-label cross-entropy)
and the gradients are `jax.value_and_grad` of them:

  (a) float  -- the base model in float, gradient for every parameter;
  (b) cqw    -- LoRA merged, CQ W4 straight-through on the merged weights, float
                activations (quant=False); gradient for A and B;
  (c) quant  -- the exact 2.0.15 fine-tuning loss: (b) plus quant=True (A8 activations).

Each is computed in float32 (the fixture) and in float64 (jax x64, the module's hard-coded
float32 casts redirected to float64) to measure the reference's own noise floor, written
to NAME.json with the count of CQ codes of the merged weights within 1e-5 of a rounding
boundary and of CQ codes that differ between the two runs.

Outputs per model NAME in OUT_DIR (see tests/fixtures/grad_v2/README.md):
  NAME.params.safetensors   the parameters (flax paths joined by '/'), float32, as
                            `needle export` reads a Needle 2 checkpoint
  NAME.config.json          the TransformerConfig (as `needle export --config` takes it)
  NAME.lora.safetensors     adapter: lora/<path>/A|B, metadata scale/base/rank/seed
  NAME.batch.jsonl          {"ids": [...], "mask": [...]} per example, one length
  NAME.grad_float.safetensors, NAME.grad_cqw.safetensors, NAME.grad_quant.safetensors
                            the float32 gradients (metadata: loss)
  NAME.json                 config, scale, rank, losses, float64 losses, noise floors

Usage: make_grad_v2_fixtures.py [OUT_DIR]
"""
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("NEEDLE_TELEMETRY", "0")
os.environ.setdefault("DO_NOT_TRACK", "1")

import numpy as np  # noqa: E402
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from needle.model import architecture as A  # noqa: E402
from needle.model import quantize as Q  # noqa: E402
from needle.model import finetune as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as V2  # noqa: E402

# finetune_local's qat_bits for a config without weight_bits ("auto")
WEIGHT_BITS = 4

# Tiny geometries covering what the 2.0.15 loss reaches: d not a power of two (Hadamard
# MLP padded), attn_dim != d_model, GQA 2:1 and 2:1 with one KV head, 2 and 4 mHC lanes,
# two engram orders with two heads, engram sites at the first and last layers, tied logits.
MODELS = {
    "g2a": dict(geom=dict(vocab_size=64, d_model=40, attn_dim=32, num_heads=4,
                          num_kv_heads=2, num_layers=3, max_seq_len=64,
                          rope_theta=10000.0, mhc_lanes=2, engram_orders=(2, 3),
                          engram_heads=2, engram_slots=13, engram_layers=(0, 2)),
                seed=41, rank=3, alpha=6.0, batch=3, T=20),
    "g2b": dict(geom=dict(vocab_size=48, d_model=24, num_heads=2, num_kv_heads=1,
                          num_layers=2, max_seq_len=64, rope_theta=100000.0,
                          mhc_lanes=4, engram_orders=(2,), engram_heads=2,
                          engram_slots=11, engram_layers=(0, 1)),
                seed=42, rank=2, alpha=2.0, batch=2, T=16),
}
BOUNDARY_EPS = 1e-5


class stnp:
    """safetensors' save_file for float32 arrays (the pinned 2.0.15 venv has no
    safetensors package): an 8-byte little-endian header length, the JSON header
    (padded with spaces to 8 bytes), the tensors' bytes in header order."""

    @staticmethod
    def save_file(tensors, path, metadata=None):
        header, blobs, off = {}, [], 0
        if metadata:
            header["__metadata__"] = metadata
        for name in sorted(tensors):
            a = np.ascontiguousarray(tensors[name], np.float32)
            b = a.astype("<f4").tobytes()
            header[name] = {"dtype": "F32", "shape": list(a.shape),
                            "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * ((-len(h)) % 8)
        with open(path, "wb") as f:
            f.write(len(h).to_bytes(8, "little"))
            f.write(h)
            for b in blobs:
                f.write(b)


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class _Jnp64:
    """jax.numpy as the architecture sees it in the float64 run: the hard-coded float32
    casts become float64, so the forward runs in double."""

    def __getattr__(self, name):
        if name == "float32":
            return jnp.float64
        return getattr(jnp, name)


def set_precision(f64):
    A.DTYPE_MAP["float64"] = jnp.float64
    shim = _Jnp64() if f64 else jnp
    A.jnp = shim
    Q.jnp = shim


def make_batch(spec, rng):
    """Token ids in [1, vocab) (0 is the pad id), a prompt/answer mask per example; the
    last example is padded at the end, the second has an empty answer mask."""
    B, T = spec["batch"], spec["T"]
    ids = rng.integers(1, spec["geom"]["vocab_size"], size=(B, T)).astype(np.int32)
    mask = np.zeros((B, T), np.float32)
    for b in range(B):
        length = T if b != B - 1 else T - 5
        ids[b, length:] = 0
        if b == 1:
            continue  # empty answer
        mask[b, 4 + b:length] = 1.0
    return ids, mask


def ce_loss(logits, ids, mask):
    logits, targets, mask = logits[:, :-1], ids[:, 1:], mask[:, 1:]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return (ce * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def losses(model, params, lora, scale, ids, mask, dtype):
    cast = lambda t: jax.tree.map(lambda a: jnp.asarray(a, dtype), t)  # noqa: E731
    params, lora = cast(params), cast(lora)
    ids, mask = jnp.asarray(ids), jnp.asarray(mask, dtype)

    def float_loss(p):
        return ce_loss(model.apply({"params": p}, ids, quant=False), ids, mask)

    def lora_loss(quant):
        def fn(lo):
            merged = Q.cq_ste_params(F.merge_lora(params, lo, scale), WEIGHT_BITS)
            return ce_loss(model.apply({"params": merged}, ids, quant=quant), ids, mask)
        return fn

    out = {}
    Q.configure_deploy(act_bits=8, kv_bits=8)
    out["float"] = jax.value_and_grad(float_loss)(params)
    out["cqw"] = jax.value_and_grad(lora_loss(False))(lora)
    out["quant"] = jax.value_and_grad(lora_loss(True))(lora)
    return out


def flat_named(tree):
    return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def lora_named(grads):
    out = {}
    for path, ab in grads.items():
        name = "/".join(path)
        out[f"lora/{name}/A"] = np.asarray(ab["A"])
        out[f"lora/{name}/B"] = np.asarray(ab["B"])
    return out


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def cq_codes(params, lora, scale, dtype, group=Q.CQ_GROUP_SIZE):
    """The CQ code of every group element of every quantized leaf of the merged weights,
    and how many sit within BOUNDARY_EPS (on the unit-norm scale) of a decision boundary."""
    merged = F.merge_lora(jax.tree.map(lambda a: jnp.asarray(a, dtype), params),
                          jax.tree.map(lambda a: jnp.asarray(a, dtype), lora), scale)
    codes, near = [], 0
    cb = np.asarray(Q._cq_codebook_np(WEIGHT_BITS, group), np.float64)
    H = np.asarray(Q._cq_hadamard_np(group), np.float64)
    bounds = (cb[:-1] + cb[1:]) / 2

    def visit(path, leaf):
        nonlocal near
        if not Q._is_quant_leaf(path, leaf):
            return leaf
        w = np.asarray(leaf, np.float64)
        if Q._reduces_second_last(path):
            w = np.swapaxes(w, -1, -2)
        D = w.shape[-1]
        pad = (-D) % group
        if pad:
            w = np.pad(w, [(0, 0)] * (w.ndim - 1) + [(0, pad)])
        g = w.reshape(-1, group)
        rot = g @ H
        unit = rot / np.maximum(np.sqrt((rot ** 2).sum(-1, keepdims=True)), 1e-12)
        codes.append(np.searchsorted(bounds, unit.ravel()))
        near += int((np.abs(unit.ravel()[:, None] - bounds[None, :]).min(axis=1)
                     < BOUNDARY_EPS).sum())
        return leaf

    jax.tree_util.tree_map_with_path(visit, merged)
    return np.concatenate(codes), near


def make(name, spec, out_dir):
    log(name)
    cfg = A.TransformerConfig(dtype="float32", remat=False, **spec["geom"])
    params = V2.random_params(cfg, spec["seed"], emb_std=0.7, heads=False)
    params = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
    rng = np.random.default_rng(spec["seed"])
    ids, mask = make_batch(spec, rng)
    paths = F.lora_target_paths(params)
    from flax.traverse_util import flatten_dict
    fp = flatten_dict(params)
    rank, scale = spec["rank"], spec["alpha"] / spec["rank"]
    lora = {}
    for path in paths:
        w = fp[path]
        lead, din, dout = w.shape[:-2], w.shape[-2], w.shape[-1]
        lora[path] = {
            "A": (rng.standard_normal(lead + (din, rank)) / rank).astype(np.float32),
            "B": (0.05 * rng.standard_normal(lead + (rank, dout))).astype(np.float32),
        }

    set_precision(False)
    r32 = losses(A.SimpleAttentionNetwork(cfg), params, lora, scale, ids, mask, jnp.float32)
    cfg64 = A.TransformerConfig(dtype="float64", remat=False, **spec["geom"])
    set_precision(True)
    try:
        r64 = losses(A.SimpleAttentionNetwork(cfg64), params, lora, scale, ids, mask,
                     jnp.float64)
    finally:
        set_precision(False)

    codes32, near32 = cq_codes(params, lora, scale, jnp.float32)
    codes64, _ = cq_codes(params, lora, scale, jnp.float64)

    conf = {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec["geom"].items()}
    stnp.save_file({k: np.ascontiguousarray(v, np.float32) for k, v in flat_named(params).items()},
                   os.path.join(out_dir, f"{name}.params.safetensors"))
    with open(os.path.join(out_dir, f"{name}.config.json"), "w") as f:
        json.dump(conf, f, indent=1)
    stnp.save_file(
        {k: np.ascontiguousarray(v, np.float32) for k, v in lora_named(lora).items()},
        os.path.join(out_dir, f"{name}.lora.safetensors"),
        metadata={"scale": repr(float(scale)), "base": json.dumps(f"{name}.params.safetensors"),
                  "rank": str(rank), "seed": str(spec["seed"])})
    with open(os.path.join(out_dir, f"{name}.batch.jsonl"), "w") as f:
        for b in range(ids.shape[0]):
            f.write(json.dumps({"ids": ids[b].tolist(),
                                "mask": [int(m) for m in mask[b]]}) + "\n")

    info = {"config": conf, "weight_bits": WEIGHT_BITS,
            "lora_rank": rank, "lora_alpha": spec["alpha"], "lora_scale": scale,
            "lora_paths": ["/".join(p) for p in paths],
            "boundary_eps": BOUNDARY_EPS, "cq_codes": int(codes32.size),
            "cq_codes_near_boundary": near32,
            "cq_codes_f32_vs_f64_differ": int((codes32 != codes64).sum()),
            "losses": {}, "losses_f64": {}, "floor_rel_l2": {},
            "floor_rel_l2_max_tensor": {}}
    for kind in ("float", "cqw", "quant"):
        loss32, g32 = r32[kind]
        loss64, g64 = r64[kind]
        named32 = flat_named(g32) if kind == "float" else lora_named(g32)
        named64 = flat_named(g64) if kind == "float" else lora_named(g64)
        stnp.save_file({k: np.ascontiguousarray(v, np.float32) for k, v in named32.items()},
                       os.path.join(out_dir, f"{name}.grad_{kind}.safetensors"),
                       metadata={"loss": repr(float(loss32))})
        all32 = np.concatenate([named32[k].ravel() for k in sorted(named32)])
        all64 = np.concatenate([named64[k].ravel() for k in sorted(named64)])
        info["losses"][kind] = float(loss32)
        info["losses_f64"][kind] = float(loss64)
        info["floor_rel_l2"][kind] = rel_l2(all32, all64)
        info["floor_rel_l2_max_tensor"][kind] = max(rel_l2(named32[k], named64[k])
                                                    for k in named32)
        zero = [k for k, v in named32.items() if not np.any(v)]
        log(f"  {kind}: loss {float(loss32):.6f} (f64 {float(loss64):.6f}) floor "
            f"{info['floor_rel_l2'][kind]:.2e} max-tensor "
            f"{info['floor_rel_l2_max_tensor'][kind]:.2e} zero-grad tensors {zero}")
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(info, f, indent=1)
    log(f"  cq codes {codes32.size}, near boundary {near32}, "
        f"f32/f64 differ {info['cq_codes_f32_vs_f64_differ']}")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(HERE), "fixtures", "grad_v2")
    os.makedirs(out_dir, exist_ok=True)
    for name, spec in MODELS.items():
        make(name, spec, out_dir)


if __name__ == "__main__":
    main()
