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

from orchestrator.errors import ConfigError, ConfigProblem, Location

_MAX_REPEAT = 1_000_000
_MAX_EXPONENT = 1000
_TRUE_WORDS = {"true", "yes", "on", "1"}
_FALSE_WORDS = {"false", "no", "off", "0", ""}


class Raw(str):
    """Text inserted into a shell command as is (no quoting). Made by the `| raw` filter."""


class Data(str):
    """Text that is never a template, whatever braces it holds: values read from the operator's
    environment with `!env` (a token such as ``hf_{{x`` or ``p{#ss`` is data, not Jinja)."""


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


def is_template(value: Any) -> bool:
    """True for a string holding Jinja syntax ({{ }}, {% %} or {# #}); never for `Data`."""
    return (isinstance(value, str) and not isinstance(value, Data)
            and ("{{" in value or "{%" in value or "{#" in value))


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


# -- public API -------------------------------------------------------------------------------


def render_string(text: str, variables: Mapping[str, Any], location: Location | None = None) -> str:
    """Render one template to text (no native types, no shell quoting)."""
    if not is_template(text):
        return text
    try:
        return str(_template(text, False).render(dict(variables)))
    except _RENDER_ERRORS as exc:
        _raise(exc, text, variables, location)
    raise AssertionError("unreachable")  # pragma: no cover


def render_value(obj: Any, variables: Mapping[str, Any], location: Location | None = None) -> Any:
    """Render every string in `obj` (recursing into dicts and lists).

    A string that is exactly one ``{{ expr }}`` becomes the expression's value with its own type.
    """
    if isinstance(obj, str):
        if not is_template(obj):
            return obj
        source = _single_expression(obj)
        if source is None:
            return render_string(obj, variables, location)
        try:
            return _resolve(_expression(source)(dict(variables)))
        except _RENDER_ERRORS as exc:
            _raise(exc, obj, variables, location)
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
    try:
        return str(_template(template, True).render(dict(variables)))
    except _RENDER_ERRORS as exc:
        _raise(exc, template, variables, location)
    raise AssertionError("unreachable")  # pragma: no cover


def condition_source(expr: str) -> str | None:
    """The bare expression of a `when:` (strips one surrounding ``{{ }}``); None if mixed text."""
    text = expr.strip()
    single = _single_expression(text)
    if single is not None:
        return single
    if is_template(text):
        return None
    return text


def evaluate_condition(
    expr: str | bool, variables: Mapping[str, Any], location: Location | None = None
) -> bool:
    """Evaluate a `when:` condition (bare expression or ``{{ expr }}``) to True/False."""
    if isinstance(expr, bool):
        return expr
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


def undeclared(template_text: str, *, expression: bool = False) -> set[str]:
    """Names of the variables a template (or, with `expression=True`, a bare expression) reads.

    Raises ConfigError (without location) on a syntax error.
    """
    return set(_undeclared(template_text, expression))


@lru_cache(maxsize=4096)
def _undeclared(template_text: str, expression: bool) -> frozenset[str]:
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
