"""HTTP server of the stand-in: SGLang's routes on a stdlib ThreadingHTTPServer.

Start-up order as in SGLang: parse and validate the arguments, load (port closed), bind, warm up
(`/health` answers 503), then log `The server is fired up and ready to roll!`. SIGTERM or SIGINT
turns `/health` to 503, lets running requests finish briefly, stops and gives the GPU memory back.
"""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from sglang.srt import hardware
from sglang.srt.engine import Req, Scheduler
from sglang.srt.hf_config import KIMI_K25_ARCHITECTURES
from sglang.srt.model_loader import ModelLoader, Stopped
from sglang.srt.utils import at_least, log, set_on_signals, uvicorn
from sglang.version import __version__

HEALTH_TIMEOUT = 20.0
_PHRASES = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 503: "Service Unavailable"}


class BadRequest(Exception):
    """A request the OpenAI-compatible API answers with 400."""


class App:
    """Shared state of the running server."""

    def __init__(self, server_args, loaded, scheduler, dummy: bool = False) -> None:
        self.args = server_args
        self.loaded = loaded
        self.scheduler = scheduler
        self.dummy = dummy
        self.state = "starting"  # starting -> ready -> shutting_down
        self.created = int(time.time())
        self.inflight = 0
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ requests
    def new_request(self, prompt_tokens: int, max_new_tokens, seed: int,
                    ignore_eos: bool = False) -> Req:
        ctx = self.loaded.context_len
        if prompt_tokens >= ctx:
            raise BadRequest(
                f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                f"({ctx} tokens)."
            )
        if max_new_tokens is None:
            if ignore_eos:
                max_new, reason = 128, "length"
            else:
                max_new, reason = 16 + seed % 48, "stop"
        else:
            try:
                max_new = int(max_new_tokens)
            except (TypeError, ValueError):
                raise BadRequest("max_tokens must be an integer") from None
            if max_new < 1:
                raise BadRequest(f"max_tokens must be at least 1, got {max_new}.")
            reason = "length"
            if prompt_tokens + max_new > ctx:
                raise BadRequest(
                    f"Requested token count exceeds the model's maximum context length of {ctx} "
                    f"tokens. You requested a total of {prompt_tokens + max_new} tokens: "
                    f"{prompt_tokens} tokens from the input messages and {max_new} tokens for the "
                    "completion. Please reduce the number of tokens in the input messages or the "
                    "completion to fit within the limit."
                )
        if self.scheduler is None:
            raise BadRequest("this node does not serve requests")
        return self.scheduler.submit(Req(prompt_tokens, max_new, reason, seed))

    def run_to_end(self, req: Req, timeout: float = 3600.0) -> dict:
        """Wait for `req` to finish; return text, counts and virtual timings."""
        pieces = []
        while True:
            kind, value, vtime = req.out.get(timeout=timeout)
            if kind == "tokens":
                pieces.append(req.words(*value))
            elif kind == "finish":
                return {"text": "".join(pieces), "finish_reason": value, "vtime": vtime}
            else:
                raise RuntimeError(value)

    def model_info(self) -> dict:
        cfg = self.loaded.hf_config
        return {
            "model_path": self.args.model_path,
            "tokenizer_path": self.args.tokenizer_path,
            "is_generation": not self.args.is_embedding,
            "preferred_sampling_params": self.args.preferred_sampling_params,
            "weight_version": self.args.weight_version,
            "has_image_understanding": cfg.arch in KIMI_K25_ARCHITECTURES,
            "has_audio_understanding": False,
            "model_type": cfg.model_type,
            "architectures": cfg.architectures,
        }

    def server_info(self) -> dict:
        info = self.args.to_dict()
        info.update(
            {
                "max_total_num_tokens": self.loaded.max_total_num_tokens,
                "max_req_input_len": self.loaded.context_len - 1,
                "internal_states": [self.scheduler.internal_state()] if self.scheduler else [],
                "version": __version__,
            }
        )
        return info

    def metrics(self) -> str:
        s = self.scheduler
        name = self.args.served_model_name.replace('"', '\\"')
        labels = '{model_name="' + name + '",engine_type="unified",tp_rank="0",pp_rank="0"}'
        ndt = s.spec.num_draft_tokens if s.spec.enabled else 1
        accept = s.avg_spec_accept_length if s.spec.enabled else 1.0
        rows = [
            ("gauge", "num_running_reqs", "The number of running requests.", len(s.running)),
            ("gauge", "num_queue_reqs", "The number of requests in the waiting queue.",
             len(s.waiting)),
            ("gauge", "gen_throughput", "The generation throughput (token/s).",
             s.last_gen_throughput),
            ("gauge", "token_usage", "The token usage.", s._usage()),
            ("gauge", "cache_hit_rate", "The prefix cache hit rate.", 0.0),
            ("gauge", "spec_accept_length", "The average acceptance length of speculative "
             "decoding.", accept),
            ("gauge", "spec_accept_rate", "The average acceptance rate of speculative decoding "
             "(accepted tokens / draft tokens).", accept / float(ndt)),
            ("counter", "prompt_tokens_total", "Number of prefill tokens processed.",
             s.prompt_tokens_total),
            ("counter", "generation_tokens_total", "Number of generation tokens processed.",
             s.generation_tokens_total),
            ("counter", "num_requests_total", "Number of requests processed.", s.num_requests),
        ]
        out = []
        for kind, name, doc, value in rows:
            out.append(f"# HELP sglang:{name} {doc}")
            out.append(f"# TYPE sglang:{name} {kind}")
            out.append(f"sglang:{name}{labels} {float(value)}")
        return "\n".join(out) + "\n"


