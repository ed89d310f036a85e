"""Turning Python callables, types and models into Needle tool schemas (JSON Schema).

Type mapping (``type_schema``):
  str -> string, int -> integer, float -> number, bool -> boolean, None -> null,
  list / List[X] / tuple / set -> array (with "items" when parameterized),
  dict / Dict / Mapping -> object, Any / unannotated -> string,
  Literal[a, b] -> {"type": T, "enum": [a, b]} where T is the JSON type shared by all the
      literals (string, integer, number, boolean); literals of mixed types give only "enum",
  Enum subclasses -> enum of the member values (typed the same way as Literal),
  Optional[X] / Union[X, None] / X | None -> X (and the parameter is not required),
  Union[X, Y] -> {"anyOf": [...]} (models too: the engine tells them apart by a Literal
  field or their required fields),
  dataclasses and TypedDicts -> nested object schemas,
  pydantic models -> model_json_schema(),
  Annotated[X, Field(...)] -> X's schema plus the Field's description and constraints,
  datetime.date -> {"type": "string", "format": "date"}, datetime.datetime -> format
      "date-time", datetime.time -> format "time" (the engine's grammar constrains these
      formats); ``convert_arguments`` turns such arguments back into Python objects.
"""
from __future__ import annotations

import dataclasses
import datetime
import enum
import inspect
import json
import re
import sys
import typing
from typing import Any, Callable, Dict, List, Optional

from ._lib import NeedleError

__all__ = ["Field", "tool", "tool_schema", "type_schema", "is_pydantic_model"]

_MISSING = object()

# Field keyword -> JSON Schema key, in output order.
_FIELD_KEYS = [
    ("description", "description"),
    ("enum", "enum"),
    ("const", "const"),
    ("ge", "minimum"),
    ("le", "maximum"),
    ("gt", "exclusiveMinimum"),
    ("lt", "exclusiveMaximum"),
    ("multiple_of", "multipleOf"),
    ("min_length", "minLength"),
    ("max_length", "maxLength"),
    ("pattern", "pattern"),
    ("format", "format"),
    ("min_items", "minItems"),
    ("max_items", "maxItems"),
    ("unique_items", "uniqueItems"),
]


class Field:
    """Constraints for ``typing.Annotated[X, needle.Field(...)]`` parameters and fields.

    ``default`` (when given) is emitted as "default" and makes the parameter optional.
    """

    def __init__(self, description: Optional[str] = None, *, enum: Optional[list] = None,
                 const: Any = _MISSING, ge: Any = None, le: Any = None, gt: Any = None,
                 lt: Any = None, multiple_of: Any = None, min_length: Optional[int] = None,
                 max_length: Optional[int] = None, pattern: Optional[str] = None,
                 format: Optional[str] = None, min_items: Optional[int] = None,
                 max_items: Optional[int] = None, unique_items: Optional[bool] = None,
                 default: Any = _MISSING):
        self.description = description
        self.enum = list(enum) if enum is not None else None
        self.const = const
        self.ge, self.le, self.gt, self.lt = ge, le, gt, lt
        self.multiple_of = multiple_of
        self.min_length, self.max_length = min_length, max_length
        self.pattern, self.format = pattern, format
        self.min_items, self.max_items, self.unique_items = min_items, max_items, unique_items
        self.default = default

    @property
    def has_default(self) -> bool:
        return self.default is not _MISSING

    def apply(self, schema: dict) -> dict:
        out = dict(schema)
        for attr, key in _FIELD_KEYS:
            v = getattr(self, attr)
            if v is _MISSING or v is None:
                continue
            out[key] = _jsonable(v)
        if self.has_default:
            out["default"] = _jsonable(self.default)
        return out

    def __repr__(self) -> str:
        keys = [a for a, _ in _FIELD_KEYS if getattr(self, a) not in (None, _MISSING)]
        return "Field(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in keys) + ")"


