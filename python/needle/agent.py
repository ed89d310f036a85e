"""Models, sessions and the tool-calling loop."""
from __future__ import annotations

import ctypes
import datetime
import json
import os
import re
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional

from . import _lib
from ._lib import NeedleError, check, lib
from .schema import convert_arguments, is_pydantic_model, tool_schema, tool_schemas

__all__ = ["Needle", "ExtractionValidationError", "extract", "validate_calls", "devices",
           "default_backend", "BACKENDS"]

# The backend names the engine knows; which of them are built into the loaded library
# and find a device is what devices() reports.
BACKENDS = ("cpu", "cuda", "metal")
_ENVELOPE_CAP = 1 << 20
_UNBOUNDED_CTX = 1 << 20


# ---------------------------------------------------------------------------------------
# Backends: what the engine reports (needle_device_count / needle_device_get /
# needle_default_backend), so a CUDA or Metal build lists its GPU here

def devices() -> List[Dict[str, Any]]:
    """The devices of every backend compiled into libneedle that finds one (the CPU is
    always there): dicts with "backend", "name", "memory_bytes" (0 if unknown),
    "compute_units", "capability" and "default" (True for the device a model opened
    with default settings would use)."""
    L = lib()
    out = []
    for i in range(L.needle_device_count()):
        d = _lib._new(_lib.DeviceInfo)
        check(L.needle_device_get(i, ctypes.byref(d)))
        out.append({"backend": d.backend.decode(), "name": d.name.decode("utf-8", "replace"),
                    "memory_bytes": int(d.memory_bytes), "compute_units": int(d.compute_units),
                    "capability": d.capability.decode(), "default": bool(d.is_default)})
    return out


def default_backend() -> str:
    """The backend a model opened with default settings would use now (NEEDLE_BACKEND,
    JAX_PLATFORMS and JAX_PLATFORM_NAME honoured); NeedleError if the environment forces
    one that is not available."""
    L = lib()
    name = L.needle_default_backend()
    if name is None:
        msg = (L.needle_last_error() or b"").decode("utf-8", "replace")
        raise NeedleError(msg or "no backend available", -12)
    return name.decode()


def _check_backend(backend: Optional[str]) -> Optional[str]:
    if backend is None or backend == "":
        return None
    if isinstance(backend, str) and backend.lower() in BACKENDS:
        return backend.lower()
    raise NeedleError(f"unknown backend {backend!r}; known backends: " + ", ".join(BACKENDS))


# ---------------------------------------------------------------------------------------
# Models: shared per path (immutable and thread-safe in the engine), reference counted

class _Model:
    def __init__(self, key: tuple, handle: ctypes.c_void_p, window: int, backend: str,
                 generation: int, layers: int):
        self.key = key
        self.handle = handle
        self.kv_window = window
        self.backend = backend
        self.generation = generation
        self.layers = layers  # layers that run: the rung's at a Needle 3 depth
        self.refs = 0


_models: Dict[str, _Model] = {}
_models_lock = threading.RLock()  # reentrant: __del__ may run under it via gc


def demo_model_path() -> Optional[str]:
    """The bundled demo model (installed package), else the repository's models/ folder
    (a checkout), else None."""
    here = os.path.dirname(os.path.abspath(__file__))
    for demo in (os.path.join(here, "models", "needle-demo.cact"),
                 os.path.join(os.path.dirname(os.path.dirname(here)), "models",
                              "needle-demo.cact")):
        if os.path.exists(demo):
            return demo
    return None


def _demo_tools_path(model_path: str) -> Optional[str]:
    """The tool list shipped next to a demo model (needle-demo.cact -> .tools.json)."""
    if not model_path.endswith(".cact"):
        return None
    path = model_path[:-len(".cact")] + ".tools.json"
    return path if os.path.isfile(path) else None


