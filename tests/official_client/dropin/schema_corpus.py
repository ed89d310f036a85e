"""The schema corpus of the drop-in test: functions and models annotated every way the
official package (cactus-needle 3.x) builds a schema for, written against the public
surface only (`needle.tool`, `needle.Field`), so the same file imports under the official
package and under ours. dump_schemas.py prints every schema; dropin.sh compares the two
packages' output byte for byte.

Not here on purpose: annotations the official builder has no rule for (datetime, tuple,
set, dataclass; it writes "string"), where ours writes a richer form (python/README.md)."""
import enum
import sys
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

import needle
from needle import Field


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Ratio(enum.Enum):
    HALF = 0.5
    FULL = 1.0


class Flag(enum.Enum):
    ON = True
    OFF = False


def t_primitives(a: str, b: int, c: float, d: bool, e, f: dict, g: list):
    "Every plain type."


def t_none_any(a: None, b: Any, c: object):
    "None, Any and an unknown class."


def t_lists(a: List[str], b: list[int], c: List[List[float]], d: List, e: List[Optional[int]],
            f: list[Literal["x", "y"]], g: List[Dict[str, int]]):
    "Lists of everything."


def t_dicts(a: Dict[str, int], b: dict[str, list[int]], c: Dict):
    "Dictionaries."


def t_literals(a: Literal["c", "f"], b: Literal[1, 2, 3], c: Literal[True, False],
               d: Literal[1.5, 2], e: Literal["x", 1], f: Literal[None, "a"]):
    "Literals of each type; the first value's type names the enum."


def t_enums(c: Color, lv: Level = Level.LOW, r: Ratio = Ratio.HALF, fl: Optional[Flag] = None):
    "Enum classes."


def t_optional(a: Optional[str], b: Union[int, None], c: str = "x", d: Optional[int] = None,
               e: Optional[List[str]] = None):
    "Optional parameters and defaults (never written into the schema)."


def t_unions(a: Union[int, str], b: Union[str, int, None] = None, c: Union[List[int], str] = 1):
    "Unions: the first member."


def t_annotated_plain(a: Annotated[int, "ignored metadata"], b: Annotated[str, 5]):
    "Annotated metadata that is not a Field is ignored."


def t_field_each(a: Annotated[str, Field(description="City name")],
                 b: Annotated[str, Field(enum=["a", "b"])],
                 c: Annotated[str, Field(const="k")],
                 d: Annotated[int, Field(ge=0)], e: Annotated[int, Field(le=9)],
                 f: Annotated[float, Field(gt=0.5)], g: Annotated[float, Field(lt=2)],
                 h: Annotated[int, Field(multiple_of=5)],
                 i: Annotated[str, Field(min_length=1)], j: Annotated[str, Field(max_length=8)],
                 k: Annotated[str, Field(pattern="^[a-z]+$")],
                 m: Annotated[str, Field(format="date")],
                 n: Annotated[List[int], Field(min_items=1)],
                 o: Annotated[List[int], Field(max_items=3)],
                 p: Annotated[List[int], Field(unique_items=True)]):
    "One Field constraint each."


def t_field_all(x: Annotated[int, Field(description="all of them", enum=[1, 2], const=1, ge=0,
                                        le=9, gt=-1, lt=10, multiple_of=1, min_length=0,
                                        max_length=3, pattern="x", format="f", min_items=0,
                                        max_items=1, unique_items=False)]):
    "Every Field keyword at once: the key order."


def t_field_default(a: Annotated[int, Field(4)], b: Annotated[int, Field(default=2, ge=1)],
                    c: Annotated[str, Field(None, description="none default")]):
    "A Field's default makes the parameter optional and is not written."


def t_field_as_default(a: int = Field(ge=1, le=5), b: str = Field(description="desc"),
                       c: int = Field(3, ge=0), d: Optional[int] = Field(ge=2)):
    """A Field as the default value keeps its constraints; the parameter stays required
    unless the Field has a default.

    Args:
        a: from the docstring
        c: also documented
    """


