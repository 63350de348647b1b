"""SGLang's online serving benchmark (stand-in, stdlib only).

The implementation lives here, in `sglang.benchmark.serving`, from 0.5.15 (`sglang.bench_serving`
is then a FutureWarning shim); up to 0.5.12 `sglang.bench_serving` is the implementation and
`python -m sglang.benchmark.serving` does not exist (0.5.9 has no sglang/benchmark package,
0.5.10/0.5.12 no serving.py in it).

Sends `--num-prompts` requests with at most `--max-concurrency` in flight, prints SGLang's
result block (output token throughput, TTFT, TPOT, ITL, "Accept length") and appends its result
line to `--output-file` (the same keys per release as the real one, Infinity and NaN included:
see `_result`). The accept length is
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
import math
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


def run(args) -> dict:
    """Run the benchmark; print SGLang's result block, append its line; return the line."""
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
        try:
            info = _server_info(base)
            if info is not None:
                if "decode" in info:
                    info = info["decode"][0]
                if info.get("internal_states"):
                    accept = info["internal_states"][0].get("avg_spec_accept_length", None)
        except urllib.error.HTTPError:
            pass  # a non-200 answer (401 without the key): no accept length
        # a server that is gone raises here, before the block is printed: SGLang calls
        # requests.get without handling errors (0.5.9 bench_serving.py:2534-2536; 0.5.23
        # benchmark/serving.py:1642-1645), so the run ends with a traceback and exit code 1
    metrics = {**_metrics(ok, duration), "duration": duration}
    _print_block(args, metrics, accept)
    # the whole /server_info again, for the result line (0.5.9 bench_serving.py:2663-2664, the
    # deprecated /get_server_info; 0.5.23 benchmark/serving.py:1847-1848); not caught either
    try:
        server_info = _server_info(base)
    except urllib.error.HTTPError:
        server_info = None
    result = _result(args, metrics, accept, server_info)
    errors = [o.error for o in outputs if o is not None and not o.success][:5]
    if errors:
        print(f"Errors (first {len(errors)}): {errors}", file=sys.stderr)
    _append_line(args, result)
    return result


def _server_info(base: str):
    """GET /server_info (/get_server_info in 0.5.9): the answer, None on a non-200 answer is
    the caller's (HTTPError); a refused connection raises."""
    path = "/server_info" if _release_at_least(0, 5, 10) else "/get_server_info"
    with urllib.request.urlopen(urllib.request.Request(base + path, headers=get_auth_headers()),
                                timeout=60) as resp:
        return json.loads(resp.read())


