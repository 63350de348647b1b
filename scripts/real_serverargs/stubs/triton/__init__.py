"""Fake `triton`: the GPU vendor/arch answer plus a version; every other name is a Dummy.

  layers/attention/fla/utils.py:229-254 (0.5.9): device = triton.runtime.driver.active
      .get_current_target().backend; getattr(torch, device) at import -> must be "cuda"
  utils/common.py:1523 (0.5.9): triton.__version__.startswith("3.")
Submodules (triton.language, triton.runtime.autotuner, ...) come from the permissive finder.
"""

import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from _permissive import DummyModule, make  # noqa: E402

__version__ = "3.5.1"


class _Target:
    backend = "cuda"

    def __init__(self):
        major, minor = os.environ.get("REALARGS_GPU_CC", "12.0").split(".")
        self.arch = int(major) * 10 + int(minor)
        self.warp_size = 32


runtime = DummyModule("triton.runtime")
runtime.__path__ = []
runtime.driver = types.SimpleNamespace(
    active=types.SimpleNamespace(get_current_target=_Target, get_current_device=lambda: 0,
                                 utils=make("triton.runtime.driver.active.utils")))
sys.modules["triton.runtime"] = runtime


def __getattr__(name):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    value = make("triton." + name)
    globals()[name] = value
    return value
