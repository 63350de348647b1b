"""remote/sglang_check.py, the program that runs SGLang's own validation on the host: without
SGLang (or torch) it says so instead of failing; with the stand-in it returns SGLang's verdict."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.sim.conftest_index import SIMHW_DOUBLE, clean_env

SCRIPT = Path(__file__).resolve().parents[2] / "orchestrator" / "remote" / "sglang_check.py"


def run(argv: list[str], **env: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT.read_text(), json.dumps(argv)],
                          capture_output=True, text=True, timeout=60, env=clean_env(**env))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("ORCH_RESULT ")][-1]
    return json.loads(line[len("ORCH_RESULT "):])


def test_without_sglang_it_is_unavailable() -> None:
    got = run(["--model-path", "/m"])
    assert got == {"available": False, "kind": "ModuleNotFoundError",
                   "message": "No module named 'sglang'"}


def test_with_the_standin_it_returns_sglangs_verdict(sim_wheels: Path,
                                                     tmp_path: Path) -> None:
    with zipfile.ZipFile(sim_wheels / "sglang-0.5.23-py3-none-any.whl") as zf:
        zf.extractall(tmp_path / "sg")
    (tmp_path / "hw").mkdir()
    (tmp_path / "hw" / "simhw.py").write_text(SIMHW_DOUBLE)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                   "max_position_embeddings": 8192}))
    path = f"{tmp_path / 'sg'}:{tmp_path / 'hw'}"
    ok = run(["--model-path", str(model), "--tp-size", "8"], PYTHONPATH=path)
    assert ok["available"] and ok["ok"] and ok["fields"]["tp_size"] == 8
    assert ok["fields"]["served_model_name"] == str(model)  # defaults to the model path
    bad = run(["--model-path", str(model), "--context-length", "9000"], PYTHONPATH=path)
    assert (bad["ok"], bad["kind"]) == (False, "ValueError")
    assert "User-specified context_length (9000) is greater than the derived" in bad["message"]
    # 0.5.19+: prepare_server_args validates nothing; the launcher's resolve_once() does, and
    # check_server_args() after it in every release (a colon in the served name)
    assert bad["stage"] == "resolve_once"
    colon = run(["--model-path", str(model), "--served-model-name", "a:b"], PYTHONPATH=path)
    assert (colon["ok"], colon["stage"]) == (False, "check_server_args")
    assert "cannot contain a colon" in colon["message"]
    usage = run(["--model-path", str(model), "--no-such-flag"], PYTHONPATH=path)
    assert usage["kind"] == "argparse" and "unrecognized arguments: --no-such-flag" in \
        usage["message"]
    helped = run(["--help"], PYTHONPATH=path)
    assert helped["code"] == 0 and "printed its usage" in helped["message"]
