"""needle.build and needle.encode_data over the C commands: the official build's bytes
(tests/fixtures/build/manifest.json) and the official fine-tuner's ids
(tests/fixtures/finetune/expected.json)."""
import hashlib
import json
import os

import pytest

import needle
from conftest import FIXTURES

BUILD = os.path.join(FIXTURES, "build")
BASE = os.path.join(FIXTURES, "v3", "v3c.cact")


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_build_matches_the_official_build(tmp_path):
    with open(os.path.join(BUILD, "manifest.json")) as f:
        cases = json.load(f)["cases"]
    out = needle.build(os.path.join(BUILD, "ckpt.safetensors"), lora=os.path.join(BUILD, "lora.safetensors"),
                       layers=2, weights=BASE, out=tmp_path / "x.cact")
    assert out == str(tmp_path / "x.cact")
    assert _sha(out) == cases["lora_layers2"]["sha256"]
    out = needle.build(os.path.join(BUILD, "ckpt.safetensors"), weights=BASE, out=tmp_path / "y.cact")
    assert _sha(out) == cases["copy"]["sha256"]


def test_build_errors_raise(tmp_path):
    with pytest.raises(needle.NeedleError, match="is a .cact file"):
        needle.build(BASE, lora=os.path.join(BUILD, "lora.safetensors"), weights=BASE, out=tmp_path / "z.cact")
    assert not (tmp_path / "z.cact").exists()


def test_encode_data(tmp_path):
    out = needle.encode_data(os.path.join(FIXTURES, "finetune", "data.jsonl"), weights=BASE,
                             max_len=128, out=tmp_path / "rows.jsonl")
    with open(os.path.join(FIXTURES, "finetune", "expected.json"), encoding="utf-8") as f:
        want = json.load(f)["caps"]["128"]["examples"]
    with open(out) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == len(want) == 30
    for row, x in zip(rows, want):
        assert row["ids"] == x["ids"] + [0] * (128 - x["n"])
        assert row["mask"] == x["mask"] + [0] * (128 - x["n"])
    with pytest.raises(needle.NeedleError, match="--strict"):
        needle.encode_data(os.path.join(FIXTURES, "finetune", "data.jsonl"), weights=BASE, strict=True,
                           out=tmp_path / "strict.jsonl")


