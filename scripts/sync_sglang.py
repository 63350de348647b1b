#!/usr/bin/env python3
"""Generate orchestrator/sglang/releases/<version>.json from the real SGLang wheels.

Usage: python scripts/sync_sglang.py [--releases 0.5.9,0.5.23] [--wheels DIR] [--cache DIR]
                                     [--out DIR] [--check [--index-url URL]]

--check writes nothing: it fails when a generated file differs from what the wheel gives, or
when the index offers a release newer than the newest supported one (a release served by an
older table is not verified: the preflight warns about it).

For each supported release the wheel is fetched with `pip download --no-deps` (into --cache,
default .cache/sglang-wheels; --wheels DIR reuses a folder of wheels and downloads nothing), and
the flags of `python -m sglang.launch_server` are read STATICALLY from its sources inside the
wheel zip with `ast`: sglang is never imported (it needs torch). What is read:

* `ServerArgs.add_cli_args` in sglang/srt/server_args.py, statement by statement: every
  `parser.add_argument(...)`, local variables, `if` on something unknowable (both branches are
  read, flags in them are marked "conditional"), helpers called with the parser;
* `add_cli_args_from_dataclass(parser, ServerArgs)` (0.5.15+): the fields of the ServerArgs
  dataclass, and from 0.5.20 of the namespace classes handed to `collect_input_fields(...)`
  (sglang/srt/arg_groups/fields/*.py). arg_utils' rules are reproduced: `--` + the field name
  with dashes (or `cli_name`), then `aliases`; `Arg(action=...)` passes action/help/default/
  action_kwargs only; `Literal[...]` gives choices; `list[X]` gives nargs "+"; `bool` gives
  store_true; otherwise `type_parser` or int/float/str; `required` when a scalar has no default.
  Fields without `Annotated` metadata, or with `no_cli=True`, make no flag.

Values (choices, defaults, help) go through a small evaluator: literals, module constants
followed across the wheel's imports (module-level `.extend/.append/.add` and `+=` applied),
`ServerArgs.x` and `_declared_default("x")` as the field's default, class attributes, enums,
comprehensions, `list()/set()/sorted()`, and zero-effect helper functions. What it cannot know
is kept as source text ("choices_unresolved", "default_expr").

Each flag: name (argparse's first option string), aliases, dest, action ("store",
"store_true", ..., "deprecated" for DeprecatedAction, else the Action class name), nargs
(argparse's effective value: 0 for flags that take no value), type, choices, default,
required, deprecated (a note, or null), help (first 200 chars), source (file:line in the
wheel). Optional keys: "hidden" (help=SUPPRESS), "conditional", "choices_hooks" (plugin
functions that can add choices at run time). "removed" lists the option strings of earlier
supported releases that this one lacks, with what argparse's prefix matching would do now.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import io
import json
import math
import re
import subprocess
import sys
import textwrap
import tokenize
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RELEASES: tuple[str, ...] = ("0.5.9", "0.5.10", "0.5.12", "0.5.15", "0.5.19", "0.5.20", "0.5.21",
                             "0.5.22", "0.5.23")
DEFAULT_CACHE = REPO / ".cache" / "sglang-wheels"
DEFAULT_OUT = REPO / "orchestrator" / "sglang" / "releases"
GENERATED_BY = "scripts/sync_sglang.py"
SERVER_ARGS = "sglang.srt.server_args"
PIP_PLATFORM = ("--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                "--platform", "manylinux_2_34_x86_64")
HELP_CHARS = 200
MUTATORS = frozenset({"extend", "append", "add", "update", "insert"})
BUILTINS = frozenset({"list", "tuple", "set", "frozenset", "sorted", "dict", "str", "int",
                      "float", "bool", "len", "range", "reversed", "next", "print"})
# Help text that retires the flag itself (not "replaces the deprecated env var X").
DEPRECATED_HELP = re.compile(
    r"^\W*deprecated\b|\(deprecated\b|\[deprecated\]|\bdeprecated alias\b"
    r"|\bthis (?:flag|option|argument) is (?:now )?deprecated\b", re.I)
ARG_UTILS = "sglang.srt.arg_groups.arg_utils"
# The functions of arg_utils whose rules field_decl reproduces, and their digests (docstrings
# left out) in the releases the reproduction was checked against, by running the real parser.
ARG_UTILS_RULES = ("add_cli_args_from_dataclass", "_unwrap_annotated", "_unwrap_optional",
                   "_unwrap_literal", "_infer_type_func", "_field_to_cli_name")
ARG_UTILS_CHECKED = {"0378bdf599f4d8a0": "0.5.15, 0.5.19", "0f6af12888096666": "0.5.20-0.5.23"}
# argparse (3.11): action -> (nargs, default) when the call gives none.
BUILTIN_ACTIONS: dict[str, tuple[Any, Any]] = {
    "store": (None, None), "store_const": (0, None), "store_true": (0, False),
    "store_false": (0, True), "append": (None, None), "append_const": (0, None),
    "count": (0, None), "extend": (None, None), "help": (0, None), "version": (0, None),
    "BooleanOptionalAction": (0, None),
}


class Unresolved(Exception):
    """A value the static evaluator cannot know."""


@dataclass(frozen=True)
class Symbol:
    """Something from outside the wheel (argparse.SUPPRESS, json.loads, int)."""

    text: str


@dataclass(frozen=True)
class Opaque:
    """An unknown value held in a container (a dict value, a local variable)."""

    text: str


@dataclass(frozen=True)
class EnumMember:
    """A member of an Enum class in the wheel."""

    name: str
    value: Any


@dataclass(frozen=True)
class ModRef:
    """A module of the wheel."""

    name: str


@dataclass(frozen=True, eq=False)
class ClassRef:
    """A class defined in a module of the wheel."""

    module: Module
    node: ast.ClassDef


@dataclass(frozen=True, eq=False)
class FuncRef:
    """A function defined in a module of the wheel."""

    module: Module
    node: ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True, eq=False)
class LambdaRef:
    """A lambda of the wheel, with where it was written."""

    node: ast.Lambda
    ctx: Ctx


@dataclass
class Binding:
    """One top-level assignment, import, class or def of a name."""

    line: int
    kind: str  # "value" | "import" | "module" | "class" | "func" | "opaque"
    node: ast.AST | None = None
    target: str = ""
    attr: str | None = None


class Module:
    """One parsed module of the wheel: its top-level bindings and in-place mutations."""

    def __init__(self, name: str, path: str, text: str, is_package: bool) -> None:
        self.name, self.path, self.is_package = name, path, is_package
        self.tree = ast.parse(text, filename=path)
        self.bindings: dict[str, list[Binding]] = {}
        self.mutations: dict[str, list[ast.stmt]] = {}
        self.star_imports: list[str] = []
        # name -> "if TEST: STMT" for in-place changes made only under a module-level `if`
        self.conditional_mutations: dict[str, list[str]] = {}
        for stmt, test in _top_statements(self.tree.body):
            if test is not None and _mutated_name(stmt):
                self.conditional_mutations.setdefault(_mutated_name(stmt) or "", []).append(
                    f"if {_src(test.test)}: {_src(stmt)}")
            else:
                self._record(stmt)

    def package(self, level: int) -> str:
        parts = self.name.split(".")
        keep = len(parts) - level + (1 if self.is_package else 0)
        return ".".join(parts[:keep])

    def _bind(self, name: str, binding: Binding) -> None:
        self.bindings.setdefault(name, []).append(binding)

    def _record(self, stmt: ast.stmt) -> None:
        line = stmt.lineno
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    self._bind(target.id, Binding(line, "value", stmt.value))
                else:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Name):
                            self._bind(sub.id, Binding(line, "opaque"))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if stmt.value is not None:
                self._bind(stmt.target.id, Binding(line, "value", stmt.value))
        elif isinstance(stmt, ast.ImportFrom):
            base = stmt.module or ""
            if stmt.level:
                base = ".".join(p for p in (self.package(stmt.level), base) if p)
            for alias in stmt.names:
                if alias.name == "*":
                    self.star_imports.append(base)
                else:
                    self._bind(alias.asname or alias.name,
                               Binding(line, "import", target=base, attr=alias.name))
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                name = alias.asname or alias.name.split(".")[0]
                target = alias.name if alias.asname else alias.name.split(".")[0]
                self._bind(name, Binding(line, "module", target=target))
        elif isinstance(stmt, ast.ClassDef):
            self._bind(stmt.name, Binding(line, "class", stmt))
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._bind(stmt.name, Binding(line, "func", stmt))
        else:
            self._record_mutation(stmt)

    def _record_mutation(self, stmt: ast.stmt) -> None:
        name = _mutated_name(stmt)
        if name:
            self.mutations.setdefault(name, []).append(stmt)


def _mutated_name(stmt: ast.stmt) -> str | None:
    """X for `X += ...` and `X.extend/append/add/update/insert(...)` statements."""
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if (isinstance(func, ast.Attribute) and func.attr in MUTATORS
                and isinstance(func.value, ast.Name)):
            return func.value.id
    return None


def _top_statements(body: list[ast.stmt], conditional: bool = False
                    ) -> Iterator[tuple[ast.stmt, ast.If | None]]:
    """Module-level statements, looking into try/if/with blocks; with the `if` they sit in."""
    for stmt in body:
        if isinstance(stmt, ast.Try):
            yield from _top_statements(stmt.body + stmt.orelse + stmt.finalbody, conditional)
        elif isinstance(stmt, ast.If):
            for inner, _ in _top_statements(stmt.body + stmt.orelse, True):
                yield inner, stmt
        elif isinstance(stmt, ast.With):
            yield from _top_statements(stmt.body, conditional)
        else:
            yield stmt, None


class Source:
    """The .py files of a wheel (path inside the wheel -> text), parsed on demand."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files
        self._modules: dict[str, Module | None] = {}

    @classmethod
    def from_wheel(cls, wheel: Path) -> Source:
        with zipfile.ZipFile(wheel) as zf:
            return cls({n: zf.read(n).decode("utf-8", "replace") for n in zf.namelist()
                        if n.endswith(".py") and n.startswith("sglang/")})

    def module(self, dotted: str) -> Module | None:
        if dotted not in self._modules:
            base = dotted.replace(".", "/")
            found: Module | None = None
            for path, package in ((f"{base}.py", False), (f"{base}/__init__.py", True)):
                if path in self.files:
                    found = Module(dotted, path, self.files[path], package)
                    break
            self._modules[dotted] = found
        return self._modules[dotted]

    def parsed(self) -> list[Module]:
        """The modules parsed so far."""
        return [m for m in self._modules.values() if m is not None]


