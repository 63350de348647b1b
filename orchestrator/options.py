"""RunOptions: the knobs of one run (the deploy command's flags), apart from the runner so that
the command line can build them without importing the runner, the stages and the transports."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.pinfile import PinFile


@dataclass
class RunOptions:
    """Knobs of one run (the deploy command's flags)."""

    forks: int = 16
    per_host: int = 4
    dry_run: bool = False
    wait_for_host: float = 10.0
    #: take nothing on trust from earlier runs (hf_download hashes every file again)
    verify: bool = False
    #: `--locked PINFILE`: the pin every stage is held to
    pin: PinFile | None = None
    sleep: Callable[[float], None] = time.sleep
    #: open the first hosts' connections while the run is still being prepared (preconnect)
    preconnect: bool = True
    #: `--max-unavailable N`: replicas behind a gateway out of rotation at once, whatever
    #: took them out (orchestrator.run.fleet); every deploy of a plan with a gateway stage
    max_unavailable: int = 1
