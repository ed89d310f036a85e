#!/usr/bin/env python3
"""Counts the code lines that compare a model generation number (issue 28, item 1).

Which generation a file is gets decided once: model_bind picks the architecture descriptor
(src/model/arch.h) from the file's tag, and everything after that tests the descriptor or
the traits the binding recorded in the weights (backend/weights.h model_traits). A new
`generation == 3` branch in the forward pass, a session, an op or a backend is the drift
this check stops. Comments and string literals are ignored; a comparison is an ==, !=, <,
<=, > or >= with an operand named `generation` (any struct path) or `genN`.

    python3 scripts/check_generation.py [repo root]   exit 0: at most MAX_LINES, 1: more
    python3 scripts/check_generation.py --self-test   each kind of comparison is caught,
                                                      comments, strings, shifts are not
"""
import os
import re
import sys

FOLDERS = ("model", "backend", "kernels", "agent", "api", "grammar")
MAX_LINES = 3
SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".m", ".metal")
NAME = r"(?:[\w.]|->)*\b(?:generation|gen\d)\b"
COMPARE = re.compile(r"(?:" + NAME + r"\s*(?:==|!=|<=|>=|<(?![<=])|>(?![>=]))"
                     r"|(?:==|!=|<=|>=|(?<![<-])<|(?<![>-])>)\s*" + NAME + r")")


def code_only(text):
    """The text with comments and string/char literals blanked, newlines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


CAUGHT = ["if (m->w.generation == 3) f();", "x = 3 != info.generation;",
          "const int gen3 = m->file.generation >= 3;", "if (gen3 < 2) g();",
          "a = f.generation<3 ? 1 : 0;"]
IGNORED = ["/* m->generation == 3 */ f();", "// generation != 2", 'puts("generation == 3");',
           "info->generation = 3;", "x = pool->generation << 1;", "p->generation = gen;",
           "if (known[i] == arch) return arch;"]


def self_test():
    bad = [c for c in CAUGHT if not COMPARE.search(code_only(c))]
    bad += [c for c in IGNORED if COMPARE.search(code_only(c))]
    for c in bad:
        print("self-test: misjudged: %s" % c)
    print("self-test: %s" % ("failed" if bad else "ok"))
    return 1 if bad else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))
    hits = []
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, "src", folder)):
            for name in sorted(files):
                if not name.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                lines = text.split("\n")
                for no, line in enumerate(code_only(text).split("\n"), 1):
                    if COMPARE.search(line):
                        hits.append("%s:%d: %s" % (os.path.relpath(path, root), no,
                                                   lines[no - 1].strip()))
    for h in hits:
        print(h)
    print("%d line(s) compare a generation number (at most %d)" % (len(hits), MAX_LINES))
    return 0 if len(hits) <= MAX_LINES else 1


if __name__ == "__main__":
    sys.exit(main())
