"""Fake `torch` for running SGLang's ServerArgs validation on a machine without torch/GPU.

Hand-written here: only what decides a launch verdict -- the device description -- and the
few values SGLang computes with at import time. Everything else (torch.nn, torch.library,
torch.distributed, torch.ops, ...) is a permissive Dummy (stubs/_permissive.py): it exists so
that modules which `import torch` at top level load, and it is never consulted by a check.

The described GPU comes from the environment set by run_real.py:
  REALARGS_GPU_CC   "12.0"   -> torch.cuda.get_device_capability()
  REALARGS_GPU_MIB  "97887"  -> get_device_properties().total_memory, mem_get_info()
  REALARGS_GPUS     "8"      -> torch.cuda.device_count()
  REALARGS_GPU_NAME (optional) -> get_device_name()

Who reads what (0.5.23 line numbers unless noted; sglang/srt/utils/common.py):
  is_hip():141  torch.version.hip is None           -> CUDA path
  is_cuda():158 torch.cuda.is_available() and torch.version.cuda
  FP8_E4M3_MAX  torch.finfo(torch.float8_e4m3fn).max (module level, :146; 0.5.9 :117)
  is_sm120():342, _check_cuda_device_version -> torch.cuda.get_device_capability()
  get_device_sm():756   torch.cuda.is_initialized()/get_device_capability()
  _cuda_mem_fallback(): torch.cuda.mem_get_info(i) (only if the fake nvidia-smi is bypassed)
  torch_release = pkg_version.parse(torch.__version__).release (module level, :120)
"""

from __future__ import annotations

import builtins as _b
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from _permissive import Dummy, DummyModule, make  # noqa: E402

__version__ = os.environ.get("REALARGS_TORCH_VERSION", "2.9.1+cu129")


def _cc():
    major, minor = os.environ.get("REALARGS_GPU_CC", "12.0").split(".")
    return _b.int(major), _b.int(minor)


def _mib():
    return _b.int(_b.float(os.environ.get("REALARGS_GPU_MIB", "97887")))


def _count():
    return _b.int(os.environ.get("REALARGS_GPUS", "8"))


_NAMES = {(12, 0): "NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 1): "NVIDIA GB10",
          (10, 0): "NVIDIA B200", (10, 3): "NVIDIA B300 SXM6 AC", (9, 0): "NVIDIA H100 80GB HBM3",
          (8, 9): "NVIDIA L40S", (8, 0): "NVIDIA A100-SXM4-80GB"}


def _name():
    return os.environ.get("REALARGS_GPU_NAME") or _NAMES.get(_cc(), "NVIDIA GPU")


# ---- dtypes (hashable, comparable, named like torch's) ---------------------------------------
class dtype:
    def __init__(self, name, itemsize, is_floating_point=True):
        self.name, self.itemsize, self.is_floating_point = name, itemsize, is_floating_point

    def __repr__(self):
        return "torch." + self.name

    def __reduce__(self):  # pickles by name, like torch.dtype
        return (_dtype_by_name, (self.name,))

    def __copy__(self):  # transformers' config.to_dict() deep-copies config.dtype
        return self

    def __deepcopy__(self, memo):
        return self


def _dtype_by_name(name):
    return globals()[name]


_DT = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8,
       "double": 8, "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1,
       "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1}
_INT = {"int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int": 4, "int64": 8, "long": 8,
        "bool": 1, "uint16": 2, "uint32": 4, "uint64": 8, "complex64": 8, "complex128": 16}
for _n, _s in _DT.items():
    globals()[_n] = dtype(_n, _s)
for _n, _s in _INT.items():
    globals()[_n] = dtype(_n, _s, False)
half, float, double, long, int = float16, float32, float64, int64, int32  # noqa: A001
bool = globals()["bool"]  # noqa: A001

_FMAX = {"float32": 3.4028234663852886e38, "float16": 65504.0, "bfloat16": 3.3895313892515355e38,
         "float64": 1.7976931348623157e308, "float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0,
         "float8_e5m2": 57344.0, "float8_e5m2fnuz": 57344.0, "float8_e8m0fnu": 1.7e38,
         "float4_e2m1fn_x2": 6.0}


class finfo:
    def __init__(self, dt=None):
        name = getattr(dt, "name", "float32")
        self.max = _FMAX.get(name, 3.4e38)
        self.min = -self.max
        self.eps = 1e-7
        self.tiny = 1e-38
        self.bits = 8 * getattr(dt, "itemsize", 4)
        self.dtype = name