@dataclass
class Ctx:
    """Where an expression is evaluated: module, local names, and the line it runs before."""

    module: Module
    local: dict[str, Any] = field(default_factory=dict)
    before: int | None = None


def _src(node: ast.AST) -> str:
    return ast.unparse(node)


def _check(value: Any) -> Any:
    if isinstance(value, Opaque):
        raise Unresolved(value.text)
    return value


class Evaluator:
    """Evaluate expressions of the wheel's source without importing it."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.field_default: Callable[[str], Any] | None = None
        self._active: set[tuple[str, str, int | None]] = set()
        self._classes: dict[int, dict[str, Any]] = {}
        self._depth = 0

    # -- names -------------------------------------------------------------------------
    def name(self, module: Module, name: str, before: int | None = None) -> Any:
        chain = [b for b in module.bindings.get(name, ()) if before is None or b.line < before]
        if not chain:
            for star in module.star_imports:
                target = self.source.module(star)
                if target is not None and name in target.bindings:
                    return self.name(target, name)
            if name in BUILTINS:
                return Symbol(name)
            raise Unresolved(name)
        key = (module.name, name, before)
        if key in self._active:
            raise Unresolved(name)
        self._active.add(key)
        try:
            binding = chain[-1]
            value = self._binding(module, name, binding)
            return self._mutated(module, name, value, binding.line, before)
        finally:
            self._active.discard(key)

    def _binding(self, module: Module, name: str, b: Binding) -> Any:
        if b.kind == "value":
            assert isinstance(b.node, ast.expr)
            return self.eval(b.node, Ctx(module, before=b.line))
        if b.kind == "class":
            assert isinstance(b.node, ast.ClassDef)
            return ClassRef(module, b.node)
        if b.kind == "func":
            assert isinstance(b.node, (ast.FunctionDef, ast.AsyncFunctionDef))
            return FuncRef(module, b.node)
        if b.kind == "module":
            return self.module_ref(b.target)
        if b.kind == "import":
            assert b.attr is not None
            return self.import_attr(b.target, b.attr)
        raise Unresolved(name)

    def module_ref(self, dotted: str) -> ModRef | Symbol:
        return ModRef(dotted) if self.source.module(dotted) else Symbol(dotted)

    def import_attr(self, dotted: str, attr: str) -> Any:
        target = self.source.module(dotted)
        if target is None:
            return Symbol(f"{dotted}.{attr}")
        if attr in target.bindings or target.star_imports:
            with contextlib.suppress(Unresolved):
                return self.name(target, attr)
        if self.source.module(f"{dotted}.{attr}") is not None:
            return ModRef(f"{dotted}.{attr}")
        return self.name(target, attr)

    def _mutated(self, module: Module, name: str, value: Any, line: int,
                 before: int | None) -> Any:
        for stmt in module.mutations.get(name, ()):
            if stmt.lineno <= line or (before is not None and stmt.lineno >= before):
                continue
            ctx = Ctx(module, before=stmt.lineno)
            if isinstance(stmt, ast.AugAssign):
                value = self.binop(stmt.op, value, self.eval(stmt.value, ctx))
            else:
                assert isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                assert isinstance(stmt.value.func, ast.Attribute)
                args = [self.eval(a, ctx) for a in stmt.value.args]
                value = mutate(value, stmt.value.func.attr, args)
        return value

    # -- expressions -------------------------------------------------------------------
    def eval(self, node: ast.expr, ctx: Ctx) -> Any:
        method = getattr(self, f"_eval_{type(node).__name__}", None)
        if method is None:
            raise Unresolved(_src(node))
        return method(node, ctx)

    def _eval_Constant(self, node: ast.Constant, ctx: Ctx) -> Any:
        return node.value

    def _eval_Name(self, node: ast.Name, ctx: Ctx) -> Any:
        if node.id in ctx.local:
            return ctx.local[node.id]
        return self.name(ctx.module, node.id, ctx.before)

    def _elements(self, elts: list[ast.expr], ctx: Ctx) -> list[Any]:
        out: list[Any] = []
        for elt in elts:
            if isinstance(elt, ast.Starred):
                out.extend(iterate(self.eval(elt.value, ctx)))
            else:
                out.append(_check(self.eval(elt, ctx)))
        return out

    def _eval_List(self, node: ast.List, ctx: Ctx) -> Any:
        return self._elements(node.elts, ctx)

    def _eval_Tuple(self, node: ast.Tuple, ctx: Ctx) -> Any:
        return tuple(self._elements(node.elts, ctx))

    def _eval_Set(self, node: ast.Set, ctx: Ctx) -> Any:
        return set(self._elements(node.elts, ctx))

    def _eval_Dict(self, node: ast.Dict, ctx: Ctx) -> Any:
        out: dict[Any, Any] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                out.update(_check(self.eval(value, ctx)))
                continue
            try:
                out[_check(self.eval(key, ctx))] = self.eval(value, ctx)
            except Unresolved:
                if key is not None and not isinstance(key, ast.Constant):
                    raise
                out[getattr(key, "value", None)] = Opaque(_src(value))
        return out

    def _eval_JoinedStr(self, node: ast.JoinedStr, ctx: Ctx) -> Any:
        parts = []
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                if value.format_spec is not None or value.conversion not in (-1, 115):
                    raise Unresolved(_src(node))
                parts.append(str(_check(self.eval(value.value, ctx))))
            else:
                parts.append(str(self.eval(value, ctx)))
        return "".join(parts)

    def _eval_BinOp(self, node: ast.BinOp, ctx: Ctx) -> Any:
        return self.binop(node.op, self.eval(node.left, ctx), self.eval(node.right, ctx))

    def binop(self, op: ast.operator, left: Any, right: Any) -> Any:
        left, right = _check(left), _check(right)
        try:
            if isinstance(op, ast.Add):
                return left + right
            if isinstance(op, ast.BitOr) and isinstance(left, (set, frozenset, dict)):
                return left | right
            if isinstance(op, ast.Sub) and isinstance(left, (int, float, set, frozenset)):
                return left - right
            if isinstance(op, ast.Mult) and isinstance(left, (int, float)):
                return left * right
        except TypeError as exc:
            raise Unresolved(str(exc)) from exc
        raise Unresolved(type(op).__name__)

    def _eval_UnaryOp(self, node: ast.UnaryOp, ctx: Ctx) -> Any:
        value = _check(self.eval(node.operand, ctx))
        if isinstance(node.op, ast.USub) and isinstance(value, (int, float)):
            return -value
        if isinstance(node.op, ast.Not) and isinstance(value, (bool, int, str, type(None))):
            return not value
        raise Unresolved(_src(node))

    def _eval_Compare(self, node: ast.Compare, ctx: Ctx) -> Any:
        if len(node.ops) != 1:
            raise Unresolved(_src(node))
        left = _check(self.eval(node.left, ctx))
        right = _check(self.eval(node.comparators[0], ctx))
        op = node.ops[0]
        table: dict[type, Callable[[Any, Any], bool]] = {
            ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
            ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
        if type(op) not in table:
            raise Unresolved(_src(node))
        return table[type(op)](left, right)

    def _eval_Subscript(self, node: ast.Subscript, ctx: Ctx) -> Any:
        value = _check(self.eval(node.value, ctx))
        if isinstance(node.slice, ast.Slice):
            parts = [None if p is None else _check(self.eval(p, ctx))
                     for p in (node.slice.lower, node.slice.upper, node.slice.step)]
            index: Any = slice(*parts)
        else:
            index = _check(self.eval(node.slice, ctx))
        try:
            return value[index]
        except (TypeError, KeyError, IndexError) as exc:
            raise Unresolved(_src(node)) from exc

    def _eval_Attribute(self, node: ast.Attribute, ctx: Ctx) -> Any:
        base_node = node.value
        if (isinstance(base_node, ast.Name) and base_node.id == "ServerArgs"
                and self.field_default is not None and base_node.id not in ctx.local):
            return self.field_default(node.attr)
        return self.attribute(_check(self.eval(base_node, ctx)), node.attr)

    def attribute(self, base: Any, attr: str) -> Any:
        if isinstance(base, Symbol):
            return Symbol(f"{base.text}.{attr}")
        if isinstance(base, (FuncRef, ClassRef)) and attr == "__doc__":
            return ast.get_docstring(base.node, clean=False)
        if isinstance(base, ModRef):
            return self.import_attr(base.name, attr)
        if isinstance(base, ClassRef):
            return self.class_attr(base, attr)
        if isinstance(base, EnumMember) and attr in ("name", "value"):
            return getattr(base, attr)
        if isinstance(base, (str, dict, list, set, frozenset, tuple)):
            return ("method", base, attr)
        raise Unresolved(attr)

    def class_attr(self, cls: ClassRef, attr: str) -> Any:
        if self.is_enum(cls):
            for member in self.enum_members(cls):
                if member.name == attr:
                    return member
        namespace = self.class_namespace(cls)
        if attr in namespace:
            return _check(namespace[attr])
        for base in self.bases(cls):
            with contextlib.suppress(Unresolved):
                return self.class_attr(base, attr)
        raise Unresolved(f"{cls.node.name}.{attr}")

    def class_namespace(self, cls: ClassRef) -> dict[str, Any]:
        """The class body's assigned names, evaluated in order (later ones see earlier)."""
        key = id(cls.node)
        if key not in self._classes:
            self._classes[key] = namespace = {}
            for stmt in cls.node.body:
                targets = [t for t in (stmt.targets if isinstance(stmt, ast.Assign) else
                                       [stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
                           if isinstance(t, ast.Name)]
                value = getattr(stmt, "value", None)
                if not targets or value is None:
                    continue
                ctx = Ctx(cls.module, dict(namespace), cls.node.lineno)
                try:
                    result = self.eval(value, ctx)
                except Unresolved:
                    result = Opaque(_src(value))
                namespace.update({t.id: result for t in targets})
        return self._classes[key]

    def bases(self, cls: ClassRef) -> list[ClassRef]:
        out = []
        for base in cls.node.bases:
            with contextlib.suppress(Unresolved):
                value = self.eval(base, Ctx(cls.module, before=cls.node.lineno))
                if isinstance(value, ClassRef):
                    out.append(value)
        return out

    def is_enum(self, cls: ClassRef) -> bool:
        for base in cls.node.bases:
            text = _src(base)
            if text.split(".")[-1] in ("Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"):
                return True
        return any(self.is_enum(b) for b in self.bases(cls))

    def enum_members(self, cls: ClassRef) -> list[EnumMember]:
        members = []
        for stmt in cls.node.body:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)
                    and not stmt.targets[0].id.startswith("_")):
                try:
                    value = _check(self.eval(stmt.value, Ctx(cls.module)))
                except Unresolved:
                    value = Opaque(_src(stmt.value))
                members.append(EnumMember(stmt.targets[0].id, value))
        return members

    def _comprehension(self, node: ast.ListComp | ast.SetComp, ctx: Ctx) -> list[Any]:
        if len(node.generators) != 1 or node.generators[0].is_async:
            raise Unresolved(_src(node))
        gen = node.generators[0]
        if not isinstance(gen.target, ast.Name):
            raise Unresolved(_src(node))
        out = []
        for item in iterate(self.eval(gen.iter, ctx), self):
            inner = Ctx(ctx.module, {**ctx.local, gen.target.id: item}, ctx.before)
            if all(_check(self.eval(cond, inner)) for cond in gen.ifs):
                out.append(_check(self.eval(node.elt, inner)))
        return out

    def _eval_ListComp(self, node: ast.ListComp, ctx: Ctx) -> Any:
        return self._comprehension(node, ctx)

    def _eval_SetComp(self, node: ast.SetComp, ctx: Ctx) -> Any:
        return set(self._comprehension(node, ctx))

    def _eval_Lambda(self, node: ast.Lambda, ctx: Ctx) -> Any:
        return LambdaRef(node, ctx)

    def _eval_Call(self, node: ast.Call, ctx: Ctx) -> Any:
        func = self.eval(node.func, ctx)
        args = self._elements(node.args, ctx)
        kwargs = {k.arg: self.eval(k.value, ctx) for k in node.keywords if k.arg}
        if len(kwargs) != len(node.keywords):
            raise Unresolved(_src(node))
        if isinstance(func, tuple) and func and func[0] == "method":
            return call_method(func[1], func[2], args, self)
        if isinstance(func, Symbol):
            return self.call_symbol(func.text, node, args, kwargs)
        if isinstance(func, FuncRef):
            if func.node.name == "_declared_default" and self.field_default and args:
                return self.field_default(args[0])
            return self.call_function(func, args, kwargs)
        raise Unresolved(_src(node))

    def call_symbol(self, name: str, node: ast.Call, args: list[Any],
                    kwargs: dict[str, Any]) -> Any:
        if name.split(".")[-1] == "field" and not args:
            if "default" in kwargs:
                return _check(kwargs["default"])
            factory = kwargs.get("default_factory")
            if isinstance(factory, LambdaRef) and not factory.node.args.args:
                return self.eval(factory.node.body, factory.ctx)
            if isinstance(factory, Symbol) and factory.text in ("list", "dict", "set", "tuple"):
                return {"list": [], "dict": {}, "set": set(), "tuple": ()}[factory.text]
            raise Unresolved(_src(node))
        simple: dict[str, Callable[..., Any]] = {
            "list": list, "tuple": tuple, "set": set, "frozenset": frozenset, "dict": dict,
            "sorted": sorted, "str": str, "int": int, "float": float, "bool": bool, "len": len,
            "range": range, "reversed": reversed}
        if name in simple and not kwargs:
            try:
                items = [list(iterate(a, self)) if name not in ("str", "int", "float", "bool")
                         else _check(a) for a in args]
                return simple[name](*items)
            except (TypeError, ValueError) as exc:
                raise Unresolved(_src(node)) from exc
        raise Unresolved(_src(node))

    def call_function(self, func: FuncRef, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run a small helper (assignments, imports, if, return) with known arguments."""
        if self._depth > 6:
            raise Unresolved(func.node.name)
        params = [a.arg for a in func.node.args.posonlyargs + func.node.args.args]
        local: dict[str, Any] = dict(zip(params, args, strict=False))
        local.update(kwargs)
        self._depth += 1
        try:
            result = self._run(func.node.body, Ctx(func.module, local))
        finally:
            self._depth -= 1
        if result is _NO_RETURN:
            raise Unresolved(func.node.name)
        return result

    def _run(self, body: list[ast.stmt], ctx: Ctx) -> Any:
        for stmt in body:
            if isinstance(stmt, ast.Return):
                return None if stmt.value is None else self.eval(stmt.value, ctx)
            if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
                try:
                    value = self.eval(stmt.value, ctx)
                except Unresolved:
                    value = Opaque(_src(stmt.value))
                for target in stmt.targets:
                    assert isinstance(target, ast.Name)
                    ctx.local[target.id] = value
            elif isinstance(stmt, ast.ImportFrom) and not stmt.level and stmt.module:
                for alias in stmt.names:
                    ctx.local[alias.asname or alias.name] = self.import_attr(stmt.module,
                                                                            alias.name)
            elif isinstance(stmt, ast.If):
                try:
                    branch = stmt.body if _check(self.eval(stmt.test, ctx)) else stmt.orelse
                except Unresolved:
                    continue  # unknowable condition (sys.modules, env): not taken
                result = self._run(branch, ctx)
                if result is not _NO_RETURN:
                    return result
            elif not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                raise Unresolved(_src(stmt))
        return _NO_RETURN


_NO_RETURN = object()


def iterate(value: Any, ev: Evaluator | None = None) -> Iterable[Any]:
    """What `for x in value` yields, for the values the evaluator knows."""
    value = _check(value)
    if isinstance(value, ClassRef) and ev is not None and ev.is_enum(value):
        return ev.enum_members(value)
    if isinstance(value, (list, tuple, set, frozenset, dict, str, range)):
        if isinstance(value, (set, frozenset)):
            return sorted(value, key=repr)
        return list(value)
    if hasattr(value, "__iter__") and not isinstance(value, (ClassRef, ModRef, Symbol)):
        return list(value)
    raise Unresolved(repr(value))


def mutate(value: Any, method: str, args: list[Any]) -> Any:
    """`value.method(*args)` on a copy (module constants are shared)."""
    value = _check(value)
    args = [_check(a) for a in args]
    if isinstance(value, list):
        out = list(value)
        if method == "extend":
            out.extend(iterate(args[0]))
        elif method == "append":
            out.append(args[0])
        elif method == "insert":
            out.insert(args[0], args[1])
        else:
            raise Unresolved(method)
        return out
    if isinstance(value, (set, frozenset)) and method in ("add", "update"):
        out_set = set(value)
        if method == "add":
            out_set.add(args[0])
        else:
            out_set.update(iterate(args[0]))
        return out_set
    if isinstance(value, dict) and method == "update":
        return {**value, **args[0]}
    raise Unresolved(method)


def call_method(obj: Any, method: str, args: list[Any], ev: Evaluator) -> Any:
    """The few side-effect-free methods of built-in values the sources use."""
    if isinstance(obj, dict) and method in ("keys", "values", "items") and not args:
        return list(getattr(obj, method)())
    if isinstance(obj, dict) and method == "get":
        return obj.get(*args)
    if isinstance(obj, str) and method in ("lower", "upper", "strip", "replace", "join",
                                           "format", "split"):
        if method == "join":
            return obj.join(str(_check(x)) for x in iterate(args[0], ev))
        return getattr(obj, method)(*args)
    if method == "copy" and not args:
        return _check(obj).copy()
    raise Unresolved(method)


# -- declarations ------------------------------------------------------------------------

UNRES = Symbol("<unresolved>")
Kw = dict[str, tuple[Any, str]]  # keyword -> (value or UNRES, source text)


@dataclass
class Decl:
    """One flag as argparse receives it: option strings, keywords, where it is declared."""

    options: list[str]
    kw: Kw
    source: str
    conditional: bool = False


@dataclass
class FieldDecl:
    """One field of the ServerArgs record (dataclass or msgspec.Struct)."""

    name: str
    module: Module
    node: ast.AnnAssign


def evaluate_kw(ev: Evaluator, node: ast.expr, ctx: Ctx) -> tuple[Any, str]:
    try:
        return _check(ev.eval(node, ctx)), _src(node)
    except Unresolved:
        return UNRES, _src(node)


def render_help(ev: Evaluator, node: ast.expr, ctx: Ctx) -> tuple[Any, str]:
    """Help text; parts of an f-string that cannot be known are shown as {source}."""
    value, text = evaluate_kw(ev, node, ctx)
    if value is not UNRES:
        return value, text
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                parts.append(str(part.value))
            else:
                rendered = render_help(ev, part.value if isinstance(part, ast.FormattedValue)
                                       else part, ctx)[0]
                parts.append(str(rendered) if isinstance(rendered, str) else
                             "{" + _src(part) + "}")
        return "".join(parts), text
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = render_help(ev, node.left, ctx)[0], render_help(ev, node.right, ctx)[0]
        if isinstance(left, str) and isinstance(right, str):
            return left + right, text
    return "{" + text + "}", text


def add_argument_decl(ev: Evaluator, call: ast.Call, ctx: Ctx, condition: str | None) -> Decl:
    options = []
    for arg in call.args:
        value = _check(ev.eval(arg, ctx))
        if not isinstance(value, str):
            raise Unresolved(_src(arg))
        options.append(value)
    kw: Kw = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            kw[f"**{_src(keyword.value)}"] = (UNRES, _src(keyword.value))
        elif keyword.arg == "help":
            kw["help"] = render_help(ev, keyword.value, ctx)
        else:
            kw[keyword.arg] = evaluate_kw(ev, keyword.value, ctx)
    return Decl(options, kw, f"{ctx.module.path}:{call.lineno}", condition is not None)


class CliWalker:
    """Walk `ServerArgs.add_cli_args` (and helpers it hands the parser to) into Decls.

    `condition` is the source of an enclosing `if` the walker cannot decide (None when the
    code always runs): flags under it are marked conditional, and in-place changes of local
    values under it are not applied but noted in `conditional_notes`.
    """

    def __init__(self, ev: Evaluator, fields: dict[str, FieldDecl], server: ClassRef) -> None:
        self.ev, self.fields, self.server = ev, fields, server
        self.decls: list[Decl] = []
        self.warnings: list[str] = []
        self.conditional_notes: dict[str, list[str]] = {}
        self.used_dataclass = False

    def walk_function(self, func: ast.FunctionDef, module: Module,
                      condition: str | None = None) -> None:
        params = [a.arg for a in func.args.posonlyargs + func.args.args]
        parsers = {p for p in params if p not in ("self", "cls")}
        self.walk(func.body, Ctx(module), parsers, condition)

    def walk(self, body: list[ast.stmt], ctx: Ctx, parsers: set[str],
             condition: str | None) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                self.call(stmt.value, ctx, parsers, condition)
            elif isinstance(stmt, ast.Assign):
                self.assign(stmt, ctx, parsers, condition)
            elif isinstance(stmt, ast.If):
                self.branch(stmt, ctx, parsers, condition)
            elif isinstance(stmt, (ast.With, ast.Try)):
                self.walk(stmt.body, ctx, parsers, condition)
            elif isinstance(stmt, (ast.For, ast.While)):
                self.warnings.append(f"{ctx.module.path}:{stmt.lineno}: loop read once")
                self.walk(stmt.body, ctx, parsers, f"loop at line {stmt.lineno}")
            elif not isinstance(stmt, (ast.Pass, ast.Return, ast.Expr, ast.Import,
                                       ast.ImportFrom)):
                self.warnings.append(f"{ctx.module.path}:{stmt.lineno}: skipped "
                                     f"{type(stmt).__name__}")

    def branch(self, stmt: ast.If, ctx: Ctx, parsers: set[str], condition: str | None) -> None:
        try:
            taken = bool(_check(self.ev.eval(stmt.test, ctx)))
        except Unresolved:
            test = _src(stmt.test)
            self.walk(stmt.body, ctx, parsers, test)
            self.walk(stmt.orelse, ctx, parsers, f"not ({test})")
            return
        self.walk(stmt.body if taken else stmt.orelse, ctx, parsers, condition)

    def assign(self, stmt: ast.Assign, ctx: Ctx, parsers: set[str],
               condition: str | None) -> None:
        value = stmt.value
        is_group = (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                    and value.func.attr in ("add_argument_group", "add_mutually_exclusive_group")
                    and isinstance(value.func.value, ast.Name) and value.func.value.id in parsers)
        for target in stmt.targets:
            if not isinstance(target, ast.Name):
                continue
            if is_group:
                parsers.add(target.id)
            elif condition is not None and target.id in ctx.local:
                ctx.local[target.id] = Opaque(_src(value))
            else:
                result, text = evaluate_kw(self.ev, value, ctx)
                ctx.local[target.id] = Opaque(text) if result is UNRES else result

    def call(self, call: ast.Call, ctx: Ctx, parsers: set[str], condition: str | None) -> None:
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else _src(func)
        receiver = func.value if isinstance(func, ast.Attribute) else None
        if name == "add_argument" and isinstance(receiver, ast.Name) and receiver.id in parsers:
            self.decls.append(add_argument_decl(self.ev, call, ctx, condition))
        elif name == "add_cli_args_from_dataclass":
            self.dataclass_call(call, ctx, condition)
        elif isinstance(receiver, ast.Name) and receiver.id in ctx.local and name in MUTATORS:
            if condition is not None:
                self.conditional_notes.setdefault(receiver.id, []).append(
                    f"if {condition}: {_src(call)}")
                return
            try:
                args = [self.ev.eval(a, ctx) for a in call.args]
                ctx.local[receiver.id] = mutate(ctx.local[receiver.id], name, args)
            except Unresolved:
                ctx.local[receiver.id] = Opaque(_src(call))
        elif any(isinstance(a, ast.Name) and a.id in parsers for a in call.args):
            self.helper(call, ctx, condition)

    def helper(self, call: ast.Call, ctx: Ctx, condition: str | None) -> None:
        func = call.func
        target: Any = None
        with contextlib.suppress(Unresolved):
            if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                    and func.value.id in ("cls", "self", "ServerArgs")):
                target = next((s for s in self.server.node.body if isinstance(
                    s, ast.FunctionDef) and s.name == func.attr), None)
                target = target and FuncRef(self.server.module, target)
            else:
                target = self.ev.eval(func, ctx)
        if not isinstance(target, FuncRef) or not isinstance(target.node, ast.FunctionDef):
            self.warnings.append(f"{ctx.module.path}:{call.lineno}: parser passed to "
                                 f"unknown {_src(func)}")
            return
        self.walk_function(target.node, target.module, condition)

    def dataclass_call(self, call: ast.Call, ctx: Ctx, condition: str | None) -> None:
        self.used_dataclass = True
        only: set[str] | None = None
        for keyword in call.keywords:
            if keyword.arg == "fields":
                only = set(iterate(self.ev.eval(keyword.value, ctx), self.ev))
        for fd in self.fields.values():
            if only is not None and fd.name not in only:
                continue
            decl = field_decl(self.ev, fd)
            if decl is not None:
                decl.conditional = condition is not None
                self.decls.append(decl)


# -- dataclass fields (add_cli_args_from_dataclass) ---------------------------------------

def _tail(node: ast.expr) -> str:
    return _src(node).split(".")[-1]


def annotated(node: ast.expr) -> tuple[ast.expr, list[ast.expr]] | None:
    """(type, metadata) of `A[T, meta...]` / `Annotated[T, meta...]`, else None."""
    if (isinstance(node, ast.Subscript) and _tail(node.value) in ("A", "Annotated")
            and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) >= 2):
        return node.slice.elts[0], node.slice.elts[1:]
    return None


def unwrap_optional(node: ast.expr) -> ast.expr:
    """X for Optional[X], Union[X, None] and X | None (one non-None member), else node."""
    members: list[ast.expr]
    if isinstance(node, ast.Subscript) and _tail(node.value) == "Optional":
        return node.slice
    if isinstance(node, ast.Subscript) and _tail(node.value) == "Union":
        members = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        members, stack = [], [node]
        while stack:
            item = stack.pop()
            if isinstance(item, ast.BinOp) and isinstance(item.op, ast.BitOr):
                stack += [item.right, item.left]
            else:
                members.append(item)
    else:
        return node
    rest = [m for m in members if not (isinstance(m, ast.Constant) and m.value is None)
            and _src(m) not in ("None", "type(None)")]
    return rest[0] if len(rest) == 1 else node


def infer_type(node: ast.expr | None) -> str:
    """arg_utils._infer_type_func: int/float/str, anything else is str."""
    text = "str" if node is None else _src(node)
    return text if text in ("int", "float", "str") else "str"


def field_metadata(ev: Evaluator, fd: FieldDecl, metas: list[ast.expr]) -> dict[str, ast.expr]:
    """The Arg(...) keywords (or {"help": text}) of the first Arg/str metadata, else {}."""
    ctx = Ctx(fd.module)
    for meta in metas:
        if isinstance(meta, ast.Call) and _tail(meta.func) == "Arg":
            out = {k.arg: k.value for k in meta.keywords if k.arg}
            if meta.args:
                out["help"] = meta.args[0]
            return out
        with contextlib.suppress(Unresolved):
            if isinstance(_check(ev.eval(meta, ctx)), str):
                return {"help": meta}
    return {}


def field_default(ev: Evaluator, fd: FieldDecl) -> tuple[Any, str] | None:
    """(value or UNRES, text) of a field's default; None when it has none."""
    node = fd.node.value
    if node is None:
        return None
    return evaluate_kw(ev, node, Ctx(fd.module, before=fd.node.lineno))


def field_decl(ev: Evaluator, fd: FieldDecl) -> Decl | None:
    """The add_argument call arg_utils.add_cli_args_from_dataclass makes for one field."""
    parts = annotated(fd.node.annotation)
    if parts is None:
        return None
    meta = field_metadata(ev, fd, parts[1])
    if not meta:
        return None
    ctx = Ctx(fd.module)
    arg: Kw = {k: (render_help(ev, v, ctx) if k == "help" else evaluate_kw(ev, v, ctx))
               for k, v in meta.items()}
    if arg.get("no_cli", (False, ""))[0] is True:
        return None
    cli_name = arg.get("cli_name", (None, ""))[0] or "--" + fd.name.replace("_", "-")
    aliases = arg.get("aliases", (None, ""))[0] or []
    if aliases is UNRES or not all(isinstance(a, str) for a in aliases):
        raise Unresolved(f"aliases of {fd.name}")
    kw: Kw = {"help": arg.get("help", ("", '""'))}
    if cli_name.lstrip("-").replace("-", "_") != fd.name:
        kw["dest"] = (fd.name, repr(fd.name))
    default = field_default(ev, fd)
    if default is not None:
        kw["default"] = default
    kw.update(_field_kind(parts[0], arg, default is None))
    source = f"{fd.module.path}:{fd.node.lineno}"
    return Decl([cli_name, *aliases], kw, source)


def _field_kind(type_node: ast.expr, arg: Kw, no_default: bool) -> Kw:
    """action/type/choices/nargs/const/required, by arg_utils' branches in order."""
    def given(key: str) -> bool:
        return key in arg and arg[key][0] is not None

    if given("action"):
        kw: Kw = {"action": arg["action"]}
        extra = arg.get("action_kwargs", (None, ""))
        if isinstance(extra[0], dict):
            kw.update({k: (v, repr(v)) for k, v in extra[0].items()})
        elif extra[0] is not None:
            kw["**action_kwargs"] = extra
        return kw
    inner = unwrap_optional(type_node)
    parser = arg["type_parser"] if given("type_parser") else None
    const = {"const": arg["const"]} if given("const") else {}
    if isinstance(inner, ast.Subscript) and _tail(inner.value) == "Literal":
        elts = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]
        if not all(isinstance(e, ast.Constant) for e in elts):
            raise Unresolved(_src(inner))
        values = [e.value for e in elts if isinstance(e, ast.Constant)]
        choices = arg["choices"] if given("choices") and arg["choices"][0] else (
            values, _src(inner))
        kind = {bool: "str", int: "int", float: "float"}.get(type(values[0]) if values
                                                              else str, "str")
        return {"type": parser or (Symbol(kind), kind), "choices": choices, **const}
    is_list = (isinstance(inner, ast.Subscript) and _tail(inner.value) in ("list", "List")) or (
        isinstance(inner, ast.Name) and inner.id == "List")
    if is_list and parser is None:
        elem = inner.slice if isinstance(inner, ast.Subscript) else None
        kw = {"type": (Symbol(infer_type(elem)), infer_type(elem)),
              "nargs": arg["nargs"] if given("nargs") else ("+", "'+'"), **const}
        if given("choices") and arg["choices"][0]:
            kw["choices"] = arg["choices"]
        return kw
    if _src(inner) == "bool":
        return {"action": ("store_true", "'store_true'")}
    kw = {"type": parser or (Symbol(infer_type(inner)), infer_type(inner)), **const}
    for key in ("choices", "nargs"):
        if given(key) and arg[key][0]:
            kw[key] = arg[key]
    required = arg.get("required", (None, ""))[0]
    if required is True or (required is None and no_default):
        kw["required"] = (True, "True")
    return kw


