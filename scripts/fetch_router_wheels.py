"""Download the REAL sglang-router wheel (and its dependencies) once, for the router tests.

    python scripts/fetch_router_wheels.py          # -> .cache/router-wheels/0.3.2/

The simulated hosts install packages from the simulator's own package index (no internet); the
router tests copy these wheels into it, so a simulated router host runs the real router binary.
pip picks the wheels for THIS interpreter, the one the simulated hosts run. Without them the
router tests skip, saying how to get them (`make router-wheels`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSION = "0.3.2"  # orchestrator.sglang.router.ROUTER_VERSION
CACHE = REPO / ".cache" / "router-wheels" / VERSION


def have_wheels(directory: Path = CACHE) -> bool:
    """True when the router wheel is there (its dependencies come with it)."""
    return any(directory.glob(f"sglang_router-{VERSION}-*.whl"))


def main() -> int:
    """Download into CACHE unless already there."""
    if have_wheels():
        print(f"router wheels already in {CACHE}")
        return 0
    CACHE.mkdir(parents=True, exist_ok=True)
    # short timeout, no retries: a machine without network skips the router tests at once
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--only-binary", ":all:",
                        "--timeout", "15", "--retries", "0", "--disable-pip-version-check",
                        f"sglang-router=={VERSION}", "-d", str(CACHE)])
    if r.returncode != 0 or not have_wheels():
        print(f"could not download sglang-router=={VERSION}; the router tests will skip",
              file=sys.stderr)
        return 1
    print(f"router wheels in {CACHE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
