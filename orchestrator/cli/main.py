"""The `orchestrator` command line: argument parsing, rendering, exit codes.

Exit codes: EXIT_CODES below. Our own errors print one clear message; anything unexpected
writes its traceback to a crash log and asks to report it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from orchestrator import __version__
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.redact import REDACTOR

if TYPE_CHECKING:
    from orchestrator.config.model import Inventory
    from orchestrator.deploy import DeployOutcome
    from orchestrator.options import RunOptions
    from orchestrator.preconnect import Preconnect
    from orchestrator.selection import Selection

EXIT_CODES = """exit codes:
  0    every stage ok or changed
  1    a stage failed (other hosts still ran)
  2    bad input: playbook, inventory, variables or flags (nothing was run)
  3    a host could not be reached (others still ran)
  130  interrupted with Ctrl-C (remote commands stopped, run record written)
"""


def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("playbook", help="playbook YAML file")
    p.add_argument("-i", "--inventory", required=True, help="inventory YAML file")
    p.add_argument("--limit", action="append", metavar="HOSTS",
                   help="only these hosts/groups/patterns (comma separated, repeatable)")
    p.add_argument("--only", action="append", metavar="STAGES",
                   help="only these stage ids or tag:NAME (dependencies are not added)")
    p.add_argument("--from", dest="from_", metavar="STAGE",
                   help="start at this stage (and run everything after it)")
    p.add_argument("--skip", action="append", metavar="STAGES", help="leave out these stages")
    p.add_argument("--var", "-e", action="append", default=[], metavar="KEY=VALUE",
                   help="set a variable (highest precedence; value parsed as YAML)")
    p.add_argument("--vars-file", action="append", default=[], metavar="FILE",
                   help="YAML mapping of variables (e.g. the override `orchestrator tune` "
                        "writes); below --var in precedence")
    p.add_argument("--forks", type=int, default=16, help="hosts in parallel (default 16)")
    p.add_argument("--per-host", type=int, default=4,
                   help="independent stages run concurrently on one host (default 4)")
    p.add_argument("--wait-for-host", default="10s", metavar="DURATION",
                   help="how long to wait for a host's SSH at the start, e.g. 5m (default 10s)")
    p.add_argument("--run-dir", default=os.environ.get("ORCHESTRATOR_RUN_DIR", "runs"),
                   help="where run records go (default ./runs, or $ORCHESTRATOR_RUN_DIR)")
    p.add_argument("--locked", metavar="PINFILE",
                   help="hold the deploy to this pin (a run's deploy.lock.json): refuse "
                        "anything that would differ (with plan: show the drift)")
    p.add_argument("--json", action="store_true",
                   help="print the run summary as JSON on stdout instead of the table")
    p.add_argument("--verify", action="store_true",
                   help="hash every downloaded file again (the usual check hashes only the "
                        "files whose size, mtime or inode changed since they were verified)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug-level events")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: every subcommand, or (`command`) the core ones and that one's."""
    parser = argparse.ArgumentParser(
        prog="orchestrator",
        description="Deploy an SGLang LLM server to GPU hosts over SSH, and keep it there.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-V", "--version", action="version",
                        version=f"orchestrator {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_deploy_and_plan(sub)

    validate = sub.add_parser(
        "validate", help="check a playbook (and inventory) without connecting anywhere",
        description="Load and validate; report every problem with file:line:column. Exit 2 if any.",
    )
    validate.add_argument("playbook")
    validate.add_argument("-i", "--inventory", help="inventory YAML file")
    validate.add_argument("--var", "-e", action="append", default=[], metavar="KEY=VALUE")
    validate.set_defaults(func=cmd_validate)

    schema = sub.add_parser(
        "schema", help="print the JSON Schema of the playbook or inventory format",
        description="Print a JSON Schema (draft 2020-12) for editors, e.g. the YAML language "
        "server: `orchestrator schema > playbook.schema.json`.",
    )
    schema.add_argument("--kind", choices=["playbook", "inventory"], default="playbook")
    schema.set_defaults(func=cmd_schema)

    for module, names in _FAMILIES.items():
        if command is None or command in names:
            importlib.import_module(module).add_subcommands(sub)
    if command not in sub.choices:  # a listing, or another distribution's (the simulator's `sim`)
        from importlib.metadata import entry_points
        for entry in entry_points(group="orchestrator.commands"):
            # one command once, though two installs of a distribution may both name it
            if command in (None, entry.name) and entry.name not in sub.choices:
                entry.load()(sub)
    return parser


def _add_deploy_and_plan(sub: Any) -> None:
    """The `deploy` and `plan` subcommands."""
    deploy = sub.add_parser(
        "deploy", help="run a playbook on the inventory's hosts",
        description="Run PLAYBOOK on the hosts of INVENTORY. Each stage checks the host first and "
        "changes only what is missing, so running it again is safe.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_selection(deploy)
    deploy.add_argument("--dry-run", "--check", dest="dry_run", action="store_true",
                        help="run only the checks and print what WOULD change; change nothing "
                        "(the same as `orchestrator plan`)")
    _add_ansible_habits(deploy)
    deploy.add_argument("--rolling", action="store_true",
                        help="accepted for older scripts: every deploy of a playbook with a "
                        "gateway stage rolls its replicas (see --max-unavailable)")
    deploy.add_argument("--max-unavailable", type=int, default=1, metavar="N",
                        help="replicas behind the playbook's gateway out of rotation at once, "
                        "whatever took them out (default 1): a replica whose server must "
                        "restart leaves the gateway, drains, restarts, is verified and comes "
                        "back; unchanged replicas stay in")
    deploy.set_defaults(func=cmd_deploy)

    plan = sub.add_parser(
        "plan", help="dry run: show what a deploy would change",
        description="Same as `deploy --dry-run`: connects, runs every check, changes nothing.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_selection(plan)
    plan.add_argument("--check", action="store_true", help="accepted: a plan is always a check")
    _add_ansible_habits(plan)
    plan.set_defaults(func=cmd_deploy, dry_run=True)


def _add_ansible_habits(p: argparse.ArgumentParser) -> None:
    """--diff, --list-hosts, --list-tasks: as ansible-playbook's, on deploy and plan."""
    p.add_argument("--diff", action="store_true",
                   help="after the table, each (host, stage) that was not converged and the "
                   "reason its check gave (with --check: what WOULD change)")
    p.add_argument("--list-hosts", action="store_true",
                   help="print the hosts the run would touch (after --limit) and how each is "
                   "reached; connect to none")
    p.add_argument("--list-tasks", action="store_true",
                   help="print the stages in run order (after --only/--from/--skip/--limit), "
                   "per host where they differ; connect to none")


#: subcommands registered (and their modules imported) only for their own command or a listing
#: of all: a deploy never imports the simulator or the plotting of `report`
_FAMILIES = {
    "orchestrator.cli.service_cmds": ("status", "logs", "stop"),
    "orchestrator.cli.bench_cmds": ("bench", "report", "tune"),
    "orchestrator.cli.pin_cmd": ("pin",),
    "orchestrator.cli.init_cmd": ("init",),
    "orchestrator.cli.completion_cmd": ("completion",),
}


def _command_of(argv: list[str]) -> str | None:
    """The subcommand word of ARGV (None when there is none: help, --version, a listing)."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg
        if arg in ("-h", "--help", "-V", "--version"):
            return None
    return None


# -- commands ---------------------------------------------------------------------------------

def cmd_validate(args: argparse.Namespace) -> int:
    import orchestrator.stages  # noqa: F401 - hands the stage kinds to config
    from orchestrator.config import (
        load_all,
        load_playbook_alone,
        parse_cli_vars,
        unknown_variables,
    )

    cli_vars = parse_cli_vars(args.var)
    if args.inventory is not None:
        pb, inv = load_all(args.playbook, args.inventory, cli_vars)
        _warn_unknown_vars(unknown_variables(pb, inv, cli_vars), cli_vars)
        print(f"ok: {args.playbook}: {len(pb.stages)} stage(s), {_host_counts(inv)}")
        return 0
    pb, needs = load_playbook_alone(args.playbook, cli_vars)
    print(f"ok: {args.playbook}: {len(pb.stages)} stage(s)")
    if needs:
        names = sorted({name for _, name in needs})
        print(f"note: {len(names)} variable(s) the playbook uses are defined by no file it "
              f"loads; the inventory (or --var) must define them: {', '.join(names)}")
        for location, name in needs:
            print(f"  {location}: {name}")
    return 0


def _host_counts(inventory: Inventory) -> str:
    """The inventory's hosts in words, e.g. `2 deploy host(s), 1 hypervisor`: a host another
    host names as its `hypervisor.host` (reached only to repair a container) counted apart."""
    hypervisors = {h.hypervisor.host for h in inventory.hosts.values() if h.hypervisor}
    hypervisors &= set(inventory.hosts)
    deploy = len(inventory.hosts) - len(hypervisors)
    if not hypervisors:
        return f"{deploy} host(s)"
    return (f"{deploy} deploy host(s), {len(hypervisors)} "
            f"hypervisor{'s' if len(hypervisors) > 1 else ''}")


def cmd_schema(args: argparse.Namespace) -> int:
    import orchestrator.stages  # noqa: F401 - hands the stage kinds to config
    from orchestrator.config.schema import json_schema

    print(json.dumps(json_schema(args.kind), indent=2))
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    """`deploy` and `plan`: run orchestrator.deploy.deploy with a console view, then the summary.

    The run's first connections start opening (orchestrator.preconnect) as soon as the flags
    are parsed and the inventory's hosts are read: the console, the run record, the stages and
    their templating are imported after, while the hosts answer.
    """
    # no cyclic GC while the run is prepared; on_start freezes what that made (_resume_gc)
    gc.disable()
    try:
        return _cmd_deploy(args)
    finally:
        gc.enable()


def _resume_gc() -> None:
    """Freeze what the preparation made out of the cyclic GC, and turn collection back on.

    Importing and preparing a run (~700 modules, their classes, the plan) makes ~115,000
    objects that live as long as the process. With collection on, the GC walks them again and
    again while they are made, one full pass included: 60-230 ms of a converged 16-host re-run,
    holding the GIL on the critical path, against ~6 ms for everything the run itself makes
    once they are frozen (gc.freeze: the permanent generation, never scanned; their memory is
    still freed by reference counting). Collection then goes on as usual for a long run.
    """
    gc.freeze()
    gc.enable()


def _cmd_deploy(args: argparse.Namespace) -> int:
    from orchestrator.config.durations import parse_duration
    from orchestrator.options import RunOptions
    from orchestrator.preconnect import for_deploy
    from orchestrator.selection import Selection

    try:
        wait_for_host = parse_duration(args.wait_for_host)
    except ValueError as exc:
        raise ConfigError(f"--wait-for-host: {exc}") from None
    selection = Selection.from_args(args.limit, args.only, args.from_, args.skip)
    if args.list_hosts or args.list_tasks:
        return _list(args, selection)
    _interrupt_on_signals()
    if getattr(args, "max_unavailable", 1) < 1:
        raise ConfigError("--max-unavailable must be at least 1")
    options = RunOptions(forks=args.forks, per_host=args.per_host, dry_run=args.dry_run,
                         wait_for_host=wait_for_host, verify=args.verify,
                         max_unavailable=getattr(args, "max_unavailable", 1))
    REDACTOR.add_env(os.environ)
    early = for_deploy(args.playbook, args.inventory, selection, options)
    try:
        from orchestrator.config.variables import parse_cli_vars

        var_names = parse_cli_vars(args.var)
        cli_vars = {**_vars_files(args.vars_file), **var_names}
        outcome = _deploy_with_view(args, cli_vars, selection, options, early, list(var_names))
    finally:
        if early is not None:
            early.close()
    if args.json:
        print(json.dumps(REDACTOR.redact(outcome.summary.to_json()), indent=2, default=str))
    else:
        _print_summary(outcome, args.locked if args.dry_run else None, diff=args.diff)
    return outcome.exit_code


def _list(args: argparse.Namespace, selection: Selection) -> int:
    """--list-hosts / --list-tasks: load, plan (the selection applied), print; connect to none."""
    import orchestrator.stages  # noqa: F401 - hands the stage kinds to config
    from orchestrator.cli.listing import list_hosts, list_tasks
    from orchestrator.config import load_all, parse_cli_vars, unknown_variables
    from orchestrator.plan import build_plan

    var_names = parse_cli_vars(args.var)
    cli_vars = {**_vars_files(args.vars_file), **var_names}
    pb, inv = load_all(args.playbook, args.inventory, cli_vars)
    _warn_unknown_vars(unknown_variables(pb, inv, cli_vars), var_names)
    plan = build_plan(pb, inv, selection)
    lines = (list_hosts(plan, args.json) if args.list_hosts else []) + \
        (list_tasks(plan, args.json) if args.list_tasks else [])
    print("\n".join(lines))
    return 0


def _warn_unknown_vars(unknown: dict[str, str | None], var_names: Iterable[str]) -> None:
    """One line on stderr per `--var` name that nothing defines or reads (a typo, most often);
    the run goes on, as Ansible's would (which says nothing)."""
    for name in var_names:
        if name in unknown:
            close = unknown[name]
            hint = f" (did you mean {close}?)" if close else ""
            print(f"warning: --var {name}: no vars define it and no template reads it{hint}",
                  file=sys.stderr)


def _deploy_with_view(args: argparse.Namespace, cli_vars: dict[str, Any], selection: Selection,
                      options: RunOptions, early: Preconnect | None,
                      var_names: Iterable[str] = ()) -> DeployOutcome:
    """orchestrator.deploy.deploy, shown on the console unless --json; VAR_NAMES: the --var
    names (warned about when nothing defines or reads them)."""
    from orchestrator.cli.console import ConsoleView
    from orchestrator.deploy import DeployStart, deploy

    view = None if args.json else ConsoleView()

    def on_start(start: DeployStart) -> None:
        _resume_gc()
        _warn_unknown_vars(start.unknown_vars, var_names)
        if start.pin_incomplete:
            print(f"warning: {args.locked} comes from a deploy that did not complete; stages it "
                  "has no entry for will be refused", file=sys.stderr)
        if view is not None:
            mode = "dry run (nothing will be changed)" if start.dry_run else "deploy"
            view.console.print(f"{mode}: {start.playbook} on {len(start.hosts)} host(s), "
                               f"{start.nodes} stage run(s); run {start.run_id}")

    try:
        return deploy(
            args.playbook, args.inventory, cli_vars=cli_vars, selection=selection,
            options=options, pin_path=args.locked, run_dir=args.run_dir,
            handlers=[view] if view is not None else [], verbose=args.verbose,
            on_start=on_start, preconnected=early)
    finally:
        if view is not None:
            view.close()


def _vars_files(paths: list[str]) -> dict[str, Any]:
    """Variables from --vars-file YAML mappings (a later file wins)."""
    import yaml

    out: dict[str, Any] = {}
    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"--vars-file {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--vars-file {path}: expected a mapping of variables")
        out.update(data)
    return out


def _print_summary(outcome: DeployOutcome, drift_against: str | None,
                   diff: bool = False) -> None:
    """The closing table, headline facts, drift (plan --locked), what was not converged and
    why (--diff), totals and paths, on stdout."""
    from rich.console import Console

    from orchestrator.cli.console import diff_lines, highlights, summary_table
    from orchestrator.pinfile import drift_lines

    summary = outcome.summary
    out = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    out.print(summary_table(summary))
    for line in highlights(summary):
        out.print(line)
    counts = Counter(st.status for h in summary.hosts.values() for st in h.stages.values())
    totals = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if drift_against:
        for line in drift_lines(summary, drift_against):
            out.print(line, markup=False)
    if diff:
        for line in diff_lines(summary):
            out.print(REDACTOR.redact(line), markup=False)
    out.print(f"run {outcome.run_id}: {totals}; exit code {outcome.exit_code}; "
              f"{summary.duration_s or 0:.1f}s")
    out.print(f"run record: {outcome.run_dir}/summary.json")
    out.print(f"events:     {outcome.run_dir}/events.jsonl")
    if outcome.pin_path is not None:
        out.print(f"pin file:   {outcome.run_dir}/deploy.lock.json")


def _interrupt_on_signals() -> None:
    """Ctrl-C and SIGTERM stop the run cleanly (remote commands killed, record written, 130),
    also when the shell that started us ignored SIGINT (e.g. a background job)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt)


# -- entry point ------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the command, map errors to exit codes."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except OrchestratorError as exc:
        print(f"error: {REDACTOR.redact(exc.render())}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    except Exception:  # noqa: BLE001 - the one place that turns a bug into a report
        import tempfile
        import traceback

        crash = Path(tempfile.gettempdir()) / f"orchestrator-crash-{int(time.time())}.log"
        crash.write_text(REDACTOR.redact(traceback.format_exc()))
        print(f"internal error: {REDACTOR.redact(str(sys.exc_info()[1]))}\n"
              f"  This is a bug in orchestrator; please report it with {crash}", file=sys.stderr)
        return 1


def entry() -> NoReturn:
    """The `orchestrator` command (and `python -m orchestrator`): main(), then a quick exit.

    When main() returns, every file a command wrote is closed and every connection is shut;
    what is left is the interpreter's own teardown of ~700 imported modules, about 0.15 s here
    (a seventh of a converged 1-host re-run). os._exit skips it once stdout, stderr and the
    logging handlers are flushed. Library callers (tests) call main() and keep their process.
    """
    code = main()
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # a closed pipe (`| head`) or a closed stdout
        code = code or 1
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    os._exit(code)


if __name__ == "__main__":
    entry()
