#!/usr/bin/env python3
"""Run a real SGLang release's start-up argument validation without torch or a GPU.

    python run_real.py --sglang-src .cache/real-serverargs/src/0.5.23 --gpu-cc 12.0 \
        --gpu-mib 97887 --gpus 8 [--env K=V ...] -- <launch_server argv...>

Prints one JSON line: {"ok": bool, "kind": "argparse"|<exception class>|"ok", "message": str,
"seconds": float, ...}.

The parent picks the dependency venv matching the release's transformers pin (venvs/tf-*),
then starts a child `python -I -S run_real.py --child ...` whose sys.path is exactly
[stubs/, <sglang src>, <venv site-packages>], with the fake nvidia-smi first on PATH and the
hub offline. The child calls the release's own `prepare_server_args(argv)` (every release
0.5.9..0.5.23 has it: argparse, then ServerArgs(...) and its __post_init__ checks), exactly as
`python -m sglang.launch_server` does before it starts any process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STUBS = os.path.join(HERE, "stubs")
#: the dependency venvs (setup.sh builds them): one per transformers pin
VENVS = os.environ.get("REALARGS_VENVS") or os.path.join(
    HERE, "..", "..", ".cache", "real-serverargs", "venvs")

#: top-level packages served as permissive Dummies when not installed (see NOTES.md, stubs/)
PERMISSIVE = (
    "flashinfer",
    "sgl_kernel",
    "compressed_tensors",
    "torchvision",
    "aiohttp",
    "IPython",
    "triton",
    "torch",
)

#: release -> torch version it pins (the fake torch reports it; 0.5.9/0.5.10's cuDNN check
#: looks at it, server_args.py:5270)
TORCH = {"0.5.9": "2.9.1", "0.5.10": "2.9.1", "0.5.12": "2.11.0", "0.5.15": "2.11.0",
         "0.5.19": "2.13.0", "0.5.20": "2.13.0", "0.5.21": "2.13.0", "0.5.22": "2.14.1",
         "0.5.23": "2.14.1"}

#: release -> transformers version it pins (wheel METADATA Requires-Dist)
TRANSFORMERS = {"0.5.9": "4.57.1", "0.5.10": "5.3.0", "0.5.12": "5.6.0", "0.5.15": "5.12.1",
                "0.5.19": "5.12.1", "0.5.20": "5.12.1", "0.5.21": "5.12.1",
                "0.5.22": "5.19.0", "0.5.23": "5.19.0"}


def release_of(src: str) -> str:
    return os.path.basename(os.path.normpath(src))


def venv_for(release: str) -> str:
    want = TRANSFORMERS.get(release, "5.19.0")
    path = os.path.join(VENVS, f"tf-{want}")
    if not os.path.isdir(path):  # fall back to the nearest installed one, and say so
        have = sorted(d for d in os.listdir(VENVS) if d.startswith("tf-") and
                      os.path.isdir(os.path.join(VENVS, d)))
        major = want.split(".")[0]
        same = [d for d in have if d[3:].split(".")[0] == major] or have
        path = os.path.join(VENVS, same[-1])
    return path


def site_packages(venv: str) -> str:
    lib = os.path.join(venv, "lib")
    py = next(d for d in os.listdir(lib) if d.startswith("python"))
    return os.path.join(lib, py, "site-packages")


# ------------------------------------------------------------------------------------ child ----
def child(src: str, argv: list[str]) -> dict:
    sys.path[:0] = [STUBS, src]
    sys.path.append(site_packages_arg)
    import importlib.util  # noqa: F401

    from _permissive import PermissiveFinder, dump_trace

    # importlib.metadata must see a torch distribution: transformers decides "PyTorch is
    # available" from it (4.57 utils/import_utils.py _is_package_available("torch")) and, when
    # it is not, its torch-only classes raise ImportError on first use -- e.g. 0.5.9 imports
    # transformers' modeling_llama while resolving arguments. A real host has torch installed.
    meta = os.path.join(os.environ["HOME"], "dist")
    ver = os.environ.get("REALARGS_TORCH_VERSION", "2.14.1")
    info = os.path.join(meta, f"torch-{ver.split('+')[0]}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as fh:
        fh.write(f"Metadata-Version: 2.1\nName: torch\nVersion: {ver}\n")
    sys.path.append(meta)

    sys.meta_path.append(PermissiveFinder(PERMISSIVE))
    import contextlib
    import io
    import traceback

    started = time.monotonic()
    captured = io.StringIO()
    result: dict
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            from sglang.srt.server_args import prepare_server_args
    except BaseException as exc:  # noqa: BLE001
        tb = traceback.extract_tb(exc.__traceback__)
        return {"ok": False, "kind": "import:" + type(exc).__name__, "message": str(exc)[:800],
                "where": f"{tb[-1].filename}:{tb[-1].lineno}" if tb else "",
                "log": captured.getvalue()[-3000:], "seconds": time.monotonic() - started}
    imported = time.monotonic()
    stage = "prepare"
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            # 1. what `python -m sglang.launch_server` calls first (argparse + ServerArgs(...);
            #    up to 0.5.15 ServerArgs.__post_init__ holds the start-time rules)
            server_args = prepare_server_args(list(argv))
            # 2. 0.5.19+: __post_init__ is empty, the rules run in resolve_once(), called by
            #    launch_server.run_server (0.5.23 launch_server.py:29) and
            #    Engine._launch_subprocesses (0.5.23 entrypoints/engine.py:1153)
            if hasattr(server_args, "resolve_once"):
                stage = "resolve"
                server_args.resolve_once()
            # 3. every release: Engine._launch_subprocesses runs check_server_args() before it
            #    spawns anything (0.5.9 entrypoints/engine.py:1026, 0.5.23 :1165)
            if STAGES_CHECK:
                stage = "check"
                server_args.check_server_args()
    except SystemExit as exc:  # argparse: usage + "error: ..." on stderr, exit 2
        lines = [ln for ln in captured.getvalue().splitlines() if ln.strip()]
        err = [ln for ln in lines if "error:" in ln]
        result = {"ok": False, "kind": "argparse", "code": exc.code, "stage": stage,
                  "message": (err[-1] if err else "\n".join(lines[-3:]))[:1500]}
    except BaseException as exc:  # noqa: BLE001 - ServerArgs raises anything
        text = str(exc) or traceback.format_exc().strip().splitlines()[-1]
        tb = traceback.extract_tb(exc.__traceback__)
        result = {"ok": False, "kind": type(exc).__name__, "message": text[:1500],
                  "stage": stage,
                  "where": f"{tb[-1].filename}:{tb[-1].lineno}" if tb else "",
                  "trace": [f"{f.filename.replace(src + '/', '')}:{f.lineno}" for f in tb
                            if "/copy.py" not in f.filename][-10:]}
    else:
        fields = {}
        for k in ("tp_size", "speculative_algorithm", "speculative_num_steps",
                  "speculative_eagle_topk", "speculative_num_draft_tokens", "served_model_name",
                  "attention_backend", "decode_attention_backend", "prefill_attention_backend",
                  "speculative_draft_attention_backend", "mem_fraction_static",
                  "context_length", "cuda_graph_max_bs", "max_running_requests",
                  "kv_cache_dtype", "quantization", "speculative_draft_model_path"):
            v = _resolved(server_args, k)
            fields[k] = v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
        result = {"ok": True, "kind": "ok", "message": "", "fields": fields}
    result["seconds"] = round(time.monotonic() - started, 3)
    result["import_seconds"] = round(imported - started, 3)
    if os.environ.get("REALARGS_LOG"):
        result["log"] = captured.getvalue()[-4000:]
    dump_trace()
    return result


site_packages_arg = ""
STAGES_CHECK = True


def _resolved(server_args, name):
    """A field's value after resolution (0.5.19+ keep resolved values off the raw record)."""
    try:
        from sglang.srt.arg_groups.overrides import resolving_view

        return getattr(resolving_view(server_args), name, None)
    except Exception:  # noqa: BLE001 - older releases: the record is resolved in place
        return getattr(server_args, name, None)


