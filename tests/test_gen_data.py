"""Checks the demo model's data generator (train/gen_data.py); standard library only.

* The held-out split is frozen: regenerating it gives the committed train/data/test.jsonl
  byte for byte, whatever the training split's recipe became. The demo model's eval
  figures, test_demo's floors and its end-to-end cases are all measured on that file.
* No training query is a rendering of a held-out off-topic template (the composed chatter
  of the training split is filtered against them), so refusals are scored on unseen
  phrasings.
* Every example is consistent with the tools it declares: calls name declared tools, use
  only their parameters and give every required one; refusal examples call nothing.

    python3 tests/test_gen_data.py
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "train"))
import gen_data as G  # noqa: E402

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)


def strip_finish(q):
    """Undo `finish`: its capitalisation, full stop, " please" and lead-ins."""
    q = q.rstrip(".")
    if q.endswith(" please"):
        q = q[:-len(" please")]
    for lead in G.LEAD_INS:
        if q.lower().startswith(lead):
            q = q[len(lead):]
    return q


def consistent(ex):
    declared = {t["name"]: t for t in ex["tools"]}
    for call in ex["answers"]:
        tool = declared.get(call["name"])
        if tool is None:
            return f"calls undeclared {call['name']}"
        props = tool["parameters"]["properties"]
        extra = set(call["arguments"]) - set(props)
        if extra:
            return f"{call['name']}: unknown arguments {sorted(extra)}"
        missing = set(tool["parameters"].get("required", [])) - set(call["arguments"])
        if missing:
            return f"{call['name']}: missing required {sorted(missing)}"
    return None


def main():
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, os.path.join(ROOT, "train", "gen_data.py"),
                        "--out", out, "--train", "4000", "--test", "600"],
                       check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "test.jsonl"), "rb") as f:
            fresh = f.read()
        with open(os.path.join(ROOT, "train", "data", "test.jsonl"), "rb") as f:
            committed = f.read()
        check(fresh == committed, "the regenerated held-out split differs from "
              "train/data/test.jsonl (a training-only change altered the test draws)")
        train = [json.loads(line) for line in open(os.path.join(out, "train.jsonl"))]
        test = [json.loads(line) for line in committed.decode("utf-8").splitlines()]

    check(len(train) == 4000 and len(test) == 600, "split sizes")
    for split, rows in (("train", train), ("test", test)):
        for i, ex in enumerate(rows):
            why = consistent(ex)
            check(why is None, f"{split} line {i + 1}: {why}")

    heldout = [t for t in G.OFF_TOPIC if G.is_heldout(t)]
    check(len(heldout) > 0, "some off-topic templates are held out")
    patterns = [G._template_regex(t) for t in heldout]
    leaks = [ex["query"] for ex in train
             if not ex["answers"] and any(p.match(strip_finish(ex["query"])) for p in patterns)]
    check(not leaks, f"training queries render held-out off-topic templates: {leaks[:3]}")
    # the filter itself: a rendering of a held-out template is caught, chatter is not
    sample = heldout[0].format(c="Peru", a="owls", f="soup", x=3, y=4)
    check(G._leaks_heldout(sample), f"_leaks_heldout misses {sample!r}")
    check(not G._leaks_heldout("tell me about volcanoes"), "_leaks_heldout flags chatter")

    # the training split's refusal share is the recipe's 26%, the test split's 16-24%
    share = sum(not ex["answers"] for ex in train) / len(train)
    check(0.22 < share < 0.30, f"training refusal share {share:.3f}")
    share = sum(not ex["answers"] for ex in test) / len(test)
    check(0.12 < share < 0.24, f"test refusal share {share:.3f}")

    print("test_gen_data:", "ok" if failures == 0 else f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
