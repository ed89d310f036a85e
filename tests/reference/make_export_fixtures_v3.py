#!/usr/bin/env python3
"""Needle 3 fixtures for `needle export --v3`, from the official cactus-needle 3.2.8.

For two small geometries: the parameter tree of the official flax module
(`SimpleAttentionNetwork` + its three probe heads, jax.eval_shape), every leaf filled with
seeded normal values (rounded to F16 / BF16, the checkpoint's storage type), written as a safetensors checkpoint + config JSON, and the official
exporter's output for it (`export.write_export`: CQ4 everywhere, the only width its packer
writes; tokenizer tiny_bpe512.model; kv_window = effective_kv_window):

  export/v3_<geom>.safetensors, export/v3_<geom>.config.json, and in export/manifest_v3.json
  the official output's size and SHA-256 (the file itself goes to
  tests/reference/work/export-official/, not committed);

for the round trip, that file read back (official read_export, decoded tensors put back
into the parameter tree as make_v3_fixtures.params_from_cact does) and run by the official
forward: export/v3_<geom>.json (prompts, argmax, greedy continuation) and
export/v3_<geom>.caseK.f32 ([n][out_vocab] float32 logits);

and the official re-quantization of that file, read_export -> parameter tree (probe heads
included) -> write_export at CQ4: its size and SHA-256 as "requantized" in the manifest
entry (what `needle quantize v3_<geom>.cact --bits 4` must write)

Usage: make_export_fixtures_v3.sh  (this script in a venv with cactus-needle[train]==3.2.8)
"""
import hashlib
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from needle.model import architecture as A  # noqa: E402
from needle.model import export as E  # noqa: E402
from needle.model import tokenizer as T  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_v3_fixtures as V  # noqa: E402  (params_from_cact, reference_logits, write_case_files)
FIX = os.path.join(os.path.dirname(HERE), "fixtures")
OUT = os.path.join(FIX, "export")

GEOMS = {
    # conv taps, local + global layers, split Hadamard permutations (ladder_widths),
    # out_vocab, uneven qk / v head dims, two engram sites
    "a": dict(vocab_size=512, out_vocab=500, d_model=96, num_heads=4, num_kv_heads=2, num_layers=4,
              qk_head_dim=16, v_head_dim=24, max_seq_len=128, rope_theta=10000.0, mhc_lanes=2,
              engram_orders=(2, 3), engram_slots=64, engram_layers=(1, 3), global_layers=(1, 3),
              sliding_window=16, qkv_conv_taps=3, embedding_dim=32, ladder_widths=(2,),
              engram_seed_heads=3, kv_window=24),
    # no taps, the legacy attn_dim spelling (no window, no global layers), d = group
    "b": dict(vocab_size=512, d_model=128, attn_dim=128, num_heads=4, num_kv_heads=2, num_layers=3,
              max_seq_len=128, rope_theta=100000.0, mhc_lanes=4, engram_orders=(2, 3, 4),
              engram_slots=97, engram_layers=(0, 2), qkv_conv_taps=0, embedding_dim=16,
              confidence_queries=2, router_probes=3),
}


def param_shapes(cfg):
    model = A.SimpleAttentionNetwork(cfg)
    tok = jnp.zeros((1, 8), jnp.int32)
    tree = {}
    for method in (None, A.SimpleAttentionNetwork.forward_confidence,
                   A.SimpleAttentionNetwork.forward_embedding, A.SimpleAttentionNetwork.forward_router):
        sh = jax.eval_shape(lambda k, t, m=method: model.init(k, t, method=m), jax.random.PRNGKey(0), tok)
        for name, sub in sh["params"].items():
            tree.setdefault(name, sub)
    return tree


