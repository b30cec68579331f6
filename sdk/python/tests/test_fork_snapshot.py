"""Snapshots (take, list, get, create from, delete) and live fork: the
copies keep the running processes and memory, and diverge afterwards."""

from __future__ import annotations

import pytest
from conftest import cleanup, create_vm, needs_server, uniq, until

import agentvm

pytestmark = needs_server

SNAP = uniq("pysnap")
EXTRA: list[agentvm.VM] = []


@pytest.fixture(scope="module")
def vm(av):
    v = create_vm(av, uniq("pyfork"))
    v.exec("echo on-disk > /root/marker; echo in-memory > /dev/shm/marker")
    v.exec("nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /dev/shm/count.new; mv /dev/shm/count.new /dev/shm/count; sleep 0.2; done' >/dev/null 2>&1 &")
    until("the counter to run", lambda: counter(v) > 0)
    yield v
    cleanup(v, *EXTRA)
    try:
        av.snapshots.delete(SNAP)
    except agentvm.NotFound:
        pass


def counter(v: agentvm.VM) -> int:
    return int(v.exec("cat /dev/shm/count 2>/dev/null || echo 0").stdout)


def test_snapshot_list_get_create_from_it(av, vm) -> None:
    s = vm.snapshot(SNAP)
    assert s.name == SNAP and s.id.startswith("snap-") and s.vm_id == vm.id
    assert s.memory_mib == 512 and s.state_bytes > 0
    assert any(x.id == s.id for x in av.snapshots.list())
    assert av.snapshots.get(SNAP).id == s.id and av.snapshots.get(s.id).name == SNAP
    copy = av.vms.create(uniq("pyfromsnap"), from_snapshot=SNAP)
    EXTRA.append(copy)
    assert copy.state == "running" and copy.info.source == f"snapshot {SNAP}"
    assert copy.exec("cat /root/marker /dev/shm/marker; hostname").stdout == f"on-disk\nin-memory\n{copy.name}\n"
    c0 = counter(copy)
    until("the restored counter to move on", lambda: counter(copy) > c0)


def test_fork_two_live_copies_that_diverge(vm) -> None:
    before = counter(vm)
    f = vm.fork(2)
    EXTRA.extend(f.children)
    assert f.parent is vm and len(f.children) == 2
    assert isinstance(f.raw["parent_pause_ms"], int) and f.raw["state_bytes"] > 0
    for c in f.children:
        assert c.state == "running" and c.id != vm.id and c.info.source == f"fork of {vm.name}"
        assert c.exec("cat /dev/shm/marker").stdout == "in-memory\n"
        assert counter(c) >= before
    a, b = f.children
    a.exec("echo only-in-a > /root/marker")
    assert b.exec("cat /root/marker").stdout == "on-disk\n"
    assert vm.exec("cat /root/marker").stdout == "on-disk\n"
    p0 = counter(vm)
    until("the parent counter to move on", lambda: counter(vm) > p0)


def test_delete_a_snapshot(av) -> None:
    av.snapshots.delete(SNAP)
    with pytest.raises(agentvm.NotFound):
        av.snapshots.get(SNAP)
    with pytest.raises(agentvm.NotFound):
        av.vms.create(from_snapshot=SNAP)
