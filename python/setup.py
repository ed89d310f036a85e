"""Build hook: compiles libneedle with CMake and bundles it into the package.

`pip install ./python` runs CMake on the repository (the parent of this folder, or the
csrc/ folder of an sdist) and copies the resulting libneedle.so into the installed `needle`
package, where the bindings find it. The CMake output is streamed to the terminal
(/dev/tty, when there is one: pip hides a build's output unless run with -v) and to the
build log that pip prints when the build fails.

The default build is CPU-only and self-contained:
  - the CUDA backend is off (-DNEEDLE_CUDA=OFF) even where nvcc exists, so the library
    needs no libcudart; NEEDLE_BUILD_CUDA=1 builds it in;
  - cJSON, libneedle's one dependency beyond libc/libm/pthreads: Debian ships no static
    libcjson.a, so the libcjson.so.1 the build linked is copied next to libneedle.so (with
    its MIT license) and libneedle.so looks there first (RUNPATH $ORIGIN). Linux only: on
    macOS the library links the system's (Homebrew) cJSON.

Environment:
  NEEDLE_BUILD_CUDA=1 build the CUDA backend too (needs nvcc; the wheel then needs libcudart).
  NEEDLE_BUILD_SERVER=0 leave out needle-serve, the HTTP server `python -m needle serve` runs
                    (bundled by default when libmicrohttpd is there; it loads the system's
                    libmicrohttpd at run time).
  NEEDLE_LIB_PATH   an already built libneedle: it is copied, as it is, instead of running
                    CMake (its dependencies are then the builder's business).
  NEEDLE_SKIP_CMAKE=1  bundle nothing, on purpose; the library is then found at import
                    time through NEEDLE_LIB_PATH (or the repository's build/ folder in a
                    checkout).
  NEEDLE_CMAKE_ARGS extra arguments for the CMake configure step.
The demo model (models/needle-demo.cact and its tool list) is copied into the package as
the default weights.
`pip install -e ./python` (an editable install) puts the library into python/needle/ (git
ignores it), where the package in the source tree finds it.
`python -m build --sdist python` writes an sdist that carries the C sources, the CMake files
and the demo model under csrc/, so that it builds on a machine without the repository.
Anything else that leaves the package without a library (a NEEDLE_LIB_PATH that does not
exist, no CMake, no repository sources, a failed build) stops the build with an error: a
wheel without its library would install "successfully" and fail at the first call.

The version is libneedle's: the NEEDLE_VERSION_* lines of include/needle.h, or, with no
sources around, what the library named by NEEDLE_LIB_PATH reports.
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
from setuptools.command.sdist import sdist
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
# an sdist carries the C sources in csrc/; a checkout has them one level up
SDIST_SOURCES = os.path.join(HERE, "csrc")
REPO = SDIST_SOURCES if os.path.isfile(os.path.join(SDIST_SOURCES, "CMakeLists.txt")) else os.path.dirname(HERE)
LIBNAME = "libneedle.dylib" if sys.platform == "darwin" else "libneedle.so"
CJSON = "libcjson.so.1"
# what the sdist carries of the repository (tests/ are not needed: NEEDLE_BUILD_TESTS=OFF)
SDIST_TREE = ("CMakeLists.txt", "LICENSE", "cmake", "include", "src", "tools",
              "models/needle-demo.cact", "models/needle-demo.tools.json")


def _cmake_bench_sources():
    """The bench/ sources CMakeLists.txt names (executables it declares even when built only
    on request): configuring fails without them, so the sdist carries each one. Read from
    CMakeLists.txt rather than listed here: a list went stale twice when a benchmark was added."""
    path = os.path.join(REPO, "CMakeLists.txt")
    if not os.path.isfile(path):
        return ()
    with open(path, encoding="utf-8") as f:
        return tuple(sorted(set(re.findall(r"\bbench/[\w./-]+\.c\b", f.read()))))


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


def _tty():
    """The terminal pip was started from, for progress that pip would otherwise hide."""
    try:
        return open("/dev/tty", "w")
    except OSError:
        return None


def _run_logged(cmd, tty):
    """Runs cmd with its output streamed to stderr (pip's build log) and to the terminal."""
    print("needle setup: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         errors="replace")
    for line in p.stdout:
        sys.stderr.write(line)
        if tty:
            tty.write(line)
            tty.flush()
    sys.stderr.flush()
    if p.wait():
        raise subprocess.CalledProcessError(p.returncode, cmd)


SERVER = "needle-serve"


def _build_server(cmake, build, tty):
    """Builds the needle-serve executable (`needle serve`, libneedle linked in statically)
    in the same CMake tree; a tree configured without libmicrohttpd has no such target, and
    the wheel then has no server (`python -m needle serve` says how to get one)."""
    try:
        _run_logged([cmake, "--build", build, "--target", "needle_serve", "-j",
                     str(os.cpu_count() or 2)], tty)
    except (OSError, subprocess.CalledProcessError):
        print("needle setup: no needle-serve (libmicrohttpd not found at configure time): "
              "the wheel has no HTTP server", file=sys.stderr)


def _build_library(tmp):
    """(path of the built libneedle, True if CMake built it here)."""
    if os.environ.get("NEEDLE_LIB_PATH"):
        path = os.environ["NEEDLE_LIB_PATH"]
        if not os.path.isfile(path):
            _fail(f"NEEDLE_LIB_PATH={path} does not exist")
        return path, False
    if not os.path.isfile(os.path.join(REPO, "CMakeLists.txt")):
        _fail(f"no CMakeLists.txt in {REPO}: build from a needle checkout, or set "
              "NEEDLE_LIB_PATH to a built libneedle (NEEDLE_SKIP_CMAKE=1 bundles none)")
    cmake = shutil.which("cmake")
    if cmake is None:
        _fail("cmake not found: install CMake, or set NEEDLE_LIB_PATH to a built libneedle")
    build = os.path.join(tmp, "build")
    cuda = os.environ.get("NEEDLE_BUILD_CUDA") == "1"
    cfg = [cmake, "-S", REPO, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
           "-DNEEDLE_BUILD_TESTS=OFF", "-DNEEDLE_CUDA=" + ("ON" if cuda else "OFF")]
    if sys.platform.startswith("linux"):
        # the bundled libcjson first; the install RPATH in the build tree, because the build
        # RPATH gets an empty (current directory) entry as room for install-time rewriting
        cfg += ["-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN"]
    cfg += shlex.split(os.environ.get("NEEDLE_CMAKE_ARGS", ""))
    tty = _tty()
    try:
        _run_logged(cfg, tty)
        _run_logged([cmake, "--build", build, "--target", "needle_shared", "-j",
                     str(os.cpu_count() or 2)], tty)
        if os.environ.get("NEEDLE_BUILD_SERVER", "1") != "0":
            _build_server(cmake, build, tty)
    except (OSError, subprocess.CalledProcessError) as e:
        _fail(f"building libneedle with CMake failed ({e}); the compiler's output is above")
    finally:
        if tty:
            tty.close()
    for root, _, files in os.walk(build):
        if LIBNAME in files:
            return os.path.join(root, LIBNAME), True
    _fail(f"CMake built no {LIBNAME}")


def _linked_cjson(lib):
    """The libcjson.so.1 that the dynamic loader resolves for lib (from ldd)."""
    try:
        out = subprocess.run(["ldd", lib], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        _fail(f"cannot list the libraries {lib} needs (ldd: {e})")
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == CJSON and len(parts) >= 3 and os.path.isfile(parts[2]):
            return parts[2]
    if CJSON in out:
        _fail(f"{lib} needs {CJSON}, which the loader does not find: install libcjson (Debian "
              "libcjson-dev)")
    return None


def _cjson_license():
    """Debian's copyright file of libcjson (MIT), bundled with the library."""
    for pkg in ("libcjson1", "libcjson-dev"):
        path = f"/usr/share/doc/{pkg}/copyright"
        if os.path.isfile(path):
            return path
    return None


DEMO_FILES = ("needle-demo.cact", "needle-demo.tools.json")


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        # An editable install imports the package from this folder: the library goes here.
        editable = getattr(self, "editable_mode", False)
        pkg_dir = os.path.join(HERE if editable else self.build_lib, "needle")
        # the demo model (models/, trained by train/) ships inside the package as the
        # default weights of Needle(); an editable install finds it in the checkout
        for name in DEMO_FILES if not editable else ():
            src = os.path.join(REPO, "models", name)
            if os.path.isfile(src):
                dest = os.path.join(pkg_dir, "models", name)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copyfile(src, dest)
        if os.environ.get("NEEDLE_SKIP_CMAKE") == "1":
            return
        with tempfile.TemporaryDirectory() as tmp:
            lib, built = _build_library(tmp)
            L = ctypes.CDLL(os.path.abspath(lib))
            L.needle_version.restype = ctypes.c_char_p
            have, want = L.needle_version().decode(), self.distribution.get_version()
            if have != want:
                _fail(f"{lib} is libneedle {have}, but this package is {want}: bundle the "
                      "library built from the same source")
            os.makedirs(pkg_dir, exist_ok=True)
            dest = os.path.join(pkg_dir, LIBNAME)
            shutil.copyfile(os.path.realpath(lib), dest)
            os.chmod(dest, 0o755)
            # the HTTP server, for `python -m needle serve`: beside the library CMake built
            # (or the one NEEDLE_LIB_PATH names, when its build folder has it)
            server = os.path.join(os.path.dirname(os.path.abspath(lib)), SERVER)
            if os.path.isfile(server) and os.access(server, os.X_OK):
                shutil.copyfile(os.path.realpath(server), os.path.join(pkg_dir, SERVER))
                os.chmod(os.path.join(pkg_dir, SERVER), 0o755)
                print(f"needle setup: bundled {server} as needle/{SERVER}", file=sys.stderr)
            cjson = _linked_cjson(lib) if built and sys.platform.startswith("linux") else None
            if cjson:
                shutil.copyfile(os.path.realpath(cjson), os.path.join(pkg_dir, CJSON))
                os.chmod(os.path.join(pkg_dir, CJSON), 0o755)
                lic = _cjson_license()
                if lic:
                    shutil.copyfile(lic, os.path.join(pkg_dir, "libcjson.LICENSE"))
                print(f"needle setup: bundled {cjson} as needle/{CJSON} (cJSON, MIT license)",
                      file=sys.stderr)


class SdistWithSources(sdist):
    """Puts the C sources, CMake files and demo model under csrc/ in the sdist."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        for name in SDIST_TREE + _cmake_bench_sources():
            src, dest = os.path.join(REPO, name), os.path.join(base_dir, "csrc", name)
            if os.path.isdir(src):
                shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.o"))
            elif os.path.isfile(src):
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copyfile(src, dest)
            elif not name.startswith("models/"):
                _fail(f"{src} is missing: the sdist needs the repository's sources")
        for name in (LIBNAME, CJSON, "libcjson.LICENSE", SERVER):  # left by an editable install
            stale = os.path.join(base_dir, "needle", name)
            if os.path.exists(stale):
                os.remove(stale)


class BinaryDistribution(Distribution):
    """The wheel carries a native library, so it gets a platform tag."""

    def has_ext_modules(self):
        return True


setup(version=_version(), cmdclass={"build_py": BuildPyWithLibrary, "sdist": SdistWithSources},
      distclass=BinaryDistribution)
