"""`python -m sglang.launch_server ARGS`: parse, validate, load, serve (stand-in).

From 0.5.10, running it as a module first warns (UserWarning, on stderr through Python's
default filters) that `sglang serve` is the recommended entrypoint (launch_server.py
0.5.10:50-57, 0.5.20/0.5.23:70-77); 0.5.9 has no such warning (0.5.9:31-37). The warning is
issued with warn_explicit at the real release's line, so stderr reads exactly as SGLang's:
`.../sglang/launch_server.py:51: UserWarning: ...` (0.5.10-0.5.19) or `:71:` (0.5.20+).
"""

import linecache
import sys
import warnings

from sglang.srt.entrypoints.http_server import launch_server
from sglang.srt.server_args import prepare_server_args, validate_for_launch
from sglang.srt.utils import at_least

ENTRYPOINT_WARNING = (
    "'python -m sglang.launch_server' is still supported, but "
    "'sglang serve' is the recommended entrypoint.\n"
    "  Example: sglang serve --model-path <model> [options]"
)


def warn_entrypoint() -> None:
    """The `__main__` UserWarning of 0.5.10+ (nothing in 0.5.9)."""
    if not at_least(0, 5, 10):
        return
    lineno = 71 if at_least(0, 5, 20) else 51
    # Python prints the source line under the warning: the real file has `    warnings.warn(`
    # there. Lend linecache that line for the warning only (mtime None: never re-checked).
    saved = linecache.cache.pop(__file__, None)
    lines = ["\n"] * (lineno - 1) + ["    warnings.warn(\n"]
    linecache.cache[__file__] = (0, None, lines, __file__)
    try:
        warnings.warn_explicit(ENTRYPOINT_WARNING, UserWarning, __file__, lineno,
                               module="__main__", registry={})
    finally:
        linecache.cache.pop(__file__, None)
        if saved is not None:
            linecache.cache[__file__] = saved


def main(argv=None) -> int:
    """Run the server with `argv` (default: the process arguments); return the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    server_args = validate_for_launch(prepare_server_args(argv))
    # launch_command of /server_info (0.5.20+): the parsed arguments, verbatim
    # (server_args.py 0.5.20:736, `server_args._launch_command = " ".join(argv)`)
    server_args._launch_command = " ".join(argv)
    return launch_server(server_args)


if __name__ == "__main__":
    warn_entrypoint()
    sys.exit(main())
