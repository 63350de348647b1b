"""The `hf_download` stage kind: one revision of a hub repo, complete and verified, on disk.

Example: playbooks/kimi-k2.6-eagle3.yaml; every param is described in its Params model.

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

With `deploy --locked PINFILE` (ctx.pin): the repo must be the pinned one and `revision` must
resolve to the pinned commit, else the stage REFUSES before downloading anything (a branch that
moved is not silently pinned back: change `revision` to the pinned commit, or deploy without
--locked and promote the new pin). Another commit on disk while the revision resolves to the
pinned one is a plain change ("drift: ..."): the pinned commit is downloaded. A verified download
at the pinned commit with another file count or size (other allow/ignore patterns) is refused.
Under `plan --locked` the same differences are reported as "drift: ..." reasons; a branch that
cannot be resolved read-only yet (no huggingface_hub in `python`) is said so.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator

from orchestrator.errors import CommandFailed, StageError
from orchestrator.facts import to_data
from orchestrator.facts.downloads import (
    FileCheck,
    HfAnswer,
    HfFiles,
    HfManifest,
    HfRevision,
    VerifiedFile,
)
from orchestrator.facts.programs import marked_result
from orchestrator.host import Host
from orchestrator.remote import source as remote_source
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext
from orchestrator.stages.hf_download.rules import (
    COMMIT_RE,
    MANIFEST,
    Fetch,
    HfPin,
    Restat,
    describe_problem,
    describes,
    download_error,
    file_state,
    hub_env,
    hub_outage,
    human_bytes,
    manifest_record,
    offline_warning,
    pin_commit,
    pin_contents,
    progress_text,
    script_args,
)
from orchestrator.stages.pin import differs, pinned, short

QUICK = 300.0
_SCRIPT = remote_source("hfcheck")


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
    Pin = HfPin

    @property
    def manifest_path(self) -> str:
        return self.params.local_dir.rstrip("/") + "/" + MANIFEST

    def _script(self, host: Host, ctx: StageContext, op: str, *, timeout: float | None,
                **extra: Any) -> HfAnswer:
        """Run one op of remote/hfcheck.py on the host; return its result or raise StageError."""
        started = time.monotonic()

        def on_output(_stream: str, text: str) -> None:
            for line in text.splitlines():
                shown = progress_text(line.split()[1:], time.monotonic() - started) \
                    if line.startswith("ORCH_PROGRESS ") else None
                if shown:
                    ctx.progress(shown)

        p = self.params
        result = host.run_argv([p.python, "-c", _SCRIPT, op, script_args(p, **extra)],
                               timeout=timeout, env=hub_env(p, ctx.env), on_output=on_output)
        answer = marked_result(result.stdout)
        if answer is None:
            raise CommandFailed(result, what=f"{op} of {p.repo} failed on the host",
                                hint=f"check that {p.python} exists and runs")
        parsed = HfAnswer.from_answer(answer)
        if parsed.error is not None:
            raise download_error(p, op, parsed.error)
        return parsed

    def _resolve(self, host: Host, ctx: StageContext, manifest: HfManifest | None = None,
                 read_only: bool = False) -> str | None:
        """The commit `revision` names: a 40-hex commit as is; a branch asked of the hub (the
        agent first; huggingface_hub, which explains any error, only if that did not answer).
        When the hub does not answer usably (rules.hub_outage) and MANIFEST, the host's verified
        download of this repo and patterns, records a commit, that commit, with one warning.
        None (read_only) when it cannot be known yet: `python` has no huggingface_hub."""
        p = self.params
        if COMMIT_RE.match(p.revision):
            ctx.record("revision_pinned", True)
            return p.revision
        answer = self._ask_hub(host, ctx)
        commit = answer.commit
        cause = hub_outage(answer, token=p.token is not None)
        if commit is None and cause and manifest is not None and manifest.commit \
                and describes(manifest, p, manifest.commit):
            ctx.warn("hf_download.hub_unavailable", offline_warning(p, cause, manifest.commit),
                     repo=p.repo, revision=p.revision, commit=manifest.commit)
            ctx.record("resolved_offline", True)
            return manifest.commit
        if commit is None:
            if read_only and not host.run_argv(
                    [p.python, "-c", "import huggingface_hub"], timeout=QUICK,
                    env=hub_env(p, ctx.env)).ok:
                return None
            commit = str(self._script(host, ctx, "resolve", timeout=QUICK).commit)
        ctx.warn("hf_download.unpinned_revision",
                 f"{p.repo}: revision {p.revision!r} is a branch, resolved to {commit}: pin "
                 "`revision` to that commit (`orchestrator pin` writes a vars file)",
                 repo=p.repo, revision=p.revision, commit=commit)
        ctx.record("revision_pinned", False)
        ctx.record("resolved_commit", commit)
        return commit

    def _ask_hub(self, host: Host, ctx: StageContext) -> HfRevision:
        """The hub's answer about the branch, asked by the agent (no interpreter, no
        huggingface_hub): a commit, or the error and HTTP status."""
        p = self.params
        env = hub_env(p, ctx.env)
        # huggingface_hub's endpoint: HF_ENDPOINT, else the public hub (2.4.0 constants.py:67-69)
        endpoint = p.endpoint or env.get("HF_ENDPOINT") or "https://huggingface.co"
        proxies = {k.lower()[: -len("_proxy")]: v for k, v in env.items()
                   if k.lower() in ("http_proxy", "https_proxy", "all_proxy")}
        token = p.token.get_secret_value() if p.token is not None else None
        answer = host.fact(HfRevision, endpoint=endpoint, repo=p.repo, revision=p.revision,
                           repo_type=p.repo_type, token=token, proxies=proxies)
        if answer.commit is None:
            ctx.log.debug("hf_download.hub_quick_resolve_failed", error=answer.error,
                          status=answer.status)
        return answer

    def _read_manifest(self, host: Host) -> HfManifest | None:
        try:
            data = host.read_json(self.manifest_path)
        except ValueError:
            return None
        return HfManifest.from_answer(data)

    def _record(self, ctx: StageContext, commit: str, files: tuple[VerifiedFile, ...]) -> None:
        pin = HfPin(self.params.repo, commit, len(files), sum(f.size for f in files)).to_json()
        for key, value in pin.items():  # repo, commit, files, bytes
            ctx.record(key, value)
        ctx.record("pin", pin)

    def _check_pin(self, host: Host, ctx: StageContext,
                   manifest: HfManifest | None) -> tuple[Needed | None, str, str | None]:
        """(verdict, note, commit) of the pin before the usual check; the note says what a dry
        run cannot know read-only; commit: what `revision` resolved to, if it was asked."""
        p = self.params
        pin = pinned(ctx, HfPin)
        if not isinstance(pin, HfPin):
            return pin, "", None
        if pin.repo != p.repo:
            return differs(ctx, "repository", p.repo, pin.repo), "", None
        commit = self._resolve(host, ctx, manifest, read_only=True)
        if commit is None:
            # a real deploy resolves in apply (after the packages stage) and refuses there
            return None, (f"; whether {p.revision!r} resolves to the locked commit "
                          f"{short(pin.commit)} cannot be known read-only "
                          f"({p.python} has no huggingface_hub yet)"), None
        verdict = pin_commit(ctx, p, pin, commit)
        if verdict is None and manifest is not None and manifest.repo == p.repo:
            if manifest.commit != commit:
                verdict = Needed(f"drift: commit {short(manifest.commit)} on the host, the lock "
                                 f"has {short(commit)} (deploy --locked downloads the locked "
                                 "commit)", plan=Fetch(commit=commit))
            else:
                verdict = pin_contents(ctx, p, pin, len(manifest.files), manifest.total_size)
        return verdict, "", commit

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        """Its plan: a Fetch (with the commit `revision` resolved to, when it was asked) or a
        Restat; apply resolves `revision` itself where the plan has no commit."""
        p = self.params
        manifest = self._read_manifest(host)
        verdict, note, commit = self._check_pin(host, ctx, manifest)
        if verdict is not None:
            return verdict
        fetch = Fetch(commit=commit)
        if manifest is None:
            return Needed(f"{p.local_dir} holds no verified download of {p.repo} "
                          f"(no {MANIFEST}){note}", plan=fetch)
        if manifest.repo != p.repo or manifest.repo_type != p.repo_type:
            return Needed(f"{p.local_dir} holds {manifest.repo}, not {p.repo}", plan=fetch)
        if (manifest.allow_patterns != p.allow_patterns
                or manifest.ignore_patterns != p.ignore_patterns):
            return Needed("allow_patterns/ignore_patterns changed since the verified download",
                          plan=fetch)
        commit = commit or self._resolve(host, ctx, manifest, read_only=True)
        if commit is None:
            return Needed(f"cannot resolve {p.revision!r} yet: {p.python} has no "
                          "huggingface_hub")
        if manifest.commit != commit:
            return Needed(f"{p.local_dir} holds commit {str(manifest.commit)[:12]}, "
                          f"{p.revision} is {commit[:12]}", plan=Fetch(commit=commit))
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
        changed = [f"{f.path} ({file_state(found[f.path], f)})" for f in files
                   if found[f.path].changed]
        if changed:
            shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more"
                                              if len(changed) > 5 else "")
            return Needed(f"{len(changed)} file(s) differ from the verified download: {shown}",
                          plan=Fetch(commit, tuple(f.path for f in files
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
        commit = plan.commit if isinstance(plan, Fetch) and plan.commit else None
        commit = commit or self._resolve(host, ctx)
        pin = pinned(ctx, HfPin)  # refuses (raises) before a single byte is written
        if isinstance(pin, HfPin):
            pin_commit(ctx, p, pin, commit)
        ctx.progress(f"downloading {p.repo}@{commit[:12]} to {p.local_dir}")
        forget = list(plan.forget) if isinstance(plan, Fetch) else []
        answer = self._script(host, ctx, "download", timeout=ctx.timeout,
                              revision=commit, forget=forget)
        ctx.record("commit", answer.commit)  # what verify checks
        ctx.log.info("hf_download.downloaded", repo=p.repo, commit=answer.commit,
                     files=answer.file_count, bytes=answer.bytes)

    def verify(self, host: Host, ctx: StageContext) -> None:
        p = self.params
        # the commit apply downloaded, or (after a Restat) the one check recorded
        recorded = ctx.facts.get("commit")
        commit = recorded if isinstance(recorded, str) else self._resolve(host, ctx)
        manifest = self._read_manifest(host)
        if manifest is not None and describes(manifest, p, commit) and not ctx.verify:
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
                "wrong:\n" + "\n".join("    " + describe_problem(x) for x in problems),
                hint="the bad files were deleted: run again to download them again "
                "(repeated hash mismatches point at the disk or a proxy altering downloads)",
            )
        extra = list(answer.extra)
        if extra:
            ctx.log.warning("hf_download.extra_files", local_dir=p.local_dir, files=extra[:20],
                            hint="files not in this commit (an older revision's?); loaders that "
                            "glob *.safetensors may pick them up: remove them")
            ctx.record("extra_files", extra)
        pin = pinned(ctx, HfPin)
        if isinstance(pin, HfPin):  # raises (no manifest written) when the files differ
            pin_contents(ctx, p, pin, len(answer.files), answer.total_size)
        host.write_file(self.manifest_path,
                        json.dumps(manifest_record(p, commit, answer), indent=1) + "\n")
        self._record(ctx, commit, answer.files)
        ctx.log.info("hf_download.verified", repo=p.repo, commit=commit,
                     files=len(answer.files), bytes=answer.bytes)


