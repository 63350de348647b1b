"""`orchestrator bench|report|tune`: benchmark the deployed server, report, sweep speculation.

    orchestrator bench PLAYBOOK -i INV [--concurrency 1,2,4] [--input-len N] [--output-len N]
                       [--num-prompts N] [--dataset random-ids|sharegpt --dataset-path P]
                       [--limit H] [--label NAME]
    orchestrator report RUN... [-o DIR] [--baseline RUN]
    orchestrator tune PLAYBOOK -i INV [--grid FILE] [--concurrency ...] [--out DIR]
                      [--for-concurrency N] [--min-user-tps X]

Exit codes: 0 every run measured; 1 a run failed (the runs measured are kept); 2 bad input;
3 a host could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ConfigError
from orchestrator.redact import REDACTOR

if TYPE_CHECKING:
    from orchestrator.bench.bench import BenchOptions, BenchRun


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: positive integers, e.g. 1,2,4,8")
    return values


def _workload(p: argparse.ArgumentParser) -> None:
    p.add_argument("playbook", help="the playbook that deployed the server")
    p.add_argument("-i", "--inventory", required=True, help="inventory YAML file")
    p.add_argument("--limit", action="append", metavar="HOSTS", help="only these hosts")
    p.add_argument("--var", "-e", action="append", default=[], metavar="KEY=VALUE",
                   help="set a variable, as for deploy")
    p.add_argument("--concurrency", type=_ints, default=(1, 2, 4, 8, 16, 32),
                   help="comma-separated concurrencies, one benchmark run each "
                        "(default 1,2,4,8,16,32)")
    p.add_argument("--input-len", type=int, default=1024, help="prompt tokens (default 1024)")
    p.add_argument("--output-len", type=int, default=1024,
                   help="generated tokens per request (default 1024)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="requests per run (default 4 x concurrency, at least 8)")
    p.add_argument("--dataset", choices=["random-ids", "sharegpt"], default="random-ids")
    p.add_argument("--dataset-path", help="the ShareGPT JSON on the host (for --dataset sharegpt)")
    p.add_argument("--run-dir", default=os.environ.get("ORCHESTRATOR_RUN_DIR", "runs"),
                   help="where run records go (default ./runs)")
    p.add_argument("--json", action="store_true", help="print results.json on stdout")


def add_subcommands(sub: Any) -> None:
    """Register `bench`, `report` and `tune` on the CLI's subparsers."""
    bench = sub.add_parser(
        "bench", help="run SGLang's serving benchmark on each host against the deployed server",
        description="One run of `python -m sglang.bench_serving` (sglang.benchmark.serving from "
        "0.5.15) per concurrency, ON the host, against the server PLAYBOOK deployed. Writes "
        "RUN_DIR/<id>/bench/results.json after every run.")
    _workload(bench)
    bench.add_argument("--label", help="name of this configuration in reports "
                       "(default: from the server's speculative settings)")
    bench.set_defaults(func=cmd_bench)

    report = sub.add_parser(
        "report", help="Markdown + PNG plots from bench, tune or deploy runs",
        description="RUN is a run dir (runs/<id>), a results.json or a tune dir. Bench runs: "
        "throughput, throughput vs per-user tok/s (where speculation stops paying marked), "
        "speedup, TTFT/ITL, accept length, tables (thin percentiles marked) and each "
        "configuration's launch arguments. Deploy runs: the stage timeline per host (Gantt "
        "chart).")
    report.add_argument("runs", nargs="+", metavar="RUN")
    report.add_argument("-o", "--out", default=None,
                        help="output dir (default: RUN_DIR/report-<time>)")
    report.add_argument("--baseline", help="the run to compute speedups against "
                        "(default: the one labelled baseline)")
    report.add_argument("--run-dir", default=os.environ.get("ORCHESTRATOR_RUN_DIR", "runs"))
    report.set_defaults(func=cmd_report)

    tune = sub.add_parser(
        "tune", help="sweep speculative settings: deploy, benchmark, pick the best per load",
        description="Each candidate (off, and EAGLE3 settings from the model profile's "
        "`tune:` grid or --grid) is deployed through PLAYBOOK's stages and benchmarked. "
        "Resumable: run it again and it measures only the candidates left.")
    _workload(tune)
    tune.add_argument("--grid", help="YAML file with a `tune:` mapping (default: the playbook "
                      "variable `tune`)")
    tune.add_argument("--out", help="tune dir (default RUN_DIR/tune-<playbook name>)")
    tune.add_argument("--for-concurrency", type=int, metavar="N",
                      help="write the override for this load: the setting best at concurrency "
                      "N (one of --concurrency; default: the lowest measured)")
    tune.add_argument("--min-user-tps", type=float, metavar="X",
                      help="the override is the setting (and concurrency) with the most output "
                      "tok/s whose per-user tok/s (1000 / median TPOT) is at least X; with "
                      "--for-concurrency, at that concurrency")
    tune.set_defaults(func=cmd_tune)


