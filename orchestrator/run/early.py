"""Checks asked ahead of their turn on a host, used when nothing changed on it meanwhile.

On a converged host every stage's check finds nothing to do, yet each waits for the stage before
it (health, then venv, then packages, ...): one round trip after another. A check only reads, so
when the runner starts a host it asks the checks of the kinds that allow it
(`Stage.speculative_check`) all at once, over the host's one connection. When a stage's turn
comes, its early answer is used if it is Converged and no stage has applied a change on this host
since it was asked for (the host's epoch, raised before every apply); otherwise it is dropped and
the check runs again, in order, as before (so an apply always gets the plan of a check made in
its turn, and a kind may leave to that turn what only a Needed answer needs: `ctx.ahead`).
What an early check said (commands it ran, progress, its log lines, the facts it recorded) is
kept aside and told when the answer is used, in its stage's place in the run record; a dropped
answer tells nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from orchestrator.result import Result
from orchestrator.stages.base import CheckResult, Converged, StageContext


@dataclass
class EarlyCheck:
    """A check's answer asked ahead of its turn, and what it said meanwhile."""

    epoch: int
    verdict: CheckResult | None = None
    error: BaseException | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    commands: list[Result] = field(default_factory=list)
    progress: list[str] = field(default_factory=list)
    logs: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    check_s: float = 0.0

    def tell(self, observe: Callable[[Result], None], ctx: StageContext) -> None:
        """Say now, in the stage's own place, what the check said when it ran."""
        for result in self.commands:
            observe(result)
        for message in self.progress:
            ctx.progress(message)
        for method, event, kw in self.logs:
            getattr(ctx.log, method)(event, **kw)
        ctx.facts.update(self.facts)


class HeldLog:
    """A stage logger that keeps its lines (`ctx.log.warning(event, **kw)`) for later."""

    def __init__(self, held: EarlyCheck) -> None:
        self._held = held

    def __getattr__(self, method: str) -> Callable[..., None]:
        def keep(event: str, **kw: Any) -> None:
            self._held.logs.append((method, event, kw))
        return keep


class Speculation:
    """The early checks of one host's stages, all asked at once (on a pool of threads of its
    own): CHECKS[sid](held) runs SID's check, saying everything into `held`."""

    def __init__(self, epoch: Callable[[], int],
                 checks: dict[str, Callable[[EarlyCheck], CheckResult]]) -> None:
        self._epoch = epoch
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="early")
        self._futures = {sid: self._pool.submit(self._run, check, EarlyCheck(epoch()))
                         for sid, check in checks.items()}

    @staticmethod
    def _run(check: Callable[[EarlyCheck], CheckResult], held: EarlyCheck) -> EarlyCheck:
        t = time.monotonic()
        try:
            held.verdict = check(held)
        except Exception as exc:  # noqa: BLE001 - the check runs again in its turn
            held.error = exc
        held.check_s = round(time.monotonic() - t, 3)
        return held

    def take(self, sid: str) -> EarlyCheck | None:
        """SID's early answer, if it was asked and nothing changed on the host since; else
        None (the check then runs in its turn)."""
        fut = self._futures.pop(sid, None)
        if fut is None:
            return None
        held = fut.result()
        if not isinstance(held.verdict, Converged) or held.epoch != self._epoch():
            return None
        return held

    def close(self) -> None:
        """Drop what was not taken (a check still running finishes on its own)."""
        self._futures.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