def _count_tokens(text: str) -> int:
    return max(1, int(math.ceil(len(text) / 4.0)))


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict)
        )
    return ""


def _seed(obj) -> int:
    return zlib.crc32(json.dumps(obj, sort_keys=True, default=str).encode("utf-8"))


class Handler(BaseHTTPRequestHandler):
    """Routes of SGLang's HTTP server (OpenAI-compatible and native)."""

    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    # ------------------------------------------------------------------ plumbing
    @property
    def app(self) -> App:
        return self.server.app  # type: ignore[attr-defined]

    def log_request(self, code="-", size="-") -> None:
        code = int(code) if str(code).isdigit() else 0
        host, port = self.client_address[:2]
        line = f'{host}:{port} - "{self.requestline}" {code} {_PHRASES.get(code, "")}'
        uvicorn("INFO", line.rstrip(), access=True)

    def log_message(self, format, *args) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0] or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(status)
        if ctype:
            self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode("utf-8"))

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"object": "error", "message": message,
                            "type": "BadRequestError" if status == 400 else "Error",
                            "param": None, "code": status})

    def _sse_start(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _sse(self, payload) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        chunk = ("data: " + data + "\n\n").encode("utf-8")
        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.flush()

    def _sse_end(self) -> None:
        self._sse("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # ------------------------------------------------------------------ dispatch
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def _dispatch(self, method: str) -> None:
        raw = self._read_body()
        path = urlsplit(self.path).path
        app = self.app
        if app.dummy:
            if path.startswith("/health"):
                self._send(200, b"", "")
            else:
                self._json(404, {"detail": "Not Found"})
            return
        key = app.args.api_key
        if key and not (path.startswith("/health") or path.startswith("/metrics")):
            if self.headers.get("Authorization") != "Bearer " + key:
                self._json(401, {"error": "Unauthorized"})
                return
        routes = {
            "/health": (("GET",), self._health),
            "/health_generate": (("GET",), self._health),
            "/model_info": (("GET",), lambda b: self._json(200, app.model_info())),
            "/get_model_info": (("GET",), lambda b: self._json(200, app.model_info())),
            "/server_info": (("GET",), lambda b: self._json(200, app.server_info())),
            "/get_server_info": (("GET",), lambda b: self._json(200, app.server_info())),
            "/version": (("GET",), lambda b: self._json(200, {"version": __version__})),
            "/v1/models": (("GET",), self._models),
            "/flush_cache": (("GET", "POST"), self._flush_cache),
            "/generate": (("POST", "PUT"), self._generate),
            "/v1/completions": (("POST",), self._completions),
            "/v1/chat/completions": (("POST",), self._chat),
        }
        if at_least(0, 5, 12):
            routes["/ready"] = (("GET",), self._ready)
        if app.args.enable_metrics:
            routes["/metrics"] = (("GET",), self._metrics)
        if path not in routes:
            self._json(404, {"detail": "Not Found"})
            return
        methods, fn = routes[path]
        if method == "HEAD" and "GET" in methods:
            method = "GET"
        if method not in methods:
            self._json(405, {"detail": "Method Not Allowed"})
            return
        body = None
        if method in ("POST", "PUT") and path not in ("/flush_cache",):
            try:
                body = json.loads(raw.decode("utf-8") or "null")
            except ValueError:
                self._error(400, "Invalid JSON body")
                return
            if not isinstance(body, dict):
                self._error(400, "The request body must be a JSON object")
                return
        with app.lock:
            app.inflight += 1
        try:
            fn(body)
        except BadRequest as exc:
            self._error(400, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # like uvicorn: log it, answer 500/503 if still possible
            traceback.print_exc()
            self.close_connection = True
            status = 503 if app.state == "shutting_down" else 500
            try:
                self._error(status, f"{type(exc).__name__}: {exc}")
            except OSError:
                pass
        finally:
            with app.lock:
                app.inflight -= 1

    # ------------------------------------------------------------------ routes
    def _health(self, body) -> None:
        app = self.app
        if app.state != "ready":
            self._send(503, b"", "")
            return
        req = app.scheduler.submit(Req(1, 1, "length", 0))
        try:
            app.run_to_end(req, timeout=HEALTH_TIMEOUT)
        except (queue.Empty, RuntimeError):
            req.aborted = True
            self._send(503, b"", "")
            return
        self._send(200, b"", "")

    def _ready(self, body) -> None:
        if self.app.state == "ready":
            self._json(200, {"status": "ready"})
        else:
            self._json(503, {"status": "not ready"})

    def _models(self, body) -> None:
        name = self.app.args.served_model_name
        self._json(200, {"object": "list", "data": [{
            "id": name, "object": "model", "created": self.app.created, "owned_by": "sglang",
            "root": name, "parent": None, "max_model_len": self.app.loaded.context_len,
        }]})

    def _flush_cache(self, body) -> None:
        self._send(200, b"Cache flushed.\nPlease check backend logs for more details. (When "
                   b"there are running or waiting requests, the operation will not be "
                   b"performed.)\n", "text/plain; charset=utf-8")

    def _metrics(self, body) -> None:
        self._send(200, self.app.metrics().encode("utf-8"), "text/plain; version=0.0.4")

    def _generate(self, body) -> None:
        app = self.app
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object")
        text, ids = body.get("text"), body.get("input_ids")
        if text is None and ids is None:
            raise BadRequest("Either text or input_ids should be provided.")
        batch = isinstance(text, list) or (isinstance(ids, list) and ids and
                                           isinstance(ids[0], list))
        prompts = (text if isinstance(text, list) else ids) if batch else [
            text if text is not None else ids]
        reqs = []
        for p in prompts:
            n = len(p) if isinstance(p, list) else _count_tokens(str(p))
            reqs.append(app.new_request(n, params.get("max_new_tokens"), _seed(p),
                                        bool(params.get("ignore_eos"))))
        if body.get("stream") and not batch:
            req = reqs[0]
            self._sse_start()
            text_so_far = ""
            try:
                while True:
                    kind, value, vtime = req.out.get(timeout=3600)
                    if kind == "tokens":
                        text_so_far += req.words(*value)
                        self._sse({"text": text_so_far, "meta_info": self._meta(req, None, vtime)})
                    elif kind == "finish":
                        self._sse({"text": text_so_far, "meta_info": self._meta(req, value, vtime)})
                        break
                    else:
                        break
                self._sse_end()
            except (BrokenPipeError, ConnectionResetError):
                req.aborted = True
                raise
            return
        results = []
        for req in reqs:
            done = app.run_to_end(req)
            results.append({"text": done["text"],
                            "meta_info": self._meta(req, done["finish_reason"], done["vtime"])})
        self._json(200, results if batch else results[0])

    def _meta(self, req: Req, finish, vtime: float) -> dict:
        meta = {
            "id": req.rid,
            "finish_reason": None if finish is None else (
                {"type": "length", "length": req.generated} if finish == "length"
                else {"type": "stop", "matched": 163586}),
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": req.generated,
            "cached_tokens": 0,
            "e2e_latency": round(vtime - req.vstart, 6),
            "sim_time": round(vtime, 6),
        }
        if self.app.scheduler.spec.enabled:
            meta["spec_verify_ct"] = req.steps
        return meta

    def _openai_request(self, body, prompt_tokens: int, seed: int) -> Req:
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        return self.app.new_request(prompt_tokens, max_tokens, seed, bool(body.get("ignore_eos")))

    def _completions(self, body) -> None:
        prompt = body.get("prompt")
        if prompt is None:
            raise BadRequest("prompt is required")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            tokens = len(prompt)
        elif isinstance(prompt, list):
            tokens = sum(_count_tokens(str(p)) for p in prompt)
        else:
            tokens = _count_tokens(str(prompt))
        req = self._openai_request(body, tokens, _seed(prompt))
        self._openai_reply(body, req, chat=False)

    def _chat(self, body) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        tokens = 3 + sum(5 + _count_tokens(_content_text(m.get("content")))
                         for m in messages if isinstance(m, dict))
        req = self._openai_request(body, tokens, _seed(messages))
        self._openai_reply(body, req, chat=True)

    def _openai_reply(self, body, req: Req, chat: bool) -> None:
        app = self.app
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion" if chat else "text_completion"
        model = app.args.served_model_name
        created = int(time.time())

        def usage() -> dict:
            return {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.generated,
                    "total_tokens": req.prompt_tokens + req.generated,
                    "prompt_tokens_details": None, "reasoning_tokens": 0}

        if not body.get("stream"):
            done = app.run_to_end(req)
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": done["text"],
                                                  "reasoning_content": None, "tool_calls": None},
                          "logprobs": None, "finish_reason": done["finish_reason"],
                          "matched_stop": None}
            else:
                choice = {"index": 0, "text": done["text"], "logprobs": None,
                          "finish_reason": done["finish_reason"], "matched_stop": None}
            self._json(200, {"id": rid, "object": obj, "created": created, "model": model,
                             "choices": [choice], "usage": usage()})
            return

        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta_text, finish, role=False) -> dict:
            if chat:
                delta = {"role": "assistant", "content": delta_text} if role else {
                    "content": delta_text}
                if finish is not None and not delta_text:
                    delta = {}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                          "matched_stop": None}
            else:
                choice = {"index": 0, "text": delta_text, "logprobs": None,
                          "finish_reason": finish, "matched_stop": None}
            return {"id": rid, "object": chunk_obj, "created": created, "model": model,
                    "choices": [choice], "usage": None}

        self._sse_start()
        try:
            if chat:
                self._sse(chunk("", None, role=True))
            while True:
                kind, value, _vtime = req.out.get(timeout=3600)
                if kind == "tokens":
                    self._sse(chunk(req.words(*value), None))
                elif kind == "finish":
                    self._sse(chunk("", value))
                    break
                else:
                    break
            if include_usage:
                self._sse({"id": rid, "object": chunk_obj, "created": created, "model": model,
                           "choices": [], "usage": usage()})
            self._sse_end()
        except (BrokenPipeError, ConnectionResetError):
            req.aborted = True
            raise


class HTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with uvicorn-like socket options."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512

    def __init__(self, address, app: App) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.app = app
        super().__init__(address, Handler)


def _nominal(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def launch_server(server_args) -> int:
    """Run the server until SIGTERM/SIGINT; return the process exit code."""
    stop = threading.Event()
    set_on_signals(stop, (signal.SIGTERM, signal.SIGINT))
    log(f"server_args={server_args!r}")
    scale = hardware.time_scale()
    try:
        try:
            loaded = ModelLoader(server_args, stop).run()
        except Stopped:
            log("Received SIGTERM while loading; exiting.")
            return 143
        dummy = server_args.node_rank > 0
        scheduler = None if dummy else Scheduler(server_args, loaded, scale)
        app = App(server_args, loaded, scheduler, dummy=dummy)
        host, port = server_args.host, server_args.port
        try:
            httpd = HTTPServer((host, port), app)
        except OSError as exc:
            reason = (exc.strerror or str(exc)).lower()
            uvicorn("ERROR", f"[Errno {exc.errno}] error while attempting to bind on address "
                    f"{(host, port)!r}: {reason}")
            return 1
        server_thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                         name="http", daemon=True)
        if dummy:
            server_thread.start()
            log(f"Dummy health check server started in background on {host}:{port}")
            app.state = "ready"
            stop.wait()
        else:
            scheduler.start()
            uvicorn("INFO", f"Started server process [{os.getpid()}]")
            uvicorn("INFO", "Waiting for application startup.")
            uvicorn("INFO", "Application startup complete.")
            server_thread.start()
            uvicorn("INFO", f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
            if not server_args.skip_server_warmup:
                if stop.wait(_nominal("SGLANG_SIM_WARMUP_SECONDS", 2.0) * scale):
                    pass
                else:
                    warm = app.new_request(6, 8, 0)
                    app.run_to_end(warm)
                    uvicorn("INFO", f'127.0.0.1:{port + 1000} - "POST /generate HTTP/1.1" 200 OK',
                            access=True)
            if not stop.is_set():
                app.state = "ready"
                log("The server is fired up and ready to roll!")
            stop.wait()
        # graceful shutdown
        app.state = "shutting_down"
        uvicorn("INFO", "Shutting down")
        deadline = time.monotonic() + max(0.05, 5.0 * scale)
        while app.inflight > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        httpd.shutdown()
        httpd.server_close()
        if scheduler is not None:
            scheduler.shutdown()
        uvicorn("INFO", "Waiting for application shutdown.")
        uvicorn("INFO", "Application shutdown complete.")
        uvicorn("INFO", f"Finished server process [{os.getpid()}]")
        return 0
    finally:
        hardware.release()
        sys.stdout.flush()
        sys.stderr.flush()
