"""Connections opened while a deploy is still being prepared.

Which hosts a deploy touches is known before its playbook is validated and rendered: from the
inventory, --limit and the `hosts:` of the playbook and of its stages. Opening a host's connection
(the SSH handshake, then the agent's start) takes ~0.25 s, mostly waiting on the host; this starts
it right after the inventory is read, while this process goes on importing the stage kinds,
validating and rendering (~0.2 s). The runner claims each host's connection when it starts that
host (`Runner._first_connection`); what nobody claims (the validated plan left the host out, the
run stopped early) is closed by `close()`.

Only the first `forks` hosts are opened early (the runner works on that many at a time; the
others connect when their turn comes). Anything unusual (a playbook that does not parse, a
`hosts:` that is not plain names and patterns, --only/--skip/--from, a --limit that matches
nothing) means no early connections: the runner connects as it always did, and every check and
error message stays the plan's.

`start` returns once those connections are under way (each thread has imported its transport,
~0.15 s of paramiko, Fabric and invoke, and begun to connect). Until then the caller would only
slow them down: one thread at a time runs Python code, and what the caller does next (import
the stages, the console, the run record) is no more urgent than the connection.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from orchestrator import logs
from orchestrator.config.loader import load_inventory
from orchestrator.config.model import HostSpec, Inventory
from orchestrator.config.yamlsrc import load_yaml
from orchestrator.errors import OrchestratorError
from orchestrator.plan import resolve_hosts

if TYPE_CHECKING:
    from orchestrator.options import RunOptions
    from orchestrator.plan import Selection

OnWait = Callable[[int, float, BaseException], None]

#: the longest `Preconnect.start` waits for its connections to be under way
SETTLE_S = 2.0


def for_deploy(playbook: str, inventory: str, selection: Selection, options: RunOptions,
               rolling: bool) -> Preconnect | None:
    """The early connections of a deploy (None when it opens none): not for a rolling redeploy
    (it orders hosts itself) or a stage selection (which may drop hosts), nor when
    `options.preconnect` is off."""
    if not options.preconnect or rolling or selection.only or selection.from_ or selection.skip:
        return None
    return Preconnect.start(
        playbook, inventory, selection.limit, options.forks,
        budget=lambda spec: max(options.wait_for_host, spec.wait_for_host or 0.0))


def early_hosts(playbook_path: str, inventory: Inventory, limit: list[str] | None) -> list[str]:
    """The hosts a deploy of PLAYBOOK on INVENTORY (with --limit LIMIT) runs on, in the plan's
    order, read from the playbook's YAML without validating it; [] when that cannot be told
    cheaply. orchestrator.plan.build_plan decides the same way: a stage runs on its `hosts:`,
    else on the playbook's, else everywhere."""
    try:
        data = load_yaml(playbook_path).data
        stages = data.get("stages") if isinstance(data, dict) else None
        if not isinstance(stages, list) or not stages:
            return []
        default = _patterns(data.get("hosts"))
        targets = [_patterns(s.get("hosts")) if isinstance(s, dict) else default
                   for s in stages]
        hosts = resolve_hosts(limit, inventory, "--limit") if limit else list(inventory.hosts)
        wanted: set[str] = set()
        for patterns in (default if t is None else t for t in targets):
            if patterns is None:
                return hosts  # a stage that runs everywhere
            wanted.update(resolve_hosts(patterns, inventory, "hosts"))
        return [h for h in hosts if h in wanted]
    except (OrchestratorError, OSError, TypeError, ValueError, AttributeError):
        return []


