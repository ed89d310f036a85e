#!/usr/bin/env python3
"""Needle 3 parity fixtures for needle, generated with the official cactus-needle 3.2.8.

Everything numeric comes from the official package:

* the parameter tree (names and shapes) is that of the official flax module
  `needle.model.architecture.SimpleAttentionNetwork` (jax.eval_shape of its init, with the
  three probe heads); every leaf is then filled with seeded random values;
* the `.cact` files are written by the official exporter `needle.model.export.write_export`
  (its CQ packer is only told which width to use per tensor: the package writes CQ4 only,
  the shipped file is CQ2 with CQ4 embedding, mHC phi and heads; the package has no
  writer for the ternary records its reader and format comment define, so those are
  packed here by that definition, see pack_ternary);
* the file is read back with the official reader `read_export`, the decoded tensors are put
  back into the parameter tree, and the reference logits are the official full-sequence
  forward `SimpleAttentionNetwork.apply` in float32 on CPU;
* the ladder rung comes from `needle.model.finetune.rung` (the official slicing), exported
  and run the same way.

Outputs per model NAME in OUT_DIR: NAME.cact, NAME.json (geometry, prompts, figures) and
NAME.caseK.f32 ([n][out_vocab] little-endian float32 logits of prompt K at every position);
rung fixtures NAME_rungD.cact / .json / .caseK.f32 likewise.

Usage: make_v3_fixtures.py [OUT_DIR] [--only NAME[,NAME...]]
"""
import argparse
import hashlib
import json
import os
import random
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("NEEDLE_TELEMETRY", "0")
os.environ.setdefault("DO_NOT_TRACK", "1")

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import sentencepiece as spm  # noqa: E402

from needle.model import architecture as A  # noqa: E402
from needle.model import export as E  # noqa: E402
from needle.model import finetune as F  # noqa: E402
from needle.model import tokenizer as T  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Geometries: padding (d < hada_n, cols < group), non-square Kronecker blocks, qk != v head
# dims both ways, local layers with a window shorter than the prompts, several global
# layers, 1-3 conv taps, 2 and 4 lanes, out_vocab < vocab, engram seed heads.
MODELS = {
    "v3a": dict(geom=dict(vocab_size=384, out_vocab=320, d_model=96, num_heads=4,
                          num_kv_heads=2, num_layers=5, qk_head_dim=16, v_head_dim=24,
                          max_seq_len=128, rope_theta=10000.0, sliding_window=8,
                          global_layers=(1, 4), qkv_conv_taps=3, mhc_lanes=2,
                          engram_orders=(2, 3), engram_slots=61, engram_layers=(0, 2, 3)),
                group=64, bits="mixed", heads=True, rungs=(3,), seed=11),
    "v3b": dict(geom=dict(vocab_size=384, out_vocab=0, d_model=128, num_heads=6,
                          num_kv_heads=2, num_layers=4, qk_head_dim=32, v_head_dim=16,
                          max_seq_len=96, rope_theta=100000.0, sliding_window=6,
                          global_layers=(0, 2), qkv_conv_taps=1, mhc_lanes=4,
                          engram_orders=(2, 3, 4), engram_slots=97, engram_seed_heads=3,
                          engram_layers=(1, 3)),
                group=32, bits="cq4", heads=False, rungs=(), seed=12),
    "v3c": dict(geom=dict(vocab_size=384, out_vocab=300, d_model=64, num_heads=2,
                          num_kv_heads=1, num_layers=3, qk_head_dim=24, v_head_dim=32,
                          max_seq_len=64, rope_theta=10000.0, sliding_window=5,
                          global_layers=(), qkv_conv_taps=2, mhc_lanes=2,
                          engram_orders=(2,), engram_slots=31, engram_layers=()),
                group=32, bits="cq2", heads=False, rungs=(2,), seed=13),
    # Every weight record kind the format defines: binary (bits 1), CQ2, CQ3, CQ4 and
    # ternary (bits 5) in turn over the tensors, so each kind lands on projections, the
    # tied embedding, mHC phi and engram tables.
    "v3d": dict(geom=dict(vocab_size=384, out_vocab=0, d_model=80, num_heads=4,
                          num_kv_heads=2, num_layers=3, qk_head_dim=16, v_head_dim=16,
                          max_seq_len=64, rope_theta=10000.0, sliding_window=6,
                          global_layers=(2,), qkv_conv_taps=2, mhc_lanes=2,
                          engram_orders=(2,), engram_slots=31, engram_layers=(1,)),
                group=64, bits="every", heads=False, rungs=(), seed=14),
}
# The released needle3.cact geometry (docs/spec/NEEDLE3.md §0), CQ2 with CQ4 embedding, mHC phi
# and heads like the shipped file; ~35 MB, so only made on request (--only released) into
# a work directory, for the bench and a full-size parity check, never committed.
RELEASED = dict(geom=dict(vocab_size=8192, out_vocab=8192, d_model=768, num_heads=12,
                          num_kv_heads=2, num_layers=20, qk_head_dim=48, v_head_dim=64,
                          max_seq_len=8192, rope_theta=100000.0, sliding_window=1024,
                          global_layers=(4, 9, 14, 19), qkv_conv_taps=3, mhc_lanes=4,
                          engram_orders=(2, 3), engram_slots=18432,
                          engram_layers=(3, 7, 11, 15, 19)),
                group=128, bits="mixed", heads=True, rungs=(), seed=20)
