"""The `pip_install` stage kind: make a venv's installed distributions satisfy requirements.

Example: playbooks/kimi-k2.6-eagle3.yaml; every param is described in its Params model.

Check (no pip involved): the agent reads the installed version of every requirement's
distribution from the venv's site-packages (dist-info METADATA, as importlib.metadata does) and
the marker environment from pyvenv.cfg, without starting the venv's python (probe
`venv_inventory`); where the files do not settle it (not a venv, two dist-infos of one name,
system site-packages) one `python -c` prints them (`importlib.metadata`, absent -> null). The
specifiers are evaluated here with `packaging`. A requirement whose marker is false on the
host is skipped. Extras (`pkg[extra]`) and URL requirements are judged by the base
distribution's version only.

Apply: `python -m pip install --disable-pip-version-check --upgrade-strategy S REQ...` with only
the unsatisfied requirements (each quoted). Index settings travel in pip's environment variables
(PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_TRUSTED_HOST), because index URLs may
hold credentials; records show them with the credentials masked. Verify re-checks.

Security: `extra_index_urls` lets pip pick a distribution from ANY of the indexes, whichever has
the highest matching version; a public index can then shadow a private package of the same name
("dependency confusion"). Prefer a single `index_url` that proxies the others, pin exact versions,
or use `find_links` for local wheels.

With `deploy --locked PINFILE` (ctx.pin) every requirement is installed at exactly its pinned
version (`name[extras]==PINNED`) and the stage is converged only when the installed versions equal
the pinned ones. It REFUSES, before pip runs, a requirement whose specifier does not admit the
pinned version, a requirement the pin does not know and a pinned one the playbook no longer
asks for. Under `plan --locked` these are reported as "drift: ..." reasons, and so is a host whose
installed version differs from the pin (deploy --locked installs the pinned one). Dependencies
of the requirements are not pinned (pip resolves them with `upgrade_strategy`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import Field, field_validator

from orchestrator.errors import CommandFailed, StageError
from orchestrator.facts.pip import InstalledDistributions
from orchestrator.facts.programs import last_json_line
from orchestrator.facts.pyenv import INTERPRETER_VARS, VenvInventory, venv_of
from orchestrator.host import Host
from orchestrator.pinfile import StagePin
from orchestrator.remote import source as remote_source
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext
from orchestrator.stages.pin import pinned, refuse

QUICK = 120.0

#: installed versions + marker environment (orchestrator/remote/distributions.py), run ON the
#: host with the venv's python as `PYTHON -c _VERSIONS NAMES_JSON`
_VERSIONS = remote_source("distributions")

_NO_MATCH = ("No matching distribution found", "Could not find a version that satisfies")
_NETWORK = ("NewConnectionError", "Max retries exceeded", "Could not fetch URL",
            "Connection refused", "Name or service not known", "Temporary failure in name")


def mask_url(url: str) -> str:
    """`url` with any user/password replaced by ***: safe for records and messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc="***@" + host))


class PipInstallParams(Params):
    """Parameters of the pip_install kind."""

    python: str = Field(description="the venv's python on the host, e.g. VENV/bin/python")
    requirements: list[str] = Field(
        min_length=1, description="PEP 508 requirements, e.g. 'compressed-tensors>=0.10.0'"
    )
    index_url: str | None = Field(
        None, description="package index (PIP_INDEX_URL); may hold credentials, kept secret"
    )
    extra_index_urls: list[str] = Field(
        default_factory=list,
        description="more indexes (PIP_EXTRA_INDEX_URL). Beware dependency confusion: pip takes "
        "the highest version from any index",
    )
    find_links: list[str] = Field(
        default_factory=list, description="folders or URLs of wheels (PIP_FIND_LINKS)"
    )
    trusted_hosts: list[str] = Field(
        default_factory=list, description="hosts pip may reach without valid HTTPS"
    )
    upgrade_strategy: Literal["only-if-needed", "eager"] = Field(
        "only-if-needed", description="how pip treats dependencies of what it installs"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment for pip (proxies, PIP_* settings)"
    )

    @field_validator("requirements")
    @classmethod
    def _parse(cls, value: list[str]) -> list[str]:
        for text in value:
            try:
                Requirement(text)
            except InvalidRequirement as exc:
                raise ValueError(f"{text!r} is not a PEP 508 requirement: {exc}") from None
        return value


@dataclass(frozen=True)
class PipPin(StagePin):
    """pip_install's pin: the installed version of each requirement that applies on the host."""

    versions: Mapping[str, str] = field(default_factory=dict)


