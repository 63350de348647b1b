"""The generic `shell` stage kind: run a command unless a check says it is already done.

    - id: make-dir
      run: mkdir -p {{ workdir }}
      check: test -d {{ workdir }}       # exit 0 = already done, `run` is skipped

    - id: same-thing
      uses: shell
      with:
        command: mkdir -p /srv/app
        creates: /srv/app                # converged when this path exists

A `run:` stage is this kind, with `command` = the rendered `run` (template values shell-quoted);
under `uses: shell`, `with: command` and `with: check` are rendered the same way.
Without `check` or `creates` the stage always runs and always reports "changed".
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.errors import CommandFailed, StageError
from orchestrator.host import Host
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext


class ShellParams(Params):
    """Parameters of the shell kind."""

    command: str = Field(description="shell command run with /bin/sh -c on the host")
    check: str | None = Field(None, description="command whose exit 0 means already done")
    creates: str | None = Field(None, description="path whose existence means already done")
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    become: bool = False


class ShellStage(Stage, kind="shell"):
    """Run a shell command, idempotent through `check` or `creates`."""

    Params = ShellParams
    params: ShellParams
    shell_params = frozenset({"command", "check"})

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        p = self.params
        if p.creates:
            info = host.probe("path", path=p.creates)
            if info.get("exists"):
                return Converged(f"{p.creates} exists")
        if p.check:
            r = host.run(p.check, timeout=ctx.timeout, env=p.env, cwd=p.cwd, become=p.become)
            if r.ok:
                return Converged("check passed")
            return Needed(f"check exited {r.exit_code}")
        if p.creates:
            return Needed(f"{p.creates} does not exist")
        return Needed("no check: always runs")

    def apply(self, host: Host, ctx: StageContext) -> None:
        p = self.params
        result = host.run(
            p.command, timeout=ctx.timeout, env=p.env, cwd=p.cwd, become=p.become,
            on_output=lambda _stream, text: ctx.progress(text.rstrip().rsplit("\n", 1)[-1]),
        )
        ctx.record("exit_code", result.exit_code)
        if not result.ok:
            raise CommandFailed(result, what=f"stage {ctx.spec.id}")

    def verify(self, host: Host, ctx: StageContext) -> None:
        p = self.params
        if p.check:
            r = host.run(p.check, timeout=ctx.timeout, env=p.env, cwd=p.cwd, become=p.become)
            if not r.ok:
                raise StageError(
                    f"stage {ctx.spec.id}: the command succeeded but its check still fails "
                    f"(exit {r.exit_code}): {p.check}",
                    hint="make `check` test exactly what `run` produces",
                )
        if p.creates and not host.probe("path", path=p.creates).get("exists"):
            raise StageError(f"stage {ctx.spec.id}: {p.creates} was not created by the command")
