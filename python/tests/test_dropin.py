"""The official cactus-needle 3.x surface on this package (issue 30): Needle's positional
order and defaults, complete/run/extract/embed defaults, ExtractionValidationError and
None from extract, the un-reset warning, validation in every envelope, ints that stay ints,
an empty query refused as the CLI refuses it, and needle.environments' harness contract.
(The byte-identical schemas and the official environment modules themselves run in
tests/official_client/dropin.sh, against the official wheel.)"""
import inspect
import json
import os
import sys
import textwrap
import warnings
from typing import Literal

import pytest

import needle
from conftest import ROOT, Scripted

DEMO = os.path.join(ROOT, "models", "needle-demo.cact")
DEMO_TOOLS = os.path.join(ROOT, "models", "needle-demo.tools.json")
needs_demo = pytest.mark.skipif(not os.path.exists(DEMO), reason="no models/needle-demo.cact")


def demo_tool(name):
    with open(DEMO_TOOLS, encoding="utf-8") as f:
        return next(t for t in json.load(f) if t["name"] == name)


def test_signatures_are_the_official_ones():
    def params(fn):
        return [(p.name, p.default, p.kind) for p in inspect.signature(fn).parameters.values()]
    P, K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    E = inspect.Parameter.empty
    assert params(needle.Needle.__init__)[:9] == [
        ("self", E, P), ("tools", None, P), ("system", None, P), ("weights", None, P),
        ("tool_index_path", None, P), ("buffer_size", 65536, P), ("auto_date", True, P),
        ("generation", None, P), ("stateless", False, P)]
    assert all(kind == K for _, _, kind in params(needle.Needle.__init__)[9:])
    assert params(needle.Needle.complete)[:3] == [("self", E, P), ("text", "", P),
                                                 ("max_new_tokens", 512, P)]
    assert params(needle.Needle.run) == [("self", E, P), ("query", "", P), ("max_steps", 8, P),
                                        ("max_new_tokens", 512, P), ("strict", True, P)]
    assert params(needle.Needle.embed) == [("self", E, P), ("text", "", P)]
    assert params(needle.extract)[:7] == [
        ("text", E, P), ("schema", E, P), ("system", None, P), ("max_new_tokens", 512, P),
        ("weights", None, P), ("strict", True, P), ("generation", None, P)]
    assert params(needle.Needle.extract)[:5] == [
        ("self", E, P), ("text", E, P), ("schema", E, P), ("max_new_tokens", 512, P),
        ("strict", True, P)]
    assert params(needle.tool) [:2] == [("fn", None, P), ("triggers", None, K)]
    assert list(inspect.signature(needle.Field).parameters)[0] == "default"
    assert issubclass(needle.ExtractionValidationError, ValueError)


def test_positional_buffer_size_and_backend_keyword_only(cq4):
    with needle.Needle([], None, cq4, None, 4096, False, 2, True) as a:
        assert a.system is None and a.stateless
    with pytest.raises(TypeError, match="backend="):
        needle.Needle([], None, cq4, None, "cpu")
    with needle.Needle([], None, cq4, backend="cpu") as a:
        assert a.backend == "cpu"


def test_empty_query_refused_like_the_cli(cq4):
    agent = needle.Needle(weights=cq4, tools=[demo_tool("set_lights")], auto_date=False)
    sent = Scripted(agent, [])
    for text in ("", "   \n"):
        env = agent.complete(text)
        assert env["type"] == "error" and env["error_code"] == "invalid_input"
        assert env["error"] == "the query is empty" and env["validation"] == {
            "ungrounded": [], "negation": False}
    assert agent.run()["stop"] == "error"
    assert sent.sent == []  # no turn reached the engine
    agent.close()


def test_stateless_repeats_its_answer_after_an_empty_call_list(cq4):
    """A turn whose envelope says "call" with no calls is not waiting for a tool result (the
    engine's rule): a stateless agent resets before the next query and answers it exactly as
    the first time. Before the fix the next query went in as a tool result of the empty turn,
    so the same query drifted (0, 1, 1, 0 calls, different confidences)."""
    tools = [{"name": "set_timer", "description": "Set a timer", "parameters": {
                 "type": "object", "properties": {"minutes": {"type": "integer"}},
                 "required": ["minutes"]}},
             {"name": "send_message", "description": "Send a message", "parameters": {
                 "type": "object", "properties": {"to": {"type": "string"},
                                                  "text": {"type": "string"}},
                 "required": ["to", "text"]}}]
    with needle.Needle(tools=tools, weights=cq4, auto_date=False, stateless=True) as agent:
        first = agent.complete("play some jazz")
        assert first["type"] == "call" and first["function_calls"] == []
        for _ in range(3):
            again = agent.complete("play some jazz")
            assert (again["function_calls"], again["confidence"]) == (
                first["function_calls"], first["confidence"])


