"""The stand-in's scheduler: continuous batching driven by a speed model instead of a GPU.

Speed model (simulated seconds; real sleeps are multiplied by the hardware's time scale). It is
a MODEL chosen to reproduce the seed figures of FACTS.md, not something read from SGLang:
- one forward of the target over T tokens takes 38 ms + 0.05 ms * T, plus 0.4 ms per token beyond
  32 (latency-bound on the PCIe box up to ~32 tokens a step, compute-bound past it): a plain
  decode step for B requests is a forward over B tokens, i.e. 26.3 tok/s for one request and
  ~808 tok/s aggregate at 32 concurrent (the seed figures), ~1190 at 64;
- a speculative step for B requests is `num_steps` draft forwards over B x topk tokens (7.2 ms +
  0.04 ms per token each, for a one-layer EAGLE-3 drafter; other drafters scale this) plus ONE
  target forward verifying B x num_draft_tokens tokens, plus 3 ms for tree verification when
  topk > 1. It emits `accept_length` tokens per request on average. Cheap verification at low
  batch makes EAGLE-3 (3 steps, topk 1, accept length 2.61) 1.66x at concurrency 1; at 32
  requests the verify forward covers 128 tokens, deep in the compute-bound part, and speculation
  turns into a small loss (0.96x); more steps or a wider tree accept more but cost more, so the
  best setting moves from wide/deep trees at low concurrency to short chains, then to none;
- prefill runs at ~7478 tok/s on a multi-GPU host only when NCCL is tuned for the PCIe box
  (NCCL_P2P_LEVEL=SYS and an existing NCCL_GRAPH_FILE), otherwise at ~876 tok/s.
Together with SGLang's default `max_running_requests` of 48 under speculation (applied in
server_args.py), the gain shrinks with load and speculation stops paying near 32 concurrent.

Time is kept on a virtual clock (sum of modelled step times), so throughput figures in logs,
/server_info and /metrics follow the model even when the real sleeps are tiny.

Speculation bookkeeping follows SGLang's scheduler (paths relative to sglang/, per release):
- every decode step of a request with speculation is ONE verify step that emits n tokens
  (n - 1 correct drafts plus the bonus token); the request counts its verify steps, correct
  drafts and a histogram of correct drafts per step (0.5.9 managers/schedule_batch.py:866-876,
  speculative/eagle_info.py:430-431), which /generate reports when it finishes;
- the scheduler adds n and 1 per request to a window (0.5.9 scheduler_metrics_mixin.py:147-150)
  and moves the window into the cumulative totals ONLY inside the decode log, which runs every
  `--decode-log-interval` decode batches (0.5.9 scheduler_output_processor_mixin.py:532-535,
  scheduler_metrics_mixin.py:366-389; 0.5.23 managers/scheduler_components/metrics_reporter.py
  :934, 963-1005). /server_info's avg_spec_accept_length is totals-accepted / totals-steps and
  is absent while the totals are empty (0.5.9 scheduler.py:2663-2666; 0.5.23
  scheduler_components/internal_state.py:118-127, 243-253);
- /flush_cache (only when idle) zeroes the decode-batch counter, the window and the totals
  (0.5.9 scheduler.py:2623-2648, scheduler_metrics_mixin.py:152-158; 0.5.23 scheduler.py:
  5518-5546, metrics_reporter.py:708-717).
"""

from __future__ import annotations

import collections
import math
import os
import queue
import threading
import time
import uuid

from sglang.srt import sim_faults
from sglang.srt.utils import at_least, log

_WORDS = (
    "the quick brown fox jumps over a lazy dog while seven silver ships sail north across "
    "calm water under bright morning light and every sailor sings an old song about home"
).split()
# SGLANG_SIM_FAULT=wrong-draft: how far a wrong draft vocabulary map moves every token after the
# first (len(_WORDS) is 31, a prime, and the words are unique: each moved word is another word)
_WRONG_DRAFT_SHIFT = 11


