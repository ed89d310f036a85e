"""Runs the official environment modules (from the pinned cactus-needle wheel, folder given
by NEEDLE_ENVIRONMENTS) unchanged on our package with the default model, through their own
run_tests() and our needle.environments._harness, and checks what the engine returns:
every response carries "validation" ({"ungrounded": [...], "negation": bool}), every call
is valid against its tool's schema (jsonschema, Draft 2020-12), and nothing raises. The
pass rate is printed, not asserted (the default demo model was not trained on these
tools). Also checks the validation rule against the suites' labels (negation exactly on
the negation cases, no expected call flagged). Exit status 1 on a failed check."""
import contextlib
import io
import json
import sys
import warnings

import jsonschema

from needle import environments

warnings.simplefilter("ignore")  # the un-reset and no-tools warnings are not the subject
NAMES = ("data_capture", "kitchen_appliance", "media_player", "productivity", "smart_home",
         "wearable")


def check_validation_labels(failures):
    """The engine's validation against the official suites' own labels: "negation" exactly on
    the cases of category "negation", and no expected (correct) call flagged ungrounded."""
    from needle.agent import validate_calls
    negated = flagged = 0
    for name in NAMES:
        module = getattr(environments, name)
        tools = [t._needle_tool for t in module.TOOLS]
        for case in module.TEST_CASES:
            v = validate_calls(tools, case["calls"], case["query"], module.SYSTEM)
            if v["negation"] != (case["category"] == "negation"):
                failures.append(f"{name}: negation {v['negation']} for [{case['category']}] "
                                f"{case['query']!r}")
            negated += v["negation"]
            if v["ungrounded"]:
                flagged += 1
                failures.append(f"{name}: the expected calls of {case['query']!r} flagged "
                                f"{v['ungrounded']}")
    print(f"validation on the suites' labels: {negated} negated (the negation cases), "
          f"{flagged} expected calls flagged")


def main():
    failures = []
    check_validation_labels(failures)
    total_passed = total_cases = 0
    positive_passed = positive_cases = 0  # cases whose expected answer has calls
    responses = 0
    for name in NAMES:
        module = getattr(environments, name)
        agent = environments._harness.agent_for(module)
        schemas = {t["name"]: t["parameters"] for t in agent.tools}
        seen = []
        engine_complete = agent.complete

        def recording(*args, _complete=engine_complete, _seen=seen, **kwargs):
            env = _complete(*args, **kwargs)
            _seen.append(env)
            return env

        agent.complete = recording
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                module.run_tests(verbose=True)
        except Exception as e:  # the check "no exception"
            failures.append(f"{name}: run_tests raised {type(e).__name__}: {e}")
            continue
        finally:
            agent.complete = engine_complete
        lines = out.getvalue().strip().splitlines()
        summary = lines[-1]
        passed, cases = (int(x) for x in summary.split()[0].split("/"))
        total_passed += passed
        total_cases += cases
        # run_tests prints "  want <calls>" under each failure: a positive failed when non-empty
        positives = sum(1 for case in module.TEST_CASES if case["calls"])
        failed_positives = sum(1 for line in lines
                               if line.startswith("  want ") and json.loads(line[7:]))
        positive_passed += positives - failed_positives
        positive_cases += positives
        if len(seen) != len(module.TEST_CASES):
            failures.append(f"{name}: {len(seen)} responses for {len(module.TEST_CASES)} cases")
        for env in seen:
            responses += 1
            v = env.get("validation")
            if not (isinstance(v, dict) and isinstance(v.get("ungrounded"), list)
                    and isinstance(v.get("negation"), bool)):
                failures.append(f"{name}: no validation in {json.dumps(env)[:200]}")
            for call in env.get("function_calls") or []:
                schema = schemas.get(call.get("name"))
                if schema is None:
                    failures.append(f"{name}: call of an undeclared tool {call}")
                    continue
                try:
                    jsonschema.Draft202012Validator(schema).validate(call.get("arguments"))
                except jsonschema.ValidationError as e:
                    failures.append(f"{name}: invalid call {call}: {e.message}")
        print(f"{name:18} {summary}; positive cases {positives - failed_positives}/{positives}")
    print(f"pass rate on the default model: {total_passed}/{total_cases} "
          f"({100.0 * total_passed / max(1, total_cases):.1f}%), positive cases {positive_passed}/"
          f"{positive_cases} ({100.0 * positive_passed / max(1, positive_cases):.1f}%), "
          f"{responses} responses checked")
    for f in failures:
        print("FAIL", f)
    return 1 if failures or not responses else 0


if __name__ == "__main__":
    sys.exit(main())
