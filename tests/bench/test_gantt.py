"""The deploy picture: a real 2-host deploy (shell stages) with one retried stage and one failure,
drawn from its events.jsonl by `orchestrator report`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from orchestrator.bench.gantt import read_timeline
from orchestrator.bench.report import write_report
from orchestrator.deploy import deploy
from orchestrator_sim.fleet import SimFleet
from tests.sim.conftest import assert_nothing_left

PLAYBOOK = """name: gantt
hosts: gpu
vars:
  marker: "{{ sim_root }}/tmp/flaky-once"
stages:
  - id: prepare
    run: sleep 0.2
  - id: flaky
    needs: [prepare]
    run: >-
      [ {{ inventory_hostname }} != gpu-2 ] || test -f {{ marker }}
      || { touch {{ marker }}; exit 75; }
    retry: {attempts: 3, delay: 0.3s, on: [75]}
  - id: broken
    needs: [flaky]
    run: "[ {{ inventory_hostname }} != gpu-1 ] || exit 3"
  - id: after
    needs: [broken]
    run: "true"
"""


def test_report_draws_the_stage_timeline_of_a_two_host_deploy(tmp_path: Path) -> None:
    fleet = SimFleet.up(tmp_path / "sim", hosts=2, time_scale=0.001, index=False, hub=False,
                        hypervisor=False)
    try:
        (tmp_path / "gantt.yaml").write_text(PLAYBOOK)
        out = deploy(tmp_path / "gantt.yaml", fleet.inventory_path, run_dir=tmp_path / "runs")
    finally:
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(fleet.simdir, pid)
    assert out.exit_code == 1
    tl = read_timeline(out.events_path)
    bars = {(b.host, b.stage): b for b in tl.bars}
    assert set(tl.hosts) == {"gpu-1", "gpu-2"} and len(bars) == 8
    flaky = bars[("gpu-2", "flaky")]
    assert flaky.status == "changed" and flaky.attempts == 2 and len(flaky.retries) == 1
    assert flaky.retries[0][1] >= 0.25  # the back-off drawn after the failed attempt
    assert bars[("gpu-1", "broken")].status == "failed"
    assert bars[("gpu-1", "after")].status != "changed"
    assert bars[("gpu-2", "after")].status == "changed"
    assert all(b.start is not None and b.end is not None and b.end >= b.start
               for b in tl.bars)

    rep = write_report([str(out.run_dir)], out=tmp_path / "report")
    png = tmp_path / "report" / f"deploy-{out.run_id}.png"
    if os.environ.get("ORCH_KEEP_PNG"):  # to look at it
        shutil.copy(png, os.environ["ORCH_KEEP_PNG"])
    assert rep.pngs == [png] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"## Deploy {out.run_id}" in rep.markdown.read_text()
