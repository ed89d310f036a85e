"""needle.build and needle.encode_data: the `needle build` and `needle encode-data`
commands of the C engine (the same executable hub.download uses), from Python."""
import os
import subprocess
from typing import Optional

from ._lib import NeedleError


def _run(args) -> str:
    from .hub import _cli
    r = subprocess.run([_cli()] + [str(a) for a in args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise NeedleError((r.stderr or "").strip() or f"needle {args[0]}: exit status {r.returncode}")
    return r.stderr


def build(checkpoint: Optional[str] = None, *, lora: Optional[str] = None,
          layers: Optional[int] = None, weights: Optional[str] = None, bits: str = "4",
          out: Optional[str] = None) -> str:
    """Builds a .cact as the official `needle build` does and returns its path.

    checkpoint: the official Needle 3 checkpoint (.safetensors; default: the adapter's
    base when that file exists). lora: an adapter to merge (its confidence head is then
    dropped). layers: the depth of the ladder rung to keep. weights: the base .cact whose
    tokenizer the file carries (default: the cached needle3). bits: "4" (the official) or
    a bits map. out: the file to write (default: the checkpoint's name with .cact).
    Raises NeedleError with the command's message on failure."""
    args = ["build"]
    if checkpoint is not None:
        args.append(os.fspath(checkpoint))
    if lora is not None:
        args += ["--lora", os.fspath(lora)]
    if layers is not None:
        args += ["--layers", int(layers)]
    if weights is not None:
        args += ["--weights", os.fspath(weights)]
    if out is None:
        if checkpoint is None:
            raise ValueError("pass out= (or a checkpoint, whose name the output takes)")
        out = os.path.splitext(os.path.basename(os.fspath(checkpoint)))[0] + ".cact"
    args += ["--bits", str(bits), "--out", os.fspath(out), "--quiet"]
    _run(args)
    return os.fspath(out)


def encode_data(data: str, *, out: str, weights: Optional[str] = None, max_len: int = 1024,
                strict: bool = False) -> str:
    """Encodes fine-tuning data (JSONL) into the ids and loss masks the official
    fine-tuner trains on, written to `out` as {"ids", "mask"} lines; returns `out`.
    strict: refuse the data on any warning or skipped line (NeedleError)."""
    args = ["encode-data", os.fspath(data), "--out", os.fspath(out), "--max-len", int(max_len)]
    if weights is not None:
        args += ["--weights", os.fspath(weights)]
    if strict:
        args.append("--strict")
    _run(args)
    return os.fspath(out)
