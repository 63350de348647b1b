"""The `python_venv` stage kind: a virtual environment on the host whose python and pip work.

Example: playbooks/kimi-k2.6-eagle3.yaml; every param is described in its Params model.

Converged when `PATH/bin/python` runs, `PATH/bin/python -m pip --version` works and the venv's
`include-system-site-packages` matches. The check reads this from the venv's files first (agent
probe `venv_inventory`: pyvenv.cfg's version, bin/python resolving to an executable, pip's
dist-info and package in site-packages), so a converged venv costs no interpreter start; anything
the files do not show as working is asked of the interpreter (`python -m pip --version`), which
also gives the reason. The files cannot tell an interpreter that no longer starts although its
binary is there (a missing shared library): the packages and server stages then fail loudly.

Apply, depending on what is there:

* nothing (or an empty folder): `python -m venv PATH`;
* a venv whose python is broken (interrupted creation, base interpreter removed) or a folder
  holding only venv's first folders (bin/include/lib): recreated with `python -m venv --clear`;
* a venv without pip (`--without-pip`, or Debian without python3-venv where plain `venv` fails
  with "ensurepip is not available"): the venv is made with `--without-pip`, then pip is
  installed by the first way that works: `PATH/bin/python -m ensurepip --upgrade`; a pip wheel
  already on the host (ensurepip's bundled wheel, /usr/share/python-wheels) run as
  `PATH/bin/python pip.whl/pip install --no-index pip.whl`; the host's own pip (>= 22.3)
  `python -m pip --python PATH/bin/python install pip` (index from `pip_index_url`, else pip's
  own configuration). If none works the error names the Debian package to install;
* anything else at PATH (a file, a non-empty folder that is not a venv) is refused, never deleted.

With `deploy --locked PINFILE` the venv's python must have the pinned version (major.minor.micro):
the existing venv's, or - when the venv is still to be made - the one `python` would create it
with. Another version is REFUSED before anything is created (under `plan --locked`: a "drift: ..."
reason).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from pydantic import Field

from orchestrator.errors import CommandFailed, StageError
from orchestrator.facts.programs import last_json_line
from orchestrator.facts.pyenv import (
    INTERPRETER_VARS,
    PipWheels,
    PyInfo,
    VenvInventory,
    VenvState,
)
from orchestrator.host import Host
from orchestrator.pinfile import StagePin
from orchestrator.remote import source as remote_source
from orchestrator.result import Result
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext
from orchestrator.stages.host_health_rules import version_less
from orchestrator.stages.pin import differs, pinned

#: a quick command (version queries, probes); creation and pip installs use the stage timeout
QUICK = 120.0

#: interpreter facts (orchestrator/remote/pyinfo.py), run as `PYTHON -c _PYINFO OP`
_PYINFO = remote_source("pyinfo")

_NO_ENSUREPIP = ("ensurepip is not available", "No module named ensurepip",
                 "No module named 'ensurepip'")
_PIP_VERSION = re.compile(r"^pip (\S+) from ")


class PythonVenvParams(Params):
    """Parameters of the python_venv kind."""

    path: str = Field(description="where the virtual environment lives on the host")
    python: str = Field("python3", description="interpreter on the host that creates the venv")
    system_site_packages: bool = Field(
        False, description="give the venv access to the interpreter's site-packages"
    )
    pip_index_url: str | None = Field(
        None,
        description="index the host's pip may use to install pip into a venv that has none "
        "(only when ensurepip and local pip wheels are missing); passed as PIP_INDEX_URL",
    )


def _tail(result: Result, n: int = 6) -> str:
    return result.tail(n).strip() or f"exit code {result.exit_code}"


@dataclass(frozen=True)
class VenvLook:
    """The venv's folder (a typed fact) and what its python and pip answered."""

    state: VenvState
    python: str | None = None
    pip: str | None = None
    python_error: str | None = None
    pip_error: str | None = None
    site_ok: bool = True


@dataclass(frozen=True)
class VenvPin(StagePin):
    """python_venv's pin: the venv's python version (major.minor.micro)."""

    python: str | None


