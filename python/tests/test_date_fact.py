"""auto_date's rule is the library's (needle_system_with_date), and it is the official
client's: every case of tests/fixtures/date_fact.json, made by cactus-needle 3.2.8's own
_with_date_fact (tests/reference/make_date_fact_fixtures.py), comes out the same through
needle.agent._with_date, lone surrogates passed through as the official leaves them."""
import datetime
import json
import os

import needle.agent
from conftest import FIXTURES


def test_official_cases(monkeypatch):
    with open(os.path.join(FIXTURES, "date_fact.json"), encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    assert len(cases) >= 300
    for case in cases:
        when = datetime.datetime(*case["time"])
        monkeypatch.setattr(needle.agent, "_now", lambda: when)
        assert needle.agent._with_date(case["system"]) == case["expected"], case


def test_surrogates_and_none(monkeypatch):
    monkeypatch.setattr(needle.agent, "_now", lambda: datetime.datetime(2026, 1, 1, 0, 0))
    assert needle.agent._with_date("\ud800") == "date: 2026-01-01 Thu 00:00; \ud800"
    assert needle.agent._with_date(None) == "date: 2026-01-01 Thu 00:00"
