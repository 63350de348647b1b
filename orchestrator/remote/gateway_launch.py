"""Start SMG (the Shepherd Model Gateway) with its keys read from 0600 files, or check a launch.

Runs ON the gateway host with the gateway venv's python (stdlib only here; `smg` is imported
inside that venv):

    PY STATE/gateway_launch.py run STATE/gateway.json      # the supervisor's child
    PY -c "$(source)" check '{"args": [...], ...}'          # before the old gateway is touched

gateway.json: {"args" (no worker URLs, no keys), "worker_urls", "api_key_file",
"control_plane_key_file"}. `run` reads each key file (`read_key`), appends the worker URLs and
key flags (`full_args`) and calls smg's own `parse_router_args()` + `launch_router()` in this
process (smg 1.13.0 wheel smg/launch_router.py:21-63, 74-118): no key is ever on an argv, and
launch_router renames the process `smg::router` (launch_router.py:32).

`check`, with throw-away keys: the parser (argparse, then RouterArgs.from_cli_args:
launch_router.py:117-118), `_validate_router_args()` and `Router.from_args()` (launch_router.py:
47, 58); with "probe": true it then STARTS the gateway in a forked child on spare loopback ports
without workers, since the Rust RouterConfig::validate() runs only in Router.start() (smg 1.13.0
bindings/python/src/lib.rs:1840-1850), waits for /health ("probe_timeout") and kills it. The
last stdout line is `ORCH_RESULT {json}`: {"available": true, "ok": true, "version"}, or
{"available": true, "ok": false, "kind": "argparse"|"ValueError"|"start"|..., "message"}, or
{"available": false, "kind": "ModuleNotFoundError", "message"}.
"""

import contextlib
import io
import json
import os
import secrets
import signal
import socket
import stat
import sys
import tempfile
import time
import urllib.request

CONTROL_ID = "orchestrator"  # orchestrator.sglang.gateway.CONTROL_ID


class KeyFileError(Exception):
    """A key file that must not be used (never carries the key)."""


def read_key(path):
    """The key in PATH, refused unless PATH is ours (effective uid) and mode 0600 or tighter."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise KeyFileError(f"cannot open the key file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"the key file {path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise KeyFileError(f"the key file {path} belongs to uid {st.st_uid}, not to us "
                               f"(uid {os.geteuid()})")
        if st.st_mode & 0o077:
            raise KeyFileError(f"the key file {path} has mode {stat.S_IMODE(st.st_mode):04o}; "
                               "it must be 0600 (no group or other access)")
        key = fh.read().decode("utf-8").strip()
    if not key:
        raise KeyFileError(f"the key file {path} is empty")
    return key


def full_args(spec, api_key, control_key):
    """args + --worker-urls + the key flags (one token each: a key that starts with '-' stays a
    value)."""
    args = list(spec.get("args") or [])
    urls = list(spec.get("worker_urls") or [])
    if urls:
        args += ["--worker-urls", *urls]
    if api_key:
        args.append("--api-key=" + api_key)
    if control_key:
        args.append(f"--control-plane-api-keys={CONTROL_ID}:{CONTROL_ID}:admin:{control_key}")
    return args


def run(spec_path):
    """Read the launch JSON and its keys, then run the gateway in this process (blocks)."""
    with open(spec_path) as fh:
        spec = json.load(fh)
    try:
        api_key, control = (read_key(spec[k]) if spec.get(k) else None
                            for k in ("api_key_file", "control_plane_key_file"))
    except KeyFileError as exc:
        print(f"gateway_launch: refused: {exc}", file=sys.stderr, flush=True)
        return 2
    from smg.launch_router import launch_router, parse_router_args

    urls = spec.get("worker_urls") or []
    print(f"gateway_launch: starting smg with {len(urls)} worker(s): {' '.join(urls)}",
          flush=True)
    launch_router(parse_router_args(full_args(spec, api_key, control)))
    return 0


def _parse(argv):
    """smg's own parser; (router_args, None) or (None, verdict)."""
    from smg.launch_router import parse_router_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse_router_args(argv), None
    except SystemExit:
        lines = [x for x in err.getvalue().splitlines() if x.strip()]
        return None, {"available": True, "ok": False, "kind": "argparse",
                      "message": lines[-1] if lines else "argparse refused the arguments"}
    except Exception as exc:  # noqa: BLE001 - reported as data
        return None, {"available": True, "ok": False, "kind": type(exc).__name__,
                      "message": str(exc)}


