"""needle.hub: the real Needle models from the Hugging Face Hub, in the cache huggingface_hub
shares, and the default-model rule.

    import needle
    path = needle.download("needle3")      # Cactus-Compute/needle3 needle3.cact
    agent = needle.Needle(tools=[...])     # the newest cached needle3 from now on

``download`` uses huggingface_hub when it is installed (the ecosystem's own client) and
the engine's own client otherwise (``needle download --json``, the C hub client, see
src/hub/hub.h); both write the same cache: $HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub, in huggingface_hub's layout (models--ORG--NAME/snapshots/...).

The default model, when no weights are given (the same rule as the CLI and the C API's
needle_default_model_path): $NEEDLE_MODEL > the newest cached official needle3 (hub cache
at refs/main, else its newest snapshot, else the official package's copy under
~/.cache/cactus-needle/v3/) > the same for needle2 > the bundled demo model.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from typing import List, Optional, Tuple

from ._lib import NeedleError

# SPEC -> (repo, file, the official package's cache folder)
OFFICIAL = {
    "needle3": ("Cactus-Compute/needle3", "needle3.cact", "v3"),
    "needle2": ("Cactus-Compute/needle2", "needle2.cact", "v2"),
    "whistle": ("Cactus-Compute/whistle", "whistle.cact", "whistle"),
}
GENERATION_SPEC = {3: "needle3", 2: "needle2"}
_COMMIT = re.compile(r"[0-9a-f]{40}")
_REPO_PART = re.compile(r"[A-Za-z0-9_.-]+")


def hub_cache_dir() -> str:
    """The hub cache directory, as huggingface_hub names it (it need not exist)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return os.environ[name]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "huggingface", "hub")