def test_unreset_warning_on_the_fifth_query(cq4):
    agent = needle.Needle(weights=cq4, tools=[demo_tool("set_lights")], auto_date=False)
    Scripted(agent, [{"type": "call", "success": True, "function_calls": []}] * 20)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(4):
            agent.complete("x")
        assert not w
        agent.complete("x")
        assert len(w) == 1 and "reset()" in str(w[0].message)
        agent.complete("x")
        assert len(w) == 1  # once
        agent.reset()
        for _ in range(4):
            agent.complete("x")
        assert len(w) == 1
    agent.close()
    stateless = needle.Needle(weights=cq4, tools=[demo_tool("set_lights")], stateless=True)
    Scripted(stateless, [{"type": "call", "success": True, "function_calls": []}] * 10)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(8):
            stateless.complete("x")
        assert not w
    stateless.close()


def test_ints_stay_ints(cq4):
    got = []

    def pick(n: Literal[1, 2, 3], count: int, ratio: float):
        "Pick."
        got.append((n, count, ratio))
        return n

    agent = needle.Needle(weights=cq4, tools=[pick])
    assert agent._execute({"name": "pick", "arguments": {"n": 3.0, "count": 2.0,
                                                          "ratio": 1.0}}) == 3
    (n, count, ratio), = got
    assert type(n) is int and type(count) is int and type(ratio) is float
    agent.close()


@needs_demo
def test_validation_in_every_envelope_on_the_demo():
    agent = needle.Needle(tools=[demo_tool("set_lights")])
    assert agent.system.startswith("date: ")  # auto_date, as the official
    env = agent.complete("turn on the kitchen lights")
    assert env["validation"] == {"ungrounded": [], "negation": False}, env
    agent.reset()
    env = agent.complete("don't turn on the kitchen lights")
    assert env["validation"]["negation"] is True, env
    agent.reset()
    env = agent.complete("turn on the lights")  # which room? the model guesses one
    if env["function_calls"]:
        assert "set_lights.room" in env["validation"]["ungrounded"], env
    env = agent.complete("", max_new_tokens=4)
    assert "validation" in env
    agent.close()


@needs_demo
def test_extract_official_contract_on_the_demo():
    lights = demo_tool("set_lights")
    assert needle.extract("turn on the kitchen lights", lights) == {"room": "kitchen",
                                                                    "state": "on"}
    with pytest.raises(needle.ExtractionValidationError, match="negated request"):
        needle.extract("don't turn on the kitchen lights", lights)
    with pytest.raises(needle.ExtractionValidationError, match="room"):
        needle.extract("what time is it", lights)  # a made-up room
    args = needle.extract("what time is it", lights, strict=False)
    assert args is None or set(args) >= {"room", "state"}
    # None when the model makes no call: a tool that does not fit the text at all
    none = {"name": "set_alarm", "parameters": {"type": "object", "properties": {
        "time": {"type": "string"}}, "required": ["time"]}}
    found = [needle.extract(q, none, strict=False) for q in
             ("hello there", "thanks!", "who are you?")]
    assert None in found or all(isinstance(f, dict) for f in found)


