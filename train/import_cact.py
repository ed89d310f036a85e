"""Reads a Needle 2 .cact back into what train.py starts from: the flax parameter pickle
that `train.py --init` takes and the SentencePiece model of the embedded tokenizer, so a
shipped model can be fine-tuned after its training checkpoints are gone.

    python train/import_cact.py models/needle-demo.cact --out train/work/import

Writes OUT/final.pkl ({"params", "config", "bits", "steps", "minutes", "qat"}, the format
train.py writes) and OUT/tok.model. The weights are dequantized as the runtime does
(spec §1.7: w_group = (codebook[idx] * norm) @ H), each group rescaled to be a fixed
point of the CQ quantizer (see cq_weights), FP16 tensors widened, and mapped back into
the tree the official exporter's `_tensors` reads them from (the inverse of its
transposes and reshapes). Re-exported with the rebuilt tokenizer, the result is the
same bytes as the input (tests/integration/test_import_cact.py checks it on models/needle-demo.cact).

The tokenizer blob keeps pieces, scores and types; the SentencePiece model is rebuilt
with the trainer settings of train_tokenizer.py (BPE, identity normalization, dummy
prefix, whitespace as written, byte fallback, digits split), which are the settings the
engine's encoder reproduces, so the rebuilt model encodes as the engine does.
"""
import argparse
import os
import pickle
import struct
import sys

import numpy as np

import train as training

HEADER = "<" + "I" * 29 + "f"          # spec §1.1: 29 u32 fields and rope_theta
RECORD = "<BBHIIIIQQII"                 # spec §1.3: the 44-byte directory record
FP16, FP32, CQ, RAW = 1, 2, 3, 4
CB_OFFSET = {2: 0, 3: 4, 4: 12}         # spec §1.2: cb2 | cb3 | cb4
# records of the RAW tokenizer blob (spec §1.11)
TK_HDR, TK_REC = "<IIIIIBBH", "<fBH"
TYPE_TO_SPM = {0: 1, 1: 2, 2: 3, 3: 4, 4: 6}   # blob type -> ModelProto.SentencePiece.Type


def hadamard(n):
    """Sylvester's Hadamard matrix scaled to be orthonormal (and symmetric)."""
    h = np.array([[1.0]], np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)


def unpack_indices(packed, bits, in_pad):
    """Each row is an LSB-first bit stream of `bits`-bit indices (spec §1.6)."""
    stream = np.unpackbits(packed, axis=1, bitorder="little")[:, :in_pad * bits]
    stream = stream.reshape(packed.shape[0], in_pad, bits).astype(np.uint8)
    return (stream << np.arange(bits, dtype=np.uint8)).sum(axis=2).astype(np.intp)


