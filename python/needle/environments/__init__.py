"""Acceptance environments: the official package's `needle.environments` contract, so the
official environment modules (smart_home, productivity, media_player, kitchen_appliance,
wearable, data_capture) import and run unchanged on this engine.

The environment modules themselves are the official package's content and are not shipped
here: point ``NEEDLE_ENVIRONMENTS`` at a folder holding them (for instance the
``needle/environments/`` folder of the unpacked cactus-needle 3.x wheel; several folders
separated by ``os.pathsep``), then

    from needle.environments import smart_home      # as with the official package
    smart_home.agent.complete("dim the study lights to 30 percent")
    smart_home.run_tests()

Each module brings TOOLS, SYSTEM and TEST_CASES and runs through ``_harness`` (this
package's): ``agent_for(module)`` and ``run_tests(module, min_confidence, verbose)``.
"""
import importlib
import os

_OFFICIAL_NAMES = ("data_capture", "kitchen_appliance", "media_player", "productivity",
                   "smart_home", "wearable")


def _extra_folders():
    value = os.environ.get("NEEDLE_ENVIRONMENTS", "")
    return [os.path.abspath(p) for p in value.split(os.pathsep) if p.strip()]


# A package's __path__ is where its submodules are looked up: the folders named by
# NEEDLE_ENVIRONMENTS join this one, so `needle.environments.smart_home` is found there.
for _folder in _extra_folders():
    if os.path.isdir(_folder) and _folder not in __path__:
        __path__.append(_folder)


def _available():
    """Environment module names found in the package's folders (official names first)."""
    found = set()
    for folder in __path__:
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        found.update(e[:-3] for e in entries
                     if e.endswith(".py") and not e.startswith("_"))
    return tuple(n for n in _OFFICIAL_NAMES if n in found) + \
        tuple(sorted(found - set(_OFFICIAL_NAMES)))


__all__ = ["ENVIRONMENTS", "run_tests", *_OFFICIAL_NAMES]


def _load(name):
    if name not in _available():
        raise ModuleNotFoundError(
            f"needle.environments.{name} is not installed here: set NEEDLE_ENVIRONMENTS to "
            "a folder holding the environment modules (e.g. the needle/environments folder "
            "of the unpacked cactus-needle wheel)", name=f"needle.environments.{name}")
    return importlib.import_module(f"needle.environments.{name}")


def __getattr__(name):
    if name in _OFFICIAL_NAMES or name in _available():
        return _load(name)
    if name == "ENVIRONMENTS":
        return {n: _load(n) for n in _available()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), "ENVIRONMENTS", *_available()])


def run_tests(min_confidence=0.0, verbose=True):
    """Every available environment's acceptance suite; True when all of them pass."""
    names = _available()
    if not names:
        raise ModuleNotFoundError("no environment modules found: set NEEDLE_ENVIRONMENTS")
    ok = True
    for name in names:
        print(name)
        ok = _load(name).run_tests(min_confidence, verbose) and ok
    return ok
