#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from the
existing test cases: the value tables of tests/unit/test_grammar.c (schema + values that must
be accepted), the held-out demo examples (tools, query, answers) and the json_canon cases.
Rerun after changing those tests; files are named by the SHA-1 of their content, as
libFuzzer names the inputs it adds."""
import hashlib
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")
LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


def c_string(body):
    """Bytes of a C string literal body (\\xHH, \\", \\\\, \\n ... escapes)."""
    return body.encode("latin-1").decode("unicode_escape").encode("latin-1")


def value_cases():
    """(schema, [accepted values]) from the {"schema", {values...}} rows of test_grammar.c."""
    src = open(os.path.join(ROOT, "tests", "test_grammar.c"), encoding="utf-8").read()
    rows = []
    for line in src.splitlines():
        line = line.strip()
        if not line.startswith('{"{'):
            continue
        lits = [c_string(m.group(1)) for m in LITERAL.finditer(line)]
        if not lits:
            continue
        try:
            json.loads(lits[0])
        except ValueError:
            continue
        rows.append((lits[0], [v for v in lits[1:] if b"`" not in v]))
    return rows


def write(target, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def compact(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def main():
    heldout = [json.loads(l) for l in open(os.path.join(ROOT, "tests", "data", "demo_heldout.jsonl"), encoding="utf-8")]
    cases = value_cases()
    # schema: one-property tool + NUL + an accepted call; demo tools + NUL + their answers
    for schema, values in cases[::2]:  # every other row: a few dozen files
        tools = b'[{"name":"f","parameters":{"type":"object","properties":{"v":' + schema + b'},"required":["v"]}}]'
        call = b'[{"name":"f","arguments":{"v":' + values[0] + b'}}]' if values else b"["
        write("schema", tools + b"\0" + call)
    for ex in heldout:
        write("schema", json.dumps(ex["tools"]).encode() + b"\0" + compact(ex["answers"]))
    # uniqueItems on objects and arrays (the table rows spell these with macros)
    strings = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "required": ["a"]}
    numbers = {"type": "array", "items": {"type": "number"}}
    for item, value in ((strings, [{"a": "x"}, {"b": "y", "a": "x"}]), (numbers, [[1, 2], [2, 1], []]),
                        ({"type": "object", "properties": {"n": numbers}}, [{"n": [1]}, {}])):
        schema = {"type": "array", "uniqueItems": True, "items": item}
        tools = [{"name": "f", "parameters": {"type": "object", "properties": {"v": schema}, "required": ["v"]}}]
        write("schema", compact(tools) + b"\0" + compact([{"name": "f", "arguments": {"v": value}}]))
    # regex: two parameter bytes (minLength, maxLength span) + a pattern from the tables
    patterns = set()
    for schema, _ in cases:
        s = json.loads(schema)
        if isinstance(s, dict) and isinstance(s.get("pattern"), str):
            patterns.add(s["pattern"])
    patterns.update([r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[a-z]{2,}", r"\d{4}-\d{2}-\d{2}",
                     r"(?:[01]\d|2[0-3]):[0-5]\d", r"[^\s]+", r"\u00e9\x41\t.*?", r"a{2,5}|b{3,}|c?"])
    for i, p in enumerate(sorted(patterns)):
        write("regex", bytes([i % 8, (i * 5) % 16]) + p.encode("utf-8"))
    # json_canon: the recorded inputs
    lines = open(os.path.join(ROOT, "tests", "data", "json_canon_cases.jsonl"), encoding="utf-8").readlines()
    for line in lines[:40]:
        write("json_canon", json.loads(line)[0].encode("utf-8"))
    # chat: tools + NUL + query, and bare queries (fixed tools in the target)
    for ex in heldout:
        write("chat", json.dumps(ex["tools"]).encode() + b"\0" + ex["query"].encode("utf-8"))
        write("chat", ex["query"].encode("utf-8"))
    # validation: demo tools + NUL + their answers + NUL + the query (+ NUL + system facts),
    # and negation phrasings without calls
    for ex in heldout[:30]:
        write("validation", json.dumps(ex["tools"]).encode() + b"\0" + compact(ex["answers"]) +
              b"\0" + ex["query"].encode("utf-8") + b"\0date: 2026-12-06 Sun 10:12; user: Ada")
    for q in ("don't turn on the study lights", "do not, under any circumstances, close it",
              "it's not done yet, set a timer for 5 minutes", "never mind, stop the vacuum from x",
              "half an hour, 1,500 s, 9:15 p.m., twenty five, -3, 25%"):
        write("validation", b"[]\0[]\0" + q.encode("utf-8"))
    # export: selector byte (0 safetensors, 1 SentencePiece model, 2 config + NUL + bits map),
    # a width byte, then the input
    import struct
    def safetensors(tensors):
        header, data = {}, b""
        for name, dtype, shape, blob in tensors:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
            data += blob
        h = compact(header)
        return struct.pack("<Q", len(h)) + h + data
    write("export", b"\0\0" + safetensors([("stack/final_norm/scale", "F32", [4], struct.pack("<4f", 1, -2, 0.5, 3)),
                                             ("embedding/embedding", "F16", [2, 2], b"\0\x3c" * 4),
                                             ("stack/mhc_a_pre", "BF16", [3], b"\x80\x3f" * 3)]))
    write("export", b"\0\3" + safetensors([("__metadata__", "F32", [], b"")])[:8] + b'{"__metadata__":{"a":"b"}}')
    write("export", b"\1\0" + open(os.path.join(ROOT, "tests", "fixtures", "tiny_bpe512.model"), "rb").read())
    fixtures = os.path.join(ROOT, "tests", "fixtures", "export")
    manifest = json.load(open(os.path.join(fixtures, "manifest.json")))
    config = open(os.path.join(fixtures, "tiny.config.json"), "rb").read()
    for entry in manifest.values():
        write("export", b"\2\0" + config + b"\0" + entry["bits"].encode())
    write("export", b"\1\1" + open(os.path.join(ROOT, "tests", "fixtures", "tiny_bpe512.model"), "rb").read())
    for name in ("v3_a.config.json", "v3_b.config.json"):
        write("export", b"\4\0" + open(os.path.join(fixtures, name), "rb").read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
