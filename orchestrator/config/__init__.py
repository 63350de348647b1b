"""Configuration: playbooks and inventories (YAML -> validated models), variables, templating.

    load_playbook(path) -> Playbook            load_inventory(path) -> Inventory
    load_playbook_alone(path, cli_vars) -> (Playbook, [(location, name) an inventory must define])
    load_all(playbook_path, inventory_path, cli_vars) -> (Playbook, Inventory)
    validate_params(stage, rendered_with) -> the kind's Params (errors located)
    host_variables(playbook, inventory, host_name, cli_vars) -> dict
    parse_cli_vars(["k=v", ...]) -> dict       secret_values(playbook, inventory, variables)
    unknown_variables(playbook, inventory, names) -> {name: did-you-mean}  (a typo'd --var)
    render_value / render_shell / evaluate_condition / undeclared   (Jinja2, sandboxed, strict)
    json_schema("playbook" | "inventory") -> dict

Every problem is a `ConfigError` whose `ConfigProblem`s name file:line:column.

The names above are loaded on first use (PEP 562): importing one submodule, e.g.
`orchestrator.config.model`, does not import the others. A deploy reads its inventory and starts
connecting before it needs the playbook's loader, so only what that takes is imported first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.config.loader import (
        load_all,
        load_inventory,
        load_playbook,
        load_playbook_alone,
        validate_params,
    )
    from orchestrator.config.model import (
        GroupSpec,
        HostSpec,
        HypervisorSpec,
        Inventory,
        Playbook,
        RetrySpec,
        StageSpec,
        parse_duration,
    )
    from orchestrator.config.schema import json_schema
    from orchestrator.config.templating import (
        Raw,
        evaluate_condition,
        is_template,
        render_shell,
        render_string,
        render_value,
        undeclared,
    )
    from orchestrator.config.variables import (
        BUILTINS,
        builtin_variables,
        group_names,
        host_variables,
        parse_cli_vars,
        secret_values,
        unknown_variables,
    )
    from orchestrator.config.yamlsrc import YamlDoc, load_yaml, load_yaml_text

#: public name -> the submodule that defines it
_HOMES = {
    **dict.fromkeys(["load_all", "load_inventory", "load_playbook", "load_playbook_alone",
                     "validate_params"], "loader"),
    **dict.fromkeys(["GroupSpec", "HostSpec", "HypervisorSpec", "Inventory", "Playbook",
                     "RetrySpec", "StageSpec", "parse_duration"], "model"),
    "json_schema": "schema",
    **dict.fromkeys(["Raw", "evaluate_condition", "is_template", "render_shell", "render_string",
                     "render_value", "undeclared"], "templating"),
    **dict.fromkeys(["BUILTINS", "builtin_variables", "group_names", "host_variables",
                     "parse_cli_vars", "secret_values", "unknown_variables"], "variables"),
    **dict.fromkeys(["YamlDoc", "load_yaml", "load_yaml_text"], "yamlsrc"),
}

__all__ = [
    "BUILTINS",
    "GroupSpec",
    "HostSpec",
    "HypervisorSpec",
    "Inventory",
    "Playbook",
    "Raw",
    "RetrySpec",
    "StageSpec",
    "YamlDoc",
    "builtin_variables",
    "evaluate_condition",
    "group_names",
    "host_variables",
    "is_template",
    "json_schema",
    "load_all",
    "load_inventory",
    "load_playbook",
    "load_playbook_alone",
    "load_yaml",
    "load_yaml_text",
    "parse_cli_vars",
    "parse_duration",
    "render_shell",
    "render_string",
    "render_value",
    "secret_values",
    "undeclared",
    "unknown_variables",
    "validate_params",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
