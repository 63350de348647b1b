"""SGLang's online serving benchmark (stand-in, stdlib only).

The implementation lives here, in `sglang.benchmark.serving`, from 0.5.15 (`sglang.bench_serving`
is then a FutureWarning shim); up to 0.5.12 `sglang.bench_serving` is the implementation and
`python -m sglang.benchmark.serving` does not exist (0.5.9 has no sglang/benchmark package,
0.5.10/0.5.12 no serving.py in it).

Sends `--num-prompts` requests with at most `--max-concurrency` in flight and prints SGLang's
result block (output token throughput, TTFT, ITL, "Accept length"). The accept length is
`internal_states[0].avg_spec_accept_length` (after `["decode"][0]` for PD) of `/get_server_info` in
0.5.9 (bench_serving.py 0.5.9:2534-2554) and `/server_info` later (0.5.10 bench_serving.py:
1405-1423; 0.5.15 benchmark/serving.py:1515-1533; 0.5.23 :1644-1662); the line is printed only
when that value is truthy (0.5.9:2628-2629; 0.5.23:1747-1748): the server's cumulative figure
since start or the last /flush_cache, absent before its first decode log or on a 401.
Auth: env OPENAI_API_KEY gives `Authorization: Bearer <key>`, env API_KEY gives
`Authorization: <key>` without "Bearer" (get_auth_headers, 0.5.9:124-132; 0.5.23:131-139).

`--dataset-name random-ids` needs nothing; `random` and `sharegpt` need the ShareGPT file from
the hub unless `--dataset-path` names a local copy (this host cannot download it).

When the server is the simulator's stand-in, its native stream carries the simulated clock
(`meta_info.sim_time`); the figures then follow simulated time, so a time-scaled run reports
the same numbers as a real-time one.
"""

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

SHAREGPT_URL = (
    "https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered/resolve/main/"
    "ShareGPT_V3_unfiltered_cleaned_split.json"
)


def get_auth_headers() -> dict:
    """SGLang's get_auth_headers (0.5.9 bench_serving.py:124-132)."""
    openai_api_key = os.environ.get("OPENAI_API_KEY")
    if openai_api_key:
        return {"Authorization": f"Bearer {openai_api_key}"}
    api_key = os.environ.get("API_KEY")
    if api_key:
        return {"Authorization": f"{api_key}"}
    return {}


def _headers() -> dict:
    return {"Content-Type": "application/json", **get_auth_headers()}


def _release_at_least(*version: int) -> bool:
    from sglang.srt.utils import at_least

    return at_least(*version)


def _time_scale() -> float:
    """The simulated host's time scale (1.0 elsewhere): the client's fixed pauses follow it."""
    from sglang.srt.hardware import time_scale

    return time_scale()


def _stream(url: str, payload: dict):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=_headers())
    with urllib.request.urlopen(req, timeout=3600) as resp:
        for raw in resp:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield json.loads(data)


class Output:
    """Measurements of one request."""

    def __init__(self) -> None:
        self.success = False
        self.error = ""
        self.prompt_len = 0
        self.output_len = 0
        self.ttft = 0.0
        self.latency = 0.0
        self.itl = []
        self.start = 0.0
        self.end = 0.0
        self.virtual = False


