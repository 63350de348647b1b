"""Permissive stand-ins for compiled/GPU-only packages that SGLang imports at module level.

Nothing here decides a launch. A `Dummy` is an object (and a class, so it can be subclassed:
`class Foo(torch.nn.Module)`, `class X(triton.runtime.Autotuner)`) whose every attribute is
another Dummy, whose call returns a Dummy -- except when called with exactly one callable and
nothing else, which is what decorators do (`@torch.compile`, `@triton.jit`,
`@torch.library.custom_op(...)(fn)`): then it hands the function back unchanged.

`PermissiveFinder(names)` serves any `name` / `name.sub.module` that is NOT otherwise
importable as a Dummy-backed module, so `import sgl_kernel`, `from flashinfer.x import y`,
`importlib.util.find_spec("flashinfer")` all succeed, as they do on a real GPU host where these
wheels are installed. Every touched name is recorded (REALARGS_TRACE=path) for the notes.
"""

from __future__ import annotations

import abc
import importlib.abc
import importlib.machinery
import os
import types

_TRACE: set[str] = set()


def _note(name: str) -> None:
    if os.environ.get("REALARGS_TRACE"):
        _TRACE.add(name)


def dump_trace() -> None:
    path = os.environ.get("REALARGS_TRACE")
    if path:
        with open(path, "a") as fh:
            for name in sorted(_TRACE):
                fh.write(name + "\n")


class _Meta(abc.ABCMeta):  # ABCMeta: `class X(nn.Module, ABC)` (kernels/fused_op.py:327)
    """Class-level behaviour: `Dummy.anything`, `Dummy(...)`, `Dummy[...]`, `Dummy | None`."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return make(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_dummy_generated") and len(args) == 1 and not kwargs \
                and callable(args[0]) and not isinstance(args[0], (_Meta, Dummy)):
            return args[0]  # decorator use: @torch.compile, @triton.jit
        return super().__call__(*args, **kwargs)

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0

    def __bool__(cls):
        return True

    def __int__(cls):  # int(torch.distributed.ReduceOp.SUM) (distributed/parallel_state.py:97)
        return 0

    __index__ = __int__

    def __float__(cls):
        return 0.0



class Dummy(metaclass=_Meta):
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return make(f"{type(self).__qualname__}().{name}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return make("call")()

    def __getitem__(self, item):
        return make("item")()

    def __setitem__(self, key, value):
        pass

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __bool__(self):
        # a query on an idle host answers "no": torch.distributed.is_initialized(),
        # torch.backends.mps.is_available(), torch.cuda.is_current_stream_capturing()
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __int__(self):
        return 0

    def __float__(self):
        return 0.0

    def __index__(self):
        return 0

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other

    def _binop(self, other):
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _binop
    __truediv__ = __rtruediv__ = __floordiv__ = __mod__ = __pow__ = _binop
    __and__ = __rand__ = __or__ = __ror__ = __neg__ = _binop
    __lt__ = __le__ = __gt__ = __ge__ = lambda self, other: False


def make(qualname: str) -> type:
    """A fresh Dummy subclass named `qualname` (subclassable, callable, attribute-rich)."""
    _note(qualname)
    cls = _Meta(qualname.rsplit(".", 1)[-1] or "Dummy", (Dummy,), {"_dummy_generated": True})
    cls.__qualname__ = qualname
    cls.__module__ = qualname.split(".", 1)[0]
    return cls


class DummyModule(types.ModuleType):
    """A module whose missing attributes are Dummies (`from sgl_kernel import anything`)."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = make(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


#: __version__ of top-level Dummy packages whose version someone parses
VERSIONS: dict[str, str] = {}


def _torchvision_version() -> str:
    major, minor = os.environ.get("REALARGS_TORCH_VERSION", "2.14.1").split("+")[0].split(".")[:2]
    return f"0.{int(minor) + 15}.0"  # torch 2.9 <-> torchvision 0.24, ... 2.14 <-> 0.29


VERSIONS["torchvision"] = _torchvision_version()


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        mod = DummyModule(spec.name)
        mod.__path__ = []  # a package, so submodules import too
        return mod

    def exec_module(self, module):
        _note("module " + module.__name__)
        version = VERSIONS.get(module.__name__)
        if version:  # transformers' _is_package_available reads __version__ when there is
            module.__version__ = version  # no dist-info (transformers/utils/import_utils.py:89)


class PermissiveFinder(importlib.abc.MetaPathFinder):
    """Serves Dummy modules for the listed top-level packages when nothing real provides them."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        # installed at the END of sys.meta_path: reached only when nothing real provides it
        if fullname.split(".", 1)[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