class PipInstallStage(Stage, kind="pip_install"):
    """Install or upgrade distributions until every requirement is satisfied."""

    speculative_check = True

    Params = PipInstallParams
    params: PipInstallParams
    Pin = PipPin

    def _env(self, ctx: StageContext) -> dict[str, str]:
        p = self.params
        env = {**ctx.env, **p.env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
        if p.index_url:
            env["PIP_INDEX_URL"] = p.index_url
        if p.extra_index_urls:
            env["PIP_EXTRA_INDEX_URL"] = " ".join(p.extra_index_urls)
        if p.find_links:
            env["PIP_FIND_LINKS"] = " ".join(p.find_links)
        if p.trusted_hosts:
            env["PIP_TRUSTED_HOST"] = " ".join(p.trusted_hosts)
        return env

    def _installed(self, host: Host, ctx: StageContext) -> tuple[dict[str, str | None],
                                                                  dict[str, str]] | str:
        """Installed versions by requirement name and the marker environment; the error if the
        python does not run (the venv is not there yet)."""
        names = sorted({Requirement(r).name for r in self.params.requirements})
        env = {**ctx.env, **self.params.env}
        venv = None if INTERPRETER_VARS & env.keys() else venv_of(self.params.python)
        if venv is not None:  # read from the venv's files: no interpreter on a converged host
            inv = host.fact(VenvInventory, path=venv, names=names)
            if inv.settled and inv.versions is not None and inv.env is not None:
                return inv.versions, inv.env
        r = host.run_argv([self.params.python, "-c", _VERSIONS, json.dumps(names)],
                          timeout=QUICK, env=env)
        if not r.ok:
            return r.tail(3).strip() or f"exit code {r.exit_code}"
        found = InstalledDistributions.from_answer(last_json_line(r.stdout))
        if found.versions is None or found.env is None:
            raise StageError(
                f"{self.params.python} printed something unexpected instead of the installed "
                f"versions: {r.tail(5)!r}",
                hint="check that this python starts cleanly (no output from sitecustomize)",
            )
        return found.versions, found.env

    def _evaluate(self, versions: dict[str, str | None], marker_env: dict[str, str],
                  requirements: list[str] | None = None) -> list[tuple[str, str]]:
        """(requirement, problem) for every unsatisfied requirement."""
        env = {**default_environment(), **marker_env, "extra": ""}
        problems = []
        for text in self.params.requirements if requirements is None else requirements:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            have = versions.get(req.name)
            if have is None:
                problems.append((text, f"{req.name} is not installed"))
                continue
            if not req.specifier:
                continue
            try:
                ok = req.specifier.contains(Version(have), prereleases=True)
            except InvalidVersion:
                ok = False
            if not ok:
                problems.append((text, f"{req.name} {have} does not satisfy {req.specifier}"))
        return problems

    def _record(self, ctx: StageContext, versions: dict[str, str | None],
                marker_env: dict[str, str] | None = None) -> None:
        ctx.record("versions", dict(versions))
        if self.params.index_url:
            ctx.record("index_url", mask_url(self.params.index_url))
        env = {**default_environment(), **(marker_env or {}), "extra": ""}
        applies = {Requirement(t).name for t in self.params.requirements
                   if Requirement(t).marker is None or Requirement(t).marker.evaluate(env)}
        ctx.record("pin", PipPin({n: v for n, v in sorted(versions.items())
                                  if n in applies and v is not None}).to_json())

    def _pinned_requirements(self, pin: PipPin) -> tuple[list[str], list[str]]:
        """(the requirements at their pinned versions, refusals)."""
        pins = {canonicalize_name(n): (n, v) for n, v in (pin.versions or {}).items()}
        pinned, refusals, seen = [], [], set()
        for text in self.params.requirements:
            req = Requirement(text)
            key = canonicalize_name(req.name)
            seen.add(key)
            if key not in pins:
                refusals.append(f"{req.name} is required ({text!r}) but the pin has no "
                                "version of it")
                continue
            version = pins[key][1]
            try:
                admitted = req.specifier.contains(Version(version), prereleases=True)
            except InvalidVersion:
                admitted = False
            if not admitted:
                refusals.append(f"requirement {text!r} does not admit the locked version "
                                f"{req.name} {version}")
                continue
            extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
            marker = f"; {req.marker}" if req.marker is not None else ""
            pinned.append(f"{req.name}{extras}=={version}{marker}")
        for key, (name, version) in sorted(pins.items()):
            if key not in seen:
                refusals.append(f"the pin has {name} {version} but no requirement asks for it")
        return pinned, refusals

    def _requirements(self, ctx: StageContext) -> list[str]:
        """What to install: the requirements, or under --locked the pinned ones (refusing
        first: raises PreflightError when not a dry run)."""
        pin = pinned(ctx, PipPin)
        if not isinstance(pin, PipPin):
            return list(self.params.requirements)
        requirements, refusals = self._pinned_requirements(pin)
        if refusals:
            refuse(ctx, "; ".join(refusals))
        return requirements

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        requirements = list(self.params.requirements)
        pin = pinned(ctx, PipPin)
        if isinstance(pin, Needed):
            return pin
        if pin is not None:
            requirements, refusals = self._pinned_requirements(pin)
            if refusals:
                return refuse(ctx, "; ".join(refusals))
        found = self._installed(host, ctx)
        if isinstance(found, str):
            return Needed(f"{self.params.python} does not run yet ({found})")
        versions, marker_env = found
        problems = self._evaluate(versions, marker_env, requirements)
        self._record(ctx, versions, marker_env)
        if problems and pin is not None:
            return Needed("drift: " + "; ".join(_drift(problem, pin) for _, problem in problems))
        if problems:
            return Needed("; ".join(problem for _, problem in problems))
        shown = ", ".join(f"{n} {v}" for n, v in versions.items() if v)
        return Converged(f"all {len(self.params.requirements)} requirements satisfied ({shown})")

    def apply(self, host: Host, ctx: StageContext) -> None:
        p = self.params
        found = self._installed(host, ctx)
        if isinstance(found, str):
            raise StageError(
                f"{p.python} does not run: {found}",
                hint="create the venv first (a python_venv stage in `needs:`)",
            )
        todo = [text for text, _ in self._evaluate(*found, self._requirements(ctx))]
        if not todo:
            return
        argv = [p.python, "-m", "pip", "install", "--disable-pip-version-check",
                "--upgrade-strategy", p.upgrade_strategy, *todo]
        ctx.record("installed", todo)
        ctx.progress("pip install " + " ".join(todo))
        result = host.run_argv(
            argv, timeout=ctx.timeout, env=self._env(ctx),
            on_output=lambda _s, text: _progress_line(ctx, text),
        )
        if not result.ok:
            raise CommandFailed(result, what=f"pip install {' '.join(todo)} failed",
                                hint=self._hint(result.stdout + result.stderr))

    def verify(self, host: Host, ctx: StageContext) -> None:
        found = self._installed(host, ctx)
        if isinstance(found, str):
            raise StageError(f"{self.params.python} no longer runs: {found}")
        problems = self._evaluate(*found, self._requirements(ctx))
        self._record(ctx, *found)
        if problems:
            raise StageError(
                "pip finished but requirements are still not satisfied: "
                + "; ".join(problem for _, problem in problems),
                hint="two requirements (or a dependency's pin) conflict; run "
                f"`{self.params.python} -m pip check` on the host and align the pins",
            )

    def _hint(self, output: str) -> str | None:
        p = self.params
        index = mask_url(p.index_url) if p.index_url else "pip's default index"
        if any(s in output for s in _NO_MATCH):
            return (f"no release matching the requirement was found on {index}: check the "
                    "version exists there (and supports this Python), or fix `index_url`")
        if any(s in output for s in _NETWORK):
            return (f"pip could not reach {index}: check the host's network, proxy settings "
                    "(`env: {HTTPS_PROXY: ...}`) or `index_url`")
        if "ResolutionImpossible" in output or "conflict" in output.lower():
            return "the requirements conflict with each other or with installed packages"
        return None


def _drift(problem: str, pin: PipPin) -> str:
    """'sglang 0.5.22 does not satisfy ==0.5.23' -> 'sglang 0.5.22 on the host, lock has
    0.5.23'."""
    m = re.match(r"^(\S+) (\S+) does not satisfy ==(\S+)$", problem)
    if m:
        return f"{m.group(1)} {m.group(2)} on the host, the pin has {m.group(3)}"
    m = re.match(r"^(\S+) is not installed$", problem)
    versions = {canonicalize_name(n): v for n, v in (pin.versions or {}).items()}
    if m and canonicalize_name(m.group(1)) in versions:
        return f"{m.group(1)} not installed, the pin has {versions[canonicalize_name(m.group(1))]}"
    return problem


_PROGRESS = re.compile(r"^(Collecting|Downloading|Installing|Successfully|Building)\b")


def _progress_line(ctx: StageContext, text: str) -> None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if _PROGRESS.match(line):
            ctx.progress(line[:120])
            return


__all__ = ["PipInstallParams", "PipInstallStage", "mask_url"]
