"""Build hook: compiles libneedle with CMake and bundles it into the package.

`pip install ./python` runs CMake on the repository (the parent of this folder) and copies
the resulting libneedle.so into the installed `needle` package, where the bindings find it.

Environment:
  NEEDLE_LIB_PATH   an already built libneedle: it is copied instead of running CMake.
  NEEDLE_SKIP_CMAKE=1  bundle nothing; the library is then found at import time through
                    NEEDLE_LIB_PATH (or the repository's build/ folder in a checkout).
  NEEDLE_CMAKE_ARGS extra arguments for the CMake configure step, e.g. -DNEEDLE_CUDA=ON.
The demo model (models/needle-demo.cact and its tool list) is copied into the package as
the default weights.
A failed or impossible CMake build (no CMake, no C compiler, no repository sources as in
an sdist built elsewhere) is reported as a warning, not an error, for the same fallback.
"""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LIBNAME = "libneedle.dylib" if sys.platform == "darwin" else "libneedle.so"


def _warn(msg):
    sys.stderr.write(f"needle setup: {msg}\n")


def _build_library(tmp):
    if os.environ.get("NEEDLE_LIB_PATH"):
        path = os.environ["NEEDLE_LIB_PATH"]
        if os.path.isfile(path):
            return path
        _warn(f"NEEDLE_LIB_PATH={path} does not exist; trying CMake")
    if not os.path.isfile(os.path.join(REPO, "CMakeLists.txt")):
        _warn("no CMakeLists.txt in the parent folder; not bundling libneedle")
        return None
    cmake = shutil.which("cmake")
    if cmake is None:
        _warn("cmake not found; not bundling libneedle (set NEEDLE_LIB_PATH at run time)")
        return None
    build = os.path.join(tmp, "build")
    cfg = [cmake, "-S", REPO, "-B", build, "-DCMAKE_BUILD_TYPE=Release"]
    cfg += shlex.split(os.environ.get("NEEDLE_CMAKE_ARGS", ""))
    try:
        subprocess.check_call(cfg)
        subprocess.check_call([cmake, "--build", build, "--target", "needle_shared", "-j",
                               str(os.cpu_count() or 2)])
    except (OSError, subprocess.CalledProcessError) as e:
        _warn(f"CMake build failed ({e}); not bundling libneedle")
        return None
    for root, _, files in os.walk(build):
        if LIBNAME in files:
            return os.path.join(root, LIBNAME)
    _warn(f"CMake built no {LIBNAME}; not bundling libneedle")
    return None


DEMO_FILES = ("needle-demo.cact", "needle-demo.tools.json")


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        # the demo model (models/, trained by train/) ships inside the package as the
        # default weights of Needle(); an sdist without it simply has no default
        for name in DEMO_FILES:
            src = os.path.join(REPO, "models", name)
            if os.path.isfile(src):
                dest = os.path.join(self.build_lib, "needle", "models", name)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copyfile(src, dest)
        if os.environ.get("NEEDLE_SKIP_CMAKE") == "1":
            return
        with tempfile.TemporaryDirectory() as tmp:
            lib = _build_library(tmp)
            if lib:
                dest = os.path.join(self.build_lib, "needle", LIBNAME)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copyfile(os.path.realpath(lib), dest)
                os.chmod(dest, 0o755)


class BinaryDistribution(Distribution):
    """The wheel carries a native library, so it gets a platform tag."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