def _offline() -> bool:
    return any((os.environ.get(n) or "").upper() in ("1", "ON", "YES", "TRUE")
               for n in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def parse_spec(spec: str) -> Tuple[str, Optional[str], Optional[str]]:
    """(repo, file or None for the repo's one .cact, official cache folder or None) of a
    SPEC: needle3 | needle2 | whistle | checkpoints/NAME | ORG/REPO | ORG/REPO/FILE."""
    if spec in OFFICIAL:
        return OFFICIAL[spec]
    if spec.startswith("checkpoints/"):
        name = spec[len("checkpoints/"):]
        if not name or "/" in name or name in (".", ".."):
            raise NeedleError(f"{spec!r}: checkpoints/NAME takes a file name "
                              "(checkpoints/needle3.safetensors)")
        repo = "Cactus-Compute/" + ("needle2" if name.startswith("needle2") else "needle3")
        return repo, spec, None
    parts = spec.split("/")
    if len(parts) < 2 or not all(_REPO_PART.fullmatch(p) and ".." not in p and "--" not in p
                                 for p in parts[:2]):
        raise NeedleError(f"{spec!r} is not a model: use needle3, needle2, whistle, "
                          "checkpoints/NAME, ORG/REPO or ORG/REPO/FILE")
    file = "/".join(parts[2:]) or None
    if file is not None and any(p in ("", ".", "..") for p in parts[2:]):
        raise NeedleError(f"{file!r} is not a file name inside a repository")
    return "/".join(parts[:2]), file, None


def _storage(repo: str) -> str:
    return os.path.join(hub_cache_dir(), "models--" + repo.replace("/", "--"))


def cached_path(repo: str, file: str, revision: str = "main") -> Optional[str]:
    """snapshots/<commit>/<file> of repo at revision (a branch, tag or commit) if cached."""
    commit = revision
    if not _COMMIT.fullmatch(revision):
        try:
            with open(os.path.join(_storage(repo), "refs", revision)) as f:
                commit = f.read().strip()
        except OSError:
            return None
        if not _COMMIT.fullmatch(commit):
            return None
    path = os.path.join(_storage(repo), "snapshots", commit, file)
    return path if os.access(path, os.R_OK) else None


def _version_key(v: str) -> List[int]:
    return [int(p) if p.isdigit() else -1 for p in v.split(".")]


def official_package_path(folder: str, file: str) -> Optional[str]:
    """The official package's copy (~/.cache/cactus-needle/FOLDER/<version>/FILE), the
    highest version that has one."""
    base = os.path.join(os.path.expanduser("~"), ".cache", "cactus-needle", folder)
    try:
        versions = [v for v in os.listdir(base) if not v.startswith(".")
                    and os.access(os.path.join(base, v, file), os.R_OK)]
    except OSError:
        return None
    if not versions:
        return None
    return os.path.join(base, max(versions, key=_version_key), file)


def cached_official(generation: int) -> Optional[str]:
    """The newest cached official model of a generation (2 or 3), or None."""
    repo, file, folder = OFFICIAL[GENERATION_SPEC[generation]]
    found = cached_path(repo, file)
    if found is None:
        # no refs/main (a download pinned to a commit): the snapshot cached last
        snaps = os.path.join(_storage(repo), "snapshots")
        best = None
        try:
            for commit in os.listdir(snaps):
                path = os.path.join(snaps, commit, file)
                if _COMMIT.fullmatch(commit) and os.access(path, os.R_OK):
                    t = os.lstat(path).st_mtime
                    if best is None or t > best[0]:
                        best = (t, path)
        except OSError:
            pass
        found = best[1] if best else None
    return found or official_package_path(folder, file)


def default_weights(generation: Optional[int] = None, demo: Optional[str] = None,
                    fetch: bool = True) -> Optional[str]:
    """The weights to use when none are named. generation=None: $NEEDLE_MODEL, the newest
    cached needle3, needle2, then `demo`. generation=2 or 3: $NEEDLE_MODEL, else that
    generation's cached official model, else (fetch, and not HF_HUB_OFFLINE=1) downloaded
    as the official package does; offline, a NeedleError that says what to run."""
    env = os.environ.get("NEEDLE_MODEL")
    if env:
        return env
    if generation is None:
        return cached_official(3) or cached_official(2) or demo
    found = cached_official(generation)
    if found or not fetch:
        return found
    spec = GENERATION_SPEC[generation]
    if _offline():
        raise NeedleError(f"generation={generation}: no {spec} model is cached (hub cache "
                          f"{hub_cache_dir()}) and HF_HUB_OFFLINE=1 forbids downloading it: "
                          f"run `needle download {spec}` (or needle.download({spec!r})) with "
                          "the network on")
    return download(spec)


def _cli() -> str:
    """The needle executable: $NEEDLE_CLI, else beside the loaded libneedle (a build
    folder), else on PATH."""
    if os.environ.get("NEEDLE_CLI"):
        return os.environ["NEEDLE_CLI"]
    from . import _lib
    try:
        _lib.lib()
        beside = os.path.join(os.path.dirname(_lib.library_path or ""), "needle")
        if os.access(beside, os.X_OK):
            return beside
    except NeedleError:
        pass
    found = shutil.which("needle")
    if found:
        return found
    raise NeedleError("needle.download needs huggingface_hub (pip install huggingface_hub) "
                      "or the needle command-line tool (set NEEDLE_CLI to it)")


def _download_hf(repo: str, file: Optional[str], folder: Optional[str],
                 revision: Optional[str], force: bool) -> str:
    import huggingface_hub
    from huggingface_hub import hf_hub_download
    if file is None:
        info = huggingface_hub.HfApi().model_info(repo, revision=revision)
        cacts = sorted(s.rfilename for s in info.siblings if s.rfilename.endswith(".cact"))
        if len(cacts) != 1:
            raise NeedleError(f"{repo} holds {len(cacts)} .cact files ({', '.join(cacts)}): "
                              f"name one, {repo}/FILE")
        file = cacts[0]
    try:
        return hf_hub_download(repo, file, revision=revision, force_download=force)
    except Exception as e:  # offline or unreachable: the official package's copy counts too
        local = official_package_path(folder, file) if folder and not force else None
        if local and (revision in (None, "main")):
            return local
        raise NeedleError(f"downloading {repo}/{file}: {e}") from e


def _download_cli(spec: str, revision: Optional[str], force: bool) -> str:
    cmd = [_cli(), "download", spec, "--json"]
    if revision:
        cmd += ["--revision", revision]
    if force:
        cmd.append("--force")
    # on a terminal stderr stays the caller's, for the progress bar (and the message of a
    # failure); otherwise it is kept for the NeedleError
    tty = sys.stderr is not None and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None if tty else subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        why = (r.stderr or "").strip() or f"exit status {r.returncode}, its message is above"
        raise NeedleError(f"needle download {spec} failed: {why}" if tty else why)
    return json.loads(r.stdout)["path"]


def download(spec: str = "needle3", *, revision: Optional[str] = None,
             out: Optional[str] = None, force: bool = False, client: str = "auto") -> str:
    """Fetches a model into the hub cache (unless cached) and returns its path.

    spec: needle3 (default), needle2, whistle, checkpoints/NAME, ORG/REPO (its one .cact)
    or ORG/REPO/FILE. revision: a branch, tag or commit (default main). out: a folder to
    copy the file into (the copy's path is returned). force: fetch again. client: "auto"
    (huggingface_hub when importable, else the engine's client), "huggingface_hub" or
    "needle". Honours HF_ENDPOINT, HF_TOKEN, HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE."""
    repo, file, folder = parse_spec(spec)
    if client not in ("auto", "huggingface_hub", "needle"):
        raise ValueError(f"client must be 'auto', 'huggingface_hub' or 'needle', not {client!r}")
    use_hf = client == "huggingface_hub"
    if client == "auto":
        try:
            import huggingface_hub  # noqa: F401
            use_hf = True
        except ImportError:
            use_hf = False
    path = (_download_hf(repo, file, folder, revision, force) if use_hf
            else _download_cli(spec, revision, force))
    if out is not None:
        os.makedirs(out, exist_ok=True)
        dest = os.path.join(out, os.path.basename(path if file is None else file))
        tmp = dest + ".incomplete"
        shutil.copyfile(path, tmp)
        os.replace(tmp, dest)
        return dest
    return path
