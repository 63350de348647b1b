"""The `hf_download` stage kind: one revision of a hub repo, complete and verified, on disk.

    - id: drafter
      uses: hf_download
      needs: [packages]                  # the python below needs huggingface_hub
      with:
        python: /opt/orchestrator/venvs/sglang/bin/python
        repo: lightseekorg/kimi-k2.6-eagle3
        revision: 0123456789abcdef0123456789abcdef01234567   # pin a commit; a branch warns
        local_dir: /opt/orchestrator/models/kimi-k2.6-eagle3
        endpoint: https://huggingface.co                      # HF_ENDPOINT
        token: "{{ hf_token }}"                               # HF_TOKEN, environment only
        allow_patterns: ["*.json", "*.safetensors", "tiktoken.model", "*.py"]

Everything runs ON the host with `python` (which must have huggingface_hub):

* apply: `snapshot_download(repo, revision=COMMIT, local_dir=...)` (skips files already complete,
  so an interrupted download resumes file by file; partial files a killed run left behind are
  deleted first, as huggingface_hub 2.4.0 cannot resume another process's partials), with
  HF_ENDPOINT, HF_TOKEN and HF_HUB_DISABLE_TELEMETRY=1 in its environment.
  Progress (bytes on disk / total) is shown while it runs.
* verify: lists the commit's files on the hub and checks every local file's size and hash, on
  the host (sha256 of LFS files against the hub's lfs.sha256; the git blob sha1 of small files).
  A file with a wrong size or hash is named (expected and actual) and DELETED, so the next run
  downloads it again. On success it writes `LOCAL_DIR/.orchestrator/manifest.json` atomically:
  repo, commit, patterns, and per file its path, size, hash and mtime.
* check: converged when the manifest's commit is the one `revision` names (a branch is resolved
  through the hub; a 40-hex commit needs no network) and every file of the manifest exists with
  the recorded size and mtime. This is cheap (no re-hash of hundreds of GB), so a file corrupted
  in place with its size and mtime preserved is NOT noticed by check; every verify (each apply,
  or after deleting the manifest) re-hashes everything and catches it.

A branch `revision` (not a 40-hex commit) is logged as a warning and recorded
(`revision_pinned: false`): the files change whenever the branch moves.

Facts recorded: repo, commit, files (count), bytes (size on disk), revision_pinned, and
"lock": {repo, commit, files, bytes} for the deploy lock file.

With `deploy --locked PINFILE` (ctx.locked): the repo must be the locked one and `revision` must
resolve to the locked commit, else the stage REFUSES before downloading anything (a branch that
moved is not silently pinned back: change `revision` to the locked commit, or deploy without
--locked and promote the new lock). Another commit on disk while the revision resolves to the
locked one is a plain change ("drift: ..."): the locked commit is downloaded. A verified download
at the locked commit with another file count or size (other allow/ignore patterns) is refused.
Under `plan --locked` the same differences are reported as "drift: ..." reasons; a branch that
cannot be resolved read-only yet (no huggingface_hub in `python`) is said so.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator

from orchestrator.errors import CommandFailed, StageError
from orchestrator.facts import to_data
from orchestrator.facts.downloads import (
    FileCheck,
    FileProblem,
    HfAnswer,
    HfError,
    HfFiles,
    HfManifest,
    HfRevision,
    VerifiedFile,
)
from orchestrator.facts.programs import marked_result
from orchestrator.host import Host
from orchestrator.remote import source as remote_source
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext
from orchestrator.stages.pin import differs, missing_entry, refuse, short

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
MANIFEST = ".orchestrator/manifest.json"
QUICK = 300.0
_SCRIPT = remote_source("hfcheck")


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class HfDownloadParams(Params):
    """Parameters of the hf_download kind."""

    python: str = Field(
        "python3", description="python on the host that has huggingface_hub (the venv's)"
    )
    repo: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", description="repo id, org/name")
    revision: str = Field(
        "main", min_length=1, description="40-hex commit (recommended) or branch/tag name"
    )
    local_dir: str = Field(description="folder on the host that receives the files")
    allow_patterns: list[str] | None = Field(None, description="only files matching these globs")
    ignore_patterns: list[str] | None = Field(None, description="skip files matching these globs")
    endpoint: str | None = Field(None, description="hub URL (HF_ENDPOINT)")
    token: SecretStr | None = Field(
        None, description="hub token; travels only in the environment (HF_TOKEN)"
    )
    max_workers: int = Field(8, ge=1, le=64, description="parallel downloads and hash threads")
    repo_type: Literal["model", "dataset", "space"] = "model"
    env: dict[str, str] = Field(default_factory=dict, description="extra environment (proxies)")
    progress_interval: float = Field(10.0, gt=0, description="seconds between progress lines")

    @field_validator("token", mode="before")
    @classmethod
    def _empty_token(cls, v: Any) -> Any:
        return None if v in ("", None) else v


class HfDownloadStage(Stage, kind="hf_download"):
    """Download one revision of a hub repo to a folder on the host and prove it is complete."""

    speculative_check = True

    Params = HfDownloadParams
    params: HfDownloadParams
    _commit: str | None = None
    _resolved: str | None = None

    # ------------------------------------------------------------------ helpers

    @property
    def manifest_path(self) -> str:
        return self.params.local_dir.rstrip("/") + "/" + MANIFEST

    def _env(self, ctx: StageContext) -> dict[str, str]:
        p = self.params
        env = {**ctx.env, **p.env, "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        if p.endpoint:
            env["HF_ENDPOINT"] = p.endpoint.rstrip("/")
        if p.token is not None:
            env["HF_TOKEN"] = p.token.get_secret_value()
        return env

    def _args(self, **extra: Any) -> str:
        p = self.params
        return json.dumps({
            "repo": p.repo, "revision": p.revision, "repo_type": p.repo_type,
            "local_dir": p.local_dir, "allow_patterns": p.allow_patterns,
            "ignore_patterns": p.ignore_patterns, "max_workers": p.max_workers,
            "endpoint": p.endpoint.rstrip("/") if p.endpoint else None,
            "progress_interval": p.progress_interval, **extra,
        })

    def _script(self, host: Host, ctx: StageContext, op: str, *, timeout: float | None,
                **extra: Any) -> HfAnswer:
        """Run one op of remote/hfcheck.py on the host; return its result or raise StageError."""
        started = time.monotonic()

        def on_output(_stream: str, text: str) -> None:
            for line in text.splitlines():
                if line.startswith("ORCH_PROGRESS "):
                    _show_progress(ctx, line.split()[1:], time.monotonic() - started)

        result = host.run_argv([self.params.python, "-c", _SCRIPT, op, self._args(**extra)],
                               timeout=timeout, env=self._env(ctx), on_output=on_output)
        answer = marked_result(result.stdout)
        if answer is None:
            raise CommandFailed(result, what=f"{op} of {self.params.repo} failed on the host",
                                hint=f"check that {self.params.python} exists and runs")
        parsed = HfAnswer.from_answer(answer)
        if parsed.error is not None:
            raise self._error(op, parsed.error)
        return parsed

    def _error(self, op: str, err: HfError) -> StageError:
        return download_error(self.params, op, err)

    def _resolve(self, host: Host, ctx: StageContext) -> str:
        p = self.params
        if COMMIT_RE.match(p.revision):
            ctx.record("revision_pinned", True)
            return p.revision
        if self._resolved is not None:  # resolved once per check -> apply -> verify
            return self._resolved
        commit = self._ask_hub(host, ctx)
        if commit is None:
            commit = self._resolved = str(self._script(host, ctx, "resolve", timeout=QUICK).commit)
            self._announce_branch(ctx, commit)
        return commit

    def _announce_branch(self, ctx: StageContext, commit: str) -> None:
        ctx.log.warning("hf_download.unpinned_revision", repo=self.params.repo,
                        revision=self.params.revision, commit=commit,
                        hint="pin `revision` to the 40-hex commit")
        ctx.record("revision_pinned", False)
        ctx.record("resolved_commit", commit)

    def _resolve_read_only(self, host: Host, ctx: StageContext) -> str | None:
        """The commit `revision` names, or None when it cannot be known yet: the hub asked by
        the agent; only if that fails huggingface_hub, once it is installed in `python`."""
        if COMMIT_RE.match(self.params.revision) or self._resolved is not None:
            return self._resolve(host, ctx)
        if self._ask_hub(host, ctx) is not None:
            return self._resolve(host, ctx)
        probe = host.run_argv([self.params.python, "-c", "import huggingface_hub"],
                              timeout=QUICK, env=self._env(ctx))
        return self._resolve(host, ctx) if probe.ok else None

    def _ask_hub(self, host: Host, ctx: StageContext) -> str | None:
        """The commit the branch names, asked by the agent (no interpreter, no huggingface_hub);
        None when that did not work: huggingface_hub is then asked, and explains any error."""
        p, env = self.params, self._env(ctx)
        # huggingface_hub's endpoint: HF_ENDPOINT, else the public hub (2.4.0 constants.py:67-69)
        endpoint = p.endpoint or env.get("HF_ENDPOINT") or "https://huggingface.co"
        proxies = {k.lower()[: -len("_proxy")]: v for k, v in env.items()
                   if k.lower() in ("http_proxy", "https_proxy", "all_proxy")}
        token = p.token.get_secret_value() if p.token is not None else None
        answer = host.fact(HfRevision, endpoint=endpoint, repo=p.repo, revision=p.revision,
                           repo_type=p.repo_type, token=token, proxies=proxies)
        if answer.commit is None:
            ctx.log.debug("hf_download.hub_quick_resolve_failed", error=answer.error)
            return None
        self._resolved = answer.commit  # resolved once per check -> apply -> verify
        self._announce_branch(ctx, answer.commit)
        return answer.commit

    def _describes(self, manifest: HfManifest, commit: str) -> bool:
        """The manifest is of this repo, commit and patterns."""
        p = self.params
        return (manifest.repo == p.repo and manifest.repo_type == p.repo_type
                and manifest.commit == commit and manifest.allow_patterns == p.allow_patterns
                and manifest.ignore_patterns == p.ignore_patterns)

    def _read_manifest(self, host: Host) -> HfManifest | None:
        try:
            data = host.read_json(self.manifest_path)
        except ValueError:
            return None
        return HfManifest.from_answer(data)

    def _record(self, ctx: StageContext, commit: str, files: tuple[VerifiedFile, ...]) -> None:
        total = sum(f.size for f in files)
        ctx.record("repo", self.params.repo)
        ctx.record("commit", commit)
        ctx.record("files", len(files))
        ctx.record("bytes", total)
        ctx.record("lock", {"repo": self.params.repo, "commit": commit, "files": len(files),
                            "bytes": total})

    # ------------------------------------------------------------------ deploy --locked

    def _lock_commit(self, ctx: StageContext, commit: str) -> Needed | None:
        """Refuse (or, dry run, report) when this deploy would fetch another commit than the
        lock's."""
        p, locked = self.params, ctx.locked or {}
        if locked.get("repo") != p.repo:
            return differs(ctx, "repository", p.repo, locked.get("repo"))
        if commit != locked.get("commit"):
            pin = f"set `revision` to the locked commit {locked.get('commit')}"
            if not COMMIT_RE.match(p.revision):
                pin += f" ({p.revision!r} is a branch or tag name: those move, commits do not)"
            return refuse(ctx, f"revision {p.revision!r} of {p.repo} is commit {short(commit)}, "
                          f"the lock has {short(locked.get('commit'))}",
                          hint=f"{pin}, or deploy without --locked to move on, then promote "
                          "the new lock (the deploy.lock.json that deploy writes)")
        return None

    def _lock_contents(self, ctx: StageContext, files: int, total: int) -> Needed | None:
        """At the locked commit: refuse another file count/size (other patterns)."""
        locked = ctx.locked or {}
        want = (locked.get("files"), locked.get("bytes"))
        if want == (None, None) or want == (files, total):
            return None
        return differs(ctx, f"files of {self.params.repo}@{short(locked.get('commit'))} "
                       "(allow_patterns/ignore_patterns?)", f"{files} files, {total} bytes",
                       f"{want[0]} files, {want[1]} bytes")

    def _check_locked(self, host: Host, ctx: StageContext,
                      manifest: HfManifest | None) -> tuple[Needed | None, str]:
        """(verdict, note) of the lock before the usual check; the note says what a dry run
        cannot know read-only."""
        p, locked = self.params, ctx.locked or {}
        verdict = missing_entry(ctx)
        if verdict is not None:
            return verdict, ""
        if locked.get("repo") != p.repo:
            return differs(ctx, "repository", p.repo, locked.get("repo")), ""
        commit = self._resolve_read_only(host, ctx)
        if commit is None:
            # a real deploy resolves in apply (after the packages stage) and refuses there
            return None, (f"; whether {p.revision!r} resolves to the locked commit "
                          f"{short(locked.get('commit'))} cannot be known read-only "
                          f"({p.python} has no huggingface_hub yet)")
        verdict = self._lock_commit(ctx, commit)
        if verdict is not None:
            return verdict, ""
        if manifest is not None and manifest.repo == p.repo:
            have = manifest.commit
            if have != commit:
                return Needed(f"drift: commit {short(have)} on the host, the lock has "
                              f"{short(commit)} (deploy --locked downloads the locked commit)"), ""
            return self._lock_contents(ctx, len(manifest.files), manifest.total_size), ""
        return None, ""

    # ------------------------------------------------------------------ stage interface

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        self._resolved = None
        p = self.params
        manifest = self._read_manifest(host)
        note = ""
        if ctx.locked is not None:
            verdict, note = self._check_locked(host, ctx, manifest)
            if verdict is not None:
                return verdict
        if manifest is None:
            return Needed(f"{p.local_dir} holds no verified download of {p.repo} "
                          f"(no {MANIFEST}){note}")
        if manifest.repo != p.repo or manifest.repo_type != p.repo_type:
            return Needed(f"{p.local_dir} holds {manifest.repo}, not {p.repo}")
        if (manifest.allow_patterns != p.allow_patterns
                or manifest.ignore_patterns != p.ignore_patterns):
            return Needed("allow_patterns/ignore_patterns changed since the verified download")
        commit = self._resolve_read_only(host, ctx)
        if commit is None:
            return Needed(f"cannot resolve {p.revision!r} yet: {p.python} has no "
                          "huggingface_hub")
        if manifest.commit != commit:
            return Needed(f"{p.local_dir} holds commit {str(manifest.commit)[:12]}, "
                          f"{p.revision} is {commit[:12]}")
        return self._check_files(host, ctx, manifest, commit)

    def _check_files(self, host: Host, ctx: StageContext, manifest: HfManifest,
                     commit: str) -> CheckResult:
        """The manifest's files on disk: stat compared, hashed again only where the stat changed
        (every file with `deploy --verify`)."""
        p, files = self.params, manifest.files
        checks = host.fact(HfFiles, root=p.local_dir, files=[to_data(f) for f in files],
                           verify=ctx.verify).files
        missing = FileCheck("missing", None, None, None)
        found = {f.path: checks.get(f.path, missing) for f in files}
        changed = [f"{f.path} ({_state(found[f.path], f)})" for f in files
                   if found[f.path].changed]
        if changed:
            shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more"
                                              if len(changed) > 5 else "")
            return Needed(f"{len(changed)} file(s) differ from the verified download: {shown}",
                          plan=Fetch(forget=tuple(f.path for f in files
                                                  if found[f.path].state in ("size", "hash"))))
        self._record(ctx, commit, files)
        same = [f for f in files if found[f.path].state == "same"]
        if same:
            fresh = tuple(replace(f, mtime_ns=found[f.path].mtime_ns, ino=found[f.path].ino)
                          if f in same else f for f in files)
            return Needed(f"{len(same)} file(s) were rewritten with the verified content (hashed "
                          "again): the manifest takes their new stat", plan=Restat(fresh))
        total = manifest.total_size
        how = "hashed" if ctx.verify else "present"
        return Converged(f"{len(files)} files of {p.repo}@{commit[:12]} {how} "
                         f"({human_bytes(total)})")

    def apply(self, host: Host, ctx: StageContext, plan: Fetch | Restat | None = None) -> None:
        p = self.params
        manifest = self._read_manifest(host) if isinstance(plan, Restat) else None
        if isinstance(plan, Restat) and manifest is not None:
            data = host.read_json(self.manifest_path)
            data["files"] = to_data(plan.files)
            host.write_file(self.manifest_path, json.dumps(data, indent=1) + "\n")
            return
        commit = self._resolve(host, ctx)
        if ctx.locked is not None:  # refuses (raises) before a single byte is written
            missing_entry(ctx)
            self._lock_commit(ctx, commit)
        ctx.progress(f"downloading {p.repo}@{commit[:12]} to {p.local_dir}")
        forget = list(plan.forget) if isinstance(plan, Fetch) else []
        answer = self._script(host, ctx, "download", timeout=ctx.timeout,
                              revision=commit, forget=forget)
        self._commit = answer.commit
        ctx.log.info("hf_download.downloaded", repo=p.repo, commit=answer.commit,
                     files=answer.file_count, bytes=answer.bytes)

    def verify(self, host: Host, ctx: StageContext) -> None:
        p = self.params
        commit = self._commit or self._resolve(host, ctx)
        manifest = self._read_manifest(host)
        if manifest is not None and self._describes(manifest, commit) and not ctx.verify:
            # after a Restat (or a download that found nothing to fetch): the manifest of this
            # very download, its files as recorded - nothing to hash again
            found = host.fact(HfFiles, root=p.local_dir,
                              files=[to_data(f) for f in manifest.files]).files
            if all(getattr(found.get(f.path), "state", None) == "ok" for f in manifest.files):
                self._record(ctx, commit, manifest.files)  # as verified (and just restated)
                return
        ctx.progress(f"verifying {p.repo}@{commit[:12]} (hashing on the host)")
        answer = self._script(host, ctx, "verify", timeout=ctx.timeout, revision=commit,
                              commit=commit)
        problems = answer.problems
        if problems:
            raise StageError(
                f"{len(problems)} file(s) of {p.repo}@{commit[:12]} in {p.local_dir} are "
                "wrong:\n" + "\n".join("    " + _describe(x) for x in problems),
                hint="the bad files were deleted: run again to download them again "
                "(repeated hash mismatches point at the disk or a proxy altering downloads)",
            )
        manifest = {
            "repo": p.repo, "repo_type": p.repo_type, "revision": p.revision, "commit": commit,
            "allow_patterns": p.allow_patterns, "ignore_patterns": p.ignore_patterns,
            "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "bytes": answer.bytes, "files": to_data(answer.files),
        }
        extra = list(answer.extra)
        if extra:
            ctx.log.warning("hf_download.extra_files", local_dir=p.local_dir, files=extra[:20],
                            hint="files not in this commit (an older revision's?); loaders that "
                            "glob *.safetensors may pick them up: remove them")
            ctx.record("extra_files", extra)
        if ctx.locked is not None:  # raises (no manifest written) when the files differ
            self._lock_contents(ctx, len(answer.files), answer.total_size)
        host.write_file(self.manifest_path, json.dumps(manifest, indent=1) + "\n")
        self._record(ctx, commit, answer.files)
        ctx.log.info("hf_download.verified", repo=p.repo, commit=commit,
                     files=len(answer.files), bytes=answer.bytes)


