"""Controller-side verdicts shared by the pyinfra and Fabric anchors (the Ansible play has the
same rules as Jinja `failed_when`/`assert` expressions).

Each function takes what the host answered (already parsed) and the run's `expect` block (from
the inventory the benchmark generates out of playbooks/kimi-k2.6-eagle3.yaml and its model
profile) and returns the problems found: an empty list means converged. See
docs/bench-anchors.md for which stage of ours each one mirrors.
"""

from __future__ import annotations

import json
import re
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

SMI_FIELDS = "index,name,memory.total,compute_cap,driver_version"
SMI_QUERY = f"nvidia-smi --query-gpu={SMI_FIELDS} --format=csv,noheader,nounits"


def canonical(name: str) -> str:
    """PEP 503 normalized distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def gpus(smi_csv: str, expect: dict[str, Any]) -> list[str]:
    """host_health (GPU part): count, memory, compute capability, driver."""
    rows = [[c.strip() for c in line.split(",")] for line in smi_csv.splitlines() if line.strip()]
    problems = []
    if len(rows) < expect["gpus"]:
        problems.append(f"{len(rows)} GPUs, {expect['gpus']} needed")
    for row in rows:
        if len(row) != 5:
            problems.append(f"unexpected nvidia-smi row: {row}")
            continue
        index, _name, mem, cc, driver = row
        if not mem.isdigit() or int(mem) < expect["min_gpu_memory_mib"]:
            problems.append(f"GPU {index}: {mem} MiB < {expect['min_gpu_memory_mib']} MiB")
        if cc != expect["compute_capability"]:
            problems.append(f"GPU {index}: compute capability {cc}")
        if _version(driver) < _version(expect["min_driver"]):
            problems.append(f"GPU {index}: driver {driver} < {expect['min_driver']}")
    return problems


def pins(installed: dict[str, str], expect: dict[str, Any]) -> list[str]:
    """pip_install: every pinned distribution installed in a version its specifier admits.

    `installed` maps names (any spelling) to versions.
    """
    have = {canonical(k): v for k, v in installed.items()}
    problems = []
    for req in expect["pins"]:
        name, spec = canonical(req["name"]), SpecifierSet(req["specifier"])
        got = have.get(name)
        try:
            ok = got is not None and Version(got) in spec
        except InvalidVersion:
            ok = False
        if not ok:
            problems.append(f"{req['name']}{spec}: installed {got}")
    return problems


def download(manifest_text: str, hub_text: str, sizes_text: str, repo: str) -> list[str]:
    """hf_download: the manifest is this repo at the hub's commit, every file has its size.

    `sizes_text` is `find DIR -type f -printf '%P\\t%s\\n'`.
    """
    manifest, hub = json.loads(manifest_text), json.loads(hub_text)
    sizes = {}
    for line in sizes_text.splitlines():
        path, _, size = line.rpartition("\t")
        if path:
            sizes[path] = int(size)
    problems = []
    if manifest.get("repo") != repo:
        problems.append(f"the manifest holds {manifest.get('repo')}, not {repo}")
    if manifest.get("commit") != hub.get("sha"):
        problems.append(f"commit {manifest.get('commit')} on disk, the hub has {hub.get('sha')}")
    for f in manifest.get("files", []):
        if sizes.get(f["path"]) != f["size"]:
            problems.append(f"{f['path']}: size {sizes.get(f['path'])} != {f['size']}")
    return problems


def drafter_fits(drafter_text: str, target_text: str, expect: dict[str, Any]) -> list[str]:
    """inspect_config: architecture, one layer, hidden and vocab size equal to the target's."""
    drafter, target = json.loads(drafter_text), json.loads(target_text)
    want = expect["drafter"]
    problems = []
    if want["architecture"] not in (drafter.get("architectures") or []):
        problems.append(f"drafter architectures {drafter.get('architectures')}")
    if drafter.get("num_hidden_layers") != want["num_hidden_layers"]:
        problems.append(f"drafter num_hidden_layers {drafter.get('num_hidden_layers')}")
    for key in expect["same_as_target"]:
        ref = target.get(key, (target.get("text_config") or {}).get(key))
        if drafter.get(key) != ref:
            problems.append(f"drafter {key} {drafter.get(key)} != target {ref}")
    return problems


def server(pidfile: dict[str, Any], proc_text: str, target_dir: str,
           drafter_dir: str) -> list[str]:
    """sglang_server: the recorded pid is alive, the same process (start time), and serves the
    target with the drafter. `proc_text`: starttime, then the cmdline one argument a line."""
    lines = proc_text.splitlines()
    problems = []
    if not lines or not lines[0].strip().isdigit() or int(lines[0]) != pidfile.get("starttime"):
        problems.append(f"pid {pidfile.get('pid')} is not the process we started")
    args = lines[1:]
    for flag, path in (("--model-path", target_dir),
                       ("--speculative-draft-model-path", drafter_dir)):
        if flag not in args or args[args.index(flag) + 1:args.index(flag) + 2] != [path]:
            problems.append(f"the server does not run {flag} {path}")
    return problems


def ready(pidfile: dict[str, Any], marker: dict[str, Any], models: dict[str, Any],
          model_info: dict[str, Any], server_info: dict[str, Any],
          expect: dict[str, Any]) -> list[str]:
    """wait_ready: this instance was verified; it serves the model, the architecture, and
    speculative decoding above the floor (/health was answered 200 by then)."""
    problems = []
    if marker.get("pid") != pidfile.get("pid"):
        problems.append(f"ready.json names pid {marker.get('pid')}, not {pidfile.get('pid')}")
    ids = [m.get("id") for m in models.get("data", [])]
    if expect["served_model_name"] not in ids:
        problems.append(f"/v1/models lists {ids}")
    if expect["target"]["architecture"] not in (model_info.get("architectures") or []):
        problems.append(f"/model_info architectures {model_info.get('architectures')}")
    states = server_info.get("internal_states") or [{}]
    accept = states[0].get("avg_spec_accept_length")
    if not isinstance(accept, (int, float)) or accept <= expect["min_accept_length"]:
        problems.append(f"accept length {accept} <= {expect['min_accept_length']}")
    return problems