def _tiny_base(tmp_path):
    """The build fixture's checkpoint without its ladder split (the training core has no
    ladder): the same tensors, ladder_widths [] in the config metadata."""
    import struct
    with open(os.path.join(BUILD, "ckpt.safetensors"), "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    config = json.loads(header["__metadata__"]["config"])
    config["ladder_widths"] = []
    header["__metadata__"]["config"] = json.dumps(config)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = tmp_path / "base.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + blob[8 + n:])
    return path


def test_finetune(tmp_path):
    base = _tiny_base(tmp_path)
    tools = [{"name": "timer", "parameters": {"type": "object", "properties": {"m": {"type": "integer"}}}}]
    rows = [{"query": f"timer {m}", "tools": tools, "answers": [{"name": "timer", "arguments": {"m": m}}]}
            for m in (1, 2, 3, 4)] * 3
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = needle.finetune(data, checkpoint=base, weights=BASE, epochs=2, batch_size=4, lr=1e-2, lora_rank=4,
                          max_len=128, val_split=0.25, out=tmp_path / "a.safetensors", threads=2)
    assert got["adapter"] == str(tmp_path / "a.safetensors")
    assert got["state"] == str(tmp_path / "a.state.safetensors")
    assert got["cact"] == str(tmp_path / "a.cact") and os.path.exists(got["cact"])
    assert got["heldout"] == str(tmp_path / "a.heldout.jsonl")
    assert len(got["val_loss"]) == 2 and got["steps"] == 6
    s = got["scores"]
    assert s["examples"] == 3 and 0 <= s["exact"] <= 3 and s["exact_match"] == s["exact"] / 3
    # the same number as `needle eval` on the written file
    from needle.hub import _cli
    import subprocess
    r = subprocess.run([_cli(), "eval", "--json", "-w", got["cact"], got["heldout"]], stdout=subprocess.PIPE,
                       text=True, check=True)
    assert json.loads(r.stdout)["exact_match"] == pytest.approx(s["exact_match"], abs=1e-4)
    with pytest.raises(needle.NeedleError, match="--resume"):
        needle.finetune(data, checkpoint=base, weights=BASE, epochs=2, batch_size=4, lr=2e-2, lora_rank=4,
                        max_len=128, val_split=0.25, out=tmp_path / "a.safetensors", resume=True)


def test_finetune_needle2(tmp_path):
    # a Needle 2 .cact alone as the base (the demo model's generation; here the tiny one)
    tools = [{"name": "timer", "parameters": {"type": "object", "properties": {"m": {"type": "integer"}}}}]
    rows = [{"query": f"timer {m}", "tools": tools, "answers": [{"name": "timer", "arguments": {"m": m}}]}
            for m in (1, 2, 3, 4)] * 3
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = needle.finetune(data, weights=os.path.join(FIXTURES, "tiny_cq4.cact"), epochs=2, batch_size=4,
                          lr=1e-2, lora_rank=4, max_len=128, val_split=0.25, out=tmp_path / "n2.safetensors",
                          threads=2)
    assert os.path.exists(got["cact"]) and got["steps"] == 6 and len(got["val_loss"]) == 2
    assert got["scores"]["examples"] == 3


def test_calibrate(tmp_path):
    """A --full run, then its confidence head trained on twelve answers whose labels are
    known: even lines expect the model's own answer, odd lines another."""
    import subprocess
    from needle.hub import _cli
    base = _tiny_base(tmp_path)
    timer = [{"name": "timer", "parameters": {"type": "object", "properties": {"m": {"type": "integer"}}}}]
    rows = [{"query": f"timer {m}", "tools": timer, "answers": [{"name": "timer", "arguments": {"m": m}}]}
            for m in (1, 2, 3, 4)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = needle.finetune(data, checkpoint=base, weights=BASE, epochs=1, batch_size=2, lr=1e-3, full=True,
                          max_len=128, val_split=0, out=tmp_path / "f.safetensors", threads=2, score=False)
    queries = ["timer 5", "call mom", "timer nine", "hi", "set 3", "ring dad", "wake me", "call 5 times",
               "nothing", "timer", "phone anna", "go"]
    lines = []
    for i, q in enumerate(queries):
        r = subprocess.run([_cli(), "run", "-w", got["cact"], "--tools", json.dumps(timer), q],
                           stdout=subprocess.PIPE, text=True, check=True)
        calls = json.loads(r.stdout)["function_calls"]
        other = [] if calls else [{"name": "timer", "arguments": {"m": 99}}]
        lines.append(json.dumps({"query": q, "tools": timer, "answers": calls if i % 2 == 0 else other}))
    cal_data = tmp_path / "cal.jsonl"
    cal_data.write_text("\n".join(lines) + "\n")
    res = needle.calibrate(got["checkpoint"], cal_data, weights=BASE, out=tmp_path / "c.safetensors",
                           build_out=tmp_path / "c.cact", epochs=25, batch_size=4, lr=0.02, val_split=0.25,
                           threads=2)
    assert res["checkpoint"] == str(tmp_path / "c.safetensors")
    assert res["answers"] == 12 and res["exact"] == 6
    assert len(res["val_loss"]) == 25 and len(res["val_auc"]) == 25
    assert res["cact"] == str(tmp_path / "c.cact") and res["heldout"] == str(tmp_path / "c.cact.heldout.jsonl")
    assert res["scores"]["examples"] == 3 and res["scores"]["calibration"]["examples"] == 3
    # the calibrated checkpoint builds with its head
    out = needle.build(res["checkpoint"], weights=BASE, out=tmp_path / "c2.cact")
    with open(out, "rb") as a, open(res["cact"], "rb") as b:
        assert a.read() == b.read()
    with pytest.raises(needle.NeedleError, match="must not be the input"):
        needle.calibrate(got["checkpoint"], cal_data, weights=BASE, out=got["checkpoint"])