class PythonVenvStage(Stage, kind="python_venv"):
    """Create or repair a virtual environment until its python and pip both work."""

    speculative_check = True

    Params = PythonVenvParams
    params: PythonVenvParams
    Pin = VenvPin

    @property
    def vpy(self) -> str:
        return self.params.path.rstrip("/") + "/bin/python"

    def _env(self, ctx: StageContext) -> dict[str, str]:
        return {**ctx.env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}

    def _inspect(self, host: Host, ctx: StageContext, *, full: bool = True) -> VenvLook:
        """Look at the venv: state of the folder, its python, its pip (read-only).

        `full` runs `python -m pip --version` (the real test); otherwise pip is only imported.
        """
        state = host.fact(VenvState, path=self.params.path)
        look = VenvLook(state=state)
        if not state.exists or not state.is_dir:
            return look
        python = pip = python_error = pip_error = None
        if not state.python_exists:
            python_error = f"{self.vpy} does not exist"
        else:
            r = host.run_argv([self.vpy, "-c", _PYINFO, "info_pip"], timeout=QUICK,
                              env=self._env(ctx))
            info = PyInfo.from_answer(last_json_line(r.stdout)) if r.ok else None
            if info is None:
                python_error = _tail(r, 3)
            elif info.version is None:
                python_error = f"unexpected output: {r.stdout[-200:]!r}"
            else:
                python = info.version
                if not full:
                    pip, pip_error = info.pip, None if info.pip else "pip does not import"
        if python and full:
            r = host.run_argv([self.vpy, "-m", "pip", "--version"], timeout=QUICK,
                              env=self._env(ctx))
            m = _PIP_VERSION.match(r.stdout.strip()) if r.ok else None
            pip, pip_error = (m.group(1), None) if m else (None, _tail(r, 3))
        site_ok = state.pyvenv_cfg is None or \
            state.system_site_packages == self.params.system_site_packages
        return VenvLook(state=state, python=python, pip=pip, python_error=python_error,
                        pip_error=pip_error, site_ok=site_ok)

    def _check_pin(self, host: Host, ctx: StageContext, s: VenvLook) -> Needed | None:
        """Under --locked: refuse (dry run: report) a python version other than the pinned one."""
        pin = pinned(ctx, VenvPin)
        if not isinstance(pin, VenvPin):
            return pin
        want = pin.python
        have, whose = s.python, "the venv's python"
        if have is None or s.state.pyvenv_cfg is None:  # apply would (re)create it with p.python
            have = self._base_version(host, ctx)
            whose = f"{self.params.python} (which would create the venv)"
        if want is None or have is None or have == want:
            return None
        return differs(ctx, f"python version of {whose}", have, want,
                       hint=f"make the venv with a python {want} (`python:` param; remove "
                       f"{self.params.path} if it holds another version), or deploy without "
                       "--locked to move on, then promote the new pin")

    def _inspect_files(self, host: Host, ctx: StageContext) -> VenvLook | None:
        """The venv as its files tell (no interpreter starts), when they show a working one:
        pyvenv.cfg with a version, bin/python resolving to an executable, pip's dist-info and
        package. None when anything is missing: `_inspect` then asks the interpreter."""
        if INTERPRETER_VARS & ctx.env.keys():
            return None
        inv = host.fact(VenvInventory, path=self.params.path, names=[])
        if inv.state.pyvenv_cfg is None or not inv.python_ok or not inv.version or not inv.pip:
            return None
        site_ok = inv.state.system_site_packages == self.params.system_site_packages
        return VenvLook(state=inv.state, python=inv.version, pip=inv.pip, site_ok=site_ok)

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        p = self.params
        s = self._inspect_files(host, ctx) or self._inspect(host, ctx)
        verdict = self._check_pin(host, ctx, s)
        if verdict is not None:
            return verdict
        if not s.state.exists:
            return Needed(f"{p.path} does not exist")
        if not s.state.is_dir:
            return Needed(f"{p.path} exists but is not a directory (apply will refuse)")
        if not s.state.entries:
            return Needed(f"{p.path} is an empty directory")
        if s.state.pyvenv_cfg is None and not s.state.skeleton_only:
            return Needed(f"{p.path} is not a virtual environment (apply will refuse)")
        if s.python is None:
            return Needed(f"the venv's python is broken: {s.python_error}")
        if s.pip is None:
            return Needed(f"the venv has no working pip: {s.pip_error}")
        if not s.site_ok:
            want = "on" if p.system_site_packages else "off"
            return Needed(f"system_site_packages should be {want}")
        record_venv(ctx, self.params.path, s)
        return Converged(f"python {s.python} with pip {s.pip} in {p.path}")

    def apply(self, host: Host, ctx: StageContext) -> None:
        p = self.params
        s = self._inspect(host, ctx, full=False)
        if s.state.exists and not s.state.is_dir:
            raise StageError(
                f"{p.path} exists and is not a directory, so no virtual environment can be "
                "created there",
                hint=f"remove it (rm {shlex.quote(p.path)}) or choose another `path`",
            )
        st = s.state
        if st.exists and st.entries and st.pyvenv_cfg is None and not st.skeleton_only:
            shown = ", ".join(s.state.entries[:8])
            raise StageError(
                f"{p.path} is a non-empty directory that is not a virtual environment "
                f"(no pyvenv.cfg; it holds: {shown}); refusing to overwrite it",
                hint=f"move it away or choose another `path` than {p.path}",
            )
        if not s.state.exists or not s.state.entries:
            self._create(host, ctx, clear=False)
        elif s.python is None or s.state.pyvenv_cfg is None:
            ctx.log.warning("python_venv.recreate", path=p.path, reason=s.python_error)
            ctx.record("recreated", s.python_error or "interrupted creation")
            self._create(host, ctx, clear=True)
        elif not s.site_ok:
            # re-running venv on an existing one rewrites pyvenv.cfg and keeps the packages
            self._venv(host, ctx, without_pip=True, clear=False, check=True)
        s = self._inspect(host, ctx, full=False)
        if s.python is None:
            raise StageError(
                f"created {p.path} but its python does not run: {s.python_error}",
                hint=f"check that {p.python} works on the host: {p.python} -c 'print(1)'",
            )
        if s.pip is None:
            self._repair_pip(host, ctx, s.python)

    def verify(self, host: Host, ctx: StageContext) -> None:
        verdict = self.check(host, ctx)
        if isinstance(verdict, Needed):
            raise StageError(f"{self.params.path} is still not usable: {verdict.reason}")

    def _venv(self, host: Host, ctx: StageContext, *, without_pip: bool, clear: bool,
              check: bool) -> Result:
        p = self.params
        argv = [p.python, "-m", "venv"]
        if clear:
            argv.append("--clear")
        if p.system_site_packages:
            argv.append("--system-site-packages")
        if without_pip:
            argv.append("--without-pip")
        argv += ["--", p.path]  # a path such as `--clear` or `-rf` is a path, not an option
        ctx.progress("creating " + p.path)
        r = host.run_argv(argv, timeout=ctx.timeout, env=self._env(ctx))
        if check and not r.ok:
            raise CommandFailed(r, what=f"creating the venv {p.path} failed",
                                hint=self._debian_hint(host, ctx))
        return r

    def _create(self, host: Host, ctx: StageContext, *, clear: bool) -> None:
        r = self._venv(host, ctx, without_pip=False, clear=clear, check=False)
        if r.ok:
            return
        out = " ".join((r.stdout + r.stderr).split())  # messages wrap across lines
        if r.exit_code == 127:
            raise CommandFailed(r, what=f"the interpreter {self.params.python!r} was not found "
                                "on the host",
                                hint="install it, or set `python` to one that exists "
                                "(e.g. python3; `ls /usr/bin/python3*` lists them)")
        if "No module named venv" in out:
            raise CommandFailed(r, what=f"{self.params.python} has no venv module",
                                hint=self._debian_hint(host, ctx))
        if not any(s in out for s in _NO_ENSUREPIP):
            raise CommandFailed(r, what=f"creating the venv {self.params.path} failed")
        ctx.log.warning("python_venv.no_ensurepip", python=self.params.python,
                        path=self.params.path)
        # Debian without python3-venv: make the venv without pip, then install pip ourselves
        self._venv(host, ctx, without_pip=True, clear=False, check=True)

    def _repair_pip(self, host: Host, ctx: StageContext, version: str) -> None:
        p = self.params
        env = self._env(ctx)
        tried: list[str] = []

        ctx.progress("installing pip with ensurepip")
        r = host.run_argv([self.vpy, "-m", "ensurepip", "--upgrade", "--default-pip"],
                          timeout=ctx.timeout, env=env)
        if r.ok:
            _repaired(ctx, self.params.path, "ensurepip")
            return
        tried.append(f"ensurepip: {_tail(r, 2)}")

        r = host.run_argv([self.vpy, "-c", _PYINFO, "find_wheels"], timeout=QUICK, env=env)
        wheels = PipWheels.from_answer(last_json_line(r.stdout) if r.ok else None).wheels
        for wheel in wheels:
            ctx.progress(f"installing pip from {wheel}")
            r = host.run_argv([self.vpy, wheel + "/pip", "install", "--no-index",
                               "--disable-pip-version-check", wheel],
                              timeout=ctx.timeout, env=env)
            if r.ok:
                _repaired(ctx, self.params.path, f"wheel {wheel}")
                return
            tried.append(f"wheel {wheel}: {_tail(r, 2)}")
        if not wheels:
            tried.append("pip wheel on the host: none found")

        r = host.run_argv([p.python, "-m", "pip", "--version"], timeout=QUICK, env=env)
        m = _PIP_VERSION.match(r.stdout.strip()) if r.ok else None
        if m and not version_less(m.group(1), "22.3"):
            host_env = dict(env)
            if p.pip_index_url:
                host_env["PIP_INDEX_URL"] = p.pip_index_url
            ctx.progress(f"installing pip with {p.python}'s pip {m.group(1)}")
            r = host.run_argv([p.python, "-m", "pip", "--python", self.vpy, "install",
                               "--disable-pip-version-check", "pip"],
                              timeout=ctx.timeout, env=host_env)
            if r.ok:
                _repaired(ctx, self.params.path, f"host pip {m.group(1)}")
                return
            tried.append(f"{p.python} -m pip --python: {_tail(r, 2)}")
        elif m:
            tried.append(f"{p.python} -m pip is {m.group(1)} (--python needs >= 22.3)")
        else:
            tried.append(f"{p.python} -m pip: not available")

        raise StageError(
            f"{p.path} has no pip and it could not be installed; tried:\n"
            + "\n".join("    - " + t for t in tried),
            hint=self._debian_hint(host, ctx, version),
        )

    def _base_version(self, host: Host, ctx: StageContext) -> str | None:
        """The version of `python` (the interpreter that makes the venv), or None."""
        r = host.run_argv([self.params.python, "-c", _PYINFO, "info"], timeout=QUICK,
                          env=self._env(ctx))
        return PyInfo.from_answer(last_json_line(r.stdout)).version if r.ok else None

    def _debian_hint(self, host: Host, ctx: StageContext, version: str | None = None) -> str:
        return debian_venv_hint(version or self._base_version(host, ctx))


def debian_venv_hint(version: str | None) -> str:
    """What to install on Debian/Ubuntu when venv creation fails (ensurepip missing)."""
    pkg = "python3-venv"
    if version:
        major, minor = version.split(".")[:2]
        pkg = f"python{major}.{minor}-venv"
    return (f"on Debian/Ubuntu install the venv package: apt install {pkg} (or python3-venv), "
            f"then rerun; or set `pip_index_url` so the host's pip can install pip")


def record_venv(ctx: StageContext, path: str, s: VenvLook) -> None:
    """The venv's facts in the run record (and the python version for the pin file)."""
    ctx.record("path", path)
    ctx.record("python", s.python)
    ctx.record("pip", s.pip)
    ctx.record("pin", VenvPin(s.python).to_json())


def _repaired(ctx: StageContext, path: str, how: str) -> None:
    ctx.log.info("python_venv.pip_installed", path=path, method=how)
    ctx.record("pip_repair", how)
