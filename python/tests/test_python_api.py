"""Issue 21's Python "Confusing" items: argument types, NUL, no tools, the official client's
keyword arguments, datetime.date parameters, tools given as a file path."""
import datetime
import json
import os
import pathlib
import warnings
from typing import List, Optional

import pytest

import needle
from conftest import ROOT, Scripted

DEMO = os.path.join(ROOT, "models", "needle-demo.cact")
DEMO_TOOLS = os.path.join(ROOT, "models", "needle-demo.tools.json")

WEATHER = {"name": "get_weather", "description": "Get the weather.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
LOOKUP = {"name": "lookup", "description": "Look up.",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}


def test_non_str_text_is_a_type_error(cq4):
    with needle.Needle(weights=cq4, tools=[WEATHER]) as agent:
        for bad in (None, 12, b"bytes"):
            with pytest.raises(TypeError, match="must be str"):
                agent.complete(bad)
            with pytest.raises(TypeError, match="must be str"):
                agent.run(bad)


def test_nul_and_surrogates_give_invalid_input(cq4):
    with needle.Needle(weights=cq4, tools=[WEATHER, LOOKUP]) as agent, \
            needle.Needle(weights=cq4, tools=[WEATHER, LOOKUP]) as fresh:
        for text in ("weather in Lagos\0 and Accra", "a\ud800b"):
            env = agent.complete(text)
            assert env["success"] is False and env["error_code"] == "invalid_input"
            assert env["type"] == "error" and env["function_calls"] == []
            assert "NUL" in env["error"] or "surrogate" in env["error"]
            assert set(env) >= {"reasoning", "confidence", "prefill_tps", "decode_tps",
                                "peak_ram_mb", "error"}
        agent.reset()
        fresh.reset()
        a, b = agent.complete("x\0"), agent.complete("weather?")
        assert a["error_code"] == "invalid_input"
        assert b["function_calls"] == fresh.complete("weather?")["function_calls"]
        r = agent.run("q\0")
        assert r["stop"] == "error" and r["error_code"] == "invalid_input"
        assert r["answer"] is None


@pytest.mark.skipif(not os.path.exists(DEMO), reason="no models/needle-demo.cact")
def test_no_tools_with_demo_model_uses_demo_tools(monkeypatch):
    monkeypatch.delenv("NEEDLE_MODEL", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with needle.Needle() as agent:
            with open(DEMO_TOOLS, encoding="utf-8") as f:
                assert agent.tools == json.load(f)
            env = agent.complete("Set a timer for 10 minutes")
            assert env["function_calls"][0]["name"] == "set_timer"


def test_no_tools_with_other_weights_warns(cq4):
    with pytest.warns(UserWarning, match="has no tools"):
        needle.Needle(weights=cq4).close()
    with pytest.warns(UserWarning, match="has no tools"):
        needle.Needle(weights=cq4, tools=[]).close()


def test_tools_from_a_file_path(cq4, tmp_path):
    arr = tmp_path / "tools.json"
    arr.write_bytes(b"\xef\xbb\xbf" + json.dumps([WEATHER, LOOKUP]).encode())  # with a BOM
    one = tmp_path / "one.json"
    one.write_text(json.dumps(WEATHER))
    for spec, expect in ((str(arr), [WEATHER, LOOKUP]), (arr, [WEATHER, LOOKUP]),
                         (str(one), [WEATHER]), (json.dumps([LOOKUP]), [LOOKUP])):
        with needle.Needle(weights=cq4, tools=spec) as agent:
            assert agent.tools == expect
            assert agent.complete("weather?")["success"]
    with pytest.raises(needle.NeedleError, match="directory"):
        needle.Needle(weights=cq4, tools=str(tmp_path))
    with pytest.raises(needle.NeedleError, match="cannot read"):
        needle.Needle(weights=cq4, tools=str(tmp_path / "missing.json"))


def test_official_keywords(cq4):
    with needle.Needle(weights=cq4, tools=[WEATHER], buffer_size=64) as agent:
        with pytest.raises(needle.NeedleError) as ei:
            agent.complete("weather?")
        assert ei.value.status == -8  # the envelope does not fit 64 bytes
    with pytest.raises(ValueError, match="buffer_size"):
        needle.Needle(weights=cq4, tools=[WEATHER], buffer_size=0)
    with pytest.raises(needle.NeedleError, match="generation"):
        needle.Needle(weights=cq4, tools=[WEATHER], generation=3)
    needle.Needle(weights=cq4, tools=[WEATHER], generation=2).close()

    today = "2026-01-05"  # conftest.fixed_clock
    with needle.Needle(weights=cq4, tools=[WEATHER], auto_date=True) as a:
        assert a.system.startswith("date: " + today)
    with needle.Needle(weights=cq4, tools=[WEATHER], system="user: Ada", auto_date=True) as a:
        assert a.system.startswith("date: " + today) and a.system.endswith("; user: Ada")
    for given in ("date: 2020-01-01", '{"city": "Lagos"}', "today is 2021-02-03"):
        with needle.Needle(weights=cq4, tools=[WEATHER], system=given, auto_date=True) as a:
            assert a.system == given
    with needle.Needle(weights=cq4, tools=[WEATHER], system="x") as a:
        assert a.system == "date: " + today + a.system[16:] and a.system.endswith("; x")
    with needle.Needle(weights=cq4, tools=[WEATHER], system="x", auto_date=False) as a:
        assert a.system == "x"


def test_stateless(cq4):
    tools = [WEATHER, LOOKUP]
    # auto_date off: the same system text in every agent whatever the minute
    with needle.Needle(weights=cq4, tools=tools, stateless=True, auto_date=False) as agent, \
            needle.Needle(weights=cq4, tools=tools, auto_date=False) as fresh:
        agent.complete("first query, forgotten")
        q = agent.complete("weather in Accra?")
        assert q["function_calls"] == fresh.complete("weather in Accra?")["function_calls"]
        r1 = agent.run("weather in Accra?", max_steps=1)
        r2 = agent.run("weather in Accra?", max_steps=1)
        assert r1["calls"] == r2["calls"]
    # a tool result after a call continues the conversation: it is not a new query
    result = json.dumps([{"temp_c": 27}])
    with needle.Needle(weights=cq4, tools=[WEATHER], stateless=True, auto_date=False) as agent, \
            needle.Needle(weights=cq4, tools=[WEATHER], auto_date=False) as kept:
        assert agent.complete("weather?")["function_calls"] == \
            kept.complete("weather?")["function_calls"]
        assert agent.complete(result)["function_calls"] == \
            kept.complete(result)["function_calls"]
        assert agent._session.last_called  # the call is remembered, the result followed it


def test_run_strict_refuses_ungrounded_dates(cq4):
    seen = []

    def book(city: str, when: datetime.date):
        "Book a table."
        seen.append(when)
        return {"booked": when.isoformat()}

    reply = {"type": "call", "success": True, "function_calls": [
        {"name": "book", "arguments": {"city": "Lagos", "when": "2023-05-01"}}]}
    done = {"type": "respond", "success": True, "function_calls": []}
    agent = needle.Needle(weights=cq4, tools=[book])
    Scripted(agent, [reply, done])
    r = agent.run("book Lagos on May 1st 2024")
    assert r["results"] == [{"error": "ungrounded book.when"}] and seen == []
    assert r["answer"] == {"error": "ungrounded book.when"}  # no function ran
    Scripted(agent, [reply, done])
    r = agent.run("book Lagos on May 1st 2024", strict=False)
    assert r["answer"] == {"booked": "2023-05-01"} and seen == [datetime.date(2023, 5, 1)]
    agent.reset()  # the years written earlier in a conversation count until reset()
    Scripted(agent, [reply, done])
    r = agent.run("book Lagos next Monday")  # no year written: nothing to contradict
    assert r["answer"] == {"booked": "2023-05-01"}
    agent.close()

    def cancel(city: str):
        "Cancel a booking."

    agent = needle.Needle(weights=cq4, tools=[book, cancel])  # two tools: several rounds
    Scripted(agent, [{"type": "call", "success": True, "function_calls": [
        {"name": "book", "arguments": {"city": "Lagos", "when": "2024-05-01"}}]}, reply,
        {"type": "respond", "success": True, "function_calls": []}])
    r = agent.run("book Lagos on May 1st 2024, or else 2024-05-02")
    # the follow-up's year is not the query's: that round is not asked for, not executed
    assert r["results"] == [{"booked": "2024-05-01"}]
    assert r["answer"] == {"booked": "2024-05-01"} and r["stop"] == "unrequested"
    agent.close()


def test_date_parameters_schema_and_conversion(cq4):
    got = []

    @needle.tool
    def plan(day: datetime.date, at: Optional[datetime.datetime] = None,
             also: Optional[List[datetime.date]] = None, alarm: Optional[datetime.time] = None):
        "Plan a day."
        got.append((day, at, also, alarm))
        return "ok"

    props = plan.__needle_tool__["parameters"]["properties"]
    assert props["day"] == {"type": "string", "format": "date"}
    assert props["at"] == {"type": "string", "format": "date-time"}
    assert props["also"] == {"type": "array", "items": {"type": "string", "format": "date"}}
    assert props["alarm"] == {"type": "string", "format": "time"}
    assert plan.__needle_tool__["parameters"]["required"] == ["day"]

    with needle.Needle(weights=cq4, tools=[plan]) as agent:
        r = agent.run("plan it", max_steps=1, max_new_tokens=512, strict=False)
        if r["results"] == ["ok"]:
            (day, at, also, alarm), = got
            assert type(day) is datetime.date
            assert at is None or type(at) is datetime.datetime
            assert also is None or all(type(d) is datetime.date for d in also)
            assert alarm is None or type(alarm) is datetime.time
        else:  # random weights: the grammar's date may still not be a real calendar day
            assert "not an ISO" in r["results"][0]["error"]
    # the conversion itself, on fixed arguments
    agent = needle.Needle(weights=cq4, tools=[plan])
    got.clear()
    assert agent._execute({"name": "plan", "arguments": {
        "day": "2024-02-29", "at": "2024-02-29T10:30:00Z", "also": ["2024-03-01"],
        "alarm": "07:15:00"}}) == "ok"
    assert got == [(datetime.date(2024, 2, 29),
                    datetime.datetime(2024, 2, 29, 10, 30, tzinfo=datetime.timezone.utc),
                    [datetime.date(2024, 3, 1)], datetime.time(7, 15))]
    assert agent._execute({"name": "plan", "arguments": {"day": "2024-02-30"}}) == \
        {"error": "'2024-02-30' is not an ISO date"}
    agent.close()
