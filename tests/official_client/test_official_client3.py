"""The official Python client (cactus-needle 3.2.8 from PyPI) driving OUR libneedle3 through
NEEDLE3_LIB_PATH on a Needle 3 fixture (random weights: answers are noise, but always well
formed): complete, run with decorated Python tools executed for real, extract, embed, reset,
two agents side by side. Every tuned-weights agent is a child process of the client's
(_worker.py), which loads the library, calls needle_load, needle_init (its prefix length),
then needle_complete / needle_embed / needle_reset. Run by tests/official_client/run3.sh."""
import ctypes
import json
import math
import os

import pytest

import needle

WEIGHTS = os.environ["NEEDLE3_TEST_WEIGHTS"]
LIB = os.environ["NEEDLE3_LIB_PATH"]
calls = []


@needle.tool
def get_weather(city: str, unit: str = "celsius"):
    """Get the current weather for a city.

    Args:
        city: the city name
        unit: celsius or fahrenheit
    """
    calls.append(("get_weather", city))
    return {"city": city, "temp_c": 27, "sky": "clear"}


@needle.tool
def set_timer(minutes: int):
    """Start a countdown timer."""
    calls.append(("set_timer", minutes))
    return {"ok": True, "minutes": minutes}


def check_envelope(response, names):
    assert response["success"] is True, response
    assert response["type"] == "call", response
    # the engine's validation, which the client's strict run and extract act on
    assert isinstance(response["validation"]["ungrounded"], list), response
    assert isinstance(response["validation"]["negation"], bool), response
    for call in response["function_calls"]:
        assert call["name"] in names
        assert isinstance(call["arguments"], dict)
    # The client overwrites the engine's confidence with None when its manifest probe
    # (_confidence_head_present, which counts 6 records per head) misses the head, as it
    # does for a file that also has the router (7 records); the engine's own number is
    # checked in test_the_abi_directly.
    assert response["confidence"] is None or 0.0 <= response["confidence"] <= 1.0


def test_complete_returns_a_valid_envelope():
    agent = needle.Needle(tools=[get_weather, set_timer], weights=WEIGHTS)
    response = agent.complete("what's it like in Lagos right now?", max_new_tokens=96)
    check_envelope(response, ("get_weather", "set_timer"))
    agent.close()


def test_run_executes_the_python_tools():
    calls.clear()
    agent = needle.Needle(tools=[get_weather], weights=WEIGHTS)
    # strict=False: the random weights' city is made up, and the engine's validation now
    # flags it (the client's strict run would rightly refuse to execute it)
    response = agent.run("what's it like in Lagos right now?", max_steps=2, max_new_tokens=96,
                         strict=False)
    # one tool: every turn is exactly one call, so the loop ran the tool for real
    assert len(calls) >= 1
    assert all(name == "get_weather" and isinstance(city, str) for name, city in calls)
    assert response["results"] and response["results"][0]["temp_c"] == 27
    agent.close()


def test_extract_function():
    schema = {"name": "contact", "parameters": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"]}}
    # strict=False: the client's grounding checks would rightly reject random-weight values
    args = needle.extract("Ada Lovelace is 36", schema, weights=WEIGHTS, max_new_tokens=96,
                          strict=False)
    assert set(args) == {"name", "age"}
    assert isinstance(args["age"], int) and 0 <= args["age"] <= 150


def test_embed_is_a_unit_vector_of_the_head_width():
    agent = needle.Needle(tools=[get_weather], weights=WEIGHTS)
    a = agent.embed("What is the weather in Paris today?")
    agent.complete("weather in Oslo", max_new_tokens=48)  # a conversation in between
    b = agent.embed("What is the weather in Paris today?")
    c = agent.embed("Set an alarm for 7am tomorrow.")
    assert len(a) == 128
    assert abs(math.sqrt(sum(x * x for x in a)) - 1.0) < 1e-4
    assert a == b  # the conversation does not disturb embeddings
    assert a != c
    agent.close()


def test_reset_and_raw_json_tools():
    tools = json.dumps([{"name": "get_weather", "description": "weather",
                         "parameters": {"type": "object",
                                        "properties": {"city": {"type": "string"}},
                                        "required": ["city"]}}])
    agent = needle.Needle(tools=tools, weights=WEIGHTS)
    first = agent.complete("weather in Oslo", max_new_tokens=96)
    agent.reset()
    again = agent.complete("weather in Oslo", max_new_tokens=96)
    assert first["function_calls"] == again["function_calls"]  # greedy, same cached prefix
    agent.close()


def test_two_agents_side_by_side():
    weather = needle.Needle(tools=[get_weather], weights=WEIGHTS)
    timer = needle.Needle(tools=[set_timer], weights=WEIGHTS)
    for _ in range(2):
        w = weather.complete("weather in Oslo", max_new_tokens=64)
        t = timer.complete("a timer for ten minutes", max_new_tokens=64)
        assert all(c["name"] == "get_weather" for c in w["function_calls"]), w
        assert all(c["name"] == "set_timer" for c in t["function_calls"]), t
        weather.reset()
        timer.reset()
    weather.close()
    timer.close()


def test_the_abi_directly():
    # What the client relies on without showing it: needle_init's prefix length, the size
    # query of needle_embed, audio refused cleanly, needle_models, needle_last_error.
    lib = ctypes.CDLL(LIB)
    lib.needle_load.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    lib.needle_init.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.needle_complete.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int,
                                    ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.needle_embed.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int,
                                 ctypes.POINTER(ctypes.c_float), ctypes.c_int]
    lib.needle_last_error.restype = ctypes.c_char_p
    out = ctypes.create_string_buffer(4096)
    assert lib.needle_models() == 1
    assert lib.needle_init(b"", b"[]", None) < 0  # no weights loaded yet
    assert b"needle_load" in lib.needle_last_error()
    data = open(WEIGHTS, "rb").read()
    assert lib.needle_load(data, len(data)) == 0
    tools = json.dumps([get_weather._needle_tool]).encode()
    short = lib.needle_init(b"", b"[]", None)
    prefix = lib.needle_init(b"", tools, None)
    assert 0 < short < prefix  # the tools are in the prefix
    pcm = (ctypes.c_float * 16)()
    assert lib.needle_complete(b"hi", pcm, 16, 32, out, len(out)) < 0
    assert b"audio" in out.value
    assert lib.needle_complete(b"weather in Oslo", None, 0, 64, out, len(out)) == 0
    envelope = json.loads(out.value)
    assert envelope["success"] is True
    assert 0.0 <= envelope["confidence"] <= 1.0  # the v3 confidence head scored the turn
    dim = lib.needle_embed(b"hello", None, 0, None, 0)
    assert dim == 128
    emb = (ctypes.c_float * dim)()
    assert lib.needle_embed(b"hello", None, 0, emb, dim) == dim
    assert lib.needle_embed(b"hello", None, 0, emb, dim - 1) < 0
    assert lib.needle_embed(b"hello", pcm, 16, emb, dim) < 0
    lib.needle_reset()
