#!/usr/bin/env python3
"""The library's layer order, checked from the #include "..." lines.

Every folder under src/ is one layer; a file may include headers of its own folder and of
lower layers only, never of a higher layer nor of another folder of the same rank (format
and tokenizer know nothing of each other). include/needle.h, the public header, is
allowed everywhere. tools/ (the CLI) may include only the public header, its own files,
the libraries beside libneedle (src/export, src/quant, src/train, src/hub) and the
library's operating-system layer (util/platform.h: UTF-8 paths and arguments on Windows). A cycle between folders is reported as well, whatever the ranks say. Above model/,
agent/ and api/ include only its interface headers (MODEL_INTERFACE) and read no model or
session field (FIELD_READ; model_api.c, the model's own public API, is exempt).

    python3 scripts/check_includes.py [repo root]     exit 0: clean, 1: violations
    python3 scripts/check_includes.py --self-test     each rule catches its case in a scratch tree

The order, lowest first (see README "Layout"):"""
import os
import re
import sys
import tempfile

LAYERS = [
    ("util",),                # error, strbuf, clock, fp16: depends on nothing
    ("format", "tokenizer"),  # .cact container; SentencePiece-style tokenizer
    ("kernels",),             # CQ kernels, SIMD dispatch, thread pool, shared scalar math
    ("backend",),             # backend interface + CPU/CUDA/Metal ops over weight views
    ("model",),               # weights binding, session, forward schedule
    ("grammar",),             # JSON-schema -> grammar compiler and recognizer
    ("agent",),               # prompt template, constrained turn, envelope
    ("api", "compat"),        # the public C API; the official engines' ABIs over it (compat)
    # not in libneedle: the exporter library (needle_export) that `needle export` and
    # `needle quantize` link; quant depends on util only, export on format and quant
    ("quant",),               # CQ codebooks, quantizer, bits maps
    ("export",),              # .cact writer, safetensors / SentencePiece readers
    # not in libneedle: the training core (needle_train), above the exporter it reads with
    ("train",),               # checkpoints, adapters, optimizer, forward and backward, LoRA merge, data encoder
    # not in libneedle: the hub client (needle_hub) of `needle download` / `needle models`
    ("hub",),                 # hub protocol, cache layout (reads api/model_cache.h)
]
# tools/ may include these src/ folders besides the public header: the exporter library
TOOL_LIBRARIES = {"export", "quant", "hub", "train"}
# and this one header of libneedle's internals: the OS layer (one implementation per
# system), so the CLI opens files and reads its arguments as the library does
TOOL_HEADERS = {os.path.join("src", "util", "platform.h")}
RANK = {folder: rank for rank, group in enumerate(LAYERS) for folder in group}
# The model's headers the layers above may include: its accessors and the session's
# functions (model.h, session.h), the probe heads (heads.h); arch.h and the forward's
# internals stay inside model/ (issue 28: the public API lives on top and composes).
MODEL_INTERFACE = {"model/model.h", "model/session.h", "model/heads.h"}
# Reads of a model's or a model session's fields from above (the accessors are the way):
# `->w.`, `->tok`, `->info`, `->bk` on a model `m` or a session `s`/`core`.
FIELD_READ = re.compile(r"\b(?:m|model|s|core)->(?:w|tok|info|bk|pos|logits)\b")
ABOVE_MODEL = {"agent", "api"}
# headers generated at build time (not in the tree)
GENERATED = {"metal_source.h"}
SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".m", ".metal")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

__doc__ += "\n    " + " < ".join(", ".join(group) for group in LAYERS) + "\n"


def sources(top):
    for dirpath, _, files in os.walk(top):
        for name in sorted(files):
            if name.endswith(SOURCE_EXT):
                yield os.path.join(dirpath, name)


def resolve(root, including, name):
    """The repository-relative path `name` refers to, or None."""
    for base in (os.path.dirname(including), os.path.join(root, "src"),
                 os.path.join(root, "include")):
        path = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(path):
            return os.path.relpath(path, root)
    return None


def folder_of(relpath):
    parts = relpath.split(os.sep)
    return parts[1] if parts[0] == "src" and len(parts) > 2 else None


