"""The SGLang launch: server arguments, environment, the API-key wrapper, fingerprint, unit file.

The server command is

    VENV_PYTHON -c WRAPPER KEY_FILE|- --model-path ... --tp-size 8 ...

where WRAPPER (one line of Python) reads the API key from KEY_FILE (0600, in the state dir) and
appends `--api-key KEY` to sys.argv in-process before running `sglang.launch_server` as
`__main__` (runpy, like `python -m`). So the key never appears on any process's command line
(`ps`, /proc/*/cmdline). SGLang has no documented environment variable for the API key, hence the
wrapper. The server's log is written through the supervisor (orchestrator.remote.server), which
masks the key before it reaches the file (SGLang logs its server_args at start-up).

The FINGERPRINT identifies a launch: sha256 over the server arguments, the environment (values
hashed), the SGLang version, the identity of the model and drafter (their download manifest's
commit, else a hash of config.json) and a hash of the API key. A running server with another
fingerprint is restarted; `diff_fingerprints` says what changed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import StageError

#: One line: `python -c WRAPPER KEYFILE ARGS...` (KEYFILE "-" = no key)
WRAPPER = (
    "import runpy,sys;f=sys.argv.pop(1);k=open(f).read().strip() if f!='-' else '';"
    "sys.argv+=['--api-key',k] if k else [];"
    "runpy.run_module('sglang.launch_server',run_name='__main__',alter_sys=True)"
)

#: The compile/JIT/autotune caches a server fills while it starts (its CUDA-graph capture and
#: warm-up compile Triton, FlashInfer and DeepGEMM kernels), each pointed at a folder under the
#: kernel cache dir, relative names here. Their defaults are lost or shared otherwise:
#: - SGLANG_CACHE_DIR, SGLang's own (FlashInfer autotune results keyed by sm arch and model,
#:   model_executor/runner/flashinfer_autotune.py:164-200; CuTe AOT kernels): ~/.cache/sglang
#:   (0.5.23 srt/environ.py:1383); 0.5.23 also redirects the third-party caches below under it
#:   by setdefault (environ.py:2308-2336), so the explicit ones here win;
#: - SGLANG_DG_CACHE_DIR -> DG_JIT_CACHE_DIR, DeepGEMM's JIT kernels: ~/.cache/deep_gemm
#:   (0.5.9 srt/environ.py:357, layers/deep_gemm_wrapper/compile_utils.py:33-35), under
#:   SGLANG_CACHE_DIR in 0.5.23 (environ.py:1373, compile_utils.py:51);
#: - TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR (torch's default is under /tmp, wiped by a
#:   reboot), CUDA_CACHE_PATH (PTX JIT), TILELANG_CACHE_DIR, FLASHINFER_WORKSPACE_BASE
#:   (FlashInfer appends .cache/flashinfer itself): the names 0.5.23 sets (environ.py:2308-2321);
#: - TORCH_EXTENSIONS_DIR (torch cpp_extension builds), TVM_FFI_CACHE_DIR (sgl-kernel JIT).
CACHE_ENV = {
    "SGLANG_CACHE_DIR": "sglang",
    "SGLANG_DG_CACHE_DIR": "deep_gemm",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "CUDA_CACHE_PATH": "cuda",
    "TILELANG_CACHE_DIR": "tilelang",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
    "TVM_FFI_CACHE_DIR": "tvm_ffi",
}


def kernel_cache_dir(python: str, state_cache: str, version: str | None) -> str:
    """Where a release's kernel caches live: VENV/../kernel-cache/sglang-VERSION beside the venv
    of `python` (VENV/bin/python), else STATE_CACHE/sglang-VERSION; a new release starts with
    empty caches, a re-run or a reboot keeps them. The GPU needs no folder of its own: each
    cache keys its entries by the device's arch (FlashInfer autotune: sm{major}{minor},
    flashinfer_autotune.py:166-168 (0.5.23))."""
    tag = f"sglang-{version or 'unknown'}"
    parts = python.rstrip("/").split("/")
    if len(parts) >= 4 and parts[-2] == "bin" and python.startswith("/"):
        return "/".join(parts[:-3] + ["kernel-cache", tag])
    return f"{state_cache.rstrip('/')}/{tag}"


def _num(value: float | int) -> str:
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def build_args(p: Any) -> list[str]:
    """Server arguments (after `-m sglang.launch_server`) for sglang_server params `p`.

    Full flag names only (`--tp-size`, never the `--tp` prefix). The API key is NOT included.
    """
    args = ["--model-path", p.model_path, "--tp-size", str(p.tp)]
    if p.host is not None:
        args += ["--host", p.host]
    if p.port is not None:
        args += ["--port", str(p.port)]
    optional = [
        ("--served-model-name", p.served_model_name),
        ("--tool-call-parser", p.tool_call_parser),
        ("--reasoning-parser", p.reasoning_parser),
        ("--mem-fraction-static", p.mem_fraction_static),
        ("--context-length", p.context_length),
        ("--max-running-requests", p.max_running_requests),
        ("--kv-cache-dtype", p.kv_cache_dtype),
        ("--attention-backend", p.attention_backend),
        ("--quantization", p.quantization),
        ("--log-level", p.log_level),
    ]
    for flag, value in optional:
        if value is not None:
            args += [flag, _num(value) if isinstance(value, float) else str(value)]
    if p.trust_remote_code:
        args.append("--trust-remote-code")
    if p.enable_metrics:
        args.append("--enable-metrics")
    spec = p.speculative
    if spec is not None and spec.algorithm:
        args += ["--speculative-algorithm", spec.algorithm]
        if p.draft_model_path:
            args += ["--speculative-draft-model-path", p.draft_model_path]
            if spec.draft_model_revision:
                args += ["--speculative-draft-model-revision", spec.draft_model_revision]
        for flag, value in (("--speculative-num-steps", spec.num_steps),
                            ("--speculative-eagle-topk", spec.eagle_topk),
                            ("--speculative-num-draft-tokens", spec.num_draft_tokens)):
            if value is not None:
                args += [flag, str(value)]
    args += [str(a) for a in p.extra_args]
    return args


def server_argv(python: str, key_file: str | None, args: list[str]) -> list[str]:
    """The full server command: the venv python running WRAPPER, then the server arguments."""
    return [python, "-c", WRAPPER, key_file or "-", *args]


def cache_env(cache_dir: str) -> dict[str, str]:
    """Environment pointing JIT/compile caches at persistent folders under `cache_dir`."""
    base = cache_dir.rstrip("/")
    return {name: f"{base}/{sub}" for name, sub in CACHE_ENV.items()}


def launch_env(cache_dir: str | None, env: Mapping[str, str]) -> dict[str, str]:
    """Server environment: cache folders, millisecond log stamps (SGLANG_LOG_MS: the load
    timeline's resolution; environ.py:354 (0.5.23), read by configure_logger, utils/common.py
    :1227 (0.5.9), :2629 (0.5.23)), then the stage's `env` (which may override them)."""
    out = cache_env(cache_dir) if cache_dir else {}
    out["SGLANG_LOG_MS"] = "1"
    out.update({str(k): str(v) for k, v in env.items()})
    return out


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


