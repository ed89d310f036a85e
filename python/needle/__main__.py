"""`python -m needle serve [options]`: the OpenAI-compatible HTTP server.

The server is the `needle` executable's `serve` command (C, libmicrohttpd; see
docs/serve.md); this entry point finds that executable and runs it in place of the Python
process, so signals (SIGTERM drains) and the exit status are the server's own. It looks in
$NEEDLE_CLI, beside the libneedle this package loads (a CMake build folder, or
PREFIX/lib -> PREFIX/bin), then on PATH."""
import os
import shutil
import sys

USAGE = """usage: python -m needle serve [options]   (`python -m needle serve --help` for the options)

Runs the needle executable's HTTP server: POST /v1/chat/completions (OpenAI's API),
POST /v1/needle/complete, GET /v1/models, /health, /metrics and a playground at /."""


def _is_executable(path):
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def find_cli():
    """Path of the `needle` executable, or None."""
    env = os.environ.get("NEEDLE_CLI")
    if env:
        return env if _is_executable(env) else None
    candidates = []
    try:
        from . import _lib
        _lib.lib()
        if _lib.library_path:
            here = os.path.dirname(os.path.abspath(_lib.library_path))
            candidates += [os.path.join(here, "needle"), os.path.join(here, "..", "bin", "needle")]
    except Exception:  # no library: PATH may still have the executable
        pass
    candidates.append(shutil.which("needle"))
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
        print("python -m needle serve: the needle executable was not found ($NEEDLE_CLI, beside "
              "libneedle, PATH); build it with CMake (it is the `needle` target) and set "
              "NEEDLE_CLI to its path", file=sys.stderr)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [exe] + argv)
    return 1  # not reached: execv replaces the process or raises


if __name__ == "__main__":
    sys.exit(main())
