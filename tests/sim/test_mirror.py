"""The simulated index also serves real packages repacked from the simulator's environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from orchestrator.sim.mirror import mirror_wheels
from orchestrator.sim.pkgindex import PackageIndex


def test_huggingface_hub_installs_from_the_simulated_index(tmp_path: Path) -> None:
    wheels = mirror_wheels(["huggingface_hub"], tmp_path / "wheels")
    names = {w.name.split("-")[0] for w in wheels}
    assert {"huggingface_hub", "filelock", "packaging"} <= names
    again = mirror_wheels(["huggingface_hub"], tmp_path / "wheels")
    assert [w.stat().st_mtime_ns for w in again] == [w.stat().st_mtime_ns for w in wheels]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE="/dev/null", PIP_DISABLE_PIP_VERSION_CHECK="1")
    index = PackageIndex([tmp_path / "wheels"])
    index.start("127.0.0.1", 0)
    try:
        subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q",
                        "--index-url", index.url, "huggingface_hub==2.4.0"],
                       check=True, env=env, timeout=180)
    finally:
        index.stop()
    out = subprocess.run([str(venv / "bin/python"), "-c",
                          "import huggingface_hub as h; print(h.__version__)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2.4.0"
