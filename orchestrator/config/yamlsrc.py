"""YAML loading that remembers where every value was written.

`load_yaml(path)` / `load_yaml_text(text, source)` compose the document with PyYAML's pure-Python
`SafeLoader` (keeping each node's start mark), then build plain Python values themselves, so that
every value has a `Location` (1-based line and column) keyed by its *path*: the tuple of mapping
keys and sequence indexes leading to it, e.g. ``("stages", 2, "needs", 0)``. Mapping keys have
their own locations too (`YamlDoc.key_locations`), used for "unknown key" errors.

Problems become `ConfigProblem`s with a location, raised together in one `ConfigError`:

- YAML syntax errors (a tab used for indentation gets a hint of its own);
- a duplicate key in a mapping (reported at the duplicate, naming the first);
- input bounds: files over `MAX_FILE_BYTES` (5 MiB), nesting deeper than `MAX_DEPTH` (64), more
  than `MAX_NODES` (100,000) values, counted while composing and again once aliases are expanded
  (an alias bomb stops there, fast), and recursive aliases;
- tags other than the standard YAML ones and `!env`; a value its tag cannot read (`!!int abc`);
  integers over `MAX_INT_BITS` (256) bits; characters YAML forbids (NUL, control characters).

Merge keys (``<<: *defaults``) are supported; keys written next to them win. Mapping keys are
always text (``on:`` is the key "on"), and, as in YAML 1.2, only true/false are booleans: yes, no,
on, off stay text (pydantic still reads them as booleans where a field wants one); dates stay text.
`yaml11_booleans=True` reads yes/no/on/off as booleans, as YAML 1.1 does (for Ansible's files).

The `!env` tag
--------------
``!env NAME`` is the value (always text) of the operator's environment variable NAME, read when
the file is loaded. It is an error (located at the tag) when NAME is not set.
``!env NAME:-DEFAULT`` is the optional form, as in the shell's ``${NAME:-DEFAULT}``: DEFAULT (text,
possibly empty, as in ``!env NAME:-``) is used when NAME is unset or empty. NAME must look like an
environment variable name (letters, digits, ``_``; not starting with a digit). Values read through
``!env`` from a variable whose NAME looks secret (`orchestrator.redact.is_secret_name`, e.g.
``HF_TOKEN``) are collected in `YamlDoc.secrets` so they can be redacted everywhere. The value is
DATA (`orchestrator.config.templating.Data`): braces in it (``{{``, ``{%``, ``{#``) are never read
as a template, so a token like ``p{#ss`` or ``{{ x }}`` reaches the host byte for byte.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from orchestrator.config.templating import Data
from orchestrator.errors import ConfigError, ConfigProblem, Location
from orchestrator.redact import is_secret_name

MAX_FILE_BYTES = 5 * 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 100_000
MAX_INT_BITS = 256  # larger integers cannot always be printed (int_max_str_digits) or floated

ENV_TAG = "!env"
_NUMBER = re.compile(
    r"^[-+]?(0x[0-9a-fA-F_]+|0o?[0-7_]+|0b[01_]+|[0-9][0-9_:.]*([eE][-+]?[0-9]+)?)$")
_TOO_BIG = object()
_ENV_SPEC = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?$", re.DOTALL)
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_SCALAR_TAGS = {
    "tag:yaml.org,2002:" + t
    for t in ("str", "int", "float", "bool", "null", "timestamp", "binary")
}

Path_ = tuple[Any, ...]


@dataclass
class YamlDoc:
    """A loaded YAML document: its value, and where each part of it was written."""

    source: str
    data: Any
    locations: dict[Path_, Location] = field(default_factory=dict)
    key_locations: dict[Path_, Location] = field(default_factory=dict)
    secrets: set[str] = field(default_factory=set)

    def has(self, path: Path_) -> bool:
        """True when a value exists at `path`."""
        return tuple(path) in self.locations

    def loc(self, path: Path_ = ()) -> Location:
        """Location of the value at `path`, or of its nearest existing parent."""
        path = tuple(path)
        while path and path not in self.locations:
            path = path[:-1]
        return self.locations.get(path, Location(self.source, 1, 1))

    def value_at(self, path: Path_) -> Any:
        """The value at `path` (None when there is none)."""
        value = self.data
        for part in path:
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
                value = value[part]
            else:
                return None
        return value

    def best_loc(self, path: Path_) -> Location:
        """Where to point at the value at `path`: its key for a list or mapping written under
        it (which starts on the next line), else the value itself."""
        path = tuple(path)
        if path in self.key_locations and isinstance(self.value_at(path), (dict, list)):
            return self.key_locations[path]
        return self.loc(path)

    def key_loc(self, path: Path_) -> Location:
        """Location of the mapping key ending `path` (falls back to `loc`)."""
        path = tuple(path)
        return self.key_locations.get(path) or self.loc(path)


class _TooDeep(Exception):
    def __init__(self, mark: Any) -> None:
        super().__init__("too deep")
        self.mark = mark


class _TooMany(Exception):
    def __init__(self, mark: Any) -> None:
        super().__init__("too many")
        self.mark = mark


class _Limited:
    """Refuses nesting deeper than MAX_DEPTH and more than MAX_NODES nodes while composing."""

    def _limits(self, max_depth: int, max_nodes: int) -> None:
        self._depth = 0
        self._max_depth = max_depth
        self._nodes = 0
        self._max_nodes = max_nodes

    def compose_node(self, parent: Node | None, index: Any) -> Node:  # noqa: D102
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > self._max_depth:
                raise _TooDeep(self.peek_event().start_mark)  # type: ignore[attr-defined]
            if self._nodes > self._max_nodes:
                raise _TooMany(self.peek_event().start_mark)  # type: ignore[attr-defined]
            return yaml.composer.Composer.compose_node(self, parent, index)  # type: ignore[arg-type]
        finally:
            self._depth -= 1


class _Loader(_Limited, yaml.SafeLoader):
    """SafeLoader (pure Python) with the limits of `_Limited`."""

    def __init__(self, stream: str, max_depth: int, max_nodes: int) -> None:
        super().__init__(stream)
        self._limits(max_depth, max_nodes)


#: ASCII text PyYAML's reader refuses: the control characters but tab, LF and CR
_ASCII_CONTROL = re.compile("[\x00-\x08\x0B\x0C\x0E-\x1F\x7F]")


@functools.cache
def _printable() -> re.Pattern[str]:
    """Text PyYAML's reader accepts (yaml/reader.py:137 NON_PRINTABLE, inverted) and no BOM;
    compiled on first use (~3 ms: most files are ASCII, see `_is_printable`)."""
    return re.compile("[\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFEFE\uFF00-\uFFFD"
                      "\U00010000-\U0010ffff]*")


def _is_printable(text: str) -> bool:
    if text.isascii():
        return _ASCII_CONTROL.search(text) is None
    return _printable().fullmatch(text) is not None

if getattr(yaml, "__with_libyaml__", False):
    from yaml.cyaml import CParser

    class _CLoader(_Limited, yaml.composer.Composer, CParser, yaml.constructor.SafeConstructor,
                   yaml.resolver.Resolver):
        """libyaml scans and parses (C, many times faster); the composer stays PyYAML's own
        (Python), so the depth and node limits and every mark work as with `_Loader`."""

        def __init__(self, stream: str, max_depth: int, max_nodes: int) -> None:
            CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._limits(max_depth, max_nodes)

        def dispose(self) -> None:  # noqa: D102 - CParser keeps no state worth dropping
            pass


def _new_loader(text: str, max_depth: int, max_nodes: int) -> Any:
    """The fast loader when libyaml is there and the text is plain (libyaml reports a bad
    character and a syntax error in its own words: those go through the pure-Python loader)."""
    if getattr(yaml, "__with_libyaml__", False) and _is_printable(text):
        return _CLoader(text, max_depth, max_nodes)
    return _Loader(text, max_depth, max_nodes)


def _plain_text(node: ScalarNode) -> bool:
    """YAML 1.1 oddities kept as text: yes/no/on/off are not booleans, dates are not dates."""
    if node.tag == _BOOL_TAG:
        return node.value.lower() not in ("true", "false")
    return node.tag == _TIMESTAMP_TAG


def parse_scalar(text: str) -> Any:
    """Read one value as YAML would (`8` -> 8, `true` -> True, `null` -> None, else text).

    Only scalars: text that YAML would read as a list or mapping stays text, and so do
    yes/no/on/off and dates (see `_plain_text`). Used for `--var NAME=VALUE`.
    """
    if text.strip() == "":
        return text
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return text
    if not isinstance(node, ScalarNode) or node.tag not in _SCALAR_TAGS or _plain_text(node):
        return text
    if node.tag == _STR_TAG:
        return text
    try:
        return yaml.SafeLoader("").construct_object(node, deep=True)
    except yaml.YAMLError:  # pragma: no cover
        return text


def _mark_loc(source: str, mark: Any) -> Location:
    return Location(source, mark.line + 1, mark.column + 1)


def load_yaml(
    path: str | os.PathLike[str],
    *,
    environ: Mapping[str, str] | None = None,
    max_bytes: int = MAX_FILE_BYTES,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    yaml11_booleans: bool = False,
) -> YamlDoc:
    """Read and load one YAML file; raise ConfigError (located) on any problem.

    `yaml11_booleans`: read yes/no/on/off as booleans, as YAML 1.1 (and Ansible) does.
    """
    text = read_text(path, max_bytes=max_bytes)
    return load_yaml_text(
        text, str(path), environ=environ, max_depth=max_depth, max_nodes=max_nodes,
        yaml11_booleans=yaml11_booleans,
    )


def read_text(path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The text of a configuration file (UTF-8, at most `max_bytes`); problems as ConfigError."""
    source = str(path)
    try:
        size = os.stat(path).st_size
        if size > max_bytes:
            raise ConfigError([_too_big(source, size, max_bytes)])
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except FileNotFoundError:
        raise ConfigError([ConfigProblem(
            None,
            f"{source}: file not found",
            "check the path (relative paths are taken from the current directory)",
        )]) from None
    except IsADirectoryError:
        raise ConfigError([ConfigProblem(
            None, f"{source}: is a directory, not a YAML file", "give the path of a .yaml file"
        )]) from None
    except OSError as exc:
        raise ConfigError([ConfigProblem(
            None, f"{source}: cannot read file: {exc.strerror or exc}",
            "check that the file exists and is readable",
        )]) from None
    if len(raw) > max_bytes:
        raise ConfigError([_too_big(source, len(raw), max_bytes)])
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError([ConfigProblem(
            Location(source, line, col), "the file is not valid UTF-8 text",
            "save the file as UTF-8",
        )]) from None


