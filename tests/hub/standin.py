"""A loopback stand-in for the Hugging Face Hub's file protocol, for tests without internet.

It answers what `hf_hub_download` and `needle download` ask, the way huggingface.co does:

  HEAD/GET /{org}/{name}/resolve/{revision}/{path}
      LFS files (.cact, .safetensors): 302 to a "CDN" on another origin (http://localhost:PORT
      while the endpoint is http://127.0.0.1:PORT), with X-Repo-Commit, X-Linked-Etag (the
      SHA-256), X-Linked-Size and ETag (the git blob id) on the redirect itself.
      Small files: 200 with ETag (the git blob id), Content-Length, X-Repo-Commit.
      A renamed repo: 307 with a relative Location to its new name.
      Errors with X-Error-Code: RepoNotFound, RevisionNotFound, EntryNotFound (404),
      GatedRepo (401 without a token, 403 with a wrong one).
  GET /cdn/{sha256}       the bytes, with Range (206 + Content-Range)
  GET /api/models/{org}/{name}[/revision/{revision}]  {"id", "sha", "siblings": [{"rfilename"}]}

Knobs (Hub.knobs, per test) for faults on the CDN: cut the body after N bytes (the first
`cut_times` transfers), corrupt a byte, answer 429 (or 503) the first N times, send slowly.
Every request is logged (method, path, Range, whether Authorization came) in Hub.log.
"""
import hashlib
import http.server
import json
import threading
import time
import urllib.parse

GIT_BLOB = lambda data: hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: E731
LFS_SUFFIXES = (".cact", ".safetensors", ".bin")


class Repo:
    def __init__(self, files, commit=None, gated=False, other_revisions=None):
        self.files = dict(files)  # name -> bytes
        self.commit = commit or hashlib.sha1(repr(sorted(self.files)).encode()).hexdigest()
        self.gated = gated
        # revision name -> (commit, files) besides main
        self.revisions = {"main": (self.commit, self.files)}
        for name, (c, f) in (other_revisions or {}).items():
            self.revisions[name] = (c, dict(f))

    def at(self, revision):
        if revision in self.revisions:
            return self.revisions[revision]
        for commit, files in self.revisions.values():
            if commit == revision:
                return commit, files
        return None


class Hub:
    def __init__(self, token="hf_standin_secret_token"):
        self.repos = {}
        self.renamed = {}  # old repo id -> new repo id
        self.token = token
        self.knobs = {}
        self.log = []
        self.counts = {}
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"hub": self})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.cdn = f"http://localhost:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def add(self, repo_id, files, **kw):
        self.repos[repo_id] = Repo(files, **kw)
        return self.repos[repo_id]

    def blob(self, sha):
        for repo in self.repos.values():
            for _, files in repo.revisions.values():
                for data in files.values():
                    if hashlib.sha256(data).hexdigest() == sha:
                        return data
        return None

    def count(self, key):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            return self.counts[key]

    def cdn_gets(self, sha=None):
        return [e for e in self.log if e["method"] == "GET" and e["path"].startswith("/cdn/")
                and (sha is None or sha in e["path"])]