def _options(args: argparse.Namespace) -> BenchOptions:
    from orchestrator.bench.bench import BenchOptions

    return BenchOptions(concurrency=tuple(args.concurrency), input_len=args.input_len,
                        output_len=args.output_len, num_prompts=args.num_prompts,
                        dataset=args.dataset, dataset_path=args.dataset_path)


def _print_run(host: str, concurrency: int, run: BenchRun) -> None:
    if run.ok:
        accept = run.figure("accept_length")
        tpot = run.figure("median_tpot_ms")
        print(f"  {host} c={concurrency:<4} {run.figure('output_throughput') or 0:>9.1f} tok/s  "
              + (f"{1000 / tpot:5.1f} tok/s per user  " if tpot else "")
              + f"TTFT p50 {run.figure('median_ttft_ms') or 0:.0f} ms  ITL p50 "
              f"{run.figure('median_itl_ms') or 0:.1f} ms"
              + (f"  accept {accept:.2f}" if accept is not None else ""), flush=True)
    else:
        print(f"  {host} c={concurrency:<4} FAILED: {run.error}\n"
              + "\n".join("      " + line for line in (run.tail or "").splitlines()[-6:]),
              flush=True)


def _quiet_logs() -> None:
    """Warnings and errors only, on stderr: the figures are the output (no info lines)."""
    from orchestrator.logs import configure

    configure()


def cmd_bench(args: argparse.Namespace) -> int:
    from orchestrator.bench.bench import run_bench
    from orchestrator.config import parse_cli_vars

    _quiet_logs()

    if not args.json:
        print(f"bench: {args.playbook}, concurrency {','.join(map(str, args.concurrency))}",
              flush=True)
    outcome = run_bench(args.playbook, args.inventory, cli_vars=parse_cli_vars(args.var),
                        limit=args.limit, options=_options(args), run_dir=args.run_dir,
                        label=args.label, progress=None if args.json else _print_run)
    if args.json:
        print(json.dumps(REDACTOR.redact(outcome.results.to_json()), indent=1, default=str))
        return outcome.exit_code
    for name, h in outcome.results.hosts.items():
        if h.error:
            print(f"  {name}: {h.error}", file=sys.stderr)
    print(f"bench {outcome.run_id} ({outcome.results.label}): exit code "
          f"{outcome.exit_code}\nresults: {outcome.results_path}")
    return outcome.exit_code


def need_matplotlib(command: str) -> None:
    """The PNGs need matplotlib, the wheel's `report` extra: say so before anything runs."""
    from importlib.util import find_spec

    from orchestrator.errors import ConfigError, ConfigProblem

    if find_spec("matplotlib") is None:
        raise ConfigError([ConfigProblem(
            None, f"`orchestrator {command}` draws its plots with matplotlib, which this Python "
            "lacks", "pip install 'sglang-orchestrator[report]'")])


def cmd_report(args: argparse.Namespace) -> int:
    need_matplotlib("report")
    from orchestrator.bench.report import write_report

    rep = write_report(args.runs, out=args.out, baseline=args.baseline, run_dir=args.run_dir)
    if rep.table:
        print(rep.table)
    for png in rep.pngs:
        print(f"plot: {png}")
    print(f"report: {rep.markdown}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    need_matplotlib("tune")
    _quiet_logs()
    from orchestrator.bench.tune import Target, run_tune
    from orchestrator.config import parse_cli_vars

    if args.grid is not None and not os.path.isfile(args.grid):
        raise ConfigError(f"--grid {args.grid}: no such file")
    res = run_tune(args.playbook, args.inventory, cli_vars=parse_cli_vars(args.var),
                   limit=args.limit, options=_options(args), run_dir=args.run_dir,
                   grid_path=args.grid, out=args.out, say=lambda m: print(m, flush=True),
                   target=Target(args.for_concurrency, args.min_user_tps))
    print(res.summary_text)
    return res.exit_code