@dataclass(frozen=True)
class Fetch:
    """Download (what is missing); `forget`: files whose content changed, deleted first."""

    forget: tuple[str, ...] = ()


@dataclass(frozen=True)
class Restat:
    """Files rewritten with their verified content: the manifest takes their new stat."""

    files: tuple[VerifiedFile, ...]


def _state(found: FileCheck, f: VerifiedFile) -> str:
    if found.state == "missing":
        return "missing"
    if found.state == "size":
        return f"size {found.size} != {f.size}"
    return "content changed since verified"


def _describe(problem: FileProblem) -> str:
    path = problem.path
    if problem.problem == "missing":
        return f"{path}: missing (expected {problem.expected} bytes)"
    if problem.problem == "size":
        return f"{path}: size {problem.actual} bytes, expected {problem.expected} (deleted)"
    return f"{path}: {problem.algo} {problem.actual}, expected {problem.expected} (deleted)"


def _show_progress(ctx: StageContext, fields: list[str], elapsed: float) -> None:
    try:
        what, done, total = fields[0], int(fields[1]), int(fields[2])
    except (IndexError, ValueError):
        return
    pct = f" ({100 * done / total:.0f}%)" if total else ""
    verb = "downloaded" if what == "download" else "hashed"
    rate = f", {human_bytes(done / elapsed)}/s" if elapsed > 1 and what == "download" else ""
    ctx.progress(f"{verb} {human_bytes(done)} of {human_bytes(total)}{pct}{rate}")


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
            hint="check the host's network/proxy (`env: {HTTPS_PROXY: ...}`) and `endpoint`",
        )
    if kind == "disk":
        return StageError(f"{head}: no space left under {p.local_dir}: {first}",
                          hint="free disk space or choose another `local_dir`")
    if kind == "missing_library":
        return StageError(f"{head}: {message}",
                          hint=f"install huggingface_hub into {p.python}'s environment "
                          "(a pip_install stage in `needs:`)")
    return StageError(f"{head}: {message}")
