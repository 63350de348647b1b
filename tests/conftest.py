"""Shared pytest fixtures for the whole suite.

Fixtures
--------
sshd        factory of REAL OpenSSH servers on loopback (tests/sshd.py). Call it to start one:

                def test_x(sshd):
                    server = sshd("127.0.0.2")            # fresh host key, free port
                    t = SSHTransport(server.host_spec())  # HostSpec with key + known_hosts
                    ...
                    server.stop(); server.restart(new_host_key=True)

            Servers of one test share one authorized client key (`sshd.client_key`); an
            unauthorized one comes from `sshd.new_client_key("other")`. Every server is stopped
            when the test ends. Skips the test (with the reason) when sshd cannot run here:
            not installed, or not root (CI installs openssh-server and runs as root).
ssh_server  one started server on 127.0.0.1 (shortcut for `sshd()`).
agent       the real agent on this machine through LocalTransport (probe tests).
sim_wheels, sim_index, standin_venv, simhw_double
            session fixtures of tests/sim/conftest_index.py (the stand-in wheels, their package
            index, a venv with the stand-in SGLang installed, the simhw test double): defined
            here, once, so that each is built once per session (per xdist worker) however many
            modules use it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

import orchestrator.stages  # noqa: F401 - hands the stage kinds to config (tests load playbooks)
from orchestrator.config.model import HostSpec
from orchestrator.transports.local import LocalTransport
from tests.sim.conftest_index import (  # noqa: F401 - session fixtures, defined once here
    sim_index,
    sim_wheels,
    simhw_double,
    standin_venv,
)
from tests.sshd import SSHDFactory, SSHServer, sshd_unavailable


@pytest.fixture(autouse=True)
def structlog_defaults() -> None:
    """Every test starts with structlog's default configuration. `orchestrator.deploy.deploy()`
    (and the CLI's `configure`) leave a WARNING filter behind in the process, under which
    `structlog.testing.capture_logs()` sees no info events: a later test of the same worker
    that looks for one would fail, depending on which modules that worker ran before."""
    structlog.reset_defaults()


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SSHDFactory]:
    reason = sshd_unavailable()
    if reason:
        pytest.skip(reason)
    factory = SSHDFactory(tmp_path / "sshd")
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def ssh_server(sshd: SSHDFactory) -> SSHServer:
    return sshd()


@pytest.fixture
def agent() -> Iterator[LocalTransport]:
    """The real agent on this machine (LocalTransport), for probe tests."""
    t = LocalTransport(HostSpec(name="localhost", connection="local"))
    t.connect()
    try:
        yield t
    finally:
        t.close()


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> object:
    """Collect with bytecode writing on, whatever PYTHONDONTWRITEBYTECODE says: pytest then
    keeps the assertion-rewritten test modules in __pycache__ (it reads them back in any case),
    instead of every worker of every run rewriting all of them again (~2 s of CPU per worker;
    `make test`'s compileall does not make these). Subprocesses keep the environment's choice."""
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = saved