class iinfo:
    def __init__(self, dt=None):
        bits = 8 * getattr(dt, "itemsize", 4)
        self.bits = bits
        self.max = 2 ** (bits - 1) - 1
        self.min = -(2 ** (bits - 1))


class device:
    def __init__(self, type="cuda", index=None):  # noqa: A002
        if isinstance(type, str) and ":" in type:
            type, index = type.split(":")[0], _b.int(type.split(":")[1])
        self.type, self.index = type, index

    def __repr__(self):
        return f"device(type={self.type!r}, index={self.index})"


class Size(tuple):
    pass


class Tensor(Dummy):
    pass


class Generator(Dummy):
    pass


def get_default_dtype():
    return float32


def is_tensor(x):
    return isinstance(x, Tensor)


# ---- torch.version -----------------------------------------------------------------------------
version = types.ModuleType("torch.version")
version.__version__ = __version__
version.cuda = os.environ.get("REALARGS_CUDA_VERSION", "12.9")
version.hip = None
version.git_version = "stub"
sys.modules["torch.version"] = version


# ---- torch.cuda --------------------------------------------------------------------------------
class _Props:
    def __init__(self, i):
        self.name = _name()
        self.major, self.minor = _cc()
        self.total_memory = _mib() * 1024 * 1024
        self.multi_processor_count = {12: 188, 10: 148, 9: 132}.get(self.major, 108)
        self.gcnArchName = "NVIDIA"
        self.L2_cache_size = 96 * 1024 * 1024
        self.uuid = f"GPU-stub-{i}"


cuda = types.ModuleType("torch.cuda")
cuda.__path__ = []
cuda.is_available = lambda: True
cuda.is_initialized = lambda: False
cuda.init = lambda: None
cuda.device_count = lambda: _count()
cuda.current_device = lambda: 0
cuda.set_device = lambda *a, **k: None
cuda.get_device_capability = lambda device=None: _cc()
cuda.get_device_properties = lambda device=None: _Props(device or 0)
cuda.get_device_name = lambda device=None: _name()
cuda.mem_get_info = lambda device=None: (_mib() * 1024 * 1024, _mib() * 1024 * 1024)
cuda.is_bf16_supported = lambda *a, **k: True
cuda.synchronize = lambda *a, **k: None
cuda.empty_cache = lambda: None
cuda.memory_allocated = lambda *a, **k: 0
cuda.get_arch_list = lambda: ["sm_80", "sm_90", "sm_100", "sm_120"]
cuda._is_compiled = lambda: True


def _cuda_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    value = make("torch.cuda." + name)
    setattr(cuda, name, value)
    return value


cuda.__getattr__ = _cuda_getattr
sys.modules["torch.cuda"] = cuda


# ---- torch.backends.cudnn.version() ---------------------------------------------------------
# server_args.py check_torch_2_9_1_cudnn_compatibility (0.5.9 :5263-5298, 0.5.10 likewise):
# on torch 2.9.1 with a multimodal model, cuDNN < 9.15 raises RuntimeError at start.
# REALARGS_CUDNN: the cuDNN the host has ("91002" = what pip gives torch 2.9.1; "" = unknown).
def _submodule(name, **attrs):
    mod = DummyModule(name)
    mod.__path__ = []
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


_cudnn_env = os.environ.get("REALARGS_CUDNN", "91002")
backends = _submodule("torch.backends")
backends.cudnn = _submodule("torch.backends.cudnn",
                            version=lambda: _b.int(_cudnn_env) if _cudnn_env else None,
                            is_available=lambda: True, enabled=True)
backends.mps = _submodule("torch.backends.mps", is_available=lambda: False,
                          is_built=lambda: False)
backends.cuda = _submodule("torch.backends.cuda")


# ---- torch.library.Library ---------------------------------------------------------------------
# utils/common.py direct_register_custom_op (0.5.21 :2916-2920): `my_lib.m.name if
# hasattr(my_lib.m, "name")` then getattr(torch.ops, lib_name) -> must be a str: m is None.
class _Library(Dummy):
    m = None


library = _submodule("torch.library", Library=_Library)


def __getattr__(name):  # everything else: a permissive Dummy (see stubs/_permissive.py)
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    if name in ("hpu", "xpu", "npu", "musa", "mlu"):  # utils/common.py: hasattr(torch, "xpu")
        raise AttributeError(name)
    value = make("torch." + name)
    globals()[name] = value
    return value
