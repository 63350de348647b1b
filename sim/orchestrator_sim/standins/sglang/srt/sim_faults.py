"""Silent serving failures the stand-in can inject: SGLANG_SIM_FAULT=name[,name...].

Simulator-only (real SGLang has no such module). Each fault leaves the process alive, the start-up
log as usual and /health answering 200, so that only a check of what is served can notice it:

  wrong-draft        with speculation on, greedy output differs from what the same server
                     writes without speculation, from the 2nd token on (a wrong draft vocabulary
                     map or a garbage drafter whose tokens get accepted); the accept length stays
                     at the drafter's usual figure. Without speculation it does nothing.
  zero-accept        with speculation on, every draft is rejected: each verify step emits the
                     bonus token only: accept length 1.00 and accept rate 0.00 in the decode
                     log, /server_info and /metrics; per request spec_num_correct_drafts 0,
                     spec_accept_rate 0.0 and spec_accept_length = completion_tokens /
                     spec_verify_ct = N / (N - 1) for N tokens, as real SGLang computes it (the
                     first token comes from the prefill, not from a verify step:
                     tokenizer_manager.py:3164-3168, scheduler_components/
                     batch_result_processor.py:832 (0.5.23));
                     the text is unchanged and correct (vllm-project/vllm#54997, seen under CUDA
                     graphs; the stand-in applies it with or without them). Without
                     speculation it does nothing.
  scheduler-dead     once the server is ready (after its warm-up) the scheduler forms no batch:
                     generation requests wait forever, /health and /health_generate stay 200
                     (sgl-project/sglang#6624); nothing is logged.
  first-token-stall  the first generation request after ready that is not a health check
                     waits FIRST_TOKEN_STALL_S (or SGLANG_SIM_FIRST_TOKEN_STALL_S) nominal
                     seconds before its first token (kernels
                     JIT-compiled on first use, sgl-project/sglang#7339); later requests are fast.

An unknown name stops the launch (exit 2) before anything loads: a typo must not pass for a
healthy server.
"""

from __future__ import annotations

import os

WRONG_DRAFT = "wrong-draft"
ZERO_ACCEPT = "zero-accept"
SCHEDULER_DEAD = "scheduler-dead"
FIRST_TOKEN_STALL = "first-token-stall"
KNOWN = (WRONG_DRAFT, ZERO_ACCEPT, SCHEDULER_DEAD, FIRST_TOKEN_STALL)

FIRST_TOKEN_STALL_S = 20.0  # nominal seconds, times hardware.time_scale() like every duration


def first_token_stall_s() -> float:
    """The stall's nominal seconds: SGLANG_SIM_FIRST_TOKEN_STALL_S, else FIRST_TOKEN_STALL_S
    (a test at a small time scale lengthens it to stand out of the SSH round trip)."""
    value = os.environ.get("SGLANG_SIM_FIRST_TOKEN_STALL_S")
    return float(value) if value else FIRST_TOKEN_STALL_S


def parse(value) -> frozenset:
    """The fault names of a SGLANG_SIM_FAULT value; ValueError names an unknown one."""
    names = [part.strip() for part in (value or "").split(",") if part.strip()]
    unknown = [name for name in names if name not in KNOWN]
    if unknown:
        raise ValueError(f"SGLANG_SIM_FAULT: unknown fault {unknown[0]!r}; known: "
                         + ", ".join(KNOWN))
    return frozenset(names)


def from_env() -> frozenset:
    """The faults selected in this process's environment."""
    return parse(os.environ.get("SGLANG_SIM_FAULT"))
