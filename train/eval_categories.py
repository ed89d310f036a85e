"""Scores a model on a held-out JSONL by category, through the engine (`needle eval -v`,
grammar-constrained greedy decoding): exact match of single-call, multi-call and refusal
examples, false refusals, and how many expected string values with non-ASCII characters
came out byte for byte. Categories come from each example's expected answers.

    python3 train/eval_categories.py --needle build/needle --weights M.cact DATA.jsonl...

Standard library only. (`needle eval` prints the overall table; this splits it.)
"""
import argparse
import json
import re
import subprocess
import sys


def mismatches(needle, weights, path):
    """{line number: predicted calls} of the examples that were not exact."""
    run = subprocess.run([needle, "eval", "-v", "--weights", weights, path],
                         capture_output=True, text=True, check=True)
    out, line = {}, None
    for text in run.stderr.splitlines():
        m = re.match(r"line (\d+): ", text)
        if m:
            line = int(m.group(1))
        elif text.strip().startswith("predicted:") and line is not None:
            try:
                out[line] = json.loads(text.split("predicted:", 1)[1])
            except json.JSONDecodeError:
                out[line] = None
            line = None
    return out, run.stdout


def non_ascii_values(calls):
    for i, c in enumerate(calls):
        for k, v in c["arguments"].items():
            if isinstance(v, str) and any(ord(ch) > 127 for ch in v):
                yield i, c["name"], k, v


def score(rows, wrong):
    cats = {"single": [0, 0], "multi-call": [0, 0], "refusal": [0, 0], "non-ASCII": [0, 0]}
    false_refusals = requests = 0
    values = [0, 0]
    for n, ex in enumerate(rows, 1):
        want = ex["answers"]
        got = wrong.get(n, want)
        ok = n not in wrong
        cat = "refusal" if not want else ("single" if len(want) == 1 else "multi-call")
        cats[cat][0] += ok
        cats[cat][1] += 1
        vals = list(non_ascii_values(want))
        if vals:
            cats["non-ASCII"][0] += ok
            cats["non-ASCII"][1] += 1
        if want:
            requests += 1
            false_refusals += got == []
        for i, name, k, v in vals:
            values[1] += 1
            values[0] += bool(got) and i < len(got) and isinstance(got[i], dict) and \
                got[i].get("name") == name and got[i].get("arguments", {}).get(k) == v
    return cats, false_refusals, requests, values


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--needle", default="build/needle")
    ap.add_argument("--weights", required=True)
    ap.add_argument("data", nargs="+")
    a = ap.parse_args()
    for path in a.data:
        rows = [json.loads(line) for line in open(path, encoding="utf-8")]
        wrong, table = mismatches(a.needle, a.weights, path)
        cats, fr, req, values = score(rows, wrong)
        total = len(rows) - len(wrong)
        print(f"## {path} ({a.weights})")
        print(f"| category | exact |\n|---|---|")
        print(f"| all | {100 * total / len(rows):.1f}% ({total}/{len(rows)}) |")
        for name, (ok, n) in cats.items():
            print(f"| {name} | {100 * ok / max(n, 1):.1f}% ({ok}/{n}) |")
        print(f"| false refusals (of requests) | {100 * fr / max(req, 1):.1f}% ({fr}/{req}) |")
        print(f"| non-ASCII values copied exactly | {100 * values[0] / max(values[1], 1):.1f}% "
              f"({values[0]}/{values[1]}) |")
        for text in table.splitlines():
            if text.startswith(("tool-name", "argument F1", "refusal accuracy", "well-formed")):
                print("    " + text)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
