"""Runs every ```python example of python/README.md on the shipped demo model, each in its
own interpreter, and compares its output with the ```text block that follows it, if any."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(os.path.dirname(HERE), "README.md")
DEMO = os.path.join(ROOT, "models", "needle-demo.cact")


def examples():
    """(source, expected output or None) of each ```python block, in order."""
    with open(README, encoding="utf-8") as f:
        blocks = re.findall(r"^```(\w*)\n(.*?)^```$", f.read(), re.M | re.S)
    out = []
    for i, (lang, body) in enumerate(blocks):
        if lang == "python":
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            out.append((body, nxt[1] if nxt and nxt[0] == "text" else None))
    return out


def test_readme_has_checked_examples():
    ex = examples()
    assert len(ex) >= 2 and ex[0][1] is not None  # the first one's output is written


@pytest.mark.skipif(not os.path.exists(DEMO), reason="no models/needle-demo.cact")
@pytest.mark.parametrize("index", range(len(examples())))
def test_readme_example(index, tmp_path):
    src, expected = examples()[index]
    script = tmp_path / f"example{index}.py"
    script.write_text(src, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    env.pop("NEEDLE_MODEL", None)  # the README's examples use the default (demo) model
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr
    if expected is not None:
        assert out.stdout == expected
