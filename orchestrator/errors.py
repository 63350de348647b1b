"""The one error tree of the orchestrator.

    OrchestratorError
    ├── ConfigError            bad playbook / inventory / model config (exit 2)
    ├── PlanError              the selection or the DAG is unusable (exit 2)
    ├── TransportError         talking to a host failed
    │   ├── ConnectError       could not (re)connect: refused, reset, unreachable, timed out
    │   │   └── TransientConnectError   worth retrying (host may be rebooting)
    │   ├── AuthError          authentication refused (never retried)
    │   ├── HostKeyError       unknown or changed host key (never retried)
    │   ├── ConnectionLost     the connection dropped while a command ran
    │   └── CommandTimeout     a command ran past its timeout (its process group was killed)
    ├── StageError             a stage could not converge
    │   ├── PreflightError     refused before doing anything (would fail later anyway)
    │   └── CommandFailed      a command exited non-zero; carries the Result
    ├── LockHeld               another deploy holds the host lock
    └── Interrupted            Ctrl-C

Every message is meant for an operator: it says what went wrong and, where we know, what to do.
Messages never carry secret values (the redactor is applied where they are rendered too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.result import Result


class OrchestratorError(Exception):
    """Root of every error the orchestrator raises on purpose."""

    exit_code = 1
    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint

    def render(self) -> str:
        """Return the message plus the hint, as printed for an operator."""
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


@dataclass(frozen=True)
class Location:
    """A place in a YAML file: 1-based line and column."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class ConfigProblem:
    """One problem found while loading configuration."""

    location: Location | None
    message: str
    hint: str | None = None

    def render(self) -> str:
        where = f"{self.location}: " if self.location else ""
        text = f"{where}{self.message}"
        if self.hint:
            text += f" (hint: {self.hint})"
        return text


class ConfigError(OrchestratorError):
    """One or more problems in a playbook, inventory or model config (all reported together)."""

    exit_code = 2

    def __init__(self, problems: list[ConfigProblem] | str) -> None:
        if isinstance(problems, str):
            problems = [ConfigProblem(None, problems)]
        self.problems = list(problems)
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in configuration:"
        super().__init__("\n".join([head, *("  " + p.render() for p in self.problems)]))


class PlanError(OrchestratorError):
    """The plan cannot be built: bad selection (--only/--from/--limit) or a dependency cycle."""

    exit_code = 2


class TransportError(OrchestratorError):
    """Talking to a host failed."""

    exit_code = 3

    def __init__(self, message: str, *, host: str | None = None, hint: str | None = None) -> None:
        self.host = host
        prefix = f"{host}: " if host else ""
        super().__init__(prefix + message, hint=hint)


class ConnectError(TransportError):
    """Could not connect to a host."""


class TransientConnectError(ConnectError):
    """A connection failure worth retrying: refused, reset, timed out, unreachable."""


class AuthError(ConnectError):
    """The host refused our credentials. Never retried."""


class HostKeyError(ConnectError):
    """The host key is unknown or has changed. Never retried."""


class ConnectionLost(TransientConnectError):
    """The connection dropped while a command was running."""


class CommandTimeout(TransportError):
    """A command ran past its timeout; its whole remote process group was killed."""

    exit_code = 1

    def __init__(self, message: str, *, host: str | None = None, result: Result | None = None):
        super().__init__(message, host=host)
        self.result = result


class StageError(OrchestratorError):
    """A stage could not converge."""

    exit_code = 1


class PreflightError(StageError):
    """Refused before doing anything, because it would fail later anyway."""


class CommandFailed(StageError):
    """A command exited non-zero. Carries the Result; renders the command, code and output tail."""

    def __init__(self, result: Result, *, what: str | None = None, hint: str | None = None):
        self.result = result
        head = what or "command failed"
        command = result.command
        if len(command) > 400:  # e.g. a whole embedded script: the start says what it was
            command = command[:400] + f"... ({len(result.command)} characters)"
        msg = (
            f"{head}: exit code {result.exit_code} after {result.duration:.1f}s\n"
            f"  command: {command}\n"
        )
        tail = result.tail(20)
        if tail:
            msg += "  output (last lines):\n" + "\n".join("    " + ln for ln in tail.splitlines())
        super().__init__(msg.rstrip(), hint=hint)


class LockHeld(OrchestratorError):
    """Another deploy holds the host's lock."""

    exit_code = 1


class Interrupted(OrchestratorError):
    """The operator pressed Ctrl-C."""

    exit_code = 130
