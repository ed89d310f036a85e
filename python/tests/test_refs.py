"""Nested pydantic models ($defs / $ref) as tool parameters: the schema keeps the refs as
written (the model sees the tools as the user wrote them), the engine resolves them for the
grammar, and every call it produces validates against the model."""
import json

import pytest

import needle
from needle.schema import tool_schema


def _models():
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        lat: float
        lon: float

    class Place(pydantic.BaseModel):
        name: str
        at: Point

    class Trip(pydantic.BaseModel):
        """Plan a trip."""
        start: Place
        stops: list[Place] = []

    return pydantic, Point, Place, Trip


def test_nested_model_as_tool(cq4):
    _, _, _, Trip = _models()
    schema = tool_schema(Trip)
    assert set(schema["parameters"]["$defs"]) == {"Point", "Place"}
    assert list(schema["parameters"]) == ["type", "properties", "required", "$defs"]  # as the official client
    assert schema["parameters"]["properties"]["start"] == {"$ref": "#/$defs/Place"}
    with needle.Needle(weights=cq4, tools=[Trip]) as agent:
        for q in ("from Oslo", "a trip", "Lagos then Accra"):
            env = agent.complete(q)
            agent.reset()
            for call in env["function_calls"]:
                assert call["name"] == "Trip"
                Trip.model_validate(call["arguments"])  # raises if the grammar let a bad one through


def test_function_with_model_parameter(cq4):
    _, Point, Place, Trip = _models()

    @needle.tool
    def plan(trip: Trip, fallback: Place = None):
        "Plan a trip."
        return trip

    params = plan.__needle_tool__["parameters"]
    # the models' $defs are moved to the parameters, where "#/$defs/..." points
    assert set(params["$defs"]) == {"Point", "Place"}
    assert "$defs" not in params["properties"]["trip"]
    assert '"$defs":' not in json.dumps(params["properties"])
    with needle.Needle(weights=cq4, tools=[plan]) as agent:
        env = agent.complete("from Oslo")
        for call in env["function_calls"]:
            Trip.model_validate(call["arguments"]["trip"])


def test_recursive_models_refused_clearly(cq4):
    pydantic, _, _, _ = _models()

    class Node(pydantic.BaseModel):
        label: str
        kids: list["Node"] = []

    with pytest.raises(needle.NeedleError, match=r"Node is recursive \(#/\$defs/Node refers"):
        needle.Needle(weights=cq4, tools=[Node])
