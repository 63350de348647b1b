#!/usr/bin/env python3
"""Run the GPU probes of orchestrator/remote/gpu.py on THIS machine (a real GPU box) and print
the facts, to check them against reality (stdlib only, Python 3.8+; pynvml used if installed).

    python3 scripts/nvml_probe_check.py                 # facts as JSON + a cross-check
    python3 scripts/nvml_probe_check.py --record DIR    # also save the raw tool outputs

The cross-check compares what NVML and nvidia-smi report (count, names, memory, driver,
compute capability, processes) and what the uvm probe and cuInit say; it exits 1 when they
disagree or when a probe failed, 0 otherwise. `--record DIR` writes the raw texts the parsers
read (nvidia-smi csv answers, the banner, /proc/devices, devices.list, Xid lines) so the
recorded samples of tests/remote/data can be refreshed from a real machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from orchestrator.remote import gpu  # noqa: E402


def _record(outdir: str) -> list:
    os.makedirs(outdir, exist_ok=True)
    written = []
    smi = [
        ("smi-query-gpu.csv", ["nvidia-smi", "--query-gpu=" + ",".join(gpu.SMI_GPU_FIELDS),
                               "--format=csv,noheader,nounits"]),
        ("smi-query-apps.csv", ["nvidia-smi", "--query-compute-apps="
                                + ",".join(gpu.SMI_APP_FIELDS), "--format=csv,noheader,nounits"]),
        ("smi-banner.txt", ["nvidia-smi"]),
    ]
    for name, argv in smi:
        try:
            p = subprocess.run(argv, capture_output=True, timeout=60)
            text = p.stdout.decode("utf-8", "replace") + p.stderr.decode("utf-8", "replace")
        except (OSError, subprocess.TimeoutExpired) as exc:
            text = f"# could not run {argv[0]}: {exc}\n"
        with open(os.path.join(outdir, name), "w") as f:
            f.write(text)
        written.append(name)
    for name, path in (("proc-devices.txt", "/proc/devices"),
                       ("devices-list.txt", "/sys/fs/cgroup/devices/devices.list")):
        try:
            with open(path) as src, open(os.path.join(outdir, name), "w") as dst:
                dst.write(src.read())
            written.append(name)
        except OSError:
            pass
    return written


def _cross_check(nvml: dict, smi: dict, uvm: dict) -> list:
    problems = []
    for name, facts in (("NVML", nvml), ("nvidia-smi", smi)):
        if facts.get("error"):
            problems.append(f"{name}: {facts['error']}")
    if nvml.get("source") == "nvml" and smi.get("source") == "nvidia-smi":
        if nvml["count"] != smi["count"]:
            problems.append(f"GPU count: NVML {nvml['count']} vs nvidia-smi {smi['count']}")
        if nvml["driver_version"] != smi["driver_version"]:
            problems.append(f"driver: NVML {nvml['driver_version']} vs nvidia-smi "
                            f"{smi['driver_version']}")
        if nvml["cuda_driver_version"] != smi["cuda_driver_version"]:
            problems.append(f"CUDA driver version: NVML {nvml['cuda_driver_version']} vs "
                            f"nvidia-smi {smi['cuda_driver_version']}")
        for a, b in zip(nvml["devices"], smi["devices"]):  # noqa: B905  (3.8: no strict=)
            for key in ("name", "uuid", "memory_total_mib", "compute_capability",
                        "ecc_uncorrected", "persistence_mode"):
                if b.get(key) is not None and a.get(key) != b.get(key):
                    problems.append(f"GPU {a.get('index')} {key}: NVML {a.get(key)!r} vs "
                                    f"nvidia-smi {b.get(key)!r}")
        pa = sorted((p["pid"], p["gpu_index"]) for p in nvml["processes"])
        pb = sorted((p["pid"], p["gpu_index"]) for p in smi["processes"])
        if pa != pb:
            problems.append(f"processes: NVML {pa} vs nvidia-smi {pb}")
    cuda = uvm.get("cuda_init") or {}
    if cuda.get("code") != 0:
        problems.append(f"cuInit(0) = {cuda.get('code')} ({cuda.get('name') or cuda.get('error')})")
    if uvm.get("proc_major") is not None and uvm.get("major_match") is False:
        problems.append(f"/dev/nvidia-uvm major {uvm['node'].get('major')} != /proc/devices "
                        f"{uvm['proc_major']}")
    return problems


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", metavar="DIR", help="also save the raw tool outputs here")
    args = ap.parse_args(argv)
    nvml = gpu.gpu_facts(nvml=True)
    smi = gpu.gpu_facts(nvml=False)
    uvm = gpu.uvm_facts(cuda=True)
    out = {"gpu_facts": nvml, "gpu_facts_nvidia_smi": smi, "uvm_facts": uvm,
           "shm_facts": gpu.shm_facts(), "kernel_xid": gpu.kernel_xid()}
    problems = _cross_check(nvml, smi, uvm)
    out["cross_check"] = problems
    if args.record:
        out["recorded"] = _record(args.record)
    print(json.dumps(out, indent=1, sort_keys=True))
    for p in problems:
        print("MISMATCH/PROBLEM:", p, file=sys.stderr)
    if not problems:
        print("OK: NVML and nvidia-smi agree; cuInit(0) = 0", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
