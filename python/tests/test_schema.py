"""Schema building: every supported annotation and Field constraint."""
import enum
import json
import sys
from dataclasses import dataclass, field
from typing import Annotated, Dict, List, Literal, Optional, Tuple, TypedDict, Union

import pytest

import needle
from needle import Field
from needle.schema import parse_docstring, tool_schemas, type_schema


def params(fn):
    return needle.tool(fn).__needle_tool__["parameters"]


def test_seed_tool_schema_and_key_order():
    @needle.tool
    def get_weather(city: str):
        "Get the current weather for a city."
        return {}
    s = get_weather.__needle_tool__
    assert s == {"name": "get_weather", "description": "Get the current weather for a city.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}}
    assert list(s) == ["name", "description", "parameters"]
    assert list(s["parameters"]) == ["type", "properties", "required"]
    assert get_weather(city="x") == {}  # the decorated function is still callable


def test_no_description_no_required():
    @needle.tool
    def f(x: int = 3):
        pass
    s = f.__needle_tool__
    # the official builder never writes "default": a default only makes it optional
    assert s == {"name": "f", "parameters": {"type": "object", "properties":
                                            {"x": {"type": "integer"}}}}
    assert f._needle_tool is s  # the official attribute name
    assert "description" not in s and "required" not in s["parameters"]


def test_primitives():
    def f(a: str, b: int, c: float, d: bool, e, g: dict, h: Dict[str, int], i: list):
        pass
    p = params(f)
    assert p["properties"] == {
        "a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "number"},
        "d": {"type": "boolean"}, "e": {"type": "string"}, "g": {"type": "object"},
        "h": {"type": "object"}, "i": {"type": "array"}}
    assert p["required"] == list("abcdeghi")


def test_arrays():
    def f(a: List[str], b: list[int], c: List[List[float]], d: Tuple[int, ...]):
        pass
    assert params(f)["properties"] == {
        "a": {"type": "array", "items": {"type": "string"}},
        "b": {"type": "array", "items": {"type": "integer"}},
        "c": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        "d": {"type": "array", "items": {"type": "integer"}}}


def test_literal_types():
    def f(a: Literal["c", "f"], b: Literal[1, 2, 3], c: Literal[True, False],
          d: Literal[1.5, 2], e: Literal["x", 1]):
        pass
    assert params(f)["properties"] == {
        "a": {"type": "string", "enum": ["c", "f"]},
        "b": {"type": "integer", "enum": [1, 2, 3]},
        "c": {"type": "boolean", "enum": [True, False]},
        "d": {"type": "number", "enum": [1.5, 2]},
        "e": {"type": "string", "enum": ["x", 1]}}  # the first value's type, as official


def test_optional_and_defaults():
    def f(a: Optional[str], b: Union[int, None], c: str = "x", d: Optional[int] = None,
          g: Union[int, str] = 1):
        pass
    p = params(f)
    assert p["properties"] == {
        "a": {"type": "string"}, "b": {"type": "integer"},
        "c": {"type": "string"}, "d": {"type": "integer"},
        "g": {"type": "integer"}}  # a Union is its first member, as official
    assert "required" not in p
    # anyOf is opt-in
    rich = needle.tool(f, unions="anyOf")._needle_tool["parameters"]["properties"]
    assert rich["g"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}


@pytest.mark.skipif(sys.version_info < (3, 10), reason="X | None needs Python 3.10")
def test_pep604_optional():
    def f(e: "int | None", h: "list[str] | None" = None):
        pass
    p = params(f)
    assert p == {"type": "object", "properties": {
        "e": {"type": "integer"}, "h": {"type": "array", "items": {"type": "string"}}}}


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def test_enums():
    def f(c: Color, l: Level = Level.LOW):
        pass
    p = params(f)
    assert p["properties"] == {"c": {"type": "string", "enum": ["red", "green"]},
                               "l": {"type": "integer", "enum": [1, 2]}}
    assert p["required"] == ["c"]


@dataclass
class Address:
    street: str
    zip_code: Optional[str] = None
    tags: List[str] = field(default_factory=list)


class Person(TypedDict):
    name: str
    age: int


class Partial(TypedDict, total=False):
    note: str


def test_nested_dataclass_and_typeddict():
    def f(addr: Address, who: Person, extra: Partial, many: List[Address]):
        pass
    addr = {"type": "object", "properties": {
        "street": {"type": "string"}, "zip_code": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["street"]}
    assert params(f)["properties"] == {
        "addr": addr,
        "who": {"type": "object", "properties": {"name": {"type": "string"},
                                                 "age": {"type": "integer"}},
                "required": ["name", "age"]},
        "extra": {"type": "object", "properties": {"note": {"type": "string"}}},
        "many": {"type": "array", "items": addr}}


def test_field_constraints_each():
    cases = [
        (Annotated[str, Field(description="City name")],
         {"type": "string", "description": "City name"}),
        (Annotated[str, Field(enum=["a", "b"])], {"type": "string", "enum": ["a", "b"]}),
        (Annotated[str, Field(const="k")], {"type": "string", "const": "k"}),
        (Annotated[int, Field(ge=0)], {"type": "integer", "minimum": 0}),
        (Annotated[int, Field(le=9)], {"type": "integer", "maximum": 9}),
        (Annotated[float, Field(gt=0.5)], {"type": "number", "exclusiveMinimum": 0.5}),
        (Annotated[float, Field(lt=2)], {"type": "number", "exclusiveMaximum": 2}),
        (Annotated[int, Field(multiple_of=5)], {"type": "integer", "multipleOf": 5}),
        (Annotated[str, Field(min_length=1)], {"type": "string", "minLength": 1}),
        (Annotated[str, Field(max_length=8)], {"type": "string", "maxLength": 8}),
        (Annotated[str, Field(pattern="^[a-z]+$")], {"type": "string", "pattern": "^[a-z]+$"}),
        (Annotated[str, Field(format="date")], {"type": "string", "format": "date"}),
        (Annotated[List[int], Field(min_items=1)],
         {"type": "array", "items": {"type": "integer"}, "minItems": 1}),
        (Annotated[List[int], Field(max_items=3)],
         {"type": "array", "items": {"type": "integer"}, "maxItems": 3}),
        (Annotated[List[int], Field(unique_items=True)],
         {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
        (Annotated[int, Field(default=4)], {"type": "integer"}),
        (Annotated[int, Field(4)], {"type": "integer"}),  # the first positional is the default
    ]
    for tp, expected in cases:
        assert type_schema(tp) == expected, tp


def test_field_combined_and_required():
    def f(n: Annotated[int, Field(description="count", ge=1, le=10)],
          m: Annotated[int, Field(default=2)],
          o: Optional[Annotated[str, Field(description="opt")]] = None,
          q: Annotated[Optional[str], Field(description="q")] = None):
        pass
    p = params(f)
    assert p == {"type": "object", "properties": {
        "n": {"type": "integer", "description": "count", "minimum": 1, "maximum": 10},
        "m": {"type": "integer"},
        "o": {"type": "string", "description": "opt"},
        "q": {"type": "string", "description": "q"}}, "required": ["n"]}


def test_docstring_google_style():
    @needle.tool
    def book(city: str, nights: int = 1, *, pets: bool = False):
        """Book a hotel room
        in a city.

        Args:
            city (str): The city to book in,
                as a plain name.
            nights: How many nights.
            pets (bool): Whether pets come.

        Returns:
            dict: the booking.
        """
    s = book.__needle_tool__
    assert s == {"name": "book", "description": "Book a hotel room in a city.",
                 "parameters": {"type": "object", "properties": {
                     "city": {"type": "string",
                              "description": "The city to book in, as a plain name."},
                     "nights": {"type": "integer", "description": "How many nights."},
                     "pets": {"type": "boolean", "description": "Whether pets come."}},
                     "required": ["city"]}}


@pytest.mark.parametrize("header", ["Args:", "Arguments:", "Parameters:"])
def test_docstring_headers(header):
    desc, args = parse_docstring(f"Do it.\n\n{header}\n    x (int): the x.\n")
    assert desc == "Do it." and args == {"x": "the x."}


def test_field_description_wins_over_docstring():
    def f(x: Annotated[int, Field(description="from field")]):
        """F.

        Args:
            x: from doc
        """
    assert params(f)["properties"]["x"] == {"type": "integer", "description": "from field"}


def test_tool_overrides_and_self_varargs():
    class K:
        def m(self, a: int, *args, **kw):
            "Method."
    s = needle.tool(name="renamed", description="Other.")(K.m).__needle_tool__
    assert s == {"name": "renamed", "description": "Other.",
                 "parameters": {"type": "object", "properties": {"a": {"type": "integer"}},
                                "required": ["a"]}}


def test_raw_dict_and_json_tools():
    raw = {"name": "t", "description": "d", "parameters": {"type": "object", "properties": {}}}
    assert tool_schemas(raw) == [raw]
    assert tool_schemas({"type": "function", "function": raw}) == [raw]
    assert tool_schemas(json.dumps(raw)) == [raw]
    assert tool_schemas(json.dumps([raw, dict(raw, name="u")]))[1]["name"] == "u"
    with pytest.raises(needle.NeedleError, match="malformed"):
        tool_schemas("{not json")


def test_unknown_annotation_is_string():
    # the official builder writes "string" for a type it has no rule for
    def f(x: complex):
        pass
    assert params(f)["properties"] == {"x": {"type": "string"}}


def test_field_as_default_keeps_constraints_and_stays_required():
    def f(a: int = Field(ge=1, le=5), b: int = Field(3, ge=0), c: str = Field(description="d")):
        pass
    p = params(f)
    assert p["properties"] == {"a": {"type": "integer", "minimum": 1, "maximum": 5},
                               "b": {"type": "integer", "minimum": 0},
                               "c": {"type": "string", "description": "d"}}
    assert p["required"] == ["a", "c"]


def test_triggers():
    @needle.tool(triggers=["lights on", "turn the lights on"])
    def lights(on: bool):
        "Lights."
    assert lights._needle_tool == {"name": "lights", "description": "Lights.", "parameters": {
        "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]},
        "triggers": ["lights on", "turn the lights on"]}


def test_description_right_after_type():
    def f(x: Annotated[int, Field(ge=0, le=9)]):
        """F.

        Args:
            x: a digit
        """
    assert list(params(f)["properties"]["x"]) == ["type", "description", "minimum", "maximum"]


def test_dataclass_as_tool():
    s = needle.tool_schema(Address)
    assert s["name"] == "Address" and "description" not in s
    assert s["parameters"]["required"] == ["street"]


def test_pydantic_model_schema():
    pydantic = pytest.importorskip("pydantic")

    class Invoice(pydantic.BaseModel):
        """An invoice."""
        number: str
        total: float = pydantic.Field(ge=0)

    s = needle.tool_schema(Invoice)
    assert s["name"] == "Invoice" and s["description"] == "An invoice."
    assert s["parameters"]["properties"]["number"]["type"] == "string"
    assert s["parameters"]["properties"]["total"]["minimum"] == 0
    assert s["parameters"]["required"] == ["number", "total"]
