#!/usr/bin/env python3
"""The browser page /try in real headless Chromium, driven over the DevTools protocol
(a small WebSocket client below: standard library only). `needle serve --web WEB` on a
free port; the page loads the WebAssembly engine and the demo model; the test types
"Set a timer for 25 minutes" into the query box and presses Enter, then checks:

  - the page shows the call set_timer {"minutes": 25} (calls list and envelope);
  - no request left the tab during the query (DevTools' network events) and the server
    answered none (its /metrics counters, /metrics itself aside, did not move);
  - a screenshot (OUT/try.png); the page's `?q=` mode gives the same call; malformed
    tools typed into the editor give the engine's error on the page;
  - with a folder lacking the browser build, /try is a 404 that says how to build it.

    browser.py NEEDLE WEB_DIR OUT_DIR     exit 0: passed, 1: failed, 77: no Chromium
"""
import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serve"))
from serverproc import Server  # noqa: E402

QUERY = "Set a timer for 25 minutes"
WANT = [{"name": "set_timer", "arguments": {"minutes": 25}}]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--no-first-run", "--window-size=1200,900"]


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


class WebSocket:
    """A WebSocket client (RFC 6455) enough for DevTools: text frames, masked when sent,
    fragmented replies joined, pings answered."""

    def __init__(self, url):
        m = re.match(r"ws://([^/:]+):(\d+)(/.*)", url)
        self.sock = socket.create_connection((m.group(1), int(m.group(2))), timeout=120)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {m.group(3)} HTTP/1.1\r\nHost: {m.group(1)}:{m.group(2)}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise RuntimeError("the DevTools socket closed during the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError("DevTools refused the WebSocket: " + head.decode(errors="replace"))

    def _exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise RuntimeError("the DevTools socket closed")
            out += chunk
        return out

    def _send_frame(self, opcode, payload):
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def send(self, text):
        self._send_frame(0x1, text.encode())

    def recv(self):
        message = b""
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            mask = self._exact(4) if b1 & 0x80 else None
            payload = self._exact(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            opcode = b0 & 0x0F
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise RuntimeError("DevTools closed the WebSocket")
            message += payload
            if b0 & 0x80:
                return message.decode()

    def close(self):
        self.sock.close()


class DevTools:
    """One page over the DevTools protocol: commands wait for their reply; events are kept."""

    def __init__(self, ws_url):
        self.ws = WebSocket(ws_url)
        self.next_id = 0
        self.events = []

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression, timeout, what):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if self.eval(expression):
                    return
            except RuntimeError:
                pass  # a page between documents (navigating) has no body yet
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout} s waiting for {what}; page said: " +
                           str(self.eval("document.body.innerText")) + "\nconsole: " +
                           json.dumps([e for e in self.events if e["method"] in (
                               "Runtime.consoleAPICalled", "Runtime.exceptionThrown")])[:3000])