def _tools_from_path(path) -> str:
    """The JSON text of a tools file (a UTF-8 BOM allowed), as the CLI's --tools reads it."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise NeedleError(f"tools: {path} is a directory, not a JSON file")
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except OSError as e:
        raise NeedleError(f"tools: cannot read {path}: {e.strerror}") from None


def _tool_specs(tools: Any) -> List[Any]:
    """The tool specs of ``tools=``: a list (or tuple) of specs; a path (str or PathLike)
    of a JSON file holding one schema or an array; or a JSON string of either."""
    if isinstance(tools, os.PathLike):
        return [_tools_from_path(tools)]
    if isinstance(tools, str):
        if tools.lstrip().startswith(("[", "{")):
            return [tools]
        return [_tools_from_path(tools)]
    if isinstance(tools, (dict, bytes)):
        return [tools]
    return list(tools)


def _now() -> datetime.datetime:
    """The local time of the date fact (the tests fix it, so that a random-weight model's
    answers do not change with the minute)."""
    return datetime.datetime.now()


def _with_date(system: Optional[str]) -> str:
    """``auto_date``: today's local date and time put before the system facts
    ("date: 2026-12-06 Sun 10:12; ..."), unless they already state a date or are a JSON
    object, by the official client's rule, which the library holds
    (needle_system_with_date)."""
    L = lib()
    if not hasattr(L, "needle_system_with_date"):
        raise NeedleError("this libneedle has no needle_system_with_date (older than 0.3): "
                          "rebuild the library from the same source as the package")
    now = _now()
    # lone surrogates pass through as bytes the rule treats as other characters
    text = (system or "").encode("utf-8", "surrogatepass")
    args = (text, now.year, now.month, now.day, now.hour, now.minute)
    n = ctypes.c_size_t(0)
    buf = ctypes.create_string_buffer(len(text) + 64)
    rc = L.needle_system_with_date(*args, buf, len(buf), ctypes.byref(n))
    if rc == _lib.NEEDLE_ERR_BUFFER_TOO_SMALL:
        buf = ctypes.create_string_buffer(n.value + 1)
        rc = L.needle_system_with_date(*args, buf, len(buf), ctypes.byref(n))
    check(rc)
    return buf.raw[:n.value].decode("utf-8", "surrogatepass")


# ---------------------------------------------------------------------------------------
# The year rule the official client adds to the engine's validation: a date or date-time
# argument must carry a year the input writes (with a relative phrase such as "tomorrow",
# also the system date's year); no year written, nothing is checked.

_MONTH = (r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|jun(?:e)?|jul(?:y)?|"
          r"aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?")
# a number right after a day and month is its year, unless it is a clock time
_NOT_A_TIME = r"(?![0-9a-z]|:\d|\s*[ap]\.?m\b)"
_YEAR_PATTERNS = [re.compile(p) for p in (
    rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTH}[\s,]+(\d{{1,4}}){_NOT_A_TIME}",
    rf"\b{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?\s*,?\s+(\d{{1,4}}){_NOT_A_TIME}",
    rf"\b{_MONTH}[\s,]+(\d{{3,4}})(?![0-9a-z])",
    r"\byear\s+(\d{1,4})(?![0-9a-z])",
    r"(?<![0-9])(\d{4})(?=[-/]\d{1,2}[-/]\d{1,2}(?![0-9]))",  # year-first dates only
)]
_RELATIVE = re.compile(
    r"\b(?:today|tonight|tomorrow|yesterday|next|this|coming|now|"
    r"in \d+ (?:days?|weeks?|months?|years?)|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b", re.IGNORECASE)


def _years_in(text: Optional[str]) -> set:
    low = (text or "").lower()
    return {int(m.group(1)) for pat in _YEAR_PATTERNS for m in pat.finditer(low)}


def _licensed_years(seen: set, system: Optional[str], text: Optional[str]) -> set:
    years = set(seen)
    if years and system and (text is None or _RELATIVE.search(text or "")):
        years |= _years_in(system)
    return years


def _bad_years(schema: dict, args: Any, years: set) -> List[str]:
    """Paths (official form: key, key.sub, key[0]) of date / date-time arguments whose year
    is not in `years`."""
    params = schema.get("parameters") if isinstance(schema.get("parameters"), dict) else schema
    bad: List[str] = []

    def deref(node: Any) -> Any:
        for _ in range(16):
            if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)
                    and node["$ref"].startswith("#/")):
                return node
            target: Any = params
            for part in node["$ref"][2:].split("/"):
                target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) \
                    if isinstance(target, dict) else {}
            node = target
        return node

    def walk(node: Any, value: Any, path: str) -> None:
        node = deref(node)
        if not isinstance(node, dict):
            return
        members = [deref(m) for m in (node.get("anyOf") or node.get("oneOf") or [])]
        concrete = [m for m in members if isinstance(m, dict) and m.get("type") != "null"]
        if len(concrete) == 1:
            node = concrete[0]
        if node.get("format") in ("date", "date-time") and isinstance(value, str):
            m = re.match(r"(\d{4})-", value)
            if m and int(m.group(1)) not in years:
                bad.append(path)
            return
        if isinstance(value, dict):
            props = node.get("properties") or {}
            for k, v in value.items():
                if k in props:
                    walk(props[k], v, f"{path}.{k}" if path else k)
        elif isinstance(value, list) and "items" in node:
            for i, v in enumerate(value):
                walk(node["items"], v, f"{path}[{i}]")

    walk(params, args, "")
    return bad


def _add_year_rule(env: dict, tools: List[dict], years: set) -> None:
    """Adds the year rule's paths ("NAME.path") to env["validation"]["ungrounded"]."""
    calls = env.get("function_calls") or env.get("suppressed_calls") or []
    if not calls or not years:
        return
    by_name = {t.get("name"): t for t in tools if isinstance(t, dict)}
    found = []
    for call in calls:
        schema = by_name.get(call.get("name"))
        if schema is not None and isinstance(call.get("arguments"), dict):
            found += [f"{call['name']}.{p}" for p in _bad_years(schema, call["arguments"], years)]
    if found:
        validation = env.get("validation") or {"ungrounded": [], "negation": False}
        flagged = list(validation.get("ungrounded") or [])
        validation["ungrounded"] = flagged + [f for f in found if f not in flagged]
        env["validation"] = validation


