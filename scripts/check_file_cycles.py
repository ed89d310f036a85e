#!/usr/bin/env python3
"""No cycle between the C files of the CPU backend (issue 28 item 4).

A file "uses" another when it names a function or object the other defines with external
linkage (found from the definitions at the start of a line, not `static`). The files of
src/backend/ and its cpu/ folder must form a DAG: cpu/runtime.c at the bottom, the ops
files over it, the table over the ops, backend.c over the tables. A cycle (as
cpu_ops.c <-> cpu_ops3.c was: par_for one way, attention3 the other) is reported.

    python3 scripts/check_file_cycles.py [repo root]   exit 0: acyclic, 1: a cycle
    python3 scripts/check_file_cycles.py --self-test   a two-file cycle is caught, a chain
                                                       and static helpers are not
"""
import os
import re
import sys

FOLDERS = ("src/backend", "src/backend/cpu")
DEFINITION = re.compile(r"^(?!static\b)(?!typedef\b)(?!extern\b)[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)"
                        r"\s*(?:\(|=|\[)", re.M)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def self_test():
    import tempfile
    cases = [  # (files of src/backend/cpu, whether a cycle must be found)
        ({"a.c": "int cpu_a(void) { return cpu_b(); }\n",
          "b.c": "void helper(void);\nint cpu_b(void) { return cpu_a() + 1; }\n"}, True),
        ({"a.c": "int cpu_a(void) { return cpu_b(); }\n",
          "b.c": "static int cpu_a2(void) { return 0; }\nint cpu_b(void) { return cpu_a2(); }\n"},
         False),
    ]
    bad = 0
    for files, cyclic in cases:
        with tempfile.TemporaryDirectory() as root:
            for folder in FOLDERS:
                os.makedirs(os.path.join(root, folder), exist_ok=True)
            for name, text in files.items():
                with open(os.path.join(root, "src/backend/cpu", name), "w") as f:
                    f.write(text)
            found = check(root) != 0
            if found != cyclic:
                print("self-test: %s: expected %s" % (sorted(files), "a cycle" if cyclic else "none"))
                bad = 1
    print("self-test: %s" % ("failed" if bad else "ok"))
    return bad


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    return check(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))


def check(root):
    texts = {}
    for folder in FOLDERS:
        top = os.path.join(root, folder)
        for name in sorted(os.listdir(top)) if os.path.isdir(top) else []:
            if name.endswith(".c"):
                with open(os.path.join(top, name), encoding="utf-8") as f:
                    texts[os.path.join(folder, name)] = COMMENT.sub(" ", f.read())
    defined = {}
    for path, text in texts.items():
        for line in text.split("\n"):
            # a definition: a function's head (a prototype ends with ';') or an initialized
            # object
            m = DEFINITION.match(line)
            if m and (not line.rstrip().endswith(";") or "=" in line):
                defined.setdefault(m.group(1), path)
    uses = {path: set() for path in texts}
    for path, text in texts.items():
        for word in set(re.findall(r"\b[A-Za-z_]\w*\b", text)):
            owner = defined.get(word)
            if owner and owner != path:
                uses[path].add(owner)
    # depth-first search for a cycle
    state, stack = {}, []

    def visit(p):
        state[p] = 1
        stack.append(p)
        for q in sorted(uses[p]):
            if state.get(q) == 1:
                return stack[stack.index(q):] + [q]
            if not state.get(q):
                cycle = visit(q)
                if cycle:
                    return cycle
        stack.pop()
        state[p] = 2
        return None

    for p in sorted(texts):
        if not state.get(p):
            cycle = visit(p)
            if cycle:
                print("cycle: " + " -> ".join(cycle))
                return 1
    for p in sorted(texts):
        print("%s uses %s" % (p, ", ".join(sorted(uses[p])) or "none"))
    print("no cycle among %d files" % len(texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
