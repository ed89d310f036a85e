"""The official Python client (cactus-needle 2.0.15 from PyPI) driving OUR library through
NEEDLE_LIB_PATH: complete, run with decorated Python tools executed for real, extract and
reset, on a fixture model (random weights: answers are noise, but always well formed).
Run by tests/official_client/run.sh."""
import json
import os

import needle

WEIGHTS = os.environ["NEEDLE_TEST_WEIGHTS"]
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


def test_complete_returns_a_valid_envelope():
    agent = needle.Needle(tools=[get_weather, set_timer], weights=WEIGHTS)
    response = agent.complete("what's it like in Lagos right now?", max_new_tokens=160)
    assert response["success"] is True, response
    assert response["type"] == "call"
    for call in response["function_calls"]:
        assert call["name"] in ("get_weather", "set_timer")
        assert isinstance(call["arguments"], dict)
    assert response["confidence"] is None  # tuned weights: the client reports None
    agent.close()


def test_run_executes_the_python_tools():
    calls.clear()
    agent = needle.Needle(tools=[get_weather], weights=WEIGHTS)
    # strict=False: the random weights' city is made up, and the engine's validation now
    # flags it (the client's strict run would rightly refuse to execute it)
    response = agent.run("what's it like in Lagos right now?", max_steps=2, max_new_tokens=160,
                         strict=False)
    # one tool: every turn is exactly one call, so the loop ran the tool for real
    assert len(calls) >= 1
    assert all(name == "get_weather" and isinstance(city, str) for name, city in calls)
    assert response["results"] and response["results"][0]["temp_c"] == 27
    agent.close()


def test_extract_yields_the_schema():
    schema = {"name": "contact", "parameters": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"]}}
    agent = needle.Needle(tools=[schema], weights=WEIGHTS)
    response = agent.complete("Ada Lovelace is 36", max_new_tokens=160)
    calls_ = response["function_calls"]
    assert len(calls_) == 1 and calls_[0]["name"] == "contact"
    args = calls_[0]["arguments"]
    assert isinstance(args["name"], str) and len(args["name"]) <= 16
    assert isinstance(args["age"], int) and 0 <= args["age"] <= 150
    agent.close()


def test_extract_function():
    schema = {"name": "contact", "parameters": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"]}}
    # strict=False: the client's grounding checks would rightly reject random-weight values
    args = needle.extract("Ada Lovelace is 36", schema, weights=WEIGHTS, max_new_tokens=160,
                          strict=False)
    assert set(args) == {"name", "age"}
    assert isinstance(args["age"], int) and 0 <= args["age"] <= 150


def test_reset_and_raw_json_tools():
    tools = json.dumps([{"name": "get_weather", "description": "weather",
                         "parameters": {"type": "object",
                                        "properties": {"city": {"type": "string"}},
                                        "required": ["city"]}}])
    agent = needle.Needle(tools=tools, weights=WEIGHTS)
    first = agent.complete("weather in Oslo", max_new_tokens=160)
    agent.reset()
    again = agent.complete("weather in Oslo", max_new_tokens=160)
    assert first["function_calls"] == again["function_calls"]  # greedy, same cached prefix
    agent.close()


def test_tool_index_path_drives_retrieval(tmp_path):
    # A fixture with the retrieval head: with more than five tools, needle_init embeds them
    # into the index file the client names, and each conversation renders five of them.
    heads_model = os.path.join(os.path.dirname(WEIGHTS), "tinyb_mixed.cact")
    tools = [{"name": f"tool_{i}", "description": f"thing {i}",
              "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}
             for i in range(8)]
    index = tmp_path / "tools.idx"
    agent = needle.Needle(tools=tools, weights=heads_model, tool_index_path=str(index))
    response = agent.complete("do thing 3", max_new_tokens=48)
    assert response["success"] is True, response
    assert len(response["retrieved_tools"]) == 5
    assert all(c["name"] in response["retrieved_tools"] for c in response["function_calls"])
    assert index.read_bytes()[:8] == b"NDLTIDX1"
    assert index.stat().st_size == 40 + 8 * (8 + 4 * 128)
    agent.close()
