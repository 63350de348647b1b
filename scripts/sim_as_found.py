"""Make a simulated host look like the user's box before the orchestrator ever touched it.

The venv the playbook uses exists but has no pip (`python3 -m venv --without-pip`), and it holds
compressed-tensors 0.8.1, too old for the checkpoint's `nvfp4_pack_quantized` format. Both were
installed from outside the venv, as an operator would have: `python3 -m pip --python VENV ...`.

    python scripts/sim_as_found.py SIM_DIR [HOST]
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from orchestrator.config import load_inventory
from orchestrator.logs import configure
from orchestrator.transports import make_transport


def main(argv: list[str]) -> int:
    configure(None)  # warnings only
    simdir = Path(argv[0])
    host = argv[1] if len(argv) > 1 else "gpu-1"
    spec = load_inventory(simdir / "inventory.yaml").hosts[host]
    hv = spec.vars
    venv = f"{hv['base_dir']}/venvs/sglang-0.5.23"
    cmd = (
        f"python3 -m venv --without-pip {shlex.quote(venv)} && "
        f"PIP_CONFIG_FILE=/dev/null python3 -m pip --python {shlex.quote(venv + '/bin/python')} "
        f"install -q --disable-pip-version-check --index-url {shlex.quote(hv['pip_index_url'])} "
        "compressed-tensors==0.8.1"
    )
    with make_transport(spec) as transport:
        transport.connect(budget=30)
        result = transport.run(cmd, timeout=300)
    print(f"{host}: {venv} has no pip and compressed-tensors 0.8.1 (exit {result.exit_code})")
    if not result.ok:
        print(result.tail(), file=sys.stderr)
    return result.exit_code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
