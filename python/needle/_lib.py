"""ctypes bindings to libneedle (include/needle.h).

Library lookup order:
  1. the path in the environment variable ``NEEDLE_LIB_PATH``;
  2. ``libneedle.so`` (or ``.dylib``) next to this file, inside the installed package;
  3. ``../build/libneedle.so`` relative to the repository, for development checkouts.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Optional

__all__ = ["NeedleError", "lib", "library_path", "CompleteParams", "SessionParams", "ModelInfo"]

NEEDLE_OK = 0
NEEDLE_ERR_BUFFER_TOO_SMALL = -8

TURN_AUTO = 0
TURN_QUERY = 1
TURN_TOOL_RESULT = 2


class NeedleError(RuntimeError):
    """An error from the engine (or from the Python layer above it).

    ``status`` is the engine's negative status code (0 when the error comes from Python),
    ``message`` the engine's message (``needle_last_error``) or a Python-side explanation.
    """

    def __init__(self, message: str, status: int = 0):
        self.message = message
        self.status = status
        super().__init__(message if not status else f"{message} (status {status})")


class ModelInfo(ctypes.Structure):
    _fields_ = [
        ("file_size", ctypes.c_uint64),
        ("num_tensors", ctypes.c_uint32),
        ("vocab", ctypes.c_uint32),
        ("d_model", ctypes.c_uint32),
        ("num_layers", ctypes.c_uint32),
        ("num_heads", ctypes.c_uint32),
        ("num_kv_heads", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32),
        ("max_seq_len", ctypes.c_uint32),
        ("kv_window", ctypes.c_uint32),
        ("kv_bits", ctypes.c_uint32),
        ("hada_n", ctypes.c_uint32),
        ("mhc_lanes", ctypes.c_uint32),
        ("engram_slots", ctypes.c_uint32),
        ("engram_sub_dim", ctypes.c_uint32),
        ("num_engram_tables", ctypes.c_uint32),
        ("engram_conv_taps", ctypes.c_uint32),
        ("engram_conv_dilation", ctypes.c_uint32),
        ("num_engram_orders", ctypes.c_uint32),
        ("engram_orders", ctypes.c_uint32 * 4),
        ("num_engram_sites", ctypes.c_uint32),
        ("engram_sites", ctypes.c_uint32 * 4),
        ("rope_theta", ctypes.c_float),
        ("group_size", ctypes.c_uint32),
        ("has_tokenizer", ctypes.c_int32),
        ("num_probe_heads", ctypes.c_uint32),
        ("probe_head_codes", ctypes.c_uint32 * 8),
    ]


class SessionParams(ctypes.Structure):
    _fields_ = [
        ("n_ctx", ctypes.c_uint32),
        ("kv_window", ctypes.c_int32),
        ("n_sinks", ctypes.c_uint32),
        ("kv_type", ctypes.c_int32),
    ]


class CompleteParams(ctypes.Structure):
    _fields_ = [
        ("max_new_tokens", ctypes.c_int32),
        ("max_think_tokens", ctypes.c_uint32),
        ("temperature", ctypes.c_float),
        ("seed", ctypes.c_uint64),
        ("turn", ctypes.c_int32),
        ("extract", ctypes.c_int32),
    ]


def _candidates():
    env = os.environ.get("NEEDLE_LIB_PATH")
    if env:
        yield env
        return  # an explicit path is authoritative
    names = ["libneedle.dylib", "libneedle.so"] if sys.platform == "darwin" else ["libneedle.so"]
    here = os.path.dirname(os.path.abspath(__file__))
    for n in names:
        yield os.path.join(here, n)
    repo = os.path.dirname(os.path.dirname(here))  # python/needle -> repo root
    for n in names:
        yield os.path.join(repo, "build", n)


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
library_path: Optional[str] = None


def _declare(L: ctypes.CDLL) -> None:
    c = ctypes
    vp, cp = c.c_void_p, c.c_char_p
    L.needle_version.restype = cp
    L.needle_version.argtypes = []
    L.needle_status_string.restype = cp
    L.needle_status_string.argtypes = [c.c_int]
    L.needle_last_error.restype = cp
    L.needle_last_error.argtypes = []
    L.needle_model_open.restype = c.c_int
    L.needle_model_open.argtypes = [cp, vp, c.POINTER(vp)]
    L.needle_model_free.restype = None
    L.needle_model_free.argtypes = [vp]
    L.needle_model_get_info.restype = c.c_int
    L.needle_model_get_info.argtypes = [vp, c.POINTER(ModelInfo)]
    L.needle_session_default_params.restype = SessionParams
    L.needle_session_default_params.argtypes = []
    L.needle_session_create.restype = c.c_int
    L.needle_session_create.argtypes = [vp, c.POINTER(SessionParams), c.POINTER(vp)]
    L.needle_session_free.restype = None
    L.needle_session_free.argtypes = [vp]
    L.needle_session_reset.restype = None
    L.needle_session_reset.argtypes = [vp]
    L.needle_session_set_tools.restype = c.c_int
    L.needle_session_set_tools.argtypes = [vp, cp, cp]
    L.needle_complete_default_params.restype = CompleteParams
    L.needle_complete_default_params.argtypes = []
    L.needle_session_complete.restype = c.c_int
    L.needle_session_complete.argtypes = [
        vp, cp, c.POINTER(CompleteParams), c.c_char_p, c.c_size_t, c.POINTER(c.c_size_t)]


def lib() -> ctypes.CDLL:
    """Loads libneedle once (thread-safe) and returns it; raises NeedleError if not found."""
    global _lib, library_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            tried.append(path)
            if not os.path.exists(path):
                continue
            try:
                L = ctypes.CDLL(path)
            except OSError as e:
                raise NeedleError(f"cannot load libneedle from {path}: {e}") from None
            _declare(L)
            library_path = path
            _lib = L
            return L
        raise NeedleError(
            "libneedle not found (tried: " + ", ".join(tried) + "); build it with CMake and set "
            "NEEDLE_LIB_PATH to the libneedle.so path, or reinstall the package")


def check(status: int) -> None:
    """Raises NeedleError with the engine's message when status is a failure."""
    if status == NEEDLE_OK:
        return
    L = lib()
    msg = (L.needle_last_error() or b"").decode("utf-8", "replace")
    if not msg:
        msg = (L.needle_status_string(status) or b"").decode("utf-8", "replace")
    raise NeedleError(msg, status)


def version() -> str:
    return lib().needle_version().decode()