def validate_calls(tools: Any, calls: List[dict], text: str = "", system: Optional[str] = None,
                   query: bool = True) -> dict:
    """The engine's validation ({"ungrounded": [...], "negation": bool}) of `calls` against
    `tools` (schemas, as for Needle), the system facts and `text` (negation is looked for
    only when `query`). Needs no model."""
    L = lib()
    if not hasattr(L, "needle_validate_calls"):
        raise NeedleError("this libneedle has no needle_validate_calls (older than 0.3): "
                          "rebuild the library from the same source as the package")
    schemas = []
    for t in _tool_specs(tools):
        schemas += tool_schemas(t)
    args = (json.dumps(schemas, ensure_ascii=False).encode("utf-8"),
            system.encode("utf-8") if system else None, (text or "").encode("utf-8"),
            _lib.TURN_QUERY if query else _lib.TURN_TOOL_RESULT,
            json.dumps(calls, ensure_ascii=False).encode("utf-8"))
    n = ctypes.c_size_t(0)
    buf = ctypes.create_string_buffer(4096)
    rc = L.needle_validate_calls(*args, buf, len(buf), ctypes.byref(n))
    if rc == _lib.NEEDLE_ERR_BUFFER_TOO_SMALL:
        buf = ctypes.create_string_buffer(n.value + 1)
        rc = L.needle_validate_calls(*args, buf, len(buf), ctypes.byref(n))
    check(rc)
    return json.loads(buf.value.decode("utf-8"))


def _resolve_weights(weights: Optional[str], generation: Optional[int] = None) -> str:
    if weights is None:
        # $NEEDLE_MODEL > cached needle3 > needle2 > the demo (hub.py; a generation asked
        # for and not cached is downloaded, as the official package does)
        from .hub import default_weights
        weights = default_weights(generation, demo_model_path())
    if weights is None:
        raise NeedleError("no weights given: pass weights='path/to/model.cact' or set "
                          "NEEDLE_MODEL")
    weights = os.fspath(weights)
    if not os.path.exists(weights):
        raise NeedleError(f"weights file not found: {weights}")
    return os.path.realpath(weights)


def _check_depth(depth: Optional[int]) -> int:
    """``depth=``: None (every layer) or a layer count, passed to the engine as
    needle_model_params.depth (0 = every layer), which checks it against the file."""
    if depth is None:
        return 0
    if isinstance(depth, bool) or not isinstance(depth, int):
        raise TypeError(f"depth must be an int or None, not {type(depth).__name__}")
    if not 0 <= depth < 1 << 31:
        raise NeedleError(f"depth={depth}: a Needle 3 ladder depth is a layer count from 2 "
                          "to the file's layers (0 or None: every layer)", -1)
    return depth


def _acquire_model(path: str, backend: Optional[str] = None, depth: int = 0) -> _Model:
    """The shared model of `path` on `backend` (None: the engine's choice), running the
    `depth`-layer rung of a Needle 3 file (0: every layer)."""
    L = lib()
    key = (path, backend, depth)
    with _models_lock:
        m = _models.get(key)
        if m is None:
            params = L.needle_model_default_params()
            params.backend = backend.encode() if backend else None
            params.depth = depth
            h = ctypes.c_void_p()
            check(L.needle_model_open(path.encode(), ctypes.byref(params), ctypes.byref(h)))
            info = _lib._new(_lib.ModelInfo)
            rc = L.needle_model_get_info(h, ctypes.byref(info))
            if rc:
                L.needle_model_free(h)
                check(rc)
            # a Needle 3 session attends over its whole context (max_seq_len bounds it),
            # so its header kv_window must not unbound the context
            window = int(info.kv_window) if info.generation != 3 else 0
            m = _Model(key, h, window, L.needle_model_backend(h).decode(),
                       int(info.generation), int(info.num_layers))
            _models[key] = m
        m.refs += 1
        return m


