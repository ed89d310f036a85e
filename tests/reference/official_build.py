#!/usr/bin/env python3
"""Runs the official `needle build` (cactus-needle 3.2.8, model.build.build_main) offline:
the "published base archive" it would download is BASE instead.

    official_build.py CHECKPOINT ADAPTER|- BASE OUT [LAYERS]

Used by tests/parity/test_build.c (under the pinned venv tests/reference/.venv3; skipped
without it) to build adapters written by this project with the official code."""
import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("NEEDLE_TELEMETRY", "0")
from needle.agent import fetch  # noqa: E402
from needle.model import build  # noqa: E402


def main(argv):
    checkpoint, adapter, base, out = argv[:4]
    layers = int(argv[4]) if len(argv) > 4 else None
    fetch.fetch_weights = lambda generation=2, dest_dir=None, force=False: base
    build.build_main(argparse.Namespace(checkpoint=checkpoint, lora=None if adapter == "-" else adapter,
                                        out=out, upload=False, layers=layers, platform=None))


if __name__ == "__main__":
    main(sys.argv[1:])
