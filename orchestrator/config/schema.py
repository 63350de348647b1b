"""JSON Schema (draft 2020-12) of the playbook and inventory formats, for editors.

`json_schema("playbook")` / `json_schema("inventory")` start from the pydantic models and widen
what the loader accepts beyond the plain types: durations as "30s"/"10m"/"1h", one name where a
list of names is expected (`needs: build`), `when: true`, numbers as `env` values, a host written
with no settings (`localhost:`). For playbooks, `with:` is described per stage kind: an if/then on
`uses` applies that kind's `Params.model_json_schema()`; any parameter may also be a template
string (``{{ ... }}``), which is rendered per host at run time.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Literal

from orchestrator.config.kinds import stage_kinds
from orchestrator.config.model import Inventory, Playbook

DRAFT = "https://json-schema.org/draft/2020-12/schema"
_DURATION = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*(ms|s|m|h)?\s*$"},
    ],
    "description": "seconds, or text such as '30s', '10m', '1h', '500ms'",
}
_TEMPLATE = {"type": "string", "pattern": r"\{\{", "description": "a template, rendered per host"}
_ONE_OR_MANY = {
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
}


def json_schema(kind: Literal["playbook", "inventory"]) -> dict[str, Any]:
    """The JSON Schema of a playbook or an inventory file."""
    if kind == "playbook":
        return _playbook()
    if kind == "inventory":
        return _inventory()
    raise ValueError(f"unknown schema kind {kind!r}; expected 'playbook' or 'inventory'")


def _duration(props: dict[str, Any], name: str, nullable: bool = False) -> None:
    if name in props:
        keep = {k: props[name][k] for k in ("default", "title") if k in props[name]}
        props[name] = {**copy.deepcopy(_DURATION), **keep}
        if nullable:
            props[name]["anyOf"].append({"type": "null"})


def _head(schema: dict[str, Any], title: str, ident: str) -> dict[str, Any]:
    # top-level `x-...` keys are ignored by the loader: a place for YAML anchors
    schema = {**schema, "patternProperties": {"^x-": {}}}
    return {"$schema": DRAFT, "$id": ident, **schema, "title": title}


def _playbook() -> dict[str, Any]:
    schema = Playbook.model_json_schema(by_alias=True)
    defs = schema["$defs"]
    stage = defs["StageSpec"]
    props = stage["properties"]
    _duration(props, "timeout", nullable=True)
    retry = defs["RetrySpec"]["properties"]
    _duration(retry, "delay")
    _duration(retry, "max_delay")
    props["needs"] = {**_ONE_OR_MANY, "description": "ids of the stages this one runs after"}
    props["tags"] = {**_ONE_OR_MANY, "description": "tags for --only/--skip"}
    props["hosts"] = {
        "anyOf": [*_ONE_OR_MANY["anyOf"], {"type": "null"}],
        "description": "host or group names (default: every host)",
    }
    props["when"] = {
        "anyOf": [{"type": "string"}, {"type": "boolean"}, {"type": "null"}],
        "description": "condition, e.g. `gpu_count > 4`; the stage is skipped when false",
    }
    props["env"] = {
        "type": "object",
        "additionalProperties": {"type": ["string", "number", "boolean"]},
        "description": "environment variables for the stage's commands",
    }

    kinds = stage_kinds()
    rules = []
    for name in sorted(kinds):
        params = kinds[name].Params
        prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", name) + "."
        sub = params.model_json_schema(by_alias=True, ref_template=f"#/$defs/{prefix}{{model}}")
        for def_name, definition in sub.pop("$defs", {}).items():
            defs[prefix + def_name] = definition
        for pname, pschema in list(sub.get("properties", {}).items()):
            sub["properties"][pname] = {"anyOf": [pschema, _TEMPLATE]}
        defs[prefix + "Params"] = sub
        rules.append({
            "if": {"properties": {"uses": {"const": name}}, "required": ["uses"]},
            "then": {"properties": {"with": {"$ref": f"#/$defs/{prefix}Params"}}},
        })
    if kinds:
        props["uses"] = {
            "anyOf": [{"enum": sorted(kinds)}, {"type": "null"}],
            "description": "the stage kind",
        }
    if rules:
        stage["allOf"] = rules
    return _head(schema, "orchestrator playbook", "orchestrator:playbook")


def _inventory() -> dict[str, Any]:
    schema = Inventory.model_json_schema(by_alias=True)
    defs = schema["$defs"]
    host = defs["HostSpec"]["properties"]
    _duration(host, "connect_timeout")
    _duration(host, "connect_budget")
    host["name"] = {"type": "string", "description": "the host's key; usually left out"}
    host["groups"] = {**_ONE_OR_MANY, "description": "groups this host belongs to"}
    defs["GroupSpec"]["properties"]["hosts"] = {**_ONE_OR_MANY, "description": "host names"}
    schema["properties"]["hosts"]["additionalProperties"] = {
        "anyOf": [{"$ref": "#/$defs/HostSpec"}, {"type": "null"}]
    }
    schema["properties"]["defaults"] = {
        "$ref": "#/$defs/HostSpec",
        "description": "default host settings for every host (a host's own settings win)",
    }
    return _head(schema, "orchestrator inventory", "orchestrator:inventory")
