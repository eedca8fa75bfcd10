"""The shipped manifest JSON Schema is the one the Manifest model generates, so a reader outside Python
validates exactly what fusedspec writes and reads."""

from __future__ import annotations

import json
from pathlib import Path

from jsonschema import Draft202012Validator

from fusedspec.compile.documents.manifest import json_schema

SHIPPED = Path(__file__).resolve().parents[1] / "registry" / "manifest.schema.json"
REGENERATE = ("python -c 'import json; from fusedspec.compile.documents.manifest import json_schema; "
              "print(json.dumps(json_schema(), indent=2))' > registry/manifest.schema.json")


def test_the_shipped_schema_is_the_generated_one() -> None:
    assert json.loads(SHIPPED.read_text()) == json_schema(), \
        f"the shipped schema is stale; regenerate it: {REGENERATE}"


def test_the_schema_is_valid_json_schema_2020_12() -> None:
    Draft202012Validator.check_schema(json_schema())