def class_fields(ev: Evaluator, cls: ClassRef, seen: set[int] | None = None) -> list[FieldDecl]:
    """Annotated fields of a dataclass/Struct, base classes first."""
    seen = seen if seen is not None else set()
    if id(cls.node) in seen:
        return []
    seen.add(id(cls.node))
    fields: dict[str, FieldDecl] = {}
    for base in ev.bases(cls):
        fields.update({f.name: f for f in class_fields(ev, base, seen)})
    for stmt in cls.node.body:
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and _tail(stmt.annotation if not isinstance(stmt.annotation, ast.Subscript)
                          else stmt.annotation.value) not in ("ClassVar", "InitVar")):
            fields[stmt.target.id] = FieldDecl(stmt.target.id, cls.module, stmt)
    return list(fields.values())


def record_fields(ev: Evaluator, module: Module, server: ClassRef) -> dict[str, FieldDecl]:
    """The fields of ServerArgs: the namespace classes given to collect_input_fields(...)
    (0.5.20+), then the class's own annotations (which win, as in the real assembly)."""
    fields: dict[str, FieldDecl] = {}
    for stmt in module.tree.body:
        for node in ast.walk(stmt):
            if (isinstance(node, ast.Call) and _tail(node.func) == "collect_input_fields"
                    and node.args and not isinstance(stmt, (ast.FunctionDef, ast.ClassDef))):
                for cls in iterate(ev.eval(node.args[0], Ctx(module, before=stmt.lineno)), ev):
                    if not isinstance(cls, ClassRef):
                        raise Unresolved(f"namespace class {cls!r}")
                    fields.update({f.name: f for f in class_fields(ev, cls)})
    fields.update({f.name: f for f in class_fields(ev, server)})
    return fields


