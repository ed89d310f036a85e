"""Checks train/render3.py, the Needle 3 chat template of training examples.

* Always: the committed cases (tests/data/render3_cases.jsonl: examples with the prompt
  and target texts the official cactus-needle 3.2.8 `finetune.render_example` gave for
  them) render to the same bytes.
* encode3.batch_lines pads and cuts as `needle grad --batch` wants.
* With the reference venv (tests/reference/.venv3, made by tests/reference/*_v3*.sh):
  50 third-generation composed examples plus the template's optional parts (system text,
  reasoning, tools and answers given as JSON text, `function_calls`) render exactly as
  the official function renders them right now. Reported as skipped without the venv.

    python3 tests/parity/test_render3.py [--write-fixture]
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "train"))
import compose3 as C3  # noqa: E402
import encode3 as E  # noqa: E402
import render3 as R  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "data", "render3_cases.jsonl")
VENV_PY = os.path.join(ROOT, "tests", "reference", ".venv3", "bin", "python")
OFFICIAL = os.path.join(ROOT, "tests", "reference", "render3_official.py")


def cases():
    """50 composed examples and the optional parts of the template."""
    rows = C3.make_split3(46, 35)
    base = rows[0]
    rows.append(dict(base, system="date: 2026-12-06\nuser: Zoë  ", reasoning=" \n"))
    rows.append(dict(base, reasoning="the user wants one call.\nżółw ✓"))
    rows.append({"query": base["query"], "tools": json.dumps(base["tools"], indent=1),
                 "answers": '[{"name": "x", "arguments": {}}]'})
    rows.append({"query": "hej 😊", "tools": base["tools"], "function_calls": base["answers"],
                 "system": "   "})
    return rows


def official(rows):
    out = subprocess.run([VENV_PY, OFFICIAL], check=True, capture_output=True,
                         input="".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                         text=True, encoding="utf-8",
                         env=dict(os.environ, JAX_PLATFORMS="cpu", NEEDLE_TELEMETRY="0",
                                  DO_NOT_TRACK="1"))
    return [json.loads(line) for line in out.stdout.splitlines()]


def main():
    failures = 0
    if "--write-fixture" in sys.argv:
        rows = cases()
        picked = [rows[i] for i in (0, 1, 2, 3, 5, 46, 47, 48, 49)]
        with open(FIXTURE, "w", encoding="utf-8") as f:
            for ex, want in zip(picked, official(picked)):
                f.write(json.dumps({"example": ex, **want}, ensure_ascii=False) + "\n")
        print("wrote", FIXTURE)
        return 0
    with open(FIXTURE, encoding="utf-8") as f:
        fixed = [json.loads(line) for line in f]
    for i, case in enumerate(fixed):
        got = R.render(case["example"])
        if got != (case["prompt"], case["target"]):
            failures += 1
            print(f"FAIL: committed case {i + 1} renders differently:\n{got!r}\n"
                  f"{(case['prompt'], case['target'])!r}")
    # the loss mask: BOS and the prompt are context, the target and EOS are learned
    ids, mask = R.encode(lambda s: [ord(c) for c in s], fixed[0]["example"])
    p, t = len(fixed[0]["prompt"]), len(fixed[0]["target"])
    if (ids[0], ids[-1], len(ids), sum(mask), mask[p], mask[p + 1]) != (
            R.BOS_ID, R.EOS_ID, p + t + 2, t + 1, 0, 1):
        failures += 1
        print("FAIL: encode's ids or loss mask")
    # encode3's batches (the `needle grad --batch` format): padded to the longest, cut at
    # max_len, pads outside the loss
    fake = lambda s: [ord(c) % 4000 + 20 for c in s]  # noqa: E731
    exs = [c["example"] for c in fixed[:3]]
    lines = [json.loads(x) for x in E.batch_lines(exs, fake, 10_000)]
    lens = [len(R.encode(fake, ex)[0]) for ex in exs]
    if not (all(len(x["ids"]) == len(x["mask"]) == max(lens) for x in lines)
            and all(x["ids"][n:] == [R.PAD_ID] * (max(lens) - n) and not any(x["mask"][n:])
                    for x, n in zip(lines, lens))
            and all(len(json.loads(x)["ids"]) == 50 for x in E.batch_lines(exs, fake, 50))):
        failures += 1
        print("FAIL: encode3 batch padding")
    checked = len(fixed)
    if os.path.exists(VENV_PY):
        rows = cases()
        for i, (ex, want) in enumerate(zip(rows, official(rows))):
            if R.render(ex) != (want["prompt"], want["target"]):
                failures += 1
                print(f"FAIL: example {i + 1} differs from the official rendering")
        checked += len(rows)
        print(f"test_render3: compared {len(rows)} examples with the official renderer")
    else:
        print("test_render3: SKIPPED the official comparison (no tests/reference/.venv3)")
    print("test_render3:", "ok" if not failures else f"{failures} failure(s)",
          f"({checked} renderings)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
