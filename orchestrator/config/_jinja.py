"""The Jinja2 side of `orchestrator.config.templating`: the sandboxed environments, compiling
(cached), rendering and the located error messages.

Imported by templating on the first string that really is a template (jinja2 takes ~25 ms to
import): reading an inventory, or a playbook without templates, never loads it. Use the API of
`orchestrator.config.templating`, which hands its template cases to the functions here (its
render functions only strings that are templates: `is_template`).
"""

from __future__ import annotations

import difflib
import re
import shlex
import types
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, Undefined, UndefinedError, meta, nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from orchestrator.config.templating import Raw, is_template
from orchestrator.errors import ConfigError, ConfigProblem, Location

_MAX_REPEAT = 1_000_000
_MAX_EXPONENT = 1000
_TRUE_WORDS = {"true", "yes", "on", "1"}
_FALSE_WORDS = {"false", "no", "off", "0", ""}


def _raw(value: Any) -> Raw:
    return value if isinstance(value, Raw) else Raw(_text(value))


def _quote(value: Any) -> Raw:
    if isinstance(value, Raw):
        return value
    if isinstance(value, (list, tuple)):
        return Raw(" ".join(shlex.quote(_text(v)) for v in value))
    return Raw(shlex.quote(_text(value)))


def _text(value: Any) -> str:
    if isinstance(value, Undefined):
        value._fail_with_undefined_error()
    return str(value)


def _shell_finalize(value: Any) -> Any:
    if isinstance(value, Undefined):
        return value  # str() on it raises the undefined-variable error
    return _quote(value)


class _Env(SandboxedEnvironment):
    """The sandbox, with bounded `*` and `**`."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            if isinstance(right, (int, float)) and abs(right) > _MAX_EXPONENT:
                raise SecurityError(f"exponent {right} is too large (limit {_MAX_EXPONENT})")
            return left**right
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    if len(seq) * n > _MAX_REPEAT:
                        raise SecurityError(
                            f"repetition would make {len(seq) * n} items (limit {_MAX_REPEAT})"
                        )
            return left * right
        return super().call_binop(context, operator, left, right)  # pragma: no cover


def _make_env(**kwargs: Any) -> _Env:
    env = _Env(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False, **kwargs)
    env.filters["raw"] = _raw
    env.filters["quote"] = _quote
    return env


_ENV = _make_env()
_SHELL_ENV = _make_env(finalize=_shell_finalize)


# -- errors -----------------------------------------------------------------------------------


def _snippet(text: str) -> str:
    one = text.strip()
    if "\n" in one or len(one) > 60:
        one = one.splitlines()[0][:57] + "..." if one else ""
    return one


def _close(name: str, candidates: Any) -> list[str]:
    return difflib.get_close_matches(name, [str(c) for c in candidates], n=3, cutoff=0.6)


def _did_you_mean(matches: list[str]) -> str:
    return "did you mean " + " or ".join(f"'{m}'" for m in matches) + "?"


def _nested_keys(variables: Mapping[str, Any]) -> set[str]:
    keys: set[str] = set()
    for value in variables.values():
        if isinstance(value, Mapping):
            keys.update(str(k) for k in value)
    return keys


def _problem(
    exc: Exception, text: str, variables: Mapping[str, Any] | None, location: Location | None
) -> ConfigProblem:
    variables = variables or {}
    where = f"template {_snippet(text)!r}"
    if isinstance(exc, UndefinedError):
        msg = str(exc.message or exc)
        m = re.match(r"^'([^']+)' is undefined", msg)
        if m:
            name = m.group(1)
            close = _close(name, variables.keys())
            hint = _did_you_mean(close) if close else (
                f"define {name!r} under `vars:` (playbook, inventory, group or host) "
                f"or pass `--var {name}=VALUE`"
            )
            return ConfigProblem(location, f"undefined variable {name!r} in {where}", hint)
        m = re.search(r"has no attribute '([^']+)'", msg)
        hint = None
        if m:
            close = _close(m.group(1), _nested_keys(variables))
            hint = _did_you_mean(close) if close else "check the key names of that mapping"
        return ConfigProblem(location, f"{msg} in {where}", hint)
    if isinstance(exc, (RecursionError, SyntaxError, MemoryError)):
        return ConfigProblem(
            location, f"{where} is nested too deeply to compile",
            "split it into smaller expressions (set intermediate variables under `vars:`)",
        )
    if isinstance(exc, SecurityError):
        return ConfigProblem(
            location, f"unsafe operation in {where}: {exc}",
            "templates may only read variables and use filters; they cannot reach Python "
            "internals or build huge values",
        )
    if isinstance(exc, TemplateSyntaxError):
        msg = exc.message or str(exc)
        line = f" (template line {exc.lineno})" if exc.lineno and "\n" in text.strip() else ""
        m = re.match(r"^No (filter|test) named '([^']+)'", msg)
        if m:
            pool = _ENV.filters if m.group(1) == "filter" else _ENV.tests
            close = _close(m.group(2), pool)
            hint = (_did_you_mean(close) if close
                    else f"see the Jinja2 list of built-in {m.group(1)}s")
            return ConfigProblem(location, f"{msg.rstrip('.')} in {where}{line}", hint)
        return ConfigProblem(
            location, f"template syntax error in {where}{line}: {msg}",
            "check the {{ ... }} and {% ... %} brackets and the expression inside",
        )
    return ConfigProblem(
        location, f"{where} failed: {type(exc).__name__}: {exc}",
        "check the types of the variables the template uses",
    )


def _raise(
    exc: Exception, text: str, variables: Mapping[str, Any] | None, location: Location | None
) -> None:
    raise ConfigError([_problem(exc, text, variables, location)]) from None


# Python's own limits hit by absurd templates (thousands of nested brackets): parsing or
# compiling them recurses too deep; they become located problems like any template error.
_TOO_DEEP = (RecursionError, SyntaxError, MemoryError)
_RENDER_ERRORS = (TemplateError, TypeError, ValueError, ArithmeticError, LookupError, *_TOO_DEEP)


# -- compiling (cached) -----------------------------------------------------------------------


@lru_cache(maxsize=2048)
def _template(text: str, shell: bool) -> Any:
    return (_SHELL_ENV if shell else _ENV).from_string(text)


@lru_cache(maxsize=2048)
def _single_expression(text: str) -> str | None:
    """The expression source when `text` is exactly one `{{ expr }}`, else None."""
    stripped = text
    if not (stripped.startswith("{{") and stripped.endswith("}}")):
        return None
    try:
        tree = _ENV.parse(text)
    except (TemplateSyntaxError, *_TOO_DEEP):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], nodes.Output):
        return None
    out = tree.body[0].nodes
    if len(out) != 1 or isinstance(out[0], nodes.TemplateData):
        return None
    inner = text[2:-2]
    if inner[:1] in "-+":
        inner = inner[1:]
    if inner[-1:] in "-+":
        inner = inner[:-1]
    return inner


@lru_cache(maxsize=2048)
def _expression(source: str) -> Any:
    return _ENV.compile_expression(source, undefined_to_none=False)


def _resolve(value: Any) -> Any:
    """Fail on Undefined anywhere in a native value; turn generators into lists."""
    if isinstance(value, Undefined):
        value._fail_with_undefined_error()
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, (types.GeneratorType, Iterator)) and not isinstance(value, (str, bytes)):
        value = list(value)
    if isinstance(value, list):
        return [_resolve(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_resolve(v) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v) for k, v in value.items()}
    return value



# -- rendering (the public functions' template cases) -----------------------------------------


def _render(text: str, shell: bool, variables: Mapping[str, Any],
            location: Location | None) -> str:
    try:
        return str(_template(text, shell).render(dict(variables)))
    except _RENDER_ERRORS as exc:
        _raise(exc, text, variables, location)
    raise AssertionError("unreachable")  # pragma: no cover


def render_string(text: str, variables: Mapping[str, Any], location: Location | None) -> str:
    """A template rendered to text."""
    return _render(text, False, variables, location)


def render_template_value(text: str, variables: Mapping[str, Any],
                          location: Location | None) -> Any:
    """A template rendered to a value: one ``{{ expr }}`` keeps the expression's own type."""
    source = _single_expression(text)
    if source is None:
        return render_string(text, variables, location)
    try:
        return _resolve(_expression(source)(dict(variables)))
    except _RENDER_ERRORS as exc:
        _raise(exc, text, variables, location)
    raise AssertionError("unreachable")  # pragma: no cover


