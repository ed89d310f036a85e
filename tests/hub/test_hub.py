"""`needle download` and `needle models` against a loopback stand-in hub (standin.py), after
huggingface_hub's own client has shown that the stand-in speaks the hub's protocol.

Run by tests/hub/run.sh (a pinned private venv with huggingface_hub); NEEDLE_CLI names the
needle binary. No test touches the network or the real ~/.cache: HOME, HF_HOME and the
endpoint are per test."""
import hashlib
import json
import os
import pathlib
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest

import huggingface_hub
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError,
                                    RepositoryNotFoundError)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import standin  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = os.environ.get("NEEDLE_CLI", str(ROOT / "build" / "needle"))
TOKEN = "hf_standin_secret_token"
DEMO = (ROOT / "models" / "needle-demo.cact").read_bytes()


@pytest.fixture(scope="session")
def v3_model(tmp_path_factory):
    """A small Needle 3 .cact (the v3_a fixture checkpoint, exported by our own CLI)."""
    out = tmp_path_factory.mktemp("v3") / "v3.cact"
    fx = ROOT / "tests" / "fixtures" / "export"
    subprocess.run([CLI, "export", str(fx / "v3_a.safetensors"), "--config",
                    str(fx / "v3_a.config.json"), "--v3", "-t",
                    str(ROOT / "tests" / "fixtures" / "tiny_bpe512.model"), "-o", str(out)],
                   check=True, capture_output=True)
    return out.read_bytes()


@pytest.fixture
def hub(v3_model):
    h = standin.Hub(token=TOKEN)
    h.add("Cactus-Compute/needle3", {"needle3.cact": v3_model, "config.json": b'{"a": 1}\n',
                                     "checkpoints/needle3.safetensors": os.urandom(70000)},
          other_revisions={"v1": ("1" * 40, {"needle3.cact": DEMO}),
                           "refs/pr/1": ("f" * 40, {"needle3.cact": DEMO})})
    h.add("Cactus-Compute/needle2", {"needle2.cact": DEMO})
    h.add("org/gated", {"m.cact": os.urandom(30000)}, gated=True)
    h.add("org/two", {"a.cact": b"1" * 100, "b.cact": b"2" * 100, "README.md": b"hi"})
    h.add("org/one", {"only.cact": os.urandom(5000), "README.md": b"hi"})
    h.renamed["org/old-name"] = "Cactus-Compute/needle3"
    with h:
        yield h


@pytest.fixture
def env(tmp_path, hub):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("HF_", "HUGGING", "NEEDLE_MODEL", "XDG_CACHE"))}
    home = tmp_path / "home"
    home.mkdir()
    e.update(HOME=str(home), HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=hub.endpoint,
             HF_HUB_DISABLE_TELEMETRY="1")
    return e


def cache(env):
    return pathlib.Path(env["HF_HOME"]) / "hub"


def needle(env, *args, **kw):
    kw.setdefault("timeout", 120)
    return subprocess.run([CLI, *args], env=env, capture_output=True, text=True, **kw)