# -- flags -----------------------------------------------------------------------------

def to_json(value: Any) -> Any:
    """A JSON value for what the evaluator produced; Unresolved when there is none."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Unresolved(repr(value))
        return value
    if isinstance(value, EnumMember):
        return to_json(value.value)
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((to_json(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: to_json(v) for k, v in value.items()}
    raise Unresolved(repr(value))


def collapse(text: str, limit: int = HELP_CHARS) -> str:
    return " ".join(text.split())[:limit]


def action_defaults(ev: Evaluator, cls: ClassRef) -> tuple[Any, Any]:
    """(nargs, default) a custom Action class gives when the call does not."""
    for node in [cls, *ev.bases(cls)]:
        init = next((s for s in node.node.body if isinstance(s, ast.FunctionDef)
                     and s.name == "__init__"), None)
        if init is None:
            continue
        args = init.args.posonlyargs + init.args.args
        positional = args[len(args) - len(init.args.defaults):]
        pairs = list(zip(positional, init.args.defaults, strict=True))
        pairs += [(a, d) for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults,
                                         strict=True) if d]
        found = {a.arg: d.value for a, d in pairs if isinstance(d, ast.Constant)}
        return found.get("nargs"), found.get("default")
    return None, None


def action_info(ev: Evaluator, value: Any, text: str) -> tuple[str, Any, Any]:
    """(action name, argparse's nargs, argparse's default) for an action= value."""
    if isinstance(value, str):
        nargs, default = BUILTIN_ACTIONS.get(value, (None, None))
        return value, nargs, default
    if isinstance(value, ClassRef):
        return (value.node.name, *action_defaults(ev, value))
    name = text.split(".")[-1]
    nargs, default = BUILTIN_ACTIONS.get(name, (None, None))
    return name, nargs, default


def type_name(entry: tuple[Any, str] | None) -> str | None:
    if entry is None:
        return None
    value, text = entry
    if isinstance(value, Symbol) and value.text in ("int", "float", "str", "bool"):
        return value.text
    if text == "json.loads" or (isinstance(value, Symbol) and value.text == "json.loads"):
        return "json"
    if isinstance(value, FuncRef):
        return value.node.name
    return "lambda" if isinstance(value, LambdaRef) else text


def deprecation(action: str, kw: Kw, help_text: str) -> str | None:
    """A note when the flag is deprecated (Deprecated*Action, deprecated=True, or its help)."""
    def text(key: str) -> str | None:
        value = kw.get(key, (None, ""))[0]
        return value if isinstance(value, str) else None

    if action == "DeprecatedAction":
        message = text("error_message")
        if message:
            return collapse("refused at launch: " + message)
        return collapse("ignored with a warning: " + (help_text or "deprecated"))
    if action.startswith("Deprecated") or kw.get("deprecated", (False, ""))[0] is True:
        new_flag = text("new_flag")
        if new_flag:
            return collapse(f"still accepted with a warning; use {new_flag}")
        return collapse(help_text or "deprecated")
    sentences = re.split(r"(?<=[.!?])\s+", help_text)
    for i, sentence in enumerate(sentences):
        if DEPRECATED_HELP.search(sentence):
            return collapse(" ".join(sentences[i:i + 2]) if len(sentence) < 40 else sentence)
    return None


def value_field(record: dict[str, Any], key: str, entry: tuple[Any, str] | None,
                fallback: Any, unresolved_key: str) -> None:
    """record[key] = the JSON value, or None and record[unresolved_key] = source text."""
    if entry is None:
        record[key] = fallback
        return
    value, text = entry
    try:
        if value is UNRES:
            raise Unresolved(text)
        record[key] = to_json(value)
    except Unresolved:
        record[key] = None
        record[unresolved_key] = text


def make_flag(ev: Evaluator, decl: Decl) -> dict[str, Any]:
    """The JSON record of one declared flag, as argparse would hold it."""
    kw = decl.kw
    action, nargs, default = action_info(ev, *kw.get("action", ("store", "'store'")))
    options = list(decl.options)
    if action == "BooleanOptionalAction":
        options = [o for opt in options
                   for o in ((opt, "--no-" + opt[2:]) if opt.startswith("--") else (opt,))]
    long = next((o for o in options if o.startswith("--")), options[0])
    dest = kw.get("dest", (None, ""))[0]
    help_value = kw.get("help", ("", ""))[0]
    full_help = " ".join(help_value.split()) if isinstance(help_value, str) else ""
    help_text = full_help[:HELP_CHARS]
    record: dict[str, Any] = {
        "name": options[0], "aliases": options[1:],
        "dest": dest if isinstance(dest, str) else long.lstrip("-").replace("-", "_"),
        "action": "deprecated" if action == "DeprecatedAction" else action,
        "type": type_name(kw.get("type")), "required": kw.get("required", (False, ""))[0] is True,
        "help": help_text, "source": decl.source,
        "deprecated": deprecation(action, kw, full_help),
    }
    value_field(record, "nargs", kw.get("nargs"), nargs, "nargs_expr")
    value_field(record, "choices", kw.get("choices"), None, "choices_unresolved")
    if kw.get("choices", (None, ""))[0] is None:
        record.pop("choices_unresolved", None)
    value_field(record, "default", kw.get("default"), default, "default_expr")
    if help_value == Symbol("argparse.SUPPRESS"):
        record["hidden"] = True
    if decl.conditional:
        record["conditional"] = True
    return record


def choice_hooks(source: Source, names: set[str]) -> dict[str, list[str]]:
    """Functions of the wheel that add to a choices list at run time (plugin hooks)."""
    names = {n for n in names if re.fullmatch(r"[A-Z][A-Z0-9_]*", n)}
    if not names:
        return {}
    pattern = re.compile(r"\b(" + "|".join(sorted(names)) + r")\.(?:"
                         + "|".join(sorted(MUTATORS)) + r")\b")
    hooks: dict[str, set[str]] = {}
    for path in sorted(source.files):
        text = source.files[path]
        if not pattern.search(text):
            continue
        for stmt in ast.parse(text).body:
            for node in ast.walk(stmt):
                if not (isinstance(node, ast.Attribute) and node.attr in MUTATORS
                        and isinstance(node.value, ast.Name) and node.value.id in names):
                    continue
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    hooks.setdefault(node.value.id, set()).add(stmt.name)
                elif isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                    hooks.setdefault(node.value.id, set()).add(stmt.targets[0].id)
    return {name: sorted(found) for name, found in hooks.items()}


def _code_tokens(text: str) -> str:
    """The code tokens of `text` (no comments, no layout), stable across Python versions."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    tokens = tokenize.generate_tokens(io.StringIO(textwrap.dedent(text)).readline)
    return " ".join(t.string for t in tokens if t.type not in skip)