def test_extract_none_strict_and_failure(cq4, monkeypatch):
    import needle.agent as agent_mod
    lights = demo_tool("set_lights")
    replies = []
    monkeypatch.setattr(agent_mod._Session, "complete",
                        lambda self, text, turn, n, extract=False: replies.pop(0))

    def reply(calls, **validation):
        return {"type": "call", "success": True, "function_calls": calls,
                "validation": {"ungrounded": [], "negation": False, **validation}}

    call = {"name": "set_lights", "arguments": {"room": "kitchen", "state": "on"}}
    replies[:] = [reply([])]
    assert needle.extract("hello", lights, weights=cq4) is None  # no call: None
    replies[:] = [reply([call])]
    assert needle.extract("kitchen on", lights, weights=cq4) == call["arguments"]
    replies[:] = [reply([call], ungrounded=["set_lights.room"])]
    with pytest.raises(needle.ExtractionValidationError, match="room"):
        needle.extract("lights on", lights, weights=cq4)
    replies[:] = [reply([call], ungrounded=["set_lights.room"])]
    assert needle.extract("lights on", lights, weights=cq4, strict=False) == call["arguments"]
    replies[:] = [reply([call], negation=True)]
    with pytest.raises(needle.ExtractionValidationError, match="negated request"):
        needle.extract("don't", lights, weights=cq4)
    failed = {"type": "error", "success": False, "error": "budget", "error_code": "max_tokens",
              "function_calls": []}
    replies[:] = [failed]
    with pytest.raises(needle.NeedleError, match="max_tokens"):
        needle.extract("kitchen on", lights, weights=cq4)
    # the year rule on top: a date whose year the text does not write
    event = {"name": "event", "parameters": {"type": "object", "properties": {
        "day": {"type": "string", "format": "date"}}, "required": ["day"]}}
    replies[:] = [reply([{"name": "event", "arguments": {"day": "2023-05-01"}}])]
    with pytest.raises(needle.ExtractionValidationError, match="day"):
        needle.extract("on May 1st 2024", event, weights=cq4)


@needs_demo
def test_pydantic_model_in_tools_runs_as_the_official():
    pydantic = pytest.importorskip("pydantic")

    class set_lights(pydantic.BaseModel):
        """Turn the lights in a room on or off, optionally setting brightness."""
        room: str
        state: Literal["on", "off"]

    agent = needle.Needle(tools=[set_lights])
    r = agent.run("turn on the kitchen lights")
    # the official client calls the model class: its instance is the result; a call with
    # a value the query does not support is refused instead (strict)
    for call, result in zip(r["calls"], r["results"]):
        if isinstance(result, set_lights):
            assert result.room == "kitchen" and result.state == "on"
        else:
            assert result["error"].startswith("ungrounded set_lights."), result
    agent.close()


def test_environments_contract(tmp_path, monkeypatch):
    # an environment module written the official way, found through NEEDLE_ENVIRONMENTS
    folder = tmp_path / "envs"
    folder.mkdir()
    (folder / "tiny_env.py").write_text(textwrap.dedent('''
        import sys
        from typing import Literal
        import needle
        from needle.environments import _harness

        @needle.tool
        def set_lights(room: Literal["kitchen", "bedroom"], state: Literal["on", "off"]):
            """Turn the lights in a room on or off."""
            return {"ok": True}

        TOOLS = [set_lights]
        SYSTEM = "Only explicit requests."
        TEST_CASES = [
            {"query": "turn on the kitchen lights", "calls": [{"name": "set_lights",
             "arguments": {"room": "kitchen", "state": "on"}}], "category": "positive"},
            {"query": "don't turn on the kitchen lights", "calls": [],
             "category": "negation", "critical": True},
        ]

        def run_tests(min_confidence=0.0, verbose=True):
            return _harness.run_tests(sys.modules[__name__], min_confidence, verbose)

        def __getattr__(name):
            if name == "agent":
                return _harness.agent_for(sys.modules[__name__])
            raise AttributeError(name)
    '''), encoding="utf-8")
    monkeypatch.setenv("NEEDLE_ENVIRONMENTS", str(folder))
    for mod in [m for m in sys.modules if m.startswith("needle.environments")]:
        monkeypatch.delitem(sys.modules, mod)
    import needle.environments as environments
    assert "tiny_env" in dir(environments)
    from needle.environments import tiny_env
    from needle.environments import _harness
    assert tiny_env.agent is _harness.agent_for(tiny_env)
    replies = [{"type": "call", "success": True, "function_calls": [
        {"name": "set_lights", "arguments": {"room": "kitchen", "state": "on"}}],
        "validation": {"ungrounded": [], "negation": False}, "confidence": 0.9},
        {"type": "call", "success": True, "function_calls": [
            {"name": "set_lights", "arguments": {"room": "kitchen", "state": "on"}}],
         "validation": {"ungrounded": [], "negation": True}, "confidence": 0.9}]
    Scripted(tiny_env.agent, replies)
    assert tiny_env.run_tests(verbose=False) is True  # the negated call is dropped
    Scripted(tiny_env.agent, replies)
    assert tiny_env.run_tests(min_confidence=0.95, verbose=False) is False
    # an environment that is not there says where environments come from
    with pytest.raises(ModuleNotFoundError, match="NEEDLE_ENVIRONMENTS"):
        environments.smart_home
