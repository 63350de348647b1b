"""Pin helpers shared by the stage kinds that honour `deploy --locked PINFILE` (the pin file).

A lockable kind records what it pinned down as the fact "lock" (see orchestrator/pinfile.py);
under `--locked` it gets that entry back as `ctx.locked` and compares what THIS deploy would
produce with it. Two sorts of difference:

* the host differs from the lock, but the deploy would converge it to the lock (e.g. another
  commit on disk while the revision still resolves to the locked commit): a plain change whose
  reason starts with "drift:" (shown by `plan`);
* the deploy itself would produce something else (another commit, a version the requirement
  does not admit, other launch arguments): REFUSED before the host is changed, with a
  PreflightError; under a dry run (`plan --locked`) check() reports it as a needed change
  "drift: ... (deploy --locked refuses this)" instead, so `plan` lists every drift.

Entries hold no secrets and no host-specific absolute paths: a lock made on staging must apply to
production, whose base_dir may differ.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.errors import PreflightError
from orchestrator.stages.base import Needed, StageContext

#: what to do when a locked deploy refuses
LOCK_HINT = ("make the playbook/inventory produce the locked value again, or deploy without "
             "--locked to move on, then promote the new lock (the deploy.lock.json that deploy "
             "writes into its run directory)")
REFUSES = "deploy --locked refuses this"


def short(value: Any) -> str:
    """A value for a message: 40-hex commits cut to 12 characters, None as 'nothing'."""
    if value is None:
        return "nothing"
    text = str(value)
    return text[:12] if re.fullmatch(r"[0-9a-f]{40}", text) else text


def missing_entry(ctx: StageContext) -> Needed | None:
    """The lock has no entry for this stage (an empty `ctx.locked`): refuse / report."""
    if ctx.locked is None or ctx.locked:
        return None
    return refuse(ctx, "the lock file has no entry for this stage (it was not run in the locked "
                  "deploy, or its hosts disagreed)")


def refuse(ctx: StageContext, what: str, *, hint: str = LOCK_HINT) -> Needed:
    """Under a dry run: Needed("drift: WHAT (deploy --locked refuses this)"); else raise."""
    if ctx.dry_run:
        return Needed(f"drift: {what} ({REFUSES})")
    raise PreflightError(f"stage {ctx.spec.id!r} refused by --locked: {what}", hint=hint)


def differs(ctx: StageContext, what: str, would: Any, locked: Any,
            *, hint: str = LOCK_HINT) -> Needed:
    """`refuse` with the usual wording: what this deploy would produce vs the locked value."""
    return refuse(ctx, f"{what}: this deploy would give {short(would)}, the lock has "
                  f"{short(locked)}", hint=hint)


# ------------------------------------------------------------------ sglang launch normalization

@functools.lru_cache(maxsize=1024)  # a launch's ~200 values x its paths, at every check
def _path_pattern(path: str) -> re.Pattern[str]:
    # the path itself, not a longer name that starts with it (/models/K vs /models/K2)
    return re.compile(re.escape(path.rstrip("/")) + r"(?=$|/|[\s,:;=\"'])")


def placeholders(paths: Mapping[str, str | None], values: Iterable[str]) -> list[str]:
    """`values` with each host path of `paths` (token -> path) replaced by its <token>.

    Longer paths first, so a cache_dir inside state_dir becomes <cache_dir>, not
    <state_dir>/cache.
    """
    pairs = sorted(((p.rstrip("/"), tok) for tok, p in paths.items() if p and p.rstrip("/")),
                   key=lambda pt: len(pt[0]), reverse=True)
    out = []
    for v in values:
        for path, tok in pairs:
            v = _path_pattern(path).sub(f"<{tok}>", v)
        out.append(v)
    return out


def bind_scope(address: str | None) -> str:
    """How far a bind address reaches: loopback, all (0.0.0.0 / ::), or address."""
    if not address:
        return "default"
    if address in ("localhost",):
        return "loopback"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "address"
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified:
        return "all"
    return "address"


def launch_pin(args: list[str], env: Mapping[str, str], paths: Mapping[str, str | None],
                sglang_version: str | None) -> dict[str, Any]:
    """The lock entry of an SGLang launch.

    args: the server arguments with host paths replaced by placeholders (<model_path>,
    <draft_model_path>, <state_dir>, <cache_dir>, <python>) and the value of --host replaced by
    "<host>" (each host binds its own address); the reach of that address is kept as "bind"
    (loopback / all / address), so exposing the API on every interface is a difference. --port is
    kept as it is, and so is the port of --dist-init-addr (multi-node), whose address becomes
    "<node0>" (node 0's address differs per environment). env: the variable NAMES and a sha256
    over "NAME=value" lines with the same placeholders (values may be secrets: never stored).
    """
    norm = placeholders(paths, args)
    host = None
    for i, a in enumerate(args):
        if a == "--host" and i + 1 < len(args):
            host = args[i + 1]
            norm[i + 1] = "<host>"
        elif a.startswith("--host="):
            host = a.split("=", 1)[1]
            norm[i] = "--host=<host>"
        elif a == "--dist-init-addr" and i + 1 < len(args):
            norm[i + 1] = "<node0>:" + args[i + 1].rpartition(":")[2]
    names = sorted(env)
    values = placeholders(paths, [env[n] for n in names])
    digest = hashlib.sha256("".join(f"{n}={v}\n" for n, v in zip(names, values, strict=True))
                            .encode("utf-8")).hexdigest()
    return {"sglang_version": sglang_version, "args": norm, "bind": bind_scope(host),
            "env": {"names": names, "sha256": digest}}


def arg_changes(old: list[str], new: list[str]) -> list[str]:
    """Flag-by-flag differences of two argument lists: '--flag OLD -> NEW'."""
    def pairs(args: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        key = None
        for a in args:
            if a.startswith("--"):
                key, _, val = a.partition("=")
                out[key] = val
            elif key is not None:
                out[key] = (out[key] + " " + a).strip()
        return out

    a, b = pairs(old), pairs(new)
    changes = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            before = "(unset)" if k not in a else (a[k] or "(set)")
            after = "(unset)" if k not in b else (b[k] or "(set)")
            changes.append(f"{k} {before} -> {after}")
    return changes or (["argument order"] if old != new else [])
