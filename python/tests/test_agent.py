"""The agent on the fixture models (random weights: answers are noise, always schema-valid)."""
import ctypes
import json
import os
import subprocess
import sys
import threading
from typing import Literal

import pytest

import needle
from conftest import header_version

HERE = os.path.dirname(os.path.abspath(__file__))


def make_weather():
    log = []

    @needle.tool
    def get_weather(city: str):
        "Get the current weather for a city."
        log.append(city)
        return {"city": city, "temp_c": 27, "sky": "clear"}
    return get_weather, log


def test_run_single_tool_stops_after_one_round(cq4):
    # With one tool the engine must answer every turn with a call of it, so a tool-result
    # turn could never end the loop: the follow-up round repeats the call or invents a
    # value (random weights), and either way it is not executed.
    fn, log = make_weather()
    with needle.Needle(weights=cq4, tools=[fn]) as agent:
        r = agent.run("weather in Lagos?", max_steps=3, strict=False)
        assert r["type"] == "call" and r["success"] is True
        assert r["stop"] in ("repeat", "unrequested")
        assert [c["name"] for c in r["calls"]] == ["get_weather"]
        assert log == [r["calls"][0]["arguments"]["city"]]
        assert r["results"] == [{"city": log[0], "temp_c": 27, "sky": "clear"}]
        assert r["answer"] == r["results"][0]
        assert r["function_calls"] and r["function_calls"][0]["name"] == "get_weather"
        for key in ("error", "error_code", "reasoning", "confidence", "prefill_tps",
                    "decode_tps", "peak_ram_mb"):
            assert key in r


def test_run_max_steps_one_and_zero(cq4):
    fn, log = make_weather()
    agent = needle.Needle(weights=cq4, tools=[fn])
    r = agent.run("hi", max_steps=1, strict=False)
    assert len(r["results"]) == 1 and log == [r["calls"][0]["arguments"]["city"]]
    r = agent.run("hi", max_steps=0)
    assert r["results"] == [] and r["answer"] is None and r["type"] == "call"
    agent.close()


def test_complete_reset_and_turns(cq4):
    fn, _ = make_weather()
    agent = needle.Needle(weights=cq4, tools=[fn], system="The user lives in Lagos.")
    e1 = agent.complete("weather?")
    assert e1["type"] == "call" and e1["function_calls"][0]["name"] == "get_weather"
    assert set(e1["function_calls"][0]["arguments"]) == {"city"}
    agent.complete(json.dumps([{"temp_c": 27}]), turn=needle.TURN_TOOL_RESULT)
    agent.reset()
    # greedy decoding: after reset the same query gives the same envelope calls
    assert agent.complete("weather?")["function_calls"] == e1["function_calls"]
    agent.close()
    agent.close()  # idempotent
    with pytest.raises(needle.NeedleError, match="closed"):
        agent.complete("x")


def test_multi_tool_results_match_calls(cq4):
    calls = []

    @needle.tool
    def add(a: int, b: int):
        "Add two integers."
        calls.append(("add", a, b))
        return a + b

    @needle.tool
    def unit(system: Literal["metric", "imperial"]):
        "Choose a unit system."
        calls.append(("unit", system))
        return system

    agent = needle.Needle(weights=cq4, tools=[add, unit])
    for q in ["add 2 and 3", "use metric", "hello", "what is 7 plus 8"]:
        r = agent.run(q, max_steps=4, strict=False)
        assert len(r["results"]) == len(r["calls"])
        for c, res in zip(r["calls"], r["results"]):
            args = c["arguments"]
            if c["name"] == "add":
                assert res == args["a"] + args["b"]
            else:
                assert c["name"] == "unit" and res == args["system"]
        if not r["calls"]:
            assert r["answer"] is None
        agent.reset()
    agent.close()


def test_tool_that_raises(cq4):
    @needle.tool
    def explode(city: str):
        "Always fails."
        raise ValueError("boom: " + city)

    agent = needle.Needle(weights=cq4, tools=[explode])
    r = agent.run("go", max_steps=2, strict=False)
    assert len(r["results"]) == 1 and r["stop"] in ("repeat", "unrequested")
    for c, res in zip(r["calls"], r["results"]):
        assert res == {"error": "boom: " + c["arguments"]["city"]}
    assert r["answer"] == r["results"][-1]
    agent.close()