def cq_weights(blob, shape, group, bits, codebooks):
    """The float weights to train from: per group (norm / |c|) * c @ H, where c are the
    codebook values of the group's indices. The runtime uses norm * c @ H; dividing by
    |c| (close to 1) makes the weights a fixed point of the CQ quantizer (its norm of
    the rotated group is then the stored norm), so quantization-aware training sees the
    shipped model exactly and a re-export gives the same indices and norms."""
    if bits not in CB_OFFSET:
        raise SystemExit(f"CQ record with bits={bits}: only 2, 3 and 4 are imported")
    out, in_dim = shape
    in_pad = -(-in_dim // group) * group
    if in_pad != in_dim:
        # the runtime drops the padded columns, so the group norms could not be kept
        raise SystemExit(f"CQ matrix {shape}: input width not a multiple of the group {group}")
    n_packed = out * in_pad * bits // 8
    packed = np.frombuffer(blob[:n_packed], np.uint8).reshape(out, -1)
    norms = np.frombuffer(blob[n_packed:], "<f2").reshape(out, in_pad // group, 1)
    cb = codebooks[CB_OFFSET[bits]:CB_OFFSET[bits] + (1 << bits)]
    c = cb[unpack_indices(packed, bits, in_pad)].reshape(out, in_pad // group, group)
    size = np.sqrt((c.astype(np.float64) ** 2).sum(-1, keepdims=True))
    scale = (norms.astype(np.float64) / np.maximum(size, 1e-30)).astype(np.float32)
    return ((c * scale) @ hadamard(group)).reshape(out, in_pad)


def read_cact(path):
    """(header fields, tensors in directory order): float32 arrays, RAW as bytes."""
    with open(path, "rb") as f:
        raw = f.read()
    h = struct.unpack_from(HEADER, raw, 0)
    if h[0] != 0x05E12A83:
        raise SystemExit(f"{path}: not a Needle 2 .cact (tag {h[0]:#x})")
    meta = dict(zip(("num_tensors", "codebook_len", "kv_window", "kv_bits", "vocab_size",
                     "d_model", "num_heads", "num_kv_heads", "num_layers", "head_dim",
                     "max_seq_len", "hada_n", "mhc_lanes", "engram_slots", "engram_sub_dim",
                     "num_engram_tables"), h[1:17]))
    meta["engram_orders"] = h[20:20 + h[19]]
    meta["engram_layers"] = h[25:25 + h[24]]
    meta["rope_theta"] = h[29]
    off = struct.calcsize(HEADER)
    codebooks = np.frombuffer(raw, "<f4", meta["codebook_len"], off).astype(np.float32)
    off += 4 * meta["codebook_len"]
    tensors, widths = [], set()
    for _ in range(meta["num_tensors"]):
        dtype, ndim, _, *rest = struct.unpack_from(RECORD, raw, off)
        shape, (start, nbytes, group, bits) = tuple(rest[:ndim]), rest[4:]
        off += struct.calcsize(RECORD)
        blob = raw[start:start + nbytes]
        if len(blob) != nbytes:
            raise SystemExit(f"{path}: truncated")
        if dtype == FP16:
            tensors.append(np.frombuffer(blob, "<f2").reshape(shape).astype(np.float32))
        elif dtype == FP32:
            tensors.append(np.frombuffer(blob, "<f4").reshape(shape).astype(np.float32))
        elif dtype == CQ:
            tensors.append(cq_weights(blob, shape, group, bits, codebooks))
            widths.add(bits)
        elif dtype == RAW:
            tensors.append(blob)
        else:
            raise SystemExit(f"{path}: unknown dtype {dtype}")
    if len(widths) > 1:
        raise SystemExit(f"{path}: mixed CQ widths {sorted(widths)}: train.py uses one")
    meta["bits"] = widths.pop() if widths else 4
    return meta, tensors


def geometry_of(meta):
    """The train.py geometry dict the header describes; fails on a geometry train.py does
    not build (its GEOMETRY fixes the lanes, heads and engram layout)."""
    geom = dict(training.GEOMETRY)
    geom.update(vocab_size=meta["vocab_size"], d_model=meta["d_model"],
                num_layers=meta["num_layers"], max_seq_len=meta["max_seq_len"],
                num_heads=meta["num_heads"], num_kv_heads=meta["num_kv_heads"],
                mhc_lanes=meta["mhc_lanes"], engram_slots=meta["engram_slots"],
                engram_orders=tuple(meta["engram_orders"]),
                engram_layers=tuple(meta["engram_layers"]),
                rope_theta=float(meta["rope_theta"]))
    if meta["head_dim"] * meta["num_heads"] != geom["d_model"]:
        raise SystemExit(f"head_dim {meta['head_dim']} x {meta['num_heads']} heads is not "
                         f"d_model {geom['d_model']}: train.py has no attn_dim option")
    return geom


def params_from_tensors(tensors, geom, num_tables):
    """The inverse of the official exporter's `_tensors` (no probe heads)."""
    L, n, d = geom["num_layers"], geom["mhc_lanes"], geom["d_model"]
    nsites = len(geom["engram_layers"])
    it = iter(tensors)
    f32 = lambda a: np.ascontiguousarray(a, np.float32)
    params = {"embedding": {"embedding": f32(next(it))}}
    per = {k: [] for k in ("norm_in", "q", "k", "v", "qn", "kn", "gate", "out", "post", "ag",
                           "pre", "d1", "d2", "d3")}
    for _ in range(L):
        for k in per:
            per[k].append(next(it))
    stack = lambda key, tr=False: f32(np.stack([a.T if tr else a for a in per[key]]))
    block = {
        "ZCRMSNorm_0": {"scale": stack("norm_in")},
        "self_attn": {
            "q_proj": {"kernel": stack("q", True)}, "k_proj": {"kernel": stack("k", True)},
            "v_proj": {"kernel": stack("v", True)}, "gate_proj": {"kernel": stack("gate", True)},
            "out_proj": {"kernel": stack("out", True)},
            "q_norm": {"scale": stack("qn")}, "k_norm": {"scale": stack("kn")}},
        "post_attn_norm": {"scale": stack("post")},
        "attn_gate": f32(np.stack([a.reshape(()) for a in per["ag"]])),
        "pre_hada_norm": {"scale": stack("pre")},
        "hadamard_mlp": {"d1": stack("d1"), "d2": stack("d2"), "d3": stack("d3")},
    }
    st = {"layers": {"block": block}}
    for name in ("mhc_a_pre", "mhc_a_post", "mhc_a_res", "mhc_b_pre", "mhc_b_post", "mhc_b_res"):
        st[name] = f32(next(it))
    for name, cols in (("mhc_phi_pre", n), ("mhc_phi_post", n), ("mhc_phi_res", n * n)):
        # exported as (L, n·d, cols) -> transpose(0, 2, 1) -> reshape(L·cols, n·d)
        st[name] = f32(next(it).reshape(L, cols, n * d).transpose(0, 2, 1))
    params["stack"] = st
    for s in range(nsites):
        tables, key, value, taps = next(it), next(it), next(it), next(it)
        params[f"engrams_{s}"] = {
            "embedding": f32(tables.reshape(num_tables, geom["engram_slots"], -1)),
            "key_proj": {"kernel": f32(key.T)}, "value_proj": {"kernel": f32(value.T)},
            "taps": f32(taps)}
    st["final_norm"] = {"scale": f32(next(it))}
    rest = list(it)
    if rest:
        raise SystemExit(f"{len(rest)} tensors after final_norm (probe heads?): not imported")
    return params


def sentencepiece_model(blob):
    """A serialized SentencePiece ModelProto with the blob's pieces, scores and types."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    n, pad, eos, bos, unk, dummy, byte_fb, _ = struct.unpack_from(TK_HDR, blob, 0)
    if not (dummy and byte_fb):
        raise SystemExit("tokenizer blob without dummy prefix or byte fallback")
    m = pb.ModelProto()
    off = struct.calcsize(TK_HDR)
    for _ in range(n):
        score, t, ln = struct.unpack_from(TK_REC, blob, off)
        off += struct.calcsize(TK_REC)
        p = m.pieces.add()
        p.piece = blob[off:off + ln].decode("utf-8")
        p.score = score
        p.type = TYPE_TO_SPM[t]
        off += ln
    if off != len(blob):
        raise SystemExit(f"tokenizer blob: {len(blob) - off} bytes after the last piece")
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.vocab_size = n
    ts.byte_fallback = True
    ts.split_digits = True
    ts.character_coverage = 1.0
    ts.pad_id, ts.eos_id, ts.bos_id, ts.unk_id = pad, eos, bos, unk
    ts.pad_piece, ts.eos_piece, ts.bos_piece, ts.unk_piece = (
        m.pieces[pad].piece, m.pieces[eos].piece, m.pieces[bos].piece, m.pieces[unk].piece)
    ns = m.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = True
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    return m.SerializeToString()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cact")
    ap.add_argument("--out", required=True, help="directory for final.pkl and tok.model")
    a = ap.parse_args()
    meta, tensors = read_cact(a.cact)
    if not isinstance(tensors[-1], bytes):
        raise SystemExit(f"{a.cact}: no tokenizer blob")
    geom = geometry_of(meta)
    params = params_from_tensors(tensors[:-1], geom, meta["num_engram_tables"])
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tok.model"), "wb") as f:
        f.write(sentencepiece_model(tensors[-1]))
    state = dict(params=params, config=geom, bits=meta["bits"],
                 steps=0, minutes=0.0, qat=True, imported_from=os.path.basename(a.cact))
    with open(os.path.join(a.out, "final.pkl"), "wb") as f:
        pickle.dump(state, f)
    n = sum(int(np.prod(x.shape)) for x in _leaves(params))
    print(f"imported {a.cact}: {n:,} params, CQ{state['bits']}; wrote {a.out}/final.pkl, "
          f"{a.out}/tok.model")


def _leaves(tree):
    for v in tree.values():
        if isinstance(v, dict):
            yield from _leaves(v)
        else:
            yield v


if __name__ == "__main__":
    sys.exit(main())
