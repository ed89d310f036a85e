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
    """Replaces an agent's complete(): the replies in order, and the turns it was sent."""

    def __init__(self, agent, replies):
        self.replies, self.sent = list(replies), []
        agent.complete = self

    def __call__(self, text, max_new_tokens=256, *, turn=0, extract=False):
        self.sent.append((turn, text))
        return self.replies.pop(0)
