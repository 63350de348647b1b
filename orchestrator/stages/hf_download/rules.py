"""hf_download's rules: the manifest's place and shape, what the host program is given, the
messages (sizes, file problems, hub errors), and the pin (`deploy --locked`): the repo and the
commit it resolved to, with the file count and size. No host is touched here; a pin refusal is
raised, or under a dry run reported (orchestrator.stages.pin.refuse)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.errors import StageError
from orchestrator.facts import to_data
from orchestrator.facts.downloads import (
    FileCheck,
    FileProblem,
    HfAnswer,
    HfError,
    HfManifest,
    HfRevision,
    VerifiedFile,
)
from orchestrator.pinfile import StagePin
from orchestrator.stages.base import Needed, StageContext
from orchestrator.stages.pin import differs, refuse, short

if TYPE_CHECKING:
    from orchestrator.stages.hf_download import HfDownloadParams

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
MANIFEST = ".orchestrator/manifest.json"


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass(frozen=True)
class Fetch:
    """Download (what is missing) of `commit` (None: not resolved yet, apply resolves it);
    `forget`: files whose content changed, deleted first."""

    commit: str | None = None
    forget: tuple[str, ...] = ()


@dataclass(frozen=True)
class Restat:
    """Files rewritten with their verified content: the manifest takes their new stat."""

    files: tuple[VerifiedFile, ...]


def hub_env(p: HfDownloadParams, base: dict[str, str]) -> dict[str, str]:
    """The environment of remote/hfcheck.py: BASE, the stage's `env`, the hub's settings."""
    env = {**base, **p.env, "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    if p.endpoint:
        env["HF_ENDPOINT"] = p.endpoint.rstrip("/")
    if p.token is not None:
        env["HF_TOKEN"] = p.token.get_secret_value()
    return env


def script_args(p: HfDownloadParams, **extra: Any) -> str:
    """The JSON argument of remote/hfcheck.py."""
    return json.dumps({
        "repo": p.repo, "revision": p.revision, "repo_type": p.repo_type,
        "local_dir": p.local_dir, "allow_patterns": p.allow_patterns,
        "ignore_patterns": p.ignore_patterns, "max_workers": p.max_workers,
        "endpoint": p.endpoint.rstrip("/") if p.endpoint else None,
        "progress_interval": p.progress_interval, **extra,
    })


def describes(manifest: HfManifest, p: HfDownloadParams, commit: str) -> bool:
    """The manifest is of this repo, commit and patterns."""
    return (manifest.repo == p.repo and manifest.repo_type == p.repo_type
            and manifest.commit == commit and manifest.allow_patterns == p.allow_patterns
            and manifest.ignore_patterns == p.ignore_patterns)


def manifest_record(p: HfDownloadParams, commit: str, answer: HfAnswer) -> dict[str, Any]:
    """LOCAL_DIR/.orchestrator/manifest.json of a verified download."""
    return {
        "repo": p.repo, "repo_type": p.repo_type, "revision": p.revision, "commit": commit,
        "allow_patterns": p.allow_patterns, "ignore_patterns": p.ignore_patterns,
        "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bytes": answer.bytes, "files": to_data(answer.files),
    }


def file_state(found: FileCheck, f: VerifiedFile) -> str:
    """Why a file of the manifest differs now (for the check's reason)."""
    if found.state == "missing":
        return "missing"
    if found.state == "size":
        return f"size {found.size} != {f.size}"
    return "content changed since verified"


def describe_problem(problem: FileProblem) -> str:
    """One line of verify's error: a file that is missing or wrong (and was deleted)."""
    path = problem.path
    if problem.problem == "missing":
        return f"{path}: missing (expected {problem.expected} bytes)"
    if problem.problem == "size":
        return f"{path}: size {problem.actual} bytes, expected {problem.expected} (deleted)"
    return f"{path}: {problem.algo} {problem.actual}, expected {problem.expected} (deleted)"


def download_error(p: Any, op: str, err: HfError) -> StageError:
    """The StageError (with what to do) for one error answer of remote/hfcheck.py."""
    kind, message, status = err.kind, err.message, err.status
    where = p.endpoint or "the hub"
    head = f"{op} of {p.repo}@{p.revision} failed"
    first = message.splitlines()[0] if message else ""
    if kind == "gated":
        return StageError(
            f"{head}: {p.repo} is gated (HTTP {status}) and "
            + ("the token was refused" if p.token else "no token was given"),
            hint=f"accept the model's license on its hub page ({where}/{p.repo}) with your "
            "account, then set HF_TOKEN to a token of that account (`token:` param, "
            "e.g. `token: \"{{ hf_token }}\"` with `hf_token: !env HF_TOKEN`)",
        )
    if kind == "unauthorized":
        return StageError(
            f"{head}: the hub refused the request (HTTP {status}): {first}",
            hint="set HF_TOKEN to a valid token (`token:` param) that can read "
            f"{p.repo}, and accept its license if it is gated",
        )
    if kind == "repo_not_found":
        return StageError(
            f"{head}: repository {p.repo} not found on {where}"
            + (" (or it is private and the token cannot read it)" if p.token else ""),
            hint="check the repo id spelling; a private repo needs HF_TOKEN (`token:`)",
        )
    if kind == "revision_not_found":
        return StageError(
            f"{head}: revision {p.revision!r} does not exist in {p.repo}",
            hint="use an existing branch, tag or full 40-hex commit of that repo",
        )
    if kind == "network":
        return StageError(
            f"{head}: cannot reach {where}: {first}",
            hint="check the host's network/proxy (`env: {HTTPS_PROXY: ...}`) and `endpoint`; "
            f"nothing of {p.repo} is verified on this host yet, so the hub is needed",
        )
    if kind == "http" and status is not None and (status == 429 or status >= 500):
        return StageError(
            f"{head}: {where} is failing (HTTP {status}): {first}",
            hint="retry when the hub answers again (https://status.huggingface.co for the "
            "public hub); nothing of this repo is verified on this host yet, so it is needed",
        )
    if kind == "disk":
        return StageError(f"{head}: no space left under {p.local_dir}: {first}",
                          hint="free disk space or choose another `local_dir`")
    if kind == "missing_library":
        return StageError(f"{head}: {message}",
                          hint=f"install huggingface_hub into {p.python}'s environment "
                          "(a pip_install stage in `needs:`)")
    return StageError(f"{head}: {message}")


def hub_outage(answer: HfRevision, token: bool) -> str | None:
    """Why the hub gave the agent's revision request (remote/hfcheck.py hf_revision) no usable
    answer - it could not be reached (refused, DNS, timeout: no status), it failed (429, 5xx)
    or it refused the credentials (401/403) - or None when its answer is definitive (a 404:
    no such repo or revision, which huggingface_hub then explains) or there was none to judge.

    401 is an outage for a host that already holds a verified download of the repo: the hub
    answers 401 both for a gated repo without a token and for an unknown repo seen without one
    (huggingface_hub 2.4.0 utils/_http.py:888-892 GatedRepo, :933-951 a 401 read as RepoNotFound);
    a token that expired reads the same."""
    if answer.commit is not None:
        return None
    status = answer.status
    if status is None:
        return f"the hub cannot be reached ({answer.error})"
    if status in (401, 403):
        how = "the token was refused" if token else "no token was given"
        return f"the hub refused the request (HTTP {status}: {how})"
    if status == 429 or status >= 500:
        return f"the hub is failing (HTTP {status})"
    return None


def offline_warning(p: HfDownloadParams, cause: str, commit: str) -> str:
    """The one warning of a re-run that used the commit the host's verified download records."""
    return (f"{cause}: {p.repo}@{p.revision} taken as {short(commit)}, the commit of the "
            f"verified download already in {p.local_dir} (the branch may have moved); pin it "
            "(`revision: <commit>`, or `orchestrator pin` for a vars file) to need no hub")


def progress_text(fields: list[str], elapsed: float) -> str | None:
    """A progress line of remote/hfcheck.py (ORCH_PROGRESS WHAT DONE TOTAL) for the console."""
    try:
        what, done, total = fields[0], int(fields[1]), int(fields[2])
    except (IndexError, ValueError):
        return None
    pct = f" ({100 * done / total:.0f}%)" if total else ""
    verb = "downloaded" if what == "download" else "hashed"
    rate = f", {human_bytes(done / elapsed)}/s" if elapsed > 1 and what == "download" else ""
    return f"{verb} {human_bytes(done)} of {human_bytes(total)}{pct}{rate}"


@dataclass(frozen=True)
class HfPin(StagePin):
    """hf_download's pin: {repo, commit, files (count), bytes}."""

    repo: str | None
    commit: str | None
    files: int | None = None
    bytes: int | None = None


def pin_commit(ctx: StageContext, p: HfDownloadParams, pin: HfPin,
               commit: str) -> Needed | None:
    """Refuse (or, dry run, report) when this deploy would fetch another repo or commit than
    the pinned one."""
    if pin.repo != p.repo:
        return differs(ctx, "repository", p.repo, pin.repo)
    if commit != pin.commit:
        how = f"set `revision` to the locked commit {pin.commit}"
        if not COMMIT_RE.match(p.revision):
            how += f" ({p.revision!r} is a branch or tag name: those move, commits do not)"
        return refuse(ctx, f"revision {p.revision!r} of {p.repo} is commit {short(commit)}, "
                      f"the pin has {short(pin.commit)}",
                      hint=f"{how}, or deploy without --locked to move on, then promote "
                      "the new pin (the deploy.lock.json that deploy writes)")
    return None


def pin_contents(ctx: StageContext, p: HfDownloadParams, pin: HfPin, files: int,
                 total: int) -> Needed | None:
    """At the pinned commit: refuse another file count/size (other patterns)."""
    want = (pin.files, pin.bytes)
    if want == (None, None) or want == (files, total):
        return None
    return differs(ctx, f"files of {p.repo}@{short(pin.commit)} "
                   "(allow_patterns/ignore_patterns?)", f"{files} files, {total} bytes",
                   f"{want[0]} files, {want[1]} bytes")
