"""The official `openai` Python client against `needle serve` on the demo model: tools in
both shapes, tool_choice, streaming, multi-turn with tool results, response_format, errors
as the client's exceptions, the bearer key, and a drain that ends in exit status 0."""
import json
import os

import openai
import pytest

from serverproc import DEMO_TOOLS, OPENAI_TOOLS, Server

NEEDLE = os.environ["NEEDLE_CLI"]
KEY = "test-key-123"


@pytest.fixture(scope="module")
def server():
    with Server(NEEDLE, "--parallel", "2", "--api-key", KEY, "--max-tools", "8") as srv:
        yield srv
        assert srv.stop() == 0, srv.log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def ask(client, text, **kw):
    kw.setdefault("tools", OPENAI_TOOLS)
    return client.chat.completions.create(model="needle", messages=[{"role": "user", "content": text}], **kw)


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["needle-demo.cact"]


def test_tool_call(client):
    r = ask(client, "What's the weather in Paris?")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["location"] == "Paris"
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0


def test_bare_tool_shape_gives_the_same_call(client):
    a = ask(client, "Set a timer for 25 minutes")
    b = ask(client, "Set a timer for 25 minutes", tools=DEMO_TOOLS)
    fa, fb = a.choices[0].message.tool_calls[0].function, b.choices[0].message.tool_calls[0].function
    assert (fa.name, json.loads(fa.arguments)) == (fb.name, json.loads(fb.arguments)) == \
        ("set_timer", {"minutes": 25})


def test_tool_choice(client):
    named = ask(client, "What's the weather in Paris?",
                tool_choice={"type": "function", "function": {"name": "send_email"}})
    assert [c.function.name for c in named.choices[0].message.tool_calls] == ["send_email"]
    required = ask(client, "hello there", tool_choice="required")
    assert len(required.choices[0].message.tool_calls) == 1
    none = ask(client, "What's the weather in Paris?", tool_choice="none")
    assert not none.choices[0].message.tool_calls and none.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        ask(client, "hi", tool_choice={"type": "function", "function": {"name": "nope"}})


def test_streaming_equals_plain(client):
    plain = ask(client, "Email Bob that the meeting moved to 3pm")
    stream = ask(client, "Email Bob that the meeting moved to 3pm", stream=True)
    calls, finish, chunks = {}, None, 0
    for chunk in stream:
        chunks += 1
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                c["name"] += tc.function.name or ""
                c["arguments"] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    want = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)}
            for c in plain.choices[0].message.tool_calls]
    got = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for _, c in sorted(calls.items())]
    assert got == want and finish == plain.choices[0].finish_reason
    assert chunks > 3  # arguments arrived in pieces, as they were decoded


def test_multi_turn_with_tool_results(client):
    first = ask(client, "What's the weather in Paris?")
    call = first.choices[0].message.tool_calls[0]
    messages = [{"role": "user", "content": "What's the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call.id, "type": "function",
                     "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21, "sky": "clear"})},
                {"role": "user", "content": "Now set a timer for 10 minutes"}]
    r = client.chat.completions.create(model="needle", messages=messages, tools=OPENAI_TOOLS)
    names = [c.function.name for c in r.choices[0].message.tool_calls or []]
    assert names == ["set_timer"], r
    # the tool result itself as the last message: a turn the engine answers as a result
    r = client.chat.completions.create(model="needle", messages=messages[:3], tools=OPENAI_TOOLS)
    assert r.choices[0].finish_reason in ("stop", "tool_calls")


def test_response_format_json_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "day": {"type": "string"}},
              "required": ["city"]}
    r = client.chat.completions.create(
        model="needle", messages=[{"role": "user", "content": "Weather in Lagos tomorrow"}],
        response_format={"type": "json_schema", "json_schema": {"name": "get_weather", "schema": schema}})
    data = json.loads(r.choices[0].message.content)
    assert isinstance(data.get("city"), str) and data["city"]
    assert not r.choices[0].message.tool_calls


def test_temperature_and_seed(client):
    a = ask(client, "Set a timer for 7 minutes", temperature=0.9, seed=5)
    b = ask(client, "Set a timer for 7 minutes", temperature=0.9, seed=5)
    assert a.choices[0].message.tool_calls[0].function.arguments == \
        b.choices[0].message.tool_calls[0].function.arguments


def test_errors(client, server):
    with pytest.raises(openai.BadRequestError, match="context"):
        ask(client, "weather " * 20000)
    with pytest.raises(openai.BadRequestError, match="last message"):
        client.chat.completions.create(model="needle", tools=OPENAI_TOOLS, messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    with pytest.raises(openai.BadRequestError, match="too many tools"):
        ask(client, "hi", tools=OPENAI_TOOLS * 3)
    with pytest.raises(openai.BadRequestError):
        ask(client, "hi", max_tokens=10 ** 7)
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        ask(bad, "hi")
    status, body = server.get("/health")  # open without the key
    assert status == 200 and json.loads(body)["sessions"] == 2
    status, body = server.get("/metrics")
    assert status == 401
    status, body = server.get("/metrics", {"Authorization": "Bearer " + KEY})
    assert status == 200 and b"needle_prefix_cache_hit_ratio" in body
    status, body, _ = server.post("/v1/needle/complete", {"query": "Set a timer for 3 minutes",
                                                           "tools": DEMO_TOOLS},
                                  {"Authorization": "Bearer " + KEY})
    env = json.loads(body)
    assert status == 200 and env["function_calls"][0]["name"] == "set_timer" and "server" in env


def test_needle_complete_carries_validation(server):
    # issue 30: the engine's validation reaches the HTTP envelope, in both directions
    auth = {"Authorization": "Bearer " + KEY}
    status, body, _ = server.post("/v1/needle/complete", {"query": "Set a timer for 3 minutes",
                                                           "tools": DEMO_TOOLS}, auth)
    assert status == 200 and json.loads(body)["validation"] == {"ungrounded": [],
                                                                "negation": False}
    status, body, _ = server.post("/v1/needle/complete", {
        "query": "don't set a timer for 3 minutes", "tools": DEMO_TOOLS}, auth)
    assert status == 200 and json.loads(body)["validation"]["negation"] is True


def test_official_playground_endpoints(server):
    auth = {"Authorization": "Bearer " + KEY}
    status, body, _ = server.post("/complete", {"query": "Set a timer for 3 minutes",
                                                "tools": json.dumps(DEMO_TOOLS)}, auth)
    assert status == 200 and json.loads(body)["function_calls"][0]["name"] == "set_timer"
    status, body, _ = server.post("/reset", {}, auth)
    assert status == 200 and json.loads(body) == {"ok": True}
    status, body = server.get("/model")
    assert status == 200 and json.loads(body)["name"] == "needle-demo.cact"
