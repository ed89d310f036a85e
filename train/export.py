"""Exports a trained demo model to .cact with the official exporter (cactus-needle's
`export.write_export`), the trained tokenizer embedded.

    python train/export.py --work train/work/run1 --tok train/work/tok.model \
        --out models/needle-demo.cact [--checkpoint]

`--checkpoint` exports the latest periodic checkpoint instead of the final weights
(to try a model while it is still training).
"""
import argparse
import os
import pickle

from needle.model import architecture as A
from needle.model import export as E
from needle.model import tokenizer as T

import train as training


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--tok", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", action="store_true")
    ap.add_argument("--bits", type=int, default=None, help="default: the width QAT used")
    # only for a --checkpoint of a run with a non-default geometry: final.pkl records it
    ap.add_argument("--d-model", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    a = ap.parse_args()
    name = "checkpoint.pkl" if a.checkpoint else "final.pkl"
    with open(os.path.join(a.work, name), "rb") as f:
        state = pickle.load(f)
    geom = dict(training.GEOMETRY)
    geom.update(state.get("config", {}))
    if a.d_model:
        geom["d_model"] = a.d_model
    if a.layers:
        geom["num_layers"] = a.layers
    cfg = A.TransformerConfig(dtype="float32", **geom)
    bits = a.bits or state.get("bits", 4)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    info = E.write_export(state["params"], cfg, a.out, bits=bits,
                          tokenizer=T.SANTokenizer(a.tok), kv_window=A.effective_kv_window(cfg))
    print(f"wrote {info['path']}: {info['bytes'] / 1e6:.2f} MB, {info['tensors']} tensors, "
          f"CQ{bits}, kv_window {A.effective_kv_window(cfg)}, step {state.get('step', state.get('steps'))}")


if __name__ == "__main__":
    main()