def rules_digest(source: Source) -> str | None:
    """Digest of arg_utils' field-to-flag rules in this wheel (None: no arg_utils)."""
    module = source.module(ARG_UTILS)
    if module is None:
        return None
    text = source.files[module.path]
    parts = []
    for name in ARG_UTILS_RULES:
        func = next((s for s in module.tree.body if isinstance(s, ast.FunctionDef)
                     and s.name == name), None)
        body = func.body if func else []
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        parts.append(name + ":" + " ".join(
            _code_tokens(ast.get_source_segment(text, stmt, padded=True) or "") for stmt in body))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def server_args_class(module: Module) -> ClassRef:
    node = next((s for s in module.tree.body if isinstance(s, ast.ClassDef)
                 and s.name == "ServerArgs"), None)
    if node is None:
        raise ValueError(f"{module.path}: no class ServerArgs")
    return ClassRef(module, node)


def extract(source: Source) -> tuple[list[dict[str, Any]], list[str]]:
    """Every flag ServerArgs.add_cli_args declares, sorted by name; and warnings."""
    module = source.module(SERVER_ARGS)
    if module is None:
        raise ValueError(f"no {SERVER_ARGS} in the wheel")
    server = server_args_class(module)
    ev = Evaluator(source)
    fields = record_fields(ev, module, server)

    def declared_default(name: str) -> Any:
        found = field_default(ev, fields[name]) if name in fields else None
        if found is None or found[0] is UNRES:
            raise Unresolved(f"ServerArgs.{name}")
        return found[0]

    ev.field_default = declared_default
    add_cli = next((s for s in server.node.body if isinstance(s, ast.FunctionDef)
                    and s.name == "add_cli_args"), None)
    if add_cli is None:
        raise ValueError(f"{module.path}: no ServerArgs.add_cli_args")
    walker = CliWalker(ev, fields, server)
    walker.walk_function(add_cli, module)
    digest = rules_digest(source)
    if walker.used_dataclass and digest not in ARG_UTILS_CHECKED:
        walker.warnings.append(
            f"{ARG_UTILS.replace('.', '/')}.py: the field-to-flag rules changed (digest "
            f"{digest}; checked: {sorted(ARG_UTILS_CHECKED)}); review field_decl against them")
    flags, owner = [], {}
    for decl in walker.decls:
        flag = make_flag(ev, decl)
        for option in [flag["name"], *flag["aliases"]]:
            if option in owner:
                raise ValueError(f"{option} declared twice: {owner[option]} and {decl.source}")
            owner[option] = decl.source
        flags.append((flag, decl.kw.get("choices", (None, ""))[1]))
    hooks = choice_hooks(source, {text.split(".")[-1] for _, text in flags if text})
    for module in source.parsed():
        for name, notes in module.conditional_mutations.items():
            hooks.setdefault(name, []).extend(notes)
    for name, notes in walker.conditional_notes.items():
        hooks.setdefault(name, []).extend(notes)
    for flag, text in flags:
        if text and hooks.get(text.split(".")[-1]):
            flag["choices_hooks"] = hooks[text.split(".")[-1]]
    return sorted((f for f, _ in flags), key=lambda f: f["name"]), walker.warnings


