"""Download the REAL SMG gateway wheel (PyPI `smg`) and its dependencies once, for its tests.

    python scripts/fetch_gateway_wheels.py          # -> .cache/gateway-wheels/1.13.0/

The simulated hosts install packages from the simulator's own package index (no internet); the
gateway tests copy these wheels into it, so a simulated gateway host runs the real gateway (its
Rust binary, on CPU). pip picks the wheels for THIS interpreter, the one the simulated hosts run.
Without them the gateway tests skip, saying how to get them (`make gateway-wheels`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSION = "1.13.0"  # orchestrator.sglang.gateway.GATEWAY_VERSION
CACHE = REPO / ".cache" / "gateway-wheels" / VERSION
HINT = f"no smg wheel in {CACHE}: run `make gateway-wheels` (downloads the real wheel once)"


def have_wheels(directory: Path = CACHE) -> bool:
    """True when the smg wheel is there (its dependencies come with it)."""
    return any(directory.glob(f"smg-{VERSION}-*.whl"))


def main() -> int:
    """Download into CACHE unless already there."""
    if have_wheels():
        print(f"gateway wheels already in {CACHE}")
        return 0
    CACHE.mkdir(parents=True, exist_ok=True)
    # short timeout, no retries: a machine without network skips the gateway tests at once
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--only-binary", ":all:",
                        "--timeout", "15", "--retries", "0", "--disable-pip-version-check",
                        f"smg=={VERSION}", "-d", str(CACHE)])
    if r.returncode != 0 or not have_wheels():
        print(f"could not download smg=={VERSION}; the gateway tests will skip",
              file=sys.stderr)
        return 1
    print(f"gateway wheels in {CACHE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
