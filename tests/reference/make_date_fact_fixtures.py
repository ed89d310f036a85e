#!/usr/bin/env python3
"""tests/fixtures/date_fact.json: the system facts the official cactus-needle 3.2.8 client
sends with auto_date (needle._with_date_fact), for the cases below and several fixed
local times; test_prompt_template checks needle_system_with_date against them.

    python3 tests/reference/make_date_fact_fixtures.py [DIR]

DIR holds the unpacked 3.2.8 wheel (pip download cactus-needle==3.2.8 --no-deps, unzip);
without it the `needle` package of tests/reference/.venv3 (make_v3_fixtures.sh) or of
the running Python is used. The module imports nothing heavy; the script only replaces
the clock the function reads."""
import datetime
import importlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "date_fact.json")

SYSTEMS = [
    "", " ", "\t\n\r", "\u00a0", "\u3000 ", "\x1c\x1f", "\x85", "\u200b", "\u2028x",
    "x", "user: Ada", "You are a helpful assistant.",
    "date: 2020-01-01", "date:", "x date: y", "Date: tomorrow", "DATE: soon",
    "update: soon", "candidate: Bob", "Update: date", "1date: x", "_date: x", "-date: x",
    "\u00e4date: x", "\u00e9 date: x", "user: Ada; date: today",
    "today is 2021-02-03", "2021-2-3", "20210-02-03", "2021/02/03", "2021-02-3x",
    "\u0662\u0660\u0662\u0661-\u0660\u0662-\u0660\u0663",
    "\uff12\uff10\uff12\uff11-\uff10\uff12-\uff10\uff13",
    "\U0001D7CE\U0001D7CF\U0001D7D0\U0001D7D1-\U0001D7D2\U0001D7D3-\U0001D7D4\U0001D7D5",
    "\u00b2\u00b3\u00b9\u00bc-12-12",
    '{"city": "Lagos"}', '  {"a": 1}', "\u00a0{x", "{", "[1, 2]", "note: {x}", "}{",
]
TIMES = [
    (2026, 1, 5, 9, 7), (2026, 12, 6, 0, 0), (2024, 2, 29, 23, 59), (2000, 3, 1, 12, 30),
    (1900, 3, 1, 6, 5), (1000, 1, 1, 0, 0), (9999, 12, 31, 23, 59), (2027, 7, 4, 18, 45),
]


def load_official(directory):
    if directory:
        sys.path.insert(0, os.path.abspath(directory))
    else:
        venv = os.path.join(HERE, ".venv3", "lib")
        if os.path.isdir(venv):
            for name in os.listdir(venv):
                sys.path.insert(0, os.path.join(venv, name, "site-packages"))
    needle = importlib.import_module("needle")
    if directory:
        infos = [d for d in os.listdir(directory) if d.endswith(".dist-info")]
        version = infos[0].split("-")[1].replace(".dist", "") if infos else "?"
    else:
        import importlib.metadata as md
        version = md.version("cactus-needle")
    if version != "3.2.8" or not hasattr(needle, "_with_date_fact"):
        sys.exit(f"need cactus-needle 3.2.8 (found {version} at {needle.__file__})")
    return needle


def main():
    needle = load_official(sys.argv[1] if len(sys.argv) > 1 else None)
    cases = []
    for when in TIMES:
        fixed = datetime.datetime(*when)

        class FixedClock(datetime.datetime):
            @classmethod
            def now(cls, tz=None):
                return fixed

        needle.datetime.datetime = FixedClock
        try:
            for system in SYSTEMS:
                cases.append({"system": system, "time": list(when),
                              "expected": needle._with_date_fact(system)})
        finally:
            needle.datetime.datetime = datetime.datetime
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"source": "cactus-needle 3.2.8 needle._with_date_fact",
                   "python": sys.version.split()[0], "cases": cases}, f, ensure_ascii=True,
                  indent=0)
        f.write("\n")
    print(f"{len(cases)} cases -> {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