def _jsonable(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    return v


def is_pydantic_model(obj: Any) -> bool:
    try:
        import pydantic  # noqa: F401
    except ImportError:
        return False
    return isinstance(obj, type) and issubclass(obj, pydantic.BaseModel)


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__annotations__") \
        and hasattr(tp, "__total__")


def _literal_type(values: list) -> Optional[str]:
    """The JSON type shared by all the values, or None if they differ."""
    def jt(v):
        if isinstance(v, bool):
            return "boolean"
        if isinstance(v, int):
            return "integer"
        if isinstance(v, float):
            return "number"
        if isinstance(v, str):
            return "string"
        if v is None:
            return "null"
        return None
    types = {jt(v) for v in values}
    if len(types) == 1:
        return types.pop()
    if types == {"integer", "number"}:
        return "number"
    return None


def _enum_schema(values: list) -> dict:
    t = _literal_type(values)
    return ({"type": t} if t else {}) | {"enum": values}


_NONE_TYPES = (type(None), None)


def _split_optional(tp: Any):
    """(inner type, was_optional) for Optional[X] / Union[X, None] / X | None."""
    origin = typing.get_origin(tp)
    union_types = [typing.Union]
    if sys.version_info >= (3, 10):
        import types as _types
        union_types.append(_types.UnionType)
    if origin in union_types:
        args = [a for a in typing.get_args(tp) if a not in _NONE_TYPES]
        if len(args) < len(typing.get_args(tp)):
            if len(args) == 1:
                return args[0], True
            return typing.Union[tuple(args)], True
    return tp, False


def _split_annotated(tp: Any):
    """(inner type, [Field...], [other metadata strings])."""
    if typing.get_origin(tp) is typing.Annotated:
        args = typing.get_args(tp)
        fields = [m for m in args[1:] if isinstance(m, Field)]
        docs = [m for m in args[1:] if isinstance(m, str)]
        return args[0], fields, docs
    return tp, [], []


def _object_schema(props: Dict[str, dict], required: List[str]) -> dict:
    out: dict = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def _dataclass_schema(cls: type) -> dict:
    hints = typing.get_type_hints(cls, include_extras=True)
    props, required = {}, []
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name, Any)
        s, optional, has_default = _param_schema(tp)
        props[f.name] = s
        if not (optional or has_default or f.default is not dataclasses.MISSING
                or f.default_factory is not dataclasses.MISSING):
            required.append(f.name)
    return _object_schema(props, required)


def _typeddict_schema(cls: type) -> dict:
    hints = typing.get_type_hints(cls, include_extras=True)
    req_keys = getattr(cls, "__required_keys__", set(hints) if cls.__total__ else set())
    props, required = {}, []
    for name, tp in hints.items():
        # NotRequired[...] / Required[...] wrappers (3.11+) only affect __required_keys__.
        origin = typing.get_origin(tp)
        if origin is not None and getattr(origin, "_name", None) in ("NotRequired", "Required"):
            tp = typing.get_args(tp)[0]
        s, optional, has_default = _param_schema(tp)
        props[name] = s
        if name in req_keys and not optional:
            required.append(name)
    return _object_schema(props, required)


def _param_schema(tp: Any):
    """(schema, optional, has_default) of an annotation, Annotated/Optional unwrapped."""
    tp, fields, docs = _split_annotated(tp)
    tp, optional = _split_optional(tp)
    # Optional[Annotated[X, Field]] puts the Annotated inside the Optional.
    tp, f2, d2 = _split_annotated(tp)
    fields, docs = fields + f2, docs + d2
    schema = type_schema(tp)
    if docs and "description" not in schema:
        schema = schema | {"description": " ".join(docs)}
    has_default = False
    for f in fields:
        schema = f.apply(schema)
        has_default = has_default or f.has_default
    return schema, optional, has_default


# exact types: a datetime is a date subclass, and a subclass may not parse the same way
_TEMPORAL_FORMATS = {datetime.datetime: "date-time", datetime.date: "date",
                     datetime.time: "time"}


def _from_iso(tp: type, value: str):
    if tp is datetime.datetime and value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"  # fromisoformat takes "Z" only from Python 3.11
    try:
        return tp.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO {_TEMPORAL_FORMATS[tp]}") from None


def _convert_value(tp: Any, value: Any) -> Any:
    tp = _split_annotated(tp)[0]
    tp = _split_annotated(_split_optional(tp)[0])[0]
    if tp in _TEMPORAL_FORMATS:
        return _from_iso(tp, value) if isinstance(value, str) else value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, set, frozenset, tuple) and args and isinstance(value, list):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis) and \
                len(set(args)) != 1:
            return value
        items = [_convert_value(args[0], v) for v in value]
        return items if origin is list else origin(items)
    return value


