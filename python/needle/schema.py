"""Turning Python callables, types and models into Needle tool schemas (JSON Schema).

The schemas are the prompt: the engine shows the tools to the model exactly as written,
key order included, so for every annotation the official package (cactus-needle 3.x)
turns into a schema, this module writes the same JSON, byte for byte (the drop-in test,
tests/official_client/dropin.sh, compares the two over a corpus). The rules:

  str -> string, int -> integer, float -> number, bool -> boolean, list -> array,
  dict / Dict[K, V] -> object, unannotated / None / Any -> string,
  List[X] / list[X] -> {"type": "array", "items": X} (bare List: items string),
  Literal[a, b] / Enum -> {"type": T, "enum": [...]}, T the JSON type of the first value,
  Optional[X] / X | None -> X, and the parameter is not required,
  Union[X, Y] -> X (the first member; ``unions="anyOf"`` opts in to {"anyOf": [...]}),
  pydantic models (v1 and v2) -> their properties / required / $defs,
  Annotated[X, needle.Field(...)] and ``x: X = needle.Field(...)`` -> X's schema with the
      Field's description and constraints; a Field used as the default stays required
      unless the Field itself has a default ("default" is never written into the schema),
  a parameter's Google-style docstring line -> "description", right after "type".

Where the official builder has no rule of its own (it writes "string" for anything else)
we write the richer form: datetime.date / datetime / time -> string with format "date" /
"date-time" / "time" (``convert_arguments`` parses them back), tuples, sets and sequences
-> arrays, dataclasses and TypedDicts -> objects, Mapping -> object.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import enum
import inspect
import json
import re
import types as _types
import typing
from typing import Any, Callable, Dict, List, Optional

from ._lib import NeedleError

__all__ = ["Field", "tool", "tool_schema", "type_schema", "build_schema", "pydantic_schema",
           "is_pydantic_model"]

_MISSING = object()

# Field keyword -> JSON Schema key, in the order the official builder writes them
# ("const" comes last, after all of these).
_FIELD_KEYS = (
    ("description", "description"), ("enum", "enum"), ("ge", "minimum"), ("le", "maximum"),
    ("gt", "exclusiveMinimum"), ("lt", "exclusiveMaximum"), ("multiple_of", "multipleOf"),
    ("min_length", "minLength"), ("max_length", "maxLength"), ("pattern", "pattern"),
    ("format", "format"), ("min_items", "minItems"), ("max_items", "maxItems"),
    ("unique_items", "uniqueItems"),
)

_UNION_ORIGINS = (typing.Union, getattr(_types, "UnionType", typing.Union))
_SIMPLE_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean",
                 list: "array", dict: "object"}


class Field:
    """Description and constraints of a parameter: ``Annotated[X, needle.Field(...)]`` or
    ``x: X = needle.Field(...)``. The first positional argument is the default (as in the
    official package); the schema never shows it, it only makes the parameter optional."""

    def __init__(self, default: Any = _MISSING, *, description: Optional[str] = None,
                 enum: Optional[list] = None, const: Any = _MISSING, ge: Any = None,
                 le: Any = None, gt: Any = None, lt: Any = None, multiple_of: Any = None,
                 min_length: Optional[int] = None, max_length: Optional[int] = None,
                 pattern: Optional[str] = None, format: Optional[str] = None,
                 min_items: Optional[int] = None, max_items: Optional[int] = None,
                 unique_items: Optional[bool] = None):
        self.default = default
        self.description = description
        self.enum = enum
        self.const = const
        self.ge, self.le, self.gt, self.lt = ge, le, gt, lt
        self.multiple_of = multiple_of
        self.min_length, self.max_length = min_length, max_length
        self.pattern, self.format = pattern, format
        self.min_items, self.max_items, self.unique_items = min_items, max_items, unique_items

    def has_default(self) -> bool:
        return self.default is not _MISSING

    def apply(self, schema: dict) -> dict:
        """Writes the constraints into `schema` (in place: a key already there keeps its
        position, as a docstring description right after "type" does) and returns it."""
        for attr, key in _FIELD_KEYS:
            value = getattr(self, attr)
            if value is not None:
                schema[key] = [_jsonable(v) for v in value] if key == "enum" else _jsonable(value)
        if self.const is not _MISSING:
            schema["const"] = _jsonable(self.const)
        return schema

    def __repr__(self) -> str:
        keys = [a for a, _ in _FIELD_KEYS if getattr(self, a) is not None]
        shown = ([f"{self.default!r}"] if self.has_default() else []) + \
            [f"{k}={getattr(self, k)!r}" for k in keys] + \
            ([f"const={self.const!r}"] if self.const is not _MISSING else [])
        return "Field(" + ", ".join(shown) + ")"


def _jsonable(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, (tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    return v


def is_pydantic_model(obj: Any) -> bool:
    """A pydantic model class, v2 or v1 (``pydantic.v1`` included), recognized as the
    official package does: by a BaseModel from a pydantic module in its MRO."""
    return isinstance(obj, type) and any(
        base.__name__ == "BaseModel" and (base.__module__ or "").startswith("pydantic")
        for base in obj.__mro__)


def pydantic_schema(model: type) -> dict:
    """The tool schema of a pydantic model: name (its JSON-schema title), parameters
    (type, properties, then required / $defs / definitions), description (the class
    docstring), in the official package's order."""
    raw = model.model_json_schema() if hasattr(model, "model_json_schema") else model.schema()
    if "properties" not in raw and isinstance(raw.get("$ref"), str):
        # a model that contains itself: pydantic writes it as a $ref into its $defs, and
        # the official builder would send a tool without parameters
        raise NeedleError(f"{model.__name__} is recursive ({raw['$ref']} refers to itself): "
                          "a tool's parameters cannot contain themselves")
    parameters: dict = {"type": "object", "properties": raw.get("properties", {})}
    for key in ("required", "$defs", "definitions"):
        if key in raw:
            parameters[key] = raw[key]
    out: dict = {"name": raw.get("title", model.__name__), "parameters": parameters}
    doc = (model.__doc__ or "").strip()
    if doc:
        out["description"] = doc
    return out


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__annotations__") \
        and hasattr(tp, "__total__")


