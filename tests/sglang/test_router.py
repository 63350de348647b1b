"""SGLang's router as orchestrator/sglang/router.py knows it (pure): the launcher's arguments,
the in-flight and finished requests read from SGLang's /metrics that the rolling redeploy drains
on, and GET /workers answers."""

from __future__ import annotations

from orchestrator.sglang import router as rt

#: SGLang's own /metrics lines (0.5.23 metrics_collector.py:364-375: labelled gauges; with
#: priority scheduling a total under priority="" plus one series per priority: 1417-1429)
METRICS = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="kimi-k2.6",engine_type="unified",tp_rank="0",pp_rank="0"} 3.0
sglang:num_queue_reqs{model_name="kimi-k2.6",engine_type="unified",tp_rank="0",pp_rank="0"} 2.0
sglang:num_grammar_queue_reqs{model_name="kimi-k2.6"} 7.0
sglang:gen_throughput{model_name="kimi-k2.6"} 12.5
"""


def test_launch_arguments() -> None:
    args = rt.router_args(["http://a:30000", "http://b:30000"], policy="round_robin",
                          host="0.0.0.0", port=30080, extra_args=["--log-level", "info"])
    assert args == ["--host", "0.0.0.0", "--port", "30080", "--policy", "round_robin",
                    "--worker-urls", "http://a:30000", "http://b:30000", "--log-level", "info"]


def test_in_flight_from_sglang_metrics() -> None:
    assert rt.in_flight(METRICS) == 5
    assert rt.in_flight(METRICS.replace(" 3.0", " 0.0").replace(" 2.0", " 0.0")) == 0
    assert rt.in_flight("sglang:num_running_reqs 0\nsglang:num_queue_reqs 1\n") == 1
    assert rt.in_flight("# no such gauges\n") is None


def test_requests_done_from_sglang_metrics() -> None:
    text = ('sglang:num_requests_total{model_name="m",is_streaming="false"} 7.0\n'
            'sglang:num_requests_total{model_name="m",is_streaming="true"} 2.0\n')
    assert rt.requests_done(METRICS + text) == 9
    assert rt.requests_done(METRICS) is None


def test_workers_from_a_get_workers_answer() -> None:
    answer = {"workers": [{"id": "u1", "url": "http://10.0.0.1:30000/", "is_healthy": True,
                           "load": 2}, {"id": "u2", "url": "http://10.0.0.2:30000"}, "junk"],
              "total": 2}
    assert rt.parse_workers(answer) == [rt.Worker("u1", "http://10.0.0.1:30000", True, 2),
                                        rt.Worker("u2", "http://10.0.0.2:30000", False, 0)]
    assert rt.parse_workers({"error": "no route"}) is None
    assert rt.parse_workers(None) is None