def _request(args, base: str, prompt, prompt_len: int, output_len: int) -> Output:
    out = Output()
    out.prompt_len = prompt_len
    ignore_eos = not args.disable_ignore_eos
    wall0 = time.perf_counter()
    last = None
    try:
        if args.backend in ("sglang", "sglang-native"):
            payload = {"sampling_params": {"temperature": 0.0, "max_new_tokens": output_len,
                                           "ignore_eos": ignore_eos}, "stream": True}
            payload["input_ids" if isinstance(prompt, list) else "text"] = prompt
            for msg in _stream(base + "/generate", payload):
                meta = msg.get("meta_info", {})
                if "sim_time" in meta:
                    out.virtual = True
                    now = float(meta["e2e_latency"])
                    out.start = float(meta["sim_time"]) - now
                else:
                    now = time.perf_counter() - wall0
                tokens = int(meta.get("completion_tokens", out.output_len))
                if tokens > out.output_len:
                    if last is None:
                        out.ttft = now
                    else:
                        out.itl.append(now - last)
                    last = now
                out.output_len = tokens
                out.latency = now
            out.end = out.start + out.latency if out.virtual else time.perf_counter()
        else:
            payload = {"model": args.model or "default", "prompt": prompt,
                       "max_tokens": output_len, "temperature": 0.0, "stream": True,
                       "ignore_eos": ignore_eos, "stream_options": {"include_usage": True}}
            for msg in _stream(base + "/v1/completions", payload):
                now = time.perf_counter() - wall0
                if msg.get("choices") and msg["choices"][0].get("text"):
                    if last is None:
                        out.ttft = now
                    else:
                        out.itl.append(now - last)
                    last = now
                if msg.get("usage"):
                    out.output_len = int(msg["usage"]["completion_tokens"])
                out.latency = now
            out.end = time.perf_counter()
            out.start = wall0
        out.success = True
    except (urllib.error.URLError, OSError, ValueError) as exc:
        out.error = str(exc)
    if not out.virtual:
        out.start = wall0
    return out


def _dataset(args):
    rng = random.Random(args.seed)
    if args.dataset_name in ("random", "sharegpt") and not args.dataset_path:
        raise ConnectionError(
            f"Failed to download {SHAREGPT_URL}: this host cannot reach the Hugging Face hub. Use "
            "--dataset-name random-ids, or pass --dataset-path to a local copy."
        )
    items = []
    for _ in range(args.num_prompts):
        lo_in = max(int(args.random_input_len * args.random_range_ratio), 1)
        lo_out = max(int(args.random_output_len * args.random_range_ratio), 1)
        n_in = rng.randint(lo_in, args.random_input_len)
        n_out = rng.randint(lo_out, args.random_output_len)
        if args.dataset_name == "random-ids":
            prompt = [rng.randint(100, 30000) for _ in range(n_in)]
        else:
            prompt = " ".join(f"tok{rng.randint(0, 9999)}" for _ in range(n_in))
        items.append((prompt, n_in, n_out))
    return items


def _pct(values, q):
    if not values:
        return 0.0
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, int(round(q / 100.0 * (len(ordered) - 1)))))
    return ordered[idx]