def _json_name(value: Any) -> str:
    """The JSON type the official builder gives an enum by its first value's Python type."""
    return _SIMPLE_TYPES.get(type(value), "string")


def _strip_annotated(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _is_optional(tp: Any) -> bool:
    tp = _strip_annotated(tp)
    return typing.get_origin(tp) in _UNION_ORIGINS and type(None) in typing.get_args(tp)


def _field_of(tp: Any, default: Any) -> Optional[Field]:
    """The Field of a parameter: its default when that is a Field, else the first Field of
    its Annotated metadata (also inside Optional[...])."""
    if isinstance(default, Field):
        return default
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return next((m for m in typing.get_args(tp)[1:] if isinstance(m, Field)), None)
    if origin in _UNION_ORIGINS:
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(members) == 1:
            return _field_of(members[0], _MISSING)
    return None


# exact types: a datetime is a date subclass, and a subclass may not parse the same way
_TEMPORAL_FORMATS = {datetime.datetime: "date-time", datetime.date: "date",
                     datetime.time: "time"}
_ARRAY_ORIGINS = (tuple, set, frozenset, collections.abc.Sequence, collections.abc.Iterable,
                  collections.abc.Set, collections.abc.MutableSequence)


def type_schema(tp: Any, unions: str = "first") -> dict:
    """The JSON Schema of a Python annotation (see the module docstring). ``unions``:
    "first" (the official rule: a Union is its first non-None member) or "anyOf"."""
    if unions not in ("first", "anyOf"):
        raise ValueError(f"unions must be 'first' or 'anyOf', not {unions!r}")
    schema = _type_schema(tp, unions)
    field = _field_of(tp, _MISSING)
    return field.apply(schema) if field else schema


def _type_schema(tp: Any, unions: str) -> dict:
    if tp is inspect.Parameter.empty or tp is None:
        return {"type": "string"}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _type_schema(args[0], unions)
    if origin is None:
        if isinstance(tp, type) and tp in _SIMPLE_TYPES:
            return {"type": _SIMPLE_TYPES[tp]}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            values = [member.value for member in tp]
            return {"type": _json_name(values[0]) if values else "string", "enum": values}
        if is_pydantic_model(tp):
            return pydantic_schema(tp)["parameters"]
        return _richer_schema(tp, unions)
    if origin is typing.Literal:
        values = [_jsonable(a) for a in args]
        return {"type": _json_name(args[0]) if args else "string", "enum": values}
    if origin is list:
        return {"type": "array", "items": _type_schema(args[0], unions) if args
                else {"type": "string"}}
    if origin is dict:
        return {"type": "object"}
    if origin in _UNION_ORIGINS:
        members = [a for a in args if a is not type(None)]
        if unions == "anyOf" and len(members) > 1:
            return {"anyOf": [_type_schema(m, unions) for m in members]}
        return _type_schema(members[0], unions) if members else {"type": "string"}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _type_schema(args[0], unions)}
        if args and len(set(args)) == 1:
            return {"type": "array", "items": _type_schema(args[0], unions),
                    "minItems": len(args), "maxItems": len(args)}
        return {"type": "array"}
    if origin in _ARRAY_ORIGINS:
        return {"type": "array", "items": _type_schema(args[0], unions)} if args \
            else {"type": "array"}
    if origin in (collections.abc.Mapping, collections.abc.MutableMapping):
        return {"type": "object"}
    return {"type": "string"}


