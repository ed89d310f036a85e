"""Renders examples with the official 3.x fine-tuner's render_example (cactus-needle 3.2.8)
for tests/parity/test_render3.py: JSON lines of examples on stdin, JSON lines of
{"prompt", "target"} on stdout. Run with the reference venv's python (tests/reference/.venv3).
"""
import json
import sys

from needle.model import finetune as F

for line in sys.stdin:
    prompt, target = F.render_example(json.loads(line))
    sys.stdout.write(json.dumps({"prompt": prompt, "target": target}, ensure_ascii=False) + "\n")
