"""The API a stage uses to act on one host.

A `Host` wraps a transport with the host's name and resolved variables. Stages never touch
paramiko or Fabric: they call `run`, `read_file`, `write_file`, `probe` / `fact` (reads) and
`act` (the named actions of orchestrator.remote.actions, which change the host) here. Everything
that changes the host (`run`, `write_file`, `act`) is refused once the run is cancelled (Ctrl-C).
"""

from __future__ import annotations

import contextvars
import json
import shlex
import threading
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.config.model import HostSpec
from orchestrator.errors import CommandFailed, Interrupted
from orchestrator.facts import F
from orchestrator.result import Result
from orchestrator.transports import AgentTransport, OutputCallback


class Host:
    """One host as seen by stages: name, spec, vars, and the transport to reach it."""

    def __init__(
        self,
        spec: HostSpec,
        transport: AgentTransport,
        variables: Mapping[str, Any],
        observer: Callable[[Result], None] | None = None,
        cancelled: threading.Event | None = None,
    ):
        self.spec = spec
        self.name = spec.name
        self.transport = transport
        self.vars = dict(variables)
        self._observer = observer
        self._cancelled = cancelled

    def _refuse_if_cancelled(self, what: str) -> None:
        # Ctrl-C kills the commands running at that moment; one a stage would start after it
        # (its apply after a killed check, the next step of a loop) must not start at all
        if self._cancelled is not None and self._cancelled.is_set():
            raise Interrupted(f"interrupted (Ctrl-C): {what} not started")

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        become: bool = False,
        check: bool = False,
        what: str | None = None,
        hint: str | None = None,
        on_output: OutputCallback | None = None,
    ) -> Result:
        """Run a shell command; with `check=True` a non-zero exit raises CommandFailed."""
        self._refuse_if_cancelled(f"command `{command[:80]}`")
        result = self.transport.run(
            command, timeout=timeout, env=env, cwd=cwd, stdin=stdin, become=become,
            on_output=on_output,
        )
        if self._observer is not None:
            self._observer(result)
        if check and not result.ok:
            raise CommandFailed(result, what=what, hint=hint)
        return result

    def run_argv(self, argv: list[str], **kwargs: Any) -> Result:
        """Run a command given as an argument list; every element is shell-quoted."""
        return self.run(shlex.join(argv), **kwargs)

    def read_file(self, path: str) -> bytes | None:
        """File bytes, or None when absent."""
        return self.transport.read_file(path)

    def read_text(self, path: str) -> str | None:
        """File text (UTF-8), or None when absent."""
        data = self.read_file(path)
        return None if data is None else data.decode("utf-8", errors="replace")

    def read_json(self, path: str) -> Any | None:
        """Parsed JSON file, or None when absent."""
        text = self.read_text(path)
        return None if text is None else json.loads(text)

    def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        """Write a file atomically (temp + fsync + rename)."""
        if isinstance(data, str):
            data = data.encode()
        self._refuse_if_cancelled(f"write of {path}")
        self.transport.write_file(path, data, mode)

    def probe(self, name: str, /, **args: Any) -> Any:
        """Run a named read-only probe on the host and return its JSON value."""
        return self.transport.probe(name, **args)

    def act(self, name: str, /, **args: Any) -> Any:
        """Run a named action (it changes the host: server start/stop, process stop, ...) and
        return its JSON value; refused once the run is cancelled."""
        self._refuse_if_cancelled(f"action {name}")
        return self.transport.act(name, **args)

    def fact(self, cls: type[F], /, **args: Any) -> F:
        """Read one typed fact (orchestrator.facts): its probe's answer, parsed by the class."""
        return cls.from_answer(self.transport.probe(cls.probe, **args))

    def facts(self, *wanted: tuple[type[Any], dict[str, Any]]) -> list[Any]:
        """Several facts, `(FactClass, probe args)` each, in that order. Their probes are asked
        at once (the agent serves requests concurrently), so N reads cost about one round trip;
        the first error raises, as `fact` would."""
        if len(wanted) < 2:
            return [self.fact(cls, **args) for cls, args in wanted]
        out: list[Any] = [None] * len(wanted)
        errors: list[BaseException | None] = [None] * len(wanted)

        def one(i: int) -> None:
            cls, args = wanted[i]
            try:
                out[i] = self.fact(cls, **args)
            except BaseException as exc:  # noqa: BLE001 - raised below, in the caller
                errors[i] = exc

        # each in a copy of this context: the log lines keep their host and stage
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(one, i),
                                    daemon=True) for i in range(1, len(wanted))]
        for t in threads:
            t.start()
        one(0)
        for t in threads:
            t.join()
        for exc in errors:
            if exc is not None:
                raise exc
        return out

    def __repr__(self) -> str:
        return f"Host({self.name!r})"
