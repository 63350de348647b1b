"""A deploy as a library call: load, plan, run, and write the run record.

`deploy()` assembles the session the `deploy` and `plan` commands use: the event bus, the
events.jsonl writer, the run record (summary.json), the log routing, the runner, the pin file
(deploy.lock.json) and the `runs/latest` link. Callers add their own `EventHandler`s (the CLI's
console view, a test's collector); a handler that also has `on_log` receives the log lines.

    outcome = deploy("playbooks/kimi-k2.6-eagle3.yaml", ".sim/try/inventory.yaml")
    outcome.exit_code, outcome.summary.hosts["gpu-1"].stages["server"].status

Nothing here prints: rendering lives in cli/.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import Interrupted, OrchestratorError
from orchestrator.events import (
    EventBus,
    EventHandler,
    JsonlWriter,
    LogHandler,
    RunLog,
    new_run_id,
)
from orchestrator.logs import configure
from orchestrator.options import RunOptions
from orchestrator.pinfile import PinFile, build_pin, load_pin, write_pin
from orchestrator.plan import Plan, Selection, build_plan, render_plan
from orchestrator.redact import REDACTOR
from orchestrator.status import Status
from orchestrator.summary import RunRecord, RunSummary

if TYPE_CHECKING:
    from orchestrator.preconnect import Preconnect


@dataclass(frozen=True)
class DeployStart:
    """What is about to run (handed to `on_start` once every stage is rendered)."""

    run_id: str
    playbook: str
    hosts: list[str]
    nodes: int
    dry_run: bool
    run_dir: Path
    #: the pin file (--locked) comes from a deploy that did not complete
    pin_incomplete: bool = False
    #: cli_vars that no vars layer defines and no template reads -> the nearest known name
    unknown_vars: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class DeployOutcome:
    """What a deploy did: its exit code, the summary (summary.json) and where it wrote."""

    run_id: str
    exit_code: int
    summary: RunSummary
    run_dir: Path

    @property
    def summary_path(self) -> Path:
        """runs/<id>/summary.json"""
        return self.run_dir / "summary.json"

    @property
    def events_path(self) -> Path:
        """runs/<id>/events.jsonl"""
        return self.run_dir / "events.jsonl"

    @property
    def pin_path(self) -> Path | None:
        """The pin file runs/<id>/deploy.lock.json, when the deploy wrote one."""
        path = self.run_dir / "deploy.lock.json"
        return path if path.exists() else None

    def statuses(self, host: str) -> dict[str, Status]:
        """Stage id -> status on one host."""
        return {sid: st.status for sid, st in self.summary.hosts[host].stages.items()}


class _Session:
    """The files and routing of one run: events.jsonl, summary.json, the log sink."""

    def __init__(self, run_dir: Path, playbook: str, inventory: str, dry_run: bool,
                 handlers: Sequence[EventHandler], verbose: bool) -> None:
        self.base = run_dir
        self.run_id = new_run_id()
        self.dir = run_dir / self.run_id
        self.bus = EventBus(self.run_id)
        self.writer = JsonlWriter(self.dir / "events.jsonl")
        self.record = RunRecord(self.run_id, playbook, inventory, dry_run=dry_run)
        self.dry_run = dry_run
        self.bus.add_sink(self.writer)
        self.bus.subscribe(self.record)
        for handler in handlers:
            self.bus.subscribe(handler)
        log_handlers = [h for h in handlers if isinstance(h, LogHandler)]
        configure(RunLog(self.run_id, [self.writer], log_handlers), verbose=verbose)

    def close(self, exit_code: int) -> None:
        """Write summary.json and the pin file, close events.jsonl, link runs/latest."""
        self.record.finish(exit_code)
        self.record.write(self.dir / "summary.json")
        pin = build_pin(self.record.summary)
        if not self.dry_run and pin.stages:
            write_pin(REDACTOR.redact(pin.to_json()), self.dir / "deploy.lock.json")
        self.writer.close()
        configure(None)
        _link_latest(self.base, self.run_id)


def deploy(
    playbook_path: str | os.PathLike[str],
    inventory_path: str | os.PathLike[str],
    *,
    cli_vars: dict[str, Any] | None = None,
    selection: Selection | None = None,
    options: RunOptions | None = None,
    pin_path: str | os.PathLike[str] | None = None,
    run_dir: str | os.PathLike[str] = "runs",
    handlers: Sequence[EventHandler] = (),
    verbose: bool = False,
    on_start: Callable[[DeployStart], None] | None = None,
    preconnected: Preconnect | None = None,
) -> DeployOutcome:
    """Run a playbook on an inventory's hosts; the run record goes to `run_dir/<run-id>/`.

    `options.dry_run` makes it a plan (checks only). `pin_path` is the pin (a deploy.lock.json) to
    hold the deploy to. Bad input raises ConfigError/PlanError (exit 2) before any host is
    touched; Ctrl-C (KeyboardInterrupt) and our errors still write the run record, then raise.
    A plan with a `gateway` stage restarts the replicas behind it at most
    `options.max_unavailable` at a time (orchestrator.run.fleet). `preconnected`: the run's
    first connections, already opening (`orchestrator.preconnect.for_deploy`, as the CLI starts
    them before importing this module); without them, deploy() opens them itself. Either way it
    closes the ones left.
    """
    REDACTOR.add_env(os.environ)
    cli_vars = dict(cli_vars or {})
    options = options or RunOptions()
    selection = selection or Selection.from_args(None, None, None, None)
    early = preconnected
    if early is None:
        from orchestrator.preconnect import for_deploy

        early = for_deploy(str(playbook_path), str(inventory_path), selection, options)
    try:
        # the stage kinds (and what they import) load while the first connections open
        import orchestrator.stages  # noqa: F401 - hands the stage kinds to config
        from orchestrator.config import load_all

        pb, inv = load_all(str(playbook_path), str(inventory_path), cli_vars)
        plan = build_plan(pb, inv, selection)
        pin = load_pin(pin_path) if pin_path else None
        if pin is not None:
            options = replace(options, pin=pin)
        session = _Session(Path(run_dir), str(playbook_path), str(inventory_path),
                           options.dry_run, handlers, verbose)
        exit_code = Interrupted.exit_code
        try:
            exit_code = _run(plan, session, cli_vars, options, pin, on_start, early)
        except OrchestratorError as exc:  # e.g. a ConfigError found rendering: not a Ctrl-C
            exit_code = exc.exit_code
            raise
        finally:
            session.close(exit_code)
    finally:
        if early is not None:
            early.close()
    return DeployOutcome(session.run_id, exit_code, session.record.summary, session.dir)


def _run(plan: Plan, session: _Session, cli_vars: dict[str, Any], options: RunOptions,
         pin: PinFile | None,
         on_start: Callable[[DeployStart], None] | None,
         early: Preconnect | None = None) -> int:
    from orchestrator.config.variables import unknown_variables
    from orchestrator.run.fleet import schedule
    from orchestrator.run.state import RunState
    from orchestrator.transports import make_transport

    # every node rendered for its host before any is touched (a ConfigError is exit 2);
    # a dry run's agents write nothing for themselves on the hosts (no code cache)
    state = RunState(render_plan(plan, cli_vars, REDACTOR), session.bus, options=options,
                     transport_factory=partial(make_transport, read_only=options.dry_run))
    runner = schedule(state, early)  # behind a gateway: at most max_unavailable replicas out
    if on_start is not None:
        on_start(DeployStart(
            run_id=session.run_id, playbook=plan.playbook.name, hosts=list(plan.hosts),
            nodes=plan.node_count, dry_run=options.dry_run, run_dir=session.dir,
            pin_incomplete=pin is not None and not pin.complete,
            unknown_vars=unknown_variables(plan.playbook, plan.inventory, cli_vars)))
    return runner.run().exit_code


def _link_latest(base: Path, run_id: str) -> None:
    link = base / "latest"
    try:
        tmp = base / f".latest-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(run_id)
        os.replace(tmp, link)
    except OSError:
        pass
