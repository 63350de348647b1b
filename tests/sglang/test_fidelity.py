"""Fidelity: every launch case of tests/sglang/fidelity_cases.py, per supported release, through
the orchestrator's preflight AND the SGLang stand-in, against what the real source does.

The preflight must refuse exactly the cases real SGLang refuses (at argparse, at start, before
or after the load) or runs uselessly (silent), naming the rule; the stand-in must fail in the
same phase, or run. Neither may pass by agreeing with the other: both are held to the table.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from orchestrator.sglang.preflight import HostFacts, LaunchRequest, run_preflight
from orchestrator.sglang.rules import Gpu
from tests.sglang.fidelity_cases import CASES, FAMILIES, RELEASES, WEIGHTS, Case
from tests.sim.conftest_index import SIMHW_DOUBLE, clean_env

DRIVER = Path(__file__).with_name("standin_driver.py")
FIX_WORDS = re.compile(r"\b(set|use|add|remove|pin|install|choose|change|drop|write|raise)\b",
                       re.I)
MEM_MIB = 97887
#: torch 2.9.1 (0.5.9's pin) requires nvidia-cudnn-cu12==9.10.2.21: a plain pip install's cuDNN;
#: the stand-in assumes the same, and so did the real-ServerArgs record
CUDNN = "9.10.2.21"


def _dirs(root: Path, case: Case) -> tuple[str, str]:
    """The case's target and drafter folders (config.json, checkpoint index)."""
    name = f"target:{case.id}" if case.served_name is None else f"target-{case.id}"
    target, draft = root / name, root / f"draft-{case.id}"
    for folder, cfg in ((target, case.target), (draft, case.draft)):
        folder.mkdir(parents=True, exist_ok=True)
        if cfg is not None:
            (folder / "config.json").write_text(json.dumps(cfg))
    if case.draft_tensors is not None:  # a header naming them, one byte each
        header = {n: {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]}
                  for i, n in enumerate(case.draft_tensors)}
        raw = json.dumps(header).encode()
        (draft / "model.safetensors").write_bytes(
            struct.pack("<Q", len(raw)) + raw + bytes(len(case.draft_tensors)))
    index = {"metadata": {"total_size": WEIGHTS}, "weight_map": {}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    return str(target), str(draft)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    root = tmp_path_factory.mktemp("fidelity-models")
    return {case.id: _dirs(root, case) for case in CASES}


def run_standins(sim_wheels: Path, root: Path,
                 cases: dict[str, list[dict]]) -> dict[str, dict[str, dict]]:
    """release -> case id -> the stand-in's outcome: one driver process per release, each
    case a dict {"id", "argv", "env", "cc"} (env may set SIMHW_TEST_MEM_MIB per case)."""
    simhw = root / "simhw"
    simhw.mkdir(exist_ok=True)
    (simhw / "simhw.py").write_text(SIMHW_DOUBLE)
    ct = root / "ct"
    with zipfile.ZipFile(sim_wheels / "compressed_tensors-0.18.0-py3-none-any.whl") as zf:
        zf.extractall(ct)
    procs = {}
    for release, todo in cases.items():
        overlay = root / release
        with zipfile.ZipFile(sim_wheels / f"sglang-{release}-py3-none-any.whl") as zf:
            zf.extractall(overlay)
        env = clean_env(PYTHONPATH=os.pathsep.join(map(str, (overlay, ct, simhw))),
                        SIMHW_TEST_TIME_SCALE="0.00001", SIMHW_TEST_MEM_MIB=str(MEM_MIB),
                        SIMHW_TEST_GPUS="8")
        procs[release] = subprocess.Popen(
            [sys.executable, str(DRIVER)], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs[release].stdin.write(json.dumps(todo))
        procs[release].stdin.close()
    results = {}
    for release, proc in procs.items():
        out = proc.stdout.read()
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 0, err[-2000:]
        results[release] = {r["id"]: r for r in map(json.loads, out.splitlines())}
    return results


@pytest.fixture(scope="module")
def standin_outcomes(sim_wheels: Path, models: dict,
                     tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict]]:
    """release -> case id -> the stand-in's outcome."""
    cases = [{"id": c.id, "argv": c.argv(*models[c.id]), "env": c.env, "cc": c.cc}
             for c in CASES]
    return run_standins(sim_wheels, tmp_path_factory.mktemp("fidelity-standins"),
                        dict.fromkeys(RELEASES, cases))


def _describe(outcome: object) -> str:
    return "ok" if outcome == "ok" else f"{outcome[0]} ({outcome[1]})"


def test_every_release_family_has_at_least_30_cases() -> None:
    for family, releases in FAMILIES.items():
        for release in releases:
            assert len([c for c in CASES if c.outcome(release) is not None]) >= 30, family
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("release", RELEASES)
def test_preflight_matches_the_real_source(release: str, models: dict) -> None:
    wrong = []
    for case in CASES:
        target_dir, draft_dir = models[case.id]
        cc = tuple(int(x) for x in case.cc.split("."))
        facts = HostFacts(
            python="/v/bin/python", sglang_version=release, compressed_tensors_version="0.18.0",
            cudnn_version=CUDNN, nvfp4_known=True, target_config=case.target,
            draft_config=case.draft if case.draft_path else None,
            gpus=[Gpu(i, cc, MEM_MIB) for i in range(8)], env=dict(case.env),
            target_weight_bytes=WEIGHTS,
            draft_vocab_map=None if case.draft_tensors is None else any(
                "d2t" in n for n in case.draft_tensors))
        argv = case.argv(target_dir, draft_dir)
        report = run_preflight(LaunchRequest(argv, target_dir, draft_dir if case.draft_path
                                             else None), facts)
        want = case.outcome(release)
        if want == "ok" and not report.ok:
            wrong.append(f"{case.id}: expected ok, refused: {report.problems}")
        elif want != "ok" and want[1] not in report.rules:
            wrong.append(f"{case.id}: expected {_describe(want)}, got rules {report.rules}")
        for problem in report.problems:  # names the values and what to change
            assert FIX_WORDS.search(problem), problem
    assert not wrong, f"sglang {release}:\n  " + "\n  ".join(wrong)


@pytest.mark.parametrize("release", RELEASES)
def test_standin_matches_the_real_source(release: str, standin_outcomes: dict) -> None:
    got = standin_outcomes[release]
    wrong = []
    for case in CASES:
        want = case.outcome(release)
        phase = "ok" if want == "ok" else want[0]
        if got[case.id]["phase"] != phase:
            wrong.append(f"{case.id}: expected {_describe(want)}, the stand-in: "
                         f"{got[case.id]['phase']} {got[case.id].get('error', '')}")
    assert not wrong, f"sglang {release} stand-in:\n  " + "\n  ".join(wrong)


# ------------------------------------------------------------- the real SGLang's own verdict

REAL = Path(__file__).with_name("real_serverargs.json")


def _real() -> dict[str, dict[str, dict]]:
    return json.loads(REAL.read_text())["outcomes"]


def test_the_real_serverargs_run_is_recorded_for_every_case_and_release() -> None:
    """`make fidelity-real` ran the real releases' prepare_server_args / resolve_once /
    check_server_args on the current table (each case's inputs digested)."""
    real = _real()
    stale = [f"{c.id}@{r}" for c in CASES for r in RELEASES
             if real.get(c.id, {}).get(r, {}).get("digest") != c.digest()]
    assert not stale, (f"{len(stale)} case(s) changed or new since the real SGLang run: "
                       f"{stale[:8]}; run `make fidelity-real ARGS=--cases ID,...`")


@pytest.mark.parametrize("release", RELEASES)
def test_start_phase_expectations_come_from_the_real_serverargs(release: str) -> None:
    """What the table says real SGLang does at argparse and at start IS what the real code did
    (run without a GPU, torch stubbed); every later phase is invisible to ServerArgs: "ok"."""
    real = _real()
    wrong = []
    for case in CASES:
        want = case.outcome(release)
        got = real.get(case.id, {}).get(release, {})
        phase = want[0] if want != "ok" else "ok"
        expected = phase if phase in ("argparse", "start") else "ok"
        outcome = str(got.get("outcome", "missing"))
        if outcome.split(":")[0] != expected:
            wrong.append(f"{case.id}: the table says {expected} ({_describe(want)}), the real "
                         f"{release}: {outcome} {got.get('message', '')[:160]}")
    assert not wrong, f"sglang {release}:\n  " + "\n  ".join(wrong)
