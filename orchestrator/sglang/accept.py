"""Where SGLang reports the speculative accept length, and how to read each place (pure parsing).

Read from the real source of 0.5.9 - 0.5.23 (paths under sglang/srt/):

- Per request, /generate: every finished request of a speculative server carries
  `meta_info.spec_accept_length` (= completion_tokens / spec_verify_ct) and `spec_verify_ct`
  (managers/tokenizer_manager.py `_calculate_spec_decoding_metrics`: :1825-1867 (0.5.9),
  :3138-3210 (0.5.23)).
- Per request, OpenAI chat/completions, 0.5.19+: `"return_spec_tokens_details": true` gives the
  response-level `sglext.spec_tokens_details` (an object; a list when n > 1) with
  spec_accept_length and spec_verify_ct (entrypoints/openai/protocol.py:418-449 (0.5.19),
  :961 (0.5.23); serving_chat.py:1857-1885 (0.5.19)).
- /server_info `internal_states[0].avg_spec_accept_length`: cumulative since start (or the last
  /flush_cache), and ABSENT until the first decode log, i.e. --decode-log-interval (default 40)
  decode batches (managers/scheduler.py:2650-2673 (0.5.9); scheduler_components/
  internal_state.py:118-127 (0.5.23); the interval: server_args.py:393 (0.5.9),
  arg_groups/fields/observability.py:136-139 (0.5.23)).
- /metrics (with --enable-metrics), set at decode-log time too: `sglang:spec_accept_length`
  (metrics/collector.py:387-398 (0.5.9); observability/metrics_collector.py:512 (0.5.23)).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orchestrator.sglang.flags import at_least

DEFAULT_DECODE_LOG_INTERVAL = 40
_METRIC = re.compile(r"^sglang:spec_accept_length(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


@dataclass(frozen=True)
class Sample:
    """One request's speculation figures: tokens generated and verify steps they took."""

    tokens: int
    verify_steps: int

    @property
    def accept_length(self) -> float:
        return self.tokens / self.verify_steps if self.verify_steps else 0.0


def _sample(details: Any, tokens: Any) -> Sample | None:
    if not isinstance(details, dict):
        return None
    steps = details.get("spec_verify_ct")
    if isinstance(steps, int) and steps > 0:
        if not isinstance(tokens, int):
            length = details.get("spec_accept_length")
            tokens = round(float(length) * steps) if isinstance(length, (int, float)) else None
        if isinstance(tokens, int):
            return Sample(tokens, steps)
    return None


def from_generate(body: Any) -> Sample | None:
    """The figures of a /generate response (meta_info), or None when it reports none."""
    meta = body.get("meta_info") if isinstance(body, dict) else None
    if not isinstance(meta, dict):
        return None
    return _sample(meta, meta.get("completion_tokens"))


def from_chat(body: Any) -> Sample | None:
    """The figures of a chat/completions response with return_spec_tokens_details."""
    if not isinstance(body, dict):
        return None
    details = (body.get("sglext") or {}).get("spec_tokens_details")
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    tokens = usage.get("completion_tokens")
    if isinstance(details, list):  # n > 1: usage counts every choice; use the first's figures
        details, tokens = (details[0] if details else None), None
    return _sample(details, tokens)


def combine(samples: list[Sample]) -> float | None:
    """The accept length over several requests (total tokens / total verify steps)."""
    steps = sum(s.verify_steps for s in samples)
    return sum(s.tokens for s in samples) / steps if steps else None


def from_server_info(info: Any) -> float | None:
    """internal_states[0].avg_spec_accept_length (absent before the first decode log)."""
    if not isinstance(info, dict):
        return None
    states = info.get("internal_states") or []
    if states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
        if isinstance(value, (int, float)):
            return float(value)
    value = info.get("avg_spec_accept_length")
    return float(value) if isinstance(value, (int, float)) else None


def from_metrics(text: str) -> float | None:
    """The sglang:spec_accept_length gauge of a /metrics page (None when absent)."""
    m = _METRIC.search(text or "")
    return float(m.group(1)) if m else None


def decode_work(info: Any) -> int:
    """Tokens one request must generate so that the decode log runs at least once.

    The log runs every decode_log_interval decode batches; one request alone makes one batch
    per step and a step emits at most num_draft_tokens tokens.
    """
    info = info if isinstance(info, dict) else {}
    interval = info.get("decode_log_interval")
    interval = interval if isinstance(interval, int) and interval > 0 else \
        DEFAULT_DECODE_LOG_INTERVAL
    per_step = info.get("speculative_num_draft_tokens")
    per_step = per_step if isinstance(per_step, int) and per_step > 0 else 8
    return interval * per_step + 16


def per_request_chat(version: str | None) -> bool:
    """True when the release takes return_spec_tokens_details on chat (0.5.19+)."""
    return at_least(version, 0, 5, 19)
