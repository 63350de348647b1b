"""The command-line flags of an SGLang release, and how argparse resolves an option against them.

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
    source: str  # "help" (parsed from --help) or "table" (FACTS.md fallback)
    #: every option string -> the canonical (first) option string of its argparse action
    options: dict[str, str] = field(default_factory=dict)
    #: canonical -> "none" (a switch), "one" (one value) or "many" (nargs)
    arity: dict[str, str] = field(default_factory=dict)
    #: canonical -> the choices argparse enforces
    choices: dict[str, list[str]] = field(default_factory=dict)
    #: canonical -> note, for flags the release marks deprecated
    deprecated: dict[str, str] = field(default_factory=dict)
    #: option strings the release is known NOT to have (table only) -> why
    removed: dict[str, str] = field(default_factory=dict)

    @property
    def authoritative(self) -> bool:
        """True when parsed from the release's own --help (complete), False for the table."""
        return self.source == "help"

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

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version, "source": self.source, "options": self.options,
            "arity": self.arity, "choices": self.choices, "deprecated": self.deprecated,
            "removed": self.removed,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FlagSet:
        return cls(
            version=str(data["version"]), source=str(data["source"]),
            options=dict(data.get("options") or {}), arity=dict(data.get("arity") or {}),
            choices={k: list(v) for k, v in (data.get("choices") or {}).items()},
            deprecated=dict(data.get("deprecated") or {}),
            removed=dict(data.get("removed") or {}),
        )


# ------------------------------------------------------------------------------ --help parsing

_OPTION_LINE = re.compile(r"^( {1,6})(-{1,2}[A-Za-z0-9?][^\s,]*)")
_CHOICES = re.compile(r"^\{([^{}]*)\}$")


def parse_help(text: str, version: str) -> FlagSet:
    """Parse argparse `--help` output into a FlagSet (raises ValueError when none is found)."""
    fs = FlagSet(version=version, source="help")
    current: str | None = None
    help_text: dict[str, list[str]] = {}
    in_options = False
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        if not line.startswith(" ") and line.endswith(":") and not line.startswith("usage"):
            in_options = True  # a section header: "options:", "Model and tokenizer:", ...
            current = None
            continue
        if not in_options:
            continue
        m = _OPTION_LINE.match(line)
        if m:
            invocation, _, rest = line.strip().partition("  ")
            strings: list[str] = []
            arity = "none"
            choices: list[str] | None = None
            for piece in invocation.split(", "):
                tokens = piece.split()
                if not tokens or not tokens[0].startswith("-"):
                    continue
                strings.append(tokens[0])
                if len(tokens) > 1:
                    arity = "many" if "..." in piece else "one"
                    cm = _CHOICES.match(tokens[1])
                    if cm:
                        choices = [c for c in cm.group(1).split(",") if c]
            if not strings:
                continue
            longs = [s for s in strings if s.startswith("--")] or strings
            canon = longs[0]
            for s in strings:
                fs.options[s] = canon
            fs.arity[canon] = arity
            if choices is not None:
                fs.choices[canon] = choices
            current = canon
            help_text[canon] = [rest.strip()] if rest.strip() else []
        elif current is not None and len(line) - len(line.lstrip()) > 6:
            help_text[current].append(line.strip())
    if not fs.options:
        raise ValueError("no option found in the --help output")
    for canon, parts in help_text.items():
        joined = " ".join(parts)
        if re.search(r"\bdeprecated\b", joined, re.IGNORECASE):
            fs.deprecated[canon] = joined[:200]
    return fs


# ------------------------------------------------------------------------------ FACTS.md table

#: (option strings, arity, choices) common to 0.5.9 - 0.5.23 (FACTS.md "SGLang launch")
_COMMON: list[tuple[tuple[str, ...], str, list[str] | None]] = [
    (("--model-path", "--model"), "one", None),
    (("--tokenizer-path",), "one", None),
    (("--trust-remote-code",), "none", None),
    (("--host",), "one", None),
    (("--port",), "one", None),
    (("--tp-size",), "one", None),
    (("--dp-size",), "one", None),
    (("--mem-fraction-static",), "one", None),
    (("--context-length",), "one", None),
    (("--max-running-requests",), "one", None),
    (("--kv-cache-dtype",), "one",
     ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]),
    (("--quantization",), "one", None),
    (("--served-model-name",), "one", None),
    (("--tool-call-parser",), "one", None),
    (("--reasoning-parser",), "one", None),
    (("--enable-metrics",), "none", None),
    (("--api-key",), "one", None),
    (("--log-level",), "one", None),
    (("--nnodes",), "one", None),
    (("--node-rank",), "one", None),
    (("--dist-init-addr",), "one", None),
    (("--attention-backend",), "one", None),
    (("--watchdog-timeout",), "one", None),
    (("--skip-server-warmup",), "none", None),
    (("--disable-cuda-graph",), "none", None),
    (("--speculative-algorithm",), "one", None),
    (("--speculative-draft-model-path",), "one", None),
    (("--speculative-draft-model-revision",), "one", None),
    (("--speculative-num-steps",), "one", None),
    (("--speculative-eagle-topk",), "one", None),
    (("--speculative-num-draft-tokens",), "one", None),
    (("--speculative-draft-model-quantization",), "one", None),
]

#: --speculative-algorithm names (FACTS.md): a choice list in 0.5.9; DFLASH from 0.5.15
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
SPEC_ALGORITHMS_0515 = (*SPEC_ALGORITHMS, "DFLASH")


def table_flags(version: str) -> FlagSet:
    """The flags FACTS.md documents for `version` (partial: unknown options are not refused)."""
    fs = FlagSet(version=version, source="table")
    for strings, arity, choices in _COMMON:
        for s in strings:
            fs.options[s] = strings[0]
        fs.arity[strings[0]] = arity
        if choices:
            fs.choices[strings[0]] = list(choices)
    if not at_least(version, 0, 5, 15):
        fs.choices["--speculative-algorithm"] = list(SPEC_ALGORITHMS)
    if at_least(version, 0, 5, 23):
        fs.deprecated["--disable-cuda-graph"] = "deprecated alias in sglang 0.5.23"
    if at_least(version, 0, 5, 20):
        for s in ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"):
            fs.options[s] = s
            fs.arity[s] = "one"
        fs.removed["--cuda-graph-max-bs"] = (
            "removed in sglang 0.5.20: use --cuda-graph-max-bs-decode and/or "
            "--cuda-graph-max-bs-prefill"
        )
    else:
        fs.options["--cuda-graph-max-bs"] = "--cuda-graph-max-bs"
        fs.arity["--cuda-graph-max-bs"] = "one"
        if at_least(version, 0, 5, 15):
            fs.deprecated["--cuda-graph-max-bs"] = (
                "deprecated alias in sglang 0.5.15 - 0.5.19, removed in 0.5.20"
            )
    return fs
