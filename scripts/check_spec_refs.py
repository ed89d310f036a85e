#!/usr/bin/env python3
"""Every specification section the code cites exists in docs/spec/.

Comments cite docs/spec/NEEDLE2.md as "spec §3.4" (or a bare "§3.4", a range "§3.4-3.7",
an item "§8.6 item 7", "Appendix A") and docs/spec/NEEDLE3.md as "docs/spec/NEEDLE3.md
§2.6" (see docs/spec/README.md, "Citations"). This script reads the section headings of the
two documents (and the numbered items under each) and reports every citation in the
scanned folders that names none of them, and every leftover pointer to the notes the
documents replaced (NEEDLE3-NOTES, ../shared/spec). "RFC 8259 §7" and the like are other
documents and are skipped.

    python3 scripts/check_spec_refs.py [repo root]    exit 0: all resolve, 1: problems
    python3 scripts/check_spec_refs.py --self-test    the checks above on a made-up tree

Runs in well under a second (ctest check_spec_refs, check_spec_refs_selftest)."""
import os
import re
import sys
import tempfile

SCANNED = ("src", "tools", "tests", "include", "python", "train")
SKIPPED = (os.path.join("tests", "fixtures"),)
EXTENSIONS = (".c", ".h", ".cu", ".cuh", ".m", ".metal", ".py", ".sh", ".txt", ".cmake",
              ".in", ".md")
DOCS = {"2": os.path.join("docs", "spec", "NEEDLE2.md"),
        "3": os.path.join("docs", "spec", "NEEDLE3.md")}

NUM = r"\d+(?:\.\d+)*"
# "§3.4", "§ 3.4", "§3.4-3.7", "§8.6 item 7", "§8.6 items 1-3"
CITATION = re.compile(r"§\s?(" + NUM + r")(?:\s*[-–]\s*(" + NUM + r"))?"
                      r"(?:\s+items?\s+(\d+)(?:\s*[-–]\s*(\d+))?)?")
# What names the document a citation belongs to; the nearest one to its left decides.
MARKER = re.compile(r"NEEDLE3\.md|NEEDLE2\.md|\bspec\b(?!/)|\bRFC\s*\d+|NEEDLE3-NOTES")
APPENDIX = re.compile(r"\bAppendix ([A-Z])\b")
STALE = re.compile(r"NEEDLE3-NOTES|shared/spec")
HEADING = re.compile(r"^#{1,6}\s+(?:§\s?)?(" + NUM + r")\.?\s")
HEADING_APPENDIX = re.compile(r"^#{1,6}\s+Appendix ([A-Z])\b")
ITEM = re.compile(r"^(\d+)\.\s")


def read_sections(path):
    """{"3.4": {item numbers under that heading}, "Appendix A": set(), ...}"""
    sections, current = {}, None
    with open(path, encoding="utf-8") as f:
        in_code = False
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
                continue
            if in_code:
                continue
            m = HEADING.match(line) or HEADING_APPENDIX.match(line)
            if m:
                current = m.group(1) if HEADING.match(line) else "Appendix " + m.group(1)
                sections.setdefault(current, set())
                continue
            item = ITEM.match(line)
            if item and current is not None:
                sections[current].add(int(item.group(1)))
    return sections


def document_of(line, pos, previous_line):
    """'2', '3' or None (another document, or the stale notes, reported apart) for the
    citation at line[pos]."""
    markers = [m for m in MARKER.finditer(line) if m.start() < pos]
    if not markers:
        # a citation that starts a comment line continues the previous line's sentence
        markers = list(MARKER.finditer(previous_line))
    if not markers:
        return "2"
    last = markers[-1].group(0)
    if last.startswith("RFC") or last == "NEEDLE3-NOTES":
        return None
    return "3" if last == "NEEDLE3.md" else "2"


def scanned_files(root):
    for top in SCANNED:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            rel = os.path.relpath(folder, root)
            if any(rel == s or rel.startswith(s + os.sep) for s in SKIPPED):
                dirs[:] = []
                continue
            # hidden folders (the test venvs: .venv, .venv3, their site-packages cite other
            # specs' sections) and build trees are not the project's sources
            dirs[:] = sorted(d for d in dirs if not d.startswith(('.', 'build', '__pycache__')))
            for name in sorted(files):
                if name.endswith(EXTENSIONS):
                    yield os.path.join(folder, name)


