"""`python -m needle serve`: finds the needle executable beside the library and runs its
HTTP server, which answers /health and exits 0 after SIGTERM."""
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest

from needle.__main__ import find_cli


def test_unknown_command_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "needle", "frobnicate"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown command" in r.stderr


def test_serve_starts_and_drains():
    if not find_cli():
        pytest.skip("no needle executable beside libneedle, in $NEEDLE_CLI or on PATH")
    p = subprocess.Popen([sys.executable, "-m", "needle", "serve", "--port", "0", "--parallel", "1"],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    line = p.stderr.readline()
    if "without HTTP support" in line:
        p.wait()
        pytest.skip("needle was built without libmicrohttpd")
    try:
        m = re.search(r"listening on http://\S+:(\d+) ", line)
        assert m, line
        with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/health", timeout=30) as r:
            assert r.status == 200 and b'"sessions":1' in r.read()
    finally:
        p.send_signal(signal.SIGTERM)
        rest = p.communicate(timeout=60)[1]
    assert p.returncode == 0, rest
    assert "stopped" in rest
