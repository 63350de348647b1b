"""The rendered plan of the last run, kept so that a re-run whose inputs did not change skips
loading, validating and rendering (about 0.15 CPU-s of a converged re-run, most of it on the
critical path while the hosts wait for their first check).

A run's plan is a pure function of: the files the load read (playbook, inventory, vars files),
the environment variables `!env` looked up, the `--var`/`--vars-file` values, the selection
(`--limit`, `--only`, `--from`, `--skip`), the working directory, and the code that loads and
renders (this package's files, pydantic, pydantic-core, Jinja2, PyYAML, the Python). Templates
see nothing else: no clock, no host, no file or environment lookup (orchestrator.config._jinja).
So the cache entry records which files and variables the load read, and a later run recomputes
one digest over all of those inputs as they are now; the entry is used only when it matches.

    cache = PlanCache.for_run(run_dir, playbook, inventory, cli_vars, selection)
    rendered = cache.load()            # the RenderedPlan, or None (absent, stale, unreadable)
    ... load, build and render as usual, the load inside config.reads.recording() ...
    cache.store(rendered, reads)       # not kept when the load read something it cannot track

The rendered plan holds secrets (a `!env HF_TOKEN`, a become password). The entry is therefore
encrypted (AES-256-GCM) with a key derived from the digest of the inputs, which include those
secrets' sources: reading the entry takes the same files and environment the run itself needs,
and it adds nothing to what they already give. In clear it keeps only the format, the paths of
the files read, the names (not values) of the variables, and a check value (a second derivation
of the digest) that tells a stale entry from a current one. An entry that does not decrypt,
unpickle or check is ignored, and the run loads afresh and writes it again. One entry per
playbook and inventory pair lives under RUN_DIR/.plan-cache/ (mode 0700, files 0600).
`deploy --verify` (take nothing on trust from earlier runs) does not use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import pickle
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.logs import get_logger

if TYPE_CHECKING:
    from orchestrator.config.reads import ReadLog
    from orchestrator.plan import RenderedPlan
    from orchestrator.selection import Selection

log = get_logger(__name__)

MAGIC = b"orchestrator plan cache 1\n"
#: the libraries whose code decides what a load and a render give
LIBRARIES = ("pydantic", "pydantic_core", "jinja2", "yaml")
_PACKAGE = Path(__file__).resolve().parent


def code_fingerprint() -> bytes:
    """This package's .py files (path, size, mtime) and the libraries' (where they are, their
    top module's size and mtime), and the Python version: a change to any is a new plan."""
    h = hashlib.sha256(sys.version.encode())
    for root, dirs, files in os.walk(_PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                st = os.stat(os.path.join(root, name))
                h.update(f"{root}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    for name in LIBRARIES:
        spec = find_spec(name)
        origin = spec.origin if spec is not None else None
        st = os.stat(origin) if origin else None
        h.update(f"{name}\0{origin}\0{st and st.st_size}\0{st and st.st_mtime_ns}\n".encode())
    return h.digest()


class _Digest:
    """SHA-256 over length-prefixed parts (so that no two sequences of parts collide)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def put(self, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self._h.update(len(raw).to_bytes(8, "big") + raw)

    def digest(self) -> bytes:
        return self._h.digest()


class PlanCache:
    """One playbook and inventory's cache entry (see the module docstring)."""

    def __init__(self, path: Path, context: bytes) -> None:
        self.path = path
        #: everything but the files and variables the load reads: code, paths, vars, selection
        self.context = context

    @classmethod
    def for_run(
        cls,
        run_dir: str | os.PathLike[str],
        playbook: str | os.PathLike[str],
        inventory: str | os.PathLike[str],
        cli_vars: dict[str, Any],
        selection: Selection,
        *,
        code: bytes | None = None,
    ) -> PlanCache | None:
        """The entry for this run, or None when its inputs cannot be told apart exactly
        (command-line values that have no canonical text)."""
        try:
            values = json.dumps(cli_vars, sort_keys=True, default=repr)
        except (TypeError, ValueError):
            return None
        d = _Digest()
        d.put(MAGIC)
        d.put(code if code is not None else code_fingerprint())
        d.put(os.getcwd())
        d.put(str(playbook))
        d.put(str(inventory))
        d.put(values)
        d.put(repr(selection))
        pair = _Digest()
        pair.put(os.path.abspath(playbook))
        pair.put(os.path.abspath(inventory))
        name = f"plan-{pair.digest().hex()[:20]}.bin"
        return cls(Path(run_dir) / ".plan-cache" / name, d.digest())

    # -- the digest of the inputs ---------------------------------------------------------------

    def _inputs(self, files: list[str], env: list[str]) -> bytes | None:
        """The digest of the inputs as they are now: the files' bytes, the variables' values;
        None when a file cannot be read (the load would fail, or differ)."""
        hashes: dict[str, str] = {}
        for path in files:
            try:
                with open(path, "rb") as fh:
                    hashes[path] = hashlib.sha256(fh.read()).hexdigest()
            except OSError:
                return None
        return self._digest(hashes, {name: os.environ.get(name) for name in env})

    def _digest(self, files: dict[str, str], env: dict[str, str | None]) -> bytes:
        """The digest of the context, each file's path and content hash, each variable."""
        d = _Digest()
        d.put(self.context)
        for path, sha in files.items():
            d.put(path)
            d.put(sha)
        for name, value in env.items():
            d.put(name)
            d.put(b"\0unset" if value is None else b"=" + value.encode("utf-8", "surrogateescape"))
        return d.digest()

    @staticmethod
    def _keys(digest: bytes) -> tuple[bytes, str]:
        """(encryption key, check value): two independent derivations of the inputs' digest."""
        key = hmac.new(digest, b"orchestrator plan cache: key", hashlib.sha256).digest()
        check = hmac.new(digest, b"orchestrator plan cache: check", hashlib.sha256).hexdigest()
        return key, check

    # -- read and write --------------------------------------------------------------------------

    def load(self) -> RenderedPlan | None:
        """The cached RenderedPlan when every input is as it was; None otherwise."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return None
        return self._decode(data)

    def _decode(self, data: bytes) -> RenderedPlan | None:
        from orchestrator.plan import RenderedPlan

        if not data.startswith(MAGIC):
            return None
        end = data.find(b"\n", len(MAGIC))
        try:
            header = json.loads(data[len(MAGIC):end])
            files, env, check = list(header["files"]), list(header["env"]), str(header["check"])
        except (ValueError, KeyError, TypeError):
            return None
        digest = self._inputs(files, env)
        if digest is None:
            return None
        key, expected = self._keys(digest)
        if not hmac.compare_digest(check, expected):
            return None
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        body = data[end + 1:]
        try:
            plain = AESGCM(key).decrypt(body[:12], body[12:], MAGIC)
        except (InvalidTag, ValueError):
            return None
        try:
            rendered = pickle.loads(plain)
        except Exception:  # noqa: BLE001 - whatever keeps it from reading back: a fresh load
            return None
        return rendered if isinstance(rendered, RenderedPlan) else None

    def store(self, rendered: RenderedPlan, reads: ReadLog) -> bool:
        """Keep `rendered` for the next run; False (nothing kept) when the load read something
        that cannot be checked later, or the entry cannot be written (the run goes on)."""
        if not reads.complete:
            log.debug("plan.not_cached", reason=reads.why_not)
            with contextlib.suppress(OSError):  # an unwritable run dir: nothing to drop
                self.path.unlink(missing_ok=True)
            return False
        # the inputs as the load saw them (a file changed since is a miss next time)
        key, check = self._keys(self._digest(reads.files, reads.env))
        files, env = list(reads.files), list(reads.env)
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(12)
        body = AESGCM(key).encrypt(nonce, pickle.dumps(rendered, pickle.HIGHEST_PROTOCOL), MAGIC)
        header = json.dumps({"files": files, "env": env, "check": check}).encode()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(MAGIC + header + b"\n" + nonce + body)
            os.replace(tmp, self.path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            log.debug("plan.not_cached", reason=str(exc))
            return False
        return True
