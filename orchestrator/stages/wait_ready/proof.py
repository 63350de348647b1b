"""What wait_ready proves after /health answers 200, beyond the model and a chat reply: a first
token in time (a scheduler dead behind a healthy /health, a JIT stall after ready) and greedy
answers that are the target's own (a drafter that corrupts the output). Calls through
`ServerApi`; the verdict on the answers is `rules.greedy_problem`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from orchestrator.errors import StageError
from orchestrator.sglang import api as shapes
from orchestrator.stages.base import StageContext
from orchestrator.stages.sglang_server.change import indent
from orchestrator.stages.wait_ready import rules
from orchestrator.stages.wait_ready.api import ServerApi


def first_token(api: ServerApi, ctx: StageContext, timeout: float, stall: float,
                log_tail: Callable[[], tuple[str, tuple[str, ...]]]) -> None:
    """One one-token request must answer within `timeout`: /health can answer 200 while the
    scheduler is dead (sglang#6624). A first answer slower than `stall` is a stall (kernels
    compiled on first use, sglang#7339): warned about, and asked again until it is gone (or
    the time is spent), so that ready means ready for users."""
    t0 = time.monotonic()
    first: float | None = None
    while True:
        left = timeout - (time.monotonic() - t0)
        ctx.progress("the first token: one greedy one-token request")
        took, answer = api.timed_post("/generate", shapes.generate_body("Hello", 1),
                                      timeout=max(1.0, left))
        if answer.status != 200:
            if answer.status is not None:
                raise StageError(f"{api.base}/generate answered {answer.status}: "
                                 f"{answer.body[:300]}", hint="look at the server log")
            path, lines = log_tail()
            raise StageError(
                f"{api.base} answers /health 200 but produced no token within {timeout:.0f}s "
                f"({answer.error}): its scheduler is dead or hung behind a healthy /health "
                f"(sglang#6624); last lines of {path or 'the server log'}:\n"
                f"{indent(chr(10).join(lines) or '(empty)')}",
                hint="restart it (deploy again, or `orchestrator stop` then deploy); if it "
                "repeats, look for NCCL or driver errors in the log")
        first = took if first is None else first
        if took <= stall or time.monotonic() - t0 >= timeout:
            break
    ctx.record("first_token_s", round(first, 3))
    if first > stall:
        ctx.warn("ready.first_token_stall",
                 f"the first request after ready took {first:.1f}s (> {stall:g}s): kernels "
                 f"compiled on first use (sglang#7339); warmed up before ready (the last took "
                 f"{took:.2f}s). Keep the kernel cache (kernel-cache beside the venv) so the "
                 "next start has them")


def greedy(api: ServerApi, ctx: StageContext, prompts: list[str], max_tokens: int,
           reference: dict[str, str] | None, info: dict[str, Any]) -> None:
    """The fixed prompts answered greedily (fact `greedy`); with speculation and a reference
    recorded without it, the answers must be the target's own."""
    answers: dict[str, str] = {}
    for i, prompt in enumerate(prompts):
        ctx.progress(f"greedy answers: {i + 1}/{len(prompts)}")
        r = api.post("/generate", shapes.generate_body(prompt, max_tokens))
        if not r.ok:
            raise StageError(f"{api.base}/generate answered {r.status or r.error}: "
                             f"{r.body[:300]}", hint="look at the server log")
        try:
            answers[prompt] = shapes.generate_text(r.json())
        except ValueError:
            answers[prompt] = ""
    algo = info.get("speculative_algorithm")
    ctx.record("greedy", {"speculative": algo or None, "max_tokens": max_tokens,
                          "answers": answers})
    if algo and reference:
        problem = rules.greedy_problem(reference, answers)
        if problem:
            raise StageError(problem, hint="deploy without speculation to compare, and check "
                             "the drafter (repo, revision, draft vocabulary)")
