"""``python3 -m sglang.launch_server`` of an OLD deploy: listens, holds GPU memory, answers a bit.

Started by the simulator's `stale-server` fault. It allocates memory on the simulated GPUs through
simhw (released when it exits, or GC'd when it is killed) and serves /health, /model_info,
/server_info and /v1/models for an older model until it is killed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import simhw

from . import __version__


def _args(argv):
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", default="/root/models/Kimi-K2-Instruct")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", type=int, default=8)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--mem-fraction-static", type=float, default=0.9)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--sim-mib-per-gpu", type=int, default=90000)
    args, _ = p.parse_known_args(argv)
    return args


def main(argv=None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    name = args.served_model_name or args.model_path
    n = min(args.tp_size, simhw.device_count())
    simhw.allocate(os.getpid(), args.sim_mib_per_gpu, list(range(n)))
    info = {"model_path": args.model_path, "tokenizer_path": args.model_path,
            "is_generation": True, "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2", "weight_version": "default"}
    server_info = {"model_path": args.model_path, "tp_size": args.tp_size, "host": args.host,
                   "port": args.port, "served_model_name": name, "version": __version__,
                   "speculative_algorithm": None, "internal_states": [{}]}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):
            sys.stdout.write("[stale-sglang] " + (fmt % a) + "\n")

        def _json(self, obj, status=200):
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif path in ("/model_info", "/get_model_info"):
                self._json(info)
            elif path in ("/server_info", "/get_server_info"):
                self._json(server_info)
            elif path == "/v1/models":
                self._json({"object": "list", "data": [{"id": name, "object": "model",
                                                        "owned_by": "sglang", "root": name}]})
            else:
                self._json({"detail": "Not Found"}, 404)

    httpd = ThreadingHTTPServer((args.host, args.port), Handler)

    def stop(signum, frame):
        simhw.release(os.getpid())
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sys.stdout.write("The server is fired up and ready to roll!\n")
    sys.stdout.flush()
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
