"""scripts/release-check.sh: the version in include/needle.h, python/pyproject.toml (or
setup.py reading the header) and CHANGELOG.md's top entry agree; run on this checkout and
on copies where one of them drifts."""
import os
import shutil
import subprocess

from conftest import ROOT, header_version

SCRIPT = os.path.join(ROOT, "scripts", "release-check.sh")


def _check(root, *args):
    return subprocess.run(["bash", SCRIPT, *args, str(root)], capture_output=True, text=True,
                          timeout=60)


def _copy(tmp_path):
    root = tmp_path / "repo"
    (root / "python").mkdir(parents=True)
    shutil.copytree(os.path.join(ROOT, "include"), root / "include")
    for f in ("CHANGELOG.md",):
        shutil.copyfile(os.path.join(ROOT, f), root / f)
    for f in ("pyproject.toml", "setup.py"):
        shutil.copyfile(os.path.join(ROOT, "python", f), root / "python" / f)
    return root


def test_this_checkout_is_consistent():
    out = _check(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"release-check: ok ({header_version()})" in out.stdout


def test_drift_is_caught(tmp_path):
    root = _copy(tmp_path)
    assert _check(root).returncode == 0
    log = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    (root / "CHANGELOG.md").write_text(log.replace(f"## {header_version()}", "## 9.9.9", 1),
                                       encoding="utf-8")
    out = _check(root)
    assert out.returncode == 1 and "CHANGELOG.md's top entry is '9.9.9" in out.stderr

    root = _copy(tmp_path / "b")
    toml = (root / "python" / "pyproject.toml").read_text(encoding="utf-8")
    (root / "python" / "pyproject.toml").write_text(
        toml.replace('dynamic = ["version"]', 'version = "0.0.1"'), encoding="utf-8")
    out = _check(root)
    assert out.returncode == 1 and "python/pyproject.toml says 0.0.1" in out.stderr


def test_release_needs_a_released_entry(tmp_path):
    root = _copy(tmp_path)
    log = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    top = f"## {header_version()}"
    line = next(l for l in log.splitlines() if l.startswith(top))
    unreleased = log.replace(line, top + " (unreleased)", 1)
    (root / "CHANGELOG.md").write_text(unreleased, encoding="utf-8")
    out = _check(root, "--release")
    assert out.returncode == 1 and "still says unreleased" in out.stderr
    (root / "CHANGELOG.md").write_text(log.replace(line, top + " (2026-12-04)", 1), encoding="utf-8")
    assert _check(root, "--release").returncode == 0
