"""Shared by the tests: clients from AGENTVM_URL / AGENTVM_TOKEN, unique
names, and waits on conditions with generous deadlines (guests may run
under TCG emulation, where everything is slow). Tests that need a server
are skipped without AGENTVM_URL; test_unit.py runs without one."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

import agentvm

T = TypeVar("T")

LIVE = bool(os.environ.get("AGENTVM_URL"))
needs_server = pytest.mark.skipif(not LIVE, reason="set AGENTVM_URL and AGENTVM_TOKEN to run the tests against an agentvm server")

_SUFFIX = format(int(time.time() * 1000) % 10**8, "x")


def uniq(prefix: str) -> str:
    """A VM, snapshot or network name unique to this run (a DNS label)."""
    return f"{prefix}-{_SUFFIX}"


def until(what: str, fn: Callable[[], T], timeout: float = 120, interval: float = 0.25) -> T:
    """Polls fn until it returns a truthy value (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            v = fn()
            if v:
                return v
            last = v
        except Exception as err:  # noqa: BLE001 - reported below
            last = err
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


@pytest.fixture(scope="session")
def av() -> Iterator[agentvm.AgentVM]:
    with agentvm.AgentVM() as c:
        yield c


def create_vm(av: agentvm.AgentVM, name: str | None = None, **kw: Any) -> agentvm.VM:
    """A small VM (512 MiB)."""
    kw.setdefault("memory", 512)
    return av.vms.create(name, **kw)


def cleanup(*vms: agentvm.VM | None) -> None:
    for v in vms:
        if v is not None:
            try:
                v.delete()
            except agentvm.NotFound:
                pass


@pytest.fixture(scope="module")
def vm(av: agentvm.AgentVM, request: pytest.FixtureRequest) -> Iterator[agentvm.VM]:
    """One VM for a test module, deleted after it."""
    v = create_vm(av, uniq("py" + request.module.__name__.removeprefix("test_").replace("_", "")[:10]))
    yield v
    cleanup(v)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With AGENTVM_SDK_NO_SKIP set (the e2e test sets it), a skipped test
    fails the run: there, everything must run."""
    if not os.environ.get("AGENTVM_SDK_NO_SKIP"):
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = tr.stats.get("skipped", []) if tr else []
    if skipped:
        print(f"\n{len(skipped)} tests were skipped where none may be: {[getattr(r, 'nodeid', r) for r in skipped]}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