FORWARD_FIXED = 0.038  # s: one target forward, latency-bound (allreduce over PCIe, 61 layers)
FORWARD_PER_TOKEN = 0.00005  # s per token while latency-bound
COMPUTE_KNEE = 32  # tokens per forward beyond which the forward is compute-bound
FORWARD_PER_TOKEN_BEYOND = 0.0004  # s per token beyond the knee
DRAFT_FIXED = 0.0072  # s: one forward of a one-layer EAGLE-3 drafter
DRAFT_PER_TOKEN = 0.00004  # s per drafted token
TREE_VERIFY = 0.003  # s: tree-structured verification (topk > 1) per step
FOLLOW_GRACE = 0.02  # real seconds the scheduler waits for the requests that follow finished ones
ARRIVAL_QUIET = 0.002  # real seconds without a new request that end a burst of arrivals
ARRIVAL_MAX = 0.02  # real seconds a burst of arrivals may take at most


def forward_seconds(tokens: int) -> float:
    """Nominal seconds of one target forward over `tokens` tokens (decode or verify)."""
    tokens = max(1, tokens)
    return (FORWARD_FIXED + FORWARD_PER_TOKEN * tokens
            + FORWARD_PER_TOKEN_BEYOND * max(0, tokens - COMPUTE_KNEE))


def base_step_seconds(batch: int) -> float:
    """Nominal seconds of one plain decode step for `batch` running requests."""
    return forward_seconds(batch)


def spec_step_seconds(batch: int, spec) -> float:
    """Nominal seconds of one speculative step (draft x num_steps, then one verify forward)."""
    draft = DRAFT_FIXED + DRAFT_PER_TOKEN * batch * spec.topk
    seconds = spec.num_steps * spec.draft_scale * draft
    seconds += forward_seconds(batch * spec.num_draft_tokens)
    return seconds + (TREE_VERIFY if spec.topk > 1 else 0.0)


def prefill_rate(tp_size: int) -> float:
    """Prefill tokens per second: NCCL untuned on the PCIe box makes prefill ~8x slower."""
    if tp_size <= 1:
        return 7478.0
    graph = os.environ.get("NCCL_GRAPH_FILE", "")
    tuned = os.environ.get("NCCL_P2P_LEVEL", "").upper() == "SYS" and graph and os.path.isfile(
        graph
    )
    return 7478.0 if tuned else 876.0


class Req:
    """One generation request as the scheduler tracks it."""

    def __init__(self, prompt_tokens: int, max_new_tokens: int, finish_reason: str,
                 seed: int = 0, health: bool = False) -> None:
        self.rid = uuid.uuid4().hex
        self.health = health  # /health's one-token request (HEALTH_CHECK_ rid in SGLang)
        self.corrupt = False  # SGLANG_SIM_FAULT=wrong-draft with speculation on
        self.prompt_tokens = max(1, int(prompt_tokens))
        self.max_new_tokens = max(1, int(max_new_tokens))
        self.finish_reason = finish_reason  # "length" or "stop" once max_new_tokens is reached
        self.seed = seed
        self.generated = 0
        self.steps = 0  # verify steps (decode steps) of this request: spec_verify_ct
        self.correct_drafts = 0  # accepted draft tokens, the bonus token excluded
        self.histogram = []  # histogram[k]: verify steps that accepted k drafts
        self.out = queue.Queue()
        self.aborted = False
        self.vstart = 0.0
        self.vfirst = None
        self.vend = None

    def words(self, start: int, count: int) -> str:
        """The text of tokens [start, start+count): deterministic filler words.

        A corrupted request (wrong-draft) keeps its first token, which the target's prefill
        samples, and gets other words from the second on, which come from accepted drafts.
        """
        picked = []
        for i in range(start, start + count):
            index = self.seed + i
            if self.corrupt and i >= 1:
                index += _WRONG_DRAFT_SHIFT
            picked.append(_WORDS[index % len(_WORDS)])
        text = " ".join(picked)
        return text if start == 0 else " " + text