PROMPT_LENGTHS = (37, 19)


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ---- tokenizer ---------------------------------------------------------------------------

WORDS = ("the of and to in is you that it was for on are with at be this have from or one "
         "weather city send email message alarm timer remind meeting tomorrow today search "
         "music play volume light kitchen temperature calendar event note contact phone "
         "translate order taxi flight hotel book cancel check price news schedule route "
         "please thanks hello date context extract schema").split()


def corpus_lines(seed=315, n=3000):
    r = random.Random(seed)
    out = []
    for _ in range(n):
        words = " ".join(r.choice(WORDS) for _ in range(r.randint(3, 12)))
        k = r.random()
        if k < 0.4:
            out.append(words.capitalize() + r.choice([".", "?", "!"]))
        elif k < 0.7:
            call = {"name": r.choice(WORDS) + "_" + r.choice(WORDS),
                    "arguments": {r.choice(WORDS): r.choice([words, r.randint(0, 999)])}}
            out.append("<|im_start|>user " + words + "<|im_end|><|im_start|>assistant "
                       "<tool_call>" + json.dumps([call]) + "</tool_call><|im_end|>")
        elif k < 0.85:
            out.append("<context>" + words + "</context><extract>" + words + "</extract>"
                       "<schema>{\"type\": \"string\"}</schema>")
        else:
            out.append("<tools>" + json.dumps([{"name": r.choice(WORDS)}]) + "</tools> café "
                       "Zürich 日本語 😀 " + str(r.randint(0, 10 ** 6)))
    return out


def train_tokenizer(out_dir, vocab):
    prefix = "tiny_v3_bpe%d" % vocab
    cwd = os.getcwd()
    os.chdir(out_dir)
    try:
        with open(prefix + ".corpus.txt", "w", encoding="utf-8") as f:
            f.write("\n".join(corpus_lines()) + "\n")
        spm.SentencePieceTrainer.train(
            input=prefix + ".corpus.txt", model_prefix=prefix, model_type="bpe",
            vocab_size=vocab, character_coverage=0.98, byte_fallback=True,
            normalization_rule_name="identity", add_dummy_prefix=True,
            remove_extra_whitespaces=False, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
            pad_piece="<pad>", eos_piece="</s>", bos_piece="<s>", unk_piece="<unk>",
            user_defined_symbols=list(T.CHAT_MARKERS), num_threads=1, input_sentence_size=0,
            shuffle_input_sentence=False, minloglevel=2)
        os.remove(prefix + ".corpus.txt")
        os.remove(prefix + ".vocab")
    finally:
        os.chdir(cwd)
    return os.path.join(out_dir, prefix + ".model")


class _Tok:
    """What export._tokenizer_blob reads: a SentencePiece processor as `.sp`."""

    def __init__(self, path):
        self.sp = spm.SentencePieceProcessor()
        self.sp.Load(path)


# ---- random parameters with the official tree ------------------------------------------

def make_config(geom):
    return A.TransformerConfig(dtype="float32", remat=False, **geom)


def param_shapes(cfg, heads):
    model = A.SimpleAttentionNetwork(cfg)
    tok = jnp.ones((1, 8), jnp.int32)
    key = jax.random.PRNGKey(0)
    methods = [None]
    if heads:
        methods += [A.SimpleAttentionNetwork.forward_embedding,
                    A.SimpleAttentionNetwork.forward_confidence,
                    A.SimpleAttentionNetwork.forward_router]
    tree = {}
    for method in methods:
        sh = jax.eval_shape(lambda k, t, m=method: model.init(k, t, method=m), key, tok)
        for name, sub in sh["params"].items():
            tree.setdefault(name, sub)
    return tree


