"""SGLang's HTTP API shapes (orchestrator/sglang/api.py): the URL on the host, the chat request
and reply, and which request reports its own speculation figures in which release."""

from __future__ import annotations

import pytest

from orchestrator.sglang import accept, api


def test_local_url_reaches_a_wildcard_bind_on_loopback() -> None:
    assert api.local_url("0.0.0.0", 30000) == "http://127.0.0.1:30000"
    assert api.local_url("::", 8) == "http://127.0.0.1:8"
    assert api.local_url("10.0.0.5", api.DEFAULT_PORT) == "http://10.0.0.5:30000"


def test_chat_body_and_reply() -> None:
    body = api.chat_body("kimi", "hi", 8)
    assert body == {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                    "temperature": 0, "stream": False, "model": "kimi"}
    assert "model" not in api.chat_body(None, "hi", 8)  # the router picks
    reply = {"choices": [{"message": {"content": " Paris. ", "reasoning_content": "x"}}]}
    assert api.chat_text(reply) == "Paris."
    assert api.chat_text({"choices": [{"message": {"reasoning_content": "think"}}]}) == "think"
    assert api.chat_text({"choices": [{"message": {"content": None}}]}) == ""
    for bad in ({}, {"choices": []}, [], None, {"choices": [{"message": "text"}]}):
        with pytest.raises(ValueError):
            api.chat_text(bad)


def test_spec_request_per_release() -> None:
    path, body, parse = api.spec_request("m", "count", 16, "0.5.23")
    assert (path, body["return_spec_tokens_details"], parse) == (
        "/v1/chat/completions", True, accept.from_chat)
    path, body, parse = api.spec_request("m", "count", 16, "0.5.9", ignore_eos=True)
    assert (path, parse) == ("/generate", accept.from_generate)
    assert body == {"text": "count", "sampling_params": {
        "max_new_tokens": 16, "temperature": 0, "ignore_eos": True}}
