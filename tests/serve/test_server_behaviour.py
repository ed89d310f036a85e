"""needle serve under pressure: a full queue answers 503 with Retry-After, a client that
goes away frees its session at once, and SIGTERM lets the request in flight finish
before the server exits 0."""
import http.client
import json
import os
import socket
import threading
import time

from serverproc import OPENAI_TOOLS, Server

NEEDLE = os.environ["NEEDLE_CLI"]
# ~900 tokens: a slow prefill that still fits the demo model's 1,024-position window (a
# longer last message is a 400 context_length_exceeded since the server flags overlong input)
LONG = "Please check the weather for the trip. " * 110


def chat_body(text, stream=False):
    return {"model": "needle", "stream": stream, "max_tokens": 64, "tools": OPENAI_TOOLS,
            "messages": [{"role": "user", "content": text}]}


def health(srv):
    return json.loads(srv.get("/health")[1])


def test_full_queue_is_503_with_retry_after():
    with Server(NEEDLE, "--parallel", "1", "--queue", "1") as srv:
        results = []

        def worker():
            results.append(srv.post("/v1/chat/completions", chat_body(LONG)))

        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = sorted(r[0] for r in results)
        assert 503 in codes and 200 in codes, codes
        busy = [r for r in results if r[0] == 503][0]
        assert busy[2].get("Retry-After") == "1"
        assert json.loads(busy[1])["error"]["code"] == "server_overloaded"
        assert srv.stop() == 0


def test_client_gone_frees_the_session():
    with Server(NEEDLE, "--parallel", "1") as srv:
        for stream in (False, True):
            s = socket.create_connection(("127.0.0.1", srv.port))
            body = json.dumps(chat_body(LONG, stream)).encode()
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            deadline = time.time() + 30
            while health(srv)["sessions_busy"] == 0 and time.time() < deadline:
                time.sleep(0.01)
            s.close()
            t0 = time.time()
            while health(srv)["sessions_busy"] and time.time() - t0 < 30:
                time.sleep(0.01)
            assert health(srv)["sessions_busy"] == 0
            # the session serves the next request normally
            status, data, _ = srv.post("/v1/chat/completions", chat_body("Set a timer for 5 minutes"))
            assert status == 200, data
            calls = json.loads(data)["choices"][0]["message"]["tool_calls"]
            assert calls[0]["function"]["name"] == "set_timer"
        _, metrics = srv.get("/metrics")
        assert b'code="4xx"' in metrics  # the cancelled requests are counted (499)
        assert srv.stop() == 0


def test_sigterm_drains_the_request_in_flight():
    with Server(NEEDLE, "--parallel", "1") as srv:
        result = {}

        def worker():
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
            conn.request("POST", "/v1/chat/completions", json.dumps(chat_body(LONG)),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            result["status"], result["body"] = r.status, r.read()

        t = threading.Thread(target=worker)
        t.start()
        deadline = time.time() + 30
        while health(srv)["sessions_busy"] == 0 and time.time() < deadline:
            time.sleep(0.01)
        assert srv.stop() == 0, srv.log
        t.join()
        assert result["status"] == 200, result
        assert json.loads(result["body"])["choices"][0]["finish_reason"] in ("tool_calls", "stop")
        assert "draining" in srv.log and "stopped" in srv.log
