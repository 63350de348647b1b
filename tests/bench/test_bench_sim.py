"""bench, report and tune against a simulated 8-GPU host (real SSH, real HTTP, SGLang stand-in).

One simulated host per module. The `tuned` fixture runs `tune` over `off` and one EAGLE-3 tree
setting, interrupted (Ctrl-C) before its second candidate and run again: it deploys from scratch
through the playbook's stages, so the other tests find a running speculative server.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.bench.bench import BenchOptions, load_results, run_bench
from orchestrator.bench.recommend import recommend
from orchestrator.bench.report import write_report
from orchestrator.bench.tune import Target, run_tune
from orchestrator.deploy import deploy
from orchestrator.errors import ConfigError
from orchestrator_sim.fleet import SimFleet
from orchestrator_sim.hubrepos import EAGLE3_MLA_REPO
from tests.sim.conftest import assert_nothing_left

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = str(REPO / "playbooks/kimi-k2.6-eagle3.yaml")
GRID = """tune:
  baseline: true
  candidates:
    - {num_steps: 3, eagle_topk: 4, num_draft_tokens: 8}
"""
WIDE = "eagle3-s3-k4-n8"
#: the profile's launch with triton: FlashInfer MLA verifies a draft tree wrongly (topk > 1,
#: rule backends.flashinfer-mla-tree-verify), so the tree candidate runs on SGLang's own
#: sm_120 default for MLA
PROFILE = yaml.safe_load((REPO / "configs/models/kimi-k2.6.yaml").read_text())
TRITON = {"launch": {**PROFILE["launch"], "attention_backend": "triton"}}
WORKLOAD = BenchOptions(concurrency=(1, 32), input_len=16, output_len=48, num_prompts=64)
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Any:
    simdir = tmp_path_factory.mktemp("bench") / "sim"
    # 0.05 (load_seconds 96 -> ~5 s): the modelled step times dominate Python overhead, so the
    # measured throughputs keep their order on a loaded machine (0.001 flipped at 32 in CI; 0.01,
    # where a concurrency-32 run lasts ~50 ms, flipped with 6 test workers on 2 cores: `off`
    # measured 37% under its quiet figure). The figures are simulated time: the same at any scale.
    fleet = SimFleet.up(simdir, hosts=1, time_scale=0.05, load_seconds=96.0)
    try:
        yield fleet
    finally:
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(fleet.simdir, pid)


class Interrupt:
    """tune's `say`: records the messages; Ctrl-C when the second candidate is to be deployed."""

    def __init__(self, at: str | None) -> None:
        self.at = at
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self.at is not None and line.startswith(f"tune: {self.at}: deploying"):
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def tuned(fleet: SimFleet, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("tune")
    (base / "grid.yaml").write_text(GRID)
    kw = {"options": WORKLOAD, "run_dir": base / "runs", "grid_path": str(base / "grid.yaml"),
          "out": base / "tune", "cli_vars": TRITON}
    first = Interrupt(at=WIDE)
    with pytest.raises(KeyboardInterrupt):
        run_tune(PLAYBOOK, str(fleet.inventory_path), say=first, **kw)
    second = Interrupt(at=None)
    result = run_tune(PLAYBOOK, str(fleet.inventory_path), say=second, **kw)
    return {"first": first.lines, "second": second.lines, "result": result, "base": base,
            "kw": kw}


def test_tune_resumes_then_picks_speculation_at_1_and_off_under_load(tuned: dict) -> None:
    first, second, result = tuned["first"], tuned["second"], tuned["result"]
    assert [m for m in first if "deploying" in m] == ["tune: off: deploying (baseline)",
                                                      first[-1]]
    # run again: `off` is not measured twice, only the candidate left
    assert any(m.startswith("tune: off: already measured") for m in second)
    assert [m.split(":")[1].strip() for m in second if "deploying" in m] == [WIDE]
    assert result.exit_code == 0, result.summary_text
    rec = result.data.recommendation
    rows = {r.concurrency: r for r in rec.per_concurrency}
    assert rows[1].best == WIDE and rows[1].speedup > 1.4
    assert rows[32].best == "off" and rec.stops_paying_from == 32
    override = Path(rec.override_file).read_text()
    assert "eagle_topk: 4" in override and "num_draft_tokens: 8" in override
    # what `off` answered greedily travels with the setting: a speculative deploy must match
    reference = yaml.safe_load(override)["greedy_reference"]
    assert len(reference) == 3 and all(reference.values())
    # the candidate was relaunched through the stages: new fingerprint, restart, verified
    wide = result.data.candidates[WIDE]
    summary = json.loads((tuned["base"] / "runs" / wide.deploy_run /
                          "summary.json").read_text())
    stages = summary["hosts"]["gpu-1"]["stages"]
    assert (stages["server"]["status"], stages["ready"]["status"]) == ("changed", "changed")
    assert "tuned for concurrency 1 (the lowest measured)" in override
    report = (tuned["base"] / "tune" / "report" / "report.md").read_text()
    assert report.startswith("# Tune report")
    assert "speculation stops paying from concurrency 32" in report
    assert "## Per-user decode speed" in report and "p99 from fewer than 100 requests" in report
    for name in ("throughput", "tradeoff", "speedup", "latency", "accept"):
        assert (tuned["base"] / "tune" / "report" / f"{name}.png").read_bytes()[:8] == PNG


def test_tune_for_concurrency_32_writes_the_setting_best_at_32(fleet: SimFleet, tuned: dict,
                                                              tmp_path: Path) -> None:
    # the measured tune dir, re-targeted: nothing is deployed or measured again
    shutil.copytree(tuned["base"] / "tune", tmp_path / "tune")
    kw = {**tuned["kw"], "out": tmp_path / "tune"}
    with pytest.raises(ConfigError, match="--for-concurrency 8: not one of"):
        run_tune(PLAYBOOK, str(fleet.inventory_path), target=Target(8), **kw)
    said: list[str] = []
    result = run_tune(PLAYBOOK, str(fleet.inventory_path), target=Target(32), say=said.append,
                      **kw)
    assert not [m for m in said if "deploying" in m] and result.exit_code == 0
    rec = result.data.recommendation
    rows = {r.concurrency: r for r in rec.per_concurrency}
    assert (rec.choice, rec.choice_concurrency) == (rows[32].best, 32)
    assert rec.choice_output_tps >= rows[32].off  # not worse than the baseline at 32
    assert rec.choice == "off" and rec.best_low == WIDE  # the stand-in: `off` best at 32
    text = Path(rec.override_file).read_text()
    assert "# Written by `orchestrator tune`: tuned for concurrency 32." in text
    assert yaml.safe_load(text)["speculative"] == {"algorithm": None}
    assert "Override tuned for concurrency 32: `off`" in (tmp_path / "tune" / "report" /
                                                         "report.md").read_text()
    # the SLO form: the most output tok/s while every user decodes at least X tok/s
    entries = [e for e in result.data.candidates.values() if e.status == "measured"]
    fast = recommend(entries, Target(min_user_tps=rows[1].user_tps * 0.99))
    assert (fast.choice, fast.choice_concurrency) == (WIDE, 1)  # only speculation is that fast
    slow = recommend(entries, Target(min_user_tps=1.0))
    assert (slow.choice, slow.choice_concurrency) == (rows[32].best, 32)
    assert recommend(entries, Target(32, min_user_tps=1e6)).choice is None


def test_bench_records_the_benchmarks_figures_and_the_server(fleet: SimFleet, tuned: dict,
                                                             tmp_path: Path) -> None:
    seen: list[tuple[int, bool]] = []
    runs = tuned["base"] / "runs"  # beside the deploy runs, as with the default ./runs
    out = run_bench(PLAYBOOK, str(fleet.inventory_path), run_dir=runs,
                    options=BenchOptions(concurrency=(1, 2), input_len=16, output_len=64),
                    progress=lambda host, c, run: seen.append((c, run.ok)))
    assert out.exit_code == 0 and seen == [(1, True), (2, True)]
    data = load_results(runs / out.run_id)
    h = data.hosts["gpu-1"]
    assert h.module == "sglang.benchmark.serving"
    assert h.server.speculative["speculative_eagle_topk"] == 4
    assert "--speculative-num-draft-tokens" in h.server.args
    fp = json.loads((Path(fleet.inventory_path).parent / "hosts/gpu-1/root/opt/orchestrator/run/"
                     "fingerprint.json").read_text())
    assert h.server.fingerprint == fp["fingerprint"]
    one = h.runs[0]
    assert one.num_prompts == 8 and one.result["completed"] == 8
    # read from the benchmark's --output-file line, whose default --request-rate inf is
    # Infinity there: null in results.json, which a strict parser reads
    assert one.nonfinite == {"request_rate": "inf"} and one.result["request_rate"] is None
    assert "server_info" not in one.result and one.result["p95_ttft_ms"] > 0
    json.loads(out.results_path.read_text(), parse_constant=_refuse)
    assert one.user_tps == pytest.approx(1000 / one.result["median_tpot_ms"])
    assert 2.8 <= one.result["accept_length"] <= 3.1
    assert 26.3 * 1.6 <= one.result["output_throughput"] <= 26.3 * 1.95

    rep = write_report([str(runs / out.run_id)], out=tmp_path / "rep")
    md = rep.markdown.read_text()
    assert "| 1 | " in rep.table and "--speculative-eagle-topk 4" in md
    wide = tuned["result"].data.candidates[WIDE]
    assert f"(deploy run `{wide.deploy_run}`)" in md  # the pin of the deploy that started it
    assert "sglang==0.5.23" in md
    assert [p.name for p in rep.pngs] == ["throughput.png", "tradeoff.png", "latency.png",
                                          "accept.png"]
    assert md.startswith("# Benchmark report")


def _refuse(name: str) -> None:
    raise ValueError(f"not strict JSON: {name}")


def test_bench_against_a_server_that_dies_midway_keeps_what_it_measured(
        fleet: SimFleet, tuned: dict, tmp_path: Path) -> None:
    def kill_after_first(host: str, c: int, run: dict) -> None:
        if c == 1:
            data = json.loads((tmp_path / os.listdir(tmp_path)[0] / "bench" /
                               "results.json").read_text())
            os.kill(int(data["hosts"]["gpu-1"]["server"]["pid"]), signal.SIGKILL)

    out = run_bench(PLAYBOOK, str(fleet.inventory_path), run_dir=tmp_path,
                    options=BenchOptions(concurrency=(1, 2, 4), input_len=16, output_len=48),
                    progress=kill_after_first)
    assert out.exit_code == 1
    h = load_results(out.results_path).hosts["gpu-1"]
    assert [r.ok for r in h.runs] == [True, False]
    assert h.runs[0].result["output_throughput"] > 0
    assert "died" in h.error and "1 run(s) measured" in h.error
    assert h.runs[1].exit_code != 0 and "Error" in h.runs[1].tail


def test_tune_skips_a_candidate_the_preflight_refuses_and_never_launches_it(
        fleet: SimFleet, tmp_path: Path) -> None:
    # the profile with an MLA EAGLE-3 drafter, whose tree (eagle_topk > 1) FlashInfer MLA
    # cannot draft: the shipped grid's {3, 4, 8} candidate is invalid for it, the chains are not
    mla = {"drafter": {**PROFILE["drafter"], "repo": EAGLE3_MLA_REPO,
                       "architecture": "Eagle3DeepseekV2ForCausalLM"}}
    runs = tmp_path / "runs"
    first = deploy(PLAYBOOK, str(fleet.inventory_path), cli_vars=mla, run_dir=runs)
    assert first.exit_code == 0, first.summary_path.read_text()[-2000:]
    say = Interrupt(at="off")  # Ctrl-C at the first launch: every candidate screened by then
    with pytest.raises(KeyboardInterrupt):
        run_tune(PLAYBOOK, str(fleet.inventory_path), cli_vars=mla, options=WORKLOAD,
                 run_dir=runs, out=tmp_path / "tune", say=say)
    refused = [m for m in say.lines if "refused by the preflight" in m]
    assert len(refused) == 1 and refused[0].startswith(f"tune: {WIDE}: "), say.lines
    assert "Currently Flashinfer MLA only supports topk=1" in refused[0]
    assert "never launched" in refused[0]
    state = json.loads((tmp_path / "tune" / "tune.json").read_text())
    entries = {e["key"]: e for e in state["candidates"]}
    assert entries[WIDE]["status"] == "refused"
    assert "eagle_topk: 1" in entries[WIDE]["error"]  # the fix travels with the reason
    # its only run is the dry run that screened it; no deploy was started for it
    screened = json.loads((runs / entries[WIDE]["deploy_run"] / "summary.json").read_text())
    assert screened["dry_run"] is True
    assert not [m for m in say.lines if m.startswith(f"tune: {WIDE}: deploying")]
    # the shipped grid's chains passed the same screen
    chains = [k for k in entries if k.startswith("eagle3-") and k != WIDE]
    assert len(chains) == 4 and all(entries[k]["status"] == "running" for k in chains)
