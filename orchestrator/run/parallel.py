"""A plain deploy's schedule: every host at once (up to --forks), each walked on a thread of its
own (orchestrator.run.walk); Ctrl-C in the calling thread cancels cleanly."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.run.state import Outcome, RunState
from orchestrator.run.walk import HostWalker

if TYPE_CHECKING:
    from orchestrator.preconnect import Preconnect


class ParallelRun:
    """Runs a rendered plan on all its hosts in parallel and publishes what happens."""

    def __init__(self, state: RunState, preconnected: Preconnect | None = None) -> None:
        self.state = state
        self.walker = HostWalker(state, preconnected)

    def run(self) -> Outcome:
        """Walk every host; the outcome."""
        t0 = self.state.started()
        try:
            self.walker.walk_all(list(self.state.plan.hosts))
        except KeyboardInterrupt:
            pass  # the run was cancelled: the outcome says so (exit 130)
        finally:
            self.walker.close()
        return self.state.finished(t0)
