"""Jinja2 templating for playbook fields: sandboxed, strict about undefined names, shell-safe.

- `render_value(obj, variables)` renders every string inside dicts/lists. A string that is exactly
  one expression, ``"{{ expr }}"``, keeps the expression's native type (int, bool, list, dict);
  any other string renders to a string.
- `render_shell(template, variables)` renders a shell command: the output of every ``{{ }}`` is
  `shlex.quote`d (a list becomes its elements quoted and joined by spaces), unless marked with
  ``| raw`` (the `Raw` wrapper type), which inserts it unquoted. ``| quote`` quotes explicitly
  (useful outside shell fields; it is not quoted twice).
- `evaluate_condition(expr, variables)` evaluates a `when:` condition, written bare
  (``gpu_count > 4``) or as ``"{{ gpu_count > 4 }}"``. Text results true/yes/on/1 and
  false/no/off/0/"" are read as booleans; other text is an error.
- `undeclared(text)` lists the variable names a template reads (jinja2.meta).

Templates run in Jinja2's `SandboxedEnvironment` (no access to Python internals) with
`StrictUndefined` (a missing variable is an error, never an empty string); string/list repetition
and powers are bounded. Every failure is a `ConfigError` whose problem carries the caller's
`Location` and a hint (close variable names via difflib).

Jinja2 itself (`orchestrator.config._jinja`) is imported on the first string that is a template:
a string without ``{{``, ``{%`` or ``{#`` is returned as it is, so reading an inventory, or
rendering values that hold no template, never loads it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from orchestrator.errors import ConfigProblem, Location


class Raw(str):
    """Text inserted into a shell command as is (no quoting). Made by the `| raw` filter."""


class Data(str):
    """Text that is never a template, whatever braces it holds: values read from the operator's
    environment with `!env` (a token such as ``hf_{{x`` or ``p{#ss`` is data, not Jinja)."""


def is_template(value: Any) -> bool:
    """True for a string holding Jinja syntax ({{ }}, {% %} or {# #}); never for `Data`."""
    return (isinstance(value, str) and not isinstance(value, Data)
            and ("{{" in value or "{%" in value or "{#" in value))


def _impl() -> ModuleType:
    """orchestrator.config._jinja, imported on first use."""
    import orchestrator.config._jinja as impl

    return impl


# -- public API -------------------------------------------------------------------------------


def render_string(text: str, variables: Mapping[str, Any], location: Location | None = None) -> str:
    """Render one template to text (no native types, no shell quoting)."""
    if not is_template(text):
        return text
    return str(_impl().render_string(text, variables, location))


def render_value(obj: Any, variables: Mapping[str, Any], location: Location | None = None) -> Any:
    """Render every string in `obj` (recursing into dicts and lists).

    A string that is exactly one ``{{ expr }}`` becomes the expression's value with its own type.
    """
    if isinstance(obj, str):
        if not is_template(obj):
            return obj
        return _impl().render_template_value(obj, variables, location)
    if isinstance(obj, Mapping):
        return {k: render_value(v, variables, location) for k, v in obj.items()}
    if isinstance(obj, list):
        return [render_value(v, variables, location) for v in obj]
    if isinstance(obj, tuple):
        return tuple(render_value(v, variables, location) for v in obj)
    return obj


def render_shell(
    template: str, variables: Mapping[str, Any], location: Location | None = None
) -> str:
    """Render a shell command; each ``{{ }}`` output is shell-quoted unless ``| raw``."""
    if not is_template(template):
        return template
    return str(_impl().render_shell(template, variables, location))


def condition_source(expr: str) -> str | None:
    """The bare expression of a `when:` (strips one surrounding ``{{ }}``); None if mixed text."""
    source: str | None = _impl().condition_source(expr)
    return source


def evaluate_condition(
    expr: str | bool, variables: Mapping[str, Any], location: Location | None = None
) -> bool:
    """Evaluate a `when:` condition (bare expression or ``{{ expr }}``) to True/False."""
    if isinstance(expr, bool):
        return expr
    return bool(_impl().evaluate_condition(expr, variables, location))


def undeclared(template_text: str, *, expression: bool = False) -> set[str]:
    """Names of the variables a template (or, with `expression=True`, a bare expression) reads.

    Raises ConfigError (without location) on a syntax error.
    """
    return set(_impl().undeclared(template_text, expression))


def check_template(text: str, *, expression: bool = False) -> ConfigProblem | None:
    """Compile a template (or bare expression) without rendering it; the problem if it fails.

    Catches syntax errors and unknown filters/tests; the problem has no location.
    """
    problem: ConfigProblem | None = _impl().check_template(text, expression=expression)
    return problem


_BLOCK_END = {"{{": "}}", "{%": "%}", "{#": "#}"}


def quoted_expressions(command: str) -> list[str]:
    """The ``{{ expr }}`` of a shell-command template written inside shell quotes.

    `render_shell` quotes every value already; inside `"..."` its quotes are literal (a value
    holding `$(...)` would run), inside `'...'` they close the author's (a value holding `;`
    would run). Expressions ending in ``| raw`` (unquoted on purpose) are not listed. Comments,
    backslash escapes and `'` inside `"..."` are followed; heredocs are not.
    """
    found: list[str] = []
    state: str | None = None  # None, "'" or '"'
    i, n = 0, len(command)
    while i < n:
        opener = command[i:i + 2]
        if opener in _BLOCK_END:
            end = command.find(_BLOCK_END[opener], i + 2)
            end = n if end < 0 else end
            expr = command[i + 2:end].strip("-+ \t\n")
            if opener == "{{" and state is not None and not re.search(r"\|\s*raw\s*$", expr):
                found.append(expr)
            i = end + 2
            continue
        c = command[i]
        if state is None:
            if c == "\\":
                i += 2
                continue
            if c == "#" and (i == 0 or command[i - 1] in " \t\n;&|()"):
                nl = command.find("\n", i)
                i = n if nl < 0 else nl
                continue
            if c in "'\"":
                state = c
        elif state == '"' and c == "\\":
            i += 2
            continue
        elif c == state:
            state = None
        i += 1
    return found