def _richer_schema(tp: Any, unions: str) -> dict:
    """Bare types the official builder has no rule for (it writes "string")."""
    if isinstance(tp, type) and tp in _TEMPORAL_FORMATS:
        return {"type": "string", "format": _TEMPORAL_FORMATS[tp]}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _members_schema(tp, unions)
    if _is_typeddict(tp):
        return _members_schema(tp, unions)
    if tp in (tuple, set, frozenset):
        return {"type": "array"}
    return {"type": "string"}


def _members_schema(cls: type, unions: str) -> dict:
    """A dataclass or TypedDict as an object: its fields as properties, by the same rules
    as a function's parameters."""
    hints = typing.get_type_hints(cls, include_extras=True)
    props: Dict[str, dict] = {}
    required: List[str] = []
    if dataclasses.is_dataclass(cls):
        members = [(f.name, hints.get(f.name, Any),
                    f.default is not dataclasses.MISSING or
                    f.default_factory is not dataclasses.MISSING) for f in dataclasses.fields(cls)]
    else:
        keys = getattr(cls, "__required_keys__", set(hints) if cls.__total__ else set())
        members = []
        for name, tp in hints.items():
            origin = typing.get_origin(tp)
            if origin is not None and getattr(origin, "_name", None) in ("NotRequired", "Required"):
                tp = typing.get_args(tp)[0]
            members.append((name, tp, name not in keys))
    for name, tp, has_default in members:
        schema = _type_schema(tp, unions)
        field = _field_of(tp, _MISSING)
        if field:
            field.apply(schema)
            has_default = has_default or field.has_default()
        props[name] = schema
        if not has_default and not _is_optional(tp):
            required.append(name)
    out: dict = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


# ---------------------------------------------------------------------------------------
# Docstrings

_ARGS_HEADERS = ("args:", "arguments:", "parameters:", "params:")
_SECTION_LINE = re.compile(r"\s*[A-Za-z][\w ]*:\s*$")
_ARG_LINE = re.compile(r"\s+(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)")


def _indent_of(line: str) -> int:
    return len(line) - len(line.lstrip())


