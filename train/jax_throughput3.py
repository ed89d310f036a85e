"""Training throughput of the JAX recipe on this machine for the Needle 3 default model's
geometry: the baseline that issue 35 compares the C trainer against. One full-parameter
training step as the official fine-tuner writes its loop (cactus-needle 3.2.8
`finetune_local`: masked mean cross-entropy of logits[:, :-1] against ids[1:], AdamW
after global-norm clipping at 1.0, under jax.jit), in float (no CQ straight-through, no
A8: the from-scratch phase before QAT), on real rendered examples of train3.jsonl.
Prints compile time and tokens per second (all row positions, and non-pad tokens).

    python train/jax_throughput3.py --data train/data/train3.jsonl --init train/work3/init \\
        [--batch 8] [--steps 5]
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import encode3  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--init", required=True, help="init3.py's output directory")
    ap.add_argument("--tok", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "data", "needle3-tok4096.model"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import sentencepiece as spm
    from needle.model import architecture as A
    from needle.model import run as RUN

    params, cfg = RUN.load_checkpoint(os.path.join(a.init, "init.safetensors"))
    trunk = {k: v for k, v in params.items() if not k.endswith("_head")}
    sp = spm.SentencePieceProcessor()
    sp.Load(a.tok)
    with open(a.data, encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(a.batch * (a.steps + 1)), f)]
    batches = []
    for i in range(a.steps + 1):
        lines = [json.loads(x) for x in encode3.batch_lines(rows[i * a.batch:(i + 1) * a.batch],
                                                             sp.encode, cfg.max_seq_len)]
        batches.append((np.array([x["ids"] for x in lines], np.int32),
                        np.array([x["mask"] for x in lines], np.float32)))
    # one row length for every step (no recompiles): the longest batch's
    width = max(b[0].shape[1] for b in batches)
    batches = [(np.pad(i, ((0, 0), (0, width - i.shape[1]))),
                np.pad(m, ((0, 0), (0, width - m.shape[1])))) for i, m in batches]
    model = A.SimpleAttentionNetwork(cfg)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.01))
    trunk = jax.tree_util.tree_map(jnp.asarray, trunk)
    opt_state = optimizer.init(trunk)

    def loss_fn(p, ids, mask):
        logits = model.apply({"params": p}, ids)
        logits, targets, mask = logits[:, :-1], ids[:, 1:], mask[:, 1:]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        return (ce * mask).sum() / jnp.maximum(mask.sum(), 1.0)

    @jax.jit
    def step(p, s, ids, mask):
        loss, grads = jax.value_and_grad(loss_fn)(p, ids, mask)
        updates, s = optimizer.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    t0 = time.time()
    trunk, opt_state, loss = step(trunk, opt_state, *batches[0])
    loss.block_until_ready()
    compile_s = time.time() - t0
    t0 = time.time()
    real = 0
    for ids, mask in batches[1:]:
        trunk, opt_state, loss = step(trunk, opt_state, ids, mask)
        real += int((ids != 0).sum())
    loss.block_until_ready()
    dt = time.time() - t0
    print(json.dumps({"batch": a.batch, "row_len": width, "steps": a.steps,
                      "compile_and_first_step_s": round(compile_s, 1),
                      "step_s": round(dt / a.steps, 2),
                      "row_tokens_per_s": round(a.batch * width * a.steps / dt),
                      "non_pad_tokens_per_s": round(real / dt), "last_loss": float(loss),
                      "load_average": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
