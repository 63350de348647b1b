"""The Result of one command run on a host."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Result:
    """What one command did: its command line, exit code, separate stdout/stderr, duration."""

    command: str
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    host: str | None = None
    timed_out: bool = False
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        """True when the command exited 0 and did not time out."""
        return self.exit_code == 0 and not self.timed_out

    def tail(self, n: int = 20) -> str:
        """The last n lines of output (stderr after stdout), for error messages."""
        lines = (self.stdout.rstrip("\n") + "\n" + self.stderr.rstrip("\n")).strip("\n")
        return "\n".join(lines.splitlines()[-n:])
