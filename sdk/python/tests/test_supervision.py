"""Supervision and evidence: services, processes, detached jobs, the event
log followed as it happens, and the server-wide calls."""

from __future__ import annotations

import asyncio
import threading

import pytest
from conftest import needs_server, until

import agentvm

pytestmark = needs_server


def state(s) -> str:
    return f"{s.active_state}/{s.sub_state}"


def test_services(vm) -> None:
    assert vm.services.create("ticker", "while true; do echo tick-$(date +%s%N); sleep 0.5; done", restart="always").name == "ticker"
    running = until("the service to run", lambda: (s := vm.services.get("ticker")) and state(s) == "active/running" and s.main_pid > 0 and s)
    assert any(s.name == "ticker" for s in vm.services.list())
    until("journal lines", lambda: "tick-" in vm.services.logs("ticker", lines=20))
    seen = []
    with vm.services.follow("ticker", lines=1) as lines:
        for line in lines:
            if "tick-" in line:
                seen.append(line)
            if len(seen) >= 3:
                break
    assert len(seen) == 3
    assert vm.services.restart("ticker").name == "ticker"
    until("a new main process", lambda: (s := vm.services.get("ticker")) and state(s) == "active/running" and s.main_pid != running.main_pid)
    assert vm.services.stop("ticker").active_state != "active"
    assert vm.services.start("ticker").active_state == "active"
    vm.services.delete("ticker")
    with pytest.raises(agentvm.NotFound):
        vm.services.get("ticker")


def test_processes(vm) -> None:
    vm.exec("nohup sleep 777 >/dev/null 2>&1 &")
    ps = until("the sleep process", lambda: (l := vm.processes.list()) and any("sleep 777" in (p.get("command") or "") for p in l) and l)
    assert any(p["pid"] == 1 for p in ps)
    sleeper = next(p for p in ps if "sleep 777" in p["command"])
    vm.processes.signal(sleeper["pid"], "KILL")
    until("the process to be gone", lambda: not any(p["pid"] == sleeper["pid"] for p in vm.processes.list()))
    with pytest.raises(agentvm.InvalidArgument):
        vm.processes.signal(1, "KILL")


def test_jobs(vm) -> None:
    job = vm.jobs.start("for i in 1 2 3; do echo line-$i; sleep 0.4; done; echo err-out >&2; exit 7")
    assert vm.jobs.logs(job.id, follow=True) == "line-1\nline-2\nline-3\n"
    done = vm.jobs.wait(job.id, timeout_ms=60_000)
    assert done.exited and done.exit_code == 7
    assert vm.jobs.logs(job.id, stream="stderr") == "err-out\n"
    with vm.jobs.stream(job.id, offset=7) as s:
        assert s.read() == b"line-2\nline-3\n"
    assert any(j.id == job.id for j in vm.jobs.list())
    assert vm.jobs.get(job.id).exit_code == 7
    long = vm.jobs.start(["sleep", "600"], user="agent")
    assert long.user == "agent"
    assert not vm.jobs.wait(long.id, timeout_ms=200).exited
    vm.jobs.signal(long.id, "KILL")
    killed = vm.jobs.wait(long.id, timeout_ms=60_000)
    assert killed.exited and killed.signal
    vm.jobs.delete(job.id)
    with pytest.raises(agentvm.NotFound):
        vm.jobs.get(job.id)


def test_events_listed_and_followed(av, vm) -> None:
    vm.exec("true")
    all_ = vm.events.list()
    assert any(e.type == "exec" for e in all_)
    last = all_[-1].seq
    assert vm.events.list(after=last) == []
    assert len(vm.events.list(limit=1)) == 1
    got: list = []

    def follow() -> None:
        with vm.events.follow(after=last) as evs:
            for e in evs:
                if e.type == "exec" and "event-marker" in str((e.data or {}).get("cmd")):
                    got.append(e)
                    return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    vm.exec("echo event-marker")
    t.join(120)
    assert got, "the exec event arrived on the followed stream"
    e = got[0]
    assert e.actor == "admin" and e.data["exit_code"] == "0" and e.seq > last and e.vm == vm.id
    assert any(x.vm == vm.id for x in av.events(limit=50))

    async def quiet() -> None:
        async with agentvm.AsyncAgentVM() as a:
            s = await a.vm(vm.id).events.follow(after=e.seq + 1000)

            async def read() -> None:
                async for ev in s:
                    raise AssertionError(f"unexpected event {ev}")

            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(read(), 0.5)
            await s.aclose()

    asyncio.run(quiet())


def test_server_calls(av) -> None:
    h = av.health()
    assert h.status == "ok" and h.accel in ("kvm", "tcg")
    assert "agentvm_" in av.metrics()
    host = av.host()
    assert host.accel == h.accel and host.memory_total_bytes > 0 and host.running >= 0, host
    with pytest.raises(agentvm.NotFound):
        av.ca()  # not running with --tls auto