def spare_port():
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe_argv(argv):
    """ARGV bound to spare loopback ports, without workers: what the probe starts."""
    swap = {"--host": "127.0.0.1", "--prometheus-host": "127.0.0.1",
            "--port": str(spare_port()), "--prometheus-port": str(spare_port())}
    out, rest = [], iter(argv)
    for a in rest:
        while a == "--worker-urls":
            a = next((x for x in rest if not x.startswith(("http://", "https://"))), None)
        if a in swap:
            out += [a, swap[a]]
            next(rest, None)  # its value
        elif a is not None:
            out.append(a)
    return out + [x for flag, value in swap.items() if flag not in argv for x in (flag, value)]


def _health(port, timeout=1.0):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/health", timeout=timeout) as resp:
            return resp.status == 200
    except Exception:  # noqa: BLE001 - not up yet
        return False


def _tail(fh, n=8):
    fh.seek(0)
    lines = [x for x in fh.read().decode("utf-8", "replace").splitlines() if x.strip()]
    return "\n".join(lines[-n:])


def probe_start(argv, timeout):
    """Start the gateway of ARGV in a forked child, wait for /health, kill it; the verdict."""
    from smg.launch_router import launch_router, parse_router_args

    port = int(argv[argv.index("--port") + 1])
    out = tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:  # the child: the gateway itself, its output to the temp file
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            launch_router(parse_router_args(argv))
            print("gateway_launch: the gateway returned", flush=True)
        except BaseException as exc:  # noqa: BLE001 - the verdict's message
            print(f"gateway_launch: {type(exc).__name__}: {exc}", flush=True)
        os._exit(3)
    deadline = time.monotonic() + timeout
    verdict = None
    try:
        while verdict is None:
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                pid = 0
                said = [x for x in _tail(out, 50).splitlines()
                        if x.startswith("gateway_launch: ")]
                verdict = {"available": True, "ok": False, "kind": "start",
                           "message": said[-1][16:] if said else _tail(out)}
            elif _health(port):
                verdict = {"available": True, "ok": True}
            elif time.monotonic() > deadline:
                verdict = {"available": True, "ok": False, "kind": "timeout",
                           "message": f"no /health within {timeout:.0f}s: " + _tail(out, 3)}
            else:
                time.sleep(0.1)
    finally:
        if pid:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
        out.close()
    return verdict


def check(spec):
    """The verdict on the launch of SPEC (see the module docstring)."""
    try:
        from smg.launch_router import Router
    except Exception as exc:  # noqa: BLE001 - reported as data
        return {"available": False, "kind": type(exc).__name__, "message": str(exc)}
    keys = spec.get("keys") or {}
    argv = full_args(spec, secrets.token_hex(16) if keys.get("api_key") else None,
                     secrets.token_hex(16) if keys.get("control_plane_key") else None)
    router_args, verdict = _parse(argv)
    if verdict is not None:
        return verdict
    try:
        router_args._validate_router_args()
        if Router is None:
            raise RuntimeError("Rust Router is not installed")
        Router.from_args(router_args)
    except Exception as exc:  # noqa: BLE001 - reported as data
        return {"available": True, "ok": False, "kind": type(exc).__name__, "message": str(exc)}
    verdict = {"available": True, "ok": True}
    if spec.get("probe"):
        verdict = probe_start(probe_argv(argv), float(spec.get("probe_timeout") or 60))
    verdict["version"] = _version()
    return verdict


def _version():
    try:
        from importlib.metadata import version
        return version("smg")
    except Exception:  # noqa: BLE001 - unknown
        return None


def main(argv=None):
    """`run SPEC_PATH` or `check SPEC_JSON` (see the module docstring)."""
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2 or args[0] not in ("run", "check"):
        print("usage: gateway_launch.py run SPEC_PATH | check SPEC_JSON", file=sys.stderr)
        return 2
    if args[0] == "run":
        return run(args[1])
    print("ORCH_RESULT " + json.dumps(check(json.loads(args[1])), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