def convert_arguments(fn: Callable, args: Dict[str, Any]) -> Dict[str, Any]:
    """The call arguments for ``fn``: values of parameters annotated ``datetime.date`` /
    ``datetime``/``time`` (also inside Optional, Annotated, list, set, tuple) parsed back
    from their ISO strings; everything else as the model wrote it. ValueError when such
    a string does not parse."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:
        return args
    return {k: _convert_value(hints[k], v) if k in hints else v for k, v in args.items()}


def type_schema(tp: Any) -> dict:
    """The JSON Schema of a Python type annotation (see the module docstring)."""
    if tp is inspect.Parameter.empty or tp is Any:
        return {"type": "string"}
    if tp is None or tp is type(None):
        return {"type": "null"}
    if typing.get_origin(tp) is typing.Annotated or _split_optional(tp)[1]:
        return _param_schema(tp)[0]
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if isinstance(tp, type) and tp in _TEMPORAL_FORMATS:
        return {"type": "string", "format": _TEMPORAL_FORMATS[tp]}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_schema([m.value for m in tp])
    if is_pydantic_model(tp):
        return tp.model_json_schema()
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass_schema(tp)
    if _is_typeddict(tp):
        return _typeddict_schema(tp)
    if tp in (list, tuple, set, frozenset, List, typing.Tuple, typing.Set, typing.Sequence):
        return {"type": "array"}
    if tp in (dict, Dict, typing.Mapping):
        return {"type": "object"}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return _enum_schema([_jsonable(a) for a in args])
    if origin in (list, set, frozenset, typing.Sequence) or \
            (origin is not None and getattr(origin, "__name__", "") in ("Sequence", "Iterable")):
        return {"type": "array", "items": type_schema(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": type_schema(args[0])}
        if args and len(set(args)) == 1:
            return {"type": "array", "items": type_schema(args[0]),
                    "minItems": len(args), "maxItems": len(args)}
        return {"type": "array"}
    if origin in (dict,) or (origin is not None and getattr(origin, "__name__", "") == "Mapping"):
        return {"type": "object"}
    if origin is typing.Union or (sys.version_info >= (3, 10) and
                                  origin is __import__("types").UnionType):
        return {"anyOf": [type_schema(a) for a in args]}
    raise NeedleError(f"unsupported type annotation for a tool schema: {tp!r}")


# ---------------------------------------------------------------------------------------
# Docstrings

_ARGS_HEADERS = {"args:", "arguments:", "parameters:", "params:"}
_SECTION_RE = re.compile(r"^[A-Z][A-Za-z ]*:$")
_ARG_RE = re.compile(r"^\*{0,2}([A-Za-z_][A-Za-z0-9_]*)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


def parse_docstring(doc: Optional[str]):
    """(description, {arg: description}) of a Google-style docstring.

    The description is every line before an ``Args:`` / ``Arguments:`` / ``Parameters:``
    header (or another section header such as ``Returns:``), stripped and joined by spaces.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    desc: List[str] = []
    args: Dict[str, str] = {}
    i = 0
    while i < len(lines) and lines[i].strip().lower() not in _ARGS_HEADERS \
            and not _SECTION_RE.match(lines[i].strip()):
        if lines[i].strip():
            desc.append(lines[i].strip())
        i += 1
    section = None
    current = None
    base_indent = None
    for line in lines[i:]:
        stripped = line.strip()
        if not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0 and (stripped.lower() in _ARGS_HEADERS or _SECTION_RE.match(stripped)):
            section = "args" if stripped.lower() in _ARGS_HEADERS else "other"
            current, base_indent = None, None
            continue
        if section != "args":
            continue
        if base_indent is None:
            base_indent = indent
        m = _ARG_RE.match(stripped)
        if indent <= base_indent and m:
            current = m.group(1)
            args[current] = m.group(3).strip()
        elif current is not None:
            args[current] = (args[current] + " " + stripped).strip()
    return " ".join(desc), args


# ---------------------------------------------------------------------------------------
# Tools

def _function_schema(fn: Callable, name: Optional[str] = None,
                     description: Optional[str] = None) -> dict:
    desc, arg_docs = parse_docstring(inspect.getdoc(fn))
    if description is not None:
        desc = description
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as e:  # unresolvable forward references
        raise NeedleError(f"cannot resolve the annotations of {fn!r}: {e}") from None
    sig = inspect.signature(fn)
    props: Dict[str, dict] = {}
    required: List[str] = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in ("self", "cls"):
            continue
        tp = hints.get(p.name, inspect.Parameter.empty)
        schema, optional, has_default = _param_schema(tp)
        if p.name in arg_docs and arg_docs[p.name] and "description" not in schema:
            schema = schema | {"description": arg_docs[p.name]}
        if p.default is not p.empty and "default" not in schema:
            d = _jsonable(p.default)
            try:
                json.dumps(d)
                if d is not None:
                    schema = schema | {"default": d}
            except (TypeError, ValueError):
                pass
        props[p.name] = schema
        if p.default is p.empty and not optional and not has_default:
            required.append(p.name)
    out: dict = {"name": name or fn.__name__}
    if desc:
        out["description"] = desc
    out["parameters"] = _object_schema(props, required)
    defs = _hoist_defs(props)
    for key in ("$defs", "definitions"):
        if defs[key]:
            out["parameters"][key] = defs[key]
    return out