def check(root):
    """(problems, citations checked)"""
    docs = {}
    problems = []
    for key, rel in DOCS.items():
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            problems.append(f"{rel}: missing")
            docs[key] = {}
        else:
            docs[key] = read_sections(path)
    checked = 0
    for path in scanned_files(root):
        rel = os.path.relpath(path, root)
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().split("\n")
        except UnicodeDecodeError:
            continue
        previous = ""
        for number, line in enumerate(lines, 1):
            where = f"{rel}:{number}"
            stale = STALE.search(line)
            if stale:
                problems.append(f"{where}: cites '{stale.group(0)}', which is not in the "
                                "repository; cite docs/spec/ (docs/spec/README.md)")
            for m in CITATION.finditer(line):
                doc = document_of(line, m.start(), previous)
                if doc is None:
                    continue
                checked += 1
                sections = docs[doc]
                name = os.path.basename(DOCS[doc])
                for section in filter(None, (m.group(1), m.group(2))):
                    if section not in sections:
                        problems.append(f"{where}: '{m.group(0).strip()}' cites {name} "
                                        f"§{section}, which has no such heading")
                if m.group(3) and m.group(1) in sections:
                    items = sections[m.group(1)]
                    for item in filter(None, (m.group(3), m.group(4))):
                        if int(item) not in items:
                            problems.append(f"{where}: '{m.group(0).strip()}': {name} "
                                            f"§{m.group(1)} has no item {item}")
            for m in APPENDIX.finditer(line):
                checked += 1
                if "Appendix " + m.group(1) not in docs["2"]:
                    problems.append(f"{where}: 'Appendix {m.group(1)}' has no heading in "
                                    "NEEDLE2.md")
            if line.strip():
                previous = line
    return problems, checked


def self_test():
    """Builds a small tree with known citations and checks that each mistake is caught
    (and that correct citations pass)."""
    n2 = ("# N2\n## 1. Format\n### 1.1 Header\n### 1.2 Codebooks\n## 8. ABI\n"
          "### 8.6 Open points\n1. one\n2. two\n```\n3. not an item (code)\n```\n"
          "## Appendix A — Checklist\n")
    n3 = "# N3\n## 2. Architecture\n### 2.1 Attention\n"
    good = ("/* spec §1.1, §1.1-1.2, spec §8.6 item 2, spec §1 and Appendix A */\n"
            "/* docs/spec/NEEDLE3.md §2.1 and NEEDLE3.md §2 */\n"
            "/* RFC 8259 §7 is another document */\n"
            "/* the spec says x\n * (§1.2) on a continuation line */\n")
    bad = {
        "missing section": "/* spec §1.3 */\n",
        "missing range end": "/* spec §1.1-1.4 */\n",
        "bare missing section": "/* see §9 */\n",
        "missing item": "/* spec §8.6 item 3 */\n",
        "item in a code block": "/* spec §8.6 item 3 */\n",
        "missing appendix": "/* Appendix B */\n",
        "Needle 3 section": "/* docs/spec/NEEDLE3.md §2.2 */\n",
        "Needle 2 number cited in NEEDLE3.md": "/* docs/spec/NEEDLE3.md §1.1 */\n",
        "continuation of a NEEDLE3.md line": "/* docs/spec/NEEDLE3.md\n * §1.2 */\n",
        "stale notes": "/* NEEDLE3-NOTES §2 */\n",
        "stale path": "/* ../shared/spec/NEEDLE2.md */\n",
    }
    failures = []
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs", "spec"))
        os.makedirs(os.path.join(root, "src"))
        for key, text in (("2", n2), ("3", n3)):
            with open(os.path.join(root, DOCS[key]), "w", encoding="utf-8") as f:
                f.write(text)
        code = os.path.join(root, "src", "a.c")
        with open(code, "w", encoding="utf-8") as f:
            f.write(good)
        problems, checked = check(root)
        if problems or checked != 8:
            failures.append(f"correct citations: {checked} checked (expected 8), "
                            f"problems {problems}")
        for what, text in bad.items():
            with open(code, "w", encoding="utf-8") as f:
                f.write(good + text)
            problems, _ = check(root)
            if len(problems) != 1:
                failures.append(f"{what}: expected 1 problem, got {problems}")
        os.remove(os.path.join(root, DOCS["3"]))
        with open(code, "w", encoding="utf-8") as f:
            f.write("/* spec §1.1 */\n")
        problems, _ = check(root)
        if not any("NEEDLE3.md: missing" in p for p in problems):
            failures.append(f"missing NEEDLE3.md not reported: {problems}")
    for f in failures:
        print("self-test:", f)
    print("self-test:", "FAILED" if failures else f"ok ({len(bad) + 2} cases)")
    return 1 if failures else 0


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems, checked = check(os.path.abspath(root))
    for p in problems:
        print(p)
    print(f"check_spec_refs: {checked} citations, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
