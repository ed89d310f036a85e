"""Checks train/init3.py, the from-scratch initial checkpoint of the Needle 3 default model,
end to end: the official 3.2.8 init written in the official checkpoint format (the
script itself reads it back with the official load_checkpoint), the same seed giving the
same bytes, `needle export --v3` turning it into a .cact at CQ4 with the committed
tokenizer (geometry and size as train/README.md states them), and `needle run` answering
a request with it (answers meaningless: the weights are random).

Needs the 3.2.8 reference venv (tests/reference/.venv3): exits 77 (skipped) without it.
About 2 minutes on 2 shared cores (two inits, mostly XLA compiles).

    python3 tests/integration/test_init3.py [BUILD_DIR]
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_PY = os.path.join(ROOT, "tests", "reference", ".venv3", "bin", "python")
INIT = os.path.join(ROOT, "train", "init3.py")
TOK = os.path.join(ROOT, "train", "data", "needle3-tok4096.model")


SAME = """
import sys, numpy as np
from safetensors import safe_open
a, b = (safe_open(p, "np") for p in sys.argv[1:3])
same = a.metadata() == b.metadata() and list(a.keys()) == list(b.keys()) and all(
    np.array_equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())
sys.exit(0 if same else 1)
"""


def main():
    if not os.path.exists(VENV_PY):
        print("test_init3: skipped (no tests/reference/.venv3)")
        return 77
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    needle = os.path.join(build, "needle")
    env = dict(os.environ, JAX_PLATFORMS="cpu", NEEDLE_TELEMETRY="0", DO_NOT_TRACK="1")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        for out in (a, b):
            subprocess.run([VENV_PY, INIT, "--out", out, "--seed", "3"], check=True, env=env,
                           stdout=subprocess.DEVNULL)
        # the same tensors and metadata (not the same bytes: the safetensors writer orders
        # the metadata keys of its header differently from one process to the next)
        same = subprocess.run([VENV_PY, "-c", SAME, os.path.join(a, "init.safetensors"),
                               os.path.join(b, "init.safetensors")], env=env)
        if same.returncode != 0:
            failures.append("the same seed gave different checkpoints")
        with open(os.path.join(a, "config.json")) as f:
            cfg = json.load(f)
        if (cfg["vocab_size"], cfg["out_vocab"]) != (4096, 4096):
            failures.append(f"vocab {cfg['vocab_size']}/{cfg['out_vocab']}")
        cact = os.path.join(tmp, "init.cact")
        r = subprocess.run([needle, "export", os.path.join(a, "init.safetensors"), "--config",
                            os.path.join(a, "config.json"), "--v3", "-t", TOK, "-o", cact, "-q"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            failures.append("needle export: " + r.stderr.strip())
        else:
            size = os.path.getsize(cact)
            if not 2_500_000 < size <= 8_000_000:  # 8 x 256: 3.06 MB (train/README.md)
                failures.append(f"CQ4 file of {size} bytes (the budget is 8 MB)")
            tools = json.dumps([{"name": "set_timer", "description": "Start a timer.",
                                 "parameters": {"type": "object", "properties": {
                                     "minutes": {"type": "integer"}}, "required": ["minutes"]}}])
            r = subprocess.run([needle, "run", "-w", cact, "--tools", tools, "-n", "16",
                                "set a timer for 10 minutes"], capture_output=True, text=True,
                               env=dict(env, NEEDLE_THREADS="1"))
            try:
                envelope = json.loads(r.stdout)
            except ValueError:
                envelope = {}
            if r.returncode not in (0, 3) or "function_calls" not in envelope:
                failures.append(f"needle run: status {r.returncode}: {r.stderr.strip()[:200]}")
    for f in failures:
        print("FAIL:", f)
    print("test_init3:", "ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