def _hoist_defs(props: Dict[str, dict]) -> Dict[str, dict]:
    """Moves the $defs / definitions of parameter schemas (a pydantic model's
    model_json_schema() carries its own) to the tool's parameters, where the refs inside them
    ("#/$defs/Name") point: a ref is resolved from the parameters schema, as the official
    client does."""
    found: Dict[str, dict] = {"$defs": {}, "definitions": {}}

    def walk(node: Any) -> None:  # node is a schema (or a list of them)
        if isinstance(node, list):
            for x in node:
                walk(x)
        if not isinstance(node, dict):
            return
        for key in ("$defs", "definitions"):
            defs = node.pop(key, None) if isinstance(node.get(key), dict) else None
            for name, schema in (defs or {}).items():
                walk(schema)
                if name in found[key] and found[key][name] != schema:
                    raise NeedleError(f"two different schemas are both named {name!r} in {key}")
                found[key][name] = schema
        for key, v in node.items():
            if key == "properties" and isinstance(v, dict):  # a map of names, not a schema
                for x in v.values():
                    walk(x)
            elif key not in ("enum", "const", "default", "examples"):
                walk(v)

    for schema in props.values():
        walk(schema)
    return found


def tool(fn: Optional[Callable] = None, *, name: Optional[str] = None,
         description: Optional[str] = None):
    """Decorator marking a function as a Needle tool; the schema is built from its signature
    and docstring and stored as ``fn.__needle_tool__``. The function itself is unchanged.

    Usable bare (``@needle.tool``) or with ``name=`` / ``description=`` overrides.
    """
    def wrap(f: Callable) -> Callable:
        f.__needle_tool__ = _function_schema(f, name, description)
        return f
    return wrap(fn) if fn is not None else wrap


def _normalize_raw(d: dict) -> dict:
    if not isinstance(d, dict):
        raise NeedleError(f"a tool schema must be a JSON object, got {type(d).__name__}")
    if d.get("type") == "function" and isinstance(d.get("function"), dict):
        d = d["function"]
    return d


def tool_schemas(obj: Any) -> List[dict]:
    """The schema(s) of one tool spec: a decorated or plain function, a pydantic model, a
    dataclass, a raw dict schema (plain or OpenAI-style), or a JSON string of either one
    schema or an array of them."""
    if isinstance(obj, (str, bytes)):
        try:
            parsed = json.loads(obj)
        except ValueError as e:
            raise NeedleError(f"tool JSON is malformed: {e}") from None
        items = parsed if isinstance(parsed, list) else [parsed]
        return [_normalize_raw(x) for x in items]
    if isinstance(obj, dict):
        return [_normalize_raw(obj)]
    return [tool_schema(obj)]


def tool_schema(obj: Any) -> dict:
    """The schema of a single tool spec (see ``tool_schemas``)."""
    if isinstance(obj, (str, bytes, dict)):
        items = tool_schemas(obj)
        if len(items) != 1:
            raise NeedleError("expected exactly one tool schema")
        return items[0]
    if hasattr(obj, "__needle_tool__"):
        return obj.__needle_tool__
    if is_pydantic_model(obj):
        out: dict = {"name": obj.__name__}
        desc, _ = parse_docstring(obj.__doc__)
        if desc:
            out["description"] = desc
        raw = obj.model_json_schema()
        raw.pop("title", None)
        raw.pop("description", None)
        # the official client's key order (the prompt shows the tools as sent): type,
        # properties, required, then the definitions the refs point at
        params = {}
        for key in ("type", "properties", "required", "$defs", "definitions"):
            if key in raw:
                params[key] = raw.pop(key)
        out["parameters"] = params | raw
        return out
    if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or _is_typeddict(obj)):
        out = {"name": obj.__name__}
        doc = obj.__doc__ or ""
        if dataclasses.is_dataclass(obj) and doc.startswith(obj.__name__ + "("):
            doc = ""  # the auto-generated dataclass signature
        desc, _ = parse_docstring(doc)
        if desc:
            out["description"] = desc
        out["parameters"] = type_schema(obj)
        return out
    if callable(obj):
        return _function_schema(obj)
    raise NeedleError(f"cannot make a tool schema from {obj!r}")
