"""Probe heads through Python: Needle.embed, min_confidence, tool retrieval with an index
file, on the random-weight fixture with heads (the weights are random: the mechanism is
tested, not the answers)."""
import json
import math
import os

import needle
import pytest

from conftest import FIXTURES

MODEL = os.path.join(FIXTURES, "tinyb_mixed.cact")


def _tools(n):
    return [{"name": f"tool_{i:02d}", "description": f"thing number {i}",
             "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}
            for i in range(n)]


def test_embed_is_unit_length_and_leaves_conversation():
    with needle.Needle(tools=_tools(2), weights=MODEL) as agent:
        a = agent.embed("hello world")
        assert len(a) == 128
        assert abs(math.sqrt(sum(x * x for x in a)) - 1.0) < 1e-5
        assert agent.embed("hello world") == a
        assert agent.embed("set a timer") != a
        with pytest.raises(TypeError):
            agent.embed(3)


def test_embed_without_head_raises(cq4):
    with needle.Needle(tools=_tools(1), weights=cq4) as agent:
        with pytest.raises(needle.NeedleError):
            agent.embed("hello")


def test_min_confidence_suppresses_calls():
    with needle.Needle(tools=_tools(2), weights=MODEL) as agent:
        env = agent.complete("set a timer", 48, extract=True)
        assert env["success"] and 0.0 <= env["confidence"] <= 1.0
    with needle.Needle(tools=_tools(2), weights=MODEL, min_confidence=2.0) as agent:
        env = agent.complete("set a timer", 48, extract=True)
        assert env["type"] == "low_confidence"
        assert env["function_calls"] == [] and len(env["suppressed_calls"]) == 1


def test_retrieval_with_index(tmp_path):
    index = tmp_path / "tools.idx"
    with needle.Needle(tools=_tools(55), weights=MODEL, tool_index_path=str(index)) as agent:
        env = agent.complete("please do thing number 7", 32)
        names = env["retrieved_tools"]
        assert len(names) == 5 and len(set(names)) == 5
        assert all(c["name"] in names for c in env["function_calls"])
    assert index.stat().st_size == 40 + 55 * (8 + 4 * 128)
    with needle.Needle(tools=_tools(55), weights=MODEL, tool_index_path=str(index)) as agent:
        assert agent.complete("please do thing number 7", 32)["retrieved_tools"] == names
