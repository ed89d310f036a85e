"""train/import_cact.py on the shipped demo model: the imported weights and rebuilt
tokenizer, exported again by `needle export`, give models/needle-demo.cact byte for byte,
and the rebuilt SentencePiece model encodes text (non-ASCII, chat markers, digits) as
the official reference encoder of the .cact's own tokenizer blob does.

    python tests/integration/test_import_cact.py BUILD_DIR

Needs the reference venv (cactus-needle 2.0.15, numpy, sentencepiece; made by
scripts/reference-venv.sh): run with its python, or this script re-runs itself with
tests/reference/.venv/bin/python when that exists, and exits 77 (skipped) when not.
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_PY = os.path.join(ROOT, "tests", "reference", ".venv", "bin", "python")
MODEL = os.path.join(ROOT, "models", "needle-demo.cact")
TEXTS = ["set a timer for an hour and a half", "text Łukasz: żółć 😊 at 19:30",
         "Ελένη, Москва, 東京, Hà Nội, São Paulo", "  two  spaces\tand a tab\n",
         "<|im_start|>user\nhi<|im_end|>", "49.99 USD -> 12345678"]


def main():
    try:
        import numpy  # noqa: F401
        import sentencepiece  # noqa: F401
        from needle.model import export  # noqa: F401
    except ImportError:
        if os.path.exists(VENV_PY) and os.path.realpath(sys.executable) != os.path.realpath(VENV_PY):
            os.execv(VENV_PY, [VENV_PY] + sys.argv)
        print("test_import_cact: skipped (no reference venv: bash scripts/reference-venv.sh)")
        return 77
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    needle = os.path.join(build, "needle")
    sys.path.insert(0, os.path.join(ROOT, "train"))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import pickle
    import sentencepiece as spm
    import checkpoint_to_safetensors as CK
    from needle.model import export as E

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, os.path.join(ROOT, "train", "import_cact.py"), MODEL,
                        "--out", tmp], check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(tmp, "final.pkl"), "rb") as f:
            state = pickle.load(f)
        st, cj = CK.write_checkpoint(state["params"], state["config"], os.path.join(tmp, "ck"))
        out = os.path.join(tmp, "again.cact")
        subprocess.run([needle, "export", st, "--config", cj, "--bits", str(state["bits"]),
                        "--tokenizer", os.path.join(tmp, "tok.model"), "-o", out, "-q"],
                       check=True)
        with open(out, "rb") as f, open(MODEL, "rb") as g:
            if f.read() != g.read():
                failures += 1
                print("FAIL: the re-exported model differs from", MODEL)
        sp = spm.SentencePieceProcessor()
        sp.Load(os.path.join(tmp, "tok.model"))
        ref = E.RefTokenizer.from_cact(MODEL)
        for text in TEXTS:
            ours, theirs = sp.Encode(text, out_type=int), ref.encode(text)
            if ours != theirs:
                failures += 1
                print(f"FAIL: {text!r}: rebuilt tokenizer {ours[:12]} vs the blob's {theirs[:12]}")
    print("test_import_cact:", "ok" if failures == 0 else f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