def _release_model(m: _Model) -> None:
    with _models_lock:
        m.refs -= 1
        if m.refs == 0:
            if _models.get(m.key) is m:
                del _models[m.key]
            lib().needle_model_free(m.handle)
            m.handle = None


# ---------------------------------------------------------------------------------------
# Sessions

class _Session:
    """One engine conversation (not thread-safe; the owner serializes calls)."""

    def __init__(self, model: _Model, system: Optional[str], tools: List[dict],
                 buffer_size: int = _ENVELOPE_CAP, tool_index_path: Optional[str] = None,
                 min_confidence: float = 0.0):
        L = lib()
        params = L.needle_session_default_params()
        params.n_ctx = _UNBOUNDED_CTX if model.kv_window > 0 else 0
        h = ctypes.c_void_p()
        check(L.needle_session_create(model.handle, ctypes.byref(params), ctypes.byref(h)))
        self.handle = h
        try:
            tools_json = json.dumps(tools, ensure_ascii=False).encode("utf-8")
            sys_b = system.encode("utf-8") if system else None
            tp = L.needle_tools_default_params()
            # kept alive in self until set_tools_ex returns (ctypes holds no reference)
            self._index_b = os.fsencode(tool_index_path) if tool_index_path else None
            tp.tool_index_path = self._index_b
            check(L.needle_session_set_tools_ex(h, sys_b, tools_json, ctypes.byref(tp)))
        except BaseException:
            self.free()
            raise
        self.cap = int(buffer_size)
        self.buf = ctypes.create_string_buffer(self.cap)
        self.last_called = False  # the engine's rule for TURN_AUTO: a result after a call
        self.min_confidence = float(min_confidence)

    def is_result(self, turn: int) -> bool:
        return turn == _lib.TURN_TOOL_RESULT or (turn == _lib.TURN_AUTO and self.last_called)

    def complete(self, text: str, turn: int, max_new_tokens: int, extract: bool = False) -> dict:
        if self.handle is None:
            raise NeedleError("the agent is closed")
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        try:
            data = text.encode("utf-8")
            bad = "holds a NUL character (U+0000) at offset %d" % text.index("\0") \
                if "\0" in text else None
        except UnicodeEncodeError as e:
            bad = f"is not valid Unicode (lone surrogate at offset {e.start})"
        if bad:
            # The C API takes a NUL-terminated string: such a text would reach the engine
            # cut short, so it is refused here, the way the engine refuses bad UTF-8.
            return _invalid_input(f"text {bad}")
        L = lib()
        p = L.needle_complete_default_params()
        p.max_new_tokens = int(max_new_tokens)
        p.turn = turn
        p.extract = 1 if extract else 0
        p.min_confidence = self.min_confidence
        n = ctypes.c_size_t(0)
        rc = L.needle_session_complete(self.handle, data, ctypes.byref(p), self.buf, self.cap,
                                       ctypes.byref(n))
        check(rc)
        raw = ctypes.string_at(self.buf, n.value).decode("utf-8", "replace")
        env = json.loads(raw)
        # the engine's rule (chat.c): a turn that wrote calls makes the next TURN_AUTO text a
        # tool result; a turn whose envelope says "call" with an empty list does not, and a
        # suppressed (low_confidence) turn leaves no trace, so the flag stays as it was
        if env.get("success") and env.get("type") != "low_confidence":
            self.last_called = bool(env.get("function_calls"))
        return env

    def embed(self, text: str) -> List[float]:
        if self.handle is None:
            raise NeedleError("the agent is closed")
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        if "\0" in text:
            raise ValueError("text holds a NUL character (U+0000)")
        L = lib()
        n = ctypes.c_size_t(0)
        out = (ctypes.c_float * 128)()
        rc = L.needle_session_embed(self.handle, text.encode("utf-8"), out, 128, ctypes.byref(n))
        if rc == _lib.NEEDLE_ERR_BUFFER_TOO_SMALL:
            out = (ctypes.c_float * n.value)()
            rc = L.needle_session_embed(self.handle, text.encode("utf-8"), out, n.value,
                                        ctypes.byref(n))
        check(rc)
        return [float(x) for x in out[:n.value]]

    def reset(self) -> None:
        if self.handle is not None:
            lib().needle_session_reset(self.handle)
            self.last_called = False

    def free(self) -> None:
        h, self.handle = self.handle, None
        if h is not None:
            lib().needle_session_free(h)