#: The launch spec's "restart" policy that `restart_on_failure: true` writes (the supervisor,
#: orchestrator/remote/supervisor.py, reads it): restart a server that failed, after 1, 2, 4 ...
#: up to 30 s, and give up after 5 restarts within 300 s.
RESTART_ON_FAILURE: dict[str, float] = {"max": 5, "window_s": 300, "backoff_s": 1,
                                        "backoff_max_s": 30}
#: The supervisor's exit statuses after which systemd must not restart it: it gave up (3), the
#: server cannot be executed (127) (orchestrator/remote/supervisor.py GAVE_UP, CANNOT_START).
SUPERVISOR_FINAL_STATUSES = (3, 127)


def fingerprint(
    args: list[str],
    env: Mapping[str, str],
    *,
    sglang_version: str | None,
    model_identity: str,
    draft_identity: str | None,
    api_key: str | None,
    python: str,
    restart: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The launch fingerprint: a sha256 plus the parts it was made from (no secret values).
    A restart policy is a part only when there is one (no policy: the digest of before)."""
    parts: dict[str, Any] = {
        "python": python,
        "args": list(args),
        "env": {k: _sha(f"{k}={v}")[:16] for k, v in sorted(env.items())},
        "sglang": sglang_version,
        "model": model_identity,
        "drafter": draft_identity,
        "api_key": _sha("api-key:" + api_key)[:16] if api_key else None,
    }
    if restart:
        parts["restart"] = dict(restart)
    digest = _sha(json.dumps(parts, sort_keys=True))
    return {"fingerprint": digest, "parts": parts}


def _arg_pairs(args: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    key = None
    for a in args:
        if a.startswith("--"):
            key = a
            out[key] = ""
        elif key is not None:
            out[key] = (out[key] + " " + a).strip()
    return out


def diff_fingerprints(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """Human-readable differences between two fingerprint records (values of secrets hidden)."""
    if not old or "parts" not in old:
        return ["no fingerprint recorded"]
    a, b = old["parts"], new["parts"]
    out: list[str] = []
    if a.get("args") != b.get("args"):
        pa, pb = _arg_pairs(a.get("args") or []), _arg_pairs(b.get("args") or [])
        for k in sorted(set(pa) | set(pb)):
            if pa.get(k) != pb.get(k):
                before = "(unset)" if k not in pa else (pa[k] or "(set)")
                after = "(unset)" if k not in pb else (pb[k] or "(set)")
                out.append(f"{k} {before} -> {after}")
        if not out:
            out.append("argument order")
    ea, eb = a.get("env") or {}, b.get("env") or {}
    for k in sorted(set(ea) | set(eb)):
        if ea.get(k) != eb.get(k):
            out.append(f"env {k} " + ("added" if k not in ea else "removed" if k not in eb
                                      else "changed"))
    for key, label in (("sglang", "sglang version"), ("model", "model"),
                       ("drafter", "drafter"), ("python", "python")):
        if a.get(key) != b.get(key):
            out.append(f"{label} {a.get(key)} -> {b.get(key)}")
    if a.get("api_key") != b.get("api_key"):
        out.append("api key changed")
    if a.get("restart") != b.get("restart"):
        out.append(f"restart on failure {a.get('restart') or 'off'} -> "
                   f"{b.get('restart') or 'off'}")
    return out or ["fingerprint differs"]


def unit_file(
    *,
    unit: str,
    description: str,
    python: str,
    supervisor: str,
    launch_file: str,
    state_dir: str,
    stop_timeout: float,
    restart: Mapping[str, Any] | None = None,
) -> str:
    """A systemd service running the supervisor (the launch spec and key live in 0600 files).

    Values are written as data for systemd: one line each (a newline in a path would add
    directives such as ExecStartPre=; it is refused), `%` specifiers and `$` variables escaped.

    With a RESTART policy (the supervisor restarts the server itself) the unit restarts the
    supervisor when IT dies: systemd.service(5) `Restart=on-failure` (a non-zero exit status, a
    signal other than SIGHUP/SIGINT/SIGTERM/SIGPIPE, a timeout; never after `systemctl stop`),
    `RestartSec=` the policy's backoff_s, `RestartPreventExitStatus=` the supervisor's final
    statuses (it gave up: systemd must not start the crash loop over); and systemd.unit(5)
    `StartLimitIntervalSec=`/`StartLimitBurst=` (in [Unit]) bound the supervisor's own restarts
    by the policy's window_s and max. Without one: `Restart=no`, as before.
    """
    exec_start = " ".join(_unit_word(w) for w in (python, supervisor, launch_file))
    description = _CONTROL.sub(" ", description).replace("%", "%%")
    return (
        "# Written by orchestrator (sglang_server stage); changes are overwritten.\n"
        "[Unit]\n"
        f"Description={description}\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        + _start_limit(restart) +
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"WorkingDirectory={_unit_value(state_dir, 'state_dir').replace('%', '%%')}\n"
        f"ExecStart={exec_start}\n"
        "KillMode=control-group\n"
        "KillSignal=SIGTERM\n"
        f"TimeoutStopSec={int(stop_timeout)}\n"
        + _restart_lines(restart) +
        "LimitNOFILE=1048576\n"
        "LimitMEMLOCK=infinity\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def _start_limit(restart: Mapping[str, Any] | None) -> str:
    if not restart:
        return ""
    return (f"StartLimitIntervalSec={int(float(restart.get('window_s', 300)))}\n"
            f"StartLimitBurst={int(restart.get('max', 5))}\n")


def _restart_lines(restart: Mapping[str, Any] | None) -> str:
    if not restart:
        return "Restart=no\n"
    final = " ".join(str(s) for s in SUPERVISOR_FINAL_STATUSES)
    return ("Restart=on-failure\n"
            f"RestartSec={max(1, int(float(restart.get('backoff_s', 1))))}\n"
            f"RestartPreventExitStatus={final}\n")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_UNIT_SAFE = re.compile(r"[\w@+=:,./-]+")


def _unit_value(text: str, what: str) -> str:
    if _CONTROL.search(text):
        raise StageError(f"{what} {text!r} holds a control character (newline, tab, ...); it "
                         "cannot be written into a systemd unit",
                         hint=f"use a plain path for {what}, or set `systemd: never`")
    return text


def _unit_word(text: str) -> str:
    """One ExecStart= argument: as is when plain, else double-quoted with C escapes; `%` and `$`
    doubled (systemd expands specifiers and variables inside quotes too)."""
    _unit_value(text, "the server command")
    if _UNIT_SAFE.fullmatch(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("%", "%%").replace("$", "$$") + '"'


def unit_name(name: str) -> str:
    """`name` with the `.service` suffix."""
    return name if name.endswith(".service") else f"{name}.service"