def parse_docstring(doc: Optional[str]):
    """(description, {arg: description}) of a Google-style docstring, read as the official
    package reads it: the description is every line before the ``Args:`` (``Arguments:``,
    ``Parameters:``, ``Params:``) header, stripped and joined by spaces; an argument is an
    indented ``name (type): text`` line, continued by lines indented deeper; a section
    header at the Args header's indent (``Returns:``) ends the arguments."""
    if not doc:
        return "", {}
    lines = doc.strip("\n").splitlines()
    at = 0
    while at < len(lines) and lines[at].strip().lower() not in _ARGS_HEADERS:
        at += 1
    description = " ".join(part for part in (line.strip() for line in lines[:at]) if part)
    args: Dict[str, str] = {}
    header_indent = _indent_of(lines[at]) if at < len(lines) else 0
    current, current_indent = None, 0
    for line in lines[at + 1:]:
        if not line.strip():
            continue
        indent = _indent_of(line)
        if indent <= header_indent and _SECTION_LINE.match(line):
            break
        match = _ARG_LINE.match(line)
        if match and (current is None or indent <= current_indent):
            current, current_indent = match.group(1), indent
            args[current] = match.group(2).strip()
        elif current is not None and indent > current_indent:
            args[current] += " " + line.strip()
    return description.strip(), args


# ---------------------------------------------------------------------------------------
# Tools

def build_schema(fn: Callable, unions: str = "first") -> dict:
    """The tool schema of a function (or any callable): its name, the docstring's
    description, and one property per parameter (see the module docstring)."""
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable forward references: the raw annotations, as official
        hints = {}
    description, arg_docs = parse_docstring(fn.__doc__)
    properties: Dict[str, dict] = {}
    required: List[str] = []
    for name, param in signature.parameters.items():
        if name in ("self", "cls") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(name, param.annotation)
        schema = _type_schema(annotation, unions)
        if name in arg_docs and "description" not in schema:
            schema["description"] = arg_docs[name]
        field = _field_of(annotation, param.default)
        if field:
            field.apply(schema)
        properties[name] = schema
        has_default = param.default is not param.empty and not isinstance(param.default, Field)
        if field and field.has_default():
            has_default = True
        if not has_default and not _is_optional(annotation):
            required.append(name)
    parameters: dict = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    _hoist_nested_defs(parameters)
    out: dict = {"name": getattr(fn, "__name__", type(fn).__name__)}
    if description:
        out["description"] = description
    out["parameters"] = parameters
    return out


def _hoist_nested_defs(parameters: dict) -> None:
    """A pydantic model used as a parameter type brings its own $defs, which its refs
    ("#/$defs/Name") cannot reach from inside a property: the engine resolves refs from the
    tool's parameters. They move there (the official package leaves them nested, where
    those refs do not resolve); a schema without nested $defs is left as it is."""
    found: Dict[str, Dict[str, dict]] = {"$defs": {}, "definitions": {}}

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        if not isinstance(node, dict):
            return
        for key in ("$defs", "definitions"):
            defs = node.pop(key, None) if isinstance(node.get(key), dict) else None
            for def_name, schema in (defs or {}).items():
                walk(schema)
                if def_name in found[key] and found[key][def_name] != schema:
                    raise NeedleError(f"two different schemas are both named {def_name!r} "
                                      f"in {key}")
                found[key][def_name] = schema
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                for item in value.values():
                    walk(item)
            elif key not in ("enum", "const", "default", "examples"):
                walk(value)

    walk(parameters["properties"])
    for key in ("$defs", "definitions"):
        if found[key]:
            parameters[key] = found[key]