class _Handler(http.server.BaseHTTPRequestHandler):
    hub = None
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _record(self):
        with self.hub.lock:
            self.hub.log.append({
                "method": self.command, "path": self.path, "host": self.headers.get("Host"),
                "range": self.headers.get("Range"),
                "auth": self.headers.get("Authorization") is not None,
            })

    def _send(self, status, headers=(), body=b"", head=False):
        self.send_response(status)
        has_length = False
        for k, v in headers:
            self.send_header(k, v)
            has_length |= k.lower() == "content-length"
        if not has_length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _error(self, status, code, head, extra=()):
        msg = json.dumps({"error": code}).encode()
        self._send(status, [("X-Error-Code", code), ("Content-Type", "application/json"),
                            *extra], msg, head)

    def _auth_ok(self, repo):
        if not repo.gated:
            return None
        got = self.headers.get("Authorization")
        if got is None:
            return 401
        return None if got == f"Bearer {self.hub.token}" else 403

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    def _route(self, head):
        self._record()
        path = urllib.parse.urlsplit(self.path).path
        parts = [urllib.parse.unquote(p) for p in path.split("/")[1:]]
        if len(parts) >= 2 and parts[0] == "cdn":
            return self._cdn(parts[1], head)
        if len(parts) >= 6 and parts[0] == "api" and parts[1] == "models" and parts[4] == "revision":
            return self._listing("/".join(parts[2:4]), "/".join(parts[5:]), head)
        if len(parts) == 4 and parts[0] == "api" and parts[1] == "models":
            return self._listing("/".join(parts[2:4]), "main", head)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
        self._error(404, "NotFound", head)

    def _repo(self, repo_id, revision, head, relative_tail):
        if repo_id in self.hub.renamed:
            # a renamed repo: a relative redirect on the hub's own origin
            new = self.hub.renamed[repo_id]
            self._send(307, [("Location", "/" + new + relative_tail)], b"", head)
            return None
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", head)
            return None
        denied = self._auth_ok(repo)
        if denied:
            self._error(denied, "GatedRepo", head)
            return None
        at = repo.at(revision)
        if at is None:
            self._error(404, "RevisionNotFound", head)
            return None
        return at

    def _resolve(self, repo_id, revision, filename, head):
        tail = "/resolve/" + urllib.parse.quote(revision, safe="") + "/" + urllib.parse.quote(filename)
        at = self._repo(repo_id, revision, head, tail)
        if at is None:
            return
        commit, files = at
        k = self.hub.knobs
        if k.get("head_429") and self.hub.count("head_429") <= k["head_429"]:
            return self._send(429, [("Retry-After", "0")], b"", head)
        if filename not in files:
            return self._error(404, "EntryNotFound", head, [("X-Repo-Commit", commit)])
        data = files[filename]
        if filename.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(data).hexdigest()
            headers = [("X-Repo-Commit", commit), ("X-Linked-Etag", f'"{sha}"'),
                       ("X-Linked-Size", str(len(data))), ("ETag", f'"{GIT_BLOB(data)}"'),
                       ("Location", f"{self.hub.cdn}/cdn/{sha}?X-Amz-Signature=standin")]
            if k.get("no_commit"):
                headers = headers[1:]
            return self._send(302, headers, b"", head)
        headers = [("X-Repo-Commit", commit), ("ETag", f'"{GIT_BLOB(data)}"'),
                   ("Content-Type", "application/octet-stream")]
        self._send(200, headers, data, head)

    def _listing(self, repo_id, revision, head):
        at = self._repo(repo_id, revision, head, "")
        if at is None:
            return
        commit, files = at
        body = json.dumps({"id": repo_id, "sha": commit,
                           "siblings": [{"rfilename": f} for f in sorted(files)]}).encode()
        self._send(200, [("Content-Type", "application/json")], body, head)

    def _cdn(self, sha, head):
        data = self.hub.blob(sha)
        if data is None:
            return self._send(404, [], b"no such blob", head)
        k = self.hub.knobs
        if self.headers.get("Authorization"):
            # the token must never leave the hub for the CDN
            self.hub.count("cdn_auth")
        if k.get("cdn_429") and self.hub.count("cdn_429") <= k["cdn_429"]:
            return self._send(429, [("Retry-After", "0")], b"slow down", head)
        if k.get("cdn_503") and self.hub.count("cdn_503") <= k["cdn_503"]:
            return self._send(503, [], b"unavailable", head)
        if k.get("corrupt"):
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        rng = self.headers.get("Range")
        status, headers = 200, []
        if rng and rng.startswith("bytes=") and rng.endswith("-") and not k.get("ignore_range"):
            start = int(rng[6:-1])
            if start >= len(data):
                return self._send(416, [("Content-Range", f"bytes */{len(data)}")], b"", head)
            status = 206
            headers.append(("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}"))
        body = data[start:]
        headers += [("Content-Length", str(len(body))), ("Accept-Ranges", "bytes"),
                    ("ETag", f'"{sha}"')]
        self.send_response(status)
        for key, v in headers:
            self.send_header(key, v)
        self.end_headers()
        if head:
            return
        cut = None
        if k.get("cut_after") is not None and self.hub.count("cut") <= k.get("cut_times", 1):
            cut = k["cut_after"]
        delay = k.get("slow")  # seconds per 4 KiB
        sent = 0
        try:
            while sent < len(body):
                n = min(4096, len(body) - sent)
                if cut is not None and sent + n > cut:
                    n = cut - sent
                    if n > 0:
                        self.wfile.write(body[sent:sent + n])
                    self.wfile.flush()
                    # drop the connection mid-body
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body[sent:sent + n])
                sent += n
                if delay:
                    self.wfile.flush()
                    time.sleep(delay)
        except (BrokenPipeError, ConnectionResetError):
            pass


if __name__ == "__main__":
    # a hub to try by hand: python3 standin.py  (then HF_ENDPOINT=... needle download needle3)
    import os
    hub = Hub()
    hub.add("Cactus-Compute/needle3", {"needle3.cact": os.urandom(3 << 20), "config.json": b"{}"})
    with hub:
        print(hub.endpoint, flush=True)
        threading.Event().wait()
