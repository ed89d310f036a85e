#!/usr/bin/env python3
"""Probe-head parity fixtures (spec §4), from the official `cactus-needle` 2.0.15 package.

For committed parity models that carry the probe-head section, this reads the `.cact` back
with the official reader (`export.read_export`), puts the decoded tensors, heads included,
into the parameter tree of the official flax module, and records what the official
functions return on seeded token sequences:

* `SimpleAttentionNetwork.forward_confidence(tokens, window=W)`: the confidence logit;
* `SimpleAttentionNetwork.encode_contrastive(tokens, window=W)`: the 128-d unit embedding;

in float32 on CPU, with W the header's kv_window (sequences both shorter and longer than
it), no sinks, no PAD tokens. Output: tests/fixtures/heads/<model>.json (a folder of its
own: tests/parity/test_parity.c reads every .json directly in tests/fixtures as a model fixture).

Usage: make_head_fixtures.py [FIXTURE_DIR] [--models tinyb_mixed,tiny_mixed,...]
"""
import argparse
import json
import math
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("NEEDLE_TELEMETRY", "0")
os.environ.setdefault("DO_NOT_TRACK", "1")

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from needle.model import architecture as A  # noqa: E402
from needle.model import export as E  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as MF  # noqa: E402  (config_from_header, params_from_cact)

HEAD_NAMES = {1: "contrastive_head", 2: "confidence_head"}


def head_params(h, ts):
    """The probe-head section (§1.10) back into the flax tree: proj is stored transposed."""
    L, S = h["num_layers"], len(h["engram_layers"])
    base = 1 + 14 * L + 9 + 4 * S + 1
    tok = 1 if isinstance(ts[-1], (bytes, bytearray)) else 0
    extra = len(ts) - base - tok
    assert extra > 0 and (extra - 1) % 3 == 0, extra
    manifest = [int(round(float(c))) for c in np.asarray(ts[base], np.float32)]
    out = {}
    for k, code in enumerate(manifest):
        probes, proj, bias = ts[base + 1 + 3 * k: base + 4 + 3 * k]
        p = {"probes": np.asarray(probes, np.float32),
             "proj": {"kernel": np.asarray(proj, np.float32).T}}
        if code == 1:
            p["log_temp"] = np.asarray(math.log(0.07), np.float32)
        else:
            p["proj"]["bias"] = np.asarray(bias, np.float32)
        out[HEAD_NAMES[code]] = p
    return out


def sequences(rng, vocab, window, tok):
    texts = ["What is the weather in Paris today?", "Set an alarm for 7am tomorrow.",
             '{"name":"get_weather","description":"Current weather","parameters":'
             '{"type":"object","properties":{"city":{"type":"string"}}}}']
    out = [[2] + tok.encode(t) for t in texts]
    for n in (1, 7, window - 1, window + 9, 2 * window + 5):
        out.append([2] + [int(x) for x in rng.integers(4, vocab, max(n, 1))])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(MF.REPO, "tests", "fixtures"))
    ap.add_argument("--models", default="tiny_mixed,tinyb_mixed")
    ap.add_argument("--cases", type=int, default=0,
                    help="only the first N sequences (the full-size model: each is a compile)")
    args = ap.parse_args()
    for name in args.models.split(","):
        path = os.path.join(args.out, name + ".cact")
        h, ts = E.read_export(path)
        cfg = MF.config_from_header(h)
        params = MF.params_from_cact(h, ts)
        params.update(head_params(h, ts))
        params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), params)
        model = A.SimpleAttentionNetwork(cfg)
        W = int(h["kv_window"])
        tok = E.RefTokenizer.from_cact(path)
        rng = np.random.default_rng(sum(map(ord, name)))
        cases = []
        seqs = sequences(rng, h["vocab_size"], W, tok)
        for toks in seqs[:args.cases] if args.cases else seqs:
            t = jnp.asarray([toks], jnp.int32)
            conf = model.apply({"params": params}, t, window=W,
                               method=A.SimpleAttentionNetwork.forward_confidence)
            emb = model.apply({"params": params}, t, window=W,
                              method=A.SimpleAttentionNetwork.encode_contrastive)
            cases.append({"tokens": toks,
                          "confidence_logit": float(np.asarray(conf)[0]),
                          "embedding": [float(x) for x in np.asarray(emb, np.float32)[0]]})
            print(f"{name}: {len(toks)} tokens, confidence logit {cases[-1]['confidence_logit']:.6f}",
                  flush=True)
        doc = {"model": name + ".cact", "window": W,
               "reference": "cactus-needle 2.0.15 export.read_export -> SimpleAttentionNetwork."
                            "forward_confidence / encode_contrastive (tokens[None], window=W), "
                            "float32, CPU",
               "cases": cases}
        os.makedirs(os.path.join(args.out, "heads"), exist_ok=True)
        with open(os.path.join(args.out, "heads", f"{name}.json"), "w") as f:
            json.dump(doc, f, indent=0)


if __name__ == "__main__":
    main()
