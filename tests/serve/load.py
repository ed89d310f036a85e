#!/usr/bin/env python3
"""Load test for `needle serve` on loopback: C concurrent clients for S seconds each, over
a fixed mix of requests (three tool sets, so the prefix cache both hits and misses; both
endpoints; a third of them streamed). Every request is first served alone; under load each
answer must equal that one (greedy decoding is deterministic), with 0 errors. Prints
requests/s, completion tokens/s, p50/p95 latency, the prefix-cache hit rate (from /metrics)
and the server's peak RSS. Standard library only.

usage: load.py NEEDLE [--clients 64] [--seconds 20] [--parallel N] [--json FILE]
       (--clients takes a comma-separated list to measure several levels, one server each)
       load.py --url http://HOST:PORT [--pid PID] ...   another OpenAI-compatible server
       (needle-openai, for the side-by-side figures): chat requests without streaming only"""
import argparse
import http.client
import json
import os
import sys
import threading
import time

from serverproc import DEMO_TOOLS, OPENAI_TOOLS, Server

QUERIES = ["What's the weather in Paris?", "Set a timer for 25 minutes",
           "Email Bob that the meeting moved to 3pm", "Will it rain in Lagos tomorrow?"]
TOOLSETS = [OPENAI_TOOLS, OPENAI_TOOLS[:2], [OPENAI_TOOLS[2], OPENAI_TOOLS[0]]]


def mix():
    reqs = []
    for i, q in enumerate(QUERIES):
        for j, tools in enumerate(TOOLSETS):
            stream = (i + j) % 3 == 0
            reqs.append(("/v1/chat/completions", {"model": "needle", "stream": stream, "max_tokens": 64,
                         "messages": [{"role": "user", "content": q}], "tools": tools}))
        reqs.append(("/v1/needle/complete", {"query": q, "tools": DEMO_TOOLS, "max_tokens": 64}))
    return reqs


def read_sse(body):
    """Tool calls and content rebuilt from chat.completion.chunk events."""
    calls, content, finish, usage = {}, "", None, None
    for line in body.decode().split("\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            raise ValueError("error event: " + line)
        for ch in ev["choices"]:
            d = ch["delta"]
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                c = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                fn = tc.get("function", {})
                c["name"] += fn.get("name") or ""
                c["arguments"] += fn.get("arguments") or ""
            finish = ch.get("finish_reason") or finish
    return [calls[i] for i in sorted(calls)], content, finish


def answer(path, status, body, stream):
    """The part of a response that must not depend on load: status and the calls."""
    if status != 200:
        return ("status", status), 0
    if path == "/v1/needle/complete":
        env = json.loads(body)
        return ("calls", json.dumps(env["function_calls"], sort_keys=True)), env["server"]["completion_tokens"]
    if stream:
        calls, content, finish = read_sse(body)
        calls = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in calls]
        return ("calls", json.dumps(calls, sort_keys=True), finish), None
    r = json.loads(body)
    msg = r["choices"][0]["message"]
    calls = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
             for c in msg.get("tool_calls") or []]
    return ("calls", json.dumps(calls, sort_keys=True), r["choices"][0]["finish_reason"]), r["usage"]["completion_tokens"]


def request(port, path, body, conn=None):
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    data = json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json"})
    r = conn.getresponse()
    return conn, r.status, r.read()


class External:
    """A server started elsewhere (--url), with the calls Server offers that load needs."""

    def __init__(self, url, pid):
        self.url, self.pid = url.rstrip("/"), pid
        self.port = int(self.url.rsplit(":", 1)[1])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def get(self, path):
        return 404, b""

    def rss_kb(self):
        if not self.pid:
            return 0
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        return 0


def run_level(needle, clients, seconds, parallel, reqs, external=None):
    out = {"clients": clients}
    args = ["--queue", str(max(64, clients))]
    if parallel:
        args += ["--parallel", str(parallel)]
    with (external or Server(needle, *args)) as srv:
        alone = []
        for path, body in reqs:
            _, status, data = request(srv.port, path, body)
            alone.append(answer(path, status, data, body.get("stream"))[0])
            if status != 200:
                raise SystemExit(f"served alone, {path} answered {status}: {data[:300]}")
        lat, errors, mismatches, tokens, lock = [], [], [], [0], threading.Lock()
        stop_at = time.time() + seconds

        def client(ci):
            conn = None
            k = ci
            while time.time() < stop_at:
                path, body = reqs[k % len(reqs)]
                t0 = time.time()
                try:
                    conn, status, data = request(srv.port, path, body, conn)
                    got, ntok = answer(path, status, data, body.get("stream"))
                except Exception as e:  # a broken connection is an error too
                    conn = None
                    with lock:
                        errors.append(repr(e))
                    continue
                dt = time.time() - t0
                with lock:
                    lat.append(dt)
                    if status != 200:
                        errors.append((path, status, data[:200]))
                    elif got != alone[k % len(reqs)]:
                        mismatches.append((k % len(reqs), got, alone[k % len(reqs)]))
                    if ntok is None:  # a stream: its usage is not in the events
                        ntok = 0
                    tokens[0] += ntok
                k += 1

        t0 = time.time()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        _, metrics = srv.get("/metrics")
        m = {}
        for line in metrics.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                m[name] = float(value)
        out["rss_mb"] = srv.rss_kb() / 1024
        rc = srv.stop()
    lat.sort()
    n = len(lat)
    out.update(requests=n, errors=len(errors), mismatches=len(mismatches), seconds=wall,
               rps=n / wall, completion_tps=m.get("needle_completion_tokens_total", tokens[0]) / wall,
               p50_ms=1e3 * lat[n // 2] if n else 0, p95_ms=1e3 * lat[min(n - 1, int(n * 0.95))] if n else 0,
               prefix_hit_rate=m.get("needle_prefix_cache_hit_ratio", 0), exit_status=rc)
    for e in errors[:5]:
        print("  error:", e)
    for mm in mismatches[:5]:
        print("  mismatch:", mm)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("needle", nargs="?")
    ap.add_argument("--url")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--clients", default="64")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--parallel", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    reqs = mix()
    if args.url:
        reqs = [(p, dict(b, stream=False)) for p, b in reqs if p == "/v1/chat/completions"]
    elif not args.needle:
        ap.error("give the needle executable or --url")
    results, failed = [], False
    print(f"{'clients':>7} {'requests':>8} {'req/s':>7} {'tok/s':>7} {'p50 ms':>8} {'p95 ms':>8} "
          f"{'hit rate':>8} {'RSS MB':>7} errors")
    for c in [int(x) for x in args.clients.split(",")]:
        external = External(args.url, args.pid) if args.url else None
        r = run_level(args.needle, c, args.seconds, args.parallel, reqs, external)
        results.append(r)
        print(f"{r['clients']:>7} {r['requests']:>8} {r['rps']:>7.1f} {r['completion_tps']:>7.0f} "
              f"{r['p50_ms']:>8.0f} {r['p95_ms']:>8.0f} {r['prefix_hit_rate']:>8.2f} {r['rss_mb']:>7.1f} "
              f"{r['errors']} (+{r['mismatches']} mismatches, exit {r['exit_status']})", flush=True)
        failed |= r["errors"] > 0 or r["mismatches"] > 0 or r["exit_status"] != 0 or r["requests"] == 0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
