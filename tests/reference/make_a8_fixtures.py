#!/usr/bin/env python3
"""W·A8 parity fixtures: logits of the official flax model with activation quantization on.

For every committed parity fixture (tests/fixtures/<model>.json and its .cact), this runs the
official module `needle.model.architecture.SimpleAttentionNetwork` with `quant=True`: the
QAT numerics of spec §5.3 (per-row absmax/127, round-half-even, clamp, at the normed
attention input, the gated attention output, the engram vector and the final hidden) over
the weights the official reader `export.read_export` decodes from the .cact.

The model is non-cached, so each case is run over the whole sequence with the decoder's
mask (causal, `(i - j) < kv_window`, or a sink column), padded with zeros to a fixed length
(causal: padding never changes earlier rows, and one XLA compile serves every case of a
geometry). Greedy decoding is QAT greedy: argmax of the last row (ties -> lowest id), fed
back, n_new times, like the float fixtures.

Besides the logits, every row records `round_margin`: over every activation element that
row quantizes (all four points, every layer), the smallest distance of x/s to a rounding
boundary, in quantization steps (0 = exactly on a .5 tie, 0.5 = on an integer). An engine
whose float activations differ from the reference's by e steps can round an element
differently (a "flip") only where round_margin < e; from a flip on, that row and every
later one (through the KV cache) see a slightly different int8 vector.

Writes FIXTURE_DIR/a8/<model>.json (model path relative to it, cases as in the float
fixtures plus round_margin) and FIXTURE_DIR/a8/<model>.case<k>.q16.

Usage: make_a8_fixtures.sh [FIXTURE_DIR] [--only tiny_cq2,...]
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import make_fixtures as MF  # noqa: E402
from needle.model import architecture as A  # noqa: E402
from needle.model import decode as D  # noqa: E402
from needle.model import export as E  # noqa: E402
from needle.model import quantize as Q  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
MODELS = [f"tiny_{t}" for t in ("cq2", "cq3", "cq4", "ternary", "mixed")] + \
         [f"tinyb_{t}" for t in ("cq2", "cq3", "cq4", "ternary", "mixed")] + ["full_mixed"]
# full_mixed: the two short cases only (the 270-token case would add 4.6 MB of logits)
FULL_CASES = 2

# ---- rounding margins, recorded at every quantization point --------------------------
_margins = []


def _record(m):
    _margins.append(np.asarray(m, np.float64))


def _aq_probe(x, quant):
    """architecture._aq with quant=True, plus the rounding margin of each row."""
    if quant is False:
        return x
    xf = x.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(xf), axis=-1, keepdims=True)
    scale = jnp.where(absmax > 0, absmax / 127, 1.0)
    r = jnp.abs(xf / scale)
    dist = jnp.abs(r - jnp.floor(r) - 0.5)
    jax.debug.callback(_record, jnp.min(dist, axis=-1))
    return jax.lax.cond(quant, Q.fake_quant_act, lambda t: t, x)


A._aq = _aq_probe


def window_mask(T, window, sinks):
    i = np.arange(T)
    causal = i[None, :] <= i[:, None]
    keep = np.ones((T, T), bool)
    if window:
        keep = (i[:, None] - i[None, :]) < window
        if sinks:
            keep |= (i[None, :] < sinks)
    return jnp.asarray((causal & keep)[None, None])


class QatModel:
    def __init__(self, path, T):
        self.header, ts = E.read_export(path)
        self.cfg = MF.config_from_header(self.header)
        self.params = D._f32(MF.params_from_cact(self.header, ts))
        self.model = A.SimpleAttentionNetwork(self.cfg)
        self.T = T
        self.fwd = jax.jit(lambda p, t, m, q: self.model.apply({"params": p}, t, mask=m,
                                                               quant=q),
                           static_argnums=3)

    def rows(self, seq, window, sinks, quant=True):
        """Logits rows [len(seq), V] and per-row rounding margins of one forward."""
        assert len(seq) <= self.T
        buf = np.zeros((1, self.T), np.int32)
        buf[0, :len(seq)] = seq
        del _margins[:]
        out = self.fwd(self.params, jnp.asarray(buf), window_mask(self.T, window, sinks),
                       quant)
        out = np.asarray(out[0, :len(seq)], np.float32)
        jax.effects_barrier()
        marg = None
        if quant:
            marg = np.min(np.stack([m.reshape(-1, self.T)[0] for m in _margins]), axis=0)
            marg = marg[:len(seq)]
        return out, marg


def read_q16(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"NQ16"
    n, V = np.frombuffer(data[4:12], "<u4")
    rows = []
    off = 12
    for _ in range(n):
        s = np.frombuffer(data[off:off + 4], "<f4")[0]
        q = np.frombuffer(data[off + 4:off + 4 + 2 * V], "<i2").astype(np.float32)
        rows.append(q * s)
        off += 4 + 2 * V
    return np.stack(rows)


def build(name, fixdir):
    with open(os.path.join(fixdir, name + ".json")) as f:
        doc = json.load(f)
    cases_in = doc["cases"][:FULL_CASES] if name.startswith("full") else doc["cases"]
    T = max(len(c["tokens"]) + len(c["greedy"]) for c in cases_in)
    T = (T + 15) // 16 * 16
    t0 = time.time()
    outdir = os.path.join(fixdir, "a8")
    os.makedirs(outdir, exist_ok=True)
    qm = QatModel(os.path.join(fixdir, doc["model"]), T)
    cases, agree, total = [], 0, 0
    float_check = 0.0
    for k, c in enumerate(cases_in):
        toks, n_new = list(c["tokens"]), len(c["greedy"])
        window, sinks = c["window"], c["sinks"]
        if k == 0:
            # the mapping check: the same module without quantization reproduces the float
            # fixture (decode.forward_cached) rows
            ref = read_q16(os.path.join(fixdir, c["logits"]))
            rows, _ = qm.rows(toks, window, sinks, quant=False)
            float_check = float(np.max(np.abs(rows - ref)) / np.max(np.abs(ref)))
            assert float_check < 1e-3, (name, float_check)
        seq = list(toks)
        greedy = []
        while True:
            rows, marg = qm.rows(seq, window, sinks)
            nxt = int(np.argmax(rows[-1]))
            greedy.append(nxt)
            if len(greedy) == n_new:
                break
            seq.append(nxt)
        agree += sum(a == b for a, b in zip(greedy, c["greedy"]))
        total += n_new
        q16 = f"{name}.case{k}.q16"
        MF.write_q16(os.path.join(outdir, q16), rows)
        cases.append({"tokens": toks, "window": window, "sinks": sinks, "logits": q16,
                      "greedy": greedy,
                      "min_margin": min(MF.margin(r) for r in rows),
                      "round_margin": [float("%.4g" % m) for m in marg]})
        first_risky = next((i for i, m in enumerate(marg) if m < 1e-3), None)
        print(f"{name} case {k}: {len(seq)} rows, min logit margin "
              f"{cases[-1]['min_margin']:.4f}, min round margin {float(np.min(marg)):.2e}, "
              f"first row below 1e-3 {first_risky}", flush=True)
    out = {"model": "../" + doc["model"],
           "reference": "cactus-needle 2.0.15 export.read_export -> "
                        "architecture.SimpleAttentionNetwork(cfg).apply({'params': "
                        "decode._f32(tree)}, seq[None], mask=causal&(window|sink), "
                        "quant=True) over the whole sequence (zero-padded to "
                        f"{T}); QAT greedy",
           "float_check": float_check, "cases": cases}
    with open(os.path.join(outdir, name + ".json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"{name}: quant=False vs float fixture max rel diff {float_check:.2e}; QAT greedy "
          f"== float greedy on {agree}/{total} tokens ({time.time() - t0:.0f}s)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixdir", nargs="?", default=os.path.join(REPO, "tests", "fixtures"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    only = [m for m in args.only.split(",") if m] or MODELS
    print(f"jax {jax.__version__} devices {jax.devices()}", flush=True)
    for name in only:
        build(name, args.fixdir)


if __name__ == "__main__":
    main()
