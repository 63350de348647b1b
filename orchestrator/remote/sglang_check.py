"""Run the installed SGLang's own argument parsing and ServerArgs validation; load no weights.

Runs ON the host with the venv's python (stdlib only here; SGLang itself is imported):

    VENV_PYTHON -c "$(cat sglang_check.py)" '["--model-path", "/m", ...]'

What `python -m sglang.launch_server` runs before it starts any process, in its order:
`prepare_server_args(argv)` (sglang/srt/server_args.py:5568-5583 (0.5.9), :668-700 (0.5.23)):
argparse, then ServerArgs(...), whose __post_init__ holds the start-time rules up to 0.5.15;
`resolve_once()` from 0.5.19, where __post_init__ is empty and the rules moved
(server_args.py:3673 (0.5.19), :244 (0.5.23); called at launch_server.py:29 and
entrypoints/engine.py:1153 (0.5.23)); then `check_server_args()` in every release
(entrypoints/engine.py:1026 (0.5.9), :1165 (0.5.23): the served-name colon, nnodes, pipeline
with speculation). `stage` in the answer names which one refused. It needs torch, so on a
host without a working SGLang install the answer is `available: false` and the caller's own
tables decide. The last stdout line is `ORCH_RESULT {json}`:

    {"available": true, "ok": true, "seconds": 3.2, "fields": {...}}
    {"available": true, "ok": false, "kind": "argparse", "message": "error: ...", ...}
    {"available": true, "ok": false, "kind": "ValueError", "message": "...", ...}
    {"available": false, "kind": "ModuleNotFoundError", "message": "No module named 'torch'"}
"""

import contextlib
import io
import json
import sys
import time
import traceback

#: ServerArgs fields reported back (what SGLang resolved the launch to)
FIELDS = ("tp_size", "speculative_algorithm", "speculative_draft_model_path",
          "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
          "served_model_name", "attention_backend", "mem_fraction_static",
          "max_running_requests", "context_length", "decode_log_interval")


def _jsonable(value):
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def check(argv):
    """The verdict of SGLang's own validation of `argv` (a dict, see the module docstring)."""
    started = time.monotonic()
    try:
        from sglang.srt.server_args import prepare_server_args
    except BaseException as exc:  # noqa: BLE001 - torch missing, CUDA broken, anything
        return {"available": False, "kind": type(exc).__name__, "message": str(exc)[:500]}
    captured = io.StringIO()
    stage = "prepare_server_args"
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            server_args = prepare_server_args(list(argv))
            if hasattr(server_args, "resolve_once"):
                stage = "resolve_once"
                server_args.resolve_once()
            stage = "check_server_args"
            server_args.check_server_args()
    except SystemExit as exc:  # argparse: usage + "error: ..." on stderr, exit 2
        lines = [ln for ln in captured.getvalue().splitlines() if ln.strip()]
        message = "\n".join(lines[-3:])
        if exc.code in (0, None):  # -h/--help: usage printed, exit 0, nothing started
            message = "SGLang printed its usage and exited (code 0): -h/--help is an argument"
        return {"available": True, "ok": False, "kind": "argparse", "code": exc.code,
                "stage": stage, "message": message, "seconds": time.monotonic() - started}
    except BaseException as exc:  # noqa: BLE001 - ServerArgs raises anything
        text = str(exc) or traceback.format_exc().strip().splitlines()[-1]
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return {"available": True, "ok": False, "kind": type(exc).__name__, "stage": stage,
                "message": text[:1500], "where": f"{where.filename}:{where.lineno}",
                "seconds": time.monotonic() - started}
    fields = {k: _jsonable(getattr(server_args, k, None)) for k in FIELDS}
    return {"available": True, "ok": True, "fields": fields,
            "seconds": time.monotonic() - started}


def main(args):
    """Command line: one JSON list of server arguments; prints ORCH_RESULT."""
    result = check(json.loads(args[0]) if args else [])
    sys.stdout.write("ORCH_RESULT " + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
