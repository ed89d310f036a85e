"""`python -m needle serve [options]`: the OpenAI-compatible HTTP server.

The server is the `needle` executable's `serve` command (C, libmicrohttpd; see
docs/serve.md), whose own executable is needle-serve; a wheel carries needle-serve in the
package. This entry point finds one (find_cli) and runs it in place of the Python process,
so signals (SIGTERM drains) and the exit status are the server's own."""
import os
import shutil
import sys

USAGE = """usage: python -m needle serve [options]   (`python -m needle serve --help` for the options)

Runs the needle executable's HTTP server: POST /v1/chat/completions (OpenAI's API),
POST /v1/needle/complete, GET /v1/models, /health, /metrics and a playground at /."""


def _is_executable(path):
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def find_cli():
    """Path of the executable that serves: $NEEDLE_CLI; the needle-serve an installed
    wheel carries in this package; else `needle` or `needle-serve` beside the loaded
    libneedle (a CMake build folder, or PREFIX/lib -> PREFIX/bin); else on PATH. None if
    there is none. Both take `serve ARGS`."""
    env = os.environ.get("NEEDLE_CLI")
    if env:
        return env if _is_executable(env) else None
    candidates = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "needle-serve")]
    try:
        from . import _lib
        _lib.lib()
        if _lib.library_path:
            here = os.path.dirname(os.path.abspath(_lib.library_path))
            candidates += [os.path.join(here, name) for name in ("needle", "needle-serve")]
            candidates += [os.path.join(here, "..", "bin", name)
                           for name in ("needle", "needle-serve")]
    except Exception:  # no library: PATH may still have the executable
        pass
    candidates += [shutil.which("needle"), shutil.which("needle-serve")]
    for c in candidates:
        if _is_executable(c):
            return os.path.abspath(c)
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] != "serve":
        print(f"python -m needle: unknown command {argv[0]!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    exe = find_cli()
    if not exe:
        print("python -m needle serve: no server executable found (the package's needle-serve, "
              "$NEEDLE_CLI, beside libneedle, PATH): this install was built without "
              "libmicrohttpd; install it (Debian: libmicrohttpd-dev) and reinstall, or build "
              "the `needle` target with CMake and set NEEDLE_CLI to its path", file=sys.stderr)
        return 1
    if not os.environ.get("NEEDLE_MODEL") and not any(
            a == "--weights" or a.startswith("--weights=") for a in argv):
        # the server's default model is the one Needle() uses: the demo model this package
        # carries (an installed wheel), which the executable cannot find by itself
        from .agent import demo_model_path
        demo = demo_model_path()
        if demo:
            os.environ["NEEDLE_MODEL"] = demo
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [exe] + argv)
    return 1  # not reached: execv replaces the process or raises


if __name__ == "__main__":
    sys.exit(main())
