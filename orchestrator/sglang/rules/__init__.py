"""Preflight rules read from the real SGLang source: what a launch would hit, and when.

Each rule is a pure function of a `Launch` (the effective options, both config.json files, the
checkpoint's weight size, the GPUs, the launch environment and the installed release) that yields
messages. It is registered with the phase in which real SGLang finds the problem and the range
of releases it applies to; its docstring cites the real file:line of each release:

    argparse      the command line is refused (exit 2)              seconds
    start         ServerArgs refuses it before any process starts   seconds
    sched-init    the scheduler processes fail before the load      a minute
    after-load    found after the target's weights loaded           15+ minutes on the real box
    first-request the first forward that reaches the draft fails    15+ minutes, then a crash
    silent        it runs, but the deploy is wasted (no speedup)    the whole deploy

Modules: serving (names, nodes), speculative (algorithm, parameters, draft path), drafter (its
class, layers, shapes, quantization, context), backends (attention backends x GPUs), memory
(weights per GPU vs the static memory fraction), quantization (compressed-tensors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.sglang.flags import FlagSet, at_least, parse_version
from orchestrator.sglang.hfconfig import Config

PHASES = ("argparse", "start", "sched-init", "after-load", "first-request", "silent")
#: phases the real server reports only after the weights loaded (or never)
EXPENSIVE = ("after-load", "first-request", "silent")


@dataclass(frozen=True)
class Gpu:
    """One GPU as the launch sees it."""

    index: int
    compute_capability: tuple[int, int]
    memory_mib: int


@dataclass
class Options:
    """Effective launch options (argparse semantics: canonical flag -> value), by any alias."""

    values: dict[str, Any]
    flags: FlagSet

    def get(self, *names: str) -> Any:
        """The value of the first of `names` (any alias) that was given, else None."""
        for name in names:
            canon = self.flags.canonical(name) or name
            if canon in self.values:
                return self.values[canon]
        return None

    def _number(self, cast: Callable[[Any], Any], names: tuple[str, ...]) -> Any:
        value = self.get(*names)
        try:
            return cast(value) if value is not None and value is not True else None
        except (TypeError, ValueError):
            return None

    def int(self, *names: str) -> int | None:
        """get() as an int (None when absent or not a number)."""
        return self._number(int, names)

    def float(self, *names: str) -> float | None:
        """get() as a float (None when absent or not a number)."""
        return self._number(float, names)

    def flag(self, *names: str) -> bool:
        """True when a switch among `names` was given."""
        return bool(self.get(*names))


@dataclass
class Launch:
    """Everything a rule may read about one launch."""

    version: str
    options: Options
    model_path: str
    target: Config | None = None
    draft: Config | None = None
    gpus: list[Gpu] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    #: metadata.total_size of the checkpoints' model.safetensors.index.json (bytes), if known
    target_weight_bytes: int | None = None
    draft_weight_bytes: int | None = None
    #: the drafter's checkpoint has a `d2t` tensor (its vocabulary map); None: unknown
    draft_vocab_map: bool | None = None
    #: the venv's python, compressed-tensors version and whether it knows nvfp4_pack_quantized
    python: str = "python"
    compressed_tensors_version: str | None = None
    cudnn_version: str | None = None
    nvfp4_known: bool | None = None
    nvfp4_error: str | None = None

    def at_least(self, *minimum: int) -> bool:
        """True when the installed release is >= minimum."""
        return at_least(self.version, *minimum)

    def env_on(self, name: str) -> bool:
        """An SGLang boolean environment switch (get_bool_env_var: "true"/"1")."""
        return str(self.env.get(name, "")).strip().lower() in ("1", "true")

    @property
    def algorithm(self) -> str | None:
        """The speculative algorithm as ServerArgs resolves it (upper-cased, NEXTN -> EAGLE)."""
        algo = self.options.get("--speculative-algorithm")
        if not isinstance(algo, str):
            return None
        name = algo.upper() if self.at_least(0, 5, 12) else algo
        return "EAGLE" if name == "NEXTN" else name

    @property
    def draft_path(self) -> str | None:
        value = self.options.get("--speculative-draft-model-path", "--speculative-draft-model")
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Finding:
    """One problem (or warning) a rule found."""

    rule: str
    phase: str
    message: str
    warning: bool = False


RuleFn = Callable[[Launch], Iterable[str]]


@dataclass(frozen=True)
class Rule:
    """A registered rule: id, phase, the releases it applies to, and its check."""

    id: str
    phase: str
    since: tuple[int, ...]
    until: tuple[int, ...] | None
    check: RuleFn
    warning: bool = False

    def applies(self, version: str) -> bool:
        v = parse_version(version)
        width = 3
        v = v + (0,) * (width - len(v))
        if v[:width] < self.since:
            return False
        return self.until is None or v[:width] <= self.until

    @property
    def doc(self) -> str:
        return (self.check.__doc__ or "").strip()


REGISTRY: list[Rule] = []


def rule(rule_id: str, phase: str, since: str = "0.5.9", until: str | None = None,
         warning: bool = False) -> Callable[[RuleFn], RuleFn]:
    """Register a rule function for releases since..until (inclusive)."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}")

    def register(fn: RuleFn) -> RuleFn:
        REGISTRY.append(Rule(rule_id, phase, parse_version(since),
                             parse_version(until) if until else None, fn, warning))
        return fn

    return register


def evaluate(launch: Launch) -> list[Finding]:
    """Every finding of every rule that applies to the launch's release."""
    _load_rule_modules()
    found: list[Finding] = []
    for r in REGISTRY:
        if not r.applies(launch.version):
            continue
        found += [Finding(r.id, r.phase, m, r.warning) for m in r.check(launch)]
    return found


def _load_rule_modules() -> None:
    from orchestrator.sglang.rules import (  # noqa: F401 - registration by import
        backends,
        drafter,
        memory,
        quantization,
        serving,
        speculative,
    )
