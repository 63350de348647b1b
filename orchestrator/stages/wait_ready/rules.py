"""Pure rules of the `wait_ready` stage: typed facts and parameters in, a decision or a message
out. No host is touched here; tests/stages/sglang_rules/*.json drive these from tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.facts.http import HttpAnswer
from orchestrator.facts.server import ExitRecord, PidFile


@dataclass(frozen=True)
class ReadyMarker:
    """STATE_DIR/ready.json: the server instance wait_ready verified, and its accept length."""

    pid: Any
    started_at: Any
    accept_length: float | None

    @classmethod
    def parse(cls, raw: Any) -> ReadyMarker | None:
        """None unless the file held a JSON object."""
        if not isinstance(raw, dict):
            return None
        acc = raw.get("accept_length")
        return cls(pid=raw.get("pid"), started_at=raw.get("started_at"),
                   accept_length=float(acc) if isinstance(acc, (int, float))
                   and not isinstance(acc, bool) else None)

    def names(self, pidfile: PidFile | None) -> bool:
        """This marker is about the server instance of PIDFILE (same pid and start time)."""
        pf = pidfile or PidFile(None, None, None, None, None, None, None)
        return (self.pid, self.started_at) == (pf.pid, pf.started_at)


def arch_problem(want: list[str], info: dict[str, Any]) -> str | None:
    """The served architectures lack one we expect (from /model_info)."""
    got = list(info.get("architectures") or [])
    if [a for a in want if a not in got]:
        return (f"the server serves architectures {got} from {info.get('model_path')}, "
                f"expected {want}")
    return None


def health_state(answer: HttpAnswer) -> str:
    """What a /health answer that is not 200 means, for the progress line."""
    if answer.refused:
        return "loading (port closed)"
    if answer.status == 503:
        return "warming up (/health 503)"
    return f"/health: {answer.error or answer.status}"


def exit_how(rec: ExitRecord | None) -> str:
    """"exited with code N", "was killed by signal N", or "is gone"."""
    if rec is not None and rec.code is not None:
        return f"exited with code {rec.code}"
    if rec is not None and rec.signal:
        return f"was killed by signal {rec.signal}"
    return "is gone"


def accept_verdict(live: float | None, verified: float | None,
                   floor: float) -> tuple[bool, str]:
    """(converged, reason): the server's own cumulative figure where it reports one, else the
    one this instance was verified with, must stay above the floor."""
    value = live if live is not None else verified
    if value is None:
        return False, "accept length not measured yet"
    if value <= floor:
        return False, f"accept length {value:.2f} is not above {floor}"
    return True, f"ready; accept length {value:.2f} > {floor}"


def needs_drafter_archs(info: dict[str, Any]) -> bool:
    """accept_message needs the drafter's architectures (read from its config.json)."""
    draft = info.get("speculative_draft_model_path")
    return bool(info.get("speculative_algorithm") and draft and draft != info.get("model_path"))


def accept_message(info: dict[str, Any], accept: float | None, *, floor: float | None,
                   requests: int, drafter_archs: list[str]) -> str:
    """Why speculative decoding does not pay off, from /server_info and the drafter."""
    algo = info.get("speculative_algorithm")
    draft = info.get("speculative_draft_model_path")
    got = "not reported" if accept is None else f"{accept:.2f}"
    head = (f"speculative decoding does not pay off: accept length {got}, required > "
            f"{floor} (measured over {requests} requests)")
    if not algo:
        return head + ("; the server runs WITHOUT speculative decoding (no "
                       "speculative_algorithm): set speculative.algorithm: EAGLE3 and "
                       "draft_model_path on sglang_server")
    if draft and draft == info.get("model_path"):
        return head + (f"; the target model is its own draft ({draft}): SGLang filled in the "
                       "missing draft path (sglang issue #36528): set draft_model_path to "
                       "the EAGLE-3 drafter")
    if algo == "EAGLE" and any("Eagle3" in a for a in drafter_archs):
        return head + (f"; speculative_algorithm is EAGLE but the drafter is an EAGLE-3 "
                       f"model ({', '.join(drafter_archs)}): SGLang then silently accepts "
                       "nothing (sglang PR #21272). Set speculative.algorithm: EAGLE3")
    if accept is not None and accept < 1.05:  # per request N / (N - 1): the bonus tokens only
        return head + (f"; every draft is rejected (0% acceptance, algorithm {algo}, drafter "
                       f"{draft}: {', '.join(drafter_archs) or 'unknown'}): with the drafter "
                       "trained for this target this is a broken draft path, seen with CUDA "
                       "graphs (vllm-project/vllm#54997): try disable_cuda_graph once to "
                       "confirm, and check the drafter's repo and revision")
    return head + (f"; algorithm {algo}, drafter {draft} "
                   f"({', '.join(drafter_archs) or 'unknown'}): the drafter does not match the "
                   "target (wrong repo or revision?) - use the drafter trained for this target")


#: the fixed prompts answered greedily at ready: short, factual, with one obvious continuation
GREEDY_PROMPTS = (
    "The capital of France is",
    "Count from one to ten in words: one, two,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
)


def _shared(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def greedy_problem(reference: dict[str, str], answers: dict[str, str]) -> str | None:
    """Why the speculative server's greedy answers are not the target's own, or None.

    An answer passes when it equals the recorded one, or first differs in the second half of
    the longer of the two: greedy decoding can flip a late near-tie when batch shapes change
    kernels' summation order, while a wrong draft (vocabulary map, drafter) changes the text
    from its first tokens on. A prompt without a recorded answer is not compared.
    """
    wrong = []
    for prompt, want in reference.items():
        got = answers.get(prompt)
        if got is None or got == want:
            continue
        if _shared(got, want) * 2 >= max(len(got), len(want)):
            continue
        wrong.append(f"{prompt[:40]!r}: expected {want[:60]!r}, got {got[:60]!r}")
    if not wrong:
        return None
    return (f"speculative decoding changes the output: {len(wrong)} of {len(reference)} "
            "greedy answers differ from the target's own (recorded without speculation): "
            + "; ".join(wrong) + ". A correct drafter only changes the speed: a wrong "
            "vocabulary map (draft_vocab_size / hot tokens), a drafter for another model or "
            "revision, or a broken draft backend does this")