def random_params(cfg, seed, heads):
    n, d = cfg.mhc_lanes, cfg.d_model

    def fill(path, leaf):
        keys = [str(getattr(p, "key", p)) for p in path]
        name = "/".join(keys)
        h = hashlib.sha256(f"{seed}/{name}".encode()).digest()
        r = np.random.default_rng(int.from_bytes(h[:8], "little"))
        shp = leaf.shape
        nrm = lambda s=1.0, m=0.0: (m + s * r.standard_normal(shp)).astype(np.float32)  # noqa
        last = keys[-1]
        if keys[0] == "embedding":
            return nrm(0.7)
        if keys[0].startswith("engrams_"):
            if last == "embedding":
                return nrm(1.0)
            if last == "kernel":
                return nrm((0.5 if keys[-2] == "value_proj" else 1.0) / np.sqrt(shp[-2]))
            if last == "taps":
                return nrm(0.7)
        if last == "kernel":
            g = 0.5 if keys[-2] in ("value_proj", "out_proj") else 1.0
            return nrm(g / np.sqrt(shp[-2]))
        if last == "bias":
            return nrm(1.0)
        if last == "scale":
            return nrm(0.3)
        if last == "attn_gate":
            return nrm(1.0)
        if last in ("q_taps", "k_taps", "v_taps"):
            t = nrm(0.4)
            t[0] += 1.0
            return t
        if last in ("w1a", "w1b", "w2a", "w2b", "w3a", "w3b"):
            return nrm(1.0 / np.sqrt(shp[0]))
        if last in ("d1", "d2", "d3"):
            return nrm(1.0)
        if last == "b2":
            return nrm(0.3)
        if last == "d4":
            return nrm(0.5)
        if last == "cond_v":
            return nrm(1.0 / np.sqrt(shp[0]))
        if last == "cond_u":
            return nrm(0.3)
        if last.startswith("mhc_phi"):
            return nrm(1.0 / np.sqrt(n * d))
        if last.startswith("mhc_a_"):
            return nrm(0.7, 1.0)
        if last == "mhc_b_res":
            return (4.0 * np.eye(n, dtype=np.float32) + nrm(1.0)).astype(np.float32)
        if last.startswith("mhc_b_"):
            return nrm(1.0)
        if last in ("probes", "query"):
            return nrm(1.0)
        if last in ("gain", "row_bias", "calibration"):
            return nrm(0.5, 1.0 if last == "gain" else 0.0)
        if last in ("log_temp",):
            return np.full(shp, np.log(10.0), np.float32)
        raise KeyError(f"no randomization rule for {name}")

    return jax.tree_util.tree_map_with_path(fill, param_shapes(cfg, heads))


# ---- the exporter, told the CQ width per tensor -----------------------------------------

# The record widths "every" cycles through: binary, ternary, CQ3, CQ2, CQ4.
EVERY_KIND = (1, E.TERNARY_RECORD_BITS, 3, 2, 4)


