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

__all__ = ["NeedleError", "lib", "library_path", "CompleteParams", "SessionParams", "ModelInfo",
           "ModelParams", "DeviceInfo"]

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


# Copies of the structs of include/needle.h. Each begins with its size (needle.h "Struct
# sizes"); _check_layouts() compares every sizeof with the library's at load time.

class ModelInfo(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
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
        # Needle 3 (generation 3)
        ("generation", ctypes.c_uint32),
        ("out_vocab", ctypes.c_uint32),
        ("qk_head_dim", ctypes.c_uint32),
        ("v_head_dim", ctypes.c_uint32),
        ("sliding_window", ctypes.c_uint32),
        ("global_layers", ctypes.c_uint64),
        ("qkv_conv_taps", ctypes.c_uint32),
        ("engram_seed_heads", ctypes.c_uint32),
        ("file_layers", ctypes.c_uint32),
        ("engram_sites_all", ctypes.c_uint32 * 16),
        ("layers_run", ctypes.c_uint64),
    ]


class ModelParams(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("n_threads", ctypes.c_int32),
        ("backend", ctypes.c_char_p),
        ("depth", ctypes.c_int32),  # Needle 3 ladder rung (0 = every layer)
    ]


class SessionParams(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("n_ctx", ctypes.c_uint32),
        ("kv_window", ctypes.c_int32),
        ("n_sinks", ctypes.c_uint32),
        ("kv_type", ctypes.c_int32),
        ("activations", ctypes.c_int32),
    ]


class CompleteParams(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("max_new_tokens", ctypes.c_int32),
        ("max_think_tokens", ctypes.c_uint32),
        ("temperature", ctypes.c_float),
        ("seed", ctypes.c_uint64),
        ("turn", ctypes.c_int32),
        ("extract", ctypes.c_int32),
        ("min_confidence", ctypes.c_float),
        ("repeat_guard", ctypes.c_int32),
    ]


class ToolsParams(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("retrieval_threshold", ctypes.c_uint32),
        ("top_k", ctypes.c_uint32),
        ("tool_index_path", ctypes.c_char_p),
    ]


class DeviceInfo(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("backend", ctypes.c_char * 16),
        ("name", ctypes.c_char * 128),
        ("memory_bytes", ctypes.c_uint64),
        ("compute_units", ctypes.c_int32),
        ("capability", ctypes.c_char * 32),
        ("is_default", ctypes.c_int32),
    ]


_STRUCTS = {"needle_model_params": ModelParams, "needle_model_info": ModelInfo, "needle_session_params": SessionParams,
            "needle_complete_params": CompleteParams, "needle_device_info": DeviceInfo,
            "needle_tools_params": ToolsParams}


def _new(cls):
    """An out-struct ready for the library to fill: its size field set."""
    v = cls()
    v.size = ctypes.sizeof(cls)
    return v


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
    L.needle_struct_size.restype = c.c_size_t
    L.needle_struct_size.argtypes = [cp]
    L.needle_device_count.restype = c.c_int
    L.needle_device_count.argtypes = []
    L.needle_device_get.restype = c.c_int
    L.needle_device_get.argtypes = [c.c_int, c.POINTER(DeviceInfo)]
    L.needle_default_backend.restype = cp
    L.needle_default_backend.argtypes = []
    L.needle_model_backend.restype = cp
    L.needle_model_backend.argtypes = [vp]
    L.needle_version.argtypes = []
    L.needle_status_string.restype = cp
    L.needle_status_string.argtypes = [c.c_int]
    L.needle_last_error.restype = cp
    L.needle_last_error.argtypes = []
    L.needle_model_open.restype = c.c_int
    L.needle_model_open.argtypes = [cp, c.POINTER(ModelParams), c.POINTER(vp)]
    L.needle_model_default_params.restype = ModelParams
    L.needle_model_default_params.argtypes = []
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
    # probe heads: retrieval options, embeddings
    L.needle_tools_default_params.restype = ToolsParams
    L.needle_tools_default_params.argtypes = []
    L.needle_session_set_tools_ex.restype = c.c_int
    L.needle_session_set_tools_ex.argtypes = [vp, cp, cp, c.POINTER(ToolsParams)]
    L.needle_session_embed.restype = c.c_int
    L.needle_session_embed.argtypes = [
        vp, cp, c.POINTER(c.c_float), c.c_size_t, c.POINTER(c.c_size_t)]
    L.needle_complete_default_params.restype = CompleteParams
    L.needle_complete_default_params.argtypes = []
    L.needle_session_complete.restype = c.c_int
    L.needle_session_complete.argtypes = [
        vp, cp, c.POINTER(CompleteParams), c.c_char_p, c.c_size_t, c.POINTER(c.c_size_t)]
    if hasattr(L, "needle_validate_calls"):  # absent from libraries before 0.3
        L.needle_validate_calls.restype = c.c_int
        L.needle_validate_calls.argtypes = [cp, cp, cp, c.c_int32, cp, c.c_char_p, c.c_size_t,
                                            c.POINTER(c.c_size_t)]
    if hasattr(L, "needle_system_with_date"):  # absent from libraries before 0.3
        L.needle_system_with_date.restype = c.c_int
        L.needle_system_with_date.argtypes = [cp] + [c.c_int32] * 5 + [
            c.c_char_p, c.c_size_t, c.POINTER(c.c_size_t)]


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
            try:
                _declare(L)
            except AttributeError as e:
                raise NeedleError(f"{path} is not a libneedle this package can use (missing "
                                  f"function: {e}); rebuild it or reinstall the package") from None
            _check_layouts(L, path)
            library_path = path
            _lib = L
            return L
        raise NeedleError(
            "libneedle not found (tried: " + ", ".join(tried) + "); build it with CMake and set "
            "NEEDLE_LIB_PATH to the libneedle.so path, or reinstall the package")


def _check_layouts(L: ctypes.CDLL, path: str) -> None:
    # The ctypes structs above are hand copies of needle.h: a copy that drifted from the
    # library's header would read and write the wrong bytes, so refuse to run with one.
    bad = []
    for name, cls in _STRUCTS.items():
        theirs = L.needle_struct_size(name.encode())
        if theirs != ctypes.sizeof(cls):
            bad.append(f"{name}: library {theirs} bytes, binding {ctypes.sizeof(cls)}")
    if bad:
        version = (L.needle_version() or b"?").decode()
        raise NeedleError(f"libneedle {version} at {path} does not match this needle package's "
                          "struct layouts (" + "; ".join(bad) + "); use the libneedle built "
                          "from the same source as the package")


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
