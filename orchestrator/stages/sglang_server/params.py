"""The parameters of the `sglang_server` kind (its YAML `with:`), validated at load time."""

from __future__ import annotations

import shlex
from typing import Any, Literal

from pydantic import Field, field_validator

from orchestrator.config.model import parse_duration
from orchestrator.sglang.api import DEFAULT_HOST, DEFAULT_PORT
from orchestrator.sglang.multinode import DEFAULT_DIST_INIT_PORT
from orchestrator.stages.base import Params


class SpeculativeParams(Params):
    """Speculative decoding settings (`--speculative-*`)."""

    algorithm: str | None = Field(None, description="EAGLE3, EAGLE, NEXTN, STANDALONE, NGRAM, "
                                  "DFLASH (0.5.15+), or null for none")
    num_steps: int | None = Field(None, ge=1, description="--speculative-num-steps")
    eagle_topk: int | None = Field(None, ge=1, description="--speculative-eagle-topk")
    num_draft_tokens: int | None = Field(None, ge=1,
                                         description="--speculative-num-draft-tokens")
    draft_model_revision: str | None = Field(
        None, description="--speculative-draft-model-revision (SGLang uses 'main' when unset)")

    @field_validator("algorithm", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.strip().upper() if isinstance(v, str) and v.strip() else (None if v == "" else v)


class SGLangServerParams(Params):
    """Parameters of the sglang_server kind."""

    python: str = Field(description="the venv's python (has sglang installed)")
    model_path: str = Field(description="target checkpoint directory on the host")
    draft_model_path: str | None = Field(None, description="drafter directory (EAGLE-3)")
    tp: int = Field(1, ge=1, description="--tp-size")
    speculative: SpeculativeParams | None = None
    host: str = Field(DEFAULT_HOST, description="--host (address the API binds)")
    port: int = Field(DEFAULT_PORT, ge=1, le=65535, description="--port")
    served_model_name: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    mem_fraction_static: float | None = Field(None, gt=0, lt=1)
    context_length: int | None = Field(None, ge=1)
    max_running_requests: int | None = Field(None, ge=1)
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    quantization: str | None = None
    trust_remote_code: bool = Field(False, description="--trust-remote-code")
    api_key: str | None = Field(None, description="SECRET: --api-key, passed through a 0600 "
                                "file read in-process, never argv")
    enable_metrics: bool = True
    log_level: str | None = None
    extra_args: list[str] = Field(default_factory=list,
                                  description="more server arguments, checked like the rest")
    nodes: list[str] = Field(default_factory=list, description="multi-node TP: the group's "
                             "inventory hosts in node-rank order, e.g. \"{{ groups.gpu }}\"; "
                             "empty or one name = a single-node server")
    dist_init_addr: str | None = Field(None, description="--dist-init-addr HOST:PORT (default: "
                                       "node 0's inventory address and dist_init_port)")
    dist_init_port: int = Field(DEFAULT_DIST_INIT_PORT, ge=1, le=65535,
                                description="port of node 0's torch.distributed store")
    dist_timeout: int | None = Field(None, ge=1, description="--dist-timeout seconds (SGLang: "
                                     "torch's 30 minutes when unset)")
    dist_init_wait: float = Field(300.0, description="how long a node rank >= 1 waits for node "
                                  "0's dist-init address to answer (its box may be rebooting) "
                                  "before the launch is refused")
    env: dict[str, str] = Field(default_factory=dict, description="server environment, e.g. "
                                "NCCL_P2P_LEVEL, NCCL_GRAPH_FILE")
    cache_dir: str | None = Field(None, description="persistent JIT caches (Triton, inductor, "
                                  "FlashInfer); default STATE_DIR/cache")
    state_dir: str = Field(description="pid file, log, fingerprint, launch spec, key file")
    stop_stale: bool = Field(False, description="stop a foreign process holding the port")
    systemd: Literal["auto", "never", "always"] = "auto"
    unit_name: str = Field("orchestrator-sglang", pattern=r"^[A-Za-z0-9:_.@-]+$",
                           description="systemd unit (a name: it goes under /etc/systemd/system)")
    autostart: bool = Field(False, description="enable the systemd unit (start at boot)")
    preflight: Literal["enforce", "warn", "off"] = "enforce"
    native_check: bool = Field(True, description="run SGLang's own argument validation in the "
                               "venv before launching (where SGLang and torch import)")
    check_timeout: float = Field(120.0, description="limit for SGLang's own validation")
    stop_timeout: float = Field(60.0, description="SIGTERM grace before SIGKILL")
    verify_window: float = Field(5.0, description="how long verify watches the new process")
    restart_unhealthy_after: float = Field(
        3600.0, description="a same-fingerprint server still not healthy this long after its "
        "start is restarted")

    @field_validator("check_timeout", "stop_timeout", "verify_window", "restart_unhealthy_after",
                     "dist_init_wait", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float:
        return parse_duration(v)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): (("true" if x else "false") if isinstance(x, bool) else str(x))
                    for k, x in v.items()}
        return v

    @field_validator("extra_args", mode="before")
    @classmethod
    def _args(cls, v: Any) -> Any:
        if isinstance(v, str):
            return shlex.split(v)
        if isinstance(v, list):
            return [str(x) for x in v]
        return v
