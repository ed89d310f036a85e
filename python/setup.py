"""Build hook: compiles libneedle with CMake and bundles it into the package.

`pip install ./python` runs CMake on the repository (the parent of this folder) and copies
the resulting libneedle.so into the installed `needle` package, where the bindings find it.

Environment:
  NEEDLE_LIB_PATH   an already built libneedle: it is copied instead of running CMake.
  NEEDLE_SKIP_CMAKE=1  bundle nothing, on purpose; the library is then found at import
                    time through NEEDLE_LIB_PATH (or the repository's build/ folder in a
                    checkout).
  NEEDLE_CMAKE_ARGS extra arguments for the CMake configure step, e.g. -DNEEDLE_CUDA=ON.
The demo model (models/needle-demo.cact and its tool list) is copied into the package as
the default weights.
Anything else that leaves the package without a library (a NEEDLE_LIB_PATH that does not
exist, no CMake, no repository sources as in an sdist built elsewhere, a failed build)
stops the build with an error: a wheel without its library would install "successfully"
and fail at the first call.

The version is libneedle's: the NEEDLE_VERSION_* lines of ../include/needle.h, or, with
no repository around, what the library named by NEEDLE_LIB_PATH reports.
"""
import ctypes
import os
import re
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


class LibraryBuildError(RuntimeError):
    pass


def _fail(msg):
    raise LibraryBuildError(f"needle setup: {msg}")


def _version():
    header = os.path.join(REPO, "include", "needle.h")
    if os.path.isfile(header):
        with open(header, encoding="utf-8") as f:
            text = f.read()
        parts = [re.search(rf"^#define NEEDLE_VERSION_{p} (\d+)$", text, re.M)
                 for p in ("MAJOR", "MINOR", "PATCH")]
        if not all(parts):
            _fail(f"{header} has no NEEDLE_VERSION_MAJOR/MINOR/PATCH lines")
        return ".".join(m.group(1) for m in parts)
    lib = os.environ.get("NEEDLE_LIB_PATH")
    if lib and not os.path.isfile(lib):
        _fail(f"NEEDLE_LIB_PATH={lib} does not exist")
    if lib:
        L = ctypes.CDLL(os.path.abspath(lib))
        L.needle_version.restype = ctypes.c_char_p
        return L.needle_version().decode()
    _fail("cannot tell the version: no ../include/needle.h (build from a needle checkout) "
          "and no NEEDLE_LIB_PATH library")


def _build_library(tmp):
    if os.environ.get("NEEDLE_LIB_PATH"):
        path = os.environ["NEEDLE_LIB_PATH"]
        if not os.path.isfile(path):
            _fail(f"NEEDLE_LIB_PATH={path} does not exist")
        return path
    if not os.path.isfile(os.path.join(REPO, "CMakeLists.txt")):
        _fail(f"no CMakeLists.txt in {REPO}: build from a needle checkout, or set "
              "NEEDLE_LIB_PATH to a built libneedle (NEEDLE_SKIP_CMAKE=1 bundles none)")
    cmake = shutil.which("cmake")
    if cmake is None:
        _fail("cmake not found: install CMake, or set NEEDLE_LIB_PATH to a built libneedle")
    build = os.path.join(tmp, "build")
    cfg = [cmake, "-S", REPO, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
           "-DNEEDLE_BUILD_TESTS=OFF"]
    cfg += shlex.split(os.environ.get("NEEDLE_CMAKE_ARGS", ""))
    try:
        subprocess.check_call(cfg)
        subprocess.check_call([cmake, "--build", build, "--target", "needle_shared", "-j",
                               str(os.cpu_count() or 2)])
    except (OSError, subprocess.CalledProcessError) as e:
        _fail(f"building libneedle with CMake failed ({e}); see the output above")
    for root, _, files in os.walk(build):
        if LIBNAME in files:
            return os.path.join(root, LIBNAME)
    _fail(f"CMake built no {LIBNAME}")


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
            L = ctypes.CDLL(os.path.abspath(lib))
            L.needle_version.restype = ctypes.c_char_p
            have, want = L.needle_version().decode(), self.distribution.get_version()
            if have != want:
                _fail(f"{lib} is libneedle {have}, but this package is {want}: bundle the "
                      "library built from the same source")
            dest = os.path.join(self.build_lib, "needle", LIBNAME)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(os.path.realpath(lib), dest)
            os.chmod(dest, 0o755)


class BinaryDistribution(Distribution):
    """The wheel carries a native library, so it gets a platform tag."""

    def has_ext_modules(self):
        return True


setup(version=_version(), cmdclass={"build_py": BuildPyWithLibrary},
      distclass=BinaryDistribution)
