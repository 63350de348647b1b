"""`python -m sglang.bench_serving`: SGLang's online serving benchmark (stand-in).

Up to 0.5.12 this module is the implementation (0.5.9 bench_serving.py, 3415 lines; 0.5.10,
0.5.12). From 0.5.15 it is a shim over `sglang.benchmark.serving` that first warns (0.5.15-0.5.23
bench_serving.py:1-22, identical in all four):
`.../sglang/bench_serving.py:13: FutureWarning: `sglang.bench_serving` is deprecated ...`.
The stand-in keeps one implementation, in sglang/benchmark/serving.py, for every release.
"""

import linecache
import sys
import warnings

from sglang.benchmark.serving import *  # noqa: F401,F403 - the public names, as the shim
from sglang.benchmark.serving import cli_main, main, make_parser, run  # noqa: F401
from sglang.srt.utils import at_least

DEPRECATION = (
    "`sglang.bench_serving` is deprecated and will be removed in a future "
    "release; use `sglang.benchmark.serving` instead "
    "(e.g. `python -m sglang.benchmark.serving`)."
)


def _warn_shim() -> None:
    """The shim's FutureWarning at its real place (bench_serving.py 0.5.15:13-19), with the
    real source line under it (linecache lent `warnings.warn(` for line 13 only)."""
    saved = linecache.cache.pop(__file__, None)
    linecache.cache[__file__] = (0, None, ["\n"] * 12 + ["warnings.warn(\n"], __file__)
    try:
        warnings.warn_explicit(DEPRECATION, FutureWarning, __file__, 13,
                               module=__name__, registry={})
    finally:
        linecache.cache.pop(__file__, None)
        if saved is not None:
            linecache.cache[__file__] = saved


if at_least(0, 5, 15):
    _warn_shim()

if __name__ == "__main__":
    sys.exit(cli_main())
