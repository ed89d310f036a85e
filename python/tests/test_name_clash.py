"""Another distribution installing the top-level module `needle` (the official cactus-needle
does) is detected at import: a warning when it lives elsewhere, ImportError when its files
are mixed into this package's folder."""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(os.path.dirname(HERE), "needle")
PROBE = ("import warnings\nwarnings.simplefilter('always')\n"
         "with warnings.catch_warnings(record=True) as w:\n"
         "    import needle\n"
         "print(needle.Needle.__module__)\n"
         "for x in w:\n    print(x.category.__name__, x.message)\n")


def fake_dist(site, name, version, files):
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("needle\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))


def probe(*path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in path))
    # cwd: `python -c` puts the current folder first on sys.path; the site's parent has none
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=env, timeout=120, cwd=os.path.dirname(str(path[-1])))


def test_no_clash_no_warning(tmp_path):
    site = tmp_path / "site"
    fake_dist(site, "libneedle", "0.2.0", ["needle/__init__.py"])  # ours: not a clash
    out = probe(os.path.dirname(HERE), site)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["needle.agent"]


def test_other_distribution_elsewhere_warns(tmp_path):
    other = tmp_path / "other"
    fake_dist(other, "cactus-needle", "2.0.15", ["needle/__init__.py", "needle/agent/tools.py"])
    (other / "needle").mkdir()
    (other / "needle" / "__init__.py").write_text("raise SystemExit('the other needle')\n")
    out = probe(os.path.dirname(HERE), other)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "needle.agent"
    assert lines[1].startswith("NameClashWarning needle: cactus-needle 2.0.15 also installs "
                               "the top-level module 'needle' (elsewhere on sys.path")
    assert "pip uninstall cactus-needle" in lines[1]


def test_mixed_files_refuse_to_import(tmp_path):
    # What `pip install cactus-needle` then `pip install libneedle` leaves: one needle/ with
    # our files over theirs, their needle/agent/ package shadowing our agent.py.
    site = tmp_path / "site"
    shutil.copytree(PKG, site / "needle", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (site / "needle" / "agent").mkdir()
    (site / "needle" / "agent" / "__init__.py").write_text("")
    fake_dist(site, "libneedle", "0.2.0", ["needle/__init__.py", "needle/agent.py"])
    fake_dist(site, "cactus-needle", "2.0.15", ["needle/__init__.py", "needle/agent/__init__.py"])
    out = probe(site)
    assert out.returncode != 0
    assert "ImportError: needle: the folder" in out.stderr
    assert "cactus-needle 2.0.15" in out.stderr and "pip uninstall cactus-needle libneedle" \
        in out.stderr


def test_mixed_files_without_shadowing_warn(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(PKG, site / "needle", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    fake_dist(site, "needle", "0.0.1", ["needle/__init__.py"])  # PyPI's unrelated `needle`
    out = probe(site)
    assert out.returncode == 0, out.stderr
    assert "NameClashWarning needle: needle 0.0.1 also installs the top-level module " \
        "'needle' (in the same folder, so their files are mixed)" in out.stdout