# -- releases, files, command line ----------------------------------------------------------

def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def removed_flags(version: str, data: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Option strings of earlier supported releases that `version` lacks."""
    def options(flags: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {o: f for f in flags for o in [f["name"], *f["aliases"]]}

    current = options(data[version]["flags"])
    last: dict[str, tuple[str, dict[str, Any]]] = {}
    for earlier in sorted((v for v in data if version_key(v) < version_key(version)),
                          key=version_key):
        last.update({o: (earlier, f) for o, f in options(data[earlier]["flags"]).items()})
    out = {}
    for option, (seen, flag) in sorted(last.items()):
        if option in current:
            continue
        note = f"in {seen}, not in {version}"
        prefixed = sorted(o for o in current if o.startswith(option))
        if len(prefixed) == 1:
            note += f"; argparse now takes it as an abbreviation of {prefixed[0]}"
        elif prefixed:
            note += f"; ambiguous abbreviation now (argparse error): {', '.join(prefixed)}"
        if flag.get("deprecated"):
            note += f"; {seen} said: {flag['deprecated']}"
        out[option] = note
    return out


def find_wheel(folder: Path, version: str) -> Path | None:
    hits = sorted(folder.glob(f"sglang-{version}-*.whl"))
    return hits[0] if hits else None


def download_wheel(version: str, cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           f"sglang=={version}", "-d", str(cache), *PIP_PLATFORM]
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    wheel = find_wheel(cache, version)
    if wheel is None:
        raise FileNotFoundError(f"pip download left no sglang-{version}-*.whl in {cache}")
    return wheel


def index_versions(index_url: str | None = None) -> list[str]:
    """The sglang versions the package index offers (`pip index versions`, newest first)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", "sglang",
           "--disable-pip-version-check", *(["--index-url", index_url] if index_url else [])]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    return []


