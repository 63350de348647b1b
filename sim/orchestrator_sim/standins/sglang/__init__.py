"""SGLang stand-in for the orchestrator simulator (stdlib only, Python 3.8+, no GPU code).

It behaves like `python -m sglang.launch_server` on the simulated GPU host: the real flag set of
its release, the real validation rules, the real start-up order and HTTP API, with a speed model
instead of a model. The hardware comes from the simulator's `simhw` module when importable.

Simulation knobs (environment of the server process):
  SGLANG_SIM_LOAD_SECONDS    nominal weight-load seconds (default: simhw.load_seconds())
  SGLANG_SIM_WARMUP_SECONDS  nominal warmup seconds after binding, /health is 503 (default 2)
  SGLANG_SIM_CRASH           a message: the launch fails at once with it (exit 1), a crash loop
  SGLANG_SIM_FAULT           comma-separated silent serving failures (srt/sim_faults.py); the
                             server starts, logs and answers /health 200 as usual, but:
                             wrong-draft: with speculation, greedy text differs from the plain
                               decoding's from the 2nd token on, accept length as usual;
                             zero-accept: with speculation, every draft rejected (accept length
                               1.00), text unchanged;
                             scheduler-dead: after ready, generation requests never finish
                               while /health and /health_generate stay 200;
                             first-token-stall: the first non-health request after ready waits
                               20 nominal seconds before its first token (JIT compile).
                             An unknown name: exit 2 before loading.
Honoured like SGLang: SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false makes /health answer 200
without generating (/health_generate still generates).
Every nominal duration is multiplied by simhw.time_scale(). Prefill is ~8x slower on a
multi-GPU launch unless NCCL_P2P_LEVEL=SYS and NCCL_GRAPH_FILE (an existing file) are set.
Native /generate answers carry `meta_info.sim_time` (the simulated clock, seconds), which
`sglang.bench_serving` uses so that time-scaled runs report real-time figures.
"""

from sglang.version import __version__  # noqa: F401
