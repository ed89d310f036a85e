"""Exports a trained demo model to .cact with `needle export` (the C exporter, byte-identical
to the official cactus-needle `export.write_export`), the trained tokenizer embedded.

    python train/export.py --work train/work/run1 --tok train/work/tok.model \
        --out models/needle-demo.cact [--checkpoint] [--needle build/needle] [--check]

The pickled parameters are written as a safetensors checkpoint + config JSON
(checkpoint_to_safetensors.py) next to the pickle, then `needle export` quantizes them.
`--checkpoint` exports the latest periodic checkpoint instead of the final weights (to try a
model while it is still training). `--check` also runs the official exporter and fails
unless both files are the same bytes.
"""
import argparse
import os
import pickle
import subprocess
import sys

import checkpoint_to_safetensors as C
import train as training

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--tok", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", action="store_true")
    ap.add_argument("--bits", type=int, default=None, help="default: the width QAT used")
    ap.add_argument("--needle", default=os.environ.get("NEEDLE_CLI", os.path.join(HERE, "..", "build", "needle")))
    ap.add_argument("--check", action="store_true", help="compare with the official exporter's bytes")
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
    bits = a.bits or state.get("bits", 4)
    ckpt_dir = os.path.join(a.work, "export-" + os.path.splitext(name)[0])
    st, cj = C.write_checkpoint(state["params"], geom, ckpt_dir)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    # the header kv_window: needle export's default is architecture.effective_kv_window
    subprocess.run([a.needle, "export", st, "--config", cj, "--bits", str(bits), "--tokenizer", a.tok,
                    "-o", a.out, "-q"], check=True)
    print(f"step {state.get('step', state.get('steps'))}")
    if a.check:
        from needle.model import architecture as A
        from needle.model import export as E
        from needle.model import tokenizer as T
        cfg = A.TransformerConfig(dtype="float32", **geom)
        ref = E.build_export(state["params"], cfg, bits=bits, tokenizer=T.SANTokenizer(a.tok),
                             kv_window=A.effective_kv_window(cfg))
        with open(a.out, "rb") as f:
            ours = f.read()
        if ours != ref:
            sys.exit(f"{a.out} differs from the official exporter's output ({len(ours)} vs {len(ref)} bytes)")
        print("byte-identical to the official exporter")


if __name__ == "__main__":
    main()
