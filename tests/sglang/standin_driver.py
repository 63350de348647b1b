"""Runs launch cases through the SGLang stand-in of ONE release, in-process, and reports when
each one fails: argparse, start (ServerArgs), sched-init (before the target's weights loaded),
after-load, first-request (the server's warm-up request, right after both loads), silent
(starts, but speculation accepts nothing, or the KV pool holds less than one full-length
request), or ok. "ok" and "silent" results carry the stand-in's max_total_num_tokens.

Run by tests/sglang/test_fidelity.py in a subprocess whose PYTHONPATH holds that release's
stand-in wheel (unpacked) and the simhw test double. Reads a JSON list of
{"id", "argv", "env", "cc"} on stdin; prints one JSON object per case. Imports nothing of the
orchestrator: the stand-in must not share the product's beliefs.
"""

import contextlib
import io
import json
import os
import sys
import threading


def run_case(case: dict) -> dict:
    """The outcome of one launch: phase, exception class and message."""
    from sglang.srt.model_loader import ModelLoader
    from sglang.srt.server_args import prepare_server_args, validate_for_launch

    saved = dict(os.environ)
    os.environ.update(case.get("env") or {})
    os.environ["SIMHW_TEST_CC"] = case.get("cc", "12.0")
    out = io.StringIO()
    phase = "start"  # argparse exits (SystemExit); anything ServerArgs raises is "start"
    loader = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            args = validate_for_launch(prepare_server_args(case["argv"]))
            loader = ModelLoader(args, threading.Event())
            loaded = loader.run()
            loader.warmup()  # sets loader.phase = "first-request"
    except SystemExit:
        return {"id": case["id"], "phase": "argparse", "error": out.getvalue()[-300:]}
    except BaseException as exc:  # noqa: BLE001 - every failure is an outcome
        if loader is not None:
            phase = loader.phase
        return {"id": case["id"], "phase": phase, "error": f"{type(exc).__name__}: {exc}"[:400]}
    finally:
        os.environ.clear()
        os.environ.update(saved)
    spec = loaded.spec
    result = {"id": case["id"], "max_total_num_tokens": loaded.max_total_num_tokens,
              "context_len": loaded.context_len}
    if spec.enabled and spec.accept_length <= 1.0:
        return {**result, "phase": "silent", "error": spec.note}
    if loaded.max_total_num_tokens < loaded.context_len:
        # real SGLang starts with max_req_len = min(context_len - 1, pool - 1)
        return {**result, "phase": "silent",
                "error": f"KV pool {loaded.max_total_num_tokens} tokens < context length "
                         f"{loaded.context_len}"}
    return {**result, "phase": "ok", "accept_length": spec.accept_length}


def main() -> int:
    cases = json.load(sys.stdin)
    for case in cases:
        print(json.dumps(run_case(case)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
