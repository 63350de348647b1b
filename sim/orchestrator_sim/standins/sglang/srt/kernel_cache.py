"""The kernel caches a real server fills while it starts, as the stand-in keeps them.

Real SGLang JIT-compiles Triton, FlashInfer and DeepGEMM kernels (and autotunes FlashInfer)
during its CUDA-graph capture and warm-up; each library keeps what it compiled in its own cache
directory and skips the compile next time. Where, read independently of the product from the
real source:

- DeepGEMM: DG_JIT_CACHE_DIR = SGLANG_DG_CACHE_DIR, default ~/.cache/deep_gemm (0.5.9
  srt/layers/deep_gemm_wrapper/compile_utils.py:33-35, environ.py:357), SGLANG_CACHE_DIR/
  deep_gemm from 0.5.23 (environ.py:1373, compile_utils.py:51);
- Triton: TRITON_CACHE_DIR; 0.5.23 defaults it to SGLANG_CACHE_DIR/triton (default
  ~/.cache/sglang, environ.py:1383, :2308-2321); earlier releases leave Triton's own default,
  ~/.triton/cache.

The stand-in writes one entry per compiled configuration (KEY: release, GPU, model, shapes) into
both directories; a capture whose entries are all there is warm. Figures (nominal seconds of
the capture phase): NVIDIA ModelExpress measured a DeepSeek-class model on 8 GPUs at 8 m 01 s
from start to API-ready cold and 1 m 44 s once the kernel artifacts were reused too (of which
7 m were weights, sent peer to peer): a few minutes of compiling, most of the capture phase.
"""

from __future__ import annotations

import hashlib
import os

from sglang.srt.utils import at_least

COLD_S = 300.0  # JIT compiles + autotune + capture, nothing cached
WARM_S = 30.0  # capture alone: every kernel comes from the caches


def _dirs() -> list[str]:
    home = os.path.expanduser("~")
    base = os.environ.get("SGLANG_CACHE_DIR") or os.path.join(home, ".cache", "sglang")
    if at_least(0, 5, 19):  # _default_cache_subdir: environ.py:31, :1078 (0.5.19)
        dg = os.environ.get("SGLANG_DG_CACHE_DIR") or os.path.join(base, "deep_gemm")
        triton = os.environ.get("TRITON_CACHE_DIR") or os.path.join(base, "triton")
    else:
        dg = os.environ.get("SGLANG_DG_CACHE_DIR") or os.path.join(home, ".cache", "deep_gemm")
        triton = os.environ.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache")
    return [dg, triton]


def _entry(directory: str, key: str) -> str:
    return os.path.join(directory, "sim-" + hashlib.sha256(key.encode()).hexdigest()[:24])


def warm(key: str) -> bool:
    """Every cache holds what a capture of KEY compiles."""
    return all(os.path.exists(_entry(d, key)) for d in _dirs())


def store(key: str) -> None:
    """Keep what a cold capture of KEY compiled (as the libraries do; unwritable: skipped)."""
    for d in _dirs():
        try:
            os.makedirs(d, exist_ok=True)
            with open(_entry(d, key), "w") as fh:
                fh.write(key + "\n")
        except OSError:
            pass
