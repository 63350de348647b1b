"""Rules on names, context length and multi-node layout (ServerArgs checks and what they miss)."""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.sglang.hfconfig import context_length
from orchestrator.sglang.rules import Launch, rule

ALLOW_LONGER = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


@rule("serving.served-name-colon", "start")
def served_name_colon(launch: Launch) -> Iterator[str]:
    """':' in served_model_name, which defaults to --model-path.

    AssertionError "served_model_name cannot contain a colon (':') character": server_args.py:
    847-850 (default) and 5155-5160 (0.5.9); server_args.py:6089-6094 (0.5.10), :7268-7273
    (0.5.12), :6591-6596 (0.5.15); arg_groups/serving_hook.py:636-646 (default) and
    arg_groups/validation_hook.py:214-219 (0.5.23). From 0.5.10 Run:ai object URIs are exempt.
    """
    name = launch.options.get("--served-model-name")
    explicit = isinstance(name, str)
    value = name if explicit else launch.model_path
    if ":" in value and not (launch.at_least(0, 5, 10) and value.startswith("runai")):
        what = (f"served_model_name {value!r}" if explicit else
                f"model_path {value!r} (served_model_name defaults to it)")
        yield (f"{what} contains ':', which SGLang refuses (':' separates a LoRA adapter name): "
               "set served_model_name to a name without ':'")


@rule("serving.context-longer-than-model", "start")
def context_longer(launch: Launch) -> Iterator[str]:
    """--context-length above the target's derived context length.

    ValueError "User-specified context_length (N) is greater than the derived context_length (M)"
    unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1: configs/model_config.py:359-390 (0.5.9),
    :379-410 (0.5.10), :541-572 (0.5.12), :675-706 (0.5.15), :863-894 (0.5.19), :1023-1054
    (0.5.20), :1291-1329 (0.5.23). Derivation: hfconfig.context_length.
    """
    wanted = launch.options.int("--context-length")
    if wanted is None or launch.target is None or launch.env_on(ALLOW_LONGER):
        return
    derived = context_length(launch.target)
    if wanted > derived:
        yield (f"context_length {wanted} is above the {derived} tokens the target's config.json "
               f"allows (SGLang: 'User-specified context_length ({wanted}) is greater than the "
               f"derived context_length ({derived})'): set context_length: {derived} or less, "
               f"or env {ALLOW_LONGER}: '1' if the model really supports it")


@rule("serving.nodes-divide-tp", "start")
def nodes_divide(launch: Launch) -> Iterator[str]:
    """tp_size * pp_size must be divisible by nnodes.

    AssertionError "tp_size must be divisible by number of nodes": server_args.py:5131-5134
    (0.5.9), :6067 (0.5.10), :7233 (0.5.12), :6555 (0.5.15); arg_groups/validation_hook.py:33-36
    (0.5.19), :44-47 (0.5.20), :177-181 (0.5.23).
    """
    o = launch.options
    tp = o.int("--tp-size", "--tensor-parallel-size") or 1
    pp = o.int("--pp-size", "--pipeline-parallel-size") or 1
    nnodes = o.int("--nnodes") or 1
    if nnodes < 1 or (tp * pp) % nnodes:
        yield (f"tp ({tp}) x pp ({pp}) = {tp * pp} is not divisible by nnodes {nnodes} "
               "(SGLang: 'tp_size must be divisible by number of nodes'): change tp or nnodes")


@rule("serving.multinode-address", "sched-init")
def multinode_address(launch: Launch) -> Iterator[str]:
    """nnodes > 1 without --dist-init-addr HOST:PORT, or a node rank outside [0, nnodes).

    Not validated at start in any release: each node then initialises torch.distributed at its
    own tcp://127.0.0.1:<port> and waits until the distributed timeout
    (model_executor/model_runner.py:773-779 (0.5.9); distributed/bootstrap.py:233-247 (0.5.23));
    a node rank >= nnodes maps onto another node's ranks (entrypoints/engine.py:925-945 (0.5.9)).
    """
    o = launch.options
    nnodes = o.int("--nnodes") or 1
    if nnodes <= 1:
        return
    addr = o.get("--dist-init-addr", "--nccl-init-addr")
    if not isinstance(addr, str) or ":" not in addr:
        yield (f"nnodes {nnodes} needs --dist-init-addr NODE0_HOST:PORT (the same on every "
               "node); without it each node waits for the others on its own localhost until "
               "the distributed timeout: add it to extra_args")
    rank = o.int("--node-rank") or 0
    if not 0 <= rank < nnodes:
        yield f"node_rank {rank} is outside 0..{nnodes - 1} for nnodes {nnodes}"


