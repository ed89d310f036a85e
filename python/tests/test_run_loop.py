"""The agent loop (python/README.md, "The agent loop"): the official loop (results sent
back, errors as results, max_steps) with its safety rule (a follow-up round that repeats a
call or was not asked for by the query is not executed): scripted replies for the rule
itself, the shipped demo model for the cases of issues 21 and 30."""
import json
import os
from typing import Optional

import pytest

import needle
from conftest import ROOT, Scripted

DEMO = os.path.join(ROOT, "models", "needle-demo.cact")
DEMO_TOOLS = os.path.join(ROOT, "models", "needle-demo.tools.json")
need_demo = pytest.mark.skipif(not os.path.exists(DEMO), reason="no models/needle-demo.cact")


def call(name, **args):
    return {"type": "call", "success": True, "function_calls": [{"name": name, "arguments": args}]}


RESPOND = {"type": "respond", "success": True, "function_calls": []}


def tools(cq4):
    done = []

    def add(a: int, b: int):
        "Add two integers."
        done.append((a, b))
        return a + b

    lookup = {"name": "lookup", "description": "Look up.",
              "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
    return needle.Needle(weights=cq4, tools=[add, lookup]), done


def test_repeat_ends_the_loop_without_executing_it(cq4):
    agent, done = tools(cq4)
    s = Scripted(agent, [call("add", a=1, b=2), call("add", a=2, b=3), call("add", b=2, a=1.0)])
    r = agent.run("add 1 and 2, then 2 and 3")
    assert r["stop"] == "repeat" and done == [(1, 2), (2, 3)]
    assert r["results"] == [3, 5] and r["answer"] == 5
    assert len(s.sent) == 3  # the query and two tool results; nothing after the repeat
    assert s.sent[2] == (needle.TURN_TOOL_RESULT, "[5]")
    agent.close()


def test_missing_implementation_is_an_error_result_sent_back(cq4):
    # as the official client: a tool without a function is an unknown tool; its result
    # {"error": ...} goes back to the model like any other
    agent, done = tools(cq4)
    s = Scripted(agent, [call("add", a=1, b=2), call("lookup", q="x"), RESPOND])
    r = agent.run("add 1 and 2, then look up x")
    assert r["stop"] == "respond" and len(s.sent) == 3
    assert s.sent[2] == (needle.TURN_TOOL_RESULT, '[{"error": "unknown tool: lookup"}]')
    assert r["results"] == [3, {"error": "unknown tool: lookup"}]
    assert r["answer"] == 3  # the earlier successful result, not the error
    agent.close()


def test_missing_implementation_alone_is_the_answer(cq4):
    agent, _ = tools(cq4)
    Scripted(agent, [call("lookup", q="x"), RESPOND])
    r = agent.run("look up x")
    assert r["stop"] == "respond"
    assert r["answer"] == {"error": "unknown tool: lookup"}
    agent.close()


def test_mixed_round_keeps_implemented_results(cq4):
    agent, done = tools(cq4)
    both = {"type": "call", "success": True, "function_calls": [
        {"name": "add", "arguments": {"a": 4, "b": 4}}, {"name": "lookup", "arguments": {}}]}
    Scripted(agent, [both, RESPOND])
    r = agent.run("add 4 and 4")
    assert r["stop"] == "respond" and done == [(4, 4)] and r["answer"] == 8
    agent.close()


def test_unrequested_followup_is_not_executed(cq4):
    # issue 30: after a result the model invented a call nobody asked for; its values are
    # in neither the query nor the results, so the round is not executed
    agent, done = tools(cq4)
    s = Scripted(agent, [call("add", a=1, b=2), call("add", a=40, b=2)])
    r = agent.run("add 1 and 2")
    assert r["stop"] == "unrequested" and done == [(1, 2)] and r["results"] == [3]
    assert r["function_calls"] == [{"name": "add", "arguments": {"a": 40, "b": 2}}]
    assert len(s.sent) == 2
    # chaining stays possible: a follow-up built from a result is asked for
    s = Scripted(agent, [call("add", a=1, b=2), call("add", a=3, b=2), RESPOND])
    r = agent.run("add 1 and 2, then add 2 to that")
    assert r["stop"] == "respond" and r["results"] == [3, 5]
    agent.close()


def test_strict_first_round_flags_and_negation(cq4):
    agent, done = tools(cq4)
    flagged = dict(call("add", a=1, b=9), validation={"ungrounded": ["add.b"], "negation": False})
    Scripted(agent, [flagged, RESPOND])
    r = agent.run("add 1 and something")
    assert done == [] and r["results"] == [{"error": "ungrounded add.b"}]
    negated = dict(call("add", a=1, b=2), validation={"ungrounded": [], "negation": True})
    Scripted(agent, [negated, RESPOND])
    r = agent.run("don't add 1 and 2")
    assert done == [] and r["results"] == [{"error": "negated request"}]
    # a negated query: what the model calls after the refusal is not asked for either
    Scripted(agent, [negated, call("add", a=1, b=2.0)])
    r = agent.run("don't add 1 and 2")
    assert done == [] and r["stop"] == "unrequested"
    Scripted(agent, [negated, RESPOND])
    r = agent.run("don't add 1 and 2", strict=False)
    assert done == [(1, 2)] and r["results"] == [3]
    agent.close()


def test_respond_and_max_steps_and_error(cq4):
    agent, done = tools(cq4)
    Scripted(agent, [call("add", a=1, b=1), RESPOND])
    r = agent.run("add 1 and 1")
    assert r["stop"] == "respond" and r["answer"] == 2 and r["type"] == "respond"
    s = Scripted(agent, [call("add", a=1, b=i) for i in range(10)])
    r = agent.run("add 1 to 0, 1, 2, 3 in turn", max_steps=3)
    assert r["stop"] == "max_steps" and r["results"] == [1, 2, 3] and r["answer"] == 3
    # as the official loop: the last round's results are sent back too
    assert len(s.sent) == 4 and s.sent[3] == (needle.TURN_TOOL_RESULT, "[3]")
    Scripted(agent, [RESPOND])
    r = agent.run("q")
    assert r["stop"] == "respond" and r["answer"] is None and r["results"] == []
    failed = {"type": "call", "success": False, "error_code": "max_tokens", "function_calls": []}
    Scripted(agent, [call("add", a=0, b=0), failed])
    r = agent.run("q")
    assert r["stop"] == "error" and r["answer"] == 0 and r["error_code"] == "max_tokens"
    agent.close()


def demo_get_weather():
    @needle.tool
    def get_weather(location: str, day: Optional[str] = None):
        """Get the current weather or forecast for a location.

        Args:
            location: City name
            day: Day of the forecast, e.g. today or tomorrow
        """
        return {"location": location, "day": day or "today", "temp_c": 24, "sky": "sunny"}
    return get_weather


@need_demo
def test_demo_single_tool_does_not_loop():
    # issue 21: this looped 8 times with garbage arguments and a ~1 KB answer
    def get_weather(city: str):
        "Get the current weather for a city."
        return {"city": city, "temp_c": 27}

    r = needle.Needle(tools=[get_weather]).run("what's it like in Lagos right now?")
    assert r["stop"] in ("repeat", "unrequested", "respond") and len(r["calls"]) == 1
    assert r["answer"] == r["results"][0]
    # the demo model writes a made-up city here ("+33 44 878 4444"): strict refuses it
    city = r["calls"][0]["arguments"]["city"]
    if city.lower() in "what's it like in lagos right now?":
        assert r["answer"]["temp_c"] == 27
    else:
        assert r["answer"] == {"error": "ungrounded get_weather.city"}


@need_demo
def test_demo_tools_answer_is_the_weather_not_a_missing_implementation():
    # issue 21: with the demo tools this ended on a convert_currency "no implementation"
    with open(DEMO_TOOLS, encoding="utf-8") as f:
        declared = [t for t in json.load(f) if t["name"] != "get_weather"]
    weather = demo_get_weather()
    assert weather.__needle_tool__ in json.load(open(DEMO_TOOLS, encoding="utf-8"))
    r = needle.Needle(tools=declared + [weather]).run("What's the weather in Paris?")
    assert r["calls"][0] == {"name": "get_weather", "arguments": {"location": "Paris"}}
    assert r["answer"] == {"location": "Paris", "day": "today", "temp_c": 24, "sky": "sunny"}
    assert r["stop"] in ("respond", "repeat", "unrequested")


@need_demo
def test_demo_play_some_jazz_executes_nothing_invented():
    # issue 30: "play some jazz" ran 7 invented follow-up calls (4 send_message to made-up
    # recipients) before stopping on a repeat. Every demo tool gets a function here.
    with open(DEMO_TOOLS, encoding="utf-8") as f:
        declared = json.load(f)
    ran = []

    def runner(name):
        def fn(**kwargs):
            ran.append((name, kwargs))
            return {"ok": True}
        return fn

    agent = needle.Needle(tools=declared)
    agent._functions.update({t["name"]: runner(t["name"]) for t in declared})
    r = agent.run("play some jazz")
    assert not any(name == "send_message" for name, _ in ran), ran
    assert len(ran) <= 1 and r["stop"] in ("respond", "repeat", "unrequested"), (ran, r["stop"])
    for name, kwargs in ran:  # what ran was asked for: its values are in the query
        assert all(str(v).lower() in "play some jazz" for v in kwargs.values()), ran
    agent.close()
