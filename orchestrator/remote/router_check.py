"""Run the installed sglang-router's own argument parsing and validation; start no router.

Runs ON the host with the router venv's python (stdlib only here; sglang_router is imported):

    VENV_PYTHON -c "$(cat router_check.py)" '["--host", "0.0.0.0", "--worker-urls", ...]'

It does what `python -m sglang_router.launch_router ARGS` does before the router starts
(sglang-router 0.3.2: launch_router.py:63-100 parse_router_args - argparse over
RouterArgs.add_cli_args(parser, use_router_prefix=False), then RouterArgs.from_cli_args -, and
launch_router.py:46 `_validate_router_args()`), importing only sglang_router.router_args
(its compiled module, not the web stack mini_lb needs). The last stdout line is
`ORCH_RESULT {json}`:

    {"available": true, "ok": true, "fields": {"worker_urls": [...], "policy": ..., ...}}
    {"available": true, "ok": false, "kind": "argparse", "message": "error: ..."}
    {"available": true, "ok": false, "kind": "ValueError", "message": "..."}
    {"available": false, "kind": "ModuleNotFoundError", "message": "..."}
"""

import argparse
import contextlib
import io
import json
import sys

FIELDS = ("worker_urls", "policy", "host", "port")


def check(argv):
    """The verdict of the router's own parsing and validation of `argv` (see the docstring)."""
    try:
        from sglang_router.router_args import RouterArgs
    except Exception as exc:  # noqa: BLE001 - reported as data
        return {"available": False, "kind": type(exc).__name__, "message": str(exc)}
    parser = argparse.ArgumentParser(prog="sglang_router.launch_router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
    except SystemExit:
        lines = [x for x in err.getvalue().splitlines() if x.strip()]
        return {"available": True, "ok": False, "kind": "argparse",
                "message": lines[-1] if lines else "argparse refused the arguments"}
    try:
        args = RouterArgs.from_cli_args(ns, use_router_prefix=False)
        validate = getattr(args, "_validate_router_args", None)
        if validate is not None:
            validate()
    except Exception as exc:  # noqa: BLE001 - reported as data
        return {"available": True, "ok": False, "kind": type(exc).__name__, "message": str(exc)}
    fields = {k: getattr(args, k, None) for k in FIELDS}
    return {"available": True, "ok": True, "fields": fields}


def main(argv=None) -> int:
    """Print the verdict for the JSON list of arguments in ARGV[0]."""
    raw = (argv if argv is not None else sys.argv[1:])[0]
    print("ORCH_RESULT " + json.dumps(check(json.loads(raw)), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
