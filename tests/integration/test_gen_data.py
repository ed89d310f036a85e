"""Checks the demo model's data generator (train/gen_data.py); standard library only.

* The held-out split is frozen: regenerating it gives the committed train/data/test.jsonl
  byte for byte, whatever the training split's recipe became. The demo model's eval
  figures, test_demo's floors and its end-to-end cases are all measured on that file.
* No training query is a rendering of a held-out off-topic template (the composed chatter
  of the training split is filtered against them), so refusals are scored on unseen
  phrasings.
* Every example is consistent with the tools it declares: calls name declared tools, use
  only their parameters and give every required one; refusal examples call nothing.
* The second generation (train/compose.py): the held-out sets test2 and unseen share no
  query, phrasing part, value-pool entry or tool combination with the training split, and
  no training example declares an unseen tool; spoken forms map to canonical values.
* The third generation (train/compose3.py): the same disjointness from test2/unseen, no
  synthetic tool named like an unseen or official-environment tool, every new kind of
  example present (synthetic tools, near misses, negations), determinism by seed.

    python3 tests/integration/test_gen_data.py
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "train"))
import gen_data as G  # noqa: E402
import compose as C  # noqa: E402
import compose3 as C3  # noqa: E402

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


def string_values(rows):
    out = set()
    for ex in rows:
        for call in ex["answers"]:
            out.update(v for v in call["arguments"].values() if isinstance(v, str))
    return out


def words_of(rows):
    out = set()
    for ex in rows:
        out.update(ex["query"].lower().split())
    return out


def check_second_generation(train, test2, unseen):
    for split, rows in (("test2", test2), ("unseen", unseen)):
        for i, ex in enumerate(rows):
            why = consistent(ex)
            check(why is None, f"{split} line {i + 1}: {why}")
    queries = {ex["query"] for ex in train}
    same = [ex["query"] for ex in test2 + unseen if ex["query"] in queries]
    check(not same, f"held-out queries also in training: {same[:3]}")

    # value pools: no string value of a held-out answer is a training answer's value,
    # except the closed vocabularies every split shares (enums, units, languages, days)
    shared = set(G.ROOM_TYPES + G.RIDE_TYPES + G.LANGUAGES + G.WEEKDAYS + G.CURRENCIES
                 + [u for pair in G.UNITS for u in pair]
                 + ["on", "off", "celsius", "fahrenheit", "driving", "walking", "transit",
                    "cycling", "running", "swimming", "yoga", "today", "tomorrow", "tonight",
                    "this weekend"])
    train_values = string_values(train)
    leaked = sorted(v for v in string_values(test2) - shared
                    if v in train_values and not v.startswith("next "))
    check(not leaked, f"test2 values also in training answers: {leaked[:5]}")
    check(len(string_values(test2) & {v for v in C.INTL_FIRST + C.INTL_CITIES}) > 0 or any(
        any(ord(ch) > 127 for ch in v) for v in string_values(test2)),
        "test2 has values in other scripts")

    # phrasing parts: no training query opens with a held-out opener or politeness
    # phrase (alone or after an opener) or ends with a held-out closer
    # (a made-up value may spell a part: "lights off in the ta" is a room named "ta")
    plain = [q for q in train if not any(x.lower() in C.protected(q["answers"])
                                          for x in C.CLOSERS + C.OPENERS)]
    heads = [q["query"].lower() for q in plain]
    tails = [q["query"].lower().rstrip(" .!?:)") for q in plain]
    openers = [o.lower() for o in C.OPENERS]
    for pool, where in ((C.OPENERS, "head"), (C.POLITE_BEFORE, "head"), (C.CLOSERS, "tail")):
        held = [x.lower() for x in pool if G.is_heldout(x)]
        check(held, "every part list has a held-out member")
        train_side = [y.lower() for y in pool if not G.is_heldout(y)]
        for x in held:
            if where == "head":
                starts = [x + " "] + [o + " " + x + " " for o in openers]
                hits = [q for q in heads if any(q.startswith(s) for s in starts)
                        and not any(q.startswith(y + " ") or any(q.startswith(o + " " + y + " ")
                                    for o in openers) for y in train_side if x in y)]
            else:
                hits = [q for q in tails if (q.endswith(" " + x) or q.endswith("," + x))
                        and not any(q.endswith(" " + y) for y in train_side if x in y)]
            check(not hits, f"held-out part {x!r} in training: {hits[:2]}")

    # tool combinations: a multi-call set of test2 is never the set of a training example
    combos = lambda rows: {"+".join(sorted(c["name"] for c in ex["answers"]))
                           for ex in rows if len(ex["answers"]) > 1}
    check(combos(test2) and not combos(test2) & combos(train),
          f"tool combinations shared: {sorted(combos(test2) & combos(train))[:3]}")
    check(sum(len(ex["answers"]) == 3 for ex in train) > 0, "three-call requests in training")

    # unseen tools: declared in every unseen request's answer, never in training
    new = set(C.UNSEEN_TOOLS)
    in_train = {t["name"] for ex in train for t in ex["tools"]} & new
    check(not in_train, f"unseen tools declared in training: {sorted(in_train)}")
    check(all(c["name"] in new for ex in unseen for c in ex["answers"]),
          "unseen requests call only unseen tools")

    # spoken forms: the query says it one way, the answer holds the canonical value
    check(C.words(45) == "forty-five" and C.words(301) == "three hundred and one", "words")
    check("an hour and a half" in C.duration_forms(90), "90 minutes as an hour and a half")
    check("half past 7 in the evening" in C.clock_forms(7, 30, "pm"), "half past 7 pm")
    check("19:30" in C.clock_forms(7, 30, "pm"), "19:30")
    said = C.Said("7:30 pm", "19:30")
    check("at {t}".format(t=said) == "at 19:30" and json.dumps(C.plain(said)) == '"7:30 pm"',
          "Said: spoken in the query, canonical in the answer")
    check(json.dumps(C.plain({"n": C.SaidInt(90, "ninety")})) == '{"n": 90}', "SaidInt")
    timers = [c["arguments"]["minutes"] for ex in train for c in ex["answers"]
              if c["name"] == "set_timer"]
    check(timers and all(isinstance(m, int) for m in timers), "timer minutes are integers")


def check_third_generation(test2, unseen):
    train = C3.make_split3(6000, 7)
    check(C3.make_split3(300, 11) == C3.make_split3(300, 11), "compose3: same seed, same data")
    check(C3.make_split3(300, 11) != C3.make_split3(300, 12), "compose3: the seed matters")
    boosted = C3.make_split3(2000, 11, 0.15)
    share = [sum(not ex["answers"] for ex in rows) / len(rows)
             for rows in (C3.make_split3(2000, 11), boosted)]
    check(share[1] > share[0] + 0.08, f"compose3: --refusal-boost raises refusals ({share})")
    unrelated = C3.make_split3(2000, 11, 0.0, 0.10)
    # 140 such refusals of 2,000 without --unrelated (seed 11), 315 with 0.10
    among_demo = [ex for ex in unrelated if not ex["answers"]
                  and all(t["name"] in C3.UNRELATED_DEMO for t in ex["tools"])]
    check(len(among_demo) > 250, f"compose3: --unrelated adds refusals among demo tools ({len(among_demo)})")
    for i, ex in enumerate(unrelated):
        why = consistent(ex)
        check(why is None, f"unrelated train3 line {i + 1}: {why}")
    for i, ex in enumerate(boosted):
        why = consistent(ex)
        check(why is None, f"boosted train3 line {i + 1}: {why}")
    for i, ex in enumerate(train):
        why = consistent(ex)
        check(why is None, f"train3 line {i + 1}: {why}")
    queries = {ex["query"] for ex in train}
    same = [ex["query"] for ex in test2 + unseen if ex["query"] in queries]
    check(not same, f"held-out queries also in train3: {same[:3]}")
    shared = set(G.ROOM_TYPES + G.RIDE_TYPES + G.LANGUAGES + G.WEEKDAYS + G.CURRENCIES
                 + [u for pair in G.UNITS for u in pair]
                 + ["on", "off", "celsius", "fahrenheit", "driving", "walking", "transit",
                    "cycling", "running", "swimming", "yoga", "today", "tomorrow", "tonight",
                    "this weekend"])
    train_values = string_values(train)
    leaked = sorted(v for v in string_values(test2) - shared
                    if v in train_values and not v.startswith("next "))
    check(not leaked, f"test2 values also in train3 answers: {leaked[:5]}")
    combos = lambda rows: {"+".join(sorted(c["name"] for c in ex["answers"]))
                           for ex in rows if len(ex["answers"]) > 1}
    check(not combos(test2) & combos(train),
          f"train3 shares tool combinations with test2: {sorted(combos(test2) & combos(train))[:3]}")

    # tools: the unseen ones never declared; official-environment names only as the
    # demo's own tools with the demo's schema
    declared = [t for ex in train for t in ex["tools"]]
    check(not {t["name"] for t in declared} & set(C.UNSEEN_TOOLS),
          "train3 declares an unseen tool")
    check(not any(any(u in t["name"] for u in C3.UNSEEN_OBJECTS) for t in declared
                  if t["name"] not in G.TOOLS), "a synthetic tool acts on an unseen tool's object")
    official = [t for t in declared if t["name"] in C3.OFFICIAL_ENV_TOOLS]
    check(all(t == G.TOOLS.get(t["name"]) for t in official),
          "an official environment's tool name on a synthetic schema")
    check(all(len({t["name"] for t in ex["tools"]}) == len(ex["tools"]) for ex in train),
          "an example of train3 declares two tools of one name")
    synthetic = {t["name"] for t in declared if t["name"] not in G.TOOLS}
    check(len(synthetic) > 1000, f"only {len(synthetic)} synthetic tools")
    called = [c["name"] for ex in train for c in ex["answers"]]
    share = sum(n in synthetic for n in called) / len(called)
    check(0.2 < share < 0.6, f"share of calls to synthetic tools {share:.2f}")

    # the new kinds of examples: a negated request with its tool declared and nothing
    # called; "don't A, B instead" calling B only; near misses both ways; empty requests
    neg = [ex for ex in train if not ex["answers"] and "don't " in ex["query"].lower()]
    check(len(neg) > 100, f"negated refusals: {len(neg)}")
    instead = [ex for ex in train if len(ex["answers"]) == 1 and "don't " in ex["query"].lower()]
    check(len(instead) > 100, f"'don't A, B' requests: {len(instead)}")
    held = [e for e in C3.EMPTY if G.is_heldout(e)]
    said = {ex["query"].lower().strip(" .!?:)") for ex in train}
    check(held and not [e for e in held if e in said], "held-out empty requests in train3")
    held = [w.split("{")[0] for w in C3.NEGATED + C3.WRAPPERS if G.is_heldout(w)]
    bare = [ex["query"].lower() for ex in train if not any(
        x.lower() in C.protected(ex["answers"]) for x in C.OPENERS + C.POLITE_BEFORE)]
    check(not [q for q in bare if any(h and q.startswith(h.lower()) for h in held)
               and not any(q.startswith(w.split("{")[0].lower())
                           for w in C3.NEGATED + C3.WRAPPERS if not G.is_heldout(w)
                           and w.split("{")[0])],
          "held-out wrappers or negations open train3 queries")
    check(any("cancel nothing" in ex["query"].lower() and not ex["answers"] for ex in train),
          "'cancel nothing' is a refusal")
    near = [ex for ex in train if len(ex["tools"]) > 1 and ex["answers"]
            and len({t["name"].split("_", 1)[-1] for t in ex["tools"]}) == 1
            and ex["tools"][0]["name"] not in G.TOOLS]
    check(len(near) > 50, f"near misses with the right tool declared: {len(near)}")
    check(sum(not ex["answers"] and all(t["name"] in synthetic for t in ex["tools"])
              for ex in train) > 100, "near misses with the right tool absent")
    # value forms: a date said as an ordinal, its canonical form in the answer
    check("the 5th of March" in C3.date_forms("March 5"), "date forms")
    nonascii = sum(any(ord(ch) > 127 for ch in json.dumps(ex["answers"], ensure_ascii=False))
                   for ex in train) / len(train)
    check(nonascii > 0.12, f"share of answers with non-ASCII values {nonascii:.2f}")


def check_unseen_train(unseen):
    """gen_data.py --unseen-train (the README's fine-tuning example): answers call only the
    six unseen tools, examples are consistent with their tools, and none of the held-out
    unseen.jsonl's queries, templates or item/dish/category values is used."""
    rows = C.make_unseen_train(400, 11, [ex["query"] for ex in unseen])
    check(len(rows) == 400, "unseen_train size")
    held_queries = {ex["query"] for ex in unseen}
    six = set(C.UNSEEN_TOOLS)
    for i, ex in enumerate(rows):
        check(ex["query"] not in held_queries, f"unseen_train line {i + 1} is a held-out query")
        check(all(c["name"] in six for c in ex["answers"]), f"unseen_train line {i + 1}: a call "
              "outside the six tools")
        why = consistent(ex)
        check(why is None, f"unseen_train line {i + 1}: {why}")
    check(sum(not ex["answers"] for ex in rows) > 20, "unseen_train has refusals")
    # the held-out set's string values of the free-text slots never appear in training
    slots = ("item", "dish", "category")
    held = {str(c["arguments"][k]) for ex in unseen for c in ex["answers"] for k in slots
            if k in c["arguments"]}
    mine = {str(c["arguments"][k]) for ex in rows for c in ex["answers"] for k in slots
            if k in c["arguments"]}
    check(not (held & mine), f"unseen_train shares held-out values: {sorted(held & mine)[:5]}")
    # the refusal knobs (finetune_example.sh's REFUSALS, NEAR_MISS, CHATTER): the share
    # asked for, refusals that declare other new tools, chatter with new tools declared
    knob = C.make_unseen_train(600, 11, list(held_queries), refusals=0.33,
                               near_miss_share=0.4, chatter_share=0.2)
    refused = [ex for ex in knob if not ex["answers"]]
    check(0.27 < len(refused) / len(knob) < 0.39, f"refusal share {len(refused) / len(knob):.2f}")
    for i, ex in enumerate(knob):
        check(ex["query"] not in held_queries, f"knob line {i + 1} is a held-out query")
        check(consistent(ex) is None, f"knob line {i + 1}: {consistent(ex)}")
    with_new = [ex for ex in refused if any(t["name"] in six for t in ex["tools"])]
    check(len(with_new) > 0.4 * len(refused), "refusals with new tools declared")
    check(sum(not any(t["name"] in six for t in ex["tools"]) for ex in refused) > 30,
          "refusals with the requested tool absent and only known tools declared")
    check(C.make_unseen_train(50, 3, (), refusals=0.33, near_miss_share=0.4, chatter_share=0.2)
          == C.make_unseen_train(50, 3, (), refusals=0.33, near_miss_share=0.4,
                                 chatter_share=0.2), "the knobs' data is deterministic")


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
        for name in ("test2", "unseen"):
            with open(os.path.join(out, name + ".jsonl"), "rb") as f:
                fresh = f.read()
            with open(os.path.join(ROOT, "train", "data", name + ".jsonl"), "rb") as f:
                check(fresh == f.read(), f"the regenerated {name} split differs from the "
                      f"committed train/data/{name}.jsonl")
        test2 = [json.loads(line) for line in open(os.path.join(out, "test2.jsonl"))]
        unseen = [json.loads(line) for line in open(os.path.join(out, "unseen.jsonl"))]

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

    check_second_generation(train, test2, unseen)
    check_third_generation(test2, unseen)
    check_unseen_train(unseen)

    print("test_gen_data:", "ok" if failures == 0 else f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
