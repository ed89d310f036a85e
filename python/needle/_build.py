"""needle.build, needle.encode_data, needle.finetune and needle.calibrate: the `needle
build`, `needle encode-data`, `needle finetune` and `needle calibrate` commands of the C engine (the same executable hub.download uses), from Python."""
import json
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


_RATIOS = {"exact match": "exact_match", "tool-name accuracy": "tool_name_accuracy",
           "argument F1": "arg_f1", "well-formed rate": "well_formed_rate",
           "refusal accuracy": "refusal_accuracy"}


def finetune(data: str, *, checkpoint: Optional[str] = None, weights: Optional[str] = None,
             epochs: int = 3, batch_size: int = 16, lr: float = 1e-4, lora_rank: int = 16,
             lora_alpha: float = 32.0, max_len: int = 1024, val_split: float = 0.1, seed: int = 0,
             layers: Optional[int] = None, out: Optional[str] = None, resume: bool = False,
             full: bool = False, quant: Optional[bool] = None, threads: Optional[int] = None,
             score: bool = True, verbose: bool = False) -> dict:
    """Fine-tunes Needle 3 with `needle finetune` (the official defaults) and returns what it
    made and scored:

      {"adapter" (or "checkpoint" with full=True), "state" (LoRA resume state), "cact" (the
       built file), "heldout" (the held-out lines scored), "val_loss": [one per epoch],
       "steps", "scores": {"exact_match", "exact", "examples", "tool_name_accuracy",
       "arg_f1", "well_formed_rate", "refusal_accuracy"} (None without a held-out split
       or with score=False)}

    The scores are `needle eval` on the built .cact over the held-out split: what the
    shipped file gets. quant: None for the default numerics (LoRA: CQ W4 straight-through
    + A8; full: float), True/False to force them. verbose: echo the command's lines.
    Raises NeedleError with the command's message on failure (or when it was stopped)."""
    from .hub import _cli
    args = ["finetune", os.fspath(data), "--epochs", int(epochs), "--batch-size", int(batch_size),
            "--lr", repr(float(lr)), "--lora-rank", int(lora_rank), "--lora-alpha", repr(float(lora_alpha)),
            "--max-len", int(max_len), "--val-split", repr(float(val_split)), "--seed", int(seed)]
    if checkpoint is not None:
        args += ["--checkpoint", os.fspath(checkpoint)]
    if weights is not None:
        args += ["--weights", os.fspath(weights)]
    if layers is not None:
        args += ["--layers", int(layers)]
    if out is not None:
        args += ["--out", os.fspath(out)]
    if threads is not None:
        args += ["--threads", int(threads)]
    args += (["--resume"] if resume else []) + (["--full"] if full else [])
    args += [] if quant is None else (["--quant"] if quant else ["--float"])
    if not score:
        args.append("--no-score")
    p = subprocess.Popen([_cli()] + [str(a) for a in args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    lines = []
    for line in p.stdout:
        lines.append(line.rstrip("\n"))
        if verbose:
            print(line, end="", flush=True)
    err = p.stderr.read()
    p.wait()
    if p.returncode != 0:
        raise NeedleError(err.strip() or f"needle finetune: exit status {p.returncode}")
    result = {"val_loss": [], "steps": 0, "scores": None, "state": None, "cact": None, "heldout": None}
    scores = {}
    for line in lines:
        words = line.split()
        if not words:
            continue
        if words[0] in ("adapter", "checkpoint") and len(words) == 2:
            result[words[0]] = words[1]
        elif words[0] == "saved" and not full:
            result["state"] = words[-1]
        elif words[0] == "built":
            result["cact"] = words[1]
        elif words[0] == "score":
            result["heldout"] = words[words.index("examples") + 1].strip("()")
        elif words[0] == "epoch" and "val" in words:
            result["val_loss"].append(float(words[words.index("val") + 1]))
        elif words[0] == "step":
            result["steps"] = int(words[1].split("/")[0])
        elif words[0] == "stopped":
            raise NeedleError("needle finetune stopped: " + line.strip())
        for label, key in _RATIOS.items():
            if line.startswith(label + " ") and result["heldout"]:
                value = line[len(label):].split()[0]
                scores[key] = None if value == "n/a" else float(value)
                if key == "exact_match" and "(" in line:
                    num, den = line.split("(")[1].rstrip(")").split("/")
                    scores["exact"], scores["examples"] = int(num), int(den)
    if scores:
        result["scores"] = scores
    return result


def calibrate(checkpoint: str, data: str, *, out: str, weights: Optional[str] = None,
              build_out: Optional[str] = None, epochs: int = 20, batch_size: int = 32, lr: float = 3e-3,
              val_split: float = 0.2, seed: int = 0, limit: Optional[int] = None,
              threads: Optional[int] = None, verbose: bool = False) -> dict:
    """Trains a Needle 3 checkpoint's confidence head on the engine's answers to `data`
    (`needle calibrate`; examples the model was not trained on) and returns:

      {"checkpoint" (the calibrated one: `needle build` keeps its head), "answers",
       "exact" (how many were exact), "val_loss": [one per epoch], "val_auc": [one per
       epoch], "cact" and "heldout" (with build_out), "scores" (with build_out and a
       held-out split: `needle eval --json` on the built file over the held-out lines,
       its "calibration" included; else None)}

    weights: the base .cact whose tokenizer the build takes. Raises NeedleError with the
    command's message on failure."""
    from .hub import _cli
    args = ["calibrate", os.fspath(checkpoint), os.fspath(data), "--out", os.fspath(out),
            "--epochs", int(epochs), "--batch-size", int(batch_size), "--lr", repr(float(lr)),
            "--val-split", repr(float(val_split)), "--seed", int(seed)]
    if weights is not None:
        args += ["--weights", os.fspath(weights)]
    if build_out is not None:
        args += ["--build-out", os.fspath(build_out)]
    if limit is not None:
        args += ["--limit", int(limit)]
    if threads is not None:
        args += ["--threads", int(threads)]
    p = subprocess.Popen([_cli()] + [str(a) for a in args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    result = {"checkpoint": None, "answers": 0, "exact": 0, "val_loss": [], "val_auc": [],
              "cact": None, "heldout": None, "scores": None}
    for line in p.stdout:
        if verbose:
            print(line, end="", flush=True)
        words = line.split()
        if not words:
            continue
        if words[0] == "answered" and len(words) > 4:
            result["answers"], result["exact"] = int(words[1]), int(words[words.index("exact") - 1])
        elif words[0] == "epoch" and "AUC" in words:
            result["val_loss"].append(float(words[words.index("held-out") + 2]))
            result["val_auc"].append(float(words[words.index("AUC") + 1].rstrip(",")))
        elif words[0] == "wrote":
            result["checkpoint"] = words[1]
        elif words[0] == "built":
            result["cact"] = words[1]
        elif words[0] == "score":
            result["heldout"] = words[words.index("examples") + 1].strip("()")
    err = p.stderr.read()
    p.wait()
    if p.returncode != 0:
        raise NeedleError(err.strip() or f"needle calibrate: exit status {p.returncode}")
    if result["cact"] and result["heldout"]:
        r = subprocess.run([_cli(), "eval", "--json", "-w", result["cact"], result["heldout"]],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise NeedleError(r.stderr.strip() or "needle eval failed on the calibrated file")
        result["scores"] = json.loads(r.stdout)
    return result
