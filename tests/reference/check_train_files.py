#!/usr/bin/env python3
"""Reads files that needle's training core wrote with the official code and prints what
it saw as JSON, for tests/test_train_*.c to compare with what they wrote.

    check_train_files.py st FILE          safetensors' own reader (numpy): every tensor
                                          (dtype, shape, values) and the metadata
    check_train_files.py checkpoint FILE [apply]
                                          cactus-needle's read_checkpoint and
                                          run.load_checkpoint (config, step, run, params);
                                          with "apply", the logits' shape of the official
                                          forward pass over the loaded parameters
    check_train_files.py adapter FILE     cactus-needle's read_adapter

Runs under the pinned venv of make_v3_fixtures.sh (cactus-needle 3.2.8, safetensors).
"""
import json
import sys

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, for BF16 tensors)
import numpy as np


def tensor_json(a):
    a = np.asarray(a)
    return {"dtype": str(a.dtype), "shape": list(a.shape),
            # strict JSON has no inf or nan: those as the strings "inf", "-inf", "nan"
            "values": [float(x) if np.isfinite(x) else str(x)
                       for x in a.astype(np.float64).ravel()]}


def main():
    mode, path = sys.argv[1], sys.argv[2]
    out = {}
    if mode == "st":
        from safetensors import safe_open
        from safetensors.numpy import load_file
        with safe_open(path, framework="np") as handle:
            out["__metadata__"] = handle.metadata()
        out["tensors"] = {k: tensor_json(v) for k, v in load_file(path).items()}
    elif mode == "checkpoint":
        from needle.model.checkpoints import flatten, read_checkpoint
        from needle.model.run import load_checkpoint
        ck = read_checkpoint(path)
        params, config = load_checkpoint(path)
        out = {"format_version": ck["format_version"], "config": ck["config"], "step": ck["step"],
               "run": ck["run"], "config_vocab_size": config.vocab_size,
               "loaded": sorted(flatten(params)),
               "tensors": {k: tensor_json(v) for k, v in flatten(ck["params"]).items()}}
        if sys.argv[3:] == ["apply"]:
            import jax.numpy as jnp
            from needle.model.architecture import SimpleAttentionNetwork
            config.dtype = "float32"
            logits = SimpleAttentionNetwork(config).apply({"params": params}, jnp.ones((1, 5), jnp.int32))
            out["apply_shape"] = list(logits.shape)
            out["apply_finite"] = bool(np.isfinite(np.asarray(logits)).all())
    elif mode == "adapter":
        from needle.model.checkpoints import read_adapter
        ad = read_adapter(path)
        out = {k: ad[k] for k in ("scale", "base", "rank", "seed", "pieces", "languages")}
        out["lora"] = {k: {m: tensor_json(v[m]) for m in v} for k, v in ad["lora"].items()}
        out["rows"] = None if ad["rows"] is None else tensor_json(ad["rows"])
    else:
        sys.exit(f"unknown mode {mode}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