# ----------------------------------------------------------------------------------- parent ----
def run(src: str, argv: list[str], cc: str = "12.0", mib: int = 97887, gpus: int = 8,
        env: dict | None = None, timeout: float = 300) -> dict:
    """Run one validation in a fresh child; returns the JSON dict (also usable as a library)."""
    src = os.path.abspath(src)
    release = release_of(src)
    venv = venv_for(release)
    home = tempfile.mkdtemp(prefix="realargs-home-")
    child_env = {
        "PATH": os.path.join(STUBS, "bin") + os.pathsep + "/usr/bin:/bin",
        "HOME": home, "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": os.path.join(home, "hf"),
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
        "REALARGS_GPU_CC": cc, "REALARGS_GPU_MIB": str(mib), "REALARGS_GPUS": str(gpus),
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus)),
        "LANG": "C.UTF-8",
        "REALARGS_TORCH_VERSION": TORCH.get(release, "2.14.1") + "+cu129",
    }
    for k in ("REALARGS_TRACE", "REALARGS_LOG"):
        if k in os.environ:
            child_env[k] = os.environ[k]
    child_env.update(env or {})
    cmd = [os.path.join(venv, "bin", "python"), "-I", "-S", "-B", os.path.abspath(__file__),
           "--child", os.path.join(src, ""), site_packages(venv), json.dumps(argv)]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True,
                              timeout=timeout, cwd=os.getcwd())  # relative --model-path
    except subprocess.TimeoutExpired:
        return {"ok": False, "kind": "timeout", "message": f"> {timeout}s",
                "seconds": timeout, "release": release}
    finally:
        subprocess.run(["rm", "-rf", home])
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("REALARGS_RESULT "):
            out = json.loads(line[len("REALARGS_RESULT "):])
            out["release"] = release
            out["wall_seconds"] = round(time.monotonic() - started, 3)
            out["venv"] = os.path.basename(venv)
            return out
    return {"ok": False, "kind": "harness", "message": (proc.stderr or proc.stdout)[-2000:],
            "seconds": time.monotonic() - started, "release": release}


def main() -> int:
    global site_packages_arg
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        src, site_packages_arg, argv = sys.argv[2].rstrip("/"), sys.argv[3], json.loads(sys.argv[4])
        result = child(src, argv)
        sys.stdout.write("REALARGS_RESULT " + json.dumps(result, default=str) + "\n")
        sys.stdout.flush()
        os._exit(0)  # skip atexit hooks of half-stubbed libraries
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sglang-src", required=True, help="directory holding the sglang package")
    ap.add_argument("--gpu-cc", default="12.0")
    ap.add_argument("--gpu-mib", type=int, default=97887)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--env", action="append", default=[], help="K=V for the child")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--full", action="store_true", help="print the whole result dict")
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    ns = ap.parse_args()
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    env = dict(kv.split("=", 1) for kv in ns.env)
    out = run(ns.sglang_src, argv, ns.gpu_cc, ns.gpu_mib, ns.gpus, env, ns.timeout)
    if not ns.full:
        out = {k: out[k] for k in ("ok", "kind", "message", "seconds") if k in out}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