def test_unknown_and_unimplemented_tools(cq4):
    raw = {"name": "lookup", "description": "Look something up.",
           "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                          "required": ["q"]}}
    agent = needle.Needle(weights=cq4, tools=[json.dumps(raw)])
    r = agent.run("find x", max_steps=3, strict=False)
    # as the official client: a declared tool without a function is an unknown tool, its
    # result an error sent back to the model like any other
    assert r["results"] == [{"error": "unknown tool: lookup"}]
    assert r["stop"] in ("repeat", "unrequested")
    assert r["answer"] == {"error": "unknown tool: lookup"}
    assert agent._execute({"name": "nope", "arguments": {}}) == {"error": "unknown tool: nope"}
    agent.close()


def test_bad_tools_raise_engine_error(cq4):
    with pytest.raises(needle.NeedleError) as ei:
        needle.Needle(weights=cq4, tools=[{"name": "", "parameters": {"type": "object"}}])
    assert ei.value.status == -11 and "name" in ei.value.message
    with pytest.raises(needle.NeedleError) as ei:
        needle.Needle(weights=cq4, tools=[{"name": "t", "parameters": {"type": "frobnicate"}}])
    assert ei.value.status == -11 and ei.value.message
    fn, _ = make_weather()
    with pytest.raises(needle.NeedleError) as ei:
        needle.Needle(weights=cq4, tools=[fn, fn])
    assert ei.value.status == -11 and "duplicate" in ei.value.message
    with pytest.raises(needle.NeedleError) as ei:
        needle.Needle(weights=cq4, tools=["[{broken"])
    assert "malformed" in ei.value.message


def test_bad_weights(tmp_path, monkeypatch):
    fn, _ = make_weather()
    with pytest.raises(needle.NeedleError, match="not found"):
        needle.Needle(weights=str(tmp_path / "missing.cact"), tools=[fn])
    bad = tmp_path / "bad.cact"
    bad.write_bytes(b"not a model at all" * 10)
    with pytest.raises(needle.NeedleError) as ei:
        needle.Needle(weights=str(bad), tools=[fn])
    assert ei.value.status in (-2, -3) and ei.value.message
    monkeypatch.delenv("NEEDLE_MODEL", raising=False)
    import needle.agent as agent_mod
    monkeypatch.setattr(agent_mod.os.path, "exists",
                        lambda p, _e=os.path.exists: False if p.endswith("needle-demo.cact")
                        else _e(p))
    with pytest.raises(needle.NeedleError, match="NEEDLE_MODEL"):
        needle.Needle(tools=[fn])


def test_weights_from_env(cq4, monkeypatch):
    monkeypatch.setenv("NEEDLE_MODEL", cq4)
    fn, _ = make_weather()
    with needle.Needle(tools=[fn]) as agent:
        assert agent.weights == os.path.realpath(cq4)
        assert agent.complete("x")["success"]


def test_backends(cq4):
    fn, _ = make_weather()
    with pytest.raises(needle.NeedleError, match="known backends: cpu, cuda, metal"):
        needle.Needle(weights=cq4, tools=[fn], backend="tpu")
    with needle.Needle(weights=cq4, tools=[fn], backend="cpu") as a:
        assert a.backend == "cpu"
    with needle.Needle(weights=cq4, tools=[fn]) as a:
        assert a.backend == needle.default_backend()
    assert needle.__version__ == needle.library_version() == header_version()


def test_devices_from_engine():
    devs = needle.devices()
    assert devs and devs[0]["backend"] == "cpu" and devs[0]["name"]
    assert devs[0]["compute_units"] >= 1 and devs[0]["capability"]  # the CPU kernel level
    assert all(d["backend"] in needle.BACKENDS for d in devs)
    defaults = [d for d in devs if d["default"]]
    assert len(defaults) == 1 and defaults[0]["backend"] == needle.default_backend()


def _in_subprocess(code, **env):
    e = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=e, timeout=120)


def test_forced_backend_through_engine(cq4):
    # A backend forced by the environment goes through the engine's selection: one that
    # this libneedle lacks (or that has no device) is the engine's error, one it has is used.
    found = {d["backend"] for d in needle.devices()}
    code = ("import needle\ntry:\n    print(needle.default_backend())\n"
            "except needle.NeedleError as e:\n    print('ERR', e.status, e.message)\n")
    for name in ("cuda", "metal"):
        out = _in_subprocess(code, NEEDLE_BACKEND=name)
        assert out.returncode == 0, out.stderr
        if name in found:
            assert out.stdout.strip() == name
        else:
            assert out.stdout.startswith("ERR -12 ") and name in out.stdout
            fn, _ = make_weather()
            with pytest.raises(needle.NeedleError) as e:
                needle.Needle(weights=cq4, tools=[fn], backend=name)
            assert e.value.status == -12
    out = _in_subprocess(code, NEEDLE_BACKEND="cpu")
    assert out.stdout.strip() == "cpu"


