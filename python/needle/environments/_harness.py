"""The acceptance harness of `needle.environments` (the official package's contract).

agent_for(module): one shared Needle per environment module, built from its TOOLS and
SYSTEM (the default weights, as `needle.Needle()` picks them).

run_tests(module, min_confidence=0.0, verbose=True): every case of module.TEST_CASES on a
reset agent. A reply counts as no call when its engine validation flags it (an ungrounded
argument or a negated request, see python/README.md "Validation") or when its confidence
is under min_confidence. The calls must equal the case's, in any order, strings compared
case-insensitively and whole floats as ints. Prints the failures (verbose) and a summary;
True when at least 90% pass and no critical case fails.
"""
import json

import needle

_agents = {}


def agent_for(module):
    name = module.__name__
    if name not in _agents:
        _agents[name] = needle.Needle(tools=module.TOOLS, system=module.SYSTEM)
    return _agents[name]


def _normalized(value):
    if isinstance(value, str):
        return value.casefold()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items()}
    return value


def _call_keys(calls):
    return sorted(json.dumps(_normalized(c), sort_keys=True) for c in calls)


def acted_calls(response, min_confidence=0.0):
    """The calls of a reply that would be acted on: none when validation flags it or the
    confidence is under the gate."""
    calls = response.get("function_calls") or []
    validation = response.get("validation") or {}
    if calls and (validation.get("ungrounded") or validation.get("negation")):
        return []
    confidence = response.get("confidence")
    if calls and (confidence if confidence is not None else 0.0) < min_confidence:
        return []
    return calls


def run_tests(module, min_confidence=0.0, verbose=True):
    agent = agent_for(module)
    failed, critical = [], []
    for case in module.TEST_CASES:
        agent.reset()
        got = acted_calls(agent.complete(case["query"]), min_confidence)
        want = case["calls"]
        if _call_keys(got) == _call_keys(want):
            continue
        failed.append(case)
        if case.get("critical"):
            critical.append(case)
        if verbose:
            print(f"FAIL [{case['category']}] {case['query']}")
            print(f"  want {json.dumps(want)}")
            print(f"  got  {json.dumps(got)}")
    total = len(module.TEST_CASES)
    passed = total - len(failed)
    print(f"{passed}/{total} passed, {len(critical)} critical failures "
          f"(confidence gate {min_confidence})")
    return passed >= round(0.9 * total) and not critical