def pack_ternary(w, group):
    """A ternary record as export.py's format comment defines it (the package reads these,
    `read_export`, but has no writer): the official CQ rotation and nearest-level choice
    over the 3-level codebook, each trit index 0, 1, 2 stored as the 2-bit crumb 3, 0, 1
    in the official LSB-first packing, then the f16 group norms."""
    cb = E._cq_codebook_np(E.TERNARY_BITS, group)
    H = E._cq_hadamard_np(group)
    out, D = w.shape
    pad = (-D) % group
    wp = np.pad(w, ((0, 0), (0, pad))) if pad else w
    in_pad = wp.shape[1]
    g = wp.reshape(out, in_pad // group, group).astype(np.float32)
    rot = g @ H
    norm = np.sqrt((rot ** 2).sum(-1, keepdims=True))
    unit = rot / np.maximum(norm, 1e-12)
    idx = E._nearest_idx(unit, cb).reshape(out, in_pad)
    crumbs = np.array([3, 0, 1], np.uint8)[idx]
    return E._pack_lsb(crumbs, 2), norm[:, :, 0].astype(np.float16)


def export(params, cfg, path, bits, group, tokenizer):
    """write_export with the width chosen per tensor: 'cq4', 'cq2', 'mixed' (CQ2 with
    CQ4 embedding, mHC phi and heads, like the shipped needle3.cact) or 'every' (the
    record kinds of EVERY_KIND in turn)."""
    orig_pack, orig_q = E._cq_pack, E._q
    count = [0]

    def pack(w, b, g):
        if b == E.TERNARY_RECORD_BITS:
            return pack_ternary(w, g)
        saved = E.WEIGHT_BITS
        E.WEIGHT_BITS = b
        try:
            return orig_pack(w, b, g)
        finally:
            E.WEIGHT_BITS = saved

    def q(name, mat, b, g):
        if bits == "every":
            b = EVERY_KIND[count[0] % len(EVERY_KIND)]
            count[0] += 1
        elif bits == "cq2" or (bits == "mixed" and not (
                name == "embedding" or name.startswith("mhc_phi") or "_head." in name)):
            b = 2
        return orig_q(name, mat, b, g)

    E._cq_pack, E._q = pack, q
    try:
        kv = A.effective_kv_window(cfg)
        return E.write_export(params, cfg, path, bits=4, group=group, tokenizer=tokenizer,
                              kv_window=kv)
    finally:
        E._cq_pack, E._q = orig_pack, orig_q


# ---- .cact -> the official parameter tree ------------------------------------------------

def params_from_cact(path, template):
    """Inverse of export._tensors: every exported leaf replaced by what read_export decodes
    (CQ weights dequantized, FP16 rounded); the tree shapes come from `template`."""
    h, ts = E.read_export(path)
    it = iter(ts)
    nxt = lambda: np.asarray(next(it), np.float32)  # noqa
    L = h["num_layers"]
    out = jax.tree_util.tree_map(lambda a: np.array(a, np.float32), template)
    out["embedding"]["embedding"] = nxt()
    b = out["stack"]["layers"]["block"]
    sa, ha = b["self_attn"], b["hadamard_mlp"]
    for i in range(L):
        b["ZCRMSNorm_0"]["scale"][i] = nxt()
        for nm in ("q_proj", "k_proj", "v_proj"):
            sa[nm]["kernel"][i] = nxt().T
        if h["qkv_conv_taps"]:
            for nm in ("q_taps", "k_taps", "v_taps"):
                sa[nm][i] = nxt()
        sa["q_norm"]["scale"][i] = nxt()
        sa["k_norm"]["scale"][i] = nxt()
        sa["gate_proj"]["kernel"][i] = nxt().T
        sa["out_proj"]["kernel"][i] = nxt().T
        b["post_attn_norm"]["scale"][i] = nxt()
        b["attn_gate"][i] = nxt().reshape(())
        b["pre_hada_norm"]["scale"][i] = nxt()
        for nm in ("d1", "d2", "b2", "d3", "d4", "w1a", "w1b", "w2a", "w2b", "w3a", "w3b",
                   "cond_v", "cond_u"):
            ha[nm][i] = nxt()
    st = out["stack"]
    for nm in ("mhc_a_pre", "mhc_a_post", "mhc_a_res", "mhc_b_pre", "mhc_b_post", "mhc_b_res"):
        st[nm] = nxt()
    for nm in ("mhc_phi_pre", "mhc_phi_post", "mhc_phi_res"):
        Lx, nC, lanes = st[nm].shape
        st[nm] = nxt().reshape(Lx, lanes, nC).transpose(0, 2, 1).copy()
    nxt(), nxt()  # hada_p1, hada_p2: the module regenerates the same permutations
    for s in range(len(h["engram_layers"])):
        eg = out[f"engrams_{s}"]
        eg["embedding"] = nxt().reshape(eg["embedding"].shape)
        eg["key_proj"]["kernel"] = nxt().T
        eg["value_proj"]["kernel"] = nxt().T
        eg["taps"] = nxt()
    st["final_norm"]["scale"] = nxt()
    return h, jax.tree_util.tree_map(jnp.asarray, out)


GREEDY_STEPS = 8


def reference_logits(params, cfg, prompts):
    """The official forward's logits at every position of each prompt, and its greedy
    continuation of GREEDY_STEPS tokens (one full-sequence forward per step, over a
    fixed-length buffer: the model is causal, so later filler cannot change a position)."""
    model = A.SimpleAttentionNetwork(cfg)
    fwd = jax.jit(lambda p, t: model.apply({"params": p}, t))
    logits, greedy = [], []
    for pr in prompts:
        logits.append(np.asarray(fwd(params, jnp.asarray([pr], jnp.int32))[0], np.float32))
        seq = list(pr) + [4] * GREEDY_STEPS
        out = []
        for j in range(GREEDY_STEPS):
            row = np.asarray(fwd(params, jnp.asarray([seq], jnp.int32))[0, len(pr) + j - 1])
            nxt = int(row.argmax())
            out.append(nxt)
            seq[len(pr) + j] = nxt
        greedy.append(out)
    return logits, greedy


def write_case_files(out_dir, name, prompts, logits_greedy, extra):
    logits, greedy = logits_greedy
    cases = []
    for k, (pr, lg) in enumerate(zip(prompts, logits)):
        fn = f"{name}.case{k}.f32"
        lg.astype("<f4").tofile(os.path.join(out_dir, fn))
        top = np.sort(lg, axis=-1)
        cases.append({"tokens": [int(t) for t in pr], "logits": fn, "rows": int(lg.shape[0]),
                      "cols": int(lg.shape[1]),
                      "max_abs_logit": float(np.abs(lg).max()),
                      "min_top2_margin": float((top[:, -1] - top[:, -2]).min()),
                      "argmax": [int(a) for a in lg.argmax(-1)],
                      "greedy": greedy[k]})
    meta = dict(extra, cases=cases)
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1)


