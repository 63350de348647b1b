"""SMG as orchestrator/sglang/gateway.py knows it (pure): `smg launch` arguments, GET /workers
answers and the membership they give against the desired URLs, and the in-flight and finished
requests read from SGLang's /metrics that draining and the back-in proof use."""

from __future__ import annotations

from orchestrator.sglang import gateway as gw

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
    args = gw.gateway_args(host="127.0.0.1", port=30080, prometheus_port=30081,
                           policy="round_robin", settings={"health_check_interval": 1,
                                                           "cb_timeout": 5},
                           extra_args=["--log-level", "info"])
    assert args == ["--host", "127.0.0.1", "--port", "30080", "--prometheus-host", "127.0.0.1",
                    "--prometheus-port", "30081", "--policy", "round_robin",
                    "--health-check-interval-secs", "1", "--cb-timeout-duration-secs", "5",
                    "--log-level", "info"]
    assert gw.control_plane_entry("s:e:c") == "orchestrator:orchestrator:admin:s:e:c"
    # the metrics listener takes no key: loopback whatever the gateway binds
    for host, metrics in (("0.0.0.0", "127.0.0.1"), ("10.1.2.3", "127.0.0.1"), ("::", "::1")):
        out = gw.gateway_args(host=host, port=1, prometheus_port=2, policy="random", settings={})
        assert out[out.index("--prometheus-host") + 1] == metrics


def test_in_flight_from_sglang_metrics() -> None:
    assert gw.in_flight(METRICS) == 5
    assert gw.in_flight(METRICS.replace(" 3.0", " 0.0").replace(" 2.0", " 0.0")) == 0
    assert gw.in_flight("sglang:num_running_reqs 0\nsglang:num_queue_reqs 1\n") == 1
    assert gw.in_flight("# no such gauges\n") is None


def test_requests_done_from_sglang_metrics() -> None:
    text = ('sglang:num_requests_total{model_name="m",is_streaming="false"} 7.0\n'
            'sglang:num_requests_total{model_name="m",is_streaming="true"} 2.0\n')
    assert gw.requests_done(METRICS + text) == 9
    assert gw.requests_done(METRICS) is None


def test_members_from_a_get_workers_answer() -> None:
    """The shape smg 1.13.0 answers (crates/protocols/src/worker.rs:976-998)."""
    answer = {"workers": [{"id": "u1", "url": "http://10.0.0.1:30000/", "is_healthy": True,
                           "status": "ready", "model_id": "kimi-k2.6"},
                          {"id": "u2", "url": "http://10.0.0.2:30000", "is_healthy": False,
                           "status": "not_ready"}, "junk"], "total": 2}
    members = gw.parse_workers(answer)
    assert members == [gw.Member("u1", "http://10.0.0.1:30000", "ready", True),
                       gw.Member("u2", "http://10.0.0.2:30000", "not_ready", False)]
    assert [m.ready for m in members] == [True, False]
    assert gw.Member("u3", "http://x:1", "", True).ready  # no status: is_healthy decides
    assert gw.parse_workers({"error": "no route"}) is None
    assert gw.parse_workers(None) is None


def test_membership_against_the_desired_urls() -> None:
    a, b, c = "http://a:30000", "http://b:30000", "http://c:30000"
    listed = [gw.Member("1", a, "ready", True), gw.Member("2", b, "pending", False),
              gw.Member("3", "http://old:30000", "ready", True)]
    diff = gw.membership(listed, [a + "/", b, c])
    assert diff.missing == (c,)
    assert [m.url for m in diff.unknown] == ["http://old:30000"]
    assert [m.url for m in diff.not_ready] == [b]
    assert diff.reason == ("membership differs: missing http://c:30000; not desired "
                           "http://old:30000; not Ready http://b:30000 (pending)")
    assert not gw.membership(listed[:1], [a]) and gw.membership(listed[:1], [a]).reason == ""
