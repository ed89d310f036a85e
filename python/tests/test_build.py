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
