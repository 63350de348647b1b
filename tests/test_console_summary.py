"""The closing summary stays readable for a fleet: a stage x status table naming the hosts that
are not ok, and one highlights line, instead of a column and a line per host."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from orchestrator.cli.console import WIDE, highlights, summary_table
from orchestrator.summary import RunSummary


def record(hosts: int, failed: dict[str, str] | None = None) -> RunSummary:
    failed = failed or {}
    out: dict[str, Any] = {"run_id": "r1", "playbook": "pb.yaml", "inventory": "inv.yaml",
                           "hosts": {}}
    for i in range(1, hosts + 1):
        name = f"gpu-{i}"
        bad = failed.get(name)
        out["hosts"][name] = {
            "stages": {"health": {"status": "ok", "duration_s": 0.1},
                       "server": {"status": "failed" if bad == "server" else "ok",
                                  "duration_s": 0.2},
                       "ready": {"status": "skipped" if bad else "ok", "duration_s": 0.0}},
            "facts": {} if bad else {"ready": {"ready_after_s": 2.0 + i / 10,
                                               "accept_length": 2.67, "version": "0.5.23"}},
        }
    return RunSummary.from_json(out)


def text(renderable: Any) -> str:
    console = Console(width=100, record=True)
    console.print(renderable)
    return console.export_text()


def test_many_hosts_get_counts_per_stage_and_the_odd_hosts_named() -> None:
    rec = record(64, failed={"gpu-7": "server", "gpu-40": "server"})
    shown = text(summary_table(rec))
    assert "64 hosts" in shown and "gpu-12" not in shown  # no column per host
    server = next(line for line in shown.splitlines() if "server" in line)
    assert "62" in server and "2" in server and "gpu-7: failed, gpu-40: failed" in server
    ready = next(line for line in shown.splitlines() if "ready" in line)
    assert "gpu-7: skipped" in ready
    assert highlights(rec) == [
        "62 of 64 hosts: ready after 2.1s-8.4s, accept length 2.67, SGLang 0.5.23"]


def test_a_few_hosts_keep_a_column_and_a_line_each() -> None:
    rec = record(WIDE)
    shown = text(summary_table(rec))
    assert all(f"gpu-{i}" in shown for i in range(1, WIDE + 1))
    assert len(highlights(rec)) == WIDE and highlights(rec)[0].startswith("gpu-1: ready after")


def test_stage_words_say_what_a_change_did_and_shorten_paths() -> None:
    from orchestrator.cli.console import short_paths, stage_words

    long = "/work/x/.sim/demo/hosts/gpu-1/root/opt/orchestrator/venvs/sglang-0.5.23/bin/python"
    assert short_paths(f"the venv at {long}: broken") == \
        "the venv at …/sglang-0.5.23/bin/python: broken"
    assert short_paths("/opt/orchestrator/models stays") == "/opt/orchestrator/models stays"
    # a change says what it did, from the facts the stage recorded ...
    assert stage_words("changed", "http://h:30000/health: connection refused",
                       {"ready_after_s": 1.52, "accept_length": 2.6}) == \
        "ready after 1.5s, accept length 2.60"
    assert stage_words("changed", "sglang is not installed",
                       {"installed": ["sglang==0.5.23"]}) == "installed sglang==0.5.23"
    # ... else what the check had found, marked as before the change
    assert stage_words("changed", "the marker is missing", {}) == "(was: the marker is missing)"
    assert stage_words("ok", "all 3 requirements satisfied", {"installed": ["x"]}) == \
        "all 3 requirements satisfied"
