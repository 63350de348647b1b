"""The stage-kind interface and its registry.

A stage kind is a class registered under its YAML name via `__init_subclass__(kind=...)`, with a
pydantic `Params` model validated at load time. The runner calls, per host:

    check(host, ctx) -> Converged | Needed      # read-only, also used by --dry-run
    apply(host, ctx, plan)                       # only when Needed; plan = Needed.plan
    verify(host, ctx)                            # after apply; raise StageError if not converged

A stage never touches paramiko or Fabric; it talks to the host through `orchestrator.host.Host`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from orchestrator.config.model import HostSpec, StageSpec
from orchestrator.errors import Interrupted
from orchestrator.host import Host
from orchestrator.pinfile import StagePin


@dataclass(frozen=True)
class Converged:
    """The host already has what the stage wants."""

    reason: str = "already converged"


@dataclass(frozen=True)
class Needed:
    """The stage must apply; `reason` says what is missing (shown by --dry-run).

    `plan` is what check() found and decided (the kind's own frozen value); the runner hands it
    to `apply(host, ctx, plan)`, so nothing is kept on the stage between the two.
    """

    reason: str
    plan: Any = field(default=None, compare=False, repr=False)


CheckResult = Converged | Needed


class Params(BaseModel):
    """Base of every stage kind's parameter schema: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", defer_build=True)


#: what a stage records in the run record (summary.json's facts): JSON data
JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]


class StageLog(Protocol):
    """What a stage logs with: a structlog logger (or orchestrator.run.early's HeldLog)."""

    def debug(self, event: str, **kw: object) -> object: ...
    def info(self, event: str, **kw: object) -> object: ...
    def warning(self, event: str, **kw: object) -> object: ...


@dataclass
class StageContext:
    """What a stage may use besides the host: its spec, logger, facts sink and progress hook."""

    spec: StageSpec
    run_id: str
    log: StageLog
    dry_run: bool = False
    #: `deploy --verify`: check what a converged check takes on trust (hashes of downloads)
    verify: bool = False
    timeout: float | None = None
    facts: dict[str, JSONValue] = field(default_factory=dict)
    progress: Callable[[str], None] = lambda message: None
    secrets: frozenset[str] = frozenset()
    env: dict[str, str] = field(default_factory=dict)
    #: open another inventory host (e.g. the hypervisor of this container); closed after the stage
    open_host: Callable[[str], Host] | None = None
    #: all hosts of the inventory by name (specs only), e.g. to find a hypervisor entry
    inventory_hosts: dict[str, HostSpec] = field(default_factory=dict)
    #: the inventory's groups: name -> member host names (e.g. a router's worker group)
    inventory_groups: dict[str, list[str]] = field(default_factory=dict)
    #: with `deploy --locked PINFILE`: the pin this stage recorded in that deploy, as its kind's
    #: `Pin` (NoPin when the file has no entry for it); a kind that would produce something
    #: else refuses (and under a dry run reports the drift). None without --locked.
    pin: StagePin | None = None
    #: set by the runner when the run is cancelled (Ctrl-C); long waits use `sleep`
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: the check is asked ahead of its turn (orchestrator.run.early): only a Converged answer
    #: is used, so anything costly that only a Needed answer needs may be left to its turn
    ahead: bool = False

    def record(self, key: str, value: JSONValue) -> None:
        """Put a fact into the run record for this (host, stage)."""
        self.facts[key] = value

    def warn(self, event: str, message: str, **fields: object) -> None:
        """A warning the operator must see: logged once (the console shows it) and kept in the
        run record as the stage's fact "warnings" (summary.json, `--json`); the same message
        given twice (check, then apply) is one warning."""
        warnings = self.facts.setdefault("warnings", [])
        if not isinstance(warnings, list) or message in warnings:
            return
        warnings.append(message)
        self.log.warning(event, message=message, **fields)

    def sleep(self, seconds: float) -> None:
        """Wait between polls; raise Interrupted at once when the run is cancelled (Ctrl-C)."""
        if self.cancelled.wait(max(0.0, seconds)):
            raise Interrupted("interrupted (Ctrl-C) while the stage was waiting")


class Stage:
    """Base class of stage kinds. Subclass with `class X(Stage, kind="name")`."""

    registry: ClassVar[dict[str, type[Stage]]] = {}
    kind: ClassVar[str] = ""
    Params: ClassVar[type[BaseModel]] = Params
    #: `with:` params that hold shell command text: the runner renders their templates like
    #: `run:` (every {{ value }} shell-quoted unless `| raw`), not as plain text
    shell_params: ClassVar[frozenset[str]] = frozenset()
    #: what the kind pins for `deploy --locked` (orchestrator.pinfile), recorded as the fact
    #: "pin"; None: nothing
    Pin: ClassVar[type[StagePin] | None] = None
    #: the check may be asked ahead of its turn, while earlier stages of the host still run
    #: (orchestrator.run.early): it only reads, answers in about a round trip, and reads
    #: nothing an earlier stage's check or apply hands over except through the host itself
    speculative_check: ClassVar[bool] = False
    #: its apply takes the host out of service (a server restart): behind a gateway the run's
    #: gate takes the host out of rotation first (orchestrator.run.fleet)
    disruptive: ClassVar[bool] = False

    def __init_subclass__(cls, kind: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if kind:
            if kind in Stage.registry and Stage.registry[kind] is not cls:
                raise TypeError(f"stage kind {kind!r} registered twice")
            cls.kind = kind
            Stage.registry[kind] = cls

    def __init__(self, params: BaseModel) -> None:
        self.params = params

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        """Look at the host (read-only) and say whether apply is needed."""
        return Needed("no check defined")

    def apply(self, host: Host, ctx: StageContext, plan: Any = None) -> None:
        """Make the change (`plan`: the Needed.plan of check(), None when called alone)."""
        raise NotImplementedError

    def verify(self, host: Host, ctx: StageContext) -> None:
        """After apply: raise StageError unless the host is now converged."""


def inventory_groups(inventory: Any) -> dict[str, list[str]]:
    """Every group of an inventory (its `groups:` and those its hosts name) -> member hosts."""
    names = dict.fromkeys([*inventory.groups, *(g for h in inventory.hosts.values()
                                                 for g in h.groups)])
    return {g: inventory.group_members(g) for g in names}


def stage_kinds() -> dict[str, type[Stage]]:
    """All registered stage kinds (imports the built-in ones first)."""
    import orchestrator.stages  # noqa: F401  (registers built-in kinds)

    return dict(Stage.registry)
