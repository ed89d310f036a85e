"""Picks the held-out cases of tests/integration/test_demo.c: lines of the test split that the
shipped model answers exactly through the engine, chosen to cover every kind of answer
(refusals, two calls, copied strings, converted numbers, enums and booleans).

    python train/pick_heldout.py --needle build/needle --weights models/needle-demo.cact \
        --data train/data/test.jsonl --out tests/data/demo_heldout.jsonl

The test proves the engine path end to end on queries the model gets right; how often
it gets them right is what `needle eval` and the floors in test_demo.c measure.
"""
import argparse
import json
import re
import subprocess


def kind(ex):
    calls = ex["answers"]
    if not calls:
        return "refusal"
    if len(calls) > 1:
        return "multi"
    args = calls[0]["arguments"]
    q = ex["query"].lower()
    if any(isinstance(v, str) and len(v) >= 4 and v.lower() in q and v.lower() not in
           ("true", "false") for v in args.values()):
        return "copied string"
    if any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in args.values()):
        return "number"
    return "enum/boolean"


QUOTA = {"refusal": 2, "multi": 3, "copied string": 4, "number": 2, "enum/boolean": 2}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--needle", default="build/needle")
    ap.add_argument("--weights", default="models/needle-demo.cact")
    ap.add_argument("--data", default="train/data/test.jsonl")
    ap.add_argument("--out", default="tests/data/demo_heldout.jsonl")
    ap.add_argument("--limit", type=int, default=300, help="examples of --data to try")
    a = ap.parse_args()
    run = subprocess.run([a.needle, "eval", "--weights", a.weights, "--verbose", "--limit",
                          str(a.limit), a.data], capture_output=True, text=True, check=True)
    # --verbose lists the examples it got wrong as "line N: query"
    wrong = {int(n) for n in re.findall(r"^line (\d+):", run.stdout + run.stderr, re.M)}
    with open(a.data, encoding="utf-8") as f:
        lines = f.read().splitlines()[:a.limit]
    picked, taken = [], {k: 0 for k in QUOTA}
    for n, line in enumerate(lines, 1):
        if n in wrong:
            continue
        k = kind(json.loads(line))
        if taken[k] < QUOTA[k]:
            taken[k] += 1
            picked.append(line)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(picked) + "\n")
    print(f"{len(lines) - len(wrong)}/{len(lines)} right; wrote {len(picked)} cases to "
          f"{a.out}: {taken}")


if __name__ == "__main__":
    main()
