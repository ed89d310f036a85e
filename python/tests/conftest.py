import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.environ.get("NEEDLE_TEST_FIXTURES", os.path.join(ROOT, "tests", "fixtures"))


@pytest.fixture(autouse=True)
def no_cached_models(monkeypatch, tmp_path_factory):
    """Hermetic default model: Needle() without weights must find the demo, whatever the
    machine running the tests has downloaded (~/.cache/huggingface, ~/.cache/cactus-needle)."""
    empty = tmp_path_factory.mktemp("no-models")
    for name in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "NEEDLE_MODEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(empty / "hub"))
    monkeypatch.setenv("HOME", str(empty))


FIXED_NOW = __import__("datetime").datetime(2026, 1, 5, 9, 0)  # a Monday


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch):
    """auto_date (on by default, as the official) writes the minute into the prompt: a fixed
    clock keeps every test's prompt, and so its answers, the same from run to run."""
    import needle.agent
    monkeypatch.setattr(needle.agent, "_now", lambda: FIXED_NOW)


@pytest.fixture
def cq4():
    return os.path.join(FIXTURES, "tiny_cq4.cact")


@pytest.fixture
def cq2():
    return os.path.join(FIXTURES, "tiny_cq2.cact")


def header_version():
    """The version written in include/needle.h (the one place it is written)."""
    import re
    with open(os.path.join(ROOT, "include", "needle.h"), encoding="utf-8") as f:
        text = f.read()
    return ".".join(re.search(rf"^#define NEEDLE_VERSION_{p} (\d+)$", text, re.M).group(1)
                    for p in ("MAJOR", "MINOR", "PATCH"))


class Scripted:
    """Replaces an agent's engine turns (Needle._engine, under complete() and run()): the
    replies in order (each a copy), and the turns it was sent."""

    def __init__(self, agent, replies):
        self.replies, self.sent = [dict(r) for r in replies], []
        agent._engine = self

    def __call__(self, text, turn=0, max_new_tokens=512, extract=False):
        self.sent.append((turn, text))
        return self.replies.pop(0)