def tool(fn: Optional[Callable] = None, *, triggers: Optional[List[str]] = None,
         name: Optional[str] = None, description: Optional[str] = None,
         unions: str = "first") -> Callable:
    """Decorator marking a function as a Needle tool: its schema (``build_schema``) is
    stored as ``fn._needle_tool``, with "triggers" (example phrasings) when given; the
    function itself is unchanged. Usable bare (``@needle.tool``) or with arguments.
    Beyond the official package: ``name=`` / ``description=`` overrides and
    ``unions="anyOf"`` (a Union parameter as anyOf rather than its first member)."""
    if unions not in ("first", "anyOf"):
        raise ValueError(f"unions must be 'first' or 'anyOf', not {unions!r}")

    def attach(target: Callable) -> Callable:
        schema = build_schema(target, unions)
        if name is not None:
            schema["name"] = name
        if description is not None:
            if "description" not in schema:
                schema = {"name": schema["name"], "description": description,
                          "parameters": schema["parameters"]}
            schema["description"] = description
        if triggers:
            schema["triggers"] = list(triggers)
        target._needle_tool = schema
        target.__needle_tool__ = schema  # the name this package used before 0.3
        return target
    return attach(fn) if fn is not None else attach


def _normalize_raw(d: Any) -> dict:
    if not isinstance(d, dict):
        raise NeedleError(f"a tool schema must be a JSON object, got {type(d).__name__}")
    if d.get("type") == "function" and isinstance(d.get("function"), dict):
        d = d["function"]
    return d


def tool_schemas(obj: Any) -> List[dict]:
    """The schema(s) of one tool spec: a decorated or plain function, a pydantic model, a
    dataclass or TypedDict, a raw dict schema (plain or OpenAI-style), or a JSON string of
    either one schema or an array of them."""
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
    stored = getattr(obj, "_needle_tool", None)
    if not isinstance(stored, dict):
        stored = getattr(obj, "__needle_tool__", None)
    if isinstance(stored, dict):
        return stored
    if is_pydantic_model(obj):
        return pydantic_schema(obj)
    if isinstance(obj, type) and dataclasses.is_dataclass(obj):
        # as a callable, but without the signature dataclass() writes as the docstring
        out = {"name": obj.__name__}
        doc = obj.__doc__ or ""
        desc, _ = parse_docstring("" if doc.startswith(obj.__name__ + "(") else doc)
        if desc:
            out["description"] = desc
        out["parameters"] = _members_schema(obj, "first")
        return out
    if _is_typeddict(obj):
        # the official builder reads a TypedDict's (empty) signature; its keys are the tool
        out: dict = {"name": obj.__name__}
        desc, _ = parse_docstring(obj.__doc__)
        if desc:
            out["description"] = desc
        out["parameters"] = _members_schema(obj, "first")
        return out
    if callable(obj):
        return build_schema(obj)
    raise NeedleError(f"cannot make a tool schema from {obj!r}")


# ---------------------------------------------------------------------------------------
# Arguments back into Python values

def _from_iso(tp: type, value: str):
    if tp is datetime.datetime and value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"  # fromisoformat takes "Z" only from Python 3.11
    try:
        return tp.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO {_TEMPORAL_FORMATS[tp]}") from None


def _without_none(tp: Any) -> Any:
    """X of Optional[X] / Annotated[Optional[X], ...] (a Union of several kept as it is)."""
    tp = _strip_annotated(tp)
    if typing.get_origin(tp) in _UNION_ORIGINS:
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(members) == 1:
            return _strip_annotated(members[0])
    return tp


def _wants_int(tp: Any) -> bool:
    """An int annotation, or a Literal / int Enum whose values are all ints."""
    if tp is int:
        return True
    if typing.get_origin(tp) is typing.Literal:
        values = typing.get_args(tp)
        return bool(values) and all(type(v) is int for v in values)
    return False


def _convert_value(tp: Any, value: Any) -> Any:
    tp = _without_none(tp)
    if isinstance(value, float) and value.is_integer() and _wants_int(tp):
        return int(value)  # a JSON number written 3.0 for an int parameter
    if isinstance(tp, type) and tp in _TEMPORAL_FORMATS:
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
    from their ISO strings; a whole float for an int (or all-int Literal) parameter as an
    int; everything else as the model wrote it. ValueError when a date does not parse."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:
        return args
    return {k: _convert_value(hints[k], v) if k in hints else v for k, v in args.items()}
