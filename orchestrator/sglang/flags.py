"""The command-line flags of an SGLang release, and how argparse resolves an option against them.

The flags are GENERATED from the real wheel of each supported release (`make sync-sglang`,
scripts/sync_sglang.py, orchestrator/sglang/releases/<version>.json): option strings, aliases,
arity, choices, deprecations, and the option strings a later release removed. `flags_for(v)`
gives the FlagSet of an installed version; a version between two supported releases gets the
data of the older one (source "nearest", whose unknown options are warnings, not refusals).

argparse resolves an option against them.

The authoritative source is the installed release itself: `python -m sglang.launch_server --help`
run in the venv ON the host, parsed by `parse_help` (option strings, aliases, choices, whether a
flag takes a value, "deprecated" in its help). When that fails, `table_flags(version)` gives the
flags FACTS.md documents for 0.5.9 - 0.5.23; the table is partial, so an option it does not know
is only a warning, while a flag the table knows was removed is refused.

argparse resolves an option (allow_abbrev=True) as: an exact option string wins; otherwise every
option string starting with it is a candidate; one candidate is used (a prefix match), several
are an error ("ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode,
--cuda-graph-max-bs-prefill"). `FlagSet.resolve` does the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_VERSION = re.compile(r"(\d+)")


def parse_version(text: str | None) -> tuple[int, ...]:
    """(0, 5, 23) for "0.5.23", "0.5.23.post1" or "0.5.23+cu128"; () for None/garbage."""
    if not text:
        return ()
    parts: list[int] = []
    for piece in text.split("+")[0].split("."):
        m = _VERSION.match(piece)
        if not m:
            break
        parts.append(int(m.group(1)))
        if m.end() != len(piece):  # "10rc1": keep 10, stop there
            break
    return tuple(parts)


def at_least(version: str | None, *minimum: int) -> bool:
    """True when `version` is known and >= `minimum` (missing parts count as 0)."""
    v = parse_version(version)
    if not v:
        return False
    width = max(len(v), len(minimum))
    return v + (0,) * (width - len(v)) >= tuple(minimum) + (0,) * (width - len(minimum))


@dataclass(frozen=True)
class Resolution:
    """How an option string resolves against a FlagSet."""

    kind: str  # "exact" | "prefix" | "ambiguous" | "unknown"
    option: str
    canonical: str | None = None
    matches: tuple[str, ...] = ()


@dataclass
class FlagSet:
    """The flags of one SGLang release."""

    version: str
    source: str  # "release" (its own generated file) or "nearest" (an older release's)
    #: every option string -> the canonical (first) option string of its argparse action
    options: dict[str, str] = field(default_factory=dict)
    #: canonical -> "none" (a switch), "one" (one value) or "many" (nargs)
    arity: dict[str, str] = field(default_factory=dict)
    #: canonical -> the choices argparse enforces
    choices: dict[str, list[str]] = field(default_factory=dict)
    #: canonical -> note, for flags the release marks deprecated
    deprecated: dict[str, str] = field(default_factory=dict)
    #: option strings an earlier supported release had and this one lacks -> why
    removed: dict[str, str] = field(default_factory=dict)
    #: the release whose generated data this is (differs from `version` for "nearest")
    data_version: str = ""

    @property
    def authoritative(self) -> bool:
        """True when generated from this very release's wheel (complete)."""
        return self.source == "release"

    def resolve(self, option: str) -> Resolution:
        """Resolve `option` ("--tp" or "--tp=8") the way argparse's prefix matching does."""
        name = option.split("=", 1)[0]
        if name in self.options:
            return Resolution("exact", name, self.options[name], (name,))
        matches = tuple(sorted(o for o in self.options if o.startswith(name)))
        if len(matches) == 1:
            return Resolution("prefix", name, self.options[matches[0]], matches)
        if len(matches) > 1:
            canon = {self.options[m] for m in matches}
            if len(canon) == 1:  # aliases of one flag: the same flag either way
                return Resolution("prefix", name, canon.pop(), matches)
            return Resolution("ambiguous", name, None, matches)
        return Resolution("unknown", name)

    def canonical(self, option: str) -> str | None:
        """The canonical name of an exact option string (aliases included), else None."""
        return self.options.get(option)


# ------------------------------------------------------------------------------ release data

#: argparse actions that take no value (the generated files name custom actions by class)
_SWITCH_ACTIONS = ("store_true", "store_false", "store_const", "count", "help", "version")


def _arity(flag: dict[str, Any]) -> str:
    """"none" (a switch), "one", "optional" (nargs "?") or "many", as argparse consumes values.

    The generated `nargs` is the action's effective one (custom deprecated switches set 0)."""
    action = str(flag.get("action") or "store")
    nargs = flag.get("nargs")
    if nargs == 0 or (nargs is None and action in _SWITCH_ACTIONS):
        return "none"
    if action == "BooleanOptionalAction":
        return "none"
    if nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1):
        return "many"
    if nargs == "?":
        return "optional"
    return "one"


def from_release(data: dict[str, Any]) -> FlagSet:
    """The FlagSet of one release from its generated data file (orchestrator/sglang/releases).

    `source` is "release" when the installed version has its own file, "nearest" when the data
    of an older supported release stands in for it.
    """
    version = str(data.get("requested") or data["version"])
    exact = str(data["version"]) == version
    fs = FlagSet(version=version, source="release" if exact else "nearest")
    for flag in data["flags"]:
        canon = flag["name"]
        for option in (canon, *flag.get("aliases", [])):
            fs.options[option] = canon
        fs.arity[canon] = _arity(flag)
        if flag.get("choices"):
            fs.choices[canon] = [str(c) for c in flag["choices"]]
        if flag.get("deprecated"):
            fs.deprecated[canon] = str(flag["deprecated"])
    # argparse's own -h/--help (ArgumentParser(add_help=True), as prepare_server_args builds it)
    fs.options.setdefault("-h", "--help")
    fs.options.setdefault("--help", "--help")
    fs.arity.setdefault("--help", "none")
    fs.removed = {k: str(v) for k, v in (data.get("removed") or {}).items()}
    fs.data_version = str(data["version"])
    return fs


def flags_for(version: str) -> FlagSet:
    """The generated FlagSet of an installed SGLang `version` (KeyError below the oldest)."""
    from orchestrator.sglang.releases import load_release

    return from_release(load_release(version))
