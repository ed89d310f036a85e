"""Models, sessions and the tool-calling loop."""
from __future__ import annotations

import ctypes
import json
import os
import threading
from typing import Any, Callable, Dict, List, Optional

from . import _lib
from ._lib import NeedleError, check, lib
from .schema import is_pydantic_model, tool_schema, tool_schemas

__all__ = ["Needle", "extract", "devices", "default_backend", "BACKENDS"]

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
    """The backend a model opened with default settings would use now (NEEDLE_BACKEND and
    JAX_PLATFORM_NAME honoured); NeedleError if the environment forces one that is not
    available."""
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
    def __init__(self, key: tuple, handle: ctypes.c_void_p, window: int, backend: str):
        self.key = key
        self.handle = handle
        self.kv_window = window
        self.backend = backend
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


def _resolve_weights(weights: Optional[str]) -> str:
    if weights is None:
        weights = os.environ.get("NEEDLE_MODEL")
    if weights is None:
        weights = demo_model_path()
    if weights is None:
        raise NeedleError("no weights given: pass weights='path/to/model.cact' or set "
                          "NEEDLE_MODEL")
    weights = os.fspath(weights)
    if not os.path.exists(weights):
        raise NeedleError(f"weights file not found: {weights}")
    return os.path.realpath(weights)


def _acquire_model(path: str, backend: Optional[str] = None) -> _Model:
    """The shared model of `path` on `backend` (None: the engine's choice)."""
    L = lib()
    key = (path, backend)
    with _models_lock:
        m = _models.get(key)
        if m is None:
            params = L.needle_model_default_params()
            params.backend = backend.encode() if backend else None
            h = ctypes.c_void_p()
            check(L.needle_model_open(path.encode(), ctypes.byref(params), ctypes.byref(h)))
            info = _lib._new(_lib.ModelInfo)
            rc = L.needle_model_get_info(h, ctypes.byref(info))
            if rc:
                L.needle_model_free(h)
                check(rc)
            m = _Model(key, h, int(info.kv_window), L.needle_model_backend(h).decode())
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

    def __init__(self, model: _Model, system: Optional[str], tools: List[dict]):
        L = lib()
        params = L.needle_session_default_params()
        params.n_ctx = _UNBOUNDED_CTX if model.kv_window > 0 else 0
        h = ctypes.c_void_p()
        check(L.needle_session_create(model.handle, ctypes.byref(params), ctypes.byref(h)))
        self.handle = h
        try:
            tools_json = json.dumps(tools, ensure_ascii=False).encode("utf-8")
            sys_b = system.encode("utf-8") if system else None
            check(L.needle_session_set_tools(h, sys_b, tools_json))
        except BaseException:
            self.free()
            raise
        self.buf = ctypes.create_string_buffer(_ENVELOPE_CAP)

    def complete(self, text: str, turn: int, max_new_tokens: int, extract: bool = False) -> dict:
        if self.handle is None:
            raise NeedleError("the agent is closed")
        L = lib()
        p = L.needle_complete_default_params()
        p.max_new_tokens = int(max_new_tokens)
        p.turn = turn
        p.extract = 1 if extract else 0
        n = ctypes.c_size_t(0)
        rc = L.needle_session_complete(self.handle, text.encode("utf-8", "replace"),
                                       ctypes.byref(p), self.buf, _ENVELOPE_CAP, ctypes.byref(n))
        check(rc)
        raw = ctypes.string_at(self.buf, n.value).decode("utf-8", "replace")
        return json.loads(raw)

    def reset(self) -> None:
        if self.handle is not None:
            lib().needle_session_reset(self.handle)

    def free(self) -> None:
        h, self.handle = self.handle, None
        if h is not None:
            lib().needle_session_free(h)


# ---------------------------------------------------------------------------------------
# The agent

