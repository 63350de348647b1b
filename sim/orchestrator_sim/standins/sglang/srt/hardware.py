"""The GPUs as this stand-in sees them: the simulator's `simhw` module, or no GPU at all.

`simhw` is on PYTHONPATH of every command run on a simulated host. Without it the stand-in acts
like SGLang on a machine without an NVIDIA driver.
"""

from __future__ import annotations

import os
import sys

try:  # the simulated hardware; absent means "no GPU here"
    import simhw  # type: ignore
except ImportError:  # pragma: no cover - depends on the host
    simhw = None


class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError look-alike (the traceback names it `torch.OutOfMemoryError`)."""


OutOfMemoryError.__module__ = "torch"

NO_DRIVER = (
    "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
    "installed a driver from http://www.nvidia.com/Download/index.aspx"
)
_CUDA_ERRORS = {
    100: "No CUDA GPUs are available",
    35: "CUDA error: CUDA driver version is insufficient for CUDA runtime version (35)",
    803: "CUDA error: system has unsupported display driver / cuda driver combination (803)",
    999: (
        "CUDA error: CUDA unknown error - this may be due to an incorrectly set up environment, "
        "e.g. changing env variable CUDA_VISIBLE_DEVICES after program start. Setting the "
        "available devices to be zero. (999)"
    ),
}


def available() -> bool:
    """True when the simulated hardware module is importable."""
    return simhw is not None


def time_scale() -> float:
    """Seconds of real time per simulated second (1.0 = real time)."""
    if simhw is None:
        return 1.0
    return float(simhw.time_scale())


def nominal_load_seconds() -> float:
    """Nominal weight-load time; SGLANG_SIM_LOAD_SECONDS overrides the hardware's figure."""
    override = os.environ.get("SGLANG_SIM_LOAD_SECONDS")
    if override:
        return float(override)
    if simhw is None:
        return 960.0
    return float(simhw.load_seconds())


def cuda_init() -> None:
    """Initialise CUDA like torch's lazy init; raise RuntimeError the way torch reports it."""
    if simhw is None:
        raise RuntimeError(NO_DRIVER)
    code = int(simhw.cuda_init())
    if code == 0:
        return
    if code == 999:
        sys.stderr.write(
            "/usr/local/lib/python3/site-packages/torch/cuda/__init__.py:174: UserWarning: CUDA "
            "initialization: CUDA unknown error - this may be due to an incorrectly set up "
            "environment, e.g. changing env variable CUDA_VISIBLE_DEVICES after program start. "
            "Setting the available devices to be zero. (Triggered internally at "
            "/pytorch/c10/cuda/CUDAFunctions.cpp:109.)\n"
        )
    raise RuntimeError(_CUDA_ERRORS.get(code, f"CUDA error: unknown error ({code})"))


def visible_gpus() -> list:
    """gpu_info() entries of the GPUs this process may use (honours CUDA_VISIBLE_DEVICES)."""
    if simhw is None:
        return []
    info = sorted(simhw.gpu_info(), key=lambda g: int(g["index"]))
    by_index = {int(g["index"]): g for g in info}
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return info[: int(simhw.device_count())]
    chosen = []
    for part in env.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) not in by_index:
            break  # CUDA stops at the first invalid entry
        chosen.append(by_index[int(part)])
    return chosen


def compute_capability():
    """(major, minor) of the first visible GPU, or None without GPUs."""
    gpus = visible_gpus()
    if not gpus:
        return None
    cc = gpus[0].get("compute_capability") or [0, 0]
    return int(cc[0]), int(cc[1])


def allocate(mib: int, gpu_indices: list) -> None:
    """Reserve `mib` MiB on each listed GPU for this process; OutOfMemoryError when full."""
    if simhw is None:
        raise RuntimeError(NO_DRIVER)
    try:
        simhw.allocate(os.getpid(), int(mib), list(gpu_indices))
    except Exception as exc:
        if type(exc).__name__ != "OutOfMemory":
            raise
        raise OutOfMemoryError(
            f"{exc} Some GPUs are occupied by other processes (nvidia-smi lists them): stop "
            "them or lower --mem-fraction-static."
        ) from None


def release() -> None:
    """Give back this process's GPU memory (idempotent)."""
    if simhw is not None:
        try:
            simhw.release(os.getpid())
        except Exception as exc:  # never mask the real exit reason
            sys.stderr.write(f"warning: releasing GPU memory failed: {exc!r}\n")