def _invalid_input(message: str) -> dict:
    """An envelope shaped like the engine's for a refused text (error_code invalid_input)."""
    return {"type": "error", "success": False, "error": message,
            "error_code": "invalid_input", "function_calls": [], "reasoning": "",
            "confidence": None, "validation": {"ungrounded": [], "negation": False},
            "prefill_tps": 0.0, "decode_tps": 0.0, "peak_ram_mb": 0.0}


class ExtractionValidationError(ValueError):
    """``extract(strict=True)``: the extracted values are not supported by the input (an
    ungrounded argument, a date whose year the input does not write) or the request was
    negated."""


# complete() / run() warn once when this many queries went by without reset()
UNRESET_TURNS = 4
_DEFAULT_BUFFER = 65536


# ---------------------------------------------------------------------------------------
# The agent

class Needle:
    """A tool-calling agent: its own model reference and its own engine session.

    The official client's parameters, in its order and with its defaults:
    tools: a list of functions (``@needle.tool`` decorated or plain), pydantic models,
        raw dict schemas or JSON strings; or a JSON string of an array; also (ours) the
        path of a JSON file (as the CLI's --tools), dataclasses and TypedDicts. Functions
        and pydantic models are what ``run`` executes. None: with the default demo model,
        the demo's own tool list (declared only, as the CLI does); otherwise no tools,
        with a warning.
    system: system facts given to the model (optional).
    weights: path of a .cact model; default $NEEDLE_MODEL, else the newest cached needle3,
        else needle2, else the demo model (needle.hub.default_weights).
    tool_index_path: a file caching the tool embeddings of retrieval (with more than 5
        tools and a model with a retrieval head, each conversation sees only the 5 tools
        closest to its first query; README "Tool retrieval"). Made or refreshed as needed.
    buffer_size: bytes of the envelope buffer (default 65536); a longer envelope raises
        NeedleError (status -8).
    auto_date: put today's local date before the system facts ("date: 2026-12-06 Sun
        10:12; ..."), unless they state a date already (default True, as the official).
    generation: the Needle generation of the weights (None: whatever the file is; 2 or 3
        must match the file, other values raise NeedleError). Without weights: that
        generation's cached official model, downloaded when none is cached (an error
        saying what to run under HF_HUB_OFFLINE=1).
    stateless: forget the conversation before every query (every ``run`` and every
        query turn of ``complete``), as if ``reset()`` were called.
    Ours, keyword-only:
    backend: None (the engine's choice: NEEDLE_BACKEND, JAX_PLATFORMS, JAX_PLATFORM_NAME,
        else the first backend that finds a device, CPU last) or "cpu", "cuda", "metal".
        ``self.backend`` is the backend the model actually runs on.
    min_confidence: a reply whose calls have a "confidence" below this comes back as
        ``"type": "low_confidence"`` with the calls in "suppressed_calls" and none in
        "function_calls", so ``run`` executes nothing (default 0: never).
    depth: a Needle 3 ladder rung: run the `depth`-layer model of the file's ladder (the
        CLI's --depth). None: every layer. ``self.depth`` is the number of layers run.

    Every envelope carries "validation" ({"ungrounded": ["NAME.path", ...], "negation":
    bool}; python/README.md "Validation"): computed by the engine, plus the official
    client's year rule for dates. One agent must be used by one thread at a time (calls
    are serialized by a lock); different agents may run concurrently.
    """

    def __init__(self, tools: Any = None, system: Optional[str] = None,
                 weights: Optional[str] = None, tool_index_path: Optional[str] = None,
                 buffer_size: int = _DEFAULT_BUFFER, auto_date: bool = True,
                 generation: Optional[int] = None, stateless: bool = False, *,
                 backend: Optional[str] = None, min_confidence: float = 0.0,
                 depth: Optional[int] = None):
        self._session: Optional[_Session] = None
        self._model: Optional[_Model] = None
        if isinstance(buffer_size, str):
            raise TypeError(f"buffer_size must be a positive int, got {buffer_size!r} (the "
                            "fifth positional parameter is buffer_size, as in the official "
                            "client; pass the backend by name: backend=...)")
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or \
                buffer_size < 1:
            raise ValueError(f"buffer_size must be a positive int, got {buffer_size!r}")
        backend = _check_backend(backend)
        depth_param = _check_depth(depth)
        if generation is not None and (isinstance(generation, bool) or generation not in (2, 3)):
            raise NeedleError(f"generation={generation!r}: this engine runs Needle 2 and "
                              "Needle 3 models (generation 2 or 3)")
        self.stateless = bool(stateless)
        self.system = _with_date(system) if auto_date else system
        self.tool_index_path = tool_index_path
        self.tools: List[dict] = []
        self._functions: Dict[str, Callable] = {}
        self._turns = 0
        self._seen_years: set = set()
        weights_defaulted = weights is None and not os.environ.get("NEEDLE_MODEL")
        self.weights = _resolve_weights(weights, generation)
        if tools is None and weights_defaulted and _demo_tools_path(self.weights):
            tools = _demo_tools_path(self.weights)
        for t in _tool_specs(tools if tools is not None else []):
            schemas = tool_schemas(t)
            for schema in schemas:
                self.tools.append(schema)
            # functions and pydantic models run (a model's "result" is its instance), as
            # with the official client; dataclass / TypedDict specs only declare a tool
            if callable(t) and len(schemas) == 1 and (
                    not isinstance(t, type) or is_pydantic_model(t)):
                self._functions[schemas[0].get("name")] = t
        if not self.tools:
            warnings.warn("needle.Needle has no tools: the model can only answer with an "
                          "empty call list ([]); pass tools=[...] (functions or schemas) "
                          "or tools='tools.json'", UserWarning, stacklevel=2)
        # Names, duplicates and schemas are validated by the engine (NEEDLE_ERR_SCHEMA).
        self._lock = threading.RLock()
        self._model = _acquire_model(self.weights, backend, depth_param)
        self.backend = self._model.backend
        self.depth = self._model.layers
        try:
            if generation is not None and generation != self._model.generation:
                raise NeedleError(f"generation={generation}: {self.weights} is a Needle "
                                  f"{self._model.generation} model")
            self._session = _Session(self._model, self.system, self.tools, buffer_size,
                                     tool_index_path, min_confidence)
        except BaseException:
            _release_model(self._model)
            self._model = None
            raise

    @property
    def _system_text(self) -> str:
        """The system facts as the model reads them (the official client's name)."""
        return self.system or ""

    # -- turns ------------------------------------------------------------------------

    def _count_query(self) -> None:
        self._turns += 1
        if self._turns == UNRESET_TURNS + 1:
            warnings.warn(
                f"{UNRESET_TURNS} queries went to this agent without reset(): each stays in "
                "the conversation and the next query is read in their context, which costs "
                "accuracy on unrelated queries; call reset() between independent queries "
                "or make the agent with stateless=True", UserWarning, stacklevel=3)

    def _turn(self, text: str, turn: int, max_new_tokens: int, extract: bool = False) -> dict:
        """One engine turn, the year rule added to its validation (queries only)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        is_result = self._session.is_result(turn)
        if not is_result and not text.strip():
            # the CLI refuses an empty query too (a usage error): no turn is run
            return _invalid_input("the query is empty")
        env = self._engine(text, turn, max_new_tokens, extract)
        if not is_result:
            self._seen_years |= _years_in(text)
            _add_year_rule(env, self.tools, _licensed_years(self._seen_years, self.system, text))
        return env

    def _engine(self, text: str, turn: int, max_new_tokens: int, extract: bool) -> dict:
        return self._session.complete(text, turn, max_new_tokens, extract)

    def complete(self, text: str = "", max_new_tokens: int = 512, *,
                 turn: int = _lib.TURN_AUTO, extract: bool = False) -> dict:
        """One turn (a query, or a tool result after a call); returns the envelope dict.
        An empty (or blank) query is refused, as the CLI refuses it: an ``invalid_input``
        envelope, and no turn is run. A text that is not a str raises TypeError; one
        holding NUL (or a lone surrogate) gives an ``invalid_input`` envelope and is not
        part of the conversation."""
        with self._lock:
            if self._session is None:
                raise NeedleError("the agent is closed")
            if not isinstance(text, str):
                raise TypeError(f"text must be str, not {type(text).__name__}")
            if not self._session.is_result(turn):
                if self.stateless:
                    self.reset()
                self._count_query()
            return self._turn(text, turn, max_new_tokens, extract)

    def embed(self, text: str = "") -> List[float]:
        """The unit-length embedding (128 floats) of ``text`` by the model's retrieval
        head; the dot product of two is their cosine similarity. Does not touch the
        conversation. NeedleError (status -13) for a model without that head."""
        with self._lock:
            if self._session is None:
                raise NeedleError("the agent is closed")
            return self._session.embed(text)

    def _execute(self, call: dict) -> Any:
        name = call.get("name")
        args = call.get("arguments") or {}
        if name not in self._functions:
            return {"error": f"unknown tool: {name}"}
        try:
            if not isinstance(args, dict):
                raise TypeError(f"arguments of {name} are not an object")
            fn = self._functions[name]
            return fn(**convert_arguments(fn, args))
        except Exception as e:
            return {"error": str(e)}

    def run(self, query: str = "", max_steps: int = 8, max_new_tokens: int = 512,
            strict: bool = True) -> dict:
        """Answers a query, executing the model's tool calls with the Python functions.

        The official loop: each round of calls is executed (an unknown tool or a raised
        exception gives ``{"error": ...}`` as its result) and the round's results go back
        to the model as a tool-result turn, for at most ``max_steps`` rounds; the answer is
        the last envelope with "results" (every result, in order).

        Safe by default (python/README.md "The agent loop"), a round is not executed:
        - strict, first round: a call the engine's validation flags (an ungrounded
          argument, a date whose year the query does not write) gets
          ``{"error": "ungrounded NAME.path"}``, and every call of a negated query
          ``{"error": "negated request"}``, instead of running;
        - a follow-up round (the model's answer to results): when a call repeats one
          already executed in this run (same name and arguments), or when a call is not
          asked for by the query: an argument the query, the system facts and the results
          so far do not support (the engine's rule, needle_validate_calls), or a date
          whose year the query does not write (the year rule). The loop stops
          there ("stop": "repeat" / "unrequested") with that round unexecuted.

        Beyond the official answer: "stop" ("respond", "error", "max_steps", "repeat",
        "unrequested"), "calls" (every executed call, in order) and "answer": the last
        useful result (see ``_answer``).
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be str, not {type(query).__name__}")
        with self._lock:
            if self._session is None:
                raise NeedleError("the agent is closed")
            if self.stateless:
                self.reset()
            self._count_query()
            env = self._turn(query, _lib.TURN_QUERY, max_new_tokens)
            results: List[Any] = []
            calls: List[dict] = []
            rounds: List[List[tuple]] = []  # per executed round: (result, function ran)
            executed = set()
            negated = False  # strict, and the query negates what it asks for
            stop = None
            for step in range(max(0, int(max_steps))):
                stop = _reply_stop(env)
                if stop:
                    break
                fcalls = env["function_calls"]
                keys = [_call_key(c) for c in fcalls]
                if step == 0:
                    negated = strict and bool((env.get("validation") or {}).get("negation"))
                else:
                    if negated:  # nothing the model adds to a negated request is asked for
                        stop = "unrequested"
                        break
                    if any(k in executed for k in keys):
                        stop = "repeat"
                        break
                    check_text = query + "\n" + json.dumps(results, default=_jsonable,
                                                           ensure_ascii=False)
                    followup = {"function_calls": fcalls, "validation": validate_calls(
                        self.tools, fcalls, check_text, self.system, query=False)}
                    _add_year_rule(followup, self.tools,
                                   _licensed_years(self._seen_years, self.system, query))
                    if followup["validation"].get("ungrounded"):
                        stop = "unrequested"
                        break
                executed.update(keys)
                this_round = [self._run_call(c, env, strict and step == 0) for c in fcalls]
                rounds.append(this_round)
                calls.extend(fcalls)
                results.extend(r for r, _ in this_round)
                payload = json.dumps([r for r, _ in this_round], default=_jsonable,
                                     ensure_ascii=False)
                env = self._turn(payload, _lib.TURN_TOOL_RESULT, max_new_tokens)
            if stop is None:  # max_steps rounds ran (or none was allowed)
                stop = _reply_stop(env) or "max_steps"
            out = dict(env)
            out["stop"] = stop
            out["results"] = results
            out["calls"] = calls
            out["answer"] = _answer(rounds)
            return out

    def _run_call(self, call: dict, env: dict, strict: bool) -> tuple:
        """(result, whether the function ran) of one call of a run's first round."""
        if strict:
            validation = env.get("validation") or {}
            name = str(call.get("name"))
            flagged = sorted(p for p in validation.get("ungrounded") or []
                             if p.split(".", 1)[0] == name)
            if flagged:
                return {"error": "ungrounded " + ", ".join(flagged)}, False
            if validation.get("negation"):
                return {"error": "negated request"}, False
        return self._execute(call), call.get("name") in self._functions

    def extract(self, text: str, schema: Any, max_new_tokens: int = 512,
                strict: bool = True, *, force: bool = False) -> Any:
        """``needle.extract`` on this agent's model and system facts, in a fresh temporary
        session (the conversation is untouched)."""
        with self._lock:
            if self._model is None:
                raise NeedleError("the agent is closed")
            return _extract_with(self._model, text, schema, self.system, max_new_tokens,
                                 strict, force)

    def reset(self) -> None:
        """Forgets the conversation (the tools prefix stays cached)."""
        with self._lock:
            self._turns = 0
            self._seen_years = set()
            if self._session is not None:
                self._session.reset()

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            s, self._session = self._session, None
            m, self._model = self._model, None
            if s is not None:
                s.free()
            if m is not None:
                _release_model(m)

    def __enter__(self) -> "Needle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        names = ", ".join(str(s.get("name")) for s in getattr(self, "tools", []))
        return f"Needle(weights={getattr(self, 'weights', None)!r}, tools=[{names}])"


def _reply_stop(env: dict) -> Optional[str]:
    """Why a reply ends the loop ("error", "respond"), or None when it is a call to run."""
    if not env.get("success", True):
        return "error"
    if env.get("type") != "call" or not env.get("function_calls"):
        return "respond"
    return None


def _jsonable(value: Any) -> Any:
    """json.dumps default for results: pydantic instances as dicts, else str()."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if is_pydantic_model(type(value)) and hasattr(value, "dict"):
        return value.dict()
    return str(value)


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    return value


def _call_key(call: dict) -> str:
    """A call's identity for the repeat rule: its name and arguments, key order ignored
    and 5.0 the same as 5."""
    return json.dumps([call.get("name"), _whole(call.get("arguments"))], sort_keys=True,
                      default=str)


def _answer(rounds: List[List[tuple]]) -> Any:
    """The last useful result of a run: the results of the latest round in which a function
    ran (its own {"error": ...} counts), without the results of calls whose function did
    not run (unknown tool, refused by strict); one result alone, several as a list.
    When no function ever ran, the last round's errors, so the answer says why; None when
    no call was executed."""
    for rnd in reversed(rounds):
        useful = [r for r, ran in rnd if ran]
        if useful:
            return useful[0] if len(useful) == 1 else useful
    if rounds:
        last = [r for r, _ in rounds[-1]]
        return last[0] if len(last) == 1 else last
    return None


def _extract_with(model: _Model, text: str, schema: Any, system: Optional[str],
                  max_new_tokens: int, strict: bool, force: bool) -> Any:
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    s = tool_schema(schema)
    sess = _Session(model, system, [s])
    try:
        if not text.strip():
            env = _invalid_input("the query is empty")
        else:
            env = sess.complete(text, _lib.TURN_QUERY, max_new_tokens, extract=force)
    finally:
        sess.free()
    if not env.get("success"):
        # a failed turn is not "nothing to extract": raised, not returned as None
        raise NeedleError("extraction failed: " + str(env.get("error") or "no call")
                          + (f" ({env['error_code']})" if env.get("error_code") else ""))
    calls = env.get("function_calls") or env.get("suppressed_calls") or []
    if not calls:
        return None
    _add_year_rule(env, [s], _licensed_years(_years_in(text), system, text))
    args = calls[0].get("arguments") or {}
    if strict:
        validation = env.get("validation") or {}
        failures = sorted({p.split(".", 1)[-1] for p in validation.get("ungrounded") or []})
        if validation.get("negation"):
            failures.append("negated request")
        if failures:
            raise ExtractionValidationError(
                "extraction returned values not grounded in the input: " + ", ".join(failures))
    if is_pydantic_model(schema):
        try:
            return schema.model_validate(args) if hasattr(schema, "model_validate") \
                else schema(**args)
        except Exception as e:
            raise NeedleError(f"extracted arguments do not validate: {e}") from None
    return args


def extract(text: str, schema: Any, system: Optional[str] = None,
            max_new_tokens: int = 512, weights: Optional[str] = None, strict: bool = True,
            generation: Optional[int] = None, *, depth: Optional[int] = None,
            auto_date: bool = True, force: bool = False) -> Any:
    """One-shot structured extraction (the official signature): the arguments of the
    model's call of `schema` (a tool spec: function, pydantic model, dataclass, dict or
    JSON schema) in `text`, as a dict (a pydantic instance for pydantic models); None when
    the model makes no call. strict (default): values the engine's validation flags (not
    supported by the text or the system facts, a date whose year the text does not
    write) or a negated request raise ExtractionValidationError. A failed turn raises
    NeedleError. Ours, keyword-only: `depth` (a Needle 3 ladder rung), `auto_date` (as for
    Needle) and `force` (constrain the answer to exactly one call of `schema`)."""
    m = _acquire_model(_resolve_weights(weights), None, _check_depth(depth))
    try:
        if generation is not None and generation != m.generation:
            raise NeedleError(f"generation={generation}: the weights are a Needle "
                              f"{m.generation} model")
        facts = _with_date(system) if auto_date else system
        return _extract_with(m, text, schema, facts, max_new_tokens, strict, force)
    finally:
        _release_model(m)