class Needle:
    """A tool-calling agent: its own model reference and its own engine session.

    tools: functions (``@needle.tool`` decorated or plain), pydantic models, dataclasses,
        raw dict schemas or JSON strings. Functions are executed by ``run``; schemas
        without a Python function yield ``{"error": "no implementation for tool: NAME"}``.
    system: system facts given to the model (optional).
    weights: path of a .cact model; default $NEEDLE_MODEL, else the repository's
        models/needle-demo.cact.
    tool_index_path: accepted for compatibility (no retrieval index yet); stored only.
    backend: None (the engine's choice: NEEDLE_BACKEND, JAX_PLATFORM_NAME, else the first
        backend that finds a device, CPU last) or "cpu", "cuda", "metal" (NeedleError if
        that backend is not built into libneedle or finds no device). ``self.backend`` is
        the backend the model actually runs on.

    One agent must be used by one thread at a time (calls are serialized by a lock);
    different agents may run concurrently.
    """

    def __init__(self, tools: Optional[List[Any]] = None, system: Optional[str] = None,
                 weights: Optional[str] = None, tool_index_path: Optional[str] = None,
                 backend: Optional[str] = None):
        self._session: Optional[_Session] = None
        self._model: Optional[_Model] = None
        backend = _check_backend(backend)
        self.system = system
        self.tool_index_path = tool_index_path
        self.tools: List[dict] = []
        self._functions: Dict[str, Callable] = {}
        for t in tools or []:
            schemas = tool_schemas(t)
            for s in schemas:
                self.tools.append(s)
            if callable(t) and not isinstance(t, type) and len(schemas) == 1:
                self._functions[schemas[0].get("name")] = t
        # Names, duplicates and schemas are validated by the engine (NEEDLE_ERR_SCHEMA).
        self.weights = _resolve_weights(weights)
        self._lock = threading.RLock()
        self._model = _acquire_model(self.weights, backend)
        self.backend = self._model.backend
        try:
            self._session = _Session(self._model, system, self.tools)
        except BaseException:
            _release_model(self._model)
            self._model = None
            raise

    # -- turns ------------------------------------------------------------------------

    def complete(self, text: str, max_new_tokens: int = 256, *, turn: int = _lib.TURN_AUTO,
                 extract: bool = False) -> dict:
        """One turn (a query, or a tool result after a call); returns the envelope dict."""
        with self._lock:
            if self._session is None:
                raise NeedleError("the agent is closed")
            return self._session.complete(text, turn, max_new_tokens, extract)

    def _execute(self, call: dict) -> Any:
        name = call.get("name")
        args = call.get("arguments") or {}
        if name not in self._functions:
            if any(s.get("name") == name for s in self.tools):
                return {"error": f"no implementation for tool: {name}"}
            return {"error": f"unknown tool: {name}"}
        try:
            if not isinstance(args, dict):
                raise TypeError(f"arguments of {name} are not an object")
            return self._functions[name](**args)
        except Exception as e:
            return {"error": str(e)}

    def run(self, query: str, max_steps: int = 8, max_new_tokens: int = 256) -> dict:
        """Answers a query, executing the model's tool calls with the Python functions.

        The stopping rule (python/README.md, "The agent loop") in order, per round:
        the reply is not a call or failed ("respond" / "error"); ``max_steps`` rounds were
        executed ("max_steps"); a call repeats one already executed in this run, same name
        and same arguments ("repeat": that round is not executed); a call names a tool
        without a Python function ("no_implementation": the round is executed, its
        results are not sent back); the agent has a single tool, so the engine can only
        answer a tool result with another call ("single_tool"). Otherwise the round's
        results go back to the model as a tool-result turn (``json.dumps`` of the list).

        Returns the last envelope plus "stop" (the reason above), "results" and "calls"
        (every executed call and its result, in order) and "answer": the last useful
        result, see ``_answer``.
        """
        with self._lock:
            env = self.complete(query, max_new_tokens, turn=_lib.TURN_QUERY)
            results: List[Any] = []
            calls: List[dict] = []
            rounds: List[List[tuple]] = []  # per executed round: (result, implemented)
            answered = set()
            steps = max(0, int(max_steps))
            while True:
                fcalls = env.get("function_calls") or []
                if not env.get("success", True):
                    stop = "error"
                    break
                if env.get("type") != "call" or not fcalls:
                    stop = "respond"
                    break
                if len(rounds) >= steps:
                    stop = "max_steps"
                    break
                keys = [_call_key(c) for c in fcalls]
                if any(k in answered for k in keys):
                    stop = "repeat"
                    break
                answered.update(keys)
                this_round = [(self._execute(c), c.get("name") in self._functions)
                              for c in fcalls]
                rounds.append(this_round)
                calls.extend(fcalls)
                results.extend(r for r, _ in this_round)
                if not all(implemented for _, implemented in this_round):
                    stop = "no_implementation"
                    break
                if len(self.tools) == 1:
                    stop = "single_tool"
                    break
                if len(rounds) >= steps:
                    stop = "max_steps"  # no round left to execute what a reply would call
                    break
                payload = json.dumps([r for r, _ in this_round], default=str,
                                     ensure_ascii=False)
                env = self.complete(payload, max_new_tokens, turn=_lib.TURN_TOOL_RESULT)
            out = dict(env)
            out["stop"] = stop
            out["results"] = results
            out["calls"] = calls
            out["answer"] = _answer(rounds)
            return out

    def extract(self, text: str, schema: Any, max_new_tokens: int = 256) -> Any:
        """Extracts the arguments of `schema` (any tool spec) from `text` in a fresh
        temporary session on this agent's model, leaving the conversation untouched.
        Returns the arguments dict, or an instance when `schema` is a pydantic model."""
        with self._lock:
            if self._model is None:
                raise NeedleError("the agent is closed")
            return _extract_with(self._model, text, schema, self.system, max_new_tokens)

    def reset(self) -> None:
        """Forgets the conversation (the tools prefix stays cached)."""
        with self._lock:
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