def _percentile(values, q):
    """np.percentile's default (linear interpolation); NaN for no values, as numpy."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _stats(values, prefix, out, percentiles, or_zero=True):
    """mean/median/std/pXX of VALUES (s) in ms, as calculate_metrics: `np.f(xs or 0)` gives 0
    for none (TTFT, TPOT, ITL); E2E has no `or 0` and gives NaN (0.5.9 bench_serving.py:
    2233-2252; 0.5.23 benchmark/serving.py:1279-1304)."""
    xs = list(values) or ([0.0] if or_zero else [])
    nan = float("nan")
    out[f"mean_{prefix}_ms"] = statistics.fmean(xs) * 1000 if xs else nan
    out[f"median_{prefix}_ms"] = statistics.median(xs) * 1000 if xs else nan
    out[f"std_{prefix}_ms"] = statistics.pstdev(xs) * 1000 if xs else nan
    for q in percentiles:
        out[f"p{q}_{prefix}_ms"] = _percentile(xs, q) * 1000


def _peaks(ok):
    """max_output_tokens_per_s and max_concurrent_requests: per-second buckets of token times
    and of requests in flight (0.5.9 bench_serving.py:2154-2195; 0.5.23 benchmark/serving.py:
    1200-1241)."""
    if not ok:
        return 0.0, 0
    t0 = min(o.start for o in ok)
    n = int(math.ceil(max(o.start + o.latency for o in ok) - t0)) + 1
    tokens = [0] * n
    inflight = [0] * n
    for o in ok:
        t = o.start + o.ttft
        times = [t]
        for gap in o.itl:
            t += gap
            times.append(t)
        for x in times:
            b = int(x - t0)
            if 0 <= b < n:
                tokens[b] += 1
        for sec in range(int(o.start - t0), min(int(o.start + o.latency - t0) + 1, n)):
            inflight[sec] += 1
    return float(max(tokens)), int(max(inflight))


def _metrics(ok, duration) -> dict:
    """calculate_metrics (0.5.9 bench_serving.py:2086-2258; 0.5.23 benchmark/serving.py:
    1132-1310) for text prompts: TPOT per request (latency - ttft) / (output_len - 1) when
    output_len > 1 (0.5.9 :2125-2126; 0.5.23 :1171-1172)."""
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_len for o in ok)
    m = {"completed": len(ok), "total_input": total_in, "total_output": total_out,
         "request_throughput": len(ok) / duration, "input_throughput": total_in / duration,
         "output_throughput": total_out / duration,
         "total_throughput": (total_in + total_out) / duration,
         "concurrency": sum(o.latency for o in ok) / duration if ok else 0.0}
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1]
    _stats([o.ttft for o in ok], "ttft", m, (90, 95, 99))
    _stats(tpots, "tpot", m, (90, 95, 99))
    _stats([x for o in ok for x in o.itl], "itl", m, (90, 95, 99))
    m["max_itl_ms"] = max([x for o in ok for x in o.itl] or [0.0]) * 1000
    _stats([o.latency for o in ok], "e2e_latency", m, (90, 95, 99), or_zero=False)
    m["max_output_tokens_per_s"], m["max_concurrent_requests"] = _peaks(ok)
    return m


def _result(args, m: dict, accept, server_info) -> dict:
    """The line appended to --output-file, key for key and in order: 0.5.9 bench_serving.py:
    2671-2718 (= 0.5.10 :1549-1596, 0.5.12 :1583-1630); from 0.5.15 six more percentiles
    (0.5.15 benchmark/serving.py:1719-1772; 0.5.23 :1855-1908). request_rate is the flag's
    value: float("inf") by default, written as Infinity."""
    new = _release_at_least(0, 5, 15)
    res = {
        "tag": args.tag, "backend": args.backend, "dataset_name": args.dataset_name,
        "request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
        "sharegpt_output_len": args.sharegpt_output_len,
        "random_input_len": args.random_input_len, "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio, "server_info": server_info,
        "duration": m["duration"], "completed": m["completed"],
        "total_input_tokens": m["total_input"], "total_input_text_tokens": m["total_input"],
        "total_input_vision_tokens": 0, "total_output_tokens": m["total_output"],
        "total_output_tokens_retokenized": m["total_output"],
        "request_throughput": m["request_throughput"], "input_throughput": m["input_throughput"],
        "output_throughput": m["output_throughput"], "total_throughput": m["total_throughput"],
    }
    groups = (("e2e_latency", (90, 95, 99) if new else (90, 99)),
              ("ttft", (90, 95, 99) if new else (99,)),
              ("tpot", (90, 95, 99) if new else (99,)),
              ("itl", (90, 95, 99) if new else (95, 99)))
    for prefix, qs in groups:
        for stat in ("mean", "median", "std"):
            res[f"{stat}_{prefix}_ms"] = m[f"{stat}_{prefix}_ms"]
        for q in qs:
            res[f"p{q}_{prefix}_ms"] = m[f"p{q}_{prefix}_ms"]
    res.update({"concurrency": m["concurrency"], "accept_length": accept,
                "max_output_tokens_per_s": m["max_output_tokens_per_s"],
                "max_concurrent_requests": m["max_concurrent_requests"]})
    return res


def _append_line(args, result: dict) -> None:
    """Append the line: --output-file, or a name made from the flags in the working directory
    (0.5.9 bench_serving.py:2723-2756; 0.5.23 benchmark/serving.py:1927-1966)."""
    name = args.output_file
    if not name:
        now = time.strftime("%m%d")
        if args.dataset_name.startswith("random"):
            name = (f"{args.backend}_{now}_{args.num_prompts}_{args.random_input_len}_"
                    f"{args.random_output_len}.jsonl")
        else:
            name = f"{args.backend}_{now}_{args.num_prompts}_{args.dataset_name}.jsonl"
    with open(name, "a") as fh:
        fh.write(json.dumps(result) + "\n")


def _print_block(args, m: dict, accept) -> None:
    """The result block, "{:<40} {:<10}" (0.5.9 bench_serving.py:2568-2661; 0.5.23
    benchmark/serving.py:1681-1845; the P90/P95 lines from 0.5.15)."""
    new = _release_at_least(0, 5, 15)

    def line(label, value, fmt="{:<10.2f}"):
        print(("{:<40} " + fmt).format(label, value))

    def rule(title):
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))

    print("\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    line("Backend:", args.backend, "{:<10}")
    line("Traffic request rate:", args.request_rate, "{:<10}")
    line("Max request concurrency:", args.max_concurrency or "not set", "{:<10}")
    line("Successful requests:", m["completed"], "{:<10}")
    line("Benchmark duration (s):", m["duration"])
    line("Total input tokens:", m["total_input"], "{:<10}")
    line("Total input text tokens:", m["total_input"], "{:<10}")
    line("Total generated tokens:", m["total_output"], "{:<10}")
    line("Total generated tokens (retokenized):", m["total_output"], "{:<10}")
    line("Request throughput (req/s):", m["request_throughput"])
    line("Input token throughput (tok/s):", m["input_throughput"])
    line("Output token throughput (tok/s):", m["output_throughput"])
    line("Peak output token throughput (tok/s):", m["max_output_tokens_per_s"])
    line("Peak concurrent requests:", m["max_concurrent_requests"], "{:<10}")
    line("Total token throughput (tok/s):", m["total_throughput"])
    line("Concurrency:", m["concurrency"])
    if accept:
        line("Accept length:", accept)
    rule("End-to-End Latency")
    line("Mean E2E Latency (ms):", m["mean_e2e_latency_ms"])
    line("Median E2E Latency (ms):", m["median_e2e_latency_ms"])
    for q in (90, 95, 99) if new else (90, 99):
        line(f"P{q} E2E Latency (ms):", m[f"p{q}_e2e_latency_ms"])
    for title, prefix, name, qs in (
            ("Time to First Token", "ttft", "TTFT", (90, 95, 99) if new else (99,)),
            ("Time per Output Token (excl. 1st token)", "tpot", "TPOT",
             (90, 95, 99) if new else (99,)),
            ("Inter-Token Latency", "itl", "ITL", (90, 95, 99) if new else (95, 99))):
        rule(title)
        line(f"Mean {name} (ms):", m[f"mean_{prefix}_ms"])
        line(f"Median {name} (ms):", m[f"median_{prefix}_ms"])
        for q in qs:
            line(f"P{q} {name} (ms):", m[f"p{q}_{prefix}_ms"])
    line("Max ITL (ms):", m["max_itl_ms"])
    print("=" * 50)


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
    p.add_argument("--tag", type=str, default=None)
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
