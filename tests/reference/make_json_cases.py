"""Writes tests/data/json_canon_cases.jsonl: [input, python_output] pairs where
python_output = json.dumps(json.loads(input), separators=(",", ":"), ensure_ascii=False),
the serialization cactus-needle 2.0.15 uses for tools and answers in its prompt template.
Run with any Python 3: python3 tests/reference/make_json_cases.py"""
import json
import os
import random

cases = [
    '{"a": 1, "b": [1.0, 2.50, -0, -0.0, 1e2, 1E-7, 123456789012345678901234567890, 0.1, '
    '1e16, 1e15, 0.0001, 0.00001, 3.141592653589793, -2.5e-310, 1.7976931348623157e308]}',
    '[ "caf\\u00e9", "\\ud83d\\ude00", "tab\\there", "ctl\\u0001", "sl\\/ash", "quote\\"", '
    '"\U0001F600 raw", "\\u2028", "\\u007f" ]',
    '{"name":"get_weather","description":"Get weather","parameters":{"type":"object",'
    '"properties":{"city":{"type":"string"}},"required":["city"]}}',
    '  true ', 'null', '[]', '{}', '[[[]]]', '{"z":{"y":{"x":[false,null,true]}}}',
    '{\n  "pretty": [\n    1,\n    2\n  ]\n}',
]
rng = random.Random(1)
for _ in range(60):
    v = rng.choice([rng.uniform(-1e6, 1e6), rng.random() * 10 ** rng.randint(-30, 30),
                    float(rng.randint(-1000, 1000)), rng.random(), rng.random() * 1e-5])
    cases.append(json.dumps([v, -v, round(v, 3)]))
out = os.path.join(os.path.dirname(__file__), "..", "data", "json_canon_cases.jsonl")
with open(out, "w") as f:
    for c in cases:
        f.write(json.dumps([c, json.dumps(json.loads(c), separators=(",", ":"),
                                          ensure_ascii=False)]) + "\n")