class Scheduler:
    """Continuous batching over a virtual clock; one thread, like SGLang's scheduler process."""

    def __init__(self, server_args, loaded, scale: float, faults=frozenset()) -> None:
        self.args = server_args
        self.loaded = loaded
        self.scale = scale
        self.spec = loaded.spec
        # SGLANG_SIM_FAULT (sim_faults.py): the speculation faults act from the start (warm-up
        # included) and only with speculation on; the others are armed by serving_started()
        self.wrong_draft = sim_faults.WRONG_DRAFT in faults and self.spec.enabled
        self.zero_accept = sim_faults.ZERO_ACCEPT in faults and self.spec.enabled
        self._arm_on_ready = faults & {sim_faults.SCHEDULER_DEAD, sim_faults.FIRST_TOKEN_STALL}
        self.dead = False
        self._stall_pending = False
        self.max_running = max(1, int(server_args.max_running_requests or 1))
        self.interval = max(1, int(server_args.decode_log_interval or 40))
        self.prefill_tps = prefill_rate(server_args.tp_size)
        self.cv = threading.Condition()
        self.waiting = collections.deque()
        self.running = []
        self.stopped = False
        self.vclock = 0.0
        self._deadline = time.monotonic()
        self._last_arrival = 0.0
        self.controls = collections.deque()  # (function, reply queue): run between batches
        # statistics
        self.decode_steps = 0
        self.num_requests = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.last_gen_throughput = 0.0
        # Prometheus gauges, set at decode-log time only (0.5.9 scheduler_metrics_mixin.py:
        # 420-437): 0 until the first decode log, and 0 without speculation
        self.last_spec_accept_length = 0.0
        self.last_spec_accept_rate = 0.0
        self.reset_metrics()
        self.thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)

    # ------------------------------------------------------------------ API
    def start(self) -> None:
        self.thread.start()

    def shutdown(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()
        self.thread.join(timeout=5)

    def serving_started(self) -> None:
        """The server declared itself ready: arm the faults that strike only then."""
        with self.cv:
            self.dead = sim_faults.SCHEDULER_DEAD in self._arm_on_ready
            self._stall_pending = sim_faults.FIRST_TOKEN_STALL in self._arm_on_ready
            self.cv.notify_all()

    def submit(self, req: Req) -> Req:
        req.corrupt = self.wrong_draft
        with self.cv:
            req.vstart = self.vclock
            self._last_arrival = time.monotonic()
            self.waiting.append(req)
            self.num_requests += 1
            self.cv.notify_all()
        return req

    def reset_metrics(self) -> None:
        """Zero the decode-batch counter, the window and the speculation totals.

        SGLang's reset_metrics (0.5.9 scheduler_metrics_mixin.py:152-158; 0.5.23
        scheduler_components/metrics_reporter.py:708-717).
        """
        self.forward_ct_decode = 0
        self._win_tokens = 0
        self._win_vtime = 0.0
        self._win_accepted = 0  # accepted tokens, bonus included
        self._win_forward = 0  # verify steps
        self.spec_total_accepted = 0
        self.spec_total_forward = 0

    def call(self, fn, timeout: float = 60.0):
        """Run `fn()` on the scheduler thread between two batches (like SGLang's control
        requests, handled by the scheduler loop) and return its result."""
        reply = queue.Queue()
        with self.cv:
            self.controls.append((fn, reply))
            self.cv.notify_all()
        return reply.get(timeout=timeout)

    def flush_cache(self) -> bool:
        """SGLang's Scheduler.flush_cache: only when no request is queued or running.

        0.5.9 scheduler.py:2623-2648; 0.5.23 scheduler.py:5518-5546.
        """
        if self.waiting or self.running:
            log(f"Cache not flushed because there are pending requests. #queue-req: "
                f"{len(self.waiting)}, #running-req: {len(self.running)}", "TP0")
            return False
        self.reset_metrics()
        log("Cache flushed successfully!", "TP0")
        return True

    @property
    def avg_spec_accept_length(self):
        """Cumulative accept length, or None before the first decode log (and without
        speculation): 0.5.9 scheduler.py:2663-2666; 0.5.23 internal_state.py:243-253."""
        if not self.spec.enabled or self.spec_total_forward <= 0:
            return None
        return self.spec_total_accepted / float(self.spec_total_forward)

    def step_seconds(self, batch: int) -> float:
        """Nominal seconds of one decode step of `batch` running requests."""
        if not self.spec.enabled:
            return base_step_seconds(batch)
        return spec_step_seconds(batch, self.spec)

    # ------------------------------------------------------------------ loop
    def _sleep(self, nominal: float) -> None:
        self.vclock += nominal
        now = time.monotonic()
        self._deadline = max(self._deadline, now) + nominal * self.scale
        delay = self._deadline - now
        if delay > 0:
            time.sleep(delay)

    def _has_work(self) -> bool:
        if self.controls:
            return True
        if self.dead:  # only health checks get an answer
            return any(r.health for r in self.waiting)
        return bool(self.waiting or self.running)

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.stopped and not self._has_work():
                    self.cv.wait(0.5)
                if self.stopped:
                    break
                controls = list(self.controls)
                self.controls.clear()
            for fn, reply in controls:
                try:
                    reply.put(fn())
                except Exception as exc:  # handed to the caller
                    reply.put(exc)
            if self.dead:
                self._ack_health_checks()
                continue
            self._coalesce_arrivals()
            with self.cv:
                free = self.max_running - len(self.running)
                new = []
                while self.waiting and free > 0:
                    req = self.waiting.popleft()
                    if not req.aborted:
                        new.append(req)
                        free -= 1
                queued = len(self.waiting)
            self.running = [r for r in self.running if not r.aborted]
            if new:
                self._prefill(new, queued)
            if self.running:
                before = len(self.running)
                self._decode_step(queued)
                self._await_followers(before - len(self.running))
        for req in list(self.running) + list(self.waiting):
            req.out.put(("abort", "server shutting down", self.vclock))
        with self.cv:
            for _fn, reply in self.controls:
                reply.put(RuntimeError("server shutting down"))
            self.controls.clear()

    def _ack_health_checks(self) -> None:
        """SGLANG_SIM_FAULT=scheduler-dead: the scheduler loop runs, no batch ever forms.

        What real SGLang does then, which keeps /health at 200 (the false positive of
        sgl-project/sglang#6624): a health check that finds the scheduler not fully idle is not
        run but queued for a bare HealthCheckOutput (0.5.23 managers/scheduler.py:2240-2247),
        which the idle housekeeping sends at once (on_idle, scheduler.py:5240-5245 ->
        maybe_send_health_check_signal, :5182-5198); any message from the scheduler bumps
        tokenizer_manager.last_receive_tstamp (managers/tokenizer_manager.py:2465-2478), and
        /health answers 200 as soon as that is later than its own start (entrypoints/
        http_server.py:779-785). Simplification: the stand-in answers a health check so even
        while no request waits yet (real SGLang would queue that one check and time it out).

        Logs nothing, as a hang does: the scheduler's watchdog is active only while a batch
        runs (managers/scheduler_components/invariant_checker.py:518-523, utils/watchdog.py:
        133-166), and here none does; the stuck requests' access lines never come either.
        """
        with self.cv:
            checks = [r for r in self.waiting if r.health]
            for req in checks:
                self.waiting.remove(req)
        for req in checks:
            req.out.put(("finish", req.finish_reason, self.vclock))

    def _first_token_stall(self, new: list) -> None:
        """SGLANG_SIM_FAULT=first-token-stall: the first batch after ready that holds a request
        other than a health check JIT-compiles its kernels first (sgl-project/sglang#7339).

        Health checks do not trigger it (a choice): SGLang's check is one token of input_ids=[0]
        with max_new_tokens=1 (0.5.23 entrypoints/http_server.py:751-762), the same tiny shapes
        the warm-up already ran, while a user's prompt brings new ones; and a readiness probe
        that polled /health must not use the stall up before the request it is meant to catch.
        Requests that arrive during the stall wait for it too (one scheduler thread, like the
        real scheduler blocked in the compile).

        The log line is the one SGLang writes when DeepGEMM compiles a kernel on first use
        (layers/deep_gemm_wrapper/compile_utils.py:179-183 (0.5.23), :134-138 (0.5.9), reached
        from _deep_gemm_execution_hook, :526-531 (0.5.23)); the stand-in does not model which
        kernel library a quantization uses (Triton and FlashInfer compile without SGLang
        logging a line).
        """
        if not self._stall_pending or all(r.health for r in new):
            return
        self._stall_pending = False
        cfg = self.loaded.hf_config
        hidden = 7168
        if cfg is not None:
            try:
                hidden = int(cfg.get("hidden_size") or hidden)
            except (AttributeError, TypeError, ValueError):
                pass
        log(f"Try DeepGEMM JIT Compiling for <GEMM_NT_F8F8BF16> N={hidden}, K={hidden}, "
            "num_groups=1 with all Ms. It only takes a little time (typically 1 sec) if you "
            "have run `python3 -m sglang.compile_deep_gemm`. ", "TP0")
        self._sleep(sim_faults.first_token_stall_s())

    def _prefill(self, new: list, queued: int) -> None:
        self._first_token_stall(new)
        tokens = sum(r.prompt_tokens for r in new)
        self._sleep(0.01 + tokens / self.prefill_tps)
        self.prompt_tokens_total += tokens
        log(f"Prefill batch, #new-seq: {len(new)}, #new-token: {tokens}, #cached-token: 0, "
            f"token usage: {self._usage():.2f}, #running-req: {len(self.running)}, "
            f"#queue-req: {queued}", "TP0")
        for req in new:
            req.vfirst = self.vclock
            self._emit(req, 1)
            if req.generated < req.max_new_tokens:
                self.running.append(req)

    def _coalesce_arrivals(self) -> None:
        """Admit a burst of requests together, as the real box would.

        Requests a client sends at once reach the real server within a millisecond, a fraction
        of one 40 ms step, so they start in one prefill batch. Time-scaled, that millisecond is
        many steps; so while requests wait to be admitted and more keep arriving, the scheduler
        waits (real time, no simulated time passes) for ARRIVAL_QUIET without a new one, at most
        ARRIVAL_MAX. Not in real time.
        """
        if self.scale >= 0.5:
            return
        with self.cv:
            if not self.waiting or len(self.running) >= self.max_running:
                return
            deadline = time.monotonic() + ARRIVAL_MAX
            while not self.stopped:
                now = time.monotonic()
                quiet = self._last_arrival + ARRIVAL_QUIET - now
                if quiet <= 0 or now >= deadline:
                    return
                self.cv.wait(min(quiet, deadline - now))

    def _await_followers(self, finished: int) -> None:
        """Give clients the real time to send the requests that follow finished ones.

        A benchmark client sends its next request as soon as one finishes: within a millisecond,
        nothing against a 40 ms decode step on the real box. Time-scaled, a step lasts well under
        a millisecond of real time, so without this wait the next steps would run with a batch
        the real box would not see. Waits (real time, no simulated time passes) until as many
        new requests arrived as finished, for at most FOLLOW_GRACE seconds; not in real time.
        """
        if finished <= 0 or self.scale >= 0.5:
            return
        with self.cv:
            self.cv.wait_for(lambda: self.stopped or len(self.waiting) >= finished,
                             timeout=FOLLOW_GRACE)

    def _decode_step(self, queued: int) -> None:
        batch = len(self.running)
        nominal = self.step_seconds(batch)
        self._sleep(nominal)
        emitted = 0
        still = []
        for req in self.running:
            if req.aborted:
                continue
            a = self.spec.accept_length if self.spec.enabled else 1.0
            if self.zero_accept:  # every draft rejected: the bonus token only
                a = 1.0
            k = req.steps
            n = int(math.floor((k + 1) * a + 1e-9) - math.floor(k * a + 1e-9))
            n = max(1, min(n, req.max_new_tokens - req.generated))
            req.steps += 1
            if self.spec.enabled:
                # one verify step: n - 1 correct drafts + the bonus token (0.5.9
                # speculative/eagle_info.py:430-431, managers/schedule_batch.py:866-876)
                req.correct_drafts += n - 1
                if len(req.histogram) < n:
                    req.histogram.extend([0] * (n - len(req.histogram)))
                req.histogram[n - 1] += 1
                # update_spec_metrics: accepted + bonus, one forward per request (0.5.9
                # scheduler_metrics_mixin.py:147-150)
                self._win_accepted += n
                self._win_forward += 1
            emitted += n
            self._emit(req, n)
            if req.generated < req.max_new_tokens:
                still.append(req)
        kv_tokens = sum(r.prompt_tokens + r.generated for r in self.running)
        self.running = still
        self.decode_steps += 1
        self._win_tokens += emitted
        self._win_vtime += nominal
        # forward_ct_decode counts decode batches since start or the last flush; the decode log
        # runs when it is a multiple of --decode-log-interval (0.5.9
        # scheduler_output_processor_mixin.py:532-535; 0.5.23 metrics_reporter.py:934)
        self.forward_ct_decode = (self.forward_ct_decode + 1) % (1 << 30)
        if self.forward_ct_decode % self.interval == 0:
            self._log_decode(batch, kv_tokens, queued)

    def _emit(self, req: Req, n: int) -> None:
        start = req.generated
        req.generated += n
        self.generation_tokens_total += n
        req.out.put(("tokens", (start, n), self.vclock))
        if req.generated >= req.max_new_tokens:
            req.vend = self.vclock
            req.out.put(("finish", req.finish_reason, self.vclock))

    def _usage(self) -> float:
        used = sum(r.prompt_tokens + r.generated for r in self.running)
        return used / float(max(1, self.loaded.max_total_num_tokens))

    def _log_decode(self, batch: int, tokens: int, queued: int) -> None:
        """The decode log line, and the only place the speculation totals grow.

        Format (plain KV pool): `Decode batch, #running-req: N, #token: T, token usage: U.UU, `
        + with speculation `accept len: X.XX, accept rate: Y.YY, ` + `cuda graph: B, gen
        throughput (token/s): Z.ZZ, #queue-req: Q` (0.5.9 scheduler_metrics_mixin.py:356-413;
        0.5.10 observability/scheduler_metrics_mixin.py:608-657; 0.5.12 :675-712; 0.5.15
        managers/scheduler_components/metrics_reporter.py:725-775; 0.5.19 :820-895; 0.5.20
        :888-962; 0.5.23 :963-1043). Without speculation there is no accept part at all.
        accept rate: 0.5.9/0.5.10 = accepted-with-bonus / (steps x num_draft_tokens) (0.5.10
        :617-627); 0.5.12+ = correct drafts / (steps x (num_draft_tokens - 1)) (0.5.12 :679-691).
        """
        throughput = self._win_tokens / self._win_vtime if self._win_vtime else 0.0
        self.last_gen_throughput = throughput
        msg = (f"Decode batch, #running-req: {batch}, #token: {tokens}, "
               f"token usage: {tokens / float(max(1, self.loaded.max_total_num_tokens)):.2f}, ")
        if self.spec.enabled and self._win_forward:
            accept = self._win_accepted / float(self._win_forward)
            ndt = self.spec.num_draft_tokens
            if at_least(0, 5, 12):
                drafts = self._win_forward * (ndt - 1)
                correct = self._win_accepted - self._win_forward
                rate = correct / float(drafts) if drafts > 0 else 0.0
            else:
                rate = self._win_accepted / float(self._win_forward * ndt)
            self.spec_total_accepted += self._win_accepted
            self.spec_total_forward += self._win_forward
            self._win_accepted = 0
            self._win_forward = 0
            self.last_spec_accept_length = accept
            self.last_spec_accept_rate = rate
            msg += f"accept len: {accept:.2f}, accept rate: {rate:.2f}, "
        graph = bool(self.loaded.cuda_graph_max_bs) and batch <= self.loaded.cuda_graph_max_bs
        msg += (f"cuda graph: {graph}, gen throughput (token/s): {throughput:.2f}, "
                f"#queue-req: {queued}")
        log(msg, "TP0")
        self._win_tokens = 0
        self._win_vtime = 0.0

    # ------------------------------------------------------------------ state
    def internal_state(self) -> dict:
        """One entry of /server_info's internal_states: the server args plus live state
        (0.5.9 scheduler.py:2650-2673; 0.5.23 scheduler_components/internal_state.py:45-127)."""
        state = self.args.to_dict()
        state.update({
            "last_gen_throughput": self.last_gen_throughput,
            "memory_usage": {"token_capacity": int(self.loaded.max_total_num_tokens)},
            "effective_max_running_requests_per_dp": self.max_running,
        })
        accept = self.avg_spec_accept_length
        if accept is not None:
            state["avg_spec_accept_length"] = accept
        return state
