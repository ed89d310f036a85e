"""Unions of pydantic models as tool parameters (Union[A, B]: discriminated by a Literal
field, or told apart by their required fields): the schema the package writes compiles in
the engine's grammar, forced calls on the shipped demo model are valid against exactly one
branch, and a union whose branches cannot be told apart is refused saying why."""
import os
from typing import Annotated, Literal, Optional, Union

import pytest

import needle
from needle.schema import tool_schema

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "models", "needle-demo.cact")
needs_demo = pytest.mark.skipif(not os.path.exists(DEMO), reason="no models/needle-demo.cact")


def _models():
    pydantic = pytest.importorskip("pydantic")
    strict = pydantic.ConfigDict(extra="forbid")  # a branch must not swallow another's keys

    class Cat(pydantic.BaseModel):
        model_config = strict
        pet_type: Literal["cat"]
        name: str
        lives: int

    class Dog(pydantic.BaseModel):
        model_config = strict
        pet_type: Literal["dog"]
        name: str
        breed: str

    class Street(pydantic.BaseModel):
        model_config = strict
        street: str
        city: str = ""

    class Coords(pydantic.BaseModel):
        model_config = strict
        lat: float
        lon: float

    class Adoption(pydantic.BaseModel):
        """Record the adoption of a pet."""
        pet: Annotated[Union[Cat, Dog], pydantic.Field(discriminator="pet_type")]
        home: Optional[Union[Street, Coords]] = None

    return pydantic, Cat, Dog, Street, Coords, Adoption


def _branches(pydantic, value, *models):
    """The models `value` validates against."""
    hits = []
    for m in models:
        try:
            m.model_validate(value)
            hits.append(m)
        except pydantic.ValidationError:
            pass
    return hits


def test_union_schemas_compile(cq4):
    _, Cat, Dog, Street, Coords, Adoption = _models()
    params = tool_schema(Adoption)["parameters"]
    assert set(params["properties"]["pet"]["oneOf"][0]) == {"$ref"}  # pydantic's discriminated union
    assert params["properties"]["pet"]["discriminator"]["propertyName"] == "pet_type"

    def adopt(pet: Union[Cat, Dog], home: Union[Street, Coords, None] = None):
        "Adopt a pet."

    # a Union as anyOf is opt-in (the official builder writes its first member)
    pet = needle.tool(adopt, unions="anyOf").__needle_tool__["parameters"]["properties"]["pet"]
    assert [s["properties"]["pet_type"]["const"] for s in pet["anyOf"]] == ["cat", "dog"]
    with needle.Needle(weights=cq4, tools=[Adoption, adopt]) as agent:  # compiles
        for call in agent.complete("adopt a cat")["function_calls"]:
            assert call["name"] in ("Adoption", "adopt")


def test_ambiguous_union_refused(cq4):
    pydantic = pytest.importorskip("pydantic")

    class Small(pydantic.BaseModel):
        size: int

    class Sized(pydantic.BaseModel):
        size: int
        unit: str = "cm"

    def measure(thing: Union[Small, Sized]):
        "Measure."

    with pytest.raises(needle.NeedleError, match="cannot be told apart"):
        needle.Needle(weights=cq4, tools=[needle.tool(measure, unions="anyOf")])


@needs_demo
def test_forced_union_calls_on_demo_model():
    pydantic, Cat, Dog, Street, Coords, Adoption = _models()
    queries = ["We adopted a cat called Tom with 9 lives, we live at 5 Main St, Oslo",
               "Adopt Rex, a beagle dog; home is at 59.9, 10.7",
               "a dog named Fido"]
    kinds = set()
    for q in queries:
        # forced (one call) and not strict: the branches are the point, not the grounding
        a = needle.extract(q, Adoption, weights=DEMO, strict=False, force=True, auto_date=False)
        assert isinstance(a, Adoption)
        assert len(_branches(pydantic, a.pet.model_dump(), Cat, Dog)) == 1
        if a.home is not None:
            assert len(_branches(pydantic, a.home.model_dump(), Street, Coords)) == 1
        kinds.add(type(a.pet))

    def adopt(pet: Union[Cat, Dog], home: Union[Street, Coords, None] = None):
        "Adopt a pet."

    adopt = needle.tool(adopt, unions="anyOf")
    with needle.Needle(weights=DEMO, tools=[adopt], auto_date=False) as agent:
        for q in queries:
            args = agent.extract(q, adopt, strict=False, force=True)
            assert len(_branches(pydantic, args["pet"], Cat, Dog)) == 1, args
            if args.get("home") is not None:
                assert len(_branches(pydantic, args["home"], Street, Coords)) == 1, args
    assert kinds  # at least one pet came back as a model instance
