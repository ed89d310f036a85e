"""Needle 3 probe-head parity fixtures: the official cactus-needle 3.2.8 forward_embedding,
forward_confidence and forward_router over the committed v3 fixture `v3a.cact`.

The parameters are read back from the .cact exactly as make_v3_fixtures.py does for the
stack (CQ weights dequantized, FP16 rounded), continued over the probe-head records, so the
reference runs on the very values an engine reads. Writes NAME.heads.json beside the file:
per prompt its tokens, the embedding (128 floats), the confidence logit and the three router
logits, for the fixture's own two prompts (no PAD inside: the official hidden_cells also masks
PAD keys in attention, which an engine's forward never sees).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_v3_fixtures as V  # noqa: E402  (sets the JAX flags before jax is imported)

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

A = V.A
E = V.E


def head_params(path, template, params):
    """The probe-head subtrees, read from the records after final_norm."""
    h, ts = E.read_export(path)
    L1 = h["num_layers"] + 1
    out = jax.tree_util.tree_map(lambda a: np.array(a, np.float32), params)
    heads = h.get("heads") or [1, 2, 3]
    # read_export yields the stack records, the manifest, the heads in order, then the
    # tokenizer blob (export.py): the heads are counted back from the end
    per = {1: 6, 2: 6, 3: 7}
    n_heads = sum(per[c] for c in heads)
    it = iter(ts[len(ts) - 1 - n_heads:len(ts) - 1])
    nxt = lambda: np.asarray(next(it), np.float32)  # noqa
    keys = {1: "embedding_head", 2: "confidence_head", 3: "router_head"}
    for code in heads:
        hp = out[keys[code]]
        probes = nxt()
        l1k, d = probes.shape
        hp["probes"] = probes.reshape(L1, l1k // L1, d)
        hp["gain"] = nxt().reshape(hp["gain"].shape)
        hp["query"] = nxt()
        hp["row_bias"] = nxt().reshape(hp["row_bias"].shape)
        hp["proj"]["kernel"] = nxt().T.copy()
        bias = nxt()
        if "bias" in hp["proj"]:
            hp["proj"]["bias"] = bias
        else:
            assert not bias.any(), "the embedding head's exported bias is not zero"
        if code == 3:
            nxt()  # calibration: not part of forward_router
    return jax.tree_util.tree_map(jnp.asarray, out)


def main():
    in_dir = os.path.join(V.REPO, "tests", "fixtures", "v3")
    out_dir = sys.argv[1] if len(sys.argv) > 1 else in_dir
    name = "v3a"
    spec = V.MODELS[name]
    cfg = V.make_config(spec["geom"])
    tmpl = V.param_shapes(cfg, True)
    tmpl = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, np.float32), tmpl)
    path = os.path.join(in_dir, name + ".cact")
    _, params = V.params_from_cact(path, tmpl)
    params = head_params(path, tmpl, params)
    with open(os.path.join(in_dir, name + ".json")) as f:
        prompts = [c["tokens"] for c in json.load(f)["cases"]]
    model = A.SimpleAttentionNetwork(cfg)
    run = lambda m: jax.jit(lambda p, t: model.apply({"params": p}, t, method=m))  # noqa
    emb = run(A.SimpleAttentionNetwork.forward_embedding)
    conf = run(A.SimpleAttentionNetwork.forward_confidence)
    router = run(A.SimpleAttentionNetwork.forward_router)
    cases = []
    for pr in prompts:
        t = jnp.asarray([pr], jnp.int32)
        cases.append({"tokens": [int(x) for x in pr],
                      "embedding": [float(x) for x in np.asarray(emb(params, t))[0]],
                      "confidence": float(np.asarray(conf(params, t))[0]),
                      "router": [float(x) for x in np.asarray(router(params, t))[0]]})
    with open(os.path.join(out_dir, name + ".heads.json"), "w") as f:
        json.dump({"package": "cactus-needle==3.2.8", "model": name + ".cact",
                   "cases": cases}, f, indent=1)
    print("wrote", os.path.join(out_dir, name + ".heads.json"))


if __name__ == "__main__":
    sys.exit(main())