def metrics(url):
    """needle_requests_total by route and status class, /metrics itself left out."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for m in re.finditer(r'needle_requests_total\{route="([^"]+)",code="(\w+)"\} (\d+)', text):
        if m.group(1) != "/metrics":
            out[(m.group(1), m.group(2))] = int(m.group(3))
    return out


def start_chromium(exe, profile):
    proc = subprocess.Popen([exe] + CHROMIUM_FLAGS + ["--remote-debugging-port=0",
                            f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    log = ""
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log += line
        m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    raise RuntimeError("Chromium did not open its DevTools port: " + log[-2000:])


def page_target(port):
    deadline = time.time() + 30
    while time.time() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        if pages:
            return pages[0]["webSocketDebuggerUrl"]
        time.sleep(0.2)
    raise RuntimeError("Chromium has no page target")


def typed_query(exe, srv, out_dir, failures):
    profile = tempfile.mkdtemp(prefix="needle-browser-")
    proc, port = start_chromium(exe, profile)
    try:
        dt = DevTools(page_target(port))
        dt.call("Runtime.enable")
        dt.call("Network.enable")
        dt.call("Page.enable")
        t0 = time.time()
        dt.call("Page.navigate", url=srv.url + "/try")
        dt.wait_for("!!document.getElementById('run') && !document.getElementById('run').disabled",
                    120, "the engine and the model to load")
        print(f"page ready (engine + model loaded) in {time.time() - t0:.1f} s:",
              dt.eval("document.getElementById('engine').textContent"))

        before = metrics(srv.url)
        dt.events.clear()
        dt.eval("(() => { const q = document.getElementById('query'); q.value = ''; q.focus(); })()")
        dt.call("Input.insertText", text=QUERY)
        for kind in ("keyDown", "keyUp"):
            dt.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                    windowsVirtualKeyCode=13, nativeVirtualKeyCode=13)
        t1 = time.time()
        dt.wait_for("document.body.dataset.state === 'done'", 120, "the query to finish")
        print(f"query answered in the tab in {time.time() - t1:.1f} s")
        during = [e["params"]["request"]["url"] for e in dt.events
                  if e["method"] == "Network.requestWillBeSent"]
        after = metrics(srv.url)

        typed = dt.eval("document.getElementById('query').value")
        calls = dt.eval("document.getElementById('calls').innerText")
        envelope = dt.eval("document.getElementById('envelope').textContent")
        print("calls shown:", calls)
        shot = base64.b64decode(dt.call("Page.captureScreenshot", format="png")["data"])
        path = os.path.join(out_dir, "try.png")
        with open(path, "wb") as f:
            f.write(shot)
        print(f"screenshot: {path} ({len(shot)} bytes)")

        # ?q= runs the query on load, no typing (what a link to the page can do)
        t2 = time.time()
        dt.call("Page.navigate", url=srv.url + "/try?q=" + urllib.request.quote(QUERY))
        dt.wait_for("document.body.dataset.state === 'done' && location.search !== ''", 120,
                    "the ?q= query")
        linked = dt.eval("document.getElementById('calls').innerText")
        print(f"?q= mode: {linked} in {time.time() - t2:.1f} s")
        if linked != 'set_timer {"minutes":25}':
            failures.append(f"?q= mode: the calls shown are {linked!r}")

        # malformed tools typed into the editor: the engine's error on the page, no crash
        dt.eval("document.getElementById('tools').value = '[{\"name\": '")
        dt.eval("document.body.dataset.state = 'edited'; document.getElementById('run').click()")
        dt.wait_for("document.body.dataset.state === 'done'", 60, "the malformed tools' answer")
        shown = dt.eval("(document.querySelector('#calls .error') || {}).textContent || ''")
        print("malformed tools:", shown)
        if "cannot set the tools" not in shown:
            failures.append(f"malformed tools: the page shows {shown!r}")
        dt.ws.close()

        if typed != QUERY:
            failures.append(f"the query box holds {typed!r}, not the typed query")
        if "set_timer" not in calls or '{"minutes":25}' not in calls:
            failures.append(f"the calls shown are {calls!r}")
        try:
            if json.loads(envelope)["function_calls"] != WANT:
                failures.append(f"envelope: {envelope}")
        except (ValueError, KeyError):
            failures.append(f"no envelope on the page: {envelope!r}")
        if during:
            failures.append(f"the tab sent requests during the query: {during}")
        if after != before:
            failures.append(f"the server answered requests during the query: {before} -> {after}")
        if not any(r == "/try" and c == "2xx" for r, c in before) or any(
                r.startswith("/v1") for r, _ in after):
            failures.append(f"unexpected requests to the server: {after}")
        if len(shot) < 10000:
            failures.append(f"the screenshot is only {len(shot)} bytes")
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def missing_build(needle, failures):
    empty = tempfile.mkdtemp(prefix="needle-noweb-")
    try:
        with Server(needle, "--parallel", "1", "--web", empty) as srv:
            try:
                urllib.request.urlopen(srv.url + "/try", timeout=30)
                failures.append("/try answered 200 without the browser build")
            except urllib.error.HTTPError as e:
                body = e.read().decode()
                if e.code != 404 or "needle-web.wasm" not in body or "needle_web" not in body:
                    failures.append(f"/try without the build: {e.code} {body!r}")
            if srv.stop() != 0:
                failures.append("needle serve did not drain to exit 0: " + srv.log)
    finally:
        shutil.rmtree(empty, ignore_errors=True)


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    needle, web, out_dir = sys.argv[1:]
    exe = chromium()
    if not exe:
        print("skipped: no Chromium (scripts/install-deps.sh --test installs it)")
        return 77
    if not os.path.isfile(os.path.join(web, "needle-web.wasm")):
        print(f"FAIL: no needle-web.wasm in {web} (build the needle_web target of the WASI build)")
        return 1
    os.makedirs(out_dir, exist_ok=True)
    failures = []
    with Server(needle, "--parallel", "1", "--web", os.path.abspath(web)) as srv:
        typed_query(exe, srv, out_dir, failures)
        if srv.stop() != 0:
            failures.append("needle serve did not drain to exit 0: " + srv.log)
    missing_build(needle, failures)
    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
