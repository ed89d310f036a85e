"""Starts `needle serve` on a free loopback port for a test and stops it with SIGTERM,
checking that it drains and exits 0. Standard library only."""
import json
import os
import re
import signal
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "models", "needle-demo.cact")

# The demo model's weather, timer and email tools: a short prefix keeps the tests quick.
_all = json.load(open(os.path.join(ROOT, "models", "needle-demo.tools.json")))
DEMO_TOOLS = [t for t in _all if t["name"] in ("get_weather", "set_timer", "send_email")]
OPENAI_TOOLS = [{"type": "function", "function": t} for t in DEMO_TOOLS]


class Server:
    def __init__(self, needle, *args, env=None):
        self.needle = needle
        self.args = list(args)
        self.env = dict(os.environ, **(env or {}))
        self.proc = None
        self.port = None
        self.log = ""

    def __enter__(self):
        cmd = [self.needle, "serve", "--port", "0", "--weights", DEMO] + self.args
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     env=self.env, text=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("needle serve exited: " + self.log)
            self.log += line
            m = re.search(r"listening on http://\S+:(\d+) ", line)
            if m:
                self.port = int(m.group(1))
                return self
        raise RuntimeError("needle serve did not start: " + self.log)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout=60):
        """SIGTERM; returns the exit status (the drain must end in 0)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rest = self.proc.communicate(timeout=timeout)[1]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rest = self.proc.communicate()[1]
            self.log += rest or ""
            raise RuntimeError("needle serve did not drain in time: " + self.log)
        self.log += rest or ""
        return self.proc.returncode

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.stop()

    def get(self, path, headers=None):
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, path, body, headers=None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers=dict({"Content-Type": "application/json"}, **(headers or {})))
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read(), dict(e.headers)

    def rss_kb(self):
        """Peak resident set (VmHWM) of the server process."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0