def _patterns(value: Any) -> list[str] | None:
    """A `hosts:` value as patterns (None when absent); ValueError when templated or odd."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(x, str) and "{" not in x
                                              for x in items):
        raise ValueError("hosts: not plain names")
    return items


class Preconnect:
    """Connections to some hosts, opening in the background until the runner claims them."""

    def __init__(self, specs: list[HostSpec], factory: Callable[..., Any],
                 budget: Callable[[HostSpec], float]) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._pending: dict[str, Future[Any]] = {}
        self._waits: dict[str, list[tuple[int, float, BaseException]]] = {}
        self._relay: dict[str, OnWait] = {}
        self._starting = len(specs)
        self._underway = threading.Event()
        if not specs:
            self._underway.set()
        logs.hold()  # what the connections log before the run exists goes to the run
        for spec in specs:
            fut: Future[Any] = Future()
            self._pending[spec.name] = fut
            threading.Thread(target=self._open, args=(spec, fut, factory, budget(spec)),
                             name=f"preconnect-{spec.name}", daemon=True).start()

    @classmethod
    def start(cls, playbook_path: str, inventory_path: str, limit: list[str] | None,
              forks: int, budget: Callable[[HostSpec], float],
              factory: Callable[..., Any] | None = None) -> Preconnect | None:
        """Open the first FORKS hosts of a deploy early; None when no host can be told (a bad
        inventory is left for the full load to report). Returns when every connection is under
        way (`wait_underway`), at most SETTLE_S seconds after they started."""
        try:
            inventory = load_inventory(inventory_path)
        except (OrchestratorError, OSError):
            return None
        names = early_hosts(playbook_path, inventory, limit)[:max(1, forks)]
        if not names:
            return None
        if factory is None:
            from orchestrator.transports import make_transport as factory
        early = cls([inventory.hosts[n] for n in names], factory, budget)
        try:
            early.wait_underway(SETTLE_S)
        except BaseException:  # Ctrl-C while waiting: nobody will claim or close them
            early.close()
            raise
        return early

    def wait_underway(self, timeout: float) -> bool:
        """Wait until every connection is under way: its transport made (the transport modules
        imported) and connecting, or failed. False when TIMEOUT seconds passed first."""
        return self._underway.wait(timeout)

    def _one_underway(self) -> None:
        with self._lock:
            self._starting -= 1
            if self._starting <= 0:
                self._underway.set()

    @property
    def hosts(self) -> list[str]:
        """The hosts still waiting to be claimed."""
        with self._lock:
            return list(self._pending)

    def _open(self, spec: HostSpec, fut: Future[Any], factory: Callable[..., Any],
              budget: float) -> None:
        def on_wait(attempt: int, elapsed: float, error: BaseException) -> None:
            with self._lock:
                relay = self._relay.get(spec.name)
                if relay is None:
                    self._waits.setdefault(spec.name, []).append((attempt, elapsed, error))
            if relay is not None:
                relay(attempt, elapsed, error)

        try:
            try:
                transport = factory(spec, on_wait=on_wait)
            finally:
                self._one_underway()
            transport.connect(budget=budget)
        except BaseException as exc:  # noqa: BLE001 - handed to the claimer
            fut.set_exception(exc)
            return
        with self._lock:
            unwanted = self._closed and spec.name not in self._relay
        if unwanted:
            transport.close()
        fut.set_result(transport)

    def claim(self, host: str, on_wait: OnWait) -> Future[Any] | None:
        """HOST's connection attempt (its result: the connected transport, or the error that
        ended it), or None when it was not opened early. The attempt's waits so far are told
        to ON_WAIT now, later ones as they happen."""
        with self._lock:
            fut = self._pending.pop(host, None)
            if fut is None:
                return None
            self._relay[host] = on_wait
            waited = self._waits.pop(host, [])
        for attempt, elapsed, error in waited:
            on_wait(attempt, elapsed, error)
        return fut

    def close(self) -> None:
        """Close the connections nobody claimed (one still opening: when it is open). Their log
        lines, if no run took them (`logs.configure`), go to stderr (`logs.release`)."""
        with self._lock:
            self._closed = True
            left, self._pending = list(self._pending.values()), {}
        for fut in left:
            if fut.done() and fut.exception() is None:
                fut.result().close()
        logs.release()