def newer_releases(offered: Iterable[str], known: Iterable[str] = RELEASES) -> list[str]:
    """Final releases (a .postN counts as its release) newer than the newest in `known`."""
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split(".post")[0].split("."))

    newest = max(key(v) for v in known)
    final = [v for v in offered if re.fullmatch(r"\d+(\.\d+)+(\.post\d+)?", v)]
    return sorted({v.split(".post")[0] for v in final if key(v) > newest}, key=key)


def release_data(version: str, wheel: Path) -> dict[str, Any]:
    flags, warnings = extract(Source.from_wheel(wheel))
    for warning in warnings:
        print(f"warning: {version}: {warning}", file=sys.stderr)
    return {"version": version, "wheel": wheel.name, "generated_by": GENERATED_BY,
            "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(), "flags": flags}


def dump(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def render(data: dict[str, dict[str, Any]], versions: list[str]) -> dict[str, str]:
    """File name -> content: one file per version in `versions`, and index.json over all."""
    files = {}
    for version in versions:
        files[f"{version}.json"] = dump({**data[version],
                                         "removed": removed_flags(version, data)})
    index = [{"version": v, "wheel": data[v]["wheel"], "wheel_sha256": data[v]["wheel_sha256"],
              "flags": len(data[v]["flags"])} for v in sorted(data, key=version_key)]
    files["index.json"] = dump({"generated_by": GENERATED_BY, "releases": index})
    return files


def summary(data: dict[str, Any]) -> str:
    flags = data["flags"]
    return (f"{data['version']}: {len(flags)} flags, "
            f"{sum('choices_unresolved' in f for f in flags)} unresolved choices, "
            f"{sum('default_expr' in f for f in flags)} unresolved defaults, "
            f"{sum(bool(f['deprecated']) for f in flags)} deprecated")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", default=",".join(RELEASES),
                        help="comma-separated releases (default: all supported)")
    parser.add_argument("--wheels", type=Path, help="reuse sglang-*.whl from DIR; no download")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help="where pip downloads the wheels (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when the files differ from what is there, "
                        "or when the index offers a release newer than the newest supported")
    parser.add_argument("--index-url", help="the package index asked by --check (default: "
                        "pip's own)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    versions = [v.strip() for v in args.releases.split(",") if v.strip()]
    unknown = [v for v in versions if v not in RELEASES]
    if unknown:
        print(f"unsupported release(s) {unknown}; supported: {list(RELEASES)}", file=sys.stderr)
        return 2
    newer: list[str] = []
    if args.check:
        newer = newer_releases(index_versions(args.index_url))
        if newer:
            print(f"newer on the index than the newest table ({RELEASES[-1]}): "
                  f"{', '.join(newer)}: read what changed, add them to RELEASES in "
                  "scripts/sync_sglang.py and run `make sync-sglang`", file=sys.stderr)
    data: dict[str, dict[str, Any]] = {}
    for version in versions:
        wheel = find_wheel(args.wheels, version) if args.wheels else download_wheel(
            version, args.cache)
        if wheel is None:
            print(f"no sglang-{version}-*.whl in {args.wheels}", file=sys.stderr)
            return 2
        data[version] = release_data(version, wheel)
        print(summary(data[version]), file=sys.stderr)
    for version in RELEASES:  # the others still count for "removed" and the index
        path = args.out / f"{version}.json"
        if version not in data and path.exists():
            data[version] = json.loads(path.read_text())
    files = render(data, versions)
    if args.check:
        stale = [n for n, text in files.items()
                 if not (args.out / n).exists() or (args.out / n).read_text() != text]
        print("up to date" if not stale else f"stale: {', '.join(stale)}", file=sys.stderr)
        return 1 if stale or newer else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text)
    print(f"wrote {', '.join(sorted(files))} in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
