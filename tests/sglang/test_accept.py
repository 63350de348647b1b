"""Reading the accept length from each place real SGLang reports it (response shapes taken
from the real source; see orchestrator/sglang/accept.py for the file:line of each)."""

from __future__ import annotations

import pytest

from orchestrator.sglang import accept

GENERATE_059 = {"text": "1, 2, 3", "meta_info": {
    "id": "a", "prompt_tokens": 12, "completion_tokens": 32, "finish_reason": {"type": "length"},
    "spec_accept_rate": 0.4, "spec_accept_length": 2.6666, "spec_accept_token_num": 20,
    "spec_draft_token_num": 48, "spec_verify_ct": 12, "spec_accept_histogram": [1, 2, 9]}}
GENERATE_PLAIN = {"text": "1, 2, 3", "meta_info": {"completion_tokens": 32}}
CHAT_0523 = {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {
    "role": "assistant", "content": "1, 2"}}], "usage": {"prompt_tokens": 9,
    "completion_tokens": 26, "total_tokens": 35}, "sglext": {"spec_tokens_details": {
        "spec_accept_rate": 0.53, "spec_accept_length": 2.6, "spec_num_correct_drafts": 16,
        "spec_num_proposed_drafts": 30, "spec_verify_ct": 10}}}
CHAT_N2 = {**CHAT_0523, "usage": {"completion_tokens": 52}, "sglext": {"spec_tokens_details": [
    {"spec_accept_length": 2.5, "spec_verify_ct": 10}, {"spec_accept_length": 2.7,
                                                        "spec_verify_ct": 10}]}}
CHAT_0515 = {**CHAT_0523, "sglext": None}


@pytest.mark.parametrize("body,tokens,steps", [
    (GENERATE_059, 32, 12), (GENERATE_PLAIN, None, None), ({}, None, None), ([], None, None),
    ({"meta_info": {"spec_verify_ct": 0, "completion_tokens": 5}}, None, None),
])
def test_generate_meta_info(body: object, tokens: int | None, steps: int | None) -> None:
    sample = accept.from_generate(body)
    assert (sample.tokens, sample.verify_steps) == (tokens, steps) if sample else tokens is None


@pytest.mark.parametrize("body,expected", [
    (CHAT_0523, (26, 10)), (CHAT_N2, (25, 10)), (CHAT_0515, None), ({}, None),
    ({"sglext": {"spec_tokens_details": {"spec_accept_length": 2.0, "spec_verify_ct": 5}}},
     (10, 5)),  # no usage: tokens from the length and the steps
])
def test_chat_spec_tokens_details(body: dict, expected: tuple[int, int] | None) -> None:
    sample = accept.from_chat(body)
    assert (None if sample is None else (sample.tokens, sample.verify_steps)) == expected


def test_combine_weights_by_verify_steps() -> None:
    samples = [accept.Sample(32, 12), accept.Sample(10, 10)]
    assert accept.combine(samples) == pytest.approx(42 / 22)
    assert accept.combine([]) is None
    assert accept.Sample(5, 0).accept_length == 0.0


def test_server_info_before_and_after_the_decode_log() -> None:
    before = {"version": "0.5.23", "internal_states": [{"last_gen_throughput": 0.0}]}
    after = {"internal_states": [{"avg_spec_accept_length": 2.61, "last_gen_throughput": 30.2}]}
    assert accept.from_server_info(before) is None
    assert accept.from_server_info(after) == 2.61
    assert accept.from_server_info({"internal_states": []}) is None
    assert accept.from_server_info(None) is None


def test_metrics_gauge() -> None:
    page = ("# HELP sglang:spec_accept_length The average acceptance length\n"
            "# TYPE sglang:spec_accept_length gauge\n"
            'sglang:spec_accept_length{model_name="kimi",engine_type="unified"} 2.57\n'
            'sglang:spec_accept_rate{model_name="kimi"} 0.52\n')
    assert accept.from_metrics(page) == 2.57
    assert accept.from_metrics("sglang:num_running_reqs 3\n") is None


def test_decode_work_reaches_one_decode_log() -> None:
    assert accept.decode_work({"decode_log_interval": 40, "speculative_num_draft_tokens": 4}) \
        == 40 * 4 + 16
    assert accept.decode_work({}) == 40 * 8 + 16
    assert accept.decode_work({"decode_log_interval": 5, "speculative_num_draft_tokens": 6}) \
        == 46
    assert accept.per_request_chat("0.5.19") and not accept.per_request_chat("0.5.15")
