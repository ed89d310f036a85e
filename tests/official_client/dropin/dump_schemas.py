"""Prints one JSON line per tool of the drop-in corpus: "<label>\t<json.dumps(schema)>".
Run under the official package or ours (`needle` resolves to whichever is installed /
on the path); the environments' tools come from `needle.environments`. The schema is the
one the package's Needle would send: `_needle_tool` when the decorator stored one, else
the package's builder (`build_schema` / `pydantic_schema`)."""
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("NEEDLE_TELEMETRY", "0")
os.environ.setdefault("DO_NOT_TRACK", "1")
warnings.simplefilter("ignore")

import needle  # noqa: E402
import schema_corpus  # noqa: E402

ENVIRONMENTS = ("data_capture", "kitchen_appliance", "media_player", "productivity",
                "smart_home", "wearable")


def schema_of(entry):
    stored = getattr(entry, "_needle_tool", None)
    if stored is not None:
        return stored
    # both packages export these names at the top level
    if needle._is_pydantic_model(entry):
        return needle.pydantic_schema(entry)
    return needle.build_schema(entry)


def main():
    import importlib
    rows = []
    for name in ENVIRONMENTS:
        module = importlib.import_module(f"needle.environments.{name}")
        for entry in module.TOOLS:
            rows.append((f"{name}.{entry.__name__}", schema_of(entry)))
        rows.append((f"{name}.SYSTEM", module.SYSTEM))
    for entry in schema_corpus.FUNCTIONS + schema_corpus.DECORATED:
        rows.append((getattr(entry, "__qualname__", entry.__name__), schema_of(entry)))
    for entry in schema_corpus.pydantic_models():
        rows.append((entry.__qualname__, schema_of(entry)))
    for label, schema in rows:
        print(label + "\t" + json.dumps(schema), flush=True)


if __name__ == "__main__":
    main()
