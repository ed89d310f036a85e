#!/usr/bin/env python3
"""W·A8 parity fixtures for Needle 3: the official 3.2.8 model with quantization on.

For every Needle 3 parity fixture (tests/fixtures/v3/<model>.json and its .cact), this runs
the official module `needle.model.architecture.SimpleAttentionNetwork` with `quant=True`
over the weights the official reader `export.read_export` decodes, after
`quantize.configure_deploy(act_bits=8, kv_bits=<the file's kv_bits>, kv_group=64)`: the
deployment numerics the file was made for. With quant on, the module quantizes (per row,
absmax/127, round-half-even, clamp to [-128, 127], in float32):
  - `_aq`: the engram vector before key/value_proj, the normed attention input before
    q/k/v/gate_proj, the gated attention output before out_proj, the normed lanes before
    the mHC phi products, the final hidden before the tied head;
  - `maybe_quant_query`: each query head after q_norm and RoPE;
  - `maybe_quant_kv` (kv_bits 8): each key head after k_norm and RoPE and each value head
    after the conv taps.
The MLP (Monarch, FP16 factors) and the weights themselves are not touched by quant.

Each case (the float fixture's prompt) is run over the whole sequence, zero-padded to a
fixed length (the model is causal and quantizes per position, so padding never changes an
earlier row, and one XLA compile serves every case). Greedy decoding is QAT greedy:
argmax of the last row, fed back, 8 times as in the float fixtures.

Every row also records `round_margin`: over every element that row's position quantizes
(all the points above, every layer), the smallest distance of x/s to a rounding boundary
in quantization steps (0 = on a .5 tie). An engine whose float activations differ from
the reference's by e steps can round an element differently only where round_margin < e.

Writes OUT_DIR/<model>.json (cases: tokens = prompt + QAT greedy[:-1], the greedy tokens,
round_margin per row) and OUT_DIR/<model>.case<k>.f32 ([rows][out_vocab] float32 LE).

Usage: make_a8_v3_fixtures.py [FIXTURE_DIR] [--only v3a,...]   (FIXTURE_DIR: tests/fixtures/v3;
output in FIXTURE_DIR/a8)
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

import make_v3_fixtures as V3  # noqa: E402
from needle.model import architecture as A  # noqa: E402
from needle.model import export as E  # noqa: E402
from needle.model import quantize as Q  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
MODELS = ("v3a", "v3b", "v3c", "v3d")
GREEDY_STEPS = 8

# ---- rounding margins, recorded at every quantization point ----------------------------
_margins = []


def _record(m):
    _margins.append(np.asarray(m, np.float64).reshape(-1))


def _margin_of(x, token_axis):
    """Per position: the smallest distance of x/s to a rounding tie, s = absmax/127 over
    the last axis (the quantized row)."""
    xf = x.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(xf), axis=-1, keepdims=True)
    scale = jnp.where(absmax > 0, absmax / 127, 1.0)
    r = jnp.abs(xf / scale)
    dist = jnp.abs(r - jnp.floor(r) - 0.5)
    axes = tuple(a for a in range(x.ndim) if a != token_axis % x.ndim)
    jax.debug.callback(_record, jnp.min(dist, axis=axes))


_orig_aq, _orig_query, _orig_kv = A._aq, Q.maybe_quant_query, Q.maybe_quant_kv


def _aq_probe(x, quant):
    if quant is not False:
        _margin_of(x, -2)  # [B, T, D]
    return _orig_aq(x, quant)


def _query_probe(x, quant):
    if quant is not False and Q.ACT_BITS:
        _margin_of(x, -2)  # [B, H, T, hd]
    return _orig_query(x, quant)


def _kv_probe(x, quant):
    if quant is not False and Q.KV_BITS >= 8:
        _margin_of(x, -2)
    return _orig_kv(x, quant)


A._aq = _aq_probe
Q.maybe_quant_query = _query_probe
Q.maybe_quant_kv = _kv_probe


class QatModel:
    def __init__(self, fixdir, name, T):
        with open(os.path.join(fixdir, name + ".json")) as f:
            self.doc = json.load(f)
        spec = V3.MODELS[name]
        self.cfg = V3.make_config(spec["geom"])
        tmpl = V3.random_params(self.cfg, spec["seed"], spec["heads"])
        self.header, self.params = V3.params_from_cact(os.path.join(fixdir, name + ".cact"),
                                                       tmpl)
        if self.header["kv_bits"] != 8:
            raise SystemExit(f"{name}: kv_bits {self.header['kv_bits']}: only 8 is made here")
        Q.configure_deploy(act_bits=8, kv_bits=self.header["kv_bits"], kv_group=64)
        model = A.SimpleAttentionNetwork(self.cfg)
        self.T = T
        self.fwd = {q: jax.jit(lambda p, t, q=q: model.apply({"params": p}, t, quant=q))
                    for q in (False, True)}

    def rows(self, seq, quant=True):
        buf = np.zeros((1, self.T), np.int32)
        buf[0, :len(seq)] = seq
        del _margins[:]
        out = np.asarray(self.fwd[quant](self.params, jnp.asarray(buf))[0, :len(seq)],
                         np.float32)
        jax.effects_barrier()
        marg = None
        if quant:
            marg = np.min(np.stack([m[-self.T:] for m in _margins]), axis=0)[:len(seq)]
        return out, marg


def build(name, fixdir, outdir):
    t0 = time.time()
    with open(os.path.join(fixdir, name + ".json")) as f:
        doc = json.load(f)
    T = max(len(c["tokens"]) for c in doc["cases"]) + GREEDY_STEPS
    T = (T + 15) // 16 * 16
    qm = QatModel(fixdir, name, T)
    cases, float_check, agree, total = [], 0.0, 0, 0
    for k, c in enumerate(doc["cases"]):
        toks = list(c["tokens"])
        if k == 0:
            # the weight mapping: quant=False reproduces the float fixture
            ref = np.fromfile(os.path.join(fixdir, c["logits"]), "<f4").reshape(len(toks), -1)
            rows, _ = qm.rows(toks, quant=False)
            float_check = float(np.max(np.abs(rows - ref)) / np.max(np.abs(ref)))
            assert float_check < 1e-4, (name, float_check)
        seq, greedy = list(toks), []
        while True:
            rows, marg = qm.rows(seq)
            greedy.append(int(np.argmax(rows[-1])))
            if len(greedy) == GREEDY_STEPS:
                break
            seq.append(greedy[-1])
        agree += sum(a == b for a, b in zip(greedy, c["greedy"]))
        total += GREEDY_STEPS
        fn = f"{name}.case{k}.f32"
        rows.astype("<f4").tofile(os.path.join(outdir, fn))
        cases.append({"prompt": len(toks), "tokens": seq, "greedy": greedy, "logits": fn,
                      "rows": int(rows.shape[0]), "cols": int(rows.shape[1]),
                      "round_margin": [float("%.4g" % m) for m in marg]})
        print(f"{name} case {k}: {len(seq)} rows, min round margin {float(np.min(marg)):.2e}",
              flush=True)
    out = {"model": "../" + name + ".cact", "package": "cactus-needle==3.2.8",
           "reference": "export.read_export -> SimpleAttentionNetwork(cfg).apply(params, "
                        "tokens, quant=True) after quantize.configure_deploy(act_bits=8, "
                        f"kv_bits={qm.header['kv_bits']}, kv_group=64), whole sequence "
                        f"zero-padded to {T}; QAT greedy",
           "kv_bits": qm.header["kv_bits"], "float_check": float_check, "cases": cases}
    with open(os.path.join(outdir, name + ".json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"{name}: quant=False vs float fixture {float_check:.2e}; QAT greedy == float greedy "
          f"on {agree}/{total} tokens ({time.time() - t0:.0f}s)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixdir", nargs="?", default=os.path.join(REPO, "tests", "fixtures", "v3"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    outdir = os.path.join(args.fixdir, "a8")
    os.makedirs(outdir, exist_ok=True)
    for name in [m for m in args.only.split(",") if m] or MODELS:
        build(name, args.fixdir, outdir)


if __name__ == "__main__":
    main()
