import json
from pathlib import Path

import pytest

from orchestrator.config import json_schema
from orchestrator.config.yamlsrc import load_yaml

ROOT = Path(__file__).resolve().parents[2]


def test_playbook_schema_describes_with_per_kind():
    schema = json_schema("playbook")
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    json.dumps(schema)  # serialisable
    stage = schema["$defs"]["StageSpec"]
    rules = {r["if"]["properties"]["uses"]["const"]: r for r in stage["allOf"]}
    assert "shell" in rules
    ref = rules["shell"]["then"]["properties"]["with"]["$ref"]
    params = schema["$defs"][ref.removeprefix("#/$defs/")]
    assert "command" in params["properties"] and "command" in params["required"]
    assert params["additionalProperties"] is False
    assert "shell" in stage["properties"]["uses"]["anyOf"][0]["enum"]
    # every $ref points at a definition
    for target in _refs(schema):
        assert target.removeprefix("#/$defs/") in schema["$defs"], target


def test_inventory_schema():
    schema = json_schema("inventory")
    assert schema["properties"]["defaults"]["$ref"] == "#/$defs/HostSpec"
    assert "connection" in schema["$defs"]["HostSpec"]["properties"]
    with pytest.raises(ValueError):
        json_schema("nonsense")  # type: ignore[arg-type]


def _refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def test_examples_validate_against_schema():
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(json_schema("playbook"))
    jsonschema.Draft202012Validator(json_schema("playbook")).validate(
        load_yaml(ROOT / "playbooks/examples/hello.yaml").data
    )
    jsonschema.Draft202012Validator(json_schema("inventory")).validate(
        load_yaml(ROOT / "configs/inventory/local.yaml").data
    )
