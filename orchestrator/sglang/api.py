"""SGLang's HTTP API shapes: the server's default address, its URL as seen on its own host, and
the requests the stages send and the answers they read. Pure: the stages make the calls (through
the host's `http` probe)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.sglang import accept

#: --host and --port defaults (0.5.23 sglang/srt/arg_groups/fields/serving.py:65-66, in
#: releases/0.5.23.json)
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000


def local_url(host: str, port: int) -> str:
    """The API's URL as seen on the host itself (a wildcard bind is reached on loopback)."""
    addr = host if host not in ("0.0.0.0", "::") else DEFAULT_HOST
    return f"http://{addr}:{port}"


def chat_body(model: str | None, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """One greedy, non-streaming chat completion (/v1/chat/completions); no model: the
    server's (or the router's) own choice."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}],
                            "max_tokens": max_tokens, "temperature": 0, "stream": False, **extra}
    if model:
        body["model"] = model
    return body


def chat_text(answer: Any) -> str:
    """A chat completion's text: the first choice's content, else its reasoning_content;
    ValueError when the answer is not a chat reply."""
    try:
        msg = answer["choices"][0]["message"]
        return str(msg.get("content") or msg.get("reasoning_content") or "").strip()
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ValueError("not a chat reply") from None


def spec_request(model: str, prompt: str, max_tokens: int, version: str | None,
                 ignore_eos: bool = False
                 ) -> tuple[str, dict[str, Any], Callable[[Any], accept.Sample | None]]:
    """(path, body, parse) of one request that reports its own speculation figures where the
    release can (orchestrator.sglang.accept): the chat route with return_spec_tokens_details
    (0.5.19+), else /generate."""
    if accept.per_request_chat(version):
        return ("/v1/chat/completions",
                chat_body(model, prompt, max_tokens, return_spec_tokens_details=True),
                accept.from_chat)
    body = generate_body(prompt, max_tokens)
    body["sampling_params"]["ignore_eos"] = ignore_eos
    return "/generate", body, accept.from_generate


def generate_body(prompt: str, max_tokens: int) -> dict[str, Any]:
    """/generate with greedy sampling (temperature 0): the text is a pure function of the
    model's weights and the prompt, with or without speculation: a verified draft changes how
    fast tokens come, never which. Greedy verification keeps only drafts equal to the
    target's own argmax: verify_tree_greedy_func, speculative/eagle_info.py:303-313 (0.5.9);
    speculative/eagle_utils.py:650 and :691 (0.5.23)."""
    return {"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}}


def generate_text(answer: Any) -> str:
    """/generate's text; ValueError when the answer is not a generate reply."""
    if isinstance(answer, list) and answer:
        answer = answer[0]
    if not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
        raise ValueError("not a /generate reply")
    return str(answer["text"])
