"""The KV pool, predicted by the preflight (rules/memory.py) and computed independently by the
SGLang stand-in from the same real formulas, held within 5% of each other over a table of
(release, GPU memory, static fraction, cuda-graph max bs, KV dtype) rows for the user's deploy:
Kimi K2.6 (multimodal, MLA) with its EAGLE-3 drafter at tp 8; on 0.5.9, which cannot drive an
EAGLE-3 drafter from a K2.6 target, the text-only K2 (no VLM factor) stands in.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.sglang.preflight import HostFacts, LaunchRequest, run_preflight
from orchestrator.sglang.rules import Gpu
from tests.sglang.fidelity_cases import EAGLE3, K2, K26, SPEC, WEIGHTS
from tests.sglang.test_fidelity import run_standins

RTX_PRO_6000, H200, B200 = 97887, 143771, 183359  # nvidia-smi memory.total, MiB
#: (release, GPU MiB, --mem-fraction-static or None, cuda-graph max bs or None, KV dtype)
ROWS = [
    (release, mib, fraction, bs, dtype)
    for release, mib, fraction, bs, dtype in (
        ("0.5.9", RTX_PRO_6000, None, None, "auto"),
        ("0.5.9", RTX_PRO_6000, "0.9", None, "auto"),
        ("0.5.9", H200, None, 128, "fp8_e4m3"),
        ("0.5.10", RTX_PRO_6000, None, None, "auto"),
        ("0.5.10", H200, "0.85", None, "auto"),
        ("0.5.12", RTX_PRO_6000, None, 128, "auto"),
        ("0.5.12", B200, None, None, "auto"),
        ("0.5.15", RTX_PRO_6000, None, None, "auto"),
        ("0.5.15", RTX_PRO_6000, "0.85", 128, "fp8_e4m3"),
        ("0.5.15", H200, "0.9", None, "auto"),
        ("0.5.19", RTX_PRO_6000, None, None, "auto"),
        ("0.5.19", RTX_PRO_6000, None, 128, "auto"),
        ("0.5.19", H200, None, None, "fp8_e4m3"),
        ("0.5.20", RTX_PRO_6000, "0.9", None, "auto"),
        ("0.5.20", B200, None, 256, "auto"),
        ("0.5.21", RTX_PRO_6000, None, None, "auto"),
        ("0.5.21", H200, "0.88", 128, "fp8_e4m3"),
        ("0.5.22", RTX_PRO_6000, None, 64, "auto"),
        ("0.5.22", H200, None, None, "auto"),
        ("0.5.23", RTX_PRO_6000, None, None, "auto"),
        ("0.5.23", RTX_PRO_6000, "0.88", None, "auto"),
        ("0.5.23", RTX_PRO_6000, "0.85", 128, "fp8_e4m3"),
        ("0.5.23", H200, "0.9", None, "auto"),
        ("0.5.23", B200, None, None, "fp8_e4m3"),
    )
]


def _bs_flag(release: str) -> str:
    """--cuda-graph-max-bs is ambiguous from 0.5.20 (releases/0.5.20.json `removed`)."""
    return "--cuda-graph-max-bs" if tuple(map(int, release.split("."))) < (0, 5, 20) \
        else "--cuda-graph-max-bs-decode"


def _target(row: tuple) -> str:
    return "k2" if row[0] == "0.5.9" else "k26"


def _argv(row: tuple, dirs: dict[str, str]) -> list[str]:
    release, _mib, fraction, bs, dtype = row
    target, draft = dirs[_target(row)], dirs["draft"]
    argv = ["--model-path", target, "--tp-size", "8", "--trust-remote-code",
            "--served-model-name", "kimi", *SPEC, "--speculative-draft-model-path", draft,
            "--context-length", "8192"]
    if fraction:
        argv += ["--mem-fraction-static", fraction]
    if bs:
        argv += [_bs_flag(release), str(bs)]
    if dtype != "auto":
        argv += ["--kv-cache-dtype", dtype]
    return argv


def _id(row: tuple) -> str:
    return "-".join(str(x) for x in row)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("memory-models")
    out = {}
    for name, cfg in (("k2", K2), ("k26", K26), ("draft", EAGLE3)):
        folder = root / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
        if name != "draft":
            (folder / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {"total_size": WEIGHTS}, "weight_map": {}}))
        out[name] = str(folder)
    return out


def test_the_table_spans_releases_gpus_fractions_graphs_and_dtypes() -> None:
    assert len(ROWS) >= 20
    for column in range(5):
        assert len({row[column] for row in ROWS}) >= 2


def test_predicted_pool_within_5_percent_of_the_standins(
        sim_wheels: Path, dirs: dict[str, str],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    cases: dict[str, list[dict]] = {}
    for row in ROWS:
        cases.setdefault(row[0], []).append({
            "id": _id(row), "argv": _argv(row, dirs), "cc": "12.0",
            "env": {"SIMHW_TEST_MEM_MIB": str(row[1])}})
    standin = run_standins(sim_wheels, tmp_path_factory.mktemp("memory-standins"), cases)
    table, wrong = [], []
    for row in ROWS:
        release, mib = row[0], row[1]
        facts = HostFacts(python="/v/bin/python", sglang_version=release,
                          compressed_tensors_version="0.18.0", nvfp4_known=True,
                          target_config=K2 if _target(row) == "k2" else K26,
                          draft_config=EAGLE3,
                          gpus=[Gpu(i, (12, 0), mib) for i in range(8)],
                          target_weight_bytes=WEIGHTS)
        report = run_preflight(LaunchRequest(_argv(row, dirs), dirs[_target(row)],
                                             dirs["draft"]), facts)
        assert report.kv_pool is not None, report.problems
        predicted = report.kv_pool.tokens
        got = standin[release][_id(row)]
        actual = got.get("max_total_num_tokens")
        table.append(f"{_id(row):<40} predicted {predicted:>9,} stand-in {actual}")
        if not isinstance(actual, int) or abs(predicted - actual) > 0.05 * actual:
            wrong.append(table[-1] + f" ({got.get('phase')}: {got.get('error', '')})")
    print("\n".join(table))
    assert not wrong, "\n".join(wrong)