def download(env, *args):
    r = needle(env, "download", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def snapshot_files(env):
    return sorted(p for p in cache(env).glob("models--*/snapshots/*/**/*") if not p.is_dir())


# ---- the stand-in, checked with huggingface_hub's own client ------------------------------

def test_standin_satisfies_huggingface_hub(hub, tmp_path, v3_model):
    kw = dict(cache_dir=str(tmp_path / "c"), endpoint=hub.endpoint)
    path = hf_hub_download("Cactus-Compute/needle3", "needle3.cact", **kw)
    assert pathlib.Path(path).read_bytes() == v3_model
    assert os.readlink(path) == "../../blobs/" + sha256(v3_model)
    # a small (non-LFS) file: 200 from the hub itself, cached under its git blob id
    small = hf_hub_download("Cactus-Compute/needle3", "config.json", **kw)
    assert os.path.basename(os.readlink(small)) == standin.GIT_BLOB(b'{"a": 1}\n')
    # nested names, other revisions, a renamed repo (a relative redirect on the hub)
    hf_hub_download("Cactus-Compute/needle3", "checkpoints/needle3.safetensors", **kw)
    assert pathlib.Path(hf_hub_download("Cactus-Compute/needle3", "needle3.cact",
                                        revision="v1", **kw)).read_bytes() == DEMO
    pr = hf_hub_download("Cactus-Compute/needle3", "needle3.cact", revision="refs/pr/1", **kw)
    assert "/snapshots/" + "f" * 40 + "/" in pr
    assert (tmp_path / "c" / "models--Cactus-Compute--needle3" / "refs" / "refs" / "pr" /
            "1").read_text() == "f" * 40
    assert pathlib.Path(hf_hub_download("org/old-name", "needle3.cact",
                                        **kw)).read_bytes() == v3_model
    # the errors the hub's X-Error-Code headers mean
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/missing", "x.cact", **kw)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("Cactus-Compute/needle3", "missing.cact", **kw)
    with pytest.raises(GatedRepoError):
        hf_hub_download("org/gated", "m.cact", **kw)
    hf_hub_download("org/gated", "m.cact", token=TOKEN, **kw)
    # the listing, as model_info reads it
    api = huggingface_hub.HfApi(endpoint=hub.endpoint)
    for info in (api.model_info("org/two"), api.model_info("org/two", revision="main")):
        assert sorted(s.rfilename for s in info.siblings) == ["README.md", "a.cact", "b.cact"]
    assert any(e["path"] == "/api/models/org/two/revision/main" for e in hub.log)
    # the token went to the hub only, never to the CDN
    assert hub.counts.get("cdn_auth", 0) == 0
    assert any(e["auth"] and e["path"].startswith("/org/gated/") for e in hub.log)


# ---- our client ----------------------------------------------------------------------------

def test_plain_download_layout(env, hub, v3_model):
    res = download(env, "needle3")
    repo = hub.repos["Cactus-Compute/needle3"]
    storage = cache(env) / "models--Cactus-Compute--needle3"
    pointer = storage / "snapshots" / repo.commit / "needle3.cact"
    assert res["path"] == str(pointer) and res["commit"] == repo.commit
    assert res["downloaded"] is True and res["size"] == len(v3_model)
    assert res["source"] == "hub-cache" and res["resumed"] is False
    assert os.readlink(pointer) == "../../blobs/" + sha256(v3_model)
    assert pointer.read_bytes() == v3_model
    assert (storage / "refs" / "main").read_text() == repo.commit  # no newline, as hf writes
    assert (cache(env) / ".locks" / "models--Cactus-Compute--needle3" /
            (sha256(v3_model) + ".lock")).exists()
    assert (cache(env) / "CACHEDIR.TAG").read_text().startswith(
        "Signature: 8a477f597d28d172789f06886806bc55\n")
    assert not list(storage.glob("blobs/*.incomplete"))
    # the HEAD went to the hub, the GET to the CDN the redirect named
    assert [e["method"] for e in hub.log if e["path"].startswith("/Cactus-Compute/")] == ["HEAD"]
    assert len(hub.cdn_gets(sha256(v3_model))) == 1
    # cached: the hub is asked which commit main is, nothing is fetched again
    again = download(env, "needle3")
    assert again["downloaded"] is False and again["path"] == res["path"]
    assert len(hub.cdn_gets()) == 1
    # --force fetches again; the path on stdout without --json
    assert download(env, "needle3", "--force")["downloaded"] is True
    r = needle(env, "download", "needle3")
    assert r.returncode == 0 and r.stdout == res["path"] + "\n"


def test_nested_file_and_out_dir(env, hub, tmp_path):
    data = hub.repos["Cactus-Compute/needle3"].files["checkpoints/needle3.safetensors"]
    res = download(env, "checkpoints/needle3.safetensors", "--out", str(tmp_path / "out"))
    assert os.readlink(res["path"]) == "../../../blobs/" + sha256(data)
    assert res["out"] == str(tmp_path / "out" / "needle3.safetensors")
    assert pathlib.Path(res["out"]).read_bytes() == data
    assert not os.path.islink(res["out"])


def test_small_file_revision_and_renamed_repo(env, hub, v3_model):
    res = download(env, "Cactus-Compute/needle3/config.json")
    assert os.path.basename(os.readlink(res["path"])) == standin.GIT_BLOB(b'{"a": 1}\n')
    v1 = download(env, "needle3", "--revision", "v1")
    assert v1["commit"] == "1" * 40 and pathlib.Path(v1["path"]).read_bytes() == DEMO
    storage = cache(env) / "models--Cactus-Compute--needle3"
    assert (storage / "refs" / "v1").read_text() == "1" * 40
    # a revision with slashes (a pull request): quoted whole in the URL, nested under refs/
    pr = download(env, "needle3", "--revision", "refs/pr/1")
    assert pr["commit"] == "f" * 40
    assert (storage / "refs" / "refs" / "pr" / "1").read_text() == "f" * 40
    assert any("/resolve/refs%2Fpr%2F1/" in e["path"] for e in hub.log)
    # a commit as revision: no ref, and once cached no request at all
    n = len(hub.log)
    assert download(env, "needle3", "--revision", "1" * 40)["path"] == v1["path"]
    assert len(hub.log) == n
    moved = download(env, "org/old-name/needle3.cact")
    assert pathlib.Path(moved["path"]).read_bytes() == v3_model


def test_repo_listing(env, hub):
    res = download(env, "org/one")
    assert res["file"] == "only.cact"
    assert any(e["path"] == "/api/models/org/one/revision/main" for e in hub.log)
    r = needle(env, "download", "org/two")
    assert r.returncode == 1 and "a.cact" in r.stderr and "b.cact" in r.stderr
    r = needle(env, "download", "org/two", "--revision", "nope")
    assert r.returncode == 1 and "revision 'nope' not found" in r.stderr
    # offline, the cached snapshot answers the listing
    off = dict(env, HF_HUB_OFFLINE="1")
    assert download(off, "org/one")["path"] == res["path"]


def test_both_cache_directions(env, hub, v3_model):
    # ours, then huggingface_hub offline
    ours = download(env, "needle3")
    theirs = hf_hub_download("Cactus-Compute/needle3", "needle3.cact", cache_dir=str(cache(env)),
                             local_files_only=True)
    assert theirs == ours["path"]
    # huggingface_hub, then ours offline (no request reaches the hub)
    got = hf_hub_download("Cactus-Compute/needle2", "needle2.cact", cache_dir=str(cache(env)),
                          endpoint=hub.endpoint)
    n = len(hub.log)
    res = download(dict(env, HF_HUB_OFFLINE="1"), "needle2")
    assert res["path"] == got and res["downloaded"] is False
    assert len(hub.log) == n


def test_cut_transfer_resumed_in_the_same_run(env, hub, v3_model):
    hub.knobs.update(cut_after=50000, cut_times=1)
    res = download(env, "needle3")
    assert res["resumed"] is True
    assert pathlib.Path(res["path"]).read_bytes() == v3_model
    ranges = [e["range"] for e in hub.cdn_gets()]
    assert ranges[0] is None and ranges[1] == "bytes=50000-", ranges


def test_cut_transfer_resumed_by_the_next_run(env, hub, v3_model):
    # a first run killed mid-transfer leaves blobs/<sha>.incomplete
    hub.knobs.update(slow=0.05)
    part = cache(env) / "models--Cactus-Compute--needle3" / "blobs" / (sha256(v3_model) + ".incomplete")
    p = subprocess.Popen([CLI, "download", "needle3"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline and (not part.exists() or part.stat().st_size < 8192):
        time.sleep(0.02)
    p.kill()
    p.wait()
    kept = part.stat().st_size
    assert 0 < kept < len(v3_model)
    assert not snapshot_files(env)
    hub.knobs.clear()
    res = download(env, "needle3")
    assert res["resumed"] is True and pathlib.Path(res["path"]).read_bytes() == v3_model
    assert hub.cdn_gets()[-1]["range"] == f"bytes={kept}-"
    assert not part.exists()


def test_corrupted_body_refused(env, hub, v3_model):
    hub.knobs.update(corrupt=True)
    r = needle(env, "download", "needle3")
    assert r.returncode == 1
    assert "checksum" in r.stderr and sha256(v3_model) in r.stderr
    assert not snapshot_files(env)
    assert not list(cache(env).glob("models--*/blobs/*"))


def test_gated_repo_and_token(env, hub):
    r = needle(env, "download", "org/gated/m.cact")
    assert r.returncode == 1 and "gated or private" in r.stderr and "HF_TOKEN" in r.stderr
    r = needle(dict(env, HF_TOKEN="hf_wrong"), "download", "org/gated/m.cact")
    assert r.returncode == 1 and "HTTP 403" in r.stderr and "hf_wrong" not in r.stderr
    r = needle(dict(env, HF_TOKEN=TOKEN), "download", "org/gated/m.cact", "--json")
    assert r.returncode == 0, r.stderr
    assert TOKEN not in r.stdout + r.stderr
    assert json.loads(r.stdout)["size"] == 30000
    # the token went with the HEAD to the hub, not with the GET to the CDN
    assert hub.counts.get("cdn_auth", 0) == 0
    # also from the token file huggingface_hub's login writes ($HF_HOME/token)
    pathlib.Path(env["HF_HOME"], "token").write_text(TOKEN)
    assert needle(env, "download", "org/gated/m.cact", "--force").returncode == 0


def test_not_found_repo_vs_file(env, hub):
    r = needle(env, "download", "org/missing")
    assert r.returncode == 1 and "repository org/missing not found" in r.stderr
    r = needle(env, "download", "Cactus-Compute/needle3/missing.cact")
    assert r.returncode == 1 and "file missing.cact not found in Cactus-Compute/needle3" in r.stderr
    # the missing file is remembered as huggingface_hub does (.no_exist/<commit>/<file>)
    commit = hub.repos["Cactus-Compute/needle3"].commit
    storage = cache(env) / "models--Cactus-Compute--needle3"
    assert (storage / ".no_exist" / commit / "missing.cact").is_file()
    assert (storage / "refs" / "main").read_text() == commit
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.file_download import _CACHED_NO_EXIST
    assert try_to_load_from_cache("Cactus-Compute/needle3", "missing.cact",
                                  cache_dir=str(cache(env))) is _CACHED_NO_EXIST
    r = needle(env, "download", "not-a-spec")
    assert r.returncode == 2 and "needle3" in r.stderr
    r = needle(env, "download", "org/repo/../../etc/passwd")
    assert r.returncode == 2


def test_unreachable_hub_falls_back_to_the_cache(env, hub, tmp_path):
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    n3 = download(env, "needle3")
    official = pathlib.Path(env["HOME"], ".cache", "cactus-needle", "v2", "2.0.4")
    official.mkdir(parents=True)
    (official / "needle2.cact").write_bytes(DEMO)
    down = dict(env, HF_ENDPOINT=dead)
    start = time.time()
    # cached: one try, then the copy (no wait through the retries)
    assert download(down, "needle3")["path"] == n3["path"]
    res = download(down, "needle2")
    assert res["source"] == "official-cache"
    assert time.time() - start < 10
    # not cached: the retries (a hub that keeps answering 429 with Retry-After: 0, so that
    # the test does not wait through the backoff), then an error saying both
    hub.knobs.update(head_429=100)
    r = needle(dict(env, HF_HUB_CACHE=str(tmp_path / "empty")), "download", "needle3")
    assert r.returncode == 1 and "HTTP 429 after 6 tries" in r.stderr, r.stderr
    assert "not cached" in r.stderr and hub.counts["head_429"] == 6


def test_429_and_503_then_success(env, hub, v3_model):
    hub.knobs.update(head_429=1, cdn_429=1, cdn_503=1)
    res = download(env, "needle3")
    assert pathlib.Path(res["path"]).read_bytes() == v3_model
    assert hub.counts["head_429"] >= 2 and hub.counts["cdn_503"] >= 2


def test_not_a_hub(env, hub):
    hub.knobs.update(no_commit=True)
    r = needle(env, "download", "needle3")
    assert r.returncode == 1 and "X-Repo-Commit" in r.stderr


def test_concurrent_downloads_of_one_file(env, hub, v3_model):
    hub.knobs.update(slow=0.003)
    procs = [subprocess.Popen([CLI, "download", "needle3", "--json"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    results = [json.loads(o[0]) for o in outs]
    assert results[0]["path"] == results[1]["path"]
    assert sorted(r["downloaded"] for r in results) == [False, True]
    # the second waited on the lock, then found the blob: one transfer in all
    assert len(hub.cdn_gets()) == 1
    assert pathlib.Path(results[0]["path"]).read_bytes() == v3_model


def test_concurrent_with_huggingface_hub(env, hub, v3_model):
    # one lock for both clients: huggingface_hub's filelock and our flock(2) on the same
    # .locks/<repo>/<etag>.lock, so whichever comes second waits and finds the blob
    hub.knobs.update(slow=0.003)
    p = subprocess.Popen([CLI, "download", "needle3", "--json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    part = cache(env) / "models--Cactus-Compute--needle3" / "blobs" / (sha256(v3_model) + ".incomplete")
    deadline = time.time() + 30
    while time.time() < deadline and not part.exists():
        time.sleep(0.01)
    theirs = hf_hub_download("Cactus-Compute/needle3", "needle3.cact", cache_dir=str(cache(env)),
                             endpoint=hub.endpoint)
    out, errs = p.communicate(timeout=120)
    assert p.returncode == 0, errs
    assert json.loads(out)["path"] == theirs
    assert pathlib.Path(theirs).read_bytes() == v3_model
    assert len(hub.cdn_gets()) == 1


def test_offline_mode(env, hub):
    off = dict(env, HF_HUB_OFFLINE="1")
    r = needle(off, "download", "needle3")
    assert r.returncode == 1
    assert "HF_HUB_OFFLINE=1" in r.stderr and "needle download needle3" in r.stderr
    assert not hub.log
    # the official package's copy counts offline
    official = pathlib.Path(env["HOME"], ".cache", "cactus-needle", "v2", "2.0.4")
    official.mkdir(parents=True)
    (official / "needle2.cact").write_bytes(DEMO)
    res = download(off, "needle2")
    assert res["source"] == "official-cache" and res["path"] == str(official / "needle2.cact")
    assert not hub.log


def _mount_tmpfs(path):
    path.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
                           capture_output=True)
    except FileNotFoundError:
        return False
    return r.returncode == 0


def test_disk_full(env, hub, tmp_path):
    small = tmp_path / "small"
    if _mount_tmpfs(small):
        # a real full disk: a 64 KiB tmpfs for the cache (needle3.cact is 220 kB): ENOSPC
        try:
            r = needle(dict(env, HF_HUB_CACHE=str(small / "hub")), "download", "needle3")
            leftover = sorted(str(p) for p in small.rglob("*") if not p.is_dir())
        finally:
            subprocess.run(["umount", str(small)], check=True)
        assert "No space left on device" in r.stderr
    else:
        # no mount permission: a file size limit (RLIMIT_FSIZE, SIGXFSZ ignored so the
        # write fails with EFBIG instead of killing the process)
        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        e = dict(env, HF_HUB_CACHE=str(small / "hub"))
        r = subprocess.run([CLI, "download", "needle3"], env=e, capture_output=True, text=True,
                           preexec_fn=limit, timeout=120)
        leftover = sorted(str(p) for p in small.rglob("*") if not p.is_dir())
    assert r.returncode == 1 and "disk full" in r.stderr, r.stderr
    assert not any("/snapshots/" in p or "/blobs/" in p for p in leftover), leftover


def test_unwritable_cache(env, hub, tmp_path):
    # a file where a folder must be: fails for root too (chmod does not stop root)
    (tmp_path / "file").write_text("x")
    r = needle(dict(env, HF_HUB_CACHE=str(tmp_path / "file" / "hub")), "download", "needle3")
    assert r.returncode == 1 and "writable" in r.stderr and "Not a directory" in r.stderr
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        r = needle(dict(env, HF_HUB_CACHE=str(ro / "hub")), "download", "needle3")
        assert r.returncode == 1 and "Permission denied" in r.stderr


def models(env):
    r = needle(env, "models", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def default_of(rows):
    d = [m for m in rows if m["default"]]
    assert len(d) == 1, rows
    return d[0]


def test_models_before_and_after(env, hub):
    before = models(env)
    assert [m["source"] for m in before] == ["demo"]
    assert default_of(before)["generation"] == 2
    text = needle(env, "models").stdout
    assert "needle download needle3" in text
    n2 = download(env, "needle2")
    mid = models(env)
    assert default_of(mid)["path"] == n2["path"]
    n3 = download(env, "needle3")
    after = models(env)
    d = default_of(after)
    assert d["path"] == n3["path"] and d["generation"] == 3 and d["source"] == "hub-cache"
    assert d["name"] == "Cactus-Compute/needle3/needle3.cact" and d["revision"] == "main"
    assert {m["source"] for m in after} == {"hub-cache", "demo"}
    # the official package's copy is listed; NEEDLE_MODEL wins over every cache
    official = pathlib.Path(env["HOME"], ".cache", "cactus-needle", "v3", "3.3.3")
    official.mkdir(parents=True)
    shutil.copy(n3["path"], official / "needle3.cact")
    rows = models(env)
    assert any(m["source"] == "official-cache" and m["generation"] == 3 for m in rows)
    assert default_of(rows)["path"] == n3["path"]
    chosen = dict(env, NEEDLE_MODEL=n2["path"])
    assert default_of(models(chosen))["source"] == "env"


def test_default_rule_in_the_cli(env, hub):
    # inspect without --weights opens the default: the demo, then needle2, then needle3
    def inspected(e):
        r = needle(e, "inspect")
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()[0]
    assert "needle-demo.cact" in inspected(env)
    n2 = download(env, "needle2")
    assert n2["path"] in inspected(env)
    n3 = download(env, "needle3")
    assert n3["path"] in inspected(env)
    # without a cached needle3, needle2
    shutil.rmtree(cache(env) / "models--Cactus-Compute--needle3")
    assert n2["path"] in inspected(env)


def test_progress_bar_on_a_terminal(env, hub):
    if not shutil.which("script"):
        pytest.skip("no script(1) to give the download a terminal")
    hub.knobs.update(slow=0.001)
    r = subprocess.run(["script", "-q", "-e", "-c", f"{CLI} download needle3", "/dev/null"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "needle3.cact [" in r.stdout and "100%" in r.stdout and "/s ETA" in r.stdout
    # piped: no bar
    r = needle(env, "download", "needle3", "--force")
    assert r.returncode == 0 and "ETA" not in r.stderr


def test_python_download_uses_huggingface_hub(env, hub, v3_model):
    # needle.download with huggingface_hub importable (this venv): the ecosystem's client
    # writes the cache (a fresh interpreter: huggingface_hub reads HF_* at import)
    e = dict(env, PYTHONPATH=str(ROOT / "python"), NEEDLE_LIB_PATH=os.environ.get(
        "NEEDLE_LIB_PATH", str(ROOT / "build" / "libneedle.so")), NEEDLE_CLI="/nonexistent")
    code = ("import needle, needle.hub as h\n"
            "p = needle.download('needle3')\n"
            "print(p)\n"
            "print(h.default_weights())\n")
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    path, default = r.stdout.split()
    assert pathlib.Path(path).read_bytes() == v3_model and default == path
    assert any(e["path"].startswith("/Cactus-Compute/needle3/resolve/main/") for e in hub.log)
    # ours finds it offline, and agrees on the default
    res = download(dict(env, HF_HUB_OFFLINE="1"), "needle3")
    assert res["path"] == path and res["downloaded"] is False
    assert default_of(models(env))["path"] == path


def test_terminal_says_which_model(env, hub):
    if not shutil.which("script"):
        pytest.skip("no script(1) to give the command a terminal")

    def on_tty(cmd):
        r = subprocess.run(["script", "-q", "-e", "-c", f"{CLI} {cmd}", "/dev/null"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout
        return r.stdout
    out = on_tty("inspect")
    assert "[model: the small demo model" in out and "needle download needle3" in out
    n3 = download(env, "needle3")
    assert f"[model: {n3['path']}]" in on_tty("inspect")
    # piped: nothing extra on stderr
    assert "[model:" not in needle(env, "inspect").stderr
