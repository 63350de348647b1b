"""Connections opened while a deploy is still being prepared.

Which hosts a deploy touches, and how each is reached, can be read from the inventory and the
playbook as written, before either is validated: the inventory's hosts (with its `defaults:`),
--limit, and the `hosts:` of the playbook and of its stages. Opening a host's connection (the
SSH handshake, then the agent's start) takes ~0.25 s, mostly waiting on the host. So the command
line starts the first hosts' connections right after it parsed its flags: it reads both files
raw (PyYAML's safe loader, the C one when there is one), imports the transports (paramiko and
Fabric, no pydantic) and starts one thread per host, and only then imports the configuration
models, validates, renders and imports the stages, while the hosts answer.

What was read raw is checked against what validation says when the runner claims a host's
connection (`Preconnect.claim`): the connection settings read early (`EarlySpec`) must equal the
validated host's, else the early connection is closed and the runner connects as it always
did. What nobody claims (the validated plan left the host out, the run stopped early) is closed
by `close()`.

Only the first `forks` hosts are opened early (the runner works on that many at a time; the
others connect when their turn comes). Anything unusual means no early connection: a file that
is not our YAML format (an Ansible inventory), a `hosts:` that is not plain names and patterns,
--only/--skip/--from, a --limit that matches nothing; and, for one host, a connection setting
that is templated, tagged (`!env`) or of an unexpected type. Every check and error message
stays the plan's.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from orchestrator import logs
from orchestrator.config.durations import parse_duration
from orchestrator.errors import OrchestratorError
from orchestrator.selection import members, resolve_hosts

if TYPE_CHECKING:
    from orchestrator.config.model import HostSpec
    from orchestrator.options import RunOptions
    from orchestrator.selection import HostTable, Selection

OnWait = Callable[[int, float, BaseException], None]


@dataclass(frozen=True)
class EarlySpec:
    """How to reach one host, read from the inventory before it is validated: the fields of
    orchestrator.config.model.HostSpec that the transports use, with HostSpec's defaults."""

    name: str
    address: str | None = None
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    connection: str = "ssh"
    host_key_policy: str = "strict"
    known_hosts: str | None = None
    ssh_config: str | None = None
    connect_timeout: float = 10.0
    connect_budget: float = 600.0
    wait_for_host: float | None = None
    become_password: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, spec: HostSpec | EarlySpec) -> EarlySpec:
        """The same fields of a validated HostSpec."""
        return cls(**{f.name: getattr(spec, f.name) for f in fields(cls)})

    @classmethod
    def read(cls, name: str, raw: Mapping[str, Any]) -> EarlySpec | None:
        """From a host's settings as written (its `defaults:` applied); None when one of them is
        not plainly what validation would take as is (a template, a tag, another type)."""
        values: dict[str, Any] = {"name": name}
        for f in fields(cls):
            if f.name == "name" or f.name not in raw:
                continue
            value = raw[f.name]
            if value is None:
                pass
            elif f.name in _DURATIONS:
                try:
                    value = parse_duration(value)
                except ValueError:
                    return None
            elif f.name == "port":
                if type(value) is not int or not 1 <= value <= 65535:
                    return None
            elif f.name in _CHOICES:
                if value not in _CHOICES[f.name]:
                    return None
            elif not isinstance(value, str) or "{{" in value or "{%" in value:
                return None
            values[f.name] = value
        for f in ("connection", "host_key_policy", "connect_timeout", "connect_budget"):
            if values.get(f, "") is None:
                return None  # validation refuses null here
        return cls(**values)


_DURATIONS = ("connect_timeout", "connect_budget", "wait_for_host")
_CHOICES = {"connection": ("ssh", "local"), "host_key_policy": ("strict", "accept-new")}


class _Opaque:
    """A value behind a YAML tag (`!env NAME`): known only once the inventory is loaded."""


_OPAQUE = _Opaque()


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


class RawInventory:
    """An inventory file of ours as written: each host's settings with `defaults:` applied, and
    the groups, enough to tell a deploy's hosts (orchestrator.selection.HostTable)."""

    def __init__(self, source: str, hosts: dict[str, dict[str, Any]],
                 groups: dict[str, list[str]]) -> None:
        self._source = source
        self._hosts = hosts
        self._groups = groups
        self._host_groups = {n: h["groups"] for n, h in hosts.items()}

    @classmethod
    def read(cls, path: str) -> RawInventory | None:
        """PATH read raw; None when it is not plainly our format (leave it to the loader)."""
        try:
            data = _raw_yaml(path)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict):
            return None
        defaults = data.get("defaults") or {}
        groups = data.get("groups") or {}
        if not isinstance(defaults, dict) or not isinstance(groups, dict):
            return None
        hosts: dict[str, dict[str, Any]] = {}
        for name, spec in data["hosts"].items():
            spec = {} if spec is None else spec
            if not isinstance(name, str) or not isinstance(spec, dict):
                return None
            merged = {**defaults, **spec}
            names = _names(merged.get("groups"))
            if names is None:
                return None
            hosts[name] = {**merged, "groups": names}
        listed: dict[str, list[str]] = {}
        for name, group in groups.items():
            group = {} if group is None else group
            names = _names(group.get("hosts")) if isinstance(group, dict) else None
            if names is None:
                return None
            listed[name] = names
        return cls(path, hosts, listed)

    @property
    def hosts(self) -> dict[str, dict[str, Any]]:
        """Host name -> its settings as written (`defaults:` applied)."""
        return self._hosts

    @property
    def source(self) -> str | None:
        """The file it was read from."""
        return self._source

    def group_names(self) -> set[str]:
        """Every group: those under `groups:` and those hosts name."""
        return set(self._groups) | {g for gs in self._host_groups.values() for g in gs}

    def group_members(self, group: str) -> list[str]:
        """Host names in a group."""
        return members(group, self._groups.get(group, []), self._host_groups)

    def spec(self, name: str) -> EarlySpec | None:
        """How to reach host NAME, when its settings can be told before validation."""
        return EarlySpec.read(name, self._hosts[name])


def _names(value: Any) -> list[str] | None:
    """A name or a list of names as written (None/absent: []), as the models' `_one_or_many`
    validators take them; None when it is something else."""
    names = [value] if isinstance(value, str) else (value or [])
    return names if isinstance(names, list) and all(isinstance(n, str) for n in names) else None


def for_deploy(playbook: str, inventory: str, selection: Selection, options: RunOptions,
               rolling: bool) -> Preconnect | None:
    """The early connections of a deploy (None when it opens none): not for a rolling redeploy
    (it orders hosts itself) or a stage selection (which may drop hosts), nor when
    `options.preconnect` is off."""
    if not options.preconnect or rolling or selection.only or selection.from_ or selection.skip:
        return None
    raw = RawInventory.read(inventory)
    if raw is None:
        return None
    names = early_hosts(playbook, raw, selection.limit)[:max(1, options.forks)]
    specs = [s for s in map(raw.spec, names) if s is not None]
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

    def __init__(self, specs: list[EarlySpec] | list[HostSpec], factory: Callable[..., Any],
                 budget: Callable[[Any], float]) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._specs = {spec.name: EarlySpec.of(spec) for spec in specs}
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

    def _open(self, spec: Any, fut: Future[Any], factory: Callable[..., Any],
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
            if EarlySpec.of(spec) != self._specs[host]:
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
