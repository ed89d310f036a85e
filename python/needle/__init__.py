"""needle: Python bindings for libneedle, a C11 inference engine for Needle 2 tool-calling
models. Distributed as `libneedle` (the official client, cactus-needle, also installs a
module `needle`: see _clash.py).

    import needle

    @needle.tool
    def get_weather(location: str):
        "Get the current weather or forecast for a location."
        return {"location": location, "temp_c": 24}

    agent = needle.Needle(tools=[get_weather])   # weights="model.cact"; default: the demo
    print(agent.run("Will it rain in London tomorrow?")["answer"])

The agent loop's stopping rule and its answer: python/README.md, "The agent loop".
"""
import os as _os

from ._clash import NameClashWarning, check as _check_name_clash

# Before any other module of the package: another distribution's needle/agent/ folder
# mixed into this one would be imported in place of agent.py.
_check_name_clash(_os.path.dirname(_os.path.abspath(__file__)))

from ._lib import NeedleError, library_path  # noqa: E402
from ._lib import TURN_AUTO, TURN_QUERY, TURN_TOOL_RESULT  # noqa: E402
from .agent import BACKENDS, ExtractionValidationError, Needle, default_backend  # noqa: E402
from .agent import devices, extract  # noqa: E402
from .schema import Field, build_schema, pydantic_schema, tool, tool_schema  # noqa: E402
from .schema import type_schema  # noqa: E402
from .hub import download  # noqa: E402
from ._build import build, calibrate, encode_data, finetune  # noqa: E402
from .schema import is_pydantic_model as _is_pydantic_model  # noqa: E402,F401  (official name)


__all__ = [
    "Needle", "NeedleError", "ExtractionValidationError", "Field", "tool", "tool_schema",
    "type_schema", "build_schema", "pydantic_schema", "extract", "devices", "default_backend",
    "BACKENDS", "library_version", "__version__", "TURN_AUTO", "TURN_QUERY",
    "TURN_TOOL_RESULT", "NameClashWarning", "download", "build", "calibrate", "encode_data", "finetune",
]


def library_version() -> str:
    """The version string of the loaded libneedle."""
    from ._lib import version
    return version()


def __getattr__(name: str):
    # The package is versioned with the library it binds (include/needle.h is the one
    # place the version is written), so __version__ asks the library, on first use.
    if name == "__version__":
        return library_version()
    raise AttributeError(f"module 'needle' has no attribute {name!r}")
