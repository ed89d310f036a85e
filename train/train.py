"""Trains the demo model: the official Needle 2 flax module, our training loop.

The architecture is cactus-needle's `SimpleAttentionNetwork` (imported from PyPI, not
copied) at a reduced geometry; the loop, data pipeline and schedule are ours:

* examples are rendered and encoded exactly as the official fine-tuner does
  (`finetune._encode`: [BOS] + prompt + target + [EOS], loss on target + EOS only) and
  packed into rows of 512 tokens, one attention segment each, so a single shape is
  compiled and no compute goes to padding;
* AdamW with warm-up and a cosine decay driven by *wall-clock* time, so the run ends
  when its time budget does whatever the machine's speed (`--minutes`);
* for the last `--qat-frac` of the budget the weights pass through the CQ quantizer
  with a straight-through gradient (`quantize.cq_ste_params`), at the bit width the
  export uses, so the exported model is the one that was trained;
* a checkpoint every few minutes; rerunning the same command resumes from it.

    python train/train.py --data train/data/train.jsonl --tok train/work/tok.model \
        --work train/work --minutes 100
"""
import argparse
import json
import math
import os
import pickle
import time

import numpy as np
import jax
import jax.numpy as jnp
import optax

from needle.model import architecture as A
from needle.model import finetune as F
from needle.model import quantize as Q
from needle.model import tokenizer as T

GEOMETRY = dict(vocab_size=4096, d_model=256, num_heads=4, num_kv_heads=2, num_layers=6,
                max_seq_len=1024, rope_theta=10000.0, mhc_lanes=4, engram_orders=(2, 3),
                engram_slots=4096, engram_layers=(1, 4), kv_window=0)
ROW = 512                   # packed rows of 512 tokens (--rows of them a step)


def log(path, msg):
    line = time.strftime("%H:%M:%S ") + msg
    print(line, flush=True)
    with open(path, "a") as f:
        f.write(line + "\n")


def geometry(args):
    """GEOMETRY with the width and depth of this run."""
    return GEOMETRY | dict(d_model=args.d_model, num_layers=args.layers)


def make_config(args):
    return A.TransformerConfig(dtype="float32", flash=True, remat=False, **geometry(args))


def encode_split(path, tok, limit=None):
    """Every example as (ids, loss mask), unpadded, as the official fine-tuner encodes it."""
    out, dropped = [], 0
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if limit and i >= limit:
                break
            ids, mask = F._encode(tok, json.loads(line), ROW + 1)
            n = int(np.count_nonzero(np.asarray(ids) != T.PAD_ID))
            if n > ROW:
                dropped += 1
                continue
            out.append((np.asarray(ids[:n], np.int32), np.asarray(mask[:n], np.float32)))
    return out, dropped


def pack(examples, order):
    """Greedy packing into rows of ROW tokens. Each example is its own attention segment
    (make_causal_packing_mask blocks attention and engram n-grams across segments); the
    padding at the end of a row is one more segment, so no query row is fully masked."""
    rows, cur = [], []
    used = 0
    for i in order:
        n = len(examples[i][0])
        if used + n > ROW:
            rows.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    if cur:
        rows.append(cur)
    ids = np.zeros((len(rows), ROW), np.int32)
    mask = np.zeros((len(rows), ROW), np.float32)
    seg = np.zeros((len(rows), ROW), np.int32)
    for r, members in enumerate(rows):
        at = 0
        for k, i in enumerate(members):
            e_ids, e_mask = examples[i]
            ids[r, at:at + len(e_ids)] = e_ids
            mask[r, at:at + len(e_ids)] = e_mask
            seg[r, at:at + len(e_ids)] = k + 1
            at += len(e_ids)
        seg[r, at:] = len(members) + 1
    return ids, mask, seg


def init_params(cfg, seed):
    model = A.SimpleAttentionNetwork(cfg)
    params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 16), jnp.int32))["params"]
    # the multi-token-prediction branch is not used by the engine or this loss
    return {k: v for k, v in params.items() if not k.startswith("mtp_")}


