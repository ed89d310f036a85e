"""Detects another distribution that installs the top-level module ``needle``.

The official client (``cactus-needle``, and the unrelated ``needle`` on PyPI) also installs a
top-level ``needle`` package. pip does not refuse such an install: the later one overwrites
the earlier one's files in the same site-packages, or the first on ``sys.path`` hides the
other, so ``import needle`` silently gives the wrong package. This package is distributed
as ``libneedle`` and checks at import, before loading its own modules, which distributions
provide ``needle``.
"""
from __future__ import annotations

import os
import re
from typing import List, Tuple

OUR_DISTRIBUTION = "libneedle"


class NameClashWarning(UserWarning):
    """Another installed distribution also provides the top-level module ``needle``."""


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _provides_needle(dist) -> bool:
    top = dist.read_text("top_level.txt")
    if top is not None:
        return "needle" in top.split()
    for f in dist.files or []:
        if f.parts and f.parts[0] == "needle":
            return True
    return False


def other_providers() -> List[Tuple[str, str, str]]:
    """(name, version, location of its needle/__init__.py) of every installed distribution
    other than ours that provides the top-level module ``needle``."""
    from importlib import metadata
    found, seen = [], set()
    for dist in metadata.distributions():
        try:
            name = dist.metadata["Name"] or ""
        except Exception:  # a broken dist-info is not ours to diagnose
            continue
        key = _normalized(name)
        if key == OUR_DISTRIBUTION or key in seen or not _provides_needle(dist):
            continue
        seen.add(key)
        found.append((name, dist.version or "?",
                      os.path.realpath(str(dist.locate_file("needle/__init__.py")))))
    return found


def check(package_dir: str) -> None:
    """Raises ImportError when another distribution's files are mixed into this package's
    folder in a way that breaks it; otherwise warns (NameClashWarning) for each other
    provider of ``needle``."""
    import warnings
    ours = os.path.realpath(os.path.join(package_dir, "__init__.py"))
    others = other_providers()
    if not others:
        return
    names = ", ".join(f"{n} {v}" for n, v, _ in others)
    uninstall = " ".join(n for n, _, _ in others)
    mixed = [o for o in others if o[2] == ours]
    # The official client's needle/agent/ package would be imported in place of agent.py.
    if mixed and os.path.isdir(os.path.join(package_dir, "agent")):
        raise ImportError(
            f"needle: the folder {package_dir} holds files of {names} mixed with this "
            f"package's ({OUR_DISTRIBUTION}): both install the top-level module 'needle' and "
            f"the later install overwrote the other's. Run `pip uninstall {uninstall} "
            f"{OUR_DISTRIBUTION}` and reinstall the one you want, or keep them in separate "
            "virtual environments.")
    where = ("in the same folder, so their files are mixed" if mixed else
             "elsewhere on sys.path; this one, from " + package_dir + ", is the one imported")
    warnings.warn(
        f"needle: {names} also installs the top-level module 'needle' ({where}). "
        f"This is {OUR_DISTRIBUTION}, the libneedle bindings; `pip uninstall {uninstall}` "
        "or a separate virtual environment removes the clash.",
        NameClashWarning, stacklevel=3)
