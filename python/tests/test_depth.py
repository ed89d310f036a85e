"""``depth=``: the Needle 3 ladder rung a model runs (needle_model_params.depth), on the
committed v3 fixtures: the rung the engine cuts at load time answers exactly as the
official rung export of the same weights does, and bad depths are refused."""
import os

import pytest

import needle
from conftest import FIXTURES

V3 = os.path.join(FIXTURES, "v3")
# a tiny schema: the fixtures' contexts are 64-128 tokens
TOOLS = [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}]
TIMING = ("prefill_tps", "decode_tps", "peak_ram_mb")


def envelopes(agent, queries=("hi", "set a timer"), max_new_tokens=12):
    out = []
    for q in queries:
        env = agent.complete(q, max_new_tokens=max_new_tokens)
        out.append({k: v for k, v in env.items() if k not in TIMING})
    return out


@pytest.fixture
def v3a():
    path = os.path.join(V3, "v3a.cact")
    if not os.path.exists(path):
        pytest.skip("no v3 fixtures")
    return path


def test_depth_runs_the_rung(v3a):
    rung_file = os.path.join(V3, "v3a_rung3.cact")
    with needle.Needle(weights=v3a, tools=TOOLS, depth=3) as cut, \
            needle.Needle(weights=rung_file, tools=TOOLS) as exported, \
            needle.Needle(weights=v3a, tools=TOOLS) as full:
        assert (cut.depth, exported.depth, full.depth) == (3, 3, 5)
        rung = envelopes(cut)
        assert rung == envelopes(exported)
        # the same file at every layer is another model: depth was not ignored
        assert rung != envelopes(full)


def test_depth_none_and_zero_run_every_layer(v3a):
    with needle.Needle(weights=v3a, tools=TOOLS, depth=None) as a, \
            needle.Needle(weights=v3a, tools=TOOLS, depth=0) as b, \
            needle.Needle(weights=v3a, tools=TOOLS, depth=5) as c:
        assert a.depth == b.depth == c.depth == 5
        assert envelopes(a) == envelopes(b) == envelopes(c)


def test_models_are_shared_per_depth(v3a):
    # agents on one file at two depths hold two models; each keeps its own rung
    with needle.Needle(weights=v3a, tools=TOOLS, depth=3) as a, \
            needle.Needle(weights=v3a, tools=TOOLS, depth=4) as b, \
            needle.Needle(weights=v3a, tools=TOOLS, depth=3) as c:
        assert (a.depth, b.depth, c.depth) == (3, 4, 3)
        assert a._model is c._model and a._model is not b._model
        assert envelopes(a) == envelopes(c)


@pytest.mark.parametrize("depth", [1, 6, 1 << 20, -1, 1 << 40])
def test_bad_depth_is_refused(v3a, depth):
    with pytest.raises(needle.NeedleError, match="depth") as ei:
        needle.Needle(weights=v3a, tools=TOOLS, depth=depth)
    assert ei.value.status == -1


@pytest.mark.parametrize("depth", [True, "3", 3.0])
def test_depth_must_be_an_int(v3a, depth):
    with pytest.raises(TypeError, match="depth"):
        needle.Needle(weights=v3a, tools=TOOLS, depth=depth)


def test_depth_on_a_needle2_file_is_refused(cq4):
    with pytest.raises(needle.NeedleError, match="Needle 2") as ei:
        needle.Needle(weights=cq4, tools=TOOLS, depth=2)
    assert ei.value.status == -1
    with needle.Needle(weights=cq4, tools=TOOLS) as agent:
        assert agent.depth == 4


def test_generation_must_match_the_file(v3a, cq4):
    with needle.Needle(weights=v3a, tools=TOOLS, generation=3) as agent:
        assert agent.depth == 5
    with pytest.raises(needle.NeedleError, match="Needle 3 model"):
        needle.Needle(weights=v3a, tools=TOOLS, generation=2)
    with pytest.raises(needle.NeedleError, match="Needle 2 model"):
        needle.Needle(weights=cq4, tools=TOOLS, generation=3)


def test_extract_at_a_depth(v3a):
    rung_file = os.path.join(V3, "v3a_rung3.cact")
    results = []
    for weights, depth in ((v3a, 3), (rung_file, None)):
        try:
            results.append(("ok", needle.extract("a is 5", TOOLS[0], weights=weights,
                                                 max_new_tokens=8, depth=depth)))
        except needle.NeedleError as e:  # random weights: the call may not complete
            results.append(("error", e.message))
    assert results[0] == results[1]
    with pytest.raises(needle.NeedleError, match="depth"):
        needle.extract("a is 5", TOOLS[0], weights=v3a, depth=9)
