"""The pin rules shared by the stage kinds that honour `deploy --locked PINFILE` (the pin file).

A kind that pins declares its `Pin` (a frozen orchestrator.pinfile.StagePin) and records it as the
fact "pin"; under `--locked` it gets that entry back (`pinned(ctx, ItsPin)`) and compares what
THIS deploy would produce with it. Two sorts of difference:

* the host differs from the pin, but the deploy would converge it to the pin (e.g. another
  commit on disk while the revision still resolves to the pinned commit): a plain change whose
  reason starts with "drift:" (shown by `plan`);
* the deploy itself would produce something else (another commit, a version the requirement
  does not admit, other launch arguments): REFUSED before the host is changed, with a
  PreflightError; under a dry run (`plan --locked`) check() reports it as a needed change
  "drift: ... (deploy --locked refuses this)" instead, so `plan` lists every drift.

Pins hold no secrets and no host-specific absolute paths (`placeholders`, `bind_scope`): a pin
made on staging must apply to production, whose base_dir may differ. The messages say "lock"
where the user meets the flag `--locked` and the file deploy.lock.json.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from orchestrator.errors import PreflightError
from orchestrator.pinfile import StagePin
from orchestrator.stages.base import Needed, StageContext

P = TypeVar("P", bound=StagePin)

#: what to do when a pinned deploy refuses
PIN_HINT = ("make the playbook/inventory produce the locked value again, or deploy without "
            "--locked to move on, then promote the new pin (the deploy.lock.json that deploy "
            "writes into its run directory)")
REFUSES = "deploy --locked refuses this"


def short(value: Any) -> str:
    """A value for a message: 40-hex commits cut to 12 characters, None as 'nothing'."""
    if value is None:
        return "nothing"
    text = str(value)
    return text[:12] if re.fullmatch(r"[0-9a-f]{40}", text) else text


def pinned(ctx: StageContext, kind: type[P]) -> P | Needed | None:
    """This stage's pin under `deploy --locked` (None without it). A pin file with no entry for
    the stage is refused: raised, or under a dry run the Needed that reports it."""
    pin = ctx.pin
    if pin is None or isinstance(pin, kind):
        return pin
    return refuse(ctx, "the pin file has no entry for this stage (it was not run in the locked "
                  "deploy, or its hosts disagreed)")


def refuse(ctx: StageContext, what: str, *, hint: str = PIN_HINT) -> Needed:
    """Under a dry run: Needed("drift: WHAT (deploy --locked refuses this)"); else raise."""
    if ctx.dry_run:
        return Needed(f"drift: {what} ({REFUSES})")
    raise PreflightError(f"stage {ctx.spec.id!r} refused by --locked: {what}", hint=hint)


def differs(ctx: StageContext, what: str, would: Any, pinned: Any,
            *, hint: str = PIN_HINT) -> Needed:
    """`refuse` with the usual wording: what this deploy would produce vs the pinned value."""
    return refuse(ctx, f"{what}: this deploy would give {short(would)}, the pin has "
                  f"{short(pinned)}", hint=hint)


# ------------------------------------------------------------------ portable values

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


def arg_changes(old: Sequence[str], new: Sequence[str]) -> list[str]:
    """Flag-by-flag differences of two argument lists: '--flag OLD -> NEW'."""
    def pairs(args: Sequence[str]) -> dict[str, str]:
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
    return changes or (["argument order"] if list(old) != list(new) else [])
