"""Connections opened while a deploy is still being prepared.

Which hosts a deploy touches, and how each is reached, can be told from the inventory and the
playbook as written: the inventory's hosts (with its `defaults:`), --limit, and the `hosts:` of
the playbook and of its stages. Opening a host's connection (the SSH handshake, then the agent's
start) takes ~0.25 s, mostly waiting on the host. So the command line starts the first hosts'
connections right after it parsed its flags: it reads both files raw (PyYAML's safe loader, the
C one when there is one), validates the inventory's hosts with the inventory's own models
(orchestrator.config.model: HostSpec's fields and defaults, nothing copied), and starts one
thread per host; the loader, templating and the stages are imported, and the playbook validated
and rendered, while the hosts answer.

When the runner reaches a host it claims its connection (`Preconnect.claim`): it is used only
when the loaded host is reached the same way (every setting but its vars), else it is closed and
the runner connects as it always did. What nobody claims (the plan left the host out, the run
stopped early) is closed by `close()`.

Only the first `forks` hosts are opened early (the runner works on that many at a time; the
others connect when their turn comes). Anything unusual means no early connection: a file that
is not plainly our YAML format (an Ansible inventory), a `hosts:` that is not plain names and
patterns, --only/--skip/--from, a --limit that matches nothing; and, for one host, a setting
that is templated or tagged (`!env`). Every check and error message stays the plan's.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from orchestrator import logs
from orchestrator.errors import OrchestratorError
from orchestrator.selection import resolve_hosts

if TYPE_CHECKING:
    from orchestrator.config.model import HostSpec, Inventory
    from orchestrator.options import RunOptions
    from orchestrator.selection import HostTable, Selection

OnWait = Callable[[int, float, BaseException], None]


#: a value behind a YAML tag (`!env NAME`): known only once the inventory is loaded
_OPAQUE = object()


@functools.cache
def _loader() -> Any:
    """PyYAML's safe loader (the C one when built) that reads any tag as `_OPAQUE`."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = type("_Loader", (base,), {})
    loader.add_multi_constructor("!", lambda _loader, _suffix, _node: _OPAQUE)
    return loader


def _raw_yaml(path: str) -> Any:
    """PATH's YAML as plain data (tagged values are `_OPAQUE`); ValueError when unreadable."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.load(fh, Loader=_loader())  # noqa: S506 - a safe loader's subclass
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(str(exc)) from None


def read_inventory(path: str) -> tuple[Inventory, set[str]] | None:
    """PATH read raw and validated with the inventory's own models (`defaults:` applied, the
    hosts' vars left out), and the hosts whose settings are written plainly (no template, no
    tag): only those can be reached before loading. None when PATH is not plainly our format or
    does not validate so (an Ansible inventory, a tag where a setting must be text...): the
    loader then says what it is."""
    from orchestrator.config.model import Inventory

    try:
        data = _raw_yaml(path)
        defaults = data.get("defaults") or {}
        hosts, plain = {}, set()
        for name, spec in data["hosts"].items():
            entry = {k: v for k, v in {**defaults, **(spec or {})}.items() if k != "vars"}
            if _plain(entry):
                plain.add(name)
            else:  # reached as the loaded inventory says; its groups still count
                entry = {k: v for k, v in entry.items() if k == "groups"}
            hosts[name] = {**entry, "name": name}
        return Inventory.model_validate({"hosts": hosts, "groups": data.get("groups") or {}}), plain
    except (ValueError, TypeError, AttributeError, KeyError):  # pydantic's ValidationError too
        return None


def _plain(value: Any) -> bool:
    """VALUE is what it will be once loaded: no template and no tag in it."""
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    templated = isinstance(value, str) and ("{{" in value or "{%" in value)
    return value is not _OPAQUE and not templated


def _reached_as(spec: HostSpec) -> dict[str, Any]:
    """How a host is reached: all of its settings but its vars (data the early read leaves out)."""
    return spec.model_dump(exclude={"vars"})


def for_deploy(playbook: str, inventory: str, selection: Selection,
               options: RunOptions) -> Preconnect | None:
    """The early connections of a deploy (None when it opens none): not for a stage selection
    (which may drop hosts), nor when `options.preconnect` is off."""
    if not options.preconnect or selection.only or selection.from_ or selection.skip:
        return None
    read = read_inventory(inventory)
    if read is None:
        return None
    inv, plain = read
    names = early_hosts(playbook, inv, selection.limit)[:max(1, options.forks)]
    specs = [inv.hosts[name] for name in names if name in plain]
    if not specs:
        return None
    from orchestrator.transports import make_transport

    return Preconnect(specs, functools.partial(make_transport, read_only=options.dry_run),
                      budget=lambda spec: max(options.wait_for_host, spec.wait_for_host or 0.0))


def early_hosts(playbook_path: str, inventory: HostTable, limit: list[str] | None) -> list[str]:
    """The hosts a deploy of PLAYBOOK on INVENTORY (with --limit LIMIT) runs on, in the plan's
    order, read from the playbook's YAML without validating it; [] when that cannot be told
    cheaply. orchestrator.plan.build_plan decides the same way: a stage runs on its `hosts:`,
    else on the playbook's, else everywhere."""
    try:
        data = _raw_yaml(playbook_path)
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
    except (OrchestratorError, TypeError, ValueError, AttributeError):
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
        self._specs = {spec.name: spec for spec in specs}
        self._pending: dict[str, Future[Any]] = {}
        self._waits: dict[str, list[tuple[int, float, BaseException]]] = {}
        self._relay: dict[str, OnWait] = {}
        logs.hold()  # what the connections log before the run exists goes to the run
        for spec in specs:
            fut: Future[Any] = Future()
            self._pending[spec.name] = fut
            threading.Thread(target=self._open, args=(spec, fut, factory, budget(spec)),
                             name=f"preconnect-{spec.name}", daemon=True).start()

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
            transport = factory(spec, on_wait=on_wait)
            transport.connect(budget=budget)
        except BaseException as exc:  # noqa: BLE001 - handed to the claimer
            fut.set_exception(exc)
            return
        with self._lock:
            unwanted = self._closed and spec.name not in self._relay
        if unwanted:
            transport.close()
        fut.set_result(transport)

    def claim(self, host: str, spec: HostSpec, on_wait: OnWait) -> Future[Any] | None:
        """HOST's connection attempt (its result: the connected transport, or the error that
        ended it), or None when it was not opened early, or opened otherwise than SPEC, the
        validated host, says (that one is closed). The attempt's waits so far are told to
        ON_WAIT now, later ones as they happen; the transport takes SPEC as its own."""
        with self._lock:
            fut = self._pending.pop(host, None)
            if fut is None:
                return None
            if _reached_as(spec) != _reached_as(self._specs[host]):
                fut.add_done_callback(_close_result)
                return None
            self._relay[host] = on_wait
            waited = self._waits.pop(host, [])
        for attempt, elapsed, error in waited:
            on_wait(attempt, elapsed, error)
        fut.add_done_callback(lambda f: _adopt_spec(f, spec))
        return fut

    def close(self) -> None:
        """Close the connections nobody claimed (one still opening: when it is open). Their log
        lines, if no run took them (`logs.configure`), go to stderr (`logs.release`)."""
        with self._lock:
            self._closed = True
            left, self._pending = list(self._pending.values()), {}
        for fut in left:
            if fut.done():
                _close_result(fut)
        logs.release()


def _close_result(fut: Future[Any]) -> None:
    if fut.exception() is None:
        fut.result().close()


def _adopt_spec(fut: Future[Any], spec: HostSpec) -> None:
    if fut.exception() is None:
        fut.result().spec = spec
