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

import os
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


# -- scheduling under xdist ------------------------------------------------------------------------
# `make test` runs `-n 6 --dist loadfile --no-loadscope-reorder`: xdist hands whole modules to
# the workers in collection order. These modules take longest (seconds of one worker, measured
# with --durations on 2 cores and 6 workers); they are collected first, longest first, so that
# none of them starts late and runs on alone while the other workers have finished. (xdist's
# default order, modules with the most tests first, left the one-test router module for the end.)
# Rough figures are enough; a module missing here only runs later.
SLOWEST_MODULES = {
    "tests/e2e/test_recovery.py": 120,
    "tests/security/test_fuzz_config.py": 112,
    "tests/e2e/test_kimi_k26.py": 111,
    "tests/e2e/test_fault_matrix.py": 93,
    "tests/e2e/test_locked.py": 90,
    "tests/e2e/test_gateway_fleet.py": 120,
    "tests/bench/test_bench_sim.py": 75,
    "tests/stages/test_python_venv.py": 55,
    "tests/security/test_secrets.py": 52,
    "tests/security/test_injection.py": 52,
    "tests/runner/test_deploy_ssh.py": 47,
    "tests/e2e/test_dry_run_trace.py": 40,
    "tests/sim/test_standin_http_fidelity.py": 43,
    "tests/transports/test_contract.py": 39,
    "tests/e2e/test_multinode.py": 39,
    "tests/sim/test_sglang_standin.py": 36,
    "tests/runner/test_deploy_local.py": 29,
    "tests/stages/test_hf_download.py": 29,
    "tests/stages/test_wait_ready.py": 28,
    "tests/sim/test_cli.py": 24,
    "tests/sim/test_pkgindex.py": 22,
}


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On xdist workers: the SLOWEST_MODULES first, longest first; the rest in their order.
    The sort is stable and by module, so the tests of a module keep their order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    first = sorted(SLOWEST_MODULES, key=lambda m: -SLOWEST_MODULES[m])
    rank = {module: i for i, module in enumerate(first)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
