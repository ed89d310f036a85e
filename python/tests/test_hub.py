"""needle.download and the default-model rule of Needle(), against the loopback stand-in
hub of tests/hub/standin.py. This venv has no huggingface_hub, so download() goes through
the engine's own client (needle download --json); tests/hub/test_hub.py covers the
huggingface_hub path. HOME, HF_HOME and HF_ENDPOINT are per test: no real cache is read."""
import os
import subprocess
import sys

import pytest

import needle
from needle import hub as needle_hub

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "hub"))
import standin  # noqa: E402

BUILD = os.path.dirname(os.environ.get("NEEDLE_LIB_PATH", os.path.join(ROOT, "build", "x")))
CLI = os.path.join(BUILD, "needle")
WEATHER = {"name": "get_weather", "description": "Get the weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}

pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"no needle CLI at {CLI}")


@pytest.fixture(scope="module")
def v3_bytes(tmp_path_factory):
    out = tmp_path_factory.mktemp("v3") / "v3.cact"
    fx = os.path.join(ROOT, "tests", "fixtures", "export")
    subprocess.run([CLI, "export", os.path.join(fx, "v3_a.safetensors"), "--config",
                    os.path.join(fx, "v3_a.config.json"), "--v3", "-t",
                    os.path.join(ROOT, "tests", "fixtures", "tiny_bpe512.model"), "-o", str(out)],
                   check=True, capture_output=True)
    return out.read_bytes()


@pytest.fixture
def hub(monkeypatch, tmp_path, v3_bytes, cq4):
    h = standin.Hub()
    with open(cq4, "rb") as f:
        h.add("Cactus-Compute/needle2", {"needle2.cact": f.read()})
    h.add("Cactus-Compute/needle3", {"needle3.cact": v3_bytes})
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE",
                 "NEEDLE_MODEL", "XDG_CACHE_HOME"):  # (conftest's hermetic cache: replaced)
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("NEEDLE_CLI", CLI)
    with h:
        monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
        yield h


def test_download_through_the_engine_client(hub, v3_bytes, tmp_path):
    path = needle.download("needle3", client="needle")
    assert path.startswith(os.path.join(str(tmp_path), "hf", "hub", "models--Cactus-Compute--needle3"))
    with open(path, "rb") as f:
        assert f.read() == v3_bytes
    # auto picks the engine's client here (no huggingface_hub in this venv)
    assert needle.download("needle3") == path
    copy = needle.download("needle3", out=str(tmp_path / "out"))
    assert copy == str(tmp_path / "out" / "needle3.cact")
    with pytest.raises(needle.NeedleError, match="not found"):
        needle.download("org/missing", client="needle")
    with pytest.raises(needle.NeedleError, match="is not a model"):
        needle.download("nonsense")


def test_needle_default_follows_the_rule(hub, cq4):
    with needle.Needle(tools=[WEATHER]) as agent:
        assert agent.weights.endswith("needle-demo.cact")
    n2 = needle.download("needle2")
    with needle.Needle(tools=[WEATHER]) as agent:
        assert agent.weights == os.path.realpath(n2)
    n3 = needle.download("needle3")
    with needle.Needle(tools=[WEATHER]) as agent:
        assert agent.weights == os.path.realpath(n3)
    # the same answer as the C library's rule (the CLI's `needle models`)
    import json
    rows = json.loads(subprocess.run([CLI, "models", "--json"], capture_output=True,
                                     text=True, check=True).stdout)
    assert [r["path"] for r in rows if r["default"]] == [needle_hub.default_weights()]
    assert needle_hub.default_weights() == n3


def test_generation_downloads_unless_offline(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(needle.NeedleError, match="needle download needle3"):
        needle.Needle(tools=[WEATHER], generation=3)
    assert not hub.log
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with needle.Needle(tools=[WEATHER], generation=3) as agent:
        assert "models--Cactus-Compute--needle3" in agent.weights or \
            "/blobs/" in agent.weights
        assert agent._model.generation == 3
    assert len(hub.cdn_gets()) == 1
    # cached now: offline works
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    needle.Needle(tools=[WEATHER], generation=3).close()
