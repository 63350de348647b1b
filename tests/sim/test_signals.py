"""SIGTERM -> threading.Event without a deadlock (orchestrator_sim.signals and the stand-in's copy).

A CI run showed `stop` SIGKILL the stand-in server after its 10 s grace: the supervisor forwards the
SIGTERM the process group already got, the second handler ran while the main thread held the stop
event's lock (just woken from `stop.wait()` by the first), and `stop.set()` waited on itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import orchestrator_sim

STANDINS = Path(orchestrator_sim.__file__).parent / "standins"

# The main thread holds the event's lock (as inside event.wait()) when the signal arrives.
SCRIPT = """
import os, signal, sys, threading, time
sys.path.insert(0, {path!r})
{setup}
ev = threading.Event()
set_on_signals(ev, (signal.SIGTERM,))
with ev._cond:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)  # the Python-level handler runs here, in the main thread
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)
print("set" if ev.wait(10) else "not set", flush=True)
"""

HELPERS = {
    "orchestrator_sim.signals": "from orchestrator_sim.signals import set_on_signals",
    "sglang stand-in": "from sglang.srt.utils import set_on_signals",
    # the naive handler, to show the script reproduces the hazard
    "naive": "def set_on_signals(ev, sigs):\n"
             "    for s in sigs: signal.signal(s, lambda *a: ev.set())",
}


def _run(helper: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    code = SCRIPT.format(path=str(STANDINS), setup=HELPERS[helper])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("helper", ["orchestrator_sim.signals", "sglang stand-in"])
def test_a_signal_while_the_main_thread_holds_the_events_lock_sets_it(helper: str) -> None:
    r = _run(helper)
    assert r.returncode == 0 and r.stdout == "set\n", r.stderr


def test_the_naive_handler_deadlocks_in_that_moment() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        _run("naive", timeout=3)