def run(args) -> dict:
    """Run the benchmark; print SGLang's result block; return the figures."""
    if args.base_url:
        base = args.base_url.rstrip("/")
    else:
        base = f"http://{args.host}:{args.port or 30000}"
    items = _dataset(args)
    print(f"#Input tokens: {sum(i[1] for i in items)}")
    print(f"#Output tokens: {sum(i[2] for i in items)}")
    if args.warmup_requests > 0 and items:
        print(f"Starting warmup with {args.warmup_requests} sequences...")
        for _ in range(args.warmup_requests):
            _request(args, base, items[0][0], items[0][1], min(items[0][2], 16))
        print(f"Warmup completed with {args.warmup_requests} sequences. Starting main "
              "benchmark run...")
    # the cache (and with it the server's speculation totals) is flushed AFTER the warmup, then
    # the client sleeps 1 s (0.5.9 bench_serving.py:2417-2421; 0.5.23 benchmark/serving.py:
    # 1516-1525): the accept length printed at the end covers the measured requests only
    if args.flush_cache:
        urllib.request.urlopen(urllib.request.Request(base + "/flush_cache", method="POST",
                                                      headers=_headers()), timeout=60).read()
    time.sleep(1.0 * _time_scale())
    limit = threading.Semaphore(args.max_concurrency or len(items) or 1)
    outputs = [None] * len(items)

    def worker(i, item):
        with limit:
            outputs[i] = _request(args, base, *item)

    wall0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i, it)) for i, it in enumerate(items)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall0
    ok = [o for o in outputs if o is not None and o.success]
    if ok and all(o.virtual for o in ok):
        duration = max(o.end for o in ok) - min(o.start for o in ok)
    else:
        duration = wall
    duration = max(duration, 1e-9)
    accept = None
    if "sglang" in args.backend:
        path = "/server_info" if _release_at_least(0, 5, 10) else "/get_server_info"
        try:
            info = json.loads(urllib.request.urlopen(urllib.request.Request(
                base + path, headers=get_auth_headers()), timeout=60).read())
            if "decode" in info:
                info = info["decode"][0]
            if info.get("internal_states"):
                accept = info["internal_states"][0].get("avg_spec_accept_length", None)
        except urllib.error.HTTPError:
            pass  # a non-200 answer (401 without the key): no accept length
        # a server that is gone raises here, before the block is printed: SGLang calls
        # requests.get without handling errors (0.5.9 bench_serving.py:2534-2536; 0.5.23
        # benchmark/serving.py:1642-1645), so the run ends with a traceback and exit code 1
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_len for o in ok)
    ttfts = [o.ttft * 1000 for o in ok]
    itls = [x * 1000 for o in ok for x in o.itl]
    e2e = [o.latency * 1000 for o in ok]
    res = {
        "backend": args.backend, "request_rate": args.request_rate,
        "max_concurrency": args.max_concurrency, "completed": len(ok), "duration": duration,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration, "input_throughput": total_in / duration,
        "output_throughput": total_out / duration,
        "total_throughput": (total_in + total_out) / duration,
        "concurrency": sum(o.latency for o in ok) / duration,
        "accept_length": accept,
        "mean_e2e_latency_ms": statistics.mean(e2e) if e2e else 0.0,
        "median_e2e_latency_ms": statistics.median(e2e) if e2e else 0.0,
        "mean_ttft_ms": statistics.mean(ttfts) if ttfts else 0.0,
        "median_ttft_ms": statistics.median(ttfts) if ttfts else 0.0,
        "p99_ttft_ms": _pct(ttfts, 99),
        "mean_itl_ms": statistics.mean(itls) if itls else 0.0,
        "median_itl_ms": statistics.median(itls) if itls else 0.0,
        "p95_itl_ms": _pct(itls, 95), "p99_itl_ms": _pct(itls, 99),
        "max_itl_ms": max(itls) if itls else 0.0,
        "errors": [o.error for o in outputs if o is not None and not o.success][:5],
    }
    w = 40  # "{:<40} {:<10}" (0.5.9 bench_serving.py:2568-2629)
    print("\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print("{:<{w}} {:<10}".format("Backend:", args.backend, w=w))
    print("{:<{w}} {:<10}".format("Traffic request rate:", args.request_rate, w=w))
    print("{:<{w}} {:<10}".format("Max request concurrency:",
                                 args.max_concurrency or "not set", w=w))
    print("{:<{w}} {:<10}".format("Successful requests:", len(ok), w=w))
    print("{:<{w}} {:<10.2f}".format("Benchmark duration (s):", duration, w=w))
    print("{:<{w}} {:<10}".format("Total input tokens:", total_in, w=w))
    print("{:<{w}} {:<10}".format("Total generated tokens:", total_out, w=w))
    print("{:<{w}} {:<10.2f}".format("Request throughput (req/s):", res["request_throughput"],
                                     w=w))
    print("{:<{w}} {:<10.2f}".format("Input token throughput (tok/s):", res["input_throughput"],
                                     w=w))
    print("{:<{w}} {:<10.2f}".format("Output token throughput (tok/s):",
                                     res["output_throughput"], w=w))
    print("{:<{w}} {:<10.2f}".format("Total token throughput (tok/s):", res["total_throughput"],
                                     w=w))
    print("{:<{w}} {:<10.2f}".format("Concurrency:", res["concurrency"], w=w))
    if accept:
        print("{:<{w}} {:<10.2f}".format("Accept length:", accept, w=w))
    print("{s:{c}^{n}}".format(s="End-to-End Latency", n=50, c="-"))
    print("{:<{w}} {:<10.2f}".format("Mean E2E Latency (ms):", res["mean_e2e_latency_ms"], w=w))
    print("{:<{w}} {:<10.2f}".format("Median E2E Latency (ms):", res["median_e2e_latency_ms"],
                                     w=w))
    print("{s:{c}^{n}}".format(s="Time to First Token", n=50, c="-"))
    print("{:<{w}} {:<10.2f}".format("Mean TTFT (ms):", res["mean_ttft_ms"], w=w))
    print("{:<{w}} {:<10.2f}".format("Median TTFT (ms):", res["median_ttft_ms"], w=w))
    print("{:<{w}} {:<10.2f}".format("P99 TTFT (ms):", res["p99_ttft_ms"], w=w))
    print("{s:{c}^{n}}".format(s="Inter-Token Latency", n=50, c="-"))
    print("{:<{w}} {:<10.2f}".format("Mean ITL (ms):", res["mean_itl_ms"], w=w))
    print("{:<{w}} {:<10.2f}".format("Median ITL (ms):", res["median_itl_ms"], w=w))
    print("{:<{w}} {:<10.2f}".format("P95 ITL (ms):", res["p95_itl_ms"], w=w))
    print("{:<{w}} {:<10.2f}".format("P99 ITL (ms):", res["p99_itl_ms"], w=w))
    print("{:<{w}} {:<10.2f}".format("Max ITL (ms):", res["max_itl_ms"], w=w))
    print("=" * 50)
    if res["errors"]:
        print(f"Errors (first {len(res['errors'])}): {res['errors']}", file=sys.stderr)
    if args.output_file:
        with open(args.output_file, "a") as fh:
            fh.write(json.dumps(res) + "\n")
    return res


def make_parser() -> argparse.ArgumentParser:
    """The bench_serving command line (the subset the stand-in honours)."""
    p = argparse.ArgumentParser(description="Benchmark the online serving throughput.")
    p.add_argument("--backend", type=str, default="sglang",
                   choices=["sglang", "sglang-native", "sglang-oai", "vllm", "lmdeploy"])
    p.add_argument("--base-url", type=str, default=None)
    p.add_argument("--host", type=str, default="0.0.0.0")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--dataset-name", type=str, default="sharegpt",
                   choices=["sharegpt", "random", "random-ids", "generated-shared-prefix"])
    p.add_argument("--dataset-path", type=str, default="")
    p.add_argument("--model", type=str, default=None)
    p.add_argument("--tokenizer", type=str, default=None)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--sharegpt-output-len", type=int, default=None)
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=1024)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--output-file", type=str, default=None)
    p.add_argument("--output-details", action="store_true")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--disable-stream", action="store_true")
    p.add_argument("--disable-ignore-eos", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup-requests", type=int, default=1)
    p.add_argument("--flush-cache", action="store_true")
    p.add_argument("--apply-chat-template", action="store_true")
    p.add_argument("--extra-request-body", type=str, default=None)
    return p


def main(argv=None) -> int:
    """Entry point; exit code 1 when no request succeeded."""
    args = make_parser().parse_args(argv)
    res = run(args)
    return 0 if res["completed"] else 1


def cli_main() -> int:
    """SGLang's entry point name (benchmark/serving.py 0.5.15:2127, 2672-2673)."""
    return main()


def _missing_before_0_5_15() -> int:
    """`python -m sglang.benchmark.serving` before 0.5.15: Python's own message and exit 1."""
    if _release_at_least(0, 5, 10):  # sglang/benchmark exists, without serving.py
        sys.stderr.write(f"{sys.executable}: No module named sglang.benchmark.serving\n")
    else:  # 0.5.9: no sglang/benchmark package at all
        sys.stderr.write(f"{sys.executable}: Error while finding module specification for "
                         "'sglang.benchmark.serving' (ModuleNotFoundError: No module named "
                         "'sglang.benchmark')\n")
    return 1


if __name__ == "__main__":
    sys.exit(cli_main() if _release_at_least(0, 5, 15) else _missing_before_0_5_15())
