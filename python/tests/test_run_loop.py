"""The agent loop's stopping rule and answer (python/README.md, "The agent loop"): scripted
replies for the rule itself, the shipped demo model for the cases of issue 21."""
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
    s = Scripted(agent, [call("add", a=1, b=2), call("add", a=2, b=3), call("add", b=2, a=1)])
    r = agent.run("q")
    assert r["stop"] == "repeat" and done == [(1, 2), (2, 3)]
    assert r["results"] == [3, 5] and r["answer"] == 5
    assert len(s.sent) == 3  # the query and two tool results; nothing after the repeat
    assert s.sent[2] == (needle.TURN_TOOL_RESULT, "[5]")
    agent.close()


def test_missing_implementation_ends_the_loop_answer_is_last_useful(cq4):
    agent, done = tools(cq4)
    s = Scripted(agent, [call("add", a=1, b=2), call("lookup", q="x")])
    r = agent.run("q")
    assert r["stop"] == "no_implementation" and len(s.sent) == 2
    assert r["results"] == [3, {"error": "no implementation for tool: lookup"}]
    assert r["answer"] == 3  # the earlier successful result, not the error
    agent.close()


def test_missing_implementation_alone_is_the_answer(cq4):
    agent, _ = tools(cq4)
    Scripted(agent, [call("lookup", q="x")])
    r = agent.run("q")
    assert r["stop"] == "no_implementation"
    assert r["answer"] == {"error": "no implementation for tool: lookup"}
    agent.close()


def test_mixed_round_keeps_implemented_results(cq4):
    agent, done = tools(cq4)
    both = {"type": "call", "success": True, "function_calls": [
        {"name": "add", "arguments": {"a": 4, "b": 4}}, {"name": "lookup", "arguments": {}}]}
    Scripted(agent, [both])
    r = agent.run("q")
    assert r["stop"] == "no_implementation" and done == [(4, 4)] and r["answer"] == 8
    agent.close()


def test_respond_and_max_steps_and_error(cq4):
    agent, done = tools(cq4)
    Scripted(agent, [call("add", a=1, b=1), RESPOND])
    r = agent.run("q")
    assert r["stop"] == "respond" and r["answer"] == 2 and r["type"] == "respond"
    Scripted(agent, [call("add", a=1, b=i) for i in range(10)])
    r = agent.run("q", max_steps=3)
    assert r["stop"] == "max_steps" and r["results"] == [1, 2, 3] and r["answer"] == 3
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
    assert r["stop"] == "single_tool" and len(r["calls"]) == 1
    assert r["answer"] == r["results"][0] and r["answer"]["temp_c"] == 27


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
    assert r["stop"] in ("respond", "repeat", "no_implementation", "single_tool")