def test_struct_layout_mismatch_refused():
    # A ctypes copy that drifted from needle.h must stop the load, not corrupt memory.
    code = ("import ctypes, needle\nfrom needle import _lib\n"
            "class Grown(ctypes.Structure):\n"
            "    _fields_ = _lib.SessionParams._fields_ + [('extra', ctypes.c_uint32)]\n"
            "_lib._STRUCTS['needle_session_params'] = Grown\n"
            "try:\n    _lib.lib()\nexcept needle.NeedleError as e:\n    print('ERR', e)\n")
    out = _in_subprocess(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ERR libneedle ") and "needle_session_params" in out.stdout
    assert "does not match" in out.stdout


def test_struct_sizes_match_library():
    L = needle._lib.lib()
    for name, cls in needle._lib._STRUCTS.items():
        assert L.needle_struct_size(name.encode()) == ctypes.sizeof(cls) > 0
    assert L.needle_struct_size(b"needle_no_such_struct") == 0


def test_extract(cq4):
    schema = {"name": "person", "description": "A person.",
              "parameters": {"type": "object", "properties": {
                  "name": {"type": "string"}, "age": {"type": "integer"}},
                  "required": ["name", "age"]}}
    # random weights: the values are noise, so not strict; force: exactly one call
    args = needle.extract("Ada is 36.", schema, weights=cq4, strict=False, force=True)
    assert set(args) >= {"name", "age"} and isinstance(args["age"], int)

    def invoice(number: str, paid: bool):
        "An invoice."
    args = needle.extract("invoice 12, paid", invoice, system="Be exact.", weights=cq4,
                          strict=False, force=True)
    assert isinstance(args["number"], str) and isinstance(args["paid"], bool)

    fn, _ = make_weather()
    with needle.Needle(weights=cq4, tools=[fn]) as agent:
        before = agent.complete("weather?")
        agent.reset()
        a2 = agent.extract("Ada is 36.", schema, strict=False, force=True)
        assert set(a2) >= {"name", "age"}
        # the agent's own conversation is untouched by extraction
        assert agent.complete("weather?")["function_calls"] == before["function_calls"]


def test_extract_pydantic(cq4):
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str
        age: int

    p = needle.extract("Ada is 36.", Person, weights=cq4, strict=False, force=True)
    assert isinstance(p, Person) and isinstance(p.age, int)


def test_pydantic_model_as_tool(cq4):
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        """A city."""
        name: str

    with needle.Needle(weights=cq4, tools=[City]) as agent:
        env = agent.complete("Lagos")
        assert env["function_calls"][0]["name"] == "City"


def test_interleaved_agents_different_models(cq4, cq2):
    fa, la = make_weather()

    @needle.tool
    def convert(amount: float, currency: str):
        "Convert money."
        return {"amount": amount, "currency": currency}

    a = needle.Needle(weights=cq4, tools=[fa])
    b = needle.Needle(weights=cq2, tools=[convert])
    solo_a = needle.Needle(weights=cq4, tools=[fa])
    solo_b = needle.Needle(weights=cq2, tools=[convert])
    ref_a = [solo_a.complete(q)["function_calls"] for q in ("q1", "q2")]
    ref_b = [solo_b.complete(q)["function_calls"] for q in ("q1", "q2")]
    got_a, got_b = [], []
    for q in ("q1", "q2"):
        got_a.append(a.complete(q)["function_calls"])
        got_b.append(b.complete(q)["function_calls"])
    assert got_a == ref_a and got_b == ref_b
    assert all(c[0]["name"] == "get_weather" for c in got_a)
    assert all(c[0]["name"] == "convert" for c in got_b)
    ra, rb = a.run("x", max_steps=2, strict=False), b.run("y", max_steps=2, strict=False)
    # (a follow-up round built from the first one's results may run too: random weights)
    assert ra["calls"] and all(c["name"] == "get_weather" for c in ra["calls"])
    assert rb["calls"] and all(c["name"] == "convert" for c in rb["calls"])
    for x in (a, b, solo_a, solo_b):
        x.close()


def test_threads_each_own_agent(cq4, cq2):
    fn, _ = make_weather()
    ref = {}
    for w in (cq4, cq2):
        with needle.Needle(weights=w, tools=[fn]) as ag:
            ref[w] = ag.run("weather in Accra?", max_steps=3)["calls"]
    errors, outs = [], []

    def worker(w):
        try:
            with needle.Needle(weights=w, tools=[fn]) as ag:
                for _ in range(3):
                    outs.append((w, ag.run("weather in Accra?", max_steps=3)["calls"]))
                    ag.reset()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=((cq4, cq2)[i % 2],)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert len(outs) == 18
    for w, calls in outs:
        assert calls == ref[w]  # greedy: identical to the single-threaded run


def test_model_cache_refcount(cq4):
    import needle.agent as agent_mod
    fn, _ = make_weather()
    path = (os.path.realpath(cq4), None, 0)  # keyed by file, requested backend, depth
    a = needle.Needle(weights=cq4, tools=[fn])
    b = needle.Needle(weights=cq4, tools=[fn])
    assert agent_mod._models[path].refs >= 2
    assert a._model is b._model
    a.close()
    b.close()
    assert path not in agent_mod._models
    c = needle.Needle(weights=cq4, tools=[fn])
    del c  # __del__ frees session and model
    assert path not in agent_mod._models


def test_del_after_failed_init(cq4):
    fn, _ = make_weather()
    try:
        needle.Needle(weights=cq4, tools=[fn], backend="tpu")
    except needle.NeedleError:
        pass
    import gc
    gc.collect()


def test_long_conversation_on_windowed_model(cq4):
    # tiny_cq4 has max_seq_len 128 and a sliding window: the session is created with
    # n_ctx = 1 << 20, so a conversation far longer than 128 positions keeps working.
    fn, log = make_weather()
    with needle.Needle(weights=cq4, tools=[fn]) as agent:
        assert agent._model.kv_window > 0
        env = agent.complete("weather please")
        for _ in range(25):
            assert env["success"] and env["type"] == "call"
            env = agent.complete(json.dumps([{"temp_c": 27}]), turn=needle.TURN_TOOL_RESULT)
        assert env["success"]


def _annotation_tools():
    import enum
    from dataclasses import dataclass
    from typing import Annotated, Dict, List, Optional, TypedDict, Union
    from needle import Field

    class Color(enum.Enum):
        RED = "red"
        GREEN = "green"

    @dataclass
    class Addr:
        street: str
        zip: Optional[str] = None

    class P(TypedDict):
        name: str

    def prims(a: str, b: int, c: float, d: bool): pass
    def arrays(a: List[str], b: list, c: List[List[int]]): pass
    def objects(a: dict, b: Dict[str, int]): pass
    def literals(a: Literal["x", "y"], b: Literal[1, 2], c: Literal["x", 1]): pass
    def enums(c: Color): pass
    def optionals(a: Optional[int] = None, b: str = "d"): pass
    def unions(a: Union[int, str]): pass
    def nested(a: Addr, p: P, l: List[Addr]): pass
    def fields(a: Annotated[str, Field("d", min_length=1, max_length=5)],
               b: Annotated[str, Field(enum=["a", "b"])],
               c: Annotated[str, Field(const="k")],
               d: Annotated[int, Field(ge=0, le=9, multiple_of=3)],
               e: Annotated[float, Field(gt=0, lt=2)],
               f: Annotated[str, Field(pattern="^[a-z]+$")],  # the engine rejects
               f2: Annotated[str, Field(format="date")],  # pattern + format together
               g: Annotated[List[int], Field(min_items=1, max_items=3, unique_items=True)],
               h: Annotated[int, Field(default=3)]): pass
    return [prims, arrays, objects, literals, enums, optionals, unions, nested, fields]


@pytest.mark.parametrize("fn", _annotation_tools(), ids=lambda f: f.__name__)
def test_engine_accepts_every_generated_schema(cq4, fn):
    schema = needle.tool(fn).__needle_tool__
    with needle.Needle(weights=cq4, tools=[fn]) as agent:
        env = agent.complete("fill it in", max_new_tokens=512)
        if env["success"]:
            (call,) = env["function_calls"]
            assert call["name"] == fn.__name__
            assert set(call["arguments"]) <= set(schema["parameters"]["properties"])
            assert set(schema["parameters"].get("required", [])) <= set(call["arguments"])
        else:
            assert env["error_code"] == "max_tokens"  # random weights may ramble
