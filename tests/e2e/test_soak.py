"""The soak (scripts/soak.py, `make soak`): deploy -> reboot -> deploy cycles on 4 simulated hosts
with ssh-flaky on, every deploy in one process so the orchestrator's own memory, file descriptors
and threads are measured across cycles.

`pytest -m soak tests/e2e/test_soak.py` runs a short soak (3 cycles, ~2 min) through the script's
`main` and checks its report; the verdict rules themselves are checked in the default run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.scripts import load_script

soak = load_script("soak")


def cycle(n: int, *, ok: bool = True, rss: int = 80_000, fds: int = 6, stray: int = 0):
    brief = {"retries": 0, "waits": 0}
    return soak.Cycle(n, ok, brief, brief, rss, fds, 3, 8 + stray, stray, 10.0)


NOTHING_LEFT: dict[str, list[int]] = {"host_processes": [], "daemon": [], "children": []}


def test_flat_figures_pass() -> None:
    # a little noise, no trend: passes
    records = [cycle(i, rss=80_000 + (i % 3) * 100) for i in range(1, 21)]
    report = soak.summarize(records, NOTHING_LEFT, 1.0, 256.0)
    assert report["passed"], report["reasons"]
    assert report["failures"] == 0 and report["leftovers"] == 0
    assert report["fds"]["growth_after_warmup"] == 0


@pytest.mark.parametrize(("records", "leftovers", "reason"), [
    ([cycle(i, ok=i != 7) for i in range(1, 11)], NOTHING_LEFT, "1 failed cycle(s): [7]"),
    ([cycle(i) for i in range(1, 11)], dict(NOTHING_LEFT, host_processes=[4242]),
     "1 leftover process"),
    ([cycle(i, fds=6 + (i > 8)) for i in range(1, 11)], NOTHING_LEFT, "open fds grew by 1"),
    # 1 MiB per cycle over the second half, flat in the first: a leak
    ([cycle(i, rss=80_000 + max(0, i - 10) * 1024) for i in range(1, 21)], NOTHING_LEFT,
     "RSS grows 1024 KiB per cycle"),
    ([cycle(i, stray=int(i == 10)) for i in range(1, 11)], NOTHING_LEFT, "1 stray process"),
])
def test_each_rule_fails_the_soak(records: list, leftovers: dict, reason: str) -> None:
    report = soak.summarize(records, leftovers, 1.0, 256.0)
    assert not report["passed"]
    assert any(reason in r for r in report["reasons"]), report["reasons"]
    assert "FAILED" in soak.render(report)


def test_a_short_soak_reports_rss_without_judging_it() -> None:
    records = [cycle(i, rss=70_000 + i * 2048) for i in range(1, 4)]  # still warming up
    report = soak.summarize(records, NOTHING_LEFT, 1.0, 256.0)
    assert report["passed"], report["reasons"]
    assert not report["rss_mib"]["judged"]
    assert report["rss_mib"]["slope_kib_per_cycle_second_half"] == 2048.0
    assert "not judged" in soak.render(report)


def test_rss_warm_up_in_the_first_half_is_not_a_leak() -> None:
    records = [cycle(i, rss=70_000 + min(i, 5) * 2048) for i in range(1, 21)]
    report = soak.summarize(records, NOTHING_LEFT, 1.0, 256.0)
    assert report["passed"], report["reasons"]
    assert report["rss_mib"]["growth"] == 8.0  # 2 MiB x 4 cycles of warm-up


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_short_soak_has_no_failures_no_leftovers_and_flat_fds(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    code = soak.main(["--cycles", "3", "--time-scale", "0.001", "--dir", str(tmp_path / "work"),
                      "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["cycles"] == 3
    assert report["failures"] == 0, [c["first"]["errors"] + c["second"]["errors"]
                                      for c in report["cycles_detail"]]
    assert report["leftovers"] == 0, report["leftover_pids"]
    assert report["fds"]["growth_after_warmup"] <= 0, report["fds"]
    assert report["stray_host_procs"]["last"] == 0
    assert report["threads"]["max"] < 50, report["threads"]  # threads do not pile up
    # every cycle really rebooted the boxes: the second deploy waited for SSH on each host
    for c in report["cycles_detail"]:
        assert c["second"]["waits"] >= 4, c["second"]
        assert {"health", "server", "ready"} <= set(c["second"]["changed"]), c["second"]
    assert code == 0, report["reasons"]