def lr_at(frac, peak, warm=0.03, floor=0.05):
    if frac < warm:
        return peak * frac / warm
    t = min(1.0, (frac - warm) / (1 - warm))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--val", default=None, help="held-out JSONL for the validation loss")
    ap.add_argument("--tok", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--minutes", type=float, default=100)
    ap.add_argument("--d-model", type=int, default=GEOMETRY["d_model"])
    ap.add_argument("--layers", type=int, default=GEOMETRY["num_layers"])
    ap.add_argument("--rows", type=int, default=6, help="packed rows per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--bits", type=int, default=4, help="CQ width the export and QAT use")
    ap.add_argument("--qat-frac", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", default=None,
                    help="start from this final.pkl's weights (fresh optimizer and schedule): "
                         "a second stage on new data")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--bench", type=int, default=0, help="time N steps per bucket and exit")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    logf = os.path.join(a.work, "train.log")
    ckpt = os.path.join(a.work, "checkpoint.pkl")

    cfg = make_config(a)
    tok = T.SANTokenizer(a.tok)
    t0 = time.time()
    data, dropped = encode_split(a.data, tok, a.limit)
    ntok = sum(len(e[0]) for e in data)
    log(logf, f"data {len(data)} examples, {ntok:,} tokens, {dropped} longer than {ROW} "
        f"({time.time() - t0:.0f}s to encode)")
    val = None
    if a.val:
        vd, _ = encode_split(a.val, tok)
        vi, vm, vs = pack(vd, range(len(vd)))
        val = [(vi[r:r + a.rows], vm[r:r + a.rows], vs[r:r + a.rows])
               for r in range(0, min(len(vi), 4 * a.rows), a.rows) if r + a.rows <= len(vi)]

    model = A.SimpleAttentionNetwork(cfg)
    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.inject_hyperparams(optax.adamw)(learning_rate=0.0,
                                                            weight_decay=a.wd))

    def hidden(module, tokens, attn_mask):
        """The official forward pass up to the final norm (what `__call__` does before
        its logits), so the loss can project only the supervised positions."""
        x = module.embedding(tokens) * module.embed_scale
        engram_kv = module._engram_kv(tokens, attn_mask, False)
        x, _ = module.stack(x, mask=attn_mask, rope=module._rope(tokens.shape[1]),
                            engram_kv=engram_kv, quant=False)
        return x, module.embedding.embedding

    # Only ~12% of a row is supervised (the answers), and the 4,096-way projection is
    # about a third of the forward pass at this width: project only the supervised
    # positions, gathered into a fixed-size buffer so one shape is compiled.
    sup_cap = a.rows * ROW // 3

    def loss_fn(params, ids, mask, seg, qat):
        if qat:
            params = Q.cq_ste_params(params, a.bits)
        x, emb = model.apply({"params": params}, ids, A.make_causal_packing_mask(seg),
                             method=hidden)
        h = x[:, :-1].reshape(-1, x.shape[-1])
        targets, w = ids[:, 1:].reshape(-1), mask[:, 1:].reshape(-1)
        pos = jnp.nonzero(w, size=sup_cap, fill_value=0)[0]
        live = (jnp.arange(sup_cap) < jnp.count_nonzero(w)).astype(jnp.float32)
        logits = h[pos].astype(jnp.float32) @ emb.T
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets[pos])
        wsel = w[pos] * live
        return (ce * wsel).sum() / jnp.maximum(wsel.sum(), 1.0)

    def make_step(qat):
        @jax.jit
        def step(params, opt_state, ids, mask, seg, lr):
            opt_state[1].hyperparams["learning_rate"] = lr
            loss, grads = jax.value_and_grad(loss_fn)(params, ids, mask, seg, qat)
            updates, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss
        return step

    steps = {False: make_step(False), True: make_step(True)}
    eval_loss = {q: jax.jit(lambda p, i, m, s, q=q: loss_fn(p, i, m, s, q)) for q in (False, True)}

    state = None
    if os.path.exists(ckpt):
        with open(ckpt, "rb") as f:
            state = pickle.load(f)
        params, opt_state = state["params"], state["opt_state"]
        step_i, elapsed, rng_state = state["step"], state["elapsed"], state["rng"]
        log(logf, f"resumed at step {step_i}, {elapsed / 60:.1f} min trained")
    else:
        if a.init:
            with open(a.init, "rb") as f:
                start = pickle.load(f)
            if start["config"] != geometry(a):
                raise SystemExit(f"--init {a.init}: its geometry differs from this run's")
            params = jax.tree.map(jnp.asarray, start["params"])
            log(logf, f"init from {a.init} ({start['steps']} steps, {start['minutes']:.0f} min)")
        else:
            params = init_params(cfg, a.seed)
        opt_state = opt.init(params)
        step_i, elapsed, rng_state = 0, 0.0, None
        n = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
        log(logf, f"geometry {json.dumps({k: getattr(cfg, k) for k in GEOMETRY})}; {n:,} params")
    rng = np.random.default_rng(a.seed)
    if rng_state is not None:
        rng.bit_generator.state = rng_state

    budget = a.minutes * 60.0
    epoch_rows = None

    def next_batch():
        nonlocal epoch_rows
        if epoch_rows is None or len(epoch_rows[0]) < a.rows:
            epoch_rows = pack(data, rng.permutation(len(data)))
        ids, mask, seg = (x[:a.rows] for x in epoch_rows)
        epoch_rows = tuple(x[a.rows:] for x in epoch_rows)
        return ids, mask, seg

    if a.bench:
        # the sparse projection must give the official full-logit loss
        ids, mask, seg = next_batch()
        full = model.apply({"params": params}, ids, mask=A.make_causal_packing_mask(seg))
        ce = optax.softmax_cross_entropy_with_integer_labels(full[:, :-1], ids[:, 1:])
        ref = float((ce * mask[:, 1:]).sum() / mask[:, 1:].sum())
        got = float(eval_loss[False](params, ids, mask, seg))
        log(logf, f"bench: loss full-logit {ref:.6f} sparse {got:.6f}")
        for qat in (False, True):
            batch = next_batch()
            t = time.time()
            p2, o2, loss = steps[qat](params, opt_state, *batch, 1e-3)
            float(loss)
            tc = time.time() - t
            t = time.time()
            for _ in range(a.bench):
                p2, o2, loss = steps[qat](p2, o2, *next_batch(), 1e-3)
            float(loss)
            dt = (time.time() - t) / a.bench
            log(logf, f"bench qat={qat}: compile {tc:.1f}s, {dt * 1000:.0f} ms/step, "
                f"{a.rows * ROW / dt:.0f} tok/s")
        return

    last_save = time.time()
    run_start = time.time() - elapsed
    losses = []
    while True:
        elapsed = time.time() - run_start
        frac = elapsed / budget
        if frac >= 1.0:
            break
        qat = frac >= 1.0 - a.qat_frac
        params, opt_state, loss = steps[qat](params, opt_state, *next_batch(),
                                             lr_at(frac, a.lr))
        step_i += 1
        losses.append(float(loss))
        if step_i % 25 == 0:
            msg = (f"step {step_i} {elapsed / 60:.1f}/{a.minutes:.0f} min lr "
                   f"{lr_at(frac, a.lr):.2e}{' qat' if qat else ''} loss {np.mean(losses):.4f}")
            if val and step_i % 150 == 0:
                v = np.mean([float(eval_loss[qat](params, *b)) for b in val])
                msg += f" val {v:.4f}"
            log(logf, msg)
            losses = []
        if time.time() - last_save > 300:
            save(ckpt, params, opt_state, step_i, time.time() - run_start, rng)
            last_save = time.time()
    save(ckpt, params, opt_state, step_i, time.time() - run_start, rng)
    final = dict(params=jax.tree.map(np.asarray, params), config=geometry(a), bits=a.bits,
                 steps=step_i, minutes=(time.time() - run_start) / 60, qat=a.qat_frac > 0)
    with open(os.path.join(a.work, "final.pkl"), "wb") as f:
        pickle.dump(final, f)
    log(logf, f"done: {step_i} steps in {final['minutes']:.1f} min")


def save(path, params, opt_state, step_i, elapsed, rng):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(dict(params=jax.tree.map(np.asarray, params),
                         opt_state=jax.tree.map(np.asarray, opt_state),
                         step=step_i, elapsed=elapsed, rng=rng.bit_generator.state), f)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