def make_model(out_dir, name, spec, tok_path):
    t0 = time.time()
    cfg = make_config(spec["geom"])
    tmpl = random_params(cfg, spec["seed"], spec["heads"])
    path = os.path.join(out_dir, name + ".cact")
    info = export(tmpl, cfg, path, spec["bits"], spec["group"], _Tok(tok_path))
    log(name, "exported", info)
    h, params = params_from_cact(path, tmpl)
    r = random.Random(spec["seed"])
    vocab = cfg.vocab_size
    prompts = [[r.randrange(4, vocab) for _ in range(n)] for n in PROMPT_LENGTHS]
    logits = reference_logits(params, cfg, prompts)
    geom = {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec["geom"].items()}
    write_case_files(out_dir, name, prompts, logits,
                     {"package": "cactus-needle==3.2.8", "geometry": geom,
                      "bits": spec["bits"], "group": spec["group"],
                      "kv_window": h["kv_window"], "heads": spec["heads"]})
    log(name, "reference done in %.0fs" % (time.time() - t0))
    for depth in spec["rungs"]:
        # The rung is cut from the float parameters and exported, as the official ladder
        # export does: its records are then the parent file's rows, so the parent run at
        # this depth and the rung file share one reference.
        rp, rcfg = F.rung(tmpl, cfg, depth)
        rp = jax.tree_util.tree_map(np.asarray, rp)
        rname = f"{name}_rung{depth}"
        rpath = os.path.join(out_dir, rname + ".cact")
        export(rp, rcfg, rpath, spec["bits"], spec["group"], _Tok(tok_path))
        _, rparams = params_from_cact(rpath, rp)
        rlogits = reference_logits(rparams, rcfg, prompts)
        write_case_files(out_dir, rname, prompts, rlogits,
                         {"package": "cactus-needle==3.2.8", "parent": name + ".cact",
                          "depth": depth,
                          "layers": list(A.ladder_layer_indices(cfg, depth)),
                          "bits": spec["bits"], "group": spec["group"]})
        log(rname, "rung done")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(REPO, "tests", "fixtures", "v3"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tok = train_tokenizer(args.out, 384)
    only = [x for x in args.only.split(",") if x]
    for name, spec in MODELS.items():
        if only and name not in only:
            continue
        make_model(args.out, name, spec, tok)
    if "released" in only:
        make_model(args.out, "released", RELEASED, tok)
    if not only or "v3a" in only:
        tokenizer_cases(args.out, tok, os.path.join(args.out, "v3a.cact"))


TOKENIZER_TEXTS = [
    "Set a timer for 25 minutes", "  two  spaces\tand a tab", "café Zürich 日本語 😀",
    "<|im_start|>user what is the weather<|im_end|><|im_start|>assistant <tool_call>",
    "<context>note</context><extract>x</extract><schema>{}</schema>", "date: 2026-12-03",
    "", " ", "<tools>[{\"name\": \"get_weather\"}]</tools>", "ünïcödé ε ж 中 🇯🇵",
]


def tokenizer_cases(out_dir, model_path, cact_path):
    """Ids of the official reference encoder over the blob embedded in a fixture, checked
    against SentencePiece itself."""
    ref = E.RefTokenizer.from_cact(cact_path)
    sp = spm.SentencePieceProcessor()
    sp.Load(model_path)
    cases = []
    for text in TOKENIZER_TEXTS:
        ids = ref.encode(text)
        assert ids == sp.Encode(text), (text, ids, sp.Encode(text))
        cases.append({"text": text, "ids": ids})
    with open(os.path.join(out_dir, "tokenizer_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"model": "v3a.cact", "cases": cases}, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    sys.exit(main())
