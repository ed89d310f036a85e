#!/usr/bin/env python3
"""needle serve owns its port and counts its prompts (issue 31). Standard library only.

  - a second `needle serve` on a port already served fails at once: a clear message, a
    non-zero exit, and the first server still answers every request (no shared port);
  - usage.prompt_tokens is the prompt's length whatever the prefix cache did: the same
    request three times gives the same count, the cache's saving is
    usage.prompt_tokens_details.cached_tokens (0 the first time, the prefix later);
  - a last message longer than the demo model's attention window (1024 positions) is a
    400 context_length_exceeded, never a 200 answered from its end.
About 15 s.

usage: ownership.py NEEDLE"""
import json
import subprocess
import sys

from serverproc import DEMO, OPENAI_TOOLS, Server

REQUEST = {"model": "m", "messages": [{"role": "user", "content": "Set a timer for 25 minutes"}],
           "tools": OPENAI_TOOLS, "max_tokens": 48}


def main():
    needle = sys.argv[1]
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAIL", what)

    with Server(needle) as s:
        # the port is taken: the second server must refuse it, not share it
        second = subprocess.run([needle, "serve", "--port", str(s.port), "--weights", DEMO],
                                capture_output=True, text=True, timeout=60)
        check(second.returncode != 0, f"second server exit status {second.returncode}")
        check("Address already in use" in second.stderr and "another process" in second.stderr,
              "second server message: " + second.stderr)
        check("listening" not in second.stderr, "second server said it listens: " + second.stderr)
        for _ in range(8):
            status, _ = s.get("/health")
            check(status == 200, f"/health after the refused second server: {status}")

        usages = []
        for _ in range(3):
            status, body, _ = s.post("/v1/chat/completions", REQUEST)
            check(status == 200, f"chat completion status {status}: {body[:200]!r}")
            usages.append(json.loads(body)["usage"])
        prompts = [u["prompt_tokens"] for u in usages]
        cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
        print("usage:", usages)
        check(len(set(prompts)) == 1 and prompts[0] > 0, f"prompt_tokens vary with the cache: {prompts}")
        check(max(cached) > 0 and all(c < prompts[0] for c in cached), f"cached_tokens {cached}")
        check(all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages),
              "total_tokens")

        long = dict(REQUEST, messages=[{"role": "user", "content": " ".join(f"word{i % 50}" for i in range(1000))}])
        status, body, _ = s.post("/v1/chat/completions", long)
        check(status == 400 and b"context_length_exceeded" in body and b"attention window" in body,
              f"overlong message: {status} {body[:300]!r}")
        check(s.stop() == 0, "drain exit status")
    print("ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