def find_cycle(edges):
    """A folder cycle as a list, or None (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def check(root):
    errors, edges, counts = [], {}, {}
    for path in sources(os.path.join(root, "src")):
        rel = os.path.relpath(path, root)
        src_folder = folder_of(rel)
        if src_folder not in RANK:
            errors.append(f"{rel}: folder src/{src_folder} has no place in the layer table")
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if src_folder in ABOVE_MODEL and os.path.basename(rel) != "model_api.c":
            for line_no, line in enumerate(text.splitlines(), 1):
                if FIELD_READ.search(line):
                    errors.append(f"{rel}:{line_no}: reads a model or session field; use "
                                  "the accessors of model/model.h, model/session.h")
        for name in INCLUDE.findall(text):
            if os.path.basename(name) in GENERATED:
                continue
            target = resolve(root, path, name)
            if target is None:
                errors.append(f'{rel}: #include "{name}" is not in the tree')
                continue
            if target in (os.path.join("include", "needle.h"),
                          os.path.join("include", "needle2.h"),
                          os.path.join("include", "needle3.h")):
                continue
            dst = folder_of(target)
            if dst is None or dst not in RANK:
                errors.append(f'{rel}: #include "{name}" is outside the layered folders')
                continue
            if dst == src_folder:
                continue
            if dst == "model" and src_folder in ABOVE_MODEL and \
                    target.replace(os.sep, "/")[len("src/"):] not in MODEL_INTERFACE:
                errors.append(f'{rel}: #include "{name}": above model/ only '
                              + ", ".join(sorted(MODEL_INTERFACE)) + " may be included")
            edges.setdefault(src_folder, set()).add(dst)
            counts[(src_folder, dst)] = counts.get((src_folder, dst), 0) + 1
            if RANK[dst] > RANK[src_folder]:
                errors.append(f'{rel}: #include "{name}" goes up the layer order '
                              f"({src_folder} may not depend on {dst})")
            elif RANK[dst] == RANK[src_folder]:
                errors.append(f'{rel}: #include "{name}": {src_folder} and {dst} are '
                              "independent layers of the same rank")
    for path in sources(os.path.join(root, "tools")):
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for name in INCLUDE.findall(text):
            target = resolve(root, path, name)
            if (target and target.split(os.sep)[0] == "src" and folder_of(target) not in TOOL_LIBRARIES
                    and target not in TOOL_HEADERS):
                errors.append(f'{rel}: #include "{name}": tools use only the public header '
                              "the libraries beside libneedle and util/platform.h")
    cycle = find_cycle(edges)
    if cycle:
        errors.append("include cycle between folders: " + " -> ".join(cycle))
    return errors, counts


# The self-test's scratch trees: a clean one, then one file per rule that must be refused
# (path, text, a phrase of the expected error). Each runs alone on top of the clean tree.
CLEAN_TREE = {
    "include/needle.h": "",
    "src/util/error.h": "",
    "src/format/cact.h": '#include "util/error.h"\n',
    "src/model/model.h": '#include "format/cact.h"\n',
    "src/model/arch.h": "",
    "src/agent/turn.c": '#include "model/model.h"\n#include "needle.h"\nint f(void) { return g(m); }\n',
    "src/api/model_api.c": "int n(const model *m) { return m->info.layers; }\n",
    "src/export/writer.c": '#include "format/cact.h"\n',
    "tools/run.c": '#include "needle.h"\n#include "export/writer.h"\n#include "util/platform.h"\n',
    "src/export/writer.h": "",
    "src/util/platform.h": "",
}
VIOLATIONS = [
    ("src/format/up.c", '#include "model/model.h"\n', "goes up the layer order"),
    ("src/format/peer.c", '#include "tokenizer/spm.h"\n', "independent layers of the same rank"),
    ("src/tokenizer/spm.h", "", None),  # the peer's target (no error by itself)
    ("src/agent/peek.c", "int f(const model *m) { return m->tok->n; }\n", "reads a model or session field"),
    ("src/api/inner.c", '#include "model/arch.h"\n', "above model/ only"),
    ("tools/inner.c", '#include "model/model.h"\n', "tools use only the public header"),
    ("src/agent/missing.c", '#include "agent/nowhere.h"\n', "is not in the tree"),
    ("src/nowhere/x.c", "", "has no place in the layer table"),
    ("src/util/down.c", '#include "format/cact.h"\n', "include cycle between folders"),
]


def self_test():
    def tree(files):
        root = tempfile.mkdtemp(prefix="check_includes.")
        for rel, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                f.write(text)
        return check(root)[0]

    failed = 0
    errors = tree(CLEAN_TREE)
    if errors:
        print("self-test: the clean tree was refused: " + "; ".join(errors))
        failed += 1
    extra = {rel: text for rel, text, phrase in VIOLATIONS if phrase is None}
    for rel, text, phrase in VIOLATIONS:
        if phrase is None:
            continue
        errors = tree({**CLEAN_TREE, **extra, rel: text})
        if not any(phrase in e for e in errors):
            print(f"self-test: {rel} not caught as '{phrase}': {errors}")
            failed += 1
    print("self-test: " + ("failed" if failed else "ok"))
    return 1 if failed else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    errors, counts = check(root)
    print("layers, lowest first: " + " < ".join("/".join(g) for g in LAYERS))
    for (a, b), n in sorted(counts.items(), key=lambda kv: (-RANK[kv[0][0]], kv[0])):
        print(f"  {a:9s} -> {b:9s} {n:3d} include lines")
    for e in errors:
        print("error: " + e)
    print(f"{len(errors)} violation(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
