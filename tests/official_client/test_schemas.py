"""Property test through the engine: hundreds of random tool schemas and queries, each run
as a real turn on a fixture model via our library's official ABI (ctypes, in process), and
every call checked with an independent validator (the `jsonschema` package): it parses,
uses only declared names, has no undeclared keys, and satisfies its schema. Random weights
make the values arbitrary, which is the point: only the grammar stands between the model
and invalid JSON."""
import ctypes
import json
import os
import random

import jsonschema

LIB = ctypes.CDLL(os.environ["NEEDLE_LIB_PATH"])
LIB.needle_load.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
LIB.needle_init.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
LIB.needle_complete.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
with open(os.environ["NEEDLE_TEST_WEIGHTS"], "rb") as f:
    BLOB = f.read()  # kept alive: needle_load does not copy
assert LIB.needle_load(BLOB, len(BLOB)) == 0

WORDS = ["city", "name", "count", "when", "tags", "unit", "level", "mode", "note", "size"]
FORMATS = ["date", "date-time", "time", "email", "uri", "uuid"]


def scalar(r, depth):
    kind = r.choice(["string", "string", "integer", "number", "boolean", "null", "enum",
                     "const", "anyOf", "array", "object", "format", "pattern"])
    if depth > 2 and kind in ("array", "object"):
        kind = "string"
    if kind == "string":
        s = {"type": "string"}
        lo = r.choice([None, 0, 1, 3])
        hi = r.choice([None, 8, 20]) if lo is None or lo <= 8 else None
        if lo is not None:
            s["minLength"] = lo
        if hi is not None:
            s["maxLength"] = hi
        return s
    if kind == "integer":
        s = {"type": "integer"}
        if r.random() < 0.6:
            s["minimum"] = r.randint(-50, 10)
        if r.random() < 0.6:
            s["maximum"] = r.randint(20, 500)
        if r.random() < 0.3:
            s["multipleOf"] = r.choice([2, 5, 10])
        if r.random() < 0.2:
            s["exclusiveMinimum"] = s.pop("minimum", -5)
        return s
    if kind == "number":
        s = {"type": "number"}
        if r.random() < 0.5:
            s["minimum"] = r.choice([-1.5, 0, 0.25])
        if r.random() < 0.5:
            s["maximum"] = r.choice([1, 99.5, 1000])
        return s
    if kind == "enum":
        return {"type": "string", "enum": r.sample(["red", "green", "blue", "off", "on", "é"], 3)}
    if kind == "const":
        return {"const": r.choice(["fixed", 7, True, None])}
    if kind == "anyOf":
        return {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                          {"type": "string", "maxLength": 5}, {"type": "null"}][: r.randint(2, 3)]}
    if kind == "format":
        return {"type": "string", "format": r.choice(FORMATS)}
    if kind == "pattern":
        return {"type": "string", "pattern": r.choice(["[a-z]{2,5}", "\\d{3}-\\d{4}",
                                                       "(yes|no)", "[A-Z][a-z]*"])}
    if kind == "array":
        s = {"type": "array", "items": scalar(r, depth + 1)}
        if r.random() < 0.5:
            s["minItems"] = r.randint(0, 2)
        s["maxItems"] = r.randint(s.get("minItems", 0) + 1, 4)
        if r.random() < 0.3 and s["items"].get("type") in ("integer", "string"):
            s["uniqueItems"] = True
            s["items"] = {"type": "integer", "minimum": 0, "maximum": 99}
        return s
    return obj(r, depth + 1)


def obj(r, depth):
    names = r.sample(WORDS, r.randint(1, 4))
    props = {n: scalar(r, depth) for n in names}
    s = {"type": "object", "properties": props}
    req = [n for n in names if r.random() < 0.5]
    if req:
        s["required"] = req
    return s


def tools_for(r):
    return [{"name": f"tool_{i}_{r.choice(WORDS)}", "description": "a test tool",
             "parameters": obj(r, 0)} for i in range(r.randint(1, 3))]


def strict(schema):
    """The grammar admits no undeclared keys: say so to the validator too."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if out.get("type") == "object":
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(x) for x in schema]
    return schema


def test_random_schemas_always_yield_valid_calls():
    r = random.Random(20261202)
    out = ctypes.create_string_buffer(1 << 16)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    n_calls = n_turns = 0
    for case in range(int(os.environ.get("NEEDLE_SCHEMA_CASES", "200"))):
        tools = tools_for(r)
        assert LIB.needle_init(b"", json.dumps(tools).encode(), None) == 0, tools
        query = r.choice(["do it", "weather in Paris tomorrow", "set level to 3 and mode on",
                          "¿qué tal?", "call the first tool twice", ""]).encode()
        assert LIB.needle_complete(query, 800, out, len(out)) == 0
        env = json.loads(out.value.decode())
        assert env["success"] is True, (tools, env)
        by_name = {t["name"]: t for t in tools}
        if len(tools) == 1:
            assert len(env["function_calls"]) == 1
        for call in env["function_calls"]:
            assert call["name"] in by_name, (tools, call)
            jsonschema.validate(call["arguments"], strict(by_name[call["name"]]["parameters"]),
                                format_checker=checker)
            n_calls += 1
        n_turns += 1
    assert n_turns >= 100 and n_calls >= n_turns // 2
