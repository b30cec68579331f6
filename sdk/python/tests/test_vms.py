"""VMs and their lifecycle: create (labels, env, idempotency), get, list,
pause/resume, suspend/wake, resize, policy, logs, stop/start, delete, and
the typed errors of each failure."""

from __future__ import annotations

import pytest
from conftest import cleanup, create_vm, needs_server, uniq, until

import agentvm

pytestmark = needs_server

NAME = uniq("pyvm")


@pytest.fixture(scope="module")
def vm(av):
    v = create_vm(av, NAME, labels={"suite": "py-sdk", "run": NAME}, env={"GREETING": "hello-from-env"}, idempotency_key="key-" + NAME)
    yield v
    cleanup(v)


def test_create_returns_a_running_vm_with_its_labels_and_env(av, vm) -> None:
    assert vm.id.startswith("vm-") and len(vm.id) == 15
    assert vm.name == NAME and vm.state == "running"
    assert vm.info.memory_mib == 512
    assert vm.info.labels == {"suite": "py-sdk", "run": NAME}
    assert vm.info.ip
    assert vm.exec("echo $GREETING; hostname").stdout == f"hello-from-env\n{NAME}\n"
    again = av.vms.create(NAME + "-x", memory=512, idempotency_key="key-" + NAME)
    assert again.id == vm.id


def test_get_open_by_name_list_with_label_filters(av, vm) -> None:
    assert av.vms.get(NAME).id == vm.id
    assert av.vm(NAME).refresh().id == vm.id
    assert [v.id for v in av.vms.list(labels={"run": NAME})] == [vm.id]
    assert [v.id for v in av.vms.list(labels=["suite=py-sdk", "run"]) if v.id == vm.id] == [vm.id]
    assert av.vms.list(labels={"run": "no-such-run"}) == []


def test_pause_and_resume(vm) -> None:
    p = vm.pause()
    assert p.state.root == "paused" and vm.state == "paused"
    assert vm.resume().state.root == "running"
    vm.pause()
    assert vm.exec("echo resumed").stdout == "resumed\n"  # exec resumes a paused VM
    assert vm.refresh().state.root == "running"


def test_suspend_then_exec_and_wake_bring_it_back(vm) -> None:
    vm.exec("echo kept-in-memory > /dev/shm/marker")
    assert vm.suspend().state.root == "suspended"
    assert vm.exec("cat /dev/shm/marker").stdout == "kept-in-memory\n"
    vm.suspend()
    assert vm.wake().state.root == "running"


def test_resize_policy_logs(vm) -> None:
    before = vm.info.disk_bytes

    def fs_size() -> int:
        return int(vm.exec("df -B1 --output=size / | tail -1").stdout.strip())

    fs_before = fs_size()
    v = vm.resize(disk=before // 2**20 + 1024)
    assert v.disk_bytes >= before + 2**30
    until("the guest to see the bigger disk", lambda: fs_size() > fs_before + 2**29)
    p = vm.set_policy(idle_timeout="2h", restart="on-failure")
    assert p.idle_timeout_s == 7200 and p.restart == "on-failure"
    vm.set_policy(idle_timeout="0")
    assert isinstance(vm.logs(), str)
    m = vm.metrics()
    assert m["vm"] == vm.id and m["interval_s"] > 0 and isinstance(m["samples"], list), m


def test_stop_conflict_while_stopped_start_boots_it_again(vm) -> None:
    vm.exec("echo on-disk > /root/kept && sync")
    assert vm.stop().state.root == "stopped"
    with pytest.raises(agentvm.Conflict) as ei:
        vm.exec(["true"])
    assert ei.value.status == 409 and ei.value.code == "conflict"
    assert vm.start().state.root == "running"
    assert vm.exec("cat /root/kept").stdout == "on-disk\n"


def test_typed_errors(av) -> None:
    with pytest.raises(agentvm.NotFound) as ei:
        av.vms.get("no-such-vm-" + NAME)
    assert ei.value.status == 404 and ei.value.code == "not_found" and "no-such-vm" in str(ei.value)
    with pytest.raises(agentvm.InvalidArgument) as bad:
        av.vms.create("Not_A_DNS_Label")
    assert bad.value.status == 400 and bad.value.code == "invalid_argument"
    with pytest.raises(agentvm.Conflict):
        av.vms.create(NAME, memory=512)
    wrong = agentvm.AgentVM(av.url, token="avm_wrong")
    with pytest.raises(agentvm.Unauthorized) as un:
        wrong.vms.list()
    assert un.value.status == 401 and un.value.code == "unauthorized"
    assert wrong.health().status == "ok"  # health needs no token


def test_delete(av) -> None:
    extra = create_vm(av)
    extra.delete()
    with pytest.raises(agentvm.NotFound):
        extra.refresh()
    with pytest.raises(agentvm.NotFound):
        av.vms.delete(extra.id)