def random_params(cfg, seed, dtype):
    """values representable in `dtype` (F16 or BF16): the checkpoint is stored in it, at half
    the bytes, and read back exactly"""
    import ml_dtypes
    half = np.float16 if dtype == "F16" else ml_dtypes.bfloat16

    def fill(path, leaf):
        name = "/".join(p.key for p in path)
        r = np.random.default_rng(int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little"))
        scale = 1.0 / np.sqrt(leaf.shape[-2]) if len(leaf.shape) >= 2 else 0.5
        return (scale * r.standard_normal(leaf.shape)).astype(np.float32).astype(half).astype(np.float32)
    return jax.tree_util.tree_map_with_path(fill, param_shapes(cfg))


def write_safetensors(path, params, dtype):
    """every leaf in `dtype` (F16 / BF16), named by its tree path joined with "/" """
    import struct
    import ml_dtypes
    half = np.dtype("<f2") if dtype == "F16" else np.dtype(ml_dtypes.bfloat16)

    def flatten(tree, prefix=""):
        for k in sorted(tree):
            v, name = tree[k], f"{prefix}/{k}" if prefix else k
            if hasattr(v, "items"):
                yield from flatten(dict(v), name)
            else:
                yield name, np.asarray(v, np.float32)
    header, blobs, off = {}, [], 0
    for name, arr in flatten(params):
        b = np.ascontiguousarray(arr).astype(half).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


ROUND_TRIP_PROMPTS = (24, 9)  # the first longer than geometry a's window of 16


def params_from_cact_with_heads(path, template):
    """params_from_cact, plus the probe heads: the records after final_norm are the heads
    manifest, then per head (in manifest order) probes, gain, query, row_bias, proj, bias
    and, for the router, calibration (export order); the tokenizer blob is last."""
    h, params = V.params_from_cact(path, template)
    params = jax.tree_util.tree_map(lambda a: np.array(a, np.float32), params)
    _, ts = E.read_export(path)
    ts = [t for t in ts if not isinstance(t, (bytes, bytearray))]
    stride = 27 if h["qkv_conv_taps"] else 24
    at = 1 + stride * h["num_layers"] + 9 + 2 + 4 * len(h["engram_layers"]) + 1
    if at < len(ts):
        codes = [int(c) for c in np.asarray(ts[at]).reshape(-1)]
        at += 1
        for code in codes:
            key = {1: "embedding_head", 2: "confidence_head", 3: "router_head"}[code]
            hp = params[key]
            hp["probes"] = np.asarray(ts[at], np.float32).reshape(hp["probes"].shape)
            hp["gain"] = np.asarray(ts[at + 1], np.float32).reshape(hp["gain"].shape)
            hp["query"] = np.asarray(ts[at + 2], np.float32).reshape(hp["query"].shape)
            hp["row_bias"] = np.asarray(ts[at + 3], np.float32).reshape(hp["row_bias"].shape)
            hp["proj"]["kernel"] = np.asarray(ts[at + 4], np.float32).T.copy()
            if "bias" in hp["proj"]:
                hp["proj"]["bias"] = np.asarray(ts[at + 5], np.float32)
            if code == 3 and "calibration" in hp:
                hp["calibration"] = np.asarray(ts[at + 6], np.float32).reshape(hp["calibration"].shape)
            at += 7 if code == 3 else 6
    return h, params


def main():
    tok = T.SANTokenizer(os.path.join(FIX, "tiny_bpe512.model"))
    manifest = {}
    for name, geom in GEOMS.items():
        cfg = A.TransformerConfig(dtype="float32", **geom)
        dtype = "F16" if name == "a" else "BF16"
        params = random_params(cfg, 300 + ord(name), dtype)
        kvw = A.effective_kv_window(cfg)
        write_safetensors(os.path.join(OUT, f"v3_{name}.safetensors"), params, dtype)
        with open(os.path.join(OUT, f"v3_{name}.config.json"), "w") as f:
            json.dump({k: (list(v) if isinstance(v, tuple) else v) for k, v in geom.items()}, f,
                      indent=1, sort_keys=True)
            f.write("\n")
        official = os.path.join(HERE, "work", "export-official")
        os.makedirs(official, exist_ok=True)
        E.write_export(params, cfg, os.path.join(official, f"v3_{name}.cact"), tokenizer=tok, kv_window=kvw)
        with open(os.path.join(official, f"v3_{name}.cact"), "rb") as f:
            data = f.read()
        manifest[f"v3_{name}.cact"] = {"checkpoint": f"v3_{name}.safetensors", "config": f"v3_{name}.config.json",
                                       "bits": "4", "kv_window": kvw, "bytes": len(data),
                                       "sha256": hashlib.sha256(data).hexdigest()}
        official_path = os.path.join(official, f"v3_{name}.cact")
        _, decoded = params_from_cact_with_heads(official_path, params)
        requantized = os.path.join(official, f"v3_{name}.requantized4.cact")
        E.write_export(decoded, cfg, requantized, tokenizer=tok, kv_window=kvw)
        with open(requantized, "rb") as f:
            rq = f.read()
        manifest[f"v3_{name}.cact"]["requantized"] = {"bits": "4", "bytes": len(rq),
                                                      "sha256": hashlib.sha256(rq).hexdigest()}
        _, fwd_params = V.params_from_cact(official_path, params)
        r = np.random.default_rng(400 + ord(name))
        prompts = [[int(t) for t in r.integers(4, cfg.vocab_size, n)] for n in ROUND_TRIP_PROMPTS]
        V.write_case_files(OUT, f"v3_{name}", prompts, V.reference_logits(fwd_params, cfg, prompts),
                           {"package": "cactus-needle==3.2.8", "cact": f"v3_{name}.cact",
                            "kv_window": kvw})
        print(f"v3_{name}: {len(data)} bytes, kv_window {kvw}; requantized {len(rq)} bytes", flush=True)
    with open(os.path.join(OUT, "manifest_v3.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