def render_shell(template: str, variables: Mapping[str, Any], location: Location | None) -> str:
    """A shell-command template rendered, each ``{{ }}`` output quoted unless ``| raw``."""
    return _render(template, True, variables, location)


def condition_source(expr: str) -> str | None:
    """See `orchestrator.config.templating.condition_source`."""
    text = expr.strip()
    single = _single_expression(text)
    if single is not None:
        return single
    if is_template(text):
        return None
    return text


def evaluate_condition(expr: str, variables: Mapping[str, Any], location: Location | None) -> bool:
    """See `orchestrator.config.templating.evaluate_condition` (EXPR is text here)."""
    source = condition_source(expr)
    try:
        if source is None:
            value: Any = render_string(expr, variables, location)
        else:
            value = _resolve(_expression(source)(dict(variables)))
    except ConfigError:
        raise
    except _RENDER_ERRORS as exc:
        _raise(exc, expr, variables, location)
    if isinstance(value, bool) or value is None:
        return bool(value)
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        raise ConfigError([ConfigProblem(
            location,
            f"condition {_snippet(expr)!r} gave the text {_snippet(value)!r}, not true or false",
            "compare explicitly, e.g. `name == 'x'` or `name | length > 0`",
        )])
    return bool(value)


@lru_cache(maxsize=4096)
def undeclared(template_text: str, expression: bool) -> frozenset[str]:
    """See `orchestrator.config.templating.undeclared`."""
    # cached: every host of a run asks about the same texts (parsing them was 17 ms per host)
    text = template_text
    if expression:
        source = condition_source(template_text)
        text = template_text if source is None else "{{ (" + source + ") }}"
    try:
        tree = _ENV.parse(text)
        return frozenset(meta.find_undeclared_variables(tree))
    except (TemplateSyntaxError, *_TOO_DEEP) as exc:
        _raise(exc, template_text, None, None)
    raise AssertionError("unreachable")  # pragma: no cover


def check_template(text: str, *, expression: bool = False) -> ConfigProblem | None:
    """Compile a template (or bare expression) without rendering it; the problem if it fails.

    Catches syntax errors and unknown filters/tests; the problem has no location.
    """
    try:
        if expression:
            source = condition_source(text)
            if source is None:
                _template(text, False)
            else:
                _expression(source)
        else:
            _template(text, False)
    except (TemplateSyntaxError, *_TOO_DEEP) as exc:
        return _problem(exc, text, None, None)
    return None