def _too_big(source: str, size: int, limit: int) -> ConfigProblem:
    return ConfigProblem(
        None,
        f"{source}: file is too large ({size} bytes; the limit is {limit})",
        "configuration files should be small; is this the right file?",
    )


def load_yaml_text(
    text: str,
    source: str = "<string>",
    *,
    environ: Mapping[str, str] | None = None,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    yaml11_booleans: bool = False,
) -> YamlDoc:
    """Load YAML text (named `source` in locations); raise ConfigError on any problem."""
    try:
        loader = _new_loader(text, max_depth, max_nodes)  # the reader checks every character
    except yaml.reader.ReaderError as exc:
        raise ConfigError([_reader_problem(source, text, exc)]) from None
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError:
            if isinstance(loader, _Loader):
                raise
            # libyaml words and places errors its own way: PyYAML's reader says them as always
            loader = _Loader(text, max_depth, max_nodes)
            node = loader.get_single_node()
    except _TooMany as exc:
        raise ConfigError([ConfigProblem(
            _mark_loc(source, exc.mark),
            f"the document holds more than {max_nodes} values",
            "configuration files should be small; is this the right file?",
        )]) from None
    except _TooDeep as exc:
        raise ConfigError([ConfigProblem(
            _mark_loc(source, exc.mark),
            f"values are nested more than {max_depth} levels deep",
            "flatten the structure; configuration never needs this much nesting",
        )]) from None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError([_syntax_problem(source, text, exc)]) from None
    except yaml.YAMLError as exc:  # pragma: no cover - reader errors without marks
        raise ConfigError([ConfigProblem(Location(source, 1, 1), f"invalid YAML: {exc}")]) from None
    except RecursionError:  # pragma: no cover - guarded by max_depth
        raise ConfigError([ConfigProblem(
            Location(source, 1, 1), "values are nested too deeply"
        )]) from None
    finally:
        loader.dispose()
    doc = YamlDoc(source=source, data=None)
    if node is None:
        return doc
    builder = _Builder(doc, loader, os.environ if environ is None else environ, max_nodes)
    builder.yaml11_booleans = yaml11_booleans
    try:
        doc.data = builder.build(node, ())
    except _Abort:
        pass
    if builder.problems:
        unique = list(dict.fromkeys(builder.problems))  # a merged anchor reports once
        unique.sort(key=lambda p: (p.location.line, p.location.column) if p.location else (0, 0))
        raise ConfigError(unique)
    return doc


