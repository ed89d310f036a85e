"""The playground page in real headless Chromium: the page loads from the server, runs a
query through /v1/needle/complete (the "#run" fragment clicks Run on load) and shows the
call; a screenshot is kept in tests/serve/out/."""
import os
import shutil
import subprocess

import pytest

from serverproc import Server

NEEDLE = os.environ["NEEDLE_CLI"]
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.skipif(chromium() is None, reason="no Chromium (scripts/install-deps.sh --test installs it)")
def test_playground_runs_a_query():
    os.makedirs(OUT, exist_ok=True)
    with Server(NEEDLE, "--parallel", "1") as srv:
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--virtual-time-budget=30000", "--window-size=1200,800"]
        dom = subprocess.run([chromium()] + flags + ["--dump-dom", srv.url + "/#run"],
                             capture_output=True, text=True, timeout=180).stdout
        shot = os.path.join(OUT, "playground.png")
        subprocess.run([chromium()] + flags + ["--screenshot=" + shot, srv.url + "/#run"],
                       capture_output=True, timeout=180)
        assert srv.stop() == 0
    assert "needle playground" in dom
    assert "needle-demo.cact" in dom                    # /model was read
    assert 'class="call"><b>get_weather</b>' in dom, dom[-3000:]  # the demo query's call
    assert '"function_calls"' in dom                    # the envelope is shown
    assert 'id="keyrow" hidden' in dom                  # no key asked: the server needs none
    assert os.path.getsize(shot) > 10000