@rule("serving.gpus-per-node", "sched-init")
def gpus_per_node(launch: Launch) -> Iterator[str]:
    """A node runs tp x pp / nnodes ranks on GPUs base_gpu_id + i * gpu_id_step: one past this
    host's GPUs (TP 16 on one 8-GPU box) fails when its scheduler sets the device ("CUDA error:
    invalid device ordinal"), before the load; ServerArgs does not check it.

    Ranks per node and GPU ids: entrypoints/engine.py:925-946 (0.5.9), :2045-2075 and :935-939
    (0.5.23); set_device: model_executor/model_runner.py:734 (0.5.9),
    distributed/bootstrap.py:133 (0.5.23).
    """
    if not launch.gpus:
        return
    o = launch.options
    tp = o.int("--tp-size", "--tensor-parallel-size") or 1
    pp = o.int("--pp-size", "--pipeline-parallel-size") or 1
    nnodes = max(1, o.int("--nnodes") or 1)
    per_node = max(1, tp * pp // nnodes)
    base, step = o.int("--base-gpu-id") or 0, o.int("--gpu-id-step") or 1
    last = base + (per_node - 1) * step
    if last >= len(launch.gpus):
        yield (f"tp {tp} x pp {pp} over {nnodes} node(s) puts {per_node} ranks on this host "
               f"(GPUs {base}..{last}), but it has {len(launch.gpus)} GPUs: SGLang stops with "
               f"'invalid device ordinal'. Set tp to {len(launch.gpus) * nnodes // pp} or less, "
               "or use more boxes (multi-node: the sglang_server `nodes` list)")


@rule("serving.pp-with-speculative", "start")
def pp_with_speculative(launch: Launch) -> Iterator[str]:
    """Pipeline parallelism with speculative decoding.

    "Pipeline parallelism is not compatible with overlap schedule, speculative decoding, ...":
    server_args.py:5136-5141 (0.5.9), :6074 (0.5.10), :7250-7253 (0.5.12), :6575 (0.5.15);
    arg_groups/validation_hook.py:54 (0.5.19), :81-84 (0.5.20); from 0.5.21 only EAGLE
    (non-multi-layer) is allowed: arg_groups/validation_hook.py:38-56 (0.5.21), :118-137
    (0.5.22), :119-138 (0.5.23).
    """
    pp = launch.options.int("--pp-size", "--pipeline-parallel-size") or 1
    algo = launch.algorithm
    if pp > 1 and algo and not (launch.at_least(0, 5, 21) and algo == "EAGLE"):
        yield (f"pp {pp} with speculative algorithm {algo}: sglang {launch.version} refuses "
               "pipeline parallelism with speculative decoding; use tp only (pp 1)")


def _cudnn(version: str | None) -> tuple[int, int] | None:
    """"9.10.2.21" -> (9, 10)."""
    parts = str(version or "").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


@rule("serving.cudnn-for-torch-2.9.1", "start", until="0.5.9")
def cudnn_for_torch_291(launch: Launch) -> Iterator[str]:
    """A multimodal target (K2.5/K2.6) under torch 2.9.1 (0.5.9's pin) with cuDNN below 9.15.

    check_torch_2_9_1_cudnn_compatibility: RuntimeError "CRITICAL WARNING: PyTorch 2.9.1 & CuDNN
    Compatibility Issue Detected" unless SGLANG_DISABLE_CUDNN_CHECK: server_args.py:5263-5298,
    called by check_server_args at :5168 (0.5.9); gone in 0.5.10. torch 2.9.1's wheel requires
    nvidia-cudnn-cu12==9.10.2.21, so a plain pip install has 9.10 (the version read from the
    venv; unknown when torch's cuDNN did not come from that wheel).
    """
    have = _cudnn(launch.cudnn_version)
    multimodal = isinstance((launch.target or {}).get("vision_config"), dict)
    if multimodal and have is not None and have < (9, 15) and \
            not launch.env_on("SGLANG_DISABLE_CUDNN_CHECK"):
        yield (f"sglang {launch.version} runs torch 2.9.1, and this venv has cuDNN "
               f"{launch.cudnn_version}: SGLang refuses a multimodal model at start ('PyTorch "
               "2.9.1 & CuDNN Compatibility Issue Detected', a Conv3d bug below cuDNN 9.15). Add "
               "nvidia-cudnn-cu12==9.16.0.29 to the pip stage's packages, or pin sglang>=0.5.10")