def _reader_problem(source: str, text: str, exc: yaml.reader.ReaderError) -> ConfigProblem:
    """A character YAML does not allow (NUL, most control characters, U+FFFE/U+FFFF, lone
    surrogates), located at its line and column as YAML counts them."""
    pos = max(0, min(int(exc.position), len(text)))
    breaks = list(re.finditer(r"\r\n|[\n\r\x85\u2028\u2029]", text[:pos]))
    column = pos - (breaks[-1].end() if breaks else 0)
    char = exc.character
    code = f"#x{ord(char):04X}" if isinstance(char, str) else f"#x{int(char):02X}"
    return ConfigProblem(
        Location(source, len(breaks) + 1, column + 1),
        f"the file holds a character YAML does not allow here ({code}, a control or "
        "non-character code point)",
        "remove it or, inside a double-quoted string, write it as an escape such as \\x07",
    )


def _syntax_problem(source: str, text: str, exc: yaml.MarkedYAMLError) -> ConfigProblem:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or "invalid YAML"
    context = f" ({exc.context})" if exc.context else ""
    hint = "check indentation, colons, quotes and brackets near this place"
    if exc.context_mark is not None and "<stream end>" in problem:
        mark = exc.context_mark  # point at the opening, not at the end of the file
        problem = f"never closed: {problem}"
        hint = "close the bracket or quote that opens here"
    loc = _mark_loc(source, mark) if mark is not None else Location(source, 1, 1)
    if "'\\t'" in problem or "\\t" in problem:
        hint = "YAML indentation must use spaces, not tabs: replace the tab characters with spaces"
        if mark is not None:
            lines = text.splitlines()
            if 0 <= mark.line < len(lines) and "\t" in lines[mark.line]:
                loc = Location(source, mark.line + 1, lines[mark.line].index("\t") + 1)
    elif "expected a single document" in (exc.context or "") + problem:
        hint = "a playbook or inventory holds one YAML document: remove the '---' separator"
    return ConfigProblem(loc, f"YAML syntax error: {problem}{context}", hint)