def _call_key(call: dict) -> str:
    """A call's identity for the repeat rule: its name and arguments, key order ignored."""
    return json.dumps([call.get("name"), call.get("arguments")], sort_keys=True, default=str)


def _answer(rounds: List[List[tuple]]) -> Any:
    """The last useful result of a run: the results of the latest round that has results
    from implemented tools (a tool's own {"error": ...} counts: the tool ran), without
    the results of calls that had no implementation; one result alone, several as a
    list. When no round ran an implemented tool, the last round's errors, so the answer
    says why nothing ran; None when no call was executed."""
    for rnd in reversed(rounds):
        useful = [r for r, implemented in rnd if implemented]
        if useful:
            return useful[0] if len(useful) == 1 else useful
    if rounds:
        last = [r for r, _ in rounds[-1]]
        return last[0] if len(last) == 1 else last
    return None


def _extract_with(model: _Model, text: str, schema: Any, system: Optional[str],
                  max_new_tokens: int) -> Any:
    s = tool_schema(schema)
    sess = _Session(model, system, [s])
    try:
        env = sess.complete(text, _lib.TURN_QUERY, max_new_tokens, extract=True)
    finally:
        sess.free()
    if not env.get("success") or not env.get("function_calls"):
        raise NeedleError("extraction failed: " + str(env.get("error") or "no call")
                          + (f" ({env['error_code']})" if env.get("error_code") else ""))
    args = env["function_calls"][0].get("arguments") or {}
    if is_pydantic_model(schema):
        try:
            return schema.model_validate(args)
        except Exception as e:
            raise NeedleError(f"extracted arguments do not validate: {e}") from None
    return args


def extract(text: str, schema: Any, system: Optional[str] = None,
            weights: Optional[str] = None, max_new_tokens: int = 256) -> Any:
    """Extracts the fields of `schema` (a tool spec: function, pydantic model, dataclass,
    dict or JSON schema) from `text`; returns the arguments dict (a pydantic instance for
    pydantic models)."""
    m = _acquire_model(_resolve_weights(weights))
    try:
        return _extract_with(m, text, schema, system, max_new_tokens)
    finally:
        _release_model(m)