def t_field_both(a: Annotated[int, Field(ge=1)] = Field(le=3)):
    "A Field default wins over an Annotated Field."


def t_field_two(a: Annotated[int, Field(ge=1), Field(le=3)]):
    "Only the first Annotated Field counts."


def t_field_optional(a: Optional[Annotated[str, Field(description="inner")]] = None,
                     b: Annotated[Optional[str], Field(description="outer")] = None,
                     c: Annotated[Optional[Literal["x", "y"]], Field(description="lit")] = None,
                     d: Optional[Annotated[int, Field(ge=0, le=10)]] = None):
    "Fields inside and outside Optional."


def t_field_desc_vs_doc(x: Annotated[int, Field(description="from field")],
                        y: Annotated[Literal["a", "b"], Field(description="lit field")],
                        z: Annotated[int, Field(ge=0)]):
    """A Field description replaces the docstring's, in its place.

    Args:
        x: from doc
        y: from doc too
        z: doc then constraint
    """


def t_field_enum_over_literal(x: Annotated[Literal["a", "b"], Field(enum=("a",))]):
    "A Field enum replaces the Literal's values in place."


def t_doc_google(city: str, nights: int = 1, *, pets: bool = False):
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


def t_doc_headers_arguments(x: int, y: int):
    """Do it.

    Arguments:
        x (int): the x.
        y: the y.
    """


def t_doc_headers_parameters(x: int):
    """Do it.

    Parameters:
        x: the x.
    """


def t_doc_headers_params(x: int):
    """Do it.

    Params:
        x: the x.
    """


def t_doc_returns_first(x: int):
    """Compute.

    Returns:
        the value.

    Args:
        x: the input.
    """


def t_doc_no_args(x: int):
    """Only a summary line, no arguments section."""


def t_doc_multiline(x: int):
    """First line.
    Second line.

    Third paragraph.
    """


def t_doc_unknown_arg(x: int):
    """Has docs for a missing parameter.

    Args:
        y: not a parameter.
        x: the real one.
    """


def t_doc_same_line():
    """Summary."""


def t_doc_nested_indent(x: int, y: str):
    """Summary.

    Args:
        x: first line
          continued deeper
            and deeper.
        y: why
    Raises:
        ValueError: never.
    """


def t_doc_empty_desc_arg(x: int, y: int):
    """Summary.

    Args:
        x:
        y: has text.
    """


def t_doc_colon_in_text(x: str):
    """Fetch: a URL.

    Args:
        x: a url: like http://x.
    """


def t_no_doc(x: int, y: str = "d"):
    pass


def t_no_params():
    "Nothing to pass."


def t_unicode(ville: str, café: Optional[str] = None):
    """Réserve une table à Paris — ☕.

    Args:
        ville: La ville, ex. « Zürich ».
        café: Le café préféré.
    """


def t_varargs(a: int, *args, b: str, **kwargs):
    "Var-positional and var-keyword parameters are skipped."


def t_numbers_defaults(a: float = 1.5, b: int = 0, c: bool = True, d: str = ""):
    "Defaults of each type."


def t_all_optional(a: Optional[int] = None, b: Optional[str] = None):
    "Nothing required."


def t_enum_literal_optional(room: Optional[Literal["kitchen", "hall"]] = None,
                            level: Optional[Level] = None):
    """Optional enums.

    Args:
        room: Which room.
        level: How much.
    """


def t_list_of_enum(colors: List[Color], levels: List[Literal[1, 2]]):
    "Lists of enums."


def t_bounded_list(tags: Annotated[List[str], Field(min_items=1, max_items=5,
                                                    description="Tags.")]):
    "A bounded list."


def t_pattern_format(email: Annotated[str, Field(format="email")],
                     code: Annotated[str, Field(pattern=r"^\d{4}$", description="PIN")]):
    "Formats and patterns."


def t_numbers_bounds(temp: Annotated[float, Field(ge=-10.5, le=40.0)],
                     pct: Annotated[int, Field(ge=0, le=100, multiple_of=5)] = 50):
    """Bounded numbers.

    Args:
        temp: Degrees.
        pct: Percent.
    """