class _Abort(Exception):
    """Stop building (a limit was hit); problems are already recorded."""


class _Builder:
    """Turns a composed node graph into Python values plus locations, enforcing the limits."""

    def __init__(
        self, doc: YamlDoc, loader: Any, environ: Mapping[str, str], max_nodes: int
    ) -> None:
        self.doc = doc
        self.loader = loader
        self.environ = environ
        self.max_nodes = max_nodes
        self.count = 0
        self.active: set[int] = set()
        self.done: set[int] = set()  # nodes built once: building them again expands an alias
        self.aliases: list[Path_] = []  # paths of the alias expansions in progress
        self.problems: list[ConfigProblem] = []
        #: yes/no/on/off are booleans (YAML 1.1, as Ansible reads its files)
        self.yaml11_booleans = False

    def loc(self, node: Node) -> Location:
        return _mark_loc(self.doc.source, node.start_mark)

    def problem(self, node: Node, message: str, hint: str | None = None) -> None:
        self.problems.append(ConfigProblem(self.loc(node), message, hint))

    def build(self, node: Node, path: Path_) -> Any:
        self.tick(node)
        if id(node) in self.active:
            self.problem(node, "an alias refers to the value that contains it (a recursive alias)",
                         "aliases (*name) may only refer to anchors (&name) outside themselves")
            raise _Abort
        self.doc.locations[path] = self.loc(node)
        if node.tag == ENV_TAG:
            return self.env(node)
        if isinstance(node, ScalarNode):
            return self.scalar(node)
        alias = id(node) in self.done
        if alias:
            self.aliases.append(path)
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                if node.tag != _SEQ_TAG:
                    self.problem(node, f"unsupported tag {node.tag!r} on a list",
                                 "remove the tag; only !env is understood")
                return [self.build(child, (*path, i)) for i, child in enumerate(node.value)]
            if isinstance(node, MappingNode):
                if node.tag != _MAP_TAG:
                    self.problem(node, f"unsupported tag {node.tag!r} on a mapping",
                                 "remove the tag; only !env is understood")
                return self.mapping(node, path)
        finally:
            self.active.discard(id(node))
            self.done.add(id(node))
            if alias:
                self.aliases.pop()
        raise AssertionError(f"unexpected node {node!r}")  # pragma: no cover

    def scalar(self, node: ScalarNode, *, key: bool = False) -> Any:
        # a plain scalar's style is None (PyYAML) or "" (libyaml)
        if key and not node.style and node.tag != ENV_TAG and node.tag in _SCALAR_TAGS:
            return node.value  # keys are text: `on:` stays "on", `1:` stays "1"
        if node.tag not in _SCALAR_TAGS:
            self.problem(node, f"unsupported tag {node.tag!r}",
                         "remove the tag; only !env NAME (and standard YAML tags) are understood")
            return node.value
        if _plain_text(node) and not (self.yaml11_booleans and node.tag == _BOOL_TAG):
            return node.value
        short = node.value if len(node.value) <= 40 else node.value[:37] + "..."
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            self.problem(node, f"invalid value: {problem}")
            return node.value
        except (ValueError, OverflowError):  # `!!int abc`, more digits than int() accepts
            if not _NUMBER.match(node.value.strip()):
                kind = node.tag.rsplit(":", 1)[-1]
                self.problem(node, f"invalid value {short!r}: not a valid {kind}",
                             "remove the tag, or quote the value to keep it as text")
                return node.value
            value = _TOO_BIG
        if value is _TOO_BIG or (isinstance(value, int) and value.bit_length() > MAX_INT_BITS):
            self.problem(node, f"the number {short!r} is too large (more than {MAX_INT_BITS} "
                         "bits)", "quote it to keep it as text")
            return node.value
        return value

    def env(self, node: Node) -> Any:
        if not isinstance(node, ScalarNode):
            self.problem(node, "!env takes a variable name, e.g. `!env HF_TOKEN`",
                         "write `!env NAME` or `!env NAME:-default` (no lists or mappings)")
            return None
        spec = str(node.value).strip()
        m = _ENV_SPEC.match(spec)
        if not m:
            self.problem(node, f"!env {spec!r}: not an environment variable name",
                         "write `!env NAME` or `!env NAME:-default`; NAME uses letters, "
                         "digits and '_'")
            return None
        name, default = m.group(1), m.group(2)
        value = self.environ.get(name)
        if default is not None and not value:
            value = default
        if value is None:
            self.problem(node, f"environment variable {name} is not set (needed by !env {name})",
                         f"export {name}=... before running, or give a default: "
                         f"`!env {name}:-VALUE`")
            return None
        if is_secret_name(name) and value:
            self.doc.secrets.add(value)
        return Data(value)  # data, never rendered as a template

    def tick(self, node: Node) -> None:
        self.count += 1
        if self.count > self.max_nodes:
            if self.aliases:  # point at the collection holding the outermost alias
                outer = self.aliases[0][:-1]
                where = self.doc.key_locations.get(outer) or self.doc.loc(outer)
                self.problems.append(ConfigProblem(
                    where,
                    f"the document expands to more than {self.max_nodes} values "
                    "(anchors and aliases repeated too often: an alias bomb?)",
                    "use fewer aliases (*name) of large anchors (&name)",
                ))
                raise _Abort
            self.problem(  # pragma: no cover - composing stops first without aliases
                node, f"the document holds more than {self.max_nodes} values",
                "configuration files should be small; is this the right file?",
            )
            raise _Abort

    def mapping(self, node: MappingNode, path: Path_) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        for key, key_node, value_node in self.entries(node, set()):
            self.doc.key_locations[(*path, key)] = self.loc(key_node)
            result[key] = self.build(value_node, (*path, key))
        return result

    def entries(self, node: MappingNode, visiting: set[int]) -> list[tuple[Any, Node, Node]]:
        """(key, key node, value node) of a mapping, with `<<` merges flattened in."""
        out: list[tuple[Any, Node, Node]] = []
        seen: dict[Any, Node] = {}
        merges: list[Node] = []
        for key_node, value_node in node.value:
            self.tick(key_node)
            if key_node.tag == _MERGE_TAG:
                merges.append(value_node)
                continue
            if not isinstance(key_node, ScalarNode) or key_node.tag == ENV_TAG:
                self.problem(key_node, "a mapping key must be a plain value (text or number)",
                             "use a simple key such as `name:`")
                continue
            key = self.scalar(key_node, key=True)
            try:
                hash(key)
            except TypeError:  # pragma: no cover - scalars are hashable
                self.problem(key_node, "a mapping key must be a plain value (text or number)")
                continue
            if key in seen:
                first = seen[key].start_mark.line + 1
                self.problem(key_node, f"duplicate key {key!r} (first written on line {first})",
                             "remove one of them; YAML would silently keep only the last")
                continue
            seen[key] = key_node
            out.append((key, key_node, value_node))
        for merge in merges:
            sources = merge.value if isinstance(merge, SequenceNode) else [merge]
            for src in sources:
                if not isinstance(src, MappingNode):
                    self.problem(src, "`<<` (merge) needs a mapping or a list of mappings",
                                 "write `<<: *anchor` where &anchor names a mapping")
                    continue
                if id(src) in visiting or id(src) in self.active or src is node:
                    self.problem(src, "a `<<` merge refers to the mapping that contains it",
                                 "merge only anchors (&name) defined outside this mapping")
                    continue
                visiting.add(id(src))
                for key, key_node, value_node in self.entries(src, visiting):
                    if key not in seen:
                        seen[key] = key_node
                        out.append((key, key_node, value_node))
                visiting.discard(id(src))
        return out
