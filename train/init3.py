"""The geometry of the Needle 3 default model (issue 35) and its from-scratch initial
checkpoint, made by the official code (cactus-needle 3.2.8: the flax module
`SimpleAttentionNetwork` with its three probe heads, initialized by flax's own `init`
with a seeded key) and saved in the official checkpoint format (`checkpoints.
write_checkpoint`: safetensors, tensor names the parameter paths joined by "/",
metadata format_version 2, config, step 0), which the official `load_checkpoint` reads
and `needle finetune --full` starts from. Needs the 3.2.8 venv
(tests/reference/.venv3).

    python train/init3.py --out train/work3/init [--seed 35]    # init.safetensors + config.json
    python train/init3.py --count                                # parameters by group
    python train/init3.py --count --set num_layers=10 --set d_model=384 --set num_heads=6 \
        --set 'global_layers=[4,9]' --set 'engram_layers=[3,7]'     # the larger alternative

Why this geometry (GEOMETRY below; the released needle3 is 20 layers x 768):
* size by the C trainer's measured tokens/s (`needle finetune --full`, one thread, train3
  data at batch 16, every row run to its last target): 8 layers x 256 (5.59 M parameters)
  1,516 tok/s, 10 x 384 (10.78 M, the alternative above) 767 tok/s. A session gives the
  trainer ~10 M tokens at the first rate: the smaller model sees twice the data.
* vocab 4,096 = out_vocab: train_tokenizer3.py's measurements, 4k/6k/8k pieces give
  222.1 / 219.0 / 218.1 pieces per training example and the same whole-piece coverage of
  the held-out non-ASCII values: the bigger vocabularies buy ~1% shorter inputs for
  0.5-1 M more embedding parameters, which this budget spends on depth instead.
* d_model 256, 8 layers, 4 query / 2 KV heads, qk head dim 48 and v head dim 64 (the
  released ratios: H x v = d), so head-level kernels are the released ones'.
* local/global: sliding window 256 (a prompt with 5 tools is ~300 tokens: local layers
  still see the tools' names) and full attention at layers 3 and 7.
* 3 causal conv taps on q/k/v, the Monarch (Hadamard) MLP, 4 mHC lanes: as released.
* engram at 2 sites (layers 2 and 5) with orders (2, 3) and 4,096 slots per table
  (released: 5 sites, 18,432 slots): gathered, not multiplied, so they cost memory, not
  compute.
* max_seq_len 2,048: training examples are under 700 tokens, but the demo's 27 tools
  alone are ~1,550 tokens of prompt (the window only costs KV memory, not parameters).
* probe heads: the confidence head only by default (--heads): an untrained retrieval
  (embedding) head in the file would make the engine show each conversation the 5 tools
  its random projection picks; add it (--heads confidence,embedding) when the trainer
  trains it.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

GEOMETRY = dict(
    vocab_size=4096, out_vocab=4096, d_model=256, num_layers=8, num_heads=4, num_kv_heads=2,
    qk_head_dim=48, v_head_dim=64, max_seq_len=2048, rope_theta=100000.0,
    sliding_window=256, global_layers=[3, 7], qkv_conv_taps=3, mhc_lanes=4,
    engram_orders=[2, 3], engram_slots=4096, engram_layers=[2, 5],
    embedding_dim=128, kv_window=0, kv_bits=8, act_bits=8, dtype="bfloat16")


def geometry(overrides=()):
    """GEOMETRY with KEY=VALUE overrides (values as JSON: 8, 256, [3, 7], "float32")."""
    g = dict(GEOMETRY)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in GEOMETRY:
            raise SystemExit(f"init3.py: --set {item!r}: KEY=VALUE with KEY one of "
                             f"{', '.join(sorted(GEOMETRY))}")
        try:
            g[key] = json.loads(value)
        except ValueError:
            g[key] = value
    return g


def config(g):
    from needle.model import architecture as A
    return A.TransformerConfig(**{k: tuple(v) if isinstance(v, list) else v
                                  for k, v in g.items()})


HEAD_METHODS = {"confidence": "forward_confidence", "embedding": "forward_embedding",
                "router": "forward_router"}


def init_params(cfg, seed, heads=("confidence",)):
    """The official initialization of the trunk and of the chosen probe heads (each head's
    parameters are created by the method that uses it), one key for all."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from needle.model import architecture as A
    model = A.SimpleAttentionNetwork(cfg)
    tokens = jnp.zeros((1, 8), jnp.int32)
    key = jax.random.PRNGKey(seed)
    params = {}
    for method in [None] + [getattr(A.SimpleAttentionNetwork, HEAD_METHODS[h]) for h in heads]:
        tree = jax.jit(lambda k, t, m=method: model.init(k, t, method=m))(key, tokens)["params"]
        for name, sub in tree.items():
            params.setdefault(name, sub)
    return jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params)


def groups(params):
    """Parameter counts: embedding, engram tables (gathered only), probe heads, the rest."""
    from needle.model import checkpoints as K
    out = {"embedding": 0, "engram tables": 0, "probe heads": 0, "trunk": 0}
    for name, v in K.flatten(params).items():
        n = int(v.size)
        if name.startswith("embedding/"):
            out["embedding"] += n
        elif name.startswith("engrams_") and name.endswith("/embedding"):
            out["engram tables"] += n
        elif name.split("/")[0].endswith("_head"):
            out["probe heads"] += n
        else:
            out["trunk"] += n
    out["total"] = sum(out.values())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="directory for init.safetensors and config.json")
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--count", action="store_true", help="print the parameter counts")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a GEOMETRY field (repeatable), e.g. --set num_layers=8")
    ap.add_argument("--heads", default="confidence",
                    help="probe heads to create, comma-separated: confidence, embedding, router")
    a = ap.parse_args()
    if not a.out and not a.count:
        ap.error("give --out DIR or --count")
    g = geometry(a.set)
    cfg = config(g)
    heads = [h for h in a.heads.split(",") if h]
    bad = [h for h in heads if h not in HEAD_METHODS]
    if bad:
        ap.error(f"--heads: unknown head {bad[0]!r} (confidence, embedding, router)")
    params = init_params(cfg, a.seed, heads)
    counts = groups(params)
    print(json.dumps(counts))
    if not a.out:
        return 0
    from needle.model import checkpoints as K
    from needle.model import run as RUN
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "init.safetensors")
    K.write_checkpoint(path, {"format_version": RUN.CHECKPOINT_FORMAT_VERSION,
                              "params": params, "config": g, "step": 0,
                              "run": {"init": "official flax init", "seed": a.seed, "heads": heads,
                                      "recipe": "train/init3.py"}})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(g, f, indent=1)
    # the official loader accepts it as a base checkpoint
    back, back_cfg = RUN.load_checkpoint(path)
    assert K.flatten(back).keys() == K.flatten(params).keys()
    assert back_cfg.num_layers == cfg.num_layers and back_cfg.out_vocab == cfg.out_vocab
    print(f"wrote {path} ({os.path.getsize(path)} bytes) and config.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
