"""The CUDA init check: cuInit(0) through libcuda, or the simulated host's simhw.

A program (stdlib only, Python 3.8+) run in a child python by the `uvm_facts` probe
(orchestrator.remote.gpu) as `PYTHON -c TEXT`: a failed cuInit is sticky for the process that
made it, so the agent never calls it itself. Prints one JSON line: {"code": int | None, "source":
"libcuda" | "simhw" | "unknown", "error": None | why, and where cuInit succeeded "devices" and
"driver_version_int"}. Under the simulator (SIM_HOST_STATE set) the simulated hardware answers.
"""

import ctypes
import json
import os
import sys


def _simhw():
    """The simulated host's hardware module, when this host is simulated (else None)."""
    if not os.environ.get("SIM_HOST_STATE"):
        return None
    try:
        import simhw
    except ImportError:
        return None
    return simhw


def _libcuda(lib, out: dict) -> None:
    out["source"] = "libcuda"
    out["code"] = int(lib.cuInit(0))
    if out["code"] == 0:
        n = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(n)) == 0:
            out["devices"] = n.value
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            out["driver_version_int"] = v.value


def check() -> dict:
    """cuInit(0) in this process: the answer described in the module docstring."""
    out = {"code": None, "source": "unknown", "error": None}
    sim = _simhw()
    if sim is not None:
        out.update(code=int(sim.cuda_init()), source="simhw")
        return out
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        out["error"] = f"libcuda.so.1 not loadable: {exc}"
        try:
            import simhw as sim
        except ImportError:
            return out
        out.update(code=int(sim.cuda_init()), source="simhw", error=None)
        return out
    _libcuda(lib, out)
    return out


def main() -> None:
    """Print the check's answer as one JSON line."""
    sys.stdout.write(json.dumps(check()))


if __name__ == "__main__":
    main()
