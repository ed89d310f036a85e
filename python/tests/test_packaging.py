"""Library lookup and packaging."""
import ctypes
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import needle
from conftest import header_version
from needle import _lib

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, env_update, cwd):
    env = dict(os.environ)
    env.pop("NEEDLE_LIB_PATH", None)
    env.update(env_update)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def test_no_tools_refuses_first_turn(cq4):
    with pytest.warns(UserWarning, match="has no tools"):
        agent = needle.Needle(weights=cq4)
    with agent:
        r = agent.run("hello")
        assert r["function_calls"] == [] and r["results"] == [] and r["answer"] is None
        assert r["stop"] == "respond"


def test_bad_lib_path(tmp_path):
    out = _run("import needle\ntry:\n    needle.library_version()\nexcept needle.NeedleError "
               "as e:\n    print('ERR', e)\n",
               {"NEEDLE_LIB_PATH": str(tmp_path / "nope.so"), "PYTHONPATH": PKG_ROOT},
               str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ERR libneedle not found") and "NEEDLE_LIB_PATH" in out.stdout


def test_library_next_to_package(tmp_path):
    lib_path = os.environ["NEEDLE_LIB_PATH"]
    dest = tmp_path / "site" / "needle"
    shutil.copytree(os.path.join(PKG_ROOT, "needle"), dest,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copyfile(lib_path, dest / "libneedle.so")
    out = _run("import needle, needle._lib as l\nprint(needle.library_version())\n"
               "l.lib()\nprint(l.library_path)\n",
               {"PYTHONPATH": str(tmp_path / "site")}, str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [header_version(), str(dest / "libneedle.so")]


def test_struct_defaults_match_header():
    p = _lib.lib().needle_complete_default_params()
    assert (p.max_new_tokens, p.max_think_tokens, p.temperature, p.seed, p.turn,
            p.extract) == (256, 64, 0.0, 0, 0, 0)
    s = _lib.lib().needle_session_default_params()
    assert (s.n_ctx, s.kv_window, s.n_sinks, s.kv_type) == (0, -1, 0, 0)
    assert p.size == ctypes.sizeof(_lib.CompleteParams)
    assert s.size == ctypes.sizeof(_lib.SessionParams)


def test_wheel_bundles_library(tmp_path):
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    src = tmp_path / "src"
    shutil.copytree(PKG_ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", "__pycache__", "build", "*.egg-info", "tests"))
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ))  # NEEDLE_LIB_PATH set: copied instead of running CMake
    assert out.returncode == 0, out.stderr
    wheels = list((tmp_path / "dist").glob(f"libneedle-{header_version()}-*.whl"))
    assert len(wheels) == 1
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "needle/libneedle.so" in names and "needle/agent.py" in names
    assert not wheels[0].name.endswith("-none-any.whl")  # a platform wheel


def _build_wheel(src, dest, env_update, drop=()):
    env = dict(os.environ)
    for k in drop:
        env.pop(k, None)
    env.update(env_update)
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(dest), str(src)], capture_output=True, text=True, timeout=300, env=env)


def test_wheel_without_library_fails(tmp_path):
    # A wheel that bundles no library used to build "successfully"; now every way of
    # ending up without one stops the build with the reason.
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    src = tmp_path / "src"  # python/ alone: no ../CMakeLists.txt, no ../include
    shutil.copytree(PKG_ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", "__pycache__", "build", "*.egg-info", "tests"))
    missing = _build_wheel(src, tmp_path / "d1", {"NEEDLE_LIB_PATH": str(tmp_path / "no.so")})
    assert missing.returncode != 0
    assert "does not exist" in missing.stderr + missing.stdout
    assert not list((tmp_path / "d1").glob("*.whl"))
    no_repo = _build_wheel(src, tmp_path / "d2", {}, drop=("NEEDLE_LIB_PATH",))
    assert no_repo.returncode != 0
    assert "needle checkout" in no_repo.stderr + no_repo.stdout
    assert not list((tmp_path / "d2").glob("*.whl"))


def test_wheel_version_from_library(tmp_path):
    # Without the repository's needle.h the version comes from the bundled library.
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    src = tmp_path / "src"
    shutil.copytree(PKG_ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", "__pycache__", "build", "*.egg-info", "tests"))
    out = _build_wheel(src, tmp_path / "dist", {})
    assert out.returncode == 0, out.stderr
    assert len(list((tmp_path / "dist").glob(f"libneedle-{_lib.version()}-*.whl"))) == 1


def test_wheel_failed_cmake_build_fails(tmp_path):
    # A checkout whose C build fails must not give a wheel (it used to be a warning), and
    # the compiler's error must be in what pip prints.
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    repo = tmp_path / "repo"
    shutil.copytree(PKG_ROOT, repo / "python", ignore=shutil.ignore_patterns(
        ".venv", "__pycache__", "build", "*.egg-info", "tests"))
    shutil.copytree(os.path.join(os.path.dirname(PKG_ROOT), "include"), repo / "include")
    (repo / "broken.c").write_text("int needle_broken(void) { return undeclared_name; }\n")
    (repo / "CMakeLists.txt").write_text(
        'cmake_minimum_required(VERSION 3.18)\nproject(broken C)\n'
        'add_library(needle_shared SHARED broken.c)\n')
    out = _build_wheel(repo / "python", tmp_path / "dist", {}, drop=("NEEDLE_LIB_PATH",))
    assert out.returncode != 0
    log = out.stderr + out.stdout
    assert "building libneedle with CMake failed" in log
    assert "undeclared_name" in log and "broken.c" in log  # the compiler's own message
    assert "-DNEEDLE_CUDA=OFF" in log  # the default wheel is CPU-only
    assert not list((tmp_path / "dist").glob("*.whl"))


def test_wheel_build_shows_progress_on_a_terminal(tmp_path):
    # pip hides a build's output unless run with -v; the CMake output still reaches the
    # terminal the user started pip from (here a pseudo-terminal made by script(1)).
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    if shutil.which("cmake") is None or shutil.which("script") is None:
        pytest.skip("needs cmake and script(1)")
    repo = tmp_path / "repo"
    shutil.copytree(PKG_ROOT, repo / "python", ignore=shutil.ignore_patterns(
        ".venv", "__pycache__", "build", "*.egg-info", "tests"))
    shutil.copytree(os.path.join(os.path.dirname(PKG_ROOT), "include"), repo / "include")
    (repo / "stand_in.c").write_text(  # a library that reports the package's version
        f'const char *needle_version(void) {{ return "{header_version()}"; }}\n')
    (repo / "CMakeLists.txt").write_text(
        'cmake_minimum_required(VERSION 3.18)\nproject(stand_in C)\n'
        'add_library(needle_shared SHARED stand_in.c)\n'
        'set_target_properties(needle_shared PROPERTIES OUTPUT_NAME needle)\n')
    pip = f"{shutil.which('env')} -u NEEDLE_LIB_PATH {sys.executable} -m pip wheel -q --no-deps " \
          f"--no-build-isolation -w {tmp_path / 'dist'} {repo / 'python'}"
    out = subprocess.run(["script", "-qec", pip, "/dev/null"], capture_output=True, text=True,
                         timeout=300, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Built target needle_shared" in out.stdout  # CMake's own progress lines
    assert len(list((tmp_path / "dist").glob("*.whl"))) == 1