def t_forward_ref(x: "int", y: "Optional[str]" = None):
    "String annotations resolved by get_type_hints."


def t_forward_unresolved(x: "NoSuchType", y: int = 1):  # noqa: F821
    "An annotation that does not resolve: every hint is taken raw."


class _Methods:
    def method(self, a: int, b: str = "x"):
        """A method: self is skipped.

        Args:
            a: an int.
        """

    @classmethod
    def klass(cls, a: int):
        "A classmethod: cls is skipped."


@needle.tool
def t_decorated_bare(q: str):
    "Decorated bare."


@needle.tool(triggers=["turn on the light", "lights on please"])
def t_decorated_triggers(room: Literal["a", "b"]):
    "Decorated with triggers."


@needle.tool()
def t_decorated_empty_call(q: str):
    "Decorated with an empty call."


@needle.tool(triggers=[])
def t_decorated_no_triggers(q: str):
    "Empty triggers are not written."


if sys.version_info >= (3, 10):
    def t_pep604(a: "int | None", b: "list[str] | None" = None, c: "str | int" = "x"):
        "PEP 604 unions."
else:  # pragma: no cover
    def t_pep604(a: Optional[int], b: Optional[List[str]] = None, c: Union[str, int] = "x"):
        "PEP 604 unions."


FUNCTIONS = [
    t_primitives, t_none_any, t_lists, t_dicts, t_literals, t_enums, t_optional, t_unions,
    t_annotated_plain, t_field_each, t_field_all, t_field_default, t_field_as_default,
    t_field_both, t_field_two, t_field_optional, t_field_desc_vs_doc,
    t_field_enum_over_literal, t_doc_google, t_doc_headers_arguments,
    t_doc_headers_parameters, t_doc_headers_params, t_doc_returns_first, t_doc_no_args,
    t_doc_multiline, t_doc_unknown_arg, t_doc_same_line, t_doc_nested_indent,
    t_doc_empty_desc_arg, t_doc_colon_in_text, t_no_doc, t_no_params, t_unicode,
    t_varargs, t_numbers_defaults, t_all_optional, t_enum_literal_optional, t_list_of_enum,
    t_bounded_list, t_pattern_format, t_numbers_bounds, t_forward_ref, t_forward_unresolved,
    _Methods().method, _Methods.klass, t_pep604,
]
DECORATED = [t_decorated_bare, t_decorated_triggers, t_decorated_empty_call,
             t_decorated_no_triggers]


def pydantic_models():
    """Pydantic models, v2 and (through pydantic.v1) v1, as tools and as parameter types;
    [] without pydantic."""
    try:
        import pydantic
    except ImportError:
        return []
    models = []

    class Invoice(pydantic.BaseModel):
        """An invoice.

        With a second paragraph."""
        number: str
        total: float = pydantic.Field(ge=0, description="Total due.")
        currency: Literal["EUR", "USD"] = "EUR"
        lines: List[str] = []

    class Point(pydantic.BaseModel):
        lat: float
        lon: float

    class Place(pydantic.BaseModel):
        name: str
        at: Point

    class Trip(pydantic.BaseModel):
        """Plan a trip."""
        start: Place
        stops: List[Place] = []

    class Flat(pydantic.BaseModel):
        x: int

    def uses_flat(p: Flat, q: Optional[Flat] = None):
        "A flat model as a parameter type."

    models += [Invoice, Point, Trip, Flat, uses_flat]
    try:
        from pydantic import v1 as pv1
    except ImportError:  # pragma: no cover
        return models

    class OldInvoice(pv1.BaseModel):
        """A pydantic v1 invoice."""
        number: str
        total: float = pv1.Field(0, ge=0)

    class OldPoint(pv1.BaseModel):
        x: int
        y: Optional[int] = None

    class OldNested(pv1.BaseModel):
        p: OldPoint

    models += [OldInvoice, OldPoint, OldNested]
    return models
